//! A rejection as API v1 answers it, in plain data: the status number of each error code
//! ([`status`], and [`outcome_status`] of any outcome), the problem title ([`title`]) and type
//! ([`problem_type`]), and the RFC 9457 document itself ([`Problem`]), whose members after
//! `type`, `title`, `status` and `detail` are the outcome's. The HTTP face sends these with
//! its headers; `idemgate ops --store` prints the same numbers and documents with no gateway
//! in between. Both take them from here, so the two cannot drift. Statuses are plain `u16`:
//! this crate knows no HTTP types.

use idemgate_core::outcome::{ErrorCode, NextAction, Outcome, Status};
use serde::Serialize;
use serde_json::Value;

use crate::views::{ErrorView, NextActionView, OutcomeStatus, OutcomeView};

/// The status of a rejection with this code.
pub fn status(code: ErrorCode) -> u16 {
    match code {
        ErrorCode::InvalidArguments
        | ErrorCode::MissingOperationKey
        | ErrorCode::InvalidOperationKey
        | ErrorCode::EffectClassRefused => 400,
        ErrorCode::Unauthorized | ErrorCode::WebhookSignatureInvalid => 401,
        ErrorCode::Forbidden | ErrorCode::ApprovalDenied => 403,
        ErrorCode::UnknownTool | ErrorCode::NotFound => 404,
        ErrorCode::ExpiredOperation | ErrorCode::ApprovalExpired => 410,
        ErrorCode::IdempotencyKeyReusedWithDifferentRequest
        | ErrorCode::PossibleDuplicateIntent
        | ErrorCode::DownstreamRejected
        | ErrorCode::PreconditionFailed
        | ErrorCode::Conflict
        | ErrorCode::OutcomeUnknown => 422,
        // Nothing was sent and the obstacle is transient: the same request may succeed later.
        ErrorCode::AuthorizationUnavailable
        | ErrorCode::DownstreamUnavailable
        | ErrorCode::StoreUnavailable => 503,
        ErrorCode::InternalError => 500,
        // `ErrorCode` is non-exhaustive: a code added later is a refusal until mapped here.
        _ => 400,
    }
}

/// The status of an answer carrying this outcome: 200 applied or replayed; 202 awaiting
/// approval or unknown; 409 for an operation in flight (common clients retry that one after
/// `Retry-After`); a rejection's by its code ([`status`]).
pub fn outcome_status(o: &Outcome) -> u16 {
    match o.status {
        Status::Applied | Status::Replayed => 200,
        Status::InFlight if o.next_action == NextAction::AskForApproval => 202,
        Status::InFlight => 409,
        Status::Unknown => 202,
        Status::Rejected => status(o.error_code().unwrap_or(ErrorCode::InternalError)),
    }
}

/// The `title` of a problem with this code: short, the same for every occurrence.
pub fn title(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::InvalidArguments => "Invalid arguments",
        ErrorCode::MissingOperationKey => "Missing operation key",
        ErrorCode::InvalidOperationKey => "Invalid operation key",
        ErrorCode::IdempotencyKeyReusedWithDifferentRequest => {
            "Idempotency key reused with a different request"
        }
        ErrorCode::PossibleDuplicateIntent => "Possible duplicate intent",
        ErrorCode::Unauthorized => "Unauthorized",
        ErrorCode::Forbidden => "Forbidden",
        ErrorCode::AuthorizationUnavailable => "Authorization unavailable",
        ErrorCode::ApprovalDenied => "Approval denied",
        ErrorCode::ApprovalExpired => "Approval expired",
        ErrorCode::ExpiredOperation => "Expired operation",
        ErrorCode::DownstreamRejected => "Downstream rejected",
        ErrorCode::DownstreamUnavailable => "Downstream unavailable",
        ErrorCode::PreconditionFailed => "Precondition failed",
        ErrorCode::OutcomeUnknown => "Outcome unknown",
        ErrorCode::StoreUnavailable => "Store unavailable",
        ErrorCode::EffectClassRefused => "Effect class refused",
        ErrorCode::UnknownTool => "Unknown tool",
        ErrorCode::NotFound => "Not found",
        ErrorCode::Conflict => "Conflict",
        ErrorCode::WebhookSignatureInvalid => "Webhook signature invalid",
        ErrorCode::InternalError => "Internal error",
        _ => "Rejected",
    }
}

/// The `type` of a problem with this code: `<base>/problems/<code>`, the page that explains
/// it. `base` is `scheme://authority` without a trailing slash, or empty for the relative
/// reference `/problems/<code>` (what a problem made without a gateway carries).
pub fn problem_type(base: &str, code: ErrorCode) -> String {
    format!("{base}/problems/{}", code.as_str())
}

