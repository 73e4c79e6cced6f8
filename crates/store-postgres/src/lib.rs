//! idemgate's PostgreSQL store: any number of stateless gateway processes share one database,
//! and the database's unique key resolves every race between them.
//!
//! Reading order:
//!
//! - [`PgStore`] and [`Options`] — a pool of connections ([`PgStore::connect`]) that implements
//!   [`idemgate_core::store::Store`]; connecting applies the schema migrations.
//! - `sql` — the text of every statement and why each is safe at READ COMMITTED: a claim is one
//!   `INSERT … ON CONFLICT DO NOTHING` that also reads the existing row, a transition is one
//!   fenced conditional `UPDATE`, and the events of either are appended by the same statement.
//!   The one explicit transaction is the claim under a duplicate-intent window
//!   ([`Store::claim_unless_duplicate`]): an advisory lock on the request, the check, then the
//!   claim.
//! - `batch` — concurrent claims, and concurrent transitions, carried by multi-row statements
//!   (on by default, [`Options::batching`]): each caller answered after the commit of the
//!   statement that held its row, a lone caller sent at once, and every guarantee of the
//!   single-row statements kept.
//! - `audit` — the audit log of operator actions: a transition that carries an entry runs in
//!   an explicit transaction that locks the chain's head row after the update applied.
//! - `conn` — pool checkout, client-side deadlines, and the rules that classify a failure as
//!   `Unavailable` (nothing changed) or `Ambiguous` (a write may have committed).
//! - [`migrate`] — embedded, versioned migrations applied under an advisory lock;
//!   [`PgStore::migrate_url`] applies them alone and reports the versions ([`Migration`]).
//! - `testing` (feature `testing`) — a throwaway database per test run, shared with other
//!   crates' tests.
//!
//! **Plans.** The hot statements (read by key, claim, transition, and their batch forms) are
//! prepared once per connection and run on PostgreSQL's cached generic plan, which the schema
//! and the statements make a lookup by key whatever the table's statistics — even when it is
//! cached while the table is empty (see `PgStore::connect` and migration 0002). Statements
//! whose best plan depends on their values (listing, the due scan, the sweep, the
//! duplicate-intent check, the trace) are planned for their values on every call.
//!
//! **Time comes from the caller.** Lease expiries, sweeps and recovery compare the `now` the
//! executor passes (read from its injected clock) with stored times; the database clock is never
//! consulted, so a simulation can drive every decision. The price: every gateway host sharing a
//! database must keep its clock synchronised (NTP) to well within one lease length, or a host
//! whose clock runs ahead will take over leases that are still live elsewhere.

mod audit;
mod batch;
mod conn;
pub mod migrate;
mod sql;
#[cfg(feature = "testing")]
pub mod testing;
mod webhooks;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use idemgate_core::audit::{Draft, Entry, Sealer};
use idemgate_core::key::OperationKey;
use idemgate_core::record::{Event, Millis, Record, RecordStatus, Row};
use idemgate_core::store::{
    self, BoxFuture, Cas, Claimed, Due, Expiry, Filter, RequestUpdate, Store, SweepReport,
    Transition, Waiting, WaitingOn,
};
use idemgate_core::trace;
use idemgate_core::webhook::{JobMatch, Recorded, WebhookEvent};
use tokio_postgres::NoTls;
use tokio_postgres::types::{ToSql, Type};

use crate::batch::{Batcher, ClaimJob, Reply, TransitionJob};
use crate::conn::{Conn, Kind};

/// What an explicit transaction writes beside a transition's fenced update: a webhook event's
/// row, an audit entry, or both (an event that settles an `unknown` record is evidence, and
/// audited).
struct Beside {
    webhook: Option<WebhookEvent>,
    audit: Option<Draft>,
}

/// What [`PgStore::migrate_url`] found and left: schema versions, 0 for an empty database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    pub from: i32,
    pub to: i32,
}

/// How a [`PgStore`] connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Connections kept per process for reads and single statements. Each gateway process has
    /// its own pool, so the database sees (`pool_size` + `batch_in_flight` when batching) ×
    /// processes connections at most.
    pub pool_size: usize,
    /// Set on every connection as PostgreSQL's `statement_timeout`, so the server itself
    /// cancels a statement that runs too long (a cancelled write changed nothing). The client
    /// waits two seconds longer for an answer before it gives the connection up. Zero disables
    /// both.
    pub statement_timeout: Duration,
    /// Bounds opening a connection and waiting for a free one in the pool.
    pub connect_timeout: Duration,
    /// Carries concurrent claims, and concurrent transitions, in multi-row statements (see
    /// the `batch` module): each caller is still answered after the commit that holds its row,
    /// and a lone caller is sent at once, alone. Off, every claim and transition is its own
    /// statement.
    pub batching: bool,
    /// With `batching`, how many batch statements may run at once, each on a connection of a
    /// pool of this size kept for them. Batches form while all of them are busy, so fewer
    /// means larger batches. The default, 2, measured a third less PostgreSQL CPU per call
    /// than 4 through the gateway at 32 connections (BENCHMARKS.md), and no loss at 8.
    pub batch_in_flight: usize,
    /// With `batching`, the most rows one batch statement carries.
    pub batch_max_rows: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            pool_size: 16,
            statement_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            batching: true,
            batch_in_flight: 2,
            batch_max_rows: 64,
        }
    }
}

