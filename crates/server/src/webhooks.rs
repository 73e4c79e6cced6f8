//! `POST /v1/webhooks/{source}`: Standard Webhooks intake that finishes accepted jobs.
//!
//! Each source is configured under `[webhooks.<source>]` ([`SourceConfig`]): its tenant, the
//! environment variables holding its secrets (several during a rotation), the timestamp
//! tolerance, how long event ids are remembered, and JSON pointers saying how an event names
//! its operation (a job id or an operation key) and how it ended. A delivery is verified
//! before anything is read from its body — `webhook-id`, `webhook-timestamp` within the
//! tolerance of the gateway's clock, a `v1` signature made with one of the secrets — and a
//! refusal names what failed, is logged without the body, and changes nothing. The verified
//! event goes to [`Executor::accept_event`](idemgate_engine::Executor::accept_event), which
//! deduplicates it by (source, `webhook-id`) in the same transaction as the finish it causes.
//!
//! Signatures are computed with the `standardwebhooks` crate (`Webhook::sign`, which also
//! reads `whsec_` secrets). Its `verify` is not used: it reads the system clock and fixes the
//! tolerance at five minutes, where the gateway's clock is injected and the tolerance is the
//! source's.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idemgate_core::duration::Span;
use idemgate_core::json;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::ErrorCode;
use idemgate_core::record::{Millis, Receipt, Refusal};
use idemgate_core::webhook::{Disposition, Finish};
use idemgate_engine::{Binding, EventAnswer, JobEvent};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::api::Segment;
use crate::state::AppState;
use crate::wire::{ApiError, Problem};

/// Deliveries by source and disposition (what the event did).
pub const EVENTS: &str = "idemgate_webhook_events_total";
/// Deliveries refused before the event was read, by source and reason.
pub const REFUSALS: &str = "idemgate_webhook_refusals_total";

/// One webhook source as written under `[webhooks.<source>]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// The tenant whose operations this source's events may finish.
    pub tenant: String,
    /// The tools whose operations this source's events may finish (required, at least one):
    /// an event binds only to an operation of one of them, by job id within them or by key.
    /// Left empty, the source is refused with an error naming it: binding across every tool
    /// lets two downstreams' overlapping job ids finish each other's operations.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Names of environment variables, each holding one secret (`whsec_<base64>`, as Standard
    /// Webhooks senders print them). A signature made with any of them is accepted, so a
    /// rotation configures the new one beside the old, then drops the old.
    pub secret_envs: Vec<String>,
    /// How far `webhook-timestamp` may be from the gateway's clock, either way.
    #[serde(default = "default_tolerance")]
    pub tolerance: Span,
    /// How long an event id is remembered: at least the sender's retry window.
    #[serde(default = "default_retention")]
    pub retention: Span,
    /// Largest body accepted, in bytes; unset, the gateway's `limits.body_bytes`.
    #[serde(default)]
    pub max_body_bytes: Option<usize>,
    /// JSON pointer (RFC 6901) to the job id the downstream's 202 answer gave. One of
    /// `job_id_pointer` and `key_pointer`.
    #[serde(default)]
    pub job_id_pointer: Option<String>,
    /// JSON pointer to the operation key the downstream received as its idempotency key.
    #[serde(default)]
    pub key_pointer: Option<String>,
    /// JSON pointer to the value that says how the job ended (`/type`, say).
    pub outcome_pointer: String,
    /// Values at `outcome_pointer` that mean the job succeeded.
    pub success: Vec<String>,
    /// Values that mean it failed. Any other value is recorded as `ignored`.
    #[serde(default)]
    pub failure: Vec<String>,
    /// JSON pointer to the effect's reference (required in a success event).
    pub reference_pointer: String,
    /// JSON pointer to the replay-safe result; unset, the whole event.
    #[serde(default)]
    pub result_pointer: Option<String>,
    /// JSON pointer to a failure's message; unset, a message naming the event.
    #[serde(default)]
    pub error_message_pointer: Option<String>,
}

