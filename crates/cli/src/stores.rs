//! Opening a store from its URL (`sqlite://PATH` or `postgres://…`) for the operators'
//! commands: the shared opener, audit entries unsigned.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, bail};

use idemgate_core::audit::Sealer;
use idemgate_core::store::Store;

pub async fn open(url: &str) -> anyhow::Result<Arc<dyn Store>> {
    Ok(idemgate_app::open_store(url, Sealer::unsigned()).await?)
}

/// `idemgate/<sub>` in the user's data directory (`$XDG_DATA_HOME`, else `~/.local/share`),
/// created: where a local face keeps its store when none is named, the same whatever directory
/// a host starts it in.
pub fn data_dir(sub: &str) -> anyhow::Result<PathBuf> {
    let data = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")));
    let Some(data) = data else {
        bail!("neither XDG_DATA_HOME nor HOME is set: name the store with --store");
    };
    let dir = data.join("idemgate").join(sub);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}
