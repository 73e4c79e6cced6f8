//! The operator console through the router (no socket): the session cookie's flags, agent
//! tokens refused at sign-in, forged forms refused, sessions ended by a token's removal, and
//! actions refused with a message (wrong state, stale page, missing reason, another tenant's
//! key) with nothing changed — each judged by the record and the fake downstream's own count.

mod common;

use std::sync::Arc;

use axum::Router;
use common::*;
use idemgate_conformance::downstream::Fault;
use idemgate_conformance::harness::EPOCH;
use idemgate_conformance::mem::MemStore;
use idemgate_core::clock::ManualClock;
use idemgate_core::key::OperationKey;
use idemgate_core::record::RecordStatus;
use idemgate_core::store::Store;
use idemgate_server::{AppState, Gateway};
use serde_json::json;

struct Env {
    app: Router,
    state: AppState,
    fakes: Fakes,
    store: Arc<MemStore>,
}

fn env_with(secure: bool) -> Env {
    let mut fakes = Fakes::new();
    let tools = fakes.tools();
    let store = Arc::new(MemStore::new());
    let state = Gateway::new(store.clone(), tools, tokens())
        .clock(Arc::new(ManualClock::new(EPOCH)))
        .environment(ENV)
        .secure_cookies(secure)
        .build();
    Env {
        app: idemgate_server::router(state.clone()),
        state,
        fakes,
        store,
    }
}

fn env() -> Env {
    env_with(false)
}

const HOST: &str = "gateway.test";

/// A browser's form post from the console's own pages.
fn form<'a>(path: impl Into<String>, body: &str) -> Call<'a> {
    sent_from(path, body, &format!("http://{HOST}"), "same-origin")
}

/// A browser's form post from a page of `origin`, which the browser judges `site`.
fn sent_from<'a>(path: impl Into<String>, body: &str, origin: &str, site: &str) -> Call<'a> {
    Call::post(path, "", body.as_bytes().to_vec())
        .anonymous()
        .header("content-type", "application/x-www-form-urlencoded")
        .header("host", HOST)
        .header("origin", origin.to_string())
        .header("sec-fetch-site", site.to_string())
}

