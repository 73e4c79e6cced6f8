//! End to end: `idemgate_engine::Executor` on a SQLite store, performing effects through
//! `HttpDownstream` against the fake ticket service over loopback HTTP. The effect count is the
//! fake's own.

mod common;

use std::sync::Arc;

use common::{bounded, key, ticket_args, tickets};
use idemgate_conformance::http_fake::{FakeServer, HttpFault};
use idemgate_core::RecordStatus;
use idemgate_core::clock::SystemClock;
use idemgate_core::contract::Contract;
use idemgate_core::effect::{AllowAll, Authorizer};
use idemgate_core::outcome::{ErrorCode, NextAction, Outcome, Status};
use idemgate_core::store::Store;
use idemgate_downstream_http::{HttpAuthorizer, HttpDownstream};
use idemgate_engine::{Caller, Executor, Operation, Settings};
use idemgate_store_sqlite::{Options, SqliteStore};

struct World {
    server: FakeServer,
    store: SqliteStore,
    executor: Executor,
    contract: Contract,
    downstream: HttpDownstream,
    _dir: tempfile::TempDir,
}

async fn world(dedup: bool, lookup: bool) -> World {
    let server = FakeServer::start().await;
    server.downstream().set_deduplicates(dedup);
    server.downstream().set_receipt_lookup(lookup);
    let contract = tickets(&format!("http://{}", server.addr()), dedup, lookup, "2s");
    world_with(server, contract)
}

fn world_with(server: FakeServer, contract: Contract) -> World {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idemgate.db"), Options::default()).unwrap();
    // The contract's own hook, if it names one (the gateway routes to it by tool).
    let authorizer: Arc<dyn Authorizer> = match HttpAuthorizer::from_contract(&contract).unwrap() {
        Some(hook) => Arc::new(hook),
        None => Arc::new(AllowAll),
    };
    let executor = Executor::new(
        Arc::new(store.clone()),
        Arc::new(SystemClock),
        authorizer,
        Settings {
            worker: "worker-http".into(),
            ..Settings::default()
        },
    );
    let downstream = HttpDownstream::from_contract(&contract).unwrap();
    World {
        server,
        store,
        executor,
        contract,
        downstream,
        _dir: dir,
    }
}

fn op(step: &str) -> Operation {
    Operation {
        caller: Caller {
            tenant: "acme".into(),
            actor: "agent-1".into(),
            role: "agent".into(),
        },
        environment: "test".into(),
        workflow_id: Some("run_827".into()),
        step_id: Some(step.into()),
    }
}

impl World {
    async fn deliver(&self, step: &str) -> Outcome {
        bounded(
            self.executor
                .execute(&self.contract, &op(step), &ticket_args(), &self.downstream),
        )
        .await
    }

    async fn status(&self, step: &str) -> Option<RecordStatus> {
        self.store
            .get(&key(step))
            .await
            .unwrap()
            .map(|r| r.status())
    }
}

#[tokio::test]
async fn a_lost_response_after_commit_is_recovered_by_the_receipt_lookup() {
    let w = world(true, true).await;
    w.server.push_fault(HttpFault::CommitThenDrop);
    let first = w.deliver("s1").await;
    assert_eq!(first.status, Status::Applied, "{first:?}");
    assert_eq!(first.effect_reference.as_deref(), Some("ticket_1"));
    let ds = w.server.downstream();
    assert_eq!(ds.effects_for(&key("s1")), 1);
    assert_eq!((ds.calls(), ds.lookups()), (1, 1), "looked up, not resent");
    let retry = w.deliver("s1").await;
    assert_eq!(retry.status, Status::Replayed, "{retry:?}");
    assert_eq!(retry.effect_reference, first.effect_reference);
    assert_eq!(retry.result, first.result);
    assert_eq!(ds.effects(), 1, "exactly one effect");
    assert_eq!(ds.calls(), 1, "the replay never reached the downstream");
    assert_eq!(w.status("s1").await, Some(RecordStatus::Applied));
}

#[tokio::test]
async fn a_lost_response_without_lookup_is_resent_to_the_deduplicating_downstream() {
    let w = world(true, false).await;
    w.server.push_fault(HttpFault::CommitThenDrop);
    let first = w.deliver("s1").await;
    assert_eq!(first.status, Status::Applied, "{first:?}");
    let ds = w.server.downstream();
    assert_eq!((ds.calls(), ds.deduplicated()), (2, 1));
    assert_eq!(ds.effects(), 1);
    // Both requests carried the same key.
    let keys: Vec<_> = w
        .server
        .requests()
        .into_iter()
        .map(|r| r.idempotency_key)
        .collect();
    assert_eq!(
        keys,
        [Some(key("s1").to_string()), Some(key("s1").to_string())]
    );
}

