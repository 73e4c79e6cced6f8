//! Many `idemgate` processes on one PostgreSQL database: the proof that the database's unique
//! key and the fencing token hold across processes, not only across tasks.
//!
//! Every worker is the real binary (`idemgate-conformance worker`) with its own pool, clock and
//! executor. Effects are counted on the downstream's side: `LedgerDownstream` writes each one as
//! a row of a SQLite file shared by all processes, which no executor reads or writes, so a green
//! answer cannot hide a duplicate. Records are read back through `PgStore` directly.
//!
//! - `four_processes_deliver_every_key_eight_times_with_one_effect_each`: 4 processes, 2,000
//!   keys, each process delivers every key twice in its own shuffled order (8 deliveries per
//!   key), 16 at a time.
//! - `killed_and_restarted_workers_never_duplicate_an_effect`: the same load while random
//!   workers are killed with SIGKILL at random moments and restarted; then a recovery pass from
//!   a process whose clock is past the lease.
//! - `a_late_finisher_in_another_process_is_fenced`: a worker paused after its claim, and one
//!   paused after the downstream commit, lose their lease to a second process; resumed, neither
//!   overwrites the newer record nor causes a second effect; one paused worker is killed instead.
//!
//! Each test is bounded: every process has a deadline, and a process still running at the end
//! of a test (also a failing one) is killed. `IDEMGATE_MP_SEED` replays a kill schedule.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use idemgate_conformance::ledger::LedgerDownstream;
use idemgate_core::record::{Record, RecordStatus};
use idemgate_core::store::{Filter, Store};
use idemgate_store_postgres::PgStore;
use idemgate_store_postgres::testing::{TestDatabase, fresh_database};
use serde_json::Value;

const PROCESSES: usize = 4;
const KEYS: u32 = 2_000;
/// Deliveries of every key by each process; `PROCESSES * ROUNDS` = 8 per key.
const ROUNDS: u32 = 2;
/// Deliveries in flight per process. Each in-flight delivery holds at most one pooled
/// connection, so the load tests stay at about 4 × 8 connections each, well inside the
/// server's `max_connections` (100) when tests run side by side.
const CONCURRENCY: &str = "8";
/// How long any one process may run before the test fails.
const PROCESS_LIMIT: Duration = Duration::from_secs(100);
/// The workers' lease in the load tests (the worker's default), and how far past it the
/// recovery pass's clock runs.
const RECOVERY_OFFSET_MS: &str = "120000";
/// Operation keys as the worker forms them: tenant `acme`, environment `test`, workflow
/// `run_827`, step `k<n>` (or the step a single delivery names).
const KEY_PREFIX: &str = "acme:test:run_827:";

fn key(step: &str) -> String {
    format!("{KEY_PREFIX}{step}")
}

/// A fresh database, or return from the test after the helper printed why it was skipped.
macro_rules! database {
    () => {
        match fresh_database().await {
            Some(db) => db,
            None => return,
        }
    };
}

/// The worker's command line: store, ledger and the arguments of one role.
fn worker(db: &TestDatabase, ledger: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idemgate-conformance"));
    cmd.args(["worker", "--store", db.url(), "--ledger"])
        .arg(ledger)
        .args(args)
        .stdin(Stdio::null());
    cmd
}

/// One load worker, restartable with the same arguments; its output goes to files so a killed
/// process leaves what it printed.
struct LoadWorker {
    args: Vec<String>,
    child: Option<Child>,
    runs: usize,
    stdout: PathBuf,
}

/// Every process the test started; whatever is still running when the test ends is killed.
struct Processes {
    dir: tempfile::TempDir,
    db_url: String,
    ledger: PathBuf,
    workers: Vec<LoadWorker>,
}

impl Processes {
    fn new(db: &TestDatabase) -> Processes {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("ledger.sqlite");
        Processes {
            db_url: db.url().to_string(),
            ledger,
            dir,
            workers: Vec::new(),
        }
    }

