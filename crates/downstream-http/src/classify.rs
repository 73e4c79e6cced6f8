//! What an HTTP answer means, as pure functions over what came back.
//!
//! The transport ([`crate::HttpDownstream`]) reduces every exchange to a [`Reply`] — a status
//! with its body, or a [`Transport`] failure that says how far the request got — and these
//! functions turn it into the executor's vocabulary. Keeping them free of I/O is what lets the
//! classification table be tested as data, one line per status or fault.
//!
//! The table's single principle: say "nothing happened" only when it is proved, and "it
//! happened" only with the downstream's own reference in hand. Everything between is
//! ambiguous, and the executor settles it by a receipt lookup or a deduplicated resend — never
//! by guessing.

use idemgate_core::ErrorCode;
use idemgate_core::effect::{Authorization, EffectOutcome, JobStatus, Lookup};
use idemgate_core::record::{Receipt, Refusal};
use serde_json::Value;

use crate::config::{Extract, JobPlan};

/// Longest reference accepted from a downstream. References are stored in every record and
/// shown to operators; a longer one is a malformed answer, not a receipt.
pub(crate) const MAX_REFERENCE: usize = 512;
/// Longest downstream-supplied reason kept in a refusal or denial.
pub(crate) const MAX_REASON: usize = 200;

/// How far a request got when no status came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Transport {
    /// The connection was never established — refused, unreachable, name not resolved, TLS
    /// handshake failed, connect timeout. No byte of the request left this process.
    NotConnected(String),
    /// Connected, then the total timeout expired: the request may have been processed.
    TimedOut(String),
    /// Connected, then the connection closed or reset without a complete answer.
    Lost(String),
}

/// One exchange, reduced to what classification needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply<'a> {
    Answered {
        status: u16,
        /// The raw `Retry-After` header.
        retry_after: Option<&'a str>,
        /// The body, or why it could not be read in full (reset mid-body, over the size limit).
        body: Result<&'a [u8], String>,
    },
    Failed(Transport),
}

/// Reads the whole body as JSON.
fn json(body: &Result<&[u8], String>) -> Result<Value, String> {
    match body {
        Ok(bytes) => serde_json::from_slice(bytes)
            .map_err(|_| "downstream answered a body that is not JSON".to_string()),
        Err(e) => Err(format!("the answer's body could not be read: {e}")),
    }
}

/// The value at `pointer` as a reference: a non-empty string or an integer.
fn reference(body: &Value, pointer: &str) -> Option<String> {
    match body.pointer(pointer)? {
        Value::String(s)
            if !s.is_empty() && s.len() <= MAX_REFERENCE && !s.chars().any(char::is_control) =>
        {
            Some(s.clone())
        }
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

/// The receipt in `body` per `extract`, or why there is none.
pub(crate) fn receipt(body: &Value, extract: &Extract) -> Result<Receipt, String> {
    let reference = reference(body, &extract.reference).ok_or_else(|| {
        format!(
            "downstream answer has no usable reference at `{}`",
            extract.reference
        )
    })?;
    let result = match &extract.result {
        None => body.clone(),
        Some(pointer) => body
            .pointer(pointer)
            .cloned()
            .ok_or_else(|| format!("downstream answer has no result at `{pointer}`"))?,
    };
    Ok(Receipt { reference, result })
}

/// A short, printable reason from `pointer` in a body, if there is one.
pub(crate) fn short_reason(body: Option<&Value>, pointer: Option<&str>) -> Option<String> {
    let text = body?.pointer(pointer?)?.as_str()?;
    let cleaned: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_REASON)
        .collect();
    let cleaned = cleaned.trim();
    (!cleaned.is_empty()).then(|| cleaned.to_string())
}

/// `Retry-After` as delta-seconds. An HTTP-date is ignored (answered as no advice) rather than
/// compared with a clock this crate does not own.
fn retry_after(header: Option<&str>) -> Option<u64> {
    header?.trim().parse().ok()
}

/// `422 Unprocessable Entity`, or `599` for a code without a canonical reason.
pub(crate) fn status_text(status: u16) -> String {
    match reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
    {
        Some(reason) => format!("{status} {reason}"),
        None => status.to_string(),
    }
}

/// What the effect's answer means.
pub(crate) struct EffectRules<'a> {
    pub extract: &'a Extract,
    /// Pointer to a short reason in a refusal.
    pub error_message: Option<&'a str>,
    /// Pointer to the job id in a `202`, when the contract declares jobs.
    pub job_id: Option<&'a str>,
}

