//! The labelled answer every face returns: what happened and what the caller may do next.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::key::OperationKey;

/// What happened to this delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// This delivery performed the effect and recorded it.
    Applied,
    /// The operation was applied earlier; the stored result, no new effect.
    Replayed,
    /// Another worker owns it, a job is running, or it awaits approval.
    InFlight,
    /// Invalid, unauthorized, mismatched, expired or refused; no effect.
    Rejected,
    /// The effect may have happened and cannot be proved.
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Applied => "applied",
            Status::Replayed => "replayed",
            Status::InFlight => "in_flight",
            Status::Rejected => "rejected",
            Status::Unknown => "unknown",
        }
    }
}

/// What the caller should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NextAction {
    None,
    Poll,
    Reconcile,
    AskForApproval,
    InspectOperation,
}

/// Stable snake_case error codes. Clients match on these; never rename one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    InvalidArguments,
    MissingOperationKey,
    InvalidOperationKey,
    IdempotencyKeyReusedWithDifferentRequest,
    PossibleDuplicateIntent,
    Unauthorized,
    Forbidden,
    AuthorizationUnavailable,
    ApprovalDenied,
    ApprovalExpired,
    ExpiredOperation,
    DownstreamRejected,
    DownstreamUnavailable,
    PreconditionFailed,
    OutcomeUnknown,
    StoreUnavailable,
    EffectClassRefused,
    UnknownTool,
    NotFound,
    Conflict,
    WebhookSignatureInvalid,
    InternalError,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArguments => "invalid_arguments",
            ErrorCode::MissingOperationKey => "missing_operation_key",
            ErrorCode::InvalidOperationKey => "invalid_operation_key",
            ErrorCode::IdempotencyKeyReusedWithDifferentRequest => {
                "idempotency_key_reused_with_different_request"
            }
            ErrorCode::PossibleDuplicateIntent => "possible_duplicate_intent",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::AuthorizationUnavailable => "authorization_unavailable",
            ErrorCode::ApprovalDenied => "approval_denied",
            ErrorCode::ApprovalExpired => "approval_expired",
            ErrorCode::ExpiredOperation => "expired_operation",
            ErrorCode::DownstreamRejected => "downstream_rejected",
            ErrorCode::DownstreamUnavailable => "downstream_unavailable",
            ErrorCode::PreconditionFailed => "precondition_failed",
            ErrorCode::OutcomeUnknown => "outcome_unknown",
            ErrorCode::StoreUnavailable => "store_unavailable",
            ErrorCode::EffectClassRefused => "effect_class_refused",
            ErrorCode::UnknownTool => "unknown_tool",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::WebhookSignatureInvalid => "webhook_signature_invalid",
            ErrorCode::InternalError => "internal_error",
        }
    }

    pub fn parse(text: &str) -> Option<ErrorCode> {
        ALL_CODES.iter().copied().find(|c| c.as_str() == text)
    }

    /// Whether the same request may succeed later without any change by the caller: nothing
    /// was sent, and the obstacle (an unreachable store or downstream) is transient.
    pub fn retryable(self) -> bool {
        match self {
            ErrorCode::DownstreamUnavailable
            | ErrorCode::StoreUnavailable
            | ErrorCode::AuthorizationUnavailable => true,
            ErrorCode::InvalidArguments
            | ErrorCode::MissingOperationKey
            | ErrorCode::InvalidOperationKey
            | ErrorCode::IdempotencyKeyReusedWithDifferentRequest
            | ErrorCode::PossibleDuplicateIntent
            | ErrorCode::Unauthorized
            | ErrorCode::Forbidden
            | ErrorCode::ApprovalDenied
            | ErrorCode::ApprovalExpired
            | ErrorCode::ExpiredOperation
            | ErrorCode::DownstreamRejected
            | ErrorCode::PreconditionFailed
            | ErrorCode::OutcomeUnknown
            | ErrorCode::EffectClassRefused
            | ErrorCode::UnknownTool
            | ErrorCode::NotFound
            | ErrorCode::Conflict
            | ErrorCode::WebhookSignatureInvalid
            | ErrorCode::InternalError => false,
        }
    }

    /// What a caller refused with this code should do next.
    pub fn next_action(self) -> NextAction {
        match self {
            ErrorCode::IdempotencyKeyReusedWithDifferentRequest
            | ErrorCode::ExpiredOperation
            | ErrorCode::DownstreamRejected
            | ErrorCode::PreconditionFailed
            | ErrorCode::Conflict => NextAction::InspectOperation,
            ErrorCode::PossibleDuplicateIntent | ErrorCode::ApprovalDenied => {
                NextAction::AskForApproval
            }
            ErrorCode::InvalidArguments
            | ErrorCode::MissingOperationKey
            | ErrorCode::InvalidOperationKey
            | ErrorCode::Unauthorized
            | ErrorCode::Forbidden
            | ErrorCode::AuthorizationUnavailable
            | ErrorCode::ApprovalExpired
            | ErrorCode::DownstreamUnavailable
            | ErrorCode::OutcomeUnknown
            | ErrorCode::StoreUnavailable
            | ErrorCode::EffectClassRefused
            | ErrorCode::UnknownTool
            | ErrorCode::NotFound
            | ErrorCode::WebhookSignatureInvalid
            | ErrorCode::InternalError => NextAction::None,
        }
    }
}

