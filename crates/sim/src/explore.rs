//! Running many schedules: seeds, stores, threads, and what to print when one fails.
//!
//! Schedule `i` of a run has the seed `mix(base + i)`; its store is the memory store or
//! SQLite, by the seed (a share set by `IDEMGATE_SIM_SQLITE_PERCENT`) unless
//! `IDEMGATE_SIM_STORE` names one. A failing schedule is replayed, shrunk, and replayed once
//! more with its trace, which is printed with the seed, the store and the shrunk draws that
//! replay it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idemgate_conformance::mem::MemStore;

use crate::checker::Violation;
use crate::choices::{self, Choices};
use crate::shrink::shrink;
use crate::workload::Catalog;
use crate::world::{self, Run, Stats, StoreKind};

/// SplitMix64: spreads consecutive numbers into unrelated seeds.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Which store a seed runs on when none is forced: `sqlite_percent` of seeds run on SQLite.
pub fn store_for(seed: u64, sqlite_percent: u64) -> StoreKind {
    if mix(seed ^ 0x5157_4C49_5445) % 100 < sqlite_percent {
        StoreKind::Sqlite
    } else {
        StoreKind::Mem
    }
}

/// The stores a schedule can run on in this build.
pub fn stores() -> Vec<StoreKind> {
    vec![StoreKind::Mem, StoreKind::Sqlite]
}

/// Runs one schedule from `choices` on a fresh store of `kind` (a SQLite store in a file of
/// its own, removed afterwards).
pub fn run(catalog: &Catalog, kind: StoreKind, choices: Choices, trace: bool) -> Run {
    match kind {
        StoreKind::Mem => world::run(catalog, Arc::new(MemStore::new()), choices, trace),
        StoreKind::Sqlite => sqlite::run(catalog, choices, trace),
    }
}

mod sqlite {
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use idemgate_store_sqlite::{Options, SqliteStore, Synchronous};

    use crate::choices::Choices;
    use crate::workload::Catalog;
    use crate::world::{self, Run};

    /// A database file of its own for one schedule, removed afterwards.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Scratch {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            Scratch(
                std::env::temp_dir().join(format!("idemgate-sim-{}-{n}.db", std::process::id())),
            )
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            for suffix in ["", "-wal", "-shm"] {
                let mut p = self.0.clone().into_os_string();
                p.push(suffix);
                let _ = std::fs::remove_file(p);
            }
        }
    }

    pub fn run(catalog: &Catalog, choices: Choices, trace: bool) -> Run {
        let scratch = Scratch::new();
        // Without fsync: the simulation crashes processes, not machines, and a schedule's
        // file lives for milliseconds.
        let options = Options {
            synchronous: Synchronous::Off,
            ..Options::default()
        };
        let store = SqliteStore::open(&scratch.0, options)
            .unwrap_or_else(|e| panic!("opening the simulation's SQLite file: {e}"));
        let run = world::run(catalog, Arc::new(store), choices, trace);
        drop(scratch);
        run
    }
}

/// A failing schedule, shrunk, with what replays it.
pub struct Failure {
    pub seed: u64,
    pub kind: StoreKind,
    /// Whether the schedule played keys' next lives ([`Choices::with_lives`]).
    pub lives: bool,
    pub violation: Violation,
    pub draws: Vec<u64>,
    pub original_draws: usize,
    pub trace: Vec<String>,
    pub attempts: usize,
    pub shrink_time: Duration,
    /// Schedules this thread had run when it found it, and how long that took.
    pub found_after: u64,
    pub found_in: Duration,
}

impl Failure {
    /// The report printed for a failing schedule.
    pub fn report(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "\nschedule failed: {}\n\nfound by one thread after {} schedules ({:.2}s)\n\
             seed {} on {} ({} draws, shrunk to {} in {} replays, {:.1}s)\n\
             replay the original:  IDEMGATE_SIM_SEED={} IDEMGATE_SIM_STORE={} IDEMGATE_SIM_LIVES={} cargo test -p idemgate-sim sim\n\
             replay the shrunk:    IDEMGATE_SIM_DRAWS={} IDEMGATE_SIM_STORE={} IDEMGATE_SIM_LIVES={} cargo test -p idemgate-sim sim\n\n\
             shrunk trace:\n",
            self.violation,
            self.found_after,
            self.found_in.as_secs_f64(),
            self.seed,
            self.kind.as_str(),
            self.original_draws,
            self.draws.len(),
            self.attempts,
            self.shrink_time.as_secs_f64(),
            self.seed,
            self.kind.as_str(),
            u8::from(self.lives),
            choices::encode(&self.draws),
            self.kind.as_str(),
            u8::from(self.lives),
        ));
        for line in &self.trace {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
        out
    }
}

