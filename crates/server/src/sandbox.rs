//! The sandbox: an in-process system of record for trying the gateway without one.
//!
//! Each tool gets its own in-memory table of effects keyed by the idempotency key it receives,
//! deduplicating, offering a receipt lookup and running jobs as its contract declares. A
//! workflow id starting with one of these words makes the sandbox misbehave, so the whole
//! outcome table can be shown with curl:
//!
//! - `sandbox-timeout…` — nothing is committed and the answer times out (ambiguous);
//! - `sandbox-drop…` — the effect is committed and the answer is lost (ambiguous);
//! - `sandbox-refuse…` — a deterministic refusal.
//!
//! Effects are not real and are lost when the process ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idemgate_core::ErrorCode;
use idemgate_core::contract::Contract;
use idemgate_core::effect::{
    Authorizer, Downstream, EffectOutcome, EffectRequest, JobStatus, Lookup,
};
use idemgate_core::key::OperationKey;
use idemgate_core::record::{Receipt, Refusal};
use idemgate_core::store::BoxFuture;
use serde_json::json;

use crate::tools::Effects;

/// Builds sandbox downstreams; no authorization hooks.
#[derive(Debug, Default, Clone, Copy)]
pub struct SandboxEffects;

impl Effects for SandboxEffects {
    fn downstream(&self, contract: &Contract) -> Result<Arc<dyn Downstream>, String> {
        Ok(Arc::new(Sandbox::for_contract(contract)))
    }
    fn authorizer(&self, _contract: &Contract) -> Result<Option<Arc<dyn Authorizer>>, String> {
        Ok(None)
    }
}

/// One tool's sandbox system of record.
#[derive(Debug)]
pub struct Sandbox {
    noun: String,
    deduplicates: bool,
    lookup: bool,
    jobs: bool,
    // A std mutex: held for table updates only, never across an await.
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    receipts: HashMap<OperationKey, Receipt>,
    jobs: HashMap<String, OperationKey>,
    effects: u64,
}

impl Sandbox {
    pub fn for_contract(contract: &Contract) -> Sandbox {
        // `tickets.create` makes `ticket_1`, `email.send` makes `email_1`.
        let first = contract.name.split('.').next().unwrap_or("effect");
        let noun = first.strip_suffix('s').unwrap_or(first).to_string();
        Sandbox {
            noun,
            deduplicates: contract.deduplicates(),
            lookup: contract.receipt_lookup(),
            jobs: contract.async_jobs(),
            state: Mutex::new(State::default()),
        }
    }

    /// Effects committed so far.
    pub fn effects(&self) -> u64 {
        self.state.lock().map(|s| s.effects).unwrap_or_default()
    }

    fn commit(&self, key: &OperationKey) -> Receipt {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.deduplicates
            && let Some(receipt) = state.receipts.get(key)
        {
            return receipt.clone();
        }
        state.next += 1;
        state.effects += 1;
        let reference = format!("{}_{}", self.noun, state.next);
        let receipt = Receipt {
            result: json!({ "id": reference, "sandbox": true }),
            reference,
        };
        state
            .receipts
            .entry(key.clone())
            .or_insert_with(|| receipt.clone());
        receipt
    }
}

impl Downstream for Sandbox {
    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        let workflow = request.key.workflow_id();
        let outcome = if workflow.starts_with("sandbox-timeout") {
            EffectOutcome::ambiguous("timed out waiting for the sandbox")
        } else if workflow.starts_with("sandbox-drop") {
            self.commit(request.key);
            EffectOutcome::ambiguous("connection reset after the request was sent")
        } else if workflow.starts_with("sandbox-refuse") {
            EffectOutcome::Refused(Refusal {
                code: ErrorCode::DownstreamRejected,
                message: "the sandbox refused the request".into(),
            })
        } else if self.jobs {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let job_id = format!("job_{}", state.jobs.len() + 1);
            state.jobs.insert(job_id.clone(), request.key.clone());
            EffectOutcome::Accepted { job_id }
        } else {
            EffectOutcome::Committed(self.commit(request.key))
        };
        Box::pin(std::future::ready(outcome))
    }

    fn lookup_receipt<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        let answer = if !self.lookup {
            Lookup::Unavailable("the sandbox offers no lookup for this tool".into())
        } else {
            let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            match state.receipts.get(key) {
                Some(r) => Lookup::Found(r.clone()),
                None => Lookup::NotFound,
            }
        };
        Box::pin(std::future::ready(answer))
    }

    fn poll_job<'a>(&'a self, key: &'a OperationKey, job_id: &'a str) -> BoxFuture<'a, JobStatus> {
        // A sandbox job finishes by the first poll.
        let known = {
            let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.jobs.get(job_id) == Some(key)
        };
        // A job the sandbox does not know was lost with a restart (its tables live in memory)
        // or belongs to another key: gone, not failed, since nothing proves it never ran.
        let answer = if known {
            JobStatus::Done(self.commit(key))
        } else {
            JobStatus::Gone(format!("the sandbox has no job {job_id} for this key"))
        };
        Box::pin(std::future::ready(answer))
    }
}
