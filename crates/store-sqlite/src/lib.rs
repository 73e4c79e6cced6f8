//! idemgate's embedded default store: one SQLite file, zero set-up.
//!
//! Reading order:
//!
//! - [`SqliteStore`] — implements [`idemgate_core::store::Store`]. [`SqliteStore::open`] takes a
//!   path and [`Options`]; the handle is cheap to clone and shared by every task. [`migrate`]
//!   opens a file only to bring its schema up to date and report the versions.
//! - `schema` — versioned migrations of our own (`migrations/*.sql`, embedded), tracked by
//!   `PRAGMA user_version`. A file written by a newer idemgate is refused.
//! - `writer` — **group commit**: one thread of our own owns the only write connection, runs
//!   every write queued meanwhile in one `BEGIN IMMEDIATE` transaction (redone with a savepoint
//!   per write only when one fails after writing), commits once, and only then answers each
//!   caller. The fsync per commit is shared by every write in it; a caller alone commits its
//!   own write on its own thread. [`Stats`] counts commits and commands.
//! - `checkpoint` — the write-ahead log's checkpoints on a thread of their own, woken by the
//!   write connection's WAL hook, instead of inside the writer's commits; the writer only
//!   rewinds the log between batches.
//! - `write` — claim (`INSERT .. ON CONFLICT DO NOTHING`), the claim that first checks for a
//!   duplicate intent, compare-and-set transitions, event appends and the batches of a
//!   retention sweep of one environment (at most [`SWEEP_BATCH`] rows each, one write
//!   transaction at a time), each run inside the writer's transaction; the caller's
//!   task prepares their inputs (`Claim`, `Update`) so that the writer only binds and steps.
//! - `webhooks` — the webhook deduplication table: reads, the dedup upsert, and the guard a
//!   transition caused by an event carries, so the row and the transition commit together.
//! - `audit` — the audit log of operator actions, appended in the transaction of the
//!   transition it records (the chain's head read under the write lock).
//! - the event trace is kept in the operation's own row, one JSON array per entry
//!   (`idemgate_core::trace`).
//! - `readers` and `read` — a small pool of read connections used inline by the caller's task:
//!   in WAL mode reads never wait behind the writer.
//! - `error` — rusqlite errors classified as `store::Error` (`Unavailable`, `Ambiguous`,
//!   `Corrupt`).
//!
//! Several processes may open one file: every write transaction takes SQLite's write lock with
//! `BEGIN IMMEDIATE`, waits up to `busy_timeout` for it, and the unique key decides every claim
//! race whichever process it comes from. A lock that stays taken becomes `Error::Unavailable`.
//!
//! Time in this store is the application's: every timestamp is given by the caller (read from
//! its `Clock`), and SQLite's clock is never consulted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use idemgate_core::audit::{Entry, Sealer};
use idemgate_core::key::OperationKey;
use idemgate_core::record::{Event, Millis, Record, RecordStatus};
use idemgate_core::store::{
    BoxFuture, Cas, Claimed, Due, Error, Filter, Store, SweepReport, Transition, Waiting,
};
use idemgate_core::trace;
use idemgate_core::webhook::{JobMatch, Recorded, WebhookEvent};
use rusqlite::{Connection, OpenFlags};

mod audit;
mod checkpoint;
mod error;
mod read;
mod readers;
mod schema;
mod webhooks;
mod write;
mod writer;

pub use read::{DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT};
pub use schema::SCHEMA_VERSION;
pub use write::SWEEPER;
pub use writer::Stats;

/// Brings the database of `conn` to schema version `version` and no further, by this crate's
/// own migrations: for tests of an upgrade from an older schema, such as another crate's test
/// that kills `idemgate migrate` halfway. A store never opens a file this way.
#[doc(hidden)]
pub fn migrate_to_version_for_tests(
    conn: &rusqlite::Connection,
    version: i64,
) -> Result<(), Error> {
    schema::migrate_to(conn, version)
}

use crate::checkpoint::{Checkpointer, Log};
use crate::error::Context;
use crate::readers::Readers;
use crate::writer::Writer;

