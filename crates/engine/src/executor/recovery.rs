//! Recovery of a pending record whose lease expired or was released: by receipt, by a resend
//! to a deduplicating downstream, by execution only when nothing was sent — or `unknown`.
//! Never a blind resend, and never a send without a fresh authorization of the recorded actor.

use idemgate_core::contract::Contract;
use idemgate_core::effect::{Downstream, Lookup};
use idemgate_core::machine::{self, Bounds, Miss, Prior, Recovery};
use idemgate_core::outcome::{ErrorCode, NextAction, Outcome};
use idemgate_core::record::{Record, RecordState};
use idemgate_core::store::Cas;
use idemgate_core::transitions;
use serde_json::Value;

use super::authorize::Refused;
use super::perform::{Claim, backoff};
use super::{Executor, store_down};

impl Executor {
    /// Recovers `record`, found pending with an expired lease (or released, when a new
    /// delivery found it). `delivery` is that delivery's arguments: used only to fill a claim
    /// that never sent anything and kept no request — never sent in place of the stored one.
    pub(crate) async fn recover(
        &self,
        contract: &Contract,
        record: Record,
        delivery: Option<&Value>,
        effect: &dyn Downstream,
    ) -> Outcome {
        let key = record.key.clone();
        let bounds = Bounds {
            max_attempts: self.settings.max_attempts,
            now: self.now(),
        };
        match machine::plan_recovery(contract, &record, bounds) {
            Recovery::Execute => {
                self.take_over(contract, record, delivery, effect, Prior::Clean)
                    .await
            }
            Recovery::Resend => {
                self.take_over(contract, record, None, effect, Prior::MaybeSent)
                    .await
            }
            Recovery::Expire => self.expire_unsent(contract, record).await,
            Recovery::GiveUp(reason) => self.mark_record_unknown(&record, &reason, None, None).await,
            Recovery::Lookup { on_miss } => match effect.lookup_receipt(&key).await {
                Lookup::Found(receipt) if !receipt.reference.is_empty() => {
                    let t =
                        transitions::receipt_found(&record, contract, receipt.clone(), None, self.at());
                    match self.store.transition(t).await {
                        Ok(Cas::Done(r)) => {
                            self.settled.offer(&r, self.now());
                            Outcome::replayed(key, Some(receipt.reference), Some(receipt.result))
                        }
                        Ok(Cas::Lost(now)) => self.settled_elsewhere(contract, key, now),
                        Err(e) => super::unrecorded(key, &receipt, &e),
                    }
                }
                Lookup::Found(_) | Lookup::NotFound => match on_miss {
                    Miss::Resend => {
                        self.take_over(contract, record, None, effect, Prior::MaybeSent)
                            .await
                    }
                    Miss::Unknown => {
                        self.mark_record_unknown(
                            &record,
                            "dispatch may have started and the downstream has no receipt for the key",
                            None,
                            None,
                        )
                        .await
                    }
                },
                Lookup::Unavailable(reason) => match on_miss {
                    // A resend to a deduplicating downstream settles it as well as a lookup.
                    Miss::Resend => {
                        self.take_over(contract, record, None, effect, Prior::MaybeSent)
                            .await
                    }
                    // Nothing is decided by an unreachable lookup: ask again after a backoff.
                    // The retry window bounds how long (`plan_recovery` gives up past it).
                    Miss::Unknown => {
                        tracing::warn!(operation_key = key.as_str(), reason, "receipt lookup unavailable");
                        self.defer_record(contract, &record, &reason, None).await
                    }
                },
            },
        }
    }

