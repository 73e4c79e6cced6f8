//! The MCP face on the gateway's own state: the loaded contracts as MCP tools, each call
//! through the same executor, store, downstreams and metrics as `POST /v1/tools/{tool}/invoke`.
//!
//! - [`service`] — the streamable-HTTP endpoint the router mounts at `/mcp`; every request is
//!   authenticated with the API's bearer tokens (tenant, holder as actor, role).
//! - [`stdio`] — `idemgate mcp --config FILE`: the gateway's configuration read by the
//!   gateway's loader, one configured tenant, served over stdin and stdout.
//!
//! One operation has two faces: a step called through `/mcp` and then through the HTTP API
//! (same tenant, workflow and step) is one operation key, replayed by the second face.

use std::path::PathBuf;
use std::sync::Arc;

use axum::http::request::Parts;
use idemgate_app::ToolSet;
use idemgate_core::contract::{Contract, Identity};
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Outcome};
use idemgate_core::record::{Millis, Record};
use idemgate_core::store::BoxFuture;
use idemgate_engine::Caller;
use idemgate_mcp::Gateway as McpGateway;
use idemgate_mcp::fake::FakeDownstreams;
use serde_json::Value;

use crate::auth::Tokens;
use crate::config::Config;
use crate::serve::{self, Error};
use crate::state::AppState;

/// The app's own MCP gateway ([`idemgate_app::App`]), with API v1's bounds on the operation's
/// parts and its listing by name.
impl McpGateway for AppState {
    fn tools(&self) -> Vec<Arc<Contract>> {
        let tools = AppState::tools(self);
        tools
            .names()
            .iter()
            .filter_map(|name| tools.get(name))
            .map(|tool| tool.contract)
            .collect()
    }

    fn invoke<'a>(
        &'a self,
        caller: Caller,
        tool: &'a str,
        workflow_id: Option<String>,
        step_id: Option<String>,
        arguments: Value,
    ) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            if AppState::tools(self).get(tool).is_some() {
                // The same bounds on the operation's parts as API v1.
                let max = self.inner().limits.key_part_bytes;
                for (name, part) in [("workflow_id", &workflow_id), ("step_id", &step_id)] {
                    if let Some(part) = part
                        && let Err(message) = crate::headers::check_part(name, part, max)
                    {
                        return Outcome::rejected(None, ErrorCode::InvalidOperationKey, message);
                    }
                }
            }
            self.app()
                .invoke(caller, tool, workflow_id, step_id, arguments)
                .await
        })
    }

    fn environment(&self) -> &str {
        AppState::environment(self)
    }

    fn record<'a>(
        &'a self,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Result<Option<Record>, idemgate_core::store::Error>> {
        self.executor().store().get(key)
    }

    fn now(&self) -> Millis {
        self.executor().clock().now()
    }

    fn status<'a>(
        &'a self,
        caller: &'a Caller,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Option<Outcome>> {
        // As `GET /v1/operations/{key}`: another tenant's or another environment's key is not
        // found, exactly as a missing one.
        Box::pin(self.app().status(caller, key))
    }
}

/// Authenticates an MCP request exactly as API v1 does: its bearer token gives the tenant,
/// the holder's name as actor, and the role. `None` (a 401) for a missing or unaccepted token.
pub fn authenticate(tokens: &Tokens, parts: &Parts) -> Option<Caller> {
    let principal = tokens.authenticate(&parts.headers).ok()?;
    Some(Caller {
        tenant: principal.tenant,
        actor: principal.name,
        role: principal.role.as_str().to_string(),
    })
}

/// The streamable-HTTP MCP service over `state`, with the gateway's tokens and its
/// configured `Host` allow-list. Fails when a contract name cannot become an MCP tool name.
pub fn service(
    state: &AppState,
) -> Result<idemgate_mcp::McpHttpService, idemgate_mcp::adapter::Error> {
    let tokens = state.inner().tokens.clone();
    idemgate_mcp::streamable_http_service_with(
        Arc::new(state.clone()),
        move |parts: &Parts| authenticate(&tokens.current(), parts),
        idemgate_mcp::HttpOptions {
            allowed_hosts: state.inner().mcp_hosts.clone(),
            options: idemgate_mcp::Options {
                identity: state.inner().mcp_identity,
                ..Default::default()
            },
            ..Default::default()
        },
    )
}

