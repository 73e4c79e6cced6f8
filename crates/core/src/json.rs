//! Strict JSON reading: the bytes a caller sends become a [`serde_json::Value`] only when they
//! are I-JSON (RFC 7493) that a fingerprint can represent faithfully.
//!
//! RFC 8785 reads every number as an IEEE double, so `9007199254740993` and `9007199254740992`
//! canonicalise to the same bytes; integers beyond ±2^53 are therefore refused here instead of
//! being silently merged into one fingerprint. Duplicate member names are refused because
//! parsers disagree on which one wins, and a fingerprint must describe exactly one request.

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// 2^53: past it a double cannot tell consecutive integers apart.
pub const MAX_SAFE_INTEGER: u64 = 1 << 53;

/// Deepest nesting of arrays and objects accepted by [`parse`] unless a caller says otherwise.
pub const DEFAULT_MAX_DEPTH: usize = 32;

/// A request body that is not strict JSON. The message names what is wrong and where, never
/// the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub message: String,
}

/// Parses `bytes` as strict JSON with the default depth bound.
pub fn parse(bytes: &[u8]) -> Result<Value, Error> {
    parse_with_depth(bytes, DEFAULT_MAX_DEPTH)
}

/// Parses `bytes` as strict JSON: UTF-8, no duplicate member names, every number exactly
/// representable as a double, nesting at most `max_depth` deep.
pub fn parse_with_depth(bytes: &[u8], max_depth: usize) -> Result<Value, Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Strict {
        depth: 0,
        max_depth,
    }
    .deserialize(&mut de)
    .map_err(|e| Error {
        message: describe(&e),
    })?;
    de.end().map_err(|e| Error {
        message: describe(&e),
    })?;
    Ok(value)
}

fn describe(e: &serde_json::Error) -> String {
    // serde_json's messages for syntax errors may quote a fragment of the input; ours never do.
    // Keep the classification and the position only.
    let what = match e.classify() {
        serde_json::error::Category::Io => "could not be read".to_string(),
        serde_json::error::Category::Syntax => "is not valid JSON".to_string(),
        serde_json::error::Category::Eof => "ends before the JSON value is complete".to_string(),
        serde_json::error::Category::Data => {
            // Our own refusals (duplicates, numbers, depth) are data errors; their text is ours.
            let text = e.to_string();
            match text.rfind(" at line ") {
                Some(cut) => text[..cut].to_string(),
                None => text,
            }
        }
    };
    format!(
        "request body {what} (line {}, column {})",
        e.line(),
        e.column()
    )
}

/// Checks a value built elsewhere (a contract default, say) against the same number rule.
pub fn check_numbers(value: &Value) -> Result<(), String> {
    match value {
        Value::Number(n) => check_number(n),
        Value::Array(items) => items.iter().try_for_each(check_numbers),
        Value::Object(members) => members.values().try_for_each(check_numbers),
        Value::Null | Value::Bool(_) | Value::String(_) => Ok(()),
    }
}

fn check_number(n: &Number) -> Result<(), String> {
    if let Some(u) = n.as_u64() {
        return check_u64(u);
    }
    if let Some(i) = n.as_i64() {
        return check_i64(i);
    }
    match n.as_f64() {
        Some(f) => check_f64(f),
        None => Err("a number is not representable as a double".to_string()),
    }
}

fn check_u64(u: u64) -> Result<(), String> {
    if u > MAX_SAFE_INTEGER {
        Err(beyond())
    } else {
        Ok(())
    }
}

fn check_i64(i: i64) -> Result<(), String> {
    if i.unsigned_abs() > MAX_SAFE_INTEGER {
        Err(beyond())
    } else {
        Ok(())
    }
}

fn check_f64(f: f64) -> Result<(), String> {
    if !f.is_finite() {
        return Err("a number is not finite".to_string());
    }
    // Every double of magnitude 2^53 or more is a whole number, and past 2^53 neighbouring
    // integers share a double: `18446744073709551617`, `1e20` and `100000000000000000000` all
    // arrive here and cannot be told from their neighbours. Refusing the magnitude, whatever
    // the literal's spelling, also keeps canonical output (JCS writes 1e20 as 21 digits)
    // readable by this same parser.
    if f.abs() > MAX_SAFE_INTEGER as f64 {
        return Err(beyond());
    }
    Ok(())
}

