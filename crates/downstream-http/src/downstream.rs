//! [`HttpDownstream`]: the effect as an HTTP request, and the exchange reduced to a [`Reply`].

use std::fmt;
use std::sync::Arc;

use idemgate_core::ErrorCode;
use idemgate_core::contract::Contract;
use idemgate_core::effect::{Downstream, EffectOutcome, EffectRequest, JobStatus, Lookup};
use idemgate_core::key::OperationKey;
use idemgate_core::record::Refusal;
use idemgate_core::store::BoxFuture;
use reqwest::header::{ACCEPT, HeaderValue, IF_MATCH, RETRY_AFTER};
use serde_json::Value;

use crate::MAX_ANSWER_BYTES;
use crate::classify::{self, EffectRules, Reply, Transport};
use crate::config::{ConfigError, Plan, Request};
use crate::template::FillError;

/// One contract's downstream over HTTP. Cheap to clone (the plan sits behind an `Arc`, the
/// client is a pool handle); `Send + Sync`.
#[derive(Clone)]
pub struct HttpDownstream {
    plan: Arc<Plan>,
    client: reqwest::Client,
    /// The argument the contract sends as `If-Match` (`downstream.version_precondition`), so
    /// that [`Downstream::check`] can refuse a value no entity tag can carry.
    precondition: Option<String>,
}

impl fmt::Debug for HttpDownstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpDownstream")
            .field("tool", &self.plan.tool)
            .field("method", &self.plan.effect.method)
            .finish_non_exhaustive()
    }
}

impl HttpDownstream {
    /// Reads and checks the contract's `downstream.http` section. Uses the process's shared
    /// client for the section's connect timeout.
    pub fn from_contract(contract: &Contract) -> Result<HttpDownstream, ConfigError> {
        let plan = Plan::from_contract(contract)?;
        let client =
            crate::shared_client(plan.connect_timeout).map_err(|message| ConfigError::Invalid {
                tool: plan.tool.clone(),
                field: "downstream.http.timeouts.connect".into(),
                message,
            })?;
        Ok(HttpDownstream {
            plan: Arc::new(plan),
            client,
            precondition: contract.file.downstream.version_precondition.clone(),
        })
    }

    /// Uses `client` instead of the shared one (its connect timeout then applies; the
    /// contract's total timeout still does, per request).
    pub fn with_client(mut self, client: reqwest::Client) -> Self {
        self.client = client;
        self
    }

    /// The tool this downstream performs.
    pub fn tool(&self) -> &str {
        &self.plan.tool
    }

    fn request(
        &self,
        request: &Request,
        key: &OperationKey,
        value: impl Fn(&str) -> Result<String, FillError>,
    ) -> Result<reqwest::RequestBuilder, FillError> {
        let url = request.url.fill(value)?;
        // Every request to this downstream carries the operation key: the effect so the
        // downstream can deduplicate it, lookups and polls so it can scope them to the key.
        Ok(self
            .client
            .request(request.method.clone(), url)
            .headers(self.plan.headers.clone())
            .header(&self.plan.idempotency_header, key.as_str())
            .header(ACCEPT, HeaderValue::from_static("application/json"))
            .timeout(self.plan.total_timeout))
    }
}

/// A placeholder's value: the operation key, or an argument that is a string, number or
/// boolean. The error names the argument and never carries its value.
fn argument(name: &str, key: &str, arguments: &Value) -> Result<String, FillError> {
    if name == "operation_key" {
        return Ok(key.to_string());
    }
    match arguments.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(Value::Bool(b)) => Ok(b.to_string()),
        _ => Err(FillError(format!(
            "argument `{name}` is used in the downstream URL and must be a string, number or boolean"
        ))),
    }
}

/// Stands in for the operation key when [`Downstream::check`] fills a URL before any key is
/// claimed. A real key always holds `:` (encoded `%3A`), so it can never be a segment the
/// template refuses; any stand-in with the same property checks the same.
const KEY_STAND_IN: &str = "tenant:environment:workflow:step";

/// A version precondition as an `If-Match` entity tag: a number or bare string is quoted; a
/// string that already is an entity tag (`"v3"`, `W/"v3"`) is sent as it is. The error says
/// what the value must be, naming the argument `field`, never the value.
fn if_match(field: &str, value: &Value) -> Result<HeaderValue, String> {
    let tag = match value {
        Value::Number(n) => format!("\"{n}\""),
        Value::String(s) if s.starts_with('"') || s.starts_with("W/\"") => s.clone(),
        Value::String(s) if !s.contains('"') => format!("\"{s}\""),
        _ => {
            return Err(format!(
                "argument `{field}` is the version precondition and must be a number or a string without quotes"
            ));
        }
    };
    HeaderValue::from_str(&tag).map_err(|_| {
        format!("argument `{field}` is the version precondition and is not a valid entity tag")
    })
}

