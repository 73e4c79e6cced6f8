//! The executor's decisions, as pure functions from records to data.
//!
//! **The executor decides, the shell acts.** Nothing here reads a clock, a store or a network:
//! the async driver (`idemgate-engine`) passes in what it observed and carries out what comes
//! back, so every branch below is tested without I/O.

use crate::contract::{Contract, LateArrival};
use crate::effect::EffectOutcome;
use crate::fingerprint::Fingerprint;
use crate::outcome::{ErrorCode, NextAction, Outcome};
use crate::record::{Digest, Dispatch, Millis, Receipt, Record, RecordState, Refusal};

/// Seconds a caller is told to wait before polling an operation that awaits approval.
pub const APPROVAL_POLL_SECONDS: u64 = 30;
/// Seconds a caller is told to wait before polling a running job.
pub const JOB_POLL_SECONDS: u64 = 2;

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
    /// The outcome is unknown: reconcile.
    Unknown(Outcome),
}

/// Decides what a delivery with fingerprint `incoming` does with the existing `record`.
/// `incoming` must have been computed under the record's tool version.
pub fn branch(contract: &Contract, record: &Record, incoming: &Fingerprint, now: Millis) -> Branch {
    let key = record.key.clone();
    if &record.fingerprint != incoming {
        return Branch::Refuse(Outcome::rejected(
            Some(key),
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
                    &Digest {
                        reference: Some(receipt.reference.clone()),
                        refusal: None,
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
        RecordState::AwaitingApproval => Branch::Wait(Outcome::in_flight(
            key,
            NextAction::AskForApproval,
            APPROVAL_POLL_SECONDS,
        )),
        RecordState::Unknown(evidence) => Branch::Unknown(
            Outcome::unknown(key, evidence.reason.clone())
                .with_reference(evidence.reference.clone()),
        ),
        RecordState::Tombstone(digest) => late_arrival(contract, record, digest),
    }
}

/// The stored refusal, replayed as the same refusal.
pub fn refused(record: &Record, refusal: &Refusal) -> Outcome {
    Outcome::rejected(
        Some(record.key.clone()),
        refusal.code,
        refusal.message.clone(),
    )
}

fn late_arrival(contract: &Contract, record: &Record, digest: &Digest) -> Branch {
    let key = record.key.clone();
    if let Some(code) = digest.refusal {
        return Branch::Refuse(Outcome::rejected(
            Some(key),
            code,
            "this operation was refused; its record has since expired",
        ));
    }
    let expired =
        "the record of this operation expired; a new operation needs new intent (a new key)";
    match contract.late_arrival() {
        LateArrival::Reject => Branch::Refuse(
            Outcome::rejected(Some(key), ErrorCode::ExpiredOperation, expired)
                .with_reference(digest.reference.clone()),
        ),
        LateArrival::Tombstone => {
            let mut o = Outcome::replayed(key, digest.reference.clone(), None);
            o.error = Some(crate::outcome::ErrorBody {
                code: ErrorCode::ExpiredOperation,
                message: "the record expired; only the effect reference is kept".into(),
            });
            Branch::Replay(o)
        }
        LateArrival::Reconcile => {
            let mut o = Outcome::unknown(key, expired).with_reference(digest.reference.clone());
            if let Some(e) = o.error.as_mut() {
                e.code = ErrorCode::ExpiredOperation;
            }
            Branch::Unknown(o)
        }
    }
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
pub fn plan_recovery(contract: &Contract, record: &Record) -> Recovery {
    let RecordState::Pending { lease, dispatch } = &record.state else {
        return Recovery::GiveUp(format!(
            "record is {}, not pending",
            record.status().as_str()
        ));
    };
    if record.tool_version != contract.version {
        // Newer code never drives an older version's pending record by itself: the meaning of
        // its arguments may have changed. A receipt, or an operator, settles it.
        return if contract.receipt_lookup() {
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
    let provably_unsent = matches!(dispatch, Dispatch::NotSent)
        && (lease.owner.is_none() || contract.uses_dispatch_marker());
    if provably_unsent {
        return Recovery::Execute;
    }
    let on_miss = if contract.deduplicates() {
        Miss::Resend
    } else {
        Miss::Unknown
    };
    if contract.receipt_lookup() {
        Recovery::Lookup { on_miss }
    } else if contract.deduplicates() {
        Recovery::Resend
    } else {
        Recovery::GiveUp(
            "dispatch may have started and the downstream neither deduplicates on the key nor offers a receipt lookup"
                .into(),
        )
    }
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
    Ambiguous(String),
}

/// Classifies a downstream answer.
pub fn after_effect(contract: &Contract, outcome: EffectOutcome) -> AfterEffect {
    match outcome {
        EffectOutcome::Committed(receipt) => {
            if receipt.reference.is_empty() {
                AfterEffect::Ambiguous("the downstream answered without an effect reference".into())
            } else {
                AfterEffect::Apply(receipt)
            }
        }
        EffectOutcome::Accepted { job_id } => {
            if contract.async_jobs() && !job_id.is_empty() {
                AfterEffect::Job(job_id)
            } else {
                AfterEffect::Ambiguous(
                    "the downstream accepted a job the contract does not declare".into(),
                )
            }
        }
        EffectOutcome::Refused(refusal) => AfterEffect::Refuse(refusal),
        EffectOutcome::PreconditionFailed(reason) => AfterEffect::Release {
            code: ErrorCode::PreconditionFailed,
            reason,
            retry_after: None,
        },
        EffectOutcome::NotSent {
            reason,
            retry_after,
        } => AfterEffect::Release {
            code: ErrorCode::DownstreamUnavailable,
            reason,
            retry_after,
        },
        EffectOutcome::Ambiguous { reason } => AfterEffect::Ambiguous(reason),
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
        RecordState::Pending { lease, .. } => {
            let wait = ((lease.expires_at - now).max(0) + 999) / 1000;
            Outcome::in_flight(key, NextAction::Poll, (wait as u64).max(JOB_POLL_SECONDS))
        }
        RecordState::AwaitingApproval => {
            Outcome::in_flight(key, NextAction::AskForApproval, APPROVAL_POLL_SECONDS)
        }
        RecordState::Unknown(e) => {
            Outcome::unknown(key, e.reason.clone()).with_reference(e.reference.clone())
        }
        RecordState::Tombstone(d) => match contract {
            Some(c) => match late_arrival(c, record, d) {
                Branch::Replay(o) | Branch::Refuse(o) | Branch::Wait(o) | Branch::Unknown(o) => o,
                Branch::PollJob { .. } | Branch::Recover => {
                    Outcome::rejected(Some(key), ErrorCode::ExpiredOperation, "expired")
                }
            },
            None => Outcome::rejected(Some(key), ErrorCode::ExpiredOperation, "expired")
                .with_reference(d.reference.clone()),
        },
    }
}
