//! Shared test fixtures: contracts, tokens, a fake effects factory, and a request helper that
//! goes through the router or over a real loopback socket.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request};
use idemgate_app::{Effects, ToolSet};
use idemgate_conformance::downstream::FakeDownstream;
use idemgate_conformance::harness::Switch;
use idemgate_core::contract::Contract;
use idemgate_core::effect::{Authorizer, Downstream};
use idemgate_server::auth::{Role, Tokens, hash_token};
use idemgate_server::config::{TenantConfig, TokenConfig};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

pub const AGENT: &str = "acme-agent-token";
pub const OPERATOR: &str = "acme-operator-token";
pub const OTHER: &str = "globex-operator-token";
pub const ENV: &str = "test";

/// A key-based tool whose downstream neither deduplicates nor offers a lookup: an ambiguous
/// answer can only end in `unknown`.
pub const NOTES: &str = r#"
name: notes.append
version: "1"
purpose: Append one note.
effect_class: key_based
input_schema:
  type: object
  properties:
    text: {type: string, minLength: 1, maxLength: 200}
  required: [text]
  additionalProperties: false
request_fingerprint:
  fields: [text]
retention:
  record_ttl: 1h
  tombstone_ttl: 1d
  late_arrival: reject
  max_retry_window: 1h
lease_seconds: 3
"#;

/// Three tenants' tokens: acme's agent and operator, globex's operator.
pub fn tokens() -> Tokens {
    let token = |name: &str, secret: &str, role| TokenConfig {
        name: name.into(),
        sha256: hash_token(secret),
        role,
    };
    Tokens::from_config(&[
        TenantConfig {
            name: "acme".into(),
            tokens: vec![
                token("acme-bot", AGENT, Role::Agent),
                token("acme-ops", OPERATOR, Role::Operator),
            ],
        },
        TenantConfig {
            name: "globex".into(),
            tokens: vec![token("globex-ops", OTHER, Role::Operator)],
        },
    ])
}

/// The example contracts plus `notes.append`, with one fake downstream each (matching each
/// contract's declarations) and one switchable authorization hook for all.
pub struct Fakes {
    pub downstreams: BTreeMap<String, FakeDownstream>,
    pub hook: Arc<Switch>,
}

impl Fakes {
    pub fn new() -> Fakes {
        Fakes {
            downstreams: BTreeMap::new(),
            hook: Arc::new(Switch::default()),
        }
    }

    pub fn fake(&self, tool: &str) -> &FakeDownstream {
        &self.downstreams[tool]
    }

    pub fn total_effects(&self) -> usize {
        self.downstreams.values().map(FakeDownstream::effects).sum()
    }

    pub fn total_calls(&self) -> u64 {
        self.downstreams.values().map(FakeDownstream::calls).sum()
    }

    /// Every contract's tool, over a fake built to its declarations.
    pub fn tools(&mut self) -> ToolSet {
        self.tools_with(&[])
    }

    /// [`Fakes::tools`] plus the contracts in `extra` (YAML texts).
    pub fn tools_with(&mut self, extra: &[&str]) -> ToolSet {
        let mut contracts = idemgate_app::contracts::examples().unwrap();
        contracts.push(Contract::load(NOTES, "notes.append.yaml").unwrap());
        for (i, text) in extra.iter().enumerate() {
            contracts.push(Contract::load(text, &format!("extra-{i}.yaml")).unwrap());
        }
        for c in &contracts {
            let fake = FakeDownstream::new()
                .deduplicating(c.deduplicates())
                .with_receipt_lookup(c.receipt_lookup());
            self.downstreams.insert(c.name.clone(), fake);
        }
        ToolSet::build(contracts, &*self).unwrap()
    }
}

impl Effects for Fakes {
    fn downstream(&self, contract: &Contract) -> Result<Arc<dyn Downstream>, String> {
        Ok(Arc::new(self.downstreams[&contract.name].clone()))
    }
    fn authorizer(&self, _contract: &Contract) -> Result<Option<Arc<dyn Authorizer>>, String> {
        Ok(Some(self.hook.clone()))
    }
}

/// An answer, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub text: String,
    pub json: Value,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn outcome(&self) -> &str {
        self.header("idempotency-outcome").unwrap_or("")
    }
    pub fn code(&self) -> &str {
        self.json["error"]["code"].as_str().unwrap_or("")
    }
    /// A rejection must be an RFC 9457 problem with the outcome fields. What it says of
    /// `safe_to_repeat` is asserted where that is the point: [`Reply::assert_problem_safe`],
    /// [`Reply::assert_problem_after_effect`].
    pub fn assert_problem(&self, status: u16, code: &str) {
        self.assert_problem_with(status, code, None);
    }

    /// A rejection of a key that provably had no effect (the machine's proof): safe to repeat.
    pub fn assert_problem_safe(&self, status: u16, code: &str) {
        self.assert_problem_with(status, code, Some(true));
    }

    /// A rejection that claims nothing, or of a key whose effect happened (or may have): not
    /// safe to repeat.
    pub fn assert_problem_after_effect(&self, status: u16, code: &str) {
        self.assert_problem_with(status, code, Some(false));
    }

    fn assert_problem_with(&self, status: u16, code: &str, safe: Option<bool>) {
        assert_eq!(self.status, status, "{}", self.text);
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{}",
            self.text
        );
        // Relative through a bare router; `http://<the gateway's address>` before it over a
        // socket.
        let problem_type = self.json["type"].as_str().unwrap_or("");
        let path = format!("/problems/{code}");
        assert!(
            problem_type == path
                || (problem_type.starts_with("http://127.0.0.1:") && problem_type.ends_with(&path)),
            "type {problem_type:?}: {}",
            self.text
        );
        assert_eq!(self.json["status"], status);
        assert_eq!(self.json["outcome"], "rejected");
        match safe {
            Some(safe) => assert_eq!(self.json["safe_to_repeat"], safe, "{}", self.text),
            None => assert!(self.json["safe_to_repeat"].is_boolean(), "{}", self.text),
        }
        assert_eq!(self.code(), code, "{}", self.text);
        assert_eq!(self.outcome(), "rejected");
    }
}

