//! idemgate's deterministic simulator: the real `Executor` and `Recoverer` of
//! `idemgate-engine`, in simulated processes that crash, over a real store, a simulated
//! downstream, clock, timer and authorization hook — one thread, one seed, every step chosen —
//! with every history checked against the invariants of DESIGN.md section 3. In the manner of
//! FoundationDB's and TigerBeetle's simulation testing.
//!
//! Reading order:
//!
//! - [`choices::Choices`] — the one source of every decision: a seeded RNG whose draws are
//!   recorded, or a recorded list replayed (0 once it runs out). 0 is always the tame option.
//! - [`runtime`] — a minimal executor of boxed futures tagged with a process id; every simulated
//!   call is a yield point where the scheduler may run another task or crash the process; a
//!   simulated clock and timer ([`runtime::SimClock`], [`runtime::SimTimer`]).
//! - [`store::SimStore`] — wraps any store (the reference [`MemStore`], SQLite): yield points
//!   before and after each write, injected `Unavailable` and commit-then-`Ambiguous` faults.
//! - [`downstream::SimDownstream`] — the system of record, per tool: deduplicating or not,
//!   lookups or not, jobs or not, with its own ledger of effects and a drawn fault per call.
//! - [`authorizer::SimAuthorizer`] — the authorization oracle: revocations toggled by the
//!   schedule, every decision logged.
//! - [`history::History`] — what happened, as the checker reads it; [`checker`] — the
//!   invariants, each a named [`checker::Violation`].
//! - [`workload`] — the contract variants (built from YAML) and the small key space;
//!   [`world`] — one schedule: main phase, quiescence, final checks.
//! - [`shrink`] — deletes and lowers draws of a failing schedule while it still fails;
//!   [`explore`] — many seeds on two threads, and the report of a failure.
//!
//! # Running
//!
//! `cargo test -p idemgate-sim sim` explores; the environment steers it:
//!
//! | variable | meaning |
//! |---|---|
//! | `IDEMGATE_SIM_SCHEDULES` | schedules to explore (default 1000; CI sets 100000) |
//! | `IDEMGATE_SIM_THREADS` | threads, each with its own seeds (default 2) |
//! | `IDEMGATE_SIM_BASE` | base of the seeds (default: from the clock, printed) |
//! | `IDEMGATE_SIM_STORE` | `mem`, `sqlite` or `mix` (default: by seed) |
//! | `IDEMGATE_SIM_SQLITE_PERCENT` | share of seeds run on SQLite under `mix` (default 3) |
//! | `IDEMGATE_SIM_SEED` | replay exactly this schedule and print its trace |
//! | `IDEMGATE_SIM_DRAWS` | replay this draw list (as a failure report prints it) |
//! | `IDEMGATE_SIM_SHRINK` | with `IDEMGATE_SIM_SEED`: also shrink it if it fails |
//! | `IDEMGATE_SIM_SHRINK_BUDGET` | replays a shrink may try (default 2000) |
//! | `IDEMGATE_SIM_LIVES` | `1` (default): schedules play keys' next lives (redeliveries of purged keys, tasks held until their key lives again, downstreams that forget purged keys; `Choices::with_lives`); `0`: not (how the schedules kept in `found_schedules_stay_fixed` were found) |
//! | `IDEMGATE_SIM_KEEP_GOING` | go on after a failure; report the first of each invariant |
//! | `IDEMGATE_SIM_TOLERATE` | invariants not to report (comma-separated): to explore past a known finding; never in CI |
//!
//! An exploration stops at its first failing schedule — every thread, not only the one that
//! found it — unless `IDEMGATE_SIM_KEEP_GOING` is set. A failure prints the invariant, the
//! seed and store, the shrunk draws, and the shrunk
//! schedule's trace, one line per step:
//!
//! ```text
//! IDEMGATE_SIM_SEED=2217980680143549128 IDEMGATE_SIM_STORE=mem IDEMGATE_SIM_LIVES=1 cargo test -p idemgate-sim sim
//! IDEMGATE_SIM_DRAWS=0x7.93.0.60.0x8.77 IDEMGATE_SIM_STORE=mem IDEMGATE_SIM_LIVES=1 cargo test -p idemgate-sim sim
//! ```
//!
//! The same seed gives the same trace, byte for byte (`same_seed_same_trace`), on either
//! store.
//!
//! # Speed
//!
//! Measured on the two-core development machine, two threads, other builds running beside:
//! about 130 schedules a second unoptimised; with the simulator, the engine, the core and the
//! conformance crate at `opt-level = 2` in test builds (the root `Cargo.toml`), 1,000 to 2,300
//! a second on the memory store and 60 to 90 on SQLite, whose opening of a fresh file (schema,
//! WAL) is half of each of its schedules. With 3% of seeds on SQLite, CI's 100,000 schedules
//! take about two minutes.
//!
//! [`MemStore`]: idemgate_conformance::mem::MemStore

