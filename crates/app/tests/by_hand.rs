//! Records of a tool this app does not serve — written by another process over the same store
//! (an in-process `idemgate.Local`, here a second app with a tool of its own) — are resolved
//! by hand: `applied` with a reference, `not_applied`, or denied; never looked up, never
//! approved. Each effect is counted on the ledger the tool writes, never from the answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use idemgate_app::{ActError, App, Assembly, Tool, ToolSet};
use idemgate_core::contract::Contract;
use idemgate_core::effect::{Downstream, EffectOutcome, EffectRequest, JobStatus, Lookup};
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Status};
use idemgate_core::record::{Receipt, RecordStatus};
use idemgate_core::store::BoxFuture;
use idemgate_engine::{Caller, Resolution};
use serde_json::{Value, json};

/// The writer's tool: a refund, held for review when `queue` is `review`, on a ledger that
/// neither deduplicates nor can be looked up.
const REFUND: &str = r#"
name: local.refund
version: "2026-12-01"
effect_class: key_based
input_schema:
  type: object
  properties:
    payment: {type: string}
    amount: {type: integer}
    queue: {type: string}
  required: [payment, amount]
request_fingerprint:
  fields: [payment, amount, queue]
downstream:
  deduplicates_by_key: false
  receipt_lookup: false
security:
  approval: when_matches
  approval_when:
    queue: [review]
retention:
  record_ttl: 1d
  tombstone_ttl: 7d
  max_retry_window: 1d
"#;

/// The ledger the refund writes: every effect counted here, on the effect's own side.
#[derive(Default)]
struct Ledger {
    effects: AtomicU64,
    /// Commit, then lose the answer.
    lose_answers: AtomicBool,
}

struct Refunds(Arc<Ledger>);

impl Downstream for Refunds {
    fn perform<'a>(&'a self, _request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        Box::pin(async move {
            let n = self.0.effects.fetch_add(1, Ordering::SeqCst) + 1;
            if self.0.lose_answers.load(Ordering::SeqCst) {
                return EffectOutcome::ambiguous("the answer was lost");
            }
            EffectOutcome::Committed(Receipt {
                reference: format!("refund-{n}"),
                result: json!({"refund": n}),
            })
        })
    }

    fn lookup_receipt<'a>(&'a self, _key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        Box::pin(async { panic!("the contract declares no lookup") })
    }

    fn poll_job<'a>(&'a self, _key: &'a OperationKey, _job: &'a str) -> BoxFuture<'a, JobStatus> {
        Box::pin(async { panic!("the contract declares no jobs") })
    }
}

struct World {
    /// The process with the tool (the in-process package's).
    writer: App,
    /// The operator's side over the same store file, without the tool.
    operator: App,
    ledger: Arc<Ledger>,
    _dir: tempfile::TempDir,
}

async fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("local.sqlite").display());
    let ledger = Arc::new(Ledger::default());
    let tool = Tool {
        contract: Arc::new(Contract::load(REFUND, "local.refund.yaml").unwrap()),
        downstream: Arc::new(Refunds(ledger.clone())),
        authorizer: None,
    };
    let open = || idemgate_app::open_store(&url, idemgate_core::audit::Sealer::unsigned());
    let writer = Assembly::new(
        open().await.unwrap(),
        ToolSet::from_tools(vec![tool]).unwrap(),
        "dev",
    )
    .build();
    // A second handle on the file, as a second process would open it.
    let operator = Assembly::new(open().await.unwrap(), ToolSet::default(), "dev").build();
    World {
        writer,
        operator,
        ledger,
        _dir: dir,
    }
}

fn agent() -> Caller {
    Caller {
        tenant: "acme".into(),
        actor: "agent-1".into(),
        role: "agent".into(),
    }
}

fn alice() -> Caller {
    Caller {
        tenant: "acme".into(),
        actor: "alice".into(),
        role: "operator".into(),
    }
}

fn refund(queue: &str) -> Value {
    json!({"payment": "pay_42", "amount": 1200, "queue": queue})
}

impl World {
    async fn deliver(&self, workflow: &str, queue: &str) -> idemgate_core::outcome::Outcome {
        self.writer
            .invoke(
                agent(),
                "local.refund",
                Some(workflow.into()),
                Some("refund".into()),
                refund(queue),
            )
            .await
    }

    fn effects(&self) -> u64 {
        self.ledger.effects.load(Ordering::SeqCst)
    }

    async fn status(&self, key: &OperationKey) -> RecordStatus {
        self.operator
            .record("acme", key)
            .await
            .unwrap()
            .unwrap()
            .status()
    }

    async fn details(&self, key: &OperationKey) -> Vec<String> {
        let store = self.operator.executor().store();
        let events = store.events(key).await.unwrap();
        events.into_iter().filter_map(|e| e.detail).collect()
    }
}

