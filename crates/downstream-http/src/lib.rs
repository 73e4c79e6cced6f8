//! The HTTP downstream effect of idemgate, and the HTTP authorization hook.
//!
//! Reading order:
//!
//! - [`HttpConfig`] — the contract's `downstream.http` section as written: method, URL template,
//!   idempotency header, JSON pointers to the reference and result, the receipt lookup, async
//!   jobs, timeouts, static headers. [`ConfigError`] names the tool and the field when it is
//!   wrong; every check happens when the contract is loaded.
//! - [`HttpDownstream`] — implements [`Downstream`]: sends the arguments as the JSON body with
//!   the operation key in the idempotency header (and a declared version precondition as
//!   `If-Match`), looks receipts up by key, polls jobs.
//! - `classify` — what an answer means, as pure functions tested as a table: only a connection
//!   never made (or 408/425/429) proves nothing was sent; only a 2xx carrying the downstream's
//!   own reference proves the effect; a 4xx is a refusal (409 ambiguous, 412 a failed
//!   precondition); everything else — 5xx, timeouts, resets, malformed bodies — is ambiguous and
//!   left to the executor's receipt lookup or deduplicated resend. Success is never inferred
//!   from a timeout.
//! - [`HttpAuthorizer`] — the contract's `security.authorization_hook`: asked before every
//!   effect and replay with the caller, tool, key and fingerprint (never the arguments);
//!   anything but a clear answer fails closed. The executor's one authorizer, routing to each
//!   contract's hook, is the application's tool registry (`idemgate_app::ToolSet`).
//! - [`client`] — the process's shared `reqwest::Client` over rustls with the ring provider.

mod authorizer;
mod classify;
mod config;
mod downstream;
mod template;
mod trace;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

pub use authorizer::HttpAuthorizer;
pub use config::{
    BodyMode, ConfigError, DEFAULT_CONNECT_TIMEOUT, DEFAULT_HOOK_TIMEOUT, DEFAULT_TOTAL_TIMEOUT,
    HookConfig, HttpConfig, JobConfig, LookupConfig, Timeout, TimeoutConfig,
};
pub use downstream::HttpDownstream;

/// Largest answer body read from a downstream or hook. Receipts are small; a larger body is
/// read as broken (ambiguous for an effect), never buffered without bound.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Installs rustls's ring provider as the process default, once. reqwest is built without a
/// provider of its own (`rustls-no-provider`): ring builds in seconds where aws-lc adds ~20 s.
/// Another part of the process may have installed one already; that one is kept.
pub fn install_crypto_provider() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _already_installed = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The process's shared HTTP client, with the default connect timeout. Cheap to clone (an
/// `Arc` inside): one connection pool per process.
pub fn client() -> reqwest::Client {
    shared_client(DEFAULT_CONNECT_TIMEOUT).expect("the default HTTP client builds")
}

/// A shared client per connect timeout: reqwest sets connect timeouts per client, not per
/// request, so contracts that agree on one share a pool.
pub(crate) fn shared_client(connect: Duration) -> Result<reqwest::Client, String> {
    static CLIENTS: OnceLock<Mutex<HashMap<Duration, reqwest::Client>>> = OnceLock::new();
    let clients = CLIENTS.get_or_init(Default::default);
    // A std mutex: held only to look up or insert, never across an await.
    let mut clients = clients.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = clients.get(&connect) {
        return Ok(c.clone());
    }
    let built = build_client(connect)?;
    clients.insert(connect, built.clone());
    Ok(built)
}

fn build_client(connect: Duration) -> Result<reqwest::Client, String> {
    install_crypto_provider();
    reqwest::Client::builder()
        .connect_timeout(connect)
        // A redirected POST may silently become a GET somewhere else; a 3xx is classified
        // instead of followed.
        .redirect(reqwest::redirect::Policy::none())
        // reqwest's default retry policy is kept on purpose: it resends only after an HTTP/2
        // protocol refusal (REFUSED_STREAM, a graceful GOAWAY), which the protocol defines as
        // "not processed". Every other resend is the executor's decision, under the same key.
        .tls_backend_rustls()
        .build()
        .map_err(|e| format!("the HTTP client could not be built: {e}"))
}
