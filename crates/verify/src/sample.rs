//! The arguments a verification sends when the user gives none, made from the contract's input
//! schema, and the copy with one material field changed that the mismatch probes send.
//!
//! A value is made for every required property and every material field: the schema's
//! `default`, `const` or first `enum` value where it has one, else a value of its type within
//! its bounds — a string that names the run (so a person looking at the staging system can
//! tell what verify made), a number at its minimum, `false`, an empty array or object. A schema
//! this cannot satisfy (a `pattern`, say) is an error that asks for `--args`.

use idemgate_core::contract::Contract;
use serde_json::{Map, Value, json};

/// Arguments for `contract` that fit its input schema, or why none could be made.
pub fn arguments(contract: &Contract, run: &str) -> Result<Value, String> {
    let schema = &contract.input_schema;
    let mut wanted: Vec<String> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    for field in material_fields(contract) {
        if !wanted.contains(&field) {
            wanted.push(field);
        }
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    let mut out = Map::new();
    for name in wanted {
        let property = properties
            .and_then(|p| p.get(&name))
            .cloned()
            .unwrap_or(Value::Bool(true));
        let value = value_for(&property, run).map_err(|why| {
            format!("no value could be made for `{name}` ({why}): give the arguments with --args")
        })?;
        out.insert(name, value);
    }
    let arguments = Value::Object(out);
    contract.validate(&arguments).map_err(|e| {
        format!(
            "the arguments made from the input schema do not fit it ({}): give them with --args",
            e.message
        )
    })?;
    Ok(arguments)
}

/// The material fields the contract names (every property for `*`).
pub(crate) fn material_fields(contract: &Contract) -> Vec<String> {
    let fields = &contract.file.request_fingerprint.fields;
    if fields.iter().any(|f| f == "*") {
        return contract
            .input_schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
    }
    fields.clone()
}

fn value_for(schema: &Value, run: &str) -> Result<Value, String> {
    if let Some(value) = schema.get("default").or_else(|| schema.get("const")) {
        return Ok(value.clone());
    }
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return Ok(first.clone());
    }
    let kind = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        // The first type a list allows, `null` last.
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        _ => "string",
    };
    match kind {
        "string" => string_for(schema, run),
        "integer" | "number" => {
            let min = bound(schema, "minimum", "exclusiveMinimum", 1.0);
            let max = bound(schema, "maximum", "exclusiveMaximum", -1.0);
            let n = match (min, max) {
                (Some(lo), Some(hi)) if lo > hi => return Err("its bounds leave no number".into()),
                (Some(lo), _) => lo,
                (None, Some(hi)) if hi < 1.0 => hi,
                (None, _) => 1.0,
            };
            Ok(if kind == "integer" {
                json!(n.ceil() as i64)
            } else {
                json!(n)
            })
        }
        "boolean" => Ok(json!(false)),
        "array" => match schema.get("minItems").and_then(Value::as_u64) {
            None | Some(0) => Ok(json!([])),
            Some(_) => Err("it needs items".into()),
        },
        "object" => {
            let mut out = Map::new();
            let required = schema.get("required").and_then(Value::as_array);
            for name in required.into_iter().flatten().filter_map(Value::as_str) {
                let property = schema
                    .get("properties")
                    .and_then(|p| p.get(name))
                    .cloned()
                    .unwrap_or(Value::Bool(true));
                out.insert(name.to_string(), value_for(&property, run)?);
            }
            Ok(Value::Object(out))
        }
        "null" => Ok(Value::Null),
        other => Err(format!("type `{other}`")),
    }
}

/// `minimum` (or an exclusive one, moved by `step`) as a number.
fn bound(schema: &Value, inclusive: &str, exclusive: &str, step: f64) -> Option<f64> {
    schema.get(inclusive).and_then(Value::as_f64).or_else(|| {
        schema
            .get(exclusive)
            .and_then(Value::as_f64)
            .map(|b| b + step)
    })
}

fn string_for(schema: &Value, run: &str) -> Result<Value, String> {
    if schema.get("pattern").is_some() {
        return Err("a pattern".into());
    }
    let text = match schema.get("format").and_then(Value::as_str) {
        Some("date") => "2026-01-01".to_string(),
        Some("date-time") => "2026-01-01T00:00:00Z".to_string(),
        Some("email") => "verify@example.invalid".to_string(),
        Some("uri" | "url") => format!("https://example.invalid/idemgate-verify/{run}"),
        Some("uuid") => "00000000-0000-4000-8000-000000000000".to_string(),
        _ => format!("idemgate verify {run}"),
    };
    let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
    let max = schema
        .get("maxLength")
        .and_then(Value::as_u64)
        .map(|m| m as usize);
    let mut text: String = match max {
        Some(max) => text.chars().take(max).collect(),
        None => text,
    };
    while text.chars().count() < min {
        text.push('x');
    }
    Ok(Value::String(text))
}

