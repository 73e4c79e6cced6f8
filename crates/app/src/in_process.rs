//! An in-process tool's contract, from its registration's options or from a contract file: the
//! one reader the in-process faces (`crates/py`, `crates/node`) share.
//!
//! The options arrive as a contract already shaped like the YAML file (each language's side maps
//! `fingerprint` to `request_fingerprint.fields` and so on), and are read by the same reader and
//! checks as every contract file ([`Contract::load`]): JSON is YAML. A file is read by the
//! gateway's own loader ([`crate::contracts::load_files`]) and reviewed by the same linter as
//! `idemgate contract lint`; it may not declare an HTTP downstream or an HTTP authorization
//! hook, since the program's own function is the effect (and its own callable the hook).

use std::path::PathBuf;

use idemgate_core::contract::{Contract, LoadError};
use idemgate_core::lint::{self, Level};
use serde_json::Value;

/// Why a tool's contract was refused: the contract field concerned (when one is) and what is
/// wrong, without the line numbers of a file the user never wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub field: Option<String>,
    pub message: String,
}

impl From<LoadError> for Refused {
    fn from(e: LoadError) -> Refused {
        Refused {
            field: e.field,
            message: e.message,
        }
    }
}

/// How one language names what the messages speak of.
#[derive(Debug, Clone, Copy)]
pub struct Binding {
    /// How a tool's registration is written, `@tool` or `local.tool`: the contract's origin.
    pub register: &'static str,
    /// What the effect is: "the decorated function".
    pub effect: &'static str,
    /// Why an HTTP authorization hook is refused.
    pub hook: &'static str,
}

/// Python's `@local.tool`.
pub const PYTHON: Binding = Binding {
    register: "@tool",
    effect: "the decorated function",
    hook: "an in-process tool's hook is the decorator's authorize= callable, not an HTTP hook; \
           remove the setting",
};

/// TypeScript's `local.tool`.
pub const NODE: Binding = Binding {
    register: "local.tool",
    effect: "the tool's function",
    hook: "an in-process tool's hook is the tool's authorize function, not an HTTP hook; \
           remove the setting",
};

/// The contract a registration's options describe.
pub fn from_arguments(binding: &Binding, name: &str, spec: &Value) -> Result<Contract, Refused> {
    let text = serde_json::to_string(spec).map_err(|e| Refused {
        field: None,
        message: e.to_string(),
    })?;
    let contract = Contract::load(&text, &format!("{}({name})", binding.register))?;
    in_process(binding, &contract)?;
    Ok(contract)
}

/// One finding of the linter on a contract file: level, rule, field, reason.
pub type Finding = (&'static str, &'static str, String, String);

/// A contract file, read as the gateway reads it, with the linter's findings.
pub fn from_file(binding: &Binding, path: &str) -> Result<(Contract, Vec<Finding>), String> {
    let mut loaded =
        crate::contracts::load_files(&[PathBuf::from(path)]).map_err(|e| e.to_string())?;
    let contract = loaded.pop().ok_or_else(|| format!("{path}: no contract"))?;
    in_process(binding, &contract).map_err(|r| match r.field {
        Some(field) => format!("{path}: field `{field}`: {}", r.message),
        None => format!("{path}: {}", r.message),
    })?;
    let findings = lint::lint(&contract.file)
        .into_iter()
        .map(|f| {
            let level = match f.level {
                Level::Error => "error",
                Level::Warning => "warning",
            };
            (level, f.rule, f.field, f.reason)
        })
        .collect();
    Ok((contract, findings))
}

/// What an in-process tool's contract may not declare: the effect is the program's function,
/// not an HTTP call, and the hook its own callable.
fn in_process(binding: &Binding, contract: &Contract) -> Result<(), Refused> {
    if contract.file.downstream.http.is_some() {
        return Err(Refused {
            field: Some("downstream.http".into()),
            message: format!(
                "an in-process tool's effect is {}, so its contract declares no HTTP \
                 downstream; remove the section (keep deduplicates_by_key, receipt_lookup and \
                 async_jobs)",
                binding.effect
            ),
        });
    }
    if contract.file.security.authorization_hook.is_some() {
        return Err(Refused {
            field: Some("security.authorization_hook".into()),
            message: binding.hook.into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> Value {
        json!({
            "name": "refunds.issue",
            "version": "1",
            "effect_class": "key_based",
            "operation_key": {"supplied_by": "application",
                              "scope": ["tenant", "environment", "workflow_id", "step_id"]},
            "input_schema": {"type": "object",
                             "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}}},
            "request_fingerprint": {"fields": ["order_id", "amount"]},
            "downstream": {"receipt_lookup": true},
            "retention": {"record_ttl": "7d", "tombstone_ttl": "30d", "max_retry_window": "1d"},
        })
    }

    #[test]
    fn the_decorators_contract_is_read_by_the_contract_reader() {
        let contract = from_arguments(&PYTHON, "refunds.issue", &spec()).unwrap();
        assert_eq!(contract.name, "refunds.issue");
        assert!(contract.receipt_lookup() && !contract.deduplicates());
    }

    #[test]
    fn a_refusal_names_the_field() {
        let mut bad = spec();
        bad["request_fingerprint"]["fields"] = json!(["order_id", "nope"]);
        let refused = from_arguments(&PYTHON, "refunds.issue", &bad).unwrap_err();
        assert_eq!(refused.field.as_deref(), Some("request_fingerprint.fields"));
        assert!(refused.message.contains("`nope`"), "{refused:?}");

        let mut http = spec();
        http["downstream"]["http"] = json!({"url": "http://127.0.0.1:9/x"});
        let refused = from_arguments(&PYTHON, "refunds.issue", &http).unwrap_err();
        assert_eq!(refused.field.as_deref(), Some("downstream.http"));
    }

    #[test]
    fn a_file_with_an_http_downstream_is_refused_naming_the_file_and_field() {
        let root = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../contracts/tickets.create.yaml"
        );
        let e = from_file(&NODE, root).unwrap_err();
        assert!(
            e.contains("tickets.create.yaml: field `downstream.http`"),
            "{e}"
        );
        assert!(
            from_file(&PYTHON, "/nonexistent/x.yaml")
                .unwrap_err()
                .contains("x.yaml")
        );
    }
}
