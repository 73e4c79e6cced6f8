//! An owned claim, sent to the downstream and settled.
//!
//! [`Claim`] is a pending record this worker owns at its current attempt. Every way of
//! finishing it — complete, refuse, release, defer, unknown, a job accepted — consumes it, so a
//! claim is finished once. [`Executor::send`] is the only code that calls
//! `Downstream::perform`, and it takes an [`Authorized`] proof by value.

use std::time::Duration;

use idemgate_core::contract::Contract;
use idemgate_core::effect::{Downstream, EffectOutcome, EffectRequest, Lookup};
use idemgate_core::key::OperationKey;
use idemgate_core::machine::{self, AfterEffect, Prior};
use idemgate_core::outcome::{ErrorCode, NextAction, Outcome, Status};
use idemgate_core::record::{Dispatch, Event, EventKind, Millis, Receipt, Record, RecordState};
use idemgate_core::store::{self, Cas, Transition};
use idemgate_core::transitions;

use tracing::Instrument;

use super::authorize::{Authorized, Refused};
use super::{Executor, unrecorded};

/// The longest `Retry-After` a delivery waits out itself before a resend; a longer one is left
/// to the recoverer, so that a caller is not held for minutes.
const MAX_INLINE_PAUSE_SECONDS: u64 = 1;

/// The longest a maybe-sent record waits between two recovery attempts.
const MAX_BACKOFF: Millis = 15 * 60 * 1000;

/// How long to leave a maybe-sent record alone before the next attempt: the lease doubled per
/// attempt, capped, and never sooner than the downstream asked.
pub(crate) fn backoff(contract: &Contract, attempt: u64, retry_after: Option<u64>) -> Millis {
    let doublings = attempt.saturating_sub(1).min(16) as u32;
    let grown = contract
        .lease
        .millis()
        .saturating_mul(1 << doublings)
        .min(MAX_BACKOFF);
    let asked = retry_after.map_or(0, |s| {
        i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX)
    });
    grown.max(asked)
}

/// A pending record owned by this worker at its current attempt.
pub(crate) struct Claim {
    record: Option<Record>,
    /// The record was claimed with its dispatch marker in it (`transitions::claimed_as_sent`):
    /// its `sent` trace entry is written, and no marker is to be written before the send.
    marked: bool,
}

impl Claim {
    pub(crate) fn new(record: Record) -> Claim {
        Claim {
            record: Some(record),
            marked: false,
        }
    }

    /// A new record claimed with its dispatch marker.
    pub(crate) fn marked(record: Record) -> Claim {
        Claim {
            record: Some(record),
            marked: true,
        }
    }

    pub(crate) fn record(&self) -> &Record {
        self.record
            .as_ref()
            .expect("a claim holds its record until it is finished")
    }

    pub(crate) fn key(&self) -> &OperationKey {
        &self.record().key
    }

    /// The record as written by this worker's last step (a renewal, the dispatch marker).
    fn replace(&mut self, record: Record) {
        self.record = Some(record);
    }

    /// Finishes the claim, handing back the record to build its last transition from.
    pub(crate) fn finish(mut self) -> Record {
        self.record.take().expect("a claim is finished once")
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        // A claim dropped unfinished: the worker's future was cancelled or the process is going
        // down. Nothing can be written from here; the lease expires and the recoverer takes it,
        // by receipt or marker, never blindly.
        if let Some(record) = &self.record {
            tracing::debug!(
                operation_key = record.key.as_str(),
                attempt = record.fence,
                "claim left unfinished; recovery takes it after its lease"
            );
        }
    }
}

