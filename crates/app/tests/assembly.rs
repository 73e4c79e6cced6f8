//! The assembly end to end on an embedded SQLite file: contracts → tools → store → executor →
//! recoverer, as every face puts it together. Effects are counted by the sandbox on its own
//! side.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idemgate_app::{App, Assembly, Recovery, ToolSet, contracts};
use idemgate_core::RecordStatus;
use idemgate_core::clock::ManualClock;
use idemgate_core::contract::Contract;
use idemgate_core::effect::Downstream;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Status};
use idemgate_engine::Caller;
use idemgate_sandbox::{Jobs, Sandbox, Sandboxes};
use serde_json::{Value, json};

struct World {
    app: App,
    clock: Arc<ManualClock>,
    sandboxes: Sandboxes,
    _dir: tempfile::TempDir,
}

async fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contracts/*.yaml");
    let contracts = contracts::load(&[root.to_string()], Path::new("")).unwrap();
    let sandboxes = Sandboxes::for_contracts(&contracts, Jobs::FirstPoll);
    let effects = |c: &Contract| -> Result<Arc<dyn Downstream>, String> {
        sandboxes
            .downstream(&c.name)
            .ok_or_else(|| "no sandbox".into())
    };
    let tools = ToolSet::build(contracts, &effects).unwrap();
    let url = format!("sqlite://{}", dir.path().join("app.sqlite").display());
    let store = idemgate_app::open_store(&url, idemgate_core::audit::Sealer::unsigned())
        .await
        .unwrap();
    // 2026-12-01T10:00:00Z; the tests move it on where they need time to pass.
    let clock = Arc::new(ManualClock::new(1_796_119_200_000));
    let app = Assembly::new(store, tools, "test")
        .clock(clock.clone())
        .recovery(Recovery {
            every: Duration::from_millis(100),
            sweep_every: Duration::from_secs(60),
        })
        .build();
    World {
        app,
        clock,
        sandboxes,
        _dir: dir,
    }
}

fn caller(tenant: &str) -> Caller {
    Caller {
        tenant: tenant.into(),
        actor: "agent-1".into(),
        role: "agent".into(),
    }
}

impl World {
    fn sandbox(&self, tool: &str) -> &Sandbox {
        self.sandboxes.get(tool).unwrap()
    }

    async fn call(&self, tenant: &str, tool: &str, workflow: &str, arguments: Value) -> Status {
        self.app
            .invoke(
                caller(tenant),
                tool,
                Some(workflow.into()),
                Some("s".into()),
                arguments,
            )
            .await
            .status
    }
}

fn ticket() -> Value {
    json!({"subject": "Refund", "body": "Order 42 arrived broken."})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_step_is_one_effect_and_its_status_is_its_tenants_only() {
    let world = world().await;
    let first = world
        .call("acme", "tickets.create", "run_1", ticket())
        .await;
    let again = world
        .call("acme", "tickets.create", "run_1", ticket())
        .await;
    assert_eq!((first, again), (Status::Applied, Status::Replayed));
    let tickets = world.sandbox("tickets.create");
    assert_eq!((tickets.effects(), tickets.calls()), (1, 1));

    let key = OperationKey::parse("acme:test:run_1:s").unwrap();
    let read = world.app.status(&caller("acme"), &key).await.unwrap();
    assert_eq!(read.status, Status::Replayed, "{read:?}");
    // Another tenant's key, or another environment's, is not found, exactly as a missing one.
    assert!(world.app.status(&caller("globex"), &key).await.is_none());
    let elsewhere = OperationKey::parse("acme:prod:run_1:s").unwrap();
    assert!(
        world
            .app
            .status(&caller("acme"), &elsewhere)
            .await
            .is_none()
    );
    assert_eq!(tickets.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_a_settled_record_is_answered_from_memory_and_nothing_else_is() {
    let world = world().await;
    let acme = caller("acme");
    let memory = |tenant: &Caller, tool: &str, step: Option<&str>, arguments: &Value| {
        world
            .app
            .replay_from_memory(tenant, tool, Some("run_m"), step, arguments)
    };
    // Nothing recorded yet: the delivery needs the store.
    assert!(memory(&acme, "tickets.create", Some("s"), &ticket()).is_none());
    let first = world
        .call("acme", "tickets.create", "run_m", ticket())
        .await;
    assert_eq!(first, Status::Applied);
    let replay = memory(&acme, "tickets.create", Some("s"), &ticket()).expect("kept in memory");
    assert_eq!(replay.status, Status::Replayed, "{replay:?}");
    // Changed arguments (a refusal), another tenant's key, no step, a tool not served: each goes
    // the long way, through `invoke`.
    let changed = json!({"subject": "Refund", "body": "Order 43 arrived broken."});
    assert!(memory(&acme, "tickets.create", Some("s"), &changed).is_none());
    assert!(memory(&caller("globex"), "tickets.create", Some("s"), &ticket()).is_none());
    assert!(memory(&acme, "tickets.create", None, &ticket()).is_none());
    assert!(memory(&acme, "tickets.missing", Some("s"), &ticket()).is_none());
    let tickets = world.sandbox("tickets.create");
    assert_eq!((tickets.effects(), tickets.calls()), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_is_not_served_is_refused_before_anything_is_sent() {
    let world = world().await;
    let refused = world
        .app
        .invoke(
            caller("acme"),
            "tickets.delete",
            Some("run_2".into()),
            Some("s".into()),
            ticket(),
        )
        .await;
    assert_eq!(refused.status, Status::Rejected);
    assert_eq!(
        refused.error.as_ref().map(|e| e.code),
        Some(ErrorCode::UnknownTool),
        "{refused:?}"
    );
    let calls: u64 = world.sandboxes.iter().map(|(_, s)| s.calls()).sum();
    assert_eq!(calls, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_started_recoverer_finishes_an_accepted_job_and_stops_when_asked() {
    let world = world().await;
    let background = world.app.start_recoverer();
    let report =
        json!({"report_type": "usage", "period_start": "2026-11-01", "period_end": "2026-11-30"});
    let accepted = world
        .call("acme", "reports.generate", "run_3", report)
        .await;
    assert_eq!(accepted, Status::InFlight);
    // Nobody reads the status: only the recoverer polls the job, once its lease ran out, and
    // settles the record.
    assert_eq!(world.sandbox("reports.generate").polls(), 0);
    world.clock.advance(10 * 60 * 1000);
    let key = OperationKey::parse("acme:test:run_3:s").unwrap();
    let store = world.app.executor().store().clone();
    tokio::time::timeout(Duration::from_secs(20), async {
        while store.get(&key).await.unwrap().unwrap().status() != RecordStatus::Applied {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the recoverer polled the job to its end");
    let reports = world.sandbox("reports.generate");
    assert_eq!(reports.effects(), 1);
    assert!(reports.polls() >= 1);
    tokio::time::timeout(Duration::from_secs(10), background.stop())
        .await
        .expect("the recoverer stops when asked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_actions_by_key_are_scoped_to_the_callers_tenant() {
    use idemgate_app::ActError;
    let world = world().await;
    let legal = json!({"queue_id": "legal", "subject": "Refund", "body": "Order 42."});
    let held = world
        .call("acme", "tickets.create", "run_4", legal.clone())
        .await;
    let denied = world.call("acme", "tickets.create", "run_5", legal).await;
    assert_eq!((held, denied), (Status::InFlight, Status::InFlight));
    let tickets = world.sandbox("tickets.create");
    assert_eq!(tickets.calls(), 0, "nothing runs before an approval");

    let key = OperationKey::parse("acme:test:run_4:s").unwrap();
    // Another tenant finds nothing to act on, exactly as for a missing key.
    let e = world
        .app
        .approve(&caller("globex"), &key, None, "r")
        .await
        .unwrap_err();
    assert!(matches!(e, ActError::NotFound(_)), "{e}");
    let applied = world
        .app
        .approve(&caller("acme"), &key, None, "checked")
        .await
        .unwrap();
    assert_eq!(applied.status, Status::Applied, "{applied:?}");
    assert_eq!(tickets.effects(), 1);

    let other = OperationKey::parse("acme:test:run_5:s").unwrap();
    let e = world
        .app
        .deny(&caller("globex"), &other, "r")
        .await
        .unwrap_err();
    assert!(matches!(e, ActError::NotFound(_)), "{e}");
    let refusal = world
        .app
        .deny(&caller("acme"), &other, "not ours")
        .await
        .unwrap();
    assert_eq!(
        refusal.error.map(|e| e.code),
        Some(ErrorCode::ApprovalDenied)
    );
    // An applied record cannot be reconciled; the engine's refusal comes through.
    let e = world
        .app
        .reconcile(&caller("acme"), &key, None, "r")
        .await
        .unwrap_err();
    assert!(matches!(e, ActError::Action(_)), "{e}");
    let elsewhere = OperationKey::parse("acme:prod:run_4:s").unwrap();
    let e = world
        .app
        .reconcile(&caller("acme"), &elsewhere, None, "r")
        .await
        .unwrap_err();
    assert!(matches!(e, ActError::NotFound(_)), "{e}");
    assert_eq!(tickets.effects(), 1);
}

/// A downstream whose call commits an effect (counted on its own side) and then panics: the
/// task that ran the delivery dies after it may have sent.
struct CommitsThenPanics {
    effects: std::sync::atomic::AtomicU64,
}

impl Downstream for CommitsThenPanics {
    fn perform<'a>(
        &'a self,
        _request: idemgate_core::effect::EffectRequest<'a>,
    ) -> idemgate_core::store::BoxFuture<'a, idemgate_core::effect::EffectOutcome> {
        Box::pin(async move {
            self.effects
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            panic!("the effect's code failed after committing");
        })
    }
    fn lookup_receipt<'a>(
        &'a self,
        _key: &'a OperationKey,
    ) -> idemgate_core::store::BoxFuture<'a, idemgate_core::effect::Lookup> {
        Box::pin(async { idemgate_core::effect::Lookup::Unavailable("no lookup".into()) })
    }
    fn poll_job<'a>(
        &'a self,
        _key: &'a OperationKey,
        _job_id: &'a str,
    ) -> idemgate_core::store::BoxFuture<'a, idemgate_core::effect::JobStatus> {
        Box::pin(async { idemgate_core::effect::JobStatus::Running })
    }
}

/// A delivery whose task died after it may have sent is `unknown`, never `rejected` — and
/// never sent again. A key the task never touched is refused as safe to repeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_died_after_it_may_have_sent_is_unknown() {
    died_after_it_may_have_sent(false).await;
}

/// The same, for a delivery run on its blocked caller's own thread (`invoke_awaited`, as a
/// synchronous in-process call runs): the panic is caught there and answered the same way.
#[test]
fn a_blocking_delivery_that_died_after_it_may_have_sent_is_unknown() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let handle = runtime.handle().clone();
    // A thread of its own, outside the runtime, blocked on the answer: as a Python caller is.
    std::thread::spawn(move || handle.block_on(died_after_it_may_have_sent(true)))
        .join()
        .unwrap();
}

async fn died_after_it_may_have_sent(blocking: bool) {
    let dir = tempfile::tempdir().unwrap();
    let root = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../contracts/tickets.create.yaml"
    );
    let contracts = contracts::load(&[root.to_string()], Path::new("")).unwrap();
    let downstream = Arc::new(CommitsThenPanics {
        effects: Default::default(),
    });
    let shared = downstream.clone();
    let effects = move |_: &Contract| -> Result<Arc<dyn Downstream>, String> {
        Ok(shared.clone() as Arc<dyn Downstream>)
    };
    let tools = ToolSet::build(contracts, &effects).unwrap();
    let url = format!("sqlite://{}", dir.path().join("app.sqlite").display());
    let store = idemgate_app::open_store(&url, idemgate_core::audit::Sealer::unsigned())
        .await
        .unwrap();
    let app = Assembly::new(store, tools, "test").build();
    let call = || async {
        let (workflow, step) = (Some("run_p".into()), Some("s".into()));
        if blocking {
            app.invoke_awaited(
                caller("acme"),
                "tickets.create",
                workflow,
                step,
                ticket(),
                None,
            )
            .await
        } else {
            app.invoke(caller("acme"), "tickets.create", workflow, step, ticket())
                .await
        }
    };
    let died = call().await;
    assert_eq!(died.status, Status::Unknown, "{died:?}");
    assert!(!died.safe_to_repeat());
    assert_eq!(
        died.operation_key.as_ref().map(|k| k.as_str()),
        Some("acme:test:run_p:s")
    );
    // The claim stays with the dead task until its lease ends; a repeat does not send again.
    let again = call().await;
    assert_ne!(again.status, Status::Applied, "{again:?}");
    assert!(!again.safe_to_repeat(), "{again:?}");
    assert_eq!(
        downstream.effects.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

#[test]
fn a_listing_query_that_does_not_read_names_its_parameter() {
    use idemgate_app::operations::{ListQuery, list_filter};
    let check = |query: ListQuery, expect: Result<(Option<RecordStatus>, usize), &str>| {
        let got = list_filter(query)
            .map(|f| (f.status, f.limit))
            .map_err(|e| (e.code(), e.to_string()));
        match expect {
            Ok(filter) => assert_eq!(got.unwrap(), filter),
            Err(parameter) => {
                let (code, message) = got.unwrap_err();
                assert_eq!(code, ErrorCode::InvalidArguments);
                assert!(message.starts_with(parameter), "{message}");
            }
        }
    };
    check(ListQuery::default(), Ok((None, 100)));
    let status = |s: &str| ListQuery {
        status: Some(s.into()),
        ..ListQuery::default()
    };
    let limit = |n| ListQuery {
        limit: Some(n),
        ..ListQuery::default()
    };
    check(status("unknown"), Ok((Some(RecordStatus::Unknown), 100)));
    check(status("settled"), Err("status is one of"));
    check(limit(500), Ok((None, 500)));
    check(limit(0), Err("limit is between 1 and 500"));
    check(limit(501), Err("limit is between 1 and 500"));
}

/// The operator's answers (what API v1 and `idemgate ops --store` send): another tenant's
/// operation reads and acts as not found, exactly as a missing key; refusals name their kind;
/// the read models keep API v1's member order. Effects are counted by the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_answers_read_another_tenants_operation_as_not_found() {
    use idemgate_app::OperatorError;
    use idemgate_app::operations::{
        ApproveRequest, DenyRequest, ListQuery, ReconcileRequest, Scope,
    };
    let world = world().await;
    let legal = json!({"queue_id": "legal", "subject": "Refund", "body": "Order 42."});
    let held = world.call("acme", "tickets.create", "run_6", legal).await;
    assert_eq!(held, Status::InFlight);
    let tickets = world.sandbox("tickets.create");
    let k = "acme:test:run_6:s";
    let operator = |tenant: &str| Caller {
        tenant: tenant.into(),
        actor: "alice".into(),
        role: "operator".into(),
    };
    let acme = operator("acme");

    let view = world.app.operation_view(&acme, k).await.unwrap();
    assert_eq!(view.record.record_status, "awaiting_approval");
    assert_eq!(view.outcome.outcome.as_str(), "in_flight");
    // API v1's member order: the summary flattened first, then receipt, outcome, events.
    let text = serde_json::to_string(&view).unwrap();
    let members = [
        "operation_key",
        "tool",
        "tool_version",
        "record_status",
        "fingerprint",
        "attempt",
        "effect_reference",
        "job_id",
        "approved_by",
        "created_at",
        "created_at_rfc3339",
        "updated_at",
        "updated_at_rfc3339",
        "expires_at",
        "expires_at_rfc3339",
        "receipt",
        "outcome",
        "events",
    ];
    let at: Vec<usize> = members
        .iter()
        .map(|m| text.find(&format!("\"{m}\":")).unwrap())
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{text}");

    // Another tenant, a missing key, a key that does not parse: not found alike.
    let not_found = |answer: Result<_, OperatorError>| match answer {
        Err(e @ OperatorError::NotFound) => {
            assert_eq!(e.code(), ErrorCode::NotFound);
            let outcome = e.outcome();
            assert_eq!(outcome.status, Status::Rejected);
            assert_eq!(outcome.error.unwrap().message, "no such operation");
        }
        other => panic!("{other:?}"),
    };
    let globex = operator("globex");
    let approve = |fingerprint: Option<&str>| ApproveRequest {
        fingerprint: fingerprint.map(str::to_string),
        reason: Some("checked".into()),
    };
    let app = &world.app;
    let missing = [
        app.operation_view(&globex, k).await.map(drop),
        app.operation_view(&acme, "acme:test:run_9:s")
            .await
            .map(drop),
        app.operation_view(&acme, "not a key").await.map(drop),
        app.deny_request(&globex, k, DenyRequest::default())
            .await
            .map(drop),
        app.approve_request(&globex, k, approve(None))
            .await
            .map(drop),
    ];
    for answer in missing {
        not_found(answer);
    }

    let listed = |scope| world.app.operation_list(scope, ListQuery::default());
    let keys = |list: idemgate_app::views::OperationList| -> Vec<String> {
        list.operations
            .into_iter()
            .map(|o| o.operation_key)
            .collect()
    };
    assert!(keys(listed(Scope::Tenant("globex".into())).await.unwrap()).is_empty());
    assert_eq!(
        keys(listed(Scope::Tenant("acme".into())).await.unwrap()),
        [k]
    );
    let store = Scope::Store {
        tenant: None,
        environment: None,
    };
    assert_eq!(keys(listed(store).await.unwrap()), [k]);
    assert_eq!(tickets.calls(), 0, "reads and refusals send nothing");

    // An invalid request names what is wrong; nothing runs.
    let bad = world
        .app
        .approve_request(&acme, k, approve(Some("sha1:x")))
        .await;
    match bad {
        Err(e @ OperatorError::Invalid(_)) => {
            assert_eq!(e.code(), ErrorCode::InvalidArguments);
            assert!(e.to_string().starts_with("fingerprint"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(tickets.calls(), 0);

    let applied = world
        .app
        .approve_request(&acme, k, approve(None))
        .await
        .unwrap();
    assert_eq!(applied.status, Status::Applied, "{applied:?}");
    assert_eq!(tickets.effects(), 1);

    // A resolution of an operation that is not unknown does not apply to it: a conflict.
    let late = ReconcileRequest::NotApplied { reason: None };
    let conflict = world.app.reconcile_request(&acme, k, Some(late)).await;
    match conflict {
        Err(e @ OperatorError::Conflict { .. }) => assert_eq!(e.code(), ErrorCode::Conflict),
        other => panic!("{other:?}"),
    }
    let empty = ReconcileRequest::Applied {
        effect_reference: " ".into(),
        result: Value::Null,
        reason: None,
    };
    let invalid = world.app.reconcile_request(&acme, k, Some(empty)).await;
    assert!(
        matches!(&invalid, Err(OperatorError::Invalid(m)) if m.starts_with("effect_reference")),
        "{invalid:?}"
    );
    assert_eq!(tickets.effects(), 1, "one effect in all");
}
