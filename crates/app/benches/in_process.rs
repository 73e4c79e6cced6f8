//! The Rust library path beside the Python package (`clients/python/bench/side_by_side.py`):
//! the same application the extension builds (`open_gateway_store` on a SQLite file, WAL and
//! `synchronous = FULL`; `Assembly` with one served tool), the same contract as the Python
//! benchmark's guarded no-op (`bench.noop`, fingerprint `n`), a no-op downstream, and callers
//! shaped as Python's: T operating-system threads, each blocked on the shared runtime for one
//! `App::invoke_awaited` at a time (the delivery on the waiting thread, as a synchronous
//! Python call's is). The difference from the Python figures is the binding.
//!
//! ```text
//! cargo bench -p idemgate-app --bench in_process -- --store /tmp/x/rust.sqlite \
//!     --calls 4000 --replays 20000 --seconds 10 --threads 1,8
//! ```
//!
//! `--store` also takes a URL: `postgres://…` runs the same calls on PostgreSQL.
//!
//! `--hand-off` performs each effect on a thread of its own, answered to the engine through a
//! channel: the one hand-off between threads that a Python function cannot avoid (it runs on a
//! thread holding the interpreter lock, never inside the engine's poll), with no Python in it.
//! What that hand-off alone costs this path is the floor under the binding's ratio
//! (docs/benchmarks/history.md, "One hand-off's price").
//!
//! Prints one CSV line per phase (`phase,ops,secs,ops_per_s`): `unique/T` delivers a new
//! operation key per call (claim, effect, record), `replay/T` delivers the keys it made again,
//! round and round to `--replays` calls (answered from the record). Every answer is checked (applied, then replayed) and every
//! unique key's effect is counted: a wrong answer or a second effect fails the run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use idemgate_app::{Assembly, Tool, ToolSet};
use idemgate_core::contract::Contract;
use idemgate_core::effect::{Downstream, EffectOutcome, EffectRequest, JobStatus, Lookup};
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::Status;
use idemgate_core::record::Receipt;
use idemgate_core::store::BoxFuture;
use idemgate_engine::Caller;
use serde_json::json;

/// The contract `@local.tool("bench.noop", fingerprint=["n"])` builds for `def noop(n: int)`.
const CONTRACT: &str = r#"{
    "name": "bench.noop", "version": "1", "effect_class": "key_based",
    "operation_key": {"supplied_by": "application",
                      "scope": ["tenant", "environment", "workflow_id", "step_id"],
                      "reused_for_retry": true},
    "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                     "required": ["n"], "additionalProperties": false},
    "request_fingerprint": {"fields": ["n"], "defaults": {}},
    "downstream": {"deduplicates_by_key": false, "receipt_lookup": false, "async_jobs": false},
    "security": {"recheck_authorization": true},
    "retention": {"record_ttl": "7d", "tombstone_ttl": "30d", "max_retry_window": "1d"}
}"#;

/// A no-op effect that counts itself; with `performer`, performed on that thread.
struct Noop {
    effects: AtomicU64,
    performer: Option<mpsc::Sender<Performed>>,
}

/// An effect's answer, sent back from the performer's thread.
type Performed = tokio::sync::oneshot::Sender<()>;

impl Noop {
    fn new(hand_off: bool) -> Self {
        let performer = hand_off.then(|| {
            let (to, from) = mpsc::channel::<Performed>();
            // Like a runner: one wake-up for whatever is queued when it wakes.
            std::thread::spawn(move || {
                while let Ok(first) = from.recv() {
                    let _ = first.send(());
                    for next in from.try_iter() {
                        let _ = next.send(());
                    }
                }
            });
            to
        });
        Noop {
            effects: AtomicU64::new(0),
            performer,
        }
    }
}

impl Downstream for Noop {
    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        self.effects.fetch_add(1, Ordering::Relaxed);
        let receipt = Receipt {
            reference: request.key.step_id().to_string(),
            result: json!({"n": request.arguments["n"]}),
        };
        let Some(performer) = &self.performer else {
            return Box::pin(std::future::ready(EffectOutcome::Committed(receipt)));
        };
        let (answer_to, answer) = tokio::sync::oneshot::channel();
        performer.send(answer_to).expect("the performer's thread");
        Box::pin(async move {
            answer.await.expect("the performer's answer");
            EffectOutcome::Committed(receipt)
        })
    }
    fn lookup_receipt<'a>(&'a self, _key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        Box::pin(std::future::ready(Lookup::NotFound))
    }
    fn poll_job<'a>(&'a self, _key: &'a OperationKey, _job: &'a str) -> BoxFuture<'a, JobStatus> {
        Box::pin(std::future::ready(JobStatus::Running))
    }
}