fn default_tolerance() -> Span {
    Span(300)
}

fn default_retention() -> Span {
    Span(3 * 86_400)
}

/// A source ready to verify: its secrets read from the environment.
pub struct Source {
    name: String,
    config: SourceConfig,
    secrets: Vec<standardwebhooks::Webhook>,
}

/// Every configured source by name.
#[derive(Default, Clone)]
pub struct Sources {
    sources: Arc<BTreeMap<String, Source>>,
}

impl Sources {
    /// Reads each source's secrets from the environment and checks its pointers. An error
    /// names the source and what is wrong; a missing variable is named, its value never.
    pub fn from_config(config: &BTreeMap<String, SourceConfig>) -> Result<Sources, String> {
        Sources::with_env(config, |name| std::env::var(name).ok())
    }

    /// [`Sources::from_config`] with the environment given (tests).
    pub fn with_env(
        config: &BTreeMap<String, SourceConfig>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Sources, String> {
        let mut sources = BTreeMap::new();
        for (name, c) in config {
            let fail = |m: String| format!("webhooks.{name}: {m}");
            check(name, c).map_err(fail)?;
            let mut secrets = Vec::new();
            for var in &c.secret_envs {
                let value = env(var)
                    .ok_or_else(|| fail(format!("the environment variable {var} is not set")))?;
                let secret = standardwebhooks::Webhook::new(value.trim()).map_err(|e| {
                    fail(format!(
                        "the secret in {var} is not a Standard Webhooks secret \
                         (whsec_ and base64): {e}"
                    ))
                })?;
                secrets.push(secret);
            }
            sources.insert(
                name.clone(),
                Source {
                    name: name.clone(),
                    config: c.clone(),
                    secrets,
                },
            );
        }
        Ok(Sources {
            sources: Arc::new(sources),
        })
    }

    pub fn get(&self, name: &str) -> Option<&Source> {
        self.sources.get(name)
    }

    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// Checks that every tool a source names is loaded (`loaded` says whether one is). The
    /// error names the source and the tool.
    pub fn check_tools(&self, loaded: impl Fn(&str) -> bool) -> Result<(), String> {
        for (name, source) in self.sources.iter() {
            if let Some(tool) = source.config.tools.iter().find(|t| !loaded(t)) {
                return Err(format!(
                    "webhooks.{name}: tools names `{tool}`, which is not a loaded tool"
                ));
            }
        }
        Ok(())
    }
}

/// An event id is remembered for `retention`; a timestamp is accepted for `tolerance`. With a
/// tolerance longer than the retention, a captured event replayed after its id was forgotten
/// but while its timestamp is still accepted would pass both checks and act again (issue 31),
/// so the configuration is refused when it is read.
pub(crate) fn tolerance_within_retention(c: &SourceConfig) -> Result<(), String> {
    if c.tolerance.0 > c.retention.0 {
        return Err(format!(
            "tolerance {} is longer than retention {}: an event replayed after its id is \
             forgotten would still carry an accepted timestamp and be acted on again; set \
             tolerance at most retention",
            c.tolerance, c.retention
        ));
    }
    Ok(())
}

fn check(name: &str, c: &SourceConfig) -> Result<(), String> {
    let part_ok =
        |s: &str| !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b':');
    if !part_ok(name) || name.contains('/') {
        return Err("a source name must be printable ASCII without spaces, `:` or `/`".into());
    }
    if !part_ok(&c.tenant) {
        return Err(format!(
            "tenant `{}` must be printable ASCII without spaces or `:`",
            c.tenant.escape_default()
        ));
    }
    if c.tools.is_empty() {
        return Err(
            "tools must name the tools whose jobs this source may finish, \
             e.g. tools = [\"reports.generate\"]"
                .into(),
        );
    }
    if c.secret_envs.is_empty() {
        return Err("secret_envs must name at least one environment variable".into());
    }
    match (&c.job_id_pointer, &c.key_pointer) {
        (Some(_), Some(_)) | (None, None) => {
            return Err("set exactly one of job_id_pointer and key_pointer".into());
        }
        _ => {}
    }
    if c.success.is_empty() {
        return Err("success must list at least one outcome value".into());
    }
    if let Some(both) = c.success.iter().find(|v| c.failure.contains(v)) {
        return Err(format!("`{both}` is listed in both success and failure"));
    }
    if c.tolerance.0 == 0 {
        return Err("tolerance must be at least one second".into());
    }
    if c.retention.0 < 3600 {
        return Err(
            "retention must be at least 1h; set it to the sender's retry window (3d by default)"
                .into(),
        );
    }
    tolerance_within_retention(c)?;
    let pointers = [
        ("job_id_pointer", c.job_id_pointer.as_deref()),
        ("key_pointer", c.key_pointer.as_deref()),
        ("outcome_pointer", Some(c.outcome_pointer.as_str())),
        ("reference_pointer", Some(c.reference_pointer.as_str())),
        ("result_pointer", c.result_pointer.as_deref()),
        ("error_message_pointer", c.error_message_pointer.as_deref()),
    ];
    for (field, pointer) in pointers {
        if let Some(p) = pointer
            && !p.is_empty()
            && !p.starts_with('/')
        {
            return Err(format!(
                "{field} `{p}` is not a JSON pointer: it starts with `/` (RFC 6901)"
            ));
        }
    }
    Ok(())
}

