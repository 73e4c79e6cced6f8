//! Fake downstreams for tests: a ticket service (and a report service with jobs) on
//! `127.0.0.1:0` whose [`Behaviour`] is one of the ways a real system of record behaves, and
//! which counts every effect on its own side, by the `Idempotency-Key` it carried — so a
//! verification's verdict can be held against what really happened.
//!
//! | route | what it does |
//! |---|---|
//! | `POST /tickets` | creates a ticket: `201 {"ticket_id", "subject"}`; a used key per [`Dedup`] and [`Changed`] |
//! | `GET /tickets/by-key/{key}` | the receipt lookup: `200 {"ticket_id"}` or `404` (per [`LookupMode`]) |
//! | `POST /reports` | accepts a job: `202 {"job_id", "status": "running"}`; a used key per [`Dedup`] |
//! | `GET /jobs/{id}` | `running` at the first poll, then `done` with `report_id` |
//! | `POST /auth` | the authorization hook, per [`Hook`] |
//!
//! [`FakeService::contract`] writes a contract for the service that claims what it is told
//! to claim — the honest one, or one that lies.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// How the service treats a key it has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dedup {
    /// Every request is a new effect.
    Off,
    /// A used key is answered with its first effect (or per [`Changed`] for another body).
    On,
    /// Deduplicates one request after another, but checks and records the key with a pause
    /// between, so two requests of one key at once both make an effect.
    Racy,
}

/// How a deduplicating service answers a used key with a different body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changed {
    /// `422`: the key is bound to its first request.
    Refuse,
    /// The first effect, ignoring the change.
    Replay,
    /// A new effect under the used key.
    NewEffect,
}

/// What the receipt lookup finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupMode {
    /// The key's effect, or `404`.
    Honest,
    /// `404`, even after a commit.
    Blind,
}

/// What the authorization hook answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// Allows [`ALLOWED_ACTOR`], denies everyone else.
    Strict,
    /// Allows everyone.
    AllowAll,
    /// `503`.
    Down,
}

/// The actor a [`Hook::Strict`] hook allows: the verification's default actor.
pub const ALLOWED_ACTOR: &str = "idemgate-verify";

/// One way a system of record behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Behaviour {
    pub dedup: Dedup,
    pub changed: Changed,
    pub lookup: LookupMode,
    pub hook: Hook,
    /// Commits, then answers `200` with a body that is not JSON.
    pub malformed: bool,
}

impl Behaviour {
    /// The well-behaved service: deduplicates, binds a key to its request, finds receipts.
    pub fn honest() -> Behaviour {
        Behaviour {
            dedup: Dedup::On,
            changed: Changed::Refuse,
            lookup: LookupMode::Honest,
            hook: Hook::Strict,
            malformed: false,
        }
    }

    /// A service that makes an effect per request and offers no lookup (its lookup route
    /// answers `404`).
    pub fn plain() -> Behaviour {
        Behaviour {
            dedup: Dedup::Off,
            lookup: LookupMode::Blind,
            ..Behaviour::honest()
        }
    }
}

/// What a contract for the service claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Claims {
    pub dedup: bool,
    pub lookup: bool,
    pub jobs: bool,
    pub hook: bool,
}

/// One effect the service made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    pub key: Option<String>,
    pub reference: String,
    pub body: Value,
}

#[derive(Default)]
struct Table {
    effects: Vec<Effect>,
    /// Key → (first body, reference of its latest effect).
    by_key: HashMap<String, (Value, String)>,
    /// Job id → polls so far.
    polls: HashMap<String, u32>,
    hook_asked: Vec<Value>,
}

struct Shared {
    behaviour: Behaviour,
    table: Mutex<Table>,
}

