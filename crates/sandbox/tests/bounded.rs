//! The sandbox's memory stays bounded, and what it keeps still makes every retry a replay:
//! effects are counted on the sandbox's own side.

use std::sync::Arc;

use idemgate_conformance::mem::MemStore;
use idemgate_core::clock::ManualClock;
use idemgate_core::contract::Contract;
use idemgate_core::effect::{AllowAll, Downstream, EffectOutcome, EffectRequest, Lookup};
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::Status;
use idemgate_engine::{Caller, Executor, Operation, Settings};
use idemgate_sandbox::{Fault, Jobs, LOG_LEN, Sandbox};
use serde_json::json;

const TICKETS: &str = include_str!("../../../contracts/tickets.create.yaml");

fn key(workflow: &str, step: u64) -> OperationKey {
    OperationKey::new("acme", "test", workflow, &format!("s{step}")).unwrap()
}

async fn perform(sandbox: &Sandbox, key: &OperationKey) -> EffectOutcome {
    let arguments = json!({});
    sandbox
        .perform(EffectRequest {
            key,
            tool: "tickets.create",
            tool_version: "1",
            arguments: &arguments,
            attempt: 1,
            precondition: None,
        })
        .await
}

#[tokio::test]
async fn the_table_holds_at_most_its_capacity_however_many_effects() {
    let sandbox = Sandbox::new("ticket")
        .deduplicating(true)
        .with_receipt_lookup(true)
        .with_capacity(1000);
    for n in 0..20_000 {
        perform(&sandbox, &key("run", n)).await;
        assert!(sandbox.remembered() <= 1000, "after {n} effects");
    }
    assert_eq!(sandbox.effects(), 20_000);
    assert_eq!(sandbox.remembered(), 1000);
    assert_eq!(sandbox.forgotten(), 19_000);
    assert_eq!(sandbox.effect_log().len(), LOG_LEN);
    // The newest are kept: a resend of one of them is deduplicated, no new effect.
    let recent = key("run", 19_999);
    assert!(matches!(
        sandbox.lookup_receipt(&recent).await,
        Lookup::Found(_)
    ));
    perform(&sandbox, &recent).await;
    assert_eq!((sandbox.effects(), sandbox.deduplicated()), (20_000, 1));
    // A forgotten key is never reported as "not found": that would invite a second effect.
    assert!(matches!(
        sandbox.lookup_receipt(&key("run", 0)).await,
        Lookup::Unavailable(_)
    ));
    // Before anything was forgotten, an unknown key is plainly not found.
    let fresh = Sandbox::new("ticket").with_receipt_lookup(true);
    assert_eq!(fresh.lookup_receipt(&key("run", 0)).await, Lookup::NotFound);
}

#[tokio::test]
async fn a_lost_answer_stays_findable_past_the_delivered_bound() {
    let sandbox = Sandbox::new("ticket")
        .deduplicating(true)
        .with_receipt_lookup(true)
        .with_capacity(100);
    let lost = key("run", 0);
    sandbox.push_fault(Fault::CommitThenDrop);
    assert!(matches!(
        perform(&sandbox, &lost).await,
        EffectOutcome::Ambiguous { .. }
    ));
    for n in 1..=1000 {
        perform(&sandbox, &key("run", n)).await;
    }
    assert!(sandbox.remembered() <= 200);
    let Lookup::Found(receipt) = sandbox.lookup_receipt(&lost).await else {
        panic!("the pinned receipt was forgotten");
    };
    assert_eq!(receipt.reference, "ticket_1");
    perform(&sandbox, &lost).await;
    assert_eq!(sandbox.effects(), 1001, "the resend was deduplicated");
}

fn operation(workflow: &str, step: u64) -> Operation {
    Operation {
        caller: Caller {
            tenant: "acme".into(),
            actor: "agent-1".into(),
            role: "agent".into(),
        },
        environment: "test".into(),
        workflow_id: Some(workflow.into()),
        step_id: Some(format!("s{step}")),
    }
}

#[tokio::test]
async fn through_the_executor_retries_replay_and_a_dropped_answer_is_one_effect() {
    let contract = Contract::load(TICKETS, "tickets.create.yaml").unwrap();
    let sandbox = Sandbox::for_contract(&contract, Jobs::FirstPoll).with_capacity(50);
    let executor = Executor::new(
        Arc::new(MemStore::new()),
        Arc::new(ManualClock::new(1_767_225_600_000)),
        Arc::new(AllowAll),
        Settings::default(),
    );
    let args = json!({"subject": "Printer on fire", "body": "Third floor."});
    // The answer of the first delivery is lost: the executor settles it by the lookup.
    let dropped = executor
        .execute(&contract, &operation("sandbox-drop-1", 0), &args, &sandbox)
        .await;
    assert_eq!(dropped.status, Status::Applied, "{dropped:?}");
    let first = executor
        .execute(&contract, &operation("run", 0), &args, &sandbox)
        .await;
    assert_eq!(first.status, Status::Applied);
    for n in 1..=500 {
        let o = executor
            .execute(&contract, &operation("run", n), &args, &sandbox)
            .await;
        assert_eq!(o.status, Status::Applied);
    }
    assert!(sandbox.remembered() <= 100, "{}", sandbox.remembered());
    for (workflow, step) in [("run", 0), ("run", 500), ("sandbox-drop-1", 0)] {
        let again = executor
            .execute(&contract, &operation(workflow, step), &args, &sandbox)
            .await;
        assert_eq!(again.status, Status::Replayed, "{workflow}:{step}");
    }
    assert_eq!(
        sandbox.effects(),
        502,
        "one effect per key, none for the retries"
    );
}
