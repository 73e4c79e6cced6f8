//! [`MemStore`]: the reference store, in memory.
//!
//! It implements the [`Store`] trait as literally as its docs read, with no durability and no
//! concurrency tricks: one mutex around two ordered maps. That makes it the store of the
//! deterministic simulation (executor, store, downstream and clock in one thread under a seed)
//! and of tests that need a real store without a database, such as those of
//! [`FaultyStore`](crate::faulty::FaultyStore). Where the trait leaves a choice open, this store
//! documents the one it makes, so the SQL stores can be held to the same answer.
//!
//! Clones share one set of records, like two connections to one database.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use idemgate_core::audit::{Entry, Head, Sealer};
use idemgate_core::key::OperationKey;
use idemgate_core::record::{Digest, Event, EventKind, Millis, Record, RecordState, RecordStatus};
use idemgate_core::store::{
    BoxFuture, Cas, Claimed, Due, Error, Expect, Filter, RequestUpdate, Store, SweepReport,
    Transition, Waiting, due_at,
};
use idemgate_core::webhook::{Disposition, JobMatch, Recorded, WebhookEvent};

/// The worker name on `expired` events appended by a sweep.
pub const SWEEPER: &str = "sweeper";

/// An in-memory [`Store`]. Each call does its whole work in the first poll of its future,
/// under one lock and without awaiting, so it is atomic and deterministic; like a database
/// statement, nothing happens until the future is polled.
#[derive(Clone, Debug, Default)]
pub struct MemStore {
    // A std mutex: every method does its whole work under one lock and never awaits, which is
    // exactly the atomicity a database transaction gives the SQL stores.
    inner: Arc<Mutex<Tables>>,
    /// Seals audit entries (unsigned unless [`MemStore::with_sealer`] gave a key).
    sealer: Sealer,
}

#[derive(Debug, Default)]
struct Tables {
    // Ordered maps, so listing by key and every scan are deterministic.
    records: BTreeMap<OperationKey, Record>,
    // Traces live apart from records, like an events table: appending to a key without a
    // record is allowed, and only a purge deletes a trace.
    events: BTreeMap<OperationKey, Vec<Event>>,
    // The audit log, in sequence order; appended only with the transition it records.
    audit: Vec<Entry>,
    // Webhook deduplication rows by (source, event id), in arrival order within a key.
    webhooks: BTreeMap<(String, String), WebhookEvent>,
}

/// The dedup rule of [`WebhookEvent`]: written when no row exists or the existing one is early.
fn may_write(tables: &Tables, event: &WebhookEvent) -> Option<WebhookEvent> {
    tables
        .webhooks
        .get(&(event.source.clone(), event.event_id.clone()))
        .filter(|existing| existing.disposition != Disposition::Early)
        .cloned()
}

impl MemStore {
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// This store with audit entries sealed by `sealer` (clones made before share the records
    /// but keep their own sealer).
    pub fn with_sealer(mut self, sealer: Sealer) -> MemStore {
        self.sealer = sealer;
        self
    }