#[tokio::test]
async fn a_lost_response_with_no_receipt_path_stops_at_unknown() {
    let w = world(false, false).await;
    w.server.push_fault(HttpFault::CommitThenStatus(500));
    let first = w.deliver("s1").await;
    assert_eq!(first.status, Status::Unknown, "{first:?}");
    assert_eq!(first.next_action, NextAction::Reconcile);
    let retry = w.deliver("s1").await;
    assert_eq!(retry.status, Status::Unknown);
    assert_eq!(w.server.downstream().calls(), 1, "never sent blindly again");
    assert_eq!(w.server.downstream().effects(), 1);
    assert_eq!(w.status("s1").await, Some(RecordStatus::Unknown));
}

#[tokio::test]
async fn a_malformed_answer_and_a_timeout_are_settled_by_the_lookup() {
    for fault in [
        HttpFault::CommitThenInvalidJson,
        HttpFault::CommitThenMissingReference,
        HttpFault::CommitThenDelay(std::time::Duration::from_secs(5)),
    ] {
        let w = world(true, true).await;
        w.server.push_fault(fault.clone());
        let first = w.deliver("s1").await;
        assert_eq!(first.status, Status::Applied, "{fault:?}: {first:?}");
        assert_eq!(w.server.downstream().effects(), 1, "{fault:?}");
        assert_eq!(w.deliver("s1").await.status, Status::Replayed, "{fault:?}");
        assert_eq!(w.server.downstream().effects(), 1, "{fault:?}");
    }
}

#[tokio::test]
async fn a_refusal_is_recorded_and_replayed_as_the_same_refusal() {
    let w = world(true, true).await;
    w.server.push_fault(HttpFault::refuse());
    let first = w.deliver("s1").await;
    assert_eq!(first.status, Status::Rejected, "{first:?}");
    assert_eq!(first.error_code(), Some(ErrorCode::DownstreamRejected));
    let again = w.deliver("s1").await;
    assert_eq!(again.error, first.error);
    assert_eq!(w.server.downstream().effects(), 0);
    assert_eq!(
        w.server.requests().len(),
        1,
        "the refusal is replayed, not re-asked"
    );
    assert_eq!(w.status("s1").await, Some(RecordStatus::FailedPermanent));
}

#[tokio::test]
async fn not_processed_releases_the_claim_and_a_retry_applies_once() {
    let w = world(true, true).await;
    w.server.push_fault(HttpFault::not_processed(3));
    let first = w.deliver("s1").await;
    assert_eq!(first.status, Status::Rejected, "{first:?}");
    assert!(first.safe_to_repeat());
    assert_eq!(w.server.downstream().effects(), 0);
    let retry = w.deliver("s1").await;
    assert_eq!(retry.status, Status::Applied, "{retry:?}");
    assert_eq!(w.server.downstream().effects(), 1);
}

#[tokio::test]
async fn a_url_argument_that_would_move_the_path_leaves_no_record() {
    let server = FakeServer::start().await;
    let base = format!("http://{}", server.addr());
    let text = tickets_yaml_without_retention(&base).replace(
        &format!("url: {base}/tickets\n"),
        &format!("url: {base}/queues/{{queue_id}}/tickets\n"),
    );
    let w = world_with(server, common::load(&text));
    for queue_id in ["..", ".", ""] {
        let args = serde_json::json!({"queue_id": queue_id, "subject": "Printer on fire"});
        let outcome = bounded(
            w.executor
                .execute(&w.contract, &op("s1"), &args, &w.downstream),
        )
        .await;
        assert_eq!(
            outcome.status,
            Status::Rejected,
            "{queue_id:?}: {outcome:?}"
        );
        assert_eq!(outcome.error_code(), Some(ErrorCode::InvalidArguments));
        assert!(outcome.safe_to_repeat(), "nothing happened under the key");
        let message = &outcome.error.as_ref().unwrap().message;
        assert!(message.contains("`queue_id`"), "{message}");
    }
    assert_eq!(w.status("s1").await, None, "refused before any record");
    assert!(w.server.requests().is_empty(), "nothing was sent");
}

