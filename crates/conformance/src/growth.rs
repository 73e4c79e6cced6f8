//! Cost as the store grows: the records a store is bulk-loaded with, and the operations
//! measured on it at each size, the same for every store (each store's `benches/growth.rs`
//! writes the rows its own way, fast, and calls these).
//!
//! **The mix.** Record `i` of `n` is, by `i % 1000`: 1% `unknown` (the reconciliation queue),
//! 0.2% `pending` (half of them past their lease: what the recoverer's scan finds), 0.5%
//! tombstones past their purge time and 0.5% `applied` records past their expiry (together
//! the 1% a retention sweep takes), 10% tombstones not yet due, and the rest `applied`, not
//! yet due. Keys look like the executor's (`acme:test:wf-<16 hex>:step-<n>`, four steps per
//! workflow, workflows spread over the whole key space, so the rows come in key order and a
//! new claim lands at a random place among them); each record carries the six trace entries a
//! claim and a finalise write, a tombstone a seventh (`expired`), a settled one a receipt of
//! some 150 bytes, and one that has not settled its request.
//!
//! **The measurements**, each through the store's `Store` methods or the executor on it:
//! claim + finalise (`Executor::execute` on new keys, counted at a downstream that must see
//! one effect per key), replay reading the store (`execute` again on loaded applied keys with
//! `settled_records: 0`, counted at a store wrapper that must see no write), the first page of
//! the reconciliation queue (`list` of `unknown`), the recoverer's scan (`due`, first page and
//! every page, and the operator's queue of claims past their lease, `waiting`), and a sweep of
//! 1% of the rows (`sweep` with a limit of 0.5% per kind), with a probe claiming beside it
//! that reports the longest a claim waited meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idemgate_core::clock::SystemClock;
use idemgate_core::contract::Contract;
use idemgate_core::effect::{
    AllowAll, Downstream, EffectOutcome, EffectRequest, JobStatus, Lookup,
};
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::Status;
use idemgate_core::record::{
    Digest, Dispatch, Event, EventKind, Evidence, Lease, Millis, NOT_SETTLED, Receipt, Record,
    RecordState, RecordStatus, Row,
};
use idemgate_core::store::{
    BoxFuture, Cursor, Due, Filter, Store, SweepReport, Waiting, WaitingOn,
};
use idemgate_engine::{Caller, Executor, Operation, Settings};
use serde_json::{Value, json};

use crate::faulty::FaultyStore;
use crate::harness::{ENVIRONMENT, Noop, Spec, TENANT, ticket};

/// The contract every record is claimed under (the benchmarks' key-based ticket tool).
pub fn contract() -> Arc<Contract> {
    Spec::key_based().contract()
}

/// How long before `now` a settled record was created, at most: records are spread over it.
const AGE: Millis = 7 * 24 * 3_600_000;
/// Retention the not-yet-due settled records still have.
const LEFT: Millis = 24 * 3_600_000;

/// What record `i` is (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Unknown,
    /// Pending, its lease run out: the recoverer's and the overdue queue's.
    Overdue,
    /// Pending, its lease still running.
    InFlight,
    /// A tombstone past its purge time.
    Purgeable,
    /// Applied, past its expiry.
    Expiring,
    /// A tombstone, not yet due.
    Tombstone,
    /// Applied, not yet due.
    Applied,
}

impl Kind {
    pub fn of(i: u64) -> Kind {
        match i % 1000 {
            0..10 => Kind::Unknown,
            10 => Kind::Overdue,
            11 => Kind::InFlight,
            12..17 => Kind::Purgeable,
            17..22 => Kind::Expiring,
            22..122 => Kind::Tombstone,
            _ => Kind::Applied,
        }
    }

    /// How many of the first `n` records are of this kind.
    pub fn count(self, n: u64) -> u64 {
        let per_thousand = (0..1000).filter(|&r| Kind::of(r) == self).count() as u64;
        let whole = n / 1000 * per_thousand;
        whole
            + (n / 1000 * 1000..n)
                .filter(|&i| Kind::of(i) == self)
                .count() as u64
    }
}

