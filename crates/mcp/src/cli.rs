//! `idemgate mcp`: the contracts as MCP tools over stdio, for one local agent.
//!
//! The binary opens the store from `--store` and calls [`run`]; everything else — loading
//! contracts and building their downstreams — is here; the executor, the recoverer and the
//! stdio server are put together by [`crate::assembly`], which `idemgate wrap` shares.
//! With `--config FILE` (the gateway's TOML configuration) the binary hands the flags to
//! `idemgate_server::mcp::stdio` instead, which reads the file with the gateway's own loader.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use idemgate_core::contract::{Contract, LoadError};
use idemgate_core::effect::Authorizer;
use idemgate_core::store::Store;
use idemgate_downstream_http::{AuthorizerByTool, HttpDownstream};

use crate::adapter::{self, Options};
use crate::assembly::{self, Assembly, Local, Recovery, Tool};
use crate::fake::FakeDownstreams;
use crate::gateway::{self, Gateway};

/// Flags of `idemgate mcp`.
#[derive(Debug, Clone, clap::Args)]
pub struct McpArgs {
    /// The gateway's configuration file (TOML, as for `idemgate serve --config`): the store,
    /// the environment, the contracts and `sandbox` come from it, and `--tenant` must be one
    /// of its tenants. Replaces `--store`, `--contracts` and `--environment`.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["store", "contracts", "environment"])]
    pub config: Option<PathBuf>,
    /// Operation store: `sqlite://PATH` or `postgres://…`.
    #[arg(
        long,
        value_name = "URL",
        default_value = "sqlite://idemgate.sqlite",
        env = "IDEMGATE_STORE"
    )]
    pub store: String,
    /// Contract files; a `*` in the last path segment is expanded here, so the default works
    /// without a shell.
    #[arg(long, value_name = "GLOB", num_args = 1.., default_value = "contracts/*.yaml")]
    pub contracts: Vec<String>,
    /// The tenant every operation of this local agent belongs to (with `--config`, one of the
    /// configuration's tenants).
    #[arg(long, default_value = "local", env = "IDEMGATE_TENANT")]
    pub tenant: String,
    /// The environment part of every operation key.
    #[arg(long, default_value = "development", env = "IDEMGATE_ENVIRONMENT")]
    pub environment: String,
    /// Who is recorded as the actor of each operation.
    #[arg(long, default_value = "mcp-stdio", env = "IDEMGATE_ACTOR")]
    pub actor: String,
    /// Send every effect to an in-process fake system of record (per contract, deduplicating
    /// and offering lookups as the contract declares), for demos and tests. Also serves the
    /// hidden `idemgate_fake_downstream` tool that reads and scripts the fakes.
    #[arg(long)]
    pub fake_downstream: bool,
    /// How a call without `_meta` is named: `meta` (default: a key-based call without it is
    /// rejected) or `session_window[:DURATION]` (for hosts that cannot send `_meta`: the same
    /// call within the window — default 10m — is one operation; `repeat_of` asks for another).
    /// With `--config`, overrides its `[mcp] identity`.
    #[arg(long, value_name = "RULE", env = "IDEMGATE_IDENTITY")]
    pub identity: Option<idemgate_core::contract::Identity>,
    /// How often the recoverer looks for due records (`2s`, `1m`). With `--config`, the
    /// file's `[recovery] interval_seconds` applies instead.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = interval)]
    pub recovery_interval: Duration,
    /// How often settled records are compacted and purged (`5m`). With `--config`, the
    /// file's `[recovery] sweep_interval_seconds` applies instead.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = interval)]
    pub sweep_interval: Duration,
}

/// A background interval: a duration (`2s`, `5m`) longer than zero.
pub fn interval(text: &str) -> Result<Duration, String> {
    let span = idemgate_core::duration::Span::parse(text).map_err(|e| e.to_string())?;
    if span.seconds() == 0 {
        return Err("must be longer than zero".into());
    }
    Ok(span.as_duration())
}