pub(crate) fn effect(rules: &EffectRules<'_>, reply: &Reply<'_>) -> EffectOutcome {
    let ambiguous = EffectOutcome::ambiguous;
    let (status, retry, body) = match reply {
        // Only a connection that was never made proves the request never left: release.
        Reply::Failed(Transport::NotConnected(e)) => {
            return EffectOutcome::NotSent {
                reason: format!("could not connect to the downstream: {e}"),
                retry_after: None,
            };
        }
        // A timeout says nothing about whether the downstream did the work. Never success.
        Reply::Failed(Transport::TimedOut(e)) => {
            return ambiguous(format!("timed out waiting for the downstream: {e}"));
        }
        // The request was (at least partly) sent; the downstream may have committed.
        Reply::Failed(Transport::Lost(e)) => {
            return ambiguous(format!("connection lost after the request was sent: {e}"));
        }
        Reply::Answered {
            status,
            retry_after,
            body,
        } => (*status, *retry_after, body),
    };
    match status {
        // Accepted: a job id is a promise to be polled, not a receipt. Without declared jobs we
        // cannot follow it, so it is no proof either way.
        202 => match rules.job_id {
            Some(pointer) => match json(body) {
                Ok(v) => match reference(&v, pointer) {
                    Some(job_id) => EffectOutcome::Accepted { job_id },
                    None => ambiguous(format!(
                        "downstream answered 202 without a job id at `{pointer}`"
                    )),
                },
                Err(e) => ambiguous(format!("downstream answered 202, but {e}")),
            },
            None => ambiguous(
                "downstream answered 202 Accepted, but the contract declares no async jobs".into(),
            ),
        },
        // Success counts only with the downstream's own reference in a readable body: a 2xx
        // without one may be a proxy's or a half-written answer, so it is settled by a lookup.
        200..=299 => match json(body).and_then(|v| receipt(&v, rules.extract)) {
            Ok(receipt) => EffectOutcome::Committed(receipt),
            Err(e) => ambiguous(format!(
                "downstream answered {}, but {e}",
                status_text(status)
            )),
        },
        // Redirects are not followed (a POST must not silently become a GET elsewhere), and a
        // 303 after a POST even means "done, look there": no proof either way.
        300..=399 => ambiguous(format!(
            "downstream answered a redirect ({}), which is not followed",
            status_text(status)
        )),
        // "Not processed, try later": Request Timeout, Too Early and Too Many Requests are
        // defined as the server not having acted on the request, so the claim may be released.
        408 | 425 | 429 => EffectOutcome::NotSent {
            reason: format!(
                "downstream did not process the request: {}",
                status_text(status)
            ),
            retry_after: retry_after(retry),
        },
        // Conflict: per the idempotency-key draft, another request under this key is still in
        // progress — the effect may be happening right now. Its `Retry-After` says when the
        // first request may have finished, so it is kept as advice for the resend.
        409 => EffectOutcome::Ambiguous {
            reason: format!(
                "downstream answered {}: a request under this key may be in progress",
                status_text(status)
            ),
            retry_after: retry_after(retry),
        },
        // A version precondition (If-Match) did not hold: the downstream refused before acting.
        412 => EffectOutcome::PreconditionFailed(format!(
            "downstream answered {}: the target changed since its version was read",
            status_text(status)
        )),
        // Any other 4xx is a deterministic refusal: the same request would be refused again,
        // so it is recorded and replayed as the same refusal.
        400..=499 => {
            let parsed = json(body).ok();
            let message = match short_reason(parsed.as_ref(), rules.error_message) {
                Some(reason) => format!("downstream answered {}: {reason}", status_text(status)),
                None => format!("downstream answered {}", status_text(status)),
            };
            EffectOutcome::Refused(Refusal {
                code: ErrorCode::DownstreamRejected,
                message,
            })
        }
        // A 5xx can come after the commit (a crash while answering, a proxy's 502/504 in front
        // of a slow success): ambiguous, never "not sent". A `Retry-After` (typically on a 503)
        // is the downstream's advice on when a resend may be served; the executor waits that
        // long before it resends or looks the receipt up.
        500..=599 => EffectOutcome::Ambiguous {
            reason: format!("downstream answered {}", status_text(status)),
            retry_after: retry_after(retry),
        },
        // Informational or non-standard codes are not answers we understand.
        _ => ambiguous(format!("downstream answered status {status}")),
    }
}