    /// Number of records held, tombstones included.
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().records.is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, Tables> {
        // Every write happens whole under the lock, so a panic elsewhere cannot leave a half
        // transition behind: the tables stay valid.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A listing's page size when the filter gives none (`limit: 0`, as `Filter::default()` has),
/// so a default filter never lists an unbounded table.
pub const DEFAULT_PAGE: usize = 100;

fn page(limit: usize) -> usize {
    if limit == 0 { DEFAULT_PAGE } else { limit }
}

/// Whether `record` still looks as the executor saw it.
fn matches(record: &Record, expect: &Expect) -> bool {
    if record.fence != expect.fence
        || record.status() != expect.status
        || record.created_at != expect.created_at
    {
        return false;
    }
    if let Some(tag) = expect.dispatch
        && record.pending_dispatch().map(|d| d.tag()) != Some(tag)
    {
        return false;
    }
    match expect.lease_expired_by {
        None => true,
        // A takeover needs a lease that expired at or before the instant the executor judged
        // it by; a renewal since then moved the expiry later and wins. A record without a
        // lease has nothing to take over.
        Some(by) => record.lease().is_some_and(|lease| lease.expires_at <= by),
    }
}

/// The sweep's compaction of one settled record: what it settled as kept, result and request
/// dropped.
fn compact(record: &mut Record, now: Millis) {
    let digest = match &record.state {
        RecordState::Applied(receipt) => Digest::Applied {
            reference: receipt.reference.clone(),
        },
        RecordState::FailedPermanent(refusal) => Digest::Refused { code: refusal.code },
        RecordState::Pending { .. }
        | RecordState::AwaitingApproval { .. }
        | RecordState::Unknown(_)
        | RecordState::Tombstone(_) => {
            unreachable!("only settled records are compacted")
        }
    };
    record.state = RecordState::Tombstone(digest);
    record.request = None;
    record.updated_at = now;
}

fn compactable(record: &Record, environment: &str, now: Millis) -> bool {
    let settled = match record.status() {
        RecordStatus::Applied | RecordStatus::FailedPermanent => true,
        // Pending, awaiting approval and unknown records have not settled: their effect may
        // still happen or arrive. Tombstones are done.
        RecordStatus::Pending
        | RecordStatus::AwaitingApproval
        | RecordStatus::Unknown
        | RecordStatus::Tombstone => false,
    };
    settled && record.key.environment() == environment && record.expires_at <= now
}

impl Store for MemStore {
    fn get<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async move {
            let found = self.lock().records.get(key).cloned();
            Ok(found)
        })
    }

