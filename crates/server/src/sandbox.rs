//! `serve`'s sandbox effects: every tool's downstream is its [`idemgate_sandbox::Sandbox`]
//! (bounded, in memory; jobs finish by their first poll), with no authorization hooks.

use std::sync::Arc;

use idemgate_core::contract::Contract;
use idemgate_core::effect::{Authorizer, Downstream};
use idemgate_sandbox::{Jobs, Sandbox};

use crate::tools::Effects;

/// Builds sandbox downstreams; no authorization hooks.
#[derive(Debug, Default, Clone, Copy)]
pub struct SandboxEffects;

impl Effects for SandboxEffects {
    fn downstream(&self, contract: &Contract) -> Result<Arc<dyn Downstream>, String> {
        Ok(Arc::new(Sandbox::for_contract(contract, Jobs::FirstPoll)))
    }
    fn authorizer(&self, _contract: &Contract) -> Result<Option<Arc<dyn Authorizer>>, String> {
        Ok(None)
    }
}
