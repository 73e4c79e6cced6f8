//! The library path, for comparison with the gateway (`scripts/bench-gateway`): the same
//! contract, the same SQLite store settings as `idemgate serve` (`SqliteStore::open` with the
//! default options: WAL, `synchronous = FULL`), the same in-process sandbox downstream, driven
//! through `Executor::execute` by C concurrent callers for a bounded time.
//!
//! ```text
//! cargo bench -p idemgate-server --bench library_path -- \
//!     --store /tmp/x/library.sqlite --contract contracts/tickets.create.yaml \
//!     --seconds 10 --warmup 2 --clients 1,64
//! ```
//!
//! Prints one line per mode and client count:
//!
//! ```text
//! library unique clients=1 calls=12345 seconds=10.00 rps=1234.5 p50_ms=0.801 p99_ms=1.502 rss_mb=21.0 hwm_mb=21.0
//! ```
//!
//! `unique` delivers a new operation key per call (claim, effect, commit); `replay` delivers
//! one applied key again and again (a read). Every answer is checked: a unique call must be
//! `applied`, a replay `replayed`; any other answer fails the run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idemgate_core::clock::SystemClock;
use idemgate_core::contract::Contract;
use idemgate_core::effect::{AllowAll, Downstream};
use idemgate_core::outcome::Status;
use idemgate_engine::{Caller, Executor, Operation, Settings};
use idemgate_sandbox::{Jobs, Sandbox};
use idemgate_store_sqlite::SqliteStore;
use serde_json::{Value, json};

/// The allocator the `idemgate` binary uses (`crates/cli/src/main.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    store: String,
    contract: String,
    seconds: f64,
    warmup: f64,
    clients: Vec<usize>,
    modes: Vec<String>,
}

fn args() -> Args {
    let mut a = Args {
        store: String::new(),
        contract: "contracts/tickets.create.yaml".into(),
        seconds: 10.0,
        warmup: 2.0,
        clients: vec![1, 64],
        modes: vec!["unique".into(), "replay".into()],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--store" => a.store = value(),
            "--contract" => a.contract = value(),
            "--seconds" => a.seconds = value().parse().expect("--seconds N"),
            "--warmup" => a.warmup = value().parse().expect("--warmup N"),
            "--clients" => {
                a.clients = value()
                    .split(',')
                    .map(|c| c.trim().parse().expect("--clients 1,64"))
                    .collect()
            }
            "--modes" => a.modes = value().split(',').map(str::to_string).collect(),
            // `cargo bench` passes `--bench` to every bench binary.
            _ => {}
        }
    }
    assert!(!a.store.is_empty(), "--store PATH is required");
    a
}

/// What every call shares.
struct Bench {
    executor: Executor,
    contract: Contract,
    downstream: Arc<dyn Downstream>,
    arguments: Value,
}

impl Bench {
    fn operation(workflow: String) -> Operation {
        Operation {
            caller: Caller {
                tenant: "bench".into(),
                actor: "bench-agent".into(),
                role: "agent".into(),
            },
            environment: "bench".into(),
            workflow_id: Some(workflow),
            step_id: Some("s".into()),
        }
    }

    async fn call(&self, workflow: String) -> Status {
        let operation = Bench::operation(workflow);
        self.executor
            .execute(
                &self.contract,
                &operation,
                &self.arguments,
                self.downstream.as_ref(),
            )
            .await
            .status
    }
}

/// Runs `clients` callers for `seconds`; returns every call's latency in nanoseconds and the
/// elapsed time. `tag` keeps unique keys apart across points.
async fn point(
    bench: &Arc<Bench>,
    mode: &str,
    clients: usize,
    seconds: f64,
    tag: &str,
) -> (Vec<u64>, Duration) {
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::with_capacity(clients);
    for task in 0..clients {
        let bench = bench.clone();
        let unique = mode == "unique";
        let tag = tag.to_string();
        let mode = mode.to_string();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(1 << 14);
            let mut i: u64 = 0;
            while Instant::now() < deadline {
                let (workflow, expect) = if unique {
                    (format!("lib-{tag}-{task}-{i}"), Status::Applied)
                } else {
                    ("lib-replay".to_string(), Status::Replayed)
                };
                let t = Instant::now();
                let status = bench.call(workflow).await;
                latencies.push(t.elapsed().as_nanos() as u64);
                assert_eq!(status, expect, "{mode} call {i} of caller {task}");
                i += 1;
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("a caller panicked"));
    }
    (all, start.elapsed())
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1e6
}

/// A `/proc/self/status` field (`VmRSS`, `VmHWM`) in MB, for comparing with the gateway's.
fn memory_mb(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                let rest = line.strip_prefix(field)?.strip_prefix(':')?;
                rest.split_whitespace().next()?.parse::<f64>().ok()
            })
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn main() {
    let args = args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let text = std::fs::read_to_string(&args.contract).expect("the contract file");
        let contract = Contract::load(&text, &args.contract).expect("a valid contract");
        let store = SqliteStore::open(&args.store, Default::default()).expect("the store");
        let downstream: Arc<dyn Downstream> = Arc::new(Sandbox::for_contract(&contract, Jobs::FirstPoll));
        let executor = Executor::new(
            Arc::new(store),
            Arc::new(SystemClock),
            Arc::new(AllowAll),
            Settings::default(),
        );
        let bench = Arc::new(Bench {
            executor,
            contract,
            downstream,
            arguments: json!({"subject": "bench", "body": "A ticket from the benchmark."}),
        });
        // The replayed key is applied first (or already was, by an earlier invocation).
        let first = bench.call("lib-replay".into()).await;
        assert!(
            matches!(first, Status::Applied | Status::Replayed),
            "the replayed key: {first:?}"
        );
        // Unique keys never collide with an earlier invocation's on the same file.
        let run = std::process::id();
        for mode in &args.modes {
            for &clients in &args.clients {
                if args.warmup > 0.0 {
                    point(&bench, mode, clients, args.warmup, &format!("{run}w{clients}")).await;
                }
                let (mut latencies, elapsed) =
                    point(&bench, mode, clients, args.seconds, &format!("{run}m{clients}")).await;
                latencies.sort_unstable();
                let secs = elapsed.as_secs_f64();
                println!(
                    "library {mode} clients={clients} calls={} seconds={secs:.2} rps={:.1} p50_ms={:.3} p99_ms={:.3} rss_mb={:.1} hwm_mb={:.1}",
                    latencies.len(),
                    latencies.len() as f64 / secs,
                    percentile(&latencies, 50.0),
                    percentile(&latencies, 99.0),
                    memory_mb("VmRSS"),
                    memory_mb("VmHWM"),
                );
            }
        }
    });
}
