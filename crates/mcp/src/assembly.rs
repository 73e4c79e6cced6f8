//! One assembly of a local face: store → tools and their effects → executor → recoverer →
//! the stdio server. `idemgate mcp` (contracts with HTTP or fake downstreams) and
//! `idemgate wrap` (a child MCP server's tools) differ only in where the tools and effects come
//! from; both are put together and run here.
//!
//! Not yet on it: `idemgate serve` (and `idemgate mcp --config`, which reads the gateway's
//! configuration), which build their state in `crates/server`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idemgate_core::clock::SystemClock;
use idemgate_core::contract::Contract;
use idemgate_core::effect::{AllowAll, Authorizer, Downstream};
use idemgate_core::key::OperationKey;
use idemgate_core::store::Store;
use idemgate_engine::{Caller, Executor, Recoverer, Settings};

use crate::adapter::{self, Options};
use crate::gateway::{self, LocalGateway};

/// How often the recoverer looks for due records, and how often it sweeps retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    pub every: Duration,
    pub sweep_every: Duration,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery {
            every: Duration::from_secs(2),
            sweep_every: Duration::from_secs(300),
        }
    }
}

/// One tool and the effect behind it.
#[derive(Clone)]
pub struct Tool {
    pub contract: Arc<Contract>,
    pub downstream: Arc<dyn Downstream>,
}

/// Who the one local caller is, and where its operations live.
#[derive(Debug, Clone)]
pub struct Local {
    pub tenant: String,
    pub environment: String,
    pub actor: String,
    /// Which rule names an operation whose call carries no `_meta` identity.
    pub identity: IdentityRule,
}

/// How the operation key of a call is found (DESIGN §6): `meta`, the agent runtime's
/// `_meta` only; or `session_window`, a key derived from the caller, the MCP session, the tool
/// and the request fingerprint within a window, for hosts that send no `_meta`. `_meta` always
/// wins. The rule is the core's, read as a contract reads it.
pub use idemgate_core::contract::Identity as IdentityRule;

/// Why the parts do not fit together.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("--tenant, --environment and --actor: {0}")]
    Identity(String),
    #[error(transparent)]
    Gateway(#[from] gateway::Error),
}

impl Local {
    /// The tenant, environment and actor end up in operation keys and records: checked now
    /// rather than by rejecting every call later.
    pub fn check(&self) -> Result<(), Error> {
        OperationKey::new(&self.tenant, &self.environment, "w", "s")
            .map_err(|e| Error::Identity(e.to_string()))?;
        if self.actor.trim().is_empty() {
            return Err(Error::Identity("the actor is empty".into()));
        }
        Ok(())
    }

    pub fn caller(&self) -> Caller {
        Caller {
            tenant: self.tenant.clone(),
            actor: self.actor.clone(),
            role: "agent".into(),
        }
    }
}

/// The parts, put together: an executor over one store serving one environment's tools.
pub struct Assembly {
    local: Local,
    gateway: Arc<LocalGateway>,
    recovery: Recovery,
}

impl Assembly {
    /// Builds the executor over `store` with `authorizer` (`None`: allow every call, for a
    /// local face with no hooks) and the gateway over `tools`, in listing order.
    pub fn new(
        local: Local,
        store: Arc<dyn Store>,
        authorizer: Option<Arc<dyn Authorizer>>,
        tools: Vec<Tool>,
        recovery: Recovery,
    ) -> Result<Assembly, Error> {
        local.check()?;
        let authorizer = authorizer.unwrap_or_else(|| Arc::new(AllowAll));
        let executor = Executor::new(
            store,
            Arc::new(SystemClock),
            authorizer,
            Settings::default(),
        );
        let contracts: Vec<Arc<Contract>> = tools.iter().map(|t| t.contract.clone()).collect();
        let gateway =
            LocalGateway::new(executor, local.environment.clone(), contracts, |contract| {
                tools
                    .iter()
                    .find(|t| t.contract.name == contract.name)
                    .map(|t| t.downstream.clone())
                    .ok_or_else(|| "no downstream".to_string())
            })?;
        Ok(Assembly {
            local,
            gateway: Arc::new(gateway),
            recovery,
        })
    }

    pub fn gateway(&self) -> &Arc<LocalGateway> {
        &self.gateway
    }

    pub fn local(&self) -> &Local {
        &self.local
    }

    /// Serves over this process's stdin and stdout until the client closes stdin or
    /// `shutdown` completes, with the recoverer driving abandoned claims, jobs and expiries
    /// meanwhile (not only retries); stops the recoverer before it returns.
    pub async fn serve_stdio(
        self,
        options: Options,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), adapter::Error> {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let recoverer = Recoverer::new(
            self.gateway.executor().clone(),
            self.gateway.clone(),
            self.local.environment.clone(),
        );
        let mut stop = stop_rx.clone();
        let recovering = tokio::spawn(recoverer.run(
            self.recovery.every,
            self.recovery.sweep_every,
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
        ));
        let result =
            adapter::serve_stdio(self.gateway.clone(), self.local.caller(), options, shutdown)
                .await;
        let _ = stop_tx.send(true);
        let _ = recovering.await;
        result
    }
}