/// The key of record `i` of `n`: workflows spread evenly over the 16-hex-digit space, four
/// steps each, so that `i` ascending is key order.
pub fn key(i: u64, n: u64) -> OperationKey {
    let workflows = n.div_ceil(4).max(1);
    let spread = u64::MAX / workflows;
    let workflow = format!("wf-{:016x}", (i / 4) * spread);
    OperationKey::new(TENANT, ENVIRONMENT, &workflow, &format!("step-{}", i % 4))
        .expect("the loader's keys are valid")
}

/// The arguments record `i` was delivered with (a replay delivers them again).
pub fn arguments(i: u64) -> Value {
    ticket(&format!("Refund for order {i:08}"))
}

/// Record `i` of `n` relative to `now`, as a row of the stores' schema, and its trace.
pub fn row(contract: &Contract, i: u64, n: u64, now: Millis) -> (Row, Vec<Event>) {
    let args = arguments(i);
    let kind = Kind::of(i);
    // Spread over the last week, the oldest first; a settled one settled a second later.
    let created_at = now - AGE + (i as i64 % AGE);
    let settled_at = created_at + 1_000;
    let reference = format!("TCK-{i:010}");
    let receipt = || Receipt {
        reference: reference.clone(),
        result: json!({
            "id": reference,
            "status": "open",
            "queue": "support",
            "url": format!("https://tickets.example.invalid/t/{reference}"),
            "created": created_at,
        }),
    };
    let (state, expires_at, purge_at) = match kind {
        Kind::Unknown => (
            RecordState::Unknown(Evidence {
                reason: "the downstream's answer was lost after it was sent".into(),
                reference: None,
                job_id: None,
            }),
            NOT_SETTLED,
            NOT_SETTLED,
        ),
        Kind::Overdue | Kind::InFlight => (
            RecordState::Pending {
                lease: Lease {
                    owner: Some("gateway-7f3a".into()),
                    expires_at: if kind == Kind::Overdue {
                        now - 60_000 - (i as i64 % 1000)
                    } else {
                        now + 30_000
                    },
                },
                dispatch: Dispatch::Sent,
            },
            NOT_SETTLED,
            NOT_SETTLED,
        ),
        Kind::Purgeable => (
            RecordState::Tombstone(Digest::Applied { reference }),
            now - 2 * LEFT,
            now - 1 - (i as i64 % 1000),
        ),
        Kind::Tombstone => (
            RecordState::Tombstone(Digest::Applied { reference }),
            now - LEFT,
            now + LEFT,
        ),
        Kind::Expiring => (
            RecordState::Applied(receipt()),
            now - 1 - (i as i64 % 1000),
            now + LEFT,
        ),
        Kind::Applied => (RecordState::Applied(receipt()), now + LEFT, now + 2 * LEFT),
    };
    let settled = !matches!(kind, Kind::Unknown | Kind::Overdue | Kind::InFlight);
    let record = Record {
        key: key(i, n),
        tool: contract.name.clone(),
        tool_version: contract.version.clone(),
        fingerprint: contract
            .fingerprint(&args)
            .expect("the loader's arguments fit the contract"),
        canonicalization: idemgate_core::canonical::CANONICALIZATION_VERSION,
        state,
        fence: 1,
        actor: "agent-support-1".into(),
        // The executor clears the request once the record settles.
        request: (!settled).then_some(args),
        approved_by: None,
        created_at,
        updated_at: if settled { settled_at } else { created_at },
        expires_at,
        purge_at,
        intent_window: false,
    };
    let worker = "gateway-7f3a";
    let mut trace: Vec<Event> = [
        EventKind::Proposed,
        EventKind::Validated,
        EventKind::Claimed,
    ]
    .into_iter()
    .map(|k| Event::new(k, created_at, 1, worker))
    .collect();
    if kind != Kind::InFlight {
        trace.push(Event::new(EventKind::Sent, created_at + 5, 1, worker));
    }
    if settled {
        trace.push(Event::new(EventKind::Committed, settled_at, 1, worker));
        trace.push(Event::new(EventKind::Acknowledged, settled_at, 1, worker));
    }
    if matches!(kind, Kind::Purgeable | Kind::Tombstone) {
        trace.push(Event::new(EventKind::Expired, now - LEFT, 1, "sweeper"));
    }
    (Row::from_record(&record), trace)
}

