//! The contract's `downstream.http` and `security.authorization_hook` sections: their YAML shape
//! ([`HttpConfig`], [`HookConfig`]) and their compiled form ([`Plan`], [`HookPlan`]).
//!
//! The core keeps both sections as raw JSON it does not interpret, so this module is where they
//! are checked. Everything that can be wrong with them is found when the contract is loaded —
//! unknown fields, bad methods, header names, JSON pointers, URL templates that name arguments
//! the input schema does not have, sections that contradict the contract's own declarations —
//! and each error names the field, so a gateway refuses to start rather than discovering a typo
//! on the first effect.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use idemgate_core::contract::Contract;
use reqwest::Method;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::Value;

use crate::template::{Template, TemplateError};

/// Why a contract's HTTP settings cannot be used. Names the tool and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The contract has no `downstream.http` section, so there is nothing to call.
    #[error(
        "{tool}: field `downstream.http` is missing: an HTTP downstream needs at least `url` and `reference`"
    )]
    Missing { tool: String },
    /// A field is present but wrong.
    #[error("{tool}: field `{field}`: {message}")]
    Invalid {
        tool: String,
        field: String,
        message: String,
    },
}

// ---------------------------------------------------------------------------------------------
// The YAML shape.

/// `downstream.http`: how the effect is requested over HTTP.
///
/// ```yaml
/// downstream:
///   deduplicates_by_key: true
///   receipt_lookup: true
///   http:
///     method: POST                       # default POST
///     url: http://127.0.0.1:9000/tickets # `{operation_key}` and `{argument}` placeholders
///     idempotency_header: Idempotency-Key   # default
///     reference: /ticket_id              # JSON pointer to the effect reference
///     result: ""                         # JSON pointer to the replay-safe result; default the whole body
///     lookup:
///       url: http://127.0.0.1:9000/tickets/by-key/{operation_key}
///     timeouts: {connect: 2s, total: 10s}
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// `GET`, `POST`, `PUT`, `PATCH` or `DELETE`.
    #[serde(default = "default_post")]
    pub method: String,
    /// An `http` or `https` URL; the path and query may hold `{operation_key}` and
    /// `{argument_name}` placeholders, filled percent-encoded.
    pub url: String,
    /// `arguments` (the arguments object as the JSON body) or `none`. Default: `none` for GET
    /// and DELETE, `arguments` otherwise.
    #[serde(default)]
    pub body: Option<BodyMode>,
    /// The header that carries the operation key. Sent on the effect, the receipt lookup and
    /// job polls.
    #[serde(default = "default_idempotency_header")]
    pub idempotency_header: String,
    /// Static headers sent with every request to this downstream.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Headers whose values come from environment variables (header → variable name), read
    /// when the contract is loaded: credentials stay out of contract files.
    #[serde(default)]
    pub headers_from_env: BTreeMap<String, String>,
    /// JSON pointer (RFC 6901) to the effect reference in a 2xx answer: a non-empty string or
    /// an integer.
    pub reference: String,
    /// JSON pointer to the replay-safe result in a 2xx answer; the whole body when absent.
    #[serde(default)]
    pub result: Option<String>,
    /// JSON pointer to a short reason in a 4xx answer. Without it a refusal carries the status
    /// only: a downstream's error body may echo the request, and refusals are replayed.
    #[serde(default)]
    pub error_message: Option<String>,
    /// The receipt lookup by operation key; required when `receipt_lookup: true`.
    #[serde(default)]
    pub lookup: Option<LookupConfig>,
    /// Asynchronous jobs; required when `async_jobs: true`.
    #[serde(default)]
    pub job: Option<JobConfig>,
    #[serde(default)]
    pub timeouts: TimeoutConfig,
}

/// `downstream.http.lookup`: `200` with the reference ⇒ found, `404` ⇒ not found, anything
/// else ⇒ unavailable.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LookupConfig {
    #[serde(default = "default_get")]
    pub method: String,
    /// URL template; `{operation_key}` is its only placeholder.
    pub url: String,
    /// Pointer to the reference in the lookup's answer; the effect's `reference` when absent.
    #[serde(default)]
    pub reference: Option<String>,
    /// Pointer to the result in the lookup's answer; the effect's `result` when absent.
    #[serde(default)]
    pub result: Option<String>,
}

