//! [`FaultyStore`]: a real store, wrapped, that fails on command.
//!
//! Faults are injected by wrapping the real thing rather than by mocking it: every call goes to
//! the inner store unless a fault says otherwise, so what the executor sees after a fault is
//! what a real database would hold. Two kinds of write fault cover the two things a caller can
//! be told ([`store::Error`](Error)):
//!
//! - [`Fault::Before`] — the write never reaches the inner store and the caller gets
//!   [`Error::Unavailable`]: nothing changed, as the error promises.
//! - [`Fault::AfterCommit`] — the inner store commits the write, then the caller gets
//!   [`Error::Ambiguous`]: the connection was lost during commit, and the write did happen.
//!
//! Faults are scheduled by write number ([`FaultyStore::fail_write`]), or cover every write or
//! read for an outage. Writes are `claim`, `transition`, `append_events` and `sweep`; reads are
//! everything else. Counting is by arrival, so a schedule means the same thing on every run.
//! Every call is counted per method ([`Counts`]), so a test can assert that a replay performed
//! no transition. Two [`Gate`]s pause a worker just after its claim inserted and just before
//! a transition.

use idemgate_core::webhook::{JobMatch, Recorded, WebhookEvent};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use idemgate_core::audit::Entry;
use idemgate_core::key::OperationKey;
use idemgate_core::record::{Event, Millis, Record, RecordStatus};
use idemgate_core::store::{
    BoxFuture, Cas, Claimed, Due, Error, Filter, Store, SweepReport, Transition, Waiting,
};

use crate::gate::Gate;

/// How a scheduled write fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Refuse before the inner store is called: nothing is written, the caller gets
    /// [`Error::Unavailable`].
    Before,
    /// Let the inner store commit, then tell the caller [`Error::Ambiguous`].
    AfterCommit,
}

/// Calls received, per method, faulted ones included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub get: u64,
    pub claim: u64,
    pub transition: u64,
    pub append_events: u64,
    pub events: u64,
    pub list: u64,
    pub due: u64,
    pub sweep: u64,
}

impl Counts {
    pub fn reads(&self) -> u64 {
        self.get + self.events + self.list + self.due
    }

    pub fn writes(&self) -> u64 {
        self.claim + self.transition + self.append_events + self.sweep
    }
}

/// A [`Store`] that delegates to `S` and injects the faults it is told to.
#[derive(Debug)]
pub struct FaultyStore<S> {
    inner: S,
    // A std mutex: held only to count and to pick a fault, never across a call to the inner
    // store or a gate.
    state: Mutex<State>,
    after_claim: Gate,
    before_transition: Gate,
    /// Set by [`FaultyStore::read_first`]: claim only after a read, whatever the inner store
    /// offers.
    read_first: bool,
}

#[derive(Debug, Default)]
struct State {
    counts: Counts,
    /// Faults by the number of the write they apply to (counted over all writes, from 1).
    scheduled: BTreeMap<u64, Fault>,
    all_writes: bool,
    all_reads: bool,
    fired: u64,
}

/// Which write method a call is, for counting.
#[derive(Clone, Copy)]
enum Write {
    Claim,
    Transition,
    AppendEvents,
    Sweep,
}

#[derive(Clone, Copy)]
enum Read {
    Get,
    Events,
    List,
    Due,
}

impl<S> FaultyStore<S> {
    /// Wraps `inner` with no faults scheduled.
    pub fn new(inner: S) -> FaultyStore<S> {
        FaultyStore {
            inner,
            state: Mutex::new(State::default()),
            after_claim: Gate::new("store.after_claim"),
            before_transition: Gate::new("store.before_transition"),
            read_first: false,
        }
    }

    /// Makes the executor read a key before claiming it even where the inner store offers
    /// claim-first ([`Store::claim_replaces_read`]): the other path, for running a matrix on
    /// both. Without it the wrapper forwards the inner store's answer.
    pub fn read_first(mut self) -> FaultyStore<S> {
        self.read_first = true;
        self
    }

    /// The real store, to read back what was actually written, bypassing faults and counters.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Fails the `n`th write call from now (`1` is the next one). Scheduling a second fault for
    /// the same write replaces the first.
    pub fn fail_write(&self, n: u64, fault: Fault) {
        assert!(n >= 1, "FaultyStore::fail_write counts writes from 1");
        let mut state = self.lock();
        let at = state.counts.writes() + n;
        state.scheduled.insert(at, fault);
    }