pub mod authorizer;
pub mod checker;
pub mod choices;
pub mod downstream;
pub mod explore;
pub mod history;
pub mod runtime;
pub mod shrink;
pub mod store;
pub mod workload;
pub mod world;

use std::time::Instant;

use choices::Choices;
use world::StoreKind;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn env_number(name: &str, default: u64) -> u64 {
    match env(name) {
        Some(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number")),
        None => default,
    }
}

fn forced_store() -> Option<StoreKind> {
    match env("IDEMGATE_SIM_STORE").as_deref() {
        None | Some("mix") => None,
        Some("mem") => Some(StoreKind::Mem),
        Some("sqlite") => Some(StoreKind::Sqlite),
        Some(other) => panic!("IDEMGATE_SIM_STORE={other}: use mem, sqlite or mix"),
    }
}

/// The `sim` test's body: replay one schedule, or explore many, as the environment says.
pub fn main_from_env() {
    let catalog = workload::Catalog::new();
    let sqlite_percent = env_number("IDEMGATE_SIM_SQLITE_PERCENT", 3);
    let budget = env_number("IDEMGATE_SIM_SHRINK_BUDGET", 2_000) as usize;
    let lives = match env("IDEMGATE_SIM_LIVES").as_deref().map(str::trim) {
        None | Some("1") => true,
        Some("0") => false,
        Some(other) => panic!("IDEMGATE_SIM_LIVES={other}: use 1 or 0"),
    };
    if let Some(text) = env("IDEMGATE_SIM_DRAWS") {
        let draws = choices::decode(&text).unwrap_or_else(|e| panic!("IDEMGATE_SIM_DRAWS: {e}"));
        let kind = forced_store().unwrap_or(StoreKind::Mem);
        let choices = Choices::replay(draws).with_lives(lives);
        let run = explore::run(&catalog, kind, choices, true);
        print_replay(&run);
        return;
    }
    if let Some(text) = env("IDEMGATE_SIM_SEED") {
        let seed: u64 = text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("IDEMGATE_SIM_SEED={text} is not a number"));
        let kind = forced_store().unwrap_or_else(|| explore::store_for(seed, sqlite_percent));
        let choices = Choices::seeded(seed).with_lives(lives);
        let run = explore::run(&catalog, kind, choices, true);
        if run.violation.is_some() && env("IDEMGATE_SIM_SHRINK").is_some() {
            let f = explore::shrink_failure(&catalog, seed, kind, &run, budget);
            panic!("{}", f.report());
        }
        print_replay(&run);
        return;
    }
    let schedules = env_number("IDEMGATE_SIM_SCHEDULES", 1_000);
    let threads = env_number("IDEMGATE_SIM_THREADS", 2).max(1);
    let base = env_number(
        "IDEMGATE_SIM_BASE",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
    let plan = explore::Plan {
        base,
        count: schedules,
        forced: forced_store(),
        sqlite_percent,
        shrink_budget: budget,
        keep_going: env("IDEMGATE_SIM_KEEP_GOING").is_some(),
        lives,
    };
    let started = Instant::now();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || explore::explore(plan, t, threads, &stop))
        })
        .collect();
    let results: Vec<explore::Explored> = handles
        .into_iter()
        .map(|h| h.join().expect("an exploring thread panicked"))
        .collect();
    let elapsed = started.elapsed();
    let total: u64 = results.iter().map(|r| r.schedules).sum();
    let mut stats = world::Stats::default();
    let mut by_store = [0u64; 2];
    let mut failing: std::collections::BTreeMap<&str, u64> = Default::default();
    for r in &results {
        for (k, v) in &r.failing {
            *failing.entry(k).or_default() += v;
        }
        stats.add(&r.stats);
        by_store[0] += r.by_store[0];
        by_store[1] += r.by_store[1];
    }
    println!(
        "simulated {total} schedules ({} mem, {} sqlite) from base {base} on {threads} threads in {:.1}s: \
         {:.0}/s; {} steps, {} deliveries, {} crashes, {} effects, {} store writes, answers {:?}",
        by_store[0],
        by_store[1],
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        stats.steps,
        stats.deliveries,
        stats.crashes,
        stats.effects,
        stats.writes,
        stats.answers
    );
    let mut reported = std::collections::BTreeSet::new();
    let mut reports = String::new();
    for f in results.iter().flat_map(|r| &r.failures) {
        if reported.insert(f.violation.invariant) {
            reports.push_str(&f.report());
        }
    }
    if !failing.is_empty() {
        panic!("failing schedules by invariant: {failing:?}\n{reports}");
    }
}

fn print_replay(run: &world::Run) {
    for line in &run.trace {
        println!("{line}");
    }
    println!("draws: {}", choices::encode(&run.draws));
    if let Some(v) = &run.violation {
        panic!("schedule failed: {v}");
    }
    println!("schedule passed every check");
}
