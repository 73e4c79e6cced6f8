//! Sign-in, sign-out, and the guard of every other console request.
//!
//! An operator pastes a token once; the gateway answers with a session cookie (`HttpOnly`,
//! `SameSite=Strict`, `Path=/console`, an expiry, `Secure` when the gateway is reached over
//! https). Agent tokens are refused with a message that says so. Every POST carries the
//! session's CSRF token in a hidden field and must come from this origin (`Origin` and
//! `Sec-Fetch-Site`, when the browser sends them); a forged form changes nothing.

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{html, message};
use crate::auth::{Role, Session, SessionEnd};
use crate::state::AppState;

/// The session cookie's name.
pub const COOKIE: &str = "idemgate_console";

#[derive(askama::Template)]
#[template(path = "console/sign_in.html")]
struct SignIn {
    notice: Option<String>,
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct Ended {
    ended: Option<String>,
}

/// The value of the console's cookie, if the request carries exactly one.
fn cookie(headers: &HeaderMap) -> Option<String> {
    let mut found = None;
    for value in headers.get_all(header::COOKIE) {
        let Ok(text) = value.to_str() else { continue };
        for pair in text.split(';') {
            if let Some((name, value)) = pair.trim().split_once('=')
                && name == COOKIE
            {
                if found.is_some() {
                    return None;
                }
                found = Some(value.to_string());
            }
        }
    }
    found
}

/// The request's session, or why there is none.
pub(crate) fn session_of(state: &AppState, headers: &HeaderMap) -> Result<Session, SessionEnd> {
    let id = cookie(headers).ok_or(SessionEnd::Unknown)?;
    state.inner().sessions.find(&id, &state.tokens().current())
}

fn see_other(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, value);
    }
    r
}

/// The answer to a request without a usable session: to the sign-in page, saying why.
pub(crate) fn to_sign_in(end: SessionEnd) -> Response {
    let why = match end {
        SessionEnd::Unknown => "",
        SessionEnd::Expired => "?ended=expired",
        SessionEnd::Revoked => "?ended=revoked",
    };
    let mut r = see_other(&format!("/console/sign-in{why}"));
    // An expired session is gone from the server: its cookie is of no use, drop it. A revoked
    // one stays marked until it would have expired, and its cookie is kept, so that every page
    // the browser opens with it says why it ended — the queue page's script, whose counts
    // request found the session revoked, navigates on its own, and clearing the cookie then
    // left the operator's next page a bare sign-in without the reason.
    if end == SessionEnd::Expired {
        r.headers_mut()
            .insert(header::SET_COOKIE, HeaderValue::from_static(CLEARED));
    }
    r
}

const CLEARED: &str = "idemgate_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0";

fn session_cookie(id: &str, max_age: u64, secure: bool) -> String {
    format!(
        "{COOKIE}={id}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={max_age}{}",
        if secure { "; Secure" } else { "" }
    )
}

