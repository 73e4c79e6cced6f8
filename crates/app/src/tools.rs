//! The one tool registry: each loaded contract with the downstream that performs its effect
//! and the authorization hook that rechecks it.
//!
//! [`ToolSet`] is everything the executor asks about a tool: it resolves a tool for the
//! recoverer ([`Tools`]) and it is the executor's [`Authorizer`], routing each request to the
//! hook of the tool it names. Where a tool's effect and hook come from is an [`Effects`]
//! factory — [`HttpEffects`] (the contract's `downstream.http` and `authorization_hook`),
//! [`SandboxEffects`] (the in-process sandbox), a test's fake — or, for `idemgate wrap`, the
//! tools are built one by one ([`ToolSet::from_tools`], [`ToolSet::serve`]).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use idemgate_core::contract::Contract;
use idemgate_core::effect::{AuthRequest, Authorization, Authorizer, Downstream};
use idemgate_core::store::BoxFuture;
use idemgate_engine::Tools;
use idemgate_sandbox::{Jobs, Sandbox};

/// Makes a tool's downstream and its authorization hook from its contract.
pub trait Effects: Send + Sync {
    /// The downstream that performs this tool's effect.
    fn downstream(&self, contract: &Contract) -> Result<Arc<dyn Downstream>, String>;
    /// The contract's authorization hook; `None` when it declares none (then every call is
    /// allowed, as far as the hook goes).
    fn authorizer(&self, contract: &Contract) -> Result<Option<Arc<dyn Authorizer>>, String>;
}

/// A function from a contract to its downstream is an [`Effects`] without hooks (a demo's or
/// a test's fakes).
impl<F> Effects for F
where
    F: Fn(&Contract) -> Result<Arc<dyn Downstream>, String> + Send + Sync,
{
    fn downstream(&self, contract: &Contract) -> Result<Arc<dyn Downstream>, String> {
        self(contract)
    }
    fn authorizer(&self, _contract: &Contract) -> Result<Option<Arc<dyn Authorizer>>, String> {
        Ok(None)
    }
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

/// `serve`'s sandbox (`sandbox = true`): every tool's downstream is its own [`Sandbox`]
/// (bounded, in memory; jobs finish by their first poll), with no authorization hooks.
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

/// One tool, ready to run.
#[derive(Clone)]
pub struct Tool {
    pub contract: Arc<Contract>,
    pub downstream: Arc<dyn Downstream>,
    /// `None`: the contract names no hook, and every call is allowed without asking.
    pub authorizer: Option<Arc<dyn Authorizer>>,
}

/// Why a [`ToolSet`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    #[error("tool {tool}: {message}")]
    Downstream { tool: String, message: String },
    #[error("tool {tool}: {message}")]
    Authorizer { tool: String, message: String },
    #[error("two contracts declare the tool {0}")]
    Duplicate(String),
}

/// Every loaded tool by name, and the order they are served in.
///
/// Tools are only ever added or replaced ([`ToolSet::serve`], for a wrapped child whose list
/// changes), never taken away: records of a tool that left still resolve for status reads and
/// recovery. The lock is held only to copy a tool out, never across an await.
#[derive(Default)]
pub struct ToolSet {
    served: RwLock<Served>,
}

#[derive(Clone, Default)]
struct Served {
    /// Contract names in the order they were first served.
    order: Vec<String>,
    tools: BTreeMap<String, Tool>,
}

impl ToolSet {
    /// Builds the tools of `contracts` through `effects`, served in name order (as API v1
    /// lists them, so every face lists one set alike). Two contracts with one name, or a tool
    /// whose effect cannot be built, is an error naming the tool.
    pub fn build(contracts: Vec<Contract>, effects: &dyn Effects) -> Result<ToolSet, BuildError> {
        let mut tools = Vec::with_capacity(contracts.len());
        for contract in contracts {
            let tool = contract.name.clone();
            let downstream =
                effects
                    .downstream(&contract)
                    .map_err(|message| BuildError::Downstream {
                        tool: tool.clone(),
                        message,
                    })?;
            let authorizer = effects
                .authorizer(&contract)
                .map_err(|message| BuildError::Authorizer { tool, message })?;
            tools.push(Tool {
                contract: Arc::new(contract),
                downstream,
                authorizer,
            });
        }
        // Stable: two contracts of one name stay in their order, for `from_tools` to refuse.
        tools.sort_by(|a, b| a.contract.name.cmp(&b.contract.name));
        ToolSet::from_tools(tools)
    }

    /// The tools as they are, served in the order given; two with one name is an error.
    pub fn from_tools(tools: Vec<Tool>) -> Result<ToolSet, BuildError> {
        let mut served = Served::default();
        for tool in tools {
            let name = tool.contract.name.clone();
            if served.tools.insert(name.clone(), tool).is_some() {
                return Err(BuildError::Duplicate(name));
            }
            served.order.push(name);
        }
        Ok(ToolSet {
            served: RwLock::new(served),
        })
    }

    fn read(&self) -> RwLockReadGuard<'_, Served> {
        self.served.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves `tool` from now on, in place of a tool of the same name (listed at its old
    /// place) or after the others.
    pub fn serve(&self, tool: Tool) {
        let mut served = self.served.write().unwrap_or_else(|e| e.into_inner());
        let name = tool.contract.name.clone();
        if served.tools.insert(name.clone(), tool).is_none() {
            served.order.push(name);
        }
    }

    pub fn get(&self, name: &str) -> Option<Tool> {
        self.read().tools.get(name).cloned()
    }

    /// The tool names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.read().tools.keys().cloned().collect()
    }