/// How much longer than `statement_timeout` the client waits before it declares the connection
/// lost: enough for the server's own cancellation to arrive as an ordinary error, which is
/// unambiguous, instead of the client timing out, which is not.
const DEADLINE_GRACE: Duration = Duration::from_secs(2);

/// Planner settings of every connection (see `PgStore::connect` for why).
const PLANNER_SETTINGS: &[(&str, &str)] = &[("enable_seqscan", "off")];

/// Written as the worker of the `expired` events the sweep appends.
const SWEEPER: &str = "sweeper";

/// The most rows of each kind one statement of a sweep purges or compacts.
pub const SWEEP_BATCH: usize = 1000;

/// Listing page size when the filter asks for none, and the most a page may hold.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// The PostgreSQL store. Cheap to clone: clones share one pool.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    deadline: Option<Duration>,
    batcher: Option<Arc<Batcher>>,
    /// Seals operator actions' audit entries; unsigned unless [`PgStore::with_sealer`] gave a
    /// key.
    sealer: Sealer,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The pool's configuration holds the password; it is deliberately not printed.
        f.debug_struct("PgStore")
            .field("status", &self.pool.status())
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Builds the pool for `url` (a `postgres://` URL or a `key=value` string) and applies the
    /// migrations the database lacks. Fails with `Unavailable` when the database cannot be
    /// reached or its schema is newer than this build.
    pub async fn connect(url: &str, options: Options) -> Result<PgStore, store::Error> {
        let store = PgStore::build(url, options)?;
        store.migrate().await?;
        Ok(store)
    }

    /// Brings the database at `url` up to this build's schema and reports the version it was
    /// at and the version it is at now (`idemgate migrate`). Running it again is a no-op that
    /// reports the same version twice.
    pub async fn migrate_url(url: &str, options: Options) -> Result<Migration, store::Error> {
        let store = PgStore::build(url, options)?;
        let from = store.schema_version().await?;
        let to = store.migrate().await?;
        Ok(Migration { from, to })
    }

    /// The schema version the database is at: 0 before the first migration.
    pub async fn schema_version(&self) -> Result<i32, store::Error> {
        let mut conn = self.conn().await?;
        let failed = |e: tokio_postgres::Error| {
            store::Error::Unavailable(format!(
                "reading the schema version: {}",
                conn::describe(&e)
            ))
        };
        let client = conn.client_mut();
        // The version table is created by the first migration run; until then there is none.
        let table = client
            .query_one(
                "SELECT to_regclass('idemgate_schema_version') IS NOT NULL",
                &[],
            )
            .await
            .map_err(failed)?;
        if !table.get::<_, bool>(0) {
            return Ok(0);
        }
        let row = client
            .query_one(
                "SELECT COALESCE(MAX(version), 0) FROM idemgate_schema_version",
                &[],
            )
            .await
            .map_err(failed)?;
        Ok(row.get(0))
    }

    /// The pool for `url`, without touching the schema.
    fn build(url: &str, options: Options) -> Result<PgStore, store::Error> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| store::Error::Unavailable(format!("invalid database URL: {e}")))?;
        config.connect_timeout(options.connect_timeout);
        if config.get_application_name().is_none() {
            config.application_name("idemgate");
        }
        // Keepalives notice a peer that vanished without closing the socket; the client-side
        // deadline covers a statement in flight, these cover idle pooled connections.
        config.keepalives(true);
        config.keepalives_idle(Duration::from_secs(30));
        // The settings travel in the startup packet, so they cost no round trip, and override
        // what the server, the database or the role were configured with. The isolation level
        // is pinned because every statement's correctness argument (see `sql`) is made for READ
        // COMMITTED. `synchronous_commit` is pinned on because a caller is told a claim or a
        // transition happened once it committed, and then acts on it (sends the effect): with
        // `off`, a common tuning for throughput, a commit is acknowledged before its WAL is
        // flushed, and a crash of the database server can lose it — a claim gone after its
        // effect ran is a second effect waiting for the next delivery.
        //
        // No sequential scans: the hot statements (read, claim, transition) keep the generic
        // plan PostgreSQL caches per connection, and a generic plan made while `operations` is
        // empty (a fresh database, a TRUNCATE, a VACUUM after everything was purged) is kept
        // until the next analyse. On an empty table a sequential scan costs nothing, so it
        // would be that plan — and then read the whole table on every lookup as the table
        // grows. Every statement here has an index that serves it, so this only removes the
        // plan that is right for a few rows and ruinous for millions. Which index the cached
        // plan uses is settled by the schema instead (migration 0002: the only indexes a lookup
        // by key can use are lookups by key). The statements whose best plan depends on their
        // values are planned afresh on each call (`Conn::run_planned`).
        let mut startup = config.get_options().map(str::to_string).unwrap_or_default();
        if !startup.is_empty() {
            startup.push(' ');
        }
        startup.push_str(&format!(
            "-c statement_timeout={} -c default_transaction_isolation=read\\ committed \
             -c synchronous_commit=on",
            options.statement_timeout.as_millis()
        ));
        for (name, value) in PLANNER_SETTINGS {
            startup.push_str(&format!(" -c {name}={value}"));
        }
        // The batch statements get connections of their own (see `batch`), which always use
        // the generic plan: their plans are lookups by key whatever the statistics (the
        // `plans` test checks it), while a custom plan of a statement carrying 64 rows costs
        // milliseconds, and PostgreSQL's own choice between the two compares estimates that
        // differ here only by how many rows it guesses an array holds.
        let mut batch_config = config.clone();
        batch_config.options(format!("{startup} -c plan_cache_mode=force_generic_plan"));
        config.options(startup);

        let build = |config: tokio_postgres::Config, size: usize| {
            // Fast recycling checks only that the connection is still open, with no round
            // trip. After a database restart the old connections are closed by the server's
            // goodbye, fail that check, and are replaced by new ones on the next checkout: the
            // pool heals itself.
            let manager = Manager::from_config(
                config,
                NoTls,
                ManagerConfig {
                    recycling_method: RecyclingMethod::Fast,
                },
            );
            Pool::builder(manager)
                .max_size(size.max(1))
                .runtime(Runtime::Tokio1)
                .wait_timeout(Some(options.connect_timeout))
                .create_timeout(Some(options.connect_timeout))
                .recycle_timeout(Some(options.connect_timeout))
                .build()
                .map_err(|e| {
                    store::Error::Unavailable(format!("cannot build the connection pool: {e}"))
                })
        };
        let pool = build(config, options.pool_size)?;
        let deadline = (!options.statement_timeout.is_zero())
            .then(|| options.statement_timeout + DEADLINE_GRACE);
        let batcher = if options.batching {
            let in_flight = options.batch_in_flight.max(1);
            let pool = build(batch_config, in_flight)?;
            Some(Arc::new(Batcher::new(
                pool,
                deadline,
                in_flight,
                options.batch_max_rows,
            )))
        } else {
            None
        };
        Ok(PgStore {
            pool,
            deadline,
            batcher,
            sealer: Sealer::unsigned(),
        })
    }

    /// Applies the migrations the database lacks and returns the schema version. Safe to call
    /// from many processes at once: they serialise on an advisory lock and migrate once.
    pub async fn migrate(&self) -> Result<i32, store::Error> {
        let mut conn = self.conn().await?;
        migrate::migrate(&mut conn).await
    }

    async fn conn(&self) -> Result<Conn, store::Error> {
        conn::checkout(&self.pool, self.deadline).await
    }

    async fn get_record(&self, key: &OperationKey) -> Result<Option<Record>, store::Error> {
        let mut conn = self.conn().await?;
        get_with(&mut conn, key).await
    }

    /// Multi-row statements sent by the batcher so far, and the rows they carried; `(0, 0)`
    /// without batching. Single-row statements (a lone caller) are not counted.
    pub fn batch_stats(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.batcher.as_ref().map_or((0, 0), |b| {
            (b.statements.load(Relaxed), b.rows.load(Relaxed))
        })
    }

    async fn claim_record(
        &self,
        record: Record,
        events: Vec<Event>,
    ) -> Result<Claimed, store::Error> {
        let Some(batcher) = &self.batcher else {
            return self.claim_single(record, events).await;
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = ClaimJob {
            record: record.clone(),
            events: events.clone(),
            reply,
        };
        batch::submit_claim(self, batcher, job);
        match answer.await {
            Ok(Reply::Done(answer)) => answer,
            // Undecided by the batch, which changed nothing for this claim: the single
            // statement decides it.
            Ok(Reply::Alone | Reply::Lost) => self.claim_single(record, events).await,
            // The driver ended without answering (its task panicked, or was dropped with the
            // runtime shutting down); whether the batch was sent is not known.
            Err(_) => Err(store::Error::Ambiguous(
                "the batch carrying this claim ended without an answer".into(),
            )),
        }
    }

    async fn claim_single(
        &self,
        record: Record,
        events: Vec<Event>,
    ) -> Result<Claimed, store::Error> {
        let row = Row::from_record(&record);
        let ev = trace::encode(&events);
        let mut conn = self.conn().await?;
        claim_with(&mut conn, Kind::Write, &record, &row, &ev).await
    }

    async fn apply(&self, mut t: Transition) -> Result<Cas, store::Error> {
        if t.webhook.is_some() || t.audit.is_some() {
            let beside = Beside {
                webhook: t.webhook.take(),
                audit: t.audit.take(),
            };
            return self.transition_beside(t, beside).await;
        }
        let Some(batcher) = &self.batcher else {
            return self.transition_single(t).await;
        };
        let key = t.key.clone();
        let (reply, answer) = tokio::sync::oneshot::channel();
        // Kept for the fall-back; a transition is small next to a round trip.
        let fallback = t.clone();
        batch::submit_transition(
            self,
            batcher,
            TransitionJob {
                transition: t,
                reply,
            },
        );
        match answer.await {
            Ok(Reply::Done(answer)) => answer,
            // The batch committed without this row: its expectation no longer held, and the
            // caller decides from the record as it now is (read after that commit).
            Ok(Reply::Lost) => Ok(Cas::Lost(self.get_record(&key).await?)),
            // The batch changed nothing: the single statement decides.
            Ok(Reply::Alone) => self.transition_single(fallback).await,
            Err(_) => Err(store::Error::Ambiguous(
                "the batch carrying this transition ended without an answer".into(),
            )),
        }
    }

    /// This store, sealing audit entries with `sealer` (a signing key, or unsigned).
    pub fn with_sealer(mut self, sealer: Sealer) -> PgStore {
        self.sealer = sealer;
        self
    }

    async fn transition_single(&self, t: Transition) -> Result<Cas, store::Error> {
        let mut conn = self.conn().await?;
        match transition_with(&mut conn, Kind::Write, &t).await? {
            Some(record) => Ok(Cas::Done(record)),
            // The expectation no longer held. The caller decides from the current record.
            None => Ok(Cas::Lost(get_with(&mut conn, &t.key).await?)),
        }
    }

    /// A transition that writes rows beside the fenced update, in one explicit transaction,
    /// never batched: a webhook event's deduplication row first (so concurrent deliveries of
    /// one event queue on it; a decided row writes nothing and the transition is `Lost`), and
    /// an audited action's entry after the update applied (the chain's head locked, the
    /// entry sealed after it and inserted, the head moved — the head's lock serialises
    /// appenders across every gateway of the database). Either failing rolls both back.
    async fn transition_beside(&self, t: Transition, beside: Beside) -> Result<Cas, store::Error> {
        let mut conn = self.conn().await?;
        // Until COMMIT nothing is durable: every statement before it runs as a read.
        conn.control(Kind::Read, "BEGIN").await?;
        let applied = async {
            if let Some(event) = &beside.webhook
                && !webhooks::upsert(&mut conn, Kind::Read, event).await?
            {
                return Ok(None);
            }
            let Some(record) = transition_with(&mut conn, Kind::Read, &t).await? else {
                return Ok(None);
            };
            if let Some(draft) = &beside.audit {
                audit::append(&mut conn, draft, &self.sealer).await?;
            }
            Ok::<_, store::Error>(Some(record))
        }
        .await;
        match applied {
            Ok(Some(record)) => {
                conn.control(Kind::Write, "COMMIT").await?;
                Ok(Cas::Done(record))
            }
            // The expectation no longer held (or the event was decided): nothing was written.
            Ok(None) => {
                conn.roll_back().await;
                Ok(Cas::Lost(get_with(&mut conn, &t.key).await?))
            }
            Err(e) => {
                conn.roll_back().await;
                Err(e)
            }
        }
    }
}