/// A URL placeholder whose argument is absent or not a scalar is refused as invalid arguments
/// before the claim: no record, nothing sent, and the key is not burned — a corrected delivery
/// under the same key runs once, counted by the fake service.
#[tokio::test]
async fn a_url_argument_that_is_absent_or_not_a_scalar_does_not_burn_the_key() {
    let server = FakeServer::start().await;
    let base = format!("http://{}", server.addr());
    // Any JSON type passes the schema, so the URL's own check is what refuses.
    let text = tickets_yaml_without_retention(&base)
        .replace(
            &format!("url: {base}/tickets\n"),
            &format!("url: {base}/queues/{{queue_id}}/tickets\n"),
        )
        .replace("queue_id: {type: string}", "queue_id: {}");
    let w = world_with(server, common::load(&text));
    let bad = [
        serde_json::json!({"subject": "Printer on fire"}),
        serde_json::json!({"queue_id": null, "subject": "Printer on fire"}),
        serde_json::json!({"queue_id": {"q": 1}, "subject": "Printer on fire"}),
        serde_json::json!({"queue_id": ["q1"], "subject": "Printer on fire"}),
    ];
    for args in bad {
        let outcome = bounded(
            w.executor
                .execute(&w.contract, &op("s1"), &args, &w.downstream),
        )
        .await;
        assert_eq!(outcome.status, Status::Rejected, "{args}: {outcome:?}");
        assert_eq!(outcome.error_code(), Some(ErrorCode::InvalidArguments));
        assert!(
            outcome.safe_to_repeat(),
            "{args}: nothing happened under the key"
        );
        let message = &outcome.error.as_ref().unwrap().message;
        assert!(message.contains("`queue_id`"), "{message}");
        assert_eq!(
            w.status("s1").await,
            None,
            "{args}: refused before any record"
        );
    }
    assert!(w.server.requests().is_empty(), "nothing was sent");
    // The key is not burned: the corrected call under it claims and is sent.
    let good = serde_json::json!({"queue_id": "q1", "subject": "Printer on fire"});
    let outcome = bounded(
        w.executor
            .execute(&w.contract, &op("s1"), &good, &w.downstream),
    )
    .await;
    assert_ne!(
        outcome.error_code(),
        Some(ErrorCode::InvalidArguments),
        "{outcome:?}"
    );
    assert!(
        w.status("s1").await.is_some(),
        "the corrected call claimed the key"
    );
    // The fake answered (404, it serves no queues): the call was sent.
    assert_eq!(
        outcome.error_code(),
        Some(ErrorCode::DownstreamRejected),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_revoked_authorization_stops_the_replay() {
    let server = FakeServer::start().await;
    let base = format!("http://{}", server.addr());
    let text = format!(
        "{}security:\n  authorization_hook:\n    url: {base}/auth\n    timeout: 1s\n",
        tickets_yaml_without_retention(&base)
    );
    let contract = common::load(&text);
    let w = world_with(server, contract);
    assert_eq!(w.deliver("s1").await.status, Status::Applied);
    w.server.auth_switch().deny("agent access revoked");
    let retry = w.deliver("s1").await;
    assert_eq!(retry.status, Status::Rejected, "{retry:?}");
    assert_eq!(retry.result, None, "no stored result handed out");
    w.server.auth_switch().unavailable();
    let down = w.deliver("s2").await;
    assert_eq!(down.status, Status::Rejected, "fails closed: {down:?}");
    assert_eq!(w.server.downstream().effects(), 1);
    let stages: Vec<_> = w
        .server
        .auth_switch()
        .requests()
        .iter()
        .map(|r| r["stage"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(stages, ["before_effect", "before_replay", "before_effect"]);
}

fn tickets_yaml_without_retention(base: &str) -> String {
    format!(
        r#"name: tickets.create
version: "1"
effect_class: key_based
input_schema:
  type: object
  properties:
    queue_id: {{type: string}}
    subject: {{type: string}}
    body: {{type: string}}
request_fingerprint:
  fields: [queue_id, subject, body]
downstream:
  deduplicates_by_key: true
  receipt_lookup: true
  http:
    url: {base}/tickets
    reference: /ticket_id
    lookup:
      url: {base}/tickets/by-key/{{operation_key}}
retention:
  record_ttl: 1h
  tombstone_ttl: 1d
  max_retry_window: 1h
"#
    )
}
