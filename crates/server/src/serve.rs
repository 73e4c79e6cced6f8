//! `idemgate serve`: read the configuration (or take the development defaults), open the
//! store, load the contracts, start the recoverer and the retention sweeper, and serve until
//! Ctrl-C or SIGTERM — then stop accepting, finish the requests in flight, and stop the
//! background work. Nothing is released on the way out: a claim whose effect may have been
//! sent stays for recovery. SIGHUP reads the configuration file's tokens again (and only
//! them): a token removed from the file stops working, and its console sessions end.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use idemgate_app::contracts;
use idemgate_app::{Effects, GatewayStoreError, HttpEffects, Recovery, SandboxEffects, ToolSet};
use idemgate_core::contract::Contract;
use idemgate_engine::Settings;

use crate::auth::{Principal, Role, Tokens, generate_token};
use crate::config::{Config, Loaded};
use crate::state::{AppState, Gateway};

/// What `idemgate serve` is told (its flags, read by the binary).
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// The configuration file (TOML). Without one: SQLite in the working directory, the
    /// example contracts, the sandbox downstream and development tokens printed at start.
    pub config: Option<PathBuf>,
    /// Listen on this address instead of the configured one (port 0 picks a free port).
    pub listen: Option<SocketAddr>,
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Config(#[from] crate::config::Error),
    #[error("contracts: {0}")]
    Contracts(String),
    #[error("store {url}: {message}")]
    Store { url: String, message: String },
    #[error("listening on {addr}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("serving: {0}")]
    Serve(std::io::Error),
    #[error("{0}")]
    Unsupported(String),
}

/// A gateway store that could not be opened: a bad URL or store is `Store`, a bad audit or
/// encryption key `Unsupported`.
impl From<GatewayStoreError> for Error {
    fn from(e: GatewayStoreError) -> Error {
        match e {
            GatewayStoreError::Open(e) => Error::Store {
                url: e.url,
                message: e.message,
            },
            other => Error::Unsupported(other.to_string()),
        }
    }
}

pub use idemgate_app::redact;

/// Picks how tools perform their effects.
pub fn effects(config: &Config) -> Box<dyn Effects> {
    if config.sandbox {
        Box::new(SandboxEffects)
    } else {
        Box::new(HttpEffects)
    }
}

/// Ctrl-C or SIGTERM, whichever comes first.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// Reads the tokens of the configuration file at `path` again and makes them the gateway's
/// current set. A file that no longer reads (or checks) leaves the current set in place: a
/// typo must not lock every operator out. Returns how many tokens are now accepted.
pub fn reload_tokens(
    path: &std::path::Path,
    tokens: &crate::auth::TokenSet,
) -> Result<usize, Error> {
    let loaded = Config::load(path)?;
    let fresh = Tokens::from_config(&loaded.config.tenants);
    let count = fresh.len();
    tokens.replace(fresh);
    Ok(count)
}

/// Reloads the tokens from `path` on every SIGHUP, until the process ends.
#[cfg(unix)]
async fn reload_on_hangup(path: PathBuf, tokens: crate::auth::TokenSet) {
    let Ok(mut hangups) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
    else {
        eprintln!("idemgate: warning: SIGHUP cannot be caught; tokens reload only on restart");
        return;
    };
    while hangups.recv().await.is_some() {
        match reload_tokens(&path, &tokens) {
            Ok(count) => {
                tracing::info!(tokens = count, file = %path.display(), "tokens reloaded on SIGHUP");
                println!(
                    "idemgate: SIGHUP: {count} tokens reloaded from {}",
                    path.display()
                );
            }
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: the configuration did not reload; the tokens in use are kept");
                eprintln!("idemgate: SIGHUP: {e}; the tokens in use are kept");
            }
        }
    }
}

/// Checks settings that can only be judged at start: the encryption key must be readable, or
/// the gateway refuses to start rather than store results unencrypted.
pub fn check_supported(config: &Config) -> Result<(), Error> {
    if let Some(var) = &config.encryption_key_env {
        idemgate_app::encryption_key(var)?;
    }
    Ok(())
}