/// Shrinks the failing schedule of `seed` (which broke `violation`).
pub fn shrink_failure(
    catalog: &Catalog,
    seed: u64,
    kind: StoreKind,
    first: &Run,
    budget: usize,
) -> Failure {
    let started = Instant::now();
    let violation = first.violation.clone().expect("a failing run");
    let invariant = violation.invariant;
    let lives = first.lives;
    let shrunk = shrink(first.draws.clone(), budget, |candidate| {
        let choices = Choices::replay(candidate.to_vec()).with_lives(lives);
        let r = run(catalog, kind, choices, false);
        match &r.violation {
            Some(v) if v.invariant == invariant => Some(r.draws),
            Some(_) | None => None,
        }
    });
    let last = run(
        catalog,
        kind,
        Choices::replay(shrunk.draws.clone()).with_lives(lives),
        true,
    );
    Failure {
        seed,
        kind,
        lives,
        violation: last.violation.unwrap_or(violation),
        draws: shrunk.draws,
        original_draws: first.draws.len(),
        trace: last.trace,
        attempts: shrunk.attempts,
        shrink_time: started.elapsed(),
        found_after: 0,
        found_in: Duration::ZERO,
    }
}

/// What one thread's share of an exploration found.
pub struct Explored {
    pub schedules: u64,
    pub by_store: [u64; 2],
    pub stats: Stats,
    /// The first failure of each invariant, shrunk.
    pub failures: Vec<Failure>,
    /// Failing schedules per invariant.
    pub failing: std::collections::BTreeMap<&'static str, u64>,
    pub elapsed: Duration,
}

/// How an exploration runs.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub base: u64,
    pub count: u64,
    pub forced: Option<StoreKind>,
    pub sqlite_percent: u64,
    pub shrink_budget: usize,
    /// Go on after a failure, shrinking only the first of each invariant.
    pub keep_going: bool,
    /// Whether schedules play keys' next lives ([`Choices::with_lives`]).
    pub lives: bool,
}

/// Runs schedules `first`, `first + stride`, … below `plan.count`, stopping at the first
/// failure unless the plan keeps going. `stop` is shared by the exploring threads: the first
/// to fail raises it (before it shrinks), and the others stop at their next schedule.
pub fn explore(plan: Plan, first: u64, stride: u64, stop: &AtomicBool) -> Explored {
    let started = Instant::now();
    let catalog = Catalog::new();
    let mut out = Explored {
        schedules: 0,
        by_store: [0, 0],
        stats: Stats::default(),
        failures: Vec::new(),
        failing: Default::default(),
        elapsed: Duration::ZERO,
    };
    let mut i = first;
    while i < plan.count && !stop.load(Ordering::Relaxed) {
        let seed = mix(plan.base.wrapping_add(i));
        let kind = plan
            .forced
            .unwrap_or_else(|| store_for(seed, plan.sqlite_percent));
        let r = run(
            &catalog,
            kind,
            Choices::seeded(seed).with_lives(plan.lives),
            false,
        );
        out.schedules += 1;
        out.by_store[kind as usize] += 1;
        out.stats.add(&r.stats);
        if let Some(v) = &r.violation {
            let n = out.failing.entry(v.invariant).or_default();
            *n += 1;
            if !plan.keep_going {
                stop.store(true, Ordering::Relaxed);
            }
            if *n == 1 {
                let found_in = started.elapsed();
                let mut f = shrink_failure(&catalog, seed, kind, &r, plan.shrink_budget);
                f.found_after = out.schedules;
                f.found_in = found_in;
                out.failures.push(f);
            }
            if !plan.keep_going {
                break;
            }
        }
        i += stride;
    }
    out.elapsed = started.elapsed();
    out
}
