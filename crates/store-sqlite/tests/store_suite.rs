//! The shared store contract against SQLite, and what only SQLite has: files, migrations,
//! group commit, and several writers on one file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use idemgate_conformance::store_suite::{self, applied, pending, record};
use idemgate_core::record::{Digest, Event, EventKind, RecordState, RecordStatus};
use idemgate_core::store::{Claimed, Error, Filter, Store, SweepReport};
use idemgate_store_sqlite::{Options, SCHEMA_VERSION, SWEEP_BATCH, SqliteStore, Synchronous};
use tempfile::TempDir;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path, Options::default()).expect("the store opens")
}

/// A fresh store in its own temporary directory, which lives as long as the store.
struct Fresh {
    dir: TempDir,
    store: SqliteStore,
}

fn fresh() -> Fresh {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = open(&dir.path().join("idemgate.db"));
    Fresh { dir, store }
}

/// How many records a fresh reader lists (up to a page of 1000).
async fn listed(store: &SqliteStore) -> usize {
    let page = Filter {
        limit: 1000,
        ..Filter::default()
    };
    store.list(page).await.expect("list").len()
}

/// One test per case, so that a failure names its case.
macro_rules! cases {
    ($($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let Fresh { dir, store } = fresh();
                store_suite::$case(store).await;
                drop(dir);
            }
        )*
    };
}

cases!(
    claim_inserts_then_returns_existing,
    concurrent_claims_insert_once,
    transition_applies_and_appends_events,
    stale_fence_loses_and_changes_nothing,
    a_purged_keys_next_life_fences_out_the_last,
    takeover_waits_for_lease_expiry,
    concurrent_takeovers_one_wins,
    request_update_keep_clear_set,
    approver_and_fingerprint_replacement,
    append_events_keeps_order,
    transition_sets_expiry_only_when_given,
    list_filters_and_pages,
    list_filters_by_environment,
    list_default_page,
    count_is_exact_past_a_page,
    due_finds_deadlines_passed_in_order,
    due_pages_by_cursor_and_limit,
    waiting_lists_expired_claims_and_jobs,
    duplicate_intent_names_the_earliest_match,
    duplicate_intent_inserts_nothing,
    concurrent_duplicate_intents_insert_once,
    sweep_compacts_and_purges,
    sweep_is_scoped_by_environment,
    sweep_never_touches_unsettled_records,
    sweep_respects_limit,
    every_state_round_trips,
    digests_round_trip,
);

/// The suite's own entry point, as other stores call it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whole_suite() {
    // The directories outlive every store the suite makes; each case drops its store first.
    let dirs: Mutex<Vec<TempDir>> = Mutex::new(Vec::new());
    store_suite::run(|| {
        let Fresh { dir, store } = fresh();
        dirs.lock().expect("no case panicked").push(dir);
        async move { store }
    })
    .await;
    assert_eq!(
        dirs.lock().expect("no case panicked").len(),
        store_suite::CASES
    );
}

#[tokio::test]
async fn reopening_keeps_records_and_events() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("idemgate.db");
    let claimed = record("acme:prod:wf-reopen:s1", applied("ticket-1"));
    let events = vec![Event::new(EventKind::Claimed, 1_000, 1, "w1")];
    {
        let store = open(&path);
        let answer = store
            .claim(claimed.clone(), events.clone())
            .await
            .expect("claim");
        assert_eq!(answer, Claimed::Inserted(claimed.clone()));
    }
    let store = open(&path);
    assert_eq!(
        store.get(&claimed.key).await.expect("get"),
        Some(claimed.clone())
    );
    assert_eq!(store.events(&claimed.key).await.expect("events"), events);
    let again = store
        .claim(claimed.clone(), Vec::new())
        .await
        .expect("claim");
    assert_eq!(again, Claimed::Existing(claimed));
}

fn user_version(path: &Path) -> i64 {
    let conn = rusqlite::Connection::open(path).expect("a plain connection");
    conn.pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("user_version reads")
}

