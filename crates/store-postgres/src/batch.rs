//! Natural batching: concurrent claims, and concurrent transitions, carried by one multi-row
//! statement each, so that many callers share one round trip, one transaction and one commit.
//!
//! # How a batch forms
//!
//! A claim or a transition is queued with a channel for its answer. At most `in_flight` batch
//! statements run at once, driven by tasks spawned when a request finds a free slot. A driver
//! takes everything queued (up to `max_rows`, claims and transitions in turn) as one statement,
//! answers its callers, and takes the next batch until the queues are empty. Nothing waits for
//! company: a lone caller finds a free slot and is sent at once, alone, with the very
//! single-row statement used without batching. Batches grow only while every slot is busy, so
//! their size follows the load.
//!
//! Batch statements run on a pool of `in_flight` connections of their own, set to always use
//! the generic plan. Taken from the main pool, each batch would land on a connection picked
//! at random, which would prepare the batch statements and plan them for its first five runs
//! (PostgreSQL's rule before it considers a generic plan) on its own: measured, that made a
//! batch of 15 rows cost more than 15 single statements. The generic plans are lookups by
//! key whatever the table's statistics, by construction of the statements (see `sql`) and
//! checked by the `plans` test.
//!
//! # What every batch keeps of the single-row statements
//!
//! - **One statement, one implicit transaction, at READ COMMITTED**: each caller is answered
//!   only after the commit of the statement that carried its row, and a row's trace entries
//!   are written by the same statement into the row, in the order given.
//! - **Claim-or-load**: `INSERT … SELECT … ON CONFLICT DO NOTHING` decides each key on the
//!   unique index exactly as a single claim does; the statement also reads the rows that
//!   already existed. A key neither inserted nor found (a concurrent claim committed after the
//!   statement's snapshot, see `sql`) is handed back to its caller, who runs the single-row
//!   claim, which reads again.
//! - **One request per key per batch**: a second claim or transition of a key already in the
//!   forming batch stays queued for the next one, so a statement never holds two rows of one
//!   key (two inserts, or two compare-and-sets where the second would test the first's result).
//! - **Fenced compare-and-set per row**: the multi-row `UPDATE … FROM` tests each row's
//!   expectation, re-checked on the newest version after a wait like the single update. A
//!   transition that matched nothing is handed back to its caller, who reads the record anew
//!   (`Cas::Lost`), exactly as after a single update.
//! - **Lock order**: rows are sorted by (tenant, key) in byte order, the order of the "C"
//!   collation, and inserted in that order, so two gateways' claim batches wait on each other's
//!   keys in one direction only. A deadlock PostgreSQL still detects (updates are joined in the
//!   plan's order, not necessarily the sorted one) is an ERROR, which rolled everything back:
//!   the callers fall back to single statements, as below.
//! - **An ERROR isolates nothing and fails nobody**: the server rolled the whole statement back
//!   (a bad row, a deadlock, a statement timeout), so nothing changed, and each caller runs its
//!   own single-row statement instead — the bad row fails alone, the others succeed.
//! - **A lost connection is ambiguous for every row**: when the connection broke or the deadline
//!   passed after the batch was sent, each caller gets `Ambiguous`, as a lost single statement
//!   gives today, and reads the record again.
//! - **A caller that gave up before its batch was sent** (its future was dropped) is left out:
//!   nothing is written for it, as for a single statement never sent.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;

use idemgate_core::record::{Event, Record, Row};
use idemgate_core::store::{self, Cas, Claimed, Transition};
use idemgate_core::trace;
use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;

use crate::conn::{self, Kind};
use crate::{PgStore, expiry_columns, record_of, request_columns, sql, written_of};

/// What a queued caller is told.
pub(crate) enum Reply<T> {
    /// The batch decided this request.
    Done(Result<T, store::Error>),
    /// The batch changed nothing for this request (the statement failed, or a claim met a
    /// key committed after its snapshot); the caller runs the single-row statement itself.
    Alone,
    /// The batch committed and this transition's expectation matched no row: the caller reads
    /// the record anew and answers `Cas::Lost`, as after a single update.
    Lost,
}

pub(crate) struct ClaimJob {
    pub(crate) record: Record,
    pub(crate) events: Vec<Event>,
    pub(crate) reply: oneshot::Sender<Reply<Claimed>>,
}

