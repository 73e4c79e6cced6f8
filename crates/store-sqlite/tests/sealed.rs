//! Encryption at rest: the whole fault matrix through a `SealedStore` over SQLite, and the file
//! itself holding no plaintext result or request.

use std::sync::Arc;

use idemgate_conformance::harness::{Fixture, Harness, Spec, key, ticket};
use idemgate_core::store::{Error, Store};
use idemgate_engine::sealed::{SealedStore, Sealer};
use idemgate_store_sqlite::{Options, SqliteStore};

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

fn fresh() -> Option<Fixture> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = SqliteStore::open(dir.path().join("sealed.sqlite"), Options::default()).unwrap();
    Some(Fixture {
        store: Arc::new(SealedStore::new(store, Sealer::from_hex(KEY).unwrap())),
        guard: Box::new(dir),
    })
}

mod matrix {
    use super::*;
    idemgate_conformance::scenario_tests!(fresh());
}

fn raw_columns(path: &std::path::Path) -> Vec<(Option<String>, Option<String>)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare("SELECT result, request FROM operations")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_holds_no_plaintext_and_a_wrong_key_cannot_read_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sealed.sqlite");
    let plain = SqliteStore::open(&path, Options::default()).unwrap();
    let sealed: Arc<dyn Store> = Arc::new(SealedStore::new(
        plain.clone(),
        Sealer::from_hex(KEY).unwrap(),
    ));
    let spec = Spec::key_based();
    let h = Harness::for_spec(sealed, &spec);
    let c = spec.contract();
    let first = h.deliver(&c, "s1", &ticket("Refund for order 4711")).await;
    assert_eq!(first.status, idemgate_core::Status::Applied);
    // A pending record keeps its request; park one to check that column too.
    h.store.after_claim().arm_nth(1);
    let parked = {
        let (exec, c, ds) = (h.worker("parked"), c.clone(), h.downstream.clone());
        tokio::spawn(async move {
            exec.execute(
                &c,
                &idemgate_conformance::harness::op("s2"),
                &ticket("Refund for order 4711"),
                &ds,
            )
            .await
        })
    };
    h.store.after_claim().reached().await;
    for (result, request) in raw_columns(&path) {
        for text in [result, request].into_iter().flatten() {
            assert!(
                text.starts_with("\"sealed:v1:"),
                "stored in the clear: {text}"
            );
            assert!(
                !text.contains("4711") && !text.contains("ticket_"),
                "plaintext leaked: {text}"
            );
        }
    }
    h.store.after_claim().release();
    parked.await.unwrap();
    // Replays open what was sealed.
    let replay = h.deliver(&c, "s1", &ticket("Refund for order 4711")).await;
    assert_eq!(replay.result, first.result);
    // Another key cannot open it, and says so instead of answering garbage.
    let other = SealedStore::new(plain, Sealer::from_hex(&KEY.replace('0', "f")).unwrap());
    assert!(matches!(
        other.get(&key("s1")).await,
        Err(Error::Corrupt(_))
    ));
}

#[test]
fn keys_are_64_hex_digits() {
    assert!(Sealer::from_hex(KEY).is_ok());
    assert!(Sealer::from_hex("abc").is_err());
    assert!(Sealer::from_hex(&"zz".repeat(32)).is_err());
    assert!(Sealer::from_env("IDEMGATE_TEST_NO_SUCH_VARIABLE").is_err());
}
