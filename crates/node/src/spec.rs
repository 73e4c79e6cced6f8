//! A tool's contract, from `local.tool`'s options or from a contract file (the same rules as
//! crates/py's).
//!
//! The options arrive as a contract already shaped like the YAML file (the TypeScript side maps
//! `fingerprint` to `request_fingerprint.fields` and so on), and are read by the same reader and
//! checks as every contract file ([`Contract::load`]): JSON is YAML. A file is read by the
//! gateway's own loader and reviewed by the same linter as `idemgate contract lint`; it may not
//! declare an HTTP downstream or an HTTP authorization hook, since the tool's function is the
//! effect.

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

/// The contract the options describe.
pub fn from_arguments(name: &str, spec: &Value) -> Result<Contract, Refused> {
    let text = serde_json::to_string(spec).map_err(|e| Refused {
        field: None,
        message: e.to_string(),
    })?;
    let contract = Contract::load(&text, &format!("local.tool({name})"))?;
    in_process(&contract)?;
    Ok(contract)
}

/// One finding of the linter on a contract file: level, rule, field, reason.
pub type Finding = (&'static str, &'static str, String, String);

/// A contract file, read as the gateway reads it, with the linter's findings.
pub fn from_file(path: &str) -> Result<(Contract, Vec<Finding>), String> {
    let mut loaded =
        idemgate_app::contracts::load_files(&[PathBuf::from(path)]).map_err(|e| e.to_string())?;
    let contract = loaded.pop().ok_or_else(|| format!("{path}: no contract"))?;
    in_process(&contract).map_err(|r| match r.field {
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

/// What an in-process tool's contract may not declare: the effect is the tool's function, not
/// an HTTP call.
fn in_process(contract: &Contract) -> Result<(), Refused> {
    if contract.file.downstream.http.is_some() {
        return Err(Refused {
            field: Some("downstream.http".into()),
            message: "an in-process tool's effect is the tool's function, so its contract \
                      declares no HTTP downstream; remove the section (keep \
                      deduplicates_by_key, receipt_lookup and async_jobs)"
                .into(),
        });
    }
    if contract.file.security.authorization_hook.is_some() {
        return Err(Refused {
            field: Some("security.authorization_hook".into()),
            message: "an in-process tool has no HTTP authorization hook; remove the setting".into(),
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
        let contract = from_arguments("refunds.issue", &spec()).unwrap();
        assert_eq!(contract.name, "refunds.issue");
        assert!(contract.receipt_lookup() && !contract.deduplicates());
    }

    #[test]
    fn a_refusal_names_the_field() {
        let mut bad = spec();
        bad["request_fingerprint"]["fields"] = json!(["order_id", "nope"]);
        let refused = from_arguments("refunds.issue", &bad).unwrap_err();
        assert_eq!(refused.field.as_deref(), Some("request_fingerprint.fields"));
        assert!(refused.message.contains("`nope`"), "{refused:?}");

        let mut http = spec();
        http["downstream"]["http"] = json!({"url": "http://127.0.0.1:9/x"});
        let refused = from_arguments("refunds.issue", &http).unwrap_err();
        assert_eq!(refused.field.as_deref(), Some("downstream.http"));
    }

    #[test]
    fn a_file_with_an_http_downstream_is_refused_naming_the_file_and_field() {
        let root = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../contracts/tickets.create.yaml"
        );
        let e = from_file(root).unwrap_err();
        assert!(
            e.contains("tickets.create.yaml: field `downstream.http`"),
            "{e}"
        );
        assert!(
            from_file("/nonexistent/x.yaml")
                .unwrap_err()
                .contains("x.yaml")
        );
    }
}