impl PgStore {
    async fn append(&self, key: &OperationKey, events: Vec<Event>) -> Result<(), store::Error> {
        if events.is_empty() {
            return Ok(());
        }
        let ev = trace::encode(&events);
        let mut conn = self.conn().await?;
        conn.run(
            Kind::Write,
            sql::APPEND_EVENTS,
            &[&key.tenant(), &key.as_str(), &ev],
        )
        .await?;
        Ok(())
    }

    async fn trace(&self, key: &OperationKey) -> Result<Vec<Event>, store::Error> {
        let mut conn = self.conn().await?;
        let rows = conn
            .run_planned(
                Kind::Read,
                sql::EVENTS,
                &[(&key.tenant(), Type::TEXT), (&key.as_str(), Type::TEXT)],
            )
            .await?;
        match rows.first() {
            None => Ok(Vec::new()),
            Some(r) => {
                let text: String = r.try_get(0).map_err(|e| {
                    store::Error::Corrupt(format!("the trace of {key} is unreadable: {e}"))
                })?;
                trace::decode(key, &text)
            }
        }
    }

    async fn list_records(&self, filter: Filter) -> Result<Vec<Record>, store::Error> {
        let limit = match filter.limit {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE),
        } as i64;
        let status = filter.status.map(|s| s.as_str());
        let text = sql::list(
            filter.tenant.is_some(),
            filter.environment.is_some(),
            status.is_some(),
            filter.tool.is_some(),
            filter.after.is_some(),
        );
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> = Vec::with_capacity(6);
        if let Some(tenant) = &filter.tenant {
            params.push((tenant, Type::TEXT));
        }
        if let Some(environment) = &filter.environment {
            params.push((environment, Type::TEXT));
        }
        if let Some(status) = &status {
            params.push((status, Type::TEXT));
        }
        if let Some(tool) = &filter.tool {
            params.push((tool, Type::TEXT));
        }
        if let Some(after) = &filter.after {
            params.push((after, Type::TEXT));
        }
        params.push((&limit, Type::INT8));
        let mut conn = self.conn().await?;
        // Planned for its values: the queue of `unknown` records and the mass of `applied`
        // ones want different indexes.
        let rows = conn.run_planned(Kind::Read, &text, &params).await?;
        rows.iter().map(|r| record_of(r, 0)).collect()
    }

    async fn count_records(
        &self,
        environment: &str,
        status: RecordStatus,
    ) -> Result<u64, store::Error> {
        let status = status.as_str();
        let mut conn = self.conn().await?;
        // Planned for its values, like a listing: `unknown` is then read from the partial
        // listing index of the statuses an operator looks for (migration 0008), which holds
        // neither pending nor applied rows, and counted there without visiting the table
        // where the visibility map allows.
        let rows = conn
            .run_planned(
                Kind::Read,
                sql::COUNT,
                &[(&status, Type::TEXT), (&environment, Type::TEXT)],
            )
            .await?;
        let n: i64 = rows.first().map(|r| r.get(0)).unwrap_or_default();
        Ok(n as u64)
    }

    async fn waiting_records(&self, query: Waiting) -> Result<Vec<Record>, store::Error> {
        let limit = match query.limit {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE),
        } as i64;
        let now = match query.on {
            WaitingOn::LeaseExpired { now } => Some(now),
            WaitingOn::Job => None,
        };
        let text = sql::waiting(now.is_some(), query.tool.is_some(), query.after.is_some());
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![
            (&query.environment, Type::TEXT),
            (&query.tenant, Type::TEXT),
        ];
        if let Some(now) = &now {
            params.push((now, Type::INT8));
        }
        if let Some(tool) = &query.tool {
            params.push((tool, Type::TEXT));
        }
        if let Some(after) = &query.after {
            params.push((after, Type::TEXT));
        }
        params.push((&limit, Type::INT8));
        let mut conn = self.conn().await?;
        let rows = conn.run_planned(Kind::Read, &text, &params).await?;
        rows.iter().map(|r| record_of(r, 0)).collect()
    }

    async fn due_records(&self, query: Due) -> Result<Vec<Record>, store::Error> {
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
        let cursor = query
            .after
            .as_ref()
            .map(|c| (c.due_at, c.key.as_str().to_string()));
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![
            (&query.environment, Type::TEXT),
            (&query.now, Type::INT8),
            (&limit, Type::INT8),
        ];
        let text = match &cursor {
            None => sql::DUE,
            Some((due_at, key)) => {
                params.push((due_at, Type::INT8));
                params.push((key, Type::TEXT));
                sql::DUE_AFTER
            }
        };
        let mut conn = self.conn().await?;
        let rows = conn.run_planned(Kind::Read, text, &params).await?;
        rows.iter().map(|r| record_of(r, 0)).collect()
    }

    /// A claim under a duplicate-intent window: one explicit transaction that takes the
    /// request's advisory lock, checks for the same request under another key, and only then
    /// claims, with the claim's events. The lock makes the check and the insert one step for
    /// every claim of the request, from any gateway: the second of two claims waits until the
    /// first has committed, and its check, a statement of its own and so with a snapshot taken
    /// after the wait, sees the first one's record. Never batched: a batch statement cannot
    /// wait on one lock per row, and a claim with this window is rare.
    async fn claim_guarded(
        &self,
        record: Record,
        events: Vec<Event>,
        since: Millis,
    ) -> Result<Claimed, store::Error> {
        let row = Row::from_record(&record);
        let ev = trace::encode(&events);
        let mut conn = self.conn().await?;
        // Until COMMIT is sent nothing can have been written, so every failure before it is
        // `Unavailable` (statements classified as reads) and leaves the transaction to be
        // rolled back, by us or by the server when the connection goes.
        conn.control(Kind::Read, "BEGIN").await?;
        match guarded(&mut conn, &record, &row, &ev, since).await {
            Ok((claimed, true)) => {
                // A failed commit may have landed (the connection broke while it was sent):
                // the write's own classification.
                conn.control(Kind::Write, "COMMIT").await?;
                Ok(claimed)
            }
            Ok((claimed, false)) => {
                // Nothing was written: the answer stands whatever the rollback does.
                conn.roll_back().await;
                Ok(claimed)
            }
            Err(e) => {
                conn.roll_back().await;
                Err(e)
            }
        }
    }

    async fn sweep_once(
        &self,
        environment: &str,
        now: Millis,
        limit: usize,
    ) -> Result<SweepReport, store::Error> {
        if limit == 0 {
            return Ok(SweepReport::default());
        }
        let mut report = SweepReport::default();
        // All the purges before the first compaction, so that a record compacted by this sweep
        // keeps its tombstone until the next one (see `sql::SWEEP`). Each batch is a statement
        // of its own, which bounds how long it runs and holds its row locks: one statement
        // over a limit of 15 000 rows per kind overran the default statement timeout on a
        // database of three million records (docs/benchmarks/history.md, "Cost as the store
        // grows").
        let mut left = limit;
        while left > 0 {
            let take = left.min(SWEEP_BATCH);
            let purged = self.sweep_batch(environment, now, take, 0).await?.purged;
            report.purged += purged;
            if purged < take as u64 {
                break;
            }
            left -= take;
        }
        let mut left = limit;
        while left > 0 {
            let take = left.min(SWEEP_BATCH);
            let compacted = self.sweep_batch(environment, now, 0, take).await?.compacted;
            report.compacted += compacted;
            if compacted < take as u64 {
                break;
            }
            left -= take;
        }
        Ok(report)
    }

    /// One statement of a sweep: at most `purge` tombstones purged and `compact` records
    /// compacted.
    async fn sweep_batch(
        &self,
        environment: &str,
        now: Millis,
        purge: usize,
        compact: usize,
    ) -> Result<SweepReport, store::Error> {
        let purge = i64::try_from(purge).unwrap_or(i64::MAX);
        let compact = i64::try_from(compact).unwrap_or(i64::MAX);
        let mut conn = self.conn().await?;
        let rows = conn
            .run_planned(
                Kind::Write,
                sql::SWEEP,
                &[
                    (&now, Type::INT8),
                    (&purge, Type::INT8),
                    (&SWEEPER, Type::TEXT),
                    (&environment, Type::TEXT),
                    (&compact, Type::INT8),
                ],
            )
            .await?;
        let count = |column: usize| -> u64 {
            rows.first()
                .and_then(|r| r.try_get::<_, i64>(column).ok())
                .unwrap_or(0)
                .max(0) as u64
        };
        Ok(SweepReport {
            compacted: count(0),
            purged: count(1),
        })
    }
}

