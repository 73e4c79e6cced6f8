//! `idemgate serve`: read the configuration (or take the development defaults), assemble the
//! application from it (`idemgate_app::config`: contracts, effects, the store), put the
//! gateway and the other faces' mounted services over it, start the recoverer and the
//! retention sweeper, and serve until the shutdown the binary passes (Ctrl-C or SIGTERM) —
//! then stop accepting, finish the requests in flight, and stop the background work. Nothing
//! is released on the way out: a claim whose effect may have been sent stays for recovery.
//! SIGHUP reads the configuration file's tokens again (and only them): a token removed from
//! the file stops working, and its console sessions end.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;

use idemgate_app::config::{AssemblyError, File};

use crate::auth::{Principal, Role, Tokens, generate_token};
use crate::config::{Config, Loaded};
use crate::state::{AppState, Gateway, Mount};

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
    /// The configuration, the contracts, the store, or a face that could not be mounted.
    #[error(transparent)]
    App(#[from] AssemblyError),
    #[error("listening on {addr}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("serving: {0}")]
    Serve(std::io::Error),
}

impl From<crate::config::Error> for Error {
    fn from(e: crate::config::Error) -> Error {
        Error::App(e.into())
    }
}

pub use idemgate_app::redact;

/// What a face mounted into the gateway is built from: the gateway's state (its app and
/// tokens), the configuration file (the face reads its own section), and the address the
/// gateway listens on.
pub struct Serving<'a> {
    pub state: &'a AppState,
    pub file: &'a File,
    pub listen: SocketAddr,
}

/// Reads the tokens of the configuration file at `path` again and makes them the gateway's
/// current set. A file that no longer reads (or checks) leaves the current set in place: a
/// typo must not lock every operator out. Returns how many tokens are now accepted.
pub fn reload_tokens(
    path: &std::path::Path,
    tokens: &crate::auth::TokenSet,
) -> Result<usize, Error> {
    let loaded = Loaded::load(path)?;
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

/// Runs `idemgate serve` until `shutdown` completes, then drains. `faces` mounts other faces'
/// services beside API v1 (the binary mounts the MCP face at `/mcp`); a face that cannot be
/// built (a contract name it cannot map) stops the start, naming why.
pub async fn serve(
    args: ServeOptions,
    faces: impl FnOnce(&Serving<'_>) -> Result<Vec<Mount>, String>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let Loaded { file, mut config } = match &args.config {
        Some(path) => Loaded::load(path)?,
        None => Loaded::development(),
    };
    if let Some(addr) = args.listen {
        config.listen = addr;
    }
    file.check_supported()?;
    let tools = file.tools()?;

    let mut tokens = Tokens::from_config(&config.tenants);
    let mut dev_tokens = Vec::new();
    if file.development {
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

    let state = gateway(&file, &config, tools, tokens).await?;
    let mounts = faces(&Serving {
        state: &state,
        file: &file,
        listen: config.listen,
    })
    .map_err(AssemblyError::Contracts)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| Error::Listen {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(Error::Serve)?;

    let app = &file.config;
    println!("idemgate listening on http://{addr}");
    println!(
        "  environment {}, store {}, tools: {}",
        app.environment,
        redact(&app.store),
        state.tools().names().join(", ")
    );
    println!("  console (operators sign in with an operator token): http://{addr}/console");
    for mount in &mounts {
        println!("  {}: http://{addr}{}", mount.title, mount.path);
    }
    if app.sandbox {
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

    let served = crate::run(listener, state, mounts, async {
        shutdown.await;
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

/// The gateway over the application `file` assembles with `tools`, with `config`'s sections
/// of the HTTP face and `tokens`.
pub async fn gateway(
    file: &File,
    config: &Config,
    tools: idemgate_app::ToolSet,
    tokens: Tokens,
) -> Result<AppState, Error> {
    let webhooks = crate::webhooks::Sources::from_config(&config.webhooks)
        .map_err(AssemblyError::Unsupported)?;
    webhooks
        .check_tools(|name| tools.get(name).is_some())
        .map_err(AssemblyError::Unsupported)?;
    Ok(Gateway::over(file.assembly(tools).await?, tokens)
        .limits(config.limits)
        .public_url(config.public_url())
        .webhooks(webhooks)
        .secure_cookies(
            config
                .public_url
                .as_deref()
                .is_some_and(|url| url.to_ascii_lowercase().starts_with("https://")),
        )
        .build())
}
