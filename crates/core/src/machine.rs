//! The executor's decisions, as pure functions from records to data.
//!
//! **The executor decides, the shell acts.** Nothing here reads a clock, a store or a network:
//! the async driver (`idemgate-engine`) passes in what it observed and carries out what comes
//! back, so every branch below is tested without I/O. Every match over a state, a dispatch or
//! an answer is exhaustive: a new variant must be decided here before anything compiles.

use crate::contract::{Contract, LateArrival};
use crate::effect::EffectOutcome;
use crate::fingerprint::Fingerprint;
use crate::key::OperationKey;
use crate::outcome::{ErrorBody, ErrorCode, NextAction, Outcome, Repeatable};
use crate::record::{Digest, Dispatch, Millis, Receipt, Record, RecordState, Refusal};

/// Seconds a caller is told to wait before polling an operation that awaits approval.
pub const APPROVAL_POLL_SECONDS: u64 = 30;
/// Seconds a caller is told to wait before polling a running job.
pub const JOB_POLL_SECONDS: u64 = 2;

/// Whether the key of `record` may have had an effect. Only a key that provably had none may
/// be answered `safe_to_repeat: true`.
pub fn may_have_effect(record: &Record) -> bool {
    match &record.state {
        // Held, refused, released or never run: nothing was sent, or the refusal proves
        // nothing happened.
        RecordState::AwaitingApproval { .. }
        | RecordState::FailedPermanent(_)
        | RecordState::Tombstone(Digest::Refused { .. } | Digest::NeverRan) => false,
        RecordState::Pending { lease, dispatch } => match dispatch {
            // A released claim: released only on a provable non-delivery.
            Dispatch::NotSent => lease.owner.is_some(),
            Dispatch::Sent | Dispatch::Job { .. } => true,
        },
        RecordState::Applied(_)
        | RecordState::Unknown(_)
        | RecordState::Tombstone(Digest::Applied { .. }) => true,
    }
}

/// The proof that `key` has had no effect, from what a read of it found: no record, or one
/// that provably had no effect ([`may_have_effect`]). `None` when the read found one that may
/// have. The read's moment is the proof's: an answer built from it is true as of the read.
pub fn repeatable(key: &OperationKey, read: Option<&Record>) -> Option<Repeatable> {
    match read {
        None => Some(Repeatable::proven(key.clone())),
        Some(record) if !may_have_effect(record) => Some(Repeatable::proven(record.key.clone())),
        Some(_) => None,
    }
}

/// A rejection of a delivery for `key`, given what a read of it found (`read`):
/// `safe_to_repeat` only when the key provably had no effect.
pub fn rejected_after_read(
    key: &OperationKey,
    read: Option<&Record>,
    code: ErrorCode,
    message: impl Into<String>,
) -> Outcome {
    match repeatable(key, read) {
        Some(proof) => Outcome::refused(proof, code, message),
        None => Outcome::rejected(Some(key.clone()), code, message),
    }
}

/// A rejection of a delivery that found `record`: `safe_to_repeat` only when the key
/// provably had no effect.
pub fn rejected_for(record: &Record, code: ErrorCode, message: impl Into<String>) -> Outcome {
    rejected_after_read(&record.key, Some(record), code, message)
}

/// What a delivery does when its key already has a record.
#[derive(Debug, Clone, PartialEq)]
pub enum Branch {
    /// Hand out the stored result, after the authorization recheck.
    Replay(Outcome),
    /// Answer without any effect or write (mismatch, stored refusal, expired key).
    Refuse(Outcome),
    /// Another worker owns it, or it awaits approval.
    Wait(Outcome),
    /// An accepted job: poll it, then decide.
    PollJob { job_id: String },
    /// Pending with an expired or released lease: recovery, not re-execution.
    Recover,
    /// Awaiting approval past its window: expire it (a refusal, nothing ran), then answer.
    ExpireApproval,
    /// The outcome is unknown: reconcile.
    Unknown(Outcome),
}