/// Why a delivery was not verified. Each names the header at fault, never the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unverified {
    Missing(&'static str),
    Malformed(&'static str),
    Stale { skew_seconds: i64, tolerance: u64 },
    Signature,
}

impl Unverified {
    fn reason(&self) -> &'static str {
        match self {
            Unverified::Missing(_) => "missing_header",
            Unverified::Malformed(_) => "malformed_header",
            Unverified::Stale { .. } => "stale_timestamp",
            Unverified::Signature => "bad_signature",
        }
    }

    fn message(&self) -> String {
        match self {
            Unverified::Missing(h) => format!("the `{h}` header is missing"),
            Unverified::Malformed(h) => format!("the `{h}` header is malformed"),
            Unverified::Stale {
                skew_seconds,
                tolerance,
            } => format!(
                "`webhook-timestamp` is {} s from the gateway's clock, beyond the source's \
                 tolerance of {tolerance} s",
                skew_seconds.abs()
            ),
            Unverified::Signature => {
                "no `v1` signature in `webhook-signature` matches a secret of this source".into()
            }
        }
    }
}

/// The verified identity of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub event_id: String,
    pub timestamp: i64,
}

fn header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, Unverified> {
    headers
        .get(name)
        .ok_or(Unverified::Missing(name))?
        .to_str()
        .map_err(|_| Unverified::Malformed(name))
}

