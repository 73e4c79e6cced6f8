//! idemgate's HTTP gateway: API v1 over the executor.
//!
//! Reading order:
//!
//! - [`config::Config`] — the gateway's sections of the TOML configuration (listen address,
//!   public URL, limits, tenants' token hashes, webhook sources), read from the file whose
//!   layout and application part (`idemgate_app::config`) every face shares.
//! - [`auth::Tokens`] — bearer tokens by SHA-256, compared in constant time, each mapping to a
//!   tenant, a holder and a [`auth::Role`].
//! - [`state::Gateway`] builds the [`state::AppState`]: the one application assembly
//!   ([`idemgate_app::App`]: the tools, the executor over a metered store, the recoverer) and
//!   what only this face needs beside it. A [`state::Mount`] is another face's service served
//!   in the same router (`idemgate serve` mounts the MCP face at `/mcp`).
//! - [`api`] — the handlers; [`headers`] — `Idempotency-Key` and `Prefer: wait=N`.
//! - [`wire`] — **the one place** where outcomes and errors become status codes, headers and
//!   RFC 9457 problems; [`problems`] — one entry per error code, written once: the page each
//!   problem's `type` names (`/problems/{code}`) and `docs/errors.md`.
//! - [`openapi`] — the document's enums from the core's own lists and the answer headers,
//!   declared by one rule on every response that carries them.
//! - [`console`] — the operator console at `/console`: sessions, queues, an operation's page
//!   and the operator actions, server-rendered.
//! - [`router`] and [`run`] — the axum router with its generated OpenAPI 3.1 document, and the
//!   server loop, which takes its shutdown as a parameter.
//! - [`serve`] — `idemgate serve`: the configuration file → the application's assembly (its
//!   `idemgate_app::config` step) → the gateway, the mounted faces, the recoverer, signals.
//!
//! **Only this crate knows HTTP shapes**, and it knows no other face: every call goes through
//! the application ([`idemgate_app::App::invoke`]), every effect through the executor.

pub mod access;
pub mod api;
pub mod auth;
pub mod config;
pub mod console;
pub mod headers;
pub mod metrics;
pub mod openapi;
pub mod problems;
pub mod serve;
pub mod state;
pub mod webhooks;
pub mod wire;

use std::future::Future;

use axum::Router;
use axum::routing::get;
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use serve::{ServeOptions, serve};
pub use state::{AppState, Gateway, Mount};

/// The API's routes and the OpenAPI document generated from them.
fn api() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (routes, mut doc) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(api::list_tools))
        .routes(routes!(api::get_tool))
        .routes(routes!(api::invoke))
        .routes(routes!(api::list_operations))
        .routes(routes!(api::get_operation))
        .routes(routes!(api::reconcile))
        .routes(routes!(api::approve))
        .routes(routes!(api::deny))
        .routes(routes!(webhooks::receive))
        .routes(routes!(api::healthz))
        .routes(routes!(api::metrics))
        .routes(routes!(problems::index))
        .routes(routes!(problems::page))
        .split_for_parts();
    openapi::AnswerHeaders.modify(&mut doc);
    (routes, doc)
}

/// The OpenAPI 3.1 document of API v1.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api().1
}

/// The gateway's router: API v1, `/openapi.json`, `/problems` and `/console`. Problem types
/// start with the configured public URL, else they are relative (a router has no address of
/// its own).
pub fn router(state: AppState) -> Router {
    router_with(state, Vec::new())
}

/// [`router`] with other faces' services mounted beside API v1 ([`Mount`]).
pub fn router_with(state: AppState, mounts: Vec<Mount>) -> Router {
    let base = state
        .inner()
        .problem_base
        .clone()
        .unwrap_or_else(problems::ProblemBase::relative);
    app(state, base, mounts)
}

fn app(state: AppState, base: problems::ProblemBase, mounts: Vec<Mount>) -> Router {
    let body_limit = state.inner().limits.body_bytes;
    let (routes, doc) = api();
    let doc = std::sync::Arc::new(doc.to_json().unwrap_or_else(|_| "{}".into()));
    let mut router: Router = routes
        .route(
            "/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        doc.as_str().to_owned(),
                    )
                }
            }),
        )
        .merge(console::routes())
        .fallback(api::fallback)
        .method_not_allowed_fallback(api::method_not_allowed)
        .with_state(state);
    // A mounted face (the MCP endpoint, JSON-RPC rather than a REST resource) is not in the
    // OpenAPI document.
    for mount in mounts {
        router = router.nest_service(&mount.path, bounded(mount.service, body_limit));
    }
    // Every answer rendered inside a request knows the base of its problem types.
    let router = router.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let base = base.clone();
            wire::with_problem_base(base, next.run(request))
        },
    ));
    router.layer(axum::middleware::from_fn(access::layer))
}

/// A mounted service behind the same body bound as API v1: a declared length over the bound is
/// a 413 problem before the service sees the request, and a body without a declared length is
/// cut off at the bound while it is read. The problem names no operation: the service's request
/// was not read, so no key is known and nothing is claimed about one.
fn bounded(
    service: tower::util::BoxCloneSyncService<
        axum::http::Request<axum::body::Body>,
        axum::response::Response,
        std::convert::Infallible,
    >,
    limit: usize,
) -> impl tower::Service<
    axum::http::Request<axum::body::Body>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
+ Send
+ Sync
+ 'static {
    tower::service_fn(move |request: axum::http::Request<axum::body::Body>| {
        let service = service.clone();
        async move {
            let declared = request
                .headers()
                .get(axum::http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<usize>().ok());
            if declared.is_some_and(|n| n > limit) {
                let refusal = wire::ApiError::new(
                    idemgate_core::ErrorCode::InvalidArguments,
                    format!("the request body is larger than {limit} bytes"),
                )
                .with_status(axum::http::StatusCode::PAYLOAD_TOO_LARGE);
                return Ok(axum::response::IntoResponse::into_response(refusal));
            }
            let request = request
                .map(|body| axum::body::Body::new(http_body_util::Limited::new(body, limit)));
            tower::ServiceExt::oneshot(service, request).await
        }
    })
}

/// Serves `state` (and `mounts` beside API v1) on `listener` until `shutdown` completes, then
/// stops accepting and lets the requests in flight finish (a drain) before returning.
pub async fn run(
    listener: tokio::net::TcpListener,
    state: AppState,
    mounts: Vec<Mount>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Without a configured public URL, the address served on names the problem pages.
    let base = match &state.inner().problem_base {
        Some(base) => base.clone(),
        None => match listener.local_addr() {
            Ok(addr) => problems::ProblemBase::for_listener(addr),
            Err(_) => problems::ProblemBase::relative(),
        },
    };
    let drains: Vec<_> = mounts.iter().filter_map(|m| m.on_drain.clone()).collect();
    let router = app(state, base, mounts);
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown.await;
            // Open response streams of a mounted face would hold the drain open; end them.
            for drain in drains {
                drain();
            }
        })
        .await
}
