//! The seed's fault matrix (`idemgate_conformance::scenarios`) on PostgreSQL, on both of the
//! executor's paths: claim-first (a new delivery claims its key without reading it, as a
//! gateway on PostgreSQL does where no hook is asked) and read-first (the key read before the
//! claim, as where a hook is asked). One throwaway database per scenario, dropped with its
//! fixture.
//!
//! Until issue 31 the fault-injecting wrapper did not forward `claim_replaces_read`, and the
//! harness's hook always asked, so the matrix never ran the claim-first path production uses.

use std::sync::Arc;

use idemgate_conformance::faulty::FaultyStore;
use idemgate_conformance::harness::Fixture;
use idemgate_core::store::Store;
use idemgate_store_postgres::testing::fresh_database;

/// A fresh PostgreSQL store; with `read_first`, wrapped to take the read-first path.
async fn fresh(read_first: bool) -> Option<Fixture> {
    let db = fresh_database().await?;
    let store = db.store().await;
    let store: Arc<dyn Store> = if read_first {
        Arc::new(FaultyStore::new(store).read_first())
    } else {
        Arc::new(store)
    };
    assert_eq!(store.claim_replaces_read(), !read_first);
    Some(Fixture {
        store,
        guard: Box::new(db),
    })
}

mod claim_first {
    use super::*;
    idemgate_conformance::scenario_tests!(fresh(false).await);

    /// The path really is claim-first: a new key's delivery is claimed without a read.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_new_key_is_claimed_without_a_read() {
        let Some(fixture) = fresh(false).await else {
            return;
        };
        let gets = super::gets_for_one_new_delivery(fixture.store.clone()).await;
        assert_eq!(gets, 0, "claim-first reads nothing before its claim");
    }
}

mod read_first {
    use super::*;
    idemgate_conformance::scenario_tests!(fresh(true).await);

    /// The path really is read-first: a new key's delivery reads it before the claim.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_new_key_is_read_before_its_claim() {
        let Some(fixture) = fresh(true).await else {
            return;
        };
        let gets = super::gets_for_one_new_delivery(fixture.store.clone()).await;
        assert!(gets >= 1, "read-first reads the key before its claim");
    }
}

/// How many `get`s one delivery of a new key made, through the scenarios' own harness.
async fn gets_for_one_new_delivery(store: Arc<dyn Store>) -> u64 {
    use idemgate_conformance::harness::{Harness, Spec, ticket};
    let spec = Spec::key_based();
    let h = Harness::for_spec(store, &spec);
    let outcome = h.deliver(&spec.contract(), "s1", &ticket("Refund")).await;
    assert_eq!(
        outcome.status,
        idemgate_core::outcome::Status::Applied,
        "{outcome:?}"
    );
    assert_eq!(h.downstream.effects(), 1);
    h.store.counts().get
}