impl Source {
    /// Verifies a delivery per Standard Webhooks against every secret of the source, at
    /// `now` (milliseconds).
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: Millis,
    ) -> Result<Verified, Unverified> {
        let event_id = header(headers, "webhook-id")?;
        if event_id.is_empty()
            || event_id.len() > 255
            || !event_id.bytes().all(|b| (0x21..=0x7e).contains(&b))
        {
            return Err(Unverified::Malformed("webhook-id"));
        }
        let timestamp: i64 = header(headers, "webhook-timestamp")?
            .trim()
            .parse()
            .map_err(|_| Unverified::Malformed("webhook-timestamp"))?;
        let skew = (now / 1000).saturating_sub(timestamp);
        let tolerance = self.config.tolerance.0;
        if skew.unsigned_abs() > tolerance {
            return Err(Unverified::Stale {
                skew_seconds: skew,
                tolerance,
            });
        }
        let offered = header(headers, "webhook-signature")?;
        let offered: Vec<&str> = offered
            .split(' ')
            .filter_map(|s| s.split_once(','))
            .filter(|(version, _)| *version == "v1")
            .map(|(_, signature)| signature)
            .collect();
        if offered.is_empty() {
            return Err(Unverified::Malformed("webhook-signature"));
        }
        for secret in &self.secrets {
            // `sign` refuses a body that is not UTF-8; such a body matches nothing.
            let Ok(expected) = secret.sign(event_id, timestamp, body) else {
                return Err(Unverified::Signature);
            };
            let expected = expected.split_once(',').map_or("", |(_, s)| s);
            if offered
                .iter()
                .any(|s| same(s.as_bytes(), expected.as_bytes()))
            {
                return Ok(Verified {
                    event_id: event_id.to_string(),
                    timestamp,
                });
            }
        }
        Err(Unverified::Signature)
    }

    /// Reads the event's operation and finish by the source's pointers. A signed event the
    /// pointers cannot read is the sender's bad input: refused, nothing recorded.
    fn read_event(&self, event: &Value, event_id: &str) -> Result<Read, String> {
        let c = &self.config;
        let text = |field: &str, pointer: &str| -> Result<String, String> {
            match event.pointer(pointer) {
                Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                Some(Value::Number(n)) => Ok(n.to_string()),
                Some(_) => Err(format!(
                    "the event's {field} at `{pointer}` is not a non-empty string"
                )),
                None => Err(format!("the event has no {field} at `{pointer}`")),
            }
        };
        let outcome = text("outcome", &c.outcome_pointer)?;
        let ended = if c.success.contains(&outcome) {
            Some(true)
        } else if c.failure.contains(&outcome) {
            Some(false)
        } else {
            None
        };
        let binding = match (&c.job_id_pointer, &c.key_pointer) {
            (Some(p), _) => text("job id", p).map(Binding::Job),
            (None, Some(p)) => text("operation key", p).and_then(|k| {
                OperationKey::parse(&k)
                    .map(Binding::Key)
                    .map_err(|e| format!("the event's operation key `{k}` is malformed: {e}"))
            }),
            (None, None) => Err("the source names no job id or key pointer".into()),
        };
        let finish = match ended {
            None => None,
            Some(true) => Some(Finish::Done(Receipt {
                reference: text("reference", &c.reference_pointer)?,
                result: match &c.result_pointer {
                    Some(p) => event
                        .pointer(p)
                        .cloned()
                        .ok_or_else(|| format!("the event has no result at `{p}`"))?,
                    None => event.clone(),
                },
            })),
            Some(false) => Some(Finish::Failed(Refusal {
                code: ErrorCode::DownstreamRejected,
                message: match &c.error_message_pointer {
                    Some(p) => text("error message", p)?,
                    None => format!("the job failed (webhook event {event_id}: {outcome})"),
                },
            })),
        };
        // An event the source does not map needs no operation: it is recorded as ignored.
        let binding = match (&finish, binding) {
            (Some(_), Err(e)) => return Err(e),
            (_, binding) => binding.ok(),
        };
        Ok(Read { binding, finish })
    }
}

struct Read {
    binding: Option<Binding>,
    finish: Option<Finish>,
}

/// Compares in time that depends on the length only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What the gateway did with a delivery.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WebhookAnswer {
    /// `applied`, `failed`, `already_settled`, `settled_differently`, `not_pending`,
    /// `other_tenant`, `other_tool`, `unknown_operation`, `ignored`, `early` or `ambiguous`.
    pub disposition: String,
    /// The operation the event bound to, when one was found.
    pub operation_key: Option<String>,
    /// The event had been decided by an earlier delivery; nothing changed now.
    pub redelivery: bool,
}