    fn claim(&self, record: Record, events: Vec<Event>) -> BoxFuture<'_, Result<Claimed, Error>> {
        Box::pin(async move {
            let mut tables = self.lock();
            let claimed = match tables.records.get(&record.key) {
                // The existing record is returned unchanged, and the caller's events are not
                // appended: they describe a claim that did not happen.
                Some(existing) => Claimed::Existing(existing.clone()),
                None => {
                    tables
                        .events
                        .entry(record.key.clone())
                        .or_default()
                        .extend(events);
                    tables.records.insert(record.key.clone(), record.clone());
                    Claimed::Inserted(record)
                }
            };
            Ok(claimed)
        })
    }

    // The read-first path, which the scenarios' read and write counts were written against;
    // PostgreSQL runs the scenario matrix on both paths.
    fn claim_replaces_read(&self) -> bool {
        false
    }

    fn claim_unless_duplicate(
        &self,
        record: Record,
        events: Vec<Event>,
        since: Millis,
    ) -> BoxFuture<'_, Result<Claimed, Error>> {
        Box::pin(async move {
            let mut tables = self.lock();
            if let Some(existing) = tables.records.get(&record.key) {
                return Ok(Claimed::Existing(existing.clone()));
            }
            // Of several matches in the same tenant and environment, the earliest created (then
            // the smallest key), so the answer is the same on every run. Checked and inserted
            // under one lock: atomic.
            let duplicate = tables
                .records
                .values()
                .filter(|r| {
                    r.intent_window
                        && r.key != record.key
                        && r.tenant() == record.tenant()
                        && r.key.environment() == record.key.environment()
                        && r.tool == record.tool
                        && r.fingerprint == record.fingerprint
                        && r.created_at >= since
                })
                .min_by(|a, b| (a.created_at, &a.key).cmp(&(b.created_at, &b.key)))
                .map(|r| r.key.clone());
            if let Some(other) = duplicate {
                return Ok(Claimed::DuplicateIntent(other));
            }
            tables
                .events
                .entry(record.key.clone())
                .or_default()
                .extend(events);
            tables.records.insert(record.key.clone(), record.clone());
            Ok(Claimed::Inserted(record))
        })
    }

    fn transition(&self, transition: Transition) -> BoxFuture<'_, Result<Cas, Error>> {
        Box::pin(async move {
            let mut tables = self.lock();
            let Transition {
                key,
                expect,
                next,
                fence,
                request,
                approved_by,
                fingerprint,
                expiry,
                events,
                now,
                webhook,
                audit,
            } = transition;
            let decided = webhook.as_ref().and_then(|w| may_write(&tables, w));
            let cas = match tables.records.get_mut(&key) {
                None => Cas::Lost(None),
                Some(record) if !matches(record, &expect) || decided.is_some() => {
                    Cas::Lost(Some(record.clone()))
                }
                Some(record) => {
                    record.state = next;
                    record.fence = fence;
                    match request {
                        RequestUpdate::Keep => {}
                        RequestUpdate::Clear => record.request = None,
                        RequestUpdate::Set(value) => record.request = Some(value),
                    }
                    if approved_by.is_some() {
                        record.approved_by = approved_by;
                    }
                    if let Some(fingerprint) = fingerprint {
                        record.fingerprint = fingerprint;
                    }
                    if let Some(expiry) = expiry {
                        record.expires_at = expiry.expires_at;
                        record.purge_at = expiry.purge_at;
                    }
                    record.updated_at = now;
                    let done = record.clone();
                    tables.events.entry(key).or_default().extend(events);
                    if let Some(w) = webhook {
                        tables
                            .webhooks
                            .insert((w.source.clone(), w.event_id.clone()), w);
                    }
                    if let Some(draft) = audit {
                        let head = match tables.audit.last() {
                            Some(last) => last.head().map_err(|e| {
                                Error::Corrupt(format!("audit entry {}: {e}", last.seq))
                            })?,
                            None => Head::GENESIS,
                        };
                        let entry = self.sealer.seal(&draft, head);
                        tables.audit.push(entry);
                    }
                    Cas::Done(done)
                }
            };
            Ok(cas)
        })
    }

    fn audit_log(&self, after: u64, limit: usize) -> BoxFuture<'_, Result<Vec<Entry>, Error>> {
        Box::pin(async move {
            let tables = self.lock();
            Ok(tables
                .audit
                .iter()
                .filter(|e| e.seq > after)
                .take(page(limit))
                .cloned()
                .collect())
        })
    }

    fn append_events<'a>(
        &'a self,
        key: &'a OperationKey,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.lock()
                .events
                .entry(key.clone())
                .or_default()
                .extend(events);
            Ok(())
        })
    }

    fn events<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Vec<Event>, Error>> {
        Box::pin(async move {
            let trace = self.lock().events.get(key).cloned().unwrap_or_default();
            Ok(trace)
        })
    }

    fn list(&self, filter: Filter) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        Box::pin(async move {
            let tables = self.lock();
            let found = tables
                .records
                .values()
                .filter(|r| filter.tenant.as_deref().is_none_or(|t| r.tenant() == t))
                .filter(|r| {
                    filter
                        .environment
                        .as_deref()
                        .is_none_or(|e| r.key.environment() == e)
                })
                .filter(|r| filter.status.is_none_or(|s| r.status() == s))
                .filter(|r| filter.tool.as_deref().is_none_or(|t| r.tool == t))
                .filter(|r| filter.after.as_deref().is_none_or(|a| r.key.as_str() > a))
                .take(page(filter.limit))
                .cloned()
                .collect();
            Ok(found)
        })
    }

    fn waiting(&self, query: Waiting) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        Box::pin(async move {
            let tables = self.lock();
            let found = tables
                .records
                .values()
                .filter(|r| r.tenant() == query.tenant)
                .filter(|r| r.key.environment() == query.environment)
                .filter(|r| query.on.holds(r))
                .filter(|r| query.tool.as_deref().is_none_or(|t| r.tool == t))
                .filter(|r| query.after.as_deref().is_none_or(|a| r.key.as_str() > a))
                .take(page(query.limit))
                .cloned()
                .collect();
            Ok(found)
        })
    }

    fn count<'a>(
        &'a self,
        environment: &'a str,
        status: RecordStatus,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(async move {
            let tables = self.lock();
            let n = tables
                .records
                .values()
                .filter(|r| r.key.environment() == environment && r.status() == status)
                .count();
            Ok(n as u64)
        })
    }

    fn due(&self, query: Due) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        Box::pin(async move {
            let tables = self.lock();
            let mut found: Vec<(Millis, &Record)> = tables
                .records
                .values()
                .filter(|r| r.key.environment() == query.environment)
                .filter_map(|r| due_at(r).map(|at| (at, r)))
                .filter(|(at, _)| *at <= query.now)
                .filter(|(at, r)| {
                    query
                        .after
                        .as_ref()
                        .is_none_or(|c| (*at, &r.key) > (c.due_at, &c.key))
                })
                .collect();
            found.sort_by(|a, b| (a.0, &a.1.key).cmp(&(b.0, &b.1.key)));
            let found = found
                .into_iter()
                .take(query.limit)
                .map(|(_, r)| r.clone())
                .collect();
            Ok(found)
        })
    }

    fn sweep<'a>(
        &'a self,
        environment: &'a str,
        now: Millis,
        limit: usize,
    ) -> BoxFuture<'a, Result<SweepReport, Error>> {
        Box::pin(async move {
            let mut tables = self.lock();
            let mut report = SweepReport::default();

            // Purge first, so a record compacted by this sweep keeps its tombstone until the next
            // one: the late-arrival policy gets at least one sweep interval to see it. Oldest
            // purge_at first, then key.
            let mut purge: Vec<(Millis, OperationKey)> = tables
                .records
                .values()
                .filter(|r| {
                    r.status() == RecordStatus::Tombstone
                        && r.key.environment() == environment
                        && r.purge_at <= now
                })
                .map(|r| (r.purge_at, r.key.clone()))
                .collect();
            purge.sort();
            for (_, key) in purge.into_iter().take(limit) {
                tables.records.remove(&key);
                tables.events.remove(&key);
                report.purged += 1;
            }

            // "Has passed" reads as "at or before now", the same boundary as a lease that has
            // expired by `now`. Oldest expires_at first, then key.
            let mut compact_keys: Vec<(Millis, OperationKey)> = tables
                .records
                .values()
                .filter(|r| compactable(r, environment, now))
                .map(|r| (r.expires_at, r.key.clone()))
                .collect();
            compact_keys.sort();
            for (_, key) in compact_keys.into_iter().take(limit) {
                let Some(record) = tables.records.get_mut(&key) else {
                    continue;
                };
                compact(record, now);
                let event = Event::new(EventKind::Expired, now, record.fence, SWEEPER);
                tables.events.entry(key).or_default().push(event);
                report.compacted += 1;
            }

            Ok(report)
        })
    }

    fn webhook<'a>(
        &'a self,
        source: &'a str,
        event_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<WebhookEvent>, Error>> {
        Box::pin(async move {
            let found = self
                .lock()
                .webhooks
                .get(&(source.to_string(), event_id.to_string()))
                .cloned();
            Ok(found)
        })
    }

    fn record_webhook(&self, event: WebhookEvent) -> BoxFuture<'_, Result<Recorded, Error>> {
        Box::pin(async move {
            let mut tables = self.lock();
            if let Some(existing) = may_write(&tables, &event) {
                return Ok(Recorded::Exists(Box::new(existing)));
            }
            tables
                .webhooks
                .insert((event.source.clone(), event.event_id.clone()), event);
            Ok(Recorded::Written)
        })
    }

    fn webhooks_for_job<'a>(
        &'a self,
        tenant: &'a str,
        job_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<WebhookEvent>, Error>> {
        Box::pin(async move {
            let tables = self.lock();
            let mut found: Vec<WebhookEvent> = tables
                .webhooks
                .values()
                .filter(|w| w.tenant == tenant && w.job_id.as_deref() == Some(job_id))
                .cloned()
                .collect();
            found.sort_by_key(|w| w.received_at);
            Ok(found)
        })
    }

    fn open_jobs<'a>(&'a self, m: JobMatch<'a>) -> BoxFuture<'a, Result<Vec<Record>, Error>> {
        Box::pin(async move {
            let tables = self.lock();
            let mut found: Vec<Record> = tables
                .records
                .values()
                .filter(|r| {
                    r.tenant() == m.tenant
                        && r.key.environment() == m.environment
                        && m.tools.contains(&r.tool)
                        && match &r.state {
                            RecordState::Pending {
                                dispatch: idemgate_core::record::Dispatch::Job { job_id: j },
                                ..
                            } => j == m.job_id,
                            RecordState::Unknown(evidence) => {
                                evidence.job_id.as_deref() == Some(m.job_id)
                            }
                            RecordState::Pending { .. }
                            | RecordState::AwaitingApproval { .. }
                            | RecordState::Applied(_)
                            | RecordState::FailedPermanent(_)
                            | RecordState::Tombstone(_) => false,
                        }
                })
                .cloned()
                .collect();
            found.sort_by(|a, b| a.key.as_str().cmp(b.key.as_str()));
            found.truncate(2);
            Ok(found)
        })
    }

    fn sweep_webhooks(&self, now: Millis, limit: usize) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(async move {
            let mut tables = self.lock();
            let due: Vec<(String, String)> = tables
                .webhooks
                .iter()
                .filter(|(_, w)| w.purge_at <= now)
                .map(|(k, _)| k.clone())
                .take(limit)
                .collect();
            for k in &due {
                tables.webhooks.remove(k);
            }
            Ok(due.len() as u64)
        })
    }
}

