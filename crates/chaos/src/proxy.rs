//! [`Proxy`]: the HTTP server that forwards each request to the upstream, applying its fault,
//! and writes the ledger.
//!
//! Each connection is served by a task of its own, raced against a *cut*: a request whose
//! fault loses the answer asks its connection's task to stop serving, which drops hyper's
//! connection and closes the socket with nothing written (a `reset` first sets `SO_LINGER` to
//! zero, so the close is an RST). What reaches the upstream runs on a task of its own too, so a
//! caller that hangs up (or times out during a delay) never stops a forward half-way, and every
//! request's ledger entry is written.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::JoinSet;

use crate::fault::{Fault, Faults, Rule};
use crate::ledger::{Arrival, Entry, Ledger, Told, Upstream};

/// What the proxy is told.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where requests go: `http(s)://host[:port][/prefix]`. A request's path and query are
    /// appended to it.
    pub upstream: String,
    /// The header that names a request's operation (`Idempotency-Key`).
    pub header: String,
    /// JSON pointer (RFC 6901) to the effect's reference in an upstream's 2xx answer.
    pub reference: String,
    /// JSON pointer to the job id in an upstream's `202` answer, for an upstream that accepts
    /// jobs: two jobs accepted for one key are a duplicate too.
    pub job_id: Option<String>,
    /// Faults: the seed, the rates and the scripted rules.
    pub faults: Faults,
    /// How long a forwarded request may take at the upstream.
    pub upstream_timeout: Duration,
    /// Largest request body forwarded; a larger one is answered 413 and not forwarded.
    pub max_body: usize,
    /// Entries the ledger keeps (see [`Ledger::new`]).
    pub max_entries: usize,
}

impl Config {
    /// A proxy to `upstream` with no faults, the `Idempotency-Key` header and the reference at
    /// `/id`.
    pub fn new(upstream: impl Into<String>) -> Config {
        Config {
            upstream: upstream.into(),
            header: "Idempotency-Key".into(),
            reference: "/id".into(),
            job_id: None,
            faults: Faults::default(),
            upstream_timeout: Duration::from_secs(30),
            max_body: 16 << 20,
            max_entries: 100_000,
        }
    }
}

/// Why a proxy could not be set up; each names the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("upstream: {0}")]
    Upstream(String),
    #[error("header: `{0}` is not a header name")]
    Header(String),
    #[error("reference: `{0}` is not a JSON pointer (write `/id`, or \"\" for the whole body)")]
    Reference(String),
    #[error("rates: {0}")]
    Rates(String),
    #[error("the HTTP client could not be built: {0}")]
    Client(String),
}

/// The proxy. Cheap to clone: clones share the ledger and the rules.
#[derive(Clone)]
pub struct Proxy {
    shared: Arc<Shared>,
}

struct Shared {
    /// Scheme, authority and path prefix, without a trailing `/`.
    upstream: String,
    header: HeaderName,
    reference: String,
    job_id: Option<String>,
    faults: Faults,
    /// Rules added while the proxy runs ([`Proxy::push_rule`]), checked before the configured
    /// ones. A std lock: held to copy or push, never across an await.
    extra: RwLock<Vec<Rule>>,
    client: reqwest::Client,
    max_body: usize,
    ledger: Ledger,
    /// Requests whose work is still running, so that stopping waits for them.
    working: watch::Sender<usize>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("upstream", &self.shared.upstream)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    pub fn new(config: Config) -> Result<Proxy, Error> {
        let upstream = check_upstream(&config.upstream)?;
        let header = HeaderName::from_bytes(config.header.as_bytes())
            .map_err(|_| Error::Header(config.header.clone()))?;
        let pointer = |p: &str| p.is_empty() || p.starts_with('/');
        if !pointer(&config.reference) {
            return Err(Error::Reference(config.reference));
        }
        if let Some(job_id) = config.job_id.as_deref().filter(|p| !pointer(p)) {
            return Err(Error::Reference(job_id.to_string()));
        }
        config.faults.rates.check().map_err(Error::Rates)?;
        idemgate_downstream_http::install_crypto_provider();
        let client = reqwest::Client::builder()
            // The proxy is transparent: a redirect goes back to the caller, who decides.
            .redirect(reqwest::redirect::Policy::none())
            .timeout(config.upstream_timeout)
            .tls_backend_rustls()
            .build()
            .map_err(|e| Error::Client(e.to_string()))?;
        Ok(Proxy {
            shared: Arc::new(Shared {
                upstream,
                header,
                reference: config.reference,
                job_id: config.job_id,
                faults: config.faults,
                extra: RwLock::default(),
                client,
                max_body: config.max_body,
                ledger: Ledger::new(config.max_entries),
                working: watch::channel(0).0,
            }),
        })
    }

