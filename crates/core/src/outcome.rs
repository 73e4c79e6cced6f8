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

impl NextAction {
    /// The name API v1 and every face give it (its serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            NextAction::None => "none",
            NextAction::Poll => "poll",
            NextAction::Reconcile => "reconcile",
            NextAction::AskForApproval => "ask_for_approval",
            NextAction::InspectOperation => "inspect_operation",
        }
    }
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

/// The proof that attempting a business action again cannot make a second effect: **the only
/// way an [`Outcome`] says `safe_to_repeat: true`**, as an `Authorized` is the only way to send.
/// Made from evidence, never by a face by hand:
///
/// - by the machine, from a read of the key ([`crate::machine::repeatable`]): no record, or one
///   that provably had no effect (held, refused, released, never run);
/// - for a delivery that readably named no operation ([`Repeatable::unnamed`]): nothing can
///   have happened under a key it did not name;
/// - from a contract whose effect class makes repeating harmless, for a call without a key
///   ([`Repeatable::harmless`]: a read, a key-less absolute update).
///
/// A face that refuses a delivery naming a key, before the executor, asks the application to
/// read the key (`idemgate_app::App::refuse`); a face that could not read what was delivered
/// (a body too large or not JSON) has no proof, and its refusal says `safe_to_repeat: false`.
#[derive(Debug)]
pub struct Repeatable {
    key: Option<OperationKey>,
}

impl Repeatable {
    /// The machine's proof for `key`, made by [`crate::machine::repeatable`] from a read.
    pub(crate) fn proven(key: OperationKey) -> Repeatable {
        Repeatable { key: Some(key) }
    }

    /// A delivery that named no operation (no `workflow_id` and `step_id`, or a key that is
    /// not one): nothing of it can have happened under any key. The outcome names no key.
    pub fn unnamed() -> Repeatable {
        Repeatable { key: None }
    }

    /// A call without a key to a tool whose repeat is harmless by its contract's own
    /// declaration (a read; a key-less natural-idempotent update). The outcome names no key.
    pub fn harmless(class: crate::contract::EffectClass) -> Option<Repeatable> {
        use crate::contract::EffectClass;
        match class {
            EffectClass::Read | EffectClass::NaturalIdempotent => Some(Repeatable { key: None }),
            EffectClass::KeyBased | EffectClass::Irreversible | EffectClass::NonIdempotent => None,
        }
    }

    /// The key the proof is about, if the delivery named one.
    pub fn key(&self) -> Option<&OperationKey> {
        self.key.as_ref()
    }
}

/// The result shape of every face. Every field is always present (null when it does not
/// apply), so clients and models see one stable shape. `safe_to_repeat` is read with
/// [`Outcome::safe_to_repeat`] and set only from a [`Repeatable`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub status: Status,
    pub operation_key: Option<OperationKey>,
    pub effect_reference: Option<String>,
    safe_to_repeat: bool,
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

    /// A rejection of this delivery: it did nothing, and nothing is claimed about whether the
    /// business action is safe to repeat (`safe_to_repeat: false`) — the key may have had its
    /// effect earlier. A rejection that may say more takes the proof: [`Outcome::refused`].
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
            safe_to_repeat: false,
            next_action: next,
            retry_after_seconds: if code.retryable() { Some(1) } else { None },
            result: None,
            error: Some(ErrorBody {
                code,
                message: message.into(),
            }),
        }
    }

    /// A rejection with the proof that the business action may be attempted again without
    /// risking a second effect: `safe_to_repeat: true`, for the proof's key.
    pub fn refused(proof: Repeatable, code: ErrorCode, message: impl Into<String>) -> Outcome {
        Outcome::rejected(None, code, message).repeatable(proof)
    }

    /// This outcome with `safe_to_repeat: true`, for the proof's key (none where the proof names
    /// none: a key-less call).
    pub fn repeatable(mut self, proof: Repeatable) -> Outcome {
        self.safe_to_repeat = true;
        self.operation_key = proof.key;
        self
    }

    /// May this business action be attempted again without risking a second effect? True only
    /// where a [`Repeatable`] proved it.
    pub fn safe_to_repeat(&self) -> bool {
        self.safe_to_repeat
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

    #[test]
    fn a_next_action_and_a_status_are_named_as_serde_names_them() {
        for next in [
            NextAction::None,
            NextAction::Poll,
            NextAction::Reconcile,
            NextAction::AskForApproval,
            NextAction::InspectOperation,
        ] {
            assert_eq!(serde_json::json!(next), next.as_str());
        }
        for status in [
            Status::Applied,
            Status::Replayed,
            Status::InFlight,
            Status::Rejected,
            Status::Unknown,
        ] {
            assert_eq!(serde_json::json!(status), status.as_str());
        }
    }

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
    fn only_a_proof_makes_a_rejection_safe_to_repeat() {
        let o = Outcome::rejected(
            None,
            ErrorCode::IdempotencyKeyReusedWithDifferentRequest,
            "x",
        );
        assert!(!o.safe_to_repeat());
        let key = OperationKey::parse("acme:prod:run_827:step_03").unwrap();
        let o = Outcome::refused(
            Repeatable::proven(key.clone()),
            ErrorCode::InvalidArguments,
            "x",
        );
        assert!(o.safe_to_repeat());
        assert_eq!(o.operation_key, Some(key));
        let o = Outcome::refused(Repeatable::unnamed(), ErrorCode::MissingOperationKey, "x");
        assert!(o.safe_to_repeat());
        assert_eq!(o.operation_key, None);
        let o = Outcome::rejected(
            None,
            ErrorCode::IdempotencyKeyReusedWithDifferentRequest,
            "x",
        );
        assert_eq!(o.next_action, NextAction::InspectOperation);
        assert_eq!(o.retry_after_seconds, None);
        let o = Outcome::rejected(None, ErrorCode::StoreUnavailable, "x");
        assert_eq!(o.retry_after_seconds, Some(1));
    }
}
