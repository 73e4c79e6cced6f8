//! The seed's fault matrix (`idemgate_conformance::scenarios`) on the embedded SQLite store,
//! one fresh file per scenario, durable settings as shipped.

use std::sync::Arc;

use idemgate_conformance::harness::Fixture;
use idemgate_store_sqlite::{Options, SqliteStore};

fn fresh() -> Option<Fixture> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = SqliteStore::open(dir.path().join("idemgate.sqlite"), Options::default())
        .expect("open a fresh SQLite store");
    Some(Fixture {
        store: Arc::new(store),
        guard: Box::new(dir),
    })
}

idemgate_conformance::scenario_tests!(fresh());