impl Executor {
    /// Sends an owned claim's request to the downstream and settles the record by what it
    /// answered. `prior` says whether an earlier attempt may already have committed.
    pub(crate) async fn perform(
        &self,
        contract: &Contract,
        mut claim: Claim,
        proof: Authorized,
        effect: &dyn Downstream,
        mut prior: Prior,
    ) -> Outcome {
        let key = claim.key().clone();
        let unsent = matches!(
            claim.record().state,
            RecordState::Pending {
                dispatch: Dispatch::NotSent,
                ..
            }
        );
        // Without the marker, the `sent` trace entry rides on the transition that records the
        // answer: one durable write fewer per operation, and the trace reads the same.
        // A claim made with the marker in it is not `unsent`: its marker and `sent` entry are
        // written.
        let mut sent = None;
        if unsent && contract.uses_dispatch_marker() {
            // The dispatch marker: durable before the first byte leaves, so that recovery can
            // tell "never sent" (take over and execute) from "maybe sent" (receipt or unknown).
            let t = transitions::mark_sent(claim.record(), contract, self.at());
            match self.store.transition(t).await {
                Ok(Cas::Done(r)) => claim.replace(r),
                Ok(Cas::Lost(now)) => {
                    drop(claim.finish());
                    return self.settled_elsewhere(contract, key, now);
                }
                Err(e) => {
                    // Nothing left this process: release the claim so a new delivery may run.
                    tracing::warn!(operation_key = key.as_str(), error = %e, "the dispatch marker could not be written");
                    return self
                        .release(
                            contract,
                            claim,
                            ErrorCode::StoreUnavailable,
                            "the dispatch marker could not be written; nothing was sent; retry \
                             later under the same key",
                            Some(1),
                            None,
                        )
                        .await;
                }
            }
        } else if !claim.marked {
            sent = Some(self.at().event(EventKind::Sent, claim.record().fence));
        }

        let mut proof = Some(proof);
        let mut resends = 0;
        loop {
            let Some(allowed) = proof.take() else {
                // Unreachable by construction: every turn of the loop gets a new proof first.
                return self
                    .mark_unknown(claim, "no authorization for a resend", None, sent)
                    .await;
            };
            // Never send on a lease that is running out: renewing it first proves the claim is
            // still this worker's (a takeover would have grown the fence), and keeps recovery
            // from starting while the request travels.
            if let Err(lost) = self.keep_lease(contract, &mut claim).await {
                drop(claim.finish());
                return lost;
            }
            let answer = self.send(contract, &mut claim, allowed, effect).await;
            match machine::after_effect(contract, answer, prior) {
                AfterEffect::Apply(receipt) => {
                    return self.complete(contract, claim, receipt, sent).await;
                }
                AfterEffect::Job(job_id) => {
                    return self.job_accepted(contract, claim, job_id, sent).await;
                }
                AfterEffect::Refuse(refusal) => {
                    let t = transitions::refuse(
                        claim.record(),
                        contract,
                        refusal.clone(),
                        sent,
                        self.at(),
                    );
                    drop(claim.finish());
                    return match self.store.transition(t).await {
                        Ok(Cas::Done(r)) => {
                            self.settled.offer(&r, self.now());
                            machine::refused(&r, &refusal)
                        }
                        Ok(Cas::Lost(now)) => self.settled_elsewhere(contract, key, now),
                        // The refusal is certain for this attempt, not for the key: unwritten,
                        // the claim stays pending and recovery takes it after its lease, and a
                        // newer attempt may already hold it. Not safe to repeat.
                        Err(_) => Outcome::rejected(Some(key), refusal.code, refusal.message),
                    };
                }
                AfterEffect::Release {
                    code,
                    reason,
                    retry_after,
                } => {
                    return self
                        .release(contract, claim, code, &reason, retry_after, sent)
                        .await;
                }
                AfterEffect::Unproven(reason) => {
                    tracing::warn!(
                        operation_key = key.as_str(),
                        reason,
                        "refusal after an ambiguous attempt"
                    );
                    if let Some(receipt) = self.look_up(contract, effect, &key).await {
                        return self.found(contract, claim, receipt, sent).await;
                    }
                    return self.mark_unknown(claim, &reason, None, sent).await;
                }
                AfterEffect::Ambiguous {
                    reason,
                    retry_after,
                } => {
                    tracing::warn!(
                        operation_key = key.as_str(),
                        reason,
                        "ambiguous downstream answer"
                    );
                    prior = Prior::MaybeSent;
                    if let Some(receipt) = self.look_up(contract, effect, &key).await {
                        return self.found(contract, claim, receipt, sent).await;
                    }
                    if !contract.deduplicates() {
                        return self.mark_unknown(claim, &reason, None, sent).await;
                    }
                    let pause = retry_after.unwrap_or(0);
                    let may_resend = resends < self.settings.max_resends
                        && pause <= MAX_INLINE_PAUSE_SECONDS
                        && claim.record().fence < self.settings.max_attempts;
                    if !may_resend {
                        // Still ambiguous after the bounded resends (or the downstream asked
                        // for a longer pause): the recoverer resends later, same key.
                        let until = self.now().saturating_add(backoff(
                            contract,
                            claim.record().fence,
                            retry_after,
                        ));
                        return self.defer(claim, until, &reason, sent).await;
                    }
                    if pause > 0 {
                        self.timer.sleep(Duration::from_secs(pause)).await;
                    }
                    // Every resend needs its own fresh decision for the recorded actor.
                    match self.authorize_send(contract, claim.record()).await {
                        Ok(next) => proof = Some(next),
                        Err(Refused::Denied(why)) => {
                            let reason = format!(
                                "authorization denied before a resend ({why}); an earlier attempt may have committed"
                            );
                            return self.mark_unknown(claim, &reason, None, sent).await;
                        }
                        Err(refused @ Refused::Unavailable(_)) => {
                            let until = self.now().saturating_add(backoff(
                                contract,
                                claim.record().fence,
                                retry_after,
                            ));
                            return self.defer(claim, until, &refused.reason(), sent).await;
                        }
                    }
                    // Same key, same attempt: the downstream recognises the resend.
                    resends += 1;
                    let resend = self
                        .at()
                        .event(EventKind::Sent, claim.record().fence)
                        .with_detail(format!("resend {resends} after: {reason}"));
                    let _ = self.store.append_events(&key, vec![resend]).await;
                }
            }
        }
    }

