//! What a consumer does with a message once the executor has answered: the decision as data,
//! so that the queue adapter only carries it out.
//!
//! The rule: a message is acknowledged only when its record has settled or has been handed to
//! a person (the reconciliation queue, an approval); a message whose operation is still moving
//! is returned for a later delivery; a message that can never become an operation is refused,
//! so the queue stops redelivering it.

use std::time::Duration;

use idemgate_core::outcome::{ErrorCode, NextAction, Outcome, Status};

/// The pause before a message returned without advice is delivered again.
pub const DEFAULT_RETRY: Duration = Duration::from_secs(1);

/// What happens to one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// The record settled — applied, replayed, or refused by the downstream
    /// (`failed_permanent`, or an approval denied or expired): acknowledge.
    Settled,
    /// The operation left the queue's hands: `unknown` (it waits in the reconciliation queue) or
    /// held for an operator's approval, which performs the effect itself. Acknowledge:
    /// redelivering it would only ask the same question again.
    Parked,
    /// Someone else owns the record for now (a live lease, a running job), or nothing was sent
    /// because something was briefly unavailable: return it, to be delivered after `after`.
    Retry { after: Duration },
    /// The message can never become this operation: a malformed envelope, an unknown tool,
    /// invalid arguments or key, a request that reuses a key for different content, a denied
    /// caller. Nothing was claimed by it and nothing was sent; stop its redelivery.
    Refused {
        code: Option<ErrorCode>,
        reason: String,
    },
}

impl Disposition {
    /// Whether the queue should stop delivering this message.
    pub fn ends_delivery(&self) -> bool {
        match self {
            Disposition::Settled | Disposition::Parked | Disposition::Refused { .. } => true,
            Disposition::Retry { .. } => false,
        }
    }

    /// The label for logs and counts.
    pub fn as_str(&self) -> &'static str {
        match self {
            Disposition::Settled => "settled",
            Disposition::Parked => "parked",
            Disposition::Retry { .. } => "retry",
            Disposition::Refused { .. } => "refused",
        }
    }

    /// The disposition of a message whose delivery the executor answered with `outcome`.
    pub fn of(outcome: &Outcome) -> Disposition {
        let retry = || Disposition::Retry {
            after: outcome
                .retry_after_seconds
                .map(Duration::from_secs)
                .unwrap_or(DEFAULT_RETRY)
                .max(Duration::from_millis(100)),
        };
        match outcome.status {
            Status::Applied | Status::Replayed => Disposition::Settled,
            Status::Unknown => Disposition::Parked,
            Status::InFlight => match outcome.next_action {
                NextAction::AskForApproval => Disposition::Parked,
                NextAction::Poll
                | NextAction::None
                | NextAction::Reconcile
                | NextAction::InspectOperation => retry(),
            },
            Status::Rejected => {
                let Some(code) = outcome.error_code() else {
                    return retry();
                };
                let refused = || Disposition::Refused {
                    code: Some(code),
                    reason: outcome
                        .error
                        .as_ref()
                        .map(|e| e.message.clone())
                        .unwrap_or_default(),
                };
                if code.retryable() {
                    return retry();
                }
                match code {
                    // The record settled as a refusal; a redelivery replays the same refusal.
                    ErrorCode::DownstreamRejected
                    | ErrorCode::ApprovalDenied
                    | ErrorCode::ApprovalExpired
                    | ErrorCode::ExpiredOperation => Disposition::Settled,
                    // Held for an operator, atomically with the claim.
                    ErrorCode::PossibleDuplicateIntent | ErrorCode::OutcomeUnknown => {
                        Disposition::Parked
                    }
                    ErrorCode::InvalidArguments
                    | ErrorCode::MissingOperationKey
                    | ErrorCode::InvalidOperationKey
                    | ErrorCode::IdempotencyKeyReusedWithDifferentRequest
                    | ErrorCode::Unauthorized
                    | ErrorCode::Forbidden
                    | ErrorCode::PreconditionFailed
                    | ErrorCode::EffectClassRefused
                    | ErrorCode::UnknownTool
                    | ErrorCode::NotFound
                    | ErrorCode::Conflict => refused(),
                    // The execution's task failed: the record, whatever it holds, decides on
                    // the next delivery (replay, recovery or `unknown`), so deliver again.
                    ErrorCode::InternalError => retry(),
                    // A code added to the core after this table: delivering again is always
                    // safe (the record deduplicates), and the queue's delivery bound ends it.
                    _ => retry(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use idemgate_core::key::OperationKey;
    use serde_json::json;

    use super::*;

    fn key() -> OperationKey {
        OperationKey::new("acme", "prod", "run_1", "step_1").unwrap()
    }

    fn rejected(code: ErrorCode, retry_after: Option<u64>) -> Outcome {
        let mut o = Outcome::rejected(Some(key()), code, "message");
        o.retry_after_seconds = retry_after;
        o
    }

    fn check(outcome: Outcome, expect: &str) {
        let got = Disposition::of(&outcome);
        let shown = match &got {
            Disposition::Retry { after } => format!("retry {}ms", after.as_millis()),
            other => other.as_str().to_string(),
        };
        assert_eq!(shown, expect, "for {outcome:?}");
    }

    #[test]
    fn every_outcome_has_its_disposition() {
        check(Outcome::applied(key(), "t1".into(), json!({})), "settled");
        check(
            Outcome::replayed(key(), Some("t1".into()), Some(json!({}))),
            "settled",
        );
        check(Outcome::unknown(key(), "lost"), "parked");
        check(
            Outcome::in_flight(key(), NextAction::Poll, 3),
            "retry 3000ms",
        );
        check(
            Outcome::in_flight(key(), NextAction::AskForApproval, 60),
            "parked",
        );
        check(rejected(ErrorCode::DownstreamRejected, None), "settled");
        check(rejected(ErrorCode::ApprovalDenied, None), "settled");
        check(rejected(ErrorCode::ApprovalExpired, None), "settled");
        check(rejected(ErrorCode::ExpiredOperation, None), "settled");
        check(rejected(ErrorCode::PossibleDuplicateIntent, None), "parked");
        check(
            rejected(ErrorCode::StoreUnavailable, Some(1)),
            "retry 1000ms",
        );
        check(
            rejected(ErrorCode::DownstreamUnavailable, Some(5)),
            "retry 5000ms",
        );
        check(
            rejected(ErrorCode::AuthorizationUnavailable, None),
            "retry 1000ms",
        );
        check(rejected(ErrorCode::InternalError, None), "retry 1000ms");
        check(rejected(ErrorCode::InvalidArguments, None), "refused");
        check(rejected(ErrorCode::MissingOperationKey, None), "refused");
        check(rejected(ErrorCode::InvalidOperationKey, None), "refused");
        check(
            rejected(ErrorCode::IdempotencyKeyReusedWithDifferentRequest, None),
            "refused",
        );
        check(rejected(ErrorCode::Forbidden, None), "refused");
        check(rejected(ErrorCode::UnknownTool, None), "refused");
    }

    #[test]
    fn only_retries_keep_a_message_on_the_queue() {
        assert!(Disposition::Settled.ends_delivery());
        assert!(Disposition::Parked.ends_delivery());
        assert!(
            !Disposition::Retry {
                after: DEFAULT_RETRY
            }
            .ends_delivery()
        );
    }
}
