//! A delivery: validate, derive the key, fingerprint, then claim — or load what is there and
//! let `machine::branch` decide.

use std::sync::atomic::Ordering;

use idemgate_core::contract::{Contract, EffectClass};
use idemgate_core::effect::{AuthStage, Downstream, EffectRequest};
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::machine::{self, AfterEffect, Branch, Prior};
use idemgate_core::outcome::{ErrorCode, NextAction, Outcome, Repeatable};
use idemgate_core::record::Record;
use idemgate_core::store::Claimed;
use idemgate_core::transitions::{self, Hold};
use serde_json::Value;
use tracing::Instrument;

use super::perform::Claim;
use super::{Executor, Operation, store_down};

/// Why a delivery's operation key could not be derived.
pub(crate) enum KeyProblem {
    /// One of workflow_id and step_id is absent.
    Missing(&'static str),
    Invalid(idemgate_core::key::Error),
}

impl Operation {
    pub(crate) fn key(&self) -> Result<Option<OperationKey>, KeyProblem> {
        match (&self.workflow_id, &self.step_id) {
            (None, None) => Ok(None),
            (Some(_), None) => Err(KeyProblem::Missing("step_id")),
            (None, Some(_)) => Err(KeyProblem::Missing("workflow_id")),
            (Some(workflow), Some(step)) => {
                OperationKey::new(&self.caller.tenant, &self.environment, workflow, step)
                    .map(Some)
                    .map_err(KeyProblem::Invalid)
            }
        }
    }
}

impl Executor {
    /// Executes one delivery of `arguments` for `operation` under `contract`, performing the
    /// effect through `effect` at most once per operation key.
    ///
    /// This future is the delivery: dropping it stops it wherever it is (a claim left
    /// unfinished is recovered after its lease). A face whose callers may go away while an
    /// effect runs uses [`Executor::execute_detached`] instead.
    pub async fn execute(
        &self,
        contract: &Contract,
        operation: &Operation,
        arguments: &Value,
        effect: &dyn Downstream,
    ) -> Outcome {
        // One span per delivery; its children are the claim, the authorization hook, the
        // downstream call and the finalising write. The outcome and the fence are recorded on it
        // as they become known. The children are at debug: a log at info neither creates nor
        // formats them, while the trace exporter enables them.
        let span = tracing::info_span!(
            "delivery",
            tool = contract.name.as_str(),
            operation_key = tracing::field::Empty,
            outcome = tracing::field::Empty,
            attempt = tracing::field::Empty,
            fence = tracing::field::Empty,
        );
        self.deliver(contract, operation, arguments, effect)
            .instrument(span)
            .await
    }