#[cfg(test)]
mod tests {
    use idemgate_core::fingerprint::Fingerprint;
    use idemgate_core::record::{Dispatch, Evidence, Lease, Receipt, Refusal};
    use idemgate_core::store::Cursor;
    use idemgate_core::{ErrorCode, Record};
    use serde_json::json;

    use super::*;

    fn key(step: &str) -> OperationKey {
        OperationKey::new("acme", "test", "wf", step).unwrap()
    }

    fn fingerprint() -> Fingerprint {
        Fingerprint::parse(&format!("sha256:{}", "a".repeat(64))).unwrap()
    }

    fn pending(step: &str, owner: Option<&str>, expires_at: Millis) -> Record {
        Record {
            key: key(step),
            tool: "t".into(),
            tool_version: "1".into(),
            fingerprint: fingerprint(),
            canonicalization: 1,
            state: RecordState::Pending {
                lease: Lease {
                    owner: owner.map(str::to_string),
                    expires_at,
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
            intent_window: true,
        }
    }

    fn with_state(mut record: Record, state: RecordState) -> Record {
        record.state = state;
        record
    }

    fn applied() -> RecordState {
        RecordState::Applied(Receipt {
            reference: "ticket_1".into(),
            result: json!({"ticket_id": "ticket_1"}),
        })
    }

    fn event(kind: EventKind) -> Event {
        Event::new(kind, 0, 1, "w1")
    }

    fn transition(step: &str, expect: Expect, next: RecordState, fence: u64) -> Transition {
        Transition {
            key: key(step),
            expect,
            next,
            fence,
            request: RequestUpdate::Keep,
            approved_by: None,
            fingerprint: None,
            expiry: None,
            events: vec![event(EventKind::Committed)],
            now: 50,
            webhook: None,
            audit: None,
        }
    }

    fn expect(fence: u64, status: RecordStatus, lease_expired_by: Option<Millis>) -> Expect {
        Expect {
            fence,
            status,
            created_at: 0,
            lease_expired_by,
            dispatch: None,
        }
    }

    #[tokio::test]
    async fn claim_inserts_once_then_loads_unchanged() {
        let store = MemStore::new();
        let first = pending("s1", Some("w1"), 100);
        let got = store
            .claim(first.clone(), vec![event(EventKind::Claimed)])
            .await;
        assert_eq!(got, Ok(Claimed::Inserted(first.clone())));
        let second = pending("s1", Some("w2"), 200);
        let got = store.claim(second, vec![event(EventKind::Claimed)]).await;
        assert_eq!(got, Ok(Claimed::Existing(first)));
        // Only the inserting claim's events were kept.
        assert_eq!(store.events(&key("s1")).await.unwrap().len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn passes_the_store_suite() {
        crate::store_suite::run(|| async { MemStore::new() }).await;
    }

    #[tokio::test]
    async fn nothing_happens_until_the_future_is_polled() {
        let store = MemStore::new();
        let unpolled = store.claim(pending("s1", Some("w1"), 100), vec![]);
        drop(unpolled);
        assert!(store.is_empty());
    }

    #[tokio::test]
    async fn transition_is_compare_and_set_on_fence_and_status() {
        let store = MemStore::new();
        store
            .claim(pending("s1", Some("w1"), 100), vec![])
            .await
            .unwrap();
        let stale_fence = transition("s1", expect(0, RecordStatus::Pending, None), applied(), 0);
        let Ok(Cas::Lost(Some(now))) = store.transition(stale_fence).await else {
            panic!("a stale fence must lose");
        };
        assert_eq!(now.status(), RecordStatus::Pending);
        let wrong_status = transition("s1", expect(1, RecordStatus::Unknown, None), applied(), 1);
        assert!(matches!(
            store.transition(wrong_status).await,
            Ok(Cas::Lost(Some(_)))
        ));
        let missing = transition("nope", expect(1, RecordStatus::Pending, None), applied(), 1);
        assert_eq!(store.transition(missing).await, Ok(Cas::Lost(None)));

        let mut good = transition("s1", expect(1, RecordStatus::Pending, None), applied(), 1);
        good.request = RequestUpdate::Clear;
        let Ok(Cas::Done(done)) = store.transition(good).await else {
            panic!("a matching transition applies");
        };
        assert_eq!(
            (done.status(), done.request.clone(), done.updated_at),
            (RecordStatus::Applied, None, 50)
        );
        assert_eq!(store.get(&key("s1")).await.unwrap(), Some(done));
        // Lost transitions appended nothing; the applied one its event.
        assert_eq!(store.events(&key("s1")).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn takeover_needs_a_lease_expired_by_the_instant_judged() {
        let store = MemStore::new();
        store
            .claim(pending("s1", Some("w1"), 100), vec![])
            .await
            .unwrap();
        let takeover = |by| {
            let next = pending("s1", Some("w2"), 200).state;
            transition("s1", expect(1, RecordStatus::Pending, Some(by)), next, 2)
        };
        // Judged at 99 the lease was still live: a renewal would have won, so this loses.
        assert!(matches!(
            store.transition(takeover(99)).await,
            Ok(Cas::Lost(Some(_)))
        ));
        // Expired exactly at the instant counts as expired.
        let Ok(Cas::Done(taken)) = store.transition(takeover(100)).await else {
            panic!("takeover of an expired lease applies");
        };
        assert_eq!(taken.fence, 2);
        // The old owner's late finish carries the old fence and loses.
        let late = transition("s1", expect(1, RecordStatus::Pending, None), applied(), 1);
        assert!(matches!(
            store.transition(late).await,
            Ok(Cas::Lost(Some(_)))
        ));
    }

    #[tokio::test]
    async fn transition_sets_approval_fingerprint_and_request_only_when_given() {
        let store = MemStore::new();
        let mut waiting = with_state(
            pending("s1", None, 0),
            RecordState::AwaitingApproval { until: 500 },
        );
        waiting.approved_by = Some("earlier".into());
        store.claim(waiting, vec![]).await.unwrap();
        let next = pending("s1", Some("w1"), 100).state;
        let mut t = transition(
            "s1",
            expect(1, RecordStatus::AwaitingApproval, None),
            next,
            1,
        );
        t.request = RequestUpdate::Set(json!({"b": 2}));
        let Ok(Cas::Done(r)) = store.transition(t).await else {
            panic!()
        };
        assert_eq!(
            (r.approved_by.as_deref(), r.request),
            (Some("earlier"), Some(json!({"b": 2})))
        );
        let other = Fingerprint::parse(&format!("sha256:{}", "b".repeat(64))).unwrap();
        let mut t = transition("s1", expect(1, RecordStatus::Pending, None), applied(), 1);
        t.approved_by = Some("operator".into());
        t.fingerprint = Some(other.clone());
        let Ok(Cas::Done(r)) = store.transition(t).await else {
            panic!()
        };
        assert_eq!(
            (r.approved_by.as_deref(), r.fingerprint),
            (Some("operator"), other)
        );
    }

    #[tokio::test]
    async fn due_lists_deadlines_passed_in_order_after_the_cursor() {
        let store = MemStore::new();
        let job = RecordState::Pending {
            lease: Lease {
                owner: Some("w".into()),
                expires_at: 150,
            },
            dispatch: Dispatch::Job {
                job_id: "job_1".into(),
            },
        };
        let records = vec![
            pending("live", Some("w"), 500),
            pending("expired", Some("w"), 100),
            pending("released", None, 120),
            with_state(pending("job", Some("w"), 0), job),
            with_state(
                pending("approval", None, 0),
                RecordState::AwaitingApproval { until: 180 },
            ),
            with_state(
                pending("unknown", Some("w"), 0),
                RecordState::Unknown(Evidence {
                    reason: "timeout".into(),
                    reference: None,
                    job_id: None,
                }),
            ),
        ];
        for r in records {
            store.claim(r, vec![]).await.unwrap();
        }
        let mut elsewhere = pending("elsewhere", Some("w"), 100);
        elsewhere.key = OperationKey::new("acme", "other", "wf", "elsewhere").unwrap();
        store.claim(elsewhere, vec![]).await.unwrap();
        let due = |now, after: Option<(Millis, &str)>, limit| {
            let store = store.clone();
            let after = after.map(|(due_at, step)| Cursor {
                due_at,
                key: key(step),
            });
            async move {
                let query = Due {
                    environment: "test".into(),
                    now,
                    after,
                    limit,
                };
                store
                    .due(query)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|r| r.key.step_id().to_string())
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(
            due(200, None, 10).await,
            ["expired", "released", "job", "approval"]
        );
        assert_eq!(due(200, None, 2).await, ["expired", "released"]);
        assert_eq!(
            due(200, Some((120, "released")), 10).await,
            ["job", "approval"]
        );
        assert_eq!(
            due(500, None, 10).await,
            ["expired", "released", "job", "approval", "live"]
        );
    }

    #[tokio::test]
    async fn list_filters_orders_by_key_and_pages() {
        let store = MemStore::new();
        for step in ["c", "a", "b"] {
            store
                .claim(pending(step, Some("w"), 100), vec![])
                .await
                .unwrap();
        }
        let mut other = pending("z", Some("w"), 100);
        other.key = OperationKey::new("globex", "test", "wf", "z").unwrap();
        other.tool = "u".into();
        store.claim(other, vec![]).await.unwrap();
        let list = |filter: Filter| {
            let store = store.clone();
            async move {
                let rs = store.list(filter).await.unwrap();
                rs.into_iter()
                    .map(|r| r.key.to_string())
                    .collect::<Vec<_>>()
            }
        };
        let all = Filter {
            limit: 10,
            ..Filter::default()
        };
        assert_eq!(
            list(all.clone()).await,
            [
                "acme:test:wf:a",
                "acme:test:wf:b",
                "acme:test:wf:c",
                "globex:test:wf:z"
            ]
        );
        let acme = Filter {
            tenant: Some("acme".into()),
            after: Some("acme:test:wf:a".into()),
            limit: 1,
            ..Filter::default()
        };
        assert_eq!(list(acme).await, ["acme:test:wf:b"]);
        let tool = Filter {
            tool: Some("u".into()),
            ..all.clone()
        };
        assert_eq!(list(tool).await, ["globex:test:wf:z"]);
        let applied_only = Filter {
            status: Some(RecordStatus::Applied),
            ..all
        };
        assert!(list(applied_only).await.is_empty());
    }

    #[tokio::test]
    async fn a_duplicate_intent_is_found_and_not_inserted() {
        let store = MemStore::new();
        let mut early = pending("early", Some("w"), 100);
        early.created_at = 10;
        let mut late = pending("late", Some("w"), 100);
        late.created_at = 20;
        store.claim(late, vec![]).await.unwrap();
        store.claim(early, vec![]).await.unwrap();
        let claim = |step: &str, since| {
            let store = store.clone();
            let mut r = pending(step, Some("w"), 100);
            r.created_at = 30;
            async move {
                store
                    .claim_unless_duplicate(r, vec![], since)
                    .await
                    .unwrap()
            }
        };
        assert_eq!(
            claim("new", 0).await,
            Claimed::DuplicateIntent(key("early"))
        );
        assert_eq!(
            claim("new", 11).await,
            Claimed::DuplicateIntent(key("late"))
        );
        assert!(matches!(claim("new", 21).await, Claimed::Inserted(_)));
        // Its own key is no duplicate of itself: the existing record comes back.
        assert!(matches!(claim("early", 0).await, Claimed::Existing(_)));
    }

    #[tokio::test]
    async fn sweep_compacts_settled_records_and_purges_tombstones() {
        let store = MemStore::new();
        let refusal = Refusal {
            code: ErrorCode::DownstreamRejected,
            message: "no".into(),
        };
        let unknown = RecordState::Unknown(Evidence {
            reason: "t".into(),
            reference: None,
            job_id: None,
        });
        for (step, state) in [
            ("applied", applied()),
            ("failed", RecordState::FailedPermanent(refusal)),
            ("approval", RecordState::AwaitingApproval { until: 0 }),
            ("pending", pending("x", Some("w"), 0).state),
            ("unknown", unknown),
        ] {
            store
                .claim(
                    with_state(pending(step, Some("w"), 0), state),
                    vec![event(EventKind::Claimed)],
                )
                .await
                .unwrap();
        }
        let mut fresh = with_state(pending("fresh", Some("w"), 0), applied());
        fresh.expires_at = 1_001;
        store.claim(fresh, vec![]).await.unwrap();
        let mut elsewhere = with_state(pending("elsewhere", Some("w"), 0), applied());
        elsewhere.key = OperationKey::new("acme", "other", "wf", "elsewhere").unwrap();
        store.claim(elsewhere, vec![]).await.unwrap();

        // Just before expiry nothing happens.
        assert_eq!(
            store.sweep("test", 999, 10).await,
            Ok(SweepReport::default())
        );
        let report = store.sweep("test", 1_000, 10).await.unwrap();
        assert_eq!(
            report,
            SweepReport {
                compacted: 2,
                purged: 0
            }
        );
        let tomb = store.get(&key("applied")).await.unwrap().unwrap();
        assert_eq!(
            tomb.state,
            RecordState::Tombstone(Digest::Applied {
                reference: "ticket_1".into()
            })
        );
        assert_eq!((tomb.request, tomb.updated_at), (None, 1_000));
        let failed = store.get(&key("failed")).await.unwrap().unwrap();
        assert_eq!(
            failed.state,
            RecordState::Tombstone(Digest::Refused {
                code: ErrorCode::DownstreamRejected
            })
        );
        let trace = store.events(&key("applied")).await.unwrap();
        assert_eq!(
            trace.iter().map(|e| e.kind).collect::<Vec<_>>(),
            [EventKind::Claimed, EventKind::Expired]
        );
        // Unsettled records are never swept; nor is another environment's.
        for step in ["pending", "unknown", "approval", "fresh"] {
            assert_ne!(
                store.get(&key(step)).await.unwrap().unwrap().status(),
                RecordStatus::Tombstone,
                "{step}"
            );
        }
        let other = OperationKey::new("acme", "other", "wf", "elsewhere").unwrap();
        assert_eq!(
            store.get(&other).await.unwrap().unwrap().status(),
            RecordStatus::Applied
        );

        // Tombstones go at purge_at, with their traces; the limit bounds each kind.
        assert_eq!(
            store.sweep("test", 2_000, 2).await.unwrap(),
            SweepReport {
                compacted: 1,
                purged: 2
            }
        );
        // The tombstone compacted a sweep ago is purged only now.
        assert_eq!(
            store.sweep("test", 2_000, 2).await.unwrap(),
            SweepReport {
                compacted: 0,
                purged: 1
            }
        );
        assert_eq!(store.get(&key("applied")).await.unwrap(), None);
        assert!(store.events(&key("applied")).await.unwrap().is_empty());
        // pending, unknown, approval and the other environment's record remain.
        assert_eq!(store.len(), 4);
    }
}