struct Args {
    store: String,
    calls: usize,
    replays: usize,
    seconds: f64,
    threads: Vec<usize>,
    hand_off: bool,
}

fn args() -> Args {
    let mut a = Args {
        store: String::new(),
        calls: 4000,
        replays: 20000,
        seconds: 10.0,
        threads: vec![1, 8],
        hand_off: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--store" => a.store = value(),
            "--calls" => a.calls = value().parse().expect("--calls N"),
            "--replays" => a.replays = value().parse().expect("--replays N"),
            "--seconds" => a.seconds = value().parse().expect("--seconds N"),
            "--threads" => {
                a.threads = value()
                    .split(',')
                    .map(|t| t.trim().parse().expect("--threads 1,8"))
                    .collect()
            }
            "--hand-off" => a.hand_off = true,
            // `cargo bench` passes `--bench` to every bench binary.
            _ => {}
        }
    }
    assert!(!a.store.is_empty(), "--store PATH (or URL) is required");
    a
}

/// One phase: `threads` callers share `steps` of `workflow` (thread t takes every T-th), each
/// stopping at the deadline. Answers the steps called and how long they took; every answer
/// must be `expect`.
fn phase(
    runtime: &tokio::runtime::Runtime,
    app: &idemgate_app::App,
    workflow: &str,
    steps: &[usize],
    threads: usize,
    seconds: f64,
    expect: Status,
) -> (Vec<usize>, f64) {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let began = Instant::now();
    let done: Vec<usize> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut made = Vec::new();
                    for &i in steps.iter().skip(t).step_by(threads) {
                        if Instant::now() > deadline {
                            break;
                        }
                        let caller = Caller {
                            tenant: "default".into(),
                            actor: "local".into(),
                            role: "agent".into(),
                        };
                        let outcome = runtime.handle().block_on(app.invoke_awaited(
                            caller,
                            "bench.noop",
                            Some(workflow.to_string()),
                            Some(i.to_string()),
                            json!({"n": i}),
                            None,
                        ));
                        assert_eq!(outcome.status, expect, "{outcome:?}");
                        made.push(i);
                    }
                    made
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    (done, began.elapsed().as_secs_f64())
}

fn main() {
    let a = args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // A path is a SQLite file; a URL (`postgres://…`) is opened as it is.
    let url = if a.store.contains("://") {
        a.store.clone()
    } else {
        format!("sqlite://{}", a.store)
    };
    let store = runtime
        .block_on(idemgate_app::open_gateway_store(&url, None))
        .expect("open the store");
    let app = Assembly::new(store, ToolSet::default(), "development").build();
    let noop = Arc::new(Noop::new(a.hand_off));
    app.tools().serve(Tool {
        contract: Arc::new(Contract::load(CONTRACT, "bench.noop").expect("the contract")),
        downstream: noop.clone(),
        authorizer: None,
    });
    let run = std::process::id();
    println!("phase,ops,secs,ops_per_s");
    let mut unique_calls = 0;
    for &threads in &a.threads {
        let workflow = format!("rust-{run}-t{threads}");
        let steps: Vec<usize> = (0..a.calls).collect();
        let report = |name: &str, done: &[usize], secs: f64| {
            let rate = done.len() as f64 / secs;
            println!("{name}/{threads},{},{secs:.3},{rate:.0}", done.len());
        };
        let (made, secs) = phase(
            &runtime,
            &app,
            &workflow,
            &steps,
            threads,
            a.seconds,
            Status::Applied,
        );
        report("unique", &made, secs);
        unique_calls += made.len();
        // The replays deliver the steps that were made (the deadline may have cut the phase),
        // round and round, to at least `replays` calls.
        let replays: Vec<usize> = made
            .iter()
            .copied()
            .cycle()
            .take(a.replays.max(made.len()))
            .collect();
        let (again, secs) = phase(
            &runtime,
            &app,
            &workflow,
            &replays,
            threads,
            a.seconds,
            Status::Replayed,
        );
        report("replay", &again, secs);
    }
    let effects = noop.effects.load(Ordering::Relaxed) as usize;
    println!("# effects check: unique_calls={unique_calls} effects={effects}");
    assert_eq!(effects, unique_calls, "one effect per unique call");
}
