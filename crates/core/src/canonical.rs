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
    for (field, value) in &material.0 {
        json::check_numbers(value).map_err(|reason| Error {
            field: field.clone(),
            reason,
        })?;
    }
    let mut envelope = Map::new();
    envelope.insert("fields".into(), Value::Object(material.0.clone()));
    envelope.insert("tool".into(), Value::String(tool.into()));
    envelope.insert("tool_version".into(), Value::String(version.into()));
    let bytes = serde_json_canonicalizer::to_vec(&Value::Object(envelope)).map_err(|e| Error {
        field: "*".into(),
        reason: e.to_string(),
    })?;
    Ok(Canonical(bytes))
}

/// JCS bytes of any strict value; used for the RFC 8785 vectors and by the fuzz target.
pub fn jcs(value: &Value) -> Result<Vec<u8>, Error> {
    json::check_numbers(value).map_err(|reason| Error {
        field: "*".into(),
        reason,
    })?;
    serde_json_canonicalizer::to_vec(value).map_err(|e| Error {
        field: "*".into(),
        reason: e.to_string(),
    })
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
