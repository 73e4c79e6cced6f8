//! The application assembly shared by every face of the `idemgate` binary and by the
//! conformance runner: what each of them would otherwise write for itself.
//!
//! - [`open_store`]: a store from its URL, `sqlite://PATH` (the embedded default) or
//!   `postgres://…` / `postgresql://…`, sealing audit entries with the given [`Sealer`].
//! - [`redact`]: a store URL without its password, for messages and logs.
//! - [`contracts::expand`]: contract file patterns (`contracts/*.yaml`) to files.

pub mod contracts;

use std::sync::Arc;

use idemgate_core::audit::Sealer;
use idemgate_core::store::Store;

/// A store URL that could not be opened; the URL is shown without its password.
#[derive(Debug, thiserror::Error)]
#[error("store {url}: {message}")]
pub struct OpenError {
    pub url: String,
    pub message: String,
}

/// Opens the store a URL names. `sqlite://` opens (and creates) the file, `postgres://`
/// connects a pool; anything else is an error naming the two schemes.
pub async fn open_store(url: &str, sealer: Sealer) -> Result<Arc<dyn Store>, OpenError> {
    let fail = |message: String| OpenError {
        url: redact(url),
        message,
    };
    if let Some(path) = url.strip_prefix("sqlite://") {
        if path.is_empty() {
            return Err(fail("names no file; write sqlite://PATH".into()));
        }
        let store = idemgate_store_sqlite::SqliteStore::open(path, Default::default())
            .map_err(|e| fail(e.to_string()))?
            .with_sealer(sealer);
        return Ok(Arc::new(store));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = idemgate_store_postgres::PgStore::connect(url, Default::default())
            .await
            .map_err(|e| fail(e.to_string()))?
            .with_sealer(sealer);
        return Ok(Arc::new(store));
    }
    Err(fail("must start with sqlite:// or postgres://".into()))
}

/// A store URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(redact("sqlite://a.db"), "sqlite://a.db");
    }
}
