//! The contract a child's tool runs under when no contract file names it, from the tool's
//! own listing.
//!
//! - `annotations.readOnlyHint: true`, or the tool named in wrap's `--reads` ⇒ `read`: no
//!   claim, no record, passed straight through.
//! - an input schema with an idempotency-key argument ([`key_argument`]: `idempotency_key`,
//!   `idempotencyKey`, `Idempotency-Key`, … in any case) ⇒ `key_based`, **deduplicating**: the
//!   argument is hidden from the model's schema and filled with the operation key on every
//!   call, so the child deduplicates on it and a lost answer is resent under the same key
//!   instead of ending `unknown`.
//! - otherwise ⇒ `key_based`: key, fingerprint over **all** arguments, durable claim, and the
//!   dispatch marker (the child neither deduplicates on the key nor offers a receipt lookup,
//!   so a lost answer ends `unknown`, never a resend).
//! - `annotations.destructiveHint: true` (written out) ⇒ `irreversible`: the same, and every
//!   operation waits for an operator's approval. The MCP specification reads a missing
//!   `destructiveHint` as `true`; here only a written `true` asks for approval, because most
//!   servers write no annotations at all and approval of every call would make them unusable.
//!   The warning printed for every defaulted tool says so.
//!
//! The input schema is the child's `inputSchema`, so idemgate validates arguments before any
//! record. The version is fixed (`wrap-1`): a child upgraded under the same tool name keeps
//! its operations' fingerprints.

use std::sync::Arc;

use idemgate_core::contract::{
    Contract, ContractFile, DownstreamSpec, EffectClass, FingerprintSpec, LoadError,
    OperationKeySpec, OwnerSpec, RetentionSpec, SecuritySpec,
};
use idemgate_core::duration::Span;
use serde_json::{Map, Value, json};

/// The version of every defaulted contract.
pub const DEFAULT_VERSION: &str = "wrap-1";

/// The hints of a listed tool that choose its class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Annotations {
    pub read_only: Option<bool>,
    pub destructive: Option<bool>,
}

impl Annotations {
    pub fn of(tool: &Map<String, Value>) -> Annotations {
        let hint = |name: &str| {
            tool.get("annotations")
                .and_then(|a| a.get(name))
                .and_then(Value::as_bool)
        };
        Annotations {
            read_only: hint("readOnlyHint"),
            destructive: hint("destructiveHint"),
        }
    }

    pub fn effect_class(self) -> EffectClass {
        if self.read_only == Some(true) {
            EffectClass::Read
        } else if self.destructive == Some(true) {
            EffectClass::Irreversible
        } else {
            EffectClass::KeyBased
        }
    }
}

/// The property of the tool's input schema that takes an idempotency key, if it has one:
/// a name that reads `idempotencykey` once `_` and `-` are dropped and the case is ignored
/// (`idempotency_key`, `idempotencyKey`, `Idempotency-Key`, `IDEMPOTENCY_KEY`…).
pub fn key_argument(tool: &Map<String, Value>) -> Option<String> {
    let properties = tool
        .get("inputSchema")
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)?;
    properties
        .keys()
        .find(|name| {
            let plain: String = name
                .chars()
                .filter(|c| !matches!(c, '_' | '-'))
                .flat_map(char::to_lowercase)
                .collect();
            plain == "idempotencykey"
        })
        .cloned()
}

/// `schema` without the property `argument`: not listed, not required.
pub fn without_argument(schema: &Value, argument: &str) -> Value {
    let mut schema = schema.clone();
    if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        properties.remove(argument);
    }
    if let Some(required) = schema.get_mut("required").and_then(Value::as_array_mut) {
        required.retain(|r| r.as_str() != Some(argument));
    }
    schema
}

/// The tool's name as it was listed.
pub fn tool_name(tool: &Map<String, Value>) -> Option<&str> {
    tool.get("name").and_then(Value::as_str)
}

