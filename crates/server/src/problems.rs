//! The problem types: one page per [`ErrorCode`], written once here as data.
//!
//! Every rejection is an RFC 9457 problem whose `type` is `<base>/problems/<code>`, and that
//! address answers: `GET /problems/{code}` is a small HTML page (no script, no external asset)
//! saying what the code means, what happened to the effect and what to do; with
//! `Accept: application/json` the same as JSON. `docs/errors.md` is generated from the same
//! entries ([`markdown`]) and a test keeps the two equal.
//!
//! The base is chosen once per gateway ([`ProblemBase`]): the configured `public_url`, else
//! `http://<listen address>` when the gateway listens on one specific address, else nothing,
//! which leaves the relative reference `/problems/<code>` (resolved against the request's own
//! URI, RFC 3986 section 5).

use std::net::SocketAddr;
use std::sync::Arc;

use askama::Template;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use idemgate_core::outcome::{ALL_CODES, ErrorCode};
use serde::Serialize;
use utoipa::ToSchema;

use crate::api::Segment;
use crate::wire::{ApiError, rejection_status};

/// One problem type, as a person reads it.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub code: ErrorCode,
    /// What the gateway concluded.
    pub meaning: &'static str,
    /// What happened to the effect (the downstream's side) — the question a caller has first.
    pub effect: &'static str,
    /// What the caller should do next.
    pub action: &'static str,
}

impl Entry {
    /// The problem's `title`: the app's, which every problem document of the code carries.
    pub fn title(&self) -> &'static str {
        title(self.code)
    }
}