/// `downstream.http.job`: a `202` answer carries a job id, polled until its state is one of
/// `done` or `failed`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    /// Pointer to the job id in the `202` answer (a string or an integer).
    pub id: String,
    #[serde(default = "default_get")]
    pub poll_method: String,
    /// URL template with `{job_id}` and optionally `{operation_key}`.
    pub poll_url: String,
    /// Pointer to the job's state in a poll answer.
    pub state: String,
    /// States that mean the job finished with its effect.
    #[serde(default = "default_done")]
    pub done: Vec<String>,
    /// States that mean the job finished without an effect.
    #[serde(default = "default_failed")]
    pub failed: Vec<String>,
    /// Pointer to the effect reference in a finished job's answer.
    pub reference: String,
    /// Pointer to the replay-safe result in a finished job's answer; the whole answer when
    /// absent.
    #[serde(default)]
    pub result: Option<String>,
    /// Pointer to a short reason in a failed job's answer.
    #[serde(default)]
    pub error_message: Option<String>,
    /// How long a job the downstream reports running stays in flight, counted from its claim;
    /// past it the operation ends `unknown`. Read by the executor (the core's
    /// `Contract::max_running`); unset, the contract's `retention.max_retry_window`.
    #[serde(default)]
    pub max_running: Option<idemgate_core::duration::Span>,
}

/// `timeouts`: `connect` bounds the TCP and TLS handshake, `total` the whole exchange.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutConfig {
    #[serde(default = "default_connect")]
    pub connect: Timeout,
    #[serde(default = "default_total")]
    pub total: Timeout,
}

impl Default for TimeoutConfig {
    fn default() -> Self {
        TimeoutConfig {
            connect: default_connect(),
            total: default_total(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BodyMode {
    Arguments,
    None,
}

/// `security.authorization_hook`: the system of record's live authorization check.
///
/// ```yaml
/// security:
///   authorization_hook:
///     url: http://127.0.0.1:9000/auth
///     timeout: 2s
///     headers: {X-Caller: idemgate}
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    pub url: String,
    #[serde(default = "default_hook_timeout")]
    pub timeout: Timeout,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub headers_from_env: BTreeMap<String, String>,
}

/// The connect timeout of the shared client: a loopback or LAN handshake takes milliseconds,
/// and a host that does not answer within two seconds is treated as unreachable (provably not
/// sent) rather than holding the claim.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The whole exchange. Shorter than the default 30-second lease, so an effect normally settles
/// within the lease that covers it (the executor renews it anyway).
pub const DEFAULT_TOTAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The authorization hook sits on every call's path; a slow hook fails closed quickly.
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(2);

fn default_post() -> String {
    "POST".into()
}
fn default_get() -> String {
    "GET".into()
}
fn default_idempotency_header() -> String {
    "Idempotency-Key".into()
}
fn default_done() -> Vec<String> {
    vec!["done".into()]
}
fn default_failed() -> Vec<String> {
    vec!["failed".into()]
}
fn default_connect() -> Timeout {
    Timeout(DEFAULT_CONNECT_TIMEOUT)
}
fn default_total() -> Timeout {
    Timeout(DEFAULT_TOTAL_TIMEOUT)
}
fn default_hook_timeout() -> Timeout {
    Timeout(DEFAULT_HOOK_TIMEOUT)
}

/// A timeout as contracts write it: `250ms`, `2s`, `1m`, or a bare number of seconds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Timeout(pub Duration);

impl fmt::Debug for Timeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0.as_millis())
    }
}