/// The statements of [`PgStore::claim_guarded`] inside its transaction: the answer, and whether
/// the transaction wrote and must commit.
async fn guarded(
    conn: &mut Conn,
    record: &Record,
    row: &Row,
    ev: &str,
    since: Millis,
) -> Result<(Claimed, bool), store::Error> {
    let request = sql::duplicate_lock_request(&row.tenant, &row.tool, &row.fingerprint);
    let environment = record.key.environment().to_string();
    conn.run(Kind::Read, sql::DUPLICATE_LOCK, &[&request])
        .await?;
    let rows = conn
        .run_planned(
            Kind::Read,
            sql::DUPLICATE,
            &[
                (&row.tenant, Type::TEXT),
                (&row.tool, Type::TEXT),
                (&row.fingerprint, Type::TEXT),
                (&since, Type::INT8),
                (&row.key, Type::TEXT),
                (&environment, Type::TEXT),
            ],
        )
        .await?;
    if let Some(r) = rows.first() {
        // The key's own record comes first: a delivery of an operation that exists is answered
        // by its record, whatever else holds the same request.
        if let Some(existing) = get_with(conn, &record.key).await? {
            return Ok((Claimed::Existing(existing), false));
        }
        let other: String = r
            .try_get(0)
            .map_err(|e| store::Error::Corrupt(format!("unreadable key: {e}")))?;
        let other = OperationKey::parse(&other).map_err(|e| {
            store::Error::Corrupt(format!("stored key `{other}` is malformed: {e}"))
        })?;
        return Ok((Claimed::DuplicateIntent(other), false));
    }
    // No duplicate: the ordinary claim, inside the transaction, decided by the unique key. A
    // plain claim of the same key, which takes no lock, may still race it.
    let claimed = claim_with(conn, Kind::Read, record, row, ev).await?;
    let wrote = matches!(claimed, Claimed::Inserted(_));
    Ok((claimed, wrote))
}