/// Decides what a delivery with fingerprint `incoming` does with the existing `record`.
/// `incoming` must have been computed under the record's tool version.
pub fn branch(contract: &Contract, record: &Record, incoming: &Fingerprint, now: Millis) -> Branch {
    let key = record.key.clone();
    if &record.fingerprint != incoming {
        return Branch::Refuse(rejected_for(
            record,
            ErrorCode::IdempotencyKeyReusedWithDifferentRequest,
            format!(
                "operation key was first used with fingerprint {} and now arrives with {}; \
                 nothing was executed or updated",
                record.fingerprint, incoming
            ),
        ));
    }
    match &record.state {
        RecordState::Applied(receipt) => {
            if now >= record.expires_at {
                late_arrival(
                    contract,
                    record,
                    &Digest::Applied {
                        reference: receipt.reference.clone(),
                    },
                )
            } else {
                Branch::Replay(Outcome::replayed(
                    key,
                    Some(receipt.reference.clone()),
                    Some(receipt.result.clone()),
                ))
            }
        }
        RecordState::FailedPermanent(refusal) => Branch::Refuse(refused(record, refusal)),
        RecordState::Pending { lease, dispatch } => match dispatch {
            Dispatch::Job { job_id } => Branch::PollJob {
                job_id: job_id.clone(),
            },
            Dispatch::NotSent | Dispatch::Sent => {
                if lease.owner.is_none() || lease.expires_at <= now {
                    Branch::Recover
                } else {
                    let wait = (lease.expires_at - now + 999) / 1000;
                    Branch::Wait(Outcome::in_flight(key, NextAction::Poll, wait as u64))
                }
            }
        },
        RecordState::AwaitingApproval { until } => {
            if *until <= now {
                Branch::ExpireApproval
            } else {
                Branch::Wait(Outcome::in_flight(
                    key,
                    NextAction::AskForApproval,
                    APPROVAL_POLL_SECONDS,
                ))
            }
        }
        RecordState::Unknown(evidence) => Branch::Unknown(
            Outcome::unknown(key, evidence.reason.clone())
                .with_reference(evidence.reference.clone()),
        ),
        RecordState::Tombstone(digest) => late_arrival(contract, record, digest),
    }
}

/// The stored refusal, replayed as the same refusal. A refusal proves nothing happened.
pub fn refused(record: &Record, refusal: &Refusal) -> Outcome {
    rejected_for(record, refusal.code, refusal.message.clone())
}

/// A delivery for a record past its retention, by what it settled as and the contract's
/// late-arrival policy. Never a new effect, never `replayed` for an effect that did not happen.
fn late_arrival(contract: &Contract, record: &Record, digest: &Digest) -> Branch {
    let key = record.key.clone();
    let reference = match digest {
        Digest::Refused { code } => {
            return Branch::Refuse(rejected_for(
                record,
                *code,
                "this operation was refused; its record has since expired",
            ));
        }
        Digest::NeverRan => {
            return Branch::Refuse(rejected_for(
                record,
                ErrorCode::ExpiredOperation,
                "this operation never ran and its record expired; a new operation needs new \
                 intent (a new key)",
            ));
        }
        Digest::Applied { reference } => reference.clone(),
    };
    let expired = "the effect of this operation happened and its record expired; a new \
                   operation needs new intent (a new key)";
    match contract.late_arrival() {
        LateArrival::Reject => Branch::Refuse(
            Outcome::rejected(Some(key), ErrorCode::ExpiredOperation, expired)
                .with_reference(Some(reference)),
        ),
        LateArrival::Tombstone => {
            let mut o = Outcome::replayed(key, Some(reference), None);
            o.error = Some(ErrorBody {
                code: ErrorCode::ExpiredOperation,
                message: "the record expired; only the effect reference is kept".into(),
            });
            Branch::Replay(o)
        }
        LateArrival::Reconcile => {
            let mut o = Outcome::unknown(key, expired).with_reference(Some(reference));
            if let Some(e) = o.error.as_mut() {
                e.code = ErrorCode::ExpiredOperation;
            }
            Branch::Unknown(o)
        }
    }
}

/// The bounds on recovering one record: past them, a maybe-sent record ends `unknown` and a
/// provably unsent one expires as never run. Nothing is retried forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Attempts (the fencing token) after which no more resends are made.
    pub max_attempts: u64,
    pub now: Millis,
}

/// The instant after which a record is no longer retried: its claim plus the contract's
/// `max_retry_window` — plus the approval window for an approved record, whose first attempt
/// came only after the approval.
pub fn retry_deadline(contract: &Contract, record: &Record) -> Millis {
    let approval = match record.approved_by {
        Some(_) => contract.approval_window().millis(),
        None => 0,
    };
    record
        .created_at
        .saturating_add(approval)
        .saturating_add(contract.retention.max_retry_window.millis())
}