/// Every code's entry, in the order of [`ALL_CODES`]. A code missing here is caught by the
/// tests (`every_code_has_one_entry`) and by [`entry`], which would return `None`.
pub const ENTRIES: &[Entry] = &[
    Entry {
        code: ErrorCode::InvalidArguments,
        meaning: "The request could not be taken as a call: the body is not strict JSON, has an \
                  unknown member or no `arguments`, is too large or too deep, or the arguments do \
                  not satisfy the tool's input schema. The detail names the place and the rule \
                  broken, never the value.",
        effect: "Nothing was sent by this delivery. If the key already named an operation, that \
                 operation is unchanged; `safe_to_repeat` says whether it had an effect.",
        action: "Correct the request and send it again under the same key. The tool's input \
                 schema is at `GET /v1/tools/{tool}`.",
    },
    Entry {
        code: ErrorCode::MissingOperationKey,
        meaning: "The tool is `key_based` or `irreversible`, and the call did not name its \
                  operation.",
        effect: "Nothing was claimed and nothing was sent.",
        action: "Have the calling application (never the model) name the operation from its own \
                 durable workflow state: `workflow_id` and `step_id` in the body, or the \
                 `Idempotency-Key` header `\"<workflow_id>:<step_id>\"`. A retry of the same step \
                 reuses the same names; do not mint them from the clock or a random number.",
    },
    Entry {
        code: ErrorCode::InvalidOperationKey,
        meaning: "The operation was named in a form the gateway does not accept: an empty, \
                  over-long or unprintable part, a malformed `Idempotency-Key` header, only one of \
                  `workflow_id` and `step_id`, or the header and the body fields both at once.",
        effect: "Nothing was claimed and nothing was sent.",
        action: "Correct the key as the detail says and send the request again. Keep the same \
                 names for every retry of the step.",
    },
    Entry {
        code: ErrorCode::IdempotencyKeyReusedWithDifferentRequest,
        meaning: "The key already names an operation, and this request's fingerprint (its \
                  material arguments under the tool's version) is not the one that operation was \
                  claimed with.",
        effect: "This delivery did nothing. The original operation is untouched: its effect, if \
                 it had one, stands, and it was not repeated or changed.",
        action: "Do not send this request again under this key. Read the original operation \
                 (`GET /v1/operations/{operation_key}`) to see what it did. A genuinely new action \
                 is a new workflow step with a new key.",
    },
    Entry {
        code: ErrorCode::PossibleDuplicateIntent,
        meaning: "The same material request already ran under another key within the contract's \
                  `duplicate_intent_window`. This operation is held for an operator instead of \
                  running.",
        effect: "Nothing ran for this key. The earlier operation's effect stands.",
        action: "If a second effect really is intended, an operator approves this operation \
                 (`POST /v1/operations/{operation_key}/approve`) and the caller polls it for the \
                 result; otherwise leave it, and it expires without an effect.",
    },
    Entry {
        code: ErrorCode::Unauthorized,
        meaning: "The request had no bearer token, or a token this gateway does not accept. The \
                  answer carries `WWW-Authenticate: Bearer`.",
        effect: "Nothing was read, claimed or sent.",
        action: "Send `Authorization: Bearer <token>` with a token configured for the tenant.",
    },
    Entry {
        code: ErrorCode::Forbidden,
        meaning: "The token is valid but not allowed this: an operator action with an agent's \
                  token, or the tool's authorization hook refused this caller. Authorization is \
                  rechecked before every effect and every replay, so a permission revoked since \
                  the first delivery refuses the retry too.",
        effect: "This delivery sent nothing. An operation that already had an effect keeps it; \
                 `safe_to_repeat` says which.",
        action: "Do not retry unchanged. Obtain the permission (or use an operator's token for an \
                 operator action), then send the same request under the same key.",
    },
    Entry {
        code: ErrorCode::AuthorizationUnavailable,
        meaning: "The tool's authorization hook could not be reached or gave no usable answer. \
                  The gateway does not guess a permission.",
        effect: "Nothing was sent.",
        action: "Send the same request under the same key after `Retry-After` seconds.",
    },
    Entry {
        code: ErrorCode::ApprovalDenied,
        meaning: "An operator denied this operation while it waited for approval.",
        effect: "The effect never ran. Every later delivery of this key is answered with this \
                 refusal.",
        action: "Do not send it again under this key. If a different action is wanted, it is a \
                 new step with a new key, and it may need approval again.",
    },
    Entry {
        code: ErrorCode::ApprovalExpired,
        meaning: "The operation waited for an operator longer than its approval window \
                  (`security.approval_window`, by default the contract's \
                  `retention.max_retry_window`).",
        effect: "The effect never ran.",
        action: "If the action is still wanted, start it as a new step with a new key; it will \
                 wait for approval again.",
    },
    Entry {
        code: ErrorCode::ExpiredOperation,
        meaning: "The key's record was compacted after its retention, and the contract answers \
                  late deliveries with a refusal (`retention.late_arrival: reject`).",
        effect: "This delivery did nothing. If `effect_reference` is present, the effect happened \
                 before the record expired and `safe_to_repeat` is false.",
        action: "Do not resend under this key. Check `effect_reference` against the system of \
                 record; a new action needs new intent, that is a new key.",
    },
    Entry {
        code: ErrorCode::DownstreamRejected,
        meaning: "The system of record refused the effect with an answer it declares final (a \
                  validation or business rule on its side).",
        effect: "The effect was not applied. The refusal is kept, and later deliveries of this \
                 key are answered with it.",
        action: "Fix what the detail says on the downstream's side or in the arguments, and send \
                 the corrected action as a new step with a new key.",
    },
    Entry {
        code: ErrorCode::DownstreamUnavailable,
        meaning: "The system of record could not be reached, or answered that it did not process \
                  the request (overloaded, unavailable), before any effect.",
        effect: "Nothing was applied, and the gateway can prove it; the claim was released.",
        action: "Send the same request under the same key after `Retry-After` seconds.",
    },
    Entry {
        code: ErrorCode::PreconditionFailed,
        meaning: "The update carried a version precondition and the target has changed since \
                  that version: someone else wrote to it first.",
        effect: "The update was not applied.",
        action: "Read the target again, decide again, and send the update with the new version.",
    },
    Entry {
        code: ErrorCode::OutcomeUnknown,
        meaning: "The effect may have happened and nothing can prove whether it did: the answer \
                  was lost and the downstream neither deduplicates on the key nor offers a \
                  receipt lookup that found it. This code usually arrives as the `error` of a 202 \
                  `unknown` outcome, not as a problem.",
        effect: "Maybe applied, maybe not. The gateway will not send it again on its own.",
        action: "Never resend, under this key or a new one. An operator reconciles the operation \
                 against the system of record (`POST /v1/operations/{operation_key}/reconcile`); \
                 poll the operation until it settles.",
    },
    Entry {
        code: ErrorCode::StoreUnavailable,
        meaning: "The operation store could not be reached. The gateway's log has the detail.",
        effect: "Nothing was claimed and nothing was sent.",
        action: "Send the same request under the same key after `Retry-After` seconds.",
    },
    Entry {
        code: ErrorCode::EffectClassRefused,
        meaning: "The tool is declared `non_idempotent`: every delivery would repeat its effect, \
                  so the gateway never executes it.",
        effect: "Nothing was sent.",
        action: "Redesign the tool's contract: a keyed command (`key_based`, sent to a downstream \
                 that deduplicates on the key or offers a receipt lookup) or an absolute update \
                 (`natural_idempotent`, such as setting a value at a version).",
    },
    Entry {
        code: ErrorCode::UnknownTool,
        meaning: "No tool of that name is loaded by this gateway. The detail names the tool asked \
                  for.",
        effect: "Nothing was claimed and nothing was sent.",
        action: "`GET /v1/tools` lists the loaded tools; check the name against it and the \
                 gateway's contract files.",
    },
    Entry {
        code: ErrorCode::NotFound,
        meaning: "No such operation for this tenant in this environment (another tenant's key \
                  answers exactly the same), or no such resource.",
        effect: "Nothing was read or changed.",
        action: "Check the operation key, `tenant:environment:workflow_id:step_id`, as the \
                 invocation's answer gave it, and the path.",
    },
    Entry {
        code: ErrorCode::Conflict,
        meaning: "The operation is not in a state this action applies to (reconciling one that is \
                  not unknown, approving one that does not await approval), it changed while the \
                  action ran, or its tool is no longer loaded.",
        effect: "This action changed nothing. The operation's record says what happened to the \
                 effect.",
        action: "Read the operation again (`GET /v1/operations/{operation_key}`) and decide from \
                 its current state.",
    },
    Entry {
        code: ErrorCode::WebhookSignatureInvalid,
        meaning: "A webhook delivery to `/v1/webhooks/{source}` was not proved to come from the \
                  source's sender: a `webhook-id`, `webhook-timestamp` or `webhook-signature` \
                  header is missing or malformed, the timestamp lies outside the source's \
                  tolerance, or no `v1` signature matches any of the source's secrets. The \
                  detail says which.",
        effect: "Nothing was recorded and no operation changed; the body was not logged.",
        action: "For the sender: sign with a current secret (Standard Webhooks, `v1` HMAC-SHA256 \
                 over `id.timestamp.body`) and send promptly; a retried delivery is signed anew. \
                 For the operator: check the source's `secret_envs`, and during a rotation keep \
                 both secrets configured.",
    },
    Entry {
        code: ErrorCode::InternalError,
        meaning: "The gateway failed in a way it did not expect. The log has the detail; the \
                  answer does not.",
        effect: "Not known from this answer. The operation's record is the authority.",
        action: "Read the operation (`GET /v1/operations/{operation_key}`) before anything else, \
                 and do not resend blindly; report the failure with the time and the key.",
    },
];

