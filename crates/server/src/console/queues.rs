//! The queues page: the signed-in operator's tenant, this gateway's environment.
//!
//! - `unknown` — the reconciliation queue: the effect may have happened and cannot be proved;
//! - `approval` — awaiting an operator's approval;
//! - `overdue` — pending past its lease: a worker stopped (or a claim was released) and
//!   recovery has not settled it yet;
//! - `jobs` — accepted asynchronous jobs still being polled.
//!
//! Filters by tool, pages by key (`after`), and counts that the page's script refreshes from
//! `/console/counts.json`.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use idemgate_core::record::{Record, RecordStatus};
use idemgate_core::store::{self, Filter, WaitingOn};
use serde::{Deserialize, Serialize};

use super::session::{session_of, to_sign_in};
use super::view::{self, When, Who};
use super::{html, message};
use crate::auth::Session;
use crate::state::AppState;

/// Rows per page.
pub const PAGE: usize = 25;
/// Counts stop here ("1000+"): a count is a listing, bounded like one.
pub const COUNT_CAP: usize = 1000;

/// The queues, in the order of the page's tabs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    Unknown,
    Approval,
    Overdue,
    Jobs,
}

impl Queue {
    pub const ALL: [Queue; 4] = [Queue::Unknown, Queue::Approval, Queue::Overdue, Queue::Jobs];

    pub fn id(self) -> &'static str {
        match self {
            Queue::Unknown => "unknown",
            Queue::Approval => "approval",
            Queue::Overdue => "overdue",
            Queue::Jobs => "jobs",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Queue::Unknown => "Unknown (reconcile)",
            Queue::Approval => "Awaiting approval",
            Queue::Overdue => "Pending past lease",
            Queue::Jobs => "Jobs in progress",
        }
    }

    fn parse(text: &str) -> Option<Queue> {
        Queue::ALL.into_iter().find(|q| q.id() == text)
    }
}

/// One page (or a count) of a queue.
pub(crate) async fn read(
    state: &AppState,
    tenant: &str,
    queue: Queue,
    tool: Option<String>,
    after: Option<String>,
    limit: usize,
) -> Result<Vec<Record>, store::Error> {
    let app = state.app();
    let listed = |status| Filter {
        status: Some(status),
        tool: tool.clone(),
        after: after.clone(),
        limit,
        ..Filter::default()
    };
    match queue {
        Queue::Unknown => app.list(tenant, listed(RecordStatus::Unknown)).await,
        Queue::Approval => {
            app.list(tenant, listed(RecordStatus::AwaitingApproval))
                .await
        }
        Queue::Overdue => {
            let now = state.executor().clock().now();
            let on = WaitingOn::LeaseExpired { now };
            app.waiting(tenant, on, tool, after, limit).await
        }
        Queue::Jobs => {
            app.waiting(tenant, WaitingOn::Job, tool, after, limit)
                .await
        }
    }
}

/// The live counts: `/console/counts.json`.
#[derive(Debug, Serialize)]
pub struct Counts {
    pub unknown: usize,
    pub approval: usize,
    pub overdue: usize,
    pub jobs: usize,
    /// A count equal to this means "at least".
    pub cap: usize,
}

impl Counts {
    fn of(&self, queue: Queue) -> usize {
        match queue {
            Queue::Unknown => self.unknown,
            Queue::Approval => self.approval,
            Queue::Overdue => self.overdue,
            Queue::Jobs => self.jobs,
        }
    }
}

async fn count(state: &AppState, session: &Session) -> Result<Counts, store::Error> {
    let tenant = &session.principal.tenant;
    let n = |q| read(state, tenant, q, None, None, COUNT_CAP);
    Ok(Counts {
        unknown: n(Queue::Unknown).await?.len(),
        approval: n(Queue::Approval).await?.len(),
        overdue: n(Queue::Overdue).await?.len(),
        jobs: n(Queue::Jobs).await?.len(),
        cap: COUNT_CAP,
    })
}

/// `GET /console/counts.json`: the counts of the four queues (signed in only).
pub async fn counts(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let session = match session_of(&state, &headers) {
        Ok(session) => session,
        Err(end) => {
            return (
                StatusCode::UNAUTHORIZED,
                axum::Json(serde_json::json!({"signed_in": false, "why": end.message()})),
            )
                .into_response();
        }
    };
    match count(&state, &session).await {
        Ok(counts) => {
            let mut r = axum::Json(counts).into_response();
            r.headers_mut().insert(
                axum::http::header::CACHE_CONTROL,
                axum::http::HeaderValue::from_static("no-store"),
            );
            r
        }
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"error": e.to_string()})),
        )
            .into_response(),
    }
}

