//! [`FakeServer`]: a ticket service over real loopback HTTP, for black-box tests of the HTTP
//! downstream and the gateway.
//!
//! It is a [`FakeDownstream`] behind HTTP routes, so effects are counted on the server's own
//! side — by the `Idempotency-Key` each request carried — and a green answer at the caller
//! cannot hide a duplicate. Deduplication, receipt lookup, jobs and the commit gates are the
//! `FakeDownstream`'s ([`FakeServer::downstream`]).
//!
//! Routes:
//!
//! | route | what it does |
//! |---|---|
//! | `POST /tickets` | creates a ticket: `201 {"ticket_id", "key"}` |
//! | `GET /tickets/by-key/{key}` | receipt lookup: `200` as above, `404`, or `503` when lookups are off |
//! | `GET /tickets/{id}` | reads a ticket: `200 {"ticket_id", "status", "version"}` |
//! | `PUT /tickets/{id}/status` | sets `status`; `If-Match: "<version>"` must match or `412` |
//! | `POST /emails`, `GET /emails/by-key/{key}` | like tickets: `200 {"message_id", "key"}` |
//! | `POST /reports` | accepts a job: `202 {"job_id", "status": "running"}` |
//! | `GET /jobs/{id}` | polls it: `{"status": "running" \| "done" \| "failed", "report_id", "report", "error"}` |
//! | `POST /auth` | the authorization hook, switched by [`FakeServer::auth_switch`] |
//!
//! Faults are scripted per request with [`FakeServer::push_fault`]: each [`HttpFault`] applies
//! to the next request on an effect route (`POST /tickets`, `/emails`, `/reports`,
//! `PUT /tickets/{id}/status`), in arrival order. A fault pushed directly on the
//! `FakeDownstream` applies too, and is answered the way HTTP would carry it (a dropped
//! connection, a 500, a malformed body, a 422, a 429, a 412, a 202).
//!
//! "Commit then drop the connection" is real: each connection is served by its own task, and a
//! handler that has committed asks that task to drop the connection, which closes the socket
//! without a byte of answer — the client sees the connection close after its request was sent.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use idemgate_core::effect::{Downstream, EffectOutcome, EffectRequest, JobStatus, Lookup};
use idemgate_core::key::OperationKey;
use idemgate_core::record::Receipt;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::downstream::{FakeDownstream, Fault, reason};

/// How long a request that "never gets an answer" is held: far past any client timeout a test
/// sets, and still bounded so a forgotten fault cannot hang a run.
pub const HANG: Duration = Duration::from_secs(120);

/// A scripted misbehaviour for one request on an effect route.
#[derive(Debug, Clone, PartialEq)]
pub enum HttpFault {
    /// Commit the effect, then close the connection without answering.
    CommitThenDrop,
    /// Commit the effect, then answer this status (500, 502, 503, 504) instead of the receipt.
    CommitThenStatus(u16),
    /// Commit the effect, then hold the answer this long: a client with a shorter timeout
    /// gives up while the effect exists.
    CommitThenDelay(Duration),
    /// Commit the effect, then answer `200` with a body that is not JSON.
    CommitThenInvalidJson,
    /// Commit the effect, then answer `200` with JSON that lacks the reference.
    CommitThenMissingReference,
    /// No effect: answer this status (422 refusal, 429 / 408 / 425 not processed, 409, 412,
    /// 404, 500 …), with `Retry-After` seconds when given.
    Status {
        status: u16,
        retry_after: Option<u64>,
    },
    /// No effect: hold the request this long, then answer 503. A client with a shorter timeout
    /// sees a timeout where nothing happened — and must still not assume so.
    Hang(Duration),
    /// Accept a job (202) instead of committing, on any effect route.
    AcceptJob,
}

impl HttpFault {
    /// A deterministic refusal: `422 Unprocessable Entity`.
    pub fn refuse() -> HttpFault {
        HttpFault::Status {
            status: 422,
            retry_after: None,
        }
    }

    /// "Not processed, try later": `429 Too Many Requests` with `Retry-After`.
    pub fn not_processed(retry_after: u64) -> HttpFault {
        HttpFault::Status {
            status: 429,
            retry_after: Some(retry_after),
        }
    }
}