fn get<'a>(path: impl Into<String>, cookie: &str) -> Call<'a> {
    Call::get(path, "")
        .anonymous()
        .header("host", HOST)
        .header("cookie", cookie.to_string())
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A signed-in operator: the cookie header to send, and the session's CSRF token (read from
/// the page's hidden field, as a browser would submit it).
struct Signed {
    cookie: String,
    csrf: String,
}

async fn sign_in(app: &Router, token: &str) -> Signed {
    let r = route(
        app,
        form("/console/sign-in", &format!("token={}", encode(token))),
    )
    .await;
    assert_eq!(r.status, 303, "{}", r.text);
    assert_eq!(r.header("location"), Some("/console"));
    let set = r
        .header("set-cookie")
        .expect("a session cookie")
        .to_string();
    let cookie = set.split(';').next().unwrap().to_string();
    let page = route(app, get("/console", &cookie)).await;
    assert_eq!(page.status, 200, "{}", page.text);
    let csrf = page
        .text
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the page carries the CSRF token")
        .to_string();
    Signed { cookie, csrf }
}

fn op_path(key: &str) -> String {
    format!("/console/operations/{key}")
}

/// An `unknown` notes.append operation (committed downstream, the answer lost).
async fn seed_unknown(e: &Env, workflow: &str) -> OperationKey {
    e.fakes
        .fake("notes.append")
        .push_fault(Fault::CommitThenDrop);
    let lost = route(
        &e.app,
        invoke(
            "notes.append",
            AGENT,
            json!({"workflow_id": workflow, "step_id": "s1", "arguments": {"text": "<script>alert(1)</script>"}}),
        ),
    )
    .await;
    assert_eq!(lost.outcome(), "unknown", "{}", lost.text);
    OperationKey::parse(&format!("acme:{ENV}:{workflow}:s1")).unwrap()
}

/// A tickets.create operation awaiting approval.
async fn seed_waiting(e: &Env, workflow: &str) -> OperationKey {
    let held = route(
        &e.app,
        invoke(
            "tickets.create",
            AGENT,
            json!({"workflow_id": workflow, "step_id": "s", "arguments": {"queue_id": "legal", "subject": "<script>alert(1)</script>", "body": "x"}}),
        ),
    )
    .await;
    assert_eq!(
        held.json["next_action"], "ask_for_approval",
        "{}",
        held.text
    );
    OperationKey::parse(&format!("acme:{ENV}:{workflow}:s")).unwrap()
}

async fn status_of(e: &Env, key: &OperationKey) -> RecordStatus {
    e.store.get(key).await.unwrap().unwrap().status()
}

async fn fence_of(e: &Env, key: &OperationKey) -> u64 {
    e.store.get(key).await.unwrap().unwrap().fence
}

#[tokio::test]
async fn sign_in_sets_a_strict_http_only_cookie_with_an_expiry() {
    let e = env();
    let r = route(
        &e.app,
        form("/console/sign-in", &format!("token={OPERATOR}")),
    )
    .await;
    assert_eq!(r.status, 303, "{}", r.text);
    let cookie = r.header("set-cookie").unwrap();
    for flag in [
        "HttpOnly",
        "SameSite=Strict",
        "Path=/console",
        "Max-Age=28800",
    ] {
        assert!(cookie.contains(flag), "{flag} in {cookie}");
    }
    assert!(!cookie.contains("Secure"), "plain http: {cookie}");

    let tls = env_with(true);
    let r = route(
        &tls.app,
        form("/console/sign-in", &format!("token={OPERATOR}")),
    )
    .await;
    assert!(r.header("set-cookie").unwrap().contains("; Secure"));

    // A browser without a session is sent to the sign-in page, not given a 401 body.
    let r = route(&e.app, get("/console", "")).await;
    assert_eq!(r.status, 303);
    assert_eq!(r.header("location"), Some("/console/sign-in"));
    let page = route(&e.app, get("/console/sign-in", "")).await;
    assert_eq!(page.status, 200);
    assert!(page.text.contains("name=\"token\""));
    assert!(
        page.header("content-security-policy")
            .unwrap()
            .contains("default-src 'none'")
    );
}

#[tokio::test]
async fn agent_and_unknown_tokens_cannot_sign_in() {
    let e = env();
    let r = route(&e.app, form("/console/sign-in", &format!("token={AGENT}"))).await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(r.text.contains("agent token"), "{}", r.text);
    assert!(r.header("set-cookie").is_none());
    let r = route(&e.app, form("/console/sign-in", "token=not-a-token")).await;
    assert_eq!(r.status, 401);
    assert!(r.header("set-cookie").is_none());
    let r = route(&e.app, form("/console/sign-in", "token=")).await;
    assert_eq!(r.status, 400);
    assert!(r.text.contains("Paste a token"));
    // A sign-in posted from another site is refused before the token is read.
    let r = route(
        &e.app,
        sent_from(
            "/console/sign-in",
            &format!("token={OPERATOR}"),
            "http://evil.example",
            "cross-site",
        ),
    )
    .await;
    assert_eq!(r.status, 403);
    assert!(r.header("set-cookie").is_none());
}

#[tokio::test]
async fn forged_forms_change_nothing() {
    let e = env();
    let key = seed_unknown(&e, "forged").await;
    let fence = fence_of(&e, &key).await;
    let me = sign_in(&e.app, OPERATOR).await;
    let body = |csrf: &str| {
        format!(
            "action=resolve_not_applied&confirm=yes&reason=forged&fence={fence}&status=unknown{csrf}"
        )
    };
    let attempts = [
        ("no CSRF token", form(op_path(key.as_str()), &body(""))),
        (
            "a wrong CSRF token",
            form(op_path(key.as_str()), &body("&csrf=idg_guessed")),
        ),
        (
            "a foreign Origin",
            sent_from(
                op_path(key.as_str()),
                &body(&format!("&csrf={}", me.csrf)),
                "http://evil.example",
                "same-origin",
            ),
        ),
        (
            "a cross-site fetch",
            sent_from(
                op_path(key.as_str()),
                &body(&format!("&csrf={}", me.csrf)),
                &format!("http://{HOST}"),
                "cross-site",
            ),
        ),
    ];
    for (what, call) in attempts {
        let r = route(&e.app, call.header("cookie", me.cookie.clone())).await;
        assert_eq!(r.status, 403, "{what}: {}", r.text);
        assert!(r.text.contains("Nothing was changed"), "{what}");
        assert_eq!(status_of(&e, &key).await, RecordStatus::Unknown, "{what}");
    }
    // The session's own token, from its own origin: the same form works, so the refusals above
    // were the checks, not a broken form.
    let r = route(
        &e.app,
        form(op_path(key.as_str()), &body(&format!("&csrf={}", me.csrf)))
            .header("cookie", me.cookie.clone()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(
        r.text.contains("Resolved not applied by acme-ops"),
        "{}",
        r.text
    );
    assert_ne!(status_of(&e, &key).await, RecordStatus::Unknown);
    assert_eq!(e.fakes.fake("notes.append").effects(), 1);
}

#[tokio::test]
async fn removing_a_token_ends_its_sessions() {
    let e = env();
    let key = seed_waiting(&e, "revoke").await;
    let me = sign_in(&e.app, OPERATOR).await;
    assert_eq!(route(&e.app, get("/console", &me.cookie)).await.status, 200);
    // The configuration loses acme's operator token (what SIGHUP's reload does).
    let mut fewer = idemgate_server::auth::Tokens::default();
    fewer.add(
        AGENT,
        idemgate_server::auth::Principal {
            tenant: "acme".into(),
            name: "acme-bot".into(),
            role: idemgate_server::auth::Role::Agent,
        },
    );
    e.state.tokens().replace(fewer);
    let r = route(&e.app, get("/console", &me.cookie)).await;
    assert_eq!(r.status, 303);
    assert_eq!(r.header("location"), Some("/console/sign-in?ended=revoked"));
    // The cookie is kept, so that the next page opened with it (the queue page's script
    // navigates on its own when its counts are refused) still says why the session ended.
    assert_eq!(r.header("set-cookie"), None);
    let again = route(&e.app, get("/console?queue=approval", &me.cookie)).await;
    assert_eq!(
        again.header("location"),
        Some("/console/sign-in?ended=revoked")
    );
    let r = route(
        &e.app,
        form(
            op_path(key.as_str()),
            &format!(
                "csrf={}&action=approve&reason=ok&fence=1&status=awaiting_approval",
                me.csrf
            ),
        )
        .header("cookie", me.cookie.clone()),
    )
    .await;
    assert_eq!(r.status, 303, "{}", r.text);
    assert_eq!(status_of(&e, &key).await, RecordStatus::AwaitingApproval);
    assert_eq!(e.fakes.fake("tickets.create").effects(), 0);
    let counts = route(&e.app, get("/console/counts.json", &me.cookie)).await;
    assert_eq!(counts.status, 401);
    // The API refuses the token too.
    let api = route(&e.app, Call::get("/v1/operations", OPERATOR)).await;
    assert_eq!(api.status, 401);
}

#[tokio::test]
async fn bad_actions_get_a_message_and_change_nothing() {
    let e = env();
    let unknown = seed_unknown(&e, "bad").await;
    let waiting = seed_waiting(&e, "bad-wait").await;
    let me = sign_in(&e.app, OPERATOR).await;
    let post = |key: &OperationKey, fields: &str| {
        form(op_path(key.as_str()), &format!("csrf={}&{fields}", me.csrf))
            .header("cookie", me.cookie.clone())
    };
    let cases = [
        (
            "approve an unknown operation",
            post(&unknown, "action=approve&reason=ok&fence=1&status=unknown"),
            409,
            "cannot be approved",
        ),
        (
            "a stale page",
            post(
                &waiting,
                "action=approve&reason=ok&fence=7&status=awaiting_approval",
            ),
            409,
            "page was out of date",
        ),
        (
            "a page from before a status change",
            post(&waiting, "action=approve&reason=ok&fence=1&status=unknown"),
            409,
            "page was out of date",
        ),
        (
            "a page of the key's earlier life (same attempt and status)",
            post(
                &waiting,
                "action=approve&reason=ok&fence=1&status=awaiting_approval&claimed_at=1",
            ),
            409,
            "claimed again since",
        ),
        (
            "no reason",
            post(
                &waiting,
                "action=approve&reason=+&fence=1&status=awaiting_approval",
            ),
            422,
            "Give a reason",
        ),
        (
            "resolve applied without a reference",
            post(
                &unknown,
                "action=resolve_applied&reason=seen&reference=&fence=1&status=unknown",
            ),
            422,
            "Give the effect",
        ),
        (
            "resolve applied with a result that is not JSON",
            post(
                &unknown,
                "action=resolve_applied&reason=seen&reference=n-1&result=%7Bnope&fence=1&status=unknown",
            ),
            422,
            "not valid JSON",
        ),
        (
            "look up where the contract has no lookup",
            post(&unknown, "action=lookup&fence=1&status=unknown"),
            409,
            "declares no receipt lookup",
        ),
        (
            "an action that does not exist",
            post(&unknown, "action=delete&reason=x&fence=1&status=unknown"),
            400,
            "There is no action",
        ),
    ];
    for (what, call, status, says) in cases {
        let r = route(&e.app, call).await;
        assert_eq!(r.status, status, "{what}: {}", r.text);
        assert!(r.text.contains(says), "{what}: {says:?} not in {}", r.text);
        assert_eq!(
            status_of(&e, &unknown).await,
            RecordStatus::Unknown,
            "{what}"
        );
        assert_eq!(
            status_of(&e, &waiting).await,
            RecordStatus::AwaitingApproval,
            "{what}"
        );
    }
    // `not_applied` stops at its confirmation step until confirmed.
    let r = route(
        &e.app,
        post(
            &unknown,
            "action=resolve_not_applied&reason=never+sent&fence=1&status=unknown",
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.text.contains("Confirm: the effect did not happen"));
    assert_eq!(status_of(&e, &unknown).await, RecordStatus::Unknown);

    // Another tenant's operator sees acme's key as missing, and changes nothing.
    let globex = sign_in(&e.app, OTHER).await;
    let r = route(
        &e.app,
        form(
            op_path(waiting.as_str()),
            &format!(
                "csrf={}&action=approve&reason=ok&fence=1&status=awaiting_approval",
                globex.csrf
            ),
        )
        .header("cookie", globex.cookie.clone()),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text);
    assert!(r.text.contains("No operation"));
    let r = route(&e.app, get(op_path(waiting.as_str()), &globex.cookie)).await;
    assert_eq!(r.status, 404);
    assert_eq!(
        status_of(&e, &waiting).await,
        RecordStatus::AwaitingApproval
    );
    assert_eq!(e.fakes.fake("tickets.create").effects(), 0);
    assert_eq!(e.fakes.fake("notes.append").effects(), 1);
}

#[tokio::test]
async fn approving_from_the_console_performs_one_effect() {
    let e = env();
    let key = seed_waiting(&e, "approve").await;
    let me = sign_in(&e.app, OPERATOR).await;
    let queue = route(&e.app, get("/console?queue=approval", &me.cookie)).await;
    assert!(queue.text.contains(key.as_str()), "{}", queue.text);
    let page = route(&e.app, get(op_path(key.as_str()), &me.cookie)).await;
    let fingerprint = e.store.get(&key).await.unwrap().unwrap().fingerprint;
    assert!(page.text.contains(fingerprint.as_str()));
    let body = format!(
        "csrf={}&action=approve&reason=legal+asked&fence=1&status=awaiting_approval&fingerprint={}",
        me.csrf,
        encode(fingerprint.as_str())
    );
    let r = route(
        &e.app,
        form(op_path(key.as_str()), &body).header("cookie", me.cookie.clone()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.text.contains("Approved by acme-ops"), "{}", r.text);
    // One answer to "what does a caller get now": the notice says what the panel says.
    let panel = between(&r.text, "id=\"outcome-label\">", "<");
    assert_eq!(panel, "replayed", "{}", r.text);
    let notice = between(&r.text, "id=\"notice\">", "</p>");
    assert!(
        notice.contains(&format!("A caller now gets: {panel}")),
        "the notice {notice:?} and the panel {panel:?} disagree"
    );
    // The reason is on the timeline.
    let timeline = between(&r.text, "id=\"timeline\">", "</ol>");
    assert!(timeline.contains("reason: legal asked"), "{timeline}");
    // The contract's owner and runbook, and the version kept on one line.
    assert!(
        r.text.contains("id=\"owner\">support-platform-oncall<"),
        "{}",
        r.text
    );
    assert!(
        r.text
            .contains("<a href=\"https://runbooks.example.com/tickets.create\""),
        "{}",
        r.text
    );
    assert!(
        r.text
            .contains("class=\"version\" id=\"tool-version\">version 2026-08-18<"),
        "{}",
        r.text
    );
    assert_eq!(status_of(&e, &key).await, RecordStatus::Applied);
    assert_eq!(e.fakes.fake("tickets.create").effects_for(&key), 1);
    // The same form again (a double click, a reload): the page is stale now; still one effect.
    let again = route(
        &e.app,
        form(op_path(key.as_str()), &body).header("cookie", me.cookie.clone()),
    )
    .await;
    assert_eq!(again.status, 409);
    assert_eq!(e.fakes.fake("tickets.create").effects_for(&key), 1);
}

#[tokio::test]
async fn agent_text_is_escaped_and_queues_count() {
    let e = env();
    let key = seed_unknown(&e, "escape").await;
    let waiting = seed_waiting(&e, "escape-wait").await;
    let me = sign_in(&e.app, OPERATOR).await;
    // The waiting operation's stored arguments hold markup from the agent.
    let page = route(&e.app, get(op_path(waiting.as_str()), &me.cookie)).await;
    assert_eq!(page.status, 200);
    assert!(!page.text.contains("<script>alert"), "{}", page.text);
    assert!(
        page.text
            .contains("&#60;script&#62;alert(1)&#60;/script&#62;"),
        "{}",
        page.text
    );
    let counts = route(&e.app, get("/console/counts.json", &me.cookie)).await;
    assert_eq!(counts.status, 200, "{}", counts.text);
    assert_eq!(counts.json["unknown"], 1);
    assert_eq!(counts.json["approval"], 1);
    assert_eq!(counts.json["overdue"], 0);
    assert_eq!(counts.json["jobs"], 0);
    let queue = route(
        &e.app,
        get("/console?queue=unknown&tool=notes.append", &me.cookie),
    )
    .await;
    assert!(queue.text.contains(key.as_str()));
    let other = route(
        &e.app,
        get("/console?queue=unknown&tool=tickets.create", &me.cookie),
    )
    .await;
    assert!(!other.text.contains(key.as_str()));
}

#[tokio::test]
async fn queues_of_claims_past_their_lease_and_of_jobs() {
    use idemgate_conformance::store_suite::{pending, record};
    use idemgate_core::record::{Dispatch, Lease, RecordState};
    let e = env();
    let job = RecordState::Pending {
        lease: Lease {
            owner: Some("w".into()),
            expires_at: EPOCH + 60_000,
        },
        dispatch: Dispatch::Job {
            job_id: "job-7".into(),
        },
    };
    let rows = [
        record(
            &format!("acme:{ENV}:stuck:s"),
            pending("w-gone", EPOCH - 5_000),
        ),
        record(
            &format!("acme:{ENV}:live:s"),
            pending("w-live", EPOCH + 30_000),
        ),
        record(&format!("acme:{ENV}:job:s"), job),
        record(
            &format!("globex:{ENV}:stuck:s"),
            pending("w-gone", EPOCH - 5_000),
        ),
        // The same tenant in another environment: not this gateway's to show.
        record("acme:elsewhere:stuck:s", pending("w-gone", EPOCH - 5_000)),
    ];
    for r in rows {
        e.store.claim(r, Vec::new()).await.unwrap();
    }
    let me = sign_in(&e.app, OPERATOR).await;
    let counts = route(&e.app, get("/console/counts.json", &me.cookie)).await;
    assert_eq!(counts.json["overdue"], 1, "{}", counts.text);
    assert_eq!(counts.json["jobs"], 1, "{}", counts.text);
    let overdue = route(&e.app, get("/console?queue=overdue", &me.cookie)).await;
    assert!(overdue.text.contains(&format!("acme:{ENV}:stuck:s")));
    assert!(overdue.text.contains("held by w-gone"), "{}", overdue.text);
    assert!(!overdue.text.contains(&format!("acme:{ENV}:live:s")));
    assert!(!overdue.text.contains("globex"));
    assert!(!overdue.text.contains("acme:elsewhere"), "{}", overdue.text);
    let jobs = route(&e.app, get("/console?queue=jobs", &me.cookie)).await;
    assert!(jobs.text.contains(&format!("acme:{ENV}:job:s")));
    assert!(!jobs.text.contains(&format!("acme:{ENV}:stuck:s")));
}

/// Regression (issue 31): the console's page of an operation showed its arguments and result
/// to an operator whom the authorization recheck refuses, while API v1 answers 403 for the
/// same read. Now the page shows the state but hides both, and says why.
#[tokio::test]
async fn an_operator_the_recheck_denies_sees_no_arguments_or_result() {
    let e = env();
    let applied = route(
        &e.app,
        invoke(
            "notes.append",
            AGENT,
            json!({"workflow_id": "hide", "step_id": "s1", "arguments": {"text": "applied note"}}),
        ),
    )
    .await;
    assert_eq!(applied.outcome(), "applied", "{}", applied.text);
    let applied = OperationKey::parse(&format!("acme:{ENV}:hide:s1")).unwrap();
    let unknown = seed_unknown(&e, "hide-unknown").await;
    assert_eq!(e.fakes.fake("notes.append").effects(), 2);
    let me = sign_in(&e.app, OPERATOR).await;

    // Allowed: the result of the applied one and the arguments of the unknown one are shown,
    // so their absence below is the recheck, not a page that never shows them.
    let page = route(&e.app, get(op_path(applied.as_str()), &me.cookie)).await;
    assert_eq!(page.status, 200, "{}", page.text);
    assert!(page.text.contains("ticket_id"), "{}", page.text);
    assert!(!page.text.contains("id=\"hidden\""));
    let page = route(&e.app, get(op_path(unknown.as_str()), &me.cookie)).await;
    assert!(page.text.contains("alert(1)"), "{}", page.text);
    assert!(!page.text.contains("id=\"hidden\""));

    e.fakes
        .hook
        .set(idemgate_core::effect::Authorization::Denied(
            "operator suspended".into(),
        ));
    for key in [&applied, &unknown] {
        let api = route(
            &e.app,
            Call::get(format!("/v1/operations/{}", key.as_str()), OPERATOR),
        )
        .await;
        assert_eq!(api.status, 403, "{}", api.text);
        let page = route(&e.app, get(op_path(key.as_str()), &me.cookie)).await;
        assert_eq!(page.status, 200, "{}", page.text);
        assert!(page.text.contains("id=\"hidden\""), "{}", page.text);
        assert!(page.text.contains("operator suspended"), "{}", page.text);
        assert!(!page.text.contains("ticket_id"), "{}", page.text);
        assert!(!page.text.contains("alert(1)"), "{}", page.text);
        assert!(!page.text.contains("applied note"), "{}", page.text);
    }
    // A hook that cannot answer hides them too (closed, as every other read).
    e.fakes
        .hook
        .set(idemgate_core::effect::Authorization::Unavailable(
            "hook down".into(),
        ));
    let page = route(&e.app, get(op_path(applied.as_str()), &me.cookie)).await;
    assert!(page.text.contains("id=\"hidden\""), "{}", page.text);
    assert!(!page.text.contains("ticket_id"), "{}", page.text);
    // Reading changed nothing and sent nothing.
    assert_eq!(e.fakes.fake("notes.append").effects(), 2);
    assert_eq!(status_of(&e, &applied).await, RecordStatus::Applied);
    assert_eq!(status_of(&e, &unknown).await, RecordStatus::Unknown);
}

/// Regression (issue 31): the same-origin check compared `Origin` with `Host`, so behind a
/// proxy (the browser at the public URL, the gateway at the proxy's upstream address) every
/// form was refused. With `public_url` configured, `Origin` is held to it; without, to `Host`.
#[tokio::test]
async fn the_same_origin_check_follows_the_public_url_when_set() {
    let behind = |public: Option<&str>| {
        let mut fakes = Fakes::new();
        let tools = fakes.tools();
        let state = Gateway::new(Arc::new(MemStore::new()), tools, tokens())
            .clock(Arc::new(ManualClock::new(EPOCH)))
            .environment(ENV)
            .public_url(public.map(|u| idemgate_server::problems::ProblemBase::parse(u).unwrap()))
            .build();
        idemgate_server::router(state)
    };
    let sign_in_from = |origin: &str, host: &str| {
        Call::post(
            "/console/sign-in",
            "",
            format!("token={}", encode(OPERATOR)).into_bytes(),
        )
        .anonymous()
        .header("content-type", "application/x-www-form-urlencoded")
        .header("host", host.to_string())
        .header("origin", origin.to_string())
        .header("sec-fetch-site", "same-origin")
    };
    let proxied = behind(Some("https://ops.example.com/idemgate"));
    // The browser at the public URL, the request's Host the proxy's upstream: accepted.
    let r = route(
        &proxied,
        sign_in_from("https://ops.example.com", "127.0.0.1:8080"),
    )
    .await;
    assert_eq!(r.status, 303, "{}", r.text);
    assert!(r.header("set-cookie").is_some());
    // An origin that matches the Host but not the public URL: refused, with no session.
    let r = route(
        &proxied,
        sign_in_from("http://127.0.0.1:8080", "127.0.0.1:8080"),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(
        r.text.contains("public_url is https://ops.example.com"),
        "{}",
        r.text
    );
    assert!(r.header("set-cookie").is_none());

    // No public URL: the Host decides.
    let direct = behind(None);
    let r = route(
        &direct,
        sign_in_from("http://127.0.0.1:8080", "127.0.0.1:8080"),
    )
    .await;
    assert_eq!(r.status, 303, "{}", r.text);
    let r = route(
        &direct,
        sign_in_from("https://ops.example.com", "127.0.0.1:8080"),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(r.header("set-cookie").is_none());
}

/// The text between `start` and the next `end`.
#[track_caller]
fn between<'t>(text: &'t str, start: &str, end: &str) -> &'t str {
    let from = text
        .find(start)
        .unwrap_or_else(|| panic!("{start:?} not in {text}"))
        + start.len();
    let len = text[from..].find(end).expect("the end");
    &text[from..from + len]
}

/// A second gateway over the same store that loads no tool: the console of `idemgate serve`
/// beside an in-process package that wrote the records.
fn without_tools(e: &Env) -> Router {
    let state = Gateway::new(e.store.clone(), idemgate_app::ToolSet::default(), tokens())
        .clock(Arc::new(ManualClock::new(EPOCH)))
        .environment(ENV)
        .build();
    idemgate_server::router(state)
}

#[tokio::test]
async fn a_record_of_a_tool_not_loaded_is_resolved_by_hand_in_the_console() {
    let e = env();
    let key = seed_unknown(&e, "by-hand").await;
    assert_eq!(e.fakes.fake("notes.append").effects(), 1);
    let console = without_tools(&e);
    let me = sign_in(&console, OPERATOR).await;

    // Listed in the reconciliation queue, and shown with the forms that apply without the tool.
    let queue = route(&console, get("/console", &me.cookie)).await;
    assert!(queue.text.contains(key.as_str()), "{}", queue.text);
    let page = route(&console, get(op_path(key.as_str()), &me.cookie)).await;
    assert_eq!(page.status, 200, "{}", page.text);
    assert!(
        page.text.contains("id=\"tool-not-loaded\""),
        "{}",
        page.text
    );
    assert!(page.text.contains("resolve-applied-form"), "{}", page.text);
    assert!(
        !page.text.contains("lookup-button"),
        "never looked up: {}",
        page.text
    );

    // A lookup posted anyway is refused, and changes nothing.
    let fence = fence_of(&e, &key).await;
    let post = |fields: String| {
        form(op_path(key.as_str()), &format!("csrf={}&{fields}", me.csrf))
            .header("cookie", me.cookie.clone())
    };
    let r = route(
        &console,
        post(format!("action=lookup&fence={fence}&status=unknown")),
    )
    .await;
    assert_eq!(r.status, 409, "{}", r.text);
    assert!(r.text.contains("resolved by hand"), "{}", r.text);
    assert_eq!(status_of(&e, &key).await, RecordStatus::Unknown);

    // Resolved applied by hand, with the reason on the timeline.
    let r = route(
        &console,
        post(format!(
            "action=resolve_applied&reference=note-1&result=%7B%7D&reason=found+in+the+notes&fence={fence}&status=unknown"
        )),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let notice = between(&r.text, "id=\"notice\">", "</p>");
    assert!(notice.contains("Resolved applied by acme-ops"), "{notice}");
    let panel = between(&r.text, "id=\"outcome-label\">", "<");
    assert_eq!(panel, "replayed");
    assert!(notice.contains("A caller now gets: replayed"), "{notice}");
    let timeline = between(&r.text, "id=\"timeline\">", "</ol>");
    assert!(
        timeline.contains("reason: found in the notes"),
        "{timeline}"
    );
    assert_eq!(status_of(&e, &key).await, RecordStatus::Applied);

    // The process with the tool replays it on its next delivery: still one effect.
    let again = route(
        &e.app,
        invoke(
            "notes.append",
            AGENT,
            json!({"workflow_id": "by-hand", "step_id": "s1", "arguments": {"text": "<script>alert(1)</script>"}}),
        ),
    )
    .await;
    assert_eq!(again.outcome(), "replayed", "{}", again.text);
    assert_eq!(again.json["effect_reference"], "note-1");
    assert_eq!(e.fakes.fake("notes.append").effects(), 1);
}

#[tokio::test]
async fn an_approval_of_a_tool_not_loaded_can_be_denied_but_not_approved_in_the_console() {
    let e = env();
    let key = seed_waiting(&e, "deny-by-hand").await;
    let console = without_tools(&e);
    let me = sign_in(&console, OPERATOR).await;
    let page = route(&console, get(op_path(key.as_str()), &me.cookie)).await;
    assert!(page.text.contains("deny-button"), "{}", page.text);
    assert!(!page.text.contains("approve-button"), "{}", page.text);
    let post = |action: &str| {
        form(
            op_path(key.as_str()),
            &format!(
                "csrf={}&action={action}&reason=not+ours&fence=1&status=awaiting_approval",
                me.csrf
            ),
        )
        .header("cookie", me.cookie.clone())
    };
    let r = route(&console, post("approve")).await;
    assert_eq!(r.status, 409, "{}", r.text);
    assert_eq!(status_of(&e, &key).await, RecordStatus::AwaitingApproval);
    let r = route(&console, post("deny")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(status_of(&e, &key).await, RecordStatus::FailedPermanent);
    let timeline = between(&r.text, "id=\"timeline\">", "</ol>");
    assert!(timeline.contains("reason: not ours"), "{timeline}");
    // The process with the tool replays the refusal; nothing ran.
    let again = route(
        &e.app,
        invoke(
            "tickets.create",
            AGENT,
            json!({"workflow_id": "deny-by-hand", "step_id": "s", "arguments": {"queue_id": "legal", "subject": "<script>alert(1)</script>", "body": "x"}}),
        ),
    )
    .await;
    assert_eq!(again.code(), "approval_denied", "{}", again.text);
    assert_eq!(e.fakes.fake("tickets.create").effects(), 0);
}
