//! API v1 through the router (no socket): outcomes, status codes and headers, the seed's
//! scenarios, tenants and roles, and hostile input. Effects are counted on the fake
//! downstream's own side.

mod common;

use std::sync::Arc;

use axum::Router;
use common::*;
use idemgate_conformance::downstream::Fault;
use idemgate_conformance::harness::EPOCH;
use idemgate_conformance::mem::MemStore;
use idemgate_core::clock::ManualClock;
use idemgate_core::effect::Authorization;
use idemgate_core::key::OperationKey;
use idemgate_core::store::Store;
use idemgate_server::Gateway;
use serde_json::{Value, json};

struct Env {
    app: Router,
    fakes: Fakes,
    store: Arc<MemStore>,
    clock: Arc<ManualClock>,
}

fn env() -> Env {
    let mut fakes = Fakes::new();
    let tools = fakes.tools();
    let store = Arc::new(MemStore::new());
    let clock = Arc::new(ManualClock::new(EPOCH));
    let state = Gateway::new(store.clone(), tools, tokens())
        .clock(clock.clone())
        .environment(ENV)
        .build();
    Env {
        app: idemgate_server::router(state),
        fakes,
        store,
        clock,
    }
}

fn ticket(workflow: &str, step: &str, subject: &str) -> Value {
    json!({"workflow_id": workflow, "step_id": step, "arguments": {"subject": subject, "body": "Order 42 arrived broken."}})
}

fn note(workflow: &str, text: &str) -> Value {
    json!({"workflow_id": workflow, "step_id": "s1", "arguments": {"text": text}})
}

fn key(workflow: &str, step: &str) -> OperationKey {
    OperationKey::new("acme", ENV, workflow, step).unwrap()
}

#[tokio::test]
async fn applied_replayed_mismatch_unknown_reconcile() {
    let e = env();
    let tickets = e.fakes.fake("tickets.create");

    let first = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_1", "create", "Refund")),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.outcome(), "applied");
    assert_eq!(first.json["status"], "applied");
    assert_eq!(first.json["operation_key"], "acme:test:run_1:create");
    assert_eq!(first.json["safe_to_repeat"], false);
    assert!(first.header("idempotent-replayed").is_none());
    let reference = first.json["effect_reference"].as_str().unwrap().to_string();

    let again = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_1", "create", "Refund")),
    )
    .await;
    assert_eq!(again.status, 200);
    assert_eq!(again.outcome(), "replayed");
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.json["effect_reference"], reference.as_str());

    let changed = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_1", "create", "Other")),
    )
    .await;
    changed.assert_problem_after_effect(422, "idempotency_key_reused_with_different_request");
    assert_eq!(changed.json["next_action"], "inspect_operation");
    assert!(
        !changed.text.contains("Other"),
        "a mismatch never echoes the request"
    );
    assert_eq!(tickets.effects_for(&key("run_1", "create")), 1);

    // A lost answer where the downstream neither deduplicates nor offers a lookup: unknown.
    let notes = e.fakes.fake("notes.append");
    notes.push_fault(Fault::CommitThenDrop);
    let lost = route(
        &e.app,
        invoke("notes.append", AGENT, note("run_2", "hello")),
    )
    .await;
    assert_eq!(lost.status, 202, "{}", lost.text);
    assert_eq!(lost.outcome(), "unknown");
    assert_eq!(lost.json["next_action"], "reconcile");
    assert_eq!(lost.json["error"]["code"], "outcome_unknown");
    let retry = route(
        &e.app,
        invoke("notes.append", AGENT, note("run_2", "hello")),
    )
    .await;
    assert_eq!(
        retry.outcome(),
        "unknown",
        "a retry never sends blindly again"
    );
    assert_eq!(notes.effects(), 1);

    let queue = route(&e.app, Call::get("/v1/operations?status=unknown", OPERATOR)).await;
    assert_eq!(queue.status, 200, "{}", queue.text);
    assert_eq!(
        queue.json["operations"][0]["operation_key"],
        "acme:test:run_2:s1"
    );
    assert_eq!(queue.json["operations"].as_array().unwrap().len(), 1);

    let path = "/v1/operations/acme:test:run_2:s1/reconcile";
    let by_agent = route(&e.app, Call::post(path, AGENT, "")).await;
    by_agent.assert_problem(403, "forbidden");
    let receipt = notes.receipt_for(&key("run_2", "s1")).unwrap();
    let body = json!({"resolution": "applied", "effect_reference": receipt.reference, "result": receipt.result});
    let settled = route(&e.app, Call::post(path, OPERATOR, body.to_string())).await;
    assert_eq!(settled.status, 200, "{}", settled.text);
    assert_eq!(settled.json["effect_reference"], receipt.reference.as_str());

    let after = route(
        &e.app,
        invoke("notes.append", AGENT, note("run_2", "hello")),
    )
    .await;
    assert_eq!(after.status, 200);
    assert_eq!(after.outcome(), "replayed");
    assert_eq!(notes.effects(), 1);

    let view = route(
        &e.app,
        Call::get("/v1/operations/acme:test:run_2:s1", AGENT),
    )
    .await;
    assert_eq!(view.status, 200, "{}", view.text);
    assert_eq!(view.json["record_status"], "applied");
    assert_eq!(
        view.json["receipt"]["reference"],
        receipt.reference.as_str()
    );
    let kinds: Vec<&str> = view.json["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"reconciled"), "{kinds:?}");
    assert_eq!(view.outcome(), "replayed");
}