    /// Renews the claim's lease when less than half of it is left. `Err` with the answer to
    /// give when the claim may no longer be this worker's (nothing may be sent then).
    async fn keep_lease(&self, contract: &Contract, claim: &mut Claim) -> Result<(), Outcome> {
        let now = self.now();
        let left = claim
            .record()
            .lease()
            .map_or(0, |l| l.expires_at.saturating_sub(now));
        if left > contract.lease.millis() / 2 {
            return Ok(());
        }
        // A renewal stamped before a long pause may land already expired: then it proves the
        // claim was still this worker's, but not that nobody may take it now. Renew again, a
        // few times at most.
        for _ in 0..3 {
            let t = transitions::renew(claim.record(), contract, self.at());
            match self.store.transition(t).await {
                Ok(Cas::Done(r)) => {
                    let live = r.lease().is_some_and(|l| l.expires_at > self.now());
                    claim.replace(r);
                    if live {
                        return Ok(());
                    }
                }
                Ok(Cas::Lost(now)) => {
                    return Err(self.settled_elsewhere(contract, claim.key().clone(), now));
                }
                // Whether the renewal committed cannot be told now, nor whether somebody took the
                // claim over: nothing is sent. The lease expires and recovery settles it by the
                // marker, a receipt or a deduplicated resend.
                Err(e) => {
                    tracing::warn!(operation_key = claim.key().as_str(), error = %e, "lease could not be renewed before a send");
                    break;
                }
            }
        }
        Err(Outcome::in_flight(
            claim.key().clone(),
            NextAction::Poll,
            contract.lease.seconds(),
        ))
    }

