//! `idemgate migrate --store URL`: applies the store's schema migrations and reports the
//! version, without starting a gateway — for a deployment step that runs before the gateways
//! roll, or to check which version a database is at. Running it twice is a no-op that reports
//! the same version.
//!
//! The migrations are the stores' own (embedded `.sql` files, applied in order in transactions;
//! PostgreSQL's under an advisory lock, so gateways starting at the same moment wait for it).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail};
use idemgate_app::redact;

#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    /// sqlite://PATH (created when missing) or postgres://USER@HOST/DATABASE.
    #[arg(long, env = "IDEMGATE_STORE", value_name = "URL")]
    store: String,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
}

/// The versions before and after.
struct Report {
    from: i64,
    to: i64,
}

pub async fn run(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let url = args.store.trim();
    let shown = redact(url);
    let report = if let Some(path) = url.strip_prefix("sqlite://") {
        if path.is_empty() {
            bail!("store URL `{shown}` names no file; write sqlite://PATH");
        }
        let path = path.to_string();
        // SQLite is synchronous: off the runtime's threads.
        let migrated = tokio::task::spawn_blocking(move || {
            idemgate_store_sqlite::migrate(&path, Default::default())
        })
        .await
        .map_err(|e| anyhow!("the migration stopped: {e}"))?
        .map_err(|e| anyhow!("migrating {shown}: {e}"))?;
        Report {
            from: migrated.from,
            to: migrated.to,
        }
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let options = idemgate_store_postgres::Options {
            pool_size: 1,
            batching: false,
            connect_timeout: Duration::from_secs(10),
            ..Default::default()
        };
        let migrated = idemgate_store_postgres::PgStore::migrate_url(url, options)
            .await
            .map_err(|e| anyhow!("migrating {shown}: {e}"))?;
        Report {
            from: migrated.from.into(),
            to: migrated.to.into(),
        }
    } else {
        bail!("store URL `{shown}` must start with sqlite:// or postgres://");
    };
    let applied = report.to - report.from;
    if args.json {
        let doc = serde_json::json!({
            "store": shown,
            "from_version": report.from,
            "schema_version": report.to,
            "applied": applied,
        });
        println!("{doc}");
    } else if applied == 0 {
        println!(
            "{shown}: schema version {}, already up to date (nothing applied)",
            report.to
        );
    } else {
        println!(
            "{shown}: schema version {} (applied {applied} migration{}: {} to {})",
            report.to,
            if applied == 1 { "" } else { "s" },
            report.from + 1,
            report.to
        );
    }
    Ok(ExitCode::SUCCESS)
}
