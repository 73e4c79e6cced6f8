//! PostgreSQL restarts while executors are busy on it. Runs only with
//! `IDEMGATE_PG_RESTART_TESTS=1`, because it restarts the server every other test on the
//! machine is using (`check` runs it in a step of its own, after the other tests); it needs a
//! user allowed to call `pg_ctlcluster` (root on the development machines and in CI).
//! `IDEMGATE_PG_CLUSTER` names the cluster as `VERSION NAME` (default `15 main`).
//!
//! What it proves, counting effects on the fake downstream's side:
//!
//! - every answer during the outage is honest — `rejected` with a retryable code, `in_flight`
//!   or `unknown` — and every `applied` answer, before, during or after it, is the one effect
//!   the downstream holds for that key, with the same reference;
//! - the same `PgStore` (never recreated) serves deliveries again after the restart;
//! - after every key is delivered again and a recovery pass runs with the clock past the
//!   lease, no record is pending, every `applied` record has exactly one effect and every
//!   `unknown` one at most one.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{ServerBack, pg_ctl};
use idemgate_conformance::downstream::FakeDownstream;
use idemgate_conformance::harness::{ENVIRONMENT, Spec, key, op, ticket};
use idemgate_core::Contract;
use idemgate_core::clock::ManualClock;
use idemgate_core::effect::{AllowAll, Downstream};
use idemgate_core::outcome::{Outcome, Status};
use idemgate_core::record::RecordStatus;
use idemgate_core::store::{Filter, Store};
use idemgate_engine::{Executor, Recoverer, Settings, Tools};
use idemgate_store_postgres::{Options, PgStore};

/// Concurrent callers sharing one executor and one pool.
const CALLERS: usize = 32;
/// Any single delivery must come back within this, outage or not.
const ANSWER_LIMIT: Duration = Duration::from_secs(30);

fn say(line: &str) {
    // Straight to the stderr handle: the harness would hide an `eprintln!`.
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// When a delivery started, relative to the restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Before = 0,
    Restarting = 1,
    After = 2,
    Redelivery = 3,
    Final = 4,
}

impl Phase {
    fn of(n: u8) -> Phase {
        match n {
            0 => Phase::Before,
            1 => Phase::Restarting,
            2 => Phase::After,
            3 => Phase::Redelivery,
            _ => Phase::Final,
        }
    }
}

struct OneTool(Arc<Contract>, FakeDownstream);

impl Tools for OneTool {
    fn resolve(&self, tool: &str) -> Option<(Arc<Contract>, Arc<dyn Downstream>)> {
        (tool == self.0.name).then(|| (self.0.clone(), Arc::new(self.1.clone()) as Arc<_>))
    }
}

fn label(o: &Outcome) -> String {
    match &o.error {
        Some(e) => format!("{}:{}", o.status.as_str(), e.code.as_str()),
        None => o.status.as_str().to_string(),
    }
}