/// [`Noop`], counting its effects.
#[derive(Default)]
pub struct Counting {
    effects: AtomicU64,
}

impl Counting {
    pub fn effects(&self) -> u64 {
        self.effects.load(Ordering::Relaxed)
    }
}

impl Downstream for Counting {
    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        self.effects.fetch_add(1, Ordering::Relaxed);
        Noop.perform(request)
    }
    fn lookup_receipt<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        Noop.lookup_receipt(key)
    }
    fn poll_job<'a>(&'a self, key: &'a OperationKey, job: &'a str) -> BoxFuture<'a, JobStatus> {
        Noop.poll_job(key, job)
    }
}

/// A small deterministic generator (splitmix64), for keys and picks without a dependency.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn operation(workflow: &str, step: &str) -> Operation {
    Operation {
        caller: Caller {
            tenant: TENANT.into(),
            actor: "agent-support-1".into(),
            role: "agent".into(),
        },
        environment: ENVIRONMENT.into(),
        workflow_id: Some(workflow.into()),
        step_id: Some(step.into()),
    }
}

/// Operations per second over a run.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    pub ops: u64,
    pub elapsed: Duration,
}

impl Rate {
    pub fn per_second(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
}

/// Claim + finalise: `callers` tasks each running `Executor::execute` on new keys (random
/// workflows, so each lands somewhere among the loaded rows) for `run`. Asserts one effect
/// per operation at the downstream and that every one applied.
pub async fn claims(store: Arc<dyn Store>, callers: usize, run: Duration, seed: u64) -> Rate {
    let downstream = Arc::new(Counting::default());
    let executor = Executor::new(
        store,
        Arc::new(SystemClock),
        Arc::new(AllowAll),
        Settings::default(),
    );
    let contract = contract();
    let started = Instant::now();
    let deadline = started + run;
    let mut tasks = Vec::new();
    for t in 0..callers as u64 {
        let (executor, contract, downstream) =
            (executor.clone(), contract.clone(), downstream.clone());
        tasks.push(tokio::spawn(async move {
            let mut mix = Mix(seed ^ (t << 32));
            let mut done = 0u64;
            while Instant::now() < deadline {
                let workflow = format!("wf-{:016x}", mix.next());
                let o = executor
                    .execute(
                        &contract,
                        &operation(&workflow, "step-0"),
                        &arguments(done),
                        downstream.as_ref(),
                    )
                    .await;
                assert_eq!(o.status, Status::Applied, "{o:?}");
                done += 1;
            }
            done
        }));
    }
    let mut ops = 0;
    for t in tasks {
        ops += t.await.expect("a claimer panicked");
    }
    let elapsed = started.elapsed();
    assert_eq!(downstream.effects(), ops, "one effect per new key");
    Rate { ops, elapsed }
}

/// Replay reading the store: `callers` tasks delivering loaded applied records again (random
/// picks among the `n`, with their own arguments) through an executor that keeps no settled
/// record in memory, for `run`. Asserts every answer is `replayed`, that no effect ran and
/// that the store saw no write.
pub async fn replays(
    store: Arc<dyn Store>,
    n: u64,
    callers: usize,
    run: Duration,
    seed: u64,
) -> Rate {
    let counted = Arc::new(FaultyStore::new(store));
    let downstream = Arc::new(Counting::default());
    let executor = Executor::new(
        counted.clone(),
        Arc::new(SystemClock),
        Arc::new(AllowAll),
        Settings {
            settled_records: 0,
            ..Settings::default()
        },
    );
    let contract = contract();
    let writes = counted.writes();
    let started = Instant::now();
    let deadline = started + run;
    let mut tasks = Vec::new();
    for t in 0..callers as u64 {
        let (executor, contract, downstream) =
            (executor.clone(), contract.clone(), downstream.clone());
        tasks.push(tokio::spawn(async move {
            let mut mix = Mix(seed ^ (t << 32));
            let mut done = 0u64;
            while Instant::now() < deadline {
                let i = loop {
                    let i = mix.next() % n;
                    if Kind::of(i) == Kind::Applied {
                        break i;
                    }
                };
                let k = key(i, n);
                let o = executor
                    .execute(
                        &contract,
                        &operation(k.workflow_id(), k.step_id()),
                        &arguments(i),
                        downstream.as_ref(),
                    )
                    .await;
                assert_eq!(o.status, Status::Replayed, "{o:?}");
                done += 1;
            }
            done
        }));
    }
    let mut ops = 0;
    for t in tasks {
        ops += t.await.expect("a replayer panicked");
    }
    let elapsed = started.elapsed();
    assert_eq!(downstream.effects(), 0, "a replay ran an effect");
    assert_eq!(counted.writes(), writes, "a replay wrote to the store");
    Rate { ops, elapsed }
}

/// The median and the longest of `times`.
#[derive(Debug, Clone, Copy)]
pub struct Latency {
    pub median: Duration,
    pub max: Duration,
}

impl Latency {
    fn of(mut times: Vec<Duration>) -> Latency {
        times.sort();
        Latency {
            median: times[times.len() / 2],
            max: *times.last().expect("at least one time"),
        }
    }
}

/// The first page (100) of the reconciliation queue, as the console reads it: `rounds` times.
/// Asserts a full page of `unknown` records.
pub async fn queue_first_page(store: &dyn Store, rounds: usize) -> Latency {
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let page = store
            .list(Filter {
                tenant: Some(TENANT.into()),
                environment: Some(ENVIRONMENT.into()),
                status: Some(RecordStatus::Unknown),
                tool: None,
                after: None,
                limit: 0,
            })
            .await
            .expect("the queue lists");
        times.push(started.elapsed());
        assert_eq!(page.len(), 100, "a full first page");
        assert!(page.iter().all(|r| r.status() == RecordStatus::Unknown));
    }
    Latency::of(times)
}

