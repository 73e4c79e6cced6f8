//! The seed's fault matrix (`idemgate_conformance::scenarios`) on PostgreSQL, unchanged: one
//! throwaway database per scenario, dropped with its fixture.

use std::sync::Arc;

use idemgate_conformance::harness::Fixture;
use idemgate_store_postgres::testing::fresh_database;

async fn fresh() -> Option<Fixture> {
    let db = fresh_database().await?;
    let store = db.store().await;
    Some(Fixture {
        store: Arc::new(store),
        guard: Box::new(db),
    })
}

idemgate_conformance::scenario_tests!(fresh().await);
