//! The durable store, as a trait both SQLite and PostgreSQL implement.
//!
//! **A store persists the transition it is given with compare-and-set and never chooses one.**
//! The executor decides the next state; the store writes it only if the record still has the
//! fencing token, status and creation instant (and for a takeover an expired lease) that the
//! executor saw.

use std::future::Future;
use std::pin::Pin;

use serde_json::Value;

use crate::audit::{Draft, Entry};
use crate::fingerprint::Fingerprint;
use crate::key::OperationKey;
use crate::record::{Event, Millis, Record, RecordState, RecordStatus};
use crate::webhook::{JobMatch, Recorded, WebhookEvent};

/// A boxed future, so that `dyn Store` works without an async-trait dependency.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

thread_local! {
    static NEVER_WAITS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks this thread, for the rest of its life, as one that must never wait for the disk or
/// for another thread: a JavaScript event loop that polls the engine's futures itself. A store
/// then never commits a write on it (the write goes to the store's own thread, and the future
/// is woken when it is durable).
pub fn never_wait_on_this_thread() {
    NEVER_WAITS.set(true);
}

/// Whether a store may wait on this thread for a commit of its own (see
/// [`never_wait_on_this_thread`]).
pub fn may_wait_on_this_thread() -> bool {
    !NEVER_WAITS.get()
}

/// A store failure, classified by what the caller may conclude from it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The write did not happen (connection refused, pool exhausted, database down before the
    /// statement was sent). Nothing changed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The write may or may not have committed (connection lost during commit). The caller
    /// must treat the record as unknown to itself and read it again.
    #[error("store write outcome unknown: {0}")]
    Ambiguous(String),
    /// A stored row does not describe a valid record.
    #[error("store holds a malformed record: {0}")]
    Corrupt(String),
}

/// The answer of an atomic claim-or-load: the unique key decided which.
#[derive(Debug, Clone, PartialEq)]
pub enum Claimed {
    /// This call inserted the record; the caller owns it.
    Inserted(Record),
    /// A record already existed under the key; it is returned unchanged.
    Existing(Record),
    /// ([`Store::claim_unless_duplicate`] only.) Another key of the same tenant and tool
    /// holds a record with the same fingerprint, created within the window: nothing was
    /// inserted.
    DuplicateIntent(OperationKey),
}

/// What the record must still look like for a transition to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expect {
    pub fence: u64,
    pub status: RecordStatus,
    /// When the record was claimed: which life of the key the executor saw. A key whose
    /// tombstone was purged can be claimed again, and the new life starts at fence 1 like the
    /// old one did, so fence and status alone would let a worker paused through the purge
    /// write, and send, for a claim that is not its own. A new life is claimed no earlier than
    /// the old one's purge, and that waited for its retention after it settled, so two lives
    /// share a creation instant only if the old one was claimed, settled without a lease or
    /// timer running out, purged with a `tombstone_ttl` of 0, and claimed again, all in one
    /// millisecond of one clock.
    pub created_at: Millis,
    /// For a takeover: the lease must have expired at or before this instant, so a renewal
    /// that raced the takeover wins.
    pub lease_expired_by: Option<Millis>,
    /// For a takeover: the dispatch column must still read this (`not_sent`, `sent`, `job`),
    /// so a dispatch marker the owner wrote after the takeover's plan was made wins, and
    /// "maybe sent" is never overwritten by "nothing sent".
    pub dispatch: Option<&'static str>,
}

/// Whether a transition keeps, clears or replaces the stored request arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestUpdate {
    Keep,
    Clear,
    Set(Value),
}

/// When a settled record expires, fixed by the transition that settles it: retention counts
/// from settlement, never from the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    /// When the record is compacted to a tombstone.
    pub expires_at: Millis,
    /// When the tombstone is deleted.
    pub purge_at: Millis,
}

/// One compare-and-set transition, fully decided by the executor.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub key: OperationKey,
    pub expect: Expect,
    pub next: RecordState,
    /// The fencing token after the transition: the same for the owner's own steps, one more
    /// on a takeover.
    pub fence: u64,
    pub request: RequestUpdate,
    /// Set when an approval is recorded.
    pub approved_by: Option<String>,
    /// Replaces the stored fingerprint (an operator's `not_applied` lets a new request run).
    pub fingerprint: Option<Fingerprint>,
    /// Replaces `expires_at` and `purge_at`: set by every transition to a settled state, and
    /// by one that leaves a settled state (to [`NOT_SETTLED`](crate::record::NOT_SETTLED)).
    pub expiry: Option<Expiry>,
    pub events: Vec<Event>,
    pub now: Millis,
    /// The webhook event that causes this transition: its deduplication row is written in the
    /// same transaction, by the rule of [`WebhookEvent`], and when that rule writes nothing (a
    /// decided row for the event exists) the transition is not applied either (`Cas::Lost`).
    pub webhook: Option<WebhookEvent>,
    /// An operator action's audit entry: appended to the audit log in the same transaction,
    /// only if the transition applies (see [`Store::transition`]).
    pub audit: Option<Draft>,
}