    /// Takes over an expired or released claim (the fence grows), rechecks the recorded
    /// actor's authorization, then sends the stored request under the same operation key.
    async fn take_over(
        &self,
        contract: &Contract,
        record: Record,
        fill: Option<&Value>,
        effect: &dyn Downstream,
        prior: Prior,
    ) -> Outcome {
        let key = record.key.clone();
        let t = transitions::take_over(&record, contract, fill, self.at());
        let claim = match self.store.transition(t).await {
            Ok(Cas::Done(r)) => Claim::new(r),
            Ok(Cas::Lost(now)) => return self.settled_elsewhere(contract, key, now),
            Err(e) => return store_down(Some(key), &e),
        };
        match self.authorize_send(contract, claim.record()).await {
            Ok(proof) => self.perform(contract, claim, proof, effect, prior).await,
            Err(refused) => match prior {
                // Nothing was sent: hand the claim back. Only a new delivery, authorized
                // afresh, runs it again.
                Prior::Clean => {
                    self.release(
                        contract,
                        claim,
                        refused.code(),
                        &refused.reason(),
                        None,
                        None,
                    )
                    .await
                }
                // An earlier attempt may have committed, and no resend may go out for this
                // actor: only an operator can settle it.
                Prior::MaybeSent => match refused {
                    Refused::Denied(_) => {
                        let reason = format!(
                            "{}; an earlier attempt may have committed and no resend may be sent",
                            refused.reason()
                        );
                        self.mark_unknown(claim, &reason, None, None).await
                    }
                    Refused::Unavailable(_) => {
                        let until = self.now().saturating_add(backoff(
                            contract,
                            claim.record().fence,
                            None,
                        ));
                        self.defer(claim, until, &refused.reason(), None).await
                    }
                },
            },
        }
    }

    /// Leaves a maybe-sent record this worker does not own for a later attempt.
    async fn defer_record(
        &self,
        contract: &Contract,
        record: &Record,
        reason: &str,
        retry_after: Option<u64>,
    ) -> Outcome {
        let key = record.key.clone();
        let until = self
            .now()
            .saturating_add(backoff(contract, record.fence, retry_after));
        let at = self.at();
        let t = transitions::from_outside(
            transitions::defer(record, until, reason, None, at),
            record,
            at,
        );
        match self.store.transition(t).await {
            Ok(Cas::Done(_)) | Err(_) => {
                let seconds = ((until - self.now()).max(0) + 999) / 1000;
                Outcome::in_flight(key, NextAction::Poll, seconds as u64)
            }
            Ok(Cas::Lost(now)) => self.settled_elsewhere(contract, key, now),
        }
    }

    /// A claim that provably never sent anything, past its retry window: it expires as never
    /// run, and a late delivery hears so.
    pub(crate) async fn expire_unsent(&self, contract: &Contract, record: Record) -> Outcome {
        let key = record.key.clone();
        let t = transitions::expire_unsent(&record, contract, self.at());
        match self.store.transition(t).await {
            Ok(Cas::Done(r)) => machine::status_outcome(Some(contract), &r, self.now()),
            Ok(Cas::Lost(now)) => self.settled_elsewhere(contract, key, now),
            Err(e) => store_down(Some(key), &e),
        }
    }

    /// An approval that waited past its window: a refusal, nothing ran.
    pub(crate) async fn expire_approval(&self, contract: &Contract, record: Record) -> Outcome {
        let key = record.key.clone();
        match record.state {
            RecordState::AwaitingApproval { .. } => {}
            RecordState::Pending { .. }
            | RecordState::Applied(_)
            | RecordState::FailedPermanent(_)
            | RecordState::Unknown(_)
            | RecordState::Tombstone(_) => {
                return machine::status_outcome(Some(contract), &record, self.now());
            }
        }
        let t = transitions::expire_approval(&record, contract, self.at());
        match self.store.transition(t).await {
            Ok(Cas::Done(r)) => {
                self.settled.offer(&r, self.now());
                machine::status_outcome(Some(contract), &r, self.now())
            }
            Ok(Cas::Lost(now)) => self.settled_elsewhere(contract, key, now),
            // Unwritten, the record may still await approval, and an approval would send it.
            Err(_) => Outcome::rejected(
                Some(key),
                ErrorCode::ApprovalExpired,
                transitions::approval_expired(contract).message,
            ),
        }
    }
}
