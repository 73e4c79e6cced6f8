//! A slow but healthy effect keeps its lease: the executor renews it while the call runs, so a
//! second worker arriving after the original lease length waits instead of taking over.

use std::sync::Arc;
use std::time::Duration;

use idemgate_conformance::downstream::{FakeDownstream, Fault};
use idemgate_conformance::harness::{Spec, key, op, ticket};
use idemgate_conformance::mem::MemStore;
use idemgate_core::clock::Clock;
use idemgate_core::effect::AllowAll;
use idemgate_core::outcome::Status;
use idemgate_core::store::Store;
use idemgate_engine::{Executor, Settings};

/// Time that follows tokio's clock, so `tokio::time::pause` drives both the executor's lease
/// arithmetic and its renewal timer.
struct TokioClock(tokio::time::Instant);

impl Clock for TokioClock {
    fn now(&self) -> i64 {
        1_767_225_600_000 + self.0.elapsed().as_millis() as i64
    }
}

fn worker(store: &Arc<MemStore>, clock: &Arc<TokioClock>, name: &str) -> Executor {
    Executor::new(
        store.clone(),
        clock.clone(),
        Arc::new(AllowAll),
        Settings {
            worker: name.into(),
            ..Settings::default()
        },
    )
}

#[tokio::test(start_paused = true)]
async fn slow_effect_keeps_its_lease() {
    let mut spec = Spec::key_based();
    spec.lease_seconds = 3;
    let contract = spec.contract();
    let store = Arc::new(MemStore::new());
    let clock = Arc::new(TokioClock(tokio::time::Instant::now()));
    let downstream = FakeDownstream::new()
        .deduplicating(true)
        .with_receipt_lookup(true);
    downstream.push_fault(Fault::Delay(Duration::from_secs(10)));

    let a = {
        let (exec, c, ds) = (
            worker(&store, &clock, "worker-a"),
            contract.clone(),
            downstream.clone(),
        );
        tokio::spawn(async move { exec.execute(&c, &op("s1"), &ticket("Refund"), &ds).await })
    };
    // Well past the 3 s lease: without renewal, worker B would take the claim over.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let b = worker(&store, &clock, "worker-b")
        .execute(&contract, &op("s1"), &ticket("Refund"), &downstream)
        .await;
    assert_eq!(b.status, Status::InFlight, "{b:?}");
    let record = store.get(&key("s1")).await.unwrap().unwrap();
    assert_eq!(record.fence, 1, "no takeover happened");
    assert!(
        record.lease().unwrap().expires_at > clock.now(),
        "the lease was renewed"
    );

    let a = a.await.unwrap();
    assert_eq!(a.status, Status::Applied, "{a:?}");
    assert_eq!(downstream.effects(), 1);
    assert_eq!(downstream.calls(), 1, "worker B sent nothing");
}
