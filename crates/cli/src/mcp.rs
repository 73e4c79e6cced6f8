//! `idemgate mcp`: the contracts as MCP tools over stdio, for one local agent — its flags, and
//! the one application assembly put together from them.
//!
//! Without `--config`: the contracts `--contracts` names, each with its HTTP downstream and
//! authorization hook (or with `--fake-downstream` the in-process fakes), over the store
//! `--store` names (by default a file in the data directory). With `--config FILE` (the gateway's TOML configuration) the application's
//! loader reads the file and the MCP face its `[mcp]` section (`idemgate_mcp::assembly::
//! serve_config`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use idemgate_app::tools::BuildError;
use idemgate_app::{Assembly, HttpEffects, Recovery, ToolSet, contracts};
use idemgate_mcp::Options;
use idemgate_mcp::assembly::{self, Local};
use idemgate_mcp::fake::FakeDownstreams;

use crate::stores;

/// Flags of `idemgate mcp`.
#[derive(Debug, Clone, clap::Args)]
pub struct McpArgs {
    /// The gateway's configuration file (TOML, as for `idemgate serve --config`): the store,
    /// the environment, the contracts and `sandbox` come from it, and `--tenant` must be one
    /// of its tenants. Replaces `--store`, `--contracts` and `--environment`.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["store", "contracts", "environment"])]
    pub config: Option<PathBuf>,
    /// Operation store: `sqlite://PATH` or `postgres://…`. Default: one SQLite file per tenant
    /// and environment in the data directory (`$XDG_DATA_HOME/idemgate/mcp/`, else
    /// `~/.local/share/idemgate/mcp/`), the same whatever directory a host starts it in, so a
    /// restarted server finds its operations.
    #[arg(long, value_name = "URL", env = "IDEMGATE_STORE")]
    pub store: Option<String>,
    /// Contract files; a `*` in the last path segment is expanded here, so it works without a
    /// shell. Default: `contracts/*.yaml` where it runs, or the example contracts built into
    /// the binary when there are none there.
    #[arg(long, value_name = "GLOB", num_args = 1..)]
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

/// Where `idemgate mcp` reads contracts unless told: relative to where it runs.
const DEFAULT_CONTRACTS: &str = "contracts/*.yaml";

/// A tenant or environment name as part of a file name.
fn slug(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect()
}

/// A background interval: a duration (`2s`, `5m`) longer than zero.
pub fn interval(text: &str) -> Result<Duration, String> {
    let span = idemgate_core::duration::Span::parse(text).map_err(|e| e.to_string())?;
    if span.seconds() == 0 {
        return Err("must be longer than zero".into());
    }
    Ok(span.as_duration())
}

/// Runs `idemgate mcp` until the client closes stdin, or Ctrl-C / SIGTERM.
pub async fn run(args: McpArgs) -> anyhow::Result<()> {
    if let Some(config) = args.config {
        // The configuration file, read by the application's loader.
        assembly::serve_config(
            assembly::ConfigOptions {
                config,
                tenant: args.tenant,
                actor: args.actor,
                fake_downstream: args.fake_downstream,
                identity: args.identity,
            },
            crate::signals::shutdown(),
        )
        .await?;
        return Ok(());
    }
    let store = match &args.store {
        Some(url) => url.clone(),
        None => {
            let dir = stores::data_dir("mcp")?;
            format!(
                "sqlite://{}/{}-{}.sqlite",
                dir.display(),
                slug(&args.tenant),
                slug(&args.environment)
            )
        }
    };
    let store = stores::open(&store).await?;
    let contracts = if args.contracts.is_empty() {
        // Hosts start servers in a directory of their choosing: without contracts there, the
        // examples built into the binary, as `serve` does.
        let default = [DEFAULT_CONTRACTS.to_string()];
        match contracts::files(&default, Path::new("")) {
            Ok(files) if !files.is_empty() => contracts::load_files(&files)?,
            Ok(_) | Err(_) => {
                eprintln!(
                    "idemgate mcp: no {DEFAULT_CONTRACTS} here; using the embedded example contracts"
                );
                contracts::examples()?
            }
        }
    } else {
        contracts::load(&args.contracts, Path::new(""))?
    };
    let (tools, fakes) = if args.fake_downstream {
        let fakes = FakeDownstreams::for_contracts(&contracts);
        (ToolSet::build(contracts, &fakes), Some(fakes))
    } else {
        (ToolSet::build(contracts, &HttpEffects), None)
    };
    let tools = tools.map_err(|e| match e {
        BuildError::Downstream { tool, message } if fakes.is_none() => anyhow!(
            "the downstream of `{tool}` could not be built: {message} (run with \
             --fake-downstream to try the tools without one)"
        ),
        BuildError::Downstream { tool, message } => {
            anyhow!("the downstream of `{tool}` could not be built: {message}")
        }
        BuildError::Authorizer { message, .. } => anyhow!(message),
        BuildError::Duplicate(tool) => anyhow!("contract `{tool}` is loaded twice"),
        other => anyhow!(other),
    })?;
    let local = Local {
        tenant: args.tenant,
        environment: args.environment,
        actor: args.actor,
        identity: args.identity.unwrap_or_default(),
    };
    local.check()?;
    let app = Assembly::new(store, tools, local.environment.clone())
        .recovery(Recovery {
            every: args.recovery_interval,
            sweep_every: args.sweep_interval,
        })
        .build();
    tracing::info!(
        tools = app.tools().len(),
        tenant = local.tenant,
        environment = local.environment,
        fake_downstream = args.fake_downstream,
        "serving MCP over stdio"
    );
    let options = Options {
        fakes,
        identity: local.identity,
        ..Options::default()
    };
    assembly::serve_stdio(
        &app,
        Arc::new(app.clone()),
        local.caller(),
        options,
        crate::signals::shutdown(),
    )
    .await?;
    Ok(())
}
