//! `idemgate serve`'s flags; the gateway itself is `idemgate_server::serve`.

use std::net::SocketAddr;
use std::path::PathBuf;

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

/// Runs `idemgate serve` until a shutdown signal, then drains.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs { config, listen } = args;
    idemgate_server::serve(idemgate_server::ServeOptions { config, listen }).await?;
    Ok(())
}