/// How hard SQLite works to make a commit durable (`PRAGMA synchronous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Every commit is fsynced before the caller hears back: a committed claim survives a power
    /// loss. The default, because a claim that vanishes after its effect ran is a second effect
    /// waiting to happen.
    #[default]
    Full,
    /// In WAL mode, commits survive a crash of the process but the last ones may be lost on a
    /// power loss or an operating-system crash.
    Normal,
    /// No fsync at all; for tests and benchmarks only.
    Off,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
            Synchronous::Off => "OFF",
        }
    }
}

/// How a [`SqliteStore`] opens its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub synchronous: Synchronous,
    /// The most writes one transaction carries. Larger batches share an fsync among more
    /// callers but hold the write lock longer against other processes.
    pub max_batch: usize,
    /// Read connections in the pool (at least one is opened).
    pub readers: usize,
    /// How long a statement waits for a lock another connection or process holds before it
    /// fails with `Error::Unavailable`.
    pub busy_timeout: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            synchronous: Synchronous::Full,
            max_batch: 128,
            readers: 4,
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// The SQLite store. Clones share one writer thread and one reader pool; the file is closed
/// when the last clone is dropped.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
    /// Seals the audit entries of operator actions; unsigned unless
    /// [`SqliteStore::with_sealer`] gave a key.
    sealer: Sealer,
}

struct Inner {
    // Fields drop in order: the readers and the checkpoint thread close first, so that the
    // writer's connection is the last one and checkpoints the write-ahead log into the main
    // file as it closes.
    readers: Readers,
    /// Held for its `Drop`, which stops the thread before the writer closes.
    _checkpointer: Checkpointer,
    writer: Writer,
    path: PathBuf,
}

