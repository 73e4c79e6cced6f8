//! Black-box over real loopback HTTP: the gateway on port 0, the HTTP downstream and its
//! authorization hook calling a fake ticket service that counts its own effects.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use idemgate_app::{HttpEffects, ToolSet};
use idemgate_conformance::downstream::FakeDownstream;
use idemgate_conformance::http_fake::{FakeServer, HttpFault};
use idemgate_core::contract::Contract;
use idemgate_core::store::Store;
use idemgate_server::{AppState, Gateway};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// `tickets.create` against the fake: it deduplicates and offers a lookup, and has a hook.
fn tickets_contract(fake: SocketAddr) -> Contract {
    let text = format!(
        r#"
name: tickets.create
version: "1"
effect_class: key_based
input_schema:
  type: object
  properties:
    subject: {{type: string, minLength: 1}}
    body: {{type: string}}
  required: [subject, body]
  additionalProperties: false
request_fingerprint:
  fields: [subject, body]
downstream:
  deduplicates_by_key: true
  receipt_lookup: true
  http:
    url: http://{fake}/tickets
    reference: /ticket_id
    lookup:
      url: http://{fake}/tickets/by-key/{{operation_key}}
      reference: /ticket_id
security:
  authorization_hook:
    url: http://{fake}/auth
retention:
  record_ttl: 1h
  tombstone_ttl: 1d
  max_retry_window: 1h
lease_seconds: 3
"#
    );
    Contract::load(&text, "tickets.create.yaml").unwrap()
}

/// `notes.append` against a fake that neither deduplicates nor offers a lookup.
fn notes_contract(fake: SocketAddr) -> Contract {
    let text = format!(
        r#"
name: notes.append
version: "1"
effect_class: key_based
input_schema:
  type: object
  properties:
    subject: {{type: string}}
    body: {{type: string}}
  required: [subject, body]
  additionalProperties: false
request_fingerprint:
  fields: [subject, body]
downstream:
  http:
    url: http://{fake}/tickets
    reference: /ticket_id
retention:
  record_ttl: 1h
  tombstone_ttl: 1d
  max_retry_window: 1h
lease_seconds: 3
"#
    );
    Contract::load(&text, "notes.append.yaml").unwrap()
}

fn state(store: Arc<dyn Store>, contracts: Vec<Contract>) -> AppState {
    let tools = ToolSet::build(contracts, &HttpEffects).unwrap();
    Gateway::new(store, tools, tokens())
        .environment(ENV)
        .build()
}

fn sqlite(path: &Path) -> Arc<dyn Store> {
    Arc::new(idemgate_store_sqlite::SqliteStore::open(path, Default::default()).unwrap())
}

