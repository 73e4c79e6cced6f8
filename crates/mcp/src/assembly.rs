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

/// What `idemgate mcp --config FILE` is told: the configuration file, and the flags that still
/// apply to it.
#[derive(Debug, Clone)]
pub struct ConfigOptions {
    /// The configuration file (TOML, as for `idemgate serve --config`).
    pub config: std::path::PathBuf,
    /// One of the configuration's tenants.
    pub tenant: String,
    pub actor: String,
    /// Every downstream an in-process fake, read and scripted through the hidden control tool.
    pub fake_downstream: bool,
    /// Overrides the file's `[mcp] identity`.
    pub identity: Option<IdentityRule>,
}

/// Why `idemgate mcp --config` could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error(transparent)]
    Assembly(#[from] idemgate_app::config::AssemblyError),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Mcp(#[from] adapter::Error),
}

impl From<idemgate_app::config::Error> for ConfigError {
    fn from(e: idemgate_app::config::Error) -> ConfigError {
        ConfigError::Assembly(e.into())
    }
}

/// What `idemgate mcp --config` serves: the app the configuration assembles, the caller (the
/// configured tenant, `--actor`, role `agent`), the identity rule in effect, and with
/// `--fake-downstream` the fakes that replaced every downstream.
pub struct Configured {
    pub app: idemgate_app::App,
    pub caller: Caller,
    pub identity: IdentityRule,
    pub fakes: Option<crate::fake::FakeDownstreams>,
    pub file: idemgate_app::config::File,
}

/// Reads `--config` with the application's loader (and the `[mcp]` section with this face's)
/// and assembles the app, as `serve` does.
pub async fn from_config(args: &ConfigOptions) -> Result<Configured, ConfigError> {
    let file = idemgate_app::config::File::load(&args.config)?;
    let mcp = crate::config::McpConfig::read(&file)?;
    file.check_supported()?;
    let shown = args.config.display();
    let tenants = &file.config.tenants;
    if !tenants.contains(&args.tenant) {
        return Err(ConfigError::Usage(if tenants.is_empty() {
            format!("--tenant {:?}: {shown} declares no tenants", args.tenant)
        } else {
            format!(
                "--tenant {:?} is not a tenant of {shown}; its tenants: {}",
                args.tenant,
                tenants.join(", ")
            )
        }));
    }
    if args.actor.trim().is_empty() {
        return Err(ConfigError::Usage("--actor is empty".into()));
    }
    let contracts = file.contracts()?;
    let (tools, fakes) = if args.fake_downstream {
        // Every downstream becomes an in-process fake that counts its own effects, read and
        // scripted through the hidden control tool; no authorization hooks.
        let fakes = crate::fake::FakeDownstreams::for_contracts(&contracts);
        (idemgate_app::ToolSet::build(contracts, &fakes), Some(fakes))
    } else {
        (
            idemgate_app::ToolSet::build(contracts, file.effects().as_ref()),
            None,
        )
    };
    let tools = tools.map_err(|e| idemgate_app::config::AssemblyError::Contracts(e.to_string()))?;
    let identity = args.identity.unwrap_or(mcp.identity);
    let app = file.assembly(tools).await?.build();
    // A contract name that cannot become an MCP tool name is refused now.
    crate::tools::Catalog::with_identity(&app.tools().contracts(), identity).map_err(|e| {
        idemgate_app::config::AssemblyError::Contracts(format!("as MCP tools: {e}"))
    })?;
    let caller = Caller {
        tenant: args.tenant.clone(),
        actor: args.actor.clone(),
        role: "agent".into(),
    };
    Ok(Configured {
        app,
        caller,
        identity,
        fakes,
        file,
    })
}

/// Runs `idemgate mcp --config FILE` over stdio until the client closes stdin or `shutdown`
/// completes; the recoverer and the retention sweeper run meanwhile, as in `serve`.
pub async fn serve_config(
    args: ConfigOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ConfigError> {
    let Configured {
        app,
        caller,
        identity,
        fakes,
        file,
    } = from_config(&args).await?;
    tracing::info!(
        tools = app.tools().len(),
        tenant = caller.tenant,
        environment = file.config.environment,
        fake_downstream = fakes.is_some(),
        "serving MCP over stdio"
    );
    let options = Options {
        fakes,
        identity,
        ..Default::default()
    };
    serve_stdio(&app, Arc::new(app.clone()), caller, options, shutdown).await?;
    Ok(())
}