impl Timeout {
    pub fn parse(text: &str) -> Result<Timeout, String> {
        let text = text.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (digits, unit) = text.split_at(split);
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("`{text}` is not a timeout such as 250ms, 2s or 1m"))?;
        let millis = match unit {
            "ms" => Some(n),
            "" | "s" => n.checked_mul(1000),
            "m" => n.checked_mul(60_000),
            _ => return Err(format!("`{text}` has unit `{unit}`; use ms, s or m")),
        };
        match millis {
            Some(0) => Err("a timeout of zero would fail every request".into()),
            // An hour is already far past any lease; a larger number is a typo.
            Some(ms) if ms <= 3_600_000 => Ok(Timeout(Duration::from_millis(ms))),
            _ => Err(format!("`{text}` is longer than the one-hour limit")),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Timeout {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Timeout, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Timeout;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a timeout such as 250ms, 2s, 1m or a number of seconds")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Timeout, E> {
                Timeout::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Timeout, E> {
                Timeout::parse(&v.to_string()).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Timeout, E> {
                Timeout::parse(&v.to_string()).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl HttpConfig {
    /// The contract's `downstream.http` section as written: typed, not yet checked against the
    /// contract (that is [`crate::HttpDownstream::from_contract`]). `None` when it has none.
    pub fn of(contract: &Contract) -> Result<Option<HttpConfig>, ConfigError> {
        contract
            .file
            .downstream
            .http
            .as_ref()
            .map(|raw| typed(&contract.name, "downstream.http", raw))
            .transpose()
    }
}

// ---------------------------------------------------------------------------------------------
// The compiled form.

/// Where the reference and result sit in an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Extract {
    pub reference: String,
    /// `None`: the whole body.
    pub result: Option<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub method: Method,
    pub url: Template,
}

#[derive(Debug, Clone)]
pub(crate) struct LookupPlan {
    pub request: Request,
    pub extract: Extract,
}

#[derive(Debug, Clone)]
pub(crate) struct JobPlan {
    pub id: String,
    pub poll: Request,
    pub state: String,
    pub done: Vec<String>,
    pub failed: Vec<String>,
    pub extract: Extract,
    pub error_message: Option<String>,
}

/// A checked `downstream.http` section, ready to perform requests.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub tool: String,
    pub effect: Request,
    pub send_body: bool,
    pub idempotency_header: HeaderName,
    pub headers: HeaderMap,
    pub extract: Extract,
    pub error_message: Option<String>,
    pub lookup: Option<LookupPlan>,
    pub job: Option<JobPlan>,
    pub connect_timeout: Duration,
    pub total_timeout: Duration,
}

/// A checked `security.authorization_hook` section.
#[derive(Debug, Clone)]
pub(crate) struct HookPlan {
    pub tool: String,
    pub url: reqwest::Url,
    pub headers: HeaderMap,
    pub timeout: Duration,
}

/// Reads a raw JSON section into its typed form, naming the failing field by its full path.
fn typed<T: serde::de::DeserializeOwned>(
    tool: &str,
    prefix: &str,
    raw: &Value,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(raw).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." || path.is_empty() {
            prefix.to_string()
        } else {
            format!("{prefix}.{path}")
        };
        ConfigError::Invalid {
            tool: tool.to_string(),
            field,
            message: e.into_inner().to_string(),
        }
    })
}

struct Checker<'a> {
    tool: &'a str,
}

