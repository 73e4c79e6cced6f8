//! The local faces over stdio, on the one application assembly ([`idemgate_app::App`]):
//! `idemgate mcp` (contracts with HTTP or fake downstreams, with or without `--config`) and
//! `idemgate wrap` (a child MCP server's tools) differ only in where the tools and effects come
//! from and who the one local caller is ([`Local`]); [`serve_stdio`] serves any of them with
//! the app's recoverer running meanwhile.

use std::future::Future;
use std::sync::Arc;

use idemgate_core::key::OperationKey;
use idemgate_engine::Caller;

use crate::adapter::{self, Options};
use crate::gateway::Gateway;

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

/// Why the local caller cannot be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("--tenant, --environment and --actor: {0}")]
    Identity(String),
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

/// Serves `gateway` (the app, or a face's state over it) to `caller` over this process's
/// stdin and stdout until the client closes stdin or `shutdown` completes, with the app's
/// recoverer driving abandoned claims, jobs and expiries meanwhile (not only retries); stops
/// the recoverer before it returns.
pub async fn serve_stdio(
    app: &idemgate_app::App,
    gateway: Arc<dyn Gateway>,
    caller: Caller,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), adapter::Error> {
    let recovering = app.start_recoverer();
    let result = adapter::serve_stdio(gateway, caller, options, shutdown).await;
    recovering.stop().await;
    result
}