pub(crate) struct TransitionJob {
    pub(crate) transition: Transition,
    pub(crate) reply: oneshot::Sender<Reply<Cas>>,
}

trait Job {
    fn id(&self) -> (String, String);
    fn abandoned(&self) -> bool;
}

impl Job for ClaimJob {
    fn id(&self) -> (String, String) {
        (
            self.record.key.tenant().to_string(),
            self.record.key.as_str().to_string(),
        )
    }
    fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }
}

impl Job for TransitionJob {
    fn id(&self) -> (String, String) {
        (
            self.transition.key.tenant().to_string(),
            self.transition.key.as_str().to_string(),
        )
    }
    fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }
}

#[derive(Default)]
struct Queues {
    claims: VecDeque<ClaimJob>,
    transitions: VecDeque<TransitionJob>,
    drivers: usize,
}

/// The queues and the bound on batch statements in flight, shared by a store's clones.
pub(crate) struct Batcher {
    /// `in_flight` connections kept for batch statements: each prepares the few batch
    /// statements once and keeps their generic plans, which a connection of the main pool,
    /// picked at random per batch, would each have to do again.
    pool: Pool,
    deadline: Option<Duration>,
    queues: Mutex<Queues>,
    in_flight: usize,
    max_rows: usize,
    /// The text of the transition batch statement per size, built once (see
    /// `sql::transition_batch`; see `transition_text` for the sizes).
    transition_texts: Mutex<std::collections::HashMap<usize, Arc<str>>>,
    /// Multi-row statements sent, and the rows they carried (for tests and tuning).
    pub(crate) statements: std::sync::atomic::AtomicU64,
    pub(crate) rows: std::sync::atomic::AtomicU64,
}

impl Batcher {
    pub(crate) fn new(
        pool: Pool,
        deadline: Option<Duration>,
        in_flight: usize,
        max_rows: usize,
    ) -> Batcher {
        Batcher {
            pool,
            deadline,
            queues: Mutex::new(Queues::default()),
            in_flight: in_flight.max(1),
            max_rows: max_rows.max(1),
            transition_texts: Default::default(),
            statements: Default::default(),
            rows: Default::default(),
        }
    }

