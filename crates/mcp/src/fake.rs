//! In-process fake downstreams for demos and tests: `idemgate mcp --fake-downstream`.
//!
//! Each contract gets its own [`Sandbox`] (the product's sandbox, with scripted jobs),
//! configured as its contract declares (deduplicates on the key, offers a receipt lookup), so
//! the fake is no more forgiving than the real system of record would be: a duplicate the
//! executor let through shows up as a second effect in the sandbox's own count, not absorbed by
//! deduplication the contract does not promise.
//!
//! The fakes are controlled and read through one hidden tool, [`CONTROL_TOOL`], served only
//! when fakes are in use. It is not listed by `tools/list` (a model should not see it), but a
//! test client may call it by name: `stats` reads the fake's own counts, `push_fault` scripts
//! the next call (commit then drop the answer, accept a job, …), `complete_job` / `fail_job`
//! finish an accepted job.

use std::sync::Arc;

use idemgate_app::Effects;
use idemgate_core::ErrorCode;
use idemgate_core::contract::Contract;
use idemgate_core::effect::{Authorizer, Downstream};
use idemgate_sandbox::{Fault, Jobs, Sandbox, Sandboxes};
use serde_json::{Map, Value, json};

/// The hidden tool that reads and scripts the fake downstreams.
pub const CONTROL_TOOL: &str = "idemgate_fake_downstream";

/// One fake system of record per contract, by contract name.
#[derive(Clone, Debug, Default)]
pub struct FakeDownstreams {
    fakes: Sandboxes,
}

impl FakeDownstreams {
    /// A fake per contract, with the contract's declared deduplication and receipt lookup.
    pub fn for_contracts<'a>(contracts: impl IntoIterator<Item = &'a Contract>) -> FakeDownstreams {
        FakeDownstreams {
            fakes: Sandboxes::for_contracts(contracts, Jobs::Scripted),
        }
    }

    /// The fake of one contract, as the executor's downstream.
    pub fn downstream(&self, contract: &str) -> Option<Arc<dyn Downstream>> {
        self.fakes.downstream(contract)
    }

    pub fn get(&self, contract: &str) -> Option<&Sandbox> {
        self.fakes.get(contract)
    }

    /// Finds a fake by contract name or by its MCP tool name.
    fn find(&self, tool: &str) -> Option<(&str, &Sandbox)> {
        self.fakes
            .iter()
            .find(|(name, _)| *name == tool || crate::tools::tool_name(name) == tool)
    }

    /// Carries out one call of [`CONTROL_TOOL`]. `Err` is a message for a tool error.
    pub fn control(&self, arguments: &Map<String, Value>) -> Result<Value, String> {
        let text = |name: &str| arguments.get(name).and_then(Value::as_str);
        let action = text("action").ok_or("`action` is required")?;
        let tool = text("tool").ok_or("`tool` is required")?;
        let (name, fake) = self
            .find(tool)
            .ok_or_else(|| format!("no fake downstream for `{tool}`"))?;
        match action {
            "stats" => {}
            "push_fault" => {
                let fault = match text("fault").ok_or("`fault` is required")? {
                    "commit_then_drop" => Fault::CommitThenDrop,
                    "commit_then_fail" => Fault::CommitThenFail,
                    "malformed" => Fault::Malformed,
                    "not_sent" => Fault::NotSent,
                    "timeout" => Fault::Timeout,
                    "accept_job" => Fault::AcceptJob,
                    "precondition_failed" => Fault::PreconditionFailed,
                    "refuse" => Fault::Refuse {
                        code: ErrorCode::DownstreamRejected,
                        message: "the fake downstream refused".into(),
                    },
                    other => return Err(format!("unknown fault `{other}`")),
                };
                fake.push_fault(fault);
            }
            "complete_job" => {
                let job = text("job_id").ok_or("`job_id` is required")?;
                fake.complete_job(job)?;
            }
            "fail_job" => {
                let job = text("job_id").ok_or("`job_id` is required")?;
                fake.fail_job(job, "the fake job failed")?;
            }
            other => return Err(format!("unknown action `{other}`")),
        }
        Ok(idemgate_sandbox::stats(name, fake))
    }
}

/// The fakes as the tools' effects (`ToolSet::build(contracts, &fakes)`): each contract's
/// fake, no authorization hooks.
impl Effects for FakeDownstreams {
    fn downstream(&self, contract: &Contract) -> Result<Arc<dyn Downstream>, String> {
        FakeDownstreams::downstream(self, &contract.name)
            .ok_or_else(|| "no fake downstream".to_string())
    }
    fn authorizer(&self, _contract: &Contract) -> Result<Option<Arc<dyn Authorizer>>, String> {
        Ok(None)
    }
}

/// The input schema of [`CONTROL_TOOL`].
pub fn control_schema() -> Map<String, Value> {
    let schema = json!({
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["stats", "push_fault", "complete_job", "fail_job"]},
            "tool": {"type": "string"},
            "fault": {"type": "string", "enum": [
                "commit_then_drop", "commit_then_fail", "malformed", "not_sent", "timeout",
                "accept_job", "precondition_failed", "refuse"
            ]},
            "job_id": {"type": "string"}
        },
        "required": ["action", "tool"],
        "additionalProperties": false
    });
    schema.as_object().cloned().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn control_reports_and_scripts_by_contract_or_tool_name() {
        let mut sandboxes = Sandboxes::default();
        sandboxes.insert("tickets.create", Sandbox::new("ticket"));
        let fakes = FakeDownstreams { fakes: sandboxes };
        let s = fakes
            .control(&args(json!({"action": "stats", "tool": "tickets_create"})))
            .unwrap();
        assert_eq!(
            (s["tool"].clone(), s["effects"].clone()),
            (json!("tickets.create"), json!(0))
        );
        let s = fakes
            .control(&args(
                json!({"action": "push_fault", "tool": "tickets.create", "fault": "accept_job"}),
            ))
            .unwrap();
        assert_eq!(s["faults_pending"], json!(1));
        for (bad, expect) in [
            (
                json!({"action": "stats", "tool": "nope"}),
                "no fake downstream for `nope`",
            ),
            (
                json!({"action": "push_fault", "tool": "tickets.create", "fault": "x"}),
                "unknown fault `x`",
            ),
            (
                json!({"action": "complete_job", "tool": "tickets.create", "job_id": "job_9"}),
                "no job `job_9`",
            ),
            (json!({"tool": "tickets.create"}), "`action` is required"),
        ] {
            assert_eq!(fakes.control(&args(bad)).unwrap_err(), expect);
        }
    }
}