impl Checker<'_> {
    fn err(&self, field: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            tool: self.tool.to_string(),
            field: field.to_string(),
            message: message.into(),
        }
    }

    fn method(&self, field: &str, text: &str) -> Result<Method, ConfigError> {
        match text.to_ascii_uppercase().as_str() {
            "GET" => Ok(Method::GET),
            "POST" => Ok(Method::POST),
            "PUT" => Ok(Method::PUT),
            "PATCH" => Ok(Method::PATCH),
            "DELETE" => Ok(Method::DELETE),
            _ => Err(self.err(
                field,
                format!("`{text}` is not one of GET, POST, PUT, PATCH, DELETE"),
            )),
        }
    }

    fn pointer(&self, field: &str, text: &str) -> Result<String, ConfigError> {
        if text.is_empty() || text.starts_with('/') {
            Ok(text.to_string())
        } else {
            Err(self.err(
                field,
                format!(
                    "`{text}` is not a JSON pointer: write `/{text}` (RFC 6901), or \"\" for the whole body"
                ),
            ))
        }
    }

    fn opt_pointer(
        &self,
        field: &str,
        text: &Option<String>,
    ) -> Result<Option<String>, ConfigError> {
        text.as_deref().map(|t| self.pointer(field, t)).transpose()
    }

    fn template(
        &self,
        field: &str,
        text: &str,
        allowed: &dyn Fn(&str) -> bool,
        allowed_names: &str,
    ) -> Result<Template, ConfigError> {
        let template = Template::parse(text).map_err(|e| match e {
            TemplateError::Syntax(m) => self.err(field, m),
        })?;
        for name in template.placeholders() {
            if !allowed(name) {
                return Err(self.err(
                    field,
                    format!("placeholder `{{{name}}}` is not {allowed_names}"),
                ));
            }
        }
        Ok(template)
    }

    fn headers(
        &self,
        field: &str,
        fixed: &BTreeMap<String, String>,
        from_env: &BTreeMap<String, String>,
        reserved: &[&HeaderName],
    ) -> Result<HeaderMap, ConfigError> {
        let mut map = HeaderMap::new();
        let name = |field: &str, n: &str| {
            let parsed = HeaderName::from_bytes(n.as_bytes())
                .map_err(|_| self.err(field, format!("`{n}` is not a header name")))?;
            if reserved.contains(&&parsed) {
                return Err(self.err(
                    field,
                    format!("`{n}` is set by idemgate itself and cannot be configured"),
                ));
            }
            Ok(parsed)
        };
        for (n, v) in fixed {
            let f = format!("{field}.headers.{n}");
            let value =
                HeaderValue::from_str(v).map_err(|_| self.err(&f, "not a valid header value"))?;
            map.insert(name(&f, n)?, value);
        }
        for (n, var) in from_env {
            let f = format!("{field}.headers_from_env.{n}");
            let v = std::env::var(var)
                .map_err(|_| self.err(&f, format!("environment variable `{var}` is not set")))?;
            let mut value = HeaderValue::from_str(&v).map_err(|_| {
                self.err(
                    &f,
                    format!("environment variable `{var}` is not a valid header value"),
                )
            })?;
            // Credentials stay out of debug output and HTTP/2 header compression tables.
            value.set_sensitive(true);
            map.insert(name(&f, n)?, value);
        }
        Ok(map)
    }
}

impl Plan {
    pub(crate) fn from_contract(contract: &Contract) -> Result<Plan, ConfigError> {
        let tool = contract.name.as_str();
        let spec = &contract.file.downstream;
        let raw = spec.http.as_ref().ok_or_else(|| ConfigError::Missing {
            tool: tool.to_string(),
        })?;
        let cfg: HttpConfig = typed(tool, "downstream.http", raw)?;
        let c = Checker { tool };
        let f = |name: &str| format!("downstream.http.{name}");

        let method = c.method(&f("method"), &cfg.method)?;
        let properties: Vec<String> = contract
            .input_schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        let is_argument =
            |name: &str| name == "operation_key" || properties.iter().any(|p| p == name);
        let url = c.template(
            &f("url"),
            &cfg.url,
            &is_argument,
            "`operation_key` or a property of the input schema",
        )?;
        let send_body = match cfg.body {
            Some(BodyMode::Arguments) => true,
            Some(BodyMode::None) => false,
            None => !matches!(method, Method::GET | Method::DELETE),
        };
        let idempotency_header = HeaderName::from_bytes(cfg.idempotency_header.as_bytes())
            .map_err(|_| {
                c.err(
                    &f("idempotency_header"),
                    format!("`{}` is not a header name", cfg.idempotency_header),
                )
            })?;
        let if_match = reqwest::header::IF_MATCH;
        let headers = c.headers(
            "downstream.http",
            &cfg.headers,
            &cfg.headers_from_env,
            &[&idempotency_header, &if_match],
        )?;
        let extract = Extract {
            reference: c.pointer(&f("reference"), &cfg.reference)?,
            result: c.opt_pointer(&f("result"), &cfg.result)?,
        };
        let error_message = c.opt_pointer(&f("error_message"), &cfg.error_message)?;

        // The section must agree with what the contract declares to the executor: the executor
        // calls a lookup or polls a job only when the contract says so, and a contract that
        // promises a lookup it cannot perform would turn every lost response into `unknown`.
        let lookup = match (&cfg.lookup, spec.receipt_lookup) {
            (Some(l), true) => Some(LookupPlan {
                request: Request {
                    method: c.method(&f("lookup.method"), &l.method)?,
                    url: c.template(
                        &f("lookup.url"),
                        &l.url,
                        &|n| n == "operation_key",
                        "`operation_key`",
                    )?,
                },
                extract: Extract {
                    reference: match &l.reference {
                        Some(p) => c.pointer(&f("lookup.reference"), p)?,
                        None => extract.reference.clone(),
                    },
                    result: match &l.result {
                        Some(p) => Some(c.pointer(&f("lookup.result"), p)?),
                        None => extract.result.clone(),
                    },
                },
            }),
            (None, false) => None,
            (None, true) => {
                return Err(c.err(
                    &f("lookup"),
                    "the contract declares `receipt_lookup: true`, so say how to look a receipt up (`lookup.url`)",
                ));
            }
            (Some(_), false) => {
                return Err(c.err(
                    &f("lookup"),
                    "a lookup is configured but the contract does not declare `downstream.receipt_lookup: true`",
                ));
            }
        };
        let job = match (&cfg.job, spec.async_jobs) {
            (Some(j), true) => Some(JobPlan {
                id: c.pointer(&f("job.id"), &j.id)?,
                poll: Request {
                    method: c.method(&f("job.poll_method"), &j.poll_method)?,
                    url: c.template(
                        &f("job.poll_url"),
                        &j.poll_url,
                        &|n| n == "job_id" || n == "operation_key",
                        "`job_id` or `operation_key`",
                    )?,
                },
                state: c.pointer(&f("job.state"), &j.state)?,
                done: non_empty(&c, &f("job.done"), &j.done)?,
                failed: j.failed.clone(),
                extract: Extract {
                    reference: c.pointer(&f("job.reference"), &j.reference)?,
                    result: c.opt_pointer(&f("job.result"), &j.result)?,
                },
                error_message: c.opt_pointer(&f("job.error_message"), &j.error_message)?,
            }),
            (None, false) => None,
            (None, true) => {
                return Err(c.err(
                    &f("job"),
                    "the contract declares `async_jobs: true`, so say how to read and poll a job (`job.id`, `job.poll_url`, `job.state`, `job.reference`)",
                ));
            }
            (Some(_), false) => {
                return Err(c.err(
                    &f("job"),
                    "a job is configured but the contract does not declare `downstream.async_jobs: true`",
                ));
            }
        };
        if !job
            .as_ref()
            .map(|j| j.poll.url.placeholders().any(|n| n == "job_id"))
            .unwrap_or(true)
        {
            return Err(c.err(&f("job.poll_url"), "the poll URL must contain `{job_id}`"));
        }
        Ok(Plan {
            tool: tool.to_string(),
            effect: Request { method, url },
            send_body,
            idempotency_header,
            headers,
            extract,
            error_message,
            lookup,
            job,
            connect_timeout: cfg.timeouts.connect.0,
            total_timeout: cfg.timeouts.total.0,
        })
    }
}