fn invalid(message: String) -> EffectOutcome {
    // Nothing was sent, and the same arguments would fail the same way: a deterministic
    // refusal, not a release.
    EffectOutcome::Refused(Refusal {
        code: ErrorCode::InvalidArguments,
        message,
    })
}

impl Downstream for HttpDownstream {
    /// The same checks `perform` makes before it sends, made before any record is written: the
    /// effect's URL must fill from the arguments (each placeholder present, a scalar, and not
    /// moving the path), and a declared version precondition must make an entity tag.
    /// `perform` still makes them itself, for a caller that did not ask first.
    fn check(&self, arguments: &Value) -> Result<(), String> {
        self.plan
            .effect
            .url
            .fill(|name| argument(name, KEY_STAND_IN, arguments))
            .map_err(|FillError(m)| m)?;
        let precondition = self.precondition.as_deref();
        match precondition.and_then(|field| Some((field, arguments.get(field)?))) {
            Some((field, value)) => if_match(field, value).map(drop),
            None => Ok(()),
        }
    }

    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        Box::pin(async move {
            let plan = &*self.plan;
            let mut builder = match self.request(&plan.effect, request.key, |name| {
                argument(name, request.key.as_str(), request.arguments)
            }) {
                Ok(b) => b,
                Err(FillError(m)) => return invalid(m),
            };
            if let Some(precondition) = request.precondition {
                let field = self
                    .precondition
                    .as_deref()
                    .unwrap_or("version precondition");
                match if_match(field, precondition) {
                    Ok(tag) => builder = builder.header(IF_MATCH, tag),
                    Err(m) => return invalid(m),
                }
            }
            if plan.send_body {
                builder = builder.json(request.arguments);
            }
            let answer = exchange(builder).await;
            let rules = EffectRules {
                extract: &plan.extract,
                error_message: plan.error_message.as_deref(),
                job_id: plan.job.as_ref().map(|j| j.id.as_str()),
            };
            let outcome = classify::effect(&rules, &answer.reply());
            tracing::info!(
                tool = plan.tool.as_str(),
                operation_key = request.key.as_str(),
                attempt = request.attempt,
                status = answer.status(),
                outcome = describe(&outcome),
                "downstream effect"
            );
            outcome
        })
    }

    fn lookup_receipt<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        Box::pin(async move {
            let Some(lookup) = &self.plan.lookup else {
                return Lookup::Unavailable(
                    "the contract configures no receipt lookup for this downstream".into(),
                );
            };
            let builder = match self.request(&lookup.request, key, |name| {
                argument(name, key.as_str(), &Value::Null)
            }) {
                Ok(b) => b,
                Err(FillError(m)) => return Lookup::Unavailable(m),
            };
            let answer = exchange(builder).await;
            let found = classify::lookup(&lookup.extract, &answer.reply());
            tracing::info!(
                tool = self.plan.tool.as_str(),
                operation_key = key.as_str(),
                status = answer.status(),
                found = matches!(found, Lookup::Found(_)),
                "receipt lookup"
            );
            found
        })
    }

    fn poll_job<'a>(&'a self, key: &'a OperationKey, job_id: &'a str) -> BoxFuture<'a, JobStatus> {
        Box::pin(async move {
            let Some(job) = &self.plan.job else {
                return JobStatus::Unavailable(
                    "the contract configures no async jobs for this downstream".into(),
                );
            };
            let builder = match self.request(&job.poll, key, |name| match name {
                "job_id" => Ok(job_id.to_string()),
                name => argument(name, key.as_str(), &Value::Null),
            }) {
                Ok(b) => b,
                // The poll URL holds only the job id and the key, and a key always fills, so
                // the downstream's own job id (`..`, say) cannot be put in the URL. Asking
                // again would fail the same way for ever: the job cannot be followed, and its
                // outcome cannot be proved.
                Err(FillError(m)) => {
                    return JobStatus::Gone(format!(
                        "the downstream's job id cannot be put in the poll URL: {m}"
                    ));
                }
            };
            let answer = exchange(builder).await;
            let status = classify::job(job, &answer.reply());
            tracing::info!(
                tool = self.plan.tool.as_str(),
                operation_key = key.as_str(),
                job_id,
                status = answer.status(),
                "job poll"
            );
            status
        })
    }
}

