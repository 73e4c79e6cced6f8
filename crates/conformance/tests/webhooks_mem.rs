//! The webhook store suite against the in-memory reference store.

use idemgate_conformance::mem::MemStore;
use idemgate_conformance::webhook_suite;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mem_store_passes_the_webhook_suite() {
    webhook_suite::run(|| async { MemStore::new() }).await;
}