async fn deliver(
    executor: &Executor,
    contract: &Contract,
    downstream: &FakeDownstream,
    k: u64,
) -> Outcome {
    tokio::time::timeout(
        ANSWER_LIMIT,
        executor.execute(
            contract,
            &op(&format!("k{k}")),
            &ticket("Refund"),
            downstream,
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("delivery of k{k} did not come back within {ANSWER_LIMIT:?}"))
}

async fn wait_until_usable(store: &PgStore) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let probe = key("probe");
    loop {
        match store.get(&probe).await {
            Ok(_) => return,
            Err(e) if Instant::now() < deadline => {
                say(&format!("waiting for the database: {e}"));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("the store did not recover after the restart: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_stay_honest_and_every_key_converges_when_the_database_restarts_under_load() {
    if std::env::var("IDEMGATE_PG_RESTART_TESTS").as_deref() != Ok("1") {
        say(
            "SKIPPED (PostgreSQL restart): IDEMGATE_PG_RESTART_TESTS is not 1 — this test did not run",
        );
        return;
    }
    let db = database!();
    let _back = ServerBack;
    let store = db
        .store_with(Options {
            pool_size: 16,
            statement_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            ..Options::default()
        })
        .await;
    let started = Instant::now();
    // The downstream neither deduplicates nor would hide a second effect; it offers a receipt
    // lookup, so the contract uses the dispatch marker.
    let spec = Spec::key_based().dedup(false);
    let contract = spec.contract();
    let downstream = FakeDownstream::new()
        .deduplicating(false)
        .with_receipt_lookup(true);
    // Time stands still during the load (no lease expires under a live caller); the recovery
    // pass moves it past the lease.
    let clock = Arc::new(ManualClock::new(1_800_000_000_000));
    let executor = Executor::new(
        Arc::new(store.clone()),
        clock.clone(),
        Arc::new(AllowAll),
        Settings {
            worker: "loader".into(),
            ..Settings::default()
        },
    );

    let phase = Arc::new(AtomicU8::new(Phase::Before as u8));
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let answers = Arc::new(Mutex::new(Vec::<(u64, Phase, Outcome)>::new()));
    let mut callers = Vec::new();
    for _ in 0..CALLERS {
        let (executor, contract, downstream) =
            (executor.clone(), contract.clone(), downstream.clone());
        let (phase, stop, next, answers) =
            (phase.clone(), stop.clone(), next.clone(), answers.clone());
        callers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                // Fresh keys all the time, so claims and completions (not only replays) meet
                // the outage: each key is delivered three times by neighbouring callers, and
                // every fifth delivery repeats an older key.
                let n = next.fetch_add(1, Ordering::Relaxed);
                let k = if n % 5 == 4 {
                    n.wrapping_mul(7919) % (n / 3 + 1)
                } else {
                    n / 3
                };
                let at = Phase::of(phase.load(Ordering::Relaxed));
                let o = deliver(&executor, &contract, &downstream, k).await;
                let backoff = o.status != Status::Applied && o.status != Status::Replayed;
                answers.lock().unwrap().push((k, at, o));
                if backoff {
                    // A polite client: back off a little before the next call.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }

    tokio::time::sleep(Duration::from_millis(1500)).await;
    phase.store(Phase::Restarting as u8, Ordering::Relaxed);
    say("restart under load: restarting PostgreSQL");
    let restarted = tokio::task::spawn_blocking(|| pg_ctl("restart"))
        .await
        .unwrap();
    assert!(restarted, "pg_ctlcluster restart failed");
    wait_until_usable(&store).await;
    phase.store(Phase::After as u8, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    stop.store(true, Ordering::Relaxed);
    for c in callers {
        c.await.unwrap();
    }

    // Every key again, then a recovery pass with the clock past the lease, then every key a
    // last time: now each must be settled.
    let keys = next.load(Ordering::Relaxed) / 3 + 1;
    for k in 0..keys {
        let o = deliver(&executor, &contract, &downstream, k).await;
        answers.lock().unwrap().push((k, Phase::Redelivery, o));
    }
    clock.advance(spec.lease_seconds as i64 * 1000 + 1);
    let recoverer = Recoverer::new(
        executor.clone(),
        Arc::new(OneTool(contract.clone(), downstream.clone())),
        ENVIRONMENT,
    )
    .with_batch(1000);
    let mut recovered = BTreeMap::<&str, usize>::new();
    for pass in 0.. {
        assert!(pass < 20, "recovery did not settle after 20 passes");
        let report = recoverer.run_once().await.expect("recovery pass");
        for (status, n) in report.outcomes {
            *recovered.entry(status).or_default() += n;
        }
        if report.examined == 0 {
            break;
        }
    }
    for k in 0..keys {
        let o = deliver(&executor, &contract, &downstream, k).await;
        answers.lock().unwrap().push((k, Phase::Final, o));
    }

    // Answers: only honest labels, and every `applied` (or `replayed`) names the one effect
    // the downstream holds for its key.
    let answers = std::mem::take(&mut *answers.lock().unwrap());
    let mut by_phase = BTreeMap::<(Phase, String), usize>::new();
    let mut applied_answers = HashMap::<u64, usize>::new();
    for (k, at, o) in answers.iter() {
        *by_phase.entry((*at, label(o))).or_default() += 1;
        let key = key(&format!("k{k}"));
        match o.status {
            Status::Applied | Status::Replayed => {
                assert_eq!(
                    downstream.effects_for(&key),
                    1,
                    "{k} answered {o:?} ({at:?}) but the downstream has {} effects",
                    downstream.effects_for(&key)
                );
                let receipt = downstream.receipt_for(&key).unwrap();
                assert_eq!(
                    o.effect_reference.as_deref(),
                    Some(receipt.reference.as_str()),
                    "{k} answered {o:?} ({at:?})"
                );
                if o.status == Status::Applied {
                    *applied_answers.entry(*k).or_default() += 1;
                }
            }
            Status::InFlight | Status::Unknown => {}
            Status::Rejected => {
                let code = o.error.as_ref().map(|e| e.code);
                assert!(
                    code.is_some_and(|c| c.retryable()),
                    "{k} answered a rejection that is not retryable: {o:?} ({at:?})"
                );
            }
            #[allow(unreachable_patterns)]
            _ => panic!("{k} answered {o:?} ({at:?})"),
        }
        if *at == Phase::Final {
            assert!(
                matches!(o.status, Status::Replayed | Status::Unknown),
                "{k} is not settled after recovery: {o:?}"
            );
        }
    }
    for (k, n) in &applied_answers {
        assert_eq!(*n, 1, "k{k} was answered `applied` {n} times");
    }
    let outage: usize = by_phase
        .iter()
        .filter(|((at, l), _)| *at == Phase::Restarting && l != "applied" && l != "replayed")
        .map(|(_, n)| n)
        .sum();
    assert!(outage > 0, "the restart hit no delivery: {by_phase:?}");
    let after: usize = by_phase
        .iter()
        .filter(|((at, l), _)| *at == Phase::After && (l == "applied" || l == "replayed"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        after > 0,
        "no delivery succeeded after the restart: {by_phase:?}"
    );

    // Records: none pending; applied ⇒ exactly one effect, with the stored reference;
    // unknown ⇒ at most one.
    let mut statuses = BTreeMap::<&str, usize>::new();
    let mut after_key = None;
    let mut records = 0;
    loop {
        let page = store
            .list(Filter {
                after: after_key.clone(),
                limit: 1000,
                ..Filter::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after_key = Some(last.key.as_str().to_string());
        for r in &page {
            records += 1;
            let effects = downstream.effects_for(&r.key);
            *statuses.entry(r.status().as_str()).or_default() += 1;
            match r.status() {
                RecordStatus::Applied => {
                    assert_eq!(effects, 1, "{} applied with {effects} effects", r.key);
                }
                RecordStatus::Unknown => {
                    assert!(effects <= 1, "{} unknown with {effects} effects", r.key)
                }
                other => panic!("{} ended {other:?}: {r:?}", r.key),
            }
        }
    }
    assert_eq!(records, keys as usize, "every key has a record");
    for effect in downstream.effect_log() {
        assert_eq!(
            downstream.effects_for(&effect.key),
            1,
            "{} has a duplicate effect",
            effect.key
        );
    }
    say(&format!(
        "restart under load: {keys} keys, {} deliveries in {:.1} s; answers by phase {by_phase:?}; \
         recovery {recovered:?}; records {statuses:?}; {} effects",
        answers.len(),
        started.elapsed().as_secs_f64(),
        downstream.effects()
    ));
}