/// The contracts a configuration names, loaded and checked; in the development set-up
/// without contract files here, the embedded examples.
pub fn contracts(loaded: &Loaded) -> Result<Vec<Contract>, Error> {
    let config = &loaded.config;
    let files = contracts::files(&config.contracts, &loaded.base).map_err(|e| {
        Error::Contracts(format!("contract pattern `{}`: {}", e.pattern, e.message))
    })?;
    if files.is_empty() && loaded.development {
        eprintln!("idemgate: no contracts/*.yaml here; using the embedded example contracts");
        contracts::examples().map_err(|e| Error::Contracts(e.to_string()))
    } else if files.is_empty() {
        Err(Error::Contracts(format!(
            "no contract file matches {:?}",
            config.contracts
        )))
    } else {
        contracts::load_files(&files).map_err(|e| {
            Error::Contracts(match e {
                contracts::Error::Read { path, source } => {
                    format!("{path}: cannot be read: {source}")
                }
                other => other.to_string(),
            })
        })
    }
}

/// Opens the configured store and assembles the gateway over `tools` and `tokens`: what
/// `idemgate serve` and `idemgate mcp --config` share.
pub async fn assemble(config: &Config, tools: ToolSet, tokens: Tokens) -> Result<AppState, Error> {
    // Audit entries are signed with IDEMGATE_AUDIT_KEY (unsigned, with a warning, without it);
    // stored requests and results are sealed at rest when a key is configured.
    let store =
        idemgate_app::open_gateway_store(&config.store, config.encryption_key_env.as_deref())
            .await?;
    Ok(Gateway::new(store, tools, tokens)
        .environment(config.environment.clone())
        .limits(config.limits)
        .settings(Settings {
            settled_records: config.executor.settled_records,
            ..Settings::default()
        })
        .recovery(Recovery {
            every: Duration::from_secs(config.recovery.interval_seconds),
            sweep_every: Duration::from_secs(config.recovery.sweep_interval_seconds),
        })
        .mcp_allowed_hosts(config.mcp.hosts(config.listen))
        .mcp_identity(config.mcp.identity)
        .public_url(config.public_url())
        .webhooks(
            crate::webhooks::Sources::from_config(&config.webhooks).map_err(Error::Unsupported)?,
        )
        .secure_cookies(
            config
                .public_url
                .as_deref()
                .is_some_and(|url| url.to_ascii_lowercase().starts_with("https://")),
        )
        .build())
}

/// Runs `idemgate serve` until a shutdown signal, then drains.
pub async fn serve(args: ServeOptions) -> Result<(), Error> {
    let mut loaded = match &args.config {
        Some(path) => Config::load(path)?,
        None => Loaded {
            config: Config::development(),
            base: PathBuf::from("."),
            development: true,
        },
    };
    if let Some(addr) = args.listen {
        loaded.config.listen = addr;
    }
    check_supported(&loaded.config)?;

    let contracts = contracts(&loaded)?;
    let Loaded {
        config,
        development,
        ..
    } = loaded;
    let tools = ToolSet::build(contracts, effects(&config).as_ref())
        .map_err(|e| Error::Contracts(e.to_string()))?;

    let mut tokens = Tokens::from_config(&config.tenants);
    let mut dev_tokens = Vec::new();
    if development {
        for role in [Role::Agent, Role::Operator] {
            let token = generate_token();
            tokens.add(
                &token,
                Principal {
                    tenant: "dev".into(),
                    name: format!("dev-{role}"),
                    role,
                },
            );
            dev_tokens.push((role, token));
        }
    } else if tokens.is_empty() {
        eprintln!("idemgate: warning: no tenant has a token; every API request will be refused");
    }

    let state = assemble(&config, tools, tokens).await?;
    // The MCP face serves the same tools; a contract name it cannot map is refused now.
    crate::mcp::check(&state).map_err(Error::Contracts)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| Error::Listen {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(Error::Serve)?;

    println!("idemgate listening on http://{addr}");
    println!(
        "  environment {}, store {}, tools: {}",
        config.environment,
        redact(&config.store),
        state.tools().names().join(", ")
    );
    println!("  MCP (streamable HTTP, the same tokens): http://{addr}/mcp");
    if config.sandbox {
        println!("  effects go to the in-process sandbox: they are not real");
    }
    for (role, token) in &dev_tokens {
        println!("  development {role} token for tenant dev: {token}");
    }

    // The recoverer and the sweeper stop when the server has drained.
    let background = state.app().start_recoverer();
    #[cfg(unix)]
    let hangup = args
        .config
        .clone()
        .map(|path| tokio::spawn(reload_on_hangup(path, state.tokens().clone())));

    let served = crate::run(listener, state, async {
        shutdown_signal().await;
        println!("idemgate: shutting down; finishing requests in flight");
    })
    .await;
    background.stop().await;
    #[cfg(unix)]
    if let Some(hangup) = hangup {
        hangup.abort();
    }
    served.map_err(Error::Serve)
}