/// The answer of a compare-and-set.
#[derive(Debug, Clone, PartialEq)]
pub enum Cas {
    /// The transition was written; the record as it now is.
    Done(Record),
    /// The record no longer matched; the record as it now is, if it still exists.
    Lost(Option<Record>),
}

/// A listing query; `status = Unknown` is the reconciliation queue.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Filter {
    pub tenant: Option<String>,
    /// Only keys of this environment (the key's second part).
    pub environment: Option<String>,
    pub status: Option<RecordStatus>,
    pub tool: Option<String>,
    /// Only keys greater than this one (keyset pagination).
    pub after: Option<String>,
    pub limit: usize,
}

/// Where a scan of due records continues: after this deadline and key, in that order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub due_at: Millis,
    pub key: OperationKey,
}

/// The recoverer's scan: records of one environment whose deadline has come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub environment: String,
    pub now: Millis,
    /// Only records after this one in (deadline, key) order: the scan is paged, so that
    /// records that make no progress never hide the others.
    pub after: Option<Cursor>,
    pub limit: usize,
}

/// The deadline a due scan orders by: the lease expiry of a pending record (owned, released or
/// a job's next poll), the approval deadline of one awaiting approval. `None` for the others.
pub fn due_at(record: &Record) -> Option<Millis> {
    match &record.state {
        RecordState::Pending { lease, .. } => Some(lease.expires_at),
        RecordState::AwaitingApproval { until } => Some(*until),
        RecordState::Applied(_)
        | RecordState::FailedPermanent(_)
        | RecordState::Unknown(_)
        | RecordState::Tombstone(_) => None,
    }
}

/// What a pending record waits on, as the operator's queues name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitingOn {
    /// A claim (owned or released, not a job) whose lease ran out at or before `now`: a worker
    /// that stopped, or a released claim no delivery took up, that recovery has yet to settle.
    LeaseExpired { now: Millis },
    /// An accepted job still being polled, whatever its next poll.
    Job,
}

impl WaitingOn {
    /// Whether `record` is in this queue (the rule every store follows).
    pub fn holds(&self, record: &Record) -> bool {
        match (&record.state, self) {
            (RecordState::Pending { dispatch, .. }, WaitingOn::Job) => {
                matches!(dispatch, crate::record::Dispatch::Job { .. })
            }
            (RecordState::Pending { lease, dispatch }, WaitingOn::LeaseExpired { now }) => {
                !matches!(dispatch, crate::record::Dispatch::Job { .. }) && lease.expires_at <= *now
            }
            (
                RecordState::AwaitingApproval { .. }
                | RecordState::Applied(_)
                | RecordState::FailedPermanent(_)
                | RecordState::Unknown(_)
                | RecordState::Tombstone(_),
                _,
            ) => false,
        }
    }
}

/// An operator's queue of pending records: one tenant's, in one environment, by what they wait
/// on, ordered by key and paged like a listing (`limit == 0` is a page of 100, none is larger
/// than 1000).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub tenant: String,
    pub environment: String,
    pub on: WaitingOn,
    pub tool: Option<String>,
    /// Only keys greater than this one (keyset pagination).
    pub after: Option<String>,
    pub limit: usize,
}

/// What one retention sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SweepReport {
    /// Settled records past `expires_at` turned into tombstones.
    pub compacted: u64,
    /// Tombstones past `purge_at` deleted, with their events.
    pub purged: u64,
}