/// Checks that every loaded contract maps to a distinct MCP tool name.
pub fn check(state: &AppState) -> Result<(), String> {
    let contracts = McpGateway::tools(state);
    idemgate_mcp::tools::Catalog::with_identity(&contracts, state.inner().mcp_identity)
        .map(|_| ())
        .map_err(|e| format!("as MCP tools: {e}"))
}

/// Why `idemgate mcp --config` could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StdioError {
    #[error(transparent)]
    Gateway(#[from] Error),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Mcp(#[from] idemgate_mcp::adapter::Error),
}

/// What `idemgate mcp --config` is told: the file, and the flags that still apply to it.
#[derive(Debug, Clone)]
pub struct StdioOptions {
    /// The gateway's configuration file (TOML, as for `idemgate serve --config`).
    pub config: PathBuf,
    /// One of the configuration's tenants.
    pub tenant: String,
    pub actor: String,
    /// Every downstream an in-process fake, read and scripted through the hidden control tool.
    pub fake_downstream: bool,
    /// Overrides the file's `[mcp] identity`.
    pub identity: Option<Identity>,
}

/// What `idemgate mcp --config` serves: the gateway's state from the configuration, the
/// caller (the configured tenant, `--actor`, role `agent`), and with `--fake-downstream` the
/// fakes that replaced every downstream.
pub struct Stdio {
    pub state: AppState,
    pub caller: Caller,
    pub fakes: Option<FakeDownstreams>,
    pub config: Config,
}

/// Reads `--config` with the gateway's loader and assembles the state, as `serve` does.
pub async fn stdio_gateway(args: &StdioOptions) -> Result<Stdio, StdioError> {
    let path = &args.config;
    let loaded = Config::load(path).map_err(Error::from)?;
    serve::check_supported(&loaded.config)?;
    let config = &loaded.config;
    let file = path.display();
    if !config.tenants.iter().any(|t| t.name == args.tenant) {
        let known: Vec<&str> = config.tenants.iter().map(|t| t.name.as_str()).collect();
        return Err(StdioError::Usage(if known.is_empty() {
            format!("--tenant {:?}: {file} declares no tenants", args.tenant)
        } else {
            format!(
                "--tenant {:?} is not a tenant of {file}; its tenants: {}",
                args.tenant,
                known.join(", ")
            )
        }));
    }
    if args.actor.trim().is_empty() {
        return Err(StdioError::Usage("--actor is empty".into()));
    }
    let contracts = serve::contracts(&loaded)?;
    let (tools, fakes) = if args.fake_downstream {
        // Every downstream becomes an in-process fake that counts its own effects, read and
        // scripted through the hidden control tool; no authorization hooks.
        let fakes = FakeDownstreams::for_contracts(&contracts);
        (ToolSet::build(contracts, &fakes), Some(fakes))
    } else {
        (
            ToolSet::build(contracts, serve::effects(config).as_ref()),
            None,
        )
    };
    let tools = tools.map_err(|e| Error::Contracts(e.to_string()))?;
    // A local agent holds no token: the tenant is the configuration's, by name.
    let state = serve::assemble(config, tools, Tokens::default()).await?;
    check(&state).map_err(Error::Contracts)?;
    let caller = Caller {
        tenant: args.tenant.clone(),
        actor: args.actor.clone(),
        role: "agent".into(),
    };
    Ok(Stdio {
        state,
        caller,
        fakes,
        config: loaded.config,
    })
}

/// Runs `idemgate mcp --config FILE` over stdio until the client closes stdin, or Ctrl-C /
/// SIGTERM; the recoverer and the retention sweeper run meanwhile, as in `serve`.
pub async fn stdio(args: StdioOptions) -> Result<(), StdioError> {
    let Stdio {
        state,
        caller,
        fakes,
        config,
    } = stdio_gateway(&args).await?;
    tracing::info!(
        tools = AppState::tools(&state).len(),
        tenant = caller.tenant,
        environment = config.environment,
        fake_downstream = fakes.is_some(),
        "serving MCP over stdio"
    );
    let app = state.app().clone();
    let served = idemgate_mcp::assembly::serve_stdio(
        &app,
        Arc::new(state),
        caller,
        idemgate_mcp::Options {
            fakes,
            identity: args.identity.unwrap_or(config.mcp.identity),
            ..Default::default()
        },
        serve::shutdown_signal(),
    )
    .await;
    Ok(served?)
}