/// Statements a connection keeps prepared. The transition statement has a few shapes (request
/// kept, cleared or set; approver; fingerprint; takeover), and each shape is cached.
const STATEMENT_CACHE: usize = 64;

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, switches it to WAL mode, brings its
    /// schema up to date, and starts the writer thread.
    pub fn open(path: impl AsRef<Path>, options: Options) -> Result<SqliteStore, Error> {
        let path = path.as_ref().to_path_buf();
        let shown = path.display().to_string();
        let what = || format!("opening {shown}");

        let mut conn = connect(&path, &options, true).context(what)?;
        // WAL lets readers run beside the writer and makes a commit one sequential append.
        let mode = wal_mode(&conn, options.busy_timeout).context(what)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::Unavailable(format!(
                "opening {shown}: SQLite refused WAL mode (journal_mode is {mode})"
            )));
        }
        conn.pragma_update(None, "synchronous", options.synchronous.pragma())
            .context(what)?;
        // Temporary files on disk while the schema is brought up to date: a migration that
        // rebuilds a table (0010) sorts each of its indexes, and this build keeps temporary
        // files in memory by default (`SQLITE_TEMP_STORE=2`), which would hold a large store's
        // index sorts in memory.
        conn.pragma_update(None, "temp_store", "FILE")
            .context(what)?;
        schema::migrate(&conn).map_err(|e| prefix(&shown, e))?;
        // The statement journals a write transaction keeps (a statement that may stop half way
        // must be undone alone) and the savepoints of a redone batch in memory, named rather
        // than left to how SQLite was built: in files they cost a write system call per
        // journalled page, some 40 µs of system time per operation measured on the writer
        // thread. In memory they cost a copy; they hold at most the pages one batch touches.
        conn.pragma_update(None, "temp_store", "MEMORY")
            .context(what)?;
        // Gathers the planner's statistics where they are missing or stale (bounded work, as
        // SQLite recommends at open for long-lived connections), so that listings choose
        // between the primary key and the listing indexes by the data actually stored.
        conn.execute_batch("PRAGMA optimize = 0x10002")
            .context(what)?;

        let mut conns = Vec::with_capacity(options.readers.max(1));
        for _ in 0..options.readers.max(1) {
            let reader = connect(&path, &options, false).context(what)?;
            // A read connection that cannot write even by mistake: every write goes through the
            // writer thread and its group commit.
            reader
                .pragma_update(None, "query_only", true)
                .context(what)?;
            conns.push(reader);
        }

        // Checkpoints run on a thread of their own, not in the writer's commits (`checkpoint`).
        // Its connection syncs the database file as the writer's syncs the log.
        let copier = connect(&path, &options, false).context(what)?;
        copier
            .pragma_update(None, "synchronous", options.synchronous.pragma())
            .context(what)?;
        let log = Arc::new(Log::default());
        let checkpointer = Checkpointer::spawn(&mut conn, copier, Arc::clone(&log))?;

        let writer = Writer::spawn(conn, options.max_batch, log)?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                readers: Readers::new(conns),
                _checkpointer: checkpointer,
                writer,
                path,
            }),
            sealer: Sealer::unsigned(),
        })
    }

    /// This store, sealing audit entries with `sealer` (a signing key, or unsigned).
    pub fn with_sealer(mut self, sealer: Sealer) -> SqliteStore {
        self.sealer = sealer;
        self
    }

    /// The schema version of the file (`PRAGMA user_version`): [`SCHEMA_VERSION`] once open.
    pub fn schema_version(&self) -> Result<i64, Error> {
        self.read(|conn| {
            conn.pragma_query_value(None, "user_version", |r| r.get(0))
                .context(|| "reading the schema version".into())
        })
    }

    /// The file this store writes.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// What the writer has committed so far: with group commit, fewer commits than commands.
    pub fn stats(&self) -> Stats {
        self.inner.writer.stats()
    }

    fn read<T>(&self, read: impl FnOnce(&Connection) -> Result<T, Error>) -> Result<T, Error> {
        self.inner.readers.with(read)
    }

    /// One step of a sweep (`write::purge` or `write::compact`) over at most `limit` rows, as
    /// writer commands of at most [`SWEEP_BATCH`] rows and some 20 ms of work each, one after
    /// the other, until a batch finds fewer rows than it may take. Every command is a write transaction of its own (or
    /// shares one with the writes queued beside it), so the sweep holds the file's write lock
    /// for one batch at a time and claims and transitions run between its batches. A failure
    /// ends the sweep; what its earlier batches did stays done, and the next sweep carries on.
    async fn in_batches(
        &self,
        environment: &str,
        now: Millis,
        limit: usize,
        step: fn(&mut writer::Tx<'_>, &str, Millis, usize) -> Result<write::Batch, Error>,
    ) -> Result<u64, Error> {
        let mut done = 0;
        while done < limit as u64 {
            let take = (limit - done as usize).min(SWEEP_BATCH);
            let environment = environment.to_string();
            let batch = self
                .inner
                .writer
                .submit(move |tx| step(tx, &environment, now, take))
                .await?;
            done += batch.done;
            if !batch.more {
                break;
            }
        }
        Ok(done)
    }
}

/// The most rows of each kind one write transaction of a sweep purges or compacts. A batch
/// also stops after 20 ms of work, which on a large file whose pages must be read from disk
/// comes first (docs/benchmarks/history.md, "Cost as the store grows"): a claim never waits
/// behind more than one batch and a commit.
pub const SWEEP_BATCH: usize = 256;

/// What [`migrate`] found and left: schema versions, 0 for a new file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    pub from: i64,
    pub to: i64,
}

/// Brings the file at `path` to this build's schema, creating it when missing, exactly as
/// opening it as a store does, and reports the version it was at and the version it is at now
/// (`idemgate migrate`). Running it again is a no-op that reports the same version twice.
pub fn migrate(path: impl AsRef<Path>, options: Options) -> Result<Migration, Error> {
    let path = path.as_ref();
    let shown = path.display().to_string();
    let from = if path.exists() {
        // Without CREATE, and closed before the store opens the file: only the header is read.
        let conn = connect(path, &options, false).context(|| format!("opening {shown}"))?;
        conn.pragma_query_value(None, "user_version", |r| r.get(0))
            .context(|| format!("reading the schema version of {shown}"))?
    } else {
        0
    };
    let store = SqliteStore::open(path, options)?;
    let to = store.schema_version()?;
    Ok(Migration { from, to })
}

