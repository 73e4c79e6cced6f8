//! The library consumer without a queue: payloads handed to `Consumer::handle` as a queue
//! would deliver them, effects counted by the fake downstream on its own side, records read
//! from the store. The dispositions table itself is in `disposition.rs`; here each path is run
//! through the real executor.

use std::sync::Arc;

use idemgate_app::{Assembly, Tool, ToolSet};
use idemgate_conformance::downstream::Fault;
use idemgate_conformance::harness::{ENVIRONMENT, Harness, Spec, TENANT, WORKFLOW, ticket};
use idemgate_conformance::mem::MemStore;
use idemgate_core::contract::Contract;
use idemgate_core::store::{Filter, Store};
use idemgate_core::{ErrorCode, RecordStatus};
use idemgate_queue::{Consumer, Delivery, Disposition, Envelope};

/// A downstream that neither deduplicates nor offers a lookup: a second send would be a
/// second effect, and an ambiguous answer can only end `unknown`. The consumer delivers
/// through an application over the harness's store, clock and authorization switch, whose one
/// tool is the spec's.
fn setup() -> (Harness, Consumer, Arc<Contract>) {
    let spec = Spec::key_based().dedup(false).lookup(false);
    let harness = Harness::for_spec(Arc::new(MemStore::new()), &spec);
    let contract = spec.contract();
    let tools = ToolSet::from_tools(vec![Tool {
        contract: contract.clone(),
        downstream: Arc::new(harness.downstream.clone()),
        authorizer: Some(harness.auth.clone()),
    }])
    .unwrap();
    let app = Assembly::new(harness.store.clone(), tools, ENVIRONMENT)
        .clock(harness.clock.clone())
        .build();
    let consumer = Consumer::new(app, TENANT, "billing-service");
    (harness, consumer, contract)
}

fn job(contract: &Contract, step: &str, subject: &str) -> Vec<u8> {
    Envelope {
        workflow_id: WORKFLOW.into(),
        step_id: step.into(),
        tool: contract.name.clone(),
        arguments: ticket(subject),
        actor: None,
    }
    .to_bytes()
}

/// The queue's telemetry changes on every delivery; the operation does not.
fn delivery(n: u64) -> Delivery {
    Delivery {
        message_id: Some(format!("msg-{n}")),
        attempt: Some(n),
    }
}

async fn records(h: &Harness) -> Vec<idemgate_core::Record> {
    h.store
        .list(Filter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn redeliveries_with_new_message_ids_are_one_effect() {
    let (h, consumer, contract) = setup();
    let payload = job(&contract, "s1", "Refund");
    for n in 1..=5 {
        let handled = consumer.handle(&payload, &delivery(n)).await;
        assert_eq!(handled.disposition, Disposition::Settled, "delivery {n}");
    }
    assert_eq!(h.downstream.effects(), 1);
    let records = records(&h).await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].state.status(), RecordStatus::Applied);
    assert_eq!(
        records[0].key.as_str(),
        format!("{TENANT}:{ENVIRONMENT}:{WORKFLOW}:s1")
    );
}

#[tokio::test]
async fn malformed_envelopes_and_unknown_tools_leave_no_record_and_no_effect() {
    let (h, consumer, _) = setup();
    let bad: Vec<Vec<u8>> = vec![
        b"{".to_vec(),
        br#"{"workflow_id":"w","step_id":"s","tool":"t","arguments":{},"tenant":"other"}"#.to_vec(),
        Vec::new(),
        Envelope {
            workflow_id: WORKFLOW.into(),
            step_id: "s2".into(),
            tool: "no.such.tool".into(),
            arguments: ticket("Refund"),
            actor: None,
        }
        .to_bytes(),
    ];
    for payload in &bad {
        let handled = consumer.handle(payload, &delivery(1)).await;
        assert!(
            matches!(handled.disposition, Disposition::Refused { .. }),
            "{:?}: {:?}",
            String::from_utf8_lossy(payload),
            handled.disposition
        );
        assert!(handled.outcome.is_none(), "the executor never saw it");
    }
    assert_eq!(h.downstream.effects(), 0);
    assert!(records(&h).await.is_empty());
}

#[tokio::test]
async fn a_key_reused_for_other_content_is_refused_and_the_first_effect_stands() {
    let (h, consumer, contract) = setup();
    let first = consumer
        .handle(&job(&contract, "s1", "Refund"), &delivery(1))
        .await;
    assert_eq!(first.disposition, Disposition::Settled);
    let other = consumer
        .handle(&job(&contract, "s1", "Upgrade"), &delivery(2))
        .await;
    assert_eq!(
        other.disposition,
        Disposition::Refused {
            code: Some(ErrorCode::IdempotencyKeyReusedWithDifferentRequest),
            reason: other
                .outcome
                .as_ref()
                .unwrap()
                .error
                .as_ref()
                .unwrap()
                .message
                .clone(),
        }
    );
    assert_eq!(h.downstream.effects(), 1);
}

#[tokio::test]
async fn an_unknown_operation_is_parked_and_stays_in_the_reconciliation_queue() {
    let (h, consumer, contract) = setup();
    h.downstream.push_fault(Fault::CommitThenDrop);
    let payload = job(&contract, "s1", "Refund");
    for n in 1..=3 {
        let handled = consumer.handle(&payload, &delivery(n)).await;
        assert_eq!(handled.disposition, Disposition::Parked, "delivery {n}");
    }
    assert_eq!(h.downstream.effects(), 1, "never sent again");
    let records = records(&h).await;
    assert_eq!(records[0].state.status(), RecordStatus::Unknown);
}

#[tokio::test]
async fn a_refusal_by_the_downstream_settles_and_is_replayed() {
    let (h, consumer, contract) = setup();
    h.downstream.push_fault(Fault::Refuse {
        code: ErrorCode::DownstreamRejected,
        message: "queue closed".into(),
    });
    let payload = job(&contract, "s1", "Refund");
    for n in 1..=2 {
        let handled = consumer.handle(&payload, &delivery(n)).await;
        assert_eq!(handled.disposition, Disposition::Settled, "delivery {n}");
    }
    assert_eq!(h.downstream.effects(), 0);
    assert_eq!(
        records(&h).await[0].state.status(),
        RecordStatus::FailedPermanent
    );
}

#[tokio::test]
async fn a_provably_unsent_attempt_returns_the_message_and_its_redelivery_runs_it() {
    let (h, consumer, contract) = setup();
    h.downstream.push_fault(Fault::NotSent);
    let payload = job(&contract, "s1", "Refund");
    let first = consumer.handle(&payload, &delivery(1)).await;
    assert!(
        matches!(first.disposition, Disposition::Retry { .. }),
        "{:?}",
        first.disposition
    );
    assert_eq!(h.downstream.effects(), 0);
    let second = consumer.handle(&payload, &delivery(2)).await;
    assert_eq!(second.disposition, Disposition::Settled);
    assert_eq!(h.downstream.effects(), 1);
}