/// Why `idemgate mcp` could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{pattern}: {message}")]
    Glob { pattern: String, message: String },
    #[error("no contract files match {0:?}")]
    NoContracts(Vec<String>),
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Contract(#[from] LoadError),
    #[error(transparent)]
    Assembly(#[from] assembly::Error),
    #[error("{0}")]
    Downstream(String),
    #[error(transparent)]
    Gateway(#[from] gateway::Error),
    #[error(transparent)]
    Serve(#[from] adapter::Error),
    #[error("--config is read by the idemgate binary (idemgate_server::mcp::stdio), not here")]
    Config,
}

/// Loads every contract the patterns name.
pub fn load_contracts(patterns: &[String]) -> Result<Vec<Arc<Contract>>, Error> {
    let mut files = Vec::new();
    for pattern in patterns {
        let found =
            idemgate_app::contracts::expand(pattern, Path::new("")).map_err(|e| Error::Glob {
                pattern: e.pattern,
                message: e.message,
            })?;
        files.extend(found);
    }
    if files.is_empty() {
        return Err(Error::NoContracts(patterns.to_vec()));
    }
    let mut contracts = Vec::new();
    for file in files {
        let name = file.display().to_string();
        let text = std::fs::read_to_string(&file).map_err(|source| Error::Read {
            path: name.clone(),
            source,
        })?;
        contracts.push(Arc::new(Contract::load(&text, &name)?));
    }
    Ok(contracts)
}

impl McpArgs {
    fn local(&self) -> Local {
        Local {
            tenant: self.tenant.clone(),
            environment: self.environment.clone(),
            actor: self.actor.clone(),
            identity: self.identity.unwrap_or_default(),
        }
    }
}

/// The tools with their effects, the authorization hooks (`None`: allow all), and the fakes
/// when `--fake-downstream` built them.
pub type Effects = (
    Vec<Tool>,
    Option<Arc<dyn Authorizer>>,
    Option<FakeDownstreams>,
);

/// The tools of `idemgate mcp` and their effects: each contract's HTTP downstream and its
/// authorization hooks, or with `--fake-downstream` the in-process fakes (hooks included).
pub fn tools(args: &McpArgs, contracts: &[Arc<Contract>]) -> Result<Effects, Error> {
    if args.fake_downstream {
        let fakes = FakeDownstreams::for_contracts(contracts);
        let mut tools = Vec::new();
        for contract in contracts {
            let downstream =
                fakes
                    .downstream(&contract.name)
                    .ok_or_else(|| gateway::Error::Downstream {
                        tool: contract.name.clone(),
                        message: "no fake downstream".into(),
                    })?;
            tools.push(Tool {
                contract: contract.clone(),
                downstream,
            });
        }
        return Ok((tools, None, Some(fakes)));
    }
    let hooks = AuthorizerByTool::from_contracts(contracts.iter().map(|c| c.as_ref()))
        .map_err(|e| Error::Downstream(e.to_string()))?;
    let mut tools = Vec::new();
    for contract in contracts {
        let downstream =
            HttpDownstream::from_contract(contract).map_err(|e| gateway::Error::Downstream {
                tool: contract.name.clone(),
                message: format!("{e} (run with --fake-downstream to try the tools without one)"),
            })?;
        tools.push(Tool {
            contract: contract.clone(),
            downstream: Arc::new(downstream),
        });
    }
    Ok((tools, Some(Arc::new(hooks)), None))
}

/// Builds the assembly for `args` over `store`. With `--fake-downstream`, returns the fakes
/// too.
pub fn assemble(
    args: &McpArgs,
    store: Arc<dyn Store>,
    contracts: Vec<Arc<Contract>>,
) -> Result<(Assembly, Option<FakeDownstreams>), Error> {
    let (tools, authorizer, fakes) = tools(args, &contracts)?;
    let recovery = Recovery {
        every: args.recovery_interval,
        sweep_every: args.sweep_interval,
    };
    let assembly = Assembly::new(args.local(), store, authorizer, tools, recovery)?;
    Ok((assembly, fakes))
}

/// Runs `idemgate mcp` until the client closes stdin, or Ctrl-C / SIGTERM.
/// Serves the tools over stdio until the client closes the stream or `shutdown` completes (the
/// binary passes Ctrl-C and SIGTERM).
pub async fn run(
    args: McpArgs,
    store: Arc<dyn Store>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    if args.config.is_some() {
        return Err(Error::Config);
    }
    let contracts = load_contracts(&args.contracts)?;
    let (assembly, fakes) = assemble(&args, store, contracts)?;
    tracing::info!(
        tools = assembly.gateway().tools().len(),
        tenant = args.tenant,
        environment = args.environment,
        fake_downstream = args.fake_downstream,
        "serving MCP over stdio"
    );
    let options = Options {
        fakes,
        identity: args.identity.unwrap_or_default(),
        ..Options::default()
    };
    Ok(assembly.serve_stdio(options, shutdown).await?)
}