/// The instant after which a job the downstream still reports running — or whose poll gets no
/// answer — ends `unknown`: its claim plus the contract's job deadline
/// ([`Contract::max_running`]) — plus the approval window for an approved record.
pub fn job_deadline(contract: &Contract, record: &Record) -> Millis {
    let approval = match record.approved_by {
        Some(_) => contract.approval_window().millis(),
        None => 0,
    };
    record
        .created_at
        .saturating_add(approval)
        .saturating_add(contract.max_running().millis())
}

/// How an abandoned pending record is recovered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// Nothing was sent: take the claim over and perform the effect.
    Execute,
    /// Ask the downstream for a receipt by key; found ⇒ applied.
    Lookup { on_miss: Miss },
    /// Take the claim over and resend under the same key: the downstream deduplicates.
    Resend,
    /// Nothing was sent and the retry window has passed: it expires as never run.
    Expire,
    /// No way to prove the outcome: `unknown`, to reconciliation.
    GiveUp(String),
}

/// What a receipt lookup that finds nothing leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    Resend,
    Unknown,
}

/// Plans the recovery of a pending `record` whose lease expired or was released.
pub fn plan_recovery(contract: &Contract, record: &Record, bounds: Bounds) -> Recovery {
    let (lease, dispatch) = match &record.state {
        RecordState::Pending { lease, dispatch } => (lease, dispatch),
        RecordState::AwaitingApproval { .. }
        | RecordState::Applied(_)
        | RecordState::FailedPermanent(_)
        | RecordState::Unknown(_)
        | RecordState::Tombstone(_) => {
            return Recovery::GiveUp(format!(
                "record is {}, not pending",
                record.status().as_str()
            ));
        }
    };
    let provably_unsent = match dispatch {
        Dispatch::NotSent => lease.owner.is_none() || contract.uses_dispatch_marker(),
        Dispatch::Sent | Dispatch::Job { .. } => false,
    };
    let out_of_time = bounds.now >= retry_deadline(contract, record);
    if record.tool_version != contract.version {
        // Newer code never drives an older version's pending record by itself: the meaning of
        // its arguments may have changed. A receipt, or an operator, settles it.
        return if provably_unsent && out_of_time {
            Recovery::Expire
        } else if contract.receipt_lookup() && !out_of_time {
            Recovery::Lookup {
                on_miss: Miss::Unknown,
            }
        } else {
            Recovery::GiveUp(format!(
                "claimed under version {} and the contract is now {}; an operator must reconcile",
                record.tool_version, contract.version
            ))
        };
    }
    if provably_unsent {
        return if out_of_time {
            Recovery::Expire
        } else {
            Recovery::Execute
        };
    }
    let resend = contract.deduplicates() && record.fence < bounds.max_attempts && !out_of_time;
    let on_miss = if resend { Miss::Resend } else { Miss::Unknown };
    if contract.receipt_lookup() && !out_of_time {
        Recovery::Lookup { on_miss }
    } else if resend {
        Recovery::Resend
    } else if contract.deduplicates() {
        Recovery::GiveUp(format!(
            "no receipt after {} attempts within the retry window of {}; the effect may have \
             happened",
            record.fence, contract.retention.max_retry_window
        ))
    } else {
        Recovery::GiveUp(
            "dispatch may have started and the downstream neither deduplicates on the key nor offers a receipt lookup"
                .into(),
        )
    }
}

/// What was known before an attempt was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prior {
    /// Nothing under this key can have reached the downstream before this attempt.
    Clean,
    /// An earlier attempt may have committed (an ambiguous answer, a takeover of a maybe-sent
    /// claim): no answer to this one proves that nothing happened.
    MaybeSent,
}

/// What the executor does with a downstream answer.
#[derive(Debug, Clone, PartialEq)]
pub enum AfterEffect {
    /// Record the receipt and answer applied.
    Apply(Receipt),
    /// Keep the record pending with the job id; answer in_flight.
    Job(String),
    /// Record the refusal (failed_permanent); answer rejected, replayed as the same later.
    Refuse(Refusal),
    /// Provably nothing happened: release the claim so a later delivery may run.
    Release {
        code: ErrorCode,
        reason: String,
        retry_after: Option<u64>,
    },
    /// The effect may have happened: recover (receipt lookup, resend) or end unknown.
    Ambiguous {
        reason: String,
        retry_after: Option<u64>,
    },
    /// A refusal that answered a resend: no proof that the earlier attempt did not commit. A
    /// receipt settles it; otherwise `unknown`, with no further resend.
    Unproven(String),
}

