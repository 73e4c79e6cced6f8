//! The wire: how outcomes and errors become HTTP answers. **This is the one place that maps
//! them**; handlers return an [`Answer`] or an [`ApiError`] and never pick a status code.
//!
//! | outcome | HTTP |
//! |---|---|
//! | applied | 200 |
//! | replayed | 200, `Idempotent-Replayed: true` |
//! | in_flight | 409 with `Retry-After`; 202 while it awaits approval |
//! | rejected | `application/problem+json` (RFC 9457), status by error code (below) |
//! | unknown | 202 |
//!
//! Every answer carries `Idempotency-Outcome: <label>`, and every body the member `outcome`
//! with the same label (`status` is the label in an outcome body, the HTTP status in a
//! problem). A problem's `type` is `<base>/problems/<code>`, a page that explains the code
//! ([`crate::problems`]). Internal detail (store errors, panics' context) goes to the log,
//! never into an answer.

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idemgate_app::OperatorError;
use idemgate_app::problems as app_problems;
pub use idemgate_app::problems::Problem;
pub use idemgate_app::views::{ErrorView, NextActionView, OutcomeStatus, OutcomeView};
use idemgate_core::outcome::{ErrorCode, Outcome, Status};
use idemgate_core::store;
use serde::Serialize;

use crate::auth::AuthError;
use crate::problems::ProblemBase;

pub const IDEMPOTENCY_OUTCOME: HeaderName = HeaderName::from_static("idempotency-outcome");
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
pub const PROBLEM_JSON: &str = "application/problem+json";

tokio::task_local! {
    /// The base of problem type URIs for the request being answered, set around every request
    /// by the router ([`with_problem_base`]); relative where none is set.
    static PROBLEM_BASE: ProblemBase;
}

/// Runs `f` (a request's handling) with `base` as the start of every problem `type` it
/// answers.
pub async fn with_problem_base<F: std::future::Future>(base: ProblemBase, f: F) -> F::Output {
    PROBLEM_BASE.scope(base, f).await
}

/// The `type` of a problem with this code: `<base>/problems/<code>`, a page that explains it.
pub fn problem_type(code: ErrorCode) -> String {
    PROBLEM_BASE
        .try_with(|base| base.type_of(code))
        .unwrap_or_else(|_| ProblemBase::relative().type_of(code))
}

/// The HTTP status of a rejection with this code (the app's number, [`app_problems::status`]).
pub fn rejection_status(code: ErrorCode) -> StatusCode {
    http_status(app_problems::status(code))
}

/// The HTTP status of an outcome (the app's number, [`app_problems::outcome_status`]).
pub fn outcome_status(o: &Outcome) -> StatusCode {
    http_status(app_problems::outcome_status(o))
}