/// What the `/auth` hook answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMode {
    /// `200 {"allow": true}`.
    Allow,
    /// `200 {"allow": false, "reason": …}`.
    Deny(String),
    /// `403` with a reason.
    Forbidden(String),
    /// `503`: the hook is down.
    Unavailable,
    /// Answer `allow` after this long: a hook slower than the caller's timeout.
    Slow(Duration),
}

/// The switch of the `/auth` hook, and what it was asked. Clones share one switch.
#[derive(Debug, Clone)]
pub struct AuthSwitch {
    inner: Arc<Mutex<AuthState>>,
}

#[derive(Debug)]
struct AuthState {
    mode: AuthMode,
    asked: Vec<Value>,
}

impl Default for AuthSwitch {
    fn default() -> Self {
        AuthSwitch {
            inner: Arc::new(Mutex::new(AuthState {
                mode: AuthMode::Allow,
                asked: Vec::new(),
            })),
        }
    }
}

impl AuthSwitch {
    pub fn set(&self, mode: AuthMode) {
        lock(&self.inner).mode = mode;
    }
    pub fn allow(&self) {
        self.set(AuthMode::Allow);
    }
    pub fn deny(&self, reason: &str) {
        self.set(AuthMode::Deny(reason.into()));
    }
    pub fn unavailable(&self) {
        self.set(AuthMode::Unavailable);
    }
    pub fn mode(&self) -> AuthMode {
        lock(&self.inner).mode.clone()
    }
    /// How many times the hook was asked.
    pub fn asked(&self) -> usize {
        lock(&self.inner).asked.len()
    }
    /// Every body the hook received, in order (unparseable bodies as `null`).
    pub fn requests(&self) -> Vec<Value> {
        lock(&self.inner).asked.clone()
    }
}

/// One ticket's state, as `GET /tickets/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub status: String,
    pub version: u64,
}

/// A request the server received, as the test may need to check it.
#[derive(Debug, Clone, PartialEq)]
pub struct SeenRequest {
    pub method: String,
    pub path: String,
    pub idempotency_key: Option<String>,
    pub if_match: Option<String>,
    /// Every header, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body when it was JSON.
    pub body: Option<Value>,
}

impl SeenRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

struct Shared {
    downstream: FakeDownstream,
    auth: AuthSwitch,
    faults: Mutex<VecDeque<HttpFault>>,
    tickets: Mutex<HashMap<String, Ticket>>,
    seen: Mutex<Vec<SeenRequest>>,
    /// Serialises handing a fault to the `FakeDownstream` with the call that must use it, so a
    /// concurrent request cannot take it from the queue first.
    dispatch: Mutex<()>,
    status_updates: AtomicU64,
    anonymous: AtomicU64,
}

/// A std mutex throughout: every lock is held for a table update only, never across an await.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The running server. Dropping it stops it; [`FakeServer::shutdown`] also waits for that.
pub struct FakeServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for FakeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl FakeServer {
    /// A server on `127.0.0.1:0` over a downstream that deduplicates on the key and offers
    /// receipt lookup (the ticket service of `contracts/tickets.create.yaml`); switch either
    /// off through [`FakeServer::downstream`] to match another contract.
    pub async fn start() -> FakeServer {
        let downstream = FakeDownstream::new()
            .deduplicating(true)
            .with_receipt_lookup(true);
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        FakeServer::start_with(downstream, loopback)
            .await
            .expect("binding a loopback port")
    }

