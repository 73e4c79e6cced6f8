//! `idemgate serve`'s flags, and the faces it serves together: the HTTP gateway
//! (`idemgate_server::serve`, API v1 and the console) with the MCP face mounted at `/mcp`, both
//! over the one application the configuration assembles.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use idemgate_mcp::config::McpConfig;
use idemgate_server::Mount;
use idemgate_server::serve::Serving;

/// Flags of `idemgate serve`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// The configuration file (TOML). Without one: SQLite in the working directory, the
    /// example contracts, the sandbox downstream and development tokens printed at start.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Listen on this address instead of the configured one (port 0 picks a free port).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
}

/// Runs `idemgate serve` until Ctrl-C or SIGTERM, then drains.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs { config, listen } = args;
    idemgate_server::serve(
        idemgate_server::ServeOptions { config, listen },
        mcp_face,
        crate::signals::shutdown(),
    )
    .await?;
    Ok(())
}

/// The MCP face over the gateway's app at `/mcp` (streamable HTTP): the `[mcp]` section's
/// host allow-list and identity rule, each request authenticated with the gateway's tokens.
pub fn mcp_face(serving: &Serving<'_>) -> Result<Vec<Mount>, String> {
    let config = McpConfig::read(serving.file).map_err(|e| e.to_string())?;
    let tokens = serving.state.tokens().clone();
    let service = idemgate_mcp::config::http_service(
        serving.state.app(),
        &config,
        serving.listen,
        move |parts: &axum::http::request::Parts| tokens.caller(&parts.headers),
    )
    .map_err(|e| format!("as MCP tools: {e}"))?;
    let drain = service.clone();
    Ok(vec![Mount {
        path: "/mcp".into(),
        service: tower::util::BoxCloneSyncService::new(service),
        title: "MCP (streamable HTTP, the same tokens)".into(),
        on_drain: Some(Arc::new(move || drain.shutdown())),
    }])
}
