//! Webhook events in SQLite: the shared webhook suite, and the event's row and its transition
//! committing together or not at all when a statement fails between them.

use std::path::Path;

use idemgate_conformance::store_suite::{applied, step};
use idemgate_conformance::webhook_suite::{self, event, job_record};
use idemgate_core::record::RecordStatus;
use idemgate_core::store::{Claimed, Store};
use idemgate_core::webhook::Disposition;
use idemgate_store_sqlite::{Options, SqliteStore};

fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path, Options::default()).expect("the store opens")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_passes_the_webhook_suite() {
    let dir = tempfile::tempdir().unwrap();
    let n = std::sync::atomic::AtomicUsize::new(0);
    let dir_path = dir.path().to_path_buf();
    webhook_suite::run(|| {
        let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir_path.join(format!("w{i}.db"));
        async move { open(&path) }
    })
    .await;
    assert_eq!(
        n.load(std::sync::atomic::Ordering::Relaxed),
        webhook_suite::CASES
    );
}

/// A trigger makes one statement of the transition fail: first the event's row (written after
/// the record's update here), then the record's update. Either way neither is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_between_the_event_and_its_transition_rolls_both_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("atomic.db");
    let store = open(&path);
    let Claimed::Inserted(r) = store
        .claim(job_record("acme:prod:wf-atomic:s1", "j1"), Vec::new())
        .await
        .unwrap()
    else {
        panic!("claimed");
    };
    let side = rusqlite::Connection::open(&path).unwrap();
    side.execute_batch(
        "CREATE TRIGGER fail_event BEFORE INSERT ON webhook_events \
         WHEN NEW.event_id = 'boom' BEGIN SELECT RAISE(ABORT, 'injected failure'); END; \
         CREATE TRIGGER fail_update BEFORE UPDATE ON operations \
         WHEN NEW.effect_reference = 'BOOM' BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
    )
    .unwrap();

    // The event's row fails after the record's update.
    let mut t = step(&r, applied("R-1"), 2_000);
    t.webhook = Some(event("boom", Disposition::Applied, Some("j1")));
    assert!(store.transition(t).await.is_err());
    assert_eq!(store.get(&r.key).await.unwrap(), Some(r.clone()));
    assert_eq!(store.webhook("jobs", "boom").await.unwrap(), None);

    // The record's update fails: no row for the event either.
    let mut t = step(&r, applied("BOOM"), 2_000);
    t.webhook = Some(event("msg_ok", Disposition::Applied, Some("j1")));
    assert!(store.transition(t).await.is_err());
    assert_eq!(store.get(&r.key).await.unwrap(), Some(r.clone()));
    assert_eq!(store.webhook("jobs", "msg_ok").await.unwrap(), None);

    // Without a failure both are written.
    let mut t = step(&r, applied("R-2"), 2_000);
    t.webhook = Some(event("msg_ok", Disposition::Applied, Some("j1")));
    store.transition(t).await.unwrap();
    assert_eq!(
        store.get(&r.key).await.unwrap().unwrap().status(),
        RecordStatus::Applied
    );
    assert!(store.webhook("jobs", "msg_ok").await.unwrap().is_some());
}