    /// The one place an effect is sent for a claim: the proof is consumed, the claimed request
    /// (never a later delivery's bytes) goes out under the operation key, and the lease is
    /// renewed at a third of its length while the call runs, so a slow but healthy effect is
    /// not taken over.
    async fn send(
        &self,
        contract: &Contract,
        claim: &mut Claim,
        proof: Authorized,
        effect: &dyn Downstream,
    ) -> EffectOutcome {
        // The record as last renewed; copied only once a renewal happens, which most calls
        // finish before.
        let mut renewed: Option<Record> = None;
        let answer = {
            let record = claim.record();
            if !proof.covers(Some(&record.key)) {
                return EffectOutcome::NotSent {
                    reason: "internal: the authorization proof is for another operation".into(),
                    retry_after: None,
                };
            }
            drop(proof);
            let Some(arguments) = &record.request else {
                return EffectOutcome::NotSent {
                    reason: "the claimed request was not kept, so it cannot be sent".into(),
                    retry_after: None,
                };
            };
            let request = EffectRequest {
                key: &record.key,
                tool: &record.tool,
                tool_version: &record.tool_version,
                arguments,
                attempt: record.fence,
                precondition: contract.precondition(arguments),
            };
            let current = tracing::Span::current();
            current.record("attempt", record.fence);
            current.record("fence", record.fence);
            let call = effect
                .perform(request)
                .instrument(tracing::debug_span!("downstream", attempt = record.fence));
            tokio::pin!(call);
            let every = Duration::from_millis((contract.lease.millis() / 3).max(500) as u64);
            loop {
                let pause = self.timer.sleep(every);
                tokio::select! {
                    // Biased: the answer first, and no randomness in which branch is polled, so a
                    // simulator replays the same order.
                    biased;
                    answer = &mut call => break answer,
                    _ = pause => {
                        let current = renewed.as_ref().unwrap_or(record);
                        let t = transitions::renew(current, contract, self.at());
                        match self.store.transition(t).await {
                            Ok(Cas::Done(r)) => renewed = Some(r),
                            // Lost: taken over. The call cannot be recalled once sent; let it
                            // finish, and the fenced completion will not overwrite the new owner.
                            Ok(Cas::Lost(_)) | Err(_) => {
                                tracing::warn!(operation_key = record.key.as_str(), "lease renewal failed");
                            }
                        }
                    }
                }
            }
        };
        if let Some(r) = renewed {
            claim.replace(r);
        }
        answer
    }

    /// The one place a key-less call is sent: with its proof, under its own idempotency key.
    pub(crate) async fn send_unkeyed(
        &self,
        proof: Authorized,
        request: EffectRequest<'_>,
        effect: &dyn Downstream,
    ) -> EffectOutcome {
        if !proof.covers(None) {
            return EffectOutcome::NotSent {
                reason: "internal: the authorization proof is for another operation".into(),
                retry_after: None,
            };
        }
        drop(proof);
        effect
            .perform(request)
            .instrument(tracing::debug_span!("downstream"))
            .await
    }

    /// A receipt lookup by key where the contract offers one; `None` when there is none, it
    /// found nothing, or it could not answer.
    pub(crate) async fn look_up(
        &self,
        contract: &Contract,
        effect: &dyn Downstream,
        key: &OperationKey,
    ) -> Option<Receipt> {
        if !contract.receipt_lookup() {
            return None;
        }
        match effect
            .lookup_receipt(key)
            .instrument(tracing::debug_span!("lookup"))
            .await
        {
            Lookup::Found(receipt) if !receipt.reference.is_empty() => Some(receipt),
            Lookup::Found(_) | Lookup::NotFound | Lookup::Unavailable(_) => None,
        }
    }

    /// Stores the receipt and replay-safe result, then answers applied.
    async fn complete(
        &self,
        contract: &Contract,
        claim: Claim,
        receipt: Receipt,
        sent: Option<Event>,
    ) -> Outcome {
        let record = claim.finish();
        let t = transitions::complete(&record, contract, receipt.clone(), sent, self.at());
        self.settle_applied(contract, t, receipt).await
    }

    /// After an ambiguous answer of this claim's own send, the receipt found by key: this
    /// delivery's attempt is the effect.
    async fn found(
        &self,
        contract: &Contract,
        claim: Claim,
        receipt: Receipt,
        sent: Option<Event>,
    ) -> Outcome {
        let record = claim.finish();
        let t = transitions::receipt_found(&record, contract, receipt.clone(), sent, self.at());
        self.settle_applied(contract, t, receipt).await
    }

    /// The write that settles (or releases) a claim, in its own `finalise` span.
    async fn finalise(&self, t: Transition) -> Result<Cas, store::Error> {
        self.store
            .transition(t)
            .instrument(tracing::debug_span!("finalise"))
            .await
    }

