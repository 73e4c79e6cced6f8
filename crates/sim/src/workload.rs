//! What a schedule asks of the executor: a few tools, a small key space, and the arguments of
//! each delivery.
//!
//! The contracts are built from YAML here, one per variant the executor treats differently:
//! a downstream that deduplicates and has lookups, one of each, neither (the dispatch marker),
//! asynchronous jobs, approval, each late-arrival policy, short retention, a duplicate-intent
//! window, and a natural-idempotent tool delivered without a key. They are compiled once per
//! thread ([`Catalog`]); a schedule picks one to three of them.
//!
//! The key space is small (two to four workflow steps) so deliveries collide. Each key is
//! always delivered by its workflow's owner, mostly with the same arguments, sometimes with a
//! changed non-material note (the same request), a changed material field (a fingerprint
//! mismatch) or arguments the downstream or the schema refuse; occasionally a new key arrives
//! with another key's arguments (duplicate intent).

use std::sync::Arc;

use idemgate_core::contract::Contract;
use idemgate_core::key::OperationKey;
use serde_json::{Value, json};

use crate::choices::Choices;
use crate::downstream::Semantics;

pub const TENANT: &str = "acme";
pub const ENVIRONMENT: &str = "sim";

/// One contract variant.
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    pub name: &'static str,
    pub class: &'static str,
    pub semantics: Semantics,
    pub late_arrival: &'static str,
    pub short_retention: bool,
    pub approval: bool,
    pub intent_window: bool,
}

const fn variant(name: &'static str, dedup: bool, lookup: bool, jobs: bool) -> Variant {
    Variant {
        name,
        class: "key_based",
        semantics: Semantics {
            deduplicates: dedup,
            lookup,
            jobs,
        },
        late_arrival: "reject",
        short_retention: false,
        approval: false,
        intent_window: false,
    }
}

/// Every variant a schedule may use. The first is the plainest.
pub const VARIANTS: &[Variant] = &[
    variant("sim.dedup_lookup", true, true, false),
    Variant {
        late_arrival: "tombstone",
        short_retention: true,
        ..variant("sim.dedup", true, false, false)
    },
    Variant {
        late_arrival: "reconcile",
        ..variant("sim.lookup", false, true, false)
    },
    Variant {
        short_retention: true,
        ..variant("sim.marker", false, false, false)
    },
    Variant {
        late_arrival: "tombstone",
        ..variant("sim.jobs", true, false, true)
    },
    Variant {
        class: "irreversible",
        approval: true,
        late_arrival: "tombstone",
        short_retention: true,
        ..variant("sim.approval", false, true, false)
    },
    Variant {
        intent_window: true,
        short_retention: true,
        ..variant("sim.intent", true, true, false)
    },
    Variant {
        class: "natural_idempotent",
        ..variant("sim.natural", false, false, false)
    },
    Variant {
        late_arrival: "reconcile",
        short_retention: true,
        ..variant("sim.lookup_short", false, true, false)
    },
    Variant {
        late_arrival: "tombstone",
        short_retention: true,
        ..variant("sim.marker_tomb", false, false, false)
    },
];

/// The YAML of a variant's contract.
pub fn contract_yaml(v: &Variant) -> String {
    let natural = v.class == "natural_idempotent";
    let (record_ttl, tombstone_ttl, window) = if v.short_retention {
        ("60s", "60s", "30s")
    } else {
        ("1d", "7d", "1d")
    };
    let mut y = format!(
        "name: {name}\nversion: \"1\"\npurpose: A simulated tool.\neffect_class: {class}\n\
         input_schema:\n  type: object\n  properties:\n    target: {{type: string, minLength: 1}}\n\
         \x20   amount: {{type: integer}}\n    note: {{type: string}}\n    path: {{type: string}}\n\
         \x20   version: {{type: integer}}\n  required: [target]\n  additionalProperties: false\n\
         request_fingerprint:\n  fields: [target, amount, path, version]\n\
         downstream:\n  deduplicates_by_key: {dedup}\n  receipt_lookup: {lookup}\n  async_jobs: {jobs}\n",
        name = v.name,
        class = v.class,
        dedup = v.semantics.deduplicates,
        lookup = v.semantics.lookup,
        jobs = v.semantics.jobs,
    );
    if natural {
        y.push_str("  version_precondition: version\n");
    }
    y.push_str("security:\n  recheck_authorization: true\n");
    if v.approval {
        y.push_str("  approval: always\n  approval_window: 10m\n");
    }
    y.push_str(&format!(
        "retention:\n  record_ttl: {record_ttl}\n  tombstone_ttl: {tombstone_ttl}\n  \
         late_arrival: {late}\n  max_retry_window: {window}\nlease_seconds: 5\n",
        late = v.late_arrival
    ));
    if v.intent_window {
        y.push_str("duplicate_intent_window: 1d\n");
    }
    y
}