/// What a receipt lookup's answer means.
pub(crate) fn lookup(extract: &Extract, reply: &Reply<'_>) -> Lookup {
    match reply {
        Reply::Answered {
            status: 200..=299,
            body,
            ..
        } => match json(body).and_then(|v| receipt(&v, extract)) {
            Ok(receipt) => Lookup::Found(receipt),
            // A lookup that answers "found" without a usable receipt proves nothing.
            Err(e) => Lookup::Unavailable(format!("receipt lookup answered, but {e}")),
        },
        // Only an explicit 404 is "no effect under this key"; the executor may then resend to a
        // deduplicating downstream.
        Reply::Answered { status: 404, .. } => Lookup::NotFound,
        Reply::Answered { status, .. } => {
            Lookup::Unavailable(format!("receipt lookup answered {}", status_text(*status)))
        }
        Reply::Failed(t) => Lookup::Unavailable(format!("receipt lookup failed: {}", transport(t))),
    }
}

/// What a job poll's answer means.
pub(crate) fn job(plan: &JobPlan, reply: &Reply<'_>) -> JobStatus {
    let body = match reply {
        Reply::Answered {
            status: 200..=299,
            body,
            ..
        } => body,
        // The downstream says it does not know this job (any more, or for this key): asking
        // again cannot finish it, and it may have run, so the executor ends it `unknown`
        // instead of polling for ever.
        Reply::Answered {
            status: status @ (404 | 410),
            ..
        } => {
            return JobStatus::Gone(format!(
                "job poll answered {}: the downstream does not know the job",
                status_text(*status)
            ));
        }
        Reply::Answered { status, .. } => {
            return JobStatus::Unavailable(format!("job poll answered {}", status_text(*status)));
        }
        Reply::Failed(t) => {
            return JobStatus::Unavailable(format!("job poll failed: {}", transport(t)));
        }
    };
    let value = match json(body) {
        Ok(v) => v,
        Err(e) => return JobStatus::Unavailable(format!("job poll: {e}")),
    };
    let Some(state) = value.pointer(&plan.state).and_then(Value::as_str) else {
        return JobStatus::Unavailable(format!("job poll answer has no state at `{}`", plan.state));
    };
    if plan.done.iter().any(|d| d == state) {
        match receipt(&value, &plan.extract) {
            Ok(receipt) => JobStatus::Done(receipt),
            // Done without a reference cannot be recorded as applied; ask again later.
            Err(e) => JobStatus::Unavailable(format!("job is `{state}`, but {e}")),
        }
    } else if plan.failed.iter().any(|f| f == state) {
        let message = match short_reason(Some(&value), plan.error_message.as_deref()) {
            Some(reason) => format!("downstream job failed: {reason}"),
            None => format!("downstream job ended `{state}`"),
        };
        JobStatus::Failed(Refusal {
            code: ErrorCode::DownstreamRejected,
            message,
        })
    } else {
        JobStatus::Running
    }
}

/// What the authorization hook's answer means. Anything but a clear answer fails closed.
pub(crate) fn authorization(reply: &Reply<'_>) -> Authorization {
    let (status, body) = match reply {
        Reply::Answered { status, body, .. } => (*status, body),
        Reply::Failed(t) => {
            return Authorization::Unavailable(format!(
                "authorization hook unreachable: {}",
                transport(t)
            ));
        }
    };
    let parsed = json(body).ok();
    let reason = || {
        short_reason(parsed.as_ref(), Some("/reason"))
            .unwrap_or_else(|| "denied by the authorization hook".into())
    };
    match status {
        200..=299 => match parsed.as_ref().and_then(|v| v.get("allow")) {
            Some(Value::Bool(true)) => Authorization::Allowed,
            Some(Value::Bool(false)) => Authorization::Denied(reason()),
            _ => Authorization::Unavailable(
                "authorization hook answered without a boolean `allow`".into(),
            ),
        },
        403 => Authorization::Denied(reason()),
        _ => Authorization::Unavailable(format!(
            "authorization hook answered {}",
            status_text(status)
        )),
    }
}

fn transport(t: &Transport) -> String {
    match t {
        Transport::NotConnected(e) => format!("could not connect: {e}"),
        Transport::TimedOut(e) => format!("timed out: {e}"),
        Transport::Lost(e) => format!("connection lost: {e}"),
    }
}

#[cfg(test)]
mod tests {
    //! The classification table, one line per status or fault.

    use super::*;

    fn extract() -> Extract {
        Extract {
            reference: "/ticket_id".into(),
            result: None,
        }
    }