    async fn settle_applied(
        &self,
        contract: &Contract,
        t: Transition,
        receipt: Receipt,
    ) -> Outcome {
        let key = t.key.clone();
        let attempt = t.fence;
        // Conditional on the fence, not on the lease: a renewal does not change the fence, and
        // a takeover does, so a late finisher cannot overwrite the newer attempt.
        let written = self.finalise(t).await;
        match written {
            Ok(Cas::Done(r)) => {
                self.settled.offer(&r, self.now());
                Outcome::applied(key, receipt.reference, receipt.result)
            }
            Ok(Cas::Lost(Some(r))) => match &r.state {
                RecordState::Applied(stored) => Outcome::replayed(
                    key,
                    Some(stored.reference.clone()),
                    Some(stored.result.clone()),
                ),
                // This attempt was given up on as unknown while its effect was still on the
                // way; nobody else acts on an unknown record, and the attempt is the same, so the
                // late proof settles it.
                RecordState::Unknown(_) if r.fence == attempt => {
                    let t = transitions::complete(&r, contract, receipt.clone(), None, self.at());
                    match self.store.transition(t).await {
                        Ok(Cas::Done(r)) => {
                            self.settled.offer(&r, self.now());
                            Outcome::applied(key, receipt.reference, receipt.result)
                        }
                        Ok(Cas::Lost(_)) | Err(_) => Outcome::unknown(
                            key,
                            "the downstream applied the effect, and the record could not be settled with its receipt; reconcile",
                        )
                        .with_reference(Some(receipt.reference)),
                    }
                }
                RecordState::Pending { .. }
                | RecordState::AwaitingApproval { .. }
                | RecordState::FailedPermanent(_)
                | RecordState::Unknown(_)
                | RecordState::Tombstone(_) => {
                    // Another attempt moved the record while this one's effect committed: the
                    // record no longer tells this effect's story, so nobody may call it settled.
                    tracing::error!(
                        operation_key = key.as_str(),
                        reference = receipt.reference,
                        now = r.status().as_str(),
                        "an effect committed after its claim was taken over"
                    );
                    Outcome::unknown(
                        key,
                        "the downstream applied the effect after this attempt lost its claim; reconcile",
                    )
                    .with_reference(Some(receipt.reference))
                }
            },
            Ok(Cas::Lost(None)) => unrecorded(
                key,
                &receipt,
                &idemgate_core::store::Error::Corrupt("record vanished".into()),
            ),
            Err(e) => unrecorded(key, &receipt, &e),
        }
    }

    async fn job_accepted(
        &self,
        contract: &Contract,
        claim: Claim,
        job_id: String,
        sent: Option<Event>,
    ) -> Outcome {
        let record = claim.finish();
        let key = record.key.clone();
        let t = transitions::job_accepted(&record, contract, job_id.clone(), sent, self.at());
        let written = self.finalise(t).await;
        match written {
            // The downstream may have called back before its 202 reached us: an event kept
            // for this job finishes it now.
            Ok(Cas::Done(recorded)) => match self.apply_early_events(contract, &recorded).await {
                Some(finished) => finished,
                None => Outcome::in_flight(key, NextAction::Poll, machine::JOB_POLL_SECONDS),
            },
            Ok(Cas::Lost(now)) => self.settled_elsewhere(contract, key, now),
            Err(_) => Outcome::unknown(
                key,
                format!("job {job_id} was accepted but could not be recorded"),
            ),
        }
    }

