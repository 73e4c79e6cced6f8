//! Request headers with a grammar: the IETF `Idempotency-Key` (a structured-field string, or
//! a bare key as generic clients send it) and RFC 7240 `Prefer: wait=N`.

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

/// The refusal for a quoted value that is not a structured-field string.
const NOT_A_STRING: &str = "Idempotency-Key starts with `\"` but is not a structured-field string (a quoted value must end with `\"` and escape only `\\\"` and `\\\\`), e.g. \"run_827:create_ticket\"";

/// Reads `Idempotency-Key`: absent ⇒ `Ok(None)`. Present, it names `"<workflow_id>:<step_id>"`,
/// or, without `:`, a one-step operation whose workflow is the value and whose step is `-`.
///
/// The IETF draft makes the header a structured-field string, and a value that starts with
/// `"` is read as exactly that (parameters allowed and ignored). Many clients send the key
/// bare instead — a UUID, a ULID, `idem_…`, digits — and reading those as structured fields
/// would accept or refuse them by their first character (`8e03…` is not an sf-token; `a8e0…`
/// is). A bare value is therefore taken verbatim, whatever its first character, when it is
/// visible ASCII without whitespace or commas: whitespace means it is not one value, and a
/// comma is how an intermediary joins a repeated header. Each part is bounded by
/// `max_part` bytes ([`check_part`]).
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
        .map_err(|_| "Idempotency-Key is not visible ASCII".to_string())?
        .trim_matches([' ', '\t']);
    if text.is_empty() {
        return Err("Idempotency-Key is empty".into());
    }
    // The joined key is bounded to 255 bytes anyway; refuse absurd headers before parsing.
    if text.len() > 2 * max_part + 16 {
        return Err(format!(
            "Idempotency-Key is {} bytes long; parts are at most {max_part} bytes",
            text.len()
        ));
    }
    let value = if text.starts_with('"') {
        let item: sfv::Item = sfv::Parser::new(text)
            .parse()
            .map_err(|_| NOT_A_STRING.to_string())?;
        match item.bare_item {
            sfv::BareItem::String(s) => s.as_str().to_string(),
            _ => return Err(NOT_A_STRING.into()),
        }
    } else {
        bare(text)?.to_string()
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

/// A key sent without quotes, taken as it is written.
fn bare(text: &str) -> Result<&str, String> {
    for c in text.chars() {
        match c {
            ' ' | '\t' => {
                return Err("Idempotency-Key contains whitespace; send one value, or quote it as a structured-field string, e.g. \"run_827:create_ticket\"".into());
            }
            ',' => {
                return Err("Idempotency-Key contains `,`, which joins repeated headers; send one value, or quote it as a structured-field string".into());
            }
            '!'..='~' => {}
            _ => return Err("Idempotency-Key contains a control character".into()),
        }
    }
    Ok(text)
}

/// Bounds one caller-supplied key part: the application's one rule, which every face's call
/// meets again in `App::invoke`; checked here first so the header's problem names the header.
pub use idemgate_app::check_part;

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
    use axum::http::HeaderValue;

    /// The part limit the table is written against.
    const MAX_PART: usize = 40;

    fn check(values: &[&str], expect: Result<Option<(&str, &str)>, &str>) {
        let mut headers = HeaderMap::new();
        for v in values {
            // From bytes, so that tabs and non-ASCII bytes reach the parser as a client sent them.
            headers.append(
                IDEMPOTENCY_KEY,
                HeaderValue::from_bytes(v.as_bytes()).unwrap(),
            );
        }
        let got = idempotency_key(&headers, MAX_PART);
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
    #[rustfmt::skip]
    fn idempotency_keys() {
        check(&[], Ok(None));
        // Structured-field strings, as the draft writes them; parameters are ignored.
        check(&["\"run_827:create\""], Ok(Some(("run_827", "create"))));
        check(&["\"8e03978e-40d5\""], Ok(Some(("8e03978e-40d5", "-"))));
        check(&["\"a:b\";x=1"], Ok(Some(("a", "b"))));
        check(&["\"a\\\"b\""], Ok(Some(("a\"b", "-"))));
        check(&["\"a b\""], Ok(Some(("a b", "-"))));
        // Bare values, verbatim, whatever their first character.
        check(&["abc-123"], Ok(Some(("abc-123", "-"))));
        check(&["42"], Ok(Some(("42", "-"))));
        check(&["1234567890"], Ok(Some(("1234567890", "-"))));
        check(&["8e03978e-40d5-4c1b-9d7e-0a1b2c3d4e5f"], Ok(Some(("8e03978e-40d5-4c1b-9d7e-0a1b2c3d4e5f", "-"))));
        check(&["01ARZ3NDEKTSV4RRFFQ69G5FAV"], Ok(Some(("01ARZ3NDEKTSV4RRFFQ69G5FAV", "-"))));
        check(&["idem_8f3kQ2LmN9xYz"], Ok(Some(("idem_8f3kQ2LmN9xYz", "-"))));
        check(&["KEY-123"], Ok(Some(("KEY-123", "-"))));
        check(&["run_827:create"], Ok(Some(("run_827", "create"))));
        check(&["abc;x=1"], Ok(Some(("abc;x=1", "-"))));
        check(&["?1"], Ok(Some(("?1", "-"))));
        check(&["  abc\t"], Ok(Some(("abc", "-"))));
        // Empty, repeated, malformed, over-long.
        check(&[""], Err("Idempotency-Key is empty"));
        check(&["   "], Err("Idempotency-Key is empty"));
        check(&["\"\""], Err("Idempotency-Key is empty"));
        check(&["\"a:b\"", "\"c:d\""], Err("Idempotency-Key appears more than once"));
        check(&["\"unterminated"], Err("Idempotency-Key starts with `\"` but is not a structured-field string"));
        check(&["\"a\" junk"], Err("Idempotency-Key starts with `\"` but is not a structured-field string"));
        check(&["\"a\\qb\""], Err("Idempotency-Key starts with `\"` but is not a structured-field string"));
        check(&["\"a:b\", \"c:d\""], Err("Idempotency-Key starts with `\"` but is not a structured-field string"));
        check(&["a b"], Err("Idempotency-Key contains whitespace"));
        check(&["a\tb"], Err("Idempotency-Key contains whitespace"));
        check(&["a,b"], Err("Idempotency-Key contains `,`"));
        check(&["cl\u{e9}"], Err("Idempotency-Key is not visible ASCII"));
        check(&["\"a:b:c\""], Err("step_id contains `:`"));
        check(&["a:b:c"], Err("step_id contains `:`"));
        check(&["\":b\""], Err("workflow_id is empty"));
        check(&[":b"], Err("workflow_id is empty"));
        check(&["\"a:\""], Err("step_id is empty"));
        check(&[&format!("{}:b", "a".repeat(41))], Err("workflow_id is 41 bytes long"));
        check(&[&format!("\"{}\"", "a".repeat(100))], Err("Idempotency-Key is 102 bytes long"));
        check(&[&"7".repeat(97)], Err("Idempotency-Key is 97 bytes long"));
    }

    /// SplitMix64: a seeded source of test values, so a failure names its inputs every run.
    fn values(seed: u64) -> impl FnMut() -> u64 {
        let mut state = seed;
        move || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
    }

    fn bytes<const N: usize>(next: &mut impl FnMut() -> u64) -> [u8; N] {
        std::array::from_fn(|_| next() as u8)
    }

    /// A ULID: 48 bits of milliseconds and 80 random bits in Crockford's base 32.
    fn ulid(millis: u64, random: [u8; 10]) -> String {
        const ALPHABET: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
        let mut n = u128::from(millis) << 80;
        for (i, b) in random.iter().enumerate() {
            n |= u128::from(*b) << (8 * (9 - i));
        }
        (0..26)
            .rev()
            .map(|i| ALPHABET[((n >> (5 * i)) & 31) as usize] as char)
            .collect()
    }

    /// The identifiers generic clients mint, generated: each is one step named by itself,
    /// bare or quoted, whatever character it starts with.
    #[test]
    fn generated_client_keys_are_accepted_whatever_they_start_with() {
        let mut next = values(0x1de6_a7e5);
        let now = 1_780_000_000_000; // milliseconds, in 2026
        let mut keys = Vec::new();
        for i in 0..256u64 {
            let v4 = uuid::Builder::from_random_bytes(bytes(&mut next)).into_uuid();
            let v7 =
                uuid::Builder::from_unix_timestamp_millis(now + i, &bytes(&mut next)).into_uuid();
            keys.push(v4.to_string());
            keys.push(v4.simple().to_string().to_uppercase());
            keys.push(v7.to_string());
            keys.push(ulid(now + i, bytes(&mut next)));
            keys.push(format!("idem_{:x}", next()));
            keys.push(format!("KEY-{}", next() % 100_000));
            keys.push((next() % 10u64.pow(12)).to_string());
        }
        let digit_first = keys
            .iter()
            .filter(|k| k.starts_with(|c: char| c.is_ascii_digit()));
        assert!(
            digit_first.count() > keys.len() / 3,
            "the generators cover digit-first keys"
        );
        for key in &keys {
            check(&[key], Ok(Some((key, "-"))));
            check(&[&format!("\"{key}\"")], Ok(Some((key, "-"))));
            check(&[&format!("run_827:{key}")], Ok(Some(("run_827", key))));
        }
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