/// The variants' contracts, compiled once.
pub struct Catalog {
    pub tools: Vec<(Variant, Arc<Contract>)>,
}

impl Catalog {
    pub fn new() -> Catalog {
        let tools = VARIANTS
            .iter()
            .map(|v| {
                let contract = Contract::load(&contract_yaml(v), v.name)
                    .unwrap_or_else(|e| panic!("simulated contract {}: {e}", v.name));
                (*v, Arc::new(contract))
            })
            .collect();
        Catalog { tools }
    }
}

impl Default for Catalog {
    fn default() -> Self {
        Catalog::new()
    }
}

/// One intended operation of the workload.
#[derive(Debug, Clone)]
pub struct Step {
    /// Index into the catalog.
    pub tool: usize,
    /// `None` for a key-less delivery (the natural-idempotent tool).
    pub key: Option<OperationKey>,
    pub workflow: String,
    pub step: String,
    pub actor: String,
    pub arguments: Value,
}

/// The schedule's tools and key space.
pub struct Workload {
    pub tools: Vec<usize>,
    pub steps: Vec<Step>,
    dup_keys: usize,
}

fn base_arguments(i: usize, natural: bool) -> Value {
    let mut args = json!({ "target": format!("t{i}"), "amount": 10 * (i + 1), "note": "first" });
    if natural {
        args["version"] = json!(1);
    }
    args
}

impl Workload {
    /// Draws the tools and the key space.
    pub fn draw(choices: &mut Choices, catalog: &Catalog) -> Workload {
        let n = catalog.tools.len();
        let mut tools = vec![choices.pick(n)];
        for _ in 0..choices.choose(3) {
            let t = choices.pick(n);
            if !tools.contains(&t) {
                tools.push(t);
            }
        }
        let keys = 2 + choices.pick(3);
        let workflows = 1 + choices.pick(2);
        let mut steps = Vec::new();
        for i in 0..keys {
            let tool = tools[choices.pick(tools.len())];
            let natural = catalog.tools[tool].0.class == "natural_idempotent";
            let wf = i % workflows + 1;
            let workflow = format!("wf{wf}");
            let step = format!("s{}", i / workflows + 1);
            let key = (!natural).then(|| {
                OperationKey::new(TENANT, ENVIRONMENT, &workflow, &step).expect("a valid key")
            });
            steps.push(Step {
                tool,
                key,
                workflow,
                step,
                actor: format!("agent-{wf}"),
                arguments: base_arguments(i, natural),
            });
        }
        Workload {
            tools,
            steps,
            dup_keys: 0,
        }
    }

    /// The arguments of one delivery of `step`: mostly its own, sometimes not.
    pub fn arguments(&self, choices: &mut Choices, step: usize) -> (Value, &'static str) {
        let mut args = self.steps[step].arguments.clone();
        match choices.choose(20) {
            0..=13 => (args, ""),
            14..=15 => {
                args["note"] = json!("again");
                (args, " (note changed)")
            }
            16..=17 => {
                args["amount"] = json!(args["amount"].as_i64().unwrap_or(0) + 1);
                (args, " (amount changed)")
            }
            18 => {
                args["path"] = json!("..");
                (args, " (path refused)")
            }
            _ => {
                args["amount"] = json!("lots");
                (args, " (schema-invalid)")
            }
        }
    }

    /// A new key of the same workflow with the arguments of `step`: the same intent under a
    /// new identity. Returns the new step's index.
    pub fn duplicate_of(&mut self, step: usize) -> Option<usize> {
        let original = self.steps[step].clone();
        let key = original.key.as_ref()?;
        self.dup_keys += 1;
        let name = format!("dup{}", self.dup_keys);
        let key = OperationKey::new(TENANT, ENVIRONMENT, key.workflow_id(), &name).ok()?;
        self.steps.push(Step {
            key: Some(key),
            step: name,
            ..original
        });
        Some(self.steps.len() - 1)
    }

    /// How many new keys may still be made (bounded, so the key space stays small).
    pub fn may_duplicate(&self) -> bool {
        self.dup_keys < 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_loads_and_says_what_it_is() {
        let catalog = Catalog::new();
        for (v, c) in &catalog.tools {
            assert_eq!(c.deduplicates(), v.semantics.deduplicates, "{}", v.name);
            assert_eq!(c.receipt_lookup(), v.semantics.lookup, "{}", v.name);
            assert_eq!(c.async_jobs(), v.semantics.jobs, "{}", v.name);
            assert_eq!(
                c.duplicate_intent_window().is_some(),
                v.intent_window,
                "{}",
                v.name
            );
        }
    }
}