fn body(workflow: &str, subject: &str) -> Value {
    json!({"workflow_id": workflow, "step_id": "s", "arguments": {"subject": subject, "body": "Order 42 arrived broken."}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_replayed_mismatch_unknown_reconcile_over_http() {
    let tickets = FakeServer::start().await;
    let notes = FakeServer::start_with(FakeDownstream::new(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::start(state(
        sqlite(&dir.path().join("gate.sqlite")),
        vec![
            tickets_contract(tickets.addr()),
            notes_contract(notes.addr()),
        ],
    ))
    .await;

    let applied = http(
        gate.addr,
        invoke("tickets.create", AGENT, body("run_1", "Refund")),
    )
    .await;
    assert_eq!(applied.status, 200, "{}", applied.text);
    assert_eq!(applied.outcome(), "applied");
    let reference = applied.json["effect_reference"]
        .as_str()
        .unwrap()
        .to_string();
    let seen = tickets.requests();
    assert_eq!(
        seen.last().unwrap().idempotency_key.as_deref(),
        Some("acme:test:run_1:s")
    );

    let replayed = http(
        gate.addr,
        invoke("tickets.create", AGENT, body("run_1", "Refund")),
    )
    .await;
    assert_eq!(replayed.status, 200);
    assert_eq!(replayed.header("idempotent-replayed"), Some("true"));
    assert_eq!(replayed.json["effect_reference"], reference.as_str());

    let mismatch = http(
        gate.addr,
        invoke("tickets.create", AGENT, body("run_1", "Other")),
    )
    .await;
    mismatch.assert_problem_after_effect(422, "idempotency_key_reused_with_different_request");
    assert_eq!(
        tickets.downstream().effects(),
        1,
        "counted on the ticket service's side"
    );

    notes.push_fault(HttpFault::CommitThenDrop);
    let unknown = http(
        gate.addr,
        invoke("notes.append", AGENT, body("run_2", "Hello")),
    )
    .await;
    assert_eq!(unknown.status, 202, "{}", unknown.text);
    assert_eq!(unknown.outcome(), "unknown");
    assert_eq!(notes.downstream().effects(), 1);

    let queue = http(
        gate.addr,
        Call::get("/v1/operations?status=unknown", OPERATOR),
    )
    .await;
    assert_eq!(
        queue.json["operations"][0]["operation_key"],
        "acme:test:run_2:s"
    );
    let settle = json!({"resolution": "applied", "effect_reference": "ticket_1", "result": {"ticket_id": "ticket_1"}});
    let reconciled = http(
        gate.addr,
        Call::post(
            "/v1/operations/acme:test:run_2:s/reconcile",
            OPERATOR,
            settle.to_string(),
        ),
    )
    .await;
    assert_eq!(reconciled.status, 200, "{}", reconciled.text);
    let after = http(
        gate.addr,
        invoke("notes.append", AGENT, body("run_2", "Hello")),
    )
    .await;
    assert_eq!(after.outcome(), "replayed");
    assert_eq!(notes.downstream().effects(), 1);

    gate.stop().await;
    tickets.shutdown().await;
    notes.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_response_is_settled_by_the_receipt_and_concurrent_deliveries_make_one_effect() {
    let tickets = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::start(state(
        sqlite(&dir.path().join("gate.sqlite")),
        vec![tickets_contract(tickets.addr())],
    ))
    .await;

    tickets.push_fault(HttpFault::CommitThenDrop);
    let first = http(
        gate.addr,
        invoke("tickets.create", AGENT, body("run_3", "a")),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.text);
    let retry = http(
        gate.addr,
        invoke("tickets.create", AGENT, body("run_3", "a")),
    )
    .await;
    assert_eq!(retry.outcome(), "replayed");
    assert_eq!(
        retry.json["effect_reference"],
        first.json["effect_reference"]
    );
    assert_eq!(tickets.downstream().effects(), 1);

    let mut deliveries = Vec::new();
    for _ in 0..8 {
        let addr = gate.addr;
        deliveries.push(tokio::spawn(async move {
            http(addr, invoke("tickets.create", AGENT, body("run_4", "same"))).await
        }));
    }
    for d in deliveries {
        let r = d.await.unwrap();
        assert!(matches!(r.status, 200 | 409), "{}", r.text);
    }
    assert_eq!(
        tickets.downstream().effects(),
        2,
        "one effect for run_3, one for run_4"
    );

    // Authorization revoked between a first delivery and its retry.
    tickets.auth_switch().deny("account closed");
    let revoked = http(
        gate.addr,
        invoke("tickets.create", AGENT, body("run_3", "a")),
    )
    .await;
    revoked.assert_problem_after_effect(403, "forbidden");
    tickets.auth_switch().unavailable();
    let closed = http(
        gate.addr,
        invoke("tickets.create", AGENT, body("run_5", "a")),
    )
    .await;
    assert_eq!(closed.outcome(), "rejected");
    assert_eq!(tickets.downstream().effects(), 2);

    gate.stop().await;
    tickets.shutdown().await;
}

/// A crash after the downstream committed and before the gateway recorded it: the first
/// gateway runs in its own runtime, paused after the commit, and is torn down whole (its
/// lease renewal with it); a second gateway on the same SQLite file recovers the receipt.
#[test]
fn a_crash_after_the_commit_is_recovered_by_a_restarted_gateway() {
    let test = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gate.sqlite");
    let tickets = test.block_on(FakeServer::start());
    let contract_addr = tickets.addr();

    // The first gateway, in a runtime that will be dropped mid-request.
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let store = sqlite(&file);
    let first = doomed.block_on(Gate::start(state(
        store,
        vec![tickets_contract(contract_addr)],
    )));
    tickets.downstream().after_commit().arm();
    let addr = first.addr;
    let delivery =
        test.spawn(
            async move { http(addr, invoke("tickets.create", AGENT, body("run_6", "a"))).await },
        );
    test.block_on(idemgate_conformance::gate::bounded(
        "the effect is committed",
        tickets.downstream().after_commit().reached(),
    ));
    assert_eq!(tickets.downstream().effects(), 1);
    doomed.shutdown_timeout(Duration::from_millis(100));
    drop(first);
    let _ = test.block_on(async { tokio::time::timeout(Duration::from_secs(5), delivery).await });
    tickets.downstream().after_commit().disarm();
    tickets.downstream().after_commit().release();

    test.block_on(async {
        let state = state(sqlite(&file), vec![tickets_contract(contract_addr)]);
        let recoverer = state.recoverer();
        let (stop, stopped) = oneshot::channel::<()>();
        let background = tokio::spawn(recoverer.run(
            Duration::from_millis(200),
            Duration::from_secs(60),
            async move {
                let _ = stopped.await;
            },
        ));
        let second = Gate::start(state).await;
        // The lease (3 s) must expire before recovery may look the receipt up.
        let mut settled = Value::Null;
        for _ in 0..60 {
            let view = http(
                second.addr,
                Call::get("/v1/operations/acme:test:run_6:s", AGENT),
            )
            .await;
            if view.json["record_status"] == "applied" {
                settled = view.json;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(
            settled["record_status"], "applied",
            "the recoverer settled it"
        );
        let retry = http(
            second.addr,
            invoke("tickets.create", AGENT, body("run_6", "a")),
        )
        .await;
        assert_eq!(retry.outcome(), "replayed", "{}", retry.text);
        assert_eq!(
            tickets.downstream().effects(),
            1,
            "one effect across the crash"
        );
        let _ = stop.send(());
        background.await.unwrap();
        second.stop().await;
    });
    test.block_on(tickets.shutdown());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_requests_in_flight_and_stops_accepting() {
    let tickets = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::start(state(
        sqlite(&dir.path().join("gate.sqlite")),
        vec![tickets_contract(tickets.addr())],
    ))
    .await;
    tickets.push_fault(HttpFault::CommitThenDelay(Duration::from_millis(800)));
    let addr = gate.addr;
    let slow = tokio::spawn(async move {
        http(addr, invoke("tickets.create", AGENT, body("run_7", "a"))).await
    });
    for _ in 0..100 {
        if tickets.downstream().effects() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(tickets.downstream().effects(), 1);
    gate.stop().await;
    let answer = slow.await.unwrap();
    assert_eq!(
        answer.status, 200,
        "the request in flight finished: {}",
        answer.text
    );
    assert_eq!(answer.outcome(), "applied");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
    tickets.shutdown().await;
}

/// A URL placeholder whose value would move the path (`..`, `.`, empty) is invalid arguments,
/// refused before any record is written or any request sent; an ordinary value goes where the
/// template says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placeholder_that_would_move_the_path_is_refused_before_any_record() {
    let fake = FakeServer::start().await;
    let text = format!(
        r#"
name: tickets.create
version: "1"
effect_class: key_based
input_schema:
  type: object
  properties:
    account: {{type: string}}
    subject: {{type: string, minLength: 1}}
  required: [account, subject]
  additionalProperties: false
request_fingerprint:
  fields: [account, subject]
downstream:
  deduplicates_by_key: true
  http:
    url: http://{addr}/accounts/{{account}}/tickets
    reference: /ticket_id
retention:
  record_ttl: 1h
  tombstone_ttl: 1d
  max_retry_window: 1h
"#,
        addr = fake.addr()
    );
    let contract = Contract::load(&text, "tickets.create.yaml").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(&dir.path().join("gate.sqlite"));
    let gate = Gate::start(state(store.clone(), vec![contract])).await;
    for (i, account) in ["..", ".", ""].into_iter().enumerate() {
        let body = json!({"workflow_id": format!("run_{i}"), "step_id": "s",
                          "arguments": {"account": account, "subject": "Refund"}});
        let r = http(gate.addr, invoke("tickets.create", AGENT, body)).await;
        r.assert_problem_safe(400, "invalid_arguments");
        assert!(r.text.contains("account"), "names the argument: {}", r.text);
        let key =
            idemgate_core::key::OperationKey::new("acme", ENV, &format!("run_{i}"), "s").unwrap();
        assert!(
            store.get(&key).await.unwrap().is_none(),
            "no record for {account:?}"
        );
    }
    assert!(
        fake.requests().is_empty(),
        "nothing was sent: {:?}",
        fake.requests()
    );
    assert_eq!(fake.downstream().effects(), 0);
    gate.stop().await;
    fake.shutdown().await;
}

/// A request refused before its body was read (here: an unknown tool) leaves the rest of the
/// body on the connection; the answer says `Connection: close`, so a keep-alive client opens a
/// new connection instead of losing its next request on this one. A request whose body was
/// read keeps the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_before_the_body_is_read_closes_the_connection_honestly() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tickets = FakeServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::start(state(
        sqlite(&dir.path().join("gate.sqlite")),
        vec![tickets_contract(tickets.addr())],
    ))
    .await;
    let request = |path: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: gate\r\nAuthorization: Bearer {AGENT}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let read_head = |text: &str| {
        text.split("\r\n\r\n")
            .next()
            .unwrap_or("")
            .to_ascii_lowercase()
    };
    let padding = "x".repeat(4000);
    let body = format!(
        r#"{{"workflow_id": "w", "step_id": "s", "arguments": {{"subject": "{padding}", "body": "b"}}}}"#
    );

    // Refused before the body: the answer closes the connection, and says so.
    let mut stream = tokio::net::TcpStream::connect(gate.addr).await.unwrap();
    stream
        .write_all(request("/v1/tools/no.such.tool/invoke", &body).as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the connection is closed after the answer")
        .unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 404"), "{text}");
    assert!(
        read_head(&text).contains("connection: close"),
        "a connection that cannot carry another request says so: {text}"
    );

    // Read to its end: the connection carries the next request.
    let mut stream = tokio::net::TcpStream::connect(gate.addr).await.unwrap();
    let wrong = r#"{"workflow_id": "w", "step_id": "s", "arguments": {"subject": 5, "body": "b"}}"#;
    stream
        .write_all(request("/v1/tools/tickets.create/invoke", wrong).as_bytes())
        .await
        .unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: gate\r\n\r\n")
        .await
        .unwrap();
    let mut seen = String::new();
    let mut buffer = [0u8; 8192];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.matches("HTTP/1.1 ").count() < 2 {
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buffer))
            .await
            .expect("both answers arrive")
            .unwrap();
        assert!(n > 0, "the connection closed after one answer: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buffer[..n]));
    }
    assert!(seen.starts_with("HTTP/1.1 400"), "{seen}");
    assert!(!read_head(&seen).contains("connection: close"), "{seen}");
    assert_eq!(tickets.downstream().effects(), 0);
    tickets.shutdown().await;
}
