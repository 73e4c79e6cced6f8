//! The audit log on SQLite: the shared audit cases, two stores (two writers) on one file, and
//! an append that fails inside the transaction rolling the transition back with it.

use idemgate_conformance::audit_suite::{self, sealer};
use idemgate_store_sqlite::{Options, SqliteStore};

fn open(path: &std::path::Path) -> SqliteStore {
    SqliteStore::open(path, Options::default())
        .expect("the store opens")
        .with_sealer(sealer())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn entry_only_with_its_transition() {
    let dir = tempfile::tempdir().unwrap();
    audit_suite::entry_only_with_its_transition(open(&dir.path().join("a.db"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appenders_of_one_store_keep_one_chain() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("a.db"));
    audit_suite::concurrent_appenders_keep_one_chain(store.clone(), store, 25).await;
}

/// Two stores on one file are two write connections, as two processes would be: SQLite's write
/// lock orders their appends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_writers_on_one_file_keep_one_chain() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let (a, b) = (open(&path), open(&path));
    audit_suite::concurrent_appenders_keep_one_chain(a, b, 20).await;
}

/// An append that fails after the update applied (here a trigger refuses the insert) fails the
/// transition: the record is unchanged and the log empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_append_rolls_the_transition_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let store = open(&path);
    let r = audit_suite::record_for_rollback(&store).await;
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER no_audit BEFORE INSERT ON audit_log \
         BEGIN SELECT RAISE(ABORT, 'audit log refused by the test'); END;",
    )
    .unwrap();
    audit_suite::failed_append_changed_nothing(&store, &r).await;
    conn.execute_batch("DROP TRIGGER no_audit").unwrap();
    audit_suite::append_works_again(&store, &r).await;
}