impl Shared {
    // A std mutex: held for a table update, never across an await.
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The running service; dropping it stops it.
pub struct FakeService {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeService {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeService {
    pub async fn start(behaviour: Behaviour) -> FakeService {
        let shared = Arc::new(Shared {
            behaviour,
            table: Mutex::default(),
        });
        let app = axum::Router::new()
            .route("/tickets", post(create_ticket))
            .route("/tickets/by-key/{key}", get(lookup_ticket))
            .route("/reports", post(create_report))
            .route("/jobs/{id}", get(poll_job))
            .route("/auth", post(auth))
            .with_state(shared.clone());
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let addr = listener.local_addr().expect("a bound address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeService { addr, shared, task }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every effect, in order.
    pub fn effects(&self) -> Vec<Effect> {
        self.shared.table().effects.clone()
    }

    /// Effects made under `key`.
    pub fn effects_for(&self, key: &str) -> usize {
        self.shared
            .table()
            .effects
            .iter()
            .filter(|e| e.key.as_deref() == Some(key))
            .count()
    }

    /// Effects per key.
    pub fn per_key(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for e in &self.shared.table().effects {
            if let Some(key) = &e.key {
                *out.entry(key.clone()).or_default() += 1;
            }
        }
        out
    }

    /// What the hook was asked, in order.
    pub fn hook_asked(&self) -> Vec<Value> {
        self.shared.table().hook_asked.clone()
    }

    /// A contract for this service (at `base`, or its own URL) claiming `claims`.
    pub fn contract(&self, name: &str, claims: Claims) -> String {
        contract_at(&self.url(), name, claims)
    }
}

/// A contract for a fake service at `base` claiming `claims`: tickets, or reports through a
/// job when `claims.jobs`.
pub fn contract_at(base: &str, name: &str, claims: Claims) -> String {
    let (path, reference) = if claims.jobs {
        ("reports", "/report_id")
    } else {
        ("tickets", "/ticket_id")
    };
    let mut http = format!(
        "    url: {base}/{path}\n    reference: {reference}\n    error_message: /error\n    timeouts:\n      connect: 2s\n      total: 5s\n"
    );
    if claims.lookup {
        http.push_str(&format!(
            "    lookup:\n      url: {base}/tickets/by-key/{{operation_key}}\n"
        ));
    }
    if claims.jobs {
        http.push_str(&format!(
            "    job:\n      id: /job_id\n      poll_url: {base}/jobs/{{job_id}}\n      state: /status\n      reference: /report_id\n"
        ));
    }
    let hook = if claims.hook {
        format!("  authorization_hook:\n    url: {base}/auth\n")
    } else {
        String::new()
    };
    format!(
        r#"name: {name}
version: "1"
purpose: Create one ticket per workflow step.
do_not_use_when:
  - The same ticket was already asked for in this step.
effect_class: key_based
operation_key:
  supplied_by: application
  scope: [tenant, environment, workflow_id, step_id]
input_schema:
  type: object
  properties:
    subject: {{type: string, minLength: 1, maxLength: 200}}
    body: {{type: string, maxLength: 2000}}
  required: [subject]
  additionalProperties: false
request_fingerprint:
  fields: [subject, body]
downstream:
  deduplicates_by_key: {dedup}
  receipt_lookup: {lookup}
  async_jobs: {jobs}
  http:
{http}security:
  recheck_authorization: true
{hook}retention:
  record_ttl: 7d
  tombstone_ttl: 30d
  max_retry_window: 1d
owner:
  reconciliation: tickets-oncall
  next_review: "2027-06-01"
"#,
        dedup = claims.dedup,
        lookup = claims.lookup,
        jobs = claims.jobs,
    )
}

fn key_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// A used key's answer, or `None` to make a new effect. Checked and recorded under one lock,
/// except by [`Dedup::Racy`], which checks, pauses, and records apart.
fn seen(
    shared: &Shared,
    table: &Table,
    key: &Option<String>,
    body: &Value,
    field: &str,
) -> Option<Response> {
    let behaviour = shared.behaviour;
    let key = key.as_ref()?;
    if behaviour.dedup == Dedup::Off {
        return None;
    }
    let (first_body, reference) = table.by_key.get(key)?;
    if first_body == body || behaviour.changed == Changed::Replay {
        let status = if field == "job_id" {
            StatusCode::ACCEPTED
        } else {
            StatusCode::OK
        };
        return Some(
            (status, Json(json!({field: reference, "status": "running"}))).into_response(),
        );
    }
    match behaviour.changed {
        Changed::Refuse => Some(
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(json!({"error": "this key was used with another request"})),
            )
                .into_response(),
        ),
        Changed::NewEffect | Changed::Replay => None,
    }
}

/// Makes an effect under `key` (unless the key's answer is due), returning its reference.
async fn effect(
    shared: &Shared,
    key: Option<String>,
    body: Value,
    field: &str,
    prefix: &str,
) -> Result<String, Response> {
    if shared.behaviour.dedup == Dedup::Racy {
        if let Some(answer) = seen(shared, &shared.table(), &key, &body, field) {
            return Err(answer);
        }
        // The window two requests of one key slip through together.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut table = shared.table();
    if shared.behaviour.dedup == Dedup::On
        && let Some(answer) = seen(shared, &table, &key, &body, field)
    {
        return Err(answer);
    }
    let reference = format!("{prefix}{}", table.effects.len() + 1);
    table.effects.push(Effect {
        key: key.clone(),
        reference: reference.clone(),
        body: body.clone(),
    });
    if let Some(key) = key {
        let first = table
            .by_key
            .get(&key)
            .map(|(b, _)| b.clone())
            .unwrap_or(body);
        table.by_key.insert(key, (first, reference.clone()));
    }
    Ok(reference)
}

async fn create_ticket(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let key = key_of(&headers);
    let reference = match effect(&shared, key, body.clone(), "ticket_id", "ticket-").await {
        Ok(r) => r,
        Err(answer) => return answer,
    };
    if shared.behaviour.malformed {
        return (StatusCode::OK, "<html>ticket created</html>").into_response();
    }
    (
        StatusCode::CREATED,
        Json(json!({"ticket_id": reference, "subject": body.get("subject")})),
    )
        .into_response()
}

async fn lookup_ticket(State(shared): State<Arc<Shared>>, Path(key): Path<String>) -> Response {
    let table = shared.table();
    match (shared.behaviour.lookup, table.by_key.get(&key)) {
        (LookupMode::Honest, Some((_, reference))) => {
            (StatusCode::OK, Json(json!({"ticket_id": reference}))).into_response()
        }
        _ => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "no ticket for this key"})),
        )
            .into_response(),
    }
}

async fn create_report(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let key = key_of(&headers);
    match effect(&shared, key, body, "job_id", "job-").await {
        Ok(job_id) => (
            StatusCode::ACCEPTED,
            Json(json!({"job_id": job_id, "status": "running"})),
        )
            .into_response(),
        Err(answer) => answer,
    }
}

async fn poll_job(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    let mut table = shared.table();
    if !table.effects.iter().any(|e| e.reference == id) {
        return (StatusCode::NOT_FOUND, Json(json!({"error": "no such job"}))).into_response();
    }
    let polls = table.polls.entry(id.clone()).or_default();
    *polls += 1;
    if *polls == 1 {
        return Json(json!({"status": "running"})).into_response();
    }
    let report = id.replacen("job-", "report-", 1);
    Json(json!({"status": "done", "report_id": report})).into_response()
}

async fn auth(State(shared): State<Arc<Shared>>, Json(body): Json<Value>) -> Response {
    shared.table().hook_asked.push(body.clone());
    let actor = body
        .get("actor")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match shared.behaviour.hook {
        Hook::Down => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        Hook::AllowAll => Json(json!({"allow": true})).into_response(),
        Hook::Strict if actor == ALLOWED_ACTOR => Json(json!({"allow": true})).into_response(),
        Hook::Strict => Json(json!({"allow": false, "reason": "unknown actor"})).into_response(),
    }
}