fn describe(outcome: &EffectOutcome) -> &'static str {
    match outcome {
        EffectOutcome::Committed(_) => "committed",
        EffectOutcome::Accepted { .. } => "accepted",
        EffectOutcome::Refused(_) => "refused",
        EffectOutcome::PreconditionFailed(_) => "precondition_failed",
        EffectOutcome::NotSent { .. } => "not_sent",
        EffectOutcome::Ambiguous { .. } => "ambiguous",
    }
}

// ---------------------------------------------------------------------------------------------
// The exchange.

/// What came back from one request, owned.
pub(crate) enum Exchange {
    Answered {
        status: u16,
        retry_after: Option<String>,
        body: Result<Vec<u8>, String>,
    },
    Failed(Transport),
}

impl Exchange {
    pub(crate) fn reply(&self) -> Reply<'_> {
        match self {
            Exchange::Answered {
                status,
                retry_after,
                body,
            } => Reply::Answered {
                status: *status,
                retry_after: retry_after.as_deref(),
                body: body.as_deref().map_err(Clone::clone),
            },
            Exchange::Failed(t) => Reply::Failed(t.clone()),
        }
    }

    fn status(&self) -> Option<u16> {
        match self {
            Exchange::Answered { status, .. } => Some(*status),
            Exchange::Failed(_) => None,
        }
    }
}

/// Sends one request and reads its answer, bounded by the request's timeout and
/// [`MAX_ANSWER_BYTES`].
pub(crate) async fn exchange(builder: reqwest::RequestBuilder) -> Exchange {
    let builder = crate::trace::propagate(builder);
    let mut response = match builder.send().await {
        Ok(r) => r,
        Err(e) => return Exchange::Failed(transport(&e)),
    };
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut body = Vec::new();
    let body = loop {
        match response.chunk().await {
            Ok(Some(chunk)) if body.len() + chunk.len() > MAX_ANSWER_BYTES => {
                break Err(format!(
                    "the answer is larger than {MAX_ANSWER_BYTES} bytes"
                ));
            }
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => break Ok(body),
            Err(e) => break Err(detail(&e)),
        }
    };
    Exchange::Answered {
        status,
        retry_after,
        body,
    }
}

/// How far a failed request got. reqwest reports `is_connect` only for failures of the
/// connector — DNS, TCP connect, TLS handshake, connect timeout — before which no byte of the
/// request was written; that is the one transport failure that proves non-delivery. A builder
/// error never reached the network at all.
fn transport(e: &reqwest::Error) -> Transport {
    let detail = detail(e);
    if e.is_connect() || e.is_builder() {
        Transport::NotConnected(detail)
    } else if e.is_timeout() {
        Transport::TimedOut(detail)
    } else {
        Transport::Lost(detail)
    }
}