    /// While on, every write fails before reaching the inner store ([`Error::Unavailable`]).
    pub fn fail_all_writes(&self, on: bool) {
        self.lock().all_writes = on;
    }

    /// While on, every read fails ([`Error::Unavailable`]).
    pub fn fail_all_reads(&self, on: bool) {
        self.lock().all_reads = on;
    }

    /// Ends any outage and drops every fault not yet fired.
    pub fn heal(&self) {
        let mut state = self.lock();
        state.scheduled.clear();
        state.all_writes = false;
        state.all_reads = false;
    }

    /// Faults that have fired, outages included.
    pub fn faults_fired(&self) -> u64 {
        self.lock().fired
    }

    /// Scheduled faults that have not fired yet.
    pub fn faults_pending(&self) -> usize {
        self.lock().scheduled.len()
    }

    /// Calls received so far, per method.
    pub fn counts(&self) -> Counts {
        self.lock().counts
    }

    pub fn reads(&self) -> u64 {
        self.lock().counts.reads()
    }

    pub fn writes(&self) -> u64 {
        self.lock().counts.writes()
    }

    /// Passed after a claim that inserted has returned from the inner store, before the caller
    /// hears of it: the record exists and the worker has not acted on it. A claim that found
    /// an existing record does not pass.
    pub fn after_claim(&self) -> &Gate {
        &self.after_claim
    }

