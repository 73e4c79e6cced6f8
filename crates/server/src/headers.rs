//! Request headers with a grammar: the IETF `Idempotency-Key` (a structured-field string) and
//! RFC 7240 `Prefer: wait=N`.

use axum::http::{HeaderMap, HeaderName};

pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
pub const PREFER: HeaderName = HeaderName::from_static("prefer");

/// The workflow step an `Idempotency-Key` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepKey {
    pub workflow_id: String,
    pub step_id: String,
}

/// The step a value without `:` names: a one-step operation.
pub const SINGLE_STEP: &str = "-";

/// Reads `Idempotency-Key`: absent ⇒ `Ok(None)`; present, it must be exactly one
/// structured-field item that is a string (or a token), non-empty, at most `max_part` bytes per
/// part; `"<workflow_id>:<step_id>"`, or a bare value meaning workflow = value, step = `-`.
pub fn idempotency_key(headers: &HeaderMap, max_part: usize) -> Result<Option<StepKey>, String> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err("Idempotency-Key appears more than once".into());
    }
    let text = value
        .to_str()
        .map_err(|_| "Idempotency-Key is not visible ASCII".to_string())?;
    if text.trim().is_empty() {
        return Err("Idempotency-Key is empty".into());
    }
    // The joined key is bounded to 255 bytes anyway; refuse absurd headers before parsing.
    if text.len() > 2 * max_part + 16 {
        return Err(format!(
            "Idempotency-Key is {} bytes long; parts are at most {max_part} bytes",
            text.len()
        ));
    }
    let item: sfv::Item = sfv::Parser::new(text).parse().map_err(|_| {
        "Idempotency-Key must be a structured-field string, e.g. \"run_827:create_ticket\""
            .to_string()
    })?;
    let value = match &item.bare_item {
        sfv::BareItem::String(s) => s.as_str().to_string(),
        sfv::BareItem::Token(t) => t.as_str().to_string(),
        _ => {
            return Err(
                "Idempotency-Key must be a structured-field string, e.g. \"run_827:create_ticket\""
                    .into(),
            );
        }
    };
    if value.is_empty() {
        return Err("Idempotency-Key is empty".into());
    }
    let (workflow_id, step_id) = match value.split_once(':') {
        Some((w, s)) => (w.to_string(), s.to_string()),
        None => (value, SINGLE_STEP.to_string()),
    };
    check_part("workflow_id", &workflow_id, max_part)?;
    check_part("step_id", &step_id, max_part)?;
    Ok(Some(StepKey {
        workflow_id,
        step_id,
    }))
}

/// Bounds one caller-supplied key part. Its characters are checked by `OperationKey`.
pub fn check_part(part: &str, value: &str, max: usize) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("{part} is empty"));
    }
    if value.len() > max {
        return Err(format!(
            "{part} is {} bytes long; at most {max} are allowed",
            value.len()
        ));
    }
    if value.contains(':') {
        return Err(format!(
            "{part} contains `:`, which separates the parts of an operation key"
        ));
    }
    Ok(())
}

/// The `wait` preference in seconds, capped at `max`; `None` when not asked for. Unknown
/// preferences and malformed values are ignored, as RFC 7240 asks.
pub fn prefer_wait(headers: &HeaderMap, max: u64) -> Option<u64> {
    headers
        .get_all(PREFER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|pref| {
            let pref = pref.split(';').next()?.trim();
            let (name, value) = pref.split_once('=')?;
            if !name.trim().eq_ignore_ascii_case("wait") {
                return None;
            }
            value.trim().trim_matches('"').parse::<u64>().ok()
        })
        .next()
        .map(|n| n.min(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(values: &[&str], expect: Result<Option<(&str, &str)>, &str>) {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(IDEMPOTENCY_KEY, v.parse().unwrap());
        }
        let got = idempotency_key(&headers, 16);
        let got = got.map(|o| o.map(|k| (k.workflow_id, k.step_id)));
        let expect = expect
            .map(|o| o.map(|(w, s)| (w.to_string(), s.to_string())))
            .map_err(str::to_string);
        match (&got, &expect) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{values:?}"),
            (Err(a), Err(b)) => assert!(a.starts_with(b.as_str()), "{values:?}: `{a}` vs `{b}`"),
            _ => panic!("{values:?}: got {got:?}, expected {expect:?}"),
        }
    }

    #[test]
    fn idempotency_keys() {
        check(&[], Ok(None));
        check(&["\"run_827:create\""], Ok(Some(("run_827", "create"))));
        check(&["\"8e03978e-40d5\""], Ok(Some(("8e03978e-40d5", "-"))));
        check(&["abc-123"], Ok(Some(("abc-123", "-"))));
        check(&["\"a:b\";x=1"], Ok(Some(("a", "b"))));
        check(&[""], Err("Idempotency-Key is empty"));
        check(&["\"\""], Err("Idempotency-Key is empty"));
        check(
            &["\"a:b\"", "\"c:d\""],
            Err("Idempotency-Key appears more than once"),
        );
        check(
            &["\"unterminated"],
            Err("Idempotency-Key must be a structured-field string"),
        );
        check(
            &["42"],
            Err("Idempotency-Key must be a structured-field string"),
        );
        check(&["\"a:b:c\""], Err("step_id contains `:`"));
        check(&["\":b\""], Err("workflow_id is empty"));
        check(&["\"a:\""], Err("step_id is empty"));
        check(
            &["\"aaaaaaaaaaaaaaaaa:b\""],
            Err("workflow_id is 17 bytes long"),
        );
        check(
            &[&format!("\"{}\"", "a".repeat(100))],
            Err("Idempotency-Key is 102 bytes long"),
        );
    }

    #[test]
    fn prefer() {
        let mut h = HeaderMap::new();
        assert_eq!(prefer_wait(&h, 30), None);
        h.insert(PREFER, "respond-async, wait=5".parse().unwrap());
        assert_eq!(prefer_wait(&h, 30), Some(5));
        h.insert(PREFER, "wait=500".parse().unwrap());
        assert_eq!(prefer_wait(&h, 30), Some(30));
        h.insert(PREFER, "wait=soon".parse().unwrap());
        assert_eq!(prefer_wait(&h, 30), None);
    }
}
