//! API v1 of a gateway that does not load a record's tool — records written by another
//! process over the same store (an in-process `idemgate.Local`; here a second gateway with
//! the tools) — resolves them by hand: `applied` with a reference, `not_applied`, denied;
//! never a lookup, never an approval. Effects are counted by the writer's fake downstreams.

mod common;

use std::sync::Arc;

use axum::Router;
use common::*;
use idemgate_conformance::downstream::Fault;
use idemgate_conformance::harness::EPOCH;
use idemgate_conformance::mem::MemStore;
use idemgate_core::clock::ManualClock;
use idemgate_core::key::OperationKey;
use idemgate_core::record::RecordStatus;
use idemgate_core::store::Store;
use idemgate_server::Gateway;
use serde_json::{Value, json};

struct Two {
    /// The process with the tools.
    writer: Router,
    /// The gateway an operator uses, over the same store, with no tools.
    reader: Router,
    fakes: Fakes,
    store: Arc<MemStore>,
}

fn two() -> Two {
    let mut fakes = Fakes::new();
    let store = Arc::new(MemStore::new());
    let gateway = |tools| {
        let state = Gateway::new(store.clone(), tools, tokens())
            .clock(Arc::new(ManualClock::new(EPOCH)))
            .environment(ENV)
            .build();
        idemgate_server::router(state)
    };
    let writer = gateway(fakes.tools());
    let reader = gateway(idemgate_app::ToolSet::default());
    Two {
        writer,
        reader,
        fakes,
        store,
    }
}

fn note() -> Value {
    json!({"workflow_id": "hand", "step_id": "s1", "arguments": {"text": "refund 42"}})
}

fn path(key: &OperationKey, action: &str) -> String {
    format!("/v1/operations/{key}/{action}")
}

async fn status_of(t: &Two, key: &OperationKey) -> RecordStatus {
    t.store.get(key).await.unwrap().unwrap().status()
}

#[tokio::test]
async fn api_v1_resolves_a_record_of_a_tool_it_does_not_load_by_hand() {
    let t = two();
    t.fakes
        .fake("notes.append")
        .push_fault(Fault::CommitThenDrop);
    let lost = route(&t.writer, invoke("notes.append", AGENT, note())).await;
    assert_eq!(lost.outcome(), "unknown", "{}", lost.text);
    let key = OperationKey::parse(&format!("acme:{ENV}:hand:s1")).unwrap();

    // Listed and shown by the gateway without the tool.
    let list = route(
        &t.reader,
        Call::get("/v1/operations?status=unknown", OPERATOR),
    )
    .await;
    assert_eq!(list.status, 200, "{}", list.text);
    assert_eq!(list.json["operations"][0]["operation_key"], key.as_str());
    assert_eq!(list.json["operations"][0]["tool"], "notes.append");
    let shown = route(
        &t.reader,
        Call::get(format!("/v1/operations/{key}"), OPERATOR),
    )
    .await;
    assert_eq!(shown.status, 200, "{}", shown.text);
    assert_eq!(shown.json["record_status"], "unknown");

    // No lookup without the tool: refused with what can be done instead; nothing changed.
    let lookup = route(&t.reader, Call::post(path(&key, "reconcile"), OPERATOR, "")).await;
    lookup.assert_problem(422, "conflict");
    assert!(
        lookup.text.contains("not loaded") && lookup.text.contains("by hand"),
        "{}",
        lookup.text
    );
    assert_eq!(status_of(&t, &key).await, RecordStatus::Unknown);
    // An agent may not resolve.
    let agent = route(
        &t.reader,
        Call::post(
            path(&key, "reconcile"),
            AGENT,
            json!({"resolution": "not_applied"}).to_string(),
        ),
    )
    .await;
    agent.assert_problem(403, "forbidden");

    // Applied by hand.
    let resolved = route(
        &t.reader,
        Call::post(
            path(&key, "reconcile"),
            OPERATOR,
            json!({"resolution": "applied", "effect_reference": "note-7", "result": {"id": 7}, "reason": "found in the notes"})
                .to_string(),
        ),
    )
    .await;
    assert_eq!(resolved.status, 200, "{}", resolved.text);
    assert_eq!(resolved.outcome(), "replayed");
    assert_eq!(status_of(&t, &key).await, RecordStatus::Applied);
    let shown = route(
        &t.reader,
        Call::get(format!("/v1/operations/{key}"), OPERATOR),
    )
    .await;
    let details: Vec<&str> = shown.json["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["detail"].as_str())
        .collect();
    assert!(
        details
            .iter()
            .any(|d| d.contains("by acme-ops") && d.contains("reason: found in the notes")),
        "{details:?}"
    );

    // The writer's next delivery replays the operator's receipt: one effect in all.
    let again = route(&t.writer, invoke("notes.append", AGENT, note())).await;
    assert_eq!(again.outcome(), "replayed", "{}", again.text);
    assert_eq!(again.json["effect_reference"], "note-7");
    assert_eq!(t.fakes.fake("notes.append").effects(), 1);
}

#[tokio::test]
async fn api_v1_denies_but_never_approves_an_operation_of_a_tool_it_does_not_load() {
    let t = two();
    let held = route(
        &t.writer,
        invoke(
            "tickets.create",
            AGENT,
            json!({"workflow_id": "held", "step_id": "s", "arguments": {"queue_id": "legal", "subject": "s", "body": "b"}}),
        ),
    )
    .await;
    assert_eq!(
        held.json["next_action"], "ask_for_approval",
        "{}",
        held.text
    );
    let key = OperationKey::parse(&format!("acme:{ENV}:held:s")).unwrap();

    let approve = route(&t.reader, Call::post(path(&key, "approve"), OPERATOR, "")).await;
    approve.assert_problem(422, "conflict");
    assert_eq!(status_of(&t, &key).await, RecordStatus::AwaitingApproval);
    // Another tenant's operator does not find it.
    let other = route(&t.reader, Call::post(path(&key, "deny"), OTHER, "")).await;
    other.assert_problem(404, "not_found");

    let denied = route(
        &t.reader,
        Call::post(
            path(&key, "deny"),
            OPERATOR,
            json!({"reason": "not ours"}).to_string(),
        ),
    )
    .await;
    denied.assert_problem(403, "approval_denied");
    assert_eq!(status_of(&t, &key).await, RecordStatus::FailedPermanent);

    let again = route(
        &t.writer,
        invoke(
            "tickets.create",
            AGENT,
            json!({"workflow_id": "held", "step_id": "s", "arguments": {"queue_id": "legal", "subject": "s", "body": "b"}}),
        ),
    )
    .await;
    assert_eq!(again.code(), "approval_denied", "{}", again.text);
    assert_eq!(t.fakes.fake("tickets.create").effects(), 0);
}
