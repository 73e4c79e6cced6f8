//! A streamable-HTTP MCP server over the example contracts with fake downstreams: what the
//! Python integration test drives, and a small picture of how a gateway mounts
//! [`idemgate_mcp::streamable_http_service`] at `/mcp`.
//!
//! ```sh
//! cargo run -p idemgate-mcp --example mcp_http -- \
//!     --store /tmp/mcp.sqlite --token secret-a=acme --token secret-b=globex
//! ```
//!
//! Prints `LISTENING http://ADDR/mcp` once bound (port 0 picks a free port), then serves until
//! stdin closes or SIGTERM / Ctrl-C arrives. Loopback only unless `--bind` says otherwise.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use axum::Router;
use axum::http::header::AUTHORIZATION;
use clap::Parser;
use idemgate_app::{Assembly, ToolSet};
use idemgate_engine::Caller;
use idemgate_mcp::fake::FakeDownstreams;
use idemgate_mcp::{HttpOptions, Options};

#[derive(Debug, Parser)]
struct Args {
    /// SQLite file of the operation store.
    #[arg(long)]
    store: String,
    #[arg(long, num_args = 1.., default_value = "contracts/*.yaml")]
    contracts: Vec<String>,
    #[arg(long, default_value = "test")]
    environment: String,
    /// `TOKEN=TENANT`, repeatable: each bearer token and the tenant it stands for.
    #[arg(long = "token", required = true)]
    tokens: Vec<String>,
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: String,
    /// Accepted `Host` values; loopback names when not given.
    #[arg(long = "allowed-host")]
    allowed_hosts: Vec<String>,
    /// How a call without `_meta` is named: `meta` or `session_window[:DURATION]`.
    #[arg(long, default_value = "meta")]
    identity: idemgate_core::contract::Identity,
    /// Keep MCP sessions (`Mcp-Session-Id`): under `session_window` the session is then part
    /// of every derived key.
    #[arg(long)]
    sessions: bool,
    /// Answers a request without an `Authorization` header as this tenant, for test clients
    /// that cannot send headers (the MCP Inspector's CLI for Node 20). Loopback tests only.
    #[arg(long, value_name = "TENANT")]
    anonymous_tenant: Option<String>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let tokens: HashMap<String, String> = args
        .tokens
        .iter()
        .map(|t| match t.split_once('=') {
            Some((token, tenant)) => Ok((token.to_string(), tenant.to_string())),
            None => Err(format!("--token {t}: expected TOKEN=TENANT")),
        })
        .collect::<Result<_, _>>()?;

    let contracts = idemgate_app::contracts::load(&args.contracts, std::path::Path::new(""))?;
    let store = idemgate_store_sqlite::SqliteStore::open(&args.store, Default::default())?;
    let fakes = FakeDownstreams::for_contracts(&contracts);
    let tools = ToolSet::build(contracts, &fakes)?;
    let gateway = Assembly::new(Arc::new(store), tools, args.environment).build();

    // The gateway's token check would go here; this one is a plain map for the test.
    let anonymous = args.anonymous_tenant.clone();
    let auth = move |parts: &axum::http::request::Parts| -> Option<Caller> {
        let tenant = match parts.headers.get(AUTHORIZATION) {
            None => anonymous.as_ref()?,
            Some(value) => {
                let token = value.to_str().ok()?.strip_prefix("Bearer ")?;
                tokens.get(token)?
            }
        };
        Some(Caller {
            tenant: tenant.clone(),
            actor: format!("token-of-{tenant}"),
            role: "agent".into(),
        })
    };
    let mut options = HttpOptions {
        options: Options {
            fakes: Some(fakes),
            identity: args.identity,
            ..Default::default()
        },
        sessions: args.sessions,
        ..HttpOptions::default()
    };
    if !args.allowed_hosts.is_empty() {
        options.allowed_hosts = args.allowed_hosts;
    }
    let mcp = idemgate_mcp::streamable_http_service_with(Arc::new(gateway), auth, options)?;
    let app = Router::new().nest_service("/mcp", mcp.clone());

    let listener = tokio::net::TcpListener::bind(&args.bind).await?;
    println!("LISTENING http://{}/mcp", listener.local_addr()?);
    std::io::stdout().flush()?;

    let shutdown = async move {
        let stdin_closed = tokio::task::spawn_blocking(|| {
            let mut sink = String::new();
            while std::io::stdin()
                .read_line(&mut sink)
                .map(|n| n > 0)
                .unwrap_or(false)
            {
                sink.clear();
            }
        });
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = stdin_closed => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        // End open response streams, or the graceful shutdown would wait on them.
        mcp.shutdown();
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    // The stdin watcher may still be blocked in a read; the runtime would wait for it.
    std::process::exit(0)
}