fn non_empty(c: &Checker<'_>, field: &str, list: &[String]) -> Result<Vec<String>, ConfigError> {
    if list.is_empty() {
        Err(c.err(field, "name at least one state"))
    } else {
        Ok(list.to_vec())
    }
}

impl HookPlan {
    pub(crate) fn from_contract(contract: &Contract) -> Result<Option<HookPlan>, ConfigError> {
        let tool = contract.name.as_str();
        let Some(raw) = contract.file.security.authorization_hook.as_ref() else {
            return Ok(None);
        };
        let cfg: HookConfig = typed(tool, "security.authorization_hook", raw)?;
        let c = Checker { tool };
        let field = "security.authorization_hook.url";
        let template = c.template(field, &cfg.url, &|_| false, "allowed in a hook URL")?;
        let url = template
            .literal()
            .and_then(|u| reqwest::Url::parse(u).ok())
            .ok_or_else(|| c.err(field, "not an http or https URL"))?;
        let headers = c.headers(
            "security.authorization_hook",
            &cfg.headers,
            &cfg.headers_from_env,
            &[],
        )?;
        Ok(Some(HookPlan {
            tool: tool.to_string(),
            url,
            headers,
            timeout: cfg.timeout.0,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_read_like_durations() {
        let ms = |t: &str| Timeout::parse(t).map(|t| t.0.as_millis());
        assert_eq!(ms("250ms"), Ok(250));
        assert_eq!(ms("2s"), Ok(2000));
        assert_eq!(ms("3"), Ok(3000));
        assert_eq!(ms("1m"), Ok(60_000));
        assert!(ms("0s").is_err());
        assert!(ms("2h").unwrap_err().contains("unit `h`"));
        assert!(ms("soon").is_err());
        assert!(ms("61m").is_err());
    }
}