/// A status number of the app's as an HTTP status; every number it answers is one.
fn http_status(number: u16) -> StatusCode {
    StatusCode::from_u16(number).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The headers every outcome answer carries.
fn outcome_headers(o: &Outcome, headers: &mut HeaderMap) {
    headers.insert(
        IDEMPOTENCY_OUTCOME,
        HeaderValue::from_static(o.status.as_str()),
    );
    if o.status == Status::Replayed {
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    if let Some(seconds) = o.retry_after_seconds {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

fn json_body(status: StatusCode, content_type: &'static str, body: &impl Serialize) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => {
            let mut r = (status, bytes).into_response();
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            r
        }
        Err(e) => {
            tracing::error!(error = %e, "an answer could not be serialised");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// Renders an outcome with its status code and headers; `status` overrides the code of a
/// rejection (413 for an oversized body).
fn respond(o: &Outcome, status: Option<StatusCode>) -> Response {
    let status = status.unwrap_or_else(|| outcome_status(o));
    let mut response = if o.status == Status::Rejected {
        let base = PROBLEM_BASE
            .try_with(|base| base.as_str().to_string())
            .unwrap_or_default();
        let problem = Problem::of(o, status.as_u16(), &base);
        json_body(status, PROBLEM_JSON, &problem)
    } else {
        json_body(status, "application/json", &OutcomeView::from(o))
    };
    outcome_headers(o, response.headers_mut());
    response.extensions_mut().insert(crate::access::Logged {
        operation_key: o.operation_key.as_ref().map(|k| k.to_string()),
        outcome: o.status.as_str(),
        code: o.error_code().map(|c| c.as_str()),
    });
    response
}

/// An outcome as an answer.
#[derive(Debug, Clone)]
pub struct Answer(pub Outcome);

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        respond(&self.0, None)
    }
}

/// A JSON body that also carries an outcome's header (the operation view).
pub struct WithOutcome<T>(pub Status, pub T);

impl<T: Serialize> IntoResponse for WithOutcome<T> {
    fn into_response(self) -> Response {
        let mut r = json_body(StatusCode::OK, "application/json", &self.1);
        r.headers_mut().insert(
            IDEMPOTENCY_OUTCOME,
            HeaderValue::from_static(self.0.as_str()),
        );
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        r
    }
}

/// Every refusal the gateway answers itself, before or around the executor. Boxed: it travels
/// in every handler's `Result`.
#[derive(Debug, Clone)]
pub struct ApiError(Box<Refusal>);

#[derive(Debug, Clone)]
struct Refusal {
    outcome: Outcome,
    status: Option<StatusCode>,
    challenge: bool,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError(Box::new(Refusal {
            outcome: Outcome::rejected(None, code, message),
            status: None,
            challenge: false,
        }))
    }

    pub fn with_status(mut self, status: StatusCode) -> ApiError {
        self.0.status = Some(status);
        self
    }

    pub fn outcome(&self) -> &Outcome {
        &self.0.outcome
    }

    pub fn unauthenticated(e: AuthError) -> ApiError {
        let message = match e {
            AuthError::Missing => "send `Authorization: Bearer <token>`",
            AuthError::Invalid => "the bearer token is not accepted",
        };
        let mut error = ApiError::new(ErrorCode::Unauthorized, message);
        error.0.challenge = true;
        error
    }

    /// A rejection the executor answered (an authorization recheck refusing a read), as a
    /// problem with the outcome's fields.
    pub fn refused(outcome: &Outcome) -> ApiError {
        ApiError(Box::new(Refusal {
            outcome: outcome.clone(),
            status: None,
            challenge: false,
        }))
    }

    pub fn not_found() -> ApiError {
        ApiError::new(ErrorCode::NotFound, "no such operation")
    }

    /// A failure whose detail stays in the log.
    pub fn internal(what: &str, detail: &dyn std::fmt::Display) -> ApiError {
        tracing::error!(error = %detail, "{what}");
        ApiError::new(
            ErrorCode::InternalError,
            "internal error; the gateway's log has the detail",
        )
    }

    pub fn store(e: &store::Error) -> ApiError {
        tracing::warn!(error = %e, "store error");
        let mut error = ApiError::new(
            ErrorCode::StoreUnavailable,
            "the operation store is unavailable; retry later",
        );
        error.0.outcome.retry_after_seconds = Some(1);
        error
    }

    /// An operator's read or action the app refused ([`OperatorError`]): its outcome, as a
    /// problem; a store failure's detail goes to the log.
    pub fn operator(e: OperatorError) -> ApiError {
        if let OperatorError::StoreUnavailable(detail) = &e {
            tracing::warn!(error = %detail, "store error");
        }
        ApiError::refused(&e.outcome()).with_status(http_status(e.status()))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = respond(&self.0.outcome, self.0.status);
        if self.0.challenge {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_core::OperationKey;
    use idemgate_core::outcome::NextAction;
    use serde_json::Value;

    fn check(o: Outcome, status: u16, outcome_header: &str, content_type: &str) {
        let r = Answer(o).into_response();
        assert_eq!(r.status().as_u16(), status);
        assert_eq!(r.headers()[IDEMPOTENCY_OUTCOME], outcome_header);
        assert_eq!(r.headers()[header::CONTENT_TYPE], content_type);
    }

    fn key() -> OperationKey {
        OperationKey::parse("t:e:w:s").unwrap()
    }

    #[test]
    fn statuses() {
        check(
            Outcome::applied(key(), "r".into(), Value::Null),
            200,
            "applied",
            "application/json",
        );
        check(
            Outcome::replayed(key(), None, None),
            200,
            "replayed",
            "application/json",
        );
        check(
            Outcome::in_flight(key(), NextAction::Poll, 3),
            409,
            "in_flight",
            "application/json",
        );
        check(
            Outcome::in_flight(key(), NextAction::AskForApproval, 30),
            202,
            "in_flight",
            "application/json",
        );
        check(
            Outcome::unknown(key(), "x"),
            202,
            "unknown",
            "application/json",
        );
        check(
            Outcome::rejected(
                None,
                ErrorCode::IdempotencyKeyReusedWithDifferentRequest,
                "x",
            ),
            422,
            "rejected",
            PROBLEM_JSON,
        );
        check(
            Outcome::rejected(None, ErrorCode::InvalidArguments, "x"),
            400,
            "rejected",
            PROBLEM_JSON,
        );
        check(
            Outcome::rejected(None, ErrorCode::Unauthorized, "x"),
            401,
            "rejected",
            PROBLEM_JSON,
        );
        check(
            Outcome::rejected(None, ErrorCode::Forbidden, "x"),
            403,
            "rejected",
            PROBLEM_JSON,
        );
        check(
            Outcome::rejected(None, ErrorCode::NotFound, "x"),
            404,
            "rejected",
            PROBLEM_JSON,
        );
        check(
            Outcome::rejected(None, ErrorCode::ExpiredOperation, "x"),
            410,
            "rejected",
            PROBLEM_JSON,
        );
    }

    #[test]
    fn replay_and_retry_headers() {
        let r = Answer(Outcome::replayed(key(), None, None)).into_response();
        assert_eq!(r.headers()[IDEMPOTENT_REPLAYED], "true");
        let r = Answer(Outcome::in_flight(key(), NextAction::Poll, 7)).into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "7");
        assert!(r.headers().get(IDEMPOTENT_REPLAYED).is_none());
    }

    #[test]
    fn every_code_has_its_own_problem_type() {
        let mut seen = std::collections::BTreeSet::new();
        for code in idemgate_core::outcome::ALL_CODES {
            assert!(seen.insert(problem_type(*code)));
            assert!(
                rejection_status(*code).is_client_error()
                    || rejection_status(*code).is_server_error()
            );
        }
    }
}