/// The entry of a code.
pub fn entry(code: ErrorCode) -> Option<&'static Entry> {
    ENTRIES.iter().find(|e| e.code == code)
}

/// The `title` of a problem with this code (the app's: a problem document made without the
/// gateway, by `idemgate ops --store`, carries the same).
pub fn title(code: ErrorCode) -> &'static str {
    idemgate_app::problems::title(code)
}

/// `scheme://host[:port]` of an http(s) URL or origin, lower case, without a path and without
/// the scheme's default port; `None` for anything else.
pub(crate) fn normal_origin(url: &str) -> Option<String> {
    let lower = url.to_ascii_lowercase();
    let (scheme, rest, default_port) = if let Some(rest) = lower.strip_prefix("https://") {
        ("https", rest, ":443")
    } else if let Some(rest) = lower.strip_prefix("http://") {
        ("http", rest, ":80")
    } else {
        return None;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.strip_suffix(default_port).unwrap_or(authority);
    if authority.is_empty() {
        return None;
    }
    Some(format!("{scheme}://{authority}"))
}

// ---------------------------------------------------------------------------------------------
// The base of problem type URIs.

/// What problem type URIs start with: an absolute `scheme://authority` (no trailing slash),
/// or empty for the relative reference `/problems/<code>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProblemBase(Arc<str>);

impl ProblemBase {
    /// Relative: `/problems/<code>`.
    pub fn relative() -> ProblemBase {
        ProblemBase::default()
    }

    /// A checked public URL: `http://` or `https://`, a host, no query or fragment. A trailing
    /// `/` is dropped.
    pub fn parse(url: &str) -> Result<ProblemBase, String> {
        let url = url.trim_end_matches('/');
        let rest = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"))
            .ok_or_else(|| format!("{url:?} must start with http:// or https://"))?;
        if rest.is_empty() || rest.starts_with('/') {
            return Err(format!("{url:?} names no host"));
        }
        if rest.contains(['?', '#']) || rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "{url:?} must have no query, fragment, space or control character"
            ));
        }
        Ok(ProblemBase(url.into()))
    }

    /// The base a gateway listening on `addr` uses without a configured `public_url`: its own
    /// address when that is one specific address; relative when it listens on every address
    /// (`0.0.0.0`, `[::]`), where no single address names it.
    pub fn for_listener(addr: SocketAddr) -> ProblemBase {
        if addr.ip().is_unspecified() {
            ProblemBase::relative()
        } else {
            ProblemBase(format!("http://{addr}").into())
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The web origin of the public URL (`scheme://host[:port]`, lower case, a default port
    /// dropped), as a browser sends it in `Origin`; `None` for a relative base.
    pub fn origin(&self) -> Option<String> {
        normal_origin(&self.0)
    }

    /// The `type` of a problem with this code.
    pub fn type_of(&self, code: ErrorCode) -> String {
        idemgate_app::problems::problem_type(&self.0, code)
    }
}

// ---------------------------------------------------------------------------------------------
// The pages.

/// A problem type as JSON (`GET /problems/{code}` with `Accept: application/json`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ProblemTypeView {
    #[schema(value_type = crate::openapi::ErrorCodeName)]
    pub code: &'static str,
    pub title: &'static str,
    /// The HTTP status of a problem with this code (413 replaces it for an oversized body).
    pub status: u16,
    /// The `next_action` a problem with this code carries.
    #[schema(value_type = crate::wire::NextActionView)]
    pub next_action: &'static str,
    /// Whether the same request may succeed later unchanged (the answer has `Retry-After`).
    pub retryable: bool,
    pub meaning: &'static str,
    pub effect: &'static str,
    pub action: &'static str,
}

fn view(e: &Entry) -> ProblemTypeView {
    ProblemTypeView {
        code: e.code.as_str(),
        title: e.title(),
        status: rejection_status(e.code).as_u16(),
        next_action: e.code.next_action().as_str(),
        retryable: e.code.retryable(),
        meaning: e.meaning,
        effect: e.effect,
        action: e.action,
    }
}

#[derive(Template)]
#[template(path = "problem.html")]
struct Page<'a> {
    problem: &'a ProblemTypeView,
    /// The three texts as HTML: escaped, with their `code` spans marked up.
    meaning: String,
    effect: String,
    action: String,
    others: Vec<(&'static str, &'static str)>,
}