/// Receive a webhook event (Standard Webhooks): verified, deduplicated by `webhook-id`, and
/// applied to the job it names.
#[utoipa::path(
    post,
    path = "/v1/webhooks/{source}",
    tag = "webhooks",
    params(
        ("source" = String, Path, description = "A source configured under `[webhooks.<source>]`."),
        ("webhook-id" = String, Header, description = "The event's id: redeliveries repeat it."),
        ("webhook-timestamp" = String, Header, description = "Unix seconds when it was signed."),
        ("webhook-signature" = String, Header, description = "Space-separated `v1,<base64>` signatures."),
    ),
    request_body(content = Value, content_type = "application/json"),
    responses(
        (status = 200, description = "decided: applied, failed, or recorded without a change (a redelivery included)", body = WebhookAnswer),
        (status = 202, description = "kept as an early arrival: applied when its job id is recorded", body = WebhookAnswer),
        (status = 409, description = "refused as ambiguous: more than one operation of the source's tools matches; nothing settled", body = WebhookAnswer),
        (status = 400, description = "a signed event the source's pointers cannot read", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "not verified: headers, timestamp or signature", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "unknown source", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "body too large", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "the store is unavailable: deliver again", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn receive(
    State(state): State<AppState>,
    Segment(name): Segment,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let sources = &state.inner().webhooks;
    let Some(source) = sources.get(&name) else {
        let shown: String = name.chars().take(64).collect();
        metrics::counter!(REFUSALS, "source" => "unknown", "reason" => "unknown_source")
            .increment(1);
        tracing::warn!(source = %shown, "webhook delivery for an unknown source refused");
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no webhook source `{shown}` is configured"),
        ));
    };
    let limit = source
        .config
        .max_body_bytes
        .unwrap_or(state.inner().limits.body_bytes);
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
        refused(source, "too_large", None);
        ApiError::new(
            ErrorCode::InvalidArguments,
            format!("the webhook body is larger than {limit} bytes"),
        )
        .with_status(StatusCode::PAYLOAD_TOO_LARGE)
    })?;
    let now = state.executor().clock().now();
    let verified = source.verify(&headers, &bytes, now).map_err(|why| {
        refused(source, why.reason(), headers.get("webhook-id"));
        ApiError::new(ErrorCode::WebhookSignatureInvalid, why.message())
    })?;
    let invalid = |message: String| {
        refused(source, "unreadable_event", headers.get("webhook-id"));
        ApiError::new(
            ErrorCode::InvalidArguments,
            format!("webhook event {}: {message}", verified.event_id),
        )
    };
    let event = json::parse_with_depth(&bytes, state.inner().limits.json_depth)
        .map_err(|e| invalid(format!("the body is not acceptable JSON: {}", e.message)))?;
    let read = source
        .read_event(&event, &verified.event_id)
        .map_err(invalid)?;
    let tools = state.tools().clone();
    let contracts = move |tool: &str| tools.get(tool).map(|t| t.contract.clone());
    let answer = state
        .executor()
        .accept_event(
            &contracts,
            JobEvent {
                source: source.name.clone(),
                event_id: verified.event_id.clone(),
                tenant: source.config.tenant.clone(),
                environment: state.environment().to_string(),
                tools: source.config.tools.clone(),
                binding: read.binding,
                finish: read.finish,
                retention_millis: source.config.retention.millis(),
            },
        )
        .await
        .map_err(|e| {
            tracing::warn!(source = %source.name, event_id = %verified.event_id, error = %e, "a webhook event could not be recorded; the sender should deliver it again");
            ApiError::new(
                ErrorCode::StoreUnavailable,
                "the operation store is unavailable; nothing was recorded; deliver the event again",
            )
        })?;
    Ok(respond(source, &verified, answer))
}

fn refused(source: &Source, reason: &'static str, event_id: Option<&HeaderValue>) {
    metrics::counter!(REFUSALS, "source" => source.name.clone(), "reason" => reason).increment(1);
    let event_id: String = event_id
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .chars()
        .take(64)
        .collect();
    tracing::warn!(source = %source.name, event_id = %event_id, reason, "webhook delivery refused; nothing recorded");
}

