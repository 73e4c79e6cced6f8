//! Canonical bytes of a material request (RFC 8785, JSON Canonicalization Scheme).
//!
//! A [`Canonical`] can only be made here, from a tool name, a tool version and the material
//! fields that the contract selected, defaulted and normalised. [`crate::Fingerprint::of`]
//! takes a `&Canonical`, so a fingerprint of raw, uncanonicalised JSON cannot be written.

use serde_json::{Map, Value};

use crate::json;

/// Version of the canonicalisation rules below. Stored beside every fingerprint: a change to
/// the rules (not to a contract) bumps it, and old payloads stay in the test vectors.
pub const CANONICALIZATION_VERSION: u32 = 1;

/// The JCS bytes of `{"fields": {..}, "tool": name, "tool_version": version}`.
#[derive(Clone, PartialEq, Eq)]
pub struct Canonical(Vec<u8>);

/// The material fields of one request, after the contract's defaults and normalisations.
#[derive(Debug, Clone, PartialEq)]
pub struct Material(pub(crate) Map<String, Value>);

impl Material {
    pub fn fields(&self) -> &Map<String, Value> {
        &self.0
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("material field `{field}`: {reason}")]
pub struct Error {
    pub field: String,
    pub reason: String,
}

impl Canonical {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The canonical bytes as text; JCS output is always UTF-8.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("JCS output is UTF-8")
    }
}

impl std::fmt::Debug for Canonical {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Canonical({})", self.as_str())
    }
}

/// Canonicalises the material request of `tool` at `version`.
pub fn canonicalize(tool: &str, version: &str, material: &Material) -> Result<Canonical, Error> {
    let mut out = Vec::with_capacity(128);
    // The envelope's member names are already in RFC 8785 order ("fields" < "tool" <
    // "tool_version"), so it is written directly instead of being built as a map and sorted.
    out.extend_from_slice(b"{\"fields\":{");
    for (i, (field, value)) in sorted(&material.0).into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(&mut out, field);
        out.push(b':');
        write_value(&mut out, value).map_err(|reason| Error {
            field: field.clone(),
            reason,
        })?;
    }
    out.extend_from_slice(b"},\"tool\":");
    write_string(&mut out, tool);
    out.extend_from_slice(b",\"tool_version\":");
    write_string(&mut out, version);
    out.push(b'}');
    Ok(Canonical(out))
}

/// Members in RFC 8785 order: by the UTF-16 code units of their names, which differs from
/// UTF-8 byte order for characters above U+FFFF against U+E000..U+FFFF.
fn sorted(map: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut members: Vec<(&String, &Value)> = map.iter().collect();
    if members.iter().all(|(k, _)| k.is_ascii()) {
        // ASCII names sort the same in bytes and in UTF-16 code units.
        members.sort_unstable_by(|a, b| a.0.cmp(b.0));
    } else {
        members.sort_unstable_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
    }
    members
}

