//! Webhook events in PostgreSQL: the shared webhook suite, and the event's row and its
//! transition committing together or not at all when a statement fails between them.

use idemgate_conformance::store_suite::{applied, step};
use idemgate_conformance::webhook_suite::{self, event, job_record};
use idemgate_core::record::RecordStatus;
use idemgate_core::store::{Claimed, Store};
use idemgate_core::webhook::Disposition;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_passes_the_webhook_suite() {
    let Some(db) = idemgate_store_postgres::testing::fresh_database().await else {
        return;
    };
    let db = &db;
    webhook_suite::run(move || async move {
        let store = db.store().await;
        db.truncate().await;
        store
    })
    .await;
}

/// A trigger makes one statement of the transition fail: the record's update (after the
/// event's row here), then the event's row. Either way neither is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_between_the_event_and_its_transition_rolls_both_back() {
    let Some(db) = idemgate_store_postgres::testing::fresh_database().await else {
        return;
    };
    let store = db.store().await;
    let Claimed::Inserted(r) = store
        .claim(job_record("acme:prod:wf-atomic:s1", "j1"), Vec::new())
        .await
        .unwrap()
    else {
        panic!("claimed");
    };
    let (client, connection) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE FUNCTION injected() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$; \
             CREATE TRIGGER fail_event BEFORE INSERT ON webhook_events FOR EACH ROW \
             WHEN (NEW.event_id = 'boom') EXECUTE FUNCTION injected(); \
             CREATE TRIGGER fail_update BEFORE UPDATE ON operations FOR EACH ROW \
             WHEN (NEW.effect_reference = 'BOOM') EXECUTE FUNCTION injected();",
        )
        .await
        .unwrap();

    // The record's update fails after the event's row was written.
    let mut t = step(&r, applied("BOOM"), 2_000);
    t.webhook = Some(event("msg_ok", Disposition::Applied, Some("j1")));
    assert!(store.transition(t).await.is_err());
    assert_eq!(store.get(&r.key).await.unwrap(), Some(r.clone()));
    assert_eq!(store.webhook("jobs", "msg_ok").await.unwrap(), None);

    // The event's row fails: the record is not updated either.
    let mut t = step(&r, applied("R-1"), 2_000);
    t.webhook = Some(event("boom", Disposition::Applied, Some("j1")));
    assert!(store.transition(t).await.is_err());
    assert_eq!(store.get(&r.key).await.unwrap(), Some(r.clone()));
    assert_eq!(store.webhook("jobs", "boom").await.unwrap(), None);

    // Without a failure both are written.
    let mut t = step(&r, applied("R-2"), 2_000);
    t.webhook = Some(event("msg_ok", Disposition::Applied, Some("j1")));
    store.transition(t).await.unwrap();
    assert_eq!(
        store.get(&r.key).await.unwrap().unwrap().status(),
        RecordStatus::Applied
    );
    assert!(store.webhook("jobs", "msg_ok").await.unwrap().is_some());
    drop(store);
    db.drop_now().await;
}