    /// A server on `addr` (e.g. `127.0.0.1:9000` for the demo) over `downstream`.
    pub async fn start_with(
        downstream: FakeDownstream,
        addr: SocketAddr,
    ) -> std::io::Result<FakeServer> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            downstream,
            auth: AuthSwitch::default(),
            faults: Mutex::default(),
            tickets: Mutex::default(),
            seen: Mutex::default(),
            dispatch: Mutex::default(),
            status_updates: AtomicU64::new(0),
            anonymous: AtomicU64::new(0),
        });
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(serve(listener, router(shared.clone()), stopped));
        Ok(FakeServer {
            addr,
            shared,
            stop,
            task: Some(task),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The system of record behind the routes: its effect table, knobs and gates.
    pub fn downstream(&self) -> &FakeDownstream {
        &self.shared.downstream
    }

    /// The `/auth` hook's switch.
    pub fn auth_switch(&self) -> &AuthSwitch {
        &self.shared.auth
    }

    /// Queues a fault for the next effect request.
    pub fn push_fault(&self, fault: HttpFault) {
        lock(&self.shared.faults).push_back(fault);
    }

    /// Queues several faults, one per upcoming effect request, in order.
    pub fn push_faults(&self, faults: impl IntoIterator<Item = HttpFault>) {
        lock(&self.shared.faults).extend(faults);
    }

    /// Faults queued and not yet used.
    pub fn faults_pending(&self) -> usize {
        lock(&self.shared.faults).len()
    }

    /// Every request received on the ticket, email, report and job routes, in arrival order.
    pub fn requests(&self) -> Vec<SeenRequest> {
        lock(&self.shared.seen).clone()
    }

    /// A ticket's current state.
    pub fn ticket(&self, id: &str) -> Option<Ticket> {
        lock(&self.shared.tickets).get(id).cloned()
    }

    /// Sets a ticket's state directly, as a person editing it would.
    pub fn put_ticket(&self, id: &str, status: &str, version: u64) {
        lock(&self.shared.tickets).insert(
            id.to_string(),
            Ticket {
                status: status.into(),
                version,
            },
        );
    }

    /// `PUT /tickets/{id}/status` requests that changed a ticket.
    pub fn status_updates(&self) -> u64 {
        self.shared.status_updates.load(Ordering::SeqCst)
    }

    /// Stops accepting, drops every open connection, and waits for the server task.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Connections.

/// Asks the connection's task to drop the connection.
#[derive(Clone)]
struct Hangup(Arc<Notify>);

/// The accept loop. Each connection runs in its own task, raced against its hang-up signal:
/// dropping hyper's connection future closes the socket with nothing written.
async fn serve(listener: TcpListener, router: Router, mut stopped: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stopped.changed() => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of file descriptors, say: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let hangup = Arc::new(Notify::new());
                let service = TowerToHyperService::new(
                    router.clone().layer(Extension(Hangup(hangup.clone()))),
                );
                connections.spawn(async move {
                    let connection = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        _ = connection => {}
                        _ = hangup.notified() => {}
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    // Aborts every open connection, held requests included.
    connections.shutdown().await;
}

/// Hangs up this request's connection and never answers.
async fn drop_connection(hangup: &Hangup) -> Response {
    hangup.0.notify_one();
    std::future::pending().await
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/tickets", post(create_ticket))
        .route("/tickets/by-key/{key}", get(lookup_ticket))
        .route("/tickets/{id}", get(read_ticket))
        .route("/tickets/{id}/status", put(set_status))
        .route("/emails", post(send_email))
        .route("/emails/by-key/{key}", get(lookup_email))
        .route("/reports", post(create_report))
        .route("/jobs/{id}", get(poll_job))
        .route("/auth", post(auth))
        .with_state(shared)
}

// ---------------------------------------------------------------------------------------------
// Handlers.

/// What the effect routes are, and how each shows a receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ticket,
    Email,
    Report,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Ticket => "tickets",
            Kind::Email => "emails",
            Kind::Report => "reports",
        }
    }

    fn created(self) -> StatusCode {
        match self {
            Kind::Ticket => StatusCode::CREATED,
            Kind::Email | Kind::Report => StatusCode::OK,
        }
    }

    fn body(self, receipt: &Receipt, key: &OperationKey) -> Value {
        match self {
            Kind::Ticket => receipt.result.clone(),
            Kind::Email => json!({ "message_id": receipt.reference, "key": key.as_str() }),
            Kind::Report => report(None, receipt),
        }
    }
}

fn report(job_id: Option<&str>, receipt: &Receipt) -> Value {
    json!({
        "job_id": job_id,
        "status": "done",
        "report_id": receipt.reference,
        "report": receipt.result,
    })
}

fn answer(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

fn error(status: StatusCode, message: &str) -> Response {
    answer(status, json!({ "error": message }))
}

fn status_answer(status: u16, retry_after: Option<u64>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = error(status, "scripted answer");
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

fn invalid_json() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from("{\"ticket_id\": \"tick"),
    )
        .into_response()
}

impl Shared {
    fn record(&self, method: Method, path: String, headers: &HeaderMap, body: Option<Value>) {
        let text = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let seen = SeenRequest {
            method: method.to_string(),
            path,
            idempotency_key: text("idempotency-key"),
            if_match: text("if-match"),
            headers: headers
                .iter()
                .map(|(n, v)| (n.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
                .collect(),
            body,
        };
        lock(&self.seen).push(seen);
    }

    fn next_fault(&self) -> Option<HttpFault> {
        lock(&self.faults).pop_front()
    }

    /// The operation key a request carries, or a fresh one per request without a header (the
    /// fake still counts its effect, under a key no other request shares).
    fn key(&self, headers: &HeaderMap) -> Result<OperationKey, &'static str> {
        match headers.get("idempotency-key") {
            Some(value) => value
                .to_str()
                .ok()
                .and_then(|v| OperationKey::parse(v).ok())
                .ok_or("malformed Idempotency-Key"),
            None => {
                let n = self.anonymous.fetch_add(1, Ordering::SeqCst) + 1;
                Ok(
                    OperationKey::new("anonymous", "fake", "no-key", &n.to_string())
                        .expect("a valid key"),
                )
            }
        }
    }

    /// Calls the `FakeDownstream`, handing it `fault` for this call unless a test queued one
    /// on it directly (which then applies instead).
    async fn dispatch(
        &self,
        kind: Kind,
        key: &OperationKey,
        arguments: &Value,
        fault: Option<Fault>,
    ) -> EffectOutcome {
        let request = EffectRequest {
            key,
            tool: kind.name(),
            tool_version: "1",
            arguments,
            // The fencing token does not travel over HTTP.
            attempt: 0,
            precondition: None,
        };
        let mut call = self.downstream.perform(request);
        let mut fault = fault;
        // The fake pops its fault on the first poll, so pushing and that poll happen under one
        // lock; later polls (gates, delays) run without it.
        let first = std::future::poll_fn(|cx| {
            let _serial = lock(&self.dispatch);
            if let Some(f) = fault.take()
                && self.downstream.faults_pending() == 0
            {
                self.downstream.push_fault(f);
            }
            Poll::Ready(call.as_mut().poll(cx))
        })
        .await;
        match first {
            Poll::Ready(outcome) => outcome,
            Poll::Pending => call.await,
        }
    }
}

/// The end of a commit attempt, before the scripted answer is chosen.
enum Done {
    /// The effect committed; its normal answer.
    Success(StatusCode, Value),
    /// Any other answer; after-commit faults do not apply to it.
    Answer(Response),
    /// Close the connection without answering.
    Drop,
}

/// Carries out one request on an effect route under the next scripted fault. `commit` performs
/// the effect (asked to accept a job instead when the fault says so).
async fn effect<F, Fut>(shared: &Shared, hangup: &Hangup, commit: F) -> Response
where
    F: FnOnce(bool) -> Fut,
    Fut: Future<Output = Done>,
{
    let fault = shared.next_fault();
    match fault {
        Some(HttpFault::Status {
            status,
            retry_after,
        }) => return status_answer(status, retry_after),
        Some(HttpFault::Hang(d)) => {
            tokio::time::sleep(d).await;
            return error(StatusCode::SERVICE_UNAVAILABLE, "held, not processed");
        }
        _ => {}
    }
    let done = commit(fault == Some(HttpFault::AcceptJob)).await;
    let (status, body) = match done {
        Done::Drop => return drop_connection(hangup).await,
        Done::Answer(response) => return response,
        Done::Success(status, body) => (status, body),
    };
    match fault {
        Some(HttpFault::CommitThenDrop) => drop_connection(hangup).await,
        Some(HttpFault::CommitThenStatus(s)) => status_answer(s, None),
        Some(HttpFault::CommitThenDelay(d)) => {
            tokio::time::sleep(d).await;
            answer(status, body)
        }
        Some(HttpFault::CommitThenInvalidJson) => invalid_json(),
        Some(HttpFault::CommitThenMissingReference) => {
            answer(StatusCode::OK, json!({ "status": "created" }))
        }
        None
        | Some(HttpFault::AcceptJob)
        | Some(HttpFault::Status { .. })
        | Some(HttpFault::Hang(_)) => answer(status, body),
    }
}

/// How the `FakeDownstream`'s answer travels over HTTP.
async fn over_http(kind: Kind, key: &OperationKey, outcome: EffectOutcome) -> Done {
    match outcome {
        EffectOutcome::Committed(receipt) => {
            Done::Success(kind.created(), kind.body(&receipt, key))
        }
        EffectOutcome::Accepted { job_id } => Done::Answer(answer(
            StatusCode::ACCEPTED,
            json!({ "job_id": job_id, "status": "running" }),
        )),
        EffectOutcome::Refused(refusal) => {
            Done::Answer(error(StatusCode::UNPROCESSABLE_ENTITY, &refusal.message))
        }
        EffectOutcome::PreconditionFailed(m) => {
            Done::Answer(error(StatusCode::PRECONDITION_FAILED, &m))
        }
        EffectOutcome::NotSent { .. } => Done::Answer(status_answer(429, Some(1))),
        EffectOutcome::Ambiguous { reason, .. } => match reason.as_str() {
            reason::DROPPED => Done::Drop,
            reason::MALFORMED => Done::Answer(invalid_json()),
            reason::TIMEOUT => {
                tokio::time::sleep(HANG).await;
                Done::Answer(error(StatusCode::GATEWAY_TIMEOUT, "held"))
            }
            _ => Done::Answer(error(StatusCode::INTERNAL_SERVER_ERROR, "internal error")),
        },
    }
}

fn json_body(body: &Bytes) -> Result<Value, &'static str> {
    serde_json::from_slice(body).map_err(|_| "body is not JSON")
}

async fn create(
    kind: Kind,
    shared: Arc<Shared>,
    hangup: Hangup,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let arguments = json_body(&body);
    shared.record(
        Method::POST,
        format!("/{}", kind.name()),
        &headers,
        arguments.as_ref().ok().cloned(),
    );
    let (arguments, key) = match (arguments, shared.key(&headers)) {
        (Ok(a), Ok(k)) => (a, k),
        (Err(m), _) | (_, Err(m)) => return error(StatusCode::BAD_REQUEST, m),
    };
    let commit = |job: bool| {
        let (shared, key, arguments) = (&shared, &key, &arguments);
        async move {
            // Reports are always jobs; other routes become one when the fault says so.
            let accept = job || kind == Kind::Report;
            let fault = accept.then_some(Fault::AcceptJob);
            let outcome = shared.dispatch(kind, key, arguments, fault).await;
            if let (Kind::Ticket, EffectOutcome::Committed(receipt)) = (kind, &outcome) {
                lock(&shared.tickets)
                    .entry(receipt.reference.clone())
                    .or_insert_with(|| Ticket {
                        status: "open".into(),
                        version: 1,
                    });
            }
            over_http(kind, key, outcome).await
        }
    };
    effect(&shared, &hangup, commit).await
}

async fn create_ticket(
    State(shared): State<Arc<Shared>>,
    Extension(hangup): Extension<Hangup>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    create(Kind::Ticket, shared, hangup, headers, body).await
}

async fn send_email(
    State(shared): State<Arc<Shared>>,
    Extension(hangup): Extension<Hangup>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    create(Kind::Email, shared, hangup, headers, body).await
}

async fn create_report(
    State(shared): State<Arc<Shared>>,
    Extension(hangup): Extension<Hangup>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    create(Kind::Report, shared, hangup, headers, body).await
}

async fn lookup(kind: Kind, shared: Arc<Shared>, key: String, headers: HeaderMap) -> Response {
    shared.record(
        Method::GET,
        format!("/{}/by-key/{key}", kind.name()),
        &headers,
        None,
    );
    let Ok(key) = OperationKey::parse(&key) else {
        return error(StatusCode::BAD_REQUEST, "malformed key");
    };
    match shared.downstream.lookup_receipt(&key).await {
        Lookup::Found(receipt) => answer(StatusCode::OK, kind.body(&receipt, &key)),
        Lookup::NotFound => error(StatusCode::NOT_FOUND, "no effect under this key"),
        Lookup::Unavailable(_) => error(StatusCode::SERVICE_UNAVAILABLE, "lookup unavailable"),
    }
}

async fn lookup_ticket(
    State(shared): State<Arc<Shared>>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    lookup(Kind::Ticket, shared, key, headers).await
}

async fn lookup_email(
    State(shared): State<Arc<Shared>>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    lookup(Kind::Email, shared, key, headers).await
}

fn ticket_body(id: &str, ticket: &Ticket) -> Value {
    json!({ "ticket_id": id, "status": ticket.status, "version": ticket.version })
}

async fn read_ticket(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    shared.record(Method::GET, format!("/tickets/{id}"), &headers, None);
    match lock(&shared.tickets).get(&id) {
        Some(ticket) => answer(StatusCode::OK, ticket_body(&id, ticket)),
        None => error(StatusCode::NOT_FOUND, "no such ticket"),
    }
}

/// The entity tag in an `If-Match` header, without `W/` and quotes.
fn entity_tag(value: &str) -> &str {
    let value = value.trim();
    let value = value.strip_prefix("W/").unwrap_or(value);
    value.trim_matches('"')
}

async fn set_status(
    State(shared): State<Arc<Shared>>,
    Extension(hangup): Extension<Hangup>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let arguments = json_body(&body);
    shared.record(
        Method::PUT,
        format!("/tickets/{id}/status"),
        &headers,
        arguments.as_ref().ok().cloned(),
    );
    let arguments = match arguments {
        Ok(a) => a,
        Err(m) => return error(StatusCode::BAD_REQUEST, m),
    };
    let Some(status) = arguments.get("status").and_then(Value::as_str) else {
        return error(StatusCode::BAD_REQUEST, "status is required");
    };
    let if_match = headers
        .get(header::IF_MATCH)
        .and_then(|v| v.to_str().ok())
        .map(entity_tag);
    let commit = |_job: bool| async {
        let mut tickets = lock(&shared.tickets);
        let Some(ticket) = tickets.get_mut(&id) else {
            return Done::Answer(error(StatusCode::NOT_FOUND, "no such ticket"));
        };
        if let Some(tag) = if_match
            && tag != "*"
            && tag != ticket.version.to_string()
        {
            return Done::Answer(answer(
                StatusCode::PRECONDITION_FAILED,
                json!({ "error": "version mismatch", "version": ticket.version }),
            ));
        }
        // An absolute update: setting the status it already has changes nothing.
        if ticket.status != status {
            ticket.status = status.to_string();
            ticket.version += 1;
            shared.status_updates.fetch_add(1, Ordering::SeqCst);
        }
        Done::Success(StatusCode::OK, ticket_body(&id, ticket))
    };
    effect(&shared, &hangup, commit).await
}

async fn poll_job(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    shared.record(Method::GET, format!("/jobs/{id}"), &headers, None);
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| OperationKey::parse(v).ok());
    // With the key, the poll is the downstream's own (counted, and refused for another
    // operation's job); without it, the job table is read directly.
    let status = match &key {
        Some(key) => shared.downstream.poll_job(key, &id).await,
        None => match shared.downstream.job(&id) {
            None => JobStatus::Unavailable("no such job".into()),
            Some(crate::downstream::JobState::Running) => JobStatus::Running,
            Some(crate::downstream::JobState::Done(r)) => JobStatus::Done(r),
            Some(crate::downstream::JobState::Failed(r)) => JobStatus::Failed(r),
        },
    };
    match status {
        JobStatus::Running => answer(StatusCode::OK, json!({ "job_id": id, "status": "running" })),
        JobStatus::Done(receipt) => answer(StatusCode::OK, report(Some(&id), &receipt)),
        JobStatus::Failed(refusal) => answer(
            StatusCode::OK,
            json!({ "job_id": id, "status": "failed", "error": refusal.message }),
        ),
        JobStatus::Gone(_) | JobStatus::Unavailable(_) => {
            error(StatusCode::NOT_FOUND, "no such job")
        }
    }
}