#[derive(Debug, Deserialize)]
pub struct QueueQuery {
    queue: Option<String>,
    tool: Option<String>,
    after: Option<String>,
}

struct Tab {
    id: &'static str,
    label: &'static str,
    count: String,
    active: bool,
}

struct Row {
    href: String,
    key: String,
    tool: String,
    /// Shown on one line: a dated version never wraps mid-date.
    version: String,
    status: String,
    since: When,
    created: When,
    attempt: u64,
    evidence: Vec<String>,
}

#[derive(askama::Template)]
#[template(path = "console/queues.html")]
struct Page {
    who: Option<Who>,
    csrf: String,
    queue: &'static str,
    queue_label: &'static str,
    tabs: Vec<Tab>,
    tool: String,
    tools: Vec<String>,
    rows: Vec<Row>,
    next: Option<String>,
    first: Option<String>,
    notice: Option<String>,
}

fn counted(n: usize) -> String {
    if n >= COUNT_CAP {
        format!("{COUNT_CAP}+")
    } else {
        n.to_string()
    }
}

fn query_href(queue: Queue, tool: &str, after: Option<&str>) -> String {
    let mut href = format!("/console?queue={}", queue.id());
    if !tool.is_empty() {
        href.push_str(&format!("&tool={}", view::key_path(tool)));
    }
    if let Some(after) = after {
        href.push_str(&format!("&after={}", view::key_path(after)));
    }
    href
}

/// `GET /console`: the queues page.
pub async fn page(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<QueueQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let session = match session_of(&state, &headers) {
        Ok(session) => session,
        Err(end) => return to_sign_in(end),
    };
    let Ok(Query(query)) = query else {
        return message(
            StatusCode::BAD_REQUEST,
            "Bad filter",
            "The queue filter in the address does not read; open the console from its start page.",
        );
    };
    let mut notice = None;
    let queue = match query.queue.as_deref() {
        None | Some("") => Queue::Unknown,
        Some(text) => Queue::parse(text).unwrap_or_else(|| {
            notice = Some(format!(
                "There is no queue {text:?}; showing the unknown queue (queues: unknown, approval, overdue, jobs)."
            ));
            Queue::Unknown
        }),
    };
    let tool = query.tool.unwrap_or_default().trim().to_string();
    let tools: Vec<String> = state.tools().names();
    if !tool.is_empty() && !tools.contains(&tool) {
        notice = Some(format!(
            "No loaded tool is named {tool:?}; the list shows what the store holds under that name."
        ));
    }
    let after = query.after.filter(|a| !a.is_empty());
    let tenant = session.principal.tenant.clone();
    let filter_tool = (!tool.is_empty()).then(|| tool.clone());
    let (records, counts) = match (
        read(&state, &tenant, queue, filter_tool, after.clone(), PAGE).await,
        count(&state, &session).await,
    ) {
        (Ok(records), Ok(counts)) => (records, counts),
        (Err(e), _) | (_, Err(e)) => {
            return message(
                StatusCode::SERVICE_UNAVAILABLE,
                "Store unavailable",
                format!("The queues could not be read: {e}. Nothing was changed."),
            );
        }
    };
    let now = state.executor().clock().now();
    let mut rows = Vec::with_capacity(records.len());
    for record in &records {
        let events = state
            .executor()
            .store()
            .events(&record.key)
            .await
            .unwrap_or_default();
        rows.push(Row {
            href: view::operation_href(record.key.as_str()),
            key: record.key.to_string(),
            tool: record.tool.clone(),
            version: record.tool_version.clone(),
            status: record.status().as_str().to_string(),
            since: When::of(record.updated_at, now),
            created: When::of(record.created_at, now),
            attempt: record.fence,
            evidence: view::evidence(record, &events),
        });
    }
    let next = (records.len() == PAGE)
        .then(|| {
            records
                .last()
                .map(|r| query_href(queue, &tool, Some(r.key.as_str())))
        })
        .flatten();
    let first = after.is_some().then(|| query_href(queue, &tool, None));
    let page = Page {
        who: Some(Who {
            tenant,
            name: session.principal.name.clone(),
            environment: state.environment().to_string(),
        }),
        csrf: session.csrf.clone(),
        queue: queue.id(),
        queue_label: queue.label(),
        tabs: Queue::ALL
            .into_iter()
            .map(|q| Tab {
                id: q.id(),
                label: q.label(),
                count: counted(counts.of(q)),
                active: q == queue,
            })
            .collect(),
        tool,
        tools,
        rows,
        next,
        first,
        notice,
    };
    html(StatusCode::OK, &page)
}
