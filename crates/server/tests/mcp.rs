//! The MCP face mounted in the gateway, over real loopback HTTP with the MCP wire format
//! (JSON-RPC over streamable HTTP): `/mcp` on the same app, tokens and executor as API v1, as
//! `idemgate serve` mounts it. Effects are counted by the fake downstreams on their own side.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use idemgate_core::store::Store;
use idemgate_server::Gateway;
use serde_json::{Value, json};

fn sqlite(path: &Path) -> Arc<dyn Store> {
    Arc::new(idemgate_store_sqlite::SqliteStore::open(path, Default::default()).unwrap())
}

/// The example contracts and `notes.append` over counting fakes, acme's and globex's tokens.
fn world(dir: &Path) -> (Fakes, Gateway) {
    let mut fakes = Fakes::new();
    let tools = fakes.tools();
    let gateway = Gateway::new(sqlite(&dir.join("gate.sqlite")), tools, tokens()).environment(ENV);
    (fakes, gateway)
}

fn ticket() -> Value {
    json!({"subject": "Refund request", "body": "Order 42 arrived broken."})
}

fn tools_call(id: u64, tool: &str, arguments: Value, step: Option<(&str, &str)>) -> Value {
    let mut params = json!({"name": tool, "arguments": arguments});
    if let Some((workflow_id, step_id)) = step {
        params["_meta"] =
            json!({"io.idemgate/operation": {"workflow_id": workflow_id, "step_id": step_id}});
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

fn status_call(id: u64, key: &str) -> Value {
    tools_call(
        id,
        "idemgate_operation_status",
        json!({"operation_key": key}),
        None,
    )
}

/// One JSON-RPC request to `/mcp` as a streamable-HTTP client sends it.
fn mcp_call(token: &'static str, message: &Value) -> Call<'static> {
    Call::post("/mcp", token, message.to_string())
        .header("Accept", "application/json, text/event-stream")
}

async fn mcp(addr: std::net::SocketAddr, token: &'static str, message: &Value) -> Value {
    let reply = http(addr, mcp_call(token, message)).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.json["id"], message["id"], "{}", reply.text);
    reply.json
}

/// The outcome a tool call answered.
fn outcome(answer: &Value) -> &Value {
    &answer["result"]["structuredContent"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_lists_tools_and_authenticates_with_the_api_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let (fakes, gateway) = world(dir.path());
    let gate = Gate::start(gateway.build()).await;

    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "server-mcp-test", "version": "0"}}});
    let answer = mcp(gate.addr, AGENT, &init).await;
    assert_eq!(answer["result"]["serverInfo"]["name"], "idemgate");

    let list = mcp(
        gate.addr,
        AGENT,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    )
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
            "notes_append",
            "reports_generate",
            "tickets_create",
            "tickets_get",
            "tickets_set_status"
        ],
        "the gateway's loaded contracts, and no fake-downstream control tool"
    );

    // No token, an unaccepted token, another scheme: 401 with a Bearer challenge, and no
    // call reaches a downstream.
    let call = tools_call(3, "tickets_create", ticket(), Some(("run_1", "s")));
    for request in [
        mcp_call(AGENT, &call).anonymous(),
        mcp_call("not-a-token", &call),
        mcp_call(AGENT, &call)
            .anonymous()
            .header("Authorization", format!("Basic {AGENT}")),
    ] {
        let reply = http(gate.addr, request).await;
        assert_eq!(reply.status, 401, "{}", reply.text);
        assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
        assert_eq!(reply.json["error"]["code"], "unauthorized");
    }
    // A Host outside the allow-list (default: loopback names) is refused: DNS rebinding.
    let reply = http(
        gate.addr,
        mcp_call(AGENT, &call).header("Host", "evil.example"),
    )
    .await;
    assert_eq!(reply.status, 403, "{}", reply.text);
    assert_eq!(fakes.total_calls(), 0);

    // The OpenAPI document describes API v1 only; `/mcp` is JSON-RPC, not a REST resource.
    let doc = http(gate.addr, Call::get("/openapi.json", AGENT)).await;
    assert!(doc.json["paths"].get("/mcp").is_none());
    gate.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_operation_through_mcp_and_the_http_api_has_one_effect() {
    let dir = tempfile::tempdir().unwrap();
    let (fakes, gateway) = world(dir.path());
    let gate = Gate::start(gateway.build()).await;
    let tickets = fakes.fake("tickets.create");

    // No `_meta`: the model-facing call names no operation, so nothing is sent.
    let missing = mcp(
        gate.addr,
        AGENT,
        &tools_call(1, "tickets_create", ticket(), None),
    )
    .await;
    assert_eq!(missing["result"]["isError"], true, "{missing}");
    assert_eq!(outcome(&missing)["status"], "rejected");
    assert_eq!(outcome(&missing)["error"]["code"], "missing_operation_key");
    assert_eq!(tickets.calls(), 0);

    // The same operation twice through /mcp: one effect, the second answer replayed.
    let step = Some(("run_827", "record_issue"));
    let first = mcp(
        gate.addr,
        AGENT,
        &tools_call(2, "tickets_create", ticket(), step),
    )
    .await;
    assert_eq!(outcome(&first)["status"], "applied", "{first}");
    assert_eq!(
        outcome(&first)["operation_key"],
        "acme:test:run_827:record_issue",
        "tenant from the token, environment from the gateway"
    );
    let again = mcp(
        gate.addr,
        AGENT,
        &tools_call(3, "tickets_create", ticket(), step),
    )
    .await;
    assert_eq!(outcome(&again)["status"], "replayed", "{again}");
    assert_eq!(again["result"]["isError"], false);
    assert_eq!(
        outcome(&again)["effect_reference"],
        outcome(&first)["effect_reference"]
    );
    assert_eq!(tickets.effects(), 1, "counted on the downstream's side");

    // The same workflow step through API v1: the same operation, replayed.
    let api = http(
        gate.addr,
        invoke(
            "tickets.create",
            AGENT,
            json!({"workflow_id": "run_827", "step_id": "record_issue", "arguments": ticket()}),
        ),
    )
    .await;
    assert_eq!(api.status, 200, "{}", api.text);
    assert_eq!(api.outcome(), "replayed");
    assert_eq!(api.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        api.json["effect_reference"],
        outcome(&first)["effect_reference"]
    );
    assert_eq!(tickets.effects(), 1);

    // And the other way round: API v1 first, then /mcp.
    let api = http(
        gate.addr,
        invoke(
            "tickets.create",
            AGENT,
            json!({"workflow_id": "run_827", "step_id": "second", "arguments": ticket()}),
        ),
    )
    .await;
    assert_eq!(api.outcome(), "applied", "{}", api.text);
    let later = mcp(
        gate.addr,
        AGENT,
        &tools_call(4, "tickets_create", ticket(), Some(("run_827", "second"))),
    )
    .await;
    assert_eq!(outcome(&later)["status"], "replayed", "{later}");
    assert_eq!(tickets.effects(), 2);

    // A changed request under the same step is a mismatch on either face.
    let changed = mcp(
        gate.addr,
        AGENT,
        &tools_call(
            5,
            "tickets_create",
            json!({"subject": "Other", "body": "x"}),
            step,
        ),
    )
    .await;
    assert_eq!(
        outcome(&changed)["error"]["code"],
        "idempotency_key_reused_with_different_request"
    );
    // Parts longer than the API's bound are refused the same way.
    let long = "w".repeat(129);
    let refused = mcp(
        gate.addr,
        AGENT,
        &tools_call(6, "tickets_create", ticket(), Some((&long, "s"))),
    )
    .await;
    assert_eq!(outcome(&refused)["error"]["code"], "invalid_operation_key");
    assert_eq!(tickets.effects(), 2);
    assert_eq!(tickets.calls(), 2);

    // MCP deliveries are counted by the same observer as the API's.
    let metrics = http(gate.addr, Call::get("/metrics", AGENT)).await;
    assert!(
        metrics
            .text
            .lines()
            .any(|l| l.starts_with("idemgate_outcomes_total")
                && l.contains("tool=\"tickets.create\"")
                && l.contains("code=\"missing_operation_key\"")),
        "{}",
        metrics.text
    );
    gate.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_tool_is_tenant_and_environment_scoped() {
    let dir = tempfile::tempdir().unwrap();
    let (fakes, gateway) = world(dir.path());
    let gate = Gate::start(gateway.build()).await;

    let first = mcp(
        gate.addr,
        AGENT,
        &tools_call(1, "tickets_create", ticket(), Some(("run_1", "s"))),
    )
    .await;
    let key = outcome(&first)["operation_key"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(key, "acme:test:run_1:s");

    let mine = mcp(gate.addr, AGENT, &status_call(2, &key)).await;
    assert_eq!(outcome(&mine)["status"], "replayed", "{mine}");
    assert_eq!(outcome(&mine)["operation_key"], key.as_str());

    // Another tenant's key answers exactly as a missing one, operator token or not.
    let theirs = mcp(gate.addr, OTHER, &status_call(3, &key)).await;
    let missing = mcp(gate.addr, OTHER, &status_call(4, "globex:test:run_1:s")).await;
    assert_eq!(theirs["result"]["isError"], true);
    assert_eq!(outcome(&theirs)["error"]["code"], "not_found");
    assert_eq!(outcome(&theirs), outcome(&missing));
    // So does the tenant's own key in another environment.
    let elsewhere = mcp(gate.addr, AGENT, &status_call(5, "acme:production:run_1:s")).await;
    assert_eq!(outcome(&elsewhere), outcome(&missing));
    // As over API v1.
    let api = http(gate.addr, Call::get(format!("/v1/operations/{key}"), OTHER)).await;
    assert_eq!(api.status, 404);
    assert_eq!(fakes.fake("tickets.create").effects(), 1);
    gate.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_host_allow_list_is_configurable() {
    let dir = tempfile::tempdir().unwrap();
    let (_fakes, gateway) = world(dir.path());
    let config = idemgate_mcp::config::McpConfig {
        allowed_hosts: Some(vec!["gate.example".into()]),
        ..Default::default()
    };
    let gate = Gate::start_with(gateway.build(), &config).await;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let allowed = http(
        gate.addr,
        mcp_call(AGENT, &list).header("Host", "gate.example"),
    )
    .await;
    assert_eq!(allowed.status, 200, "{}", allowed.text);
    let loopback = http(gate.addr, mcp_call(AGENT, &list)).await;
    assert_eq!(loopback.status, 403, "only the configured names");
    gate.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_bodies_keep_the_api_body_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (fakes, gateway) = world(dir.path());
    let limits = idemgate_server::config::Limits {
        body_bytes: 2048,
        ..idemgate_server::config::Limits::default()
    };
    let gate = Gate::start(gateway.limits(limits).build()).await;
    let mut big = ticket();
    big["body"] = json!("x".repeat(4096));
    let call = tools_call(7, "tickets_create", big, Some(("run_1", "big")));
    let reply = http(gate.addr, mcp_call(AGENT, &call)).await;
    assert_eq!(reply.status, 413, "{}", reply.text);
    assert_eq!(
        reply.json["error"]["code"], "invalid_arguments",
        "{}",
        reply.text
    );
    assert_eq!(
        fakes.total_effects(),
        0,
        "an oversized call reaches no downstream"
    );
    // Within the bound the same face works.
    let small = tools_call(8, "tickets_create", ticket(), Some(("run_1", "small")));
    let answer = mcp(gate.addr, AGENT, &small).await;
    assert_eq!(outcome(&answer)["status"], "applied", "{answer}");
    gate.stop().await;
}

/// The status tool hands out a stored result like a replay: a revoked caller is refused, and
/// hears nothing of the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_tool_rechecks_the_caller() {
    let dir = tempfile::tempdir().unwrap();
    let (fakes, gateway) = world(dir.path());
    let gate = Gate::start(gateway.build()).await;
    let first = mcp(
        gate.addr,
        AGENT,
        &tools_call(1, "tickets_create", ticket(), Some(("run_r", "s"))),
    )
    .await;
    assert_eq!(outcome(&first)["status"], "applied", "{first}");
    let reference = outcome(&first)["effect_reference"]
        .as_str()
        .unwrap()
        .to_string();
    fakes.hook.set(idemgate_core::effect::Authorization::Denied(
        "revoked".into(),
    ));
    let read = mcp(gate.addr, AGENT, &status_call(2, "acme:test:run_r:s")).await;
    assert_eq!(read["result"]["isError"], true, "{read}");
    assert_eq!(outcome(&read)["error"]["code"], "forbidden", "{read}");
    assert!(outcome(&read)["result"].is_null());
    assert!(!read.to_string().contains(&reference), "{read}");
    assert_eq!(fakes.fake("tickets.create").effects(), 1);
    gate.stop().await;
}