    fn command(&self, args: &[String]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_idemgate-conformance"));
        cmd.args(["worker", "--store", &self.db_url, "--ledger"])
            .arg(&self.ledger)
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    /// Adds a worker and starts it.
    fn add(&mut self, args: Vec<String>) -> usize {
        self.workers.push(LoadWorker {
            args,
            child: None,
            runs: 0,
            stdout: PathBuf::new(),
        });
        let i = self.workers.len() - 1;
        self.start(i);
        i
    }

    fn start(&mut self, i: usize) {
        let w = &self.workers[i];
        let name = format!("w{i}-run{}", w.runs);
        let stdout = self.dir.path().join(format!("{name}.out"));
        let stderr = self.dir.path().join(format!("{name}.err"));
        let child = self
            .command(&w.args)
            .stdout(File::create(&stdout).unwrap())
            .stderr(File::create(stderr).unwrap())
            .spawn()
            .expect("the idemgate binary starts");
        let w = &mut self.workers[i];
        w.child = Some(child);
        w.runs += 1;
        w.stdout = stdout;
    }

    fn running(&mut self, i: usize) -> bool {
        match &mut self.workers[i].child {
            Some(child) => child.try_wait().unwrap().is_none(),
            None => false,
        }
    }

    /// SIGKILL, reaped at once, then the same arguments again.
    fn kill_and_restart(&mut self, i: usize) {
        if let Some(mut child) = self.workers[i].child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        self.start(i);
    }

    /// Waits for every worker to exit successfully, within `limit`; returns the last line each
    /// printed (the worker's answer counts).
    async fn finish(&mut self, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        let mut lines = Vec::new();
        for i in 0..self.workers.len() {
            let status = loop {
                let child = self.workers[i].child.as_mut().expect("started");
                if let Some(status) = child.try_wait().unwrap() {
                    break status;
                }
                assert!(
                    Instant::now() < deadline,
                    "worker {i} still running after {limit:?}: {}",
                    self.stderr_of(i)
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            assert!(
                status.success(),
                "worker {i} failed ({status}): {}",
                self.stderr_of(i)
            );
            let out = std::fs::read_to_string(&self.workers[i].stdout).unwrap();
            lines.push(out.lines().last().unwrap_or_default().to_string());
        }
        lines
    }

    fn stderr_of(&self, i: usize) -> String {
        let path = self.workers[i].stdout.with_extension("err");
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Runs one more process to the end and returns its stdout.
    async fn run(&self, args: &[String]) -> String {
        let mut child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + PROCESS_LIMIT;
        while child.try_wait().unwrap().is_none() {
            if Instant::now() >= deadline {
                let _ = child.kill();
                panic!("{args:?} still running after {PROCESS_LIMIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for w in &mut self.workers {
            if let Some(child) = &mut w.child {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn load_args(i: usize, seed: u64) -> Vec<String> {
    [
        "--receipt",
        "lookup",
        "--keys",
        &KEYS.to_string(),
        "--rounds",
        &ROUNDS.to_string(),
        "--seed",
        &seed.to_string(),
        "--concurrency",
        CONCURRENCY,
        "--name",
        &format!("w{i}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Every record in the database, read page by page through the store.
async fn all_records(store: &PgStore) -> BTreeMap<String, Record> {
    let mut records = BTreeMap::new();
    let mut after = None;
    loop {
        let page = store
            .list(Filter {
                after: after.clone(),
                limit: 1000,
                ..Filter::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.key.as_str().to_string());
        for r in page {
            records.insert(r.key.as_str().to_string(), r);
        }
    }
    records
}

/// Records of one status, through the store's status filter (the index an operator's
/// reconciliation queue uses).
async fn count_with_status(store: &PgStore, status: RecordStatus) -> usize {
    let mut n = 0;
    let mut after = None;
    loop {
        let page = store
            .list(Filter {
                status: Some(status),
                after: after.clone(),
                limit: 1000,
                ..Filter::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.key.as_str().to_string());
        n += page.len();
    }
    n
}

/// Effects per operation key, counted in the downstream's own ledger.
fn effects(ledger: &Path) -> HashMap<String, u64> {
    if !ledger.exists() {
        return HashMap::new();
    }
    LedgerDownstream::effects_by_key(ledger)
        .unwrap()
        .into_iter()
        .collect()
}

/// The answers one worker counted, by label (`applied`, `replayed`, `in_flight`, …).
fn answers(line: &str) -> BTreeMap<String, u64> {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("worker printed `{line}`: {e}"))
}

/// A small deterministic generator (splitmix64), so a kill schedule replays from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn say(line: &str) {
    // Straight to the stderr handle: the harness would hide an `eprintln!` of a passing test.
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_deliver_every_key_eight_times_with_one_effect_each() {
    let db = database!();
    let mut procs = Processes::new(&db);
    let started = Instant::now();
    for i in 0..PROCESSES {
        procs.add(load_args(i, 1 + i as u64));
    }
    let lines = procs.finish(PROCESS_LIMIT).await;

    // On the downstream's side: exactly one effect for every key, and nothing else.
    let effects = effects(&procs.ledger);
    assert_eq!(effects.len(), KEYS as usize, "keys with an effect");
    for (key, n) in &effects {
        assert_eq!(*n, 1, "{key} has {n} effects");
    }
    for k in 0..KEYS {
        assert!(
            effects.contains_key(&key(&format!("k{k}"))),
            "k{k} has no effect"
        );
    }

    // The executors' records: every key applied.
    let store = db.store().await;
    let records = all_records(&store).await;
    assert_eq!(records.len(), KEYS as usize);
    for (key, r) in &records {
        assert_eq!(r.status(), RecordStatus::Applied, "{key}: {r:?}");
        assert_eq!(
            effects.get(key),
            Some(&1),
            "{key} applied without an effect"
        );
    }

    // The callers' side: one `applied` answer per effect; every other answer a replay or an
    // honest in-flight, and every delivery answered.
    let mut total = BTreeMap::<String, u64>::new();
    for line in &lines {
        for (label, n) in answers(line) {
            *total.entry(label).or_default() += n;
        }
    }
    assert_eq!(total.get("applied"), Some(&(KEYS as u64)), "{total:?}");
    for label in total.keys() {
        assert!(
            ["applied", "replayed", "in_flight"].contains(&label.as_str()),
            "unexpected answers {total:?}"
        );
    }
    assert_eq!(
        total.values().sum::<u64>(),
        (KEYS * ROUNDS) as u64 * PROCESSES as u64
    );
    say(&format!(
        "multiprocess: {PROCESSES} processes, {KEYS} keys x {} deliveries: {total:?}, \
         {} effects, {:.1} s",
        ROUNDS as usize * PROCESSES,
        effects.len(),
        started.elapsed().as_secs_f64()
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_restarted_workers_never_duplicate_an_effect() {
    let db = database!();
    let seed = std::env::var("IDEMGATE_MP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    say(&format!(
        "multiprocess kills: seed {seed} (IDEMGATE_MP_SEED={seed} replays the schedule)"
    ));
    let mut rng = Rng(seed);
    let mut procs = Processes::new(&db);
    let started = Instant::now();
    for i in 0..PROCESSES {
        procs.add(load_args(i, seed.wrapping_add(i as u64)));
    }

    // Kill a random running worker every 100–700 ms for at most 8 s, restarting it with the
    // same arguments. A restarted worker delivers every key again: replays are harmless.
    let mut kills = 0;
    let kill_phase = Instant::now();
    while kill_phase.elapsed() < Duration::from_secs(8) {
        tokio::time::sleep(Duration::from_millis(100 + rng.below(600))).await;
        let i = rng.below(PROCESSES as u64) as usize;
        if procs.running(i) {
            procs.kill_and_restart(i);
            kills += 1;
        } else if (0..PROCESSES).all(|i| !procs.running(i)) {
            break;
        }
    }
    assert!(
        kills >= 3,
        "only {kills} workers were killed during the load"
    );
    procs.finish(PROCESS_LIMIT).await;

    // Claims left by killed workers hold live leases; a recovery pass whose clock is past the
    // lease settles them: by receipt, by execution when nothing was sent, or as `unknown`.
    let out = procs
        .run(&[
            "--receipt".into(),
            "lookup".into(),
            "--recover".into(),
            "--clock-offset-ms".into(),
            RECOVERY_OFFSET_MS.into(),
            "--name".into(),
            "recoverer".into(),
        ])
        .await;
    assert!(out.contains("\"recovered\""), "recovery pass printed {out}");

    let effects = effects(&procs.ledger);
    let store = db.store().await;
    let records = all_records(&store).await;
    // Every key was delivered by a worker that ran to the end, so every key has a record.
    assert_eq!(records.len(), KEYS as usize, "records");
    let mut by_status = BTreeMap::<&str, usize>::new();
    for (key, n) in &effects {
        assert!(*n <= 1, "{key} has {n} effects");
        assert!(
            records.contains_key(key),
            "{key} has an effect but no record"
        );
    }
    for (key, r) in &records {
        let n = effects.get(key).copied().unwrap_or(0);
        match r.status() {
            RecordStatus::Applied => assert_eq!(n, 1, "{key} is applied with {n} effects"),
            RecordStatus::Unknown => assert!(n <= 1, "{key} is unknown with {n} effects"),
            other => panic!("{key} ended {other:?} after the recovery pass: {r:?}"),
        }
        *by_status.entry(r.status().as_str()).or_default() += 1;
    }
    assert_eq!(count_with_status(&store, RecordStatus::Pending).await, 0);
    assert_eq!(
        count_with_status(&store, RecordStatus::Applied).await,
        by_status.get("applied").copied().unwrap_or(0)
    );
    say(&format!(
        "multiprocess kills: {kills} SIGKILLs, records {by_status:?}, {} effects, {:.1} s",
        effects.len(),
        started.elapsed().as_secs_f64()
    ));
}

/// A worker that pauses, driven line by line: its stdout arrives on a channel, a line on its
/// stdin lets it continue.
struct Paused {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Paused {
    fn start(mut cmd: Command) -> Paused {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Paused {
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    fn line(&self, what: &str) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("waiting for {what}: {e}"))
    }

    fn expect_paused(&self, point: &str) {
        assert_eq!(self.line(point), format!("PAUSED {point}"));
    }

    /// Lets the worker continue and returns the outcome it prints.
    fn resume(&mut self) -> Value {
        let mut stdin = self.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
        drop(stdin);
        let outcome = self.line("the late finisher's outcome");
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the resumed worker did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
        serde_json::from_str(&outcome).unwrap()
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One delivery of `step` run to the end; its printed outcome.
fn deliver(db: &TestDatabase, ledger: &Path, step: &str, extra: &[&str]) -> Value {
    let mut args = vec!["--step", step];
    args.extend_from_slice(extra);
    let out = worker(db, ledger, &args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "delivery of {step} failed");
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("delivery of {step} printed `{text}`: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_finisher_in_another_process_is_fenced() {
    let db = database!();
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.sqlite");
    let store = db.store().await;
    // A 3 s lease (the shortest a contract may declare); the second process's clock runs 10 s
    // ahead, so A's lease has expired for it while A is paused.
    let lease = ["--receipt", "lookup", "--lease-seconds", "3"];
    let later = ["--clock-offset-ms", "10000", "--name", "B"];
    let b_args: Vec<&str> = lease.iter().chain(&later).copied().collect();
    let a_args = |pause: &'static str, resume: bool| {
        let mut args: Vec<&str> = lease.to_vec();
        args.extend(["--name", "A", "--pause-after", pause]);
        if resume {
            args.push("--resume-on-stdin");
        }
        args
    };
    let record = |step: &str| {
        let store = store.clone();
        let key = idemgate_core::key::OperationKey::parse(&key(step)).unwrap();
        async move { store.get(&key).await.unwrap().expect("a record") }
    };

    // 1. A is paused after its claim, before anything is sent, on a downstream that
    // deduplicates (the claim of one that does not carries the dispatch marker: a pause after
    // it is a pause after the marker, which step 2 covers with the commit). B takes the expired
    // lease over (fence 2) and performs the effect. A then continues: what it sends under the
    // key the downstream deduplicates, and its completion, conditional on fence 1, loses.
    let dedup = ["--receipt", "dedup", "--lease-seconds", "3"];
    let b1_args: Vec<&str> = dedup.iter().chain(&later).copied().collect();
    let mut a = Paused::start({
        let mut args = vec!["--step", "s1"];
        args.extend(dedup);
        args.extend(["--name", "A", "--pause-after", "claim", "--resume-on-stdin"]);
        worker(&db, &ledger, &args)
    });
    a.expect_paused("claim");
    let b = deliver(&db, &ledger, "s1", &b1_args);
    assert_eq!(b["status"], "applied", "{b}");
    let taken_over = record("s1").await;
    assert_eq!(taken_over.fence, 2, "{taken_over:?}");
    let late = a.resume();
    assert_ne!(
        late["status"], "applied",
        "the late finisher claimed the effect: {late}"
    );
    assert_eq!(late["effect_reference"], b["effect_reference"], "{late}");
    assert_eq!(effects(&ledger).get(&key("s1")), Some(&1));
    assert_eq!(
        record("s1").await,
        taken_over,
        "the late finisher changed the record"
    );

    // 2. A is paused after the downstream committed, before it records the receipt (its lease
    // renewal is held too). B recovers the expired claim by looking the receipt up by key and
    // records it. A then continues: its completion, conditional on its fence and a pending
    // record, loses, and A answers the stored result.
    let mut a = Paused::start({
        let mut args = vec!["--step", "s2"];
        args.extend(a_args("commit", true));
        worker(&db, &ledger, &args)
    });
    a.expect_paused("commit");
    assert_eq!(effects(&ledger).get(&key("s2")), Some(&1));
    let b = deliver(&db, &ledger, "s2", &b_args);
    assert_eq!(b["status"], "replayed", "{b}");
    let recovered = record("s2").await;
    assert_eq!(recovered.status(), RecordStatus::Applied, "{recovered:?}");
    let late = a.resume();
    assert_eq!(late["status"], "replayed", "{late}");
    assert_eq!(late["effect_reference"], b["effect_reference"], "{late}");
    assert_eq!(effects(&ledger).get(&key("s2")), Some(&1));
    assert_eq!(
        record("s2").await,
        recovered,
        "the late finisher changed the record"
    );

    // 3. The same, but A is killed while paused after the commit: the effect it committed is
    // the only one, and B's record of it stands.
    let a = Paused::start({
        let mut args = vec!["--step", "s3"];
        args.extend(a_args("commit", false));
        worker(&db, &ledger, &args)
    });
    a.expect_paused("commit");
    let b = deliver(&db, &ledger, "s3", &b_args);
    assert_eq!(b["status"], "replayed", "{b}");
    drop(a); // SIGKILL
    let again = deliver(&db, &ledger, "s3", &b_args);
    assert_eq!(again["status"], "replayed", "{again}");
    assert_eq!(again["effect_reference"], b["effect_reference"]);
    assert_eq!(effects(&ledger).get(&key("s3")), Some(&1));
    assert_eq!(record("s3").await.status(), RecordStatus::Applied);
    assert_eq!(effects(&ledger).len(), 3, "{:?}", effects(&ledger));
}