/// The default contract of one listed tool. `lease_seconds` should outlast the call timeout's
/// renewals comfortably; the executor renews it while the call runs. `read`: the operator
/// marked the tool a read (wrap's `--reads`), whatever its annotations say.
pub fn default_contract(
    tool: &Map<String, Value>,
    lease_seconds: u64,
    read: bool,
) -> Result<Arc<Contract>, LoadError> {
    let name = tool_name(tool).unwrap_or_default().to_string();
    let class = if read {
        EffectClass::Read
    } else {
        Annotations::of(tool).effect_class()
    };
    let mut schema = match tool.get("inputSchema") {
        Some(Value::Object(s)) => Value::Object(s.clone()),
        _ => json!({"type": "object"}),
    };
    let keyed = class != EffectClass::Read;
    // The model never sees or sends the key argument: the downstream fills it.
    let filled = key_argument(tool).filter(|_| keyed);
    if let Some(argument) = &filled {
        schema = without_argument(&schema, argument);
    }
    let description = tool
        .get("description")
        .and_then(Value::as_str)
        .map(str::to_string);
    let file = ContractFile {
        name: name.clone(),
        version: Some(DEFAULT_VERSION.into()),
        purpose: description,
        use_when: Vec::new(),
        do_not_use_when: Vec::new(),
        effect_class: class,
        operation_key: if keyed {
            OperationKeySpec {
                supplied_by: Some("application".into()),
                scope: ["tenant", "environment", "workflow_id", "step_id"]
                    .map(String::from)
                    .to_vec(),
                reused_for_retry: Some(true),
            }
        } else {
            OperationKeySpec::default()
        },
        input_schema: Some(schema),
        request_fingerprint: FingerprintSpec {
            fields: if keyed { vec!["*".into()] } else { Vec::new() },
            ..FingerprintSpec::default()
        },
        downstream: DownstreamSpec {
            deduplicates_by_key: filled.is_some(),
            receipt_lookup: false,
            async_jobs: false,
            receipt: Some("the child's tool result, stored whole".into()),
            ..DownstreamSpec::default()
        },
        // The approval rule follows the class (irreversible ⇒ always); the recheck asks the
        // authorizer wrap runs with, which allows every call of its one local user.
        security: SecuritySpec::default(),
        retention: Some(RetentionSpec {
            record_ttl: Span(86_400),
            tombstone_ttl: Span(7 * 86_400),
            late_arrival: Default::default(),
            max_retry_window: Span(86_400),
        }),
        lease_seconds: Some(lease_seconds.max(3)),
        duplicate_intent_window: None,
        // The server's rule (wrap's `--identity`, session_window by default).
        identity: None,
        owner: OwnerSpec::default(),
    };
    let text = format!("(defaults for tool `{name}`)");
    Contract::from_file(file, "", &text).map(Arc::new)
}

/// How a tool under defaults is treated, and why, in one clause (for `wrap --list` and the
/// warning on stderr). `read`: the operator marked it a read.
pub fn treatment(tool: &Map<String, Value>, contract: &Contract, read: bool) -> String {
    let annotations = Annotations::of(tool);
    match contract.effect_class {
        EffectClass::Read if read => "read (--reads): passed straight through, no record".into(),
        EffectClass::Read => "read (readOnlyHint): passed straight through, no record".into(),
        class => {
            let why = if class == EffectClass::Irreversible {
                "destructiveHint: each operation waits for an operator's approval"
            } else if annotations.read_only == Some(false) {
                "readOnlyHint: false"
            } else {
                "no readOnlyHint: a repeat within the window replays, even of a read; mark reads with --reads"
            };
            match key_argument(tool) {
                Some(argument) if contract.deduplicates() => format!(
                    "{} and deduplicating: `{argument}` is filled with the operation key and hidden from the model, a lost answer is resent under the same key ({why})",
                    class.as_str()
                ),
                _ => format!(
                    "{}: one effect per operation, a lost answer ends unknown ({why})",
                    class.as_str()
                ),
            }
        }
    }
}

