//! `/console`: the operator console, server-rendered (askama) with one small script.
//!
//! Reading order:
//!
//! - [`session`] — sign-in with an operator token (exchanged for an HttpOnly, SameSite=Strict
//!   cookie), sign-out, and the guard every other page passes: the session must be open and
//!   its token still an operator token of the current set; every POST carries the session's
//!   CSRF token and comes from this origin.
//! - [`queues`] — the tenant's queues in this environment: `unknown`, awaiting approval,
//!   pending past its lease, jobs in progress; filters, paging, and the live counts.
//! - [`operation`] — one operation: its timeline, receipt, the outcome a caller gets now, and
//!   the actions its state allows, each through the executor's operator methods.
//! - [`view`] — ages, UTC times, link encoding.
//!
//! Every value shown is escaped by askama; agent-supplied text (key parts, arguments, results,
//! reasons) is never marked safe.

pub mod operation;
pub mod queues;
pub mod session;
pub mod view;

use askama::Template;
use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::state::AppState;

/// The console's routes, mounted by the gateway's router.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/console", get(queues::page))
        .route(
            "/console/sign-in",
            get(session::sign_in_page).post(session::sign_in),
        )
        .route("/console/sign-out", axum::routing::post(session::sign_out))
        .route("/console/counts.json", get(queues::counts))
        .route(
            "/console/operations/{operation_key}",
            get(operation::page).post(operation::act),
        )
        .route("/console/assets/console.js", get(script))
        .route("/console/assets/console.css", get(stylesheet))
}

/// The console's one script: the live counts and nothing else.
const SCRIPT: &str = include_str!("../../templates/console/console.js");
const STYLESHEET: &str = include_str!("../../templates/console/console.css");

async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

async fn stylesheet() -> Response {
    asset(STYLESHEET, "text/css; charset=utf-8")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// Only the gateway's own script and stylesheet, no framing, forms only to this origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// A rendered page with the console's headers: never cached, never framed.
pub(crate) fn html(status: StatusCode, page: &impl Template) -> Response {
    let body = match page.render() {
        Ok(body) => body,
        Err(e) => {
            tracing::error!(error = %e, "a console page failed to render");
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the console page failed to render; see the gateway's log",
            )
                .into_response();
        }
    };
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: under it a browser sends `Origin: null` with the console's own forms,
    // and the origin check could no longer tell them from a sandboxed page's.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    r
}

/// A message page (a refused form, a store that is down), with a way back.
#[derive(Template)]
#[template(path = "console/message.html")]
pub(crate) struct Message {
    pub title: String,
    pub text: String,
    /// Where "back" leads.
    pub back: String,
    /// Set when signed in: the header shows who.
    pub who: Option<view::Who>,
    pub csrf: String,
}

pub(crate) fn message(status: StatusCode, title: &str, text: impl Into<String>) -> Response {
    html(
        status,
        &Message {
            title: title.into(),
            text: text.into(),
            back: "/console".into(),
            who: None,
            csrf: String::new(),
        },
    )
}
