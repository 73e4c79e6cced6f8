//! `/metrics`' reconciliation-queue gauge on PostgreSQL (issue 31): it counts every `unknown`
//! record of the environment — past the 1 000 a listing page holds, where it once stopped —
//! and it is counted in the background, not on each scrape: the store's own count of the
//! reads it served says how often it was asked.
//!
//! Its own test binary, because the gauge is process-wide: another gateway in the same process
//! would set it from its own store. Skipped (loudly) without `DATABASE_URL`; a failure under
//! `IDEMGATE_REQUIRE_POSTGRES=1`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use idemgate_conformance::faulty::FaultyStore;
use idemgate_conformance::store_suite::{record, unknown};
use idemgate_core::store::{Claimed, Store};
use idemgate_server::Gateway;

/// The gauge's line in a scrape.
fn gauge(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("idemgate_unknown_operations "))
        .map(|v| v.trim().parse::<f64>().expect("a number") as u64)
}

async fn claim_unknown(store: &dyn Store, keys: impl Iterator<Item = String>) {
    for key in keys {
        match store.claim(record(&key, unknown()), Vec::new()).await {
            Ok(Claimed::Inserted(_)) => {}
            other => panic!("{key}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_unknown_gauge_counts_past_a_page_in_the_background() {
    let Some(db) = idemgate_store_postgres::testing::fresh_database().await else {
        return;
    };
    const QUEUE: usize = 1_050;
    let pg = Arc::new(db.store().await);
    // Concurrent claims, so that seeding takes a few seconds at most.
    let mut seeding = tokio::task::JoinSet::new();
    for part in 0..10 {
        let pg = Arc::clone(&pg);
        seeding.spawn(async move {
            let keys = (part..QUEUE)
                .step_by(10)
                .map(|i| format!("{}:{ENV}:wf-gauge:s{i:04}", ["acme", "globex"][i % 2]));
            claim_unknown(pg.as_ref(), keys).await;
        });
    }
    while let Some(done) = seeding.join_next().await {
        done.unwrap();
    }
    // Another environment's unknown records are not this gateway's queue.
    claim_unknown(
        pg.as_ref(),
        (0..3).map(|i| format!("acme:other:wf-gauge:s{i}")),
    )
    .await;

    let store = Arc::new(FaultyStore::new(pg.clone()));
    let every = Duration::from_millis(500);
    let mut fakes = Fakes::new();
    let tools = fakes.tools();
    let state = Gateway::new(store.clone(), tools, tokens())
        .environment(ENV)
        .queue_gauge_every(every)
        .build();
    let app = idemgate_server::router(state);

    let reads_before = store.counts().list;
    let started = Instant::now();
    const SCRAPES: u64 = 40;
    for _ in 0..SCRAPES {
        let m = route(&app, Call::get("/metrics", AGENT).anonymous()).await;
        assert_eq!(m.status, 200);
        assert_eq!(gauge(&m.text), Some(QUEUE as u64), "{}", m.text);
    }
    let elapsed = started.elapsed();
    let counted = store.counts().list - reads_before;
    // One count when the first scrape started the task, then one per interval: never one per
    // scrape.
    let bound = 2 + (elapsed.as_millis() / every.as_millis()) as u64;
    assert!(
        counted >= 1 && counted <= bound,
        "{counted} counts for {SCRAPES} scrapes in {elapsed:?}"
    );
    assert!(counted < SCRAPES, "{counted} counts for {SCRAPES} scrapes");

    // New unknown records appear at the next count, without a scrape asking for one.
    claim_unknown(
        pg.as_ref(),
        (0..7).map(|i| format!("acme:{ENV}:wf-gauge-late:s{i}")),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = route(&app, Call::get("/metrics", AGENT).anonymous()).await;
        if gauge(&m.text) == Some(QUEUE as u64 + 7) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the gauge stayed at {:?}",
            gauge(&m.text)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(app);
    db.drop_now().await;
}