#[tokio::test]
async fn reconcile_not_applied_lets_the_key_run_again() {
    let e = env();
    let notes = e.fakes.fake("notes.append");
    notes.push_fault(Fault::Timeout);
    let lost = route(&e.app, invoke("notes.append", AGENT, note("run_3", "x"))).await;
    assert_eq!(lost.outcome(), "unknown", "{}", lost.text);
    assert_eq!(notes.effects(), 0);
    let path = "/v1/operations/acme:test:run_3:s1/reconcile";
    let lookup = route(&e.app, Call::post(path, OPERATOR, "")).await;
    lookup.assert_problem(422, "conflict");
    let settled = route(
        &e.app,
        Call::post(path, OPERATOR, r#"{"resolution":"not_applied"}"#),
    )
    .await;
    assert!(settled.status < 500, "{}", settled.text);
    let run = route(&e.app, invoke("notes.append", AGENT, note("run_3", "x"))).await;
    assert_eq!(run.status, 200, "{}", run.text);
    assert_eq!(notes.effects(), 1);
}

#[tokio::test]
async fn hostile_input_leaves_no_record_and_no_downstream_call() {
    let e = env();
    let deep = format!("{}1{}", "[".repeat(40), "]".repeat(40));
    // The last column: whether the refusal may say `safe_to_repeat`. Only where the delivery
    // was read far enough to know the operation it named (none, or a key without a record) does
    // the machine prove it; a refusal of an unread body, a credential or a read claims nothing.
    let cases: Vec<(&str, Call<'static>, u16, &str, bool)> = vec![
        ("no token", invoke("tickets.create", AGENT, ticket("h", "1", "s")).anonymous(), 401, "unauthorized", false),
        ("bad token", invoke("tickets.create", "nope", ticket("h", "1", "s")), 401, "unauthorized", false),
        ("basic scheme", invoke("tickets.create", AGENT, ticket("h", "1", "s")).anonymous().header("authorization", "Basic YTpi"), 401, "unauthorized", false),
        ("unknown tool", invoke("tickets.delete", AGENT, ticket("h", "1", "s")), 404, "unknown_tool", false),
        ("body too large", Call::post("/v1/tools/tickets.create/invoke", AGENT, format!(r#"{{"workflow_id":"h","step_id":"1","arguments":{{"subject":"s","body":"{}"}}}}"#, "x".repeat(300_000))), 413, "invalid_arguments", false),
        ("too deep", Call::post("/v1/tools/tickets.create/invoke", AGENT, format!(r#"{{"workflow_id":"h","step_id":"1","arguments":{deep}}}"#)), 400, "invalid_arguments", false),
        ("duplicate member", Call::post("/v1/tools/tickets.create/invoke", AGENT, r#"{"workflow_id":"h","step_id":"1","arguments":{"subject":"a","subject":"b","body":"x"}}"#), 400, "invalid_arguments", false),
        ("duplicate envelope member", Call::post("/v1/tools/tickets.create/invoke", AGENT, r#"{"workflow_id":"h","workflow_id":"g","step_id":"1","arguments":{}}"#), 400, "invalid_arguments", false),
        ("number beyond 2^53", Call::post("/v1/tools/tickets.create/invoke", AGENT, r#"{"workflow_id":"h","step_id":"1","arguments":{"subject":"a","body":"x","n":9007199254740993}}"#), 400, "invalid_arguments", false),
        ("number beyond 2^53 in exponent form", Call::post("/v1/tools/tickets.create/invoke", AGENT, r#"{"workflow_id":"h","step_id":"1","arguments":{"subject":"a","body":"x","n":9.007199254740993e15}}"#), 400, "invalid_arguments", false),
        ("not UTF-8", Call::post("/v1/tools/tickets.create/invoke", AGENT, b"{\"workflow_id\":\"h\",\"step_id\":\"1\",\"arguments\":{\"subject\":\"\xff\",\"body\":\"x\"}}".to_vec()), 400, "invalid_arguments", false),
        ("not JSON", Call::post("/v1/tools/tickets.create/invoke", AGENT, "subject=a"), 400, "invalid_arguments", false),
        ("empty body", Call::post("/v1/tools/tickets.create/invoke", AGENT, ""), 400, "invalid_arguments", false),
        ("not an object", Call::post("/v1/tools/tickets.create/invoke", AGENT, "[1]"), 400, "invalid_arguments", true),
        ("no arguments", Call::post("/v1/tools/tickets.create/invoke", AGENT, r#"{"workflow_id":"h","step_id":"1"}"#), 400, "invalid_arguments", true),
        ("unknown member", Call::post("/v1/tools/tickets.create/invoke", AGENT, r#"{"workflow_id":"h","step_id":"1","arguments":{"subject":"a","body":"x"},"tenant":"globex"}"#), 400, "invalid_arguments", true),
        ("schema violation", invoke("tickets.create", AGENT, json!({"workflow_id":"h","step_id":"1","arguments":{"subject":""}})), 400, "invalid_arguments", true),
        ("no key for a keyed tool", invoke("tickets.create", AGENT, json!({"arguments":{"subject":"a","body":"x"}})), 400, "missing_operation_key", true),
        ("step without workflow", invoke("tickets.create", AGENT, json!({"step_id":"1","arguments":{"subject":"a","body":"x"}})), 400, "invalid_operation_key", true),
        ("colon in a part", invoke("tickets.create", AGENT, ticket("a:b", "1", "s")), 400, "invalid_operation_key", true),
        ("space in a part", invoke("tickets.create", AGENT, ticket("a b", "1", "s")), 400, "invalid_operation_key", true),
        ("over-long part", invoke("tickets.create", AGENT, ticket(&"w".repeat(129), "1", "s")), 400, "invalid_operation_key", true),
        ("numeric workflow", invoke("tickets.create", AGENT, json!({"workflow_id": 7, "step_id":"1","arguments":{"subject":"a","body":"x"}})), 400, "invalid_operation_key", true),
        ("empty header", invoke("tickets.create", AGENT, json!({"arguments":{"subject":"a","body":"x"}})).header("idempotency-key", ""), 400, "invalid_operation_key", true),
        ("malformed header", invoke("tickets.create", AGENT, json!({"arguments":{"subject":"a","body":"x"}})).header("idempotency-key", "\"open"), 400, "invalid_operation_key", true),
        ("spaced header", invoke("tickets.create", AGENT, json!({"arguments":{"subject":"a","body":"x"}})).header("idempotency-key", "a b"), 400, "invalid_operation_key", true),
        ("over-long header", invoke("tickets.create", AGENT, json!({"arguments":{"subject":"a","body":"x"}})).header("idempotency-key", format!("\"{}\"", "k".repeat(400))), 400, "invalid_operation_key", true),
        ("header and body key", invoke("tickets.create", AGENT, ticket("h", "1", "s")).header("idempotency-key", "\"h:1\""), 400, "invalid_operation_key", true),
        ("key in the path of another tenant", Call::get("/v1/operations/globex:test:h:1", AGENT), 404, "not_found", false),
        ("malformed key in the path", Call::get("/v1/operations/not-a-key", AGENT), 404, "not_found", false),
        ("unknown route", Call::get("/v2/anything", AGENT), 404, "not_found", false),
        ("list with a bad status", Call::get("/v1/operations?status=done", OPERATOR), 400, "invalid_arguments", false),
        ("list with a bad limit", Call::get("/v1/operations?limit=0", OPERATOR), 400, "invalid_arguments", false),
        ("list with a non-numeric limit", Call::get("/v1/operations?limit=many", OPERATOR), 400, "invalid_arguments", false),
        ("reconcile with an unknown resolution", Call::post("/v1/operations/acme:test:h:1/reconcile", OPERATOR, r#"{"resolution":"maybe"}"#), 400, "invalid_arguments", false),
        ("approve with a bad fingerprint", Call::post("/v1/operations/acme:test:h:1/approve", OPERATOR, r#"{"fingerprint":"md5:x"}"#), 400, "invalid_arguments", false),
    ];
    for (name, call, status, code, safe) in cases {
        let reply = route(&e.app, call).await;
        assert_eq!(reply.status, status, "{name}: {}", reply.text);
        if safe {
            reply.assert_problem_safe(status, code);
        } else {
            reply.assert_problem_after_effect(status, code);
        }
        if status == 401 {
            assert_eq!(reply.header("www-authenticate"), Some("Bearer"), "{name}");
        }
    }
    assert!(e.store.is_empty(), "hostile input left a record");
    assert_eq!(
        e.fakes.total_calls(),
        0,
        "hostile input reached a downstream"
    );
    assert_eq!(e.fakes.total_effects(), 0);
}

/// Once a delivery names its operation, a refusal before the executor (a body too large, one
/// that is not an object, an unknown member, a tool that is not loaded) is the machine's
/// answer for that key: `safe_to_repeat` for a key without a record, never for one whose
/// effect happened. A body that could not be read names nothing, and claims nothing.
#[tokio::test]
async fn refusals_of_a_named_operation_are_the_machines_answer_for_its_key() {
    let e = env();
    let tickets = e.fakes.fake("tickets.create");
    let done = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_r", "done", "Refund")),
    )
    .await;
    assert_eq!(done.outcome(), "applied", "{}", done.text);
    let big = format!(
        r#"{{"arguments":{{"subject":"s","body":"{}"}}}}"#,
        "x".repeat(300_000)
    );
    let post = |header: &str, body: &str| {
        Call::post("/v1/tools/tickets.create/invoke", AGENT, body.to_string())
            .header("idempotency-key", header.to_string())
    };
    // The key whose effect happened: every refusal says it is not safe to repeat, and names it.
    let after_effect = [
        ("too large", post("\"run_r:done\"", &big), 413),
        ("not an object", post("\"run_r:done\"", "[1]"), 400),
        ("not JSON", post("\"run_r:done\"", "subject=a"), 400),
        ("no arguments", post("\"run_r:done\"", "{}"), 400),
        (
            "unknown member",
            invoke(
                "tickets.create",
                AGENT,
                json!({"workflow_id": "run_r", "step_id": "done", "arguments": {}, "x": 1}),
            ),
            400,
        ),
        (
            "unknown tool",
            Call::post("/v1/tools/tickets.delete/invoke", AGENT, "{}")
                .header("idempotency-key", "\"run_r:done\""),
            404,
        ),
    ];
    for (name, call, status) in after_effect {
        let reply = route(&e.app, call).await;
        assert_eq!(reply.status, status, "{name}: {}", reply.text);
        assert_eq!(
            reply.json["safe_to_repeat"], false,
            "{name}: {}",
            reply.text
        );
        assert_eq!(
            reply.json["operation_key"], "acme:test:run_r:done",
            "{name}: {}",
            reply.text
        );
    }
    // A key without a record: the same refusals are safe to repeat, and write nothing.
    let fresh = [
        ("too large", post("\"run_r:fresh\"", &big), 413),
        ("not an object", post("\"run_r:fresh\"", "[1]"), 400),
        (
            "unknown tool",
            Call::post("/v1/tools/tickets.delete/invoke", AGENT, "{}")
                .header("idempotency-key", "\"run_r:fresh\""),
            404,
        ),
    ];
    for (name, call, status) in fresh {
        let reply = route(&e.app, call).await;
        assert_eq!(reply.status, status, "{name}: {}", reply.text);
        assert_eq!(reply.json["safe_to_repeat"], true, "{name}: {}", reply.text);
    }
    assert!(e.store.get(&key("run_r", "fresh")).await.unwrap().is_none());
    // Unreadable, with no header: nothing is known of the operation, nothing is claimed.
    let unread = Call::post("/v1/tools/tickets.create/invoke", AGENT, big.clone());
    let reply = route(&e.app, unread).await;
    assert_eq!(reply.status, 413, "{}", reply.text);
    assert_eq!(reply.json["safe_to_repeat"], false, "{}", reply.text);
    assert_eq!(
        tickets.effects(),
        1,
        "one effect, whatever the refusals said"
    );
}

#[tokio::test]
async fn idempotency_key_header_names_the_operation() {
    let e = env();
    let args = json!({"arguments": {"subject": "a", "body": "x"}});
    let r = route(
        &e.app,
        invoke("tickets.create", AGENT, args.clone()).header("idempotency-key", "\"run_9:step_1\""),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["operation_key"], "acme:test:run_9:step_1");
    let r = route(
        &e.app,
        invoke("tickets.create", AGENT, args.clone())
            .header("idempotency-key", "\"8e03978e-40d5-43e8\""),
    )
    .await;
    assert_eq!(r.json["operation_key"], "acme:test:8e03978e-40d5-43e8:-");
    let r = route(
        &e.app,
        invoke("tickets.create", AGENT, args).header("idempotency-key", "\"8e03978e-40d5-43e8\""),
    )
    .await;
    assert_eq!(r.outcome(), "replayed");
    assert_eq!(e.fakes.fake("tickets.create").effects(), 2);
}

/// Generic clients send bare identifiers as `Idempotency-Key`, many starting with a digit
/// (UUIDv4/v7, ULIDs) and some Stripe-style: each names its own operation, a repeat replays,
/// and the fake service counts one ticket per key.
#[tokio::test]
async fn bare_idempotency_keys_whatever_their_first_character_run_once() {
    let e = env();
    let keys = [
        "8e03978e-40d5-4c1b-9d7e-0a1b2c3d4e5f",
        "0190f5a4-7c3e-7b2a-9f10-3c4d5e6f7a8b",
        "01ARZ3NDEKTSV4RRFFQ69G5FAV",
        "idem_8f3kQ2LmN9xYz",
        "c1f0e6d2-9a4b-4e8f-8c7d-6b5a4f3e2d1c",
    ];
    for (i, k) in keys.iter().enumerate() {
        let args = json!({"arguments": {"subject": format!("s{i}"), "body": "x"}});
        for expected in ["applied", "replayed"] {
            let r = route(
                &e.app,
                invoke("tickets.create", AGENT, args.clone()).header("idempotency-key", *k),
            )
            .await;
            assert_eq!(r.status, 200, "{k}: {}", r.text);
            assert_eq!(r.outcome(), expected, "{k}: {}", r.text);
            assert_eq!(r.json["operation_key"], format!("acme:test:{k}:-"));
        }
    }
    assert_eq!(e.fakes.fake("tickets.create").effects(), keys.len());
}

#[tokio::test]
async fn another_tenants_key_is_not_found_exactly_like_a_missing_one() {
    let e = env();
    let r = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_1", "create", "s")),
    )
    .await;
    assert_eq!(r.status, 200);
    let own = route(
        &e.app,
        Call::get("/v1/operations/acme:test:run_1:create", OPERATOR),
    )
    .await;
    assert_eq!(own.status, 200);
    let theirs = route(
        &e.app,
        Call::get("/v1/operations/acme:test:run_1:create", OTHER),
    )
    .await;
    let missing = route(
        &e.app,
        Call::get("/v1/operations/globex:test:run_1:create", OTHER),
    )
    .await;
    theirs.assert_problem(404, "not_found");
    assert_eq!(theirs.text, missing.text);
    for action in ["reconcile", "approve", "deny"] {
        let r = route(
            &e.app,
            Call::post(
                format!("/v1/operations/acme:test:run_1:create/{action}"),
                OTHER,
                "",
            ),
        )
        .await;
        r.assert_problem(404, "not_found");
    }
    let list = route(&e.app, Call::get("/v1/operations", OTHER)).await;
    assert_eq!(list.json["operations"], json!([]));
    // The same workflow step in another tenant is another operation.
    let r = route(
        &e.app,
        Call::post(
            "/v1/tools/tickets.create/invoke",
            OTHER,
            ticket("run_1", "create", "s").to_string(),
        ),
    )
    .await;
    assert_eq!(r.outcome(), "applied");
    assert_eq!(e.fakes.fake("tickets.create").effects(), 2);
}

#[tokio::test]
async fn agents_cannot_list_reconcile_approve_or_deny() {
    let e = env();
    for call in [
        Call::get("/v1/operations", AGENT),
        Call::get("/v1/operations?status=unknown", AGENT),
        Call::post("/v1/operations/acme:test:a:b/reconcile", AGENT, ""),
        Call::post("/v1/operations/acme:test:a:b/approve", AGENT, ""),
        Call::post("/v1/operations/acme:test:a:b/deny", AGENT, ""),
    ] {
        route(&e.app, call).await.assert_problem(403, "forbidden");
    }
    let r = route(&e.app, Call::get("/v1/operations", OPERATOR)).await;
    assert_eq!(r.status, 200);
    // The console takes no bearer token: a browser signs in (tests/console.rs).
    let r = route(&e.app, Call::get("/console", OPERATOR)).await;
    assert_eq!(r.status, 303);
    assert_eq!(r.header("location"), Some("/console/sign-in"));
}

#[tokio::test]
async fn approval_holds_the_effect_until_an_operator_approves() {
    let e = env();
    let tickets = e.fakes.fake("tickets.create");
    let legal = json!({"workflow_id": "run_5", "step_id": "s", "arguments": {"queue_id": "legal", "subject": "a", "body": "x"}});
    let held = route(&e.app, invoke("tickets.create", AGENT, legal.clone())).await;
    assert_eq!(held.status, 202, "{}", held.text);
    assert_eq!(held.outcome(), "in_flight");
    assert_eq!(held.json["next_action"], "ask_for_approval");
    assert!(held.header("retry-after").is_some());
    assert_eq!(tickets.effects(), 0);
    let view = route(&e.app, Call::get("/v1/operations/acme:test:run_5:s", AGENT)).await;
    let fingerprint = view.json["fingerprint"].as_str().unwrap().to_string();
    assert_eq!(view.json["record_status"], "awaiting_approval");

    let wrong = route(
        &e.app,
        Call::post(
            "/v1/operations/acme:test:run_5:s/approve",
            OPERATOR,
            json!({"fingerprint": format!("sha256:{}", "0".repeat(64))}).to_string(),
        ),
    )
    .await;
    wrong.assert_problem(422, "conflict");
    let approved = route(
        &e.app,
        Call::post(
            "/v1/operations/acme:test:run_5:s/approve",
            OPERATOR,
            json!({"fingerprint": fingerprint}).to_string(),
        ),
    )
    .await;
    assert_eq!(approved.status, 200, "{}", approved.text);
    assert_eq!(tickets.effects(), 1);
    let twice = route(
        &e.app,
        Call::post("/v1/operations/acme:test:run_5:s/approve", OPERATOR, ""),
    )
    .await;
    twice.assert_problem(422, "conflict");
    let replay = route(&e.app, invoke("tickets.create", AGENT, legal)).await;
    assert_eq!(replay.outcome(), "replayed");
    let view = route(&e.app, Call::get("/v1/operations/acme:test:run_5:s", AGENT)).await;
    assert_eq!(view.json["approved_by"], "acme-ops");

    // Denied: final, replayed as the same refusal.
    let other = json!({"workflow_id": "run_6", "step_id": "s", "arguments": {"queue_id": "legal", "subject": "a", "body": "x"}});
    route(&e.app, invoke("tickets.create", AGENT, other.clone())).await;
    let denied = route(
        &e.app,
        Call::post(
            "/v1/operations/acme:test:run_6:s/deny",
            OPERATOR,
            r#"{"reason":"not ours"}"#,
        ),
    )
    .await;
    denied.assert_problem_safe(403, "approval_denied");
    let replay = route(&e.app, invoke("tickets.create", AGENT, other)).await;
    replay.assert_problem_safe(403, "approval_denied");
    assert_eq!(tickets.effects(), 1);
}

#[tokio::test]
async fn revoked_authorization_refuses_the_retry() {
    let e = env();
    let r = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_7", "s", "a")),
    )
    .await;
    assert_eq!(r.status, 200);
    e.fakes
        .hook
        .set(Authorization::Denied("account closed".into()));
    let retry = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_7", "s", "a")),
    )
    .await;
    retry.assert_problem_after_effect(403, "forbidden");
    let fresh = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_8", "s", "a")),
    )
    .await;
    fresh.assert_problem_safe(403, "forbidden");
    e.fakes
        .hook
        .set(Authorization::Unavailable("hook down".into()));
    let closed = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_7", "s", "a")),
    )
    .await;
    closed.assert_problem_after_effect(503, "authorization_unavailable");
    assert_eq!(e.fakes.fake("tickets.create").effects(), 1);
    assert_eq!(e.store.len(), 1);
}

#[tokio::test]
async fn a_key_after_retention_follows_the_late_arrival_policy() {
    let e = env();
    let r = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_10", "s", "a")),
    )
    .await;
    assert_eq!(r.status, 200);
    // tickets.create keeps records 7 days and rejects late arrivals.
    e.clock.advance(8 * 86_400_000);
    let late = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_10", "s", "a")),
    )
    .await;
    late.assert_problem_after_effect(410, "expired_operation");
    assert_eq!(e.fakes.fake("tickets.create").effects(), 1);
}

#[tokio::test]
async fn a_delayed_job_is_in_flight_until_polling_finds_it_done() {
    let e = env();
    let reports = e.fakes.fake("reports.generate");
    reports.push_fault(Fault::AcceptJob);
    let body = json!({"workflow_id": "run_11", "step_id": "s", "arguments": {"report_type": "usage", "period_start": "2026-01-01", "period_end": "2026-01-31"}});
    let accepted = route(&e.app, invoke("reports.generate", AGENT, body.clone())).await;
    assert_eq!(accepted.status, 409, "{}", accepted.text);
    assert_eq!(accepted.outcome(), "in_flight");
    assert_eq!(accepted.json["next_action"], "poll");
    assert!(accepted.header("retry-after").is_some());
    let poll = route(
        &e.app,
        Call::get("/v1/operations/acme:test:run_11:s", AGENT),
    )
    .await;
    assert_eq!(poll.json["outcome"]["status"], "in_flight", "{}", poll.text);
    assert_eq!(poll.json["record_status"], "pending");
    let job = reports.job_ids()[0].clone();
    assert_eq!(poll.json["job_id"], job.as_str());
    reports.complete_job(&job);
    let done = route(
        &e.app,
        Call::get("/v1/operations/acme:test:run_11:s", AGENT),
    )
    .await;
    assert_eq!(done.json["record_status"], "applied", "{}", done.text);
    let replay = route(&e.app, invoke("reports.generate", AGENT, body)).await;
    assert_eq!(replay.outcome(), "replayed");
    assert_eq!(reports.effects(), 1);
}

#[tokio::test]
async fn a_malformed_result_is_never_success() {
    let e = env();
    let notes = e.fakes.fake("notes.append");
    notes.push_fault(Fault::Malformed);
    let r = route(&e.app, invoke("notes.append", AGENT, note("run_12", "x"))).await;
    assert_eq!(r.status, 202, "{}", r.text);
    assert_eq!(r.outcome(), "unknown");
    // Where a receipt can be looked up, the malformed answer is settled by the receipt.
    let tickets = e.fakes.fake("tickets.create");
    tickets.push_fault(Fault::Malformed);
    let r = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_12", "s", "a")),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["effect_reference"],
        tickets
            .receipt_for(&key("run_12", "s"))
            .unwrap()
            .reference
            .as_str()
    );
    assert_eq!(tickets.effects(), 1);
    assert_eq!(notes.effects(), 1);
}

#[tokio::test]
async fn a_new_key_with_the_same_arguments_is_a_new_operation() {
    let e = env();
    route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_13", "a", "s")),
    )
    .await;
    let r = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_13", "b", "s")),
    )
    .await;
    assert_eq!(r.outcome(), "applied");
    assert_eq!(e.fakes.fake("tickets.create").effects(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_is_409_with_retry_after_and_prefer_wait_waits() {
    let e = env();
    let tickets = e.fakes.fake("tickets.create").clone();
    tickets.before_commit().arm();
    let app = e.app.clone();
    let first = tokio::spawn(async move {
        route(
            &app,
            invoke("tickets.create", AGENT, ticket("run_14", "s", "a")),
        )
        .await
    });
    idemgate_conformance::gate::bounded(
        "first delivery reaches the downstream",
        tickets.before_commit().reached(),
    )
    .await;
    let busy = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_14", "s", "a")),
    )
    .await;
    assert_eq!(busy.status, 409, "{}", busy.text);
    assert_eq!(busy.outcome(), "in_flight");
    assert!(busy.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
    let app = e.app.clone();
    let waiting = tokio::spawn(async move {
        route(
            &app,
            invoke("tickets.create", AGENT, ticket("run_14", "s", "a")).header("prefer", "wait=10"),
        )
        .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    tickets.before_commit().release();
    let first = idemgate_conformance::gate::bounded("first delivery", first)
        .await
        .unwrap();
    assert_eq!(first.outcome(), "applied");
    let waited = idemgate_conformance::gate::bounded("waiting delivery", waiting)
        .await
        .unwrap();
    assert_eq!(waited.status, 200, "{}", waited.text);
    assert_eq!(waited.outcome(), "replayed");
    assert_eq!(tickets.effects(), 1);
}

#[tokio::test]
async fn list_pages_by_key() {
    let e = env();
    for step in ["a", "b", "c"] {
        route(
            &e.app,
            invoke("tickets.create", AGENT, ticket("run_15", step, "s")),
        )
        .await;
    }
    let page = route(
        &e.app,
        Call::get("/v1/operations?tool=tickets.create&limit=2", OPERATOR),
    )
    .await;
    assert_eq!(
        page.json["operations"].as_array().unwrap().len(),
        2,
        "{}",
        page.text
    );
    let after = page.json["next_after"].as_str().unwrap().to_string();
    let rest = route(
        &e.app,
        Call::get(
            format!("/v1/operations?tool=tickets.create&limit=2&after={after}"),
            OPERATOR,
        ),
    )
    .await;
    assert_eq!(
        rest.json["operations"].as_array().unwrap().len(),
        1,
        "{}",
        rest.text
    );
    assert_eq!(rest.json["next_after"], Value::Null);
    let applied = route(&e.app, Call::get("/v1/operations?status=applied", OPERATOR)).await;
    assert_eq!(applied.json["operations"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn health_metrics_and_the_generated_openapi_document() {
    let e = env();
    let r = route(&e.app, Call::get("/healthz", AGENT).anonymous()).await;
    assert_eq!(r.status, 200);
    route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_16", "s", "a")),
    )
    .await;
    let m = route(&e.app, Call::get("/metrics", AGENT).anonymous()).await;
    assert_eq!(m.status, 200);
    for name in [
        "idemgate_outcomes_total",
        "idemgate_claim_duration_seconds_bucket",
        "idemgate_effect_duration_seconds_bucket",
        "idemgate_unknown_operations",
    ] {
        assert!(m.text.contains(name), "{name} missing from\n{}", m.text);
    }
    let doc = route(&e.app, Call::get("/openapi.json", AGENT).anonymous()).await;
    assert_eq!(doc.status, 200);
    assert!(
        doc.json["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc.json["openapi"]
    );
    for path in [
        "/v1/tools/{tool}/invoke",
        "/v1/operations",
        "/v1/operations/{operation_key}",
        "/v1/operations/{operation_key}/reconcile",
        "/v1/operations/{operation_key}/approve",
        "/v1/operations/{operation_key}/deny",
        "/healthz",
        "/metrics",
    ] {
        assert!(
            doc.json["paths"].get(path).is_some(),
            "{path} missing from the document"
        );
    }
    assert!(doc.json["components"]["schemas"].get("Problem").is_some());
}

// ---------------------------------------------------------------------------------------------
// The paths between the scenarios.

/// `GET /v1/operations/{key}` hands out a stored result like a replay: a revoked reader is
/// refused, with nothing of the record in the answer.
#[tokio::test]
async fn a_revoked_reader_cannot_read_the_stored_result() {
    let e = env();
    let r = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_r", "s", "a")),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let reference = r.json["effect_reference"].as_str().unwrap().to_string();
    e.fakes
        .hook
        .set(Authorization::Denied("account closed".into()));
    let read = route(&e.app, Call::get("/v1/operations/acme:test:run_r:s", AGENT)).await;
    assert_eq!(read.status, 403, "{}", read.text);
    assert_eq!(read.code(), "forbidden");
    assert_eq!(read.json["safe_to_repeat"], false, "the effect happened");
    assert!(!read.text.contains(&reference), "{}", read.text);
    assert!(read.json.get("receipt").is_none() && read.json["result"].is_null());
    assert_eq!(e.fakes.fake("tickets.create").effects(), 1);
}

/// The handler's future is dropped when the client goes away (hyper drops it with the
/// connection): the claimed execution runs on regardless, to a settled record, with no
/// recovery or retry needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_does_not_stop_the_effect() {
    let e = env();
    let tickets = e.fakes.fake("tickets.create").clone();
    tickets.before_commit().arm_nth(1);
    let app = e.app.clone();
    let client = tokio::spawn(async move {
        route(
            &app,
            invoke("tickets.create", AGENT, ticket("run_gone", "s", "a")),
        )
        .await
    });
    // The request reached the downstream; the client disconnects before any answer.
    tickets.before_commit().reached().await;
    client.abort();
    let _ = client.await;
    tickets.before_commit().release();
    let key = key("run_gone", "s");
    let mut settled = None;
    for _ in 0..200 {
        let record = e.store.get(&key).await.unwrap().unwrap();
        if record.status() != idemgate_core::record::RecordStatus::Pending {
            settled = Some(record);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let record = settled.expect("the execution settled after the client left");
    assert_eq!(
        record.status(),
        idemgate_core::record::RecordStatus::Applied
    );
    assert_eq!(tickets.effects(), 1);
    let replay = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_gone", "s", "a")),
    )
    .await;
    assert_eq!(replay.outcome(), "replayed", "{}", replay.text);
    assert_eq!(tickets.effects(), 1);
}

/// An effect run by an operator's approval is counted in `idemgate_outcomes_total` like any
/// delivery's.
#[tokio::test]
async fn an_approved_effect_is_counted_in_the_outcome_metrics() {
    let e = env();
    let applied = |text: &str| -> u64 {
        text.lines()
            .filter(|l| {
                l.starts_with("idemgate_outcomes_total")
                    && l.contains("tool=\"tickets.create\"")
                    && l.contains("status=\"applied\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let before = applied(&route(&e.app, Call::get("/metrics", OPERATOR)).await.text);
    let legal = json!({"workflow_id": "run_m", "step_id": "s", "arguments": {"queue_id": "legal", "subject": "a", "body": "x"}});
    route(&e.app, invoke("tickets.create", AGENT, legal)).await;
    let approved = route(
        &e.app,
        Call::post("/v1/operations/acme:test:run_m:s/approve", OPERATOR, ""),
    )
    .await;
    assert_eq!(approved.status, 200, "{}", approved.text);
    let after = applied(&route(&e.app, Call::get("/metrics", OPERATOR)).await.text);
    assert!(
        after > before,
        "the approved effect is counted: {before} -> {after}"
    );
}

/// Operator actions are counted by whether they were done: an approval and a denial that
/// record their decision are `done`; acting on an operation in the wrong state is `refused`.
#[tokio::test]
async fn operator_actions_are_counted_done_or_refused() {
    let e = env();
    let count = |text: &str, action: &str, result: &str| -> u64 {
        text.lines()
            .filter(|l| {
                l.starts_with("idemgate_operator_actions_total")
                    && l.contains(&format!("action=\"{action}\""))
                    && l.contains(&format!("result=\"{result}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let metrics = || async { route(&e.app, Call::get("/metrics", OPERATOR)).await.text };
    let before = metrics().await;
    for step in ["a", "d"] {
        let legal = json!({"workflow_id": "run_oa", "step_id": step, "arguments": {"queue_id": "legal", "subject": "a", "body": "x"}});
        let waiting = route(&e.app, invoke("tickets.create", AGENT, legal)).await;
        assert_eq!(waiting.status, 202, "{}", waiting.text);
    }
    let approve = |step: &str| {
        Call::post(
            format!("/v1/operations/acme:test:run_oa:{step}/approve"),
            OPERATOR,
            "",
        )
    };
    let deny = |step: &str| {
        Call::post(
            format!("/v1/operations/acme:test:run_oa:{step}/deny"),
            OPERATOR,
            "",
        )
    };
    assert_eq!(route(&e.app, approve("a")).await.status, 200);
    assert_eq!(route(&e.app, deny("d")).await.status, 403);
    // Both are settled now: the same actions again do not apply.
    assert_eq!(route(&e.app, approve("a")).await.status, 422);
    assert_eq!(route(&e.app, deny("a")).await.status, 422);
    let after = metrics().await;
    let delta =
        |action: &str, result: &str| count(&after, action, result) - count(&before, action, result);
    assert_eq!(delta("approve", "done"), 1);
    assert_eq!(delta("deny", "done"), 1);
    assert_eq!(delta("approve", "refused"), 1);
    assert_eq!(delta("deny", "refused"), 1);
    assert_eq!(
        e.fakes.total_effects(),
        1,
        "one approved effect at the downstream"
    );
}

/// A listing is scoped by the gateway's environment as well as the tenant.
#[tokio::test]
async fn listings_are_scoped_by_environment() {
    let e = env();
    let r = route(
        &e.app,
        invoke("tickets.create", AGENT, ticket("run_l", "s", "a")),
    )
    .await;
    assert_eq!(r.status, 200);
    // Another environment's record in the same store and tenant.
    let mut other = e.store.get(&key("run_l", "s")).await.unwrap().unwrap();
    other.key = OperationKey::new("acme", "staging", "run_l", "s").unwrap();
    e.store.claim(other, vec![]).await.unwrap();
    let list = route(&e.app, Call::get("/v1/operations?status=applied", OPERATOR)).await;
    let keys: Vec<&str> = list.json["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["operation_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["acme:test:run_l:s"], "{}", list.text);
}
