//! `idemgate ops --store URL`: the operator's commands on a store directly, without a gateway,
//! over records of a tool the command does not have (written by another process — an
//! in-process `idemgate.Local`; here the engine with a tool of its own). They are listed,
//! shown, and resolved by hand (applied with a reference, not applied, denied), never looked
//! up or approved. Every effect is counted on the ledger the tool writes.
//!
//! On SQLite always; on PostgreSQL too when `DATABASE_URL` is set (a fresh database, dropped
//! after). Every refusal reads as it does through a gateway: the same status and code in the
//! message, the same problem document with `--json`.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use idemgate_app::{App, Assembly, Tool, ToolSet};
use idemgate_core::contract::Contract;
use idemgate_core::effect::{Downstream, EffectOutcome, EffectRequest, JobStatus, Lookup};
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Outcome, Status};
use idemgate_core::record::Receipt;
use idemgate_core::store::BoxFuture;
use idemgate_engine::Caller;
use idemgate_store_postgres::testing::fresh_database;
use serde_json::{Value, json};
use support::{Gateway, OPERATOR, Run};

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

/// The refunds ledger: every effect counted on its own side.
#[derive(Default)]
struct Ledger {
    effects: AtomicU64,
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

/// The process with the tool, over `url`, in `environment`.
async fn writer(url: &str, ledger: &Arc<Ledger>, environment: &str) -> App {
    let tool = Tool {
        contract: Arc::new(Contract::load(REFUND, "local.refund.yaml").unwrap()),
        downstream: Arc::new(Refunds(ledger.clone())),
        authorizer: None,
    };
    let store = idemgate_app::open_store(url, idemgate_core::audit::Sealer::unsigned())
        .await
        .unwrap();
    Assembly::new(store, ToolSet::from_tools(vec![tool]).unwrap(), environment).build()
}

async fn deliver(app: &App, workflow: &str, queue: &str) -> Outcome {
    let caller = Caller {
        tenant: "acme".into(),
        actor: "agent-1".into(),
        role: "agent".into(),
    };
    let arguments = json!({"payment": "pay_42", "amount": 1200, "queue": queue});
    app.invoke(
        caller,
        "local.refund",
        Some(workflow.into()),
        Some("refund".into()),
        arguments,
    )
    .await
}

/// `idemgate ops --store URL ARGS` as operator `alice`, off the test's runtime threads.
async fn ops(url: &str, args: &[&str]) -> Run {
    let mut all = vec!["ops".to_string(), "--store".into(), url.to_string()];
    all.extend(args.iter().map(|s| s.to_string()));
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = all.iter().map(String::as_str).collect();
        support::idemgate_with(None, None, &[("IDEMGATE_ACTOR", "alice")], &args)
    })
    .await
    .unwrap()
}

#[track_caller]
fn expect_code(run: &Run, code: i32) {
    assert_eq!(run.code, code, "{run:#?}");
}