/// Claim-or-load of `record` on a checked-out connection: its own implicit transaction
/// (`kind` a write), or a statement of an explicit one that commits later (`kind` a read, for
/// nothing commits before the COMMIT).
async fn claim_with(
    conn: &mut Conn,
    kind: Kind,
    record: &Record,
    row: &Row,
    ev: &str,
) -> Result<Claimed, store::Error> {
    // Two rounds are enough for the READ COMMITTED gap (see `sql`); a third guards against
    // a purge racing the re-read, after which the key is free and the claim inserts.
    for _ in 0..3 {
        let rows = conn
            .run(
                kind,
                sql::CLAIM,
                &[
                    &row.tenant,
                    &row.key,
                    &row.tool,
                    &row.tool_version,
                    &row.fingerprint,
                    &row.canonicalization,
                    &row.status,
                    &row.fence,
                    &row.lease_owner,
                    &row.lease_expires_at,
                    &row.dispatch,
                    &row.job_id,
                    &row.effect_reference,
                    &row.result,
                    &row.error_code,
                    &row.error_message,
                    &row.actor,
                    &row.request,
                    &row.approved_by,
                    &row.created_at,
                    &row.updated_at,
                    &row.expires_at,
                    &row.purge_at,
                    &ev,
                    &row.intent_window,
                ],
            )
            .await?;
        // Prefer the inserted row: both can appear only if the old row was purged after
        // this statement's snapshot was taken, and then the insert is what happened.
        // The statement returns only the key of a row it inserted (`sql::CLAIM`): the row
        // is the record sent.
        if rows
            .iter()
            .any(|r| r.try_get::<_, bool>(0).unwrap_or(false))
        {
            return Ok(Claimed::Inserted(record.clone()));
        }
        if let Some(r) = rows.first() {
            return Ok(Claimed::Existing(record_of(r, 1)?));
        }
        // Neither inserted nor found: a concurrent claim committed the row after this
        // statement's snapshot. A new statement has a new snapshot and sees it.
        if let Some(existing) = get_with(conn, &record.key).await? {
            return Ok(Claimed::Existing(existing));
        }
    }
    Err(store::Error::Unavailable(format!(
        "claim of {} kept racing with concurrent deletes",
        record.key
    )))
}