/// The one line printed on stderr for a tool that runs under defaults.
pub fn warning(child: &str, tool: &Map<String, Value>, contract: &Contract, read: bool) -> String {
    let name = tool_name(tool).unwrap_or_default();
    format!(
        "idemgate wrap: warning: tool `{name}` of `{child}` has no contract; using defaults: {}",
        treatment(tool, contract, read)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(annotations: Value) -> Map<String, Value> {
        json!({
            "name": "tickets_create",
            "description": "Opens a ticket.",
            "inputSchema": {"type": "object", "properties": {"subject": {"type": "string"}}},
            "annotations": annotations,
        })
        .as_object()
        .cloned()
        .unwrap()
    }

    #[test]
    fn the_class_follows_the_written_hints() {
        for (hints, class) in [
            (json!({}), EffectClass::KeyBased),
            (json!({"readOnlyHint": true}), EffectClass::Read),
            (
                json!({"readOnlyHint": true, "destructiveHint": true}),
                EffectClass::Read,
            ),
            (json!({"destructiveHint": true}), EffectClass::Irreversible),
            (json!({"destructiveHint": false}), EffectClass::KeyBased),
            (json!({"readOnlyHint": false}), EffectClass::KeyBased),
        ] {
            let contract = default_contract(&tool(hints.clone()), 30, false).unwrap();
            assert_eq!(contract.effect_class, class, "{hints}");
        }
    }

    #[test]
    fn a_keyed_default_fingerprints_every_argument_and_marks_dispatch() {
        let contract = default_contract(&tool(json!({})), 30, false).unwrap();
        assert!(contract.requires_key());
        assert!(contract.uses_dispatch_marker());
        assert!(!contract.receipt_lookup());
        let a = contract
            .fingerprint(&json!({"subject": "a", "extra": 1}))
            .unwrap();
        let b = contract
            .fingerprint(&json!({"subject": "a", "extra": 2}))
            .unwrap();
        assert_ne!(
            a, b,
            "an argument outside the schema's properties is material too"
        );
        assert!(contract.validate(&json!({"subject": 7})).is_err());
    }

    #[test]
    fn a_destructive_default_needs_approval() {
        let contract =
            default_contract(&tool(json!({"destructiveHint": true})), 30, false).unwrap();
        assert!(contract.needs_approval(&json!({"subject": "x"})));
    }

    #[test]
    fn an_idempotency_key_argument_is_found_in_any_spelling() {
        for name in [
            "idempotency_key",
            "idempotencyKey",
            "Idempotency-Key",
            "idempotency-key",
            "IDEMPOTENCY_KEY",
            "IdempotencyKey",
        ] {
            let t = json!({"name": "pay", "inputSchema": {"type": "object",
                "properties": {"amount": {"type": "integer"}, name: {"type": "string"}}}});
            assert_eq!(
                key_argument(t.as_object().unwrap()).as_deref(),
                Some(name),
                "{name}"
            );
        }
        for name in ["idempotency", "key", "idempotency_key_2", "request_id"] {
            let t = json!({"name": "pay", "inputSchema": {"type": "object",
                "properties": {name: {"type": "string"}}}});
            assert_eq!(key_argument(t.as_object().unwrap()), None, "{name}");
        }
    }

    #[test]
    fn a_key_argument_makes_a_deduplicating_contract_without_it_in_the_schema() {
        let t = json!({
            "name": "pay",
            "inputSchema": {"type": "object", "additionalProperties": false,
                "properties": {"amount": {"type": "integer"}, "idempotencyKey": {"type": "string"}},
                "required": ["amount", "idempotencyKey"]},
        });
        let t = t.as_object().unwrap();
        let contract = default_contract(t, 30, false).unwrap();
        assert_eq!(contract.effect_class, EffectClass::KeyBased);
        assert!(contract.deduplicates());
        assert!(!contract.uses_dispatch_marker());
        // The model's call carries no key; one that sends it anyway is refused by the schema.
        assert!(contract.validate(&json!({"amount": 5})).is_ok());
        assert!(
            contract
                .validate(&json!({"amount": 5, "idempotencyKey": "mine"}))
                .is_err()
        );
        assert!(treatment(t, &contract, false).contains("`idempotencyKey` is filled"));
        // Marked a read: passed through, the argument left to the model.
        let read = default_contract(t, 30, true).unwrap();
        assert_eq!(read.effect_class, EffectClass::Read);
        assert!(!read.deduplicates());
    }

    #[test]
    fn a_tool_marked_a_read_is_a_read_whatever_its_hints() {
        let contract = default_contract(&tool(json!({"destructiveHint": true})), 30, true).unwrap();
        assert_eq!(contract.effect_class, EffectClass::Read);
        let t = tool(json!({}));
        let keyed = default_contract(&t, 30, false).unwrap();
        assert!(
            treatment(&t, &keyed, false)
                .contains("no readOnlyHint: a repeat within the window replays")
        );
    }
}