/// The durable store.
///
/// Sweeping is the one bulk transition, and its rule is fixed here so that stores agree:
/// within one environment, records in `applied` or `failed_permanent` whose `expires_at` has
/// passed become tombstones (reference or refusal code kept — the [`Digest`] of what they
/// settled as; result and request dropped; an `expired` event appended); tombstones whose
/// `purge_at` has passed are deleted with their events. Records that have not settled —
/// `pending`, `awaiting_approval`, `unknown` — are never swept: their effect may still happen
/// or arrive. (The executor expires an approval or a released claim past its deadline with an
/// ordinary transition, found by [`Store::due`].)
///
/// The finer points every store follows (the shared `store_suite` checks each):
///
/// - "Has passed" means at or before `now` (`<=`), for expiries, purges, leases and deadlines.
/// - A sweep purges before it compacts, so a record compacted by one sweep is purged, at the
///   earliest, by the next.
/// - `due` returns `pending` and `awaiting_approval` records of the environment whose
///   [`due_at`] has passed, ordered by (`due_at`, key), after the cursor; owned, released and
///   job records alike.
/// - `list` with `limit == 0` returns a page of 100; no page is larger than 1000.
/// - `claim_unless_duplicate` names the earliest-created match, the smallest key on a tie.
/// - `append_events` for a key without a record is accepted (the trace may outlive a purge
///   race; it is never read without its record).
///
/// [`Digest`]: crate::record::Digest
pub trait Store: Send + Sync + 'static {
    /// Reads one record. Never writes.
    fn get<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Option<Record>, Error>>;

    /// Inserts `record` if no record exists under its key, else returns the existing one —
    /// atomically, decided by the store's unique constraint. `events` are appended with the
    /// insert in the same transaction, and only if it inserted.
    fn claim(&self, record: Record, events: Vec<Event>) -> BoxFuture<'_, Result<Claimed, Error>>;

    /// Whether [`Store::claim`] may stand in for the read before it: a claim that meets an
    /// existing record writes nothing (no row, no trace entry, nothing to commit) and answers
    /// it in the one round trip a [`Store::get`] would take. The executor then claims a new
    /// delivery's key without reading it first, where nothing between the read and the claim
    /// could refuse the delivery (see `Executor::keyed`).
    ///
    /// No method of this trait has a default: a wrapper (metrics, sealing, fault injection,
    /// the simulator) must say what it does with each, so none can silently fall back to a
    /// behaviour its inner store does not have. A wrapper forwards this answer unless it means
    /// to choose the path (a test running the read-first path over a claim-first store).
    fn claim_replaces_read(&self) -> bool;

    /// Like [`Store::claim`], for a tool with a duplicate-intent window, atomically: when a
    /// record of the same tenant, environment and tool with the same fingerprint, claimed with
    /// `intent_window`, under another key, created at or after `since` exists, nothing is
    /// inserted and its key is returned ([`Claimed::DuplicateIntent`]). The check and the insert
    /// are one step: two concurrent claims of one fingerprint under two keys never both insert.
    fn claim_unless_duplicate(
        &self,
        record: Record,
        events: Vec<Event>,
        since: Millis,
    ) -> BoxFuture<'_, Result<Claimed, Error>>;

    /// Applies `transition` if the record still matches its expectation. A transition with an
    /// audit draft appends its entry to the audit log in the same transaction: sealed (see
    /// [`crate::audit::Sealer`]) after the chain's head, read under a lock that serialises every
    /// appender of the database, so the log is one unbroken chain. A transition that does not
    /// apply appends nothing; an append that fails fails the transition, which is not applied.
    fn transition(&self, transition: Transition) -> BoxFuture<'_, Result<Cas, Error>>;

    /// Audit entries with a sequence number above `after`, oldest first, at most `limit`.
    fn audit_log(&self, after: u64, limit: usize) -> BoxFuture<'_, Result<Vec<Entry>, Error>>;

    /// Appends trace entries without a transition.
    fn append_events<'a>(
        &'a self,
        key: &'a OperationKey,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// The trace of one operation, oldest first.
    fn events<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Vec<Event>, Error>>;

    /// Records matching `filter`, ordered by key.
    fn list(&self, filter: Filter) -> BoxFuture<'_, Result<Vec<Record>, Error>>;

    /// How many records of `environment`, across tenants, are in `status`: the depth of the
    /// reconciliation queue that `/metrics` reports. Exact however many there are (no page
    /// limit); a store counts on an index where it has one. Never writes.
    fn count<'a>(
        &'a self,
        environment: &'a str,
        status: RecordStatus,
    ) -> BoxFuture<'a, Result<u64, Error>>;

    /// Records whose deadline has come, for the recoverer (see the trait's rule): at most
    /// `limit`, in (`due_at`, key) order after the cursor.
    fn due(&self, query: Due) -> BoxFuture<'_, Result<Vec<Record>, Error>>;

    /// Pending records of one tenant and environment that wait on what `query.on` names
    /// ([`WaitingOn::holds`]), ordered by key after the cursor: the operator's queues of
    /// claims past their lease and of jobs in progress.
    fn waiting(&self, query: Waiting) -> BoxFuture<'_, Result<Vec<Record>, Error>>;

    /// One retention sweep of `environment`, of at most `limit` rows of each kind (see the
    /// trait's rule).
    fn sweep<'a>(
        &'a self,
        environment: &'a str,
        now: Millis,
        limit: usize,
    ) -> BoxFuture<'a, Result<SweepReport, Error>>;

    /// The deduplication row of one webhook event. Never writes.
    fn webhook<'a>(
        &'a self,
        source: &'a str,
        event_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<WebhookEvent>, Error>>;

    /// Writes the row of an event that causes no transition, by the rule of [`WebhookEvent`]:
    /// written when no row exists or the existing one is early, else the existing row.
    fn record_webhook(&self, event: WebhookEvent) -> BoxFuture<'_, Result<Recorded, Error>>;

    /// The rows of `tenant`'s events that named job `job_id`, oldest first: early arrivals
    /// waiting for the job, and the events that bound it to its operation.
    fn webhooks_for_job<'a>(
        &'a self,
        tenant: &'a str,
        job_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<WebhookEvent>, Error>>;

    /// The records whose end of accepted job `m.job_id` is not known yet — pending with the
    /// job, or `unknown` with it as their evidence — of `m.tenant`, in environment
    /// `m.environment`, of one of `m.tools`, ordered by key: **at most two**. One is the
    /// event's operation; two say that the job id alone does not name one (two tools whose
    /// downstreams hand out overlapping ids) and the event must not bind. Never writes.
    fn open_jobs<'a>(&'a self, m: JobMatch<'a>) -> BoxFuture<'a, Result<Vec<Record>, Error>>;

    /// Deletes at most `limit` webhook rows whose `purge_at` has passed; how many.
    fn sweep_webhooks(&self, now: Millis, limit: usize) -> BoxFuture<'_, Result<u64, Error>>;
}