/// The fenced compare-and-set of `t` on a checked-out connection: the record as written, or
/// `None` when the expectation no longer held. Its own implicit transaction (`kind` a write),
/// or a statement of an explicit one (`kind` a read, for nothing commits before the COMMIT).
pub(crate) async fn transition_with(
    conn: &mut Conn,
    kind: Kind,
    t: &Transition,
) -> Result<Option<Record>, store::Error> {
    let mut next = Row::default();
    next.set_state(&t.next);
    let (replace_request, request) = request_columns(&t.request);
    let fingerprint = t.fingerprint.as_ref().map(|f| f.as_str().to_string());
    let ev = trace::encode(&t.events);
    let expect_fence = t.expect.fence as i64;
    let fence = t.fence as i64;
    let (expires_at, purge_at) = expiry_columns(t.expiry);
    let rows = conn
        .run(
            kind,
            sql::TRANSITION,
            &[
                &t.key.tenant(),
                &t.key.as_str(),
                &expect_fence,
                &t.expect.status.as_str(),
                &t.expect.lease_expired_by,
                &next.status,
                &fence,
                &next.lease_owner,
                &next.lease_expires_at,
                &next.dispatch,
                &next.job_id,
                &next.effect_reference,
                &next.result,
                &next.error_code,
                &next.error_message,
                &replace_request,
                &request,
                &t.approved_by,
                &fingerprint,
                &t.now,
                &ev,
                &expires_at,
                &purge_at,
                &t.expect.dispatch,
                &t.expect.created_at,
            ],
        )
        .await?;
    rows.first().map(|r| written_of(r, 0, t, next)).transpose()
}