    /// The contracts in the order they are served.
    pub fn contracts(&self) -> Vec<Arc<Contract>> {
        let served = self.read();
        served
            .order
            .iter()
            .filter_map(|name| served.tools.get(name))
            .map(|tool| tool.contract.clone())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.read().tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.read().tools.is_empty()
    }

    /// Wraps every downstream (for timing, or to put a test's fake in its place).
    pub fn map_downstreams(
        self,
        f: impl Fn(&str, Arc<dyn Downstream>) -> Arc<dyn Downstream>,
    ) -> ToolSet {
        let mut served = self.served.into_inner().unwrap_or_else(|e| e.into_inner());
        for (name, tool) in served.tools.iter_mut() {
            tool.downstream = f(name, tool.downstream.clone());
        }
        ToolSet {
            served: RwLock::new(served),
        }
    }
}

impl Clone for ToolSet {
    fn clone(&self) -> ToolSet {
        ToolSet {
            served: RwLock::new(self.read().clone()),
        }
    }
}

impl Tools for ToolSet {
    fn resolve(&self, tool: &str) -> Option<(Arc<Contract>, Arc<dyn Downstream>)> {
        self.read()
            .tools
            .get(tool)
            .map(|t| (t.contract.clone(), t.downstream.clone()))
    }
}

/// The executor's one authorizer: each request goes to the hook of the tool it names. A tool
/// without a hook is allowed without asking; a tool that is not loaded is denied (fail
/// closed).
impl Authorizer for ToolSet {
    fn authorize<'a>(&'a self, request: AuthRequest<'a>) -> BoxFuture<'a, Authorization> {
        let hook = match self.read().tools.get(request.tool) {
            Some(tool) => tool.authorizer.clone(),
            None => {
                return Box::pin(std::future::ready(Authorization::Denied(
                    "the tool is not loaded".into(),
                )));
            }
        };
        match hook {
            Some(hook) => Box::pin(async move { hook.authorize(request).await }),
            None => Box::pin(std::future::ready(Authorization::Allowed)),
        }
    }

    /// A loaded tool without a hook is allowed without asking; anything else may be refused.
    fn asks(&self, tool: &str) -> bool {
        !matches!(
            self.read().tools.get(tool),
            Some(Tool {
                authorizer: None,
                ..
            })
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_core::effect::AuthStage;
    use idemgate_core::fingerprint::Fingerprint;

    /// A hook that denies everything, to tell it apart from the registry's own answers.
    struct DenyAll;

    impl Authorizer for DenyAll {
        fn authorize<'a>(&'a self, _: AuthRequest<'a>) -> BoxFuture<'a, Authorization> {
            Box::pin(std::future::ready(Authorization::Denied("hook".into())))
        }
    }

    fn tools() -> ToolSet {
        let contracts = crate::contracts::examples().unwrap();
        let hooked = contracts[0].name.clone();
        ToolSet::build(contracts, &SandboxEffects)
            .unwrap()
            .with_hook(&hooked, Arc::new(DenyAll))
    }

    impl ToolSet {
        fn with_hook(self, name: &str, hook: Arc<dyn Authorizer>) -> ToolSet {
            let mut tool = self.get(name).unwrap();
            tool.authorizer = Some(hook);
            self.serve(tool);
            self
        }
    }

    fn ask(tools: &ToolSet, tool: &str) -> Authorization {
        let fingerprint = Fingerprint::parse(&format!("sha256:{}", "0".repeat(64))).unwrap();
        let request = AuthRequest {
            tenant: "t",
            actor: "a",
            role: "agent",
            tool,
            key: None,
            fingerprint: &fingerprint,
            stage: AuthStage::BeforeEffect,
        };
        ready(tools.authorize(request))
    }

    /// Polls a future that is ready at once (every answer here is).
    fn ready(mut f: BoxFuture<'_, Authorization>) -> Authorization {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(a) => a,
            std::task::Poll::Pending => panic!("not ready"),
        }
    }

    #[test]
    fn authorization_goes_to_the_named_tools_hook_and_fails_closed_for_others() {
        let tools = tools();
        let hooked = "tickets.create";
        assert!(matches!(ask(&tools, hooked), Authorization::Denied(m) if m == "hook"));
        assert!(tools.asks(hooked));
        assert!(matches!(ask(&tools, "tickets.get"), Authorization::Allowed));
        assert!(!tools.asks("tickets.get"));
        assert!(
            matches!(ask(&tools, "nope"), Authorization::Denied(m) if m == "the tool is not loaded")
        );
        assert!(tools.asks("nope"));
    }

    #[test]
    fn a_served_tool_replaces_its_namesake_in_place_and_new_ones_come_last() {
        let mut contracts = crate::contracts::examples().unwrap();
        let last = contracts.remove(0);
        let tools = ToolSet::build(contracts, &SandboxEffects).unwrap();
        let before: Vec<String> = tools.contracts().iter().map(|c| c.name.clone()).collect();
        let mut again = tools.get(&before[0]).unwrap();
        again.authorizer = Some(Arc::new(DenyAll));
        tools.serve(again);
        let extra = ToolSet::build(vec![last], &SandboxEffects).unwrap();
        let extra_name = extra.names().remove(0);
        tools.serve(extra.get(&extra_name).unwrap());
        let after: Vec<String> = tools.contracts().iter().map(|c| c.name.clone()).collect();
        assert_eq!(after[..before.len()], before[..]);
        assert_eq!(after.last(), Some(&extra_name));
        assert!(tools.asks(&before[0]));
        let twice = vec![
            tools.get(&before[0]).unwrap(),
            tools.get(&before[0]).unwrap(),
        ];
        assert!(matches!(
            ToolSet::from_tools(twice),
            Err(BuildError::Duplicate(name)) if name == before[0]
        ));
    }
}
