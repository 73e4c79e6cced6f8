//! The proxy in front of a ticket service that counts its own effects: each fault does to the
//! caller and to the upstream what it says, and the ledger agrees with the upstream's count.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use idemgate_chaos::{Config, Fault, Faults, Proxy, Rates, Rule, Running, Told};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// Tickets by key; `dedup` answers a repeated key with its first ticket.
#[derive(Default)]
struct Tickets {
    dedup: bool,
    created: Mutex<Vec<(Option<String>, u64)>>,
    by_key: Mutex<HashMap<String, u64>>,
}

impl Tickets {
    fn count(&self) -> usize {
        self.created.lock().unwrap().len()
    }
    fn count_for(&self, key: &str) -> usize {
        let created = self.created.lock().unwrap();
        created
            .iter()
            .filter(|(k, _)| k.as_deref() == Some(key))
            .count()
    }
}

async fn create(State(t): State<Arc<Tickets>>, headers: HeaderMap) -> (StatusCode, Json<Value>) {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    // One lock over the check and the insert: two copies of one key arriving at once must
    // not both create a ticket.
    let mut created = t.created.lock().unwrap();
    let mut by_key = t.by_key.lock().unwrap();
    if t.dedup
        && let Some(key) = &key
        && let Some(id) = by_key.get(key)
    {
        return (StatusCode::OK, Json(json!({"id": format!("t{id}")})));
    }
    let id = created.len() as u64 + 1;
    created.push((key.clone(), id));
    if let Some(key) = key {
        by_key.insert(key, id);
    }
    (StatusCode::CREATED, Json(json!({"id": format!("t{id}")})))
}

async fn upstream(dedup: bool) -> (SocketAddr, Arc<Tickets>) {
    let tickets = Arc::new(Tickets {
        dedup,
        ..Tickets::default()
    });
    let app = axum::Router::new()
        .route("/tickets", post(create))
        .route("/health", get(|| async { "ok" }))
        .with_state(tickets.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, tickets)
}

async fn proxy(upstream: SocketAddr, faults: Faults) -> Running {
    let mut config = Config::new(format!("http://{upstream}"));
    config.faults = faults;
    let proxy = Proxy::new(config).unwrap();
    proxy.start(([127, 0, 0, 1], 0).into()).await.unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

async fn post_ticket(url: &str, key: &str) -> Result<(u16, String), reqwest::Error> {
    let response = client()
        .post(format!("{url}/tickets"))
        .header("Idempotency-Key", key)
        .json(&json!({"subject": "s"}))
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await?))
}

