//! Opening a store from its URL (`sqlite://PATH` or `postgres://…`) for the operators'
//! commands: the shared opener, audit entries unsigned.

use std::sync::Arc;

use idemgate_core::audit::Sealer;
use idemgate_core::store::Store;

pub async fn open(url: &str) -> anyhow::Result<Arc<dyn Store>> {
    Ok(idemgate_app::open_store(url, Sealer::unsigned()).await?)
}