/// A rejection as an RFC 9457 problem, with the outcome's fields as members. `status` is the
/// HTTP status (RFC 9457); the outcome's own status is `outcome` and is always `rejected`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Problem {
    /// `<base>/problems/<error code>`: a page explaining the code, what happened to the effect
    /// and what to do. The base is the gateway's `public_url` (or its own address); without
    /// one the reference is relative to the request.
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    pub outcome: OutcomeStatus,
    #[cfg_attr(feature = "openapi", schema(required))]
    pub operation_key: Option<String>,
    #[cfg_attr(feature = "openapi", schema(required))]
    pub effect_reference: Option<String>,
    pub safe_to_repeat: bool,
    pub next_action: NextActionView,
    #[cfg_attr(feature = "openapi", schema(required))]
    pub retry_after_seconds: Option<u64>,
    /// Any JSON value; null in a rejection unless the operation's result is shown.
    #[cfg_attr(feature = "openapi", schema(value_type = Value, required))]
    pub result: Option<Value>,
    #[cfg_attr(feature = "openapi", schema(required))]
    pub error: Option<ErrorView>,
}

impl Problem {
    /// The problem document of a rejected outcome answered with `status` (usually
    /// [`outcome_status`]; a face may answer another, as API v1 answers 413 for an oversized
    /// body), its `type` under `base` ([`problem_type`]).
    pub fn of(o: &Outcome, status: u16, base: &str) -> Problem {
        let code = o.error_code().unwrap_or(ErrorCode::InternalError);
        let view = OutcomeView::from(o);
        Problem {
            problem_type: problem_type(base, code),
            title: title(code).to_string(),
            status,
            detail: o
                .error
                .as_ref()
                .map(|e| e.message.clone())
                .unwrap_or_default(),
            outcome: view.outcome,
            operation_key: view.operation_key,
            effect_reference: view.effect_reference,
            safe_to_repeat: view.safe_to_repeat,
            next_action: view.next_action,
            retry_after_seconds: view.retry_after_seconds,
            result: view.result,
            error: view.error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_core::outcome::ALL_CODES;

    #[test]
    fn every_code_has_its_own_title_and_an_error_status() {
        let mut titles = std::collections::BTreeSet::new();
        for code in ALL_CODES {
            assert!(titles.insert(title(*code)), "{}", code.as_str());
            assert_ne!(title(*code), "Rejected", "{}", code.as_str());
            assert!((400..600).contains(&status(*code)), "{}", code.as_str());
        }
    }

    /// Each refusal of the operator's answers: its status, and its problem's title and type,
    /// as API v1 sends them (an unavailable store's with a retry after a second, its detail
    /// kept out of the answer).
    #[test]
    fn an_operator_refusal_is_answered_as_api_v1_answers_it() {
        use crate::OperatorError;
        use idemgate_core::store;
        let check = |e: OperatorError, status: u16, title: &str, retry: Option<u64>| {
            let problem = e.problem("https://gate.example");
            assert_eq!(e.status(), status, "{e:?}");
            assert_eq!(problem.status, status, "{e:?}");
            assert_eq!(problem.title, title, "{e:?}");
            let code = e.code().as_str();
            assert_eq!(
                problem.problem_type,
                format!("https://gate.example/problems/{code}")
            );
            assert_eq!(problem.detail, e.to_string(), "{e:?}");
            assert_eq!(problem.retry_after_seconds, retry, "{e:?}");
        };
        check(OperatorError::NotFound, 404, "Not found", None);
        let tool = "local.refund".to_string();
        check(OperatorError::NotServed { tool }, 422, "Conflict", None);
        let message = "operation k is applied, so it cannot be denied".to_string();
        check(
            OperatorError::Conflict { key: None, message },
            422,
            "Conflict",
            None,
        );
        let invalid = OperatorError::Invalid("limit is between 1 and 500".into());
        check(invalid, 400, "Invalid arguments", None);
        let down = store::Error::Unavailable("connection refused to db:5432".into());
        let down = OperatorError::StoreUnavailable(down);
        assert!(!down.problem("").detail.contains("db:5432"));
        check(down, 503, "Store unavailable", Some(1));
    }

    #[test]
    fn a_problem_carries_the_outcomes_members() {
        let o = Outcome::rejected(None, ErrorCode::Conflict, "operation k is applied");
        let problem = serde_json::to_value(Problem::of(&o, outcome_status(&o), "")).unwrap();
        assert_eq!(
            problem,
            serde_json::json!({
                "type": "/problems/conflict",
                "title": "Conflict",
                "status": 422,
                "detail": "operation k is applied",
                "outcome": "rejected",
                "operation_key": null,
                "effect_reference": null,
                "safe_to_repeat": false,
                "next_action": "inspect_operation",
                "retry_after_seconds": null,
                "result": null,
                "error": {"code": "conflict", "message": "operation k is applied"},
            })
        );
    }
}