/// A shared store is a store: executors, recoverers and test wrappers hold `Arc<dyn Store>`.
impl<T: Store + ?Sized> Store for std::sync::Arc<T> {
    fn get<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        (**self).get(key)
    }
    fn claim(&self, record: Record, events: Vec<Event>) -> BoxFuture<'_, Result<Claimed, Error>> {
        (**self).claim(record, events)
    }
    fn claim_replaces_read(&self) -> bool {
        (**self).claim_replaces_read()
    }
    fn claim_unless_duplicate(
        &self,
        record: Record,
        events: Vec<Event>,
        since: Millis,
    ) -> BoxFuture<'_, Result<Claimed, Error>> {
        (**self).claim_unless_duplicate(record, events, since)
    }
    fn transition(&self, transition: Transition) -> BoxFuture<'_, Result<Cas, Error>> {
        (**self).transition(transition)
    }
    fn audit_log(&self, after: u64, limit: usize) -> BoxFuture<'_, Result<Vec<Entry>, Error>> {
        (**self).audit_log(after, limit)
    }
    fn append_events<'a>(
        &'a self,
        key: &'a OperationKey,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        (**self).append_events(key, events)
    }
    fn events<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Vec<Event>, Error>> {
        (**self).events(key)
    }
    fn list(&self, filter: Filter) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        (**self).list(filter)
    }
    fn count<'a>(
        &'a self,
        environment: &'a str,
        status: RecordStatus,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        (**self).count(environment, status)
    }
    fn due(&self, query: Due) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        (**self).due(query)
    }
    fn waiting(&self, query: Waiting) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        (**self).waiting(query)
    }
    fn sweep<'a>(
        &'a self,
        environment: &'a str,
        now: Millis,
        limit: usize,
    ) -> BoxFuture<'a, Result<SweepReport, Error>> {
        (**self).sweep(environment, now, limit)
    }
    fn webhook<'a>(
        &'a self,
        source: &'a str,
        event_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<WebhookEvent>, Error>> {
        (**self).webhook(source, event_id)
    }
    fn record_webhook(&self, event: WebhookEvent) -> BoxFuture<'_, Result<Recorded, Error>> {
        (**self).record_webhook(event)
    }
    fn webhooks_for_job<'a>(
        &'a self,
        tenant: &'a str,
        job_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<WebhookEvent>, Error>> {
        (**self).webhooks_for_job(tenant, job_id)
    }
    fn open_jobs<'a>(&'a self, m: JobMatch<'a>) -> BoxFuture<'a, Result<Vec<Record>, Error>> {
        (**self).open_jobs(m)
    }
    fn sweep_webhooks(&self, now: Millis, limit: usize) -> BoxFuture<'_, Result<u64, Error>> {
        (**self).sweep_webhooks(now, limit)
    }
}
