//! On PostgreSQL a delivery claims a new key without reading it first: the claim statement is
//! claim-or-load, and a claim that meets an existing record writes nothing
//! (`Store::claim_replaces_read`). Effects are counted at the downstream, store calls by a
//! wrapper, rows and their versions in the database.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::admin;
use futures_util::future::BoxFuture;
use idemgate_conformance::downstream::FakeDownstream;
use idemgate_conformance::harness::{Spec, Switch, key, op, ticket};
use idemgate_core::audit::Entry;
use idemgate_core::clock::SystemClock;
use idemgate_core::effect::{AllowAll, Authorizer};
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::Status;
use idemgate_core::record::{Event, Millis, Record, RecordStatus};
use idemgate_core::store::{
    Cas, Claimed, Due, Error, Filter, Store, SweepReport, Transition, Waiting,
};
use idemgate_core::webhook::{JobMatch, Recorded, WebhookEvent};
use idemgate_engine::{Executor, Settings};

/// Counts the reads and claims the executor makes, and forwards everything.
struct Counted {
    inner: Arc<dyn Store>,
    gets: AtomicUsize,
    claims: AtomicUsize,
}

impl Counted {
    fn new(inner: Arc<dyn Store>) -> Arc<Counted> {
        Arc::new(Counted {
            inner,
            gets: AtomicUsize::new(0),
            claims: AtomicUsize::new(0),
        })
    }
    fn calls(&self) -> (usize, usize) {
        (
            self.gets.load(Ordering::SeqCst),
            self.claims.load(Ordering::SeqCst),
        )
    }
}

impl Store for Counted {
    fn get<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get(key)
    }
    fn claim(&self, record: Record, events: Vec<Event>) -> BoxFuture<'_, Result<Claimed, Error>> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(record, events)
    }
    fn claim_replaces_read(&self) -> bool {
        self.inner.claim_replaces_read()
    }
    fn claim_unless_duplicate(
        &self,
        record: Record,
        events: Vec<Event>,
        since: Millis,
    ) -> BoxFuture<'_, Result<Claimed, Error>> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.claim_unless_duplicate(record, events, since)
    }
    fn transition(&self, transition: Transition) -> BoxFuture<'_, Result<Cas, Error>> {
        self.inner.transition(transition)
    }
    fn audit_log(&self, after: u64, limit: usize) -> BoxFuture<'_, Result<Vec<Entry>, Error>> {
        self.inner.audit_log(after, limit)
    }
    fn append_events<'a>(
        &'a self,
        key: &'a OperationKey,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.inner.append_events(key, events)
    }
    fn events<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Result<Vec<Event>, Error>> {
        self.inner.events(key)
    }
    fn list(&self, filter: Filter) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        self.inner.list(filter)
    }
    fn count<'a>(
        &'a self,
        environment: &'a str,
        status: RecordStatus,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        self.inner.count(environment, status)
    }
    fn due(&self, query: Due) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        self.inner.due(query)
    }
    fn waiting(&self, query: Waiting) -> BoxFuture<'_, Result<Vec<Record>, Error>> {
        self.inner.waiting(query)
    }
    fn sweep<'a>(
        &'a self,
        environment: &'a str,
        now: Millis,
        limit: usize,
    ) -> BoxFuture<'a, Result<SweepReport, Error>> {
        self.inner.sweep(environment, now, limit)
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

/// An executor that keeps no settled records, so that every replay reaches the store.
fn executor(store: Arc<Counted>, authorizer: Arc<dyn Authorizer>) -> Executor {
    Executor::new(
        store,
        Arc::new(SystemClock),
        authorizer,
        Settings {
            settled_records: 0,
            ..Settings::default()
        },
    )
}

/// The versions of the key's row and its trace entries: any write changes them.
async fn row_versions(client: &tokio_postgres::Client, key: &OperationKey) -> (String, i64) {
    let row = client
        .query_one(
            "SELECT o.xmin::text, length(o.trace)::bigint
             FROM operations o WHERE o.tenant = $1 AND o.key = $2",
            &[&key.tenant(), &key.as_str()],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_key_is_claimed_unread_and_its_replay_is_the_claim_writing_nothing() {
    let db = database!();
    let store = Counted::new(Arc::new(db.store().await));
    let client = admin(db.url()).await;
    let contract = Spec::key_based().contract();
    let downstream = FakeDownstream::new().deduplicating(true);
    let exec = executor(store.clone(), Arc::new(AllowAll));

    let first = exec
        .execute(&contract, &op("s1"), &ticket("Refund"), &downstream)
        .await;
    assert_eq!(first.status, Status::Applied, "{first:?}");
    assert_eq!(store.calls(), (0, 1), "a new key: one claim, no read");
    let written = row_versions(&client, &key("s1")).await;

    for n in 0..3 {
        let again = exec
            .execute(&contract, &op("s1"), &ticket("Refund"), &downstream)
            .await;
        assert_eq!(again.status, Status::Replayed, "replay {n}: {again:?}");
        assert_eq!(again.effect_reference, first.effect_reference);
    }
    assert_eq!(store.calls(), (0, 4), "each replay is one claim, no read");
    assert_eq!(
        row_versions(&client, &key("s1")).await,
        written,
        "a replay wrote nothing"
    );
    assert_eq!(downstream.effects_for(&key("s1")), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_deliveries_of_a_new_key_have_one_effect() {
    let db = database!();
    let store = Counted::new(Arc::new(db.store().await));
    let contract = Spec::key_based().contract();
    let downstream = Arc::new(FakeDownstream::new().deduplicating(true));
    let exec = executor(store.clone(), Arc::new(AllowAll));
    let deliveries: Vec<_> = (0..16)
        .map(|_| {
            let (exec, contract, downstream) = (exec.clone(), contract.clone(), downstream.clone());
            tokio::spawn(async move {
                exec.execute(&contract, &op("race"), &ticket("Refund"), &*downstream)
                    .await
            })
        })
        .collect();
    let mut applied = 0;
    for d in deliveries {
        let o = d.await.unwrap();
        match o.status {
            Status::Applied => applied += 1,
            Status::Replayed | Status::InFlight => {}
            other => panic!("unexpected {other:?}: {o:?}"),
        }
    }
    assert_eq!(applied, 1);
    assert_eq!(downstream.effects_for(&key("race")), 1);
    assert_eq!(
        store.calls(),
        (0, 16),
        "every delivery claimed, none read first"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_to_ask_keeps_the_read_before_the_claim() {
    let db = database!();
    let store = Counted::new(Arc::new(db.store().await));
    let contract = Spec::key_based().contract();
    let downstream = FakeDownstream::new().deduplicating(true);
    let hook = Arc::new(Switch::default());
    let exec = executor(store.clone(), hook.clone());

    let first = exec
        .execute(&contract, &op("s1"), &ticket("Refund"), &downstream)
        .await;
    assert_eq!(first.status, Status::Applied, "{first:?}");
    assert_eq!(store.calls(), (1, 1), "read, then claim");
    let again = exec
        .execute(&contract, &op("s1"), &ticket("Refund"), &downstream)
        .await;
    assert_eq!(again.status, Status::Replayed, "{again:?}");
    assert_eq!(
        store.calls(),
        (2, 1),
        "a replay with a hook to ask is a read"
    );
    assert_eq!(downstream.effects_for(&key("s1")), 1);
}