fn respond(source: &Source, verified: &Verified, answer: EventAnswer) -> Response {
    let disposition = answer.disposition;
    metrics::counter!(
        EVENTS,
        "source" => source.name.clone(),
        "disposition" => if answer.redelivery { "redelivery" } else { disposition.as_str() }
    )
    .increment(1);
    tracing::info!(
        source = %source.name,
        event_id = %verified.event_id,
        disposition = disposition.as_str(),
        redelivery = answer.redelivery,
        operation_key = answer.key.as_ref().map(OperationKey::as_str),
        "webhook event"
    );
    let status = match (disposition, answer.redelivery) {
        (Disposition::Early, false) => StatusCode::ACCEPTED,
        // Refused: the sender's retries hear the same, and its dashboard shows the failure
        // that an operator must resolve (settle the operations, or narrow `tools`).
        (Disposition::Ambiguous, _) => StatusCode::CONFLICT,
        _ => StatusCode::OK,
    };
    let body = WebhookAnswer {
        disposition: disposition.as_str().into(),
        operation_key: answer.key.map(|k| k.as_str().to_string()),
        redelivery: answer.redelivery,
    };
    let mut response = (status, axum::Json(body)).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const NEXT: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

    fn config() -> SourceConfig {
        SourceConfig {
            tenant: "acme".into(),
            tools: vec!["reports.generate".into()],
            secret_envs: vec!["OLD".into(), "NEW".into()],
            tolerance: Span(300),
            retention: Span(3 * 86_400),
            max_body_bytes: None,
            job_id_pointer: Some("/data/job_id".into()),
            key_pointer: None,
            outcome_pointer: "/type".into(),
            success: vec!["job.succeeded".into()],
            failure: vec!["job.failed".into()],
            reference_pointer: "/data/reference".into(),
            result_pointer: Some("/data".into()),
            error_message_pointer: None,
        }
    }

    fn sources(old: &str) -> Sources {
        let old = old.to_string();
        Sources::with_env(
            &BTreeMap::from([("jobs".to_string(), config())]),
            move |name| match name {
                "OLD" => Some(old.clone()),
                "NEW" => Some(NEXT.to_string()),
                _ => None,
            },
        )
        .unwrap()
    }

    fn signed(secret: &str, id: &str, at: i64, body: &[u8]) -> HeaderMap {
        let signature = standardwebhooks::Webhook::new(secret)
            .unwrap()
            .sign(id, at, body)
            .unwrap();
        let mut h = HeaderMap::new();
        h.insert("webhook-id", id.parse().unwrap());
        h.insert("webhook-timestamp", at.to_string().parse().unwrap());
        h.insert("webhook-signature", signature.parse().unwrap());
        h
    }

    #[test]
    fn both_secrets_verify_during_a_rotation() {
        let s = sources(SECRET);
        let source = s.get("jobs").unwrap();
        let body = br#"{"type":"job.succeeded"}"#;
        let now = 1_700_000_000_000;
        for secret in [SECRET, NEXT] {
            let h = signed(secret, "msg_1", now / 1000, body);
            assert_eq!(source.verify(&h, body, now).unwrap().event_id, "msg_1");
        }
        let other = "whsec_dGhpcyBpcyBub3QgdGhlIHNlY3JldA==";
        let h = signed(other, "msg_1", now / 1000, body);
        assert_eq!(source.verify(&h, body, now), Err(Unverified::Signature));
    }

    #[test]
    fn one_matching_signature_among_several_is_enough() {
        let s = sources(SECRET);
        let source = s.get("jobs").unwrap();
        let body = br#"{"type":"job.succeeded"}"#;
        let now = 1_700_000_000_000;
        let mut h = signed(NEXT, "msg_2", now / 1000, body);
        let good = h["webhook-signature"].to_str().unwrap().to_string();
        let both = format!("v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA= {good}");
        h.insert("webhook-signature", both.parse().unwrap());
        assert!(source.verify(&h, body, now).is_ok());
    }

    #[test]
    fn a_changed_body_or_id_is_refused() {
        let s = sources(SECRET);
        let source = s.get("jobs").unwrap();
        let now = 1_700_000_000_000;
        let h = signed(SECRET, "msg_3", now / 1000, br#"{"a":1}"#);
        assert_eq!(
            source.verify(&h, br#"{"a":2}"#, now),
            Err(Unverified::Signature)
        );
        let mut h = signed(SECRET, "msg_3", now / 1000, br#"{"a":1}"#);
        h.insert("webhook-id", "msg_4".parse().unwrap());
        assert_eq!(
            source.verify(&h, br#"{"a":1}"#, now),
            Err(Unverified::Signature)
        );
    }

    #[test]
    fn timestamps_outside_the_tolerance_are_refused_both_ways() {
        let s = sources(SECRET);
        let source = s.get("jobs").unwrap();
        let body = b"{}";
        let now = 1_700_000_000_000;
        for skew in [301, -301] {
            let h = signed(SECRET, "msg_5", now / 1000 - skew, body);
            assert!(matches!(
                source.verify(&h, body, now),
                Err(Unverified::Stale { .. })
            ));
        }
        let h = signed(SECRET, "msg_5", now / 1000 - 299, body);
        assert!(source.verify(&h, body, now).is_ok());
    }

    #[test]
    fn missing_headers_are_named() {
        let s = sources(SECRET);
        let source = s.get("jobs").unwrap();
        let now = 1_700_000_000_000;
        let mut h = signed(SECRET, "msg_6", now / 1000, b"{}");
        h.remove("webhook-timestamp");
        assert_eq!(
            source.verify(&h, b"{}", now),
            Err(Unverified::Missing("webhook-timestamp"))
        );
    }

    #[test]
    fn configuration_errors_name_the_source_and_the_variable() {
        let mut c = config();
        let e = Sources::with_env(&BTreeMap::from([("jobs".to_string(), c.clone())]), |_| None)
            .err()
            .unwrap();
        assert!(e.contains("webhooks.jobs") && e.contains("OLD"), "{e}");
        let mut toolless = c.clone();
        toolless.tools.clear();
        let e = Sources::with_env(&BTreeMap::from([("jobs".to_string(), toolless)]), |_| {
            Some(SECRET.into())
        })
        .err()
        .unwrap();
        assert!(e.contains("webhooks.jobs") && e.contains("tools"), "{e}");
        let s = Sources::with_env(&BTreeMap::from([("jobs".to_string(), c.clone())]), |_| {
            Some(SECRET.into())
        })
        .unwrap();
        let e = s.check_tools(|t| t == "tickets.create").err().unwrap();
        assert!(
            e.contains("webhooks.jobs") && e.contains("reports.generate"),
            "{e}"
        );
        assert!(s.check_tools(|t| t == "reports.generate").is_ok());
        c.key_pointer = Some("/key".into());
        let e = Sources::with_env(&BTreeMap::from([("jobs".to_string(), c)]), |_| {
            Some(SECRET.into())
        })
        .err()
        .unwrap();
        assert!(
            e.contains("exactly one of job_id_pointer and key_pointer"),
            "{e}"
        );
    }

    #[test]
    fn events_read_by_the_pointers() {
        let s = sources(SECRET);
        let source = s.get("jobs").unwrap();
        let done = serde_json::json!({"type": "job.succeeded", "data": {"job_id": "j1", "reference": "R-1"}});
        let read = source.read_event(&done, "m").unwrap();
        assert_eq!(read.binding, Some(Binding::Job("j1".into())));
        assert!(matches!(read.finish, Some(Finish::Done(r)) if r.reference == "R-1"));
        let progress = serde_json::json!({"type": "job.progress"});
        let read = source.read_event(&progress, "m").unwrap();
        assert_eq!((read.binding, read.finish), (None, None));
        let no_job = serde_json::json!({"type": "job.failed", "data": {}});
        let e = source.read_event(&no_job, "m").err().unwrap();
        assert!(e.contains("/data/job_id"), "{e}");
    }
}