/// A request description: method, path, bearer token, extra headers, raw body.
pub struct Call<'a> {
    pub method: &'a str,
    pub path: String,
    pub token: Option<&'a str>,
    pub headers: Vec<(&'a str, String)>,
    pub body: Vec<u8>,
}

impl<'a> Call<'a> {
    pub fn post(path: impl Into<String>, token: &'a str, body: impl Into<Vec<u8>>) -> Call<'a> {
        Call {
            method: "POST",
            path: path.into(),
            token: Some(token),
            headers: Vec::new(),
            body: body.into(),
        }
    }
    pub fn get(path: impl Into<String>, token: &'a str) -> Call<'a> {
        Call {
            method: "GET",
            path: path.into(),
            token: Some(token),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }
    pub fn header(mut self, name: &'a str, value: impl Into<String>) -> Call<'a> {
        self.headers.push((name, value.into()));
        self
    }
    pub fn anonymous(mut self) -> Call<'a> {
        self.token = None;
        self
    }
}

pub fn invoke(tool: &str, token: &'static str, body: Value) -> Call<'static> {
    Call::post(format!("/v1/tools/{tool}/invoke"), token, body.to_string())
}

fn parse_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// Through the router, no socket.
pub async fn route(app: &Router, call: Call<'_>) -> Reply {
    let mut req = Request::builder().method(call.method).uri(&call.path);
    if let Some(token) = call.token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    for (name, value) in &call.headers {
        req = req.header(*name, value.as_str());
    }
    let response = app
        .clone()
        .oneshot(req.body(Body::from(call.body)).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 24)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    Reply {
        status,
        headers,
        json: parse_json(&text),
        text,
    }
}

/// Over a real loopback connection: a minimal HTTP/1.1 client (one request per connection),
/// bounded in time.
pub async fn http(addr: SocketAddr, call: Call<'_>) -> Reply {
    tokio::time::timeout(Duration::from_secs(30), http_unbounded(addr, call))
        .await
        .expect("the gateway answered within 30 s")
}

async fn http_unbounded(addr: SocketAddr, call: Call<'_>) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut head = format!(
        "{} {} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        call.method,
        call.path,
        call.body.len()
    );
    // The connection's own address, unless the call names another host.
    if !call
        .headers
        .iter()
        .any(|(h, _)| h.eq_ignore_ascii_case("host"))
    {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    if let Some(token) = call.token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if !call.body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (name, value) in &call.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&call.body).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let mut headers = HeaderMap::new();
    let mut chunked = false;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            let name: axum::http::HeaderName = name.trim().to_ascii_lowercase().parse().unwrap();
            if name == "transfer-encoding" && value.trim().eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
            headers.append(name, value.trim().parse().unwrap());
        }
    }
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_vec()
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    Reply {
        status,
        headers,
        json: parse_json(&text),
        text,
    }
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(end) = body.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&body[..end]).trim(), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&body[end + 2..end + 2 + size]);
        body = &body[end + 2 + size + 2..];
    }
}

/// The MCP face over `state`'s app at `/mcp`, as `idemgate serve` mounts it (with `config`
/// as its `[mcp]` section), authenticated with the gateway's tokens.
pub fn mcp_mount(
    state: &idemgate_server::AppState,
    config: &idemgate_mcp::config::McpConfig,
) -> idemgate_server::Mount {
    let tokens = state.tokens().clone();
    let listen: SocketAddr = idemgate_server::config::DEFAULT_LISTEN.parse().unwrap();
    let service = idemgate_mcp::config::http_service(state.app(), config, listen, move |parts| {
        tokens.caller(&parts.headers)
    })
    .expect("the tools are MCP tools");
    let drain = service.clone();
    idemgate_server::Mount {
        path: "/mcp".into(),
        service: tower::util::BoxCloneSyncService::new(service),
        title: "MCP".into(),
        on_drain: Some(Arc::new(move || drain.shutdown())),
    }
}

/// The gateway's router with the MCP face at `/mcp`, as `idemgate serve` serves it.
pub fn served(state: idemgate_server::AppState) -> Router {
    let mcp = mcp_mount(&state, &Default::default());
    idemgate_server::router_with(state, vec![mcp])
}

/// A gateway serving `state` on a loopback port until stopped, as `serve` runs it (the MCP
/// face mounted at `/mcp`).
pub struct Gate {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Gate {
    pub async fn start(state: idemgate_server::AppState) -> Gate {
        Gate::start_with(state, &Default::default()).await
    }

    /// [`Gate::start`] with `config` as the MCP face's `[mcp]` section.
    pub async fn start_with(
        state: idemgate_server::AppState,
        config: &idemgate_mcp::config::McpConfig,
    ) -> Gate {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mcp = mcp_mount(&state, config);
        let task = tokio::spawn(idemgate_server::run(
            listener,
            state,
            vec![mcp],
            async move {
                let _ = stopped.await;
            },
        ));
        Gate {
            addr,
            stop: Some(stop),
            task,
        }
    }

    /// Shuts down as `serve` does on SIGTERM: stop accepting, drain, return.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let served = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        served.expect("drained within 10 s").unwrap().unwrap();
    }
}