fn key(workflow: &str) -> OperationKey {
    OperationKey::parse(&format!("acme:dev:{workflow}:refund")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_record_of_a_tool_not_served_is_resolved_applied_by_hand_never_looked_up() {
    let w = world().await;
    w.ledger.lose_answers.store(true, Ordering::SeqCst);
    let lost = w.deliver("run_1", "main").await;
    assert_eq!(lost.status, Status::Unknown, "{lost:?}");
    assert_eq!(w.effects(), 1);
    let k = key("run_1");

    // A lookup needs the tool: refused, nothing written.
    let before = w.details(&k).await;
    let lookup = w.operator.reconcile(&alice(), &k, None, "check").await;
    assert!(
        matches!(&lookup, Err(ActError::NotServed { tool, .. }) if tool == "local.refund"),
        "{lookup:?}"
    );
    // Approval needs the effect: refused too.
    let approve = w.operator.approve(&alice(), &k, None, "go").await;
    assert!(
        matches!(approve, Err(ActError::NotServed { .. })),
        "{approve:?}"
    );
    assert_eq!(w.details(&k).await, before, "a refusal writes nothing");
    assert_eq!(w.status(&k).await, RecordStatus::Unknown);

    // Another tenant's operator does not find it.
    let other = Caller {
        tenant: "globex".into(),
        ..alice()
    };
    let hidden = w
        .operator
        .reconcile(&other, &k, Some(Resolution::NotApplied), "mine")
        .await;
    assert!(matches!(hidden, Err(ActError::NotFound(_))), "{hidden:?}");

    // By hand: the operator found the refund in the ledger.
    let applied = Resolution::Applied {
        reference: "refund-1".into(),
        result: json!({"refund": 1}),
    };
    let resolved = w
        .operator
        .reconcile(&alice(), &k, Some(applied), "seen in the payments ledger")
        .await
        .unwrap();
    assert_eq!(resolved.status, Status::Replayed, "{resolved:?}");
    assert_eq!(resolved.effect_reference.as_deref(), Some("refund-1"));
    assert_eq!(w.status(&k).await, RecordStatus::Applied);
    let record = w.operator.record("acme", &k).await.unwrap().unwrap();
    assert!(
        record.expires_at > record.updated_at && record.purge_at > record.expires_at,
        "settled with an expiry: {record:?}"
    );
    // The reason is on the timeline, with the actor.
    assert!(
        w.details(&k)
            .await
            .iter()
            .any(|d| d.contains("by alice") && d.contains("reason: seen in the payments ledger")),
        "{:?}",
        w.details(&k).await
    );

    // The writer's next delivery replays it: still one effect on the ledger.
    w.ledger.lose_answers.store(false, Ordering::SeqCst);
    let again = w.deliver("run_1", "main").await;
    assert_eq!(again.status, Status::Replayed, "{again:?}");
    assert_eq!(again.effect_reference.as_deref(), Some("refund-1"));
    assert_eq!(w.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_applied_by_hand_lets_the_writer_run_it_and_a_denial_by_hand_is_replayed() {
    let w = world().await;

    // Not applied: the operator says the ledger holds nothing; the next delivery runs it.
    w.ledger.lose_answers.store(true, Ordering::SeqCst);
    assert_eq!(w.deliver("run_2", "main").await.status, Status::Unknown);
    let k = key("run_2");
    let released = w
        .operator
        .reconcile(
            &alice(),
            &k,
            Some(Resolution::NotApplied),
            "no refund in the ledger",
        )
        .await
        .unwrap();
    // Released: the next delivery runs it (a poll meanwhile answers in flight).
    assert_eq!(released.status, Status::InFlight, "{released:?}");
    assert_eq!(w.status(&k).await, RecordStatus::Pending);
    w.ledger.lose_answers.store(false, Ordering::SeqCst);
    let ran = w.deliver("run_2", "main").await;
    assert_eq!(ran.status, Status::Applied, "{ran:?}");
    assert_eq!(
        w.effects(),
        2,
        "the lost one and the one the operator let run"
    );

    // Held for review, then denied by hand: nothing runs, every delivery replays the refusal.
    let held = w.deliver("run_3", "review").await;
    assert_eq!(
        w.status(&key("run_3")).await,
        RecordStatus::AwaitingApproval
    );
    assert_ne!(held.status, Status::Applied);
    let approve = w
        .operator
        .approve(&alice(), &key("run_3"), None, "ok")
        .await;
    assert!(
        matches!(approve, Err(ActError::NotServed { .. })),
        "{approve:?}"
    );
    let denied = w
        .operator
        .deny(&alice(), &key("run_3"), "duplicate of run_2")
        .await
        .unwrap();
    assert_eq!(denied.status, Status::Rejected, "{denied:?}");
    let replayed = w.deliver("run_3", "review").await;
    assert_eq!(
        replayed.error.as_ref().map(|e| e.code),
        Some(ErrorCode::ApprovalDenied),
        "{replayed:?}"
    );
    assert_eq!(w.effects(), 2, "a denial runs nothing");
    assert!(
        w.details(&key("run_3"))
            .await
            .iter()
            .any(|d| d.contains("reason: duplicate of run_2")),
        "{:?}",
        w.details(&key("run_3")).await
    );
}