/// The record `t` wrote, from a result row of the columns it did not set (starting at column
/// `offset`) and `next`, the state columns it set (`Row::set_state`).
pub(crate) fn written_of(
    r: &tokio_postgres::Row,
    offset: usize,
    t: &Transition,
    next: Row,
) -> Result<Record, store::Error> {
    let written = Row {
        tenant: t.key.tenant().to_string(),
        key: t.key.as_str().to_string(),
        fence: t.fence as i64,
        updated_at: t.now,
        ..next
    };
    let row = sql::read_written(r, offset, written)
        .map_err(|e| store::Error::Corrupt(format!("unreadable operations row: {e}")))?;
    row.into_record()
        .map_err(|e| store::Error::Corrupt(e.to_string()))
}

/// Reads one record on an already checked-out connection (a statement of its own, hence a
/// fresh snapshot).
pub(crate) async fn get_with(
    conn: &mut Conn,
    key: &OperationKey,
) -> Result<Option<Record>, store::Error> {
    let rows = conn
        .run(Kind::Read, sql::GET, &[&key.tenant(), &key.as_str()])
        .await?;
    rows.first().map(|r| record_of(r, 0)).transpose()
}

/// A result row as a record; anything unreadable is `Corrupt`, never silently fixed.
pub(crate) fn record_of(r: &tokio_postgres::Row, offset: usize) -> Result<Record, store::Error> {
    let row = sql::read_row(r, offset)
        .map_err(|e| store::Error::Corrupt(format!("unreadable operations row: {e}")))?;
    row.into_record()
        .map_err(|e| store::Error::Corrupt(e.to_string()))
}

