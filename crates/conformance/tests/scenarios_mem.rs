//! The scenario suite against the in-memory reference store.

use std::sync::Arc;

use idemgate_conformance::harness::Fixture;
use idemgate_conformance::mem::MemStore;

idemgate_conformance::scenario_tests!(Some(Fixture {
    store: Arc::new(MemStore::new()),
    guard: Box::new(()),
}));