fn scripted(rules: &[(&str, u64, Fault)]) -> Faults {
    Faults {
        rules: rules
            .iter()
            .map(|(key, nth, fault)| Rule::for_key(key, *nth, *fault))
            .collect(),
        ..Faults::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fault_does_what_it_says_to_the_caller_and_the_upstream() {
    let (addr, tickets) = upstream(false).await;
    let running = proxy(
        addr,
        scripted(&[
            ("drop", 1, Fault::Drop),
            ("reset", 1, Fault::Reset),
            ("error", 1, Fault::Error(503)),
            ("malformed", 1, Fault::Malformed),
            ("duplicate", 1, Fault::Duplicate),
        ]),
    )
    .await;
    let url = running.url();

    let (status, body) = post_ticket(&url, "pass").await.unwrap();
    assert_eq!((status, body.as_str()), (201, r#"{"id":"t1"}"#));
    assert_eq!(tickets.count_for("pass"), 1);

    // Forwarded, then the connection closed: no answer, one effect.
    let dropped = post_ticket(&url, "drop").await;
    assert!(dropped.is_err(), "{dropped:?}");
    assert_eq!(tickets.count_for("drop"), 1);

    // Reset before forwarding: no answer, no effect.
    let reset = post_ticket(&url, "reset").await;
    assert!(reset.is_err(), "{reset:?}");
    assert_eq!(tickets.count_for("reset"), 0);

    let (status, _) = post_ticket(&url, "error").await.unwrap();
    assert_eq!(status, 503);
    assert_eq!(tickets.count_for("error"), 1);

    let (status, body) = post_ticket(&url, "malformed").await.unwrap();
    assert_eq!(status, 200);
    assert!(serde_json::from_str::<Value>(&body).is_err(), "{body}");
    assert_eq!(tickets.count_for("malformed"), 1);

    let (status, _) = post_ticket(&url, "duplicate").await.unwrap();
    assert_eq!(status, 201);
    assert_eq!(tickets.count_for("duplicate"), 2);

    let proxy = running.stop().await.unwrap();
    let ledger = proxy.ledger();
    let told = |key: &str| ledger.entries_for(key)[0].told;
    assert_eq!(told("pass"), Told::Status(201));
    assert_eq!(told("drop"), Told::Dropped);
    assert_eq!(told("reset"), Told::Reset);
    assert_eq!(told("error"), Told::Status(503));
    assert_eq!(told("malformed"), Told::Malformed);
    assert_eq!(ledger.entries_for("reset")[0].upstream.len(), 0);
    assert_eq!(ledger.entries_for("drop")[0].upstream[0].status, Some(201));
    // The ledger's commits per key are the upstream's own effects per key.
    for key in ledger.keys() {
        assert_eq!(key.commits as usize, tickets.count_for(&key.key), "{key:?}");
    }
    let summary = ledger.summary();
    assert_eq!(summary.commits as usize, tickets.count());
    assert_eq!(summary.duplicates.len(), 1);
    assert_eq!(summary.duplicates[0].key, "duplicate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deduplicating_upstream_absorbs_duplicates() {
    let (addr, tickets) = upstream(true).await;
    let running = proxy(
        addr,
        scripted(&[("k", 1, Fault::Duplicate), ("k", 2, Fault::Drop)]),
    )
    .await;
    let first = post_ticket(&running.url(), "k").await.unwrap();
    assert!(post_ticket(&running.url(), "k").await.is_err());
    let third = post_ticket(&running.url(), "k").await.unwrap();
    assert_eq!(first.1, third.1);
    let proxy = running.stop().await.unwrap();
    assert_eq!(tickets.count(), 1);
    let key = proxy.ledger().key("k").unwrap();
    assert_eq!((key.requests, key.forwarded, key.commits), (3, 4, 4));
    assert_eq!(key.references, vec!["t1"]);
    assert!(!proxy.ledger().summary().has_duplicates());
}

/// A caller that gives up during a delay stops waiting, not the forward: the upstream gets the
/// request late, and the ledger says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_request_reaches_the_upstream_after_its_caller_gave_up() {
    let (addr, tickets) = upstream(false).await;
    let running = proxy(
        addr,
        scripted(&[("late", 1, Fault::Delay(Duration::from_millis(600)))]),
    )
    .await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let gave_up = impatient
        .post(format!("{}/tickets", running.url()))
        .header("Idempotency-Key", "late")
        .json(&json!({}))
        .send()
        .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()));
    assert_eq!(tickets.count(), 0, "held, not yet forwarded");
    // Stopping waits for the forward still travelling.
    let proxy = running.stop().await.unwrap();
    assert_eq!(tickets.count_for("late"), 1);
    let entry = &proxy.ledger().entries_for("late")[0];
    assert_eq!(entry.fault, "delay=600ms");
    assert_eq!(entry.upstream[0].status, Some(201));
}

/// Rates drawn from a seed: the same seed gives every key the same faults, whatever the order
/// in which keys arrive, and the ledger still matches the upstream's count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_rates_replay_per_key() {
    let faults = Faults {
        seed: 42,
        rates: Rates {
            drop: 0.2,
            error: 0.2,
            reset: 0.1,
            ..Rates::default()
        },
        ..Faults::default()
    };
    let mut runs = Vec::new();
    for reverse in [false, true] {
        let (addr, tickets) = upstream(false).await;
        let running = proxy(addr, faults.clone()).await;
        let mut keys: Vec<String> = (0..30).map(|i| format!("key-{i}")).collect();
        if reverse {
            keys.reverse();
        }
        let mut calls = tokio::task::JoinSet::new();
        for key in keys {
            let url = running.url();
            calls.spawn(async move { post_ticket(&url, &key).await.map(|_| ()) });
        }
        while calls.join_next().await.is_some() {}
        let proxy = running.stop().await.unwrap();
        let ledger = proxy.ledger();
        assert_eq!(ledger.summary().commits as usize, tickets.count());
        let mut faults: Vec<(String, String)> = ledger
            .entries()
            .into_iter()
            .map(|e| (e.key.unwrap(), e.fault))
            .collect();
        faults.sort();
        runs.push(faults);
    }
    assert_eq!(runs[0], runs[1]);
    let injected = runs[0].iter().filter(|(_, f)| f != "pass").count();
    assert!(injected > 0, "{:?}", runs[0]);
}