pub const ALL_CODES: &[ErrorCode] = &[
    ErrorCode::InvalidArguments,
    ErrorCode::MissingOperationKey,
    ErrorCode::InvalidOperationKey,
    ErrorCode::IdempotencyKeyReusedWithDifferentRequest,
    ErrorCode::PossibleDuplicateIntent,
    ErrorCode::Unauthorized,
    ErrorCode::Forbidden,
    ErrorCode::AuthorizationUnavailable,
    ErrorCode::ApprovalDenied,
    ErrorCode::ApprovalExpired,
    ErrorCode::ExpiredOperation,
    ErrorCode::DownstreamRejected,
    ErrorCode::DownstreamUnavailable,
    ErrorCode::PreconditionFailed,
    ErrorCode::OutcomeUnknown,
    ErrorCode::StoreUnavailable,
    ErrorCode::EffectClassRefused,
    ErrorCode::UnknownTool,
    ErrorCode::NotFound,
    ErrorCode::Conflict,
    ErrorCode::WebhookSignatureInvalid,
    ErrorCode::InternalError,
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
}

/// The result shape of every face. Every field is always present (null when it does not
/// apply), so clients and models see one stable shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub status: Status,
    pub operation_key: Option<OperationKey>,
    pub effect_reference: Option<String>,
    pub safe_to_repeat: bool,
    pub next_action: NextAction,
    pub retry_after_seconds: Option<u64>,
    pub result: Option<Value>,
    pub error: Option<ErrorBody>,
}

impl Outcome {
    pub fn applied(key: OperationKey, reference: String, result: Value) -> Outcome {
        Outcome {
            status: Status::Applied,
            operation_key: Some(key),
            effect_reference: Some(reference),
            safe_to_repeat: false,
            next_action: NextAction::None,
            retry_after_seconds: None,
            result: Some(result),
            error: None,
        }
    }

    pub fn replayed(
        key: OperationKey,
        reference: Option<String>,
        result: Option<Value>,
    ) -> Outcome {
        Outcome {
            status: Status::Replayed,
            operation_key: Some(key),
            effect_reference: reference,
            safe_to_repeat: false,
            next_action: NextAction::None,
            retry_after_seconds: None,
            result,
            error: None,
        }
    }

    pub fn in_flight(key: OperationKey, next: NextAction, retry_after: u64) -> Outcome {
        Outcome {
            status: Status::InFlight,
            operation_key: Some(key),
            effect_reference: None,
            safe_to_repeat: false,
            next_action: next,
            retry_after_seconds: Some(retry_after.max(1)),
            result: None,
            error: None,
        }
    }

    pub fn unknown(key: OperationKey, message: impl Into<String>) -> Outcome {
        Outcome {
            status: Status::Unknown,
            operation_key: Some(key),
            effect_reference: None,
            safe_to_repeat: false,
            next_action: NextAction::Reconcile,
            retry_after_seconds: None,
            result: None,
            error: Some(ErrorBody {
                code: ErrorCode::OutcomeUnknown,
                message: message.into(),
            }),
        }
    }

    /// A rejection of a key that has had no effect: nothing happened, and the business action
    /// may be attempted again without risking a second effect. For a refusal of a key whose
    /// effect did (or may have) happen, use [`Outcome::rejected_after_effect`].
    pub fn rejected(
        key: Option<OperationKey>,
        code: ErrorCode,
        message: impl Into<String>,
    ) -> Outcome {
        let next = code.next_action();
        Outcome {
            status: Status::Rejected,
            operation_key: key,
            effect_reference: None,
            safe_to_repeat: true,
            next_action: next,
            retry_after_seconds: if code.retryable() { Some(1) } else { None },
            result: None,
            error: Some(ErrorBody {
                code,
                message: message.into(),
            }),
        }
    }