/// The whole story over one store URL.
async fn resolves_by_hand_over(url: &str) {
    let ledger = Arc::new(Ledger::default());
    let app = writer(url, &ledger, "dev").await;
    let effects = || ledger.effects.load(Ordering::SeqCst);

    // An answer lost after the effect: unknown.
    ledger.lose_answers.store(true, Ordering::SeqCst);
    assert_eq!(deliver(&app, "run_1", "main").await.status, Status::Unknown);
    assert_eq!(effects(), 1);
    let k = "acme:dev:run_1:refund";

    // The reconciliation queue and the record, read from the store.
    let list = ops(url, &["list"]).await;
    expect_code(&list, 0);
    assert!(
        list.stdout.contains(k) && list.stdout.contains("local.refund"),
        "{list:?}"
    );
    let listed = ops(url, &["list", "--json", "--tenant", "acme"])
        .await
        .json();
    assert_eq!(listed["operations"][0]["operation_key"], k);
    let elsewhere = ops(url, &["list", "--json", "--tenant", "globex"])
        .await
        .json();
    assert_eq!(elsewhere["operations"], json!([]));
    let show = ops(url, &["show", k]).await;
    expect_code(&show, 0);
    assert!(
        show.stdout.contains("unknown")
            && show.stdout.contains("local.refund (version 2026-12-01)"),
        "{show:?}"
    );

    // A lookup needs the tool: refused, nothing changed.
    let lookup = ops(url, &["reconcile", k]).await;
    expect_code(&lookup, 2);
    assert!(
        lookup.stderr.contains("not loaded") && lookup.stderr.contains("by hand"),
        "{lookup:?}"
    );
    let missing = ops(url, &["show", "acme:dev:run_9:refund"]).await;
    expect_code(&missing, 2);
    assert!(missing.stderr.contains("no operation"), "{missing:?}");

    // Resolved applied by hand: what changed, and what a caller gets now.
    let resolved = ops(
        url,
        &[
            "reconcile",
            k,
            "--applied",
            "--reference",
            "refund-1",
            "--result",
            r#"{"refund": 1}"#,
            "--reason",
            "seen in the payments ledger",
        ],
    )
    .await;
    expect_code(&resolved, 0);
    assert!(
        resolved.stdout.contains("unknown -> applied")
            && resolved
                .stdout
                .contains("a caller gets now: replayed, reference refund-1")
            && resolved
                .stdout
                .contains("by alice; reason: seen in the payments ledger"),
        "{resolved:?}"
    );
    // The process with the tool replays it: one effect in all.
    ledger.lose_answers.store(false, Ordering::SeqCst);
    let again = deliver(&app, "run_1", "main").await;
    assert_eq!(again.status, Status::Replayed, "{again:?}");
    assert_eq!(again.effect_reference.as_deref(), Some("refund-1"));
    assert_eq!(effects(), 1);

    // Held for review: approving needs the tool; a denial by hand is replayed, nothing runs.
    let held = deliver(&app, "run_2", "review").await;
    assert_ne!(held.status, Status::Applied, "{held:?}");
    let k2 = "acme:dev:run_2:refund";
    let approve = ops(url, &["approve", k2, "--reason", "fine"]).await;
    expect_code(&approve, 2);
    assert!(approve.stderr.contains("not loaded"), "{approve:?}");
    let deny = ops(url, &["deny", k2, "--reason", "a duplicate of run_1"]).await;
    expect_code(&deny, 0);
    assert!(
        deny.stdout
            .contains("awaiting_approval -> failed_permanent"),
        "{deny:?}"
    );
    let refused = deliver(&app, "run_2", "review").await;
    assert_eq!(
        refused.error.as_ref().map(|e| e.code),
        Some(ErrorCode::ApprovalDenied),
        "{refused:?}"
    );
    assert_eq!(effects(), 1, "a denial runs nothing");

    // Not applied by hand (confirmed for a script): the writer's next delivery runs it.
    ledger.lose_answers.store(true, Ordering::SeqCst);
    assert_eq!(deliver(&app, "run_3", "main").await.status, Status::Unknown);
    assert_eq!(effects(), 2);
    let k3 = "acme:dev:run_3:refund";
    let unconfirmed = ops(url, &["reconcile", k3, "--not-applied"]).await;
    expect_code(&unconfirmed, 2);
    let released = ops(
        url,
        &[
            "reconcile",
            k3,
            "--not-applied",
            "--yes",
            "--reason",
            "the ledger has no refund",
        ],
    )
    .await;
    expect_code(&released, 0);
    assert!(
        released.stdout.contains("unknown -> pending"),
        "{released:?}"
    );
    ledger.lose_answers.store(false, Ordering::SeqCst);
    assert_eq!(deliver(&app, "run_3", "main").await.status, Status::Applied);
    assert_eq!(
        effects(),
        3,
        "the lost one, and the one the operator let run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_on_a_sqlite_store_resolves_records_of_a_tool_it_does_not_have() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("local.sqlite").display());
    resolves_by_hand_over(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_on_a_postgres_store_resolves_records_of_a_tool_it_does_not_have() {
    let Some(db) = fresh_database().await else {
        return;
    };
    resolves_by_hand_over(db.url()).await;
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_store_url_and_a_store_beside_a_gateway_are_refused() {
    let bad = ops("mysql://db/x", &["list"]).await;
    expect_code(&bad, 2);
    assert!(
        bad.stderr.contains("sqlite://") && bad.stderr.contains("postgres://"),
        "{bad:?}"
    );
    let both = tokio::task::spawn_blocking(|| {
        support::idemgate(
            None,
            None,
            &[
                "ops",
                "--gateway",
                "http://127.0.0.1:1",
                "--store",
                "sqlite://x.db",
                "list",
            ],
        )
    })
    .await
    .unwrap();
    expect_code(&both, 2);
    assert!(both.stderr.contains("--store"), "{both:?}");
}

/// What a refusal printed with `--json`, apart from what differs by nature: a gateway's problem
/// `type` is under its own address, one made over a store is the relative `/problems/<code>`.
fn document(run: &Run) -> Option<Value> {
    if run.stdout.trim().is_empty() {
        return None;
    }
    let mut doc = run.json();
    if let Some(Value::String(t)) = doc.get_mut("type") {
        *t = t[t.find("/problems/").expect("a problem type")..].to_string();
    }
    Some(doc)
}

/// `ops --store` answers every refusal as `ops` through a gateway does over the same records
/// (two stores written alike, a gateway over one): the same exit status, the same `(422
/// conflict)` in the message, and with `--json` the same problem document (API v1's, made in
/// the process). Nothing is sent by any of them: the ledger counts no effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_over_a_store_reads_as_through_a_gateway() {
    let (here, there) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = format!("sqlite://{}", here.path().join("gate.sqlite").display());
    let gated = format!("sqlite://{}", there.path().join("gate.sqlite").display());
    let ledger = Arc::new(Ledger::default());
    let mut writers = Vec::new();
    for url in [&store, &gated] {
        let app = writer(url, &ledger, support::ENVIRONMENT).await;
        assert_eq!(deliver(&app, "run_1", "main").await.status, Status::Applied);
        assert_ne!(
            deliver(&app, "run_2", "review").await.status,
            Status::Applied
        );
        assert_ne!(
            deliver(&app, "run_3", "review").await.status,
            Status::Applied
        );
        ledger.lose_answers.store(true, Ordering::SeqCst);
        assert_eq!(deliver(&app, "run_4", "main").await.status, Status::Unknown);
        ledger.lose_answers.store(false, Ordering::SeqCst);
        writers.push(app);
    }
    let effects = || ledger.effects.load(Ordering::SeqCst);
    assert_eq!(effects(), 4, "run_1 and run_4 on each store");
    // The gateway serves the examples, not `local.refund`: its records are resolved by hand
    // there too.
    let config = format!(
        "{}{}",
        support::config_head(there.path(), &support::example_contracts(), true),
        support::tenants()
    );
    let gateway = Gateway::start(there, &config);

    let k = |run: &str| format!("acme:{}:{run}:refund", support::ENVIRONMENT);
    let (applied, held, denied) = (k("run_1"), k("run_2"), k("run_3"));
    let (unknown, missing) = (k("run_4"), k("run_9"));
    // (the command, the label of its refusal)
    let cases: &[(&[&str], &str)] = &[
        (&["show", &missing], "404 not_found"),
        (&["approve", &missing], "404 not_found"),
        (&["approve", &held, "--reason", "fine"], "422 conflict"),
        (&["reconcile", &unknown], "422 conflict"),
        (
            &["reconcile", &applied, "--applied", "--reference", "r-1"],
            "422 conflict",
        ),
        (&["deny", &applied, "--reason", "late"], "422 conflict"),
        (
            &["approve", &held, "--fingerprint", "sha256:nonsense"],
            "400 invalid_arguments",
        ),
    ];
    for (args, label) in cases {
        let local = ops(&store, args).await;
        let remote = support::ops(&gateway, OPERATOR, args).await;
        for run in [&local, &remote] {
            expect_code(run, 2);
            assert!(
                run.stderr.contains(&format!("({label}")),
                "{args:?}: {run:?}"
            );
        }
        let mut json = args.to_vec();
        json.push("--json");
        let local = ops(&store, &json).await;
        let remote = support::ops(&gateway, OPERATOR, &json).await;
        assert_eq!(local.code, remote.code, "{args:?}: {local:?} {remote:?}");
        assert_eq!(document(&local), document(&remote), "{args:?}");
        if let Some(doc) = document(&local) {
            assert_eq!(
                format!(
                    "{} {}",
                    doc["status"],
                    doc["error"]["code"].as_str().unwrap()
                ),
                *label
            );
        }
    }
    // A denial's answer is the refusal every later delivery gets: a problem, and success.
    let deny = ["deny", &denied, "--reason", "a duplicate", "--json"];
    let local = ops(&store, &deny).await;
    let remote = support::ops(&gateway, OPERATOR, &deny).await;
    expect_code(&local, 0);
    expect_code(&remote, 0);
    assert_eq!(document(&local), document(&remote));
    assert_eq!(local.json()["status"], 403, "{local:?}");
    for app in &writers {
        let replayed = deliver(app, "run_3", "review").await;
        assert_eq!(
            replayed.error.as_ref().map(|e| e.code),
            Some(ErrorCode::ApprovalDenied),
            "{replayed:?}"
        );
    }
    assert_eq!(effects(), 4, "no refusal and no denial sent anything");
}