#[test]
fn a_new_file_is_migrated_to_the_current_version() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("idemgate.db");
    drop(open(&path));
    assert_eq!(user_version(&path), SCHEMA_VERSION);
    // Opening again applies nothing and keeps the version.
    drop(open(&path));
    assert_eq!(user_version(&path), SCHEMA_VERSION);
    let conn = rusqlite::Connection::open(&path).expect("a plain connection");
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .expect("journal_mode reads");
    assert_eq!(mode, "wal");
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("idemgate.db");
    drop(open(&path));
    {
        let conn = rusqlite::Connection::open(&path).expect("a plain connection");
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .expect("user_version writes");
    }
    let refused = SqliteStore::open(&path, Options::default()).expect_err("a newer file");
    match refused {
        Error::Unavailable(message) => {
            assert!(
                message.contains(&format!("schema version is {}", SCHEMA_VERSION + 1))
                    && message.contains("upgrade idemgate"),
                "{message}"
            );
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // Refusing changed nothing.
    assert_eq!(user_version(&path), SCHEMA_VERSION + 1);
}

#[test]
fn a_file_that_is_not_a_database_is_refused() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("idemgate.db");
    std::fs::write(&path, vec![b'x'; 8192]).expect("a junk file");
    let refused = SqliteStore::open(&path, Options::default()).expect_err("junk");
    assert!(matches!(refused, Error::Corrupt(_)), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_shares_commits() {
    const CLAIMS: usize = 64;
    let Fresh { dir, store } = fresh();
    let before = store.stats();
    let start = Arc::new(Barrier::new(CLAIMS));
    let mut tasks = JoinSet::new();
    for i in 0..CLAIMS {
        let store = store.clone();
        let start = Arc::clone(&start);
        tasks.spawn(async move {
            let r = record(
                &format!("acme:prod:wf-group:s{i:02}"),
                pending("w1", 31_000),
            );
            start.wait().await;
            store.claim(r, Vec::new()).await.expect("claim")
        });
    }
    let mut inserted = 0;
    while let Some(answer) = tasks.join_next().await {
        if let Claimed::Inserted(_) = answer.expect("a claimant panicked") {
            inserted += 1;
        }
    }
    assert_eq!(inserted, CLAIMS);
    let stats = store.stats();
    let commands = stats.commands - before.commands;
    let commits = stats.commits - before.commits;
    assert_eq!(commands, CLAIMS as u64);
    println!("group commit: {commits} commits for {commands} commands");
    assert!(
        commits < commands,
        "{commits} commits for {commands} commands"
    );
    // Every answer came after its commit, so a fresh reader sees every claim.
    assert_eq!(listed(&store).await, CLAIMS);
    drop(store);
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_batch_bounds_a_transaction() {
    const CLAIMS: usize = 40;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let options = Options {
        max_batch: 1,
        ..Options::default()
    };
    let store = SqliteStore::open(dir.path().join("idemgate.db"), options).expect("open");
    let mut tasks = JoinSet::new();
    for i in 0..CLAIMS {
        let store = store.clone();
        tasks.spawn(async move {
            let r = record(
                &format!("acme:prod:wf-batch:s{i:02}"),
                pending("w1", 31_000),
            );
            store.claim(r, Vec::new()).await.expect("claim")
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("a claimant panicked");
    }
    let stats = store.stats();
    assert_eq!(stats.commands, CLAIMS as u64);
    assert_eq!(stats.commits, CLAIMS as u64, "one command per transaction");
}

/// A sweep of many rows runs as several write transactions of at most `SWEEP_BATCH` rows each,
/// purges before compactions, so that no claim waits behind the whole sweep; together they do
/// exactly what one sweep of that limit does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_sweep_runs_in_bounded_batches() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let options = Options {
        synchronous: Synchronous::Off,
        ..Options::default()
    };
    let store = SqliteStore::open(dir.path().join("idemgate.db"), options).expect("open");
    // `record` makes settled records due for compaction at 100 000 and for purging at 200 000.
    let tombstones = SWEEP_BATCH + 3;
    let settled = 3 * SWEEP_BATCH + 5;
    for i in 0..tombstones {
        let r = record(
            &format!("acme:prod:wf-big:t{i:04}"),
            RecordState::Tombstone(Digest::NeverRan),
        );
        store.claim(r, Vec::new()).await.expect("claim");
    }
    for i in 0..settled {
        let r = record(&format!("acme:prod:wf-big:a{i:04}"), applied("t"));
        store.claim(r, Vec::new()).await.expect("claim");
    }
    let young = record("acme:prod:wf-big:young", pending("w1", 31_000));
    store.claim(young.clone(), Vec::new()).await.expect("claim");

    let before = store.stats();
    let report = store.sweep("prod", 250_000, 10_000).await.expect("sweep");
    let after = store.stats();
    assert_eq!(
        report,
        SweepReport {
            compacted: settled as u64,
            purged: tombstones as u64,
        }
    );
    // Purge: a full batch, then one of 3 that ends it; compaction: three full, one of 5. A
    // batch that runs out of its time budget first leaves the rest to one more.
    assert!(
        after.commits - before.commits >= 2 + 4,
        "{before:?} {after:?}"
    );
    assert_eq!(
        after.commands - before.commands,
        after.commits - before.commits,
        "one command per batch, nothing else written"
    );
    // The records this sweep compacted are past their purge time too, yet only the next sweep
    // purges them; nothing else is touched.
    let tomb = store
        .get(&store_suite::key("acme:prod:wf-big:a0000"))
        .await
        .expect("get")
        .expect("compacted, not purged");
    assert_eq!(tomb.status(), RecordStatus::Tombstone);
    let next = store.sweep("prod", 250_000, 10_000).await.expect("sweep");
    assert_eq!(
        next,
        SweepReport {
            compacted: 0,
            purged: settled as u64,
        }
    );
    assert_eq!(store.get(&young.key).await.expect("get"), Some(young));
}

/// A failing command is undone alone: the others in its batch still commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_row_fails_alone() {
    let Fresh { dir, store } = fresh();
    let good = record("acme:prod:wf-bad:good", applied("ticket-1"));
    let bad = record("acme:prod:wf-bad:bad", applied("ticket-2"));
    for r in [&good, &bad] {
        store.claim(r.clone(), Vec::new()).await.expect("claim");
    }
    {
        let conn = rusqlite::Connection::open(store.path()).expect("a plain connection");
        conn.execute(
            "UPDATE operations SET status = 'exploded' WHERE key = ?1",
            [bad.key.as_str()],
        )
        .expect("the row is spoiled");
    }
    let read = store.get(&bad.key).await;
    assert!(matches!(read, Err(Error::Corrupt(_))), "{read:?}");
    // A claim of the spoiled key reads the row back and fails; the claims beside it commit.
    let mut tasks = JoinSet::new();
    for i in 0..16 {
        let store = store.clone();
        let r = if i == 8 {
            bad.clone()
        } else {
            record(&format!("acme:prod:wf-bad:s{i:02}"), pending("w1", 31_000))
        };
        tasks.spawn(async move { (i, store.claim(r, Vec::new()).await) });
    }
    while let Some(joined) = tasks.join_next().await {
        let (i, answer) = joined.expect("a claimant panicked");
        if i == 8 {
            assert!(matches!(answer, Err(Error::Corrupt(_))), "{answer:?}");
        } else {
            assert!(matches!(answer, Ok(Claimed::Inserted(_))), "{answer:?}");
        }
    }
    let listed = store
        .list(Filter {
            tenant: Some("acme".into()),
            after: Some("acme:prod:wf-bad:s".into()),
            limit: 100,
            ..Filter::default()
        })
        .await
        .expect("list");
    assert_eq!(listed.len(), 15);
    assert_eq!(store.get(&good.key).await.expect("get"), Some(good));
    drop(store);
    drop(dir);
}

/// Two stores opened separately on one file, as two processes would: each key is inserted
/// exactly once, whichever writer gets there first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_on_one_file_insert_each_key_once() {
    const KEYS: usize = 40;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("idemgate.db");
    let stores = [open(&path), open(&path)];
    let start = Arc::new(Barrier::new(KEYS * 2));
    let mut tasks = JoinSet::new();
    for i in 0..KEYS {
        for (s, store) in stores.iter().enumerate() {
            let store = store.clone();
            let start = Arc::clone(&start);
            tasks.spawn(async move {
                let worker = format!("store{s}");
                let r = record(
                    &format!("acme:prod:wf-two:s{i:02}"),
                    pending(&worker, 31_000),
                );
                let events = vec![Event::new(EventKind::Claimed, 1_000, 1, &worker)];
                start.wait().await;
                (i, store.claim(r, events).await.expect("claim"))
            });
        }
    }
    let mut inserted = vec![0; KEYS];
    while let Some(joined) = tasks.join_next().await {
        let (i, answer) = joined.expect("a claimant panicked");
        if let Claimed::Inserted(_) = answer {
            inserted[i] += 1;
        }
    }
    assert_eq!(inserted, vec![1; KEYS], "inserts per key");
    for i in 0..KEYS {
        let key = idemgate_conformance::store_suite::key(&format!("acme:prod:wf-two:s{i:02}"));
        let stored = stores[0].get(&key).await.expect("get").expect("stored");
        let events = stores[1].events(&key).await.expect("events");
        assert_eq!(events.len(), 1, "{key}: {events:?}");
        let owner = stored.lease().and_then(|l| l.owner.clone());
        assert_eq!(
            Some(events[0].worker.clone()),
            owner,
            "the winner's own trace"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Real processes: this test binary runs itself as children that claim the same keys.

const CHILD_DB: &str = "IDEMGATE_SQLITE_CHILD_DB";
const CHILD_NAME: &str = "IDEMGATE_SQLITE_CHILD_NAME";
const PROCESS_KEYS: usize = 30;
const REPORT: &str = "child inserted: ";

/// Run as a child by `processes_on_one_file_insert_each_key_once`; does nothing otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_claimer() {
    let (Some(path), Some(name)) = (std::env::var_os(CHILD_DB), std::env::var(CHILD_NAME).ok())
    else {
        return;
    };
    let store = open(&PathBuf::from(path));
    let mut tasks = JoinSet::new();
    for i in 0..PROCESS_KEYS {
        let store = store.clone();
        let name = name.clone();
        tasks.spawn(async move {
            let r = record(
                &format!("acme:prod:wf-proc:s{i:02}"),
                pending(&name, 31_000),
            );
            let events = vec![Event::new(EventKind::Claimed, 1_000, 1, &name)];
            store.claim(r, events).await.expect("claim")
        });
    }
    let mut inserted = 0;
    while let Some(joined) = tasks.join_next().await {
        if let Claimed::Inserted(_) = joined.expect("a claimant panicked") {
            inserted += 1;
        }
    }
    // On a line of its own: the test harness prints its "test child_claimer ..." line first.
    println!("\n{REPORT}{inserted}");
}

const CHILD_OPEN: &str = "IDEMGATE_SQLITE_CHILD_OPEN";

/// Run as a child by `processes_opening_a_new_file_together_all_open`; does nothing otherwise.
#[test]
fn child_opener() {
    let Some(path) = std::env::var_os(CHILD_OPEN) else {
        return;
    };
    // Panics, and so fails the child, if the store does not open.
    drop(open(&PathBuf::from(path)));
}

/// Switching a new file to WAL takes an exclusive lock, and SQLite answers "busy" at once,
/// without consulting the busy handler, to processes that race for it: two gateways started
/// together on a new file must both open, not one of them fail.
#[test]
fn processes_opening_a_new_file_together_all_open() {
    const ROUNDS: usize = 20;
    const CHILDREN: usize = 4;
    for round in 0..ROUNDS {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("new.db");
        let children: Vec<_> = (0..CHILDREN)
            .map(|_| {
                child_test("child_opener")
                    .env(CHILD_OPEN, &path)
                    .spawn()
                    .expect("the child starts")
            })
            .collect();
        for child in children {
            let output = child.wait_with_output().expect("the child runs");
            assert!(
                output.status.success(),
                "round {round}: a process failed to open a new file: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

#[test]
fn processes_on_one_file_insert_each_key_once() {
    const CHILDREN: usize = 3;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("idemgate.db");
    // Created and migrated up front, so the children race only on claims.
    drop(open(&path));
    let children: Vec<_> = (0..CHILDREN)
        .map(|c| {
            child_test("child_claimer")
                .env(CHILD_DB, &path)
                .env(CHILD_NAME, format!("proc{c}"))
                .spawn()
                .expect("the child starts")
        })
        .collect();
    let mut total = 0;
    for child in children {
        let output = child.wait_with_output().expect("the child runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let count: usize = stdout
            .lines()
            .find_map(|l| l.strip_prefix(REPORT))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no report in {stdout}"));
        total += count;
    }
    assert_eq!(total, PROCESS_KEYS, "inserts across all processes");
    let conn = rusqlite::Connection::open(&path).expect("a plain connection");
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM operations", [], |r| r.get(0))
        .expect("count");
    // The trace is kept in the row, one line per entry.
    let events: i64 = conn
        .query_row(
            "SELECT sum(length(trace) - length(replace(trace, char(10), ''))) FROM operations",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!((rows, events), (PROCESS_KEYS as i64, PROCESS_KEYS as i64));
}

/// This test binary, set to run only the test `name`, its output captured.
fn child_test(name: &str) -> Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = Command::new(exe);
    command
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    command
}

#[tokio::test]
async fn synchronous_modes_open() {
    for synchronous in [Synchronous::Full, Synchronous::Normal, Synchronous::Off] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let options = Options {
            synchronous,
            readers: 0,
            ..Options::default()
        };
        let store = SqliteStore::open(dir.path().join("idemgate.db"), options).expect("open");
        let r = record("acme:prod:wf-sync:s1", applied("t"));
        store.claim(r.clone(), Vec::new()).await.expect("claim");
        assert_eq!(store.get(&r.key).await.expect("get"), Some(r));
    }
}

/// Another process holding the write lock past `busy_timeout` makes a write `Unavailable`:
/// nothing was written, and the same write succeeds once the lock is free. Reads go on.
#[tokio::test]
async fn a_write_lock_held_elsewhere_is_unavailable() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("idemgate.db");
    let options = Options {
        busy_timeout: std::time::Duration::from_millis(100),
        ..Options::default()
    };
    let store = SqliteStore::open(&path, options).expect("open");
    let before = record("acme:prod:wf-busy:s0", applied("t"));
    store
        .claim(before.clone(), Vec::new())
        .await
        .expect("claim");

    let other = rusqlite::Connection::open(&path).expect("a plain connection");
    other
        .execute_batch("BEGIN IMMEDIATE")
        .expect("the lock is taken");
    let r = record("acme:prod:wf-busy:s1", applied("t"));
    let refused = store.claim(r.clone(), Vec::new()).await;
    assert!(matches!(refused, Err(Error::Unavailable(_))), "{refused:?}");
    assert_eq!(
        store.get(&before.key).await.expect("reads go on"),
        Some(before)
    );
    assert_eq!(store.get(&r.key).await.expect("get"), None);

    other
        .execute_batch("ROLLBACK")
        .expect("the lock is released");
    let answer = store.claim(r.clone(), Vec::new()).await.expect("claim");
    assert_eq!(answer, Claimed::Inserted(r));
}