/// Classifies a downstream answer to an attempt made after `prior`.
pub fn after_effect(contract: &Contract, outcome: EffectOutcome, prior: Prior) -> AfterEffect {
    match outcome {
        EffectOutcome::Committed(receipt) => {
            if receipt.reference.is_empty() {
                AfterEffect::Ambiguous {
                    reason: "the downstream answered without an effect reference".into(),
                    retry_after: None,
                }
            } else {
                AfterEffect::Apply(receipt)
            }
        }
        EffectOutcome::Accepted { job_id } => {
            if contract.async_jobs() && !job_id.is_empty() {
                AfterEffect::Job(job_id)
            } else {
                AfterEffect::Ambiguous {
                    reason: "the downstream accepted a job the contract does not declare".into(),
                    retry_after: None,
                }
            }
        }
        EffectOutcome::Refused(refusal) => match prior {
            Prior::Clean => AfterEffect::Refuse(refusal),
            Prior::MaybeSent => AfterEffect::Unproven(format!(
                "an earlier attempt may have committed, and the resend was refused ({}): {}",
                refusal.code.as_str(),
                refusal.message
            )),
        },
        EffectOutcome::PreconditionFailed(reason) => match prior {
            Prior::Clean => AfterEffect::Release {
                code: ErrorCode::PreconditionFailed,
                reason,
                retry_after: None,
            },
            // After an ambiguous attempt, a failed precondition is what the first attempt's
            // own commit would cause.
            Prior::MaybeSent => AfterEffect::Unproven(format!(
                "an earlier attempt may have committed, and the resend's precondition failed: {reason}"
            )),
        },
        EffectOutcome::NotSent {
            reason,
            retry_after,
        } => match prior {
            Prior::Clean => AfterEffect::Release {
                code: ErrorCode::DownstreamUnavailable,
                reason,
                retry_after,
            },
            // This attempt was not processed; the earlier one may have been. Still ambiguous.
            Prior::MaybeSent => AfterEffect::Ambiguous {
                reason: format!(
                    "an earlier attempt may have committed; the resend was not processed: {reason}"
                ),
                retry_after,
            },
        },
        EffectOutcome::Ambiguous {
            reason,
            retry_after,
        } => AfterEffect::Ambiguous {
            reason,
            retry_after,
        },
    }
}

/// The answer a status poll gives for a record, without any effect.
pub fn status_outcome(contract: Option<&Contract>, record: &Record, now: Millis) -> Outcome {
    let key = record.key.clone();
    match &record.state {
        RecordState::Applied(r) => {
            Outcome::replayed(key, Some(r.reference.clone()), Some(r.result.clone()))
        }
        RecordState::FailedPermanent(refusal) => refused(record, refusal),
        RecordState::Pending { lease, dispatch } => {
            let wait = ((lease.expires_at - now).max(0) + 999) / 1000;
            let wait = match (dispatch, &lease.owner) {
                // A job's lease is its next poll; the caller may poll it as often as this.
                (Dispatch::Job { .. }, _) => JOB_POLL_SECONDS,
                // Never more often than a job, and no sooner than the lease ends.
                (Dispatch::NotSent | Dispatch::Sent, Some(_)) => {
                    (wait as u64).max(JOB_POLL_SECONDS)
                }
                // A released claim waits for a new delivery, not for time.
                (Dispatch::NotSent | Dispatch::Sent, None) => 1,
            };
            Outcome::in_flight(key, NextAction::Poll, wait)
        }
        RecordState::AwaitingApproval { until } if *until <= now => rejected_for(
            record,
            ErrorCode::ApprovalExpired,
            "no operator approved this operation within its approval window; nothing ran",
        ),
        RecordState::AwaitingApproval { .. } => {
            Outcome::in_flight(key, NextAction::AskForApproval, APPROVAL_POLL_SECONDS)
        }
        RecordState::Unknown(e) => {
            Outcome::unknown(key, e.reason.clone()).with_reference(e.reference.clone())
        }
        RecordState::Tombstone(d) => match contract {
            Some(c) => match late_arrival(c, record, d) {
                Branch::Replay(o) | Branch::Refuse(o) | Branch::Wait(o) | Branch::Unknown(o) => o,
                Branch::PollJob { .. } | Branch::Recover | Branch::ExpireApproval => {
                    rejected_for(record, ErrorCode::ExpiredOperation, "expired")
                }
            },
            None => rejected_for(record, ErrorCode::ExpiredOperation, "expired")
                .with_reference(d.reference().map(str::to_string)),
        },
    }
}