/// Whether a state-changing request comes from a page of this gateway. A browser names the
/// page's origin in `Origin` and how it relates to the target in `Sec-Fetch-Site`; when it
/// sends either, it must say this origin. A client that sends neither (not a browser) is held
/// to the CSRF token alone.
pub(crate) fn same_origin(headers: &HeaderMap, public: Option<&str>) -> Result<(), String> {
    for name in ["sec-fetch-site", "origin"] {
        if headers.get_all(name).iter().count() > 1 {
            return Err(format!("The form arrived with more than one {name} header"));
        }
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("");
        if site != "same-origin" {
            return Err(format!(
                "The form was sent from another site (Sec-Fetch-Site: {site})"
            ));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let sent = crate::problems::normal_origin(origin);
        // Behind a proxy the request's Host is the proxy's upstream, not what the browser
        // showed: the configured public URL is then the gateway's origin. Without one, the
        // gateway is reached directly and its Host is what the browser addressed.
        let matches = match public {
            Some(public) => sent.as_deref() == Some(public),
            None => {
                let host = headers
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or("")
                    .to_ascii_lowercase();
                let named = sent.as_deref().and_then(|o| {
                    o.strip_prefix("http://")
                        .or_else(|| o.strip_prefix("https://"))
                });
                !host.is_empty()
                    && named.is_some_and(|n| {
                        n == host
                            || Some(n) == host.strip_suffix(":80")
                            || Some(n) == host.strip_suffix(":443")
                    })
            }
        };
        if !matches {
            let theirs = match public {
                Some(public) => format!("this gateway's public_url is {public}"),
                None => "not this gateway's Host".to_string(),
            };
            return Err(format!(
                "The form was sent from another origin ({origin}; {theirs})"
            ));
        }
    }
    Ok(())
}

/// The origin of the configured `public_url`, if any.
fn public_origin(state: &AppState) -> Option<String> {
    state
        .inner()
        .problem_base
        .as_ref()
        .and_then(|base| base.origin())
}

/// Compares two CSRF tokens without an early exit.
fn same_token(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The guard of every console POST but sign-in: an open session, this origin, and the
/// session's CSRF token in the form. The refusal is a page that says which failed.
#[allow(clippy::result_large_err)] // the refusal is the request's answer, made at most once
pub(crate) fn check_post(
    state: &AppState,
    headers: &HeaderMap,
    csrf: Option<&str>,
) -> Result<Session, Response> {
    if let Err(why) = same_origin(headers, public_origin(state).as_deref()) {
        return Err(forged(why));
    }
    let session = session_of(state, headers).map_err(to_sign_in)?;
    match csrf {
        Some(token) if same_token(token, &session.csrf) => Ok(session),
        Some(_) => Err(forged(
            "The form's CSRF token is not this session's (an old page, or a forged form)".into(),
        )),
        None => Err(forged("The form carries no CSRF token".into())),
    }
}

fn forged(why: String) -> Response {
    tracing::warn!(reason = %why, "console form refused");
    message(
        StatusCode::FORBIDDEN,
        "Form refused",
        format!("{why}. Nothing was changed. Reload the console and try again from its own pages."),
    )
}

/// `GET /console/sign-in`.
pub async fn sign_in_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(ended): Query<Ended>,
) -> Response {
    if session_of(&state, &headers).is_ok() {
        return see_other("/console");
    }
    let notice = match ended.ended.as_deref() {
        Some("expired") => Some(SessionEnd::Expired.message().to_string()),
        Some("revoked") => Some(SessionEnd::Revoked.message().to_string()),
        Some("signed_out") => Some("You are signed out.".to_string()),
        _ => None,
    };
    html(
        StatusCode::OK,
        &SignIn {
            notice,
            error: None,
        },
    )
}

#[derive(Debug, Deserialize)]
pub struct SignInForm {
    token: String,
}

fn refused(status: StatusCode, error: String) -> Response {
    html(
        status,
        &SignIn {
            notice: None,
            error: Some(error),
        },
    )
}

/// `POST /console/sign-in`: exchanges an operator token for a session.
pub async fn sign_in(
    State(state): State<AppState>,
    headers: HeaderMap,
    form: Result<Form<SignInForm>, FormRejection>,
) -> Response {
    if let Err(why) = same_origin(&headers, public_origin(&state).as_deref()) {
        return forged(why);
    }
    let Ok(Form(form)) = form else {
        return refused(
            StatusCode::BAD_REQUEST,
            "The sign-in form arrived without a token field.".into(),
        );
    };
    let token = form.token.trim();
    if token.is_empty() {
        return refused(StatusCode::BAD_REQUEST, "Paste a token to sign in.".into());
    }
    let Some(holder) = state.tokens().current().verify(token) else {
        return refused(
            StatusCode::UNAUTHORIZED,
            "This token is not accepted by this gateway (mistyped, revoked, or of another gateway).".into(),
        );
    };
    if holder.role != Role::Operator {
        return refused(
            StatusCode::FORBIDDEN,
            format!(
                "This is an agent token ({} of tenant {}). Agent tokens cannot sign in to the console; use an operator token.",
                holder.name, holder.tenant
            ),
        );
    }
    tracing::info!(tenant = %holder.tenant, actor = %holder.name, "console sign-in");
    let sessions = &state.inner().sessions;
    let (id, _) = sessions.open(token, holder);
    let mut r = see_other("/console");
    let cookie = session_cookie(&id, sessions.ttl().as_secs(), state.inner().secure_cookies);
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, value);
    }
    r
}