/// Escapes `text` for HTML and turns its backtick spans into `<code>` elements (the entries
/// are written once, for the Markdown document and the page alike).
fn html_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut in_code = false;
    for c in text.chars() {
        match c {
            '`' => {
                out.push_str(if in_code { "</code>" } else { "<code>" });
                in_code = !in_code;
            }
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    if in_code {
        out.push_str("</code>");
    }
    out
}

#[derive(Template)]
#[template(path = "problems.html")]
struct Index {
    problems: Vec<ProblemTypeView>,
}

/// Whether the caller asked for JSON rather than a page.
fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.split(';').next().unwrap_or("").trim())
        .any(|t| t.eq_ignore_ascii_case("application/json"))
}

fn html(text: String) -> Response {
    let mut r = text.into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // The pages are the same for every caller and change only with the binary.
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    // No script and no asset from anywhere: say so to the browser too.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'"),
    );
    r
}

/// A problem type: what the code means, what happened to the effect, what to do.
#[utoipa::path(
    get,
    path = "/problems/{code}",
    operation_id = "get_problem_type",
    tag = crate::api::TAG,
    params(("code" = String, Path, description = "An error code, as in a problem's `error.code`.", example = "invalid_arguments")),
    responses(
        (status = 200, description = "the problem type: an HTML page, or JSON with `Accept: application/json`",
            content(
                (String = "text/html"),
                (ProblemTypeView = "application/json"),
            )),
        (status = 404, description = "no such error code", body = crate::wire::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn page(Segment(code): Segment, headers: HeaderMap) -> Result<Response, ApiError> {
    let Some(entry) = ErrorCode::parse(&code).and_then(entry) else {
        let shown: String = code
            .chars()
            .take(64)
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no problem type {shown:?}; GET /problems lists them"),
        ));
    };
    let problem = view(entry);
    if wants_json(&headers) {
        return Ok(axum::Json(problem).into_response());
    }
    let page = Page {
        problem: &problem,
        meaning: html_of(entry.meaning),
        effect: html_of(entry.effect),
        action: html_of(entry.action),
        others: ENTRIES
            .iter()
            .filter(|e| e.code != entry.code)
            .map(|e| (e.code.as_str(), e.title()))
            .collect(),
    };
    page.render()
        .map(html)
        .map_err(|e| ApiError::internal("problem page failed to render", &e))
}