/// A copy of `arguments` with one material field changed so that the fingerprint differs:
/// the field's name and the copy, or `None` when no field can change within the schema.
pub fn changed(contract: &Contract, arguments: &Value) -> Option<(String, Value)> {
    let properties = contract
        .input_schema
        .get("properties")
        .and_then(Value::as_object);
    let before = contract.fingerprint(arguments).ok()?;
    for field in material_fields(contract) {
        let schema = properties
            .and_then(|p| p.get(&field))
            .cloned()
            .unwrap_or(Value::Bool(true));
        let current = arguments.get(&field).cloned().unwrap_or(Value::Null);
        for candidate in alternatives(&schema, &current) {
            let mut copy = arguments.clone();
            copy.as_object_mut()?.insert(field.clone(), candidate);
            let differs = contract
                .fingerprint(&copy)
                .is_ok_and(|after| after != before);
            if differs && contract.validate(&copy).is_ok() {
                return Some((field, copy));
            }
        }
    }
    None
}

/// Values to try in place of `current`.
fn alternatives(schema: &Value, current: &Value) -> Vec<Value> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values.iter().filter(|v| *v != current).cloned().collect();
    }
    match current {
        Value::String(s) => {
            let mut shorter: String = s
                .chars()
                .take(s.chars().count().saturating_sub(1))
                .collect();
            shorter.push(if s.ends_with('y') { 'z' } else { 'y' });
            vec![json!(format!("{s} (changed)")), json!(shorter)]
        }
        Value::Number(n) => match n.as_i64() {
            Some(i) => vec![json!(i + 1), json!(i - 1)],
            None => {
                let f = n.as_f64().unwrap_or(0.0);
                vec![json!(f + 1.0), json!(f - 1.0)]
            }
        },
        Value::Bool(b) => vec![json!(!b)],
        Value::Null => vec![json!("idemgate verify (changed)"), json!(1), json!(true)],
        Value::Array(_) | Value::Object(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contract(schema: &str, fields: &str) -> Contract {
        let yaml = format!(
            "name: t.x\nversion: \"1\"\neffect_class: key_based\ninput_schema: {schema}\nrequest_fingerprint:\n  fields: {fields}\nretention:\n  record_ttl: 1d\n  tombstone_ttl: 1d\n  max_retry_window: 1d\n"
        );
        Contract::load(&yaml, "t.yaml").unwrap()
    }

    #[test]
    fn arguments_fit_the_schema_and_name_the_run() {
        let c = contract(
            r#"{type: object, properties: {subject: {type: string, minLength: 1, maxLength: 200}, queue: {type: string, enum: [support, legal]}, n: {type: integer, minimum: 3, maximum: 9}, on: {type: boolean}, d: {type: string, format: date}, note: {type: string}}, required: [subject, n, on, d], additionalProperties: false}"#,
            "[subject, queue]",
        );
        let args = arguments(&c, "r1").unwrap();
        assert_eq!(
            args,
            json!({"subject": "idemgate verify r1", "n": 3, "on": false, "d": "2026-01-01", "queue": "support"})
        );
        let (field, copy) = changed(&c, &args).unwrap();
        assert_eq!(field, "subject");
        assert_eq!(copy["subject"], "idemgate verify r1 (changed)");
        assert_ne!(c.fingerprint(&copy).unwrap(), c.fingerprint(&args).unwrap());
    }

    #[test]
    fn a_pattern_asks_for_the_arguments() {
        let c = contract(
            r#"{type: object, properties: {sku: {type: string, pattern: "^[A-Z]{3}$"}}, required: [sku]}"#,
            "[sku]",
        );
        let e = arguments(&c, "r1").unwrap_err();
        assert!(e.contains("`sku`") && e.contains("--args"), "{e}");
    }

    #[test]
    fn a_change_stays_within_the_schema() {
        let c = contract(
            r#"{type: object, properties: {s: {type: string, maxLength: 3}, k: {type: string, enum: [a]}}, required: [s, k]}"#,
            "[k, s]",
        );
        let args = json!({"s": "abc", "k": "a"});
        let (field, copy) = changed(&c, &args).unwrap();
        assert_eq!((field.as_str(), &copy["s"]), ("s", &json!("aby")));
        let fixed = contract(
            r#"{type: object, properties: {k: {type: string, enum: [a]}}}"#,
            "[k]",
        );
        assert_eq!(changed(&fixed, &json!({"k": "a"})), None);
    }
}