    /// Releases a claim after a provable non-delivery: no owner, nothing sent. Only a new
    /// delivery takes it up again.
    ///
    /// `answer` is what the caller hears when the release is written. When the record moved
    /// meanwhile (the claim was taken over while this attempt ran), the answer comes from the
    /// record as it is now: this attempt's "nothing happened" no longer speaks for the key.
    /// When the write fails, whether it committed cannot be told: the claim may still be
    /// pending under this attempt's lease (which expires, and recovery then sends it, by the
    /// marker, a lookup or a resend — never blindly) or under a newer attempt's that has sent
    /// already. Either way the key may yet have an effect: the caller polls it.
    /// Hands a claim that provably sent nothing back (no owner; only a new delivery runs it
    /// again), and answers the refusal `code` / `reason` from the record as written: safe to
    /// repeat by the machine's proof, since a released claim had no effect.
    pub(crate) async fn release(
        &self,
        contract: &Contract,
        claim: Claim,
        code: ErrorCode,
        reason: &str,
        retry_after: Option<u64>,
        sent: Option<Event>,
    ) -> Outcome {
        let record = claim.finish();
        let t = transitions::release(&record, contract, reason, sent, self.at());
        let written = self.finalise(t).await;
        match written {
            Ok(Cas::Done(released)) => {
                let answer = machine::rejected_for(&released, code, reason);
                match retry_after {
                    Some(seconds) => answer.with_retry_after(seconds),
                    None => answer,
                }
            }
            Ok(Cas::Lost(now)) => self.settled_elsewhere(contract, record.key.clone(), now),
            Err(e) => {
                tracing::warn!(operation_key = record.key.as_str(), error = %e, "release failed");
                let wait = retry_after.unwrap_or(if code.retryable() { 1 } else { 0 });
                Outcome::in_flight(
                    record.key.clone(),
                    NextAction::Poll,
                    wait.max(contract.lease.seconds()),
                )
            }
        }
    }

    /// Leaves a maybe-sent claim to the recoverer until `until`.
    pub(crate) async fn defer(
        &self,
        claim: Claim,
        until: Millis,
        reason: &str,
        sent: Option<Event>,
    ) -> Outcome {
        let record = claim.finish();
        let key = record.key.clone();
        let t = transitions::defer(&record, until, reason, sent, self.at());
        if let Err(e) = self.store.transition(t).await {
            tracing::warn!(operation_key = key.as_str(), error = %e, "deferring failed; the lease expires instead");
        }
        let seconds = ((until - self.now()).max(0) + 999) / 1000;
        Outcome::in_flight(key, NextAction::Poll, seconds as u64)
    }

    /// The outcome cannot be proved: `unknown`, for an operator.
    pub(crate) async fn mark_unknown(
        &self,
        claim: Claim,
        reason: &str,
        reference: Option<String>,
        sent: Option<Event>,
    ) -> Outcome {
        let record = claim.finish();
        let t = transitions::mark_unknown(&record, reason, reference.clone(), sent, self.at());
        self.write_unknown(&record, t, reason, reference).await
    }

    /// `unknown` for a record this worker does not hold the claim of (a recovery or a poll
    /// that cannot prove anything), guarded against what changed since it was read.
    pub(crate) async fn mark_record_unknown(
        &self,
        record: &Record,
        reason: &str,
        reference: Option<String>,
        sent: Option<Event>,
    ) -> Outcome {
        let at = self.at();
        let t = transitions::mark_unknown(record, reason, reference.clone(), sent, at);
        let t = transitions::from_outside(t, record, at);
        self.write_unknown(record, t, reason, reference).await
    }

    async fn write_unknown(
        &self,
        record: &Record,
        t: Transition,
        reason: &str,
        reference: Option<String>,
    ) -> Outcome {
        let key = record.key.clone();
        let written = self.finalise(t).await;
        match written {
            Ok(Cas::Done(_)) => Outcome::unknown(key, reason).with_reference(reference),
            Ok(Cas::Lost(Some(r))) => machine::status_outcome(None, &r, self.now()),
            Ok(Cas::Lost(None)) => Outcome::unknown(key, reason).with_reference(reference),
            // The record stays pending; its lease expires and recovery reaches the same verdict.
            Err(_) => Outcome::unknown(key, reason).with_reference(reference),
        }
    }

    /// A compare-and-set lost: somebody else moved the record. Answer from what it is now,
    /// without another effect.
    pub(crate) fn settled_elsewhere(
        &self,
        contract: &Contract,
        key: OperationKey,
        now: Option<Record>,
    ) -> Outcome {
        match now {
            Some(record) => {
                let o = machine::status_outcome(Some(contract), &record, self.now());
                match o.status {
                    Status::InFlight => {
                        Outcome::in_flight(key, o.next_action, o.retry_after_seconds.unwrap_or(1))
                    }
                    Status::Applied | Status::Replayed | Status::Rejected | Status::Unknown => o,
                }
            }
            None => Outcome::rejected(
                Some(key),
                idemgate_core::outcome::ErrorCode::Conflict,
                "the operation record disappeared while this delivery ran",
            ),
        }
    }
}