/// A transition's request change as the statements' two parameters: whether to replace the
/// stored request, and the new value (NULL to clear it).
pub(crate) fn request_columns(update: &RequestUpdate) -> (bool, Option<String>) {
    match update {
        RequestUpdate::Keep => (false, None),
        RequestUpdate::Clear => (true, None),
        RequestUpdate::Set(value) => (true, Some(value.to_string())),
    }
}

/// A transition's expiry as the statements' two parameters, both NULL to keep the stored
/// `expires_at` and `purge_at`.
pub(crate) fn expiry_columns(expiry: Option<Expiry>) -> (Option<i64>, Option<i64>) {
    match expiry {
        Some(Expiry {
            expires_at,
            purge_at,
        }) => (Some(expires_at), Some(purge_at)),
        None => (None, None),
    }
}

impl Store for PgStore {
    fn get<'a>(
        &'a self,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Result<Option<Record>, store::Error>> {
        Box::pin(self.get_record(key))
    }

    fn claim(
        &self,
        record: Record,
        events: Vec<Event>,
    ) -> BoxFuture<'_, Result<Claimed, store::Error>> {
        Box::pin(self.claim_record(record, events))
    }

    /// The claim is claim-or-load in one statement (`sql::CLAIM`, `sql::CLAIM_BATCH`): on an
    /// existing key `ON CONFLICT DO NOTHING` inserts no row, the trace's insert joins only
    /// inserted rows, and the statement reads the existing row instead — no tuple written, no
    /// transaction id taken, one round trip like the read.
    fn claim_replaces_read(&self) -> bool {
        true
    }

    fn claim_unless_duplicate(
        &self,
        record: Record,
        events: Vec<Event>,
        since: Millis,
    ) -> BoxFuture<'_, Result<Claimed, store::Error>> {
        Box::pin(self.claim_guarded(record, events, since))
    }

    fn transition(&self, transition: Transition) -> BoxFuture<'_, Result<Cas, store::Error>> {
        Box::pin(self.apply(transition))
    }

    fn audit_log(
        &self,
        after: u64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Entry>, store::Error>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            audit::after(&mut conn, after, limit).await
        })
    }

    fn append_events<'a>(
        &'a self,
        key: &'a OperationKey,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), store::Error>> {
        Box::pin(self.append(key, events))
    }

    fn events<'a>(
        &'a self,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Result<Vec<Event>, store::Error>> {
        Box::pin(self.trace(key))
    }

    fn list(&self, filter: Filter) -> BoxFuture<'_, Result<Vec<Record>, store::Error>> {
        Box::pin(self.list_records(filter))
    }

    fn count<'a>(
        &'a self,
        environment: &'a str,
        status: RecordStatus,
    ) -> BoxFuture<'a, Result<u64, store::Error>> {
        Box::pin(self.count_records(environment, status))
    }

    fn due(&self, query: Due) -> BoxFuture<'_, Result<Vec<Record>, store::Error>> {
        Box::pin(self.due_records(query))
    }

    fn waiting(&self, query: Waiting) -> BoxFuture<'_, Result<Vec<Record>, store::Error>> {
        Box::pin(self.waiting_records(query))
    }

    fn sweep<'a>(
        &'a self,
        environment: &'a str,
        now: Millis,
        limit: usize,
    ) -> BoxFuture<'a, Result<SweepReport, store::Error>> {
        Box::pin(self.sweep_once(environment, now, limit))
    }

    fn webhook<'a>(
        &'a self,
        source: &'a str,
        event_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<WebhookEvent>, store::Error>> {
        Box::pin(self.webhook_event(source, event_id))
    }

    fn record_webhook(&self, event: WebhookEvent) -> BoxFuture<'_, Result<Recorded, store::Error>> {
        Box::pin(self.record_webhook_event(event))
    }

    fn webhooks_for_job<'a>(
        &'a self,
        tenant: &'a str,
        job_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<WebhookEvent>, store::Error>> {
        Box::pin(self.webhook_events_for_job(tenant, job_id))
    }

    fn open_jobs<'a>(
        &'a self,
        m: JobMatch<'a>,
    ) -> BoxFuture<'a, Result<Vec<Record>, store::Error>> {
        Box::pin(self.open_job_records(m))
    }

    fn sweep_webhooks(
        &self,
        now: Millis,
        limit: usize,
    ) -> BoxFuture<'_, Result<u64, store::Error>> {
        Box::pin(self.sweep_webhook_events(now, limit))
    }
}
