//! Where the CPU goes per operation: the executor with a no-op effect on new keys, `CALLERS`
//! tasks × `PER_CALLER` operations each, then the CPU time of each thread of this process
//! (the SQLite writer thread, tokio's workers) divided by the operations, and the commands per
//! group commit. A probe, not a benchmark: it explains the ratios `benches/executor.rs`
//! measures (see BENCHMARKS.md).
//!
//! ```text
//! cargo run --release -p idemgate-store-sqlite --example writer_probe -- 64 300
//! valgrind --tool=callgrind --separate-threads=yes \
//!     target/release/examples/writer_probe 64 60          # instructions per thread
//! ```
//!
//! Linux only (it reads `/proc/self/task/*/stat`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use idemgate_conformance::harness::{Noop, Spec, op, ticket};
use idemgate_core::clock::SystemClock;
use idemgate_core::effect::AllowAll;
use idemgate_core::outcome::Status;
use idemgate_engine::{Executor, Settings};
use idemgate_store_sqlite::{Options, SqliteStore};

/// User and system CPU seconds per thread name, summed over threads of one name.
fn cpu_by_thread() -> BTreeMap<String, (f64, f64)> {
    // Clock ticks per second: 100 on every Linux this runs on (`getconf CLK_TCK`).
    const TICKS: f64 = 100.0;
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ...`: the name may hold spaces, so split around the parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let (Some(user), Some(system)) = (fields.get(11), fields.get(12)) else {
            continue;
        };
        let entry = out.entry(stat[open + 1..close].to_string()).or_default();
        entry.0 += user.parse::<f64>().unwrap_or(0.0) / TICKS;
        entry.1 += system.parse::<f64>().unwrap_or(0.0) / TICKS;
    }
    out
}

fn main() {
    let mut args = std::env::args().skip(1);
    let callers: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let per_caller: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(300);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let store = Arc::new(
        SqliteStore::open(dir.path().join("probe.sqlite"), Options::default()).expect("a store"),
    );
    let executor = Executor::new(
        store.clone(),
        Arc::new(SystemClock),
        Arc::new(AllowAll),
        Settings::default(),
    );
    let contract = Spec::key_based().contract();
    let counter = Arc::new(AtomicU64::new(0));

    let (cpu_before, stats_before, start) = (cpu_by_thread(), store.stats(), Instant::now());
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..callers {
            let (executor, contract, counter) =
                (executor.clone(), contract.clone(), counter.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..per_caller {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    let o = executor
                        .execute(&contract, &op(&format!("u{n}")), &ticket("Refund"), &Noop)
                        .await;
                    assert_eq!(o.status, Status::Applied, "{o:?}");
                }
            }));
        }
        for task in tasks {
            task.await.expect("a caller");
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    let (cpu_after, stats_after) = (cpu_by_thread(), store.stats());

    let operations = (callers * per_caller) as f64;
    let commits = (stats_after.commits - stats_before.commits).max(1);
    println!(
        "{callers} callers × {per_caller}: {:.0} operations/s, {:.1} commands per commit",
        operations / elapsed,
        (stats_after.commands - stats_before.commands) as f64 / commits as f64
    );
    for (thread, (user, system)) in cpu_after {
        let (user_before, system_before) = cpu_before.get(&thread).copied().unwrap_or_default();
        let (user, system) = (user - user_before, system - system_before);
        if user + system > 0.0 {
            println!(
                "  {thread:<24} user {:6.1} µs/op  system {:6.1} µs/op",
                user * 1e6 / operations,
                system * 1e6 / operations
            );
        }
    }
}