    /// The upstream requests go to.
    pub fn upstream(&self) -> &str {
        &self.shared.upstream
    }

    pub fn ledger(&self) -> &Ledger {
        &self.shared.ledger
    }

    /// Adds a rule that wins over every rule before it and over the configured ones: a test
    /// (or `idemgate verify`) scripts the fate of one key's next request this way.
    pub fn push_rule(&self, rule: Rule) {
        let mut extra = self.shared.extra.write().unwrap_or_else(|p| p.into_inner());
        extra.insert(0, rule);
    }

    /// Binds `addr` and serves on a task of its own until [`Running::stop`].
    pub async fn start(self, addr: SocketAddr) -> std::io::Result<Running> {
        let listener = TcpListener::bind(addr).await?;
        let address = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let proxy = self.clone();
        let task = tokio::spawn(async move {
            proxy
                .serve(listener, async {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(Running {
            proxy: self,
            address,
            stop,
            task,
        })
    }

    /// Serves connections from `listener` until `shutdown` completes, then stops accepting,
    /// lets open connections finish the request they are on, and waits for every forward
    /// still travelling (each within the upstream timeout), so the ledger is complete when
    /// this returns.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let (stop, stopped) = watch::channel(false);
        let mut connections = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => {
                    let (stream, _) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            // Out of file descriptors, say: back off instead of spinning.
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    connections.spawn(connection(self.shared.clone(), stream, stopped.clone()));
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        drop(listener);
        let _ = stop.send(true);
        while connections.join_next().await.is_some() {}
        // Work whose caller hung up outlives its connection: wait for it too.
        let mut working = self.shared.working.subscribe();
        let _ = working.wait_for(|n| *n == 0).await;
        Ok(())
    }
}

/// A proxy serving on a task of its own ([`Proxy::start`]).
pub struct Running {
    proxy: Proxy,
    address: SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    /// `http://<address>`: where callers send requests.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    /// Stops it as `serve` stops (every forward in flight finished) and hands the proxy
    /// back, its ledger complete.
    pub async fn stop(self) -> std::io::Result<Proxy> {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(served) => served.map(|()| self.proxy),
            Err(e) => Err(std::io::Error::other(e)),
        }
    }
}

fn check_upstream(text: &str) -> Result<String, Error> {
    let url = reqwest::Url::parse(text).map_err(|e| Error::Upstream(format!("`{text}`: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(Error::Upstream(format!(
            "`{text}` is not an http or https URL with a host"
        )));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(Error::Upstream(format!(
            "`{text}` has a query or fragment; the caller's path and query are appended to it"
        )));
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

/// How a cut connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Closed after the request, nothing written.
    Close,
    /// Reset: the socket closes with an RST.
    Reset,
}

/// The signal from a request's handler to its connection's task.
#[derive(Default)]
struct Cutter {
    how: Mutex<Option<Cut>>,
    notify: Notify,
}

impl Cutter {
    fn cut(&self, how: Cut) {
        *self.how.lock().unwrap_or_else(|p| p.into_inner()) = Some(how);
        self.notify.notify_one();
    }
}

/// Serves one connection until it ends, is cut, or the proxy stops (then the request in
/// progress is finished and the connection closed).
async fn connection(shared: Arc<Shared>, stream: TcpStream, mut stopped: watch::Receiver<bool>) {
    let cutter = Arc::new(Cutter::default());
    let service = {
        let cutter = cutter.clone();
        hyper::service::service_fn(move |request| handle(shared.clone(), cutter.clone(), request))
    };
    let mut conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    let mut stopping = false;
    loop {
        tokio::select! {
            _ = &mut conn => return,
            _ = cutter.notify.notified() => {
                let how = *cutter.how.lock().unwrap_or_else(|p| p.into_inner());
                let parts = conn.into_parts();
                if how == Some(Cut::Reset) {
                    let _ = parts.io.inner().set_zero_linger();
                }
                // Dropping the socket closes it, with nothing written.
                return;
            }
            _ = stopped.wait_for(|s| *s), if !stopping => {
                stopping = true;
                std::pin::Pin::new(&mut conn).graceful_shutdown();
            }
        }
    }
}

/// What a request's work decided to tell the caller.
enum Reply {
    Answer(Response<Full<Bytes>>),
    Cut(Cut),
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) and the ones the client sets itself: never copied
/// from one side to the other.
fn forwardable(name: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

async fn handle(
    shared: Arc<Shared>,
    cutter: Arc<Cutter>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let key = parts
        .headers
        .get(&shared.header)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let arrival = shared.ledger.arrive(key.as_deref());
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let body = match Limited::new(body, shared.max_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            let entry = Entry {
                seq: arrival.seq,
                key,
                nth: arrival.nth,
                method: parts.method.to_string(),
                path,
                fault: "too_large".into(),
                upstream: Vec::new(),
                told: Told::Status(413),
                at_ms: arrival.at_ms,
                millis: started.elapsed().as_millis() as u64,
            };
            shared.ledger.record(entry);
            return Ok(plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is too large for the proxy",
            ));
        }
    };
    let fault = decide(&shared, key.as_deref(), arrival.nth, parts.method.as_str());
    let request = Forward {
        method: parts.method,
        path,
        headers: parts.headers,
        body,
    };
    // The upstream's part runs on its own task: a caller that hangs up stops waiting, never
    // the forward, and the entry is always recorded.
    let working = Working::start(shared.clone());
    let work = tokio::spawn(async move {
        let reply = process(&working.0, request, key, arrival, fault, started).await;
        drop(working);
        reply
    });
    match work.await {
        Ok(Reply::Answer(response)) => Ok(response),
        Ok(Reply::Cut(how)) => {
            cutter.cut(how);
            // The connection's task drops this future with the connection.
            std::future::pending().await
        }
        Err(_) => Ok(plain(StatusCode::BAD_GATEWAY, "the proxy failed")),
    }
}

/// One request's work in the count `serve` waits for; counted out when dropped, however the
/// work ends.
struct Working(Arc<Shared>);

impl Working {
    fn start(shared: Arc<Shared>) -> Working {
        shared.working.send_modify(|n| *n += 1);
        Working(shared)
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        self.0.working.send_modify(|n| *n = n.saturating_sub(1));
    }
}

fn decide(shared: &Shared, key: Option<&str>, nth: u64, method: &str) -> Fault {
    let extra = shared.extra.read().unwrap_or_else(|p| p.into_inner());
    match extra.iter().find(|r| r.matches(key, nth, method)) {
        Some(rule) => rule.fault,
        None => shared.faults.decide(key, nth, method),
    }
}

/// A request as received, to be forwarded (once or twice).
struct Forward {
    method: Method,
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

/// An upstream's answer, whole.
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
}

async fn process(
    shared: &Shared,
    request: Forward,
    key: Option<String>,
    arrival: Arrival,
    fault: Fault,
    started: Instant,
) -> Reply {
    if let Fault::Delay(pause) = fault {
        tokio::time::sleep(pause).await;
    }
    let (upstream, answer) = match fault {
        Fault::Reset => (Vec::new(), None),
        Fault::Duplicate => {
            let (first, second) =
                tokio::join!(forward(shared, &request), forward(shared, &request));
            (vec![first.0, second.0], first.1)
        }
        Fault::Pass | Fault::Drop | Fault::Delay(_) | Fault::Error(_) | Fault::Malformed => {
            let (record, answer) = forward(shared, &request).await;
            (vec![record], answer)
        }
    };
    let (told, reply) = match fault {
        Fault::Reset => (Told::Reset, Reply::Cut(Cut::Reset)),
        Fault::Drop => (Told::Dropped, Reply::Cut(Cut::Close)),
        Fault::Error(status) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            let body = r#"{"error": "an error injected by idemgate chaos after forwarding"}"#;
            (
                Told::Status(status.as_u16()),
                Reply::Answer(json(status, body)),
            )
        }
        Fault::Malformed => {
            let body = "{\"truncated\": an answer broken by idemgate chaos";
            (Told::Malformed, Reply::Answer(json(StatusCode::OK, body)))
        }
        Fault::Pass | Fault::Delay(_) | Fault::Duplicate => match answer {
            Some(answer) => (Told::Status(answer.status), Reply::Answer(relay(answer))),
            None => (
                Told::Status(502),
                Reply::Answer(plain(
                    StatusCode::BAD_GATEWAY,
                    "idemgate chaos: the upstream gave no answer",
                )),
            ),
        },
    };
    shared.ledger.record(Entry {
        seq: arrival.seq,
        key,
        nth: arrival.nth,
        method: request.method.to_string(),
        path: request.path,
        fault: fault.to_string(),
        upstream,
        told,
        at_ms: arrival.at_ms,
        millis: started.elapsed().as_millis() as u64,
    });
    reply
}

/// Sends one copy of the request upstream.
async fn forward(shared: &Shared, request: &Forward) -> (Upstream, Option<Answer>) {
    let url = format!("{}{}", shared.upstream, request.path);
    let mut builder = shared.client.request(request.method.clone(), url);
    for (name, value) in request.headers.iter().filter(|(n, _)| forwardable(n)) {
        builder = builder.header(name, value);
    }
    let sent = builder.body(request.body.clone()).send().await;
    let failed = |e: String| Upstream {
        status: None,
        error: Some(e),
        reference: None,
        job: None,
        commit: false,
    };
    let response = match sent {
        Ok(r) => r,
        Err(e) => return (failed(describe(&e)), None),
    };
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = match response.bytes().await {
        Ok(b) => b,
        Err(e) => return (failed(describe(&e)), None),
    };
    let json = (200..300)
        .contains(&status)
        .then(|| serde_json::from_slice::<Value>(&body).ok())
        .flatten();
    let found = json.as_ref().and_then(|v| reference(v, &shared.reference));
    let job = match (&shared.job_id, status, &json) {
        (Some(pointer), 202, Some(v)) => reference(v, pointer),
        _ => None,
    };
    let commit =
        found.is_some() && !matches!(request.method, Method::GET | Method::HEAD | Method::OPTIONS);
    let record = Upstream {
        status: Some(status),
        error: None,
        reference: found,
        job,
        commit,
    };
    (
        record,
        Some(Answer {
            status,
            headers,
            body,
        }),
    )
}

/// The reference at `pointer`: a non-empty string, or an integer written in decimal — the
/// same reading as idemgate's HTTP downstream, so the ledger and the executor agree.
fn reference(body: &Value, pointer: &str) -> Option<String> {
    match body.pointer(pointer)? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

/// The cause of a failed forward, without the URL.
fn describe(e: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    let kind = if e.is_connect() {
        "connect"
    } else if e.is_timeout() {
        "timeout"
    } else {
        "request"
    };
    format!("{kind}: {cause}")
}

fn relay(answer: Answer) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(answer.body));
    *response.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
    for (name, value) in answer.headers.iter().filter(|(n, _)| forwardable(n)) {
        response.headers_mut().append(name, value.clone());
    }
    response
}

fn json(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
