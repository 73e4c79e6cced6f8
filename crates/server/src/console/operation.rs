//! One operation's page and the operator's actions on it.
//!
//! The page shows the record, its timeline (every event in order, with attempt and worker),
//! the receipt, the evidence, the outcome a caller gets now, and the forms its state allows:
//! approve or deny (awaiting approval); look the receipt up now, resolve `applied` with a
//! reference and result, resolve `not_applied` after a confirmation step (unknown or pending).
//! Each action goes through the app's operator methods, as API v1's do, with the signed-in
//! token's holder as actor. A record whose tool this gateway does not load (written by an
//! in-process `idemgate.Local`, say) is resolved by hand — `applied` with a reference,
//! `not_applied`, or denied — never looked up or approved.
//!
//! After an action the notice says what was done and, from the same read as the "What a
//! caller gets now" panel, what a caller gets now: the two never disagree. The operator's
//! reason is on the timeline (in the detail of the event the action wrote).
//!
//! Reading the page rechecks the operator with the tool's authorization hook, as API v1's
//! `GET /v1/operations/{key}` does: an operator it refuses (or a hook that cannot answer)
//! still sees the record's state and timeline, but its arguments and result are hidden, and
//! the page says so and why.
//!
//! Every form carries the record's attempt (fence), status and creation instant (`claimed_at`,
//! which life of the key: a key purged and claimed again starts at attempt 1 again) as the page
//! showed them; an action on a record that has changed since is refused with the record as it
//! now is, and nothing changes. So is an action without a reason, one of a key of another
//! tenant (not found, as a missing one), and one the record's state does not allow (the
//! executor says why).

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use idemgate_core::Fingerprint;
use idemgate_core::json;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::Outcome;
use idemgate_core::record::{Record, RecordState};
use idemgate_engine::{Caller, Resolution, StatusRead};
use serde::Deserialize;

use super::session::{check_post, session_of, to_sign_in};
use super::view::{self, When, Who};
use super::{html, message};
use crate::api::Segment;
use crate::auth::Session;
use crate::state::AppState;
use idemgate_app::ActError;

/// What stands in for a stored value the authorization recheck refused this operator.
const HIDDEN: &str = "(hidden: the authorization recheck refused this read)";

/// The longest reason kept, in characters (as API v1's deny).
pub const MAX_REASON: usize = idemgate_app::operations::MAX_REASON_CHARS;

struct Step {
    kind: String,
    when: When,
    attempt: u64,
    worker: String,
    detail: String,
}

struct Receipt {
    reference: String,
    result: String,
}

struct Now {
    label: String,
    next_action: String,
    safe_to_repeat: bool,
    reference: Option<String>,
    error: Option<String>,
}

/// What the page says after an action, or why the action was refused.
pub(crate) struct Notice {
    pub ok: bool,
    pub text: String,
    /// Followed by what a caller gets now, as the page's panel reads it.
    pub caller_gets: bool,
}

/// Which forms the record's state allows.
#[derive(Default)]
struct Actions {
    /// Approve and deny share one form; approving needs the tool loaded.
    approve: bool,
    deny: bool,
    lookup: bool,
    resolve: bool,
    /// A released claim: no action, the next delivery runs it.
    released: bool,
}

