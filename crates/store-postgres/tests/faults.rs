//! Failures classified by what the caller may conclude: `Unavailable` when nothing changed,
//! `Ambiguous` when a write may have committed — and a pool that heals afterwards.

mod common;

use std::time::{Duration, Instant};

use common::*;
use idemgate_core::record::{Dispatch, EventKind};
use idemgate_core::store::{self, Cas, Claimed, Store};
use idemgate_store_postgres::{Options, PgStore};

const T0: i64 = 1_700_000_000_000;

/// Ends every connection the store holds, as a database restart or a failover would.
async fn terminate_store_connections(admin: &tokio_postgres::Client) -> i64 {
    let rows = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'idemgate'",
            &[],
        )
        .await
        .unwrap();
    rows.len() as i64
}

/// Runs without a database: nothing listens on port 1.
#[tokio::test]
async fn an_unreachable_database_is_unavailable() {
    let started = Instant::now();
    let options = Options {
        connect_timeout: Duration::from_secs(2),
        ..Options::default()
    };
    let err = PgStore::connect("postgres://postgres@127.0.0.1:1/idemgate", options)
        .await
        .unwrap_err();
    assert!(matches!(err, store::Error::Unavailable(_)), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused quickly, not hung"
    );
}

#[tokio::test]
async fn a_malformed_url_is_refused() {
    let err = PgStore::connect("postgres://h:notaport/db", Options::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, store::Error::Unavailable(ref m) if m.contains("invalid database URL")),
        "{err:?}"
    );
}

/// The statement timeout is set on every connection: a write blocked behind another
/// transaction's row lock is cancelled by the server — an ERROR, so nothing committed and the
/// answer is `Unavailable`, not `Ambiguous`. The connection stays usable.
#[tokio::test]
async fn a_cancelled_write_is_unavailable() {
    let db = database!();
    let options = Options {
        statement_timeout: Duration::from_millis(300),
        ..Options::default()
    };
    let store = db.store_with(options).await;
    let rec = claimed("acme:prod:wf:s1", "w1", T0);
    store.claim(rec.clone(), vec![]).await.unwrap();

    let mut blocker = admin(db.url()).await;
    let tx = lock_row(&mut blocker, rec.key.as_str()).await;

    let started = Instant::now();
    let t = step(
        &rec,
        applied("T-1"),
        T0 + 1,
        vec![event(EventKind::Committed, T0 + 1, 1, "w1")],
    );
    let err = store.transition(t.clone()).await.unwrap_err();
    assert!(
        matches!(err, store::Error::Unavailable(ref m) if m.contains("57014")),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    tx.rollback().await.unwrap();

    assert_eq!(store.get(&rec.key).await.unwrap(), Some(rec.clone()));
    assert!(store.events(&rec.key).await.unwrap().is_empty());
    assert!(matches!(store.transition(t).await.unwrap(), Cas::Done(_)));
}

/// A connection killed while its write waits: the write may or may not have committed as far
/// as the store can tell, so the answer is `Ambiguous`; the next call gets a new connection.
#[tokio::test]
async fn a_write_cut_off_midway_is_ambiguous() {
    let db = database!();
    let store = db.store().await;
    let rec = claimed("acme:prod:wf:s1", "w1", T0);
    store.claim(rec.clone(), vec![]).await.unwrap();

    let mut blocker = admin(db.url()).await;
    let tx = lock_row(&mut blocker, rec.key.as_str()).await;

    let writer = {
        let store = store.clone();
        let t = step(&rec, applied("T-1"), T0 + 1, vec![]);
        tokio::spawn(async move { store.transition(t).await })
    };
    // Wait until the write is blocked on the lock, then end its session.
    let killer = admin(db.url()).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let waiting: i64 = killer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'idemgate'
                   AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the write never blocked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(terminate_store_connections(&killer).await > 0);
    let err = writer.await.unwrap().unwrap_err();
    assert!(matches!(err, store::Error::Ambiguous(_)), "{err:?}");
    tx.rollback().await.unwrap();

    // The write did not commit (it was waiting), and the pool replaced the dead connection.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(store.get(&rec.key).await.unwrap(), Some(rec));
}

/// Every pooled connection ends at once (a restart or failover): the same store works again on
/// the next call, without being recreated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_replaces_terminated_connections() {
    let db = database!();
    let store = db
        .store_with(Options {
            pool_size: 4,
            ..Options::default()
        })
        .await;
    // Open several connections by running claims concurrently.
    let claims: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .claim(claimed(&format!("acme:prod:wf:s{i}"), "w1", T0), vec![])
                    .await
            })
        })
        .collect();
    for c in claims {
        assert!(matches!(c.await.unwrap().unwrap(), Claimed::Inserted(_)));
    }
    let killer = admin(db.url()).await;
    assert!(terminate_store_connections(&killer).await > 0);
    // The connections learn of their end from the server's goodbye message.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..8 {
        let k = key(&format!("acme:prod:wf:s{i}"));
        assert!(store.get(&k).await.unwrap().is_some());
    }
    let rec = claimed("acme:prod:wf:after", "w1", T0);
    assert!(matches!(
        store.claim(rec.clone(), vec![]).await.unwrap(),
        Claimed::Inserted(_)
    ));
    let t = step(
        &rec,
        pending(Some("w1"), T0 + LEASE, Dispatch::Sent),
        T0 + 1,
        vec![],
    );
    assert!(matches!(store.transition(t).await.unwrap(), Cas::Done(_)));
}
