//! The contract a child's tool runs under when no contract file names it, from the tool's
//! own listing.
//!
//! - `annotations.readOnlyHint: true` ⇒ `read`: no claim, no record, passed straight through.
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

/// The tool's name as it was listed.
pub fn tool_name(tool: &Map<String, Value>) -> Option<&str> {
    tool.get("name").and_then(Value::as_str)
}

/// The default contract of one listed tool. `lease_seconds` should outlast the call timeout's
/// renewals comfortably; the executor renews it while the call runs.
pub fn default_contract(
    tool: &Map<String, Value>,
    lease_seconds: u64,
) -> Result<Arc<Contract>, LoadError> {
    let name = tool_name(tool).unwrap_or_default().to_string();
    let class = Annotations::of(tool).effect_class();
    let schema = match tool.get("inputSchema") {
        Some(Value::Object(s)) => Value::Object(s.clone()),
        _ => json!({"type": "object"}),
    };
    let keyed = class != EffectClass::Read;
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
            deduplicates_by_key: false,
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

/// The one line printed on stderr for a tool that runs under defaults.
pub fn warning(child: &str, tool: &str, class: EffectClass) -> String {
    let what = match class {
        EffectClass::Read => "read-only (readOnlyHint): passed through, no record",
        EffectClass::Irreversible => {
            "key-based with approval (destructiveHint): each operation waits for an operator"
        }
        _ => {
            "key-based: one effect per operation, a lost answer ends unknown; no approval (no destructiveHint: true)"
        }
    };
    format!(
        "idemgate wrap: warning: tool `{tool}` of `{child}` has no contract; using defaults from its annotations: {what}"
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
            let contract = default_contract(&tool(hints.clone()), 30).unwrap();
            assert_eq!(contract.effect_class, class, "{hints}");
        }
    }

    #[test]
    fn a_keyed_default_fingerprints_every_argument_and_marks_dispatch() {
        let contract = default_contract(&tool(json!({})), 30).unwrap();
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
        let contract = default_contract(&tool(json!({"destructiveHint": true})), 30).unwrap();
        assert!(contract.needs_approval(&json!({"subject": "x"})));
    }
}