#[derive(askama::Template)]
#[template(path = "console/operation.html")]
struct Page {
    who: Option<Who>,
    csrf: String,
    key: String,
    href: String,
    status: String,
    fence: u64,
    /// The record's `created_at` in milliseconds: which life of the key the page shows.
    claimed_at: i64,
    tool: String,
    tool_version: String,
    tool_loaded: bool,
    /// The contract's owner of the unknown-outcome queue and its runbook, when loaded.
    owner: Option<String>,
    runbook: Option<Runbook>,
    fingerprint: String,
    actor: String,
    approved_by: Option<String>,
    created: When,
    updated: When,
    /// The pending claim's lease, or the approval's deadline: (label, text).
    lease: Option<(&'static str, String)>,
    arguments: Option<String>,
    /// Set when the authorization recheck refused this operator the stored arguments and
    /// result (API v1 answers 403 for the same read): why, as the hook said it.
    hidden: Option<String>,
    receipt: Option<Receipt>,
    refusal: Option<String>,
    now: Now,
    timeline: Vec<Step>,
    evidence: Vec<String>,
    actions: Actions,
    notice: Option<Notice>,
    /// Set on the confirmation step of `not_applied`: the reason to carry on.
    confirm_not_applied: Option<String>,
    /// What the operator typed, kept when a form is refused.
    draft: Draft,
}

/// A runbook as the page shows it: a link only for an http(s) URL.
struct Runbook {
    text: String,
    link: bool,
}

#[derive(Default, Clone)]
struct Draft {
    reason: String,
    reference: String,
    result: String,
}

fn caller_of(session: &Session) -> Caller {
    Caller {
        tenant: session.principal.tenant.clone(),
        actor: session.principal.name.clone(),
        role: session.principal.role.as_str().to_string(),
    }
}

/// The operation under `key` if it is the session's tenant's, in this environment. Anything
/// else reads as not found, exactly as a missing one: another tenant's keys are not shown.
async fn own_record(
    state: &AppState,
    session: &Session,
    key: &str,
) -> Result<(OperationKey, Record), Response> {
    let not_found = || {
        message(
            StatusCode::NOT_FOUND,
            "No such operation",
            format!(
                "No operation {key} in tenant {} and environment {}. Nothing was changed.",
                session.principal.tenant,
                state.environment()
            ),
        )
    };
    let Ok(parsed) = OperationKey::parse(key) else {
        return Err(not_found());
    };
    match state.app().record(&session.principal.tenant, &parsed).await {
        Ok(Some(record)) => Ok((parsed, record)),
        Ok(None) => Err(not_found()),
        Err(e) => Err(message(
            StatusCode::SERVICE_UNAVAILABLE,
            "Store unavailable",
            format!("The operation could not be read: {e}. Nothing was changed."),
        )),
    }
}

fn describe(outcome: &Outcome) -> Now {
    let label = outcome.status.as_str();
    let next_action = outcome.next_action.as_str();
    Now {
        label: label.into(),
        next_action: next_action.into(),
        safe_to_repeat: outcome.safe_to_repeat(),
        reference: outcome.effect_reference.clone(),
        error: outcome
            .error
            .as_ref()
            .map(|e| format!("{}: {}", e.code.as_str(), e.message)),
    }
}

/// What a caller gets now, in one sentence: the same read the page's panel shows.
fn caller_gets(now: &Now) -> String {
    let mut text = format!("A caller now gets: {}", now.label);
    if let Some(reference) = &now.reference {
        text.push_str(&format!(", reference {reference}"));
    }
    if let Some(error) = &now.error {
        text.push_str(&format!(" ({error})"));
    }
    text.push_str(&format!("; next action {}.", now.next_action));
    text
}

/// The record vanished between the check and the page (purged, or never there).
fn gone(key: &OperationKey) -> Response {
    message(
        StatusCode::NOT_FOUND,
        "No such operation",
        format!("No operation {key}."),
    )
}

fn store_down(e: &idemgate_core::store::Error) -> Response {
    message(
        StatusCode::SERVICE_UNAVAILABLE,
        "Store unavailable",
        format!("The operation could not be read: {e}."),
    )
}

/// Renders the page of `key` as it is now, with `notice` on top.
async fn render(
    state: &AppState,
    session: &Session,
    key: &OperationKey,
    status: StatusCode,
    mut notice: Option<Notice>,
    confirm_not_applied: Option<String>,
    draft: Draft,
) -> Response {
    let record = match state.app().record(&session.principal.tenant, key).await {
        Ok(Some(record)) => record,
        Ok(None) => return gone(key),
        Err(e) => return store_down(&e),
    };
    let tool = state.tools().get(&record.tool);
    // The outcome a caller gets now, read as API v1's status read (a job is polled).
    // A denied reader (or a hook that cannot answer: closed) still sees the record's state, so
    // it can be reconciled, but not what the caller sent or what the downstream returned.
    let (record, outcome, hidden) = match state
        .executor()
        .status(
            tool.as_ref().map(|t| t.contract.as_ref()),
            key,
            tool.as_ref().map(|t| t.downstream.as_ref()),
            &caller_of(session),
        )
        .await
    {
        Ok(Some(StatusRead::Found { record, outcome })) => (record, outcome, None),
        Ok(Some(StatusRead::Denied(outcome))) => {
            let why = outcome
                .error
                .as_ref()
                .map(|e| format!("{}: {}", e.code.as_str(), e.message))
                .unwrap_or_else(|| "the authorization recheck refused this read".into());
            (record, outcome, Some(why))
        }
        Ok(None) => return gone(key),
        Err(e) => return store_down(&e),
    };
    let events = state
        .executor()
        .store()
        .events(key)
        .await
        .unwrap_or_default();
    let now = state.executor().clock().now();
    let (receipt, refusal, lease) = match &record.state {
        RecordState::Applied(r) => (
            Some(Receipt {
                reference: r.reference.clone(),
                result: match &hidden {
                    Some(_) => HIDDEN.into(),
                    None => view::pretty(&r.result),
                },
            }),
            None,
            None,
        ),
        RecordState::FailedPermanent(r) => (
            None,
            Some(format!("{}: {}", r.code.as_str(), r.message)),
            None,
        ),
        RecordState::Pending { lease, dispatch } => (
            None,
            None,
            Some((
                "lease",
                format!(
                    "{} until {} ({}); dispatch {}",
                    lease.owner.as_deref().unwrap_or("released"),
                    view::utc(lease.expires_at),
                    view::age(lease.expires_at, now),
                    dispatch.tag()
                ),
            )),
        ),
        RecordState::AwaitingApproval { until } => (
            None,
            None,
            Some((
                "approval deadline",
                format!(
                    "{} ({}); past it, the operation expires unapproved",
                    view::utc(*until),
                    view::age(*until, now)
                ),
            )),
        ),
        RecordState::Tombstone(digest) => (
            digest.reference().map(|r| Receipt {
                reference: r.to_string(),
                result: "(compacted: the result is no longer kept)".into(),
            }),
            None,
            None,
        ),
        RecordState::Unknown(_) => (None, None, None),
    };
    let lookup = tool.as_ref().is_some_and(|t| t.contract.receipt_lookup());
    // Without its tool, an operation is resolved by hand or denied: never looked up or
    // approved (neither the effect nor its lookup is here).
    let actions = match (&record.state, tool.is_some()) {
        (RecordState::AwaitingApproval { .. }, loaded) => Actions {
            approve: loaded,
            deny: true,
            ..Actions::default()
        },
        // Released (an operator's `not_applied`, or a claim whose send was refused before it
        // left): nothing to settle; the next delivery runs it.
        (
            RecordState::Pending {
                lease: idemgate_core::record::Lease { owner: None, .. },
                dispatch: idemgate_core::record::Dispatch::NotSent,
            },
            _,
        ) => Actions {
            released: true,
            ..Actions::default()
        },
        (RecordState::Unknown(_) | RecordState::Pending { .. }, _) => Actions {
            lookup,
            resolve: true,
            ..Actions::default()
        },
        (_, _) => Actions::default(),
    };
    let now_gets = describe(&outcome);
    if let Some(notice) = notice.as_mut()
        && notice.caller_gets
    {
        notice.text = format!("{} {}", notice.text, caller_gets(&now_gets));
    }
    let owner = tool
        .as_ref()
        .and_then(|t| t.contract.file.owner.reconciliation.clone());
    let runbook = tool
        .as_ref()
        .and_then(|t| t.contract.file.owner.runbook.clone())
        .map(|text| Runbook {
            link: text.starts_with("https://") || text.starts_with("http://"),
            text,
        });
    let page = Page {
        who: Some(Who {
            tenant: session.principal.tenant.clone(),
            name: session.principal.name.clone(),
            environment: state.environment().to_string(),
        }),
        csrf: session.csrf.clone(),
        key: key.to_string(),
        href: view::operation_href(key.as_str()),
        status: record.status().as_str().to_string(),
        fence: record.fence,
        claimed_at: record.created_at,
        tool: record.tool.clone(),
        tool_version: record.tool_version.clone(),
        tool_loaded: tool.is_some(),
        owner,
        runbook,
        fingerprint: record.fingerprint.as_str().to_string(),
        actor: record.actor.clone(),
        approved_by: record.approved_by.clone(),
        created: When::of(record.created_at, now),
        updated: When::of(record.updated_at, now),
        lease,
        arguments: match &hidden {
            Some(_) => None,
            None => record.request.as_ref().map(view::pretty),
        },
        hidden,
        receipt,
        refusal,
        now: now_gets,
        evidence: view::evidence(&record, &events),
        timeline: events
            .into_iter()
            .map(|e| Step {
                kind: e.kind.as_str().to_string(),
                when: When::of(e.at, now),
                attempt: e.attempt,
                worker: e.worker,
                detail: e.detail.unwrap_or_default(),
            })
            .collect(),
        actions,
        notice,
        confirm_not_applied,
        draft,
    };
    html(status, &page)
}

/// `GET /console/operations/{operation_key}`.
pub async fn page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Segment(key): Segment,
) -> Response {
    let session = match session_of(&state, &headers) {
        Ok(session) => session,
        Err(end) => return to_sign_in(end),
    };
    let key = match own_record(&state, &session, &key).await {
        Ok((key, _)) => key,
        Err(refusal) => return refusal,
    };
    render(
        &state,
        &session,
        &key,
        StatusCode::OK,
        None,
        None,
        Draft::default(),
    )
    .await
}

