//! `idemgate conformance`: the fault matrix against a store, and the worker process that the
//! crash and multi-process tests start and kill.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use idemgate_conformance::faulty::FaultyStore;
use idemgate_conformance::harness::Spec;
use idemgate_conformance::ledger::LedgerDownstream;
use idemgate_core::clock::{Clock, SystemClock};
use idemgate_core::effect::AllowAll;
use idemgate_core::store::Store;
use idemgate_engine::{Caller, Executor, Operation, Recoverer, Settings, Tools};
use serde_json::json;

#[derive(Debug, Args)]
pub struct ConformanceArgs {
    #[command(subcommand)]
    pub command: Option<ConformanceCommand>,
    /// Run only scenarios whose name contains this text.
    #[arg(long)]
    pub only: Option<String>,
    /// Print the scenarios' names (those `--only` selects, with it) instead of running them.
    #[arg(long)]
    pub list: bool,
}

#[derive(Debug, Subcommand)]
pub enum ConformanceCommand {
    /// A worker process for crash and multi-process tests (not for people).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

/// Which receipt path the worker's contract declares.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ReceiptPath {
    /// The downstream deduplicates on the key and offers a receipt lookup.
    Dedup,
    /// A receipt lookup only (the dispatch marker is used).
    Lookup,
    /// Neither (the linter flags this; recovery ends in unknown).
    None,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PauseAt {
    Claim,
    Commit,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// sqlite://PATH or postgres://…
    #[arg(long)]
    pub store: String,
    /// The downstream's own effect ledger (a SQLite file).
    #[arg(long)]
    pub ledger: PathBuf,
    #[arg(long, value_enum, default_value = "lookup")]
    pub receipt: ReceiptPath,
    #[arg(long, default_value_t = 30)]
    pub lease_seconds: u64,
    /// Added to the wall clock: a restarted worker "arrives later" without sleeping.
    #[arg(long, default_value_t = 0)]
    pub clock_offset_ms: i64,
    #[arg(long, default_value = "worker")]
    pub name: String,
    /// Deliver one operation with this step id and print its outcome as JSON.
    #[arg(long)]
    pub step: Option<String>,
    /// Print `PAUSED <point>` and wait to be killed at this point.
    #[arg(long, value_enum)]
    pub pause_after: Option<PauseAt>,
    /// With `--pause-after`: continue when a line arrives on stdin instead of waiting to be
    /// killed, so a test can let a worker whose lease was taken over finish late.
    #[arg(long, requires = "pause_after")]
    pub resume_on_stdin: bool,
    /// Deliver steps `k0 .. k{keys-1}`, each `rounds` times, shuffled by `seed`.
    #[arg(long)]
    pub keys: Option<u32>,
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Concurrent deliveries in load mode.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Run one recovery pass and print its report.
    #[arg(long)]
    pub recover: bool,
}

struct OffsetClock(i64);

impl Clock for OffsetClock {
    fn now(&self) -> i64 {
        SystemClock.now() + self.0
    }
}

struct One(Arc<idemgate_core::Contract>, Arc<LedgerDownstream>);

impl Tools for One {
    fn resolve(
        &self,
        tool: &str,
    ) -> Option<(
        Arc<idemgate_core::Contract>,
        Arc<dyn idemgate_core::effect::Downstream>,
    )> {
        (tool == self.0.name).then(|| (self.0.clone(), self.1.clone() as Arc<_>))
    }
}

pub async fn run(args: ConformanceArgs) -> anyhow::Result<bool> {
    if let Some(ConformanceCommand::Worker(w)) = args.command {
        return worker(w).await.map(|()| true);
    }
    let scenarios = selected(args.only.as_deref())?;
    if args.list {
        for (name, _) in scenarios {
            println!("{name}");
        }
        return Ok(true);
    }
    matrix(scenarios).await
}

type Scenario = (
    &'static str,
    fn(Arc<dyn Store>) -> idemgate_core::store::BoxFuture<'static, ()>,
);

/// The scenarios `only` selects. A filter that selects none is an error, not an empty pass: a
/// misspelt name in a CI script would otherwise report success having checked nothing.
fn selected(only: Option<&str>) -> anyhow::Result<Vec<Scenario>> {
    let mut scenarios = idemgate_conformance::scenarios::all();
    if let Some(o) = only {
        scenarios.retain(|(name, _)| name.contains(o));
        if scenarios.is_empty() {
            anyhow::bail!(
                "no conformance scenario's name contains `{o}`; `idemgate conformance --list` prints their names"
            );
        }
    }
    Ok(scenarios)
}

/// Runs the scenarios against a fresh embedded store each and prints a table.
async fn matrix(scenarios: Vec<Scenario>) -> anyhow::Result<bool> {
    let mut failed = Vec::new();
    let mut ran = 0;
    // Scenario assertions panic; keep their messages for the summary instead of the default
    // hook's backtrace noise.
    std::panic::set_hook(Box::new(|_| {}));
    println!("idemgate conformance — the fault matrix on embedded SQLite\n");
    for (name, scenario) in scenarios {
        ran += 1;
        let dir = tempfile::tempdir()?;
        let store = idemgate_store_sqlite::SqliteStore::open(
            dir.path().join("conformance.sqlite"),
            Default::default(),
        )?;
        let started = Instant::now();
        let result = tokio::spawn(scenario(Arc::new(store))).await;
        let took = started.elapsed();
        match result {
            Ok(()) => println!("  pass  {name:<70} {:>6.1} ms", took.as_secs_f64() * 1000.0),
            Err(e) => {
                let why = e
                    .try_into_panic()
                    .ok()
                    .and_then(|p| {
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    })
                    .unwrap_or_else(|| "cancelled".into());
                println!("  FAIL  {name}\n        {why}");
                failed.push(name);
            }
        }
    }
    let _ = std::panic::take_hook();
    println!("\n{} passed, {} failed", ran - failed.len(), failed.len());
    Ok(failed.is_empty())
}

fn contract(receipt: ReceiptPath, lease_seconds: u64) -> Arc<idemgate_core::Contract> {
    let mut spec = match receipt {
        ReceiptPath::Dedup => Spec::key_based(),
        ReceiptPath::Lookup => Spec::key_based().dedup(false),
        ReceiptPath::None => Spec::key_based().dedup(false).lookup(false),
    };
    spec.lease_seconds = lease_seconds;
    spec.contract()
}

fn operation(step: &str) -> Operation {
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

fn announce(point: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "PAUSED {point}");
    let _ = out.flush();
}

/// Blocks the calling thread until a line (or the end) arrives on stdin.
fn wait_for_stdin_line() {
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

async fn worker(w: WorkerArgs) -> anyhow::Result<()> {
    let inner =
        idemgate_app::open_store(&w.store, idemgate_core::audit::Sealer::unsigned()).await?;
    let faulty = Arc::new(FaultyStore::new(inner));
    let (dedup, lookup) = match w.receipt {
        ReceiptPath::Dedup => (true, true),
        ReceiptPath::Lookup => (false, true),
        ReceiptPath::None => (false, false),
    };
    let mut ledger = LedgerDownstream::open(&w.ledger, dedup, lookup)
        .with_context(|| format!("opening the ledger {}", w.ledger.display()))?;
    if matches!(w.pause_after, Some(PauseAt::Commit)) {
        let resume = w.resume_on_stdin;
        ledger = ledger.with_after_commit(Arc::new(move |_| {
            announce("commit");
            if resume {
                // Hold this thread (and with it the lease renewal, which runs in the same
                // task) until the test lets the late finisher go on.
                wait_for_stdin_line();
                return;
            }
            // Hold this thread until the test kills the process: the effect is committed on
            // the downstream's side and the executor never hears of it.
            loop {
                std::thread::sleep(Duration::from_secs(60));
            }
        }));
    }
    let ledger = Arc::new(ledger);
    if matches!(w.pause_after, Some(PauseAt::Claim)) {
        faulty.after_claim().arm_nth(1);
        let gate = faulty.after_claim().clone();
        let resume = w.resume_on_stdin;
        tokio::spawn(async move {
            gate.reached_n_within(1, Duration::from_secs(3600)).await;
            announce("claim");
            if resume {
                let _ = tokio::task::spawn_blocking(wait_for_stdin_line).await;
                gate.release();
            }
        });
    }
    let store: Arc<dyn Store> = faulty;
    let executor = Executor::new(
        store,
        Arc::new(OffsetClock(w.clock_offset_ms)),
        Arc::new(AllowAll),
        Settings {
            worker: format!("{}-{}", w.name, std::process::id()),
            ..Settings::default()
        },
    );
    let contract = contract(w.receipt, w.lease_seconds);
    let args = json!({"queue_id": "support", "subject": "Refund", "body": "Order 42"});

    if let Some(step) = &w.step {
        let outcome = executor
            .execute(&contract, &operation(step), &args, ledger.as_ref())
            .await;
        println!("{}", serde_json::to_string(&outcome)?);
    }
    if let Some(keys) = w.keys {
        // A deterministic shuffle (splitmix64), so a failing run can be replayed from its seed.
        let mut order: Vec<u32> = (0..keys)
            .flat_map(|k| (0..w.rounds).map(move |_| k))
            .collect();
        let mut state = w.seed;
        for i in (1..order.len()).rev() {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            order.swap(i, (z % (i as u64 + 1)) as usize);
        }
        let queue = Arc::new(std::sync::Mutex::new(order));
        let mut tasks = Vec::new();
        let counts = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<
            String,
            u64,
        >::new()));
        for _ in 0..w.concurrency.max(1) {
            let (queue, executor, contract, ledger, args, counts) = (
                queue.clone(),
                executor.clone(),
                contract.clone(),
                ledger.clone(),
                args.clone(),
                counts.clone(),
            );
            tasks.push(tokio::spawn(async move {
                loop {
                    let Some(k) = queue.lock().unwrap().pop() else {
                        break;
                    };
                    let o = executor
                        .execute(
                            &contract,
                            &operation(&format!("k{k}")),
                            &args,
                            ledger.as_ref(),
                        )
                        .await;
                    let label = match &o.error {
                        Some(e) => format!("{}:{}", o.status.as_str(), e.code.as_str()),
                        None => o.status.as_str().to_string(),
                    };
                    *counts.lock().unwrap().entry(label).or_default() += 1;
                }
            }));
        }
        for t in tasks {
            t.await?;
        }
        println!("{}", serde_json::to_string(&*counts.lock().unwrap())?);
    }
    if w.recover {
        let recoverer = Recoverer::new(
            executor.clone(),
            Arc::new(One(contract.clone(), ledger.clone())),
            "test",
        )
        .with_batch(1000);
        let mut total = 0;
        // Bounded: a record whose lookup stays unavailable remains recoverable on every pass.
        for _ in 0..100 {
            let report = recoverer.run_once().await?;
            total += report.examined;
            if report.examined == 0 {
                break;
            }
        }
        println!("{}", json!({ "recovered": total }));
    }
    Ok(())
}