    /// A status with a body (`!` marks a body that broke mid-read).
    fn answer(status: u16, body: &str) -> Reply<'_> {
        Reply::Answered {
            status,
            retry_after: None,
            body: match body.strip_prefix('!') {
                Some(e) => Err(e.to_string()),
                None => Ok(body.as_bytes()),
            },
        }
    }

    /// The outcome's kind, and its detail where it matters.
    fn kind(o: &EffectOutcome) -> String {
        match o {
            EffectOutcome::Committed(r) => format!("committed {}", r.reference),
            EffectOutcome::Accepted { job_id } => format!("accepted {job_id}"),
            EffectOutcome::Refused(r) => format!("refused {}: {}", r.code.as_str(), r.message),
            EffectOutcome::PreconditionFailed(_) => "precondition".into(),
            EffectOutcome::NotSent { retry_after, .. } => format!("not_sent {retry_after:?}"),
            EffectOutcome::Ambiguous { retry_after, .. } => format!("ambiguous {retry_after:?}"),
        }
    }

    fn check(jobs: bool, reply: Reply<'_>, expect: &str) {
        let x = extract();
        let rules = EffectRules {
            extract: &x,
            error_message: Some("/error"),
            job_id: jobs.then_some("/job_id"),
        };
        let got = kind(&effect(&rules, &reply));
        assert!(
            got.starts_with(expect),
            "{reply:?}: expected `{expect}`, got `{got}`"
        );
    }

    #[test]
    #[rustfmt::skip]
    fn effect_classification_table() {
        // 2xx: success only with a reference in a readable JSON body.
        check(false, answer(201, r#"{"ticket_id":"t_1"}"#), "committed t_1");
        check(false, answer(200, r#"{"ticket_id":42}"#), "committed 42");
        check(false, answer(200, r#"{"ticket_id":""}"#), "ambiguous");
        check(false, answer(200, r#"{"ticket_id":null}"#), "ambiguous");
        check(false, answer(200, r#"{"ticket_id":1.5}"#), "ambiguous");
        check(false, answer(200, r#"{"ticket_id":{"x":1}}"#), "ambiguous");
        check(false, answer(200, r#"{"id":"t_1"}"#), "ambiguous");
        check(false, answer(200, "{not json"), "ambiguous");
        check(false, answer(204, ""), "ambiguous");
        check(false, answer(200, "!connection reset"), "ambiguous");
        // 202: a job when the contract declares jobs, else no proof of anything.
        check(true, answer(202, r#"{"job_id":"job_1"}"#), "accepted job_1");
        check(true, answer(202, r#"{"job_id":7}"#), "accepted 7");
        check(true, answer(202, r#"{}"#), "ambiguous");
        check(true, answer(202, "garbage"), "ambiguous");
        check(false, answer(202, r#"{"job_id":"job_1"}"#), "ambiguous");
        // A 200 still commits when jobs are declared (a deduplicated resend of a finished job).
        check(true, answer(200, r#"{"ticket_id":"t_1"}"#), "committed t_1");
        // 3xx: not followed, no proof.
        check(false, answer(303, ""), "ambiguous");
        check(false, answer(307, ""), "ambiguous");
        // 4xx: refusals, except "not processed" (release), conflict (ambiguous), precondition.
        check(false, answer(400, ""), "refused downstream_rejected: downstream answered 400 Bad Request");
        check(false, answer(404, ""), "refused downstream_rejected: downstream answered 404 Not Found");
        check(false, answer(422, r#"{"error":"queue closed"}"#), "refused downstream_rejected: downstream answered 422 Unprocessable Entity: queue closed");
        check(false, answer(422, "{oops"), "refused downstream_rejected: downstream answered 422 Unprocessable Entity");
        check(false, answer(403, "!reset"), "refused downstream_rejected: downstream answered 403 Forbidden");
        check(false, answer(408, ""), "not_sent None");
        check(false, answer(425, ""), "not_sent None");
        check(false, answer(429, ""), "not_sent None");
        check(false, answer(409, ""), "ambiguous None");
        check(false, answer(412, ""), "precondition");
        // 5xx: all ambiguous, whatever the body says.
        check(false, answer(500, r#"{"ticket_id":"t_1"}"#), "ambiguous");
        check(false, answer(502, ""), "ambiguous");
        check(false, answer(503, ""), "ambiguous None");
        check(false, answer(504, ""), "ambiguous");
        // Odd codes are not understood.
        check(false, answer(101, ""), "ambiguous");
        check(false, answer(600, ""), "ambiguous");
        // Transport faults: only a connection never made proves nothing was sent.
        check(false, Reply::Failed(Transport::NotConnected("refused".into())), "not_sent None");
        check(false, Reply::Failed(Transport::TimedOut("10s".into())), "ambiguous");
        check(false, Reply::Failed(Transport::Lost("reset".into())), "ambiguous");
    }

    #[test]
    fn retry_after_is_carried_on_not_processed_and_ambiguous_answers() {
        let with = |status, header| {
            let x = extract();
            let rules = EffectRules {
                extract: &x,
                error_message: None,
                job_id: None,
            };
            kind(&effect(
                &rules,
                &Reply::Answered {
                    status,
                    retry_after: header,
                    body: Ok(b""),
                },
            ))
        };
        assert_eq!(with(429, Some("7")), "not_sent Some(7)");
        assert_eq!(with(408, Some(" 30 ")), "not_sent Some(30)");
        assert_eq!(
            with(425, Some("Wed, 21 Oct 2026 07:28:00 GMT")),
            "not_sent None"
        );
        assert_eq!(with(429, Some("-1")), "not_sent None");
        // An ambiguous answer keeps the advice for the resend (or lookup) it leads to.
        assert_eq!(with(503, Some("120")), "ambiguous Some(120)");
        assert_eq!(with(503, None), "ambiguous None");
        assert_eq!(with(500, Some("3")), "ambiguous Some(3)");
        assert_eq!(with(502, Some(" 5 ")), "ambiguous Some(5)");
        assert_eq!(with(504, Some("0")), "ambiguous Some(0)");
        assert_eq!(
            with(503, Some("Wed, 21 Oct 2026 07:28:00 GMT")),
            "ambiguous None"
        );
        assert_eq!(with(503, Some("1.5")), "ambiguous None");
        assert_eq!(with(409, Some("2")), "ambiguous Some(2)");
        // Advice on an answer that proves nothing else is not taken: a 2xx without a receipt
        // is settled by a lookup, not by waiting.
        assert_eq!(with(200, Some("9")), "ambiguous None");
    }

    #[test]
    fn refusals_never_echo_more_than_a_short_reason() {
        let x = extract();
        let long = format!(r#"{{"error":"{}","echo":"secret body"}}"#, "x".repeat(5000));
        for pointer in [None, Some("/error")] {
            let rules = EffectRules {
                extract: &x,
                error_message: pointer,
                job_id: None,
            };
            let EffectOutcome::Refused(r) = effect(&rules, &answer(422, &long)) else {
                panic!("expected a refusal");
            };
            assert!(!r.message.contains("secret"), "{}", r.message);
            assert!(r.message.len() <= 60 + MAX_REASON, "{}", r.message.len());
        }
        // Control characters cannot forge log lines.
        assert_eq!(
            short_reason(Some(&serde_json::json!({"e": "a\nb"})), Some("/e")).as_deref(),
            Some("a b")
        );
    }

    #[test]
    fn a_result_pointer_selects_the_replay_safe_part() {
        let x = Extract {
            reference: "/ticket/id".into(),
            result: Some("/ticket".into()),
        };
        let body = serde_json::json!({"ticket": {"id": "t_9", "status": "open"}, "debug": "x"});
        assert_eq!(
            receipt(&body, &x),
            Ok(Receipt {
                reference: "t_9".into(),
                result: serde_json::json!({"id": "t_9", "status": "open"}),
            })
        );
        let missing = Extract {
            reference: "/ticket/id".into(),
            result: Some("/nope".into()),
        };
        assert!(receipt(&body, &missing).is_err());
    }

    fn lookup_kind(reply: Reply<'_>) -> String {
        match lookup(&extract(), &reply) {
            Lookup::Found(r) => format!("found {}", r.reference),
            Lookup::NotFound => "not_found".into(),
            Lookup::Unavailable(_) => "unavailable".into(),
        }
    }

    #[test]
    #[rustfmt::skip]
    fn lookup_classification_table() {
        let cases: &[(Reply<'_>, &str)] = &[
            (answer(200, r#"{"ticket_id":"t_1"}"#), "found t_1"),
            (answer(200, r#"{"other":1}"#), "unavailable"),
            (answer(200, "nope"), "unavailable"),
            (answer(404, ""), "not_found"),
            (answer(410, ""), "unavailable"),
            (answer(500, ""), "unavailable"),
            (answer(429, ""), "unavailable"),
            (Reply::Failed(Transport::NotConnected("refused".into())), "unavailable"),
            (Reply::Failed(Transport::TimedOut("1s".into())), "unavailable"),
        ];
        for (reply, expect) in cases {
            assert_eq!(lookup_kind(reply.clone()), *expect, "{reply:?}");
        }
    }

    fn job_kind(reply: Reply<'_>) -> String {
        let plan = JobPlan {
            id: "/job_id".into(),
            poll: crate::config::Request {
                method: reqwest::Method::GET,
                url: crate::template::Template::parse("http://h/jobs/{job_id}").unwrap(),
            },
            state: "/status".into(),
            done: vec!["done".into(), "succeeded".into()],
            failed: vec!["failed".into()],
            extract: Extract {
                reference: "/report_id".into(),
                result: None,
            },
            error_message: Some("/error".into()),
        };
        match job(&plan, &reply) {
            JobStatus::Running => "running".into(),
            JobStatus::Done(r) => format!("done {}", r.reference),
            JobStatus::Failed(r) => format!("failed {}", r.message),
            JobStatus::Gone(_) => "gone".into(),
            JobStatus::Unavailable(_) => "unavailable".into(),
        }
    }

    #[test]
    #[rustfmt::skip]
    fn job_classification_table() {
        let cases: &[(Reply<'_>, &str)] = &[
            (answer(200, r#"{"status":"running"}"#), "running"),
            (answer(200, r#"{"status":"queued"}"#), "running"),
            (answer(200, r#"{"status":"done","report_id":"r_1"}"#), "done r_1"),
            (answer(200, r#"{"status":"succeeded","report_id":"r_1"}"#), "done r_1"),
            (answer(200, r#"{"status":"done"}"#), "unavailable"),
            (answer(200, r#"{"status":"failed","error":"no data"}"#), "failed downstream job failed: no data"),
            (answer(200, r#"{"status":"failed"}"#), "failed downstream job ended `failed`"),
            (answer(200, r#"{"state":"done"}"#), "unavailable"),
            (answer(200, "nope"), "unavailable"),
            // The downstream no longer knows the job: it ends, it is not asked for ever.
            (answer(404, ""), "gone"),
            (answer(404, r#"{"status":"done","report_id":"r_1"}"#), "gone"),
            (answer(410, ""), "gone"),
            // Everything else may answer differently later.
            (answer(400, ""), "unavailable"),
            (answer(403, ""), "unavailable"),
            (answer(429, ""), "unavailable"),
            (answer(500, ""), "unavailable"),
            (answer(503, ""), "unavailable"),
            (Reply::Failed(Transport::NotConnected("refused".into())), "unavailable"),
            (Reply::Failed(Transport::Lost("reset".into())), "unavailable"),
        ];
        for (reply, expect) in cases {
            assert_eq!(job_kind(reply.clone()), *expect, "{reply:?}");
        }
    }

    fn auth_kind(reply: Reply<'_>) -> String {
        match authorization(&reply) {
            Authorization::Allowed => "allowed".into(),
            Authorization::Denied(r) => format!("denied {r}"),
            Authorization::Unavailable(_) => "unavailable".into(),
        }
    }

    #[test]
    #[rustfmt::skip]
    fn authorization_classification_table() {
        let cases: &[(Reply<'_>, &str)] = &[
            (answer(200, r#"{"allow":true}"#), "allowed"),
            (answer(204, r#"{"allow":true}"#), "allowed"),
            (answer(200, r#"{"allow":false,"reason":"revoked"}"#), "denied revoked"),
            (answer(200, r#"{"allow":false}"#), "denied denied by the authorization hook"),
            (answer(403, r#"{"reason":"no access"}"#), "denied no access"),
            (answer(403, ""), "denied denied by the authorization hook"),
            (answer(200, r#"{"allow":"yes"}"#), "unavailable"),
            (answer(200, r#"{}"#), "unavailable"),
            (answer(200, "allow"), "unavailable"),
            (answer(401, ""), "unavailable"),
            (answer(500, r#"{"allow":true}"#), "unavailable"),
            (answer(302, ""), "unavailable"),
            (Reply::Failed(Transport::NotConnected("refused".into())), "unavailable"),
            (Reply::Failed(Transport::TimedOut("2s".into())), "unavailable"),
        ];
        for (reply, expect) in cases {
            assert_eq!(auth_kind(reply.clone()), *expect, "{reply:?}");
        }
    }
}