/// An action form, as posted.
#[derive(Debug, Deserialize)]
pub struct ActionForm {
    csrf: Option<String>,
    action: Option<String>,
    /// The record's attempt and status as the page showed them.
    fence: Option<String>,
    status: Option<String>,
    /// The record's creation instant as the page showed it (milliseconds); a form without it
    /// is judged on attempt and status alone.
    claimed_at: Option<String>,
    /// The fingerprint the approver reviewed.
    fingerprint: Option<String>,
    reason: Option<String>,
    reference: Option<String>,
    result: Option<String>,
    confirm: Option<String>,
}

/// `POST /console/operations/{operation_key}`: one action, named by the form's `action`.
pub async fn act(
    State(state): State<AppState>,
    headers: HeaderMap,
    Segment(key): Segment,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let form = match form {
        Ok(Form(form)) => form,
        Err(e) => {
            // Still judged as a forgery first: a cross-site post must not learn more.
            if let Err(refusal) = check_post(&state, &headers, None) {
                return refusal;
            }
            return message(
                StatusCode::BAD_REQUEST,
                "Form not read",
                format!(
                    "The form did not read ({}). Nothing was changed.",
                    e.body_text()
                ),
            );
        }
    };
    let session = match check_post(&state, &headers, form.csrf.as_deref()) {
        Ok(session) => session,
        Err(refusal) => return refusal,
    };
    let (key, record) = match own_record(&state, &session, &key).await {
        Ok(found) => found,
        Err(refusal) => return refusal,
    };
    let draft = Draft {
        reason: form.reason.clone().unwrap_or_default(),
        reference: form.reference.clone().unwrap_or_default(),
        result: form.result.clone().unwrap_or_default(),
    };
    let refuse = |status: StatusCode, text: String| {
        let (state, session, key, draft) = (&state, &session, &key, draft.clone());
        async move {
            render(
                state,
                session,
                key,
                status,
                Some(Notice {
                    ok: false,
                    text,
                    caller_gets: false,
                }),
                None,
                draft,
            )
            .await
        }
    };
    // The page the form came from must still describe the record.
    let shown_fence = form.fence.as_deref().and_then(|f| f.parse::<u64>().ok());
    let shown_status = form.status.as_deref().unwrap_or("");
    // A key purged and claimed again is at attempt 1 again: the creation instant tells the
    // lives apart.
    let other_life = form
        .claimed_at
        .as_deref()
        .is_some_and(|c| c.trim().parse::<i64>().ok() != Some(record.created_at));
    if other_life {
        return refuse(
            StatusCode::CONFLICT,
            "The page was out of date: the operation was claimed again since (a new request under the same key). Nothing was done; review it and act again.".to_string(),
        )
        .await;
    }
    if shown_fence != Some(record.fence) || shown_status != record.status().as_str() {
        return refuse(
            StatusCode::CONFLICT,
            format!(
                "The page was out of date: the operation is now {} at attempt {} (the form was for {} at attempt {}). Nothing was done; review it and act again.",
                record.status().as_str(),
                record.fence,
                if shown_status.is_empty() { "?" } else { shown_status },
                form.fence.as_deref().unwrap_or("?"),
            ),
        )
        .await;
    }
    let action = form.action.as_deref().unwrap_or("");
    let reason = form.reason.as_deref().unwrap_or("").trim();
    let reason: String = reason.chars().take(MAX_REASON).collect();
    let needs_reason = matches!(
        action,
        "approve" | "deny" | "resolve_applied" | "resolve_not_applied"
    );
    if needs_reason && reason.is_empty() {
        return refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Give a reason: it is recorded with the action. Nothing was done.".into(),
        )
        .await;
    }
    // A lookup may go without one; the audit log then says so, as API v1 does.
    let reason = if reason.is_empty() {
        crate::api::DEFAULT_REASON.to_string()
    } else {
        reason
    };
    let actor = session.principal.name.clone();
    let caller = caller_of(&session);
    let answer = match action {
        "approve" => approve(&state, &caller, &key, &reason, form.fingerprint.as_deref()).await,
        "deny" => state
            .app()
            .deny(&caller, &key, &reason)
            .await
            .map_err(|e| act_error(&e)),
        "lookup" => reconcile(&state, &caller, &key, None, &reason).await,
        "resolve_applied" => {
            let reference = form.reference.as_deref().unwrap_or("").trim();
            if reference.is_empty() {
                return refuse(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Give the effect's reference in the system of record (a ticket id, a provider request id). Nothing was done.".into(),
                )
                .await;
            }
            let result = match parse_result(&state, form.result.as_deref().unwrap_or("")) {
                Ok(result) => result,
                Err(why) => {
                    return refuse(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        format!("The result is not valid JSON: {why}. Nothing was done."),
                    )
                    .await;
                }
            };
            let resolution = Resolution::Applied {
                reference: reference.to_string(),
                result,
            };
            reconcile(&state, &caller, &key, Some(resolution), &reason).await
        }
        "resolve_not_applied" => {
            if form.confirm.as_deref() != Some("yes") {
                // The confirmation step: nothing changes until it is confirmed.
                return render(
                    &state,
                    &session,
                    &key,
                    StatusCode::OK,
                    None,
                    Some(reason),
                    draft,
                )
                .await;
            }
            reconcile(&state, &caller, &key, Some(Resolution::NotApplied), &reason).await
        }
        other => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!(
                    "There is no action {other:?} (approve, deny, lookup, resolve_applied, resolve_not_applied). Nothing was done."
                ),
            )
            .await;
        }
    };
    // The reason is recorded with the action, in the operation's events and the audit log;
    // the log line names it with the actor too.
    tracing::info!(
        operation_key = key.as_str(),
        actor = %actor,
        action,
        reason = %reason,
        succeeded = answer.is_ok(),
        "console operator action"
    );
    match answer {
        Ok(_) => {
            let done = match action {
                "approve" => "Approved",
                "deny" => "Denied",
                "lookup" => "Receipt looked up",
                "resolve_applied" => "Resolved applied",
                _ => "Resolved not applied",
            };
            // What a caller gets now comes from the page's own read, below.
            let text = format!("{done} by {actor}.");
            render(
                &state,
                &session,
                &key,
                StatusCode::OK,
                Some(Notice {
                    ok: true,
                    text,
                    caller_gets: true,
                }),
                None,
                Draft::default(),
            )
            .await
        }
        Err(why) => {
            refuse(
                StatusCode::CONFLICT,
                format!("Refused: {why}. Nothing was changed."),
            )
            .await
        }
    }
}

