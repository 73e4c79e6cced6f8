//! The loaded tools: each contract with the downstream that performs its effect and the
//! authorization hook that rechecks it.
//!
//! Where a tool's effect and hook come from is an [`Effects`] factory, so the gateway runs the
//! same over the HTTP downstream, the in-process sandbox, or a test's fake.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use idemgate_core::contract::Contract;
use idemgate_core::effect::{AuthRequest, Authorization, Authorizer, Downstream};
use idemgate_core::store::BoxFuture;
use idemgate_engine::Tools;

/// Makes a tool's downstream and its authorization hook from its contract.
pub trait Effects: Send + Sync {
    /// The downstream that performs this tool's effect.
    fn downstream(&self, contract: &Contract) -> Result<Arc<dyn Downstream>, String>;
    /// The contract's authorization hook; `None` when it declares none (then every call is
    /// allowed, as far as the hook goes).
    fn authorizer(&self, contract: &Contract) -> Result<Option<Arc<dyn Authorizer>>, String>;
}

/// The real thing: each contract's `downstream.http` section and `security.authorization_hook`.
#[derive(Debug, Default, Clone, Copy)]
pub struct HttpEffects;

impl Effects for HttpEffects {
    fn downstream(&self, contract: &Contract) -> Result<Arc<dyn Downstream>, String> {
        idemgate_downstream_http::HttpDownstream::from_contract(contract)
            .map(|d| Arc::new(d) as Arc<dyn Downstream>)
            .map_err(|e| e.to_string())
    }
    fn authorizer(&self, contract: &Contract) -> Result<Option<Arc<dyn Authorizer>>, String> {
        idemgate_downstream_http::HttpAuthorizer::from_contract(contract)
            .map(|hook| hook.map(|h| Arc::new(h) as Arc<dyn Authorizer>))
            .map_err(|e| e.to_string())
    }
}

/// One tool, ready to run.
#[derive(Clone)]
pub struct Tool {
    pub contract: Arc<Contract>,
    pub downstream: Arc<dyn Downstream>,
    pub authorizer: Option<Arc<dyn Authorizer>>,
}

/// Every loaded tool by name.
#[derive(Clone, Default)]
pub struct ToolSet {
    tools: BTreeMap<String, Tool>,
}

impl ToolSet {
    /// Builds the tools of `contracts` through `effects`. Two contracts with one name, or a
    /// tool whose effect cannot be built, is an error naming the tool.
    pub fn build(contracts: Vec<Contract>, effects: &dyn Effects) -> Result<ToolSet, String> {
        let mut tools = BTreeMap::new();
        for contract in contracts {
            let name = contract.name.clone();
            let downstream = effects
                .downstream(&contract)
                .map_err(|e| format!("tool {name}: {e}"))?;
            let authorizer = effects
                .authorizer(&contract)
                .map_err(|e| format!("tool {name}: {e}"))?;
            let tool = Tool {
                contract: Arc::new(contract),
                downstream,
                authorizer,
            };
            if tools.insert(name.clone(), tool).is_some() {
                return Err(format!("two contracts declare the tool {name}"));
            }
        }
        Ok(ToolSet { tools })
    }

    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Wraps every downstream (for timing).
    pub fn map_downstreams(
        mut self,
        f: impl Fn(&str, Arc<dyn Downstream>) -> Arc<dyn Downstream>,
    ) -> ToolSet {
        for (name, tool) in self.tools.iter_mut() {
            tool.downstream = f(name, tool.downstream.clone());
        }
        self
    }
}

impl Tools for ToolSet {
    fn resolve(&self, tool: &str) -> Option<(Arc<Contract>, Arc<dyn Downstream>)> {
        self.get(tool)
            .map(|t| (t.contract.clone(), t.downstream.clone()))
    }
}

/// The executor's authorizer: dispatches on the tool to its contract's hook. A tool without a
/// hook is allowed; a tool that is not loaded is denied (fail closed).
pub struct Dispatch {
    tools: Arc<ToolSet>,
}

impl Dispatch {
    pub fn new(tools: Arc<ToolSet>) -> Dispatch {
        Dispatch { tools }
    }
}

impl Authorizer for Dispatch {
    fn authorize<'a>(&'a self, request: AuthRequest<'a>) -> BoxFuture<'a, Authorization> {
        match self.tools.get(request.tool) {
            Some(Tool {
                authorizer: Some(hook),
                ..
            }) => hook.authorize(request),
            Some(_) => Box::pin(std::future::ready(Authorization::Allowed)),
            None => Box::pin(std::future::ready(Authorization::Denied(
                "the tool is not loaded".into(),
            ))),
        }
    }

    /// A loaded tool without a hook is allowed without asking; anything else may be refused.
    fn asks(&self, tool: &str) -> bool {
        !matches!(
            self.tools.get(tool),
            Some(Tool {
                authorizer: None,
                ..
            })
        )
    }
}

/// The example contracts, embedded so that `idemgate serve` without configuration runs from
/// any directory.
pub const EXAMPLE_CONTRACTS: &[(&str, &str)] = &[
    (
        "tickets.create.yaml",
        include_str!("../../../contracts/tickets.create.yaml"),
    ),
    (
        "tickets.get.yaml",
        include_str!("../../../contracts/tickets.get.yaml"),
    ),
    (
        "tickets.set_status.yaml",
        include_str!("../../../contracts/tickets.set_status.yaml"),
    ),
    (
        "email.send.yaml",
        include_str!("../../../contracts/email.send.yaml"),
    ),
    (
        "reports.generate.yaml",
        include_str!("../../../contracts/reports.generate.yaml"),
    ),
];

/// Loads the embedded example contracts.
pub fn example_contracts() -> Result<Vec<Contract>, String> {
    EXAMPLE_CONTRACTS
        .iter()
        .map(|(file, text)| Contract::load(text, file).map_err(|e| e.to_string()))
        .collect()
}

/// Expands contract patterns (files, or `*` in the file name) relative to `base`, sorted.
pub fn expand(patterns: &[String], base: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for pattern in patterns {
        let found = idemgate_app::contracts::expand(pattern, base)
            .map_err(|e| format!("contract pattern `{}`: {}", e.pattern, e.message))?;
        files.extend(found);
    }
    Ok(files)
}

/// Reads and checks contract files.
pub fn load_files(files: &[PathBuf]) -> Result<Vec<Contract>, String> {
    files
        .iter()
        .map(|path| {
            let shown = path.display().to_string();
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("{shown}: cannot be read: {e}"))?;
            Contract::load(&text, &shown).map_err(|e| e.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_load() {
        let contracts = example_contracts().unwrap();
        assert_eq!(contracts.len(), EXAMPLE_CONTRACTS.len());
    }
}