/// What the recoverer's scan measured.
#[derive(Debug, Clone, Copy)]
pub struct Scan {
    /// `due`'s first page of 100.
    pub first_page: Latency,
    /// Every page of `due`, cursor after cursor, and how many records they held.
    pub all_pages: Duration,
    pub found: u64,
    /// The operator's queue of claims past their lease (`waiting`), first page.
    pub overdue_page: Latency,
}

/// The recoverer's scan at `now` (the loader's): asserts it finds exactly the overdue records.
pub async fn scan(store: &dyn Store, n: u64, now: Millis, rounds: usize) -> Scan {
    let due = |after: Option<Cursor>| Due {
        environment: ENVIRONMENT.into(),
        now,
        after,
        limit: 100,
    };
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let page = store.due(due(None)).await.expect("the scan reads");
        times.push(started.elapsed());
        assert_eq!(page.len() as u64, Kind::Overdue.count(n).min(100));
    }
    let started = Instant::now();
    let mut found = 0;
    let mut after = None;
    loop {
        let page = store.due(due(after)).await.expect("the scan reads");
        found += page.len() as u64;
        let Some(last) = page.last() else { break };
        after = Some(Cursor {
            due_at: idemgate_core::store::due_at(last).expect("a due record has a deadline"),
            key: last.key.clone(),
        });
        if page.len() < 100 {
            break;
        }
    }
    let all_pages = started.elapsed();
    assert_eq!(
        found,
        Kind::Overdue.count(n),
        "the scan finds every overdue record"
    );
    let mut overdue = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let page = store
            .waiting(Waiting {
                tenant: TENANT.into(),
                environment: ENVIRONMENT.into(),
                on: WaitingOn::LeaseExpired { now },
                tool: None,
                after: None,
                limit: 0,
            })
            .await
            .expect("the queue lists");
        overdue.push(started.elapsed());
        assert_eq!(page.len() as u64, Kind::Overdue.count(n).min(100));
    }
    Scan {
        first_page: Latency::of(times),
        all_pages,
        found,
        overdue_page: Latency::of(overdue),
    }
}

