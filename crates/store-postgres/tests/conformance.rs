//! The shared store contract (`idemgate_conformance::store_suite`), run against PostgreSQL:
//! the same cases SQLite and the in-memory store pass.

use idemgate_conformance::store_suite;

/// One database for the whole suite, emptied before each case: creating a database per case
/// would cost more than the cases themselves. Each case gets a new store (a new pool), so no
/// statement cache or connection state carries over from the case before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_passes_the_store_suite() {
    let Some(db) = idemgate_store_postgres::testing::fresh_database().await else {
        return;
    };
    let db = &db;
    store_suite::run(move || async move {
        let store = db.store().await;
        db.truncate().await;
        store
    })
    .await;
}
