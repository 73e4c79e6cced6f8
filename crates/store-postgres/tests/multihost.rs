//! A multi-host URL (`postgres://u@HOST1:P1,HOST2:P2/db?target_session_attrs=read-write`), the
//! form a gateway is given for a primary and its standby (docs/scaling-out.md, "Failover"):
//! the store skips a host that refuses the connection and works on the next one.

mod common;

use common::*;
use idemgate_core::store::{Claimed, Store};
use idemgate_store_postgres::{Options, PgStore};

const T0: i64 = 1_700_000_000_000;

/// `url` with a host that refuses connections put before its own host.
fn behind_a_dead_host(url: &str, dead_port: u16) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL DATABASE_URL");
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (user, host) = match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), authority),
    };
    let (path, query) = match path.split_once('?') {
        Some((p, q)) => (p, format!("{q}&")),
        None => (path, String::new()),
    };
    format!(
        "{scheme}://{user}127.0.0.1:{dead_port},{host}/{path}?{query}target_session_attrs=read-write"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_host_url_reaches_the_writable_host_past_a_dead_one() {
    let db = database!();
    if !db.url().starts_with("postgres://") && !db.url().starts_with("postgresql://") {
        eprintln!("SKIPPED (multi-host URL): DATABASE_URL is not a URL");
        return;
    }
    // A port nothing listens on: bound, then released.
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = behind_a_dead_host(db.url(), dead_port);
    let store = PgStore::connect(&url, Options::default())
        .await
        .unwrap_or_else(|e| panic!("the multi-host URL {url} was refused: {e}"));
    let rec = claimed("acme:prod:wf:multihost", "w1", T0);
    assert!(matches!(
        store.claim(rec.clone(), vec![]).await.unwrap(),
        Claimed::Inserted(_)
    ));
    // The claim is in the database the single-host URL names: the same server.
    let direct = db.store().await;
    let read = direct
        .get(&rec.key)
        .await
        .unwrap()
        .expect("the claim is stored");
    assert_eq!(read.key, rec.key);
}

#[test]
fn the_dead_host_goes_first_and_the_query_is_kept() {
    assert_eq!(
        behind_a_dead_host("postgres://postgres@127.0.0.1:5432/db_1", 9),
        "postgres://postgres@127.0.0.1:9,127.0.0.1:5432/db_1?target_session_attrs=read-write"
    );
    assert_eq!(
        behind_a_dead_host("postgres://h:5/d?sslmode=disable", 9),
        "postgres://127.0.0.1:9,h:5/d?sslmode=disable&target_session_attrs=read-write"
    );
}