    /// The pool the batch statements run on.
    #[cfg(feature = "testing")]
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The transition batch statement for `rows` rows: of exactly that many up to
    /// [`EXACT_SIZES`], above that rounded up to a power of two, so that each connection
    /// prepares at most ten of them (2 to 64 rows by default). Every row of the statement is
    /// an `UPDATE` of its own, which PostgreSQL sets up (the result relation, its indexes, their
    /// predicates) before it runs, whether or not it has a row to update: a statement for 4 rows
    /// carrying 3 spent a quarter of that set-up on nothing. Batches under load are mostly of a
    /// few rows (some 4 per statement at 32 callers), so those sizes are exact.
    fn transition_text(&self, rows: usize) -> Arc<str> {
        let size = if rows <= EXACT_SIZES {
            rows
        } else {
            rows.next_power_of_two()
        };
        let mut texts = self
            .transition_texts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        texts
            .entry(size)
            .or_insert_with(|| sql::transition_batch(size).into())
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queues> {
        // A panic while the lock was held leaves plain queues behind, still consistent.
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The largest transition batch sent with a statement of exactly its size (see
/// `Batcher::transition_text`).
const EXACT_SIZES: usize = 8;

/// Queues a claim and starts a driver if a slot is free.
pub(crate) fn submit_claim(store: &PgStore, batcher: &Arc<Batcher>, job: ClaimJob) {
    let start = {
        let mut q = batcher.lock();
        q.claims.push_back(job);
        take_slot(&mut q, batcher.in_flight)
    };
    if start {
        tokio::spawn(drive(store.clone(), batcher.clone()));
    }
}

/// Queues a transition and starts a driver if a slot is free.
pub(crate) fn submit_transition(store: &PgStore, batcher: &Arc<Batcher>, job: TransitionJob) {
    let start = {
        let mut q = batcher.lock();
        q.transitions.push_back(job);
        take_slot(&mut q, batcher.in_flight)
    };
    if start {
        tokio::spawn(drive(store.clone(), batcher.clone()));
    }
}

fn take_slot(q: &mut Queues, in_flight: usize) -> bool {
    if q.drivers < in_flight {
        q.drivers += 1;
        true
    } else {
        false
    }
}

enum Work {
    Claims(Vec<ClaimJob>),
    Transitions(Vec<TransitionJob>),
}

/// Takes up to `max` jobs with distinct keys from the front of `queue`, dropping those whose
/// caller is gone; a job whose key is already taken keeps its place for the next batch.
fn take<J: Job>(queue: &mut VecDeque<J>, max: usize) -> Vec<J> {
    let mut taken = Vec::new();
    let mut keys = HashSet::new();
    let mut kept = VecDeque::new();
    while let Some(job) = queue.pop_front() {
        if taken.len() == max {
            kept.push_back(job);
            kept.extend(queue.drain(..));
            break;
        }
        if job.abandoned() {
            continue;
        }
        if keys.insert(job.id()) {
            taken.push(job);
        } else {
            kept.push_back(job);
        }
    }
    *queue = kept;
    taken
}

/// One driver: batches until the queues are empty, then gives its slot back.
async fn drive(store: PgStore, batcher: Arc<Batcher>) {
    let mut slot = Slot {
        batcher: &batcher,
        held: true,
    };
    // Claims and transitions alternate when both wait, so neither starves the other.
    let mut claims_first = true;
    loop {
        let work = {
            let mut q = batcher.lock();
            let claims = if claims_first || q.transitions.is_empty() {
                take(&mut q.claims, batcher.max_rows)
            } else {
                Vec::new()
            };
            if !claims.is_empty() {
                Work::Claims(claims)
            } else {
                let transitions = take(&mut q.transitions, batcher.max_rows);
                let claims = if transitions.is_empty() {
                    take(&mut q.claims, batcher.max_rows)
                } else {
                    Vec::new()
                };
                if !transitions.is_empty() {
                    Work::Transitions(transitions)
                } else if !claims.is_empty() {
                    Work::Claims(claims)
                } else {
                    // Given back under the same lock that saw the queues empty, so a request
                    // queued from now on finds the slot free and starts a driver.
                    q.drivers -= 1;
                    slot.held = false;
                    return;
                }
            }
        };
        claims_first = !claims_first;
        match work {
            Work::Claims(jobs) => claim_batch(&store, &batcher, jobs).await,
            Work::Transitions(jobs) => transition_batch(&store, &batcher, jobs).await,
        }
    }
}

/// A driver's slot, given back if the driver ends any other way than by finding the queues
/// empty (a panic, or its task dropped with the runtime): otherwise every slot could leak,
/// and queued requests would wait for ever.
struct Slot<'a> {
    batcher: &'a Batcher,
    held: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if self.held {
            self.batcher.lock().drivers -= 1;
        }
    }
}

/// Sorts by (tenant, key) in byte order: the lock order every batch follows.
fn by_key<J: Job>(jobs: &mut [J]) {
    jobs.sort_by_cached_key(|j| j.id());
}

async fn claim_batch(store: &PgStore, batcher: &Batcher, mut jobs: Vec<ClaimJob>) {
    if jobs.len() == 1 {
        let job = jobs.pop().expect("one job");
        let answer = store.claim_single(job.record, job.events).await;
        let _ = job.reply.send(Reply::Done(answer));
        return;
    }
    by_key(&mut jobs);
    let rows: Vec<Row> = jobs.iter().map(|j| Row::from_record(&j.record)).collect();
    let trace: Vec<String> = jobs.iter().map(|j| trace::encode(&j.events)).collect();
    let col = |f: fn(&Row) -> &String| rows.iter().map(f).collect::<Vec<_>>();
    let opt = |f: fn(&Row) -> &Option<String>| rows.iter().map(f).collect::<Vec<_>>();
    let int = |f: fn(&Row) -> i64| rows.iter().map(f).collect::<Vec<_>>();
    let opt_int = |f: fn(&Row) -> Option<i64>| rows.iter().map(f).collect::<Vec<_>>();
    let (tenant, key, tool, tool_version, fingerprint) = (
        col(|r| &r.tenant),
        col(|r| &r.key),
        col(|r| &r.tool),
        col(|r| &r.tool_version),
        col(|r| &r.fingerprint),
    );
    let (canonicalization, status, fence) = (
        int(|r| r.canonicalization),
        col(|r| &r.status),
        int(|r| r.fence),
    );
    let (lease_owner, lease_expires_at, dispatch, job_id, effect_reference) = (
        opt(|r| &r.lease_owner),
        opt_int(|r| r.lease_expires_at),
        opt(|r| &r.dispatch),
        opt(|r| &r.job_id),
        opt(|r| &r.effect_reference),
    );
    let (result, error_code, error_message, actor, request, approved_by) = (
        opt(|r| &r.result),
        opt(|r| &r.error_code),
        opt(|r| &r.error_message),
        col(|r| &r.actor),
        opt(|r| &r.request),
        opt(|r| &r.approved_by),
    );
    let (created_at, updated_at, expires_at, purge_at) = (
        int(|r| r.created_at),
        int(|r| r.updated_at),
        int(|r| r.expires_at),
        int(|r| r.purge_at),
    );
    let intent_window: Vec<bool> = rows.iter().map(|r| r.intent_window).collect();
    let params: [&(dyn ToSql + Sync); 25] = [
        &tenant,
        &key,
        &tool,
        &tool_version,
        &fingerprint,
        &canonicalization,
        &status,
        &fence,
        &lease_owner,
        &lease_expires_at,
        &dispatch,
        &job_id,
        &effect_reference,
        &result,
        &error_code,
        &error_message,
        &actor,
        &request,
        &approved_by,
        &created_at,
        &updated_at,
        &expires_at,
        &purge_at,
        &trace,
        &intent_window,
    ];
    count(batcher, jobs.len());
    let answer = match conn::checkout(&batcher.pool, batcher.deadline).await {
        Ok(mut conn) => conn.run(Kind::Write, sql::CLAIM_BATCH, &params).await,
        Err(e) => Err(e),
    };
    let rows = match answer {
        Ok(rows) => rows,
        Err(e) => return fail(jobs.into_iter().map(|j| j.reply), e),
    };
    // Per key: the inserted row if there is one (see the single claim for why both may come
    // back), else the existing one.
    let mut found: std::collections::HashMap<String, (bool, &tokio_postgres::Row)> =
        std::collections::HashMap::with_capacity(rows.len());
    for r in &rows {
        let inserted = r.try_get::<_, bool>(0).unwrap_or(false);
        let Ok(key) = r.try_get::<_, String>(2) else {
            continue;
        };
        let entry = found.entry(key).or_insert((inserted, r));
        if inserted && !entry.0 {
            *entry = (inserted, r);
        }
    }
    for job in jobs {
        let reply = match found.get(job.record.key.as_str()) {
            // Only the key comes back for an inserted row: it is the record sent.
            Some((true, _)) => Reply::Done(Ok(Claimed::Inserted(job.record))),
            Some((false, r)) => Reply::Done(record_of(r, 1).map(Claimed::Existing)),
            // Neither inserted nor seen: committed by another claim after this statement's
            // snapshot. The single claim reads again with a new one.
            None => Reply::Alone,
        };
        let _ = job.reply.send(reply);
    }
}

async fn transition_batch(store: &PgStore, batcher: &Batcher, mut jobs: Vec<TransitionJob>) {
    if jobs.len() == 1 {
        let job = jobs.pop().expect("one job");
        let answer = store.transition_single(job.transition).await;
        let _ = job.reply.send(Reply::Done(answer));
        return;
    }
    by_key(&mut jobs);
    let mut next = Vec::with_capacity(jobs.len());
    for job in &jobs {
        let mut row = Row::default();
        row.set_state(&job.transition.next);
        next.push(row);
    }
    let ts: Vec<&Transition> = jobs.iter().map(|j| &j.transition).collect();
    let tenant: Vec<&str> = ts.iter().map(|t| t.key.tenant()).collect();
    let key: Vec<&str> = ts.iter().map(|t| t.key.as_str()).collect();
    let expect_fence: Vec<i64> = ts.iter().map(|t| t.expect.fence as i64).collect();
    let expect_status: Vec<&str> = ts.iter().map(|t| t.expect.status.as_str()).collect();
    let expired_by: Vec<Option<i64>> = ts.iter().map(|t| t.expect.lease_expired_by).collect();
    let expect_dispatch: Vec<Option<&str>> = ts.iter().map(|t| t.expect.dispatch).collect();
    let expect_created: Vec<i64> = ts.iter().map(|t| t.expect.created_at).collect();
    let status: Vec<&String> = next.iter().map(|r| &r.status).collect();
    let fence: Vec<i64> = ts.iter().map(|t| t.fence as i64).collect();
    let opt = |f: fn(&Row) -> &Option<String>| next.iter().map(f).collect::<Vec<_>>();
    let lease_owner = opt(|r| &r.lease_owner);
    let lease_expires_at: Vec<Option<i64>> = next.iter().map(|r| r.lease_expires_at).collect();
    let dispatch = opt(|r| &r.dispatch);
    let job_id = opt(|r| &r.job_id);
    let effect_reference = opt(|r| &r.effect_reference);
    let result = opt(|r| &r.result);
    let error_code = opt(|r| &r.error_code);
    let error_message = opt(|r| &r.error_message);
    let (replace_request, request): (Vec<bool>, Vec<Option<String>>) =
        ts.iter().map(|t| request_columns(&t.request)).unzip();
    let approved_by: Vec<Option<&str>> = ts.iter().map(|t| t.approved_by.as_deref()).collect();
    let fingerprint: Vec<Option<&str>> = ts
        .iter()
        .map(|t| t.fingerprint.as_ref().map(|f| f.as_str()))
        .collect();
    let now: Vec<i64> = ts.iter().map(|t| t.now).collect();
    let (expires_at, purge_at): (Vec<Option<i64>>, Vec<Option<i64>>) =
        ts.iter().map(|t| expiry_columns(t.expiry)).unzip();
    let trace: Vec<String> = ts.iter().map(|t| trace::encode(&t.events)).collect();
    let params: [&(dyn ToSql + Sync); 25] = [
        &tenant,
        &key,
        &expect_fence,
        &expect_status,
        &expired_by,
        &status,
        &fence,
        &lease_owner,
        &lease_expires_at,
        &dispatch,
        &job_id,
        &effect_reference,
        &result,
        &error_code,
        &error_message,
        &replace_request,
        &request,
        &approved_by,
        &fingerprint,
        &now,
        &trace,
        &expires_at,
        &purge_at,
        &expect_dispatch,
        &expect_created,
    ];
    count(batcher, jobs.len());
    let answer = match conn::checkout(&batcher.pool, batcher.deadline).await {
        Ok(mut conn) => {
            let text = batcher.transition_text(jobs.len());
            conn.run(Kind::Write, &text, &params).await
        }
        Err(e) => Err(e),
    };
    let rows = match answer {
        Ok(rows) => rows,
        Err(e) => return fail(jobs.into_iter().map(|j| j.reply), e),
    };
    let mut done: Vec<Option<&tokio_postgres::Row>> = vec![None; jobs.len()];
    for r in &rows {
        // The ordinality of the request within the (sorted) batch, from 1.
        if let Ok(ord) = r.try_get::<_, i64>(0)
            && let Some(slot) = usize::try_from(ord - 1).ok().and_then(|i| done.get_mut(i))
        {
            *slot = Some(r);
        }
    }
    for ((job, row), next) in jobs.into_iter().zip(done).zip(next) {
        let reply = match row {
            Some(r) => Reply::Done(written_of(r, 1, &job.transition, next).map(Cas::Done)),
            // The expectation no longer held; the caller reads the record as it now is.
            None => Reply::Lost,
        };
        let _ = job.reply.send(reply);
    }
}

fn count(batcher: &Batcher, rows: usize) {
    use std::sync::atomic::Ordering::Relaxed;
    batcher.statements.fetch_add(1, Relaxed);
    batcher.rows.fetch_add(rows as u64, Relaxed);
}

/// A failed batch: `Ambiguous` (the statement was sent and no answer says whether it
/// committed) goes to every caller; anything else means nothing changed, and every caller
/// runs its own single statement, so that one bad row fails alone.
fn fail<T>(replies: impl Iterator<Item = oneshot::Sender<Reply<T>>>, e: store::Error) {
    for reply in replies {
        let answer = match &e {
            store::Error::Ambiguous(_) => Reply::Done(Err(e.clone())),
            _ => Reply::Alone,
        };
        let _ = reply.send(answer);
    }
}