fn beyond() -> String {
    "a number is an integer beyond ±2^53, which JSON canonicalisation cannot keep distinct; send it as a string".to_string()
}

struct Strict {
    depth: usize,
    max_depth: usize,
}

impl Strict {
    fn nested<E: de::Error>(&self) -> Result<Strict, E> {
        if self.depth >= self.max_depth {
            return Err(E::custom(format!(
                "nesting is deeper than {} levels",
                self.max_depth
            )));
        }
        Ok(Strict {
            depth: self.depth + 1,
            max_depth: self.max_depth,
        })
    }
}

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        check_u64(v).map_err(E::custom)?;
        Ok(Value::from(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        check_i64(v).map_err(E::custom)?;
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        check_f64(v).map_err(E::custom)?;
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number is not finite"))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = self.nested::<A::Error>()?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Strict { ..inner })? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let inner = self.nested::<A::Error>()?;
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            if members.contains_key(&name) {
                let shown: String = name.chars().take(64).collect();
                return Err(de::Error::custom(format!(
                    "member name `{shown}` appears twice in one object"
                )));
            }
            let value = map.next_value_seed(Strict { ..inner })?;
            members.insert(name, value);
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expect: Result<&str, &str>) {
        match (parse(input.as_bytes()), expect) {
            (Ok(v), Ok(json)) => assert_eq!(v, serde_json::from_str::<Value>(json).unwrap()),
            (Err(e), Err(prefix)) => assert!(
                e.message.starts_with(prefix),
                "{input}: `{}` does not start with `{prefix}`",
                e.message
            ),
            (got, expect) => panic!("{input}: got {got:?}, expected {expect:?}"),
        }
    }

    #[test]
    fn strict_json() {
        check(
            r#"{"a":1,"b":[true,null,"x"]}"#,
            Ok(r#"{"a":1,"b":[true,null,"x"]}"#),
        );
        check("9007199254740992", Ok("9007199254740992"));
        check("-9007199254740992", Ok("-9007199254740992"));
        check(
            "9007199254740993",
            Err("request body a number is an integer beyond ±2^53"),
        );
        check(
            "-9007199254740993",
            Err("request body a number is an integer beyond ±2^53"),
        );
        check(
            "18446744073709551617",
            Err("request body a number is an integer beyond ±2^53"),
        );
        check(
            "1e20",
            Err("request body a number is an integer beyond ±2^53"),
        );
        check(
            "1.5e300",
            Err("request body a number is an integer beyond ±2^53"),
        );
        check("9007199254740992.0", Ok("9007199254740992.0"));
        check("-1.5e-300", Ok("-1.5e-300"));
        check(
            r#"{"s":"123456789012345678901234","n":[1,2]}"#,
            Ok(r#"{"s":"123456789012345678901234","n":[1,2]}"#),
        );
        check(
            r#"{"s":"a\"99999999999999999","n":1}"#,
            Ok(r#"{"s":"a\"99999999999999999","n":1}"#),
        );
        check(
            "[1,\n 99999999999999999]",
            Err(
                "request body a number is an integer beyond ±2^53, which JSON canonicalisation cannot keep distinct; send it as a string (line 2",
            ),
        );
        check("0.1", Ok("0.1"));
        check("1e400", Err("request body is not valid JSON"));
        check(
            r#"{"a":1,"a":2}"#,
            Err("request body member name `a` appears twice in one object"),
        );
        check(
            r#"{"a":{"b":1,"b":1}}"#,
            Err("request body member name `b` appears twice"),
        );
        check(r#"{"a":1} x"#, Err("request body is not valid JSON"));
        check(
            r#"{"a":"#,
            Err("request body ends before the JSON value is complete"),
        );
        check(r#""\ud800""#, Err("request body is not valid JSON"));
    }

    #[test]
    fn depth_is_bounded() {
        let deep = "[".repeat(DEFAULT_MAX_DEPTH) + &"]".repeat(DEFAULT_MAX_DEPTH);
        assert!(parse(deep.as_bytes()).is_ok());
        let deeper = "[".repeat(DEFAULT_MAX_DEPTH + 1) + &"]".repeat(DEFAULT_MAX_DEPTH + 1);
        let err = parse(deeper.as_bytes()).unwrap_err();
        assert!(
            err.message.contains("nesting is deeper than 32 levels"),
            "{err}"
        );
    }

    #[test]
    fn invalid_utf8_is_refused() {
        assert!(parse(b"\"\xff\"").is_err());
    }
}