    /// A rejection of this delivery for a key whose effect happened (or may have): this
    /// delivery did nothing, but the business action is not safe to repeat.
    pub fn rejected_after_effect(
        key: Option<OperationKey>,
        code: ErrorCode,
        message: impl Into<String>,
    ) -> Outcome {
        let mut o = Outcome::rejected(key, code, message);
        o.safe_to_repeat = false;
        o
    }

    pub fn with_retry_after(mut self, seconds: u64) -> Outcome {
        self.retry_after_seconds = Some(seconds.max(1));
        self
    }

    pub fn with_reference(mut self, reference: Option<String>) -> Outcome {
        self.effect_reference = reference;
        self
    }

    pub fn error_code(&self) -> Option<ErrorCode> {
        self.error.as_ref().map(|e| e.code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exhaustive on purpose: a new code must get a place here, and then the test below fails
    /// until `ALL_CODES` (which the OpenAPI enum, the problem pages and `parse` read) lists it.
    fn ordinal(code: ErrorCode) -> usize {
        match code {
            ErrorCode::InvalidArguments => 0,
            ErrorCode::MissingOperationKey => 1,
            ErrorCode::InvalidOperationKey => 2,
            ErrorCode::IdempotencyKeyReusedWithDifferentRequest => 3,
            ErrorCode::PossibleDuplicateIntent => 4,
            ErrorCode::Unauthorized => 5,
            ErrorCode::Forbidden => 6,
            ErrorCode::AuthorizationUnavailable => 7,
            ErrorCode::ApprovalDenied => 8,
            ErrorCode::ApprovalExpired => 9,
            ErrorCode::ExpiredOperation => 10,
            ErrorCode::DownstreamRejected => 11,
            ErrorCode::DownstreamUnavailable => 12,
            ErrorCode::PreconditionFailed => 13,
            ErrorCode::OutcomeUnknown => 14,
            ErrorCode::StoreUnavailable => 15,
            ErrorCode::EffectClassRefused => 16,
            ErrorCode::UnknownTool => 17,
            ErrorCode::NotFound => 18,
            ErrorCode::Conflict => 19,
            ErrorCode::InternalError => 20,
            ErrorCode::WebhookSignatureInvalid => 21,
        }
    }

    #[test]
    fn all_codes_lists_every_code_once() {
        let mut seen = [false; 22];
        for &code in ALL_CODES {
            assert!(!seen[ordinal(code)], "{} listed twice", code.as_str());
            seen[ordinal(code)] = true;
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
        }
        assert!(seen.iter().all(|s| *s), "ALL_CODES misses a code");
        assert_eq!(ALL_CODES.len(), seen.len());
    }

    #[test]
    fn shape_has_every_field() {
        let key = OperationKey::parse("acme:prod:run_827:step_03").unwrap();
        let o = Outcome::applied(
            key,
            "ticket_1042".into(),
            serde_json::json!({"id": "ticket_1042"}),
        );
        let v = serde_json::to_value(&o).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "status": "applied",
                "operation_key": "acme:prod:run_827:step_03",
                "effect_reference": "ticket_1042",
                "safe_to_repeat": false,
                "next_action": "none",
                "retry_after_seconds": null,
                "result": {"id": "ticket_1042"},
                "error": null
            })
        );
        let back: Outcome = serde_json::from_value(v).unwrap();
        assert_eq!(back, o);
    }

    #[test]
    fn codes_round_trip() {
        for code in ALL_CODES {
            let text = serde_json::to_value(code).unwrap();
            assert_eq!(text, serde_json::Value::String(code.as_str().into()));
            assert_eq!(ErrorCode::parse(code.as_str()), Some(*code));
        }
    }

    #[test]
    fn rejected_is_safe_to_repeat_and_mismatch_says_inspect() {
        let o = Outcome::rejected(
            None,
            ErrorCode::IdempotencyKeyReusedWithDifferentRequest,
            "x",
        );
        assert!(o.safe_to_repeat);
        assert_eq!(o.next_action, NextAction::InspectOperation);
        assert_eq!(o.retry_after_seconds, None);
        let o = Outcome::rejected(None, ErrorCode::StoreUnavailable, "x");
        assert_eq!(o.retry_after_seconds, Some(1));
    }
}