/// The result an operator typed: empty is null; otherwise strict JSON, as API v1 reads bodies.
fn parse_result(state: &AppState, text: &str) -> Result<serde_json::Value, String> {
    if text.trim().is_empty() {
        return Ok(serde_json::Value::Null);
    }
    json::parse_with_depth(text.as_bytes(), state.inner().limits.json_depth).map_err(|e| e.message)
}

async fn approve(
    state: &AppState,
    caller: &Caller,
    key: &OperationKey,
    reason: &str,
    fingerprint: Option<&str>,
) -> Result<Outcome, String> {
    let expected = match fingerprint {
        Some(text) => Some(Fingerprint::parse(text).map_err(|_| {
            "the form's fingerprint is not `sha256:` and 64 hex digits".to_string()
        })?),
        None => None,
    };
    // Detached, as API v1's approve: the approved effect does not depend on this connection.
    state
        .app()
        .approve(caller, key, expected, reason)
        .await
        .map_err(|e| act_error(&e))
}

async fn reconcile(
    state: &AppState,
    caller: &Caller,
    key: &OperationKey,
    resolution: Option<Resolution>,
    reason: &str,
) -> Result<Outcome, String> {
    state
        .app()
        .reconcile(caller, key, resolution, reason)
        .await
        .map_err(|e| act_error(&e))
}

fn act_error(e: &ActError) -> String {
    match e {
        ActError::NotServed { tool, .. } => format!(
            "the tool {tool} of this operation is not loaded by this gateway, so it can only \
             be resolved by hand (applied with a reference, or not applied) or denied"
        ),
        other => other.to_string(),
    }
}
