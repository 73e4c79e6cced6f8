//! Opening a store from its URL: `sqlite://PATH` (the embedded default) or `postgres://…`.

use std::sync::Arc;

use anyhow::{Context, bail};
use idemgate_core::store::Store;

pub async fn open(url: &str) -> anyhow::Result<Arc<dyn Store>> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        if path.is_empty() {
            bail!("store URL `{url}` names no file; write sqlite://PATH");
        }
        let store = idemgate_store_sqlite::SqliteStore::open(path, Default::default())
            .with_context(|| format!("opening the SQLite store at {path}"))?;
        return Ok(Arc::new(store));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = idemgate_store_postgres::PgStore::connect(url, Default::default())
            .await
            .context("connecting to the PostgreSQL store")?;
        return Ok(Arc::new(store));
    }
    bail!("store URL `{url}` must start with sqlite:// or postgres://")
}