fn connect(path: &Path, options: &Options, create: bool) -> rusqlite::Result<Connection> {
    // NO_MUTEX: each connection is used by one thread at a time (the writer thread, or a
    // reader under its mutex), so SQLite's own per-connection mutex would be pure overhead.
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(options.busy_timeout)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// Switches the file to WAL and returns the journal mode it is in. On a new file several
/// processes may do this at the same moment; the switch takes an exclusive lock, and SQLite
/// answers "busy" at once (without its busy handler, which could deadlock here) to all but one,
/// so the switch is retried until `patience` has passed.
fn wal_mode(conn: &Connection, patience: Duration) -> rusqlite::Result<String> {
    let started = std::time::Instant::now();
    loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && started.elapsed() < patience =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

fn prefix(file: &str, e: Error) -> Error {
    match e {
        Error::Unavailable(m) => Error::Unavailable(format!("opening {file}: {m}")),
        Error::Ambiguous(m) => Error::Ambiguous(format!("opening {file}: {m}")),
        Error::Corrupt(m) => Error::Corrupt(format!("opening {file}: {m}")),
        other => other,
    }
}

impl SqliteStore {
    async fn claim_record(&self, record: Record, events: Vec<Event>) -> Result<Claimed, Error> {
        // Shared with the command rather than cloned by it: the writer drops its share before
        // answering, so an inserted record comes back here without a copy.
        let claim = Arc::new(write::Claim::new(record, &events));
        let work = Arc::clone(&claim);
        let run = move |tx: &mut writer::Tx<'_>| write::claim(tx, &work);
        let existing = self.inner.writer.submit(run).await?;
        Ok(match existing {
            Some(existing) => Claimed::Existing(read::record(existing)?),
            None => Claimed::Inserted(
                Arc::try_unwrap(claim).map_or_else(|c| c.record.clone(), |c| c.record),
            ),
        })
    }
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Store for SqliteStore {
    fn get<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async move {
            // While callers come one at a time, the writer's connection is free, and its page
            // cache holds what it wrote last (unless another process wrote since), where a
            // reader's cache was discarded by that write: the lookup reads no page from the
            // file.
            if let Some(conn) = self.inner.writer.idle_connection() {
                return read::get(&conn, key);
            }
            self.read(|conn| read::get(conn, key))
        })
    }

    fn claim(&self, record: Record, events: Vec<Event>) -> BoxFuture<'_, Result<Claimed, Error>> {
        Box::pin(self.claim_record(record, events))
    }

    // Every claim goes through the one writer thread: claiming a replay's key there, instead
    // of reading it from a reader connection, would queue every replay behind the writes.
    fn claim_replaces_read(&self) -> bool {
        false
    }

    fn claim_unless_duplicate(
        &self,
        record: Record,
        events: Vec<Event>,
        since: Millis,
    ) -> BoxFuture<'_, Result<Claimed, Error>> {
        let claim = Arc::new(write::Claim::new(record, &events));
        let work = Arc::clone(&claim);
        Box::pin(async move {
            // One command: the check and the insert share the writer's transaction, which makes
            // them one atomic step (see `write::claim_unless_duplicate`).
            let found = self
                .inner
                .writer
                .submit(move |tx| write::claim_unless_duplicate(tx, &work, since))
                .await?;
            Ok(match found {
                write::Guarded::Inserted => Claimed::Inserted(
                    Arc::try_unwrap(claim).map_or_else(|c| c.record.clone(), |c| c.record),
                ),
                write::Guarded::Existing(existing) => Claimed::Existing(read::record(*existing)?),
                write::Guarded::Duplicate(other) => {
                    Claimed::DuplicateIntent(OperationKey::parse(&other).map_err(|e| {
                        Error::Corrupt(format!("stored key `{other}` is malformed: {e}"))
                    })?)
                }
            })
        })
    }

    fn transition(&self, transition: Transition) -> BoxFuture<'_, Result<Cas, Error>> {
        let update = Arc::new(write::Update::new(&transition));
        let work = Arc::clone(&update);
        let sealer = self.sealer.clone();
        Box::pin(async move {
            self.inner
                .writer
                .submit(move |tx| write::transition(tx, &work, &sealer))
                .await?
                .decode(update)
        })
    }

    fn audit_log(&self, after: u64, limit: usize) -> BoxFuture<'_, Result<Vec<Entry>, Error>> {
        Box::pin(async move { self.read(|conn| audit::after(conn, after, limit)) })
    }

    fn append_events<'a>(
        &'a self,
        key: &'a OperationKey,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let (key, entries) = (key.clone(), trace::encode(&events));
        Box::pin(
            self.inner
                .writer
                .submit(move |tx| write::append(tx, &key, &entries)),
        )
    }

    fn events<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Vec<Event>, Error>> {
        Box::pin(async move { self.read(|conn| read::events(conn, key)) })
    }

    fn list(&self, filter: Filter) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        Box::pin(async move { self.read(|conn| read::list(conn, &filter)) })
    }

    fn count<'a>(
        &'a self,
        environment: &'a str,
        status: RecordStatus,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(async move { self.read(|conn| read::count(conn, environment, status)) })
    }

    fn due(&self, query: Due) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        Box::pin(async move { self.read(|conn| read::due(conn, &query)) })
    }

    fn waiting(&self, query: Waiting) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        Box::pin(async move { self.read(|conn| read::waiting(conn, &query)) })
    }

    fn sweep<'a>(
        &'a self,
        environment: &'a str,
        now: Millis,
        limit: usize,
    ) -> BoxFuture<'a, Result<SweepReport, Error>> {
        Box::pin(async move {
            // Purge first, so that a record compacted by this sweep keeps its tombstone at
            // least until the next one: a late arrival gets one sweep interval to meet it.
            let purged = self
                .in_batches(environment, now, limit, write::purge)
                .await?;
            let compacted = self
                .in_batches(environment, now, limit, write::compact)
                .await?;
            Ok(SweepReport { compacted, purged })
        })
    }

    fn webhook<'a>(
        &'a self,
        source: &'a str,
        event_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<WebhookEvent>, Error>> {
        Box::pin(async move { self.read(|conn| webhooks::get(conn, source, event_id)) })
    }

    fn record_webhook(&self, event: WebhookEvent) -> BoxFuture<'_, Result<Recorded, Error>> {
        let row = webhooks::Row::new(&event);
        let (source, event_id) = (event.source, event.event_id);
        Box::pin(async move {
            self.inner
                .writer
                .submit(move |tx| {
                    if webhooks::upsert(tx, &row)? {
                        return Ok(Recorded::Written);
                    }
                    match webhooks::get_in(tx, &source, &event_id)? {
                        Some(existing) => Ok(Recorded::Exists(Box::new(existing))),
                        None => Err(Error::Corrupt(format!(
                            "webhook event {event_id} of source {source} was neither written \
                             nor found"
                        ))),
                    }
                })
                .await
        })
    }

    fn webhooks_for_job<'a>(
        &'a self,
        tenant: &'a str,
        job_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<WebhookEvent>, Error>> {
        Box::pin(async move { self.read(|conn| webhooks::for_job(conn, tenant, job_id)) })
    }

    fn open_jobs<'a>(&'a self, m: JobMatch<'a>) -> BoxFuture<'a, Result<Vec<Record>, Error>> {
        Box::pin(async move { self.read(|conn| webhooks::open_jobs(conn, m)) })
    }

    fn sweep_webhooks(&self, now: Millis, limit: usize) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(
            self.inner
                .writer
                .submit(move |tx| webhooks::sweep(tx, now, limit)),
        )
    }
}