async fn auth(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let asked = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mode = {
        let mut state = lock(&shared.auth.inner);
        state.asked.push(asked);
        state.mode.clone()
    };
    match mode {
        AuthMode::Allow => answer(StatusCode::OK, json!({ "allow": true })),
        AuthMode::Deny(reason) => {
            answer(StatusCode::OK, json!({ "allow": false, "reason": reason }))
        }
        AuthMode::Forbidden(reason) => answer(StatusCode::FORBIDDEN, json!({ "reason": reason })),
        AuthMode::Unavailable => error(StatusCode::SERVICE_UNAVAILABLE, "hook down"),
        AuthMode::Slow(d) => {
            tokio::time::sleep(d).await;
            answer(StatusCode::OK, json!({ "allow": true }))
        }
    }
}

#[cfg(test)]
mod tests {
    //! The faults that only the wire can show; the routes' answers are tested through the HTTP
    //! downstream in `idemgate-downstream-http`.

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::gate::bounded;

    /// Sends one raw request and reads until the server closes: what came back, or the error.
    async fn raw(server: &FakeServer, request: &str) -> std::io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect(server.addr()).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.map(|_| answer)
    }

    const CREATE: &str = "POST /tickets HTTP/1.1\r\nHost: fake\r\nIdempotency-Key: acme:test:wf:s1\r\n\
                          Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";

    #[tokio::test]
    async fn commit_then_drop_closes_the_connection_without_a_byte_of_answer() {
        let server = FakeServer::start().await;
        server.push_fault(HttpFault::CommitThenDrop);
        let answer = bounded("raw request", raw(&server, CREATE)).await;
        // A clean close or a reset: either way, nothing was answered.
        assert!(
            answer.as_ref().map(Vec::is_empty).unwrap_or(true),
            "{answer:?}"
        );
        assert_eq!(server.downstream().effects(), 1);
        assert_eq!(server.faults_pending(), 0);
    }

    #[tokio::test]
    async fn a_normal_request_is_answered_with_the_receipt() {
        let server = FakeServer::start().await;
        let request = CREATE.replace("Host: fake", "Host: fake\r\nConnection: close");
        let answer = bounded("raw request", raw(&server, &request))
            .await
            .unwrap();
        let text = String::from_utf8(answer).unwrap();
        assert!(text.starts_with("HTTP/1.1 201"), "{text}");
        assert!(
            text.ends_with(r#"{"key":"acme:test:wf:s1","ticket_id":"ticket_1"}"#),
            "{text}"
        );
        assert_eq!(
            server.requests()[0].idempotency_key.as_deref(),
            Some("acme:test:wf:s1")
        );
    }

    #[tokio::test]
    async fn shutdown_ends_held_requests_and_closes_the_port() {
        let server = FakeServer::start().await;
        server.push_fault(HttpFault::Hang(Duration::from_secs(60)));
        let addr = server.addr();
        let held = tokio::spawn({
            let mut stream = TcpStream::connect(addr).await.unwrap();
            async move {
                stream.write_all(CREATE.as_bytes()).await.unwrap();
                let mut answer = Vec::new();
                stream.read_to_end(&mut answer).await.map(|_| answer)
            }
        });
        // Wait until the request has arrived and is being held.
        bounded("request arrives", async {
            while server.requests().is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        bounded("shutdown", server.shutdown()).await;
        let answer = bounded("held request", held).await.unwrap();
        assert!(
            answer.as_ref().map(Vec::is_empty).unwrap_or(true),
            "{answer:?}"
        );
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "the port is closed"
        );
    }

    #[tokio::test]
    async fn the_auth_switch_answers_and_remembers() {
        let server = FakeServer::start().await;
        let ask = "POST /auth HTTP/1.1\r\nHost: fake\r\nConnection: close\r\n\
                   Content-Type: application/json\r\nContent-Length: 14\r\n\r\n{\"tool\":\"t.c\"}";
        let allowed = bounded("auth", raw(&server, ask)).await.unwrap();
        assert!(
            String::from_utf8(allowed)
                .unwrap()
                .ends_with(r#"{"allow":true}"#)
        );
        server.auth_switch().deny("revoked");
        let denied = bounded("auth", raw(&server, ask)).await.unwrap();
        assert!(
            String::from_utf8(denied)
                .unwrap()
                .ends_with(r#"{"allow":false,"reason":"revoked"}"#)
        );
        assert_eq!(server.auth_switch().asked(), 2);
        assert_eq!(server.auth_switch().requests()[0], json!({"tool": "t.c"}));
    }
}
