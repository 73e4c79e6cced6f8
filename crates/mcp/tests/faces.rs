//! Both MCP transports end to end in-process, with plain JSON-RPC: stdio over an in-memory
//! pipe, streamable HTTP mounted in an axum router on 127.0.0.1:0. Effects are counted by the
//! fake downstreams on their own side. (The official Python SDK drives the same paths in
//! `tests/python/test_mcp.py`.)

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::header::AUTHORIZATION;
use idemgate_app::{App, Assembly, ToolSet};
use idemgate_engine::Caller;
use idemgate_mcp::fake::FakeDownstreams;
use idemgate_mcp::{HttpOptions, Options};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const LIMIT: Duration = Duration::from_secs(20);

struct World {
    gateway: Arc<App>,
    fakes: FakeDownstreams,
    _dir: tempfile::TempDir,
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contracts/*.yaml");
    let contracts =
        idemgate_app::contracts::load(&[root.to_string()], std::path::Path::new("")).unwrap();
    let store =
        idemgate_store_sqlite::SqliteStore::open(dir.path().join("s.sqlite"), Default::default())
            .unwrap();
    let fakes = FakeDownstreams::for_contracts(&contracts);
    let tools = ToolSet::build(contracts, &fakes).unwrap();
    let app = Assembly::new(Arc::new(store), tools, "test").build();
    World {
        gateway: Arc::new(app),
        fakes,
        _dir: dir,
    }
}

fn caller(tenant: &str) -> Caller {
    Caller {
        tenant: tenant.into(),
        actor: format!("agent-of-{tenant}"),
        role: "agent".into(),
    }
}

fn ticket() -> Value {
    json!({"subject": "Refund request", "body": "Order 42 arrived broken."})
}

fn call(id: u64, tool: &str, arguments: Value, step: Option<&str>) -> Value {
    let mut params = json!({"name": tool, "arguments": arguments});
    if let Some(step) = step {
        params["_meta"] =
            json!({"io.idemgate/operation": {"workflow_id": "run_827", "step_id": step}});
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

fn initialize(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "faces-test", "version": "0"}}})
}

/// A JSON-RPC client over newline-delimited stdio framing.
struct Stdio {
    write: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    read: BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>,
}

impl Stdio {
    async fn send(&mut self, message: Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.write.write_all(line.as_bytes()).await.unwrap();
    }

    /// Sends a request and reads until its response (notifications are skipped).
    async fn request(&mut self, message: Value) -> Value {
        let id = message["id"].clone();
        self.send(message).await;
        tokio::time::timeout(LIMIT, async {
            loop {
                let mut line = String::new();
                assert!(self.read.read_line(&mut line).await.unwrap() > 0, "EOF");
                let v: Value = serde_json::from_str(&line).unwrap();
                if v["id"] == id {
                    return v;
                }
            }
        })
        .await
        .expect("an answer in time")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_serves_contracts_and_replays_one_operation() {
    let w = world();
    let (client, server) = tokio::io::duplex(1 << 16);
    let (server_read, server_write) = tokio::io::split(server);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(idemgate_mcp::serve_io(
        w.gateway.clone(),
        caller("acme"),
        Options {
            fakes: Some(w.fakes.clone()),
            ..Options::default()
        },
        server_read,
        server_write,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let (read, write) = tokio::io::split(client);
    let mut c = Stdio {
        write,
        read: BufReader::new(read),
    };

    let init = c.request(initialize(1)).await;
    assert_eq!(init["result"]["serverInfo"]["name"], "idemgate");
    c.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;

    let list = c
        .request(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .await;
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "idemgate_operation_status",
            "email_send",
            "reports_generate",
            "tickets_create",
            "tickets_get",
            "tickets_set_status"
        ]
    );

    let missing = c.request(call(3, "tickets_create", ticket(), None)).await;
    assert_eq!(missing["result"]["isError"], true);
    assert_eq!(
        missing["result"]["structuredContent"]["error"]["code"],
        "missing_operation_key"
    );

    let first = c
        .request(call(4, "tickets_create", ticket(), Some("s1")))
        .await;
    let second = c
        .request(call(5, "tickets_create", ticket(), Some("s1")))
        .await;
    assert_eq!(first["result"]["structuredContent"]["status"], "applied");
    assert_eq!(second["result"]["structuredContent"]["status"], "replayed");
    assert_eq!(second["result"]["isError"], false);
    let fake = w.fakes.get("tickets.create").unwrap();
    assert_eq!((fake.effects(), fake.calls()), (1, 1));

    let key = first["result"]["structuredContent"]["operation_key"].clone();
    assert_eq!(key, "acme:test:run_827:s1");
    let status = c
        .request(call(
            6,
            "idemgate_operation_status",
            json!({"operation_key": key}),
            None,
        ))
        .await;
    assert_eq!(status["result"]["structuredContent"]["status"], "replayed");

    let unknown = c.request(call(7, "tickets.create", ticket(), None)).await;
    assert!(unknown["error"].is_object(), "{unknown}");

    let _ = stop_tx.send(());
    tokio::time::timeout(LIMIT, serving)
        .await
        .expect("the server stops on shutdown")
        .unwrap()
        .unwrap();
}

/// One HTTP/1.1 request on a fresh connection; answers status and body.
async fn post(addr: std::net::SocketAddr, headers: &[(&str, &str)], body: &Value) -> (u16, Value) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = body.to_string();
    let mut request = format!(
        "POST /mcp HTTP/1.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if !headers.iter().any(|(h, _)| h.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    for (h, v) in headers {
        request.push_str(&format!("{h}: {v}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(&body);
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(LIMIT, stream.read_to_end(&mut raw))
        .await
        .expect("an answer in time")
        .unwrap();
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    // JSON bodies only here; a chunked body is de-chunked crudely by taking the JSON object.
    let start = rest.find('{');
    let end = rest.rfind('}');
    let json = match (start, end) {
        (Some(s), Some(e)) => serde_json::from_str(&rest[s..=e]).unwrap_or(Value::Null),
        _ => Value::Null,
    };
    (status, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_authenticates_each_request_and_scopes_status_by_tenant() {
    let w = world();
    let auth = |parts: &axum::http::request::Parts| {
        let value = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
        match value {
            "Bearer a" => Some(caller("acme")),
            "Bearer g" => Some(caller("globex")),
            _ => None,
        }
    };
    let options = HttpOptions {
        allowed_hosts: vec!["127.0.0.1".into(), "mcp.example".into()],
        ..HttpOptions::default()
    };
    let mcp = idemgate_mcp::streamable_http_service_with(w.gateway.clone(), auth, options).unwrap();
    let app = Router::new().nest_service("/mcp", mcp.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop_rx.await;
                mcp.shutdown();
            })
            .await
    });

    // (headers, body) ⇒ (status, what the answer says)
    let acme = [("Authorization", "Bearer a")];
    let globex = [("Authorization", "Bearer g")];
    let (status, body) = post(addr, &[], &initialize(1)).await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (401, json!("unauthorized"))
    );
    let (status, _) = post(
        addr,
        &[("Authorization", "Bearer a"), ("Host", "evil.example")],
        &initialize(1),
    )
    .await;
    assert_eq!(status, 403, "a Host outside the allow-list");
    let (status, body) = post(
        addr,
        &[("Authorization", "Bearer a"), ("Host", "mcp.example")],
        &initialize(1),
    )
    .await;
    assert_eq!(
        (status, body["result"]["serverInfo"]["name"].clone()),
        (200, json!("idemgate"))
    );

    let (status, first) = post(
        addr,
        &acme,
        &call(2, "tickets_create", ticket(), Some("s1")),
    )
    .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["result"]["structuredContent"]["status"], "applied");
    let (_, again) = post(
        addr,
        &acme,
        &call(3, "tickets_create", ticket(), Some("s1")),
    )
    .await;
    assert_eq!(again["result"]["structuredContent"]["status"], "replayed");
    assert_eq!(w.fakes.get("tickets.create").unwrap().effects(), 1);

    let key = first["result"]["structuredContent"]["operation_key"].clone();
    assert_eq!(key, "acme:test:run_827:s1");
    let status_call = |id| {
        call(
            id,
            "idemgate_operation_status",
            json!({"operation_key": key}),
            None,
        )
    };
    let (_, mine) = post(addr, &acme, &status_call(4)).await;
    assert_eq!(mine["result"]["structuredContent"]["status"], "replayed");
    let (_, theirs) = post(addr, &globex, &status_call(5)).await;
    assert_eq!(theirs["result"]["isError"], true);
    assert_eq!(
        theirs["result"]["structuredContent"]["error"]["code"],
        "not_found"
    );
    // globex's own step of the same name is its own operation.
    let (_, own) = post(
        addr,
        &globex,
        &call(6, "tickets_create", ticket(), Some("s1")),
    )
    .await;
    assert_eq!(
        own["result"]["structuredContent"]["operation_key"],
        "globex:test:run_827:s1"
    );
    assert_eq!(w.fakes.get("tickets.create").unwrap().effects(), 2);

    let _ = stop_tx.send(());
    tokio::time::timeout(LIMIT, serving)
        .await
        .expect("graceful shutdown")
        .unwrap()
        .unwrap();
}