#[derive(Debug, Deserialize)]
pub struct CsrfOnly {
    csrf: Option<String>,
}

/// `POST /console/sign-out`.
pub async fn sign_out(
    State(state): State<AppState>,
    headers: HeaderMap,
    form: Result<Form<CsrfOnly>, FormRejection>,
) -> Response {
    let csrf = form.ok().and_then(|Form(f)| f.csrf);
    if let Err(refusal) = check_post(&state, &headers, csrf.as_deref()) {
        return refusal;
    }
    if let Some(id) = cookie(&headers) {
        state.inner().sessions.close(&id);
    }
    let mut r = see_other("/console/sign-in?ended=signed_out");
    r.headers_mut()
        .insert(header::SET_COOKIE, HeaderValue::from_static(CLEARED));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_checks() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:8080".parse().unwrap());
        assert!(
            same_origin(&h, None).is_ok(),
            "no browser headers: the token decides"
        );
        h.insert(header::ORIGIN, "http://127.0.0.1:8080".parse().unwrap());
        h.insert("sec-fetch-site", "same-origin".parse().unwrap());
        assert!(same_origin(&h, None).is_ok());
        h.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(same_origin(&h, None).is_err());
        h.insert(header::ORIGIN, "null".parse().unwrap());
        assert!(same_origin(&h, None).is_err());
        h.remove(header::ORIGIN);
        h.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert!(same_origin(&h, None).is_err());
    }

    /// Regression (issue 31): behind a proxy the Host is the proxy's upstream; with a
    /// configured public URL the browser's Origin is held to it instead.
    #[test]
    fn origin_behind_a_proxy_is_the_public_url() {
        let public = crate::problems::ProblemBase::parse("https://Gateway.Example:443/idemgate/")
            .unwrap()
            .origin()
            .unwrap();
        assert_eq!(public, "https://gateway.example");
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "10.0.0.7:8080".parse().unwrap());
        h.insert("sec-fetch-site", "same-origin".parse().unwrap());
        h.insert(header::ORIGIN, "https://gateway.example".parse().unwrap());
        assert!(same_origin(&h, Some(&public)).is_ok());
        assert!(
            same_origin(&h, None).is_err(),
            "by Host it is another origin"
        );
        for other in [
            "http://gateway.example",
            "https://gateway.example:8443",
            "https://evil.example",
            "http://10.0.0.7:8080",
            "null",
        ] {
            h.insert(header::ORIGIN, other.parse().unwrap());
            let refused = same_origin(&h, Some(&public)).unwrap_err();
            assert!(
                refused.contains("public_url is https://gateway.example"),
                "{other}: {refused}"
            );
        }
        // Without Origin and Sec-Fetch-Site (not a browser) the CSRF token decides, as before.
        assert!(same_origin(&HeaderMap::new(), Some(&public)).is_ok());
    }

    #[test]
    fn reads_one_cookie() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "a=1; idemgate_console=abc; b=2".parse().unwrap(),
        );
        assert_eq!(cookie(&h).as_deref(), Some("abc"));
        h.append(header::COOKIE, "idemgate_console=def".parse().unwrap());
        assert_eq!(cookie(&h), None, "two session cookies: neither is trusted");
    }
}