/// RFC 8785 string serialisation: `"` and `\\` escaped, control characters as `\b \t \n \f \r`
/// or `\u00xx` in lowercase hex, everything else (U+007F, U+2028 included) as UTF-8.
fn write_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: Option<&[u8]> = match b {
            b'"' => Some(b"\\\""),
            b'\\' => Some(b"\\\\"),
            0x08 => Some(b"\\b"),
            0x09 => Some(b"\\t"),
            0x0a => Some(b"\\n"),
            0x0c => Some(b"\\f"),
            0x0d => Some(b"\\r"),
            0x00..=0x1f => None,
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        match escape {
            Some(e) => out.extend_from_slice(e),
            None => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

fn write_value(out: &mut Vec<u8>, value: &Value) -> Result<(), String> {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => {
            json::check_numbers(value)?;
            if let Some(u) = n.as_u64() {
                out.extend_from_slice(u.to_string().as_bytes());
            } else if let Some(i) = n.as_i64() {
                out.extend_from_slice(i.to_string().as_bytes());
            } else {
                // Doubles follow ECMAScript's Number-to-string rules; that algorithm is the
                // part of RFC 8785 worth taking from a maintained crate rather than rewriting.
                let text = serde_json_canonicalizer::to_vec(value).map_err(|e| e.to_string())?;
                out.extend_from_slice(&text);
            }
        }
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item)?;
            }
            out.push(b']');
        }
        Value::Object(members) => {
            out.push(b'{');
            for (i, (name, item)) in sorted(members).into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(out, name);
                out.push(b':');
                write_value(out, item)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

/// JCS bytes of any strict value; used for the RFC 8785 vectors and by the fuzz target.
pub fn jcs(value: &Value) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(64);
    write_value(&mut out, value).map_err(|reason| Error {
        field: "*".into(),
        reason,
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expect: &str) {
        // The RFC's vectors include doubles beyond 2^53 (1E30), which requests may not carry;
        // the canonicaliser itself is checked here on a plain parse.
        let value: serde_json::Value = serde_json::from_str(input).unwrap();
        let bytes = serde_json_canonicalizer::to_vec(&value).unwrap();
        assert_eq!(std::str::from_utf8(&bytes).unwrap(), expect, "{input}");
    }

    #[test]
    fn our_writer_agrees_with_the_crate_on_the_vectors() {
        for input in [
            r#"{"b":2,"a":1,"c":{"z":[1,"x",null,true,false],"y":-0}}"#,
            r#"{"s":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/\u007f\u2028"}"#,
            "{\"\u{20ac}\":1,\"\\r\":2,\"\u{fb33}\":3,\"1\":4,\"\u{1f600}\":5,\"\u{0080}\":6}",
            r#"[0.1, -1.5e-7, 123456.789, 9007199254740992, -9007199254740992, 1e-7, 5e-324]"#,
        ] {
            let value: serde_json::Value = serde_json::from_str(input).unwrap();
            assert_eq!(
                String::from_utf8(jcs(&value).unwrap()).unwrap(),
                String::from_utf8(serde_json_canonicalizer::to_vec(&value).unwrap()).unwrap(),
                "{input}"
            );
        }
    }

    // Vectors in the manner of RFC 8785's examples: member ordering by UTF-16 code units,
    // number serialisation as ECMAScript does, string escaping of control characters only.
    #[test]
    fn rfc8785_vectors() {
        check(r#"{"b":2,"a":1}"#, r#"{"a":1,"b":2}"#);
        check(
            r#"{ "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001] }"#,
            r#"{"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27]}"#,
        );
        check(
            r#"{"string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/"}"#,
            r#"{"string":"€$\u000f\nA'B\"\\\\\"/"}"#,
        );
        check(
            r#"{"literals": [null, true, false]}"#,
            r#"{"literals":[null,true,false]}"#,
        );
        // Sorting by UTF-16 code units puts U+1F600 (a surrogate pair) before U+FB33.
        check(
            "{\"\u{20ac}\":\"Euro Sign\",\"\\r\":\"Carriage Return\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\",\"1\":\"One\",\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{0080}\":\"Control\",\"\u{00f6}\":\"Latin Small Letter O With Diaeresis\"}",
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{0080}\":\"Control\",\"\u{00f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}",
        );
        check("-0", "0");
        check("[1.0, 100, 1e2, 0.5e1]", "[1,100,100,5]");
        check("9007199254740992", "9007199254740992");
    }

    #[test]
    fn envelope_names_tool_and_version() {
        let mut m = Map::new();
        m.insert("subject".into(), Value::String("Refund".into()));
        let c = canonicalize("tickets.create", "2026-08-18", &Material(m)).unwrap();
        assert_eq!(
            c.as_str(),
            r#"{"fields":{"subject":"Refund"},"tool":"tickets.create","tool_version":"2026-08-18"}"#
        );
    }

    #[test]
    fn big_integers_in_material_are_refused() {
        let mut m = Map::new();
        m.insert("amount".into(), Value::from(9_007_199_254_740_993u64));
        let err = canonicalize("t", "1", &Material(m)).unwrap_err();
        assert_eq!(err.field, "amount");
    }
}
