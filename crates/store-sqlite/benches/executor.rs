//! The executor on SQLite against the raw store doing the same statements, side by side in one
//! run. `scripts/bench-ratios` turns criterion's estimates into the ratios in BENCHMARKS.md.
//!
//! - `unique/{bare,executor}/{1,64}`: a new operation key per call; the effect is a no-op.
//!   The bare loop issues the same claim (insert, with 3 trace entries, not yet expiring) and
//!   finalise (conditional update appending 3 entries and fixing the settled record's expiry,
//!   the row read back) statements, one transaction each, on a connection with the same file
//!   settings (WAL, synchronous=FULL). At 64 callers the bare loop shares one connection
//!   behind a mutex (its best case: separate connections would also spin on SQLite's busy
//!   handler).
//! - `replay/{bare,executor,executor-uncached}/{1,64}`: an applied key delivered again, against
//!   a bare primary-key read of the same row with the same statement, every column decoded.
//!   `executor` answers from the settled records it keeps in memory; `executor-uncached` keeps
//!   none and reads the record from the store on every replay.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use idemgate_conformance::harness::{Noop, Spec, op, ticket};
use idemgate_core::clock::SystemClock;
use idemgate_core::effect::AllowAll;
use idemgate_core::outcome::Status;
use idemgate_core::record::EventKind;
use idemgate_engine::{Executor, Settings};
use idemgate_store_sqlite::{Options, SqliteStore};
use rusqlite::{Connection, params};

const CALLERS: [usize; 2] = [1, 64];

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn bare_connection(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.pragma_update(None, "synchronous", "FULL").unwrap();
    // As the store's writer: statement journals in memory, not in temporary files.
    conn.pragma_update(None, "temp_store", "MEMORY").unwrap();
    conn
}

const INSERT: &str = "INSERT INTO operations (tenant, key, tool, tool_version, fingerprint, \
    canonicalization, status, fence, lease_owner, lease_expires_at, dispatch, job_id, \
    effect_reference, result, error_code, error_message, actor, request, approved_by, created_at, \
    updated_at, expires_at, purge_at, intent_window, trace) VALUES (?1, ?2, 'tickets.create', \
    '2026-08-18', ?3, 1, 'pending', 1, 'bare', ?4, 'not_sent', NULL, NULL, NULL, NULL, NULL, \
    'agent-1', ?5, NULL, ?4, ?4, 9223372036854775807, 9223372036854775807, 0, ?6) \
    ON CONFLICT (tenant, key) DO NOTHING";
const FINALISE: &str = "UPDATE operations SET status = 'applied', lease_owner = NULL, \
    lease_expires_at = NULL, dispatch = NULL, job_id = NULL, effect_reference = ?3, result = ?4, \
    error_code = NULL, error_message = NULL, fence = 1, updated_at = ?5, request = NULL, \
    expires_at = ?5 + 86400000, purge_at = ?5 + 172800000, trace = trace || ?6 \
    WHERE tenant = ?1 AND key = ?2 AND fence = 1 AND status = 'pending' AND created_at = ?5";
const READ: &str = "SELECT tenant, key, tool, tool_version, fingerprint, canonicalization, \
    status, fence, lease_owner, lease_expires_at, dispatch, job_id, effect_reference, result, \
    error_code, error_message, actor, request, approved_by, created_at, updated_at, expires_at, \
    purge_at, intent_window FROM operations WHERE tenant = ?1 AND key = ?2";

/// Three trace entries in the store's form (`[kind, at, attempt, worker, detail]`, one per
/// line), as a claim and a finalise each append.
fn entries(kinds: [EventKind; 3], at: i64) -> String {
    kinds
        .into_iter()
        .map(|kind| serde_json::to_string(&(kind, at, 1, "bare", None::<&str>)).unwrap() + "\n")
        .collect()
}

/// One operation as the raw store: the claim transaction, then the finalise transaction.
fn bare_operation(conn: &mut Connection, n: u64) {
    let key = format!("acme:bench:bare:{n}");
    let fp = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let request = ticket("Refund").to_string();
    let at = n as i64;
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    let claimed = entries(
        [
            EventKind::Proposed,
            EventKind::Validated,
            EventKind::Claimed,
        ],
        at,
    );
    tx.prepare_cached(INSERT)
        .unwrap()
        .execute(params!["acme", key, fp, at, request, claimed])
        .unwrap();
    tx.commit().unwrap();
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    let settled = entries(
        [
            EventKind::Sent,
            EventKind::Committed,
            EventKind::Acknowledged,
        ],
        at,
    );
    let changed = tx
        .prepare_cached(FINALISE)
        .unwrap()
        .execute(params![
            "acme",
            key,
            n.to_string(),
            r#"{"ok":true}"#,
            at,
            settled
        ])
        .unwrap();
    assert_eq!(changed, 1);
    // The store reads the row back as written, in the same transaction.
    bare_read(&tx, &key);
    tx.commit().unwrap();
}

fn bare_read(conn: &Connection, key: &str) {
    // The same statement the store's `get` runs, every column decoded: the raw store's cost of
    // reading one record.
    let row = conn
        .prepare_cached(READ)
        .unwrap()
        .query_row(params!["acme", key], |r| {
            let mut columns = Vec::with_capacity(24);
            for i in 0..24 {
                columns.push(r.get::<_, rusqlite::types::Value>(i)?);
            }
            Ok(columns)
        })
        .unwrap();
    std::hint::black_box(row);
}