    /// Passed when a transition arrives, before any fault is applied or the inner store is
    /// called. An outage switched on while a worker waits here applies to its transition.
    pub fn before_transition(&self) -> &Gate {
        &self.before_transition
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts a write and returns its number.
    fn arrive(&self, write: Write) -> u64 {
        let mut state = self.lock();
        let counts = &mut state.counts;
        match write {
            Write::Claim => counts.claim += 1,
            Write::Transition => counts.transition += 1,
            Write::AppendEvents => counts.append_events += 1,
            Write::Sweep => counts.sweep += 1,
        }
        counts.writes()
    }

    /// The fault for write number `n`, if any: an outage first, then a scheduled one.
    fn fault_for(&self, n: u64) -> Option<Fault> {
        let mut state = self.lock();
        let scheduled = state.scheduled.remove(&n);
        let fault = if state.all_writes {
            Some(Fault::Before)
        } else {
            scheduled
        };
        if fault.is_some() {
            state.fired += 1;
        }
        fault
    }

    /// Counts a read; an error if reads are down.
    fn read(&self, read: Read) -> Result<(), Error> {
        let mut state = self.lock();
        let counts = &mut state.counts;
        match read {
            Read::Get => counts.get += 1,
            Read::Events => counts.events += 1,
            Read::List => counts.list += 1,
            Read::Due => counts.due += 1,
        }
        if state.all_reads {
            state.fired += 1;
            return Err(Error::Unavailable("injected: store reads are down".into()));
        }
        Ok(())
    }
}

fn refused(n: u64) -> Error {
    Error::Unavailable(format!(
        "injected: write {n} refused before reaching the store"
    ))
}

fn lost(n: u64) -> Error {
    Error::Ambiguous(format!(
        "injected: write {n} committed, then its answer was lost"
    ))
}

/// Applies a write fault around the inner call: skip it, or run it and hide its success.
/// Takes the write as a closure rather than a future: a store may do its work when the
/// method is called rather than when the future is polled, and `Before` must not even call it.
async fn around<T, F>(n: u64, fault: Option<Fault>, write: impl FnOnce() -> F) -> Result<T, Error>
where
    F: Future<Output = Result<T, Error>>,
{
    match fault {
        None => write().await,
        Some(Fault::Before) => Err(refused(n)),
        // A real error from the inner store is reported as it is: it did not commit.
        Some(Fault::AfterCommit) => write().await.and_then(|_| Err(lost(n))),
    }
}

impl<S: Store> Store for FaultyStore<S> {
    fn get<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async move {
            self.read(Read::Get)?;
            self.inner.get(key).await
        })
    }

    fn claim(&self, record: Record, events: Vec<Event>) -> BoxFuture<'_, Result<Claimed, Error>> {
        Box::pin(async move {
            let n = self.arrive(Write::Claim);
            let fault = self.fault_for(n);
            let claimed = around(n, fault, || self.inner.claim(record, events)).await?;
            if let Claimed::Inserted(_) = claimed {
                self.after_claim.pass().await;
            }
            Ok(claimed)
        })
    }

    /// The inner store's answer, unless [`FaultyStore::read_first`] chose the read-first path:
    /// the fault matrix then runs the path production takes on that store.
    fn claim_replaces_read(&self) -> bool {
        !self.read_first && self.inner.claim_replaces_read()
    }

    fn claim_unless_duplicate(
        &self,
        record: Record,
        events: Vec<Event>,
        since: Millis,
    ) -> BoxFuture<'_, Result<Claimed, Error>> {
        Box::pin(async move {
            let n = self.arrive(Write::Claim);
            let fault = self.fault_for(n);
            let claimed = around(n, fault, || {
                self.inner.claim_unless_duplicate(record, events, since)
            })
            .await?;
            if let Claimed::Inserted(_) = claimed {
                self.after_claim.pass().await;
            }
            Ok(claimed)
        })
    }

    fn transition(&self, transition: Transition) -> BoxFuture<'_, Result<Cas, Error>> {
        Box::pin(async move {
            let n = self.arrive(Write::Transition);
            self.before_transition.pass().await;
            let fault = self.fault_for(n);
            around(n, fault, || self.inner.transition(transition)).await
        })
    }

    /// Read as it is, without faults: the log is exported by operators, never on a delivery's
    /// path.
    fn audit_log(&self, after: u64, limit: usize) -> BoxFuture<'_, Result<Vec<Entry>, Error>> {
        self.inner.audit_log(after, limit)
    }

    fn append_events<'a>(
        &'a self,
        key: &'a OperationKey,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let n = self.arrive(Write::AppendEvents);
            let fault = self.fault_for(n);
            around(n, fault, || self.inner.append_events(key, events)).await
        })
    }

    fn events<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Vec<Event>, Error>> {
        Box::pin(async move {
            self.read(Read::Events)?;
            self.inner.events(key).await
        })
    }

    fn list(&self, filter: Filter) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        Box::pin(async move {
            self.read(Read::List)?;
            self.inner.list(filter).await
        })
    }

    fn count<'a>(
        &'a self,
        environment: &'a str,
        status: RecordStatus,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(async move {
            self.read(Read::List)?;
            self.inner.count(environment, status).await
        })
    }

    fn due(&self, query: Due) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        Box::pin(async move {
            self.read(Read::Due)?;
            self.inner.due(query).await
        })
    }

    /// Faults as a listing: it is one.
    fn waiting(&self, query: Waiting) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        Box::pin(async move {
            self.read(Read::List)?;
            self.inner.waiting(query).await
        })
    }

    fn sweep<'a>(
        &'a self,
        environment: &'a str,
        now: Millis,
        limit: usize,
    ) -> BoxFuture<'a, Result<SweepReport, Error>> {
        Box::pin(async move {
            let n = self.arrive(Write::Sweep);
            let fault = self.fault_for(n);
            around(n, fault, || self.inner.sweep(environment, now, limit)).await
        })
    }
    fn webhook<'a>(
        &'a self,
        source: &'a str,
        event_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<WebhookEvent>, Error>> {
        self.inner.webhook(source, event_id)
    }

    fn record_webhook(&self, event: WebhookEvent) -> BoxFuture<'_, Result<Recorded, Error>> {
        self.inner.record_webhook(event)
    }

    fn webhooks_for_job<'a>(
        &'a self,
        tenant: &'a str,
        job_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<WebhookEvent>, Error>> {
        self.inner.webhooks_for_job(tenant, job_id)
    }

    fn open_jobs<'a>(&'a self, m: JobMatch<'a>) -> BoxFuture<'a, Result<Vec<Record>, Error>> {
        self.inner.open_jobs(m)
    }

    fn sweep_webhooks(&self, now: Millis, limit: usize) -> BoxFuture<'_, Result<u64, Error>> {
        self.inner.sweep_webhooks(now, limit)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use idemgate_core::record::{Dispatch, EventKind, Lease, Receipt, RecordState, RecordStatus};
    use idemgate_core::store::{Expect, RequestUpdate};
    use serde_json::json;

    use super::*;
    use crate::gate::bounded;
    use crate::mem::MemStore;
    use idemgate_core::fingerprint::Fingerprint;

    fn key(step: &str) -> OperationKey {
        OperationKey::new("acme", "test", "wf", step).unwrap()
    }

    fn record(step: &str) -> Record {
        Record {
            key: key(step),
            tool: "t".into(),
            tool_version: "1".into(),
            fingerprint: Fingerprint::parse(&format!("sha256:{}", "a".repeat(64))).unwrap(),
            canonicalization: 1,
            state: RecordState::Pending {
                lease: Lease {
                    owner: Some("w1".into()),
                    expires_at: 100,
                },
                dispatch: Dispatch::NotSent,
            },
            fence: 1,
            actor: "agent".into(),
            request: Some(json!({"a": 1})),
            approved_by: None,
            created_at: 0,
            updated_at: 0,
            expires_at: 1_000,
            purge_at: 2_000,
            intent_window: false,
        }
    }

    fn apply(step: &str) -> Transition {
        Transition {
            key: key(step),
            expect: Expect {
                fence: 1,
                status: RecordStatus::Pending,
                created_at: 0,
                lease_expired_by: None,
                dispatch: None,
            },
            next: RecordState::Applied(Receipt {
                reference: "ticket_1".into(),
                result: json!({"ticket_id": "ticket_1"}),
            }),
            fence: 1,
            request: RequestUpdate::Clear,
            approved_by: None,
            fingerprint: None,
            expiry: None,
            events: vec![Event::new(EventKind::Committed, 10, 1, "w1")],
            now: 10,
            webhook: None,
            audit: None,
        }
    }

    async fn status_in_inner(store: &FaultyStore<MemStore>, step: &str) -> Option<RecordStatus> {
        store
            .inner()
            .get(&key(step))
            .await
            .unwrap()
            .map(|r| r.status())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_store_without_faults_still_passes_the_store_suite() {
        crate::store_suite::run(|| async { FaultyStore::new(MemStore::new()) }).await;
    }

    #[tokio::test]
    async fn healthy_store_passes_everything_through() {
        let store = FaultyStore::new(MemStore::new());
        let r = record("s1");
        assert_eq!(
            store.claim(r.clone(), vec![]).await,
            Ok(Claimed::Inserted(r.clone()))
        );
        assert_eq!(store.get(&key("s1")).await, Ok(Some(r)));
        assert!(matches!(
            store.transition(apply("s1")).await,
            Ok(Cas::Done(_))
        ));
        assert_eq!(store.faults_fired(), 0);
    }

    #[tokio::test]
    async fn before_writes_nothing() {
        let store = FaultyStore::new(MemStore::new());
        store.fail_write(1, Fault::Before);
        let got = store.claim(record("s1"), vec![]).await;
        assert!(matches!(got, Err(Error::Unavailable(_))), "{got:?}");
        assert_eq!(status_in_inner(&store, "s1").await, None);
        // One call, one fault: the retry goes through.
        assert!(matches!(
            store.claim(record("s1"), vec![]).await,
            Ok(Claimed::Inserted(_))
        ));
    }

    #[tokio::test]
    async fn after_commit_really_committed() {
        let store = FaultyStore::new(MemStore::new());
        store.fail_write(1, Fault::AfterCommit);
        let got = store.claim(record("s1"), vec![]).await;
        assert!(matches!(got, Err(Error::Ambiguous(_))), "{got:?}");
        assert_eq!(
            status_in_inner(&store, "s1").await,
            Some(RecordStatus::Pending)
        );

        store.fail_write(1, Fault::AfterCommit);
        let got = store.transition(apply("s1")).await;
        assert!(matches!(got, Err(Error::Ambiguous(_))), "{got:?}");
        assert_eq!(
            status_in_inner(&store, "s1").await,
            Some(RecordStatus::Applied)
        );
        let trace = store.inner().events(&key("s1")).await.unwrap();
        assert_eq!(
            trace.len(),
            1,
            "the transition's event was committed with it"
        );

        // A caller re-reading after the ambiguity sees the truth; a retry of the same
        // transition loses, as a compare-and-set against the committed write should.
        assert!(matches!(
            store.transition(apply("s1")).await,
            Ok(Cas::Lost(Some(_)))
        ));
    }

    #[tokio::test]
    async fn nth_write_counts_from_now_over_all_write_methods() {
        let store = FaultyStore::new(MemStore::new());
        store.claim(record("s0"), vec![]).await.unwrap();
        store.fail_write(3, Fault::Before);
        let k = key("s1");
        let event = || vec![Event::new(EventKind::InFlight, 1, 1, "w")];
        store.claim(record("s1"), vec![]).await.unwrap(); // write 1 from now
        store.append_events(&k, event()).await.unwrap(); // write 2
        let third = store.transition(apply("s1")).await; // write 3
        assert!(matches!(third, Err(Error::Unavailable(_))), "{third:?}");
        assert_eq!(
            status_in_inner(&store, "s1").await,
            Some(RecordStatus::Pending)
        );
        assert!(store.sweep("test", 0, 10).await.is_ok()); // write 4
        assert_eq!((store.faults_fired(), store.faults_pending()), (1, 0));
        assert_eq!(store.writes(), 5);
    }

    #[tokio::test]
    async fn outages_fail_every_call_of_their_kind_until_healed() {
        let store = FaultyStore::new(MemStore::new());
        store.claim(record("s1"), vec![]).await.unwrap();
        store.fail_all_writes(true);
        let k = key("s1");
        assert!(matches!(
            store.transition(apply("s1")).await,
            Err(Error::Unavailable(_))
        ));
        assert!(matches!(
            store.append_events(&k, vec![]).await,
            Err(Error::Unavailable(_))
        ));
        assert!(matches!(
            store.claim(record("s2"), vec![]).await,
            Err(Error::Unavailable(_))
        ));
        // Reads still work during a write outage.
        assert_eq!(
            store.get(&k).await.unwrap().unwrap().status(),
            RecordStatus::Pending
        );
        assert_eq!(status_in_inner(&store, "s2").await, None);

        store.fail_all_reads(true);
        assert!(matches!(store.get(&k).await, Err(Error::Unavailable(_))));
        assert!(matches!(
            store.list(Filter::default()).await,
            Err(Error::Unavailable(_))
        ));
        store.heal();
        assert!(store.get(&k).await.is_ok());
        assert!(matches!(
            store.transition(apply("s1")).await,
            Ok(Cas::Done(_))
        ));
    }

    #[tokio::test]
    async fn counts_show_a_replay_that_never_transitions() {
        let store = FaultyStore::new(MemStore::new());
        store.claim(record("s1"), vec![]).await.unwrap();
        store.transition(apply("s1")).await.unwrap();
        let before = store.counts();
        // What a replay does: claim-or-load finds the record, the trace gets its entry.
        assert!(matches!(
            store.claim(record("s1"), vec![]).await,
            Ok(Claimed::Existing(_))
        ));
        let replayed = vec![Event::new(EventKind::Replayed, 20, 1, "w2")];
        store.append_events(&key("s1"), replayed).await.unwrap();
        let after = store.counts();
        assert_eq!(after.transition, before.transition);
        assert_eq!(after.claim, before.claim + 1);
        assert_eq!(after.writes(), before.writes() + 2);
        assert_eq!(after.reads(), 0);
    }

    #[tokio::test]
    async fn after_claim_gate_pauses_a_worker_that_owns_the_record() {
        let store = Arc::new(FaultyStore::new(MemStore::new()));
        store.after_claim().arm();
        let worker = tokio::spawn({
            let store = store.clone();
            async move { store.claim(record("s1"), vec![]).await }
        });
        store.after_claim().reached().await;
        // The claim is in the store; a second worker finds it without passing the gate.
        assert!(matches!(
            store.claim(record("s1"), vec![]).await,
            Ok(Claimed::Existing(_))
        ));
        assert!(!worker.is_finished());
        store.after_claim().release();
        assert!(matches!(
            bounded("worker", worker).await.unwrap(),
            Ok(Claimed::Inserted(_))
        ));
        assert_eq!(store.after_claim().passes(), 1);
    }

    #[tokio::test]
    async fn before_transition_gate_pauses_before_the_write_and_its_faults() {
        let store = Arc::new(FaultyStore::new(MemStore::new()));
        store.claim(record("s1"), vec![]).await.unwrap();
        store.before_transition().arm();
        let worker = tokio::spawn({
            let store = store.clone();
            async move { store.transition(apply("s1")).await }
        });
        store.before_transition().reached().await;
        assert_eq!(
            status_in_inner(&store, "s1").await,
            Some(RecordStatus::Pending)
        );
        // The database goes down while the worker is paused: its write must fail.
        store.fail_all_writes(true);
        store.before_transition().release();
        assert!(matches!(
            bounded("worker", worker).await.unwrap(),
            Err(Error::Unavailable(_))
        ));
        assert_eq!(
            status_in_inner(&store, "s1").await,
            Some(RecordStatus::Pending)
        );
    }
}