/// The innermost cause of an error, without the URL (which may carry argument values).
fn detail(e: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    let text = cause.to_string();
    if std::ptr::addr_eq(cause, e as &dyn std::error::Error) {
        // No source: reqwest's own message, with the URL removed.
        return match e.is_timeout() {
            true => "operation timed out".into(),
            false => "request failed".into(),
        };
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn preconditions_become_entity_tags() {
        let tag = |v: Value| if_match("version", &v).map(|h| h.to_str().unwrap().to_string());
        assert_eq!(tag(json!(3)), Ok("\"3\"".into()));
        assert_eq!(tag(json!("v7")), Ok("\"v7\"".into()));
        assert_eq!(tag(json!("\"v7\"")), Ok("\"v7\"".into()));
        assert_eq!(tag(json!("W/\"v7\"")), Ok("W/\"v7\"".into()));
        assert!(tag(json!("a\"b")).is_err());
        assert!(tag(json!(null)).is_err());
        assert!(tag(json!({"v": 1})).is_err());
    }

    #[test]
    fn url_arguments_are_scalars_and_errors_never_carry_values() {
        let key = "t:e:w:s";
        let args = json!({"id": "ticket_1", "n": 4, "b": true, "o": {"secret": "x"}});
        assert_eq!(argument("id", key, &args), Ok("ticket_1".into()));
        assert_eq!(argument("n", key, &args), Ok("4".into()));
        assert_eq!(argument("b", key, &args), Ok("true".into()));
        assert_eq!(argument("operation_key", key, &args), Ok("t:e:w:s".into()));
        let FillError(m) = argument("o", key, &args).unwrap_err();
        assert!(m.contains("`o`") && !m.contains("secret"), "{m}");
        assert!(argument("missing", key, &args).is_err());
    }

    #[test]
    fn the_key_stand_in_is_a_key() {
        assert_eq!(
            OperationKey::parse(KEY_STAND_IN).unwrap().as_str(),
            KEY_STAND_IN
        );
    }

    fn downstream(url: &str, precondition: bool) -> HttpDownstream {
        let (class, extra) = match precondition {
            true => ("natural_idempotent", "  version_precondition: version\n"),
            false => ("key_based", ""),
        };
        let yaml = format!(
            r#"name: accounts.tickets
version: "1"
effect_class: {class}
input_schema:
  type: object
  properties:
    account: {{type: string}}
    n: {{type: integer}}
    version: {{}}
    secret: {{type: string}}
request_fingerprint:
  fields: [account]
downstream:
{extra}  http:
    url: {url}
    reference: /id
retention:
  record_ttl: 1h
  tombstone_ttl: 1d
  max_retry_window: 1h
"#
        );
        let contract = Contract::load(&yaml, "test.yaml").unwrap();
        HttpDownstream::from_contract(&contract).unwrap()
    }

    /// `Downstream::check` on `arguments`: `Ok`, or the message, which must name `expect` and
    /// carry no argument's value.
    fn check(d: &HttpDownstream, arguments: Value, expect: Result<(), &str>) {
        let got = d.check(&arguments);
        match (&got, expect) {
            (Ok(()), Ok(())) => {}
            (Err(m), Err(needle)) => {
                assert!(m.contains(needle), "{arguments}: {m}");
                assert!(!m.contains("s3cr3t"), "{arguments}: {m}");
            }
            _ => panic!("{arguments}: got {got:?}, expected {expect:?}"),
        }
    }

    #[test]
    fn a_job_id_that_would_move_the_poll_path_ends_the_job() {
        let yaml = r#"name: reports.generate
version: "1"
effect_class: key_based
input_schema:
  type: object
  properties:
    report_type: {type: string}
request_fingerprint:
  fields: [report_type]
downstream:
  deduplicates_by_key: true
  async_jobs: true
  http:
    url: http://127.0.0.1:9/reports
    reference: /report_id
    job:
      id: /job_id
      poll_url: http://127.0.0.1:9/jobs/{job_id}
      state: /status
      reference: /report_id
retention:
  record_ttl: 1h
  tombstone_ttl: 1d
  max_retry_window: 1h
"#;
        let d = HttpDownstream::from_contract(&Contract::load(yaml, "test.yaml").unwrap()).unwrap();
        let key = OperationKey::parse(KEY_STAND_IN).unwrap();
        for job_id in ["..", ".", ""] {
            // Refused before any request, so the future is ready at its first poll.
            let mut poll = std::pin::pin!(d.poll_job(&key, job_id));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            let std::task::Poll::Ready(status) = poll.as_mut().poll(&mut cx) else {
                panic!("{job_id:?}: the poll went to the network");
            };
            assert!(
                matches!(status, JobStatus::Gone(_)),
                "{job_id:?}: {status:?}"
            );
        }
    }

    #[test]
    #[rustfmt::skip]
    fn arguments_the_url_cannot_take_are_refused_before_any_claim() {
        let d = downstream("http://h/accounts/{account}/tickets?n={n}&k={operation_key}", false);
        check(&d, json!({"account": "acct_1", "n": 3}), Ok(()));
        check(&d, json!({"account": "a/..", "n": 3, "secret": "s3cr3t"}), Ok(()));
        check(&d, json!({"account": "..", "n": 3}), Err("argument `account` fills a segment"));
        check(&d, json!({"account": ".", "n": 3}), Err("argument `account` fills a segment"));
        check(&d, json!({"account": "", "n": 3}), Err("argument `account` fills a segment"));
        check(&d, json!({"n": 3}), Err("argument `account` is used in the downstream URL and must be a string, number or boolean"));
        check(&d, json!({"account": null, "n": 3}), Err("argument `account`"));
        check(&d, json!({"account": {"s3cr3t": 1}, "n": 3}), Err("argument `account`"));
        check(&d, json!({"account": ["s3cr3t"], "n": 3}), Err("argument `account`"));
        check(&d, json!({"account": "acct_1"}), Err("argument `n`"));
        let d = downstream("http://h/accounts/{account}", true);
        check(&d, json!({"account": "a", "version": 3}), Ok(()));
        check(&d, json!({"account": "a", "version": "W/\"v3\""}), Ok(()));
        check(&d, json!({"account": "a"}), Ok(()));
        check(&d, json!({"account": "a", "version": "s3cr3t\"x"}), Err("argument `version` is the version precondition"));
        check(&d, json!({"account": "a", "version": {"s3cr3t": 1}}), Err("argument `version` is the version precondition"));
        check(&d, json!({"account": "a", "version": "s3cr3t\n"}), Err("argument `version` is the version precondition and is not a valid entity tag"));
    }
}