fn unique(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let store = Arc::new(
        SqliteStore::open(dir.path().join("executor.sqlite"), Options::default()).unwrap(),
    );
    let executor = Executor::new(
        store.clone(),
        Arc::new(SystemClock),
        Arc::new(AllowAll),
        Settings::default(),
    );
    let contract = Spec::key_based().contract();
    let bare_path = dir.path().join("bare.sqlite");
    drop(SqliteStore::open(&bare_path, Options::default()).unwrap()); // same schema
    let bare = Arc::new(Mutex::new(bare_connection(&bare_path)));
    let counter = Arc::new(AtomicU64::new(0));

    let mut group = c.benchmark_group("unique");
    group.throughput(Throughput::Elements(1));
    for callers in CALLERS {
        group.bench_function(format!("bare/{callers}"), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for t in 0..callers as u64 {
                        let (bare, counter) = (&bare, &counter);
                        let share = iters / callers as u64 + u64::from(t < iters % callers as u64);
                        s.spawn(move || {
                            for _ in 0..share {
                                let n = counter.fetch_add(1, Ordering::Relaxed);
                                bare_operation(&mut bare.lock().unwrap(), n);
                            }
                        });
                    }
                });
                start.elapsed()
            })
        });
        group.bench_function(format!("executor/{callers}"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    let mut tasks = Vec::new();
                    for t in 0..callers as u64 {
                        let share = iters / callers as u64 + u64::from(t < iters % callers as u64);
                        let (executor, contract, counter) =
                            (executor.clone(), contract.clone(), counter.clone());
                        tasks.push(tokio::spawn(async move {
                            for _ in 0..share {
                                let n = counter.fetch_add(1, Ordering::Relaxed);
                                let o = executor
                                    .execute(
                                        &contract,
                                        &op(&format!("u{n}")),
                                        &ticket("Refund"),
                                        &Noop,
                                    )
                                    .await;
                                assert_eq!(o.status, Status::Applied, "{o:?}");
                            }
                        }));
                    }
                    for t in tasks {
                        t.await.unwrap();
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
    let stats = store.stats();
    eprintln!(
        "group commit: {} commands in {} commits",
        stats.commands, stats.commits
    );
}

fn replay(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let store =
        Arc::new(SqliteStore::open(dir.path().join("replay.sqlite"), Options::default()).unwrap());
    let executor = Executor::new(
        store.clone(),
        Arc::new(SystemClock),
        Arc::new(AllowAll),
        Settings::default(),
    );
    // The same executor without the settled records it keeps in memory: every replay reads the
    // record from the store, as the first replay after a restart (or on another process) does.
    let uncached = Executor::new(
        store.clone(),
        Arc::new(SystemClock),
        Arc::new(AllowAll),
        Settings {
            settled_records: 0,
            ..Settings::default()
        },
    );
    let contract = Spec::key_based().contract();
    let first = rt.block_on(executor.execute(&contract, &op("applied"), &ticket("Refund"), &Noop));
    assert_eq!(first.status, Status::Applied);
    let key = first.operation_key.unwrap().to_string();
    let readers: Vec<Arc<Mutex<Connection>>> = (0..4)
        .map(|_| {
            Arc::new(Mutex::new(bare_connection(
                &dir.path().join("replay.sqlite"),
            )))
        })
        .collect();
    let writes_before = store.stats().commands;

    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(1));
    for callers in CALLERS {
        group.bench_function(format!("bare/{callers}"), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    // At most as many threads as cores: the read is CPU-bound.
                    let threads = callers.min(2) as u64;
                    for t in 0..threads {
                        let (conn, key) = (readers[t as usize].clone(), &key);
                        let share = iters / threads + u64::from(t < iters % threads);
                        s.spawn(move || {
                            let conn = conn.lock().unwrap();
                            for _ in 0..share {
                                bare_read(&conn, key);
                            }
                        });
                    }
                });
                start.elapsed()
            })
        });
        for (side, executor) in [("executor", &executor), ("executor-uncached", &uncached)] {
            group.bench_function(format!("{side}/{callers}"), |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let start = Instant::now();
                        let mut tasks = Vec::new();
                        for t in 0..callers as u64 {
                            let share =
                                iters / callers as u64 + u64::from(t < iters % callers as u64);
                            let (executor, contract) = (executor.clone(), contract.clone());
                            tasks.push(tokio::spawn(async move {
                                for _ in 0..share {
                                    let o = executor
                                        .execute(
                                            &contract,
                                            &op("applied"),
                                            &ticket("Refund"),
                                            &Noop,
                                        )
                                        .await;
                                    assert_eq!(o.status, Status::Replayed);
                                }
                            }));
                        }
                        for t in tasks {
                            t.await.unwrap();
                        }
                        start.elapsed()
                    })
                })
            });
        }
    }
    group.finish();
    assert_eq!(
        store.stats().commands,
        writes_before,
        "a replay wrote to the store"
    );
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
}

criterion_group! { name = benches; config = config(); targets = unique, replay }
criterion_main!(benches);