#[cfg(test)]
mod tests {
    use idemgate_core::fingerprint::Fingerprint;
    use idemgate_core::key::OperationKey;
    use idemgate_core::record::{
        Dispatch, Event, EventKind, Lease, Receipt, RecordState, RecordStatus,
    };
    use idemgate_core::store::{Expect, Expiry, Filter, RequestUpdate, Transition};
    use rusqlite::Connection;

    use super::{read, schema, write};

    fn migrated() -> Connection {
        let conn = Connection::open_in_memory().expect("an in-memory database");
        schema::migrate(&conn).expect("the schema applies");
        conn
    }

    /// The query plan SQLite picks for `sql` (every parameter NULL), one line per step.
    fn plan(conn: &Connection, sql: &str) -> String {
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("the query prepares");
        let nulls = vec![rusqlite::types::Null; stmt.parameter_count()];
        let steps = stmt
            .query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))
            .expect("the plan runs")
            .collect::<rusqlite::Result<Vec<_>>>()
            .expect("the plan reads");
        steps.join("\n")
    }

    /// The query plan of a listing with its own values, one line per step.
    fn listing_plan(conn: &Connection, sql: &str, values: Vec<rusqlite::types::Value>) -> String {
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("the listing prepares");
        stmt.query_map(rusqlite::params_from_iter(values), |r| {
            r.get::<_, String>(3)
        })
        .expect("the plan runs")
        .collect::<rusqlite::Result<Vec<_>>>()
        .expect("the plan reads")
        .join("\n")
    }

    /// The opcodes of `sql` (with every parameter NULL).
    fn program(conn: &Connection, sql: &str) -> Vec<String> {
        let mut stmt = conn
            .prepare(&format!("EXPLAIN {sql}"))
            .expect("the statement prepares");
        let nulls = vec![rusqlite::types::Null; stmt.parameter_count()];
        stmt.query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(1))
            .expect("the program lists")
            .collect::<rusqlite::Result<Vec<_>>>()
            .expect("the program reads")
    }

    /// The shapes of transition the executor sends most: the owner's finalise (settling, with
    /// an expiry, the request cleared, events), an approval, a takeover, an operator's new
    /// fingerprint.
    fn transitions() -> Vec<Transition> {
        let key = OperationKey::parse("acme:prod:wf:s1").expect("a valid key");
        let fingerprint =
            Fingerprint::parse(&format!("sha256:{}", "b".repeat(64))).expect("a fingerprint");
        let pending = RecordState::Pending {
            lease: Lease {
                owner: Some("w1".into()),
                expires_at: 30_000,
            },
            dispatch: Dispatch::NotSent,
        };
        let base = Transition {
            key,
            expect: Expect {
                fence: 1,
                status: RecordStatus::Pending,
                created_at: 0,
                lease_expired_by: None,
                dispatch: None,
            },
            next: pending.clone(),
            fence: 1,
            request: RequestUpdate::Keep,
            approved_by: None,
            fingerprint: None,
            expiry: None,
            events: Vec::new(),
            now: 1_000,
            webhook: None,
            audit: None,
        };
        let finalise = Transition {
            next: RecordState::Applied(Receipt {
                reference: "ticket-1".into(),
                result: serde_json::json!({"id": 1}),
            }),
            request: RequestUpdate::Clear,
            expiry: Some(Expiry {
                expires_at: 90_000,
                purge_at: 180_000,
            }),
            events: vec![Event::new(EventKind::Committed, 1_000, 1, "w1")],
            ..base.clone()
        };
        let approval = Transition {
            expect: Expect {
                status: RecordStatus::AwaitingApproval,
                ..base.expect.clone()
            },
            approved_by: Some("operator".into()),
            ..base.clone()
        };
        let takeover = Transition {
            expect: Expect {
                lease_expired_by: Some(1_000),
                ..base.expect.clone()
            },
            fence: 2,
            ..base.clone()
        };
        let reconcile = Transition {
            fingerprint: Some(fingerprint),
            request: RequestUpdate::Set(serde_json::json!({"a": 1})),
            ..base
        };
        vec![finalise, approval, takeover, reconcile]
    }

    #[test]
    fn claims_and_transitions_build_no_temporary_tables() {
        // A temporary table per statement (an IN list in a partial index's condition, or
        // RETURNING) cost the single writer thread a fifth of its instructions.
        let conn = migrated();
        let updates: Vec<write::Update> = transitions().iter().map(write::Update::new).collect();
        let statements = [write::CLAIM, write::DUPLICATE, read::GET]
            .into_iter()
            .chain(updates.iter().map(write::Update::sql));
        for sql in statements {
            let program = program(&conn, sql);
            assert!(
                !program.iter().any(|op| op == "OpenEphemeral"),
                "{sql}\n{program:?}"
            );
        }
    }

    #[test]
    fn listings_by_status_read_an_index_in_key_order() {
        let conn = migrated();
        for (status, environment) in RecordStatus::ALL
            .into_iter()
            .flat_map(|s| [(s, None), (s, Some("prod".to_string()))])
        {
            let filter = Filter {
                tenant: Some("acme".into()),
                environment: environment.clone(),
                status: Some(status),
                tool: Some("tickets.create".into()),
                after: Some("acme:prod:wf:a".into()),
                limit: 10,
            };
            let (sql, values) = read::list_query(&filter);
            let plan = listing_plan(&conn, &sql, values);
            // Pending and applied rows are not in the listing index; every other status is, and
            // a listing of it must not scan the table. Pending rows are read from the due
            // index, a range of it when the environment is given; applied rows in key order
            // from the primary key, from the page's first key on.
            let index = match (status, &environment) {
                (RecordStatus::Pending, None) => "USING INDEX operations_due",
                (RecordStatus::Pending, Some(_)) => "USING INDEX operations_due (environment=?)",
                (RecordStatus::Applied, _) => {
                    "USING INDEX sqlite_autoindex_operations_1 (tenant=? AND key>?)"
                }
                (
                    RecordStatus::AwaitingApproval
                    | RecordStatus::FailedPermanent
                    | RecordStatus::Unknown
                    | RecordStatus::Tombstone,
                    _,
                ) => "USING INDEX operations_list_by_tenant (tenant=? AND status=? AND tool=?",
            };
            assert!(plan.contains(index), "{status:?}: {sql}\n{plan}");
            // Only the pending rows, the few in flight, are sorted; every other listing reads
            // its page in order and stops after it.
            if status != RecordStatus::Pending {
                assert!(!plan.contains("TEMP B-TREE"), "{status:?}: {sql}\n{plan}");
            }
        }
    }

    #[test]
    fn a_queue_without_a_tool_reads_its_first_page_in_key_order() {
        let conn = migrated();
        for status in [
            RecordStatus::Unknown,
            RecordStatus::AwaitingApproval,
            RecordStatus::FailedPermanent,
            RecordStatus::Tombstone,
        ] {
            for after in [None, Some("acme:prod:wf:a".to_string())] {
                let filter = Filter {
                    tenant: Some("acme".into()),
                    environment: Some("prod".into()),
                    status: Some(status),
                    tool: None,
                    after: after.clone(),
                    limit: 0,
                };
                let (sql, values) = read::list_query(&filter);
                let plan = listing_plan(&conn, &sql, values);
                let range = match after {
                    None => "(tenant=? AND environment=? AND status=?)",
                    Some(_) => "(tenant=? AND environment=? AND status=? AND key>?)",
                };
                assert!(
                    plan.contains(&format!("USING INDEX operations_queue {range}")),
                    "{status:?}: {sql}\n{plan}"
                );
                assert!(!plan.contains("TEMP B-TREE"), "{status:?}: {sql}\n{plan}");
            }
        }
    }

    #[test]
    fn maintenance_queries_read_only_their_partial_indexes() {
        let conn = migrated();
        for (sql, index) in [
            (
                read::DUE,
                "INDEX operations_due (environment=? AND lease_expires_at<?)",
            ),
            (
                read::DUE_AFTER,
                "INDEX operations_due (environment=? AND (lease_expires_at,key)>(?,?) \
                 AND lease_expires_at<?)",
            ),
            (
                write::COMPACTABLE,
                "INDEX operations_expiring (environment=? AND expires_at<?)",
            ),
            (
                write::PURGEABLE,
                "INDEX operations_purgeable (environment=? AND purge_at<?)",
            ),
            (
                write::DUPLICATE,
                "INDEX operations_fingerprint (tenant=? AND tool=? AND fingerprint=? \
                 AND created_at>?)",
            ),
        ] {
            let plan = plan(&conn, sql);
            assert!(plan.contains(index), "{sql}\n{plan}");
            // Each reads its index in the answer's order and stops at the limit.
            assert!(!plan.contains("TEMP B-TREE"), "{sql}\n{plan}");
        }
    }
}
