//! The one application assembly behind every face of the `idemgate` binary — `serve` (API v1
//! and MCP over HTTP), `idemgate mcp` (stdio, with or without `--config`), `idemgate wrap` —
//! and the conformance runner. Each face reads its own flags or file into plain values and
//! goes through the same steps, in this order:
//!
//! 1. [`contracts`] — patterns → files → checked contracts ([`contracts::load`]), or the
//!    embedded examples ([`contracts::examples`]).
//! 2. [`tools`] — the contracts and their effects: [`tools::ToolSet`], the one registry, built
//!    through an [`tools::Effects`] factory ([`tools::HttpEffects`], [`tools::SandboxEffects`],
//!    a fake); it is also the executor's authorizer, routing each request to its tool's hook.
//! 3. [`open_store`] / [`open_gateway_store`] — a store from its URL, `sqlite://PATH` (the
//!    embedded default) or `postgres://…` / `postgresql://…`; for a gateway, audit entries
//!    signed with the key in `IDEMGATE_AUDIT_KEY` and stored requests and results encrypted
//!    when a key is configured.
//! 4. [`Assembly`] → [`App`] — the executor over the store and the tools; the app starts its
//!    recoverer ([`App::start_recoverer`], intervals from [`Recovery`]) and answers the two
//!    calls every face makes, [`App::invoke`] and [`App::status`].
//! 5. [`operations`] — the operator's actions by key for a face that holds no tool of its own
//!    (the in-process packages): [`App::reconcile`], [`App::approve`], [`App::deny`], scoped
//!    by [`App::owns`] like every read; and the operator's answers over them, plain data that
//!    API v1 and `idemgate ops --store` both send: [`App::operation_view`],
//!    [`App::operation_list`], [`App::reconcile_request`], [`App::approve_request`],
//!    [`App::deny_request`], each refusal an [`OperatorError`].
//! 6. [`views`] — the read models in API v1's JSON shape: [`views::OutcomeView`] (the labelled
//!    answer of every face), [`views::OperationView`], [`views::OperationSummary`],
//!    [`views::OperationList`]. With the feature `openapi` they describe their schemas too
//!    ([`openapi`]), for the HTTP face's OpenAPI document.
//! 7. [`problems`] — a rejection as API v1 answers it, without HTTP types: each error code's
//!    status number and title, and the problem document ([`problems::Problem`]) that the
//!    server sends and `idemgate ops --store` prints alike.
//!
//! [`config`] is the configuration file every face reads — the application's part of it, the
//! faces' sections read from the same text by the faces, and [`config::File::assembly`], the
//! step from the file to steps 1–4.
//!
//! [`redact`] writes a store URL without its password, for messages and logs. This crate knows
//! no protocol: HTTP, MCP and flags are the faces'.

pub mod assembly;
pub mod config;
pub mod contracts;
pub mod in_process;
#[cfg(feature = "openapi")]
pub mod openapi;
pub mod operations;
pub mod problems;
pub mod tools;
pub mod views;

use std::sync::Arc;

use idemgate_core::audit::Sealer;
use idemgate_core::store::Store;
use idemgate_engine::sealed::SealedStore;

pub use assembly::{App, Assembly, Background, Recovery, check_part};
pub use operations::{ActError, OperatorError};
pub use tools::{Effects, HttpEffects, SandboxEffects, Tool, ToolSet};

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

/// Why a gateway's store could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayStoreError {
    /// `IDEMGATE_AUDIT_KEY` is set but is no key.
    #[error("{0}")]
    AuditKey(String),
    /// The encryption key variable does not hold a key.
    #[error("encryption_key_env = {var:?}: {message}")]
    EncryptionKey { var: String, message: String },
    #[error(transparent)]
    Open(#[from] OpenError),
}

/// The encryption key in the variable `var`, checked.
pub fn encryption_key(var: &str) -> Result<idemgate_engine::sealed::Sealer, GatewayStoreError> {
    idemgate_engine::sealed::Sealer::from_env(var).map_err(|e| GatewayStoreError::EncryptionKey {
        var: var.to_string(),
        message: e.to_string(),
    })
}

/// Opens a gateway's store (`serve`, `idemgate mcp --config`): audit entries signed with the
/// key in `IDEMGATE_AUDIT_KEY` (unsigned, with a warning, when it is not set; a malformed key
/// stops the start), and stored requests and results sealed at rest with the key in
/// `encryption_key_env` when one is configured.
pub async fn open_gateway_store(
    url: &str,
    encryption_key_env: Option<&str>,
) -> Result<Arc<dyn Store>, GatewayStoreError> {
    let audit = idemgate_audit::sealer_from_env()
        .map_err(|e| GatewayStoreError::AuditKey(e.to_string()))?;
    match audit.public_key() {
        Some(key) => tracing::info!(
            public_key = idemgate_core::audit::hex(&key),
            "audit log entries are signed"
        ),
        None => tracing::warn!(
            "{} is not set: audit log entries are chained but unsigned, and `idemgate audit \
             verify --public-key` will refuse them (see docs/operators.md, Audit log)",
            idemgate_audit::KEY_VAR
        ),
    }
    let store = open_store(url, audit).await?;
    Ok(match encryption_key_env {
        Some(var) => Arc::new(SealedStore::new(store, encryption_key(var)?)),
        None => store,
    })
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