/// What the sweep measured.
#[derive(Debug, Clone, Copy)]
pub struct Sweep {
    pub report: SweepReport,
    pub elapsed: Duration,
    /// Claims a probe made while the sweep ran, and the longest one took.
    pub probes: u64,
    pub longest_probe: Duration,
}

/// One `sweep` at `now` with a limit of 0.5% of the rows per kind (1% in all), while a probe
/// claims and finalises new keys one after the other: the longest of those is the longest a
/// claim waited behind the sweep. Asserts the sweep took exactly the due rows.
pub async fn sweep(store: Arc<dyn Store>, n: u64, now: Millis) -> Sweep {
    let limit = (n / 200) as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let probe = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let executor = Executor::new(
                store,
                Arc::new(SystemClock),
                Arc::new(AllowAll),
                Settings::default(),
            );
            let (contract, downstream) = (contract(), Counting::default());
            let (mut probes, mut longest) = (0u64, Duration::ZERO);
            let mut mix = Mix(0x5eed);
            while !stop.load(Ordering::Relaxed) {
                let workflow = format!("wf-{:016x}", mix.next());
                let started = Instant::now();
                let o = executor
                    .execute(
                        &contract,
                        &operation(&workflow, "probe"),
                        &arguments(probes),
                        &downstream,
                    )
                    .await;
                longest = longest.max(started.elapsed());
                assert_eq!(o.status, Status::Applied, "{o:?}");
                probes += 1;
            }
            assert_eq!(downstream.effects(), probes);
            (probes, longest)
        })
    };
    // Let the probe start before the sweep does.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    let report = store
        .sweep(ENVIRONMENT, now, limit)
        .await
        .expect("the sweep runs");
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (probes, longest_probe) = probe.await.expect("the probe panicked");
    assert_eq!(
        report,
        SweepReport {
            compacted: Kind::Expiring.count(n).min(limit as u64),
            purged: Kind::Purgeable.count(n).min(limit as u64),
        }
    );
    Sweep {
        report,
        elapsed,
        probes,
        longest_probe,
    }
}

/// Formats a duration in milliseconds with two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// Runs and prints, in this order, the queue's first page, the recoverer's scan, claim +
/// finalise and replay on a store loaded with `n` records at `now`: what both stores' growth
/// benchmarks measure before their sweep. `seed` picks the new keys the claims make (a run on a
/// file kept from an earlier one needs keys that run did not make).
pub async fn reads_and_rates(
    store: Arc<dyn Store>,
    n: u64,
    now: Millis,
    callers: usize,
    run: Duration,
    seed: u64,
) {
    let queue = queue_first_page(store.as_ref(), 50).await;
    println!(
        "queue first page (100 unknown): median {} ms, max {} ms",
        ms(queue.median),
        ms(queue.max)
    );
    let scan = scan(store.as_ref(), n, now, 20).await;
    println!(
        "due first page: median {} ms, max {} ms; all {} due in {} ms; \
         overdue queue first page: median {} ms",
        ms(scan.first_page.median),
        ms(scan.first_page.max),
        scan.found,
        ms(scan.all_pages),
        ms(scan.overdue_page.median)
    );
    let claims = claims(store.clone(), callers, run, seed).await;
    println!(
        "claim + finalise: {:.0} ops/s ({} ops)",
        claims.per_second(),
        claims.ops
    );
    let replays = replays(store, n, callers, run, n).await;
    println!(
        "replay from the store: {:.0} ops/s ({} ops)",
        replays.per_second(),
        replays.ops
    );
}