/// Every problem type.
#[utoipa::path(
    get,
    path = "/problems",
    operation_id = "list_problem_types",
    tag = crate::api::TAG,
    responses(
        (status = 200, description = "every problem type: an HTML page, or JSON with `Accept: application/json`",
            content(
                (String = "text/html"),
                (Vec<ProblemTypeView> = "application/json"),
            )),
    )
)]
pub async fn index(headers: HeaderMap) -> Result<Response, ApiError> {
    let problems: Vec<ProblemTypeView> = ALL_CODES
        .iter()
        .filter_map(|c| entry(*c))
        .map(view)
        .collect();
    if wants_json(&headers) {
        return Ok(axum::Json(problems).into_response());
    }
    Index { problems }
        .render()
        .map(html)
        .map_err(|e| ApiError::internal("problem index failed to render", &e))
}

// ---------------------------------------------------------------------------------------------
// docs/errors.md

/// The marker lines between which `docs/errors.md` holds [`markdown`]'s text.
pub const DOC_BEGIN: &str =
    "<!-- generated from crates/server/src/problems.rs: do not edit by hand -->";
pub const DOC_END: &str = "<!-- end of generated text -->";

/// The reference part of `docs/errors.md`: a table of every code, then one section each.
pub fn markdown() -> String {
    let mut out = String::new();
    out.push_str("| code | HTTP | next_action | retry unchanged |\n|---|---|---|---|\n");
    for code in ALL_CODES {
        let Some(e) = entry(*code) else { continue };
        let v = view(e);
        out.push_str(&format!(
            "| [`{}`](#{}) | {} | {} | {} |\n",
            v.code,
            v.code,
            v.status,
            v.next_action,
            if v.retryable {
                "yes, after `Retry-After`"
            } else {
                "no"
            }
        ));
    }
    for code in ALL_CODES {
        let Some(e) = entry(*code) else { continue };
        let v = view(e);
        out.push_str(&format!(
            "\n### {code}\n\n**{title}** — HTTP {status}, `next_action: {next}`.\n\n{meaning}\n\n\
             *The effect:* {effect}\n\n*What to do:* {action}\n",
            code = v.code,
            title = v.title,
            status = v.status,
            next = v.next_action,
            meaning = v.meaning,
            effect = v.effect,
            action = v.action,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_one_entry() {
        for code in ALL_CODES {
            let n = ENTRIES.iter().filter(|e| e.code == *code).count();
            assert_eq!(n, 1, "{} has {n} entries", code.as_str());
        }
        assert_eq!(ENTRIES.len(), ALL_CODES.len());
        for e in ENTRIES {
            for text in [e.title(), e.meaning, e.effect, e.action] {
                assert!(!text.trim().is_empty(), "{}", e.code.as_str());
                assert!(!text.contains("  "), "{}: {text:?}", e.code.as_str());
            }
        }
    }

    #[test]
    fn bases() {
        let check = |url: &str, expect: Result<&str, ()>| {
            assert_eq!(
                ProblemBase::parse(url)
                    .map(|b| b.as_str().to_string())
                    .map_err(|_| ()),
                expect.map(str::to_string),
                "{url}"
            )
        };
        check("https://gate.example", Ok("https://gate.example"));
        check("https://gate.example/", Ok("https://gate.example"));
        check(
            "http://127.0.0.1:8080/idemgate/",
            Ok("http://127.0.0.1:8080/idemgate"),
        );
        check("gate.example", Err(()));
        check("https://", Err(()));
        check("https://gate.example/?x=1", Err(()));
        check("https://gate.example/#x", Err(()));
        check("https://gate example", Err(()));
        let listen = |a: &str| {
            ProblemBase::for_listener(a.parse().unwrap())
                .as_str()
                .to_string()
        };
        assert_eq!(listen("127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(listen("[::1]:8080"), "http://[::1]:8080");
        assert_eq!(listen("0.0.0.0:8080"), "");
        assert_eq!(listen("[::]:8080"), "");
        assert_eq!(
            ProblemBase::relative().type_of(ErrorCode::NotFound),
            "/problems/not_found"
        );
    }

    #[test]
    fn html_marks_up_code_and_escapes_the_rest() {
        assert_eq!(
            html_of("send `a<b>` & 'c'"),
            "send <code>a&lt;b&gt;</code> &amp; &#39;c&#39;"
        );
        assert_eq!(html_of("`open"), "<code>open</code>");
        for e in ENTRIES {
            for text in [e.meaning, e.effect, e.action] {
                assert_eq!(
                    text.matches('`').count() % 2,
                    0,
                    "{}: {text}",
                    e.code.as_str()
                );
            }
        }
    }

    #[test]
    fn accept() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::ACCEPT, v.parse().unwrap());
            wants_json(&m)
        };
        assert!(h("application/json"));
        assert!(h("text/html;q=0.5, Application/JSON"));
        assert!(!h("text/html"));
        assert!(!h("*/*"));
        assert!(!wants_json(&HeaderMap::new()));
    }
}
