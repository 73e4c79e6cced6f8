//! Operator actions through API v1 land in the audit log with the operator and the reason; the
//! refused ones do not. Effects are counted on the fake downstreams' side.

mod common;

use std::sync::Arc;

use common::*;
use idemgate_audit::Expect;
use idemgate_conformance::audit_suite::{self, all_entries, export};
use idemgate_conformance::downstream::Fault;
use idemgate_conformance::mem::MemStore;
use idemgate_core::key::OperationKey;
use idemgate_server::Gateway;
use serde_json::json;

fn legal(workflow: &str) -> serde_json::Value {
    json!({"workflow_id": workflow, "step_id": "s", "arguments": {"queue_id": "legal", "subject": "a", "body": "x"}})
}

#[tokio::test]
async fn operator_actions_are_audited_with_actor_and_reason() {
    let mut fakes = Fakes::new();
    let tools = fakes.tools();
    let store = MemStore::new().with_sealer(audit_suite::sealer());
    let state = Gateway::new(Arc::new(store.clone()), tools, tokens())
        .environment(ENV)
        .build();
    let app = idemgate_server::router(state);
    let tickets = fakes.fake("tickets.create");
    let notes = fakes.fake("notes.append");
    let key = |w: &str, s: &str| OperationKey::new("acme", ENV, w, s).unwrap();

    // An approval with a reason: applied once at the ticket service, one entry.
    let held = route(&app, invoke("tickets.create", AGENT, legal("a1"))).await;
    assert_eq!(held.status, 202, "{}", held.text);
    let approve = |reason: &str| {
        Call::post(
            "/v1/operations/acme:test:a1:s/approve",
            OPERATOR,
            json!({ "reason": reason }).to_string(),
        )
    };
    let approved = route(&app, approve("reviewed with legal")).await;
    assert_eq!(approved.outcome(), "applied", "{}", approved.text);
    assert_eq!(tickets.effects_for(&key("a1", "s")), 1);
    // Approving again is refused (it is applied): nothing appended.
    let again = route(&app, approve("twice")).await;
    assert_eq!(again.status, 422, "{}", again.text);
    assert_eq!(all_entries(&store).await.len(), 1);

    // A denial without a reason records the default.
    route(&app, invoke("tickets.create", AGENT, legal("a2"))).await;
    let denied = route(
        &app,
        Call::post("/v1/operations/acme:test:a2:s/deny", OPERATOR, ""),
    )
    .await;
    assert_eq!(denied.outcome(), "rejected");

    // An unknown note: a lookup that finds nothing appends nothing; the resolution does.
    notes.push_fault(Fault::CommitThenDrop);
    let unknown = route(
        &app,
        invoke(
            "notes.append",
            AGENT,
            json!({"workflow_id": "a3", "step_id": "s1", "arguments": {"text": "hello"}}),
        ),
    )
    .await;
    assert_eq!(unknown.outcome(), "unknown");
    let receipt = notes.receipt_for(&key("a3", "s1")).unwrap();
    let settled = route(
        &app,
        Call::post(
            "/v1/operations/acme:test:a3:s1/reconcile",
            OPERATOR,
            json!({"resolution": "applied", "effect_reference": receipt.reference, "reason": "seen in the notes service"}).to_string(),
        ),
    )
    .await;
    assert_eq!(settled.status, 200, "{}", settled.text);
    assert_eq!(notes.effects(), 1, "the resolution sent nothing");

    let entries = all_entries(&store).await;
    let seen: Vec<(u64, &str, &str, &str, &str, &str)> = entries
        .iter()
        .map(|e| {
            (
                e.seq,
                e.operation_key.as_str(),
                e.action.as_str(),
                e.actor.as_str(),
                e.reason.as_str(),
                e.status.as_str(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                1,
                "acme:test:a1:s",
                "approved",
                "acme-ops",
                "reviewed with legal",
                "pending"
            ),
            (
                2,
                "acme:test:a2:s",
                "denied",
                "acme-ops",
                "no reason given",
                "failed_permanent"
            ),
            (
                3,
                "acme:test:a3:s1",
                "resolved_applied",
                "acme-ops",
                "seen in the notes service",
                "applied"
            ),
        ]
    );
    assert_eq!(
        entries[2].reference.as_deref(),
        Some(receipt.reference.as_str())
    );
    let report = idemgate_audit::verify(
        export(&entries).as_bytes(),
        Expect::SignedBy(audit_suite::public_key()),
    )
    .expect("the gateway's log verifies");
    assert_eq!(report.last_seq, 3);
}