    /// A delivery that memory alone answers: the replay of a settled record this executor
    /// keeps (the `settled` module), of a tool whose replays ask no hook. `None` when the
    /// delivery needs anything more — a store read, a write, a hook, a refusal — and then
    /// [`Executor::execute`] (or its detached form) runs it whole, from the start.
    ///
    /// Not async, on purpose: it reads no store and asks no hook, so a face may call it on a
    /// thread that must never wait (Node's event loop, an interpreter holding its lock), and
    /// spare a replay the hop to the runtime's threads and back.
    pub fn replay_from_memory(
        &self,
        contract: &Contract,
        operation: &Operation,
        arguments: &Value,
        effect: &dyn Downstream,
    ) -> Option<Outcome> {
        // The cheap tests first: a unique key (most deliveries that are no replay) costs the
        // key and one lookup in memory.
        let keyed = matches!(
            contract.effect_class,
            EffectClass::NaturalIdempotent | EffectClass::KeyBased | EffectClass::Irreversible
        );
        if !keyed || (contract.recheck_authorization() && self.authorizer.asks(&contract.name)) {
            return None;
        }
        let key = operation.key().ok()??;
        let record = self.settled.get(&key, self.now())?;
        // An older version's record compares under its own version: `existing` does that.
        if record.tool_version != contract.version {
            return None;
        }
        // The same checks, in the same order, as `deliver`: any refusal goes the long way.
        contract.validate(arguments).ok()?;
        let fingerprint = contract.fingerprint(arguments).ok()?;
        effect.check(arguments).ok()?;
        let Branch::Replay(outcome) = machine::branch(contract, &record, &fingerprint, self.now())
        else {
            return None;
        };
        let span = tracing::info_span!(
            "delivery",
            tool = contract.name.as_str(),
            operation_key = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let _entered = span.enter();
        Some(self.observe(&contract.name, Some(&fingerprint), outcome))
    }

    async fn deliver(
        &self,
        contract: &Contract,
        operation: &Operation,
        arguments: &Value,
        effect: &dyn Downstream,
    ) -> Outcome {
        let tool = contract.name.as_str();
        // Bad input leaves no record: validation, key, fingerprint and the downstream's own
        // check of the arguments all come before any write.
        if let Err(e) = contract.validate(arguments) {
            let o = self
                .refuse(operation, ErrorCode::InvalidArguments, e.message)
                .await;
            return self.observe(tool, None, o);
        }
        let key = match operation.key() {
            Ok(key) => key,
            Err(KeyProblem::Missing(part)) => {
                return self.observe(
                    tool,
                    None,
                    Outcome::refused(
                        Repeatable::unnamed(),
                        ErrorCode::MissingOperationKey,
                        format!("the operation names no {part}; give both workflow_id and step_id"),
                    ),
                );
            }
            Err(KeyProblem::Invalid(e)) => {
                return self.observe(
                    tool,
                    None,
                    Outcome::refused(
                        Repeatable::unnamed(),
                        ErrorCode::InvalidOperationKey,
                        e.to_string(),
                    ),
                );
            }
        };
        let fingerprint = match contract.fingerprint(arguments) {
            Ok(fp) => fp,
            Err(e) => {
                let o = self
                    .refuse(operation, ErrorCode::InvalidArguments, e.message)
                    .await;
                return self.observe(tool, None, o);
            }
        };
        if let Err(message) = effect.check(arguments) {
            let o = self
                .refuse(operation, ErrorCode::InvalidArguments, message)
                .await;
            return self.observe(tool, Some(&fingerprint), o);
        }
        let outcome = match (contract.effect_class, key) {
            (EffectClass::NonIdempotent, _) => {
                self.refuse(
                    operation,
                    ErrorCode::EffectClassRefused,
                    "non_idempotent tools are not executed; redesign as a keyed command",
                )
                .await
            }
            (EffectClass::Read, _) | (EffectClass::NaturalIdempotent, None) => {
                self.unkeyed(contract, operation, arguments, &fingerprint, effect)
                    .await
            }
            (EffectClass::KeyBased | EffectClass::Irreversible, None) => Outcome::refused(
                Repeatable::unnamed(),
                ErrorCode::MissingOperationKey,
                format!(
                    "{tool} is {}: the calling application must name the workflow_id and step_id of this operation",
                    contract.effect_class.as_str()
                ),
            ),
            (
                EffectClass::NaturalIdempotent | EffectClass::KeyBased | EffectClass::Irreversible,
                Some(key),
            ) => {
                self.keyed(contract, operation, key, arguments, &fingerprint, effect)
                    .await
            }
        };
        self.observe(tool, Some(&fingerprint), outcome)
    }

    /// The machine's answer to a delivery refused before its key's record was read (invalid
    /// arguments; or, from a face, a body too large or malformed once the key is known):
    /// whether the refusal may say `safe_to_repeat` depends on what the key already holds, so
    /// it is read — only on this path, and never written. A delivery that named no operation
    /// (or no valid key) proves nothing happened under any key; a key that cannot be read proves
    /// nothing at all.
    pub async fn refuse(
        &self,
        operation: &Operation,
        code: ErrorCode,
        message: impl Into<String>,
    ) -> Outcome {
        let key = match operation.key() {
            Ok(Some(key)) => key,
            Ok(None) | Err(_) => return Outcome::refused(Repeatable::unnamed(), code, message),
        };
        match self.store.get(&key).await {
            Ok(read) => machine::rejected_after_read(&key, read.as_ref(), code, message),
            Err(e) => {
                tracing::warn!(operation_key = key.as_str(), error = %e, "refusal: the key could not be read");
                Outcome::rejected(Some(key), code, message)
            }
        }
    }

    /// Reads and key-less natural-idempotent updates: no claim and no record; repeating them is
    /// harmless by the contract's own declaration.
    async fn unkeyed(
        &self,
        contract: &Contract,
        operation: &Operation,
        arguments: &Value,
        fingerprint: &Fingerprint,
        effect: &dyn Downstream,
    ) -> Outcome {
        let caller = &operation.caller;
        let proof = match self
            .authorize_new(contract, caller, None, fingerprint)
            .await
        {
            Ok(proof) => proof,
            // A key-less call: nothing was sent, under no key.
            Err(refused) => return refused.outcome(None, Some(Repeatable::unnamed())),
        };
        // A key-less call is no retry of anything: it goes out under an idempotency key of its
        // own, never one derived from its content, so that a downstream deduplicating on keys
        // cannot answer "set 5" with the cached result of an earlier, different "set 5".
        let n = self.unkeyed.fetch_add(1, Ordering::Relaxed);
        let once = match OperationKey::new(
            &caller.tenant,
            &operation.environment,
            "unkeyed",
            &format!("{}.{n}", self.settings.worker),
        ) {
            Ok(key) => key,
            Err(e) => {
                return Outcome::refused(
                    Repeatable::unnamed(),
                    ErrorCode::InvalidOperationKey,
                    e.to_string(),
                );
            }
        };
        let request = EffectRequest {
            key: &once,
            tool: &contract.name,
            tool_version: &contract.version,
            arguments,
            attempt: 1,
            precondition: contract.precondition(arguments),
        };
        // Repeating a key-less read or absolute update is harmless by the contract's own
        // declaration (this path is only taken for those classes).
        let harmless =
            || Repeatable::harmless(contract.effect_class).unwrap_or_else(Repeatable::unnamed);
        let repeatable = |o: Outcome| o.repeatable(harmless());
        let answer = self.send_unkeyed(proof, request, effect).await;
        match machine::after_effect(contract, answer, Prior::Clean) {
            AfterEffect::Apply(r) => repeatable(Outcome::applied(once, r.reference, r.result)),
            AfterEffect::Job(job_id) => repeatable(
                Outcome::in_flight(once, NextAction::Poll, machine::JOB_POLL_SECONDS)
                    .with_reference(Some(job_id)),
            ),
            AfterEffect::Refuse(refusal) => {
                Outcome::refused(harmless(), refusal.code, refusal.message)
            }
            AfterEffect::Release { code, reason, .. } => Outcome::refused(harmless(), code, reason),
            AfterEffect::Ambiguous { reason, .. } | AfterEffect::Unproven(reason) => {
                let mut o = repeatable(Outcome::unknown(once, reason));
                o.next_action = NextAction::None;
                o.retry_after_seconds = Some(1);
                o
            }
        }
    }

    async fn keyed(
        &self,
        contract: &Contract,
        operation: &Operation,
        key: OperationKey,
        arguments: &Value,
        fingerprint: &Fingerprint,
        effect: &dyn Downstream,
    ) -> Outcome {
        // A read first: a replay must never write, and most duplicates are replays. A settled
        // record seen before cannot have changed since, and is not read again. Where the
        // store's claim of an existing key writes nothing and reads it in the same round trip,
        // and nothing between the read and the claim could refuse this delivery (no hook to
        // ask, no duplicate-intent check), the claim is the read.
        let existing = match self.settled.get(&key, self.now()) {
            Some(record) => Some(record),
            None if self.claim_is_read(contract) => None,
            None => match self.store.get(&key).await {
                Ok(Some(record)) => {
                    self.settled.offer(&record, self.now());
                    Some(record)
                }
                Ok(None) => None,
                Err(e) => return store_down(Some(key), &e),
            },
        };
        if let Some(record) = existing {
            return self
                .existing(contract, operation, record, arguments, fingerprint, effect)
                .await;
        }
        let caller = &operation.caller;
        // The caller becomes the recorded actor: this decision is the first send's proof, and
        // an unauthorized caller leaves no record.
        let proof = match self
            .authorize_new(contract, caller, Some(&key), fingerprint)
            .await
        {
            Ok(proof) => proof,
            // The read before the claim found no record, so nothing happened under the key
            // (where the claim is the read, no hook is asked before it, so this is not reached).
            Err(refused) => {
                let proof =
                    (!self.claim_is_read(contract)).then(|| machine::repeatable(&key, None));
                return refused.outcome(Some(key), proof.flatten());
            }
        };
        let hold = if contract.needs_approval(arguments) {
            Hold::ForApproval
        } else {
            Hold::No
        };
        let at = self.at();
        let (record, events) = transitions::new_record(
            contract,
            key.clone(),
            fingerprint.clone(),
            &caller.actor,
            arguments,
            &hold,
            at,
        );
        // A claim sent at once by a tool that writes the dispatch marker carries the marker:
        // claimed and marked in one durable write rather than two in turn (the second was
        // written straight after the first, with nothing between them that could stop the send).
        // A claim whose write fails is answered as any store failure: nothing was sent. Should
        // the write have committed all the same, its record says maybe sent and ends `unknown`
        // rather than released: this delivery cannot tell its own claim from an identical one
        // made by another caller of the same key in the same millisecond, which may have sent.
        let marked = contract.duplicate_intent_window().is_none()
            && matches!(hold, Hold::No)
            && contract.uses_dispatch_marker();
        // The store's unique key decides: inserted, or somebody else's record comes back. With
        // a duplicate-intent window, the window's check is part of the same atomic claim.
        let claimed = match contract.duplicate_intent_window() {
            Some(window) => {
                self.store
                    .claim_unless_duplicate(record, events, at.now - window.millis())
                    .instrument(tracing::debug_span!("claim"))
                    .await
            }
            None if marked => {
                let (record, events) = transitions::claimed_as_sent(record, events, at);
                self.store
                    .claim(record, events)
                    .instrument(tracing::debug_span!("claim"))
                    .await
            }
            None => {
                self.store
                    .claim(record, events)
                    .instrument(tracing::debug_span!("claim"))
                    .await
            }
        };
        match claimed {
            Err(e) => store_down(Some(key), &e),
            Ok(Claimed::Existing(record)) => {
                self.settled.offer(&record, self.now());
                self.existing(contract, operation, record, arguments, fingerprint, effect)
                    .await
            }
            Ok(Claimed::DuplicateIntent(other)) => {
                self.hold_duplicate(
                    contract,
                    operation,
                    key,
                    other,
                    arguments,
                    fingerprint,
                    effect,
                )
                .await
            }
            Ok(Claimed::Inserted(record)) => match hold {
                Hold::No => {
                    let claim = if marked {
                        Claim::marked(record)
                    } else {
                        Claim::new(record)
                    };
                    self.perform(contract, claim, proof, effect, Prior::Clean)
                        .await
                }
                Hold::ForApproval | Hold::ForDuplicateIntent(_) => Outcome::in_flight(
                    key,
                    NextAction::AskForApproval,
                    machine::APPROVAL_POLL_SECONDS,
                ),
            },
        }
    }

    /// Whether this delivery's claim stands in for the read before it (see `keyed`): the store
    /// says a claim of an existing key writes nothing, the contract has no duplicate-intent
    /// window (whose check must not run for a replay), and the decision before the claim asks
    /// no hook, so that claiming before knowing whether the key is new changes nothing a hook
    /// or the trace could see.
    fn claim_is_read(&self, contract: &Contract) -> bool {
        self.store.claim_replaces_read()
            && contract.duplicate_intent_window().is_none()
            && (!contract.recheck_authorization() || !self.authorizer.asks(&contract.name))
    }

    /// The same request ran under `other` within the window: hold this one for an operator,
    /// who may approve it as intended (a second effect) or deny it. Nothing runs now.
    #[allow(clippy::too_many_arguments)]
    async fn hold_duplicate(
        &self,
        contract: &Contract,
        operation: &Operation,
        key: OperationKey,
        other: OperationKey,
        arguments: &Value,
        fingerprint: &Fingerprint,
        effect: &dyn Downstream,
    ) -> Outcome {
        let (record, events) = transitions::new_record(
            contract,
            key.clone(),
            fingerprint.clone(),
            &operation.caller.actor,
            arguments,
            &Hold::ForDuplicateIntent(other.clone()),
            self.at(),
        );
        match self.store.claim(record, events).await {
            Err(e) => store_down(Some(key), &e),
            Ok(Claimed::Inserted(_)) => Outcome::rejected(
                Some(key.clone()),
                ErrorCode::PossibleDuplicateIntent,
                format!(
                    "the same request ran under operation {other} within the contract's \
                     duplicate-intent window; nothing ran. If a second effect is really \
                     intended, an operator approves operation {key}; poll it for the result"
                ),
            ),
            Ok(Claimed::Existing(record)) => {
                self.existing(contract, operation, record, arguments, fingerprint, effect)
                    .await
            }
            Ok(Claimed::DuplicateIntent(_)) => store_down(
                Some(key),
                &idemgate_core::store::Error::Corrupt(
                    "a plain claim answered a duplicate intent".into(),
                ),
            ),
        }
    }

    /// A delivery found a record under its key.
    async fn existing(
        &self,
        contract: &Contract,
        operation: &Operation,
        record: Record,
        arguments: &Value,
        fingerprint: &Fingerprint,
        effect: &dyn Downstream,
    ) -> Outcome {
        // An older version's record is compared under the version it was claimed with: the
        // same material request under that version replays; anything else is a mismatch.
        let incoming = if record.tool_version == contract.version {
            fingerprint.clone()
        } else {
            match contract.canonicalize_as(&record.tool_version, arguments) {
                Ok(c) => Fingerprint::of(&c),
                Err(e) => {
                    return machine::rejected_for(&record, ErrorCode::InvalidArguments, e.message);
                }
            }
        };
        let caller = &operation.caller;
        match machine::branch(contract, &record, &incoming, self.now()) {
            Branch::Replay(outcome) => {
                // An idempotency hit is no authorization bypass.
                match self
                    .authorize_caller(
                        contract,
                        caller,
                        Some(&record.key),
                        &incoming,
                        AuthStage::BeforeReplay,
                    )
                    .await
                {
                    Ok(()) => outcome,
                    Err(refused) => refused.outcome(Some(record.key), None),
                }
            }
            Branch::Refuse(outcome) | Branch::Wait(outcome) => outcome,
            // Later evidence (the job's end, a receipt) may settle it now, by no send.
            Branch::Unknown(outcome) => {
                let Some(settled) = self.seek_evidence(contract, &record, effect).await else {
                    return outcome;
                };
                // The settled record hands out a result: the same recheck as any replay.
                if let Err(refused) = self
                    .authorize_caller(
                        contract,
                        caller,
                        Some(&settled.key),
                        &incoming,
                        AuthStage::BeforeReplay,
                    )
                    .await
                {
                    return refused.outcome(Some(settled.key), None);
                }
                machine::status_outcome(Some(contract), &settled, self.now())
            }
            Branch::ExpireApproval => self.expire_approval(contract, record).await,
            Branch::PollJob { job_id } => {
                // A finished job hands out its result: the same recheck as any replay.
                if let Err(refused) = self
                    .authorize_caller(
                        contract,
                        caller,
                        Some(&record.key),
                        &incoming,
                        AuthStage::BeforeReplay,
                    )
                    .await
                {
                    return refused.outcome(Some(record.key), None);
                }
                self.poll_job(
                    contract,
                    record,
                    &job_id,
                    effect,
                    super::jobs::Poller::Delivery,
                )
                .await
            }
            Branch::Recover => {
                // The delivering caller must be allowed to do this at all; the send itself
                // rechecks the recorded actor, right before it goes out.
                if let Err(refused) = self
                    .authorize_caller(
                        contract,
                        caller,
                        Some(&record.key),
                        &incoming,
                        AuthStage::BeforeEffect,
                    )
                    .await
                {
                    let proof = machine::repeatable(&record.key, Some(&record));
                    return refused.outcome(Some(record.key), proof);
                }
                self.recover(contract, record, Some(arguments), effect)
                    .await
            }
        }
    }
}
