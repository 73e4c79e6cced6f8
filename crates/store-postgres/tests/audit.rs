//! The audit log on PostgreSQL: the shared audit cases; two stores (two gateways' pools) on one
//! database appending at once; an append that fails inside the transaction rolling the
//! transition back with it.

use std::time::Duration;

use idemgate_conformance::audit_suite::{self, sealer};
use idemgate_store_postgres::Options;
use idemgate_store_postgres::testing::{self, TestDatabase};

async fn database() -> Option<TestDatabase> {
    testing::fresh_database().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn entry_only_with_its_transition() {
    let Some(db) = database().await else { return };
    audit_suite::entry_only_with_its_transition(db.store().await.with_sealer(sealer())).await;
    db.drop_now().await;
}

/// Two stores with pools of their own, as two gateway processes: their denials interleave, and
/// the head row's lock still gives one chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_gateways_appending_at_once_keep_one_chain() {
    let Some(db) = database().await else { return };
    // 80 transactions queue on the head row's lock, each holding a pooled connection while it
    // waits: on a loaded machine that takes longer than the default 5 s wait for a connection,
    // which would be an honest `Unavailable`, not a broken chain; so would a statement that
    // waits on the head's lock past the default 5 s statement timeout. Give both room.
    let options = || Options {
        connect_timeout: Duration::from_secs(60),
        statement_timeout: Duration::from_secs(60),
        ..Options::default()
    };
    let a = db.store_with(options()).await.with_sealer(sealer());
    let b = db.store_with(options()).await.with_sealer(sealer());
    audit_suite::concurrent_appenders_keep_one_chain(a, b, 40).await;
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_append_rolls_the_transition_back() {
    let Some(db) = database().await else { return };
    let store = db.store().await.with_sealer(sealer());
    let r = audit_suite::record_for_rollback(&store).await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'audit log refused by the test'; END $$; \
             CREATE TRIGGER no_audit BEFORE INSERT ON audit_log \
             FOR EACH ROW EXECUTE FUNCTION refuse_audit();",
        )
        .await
        .unwrap();
    audit_suite::failed_append_changed_nothing(&store, &r).await;
    client
        .batch_execute("DROP TRIGGER no_audit ON audit_log")
        .await
        .unwrap();
    audit_suite::append_works_again(&store, &r).await;
    db.drop_now().await;
}
