//! The chaos proxy under a bounded load, in front of fake downstreams that count their own
//! effects, with the real executor as its caller: the ledger's effects per key are the
//! downstream's, and a duplicate effect — a contract that claims deduplication for a
//! downstream that does not deduplicate, so that every resend after a lost answer is a second
//! ticket — is caught and named by key.

use std::collections::HashMap;

use idemgate_app::{App, Assembly, HttpEffects, ToolSet};
use idemgate_chaos::{Config, Faults, Proxy, Rates, Running};
use idemgate_core::audit::Sealer;
use idemgate_core::contract::Contract;
use idemgate_engine::Caller;
use idemgate_verify::testing::{Behaviour, Claims, FakeService, contract_at};
use serde_json::json;

struct Stack {
    proxy: Running,
    app: App,
    _dir: tempfile::TempDir,
}

async fn start(fake: &FakeService, claims: Claims, faults: Faults) -> Stack {
    let mut config = Config::new(fake.url());
    config.reference = "/ticket_id".into();
    config.faults = faults;
    let proxy = Proxy::new(config)
        .unwrap()
        .start(([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    let contract = Contract::load(
        &contract_at(&proxy.url(), "tickets.create", claims),
        "t.yaml",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = idemgate_app::open_store(
        &format!("sqlite://{}", dir.path().join("s.sqlite").display()),
        Sealer::unsigned(),
    )
    .await
    .unwrap();
    let tools = ToolSet::build(vec![contract], &HttpEffects).unwrap();
    let app = Assembly::new(store, tools, "load").build();
    Stack {
        proxy,
        app,
        _dir: dir,
    }
}

/// Delivers `keys` operations, each twice, eight at a time; the labels answered.
async fn load(app: &App, keys: usize) -> HashMap<String, usize> {
    let mut labels = HashMap::new();
    for _round in 0..2 {
        for batch in (0..keys).collect::<Vec<_>>().chunks(8) {
            let mut calls = tokio::task::JoinSet::new();
            for &i in batch {
                let app = app.clone();
                calls.spawn(async move {
                    let caller = Caller {
                        tenant: "acme".into(),
                        actor: "agent".into(),
                        role: "agent".into(),
                    };
                    let arguments = json!({"subject": format!("ticket {i}")});
                    let outcome = app
                        .invoke(
                            caller,
                            "tickets.create",
                            Some(format!("run-{i}")),
                            Some("open".into()),
                            arguments,
                        )
                        .await;
                    outcome.status.as_str().to_string()
                });
            }
            while let Some(label) = calls.join_next().await {
                *labels.entry(label.unwrap()).or_default() += 1;
            }
        }
    }
    labels
}

async fn stop(stack: Stack) -> Proxy {
    stack.proxy.stop().await.unwrap()
}

fn faults(seed: u64) -> Faults {
    Faults {
        seed,
        rates: Rates {
            drop: 0.25,
            error: 0.1,
            reset: 0.05,
            malformed: 0.05,
            ..Rates::default()
        },
        ..Faults::default()
    }
}

/// The ledger's distinct references per key are the downstream's own effects per key.
fn ledger_matches(proxy: &Proxy, fake: &FakeService) {
    let per_key = fake.per_key();
    for key in proxy.ledger().keys() {
        assert_eq!(
            key.references.len(),
            per_key.get(&key.key).copied().unwrap_or(0),
            "{key:?}"
        );
    }
    // And no effect at the downstream that the ledger did not see.
    for (key, n) in per_key {
        let seen = proxy.ledger().key(&key).map_or(0, |k| k.references.len());
        assert_eq!(seen, n, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_honest_contract_under_faults_makes_one_effect_per_key() {
    let fake = FakeService::start(Behaviour::honest()).await;
    let claims = Claims {
        dedup: true,
        lookup: true,
        ..Claims::default()
    };
    let stack = start(&fake, claims, faults(11)).await;
    let labels = load(&stack.app, 32).await;
    let proxy = stop(stack).await;
    ledger_matches(&proxy, &fake);
    let summary = proxy.ledger().summary();
    assert!(!summary.has_duplicates(), "{}", summary.render());
    assert!(
        summary.faults.get("drop").copied().unwrap_or(0) > 0,
        "{summary:?}"
    );
    for (key, n) in fake.per_key() {
        assert_eq!(n, 1, "{key}");
    }
    assert_eq!(labels.get("unknown"), None, "{labels:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contract_that_lies_about_deduplication_is_caught_by_the_ledger() {
    let fake = FakeService::start(Behaviour::plain()).await;
    let lie = Claims {
        dedup: true,
        ..Claims::default()
    };
    let stack = start(&fake, lie, faults(11)).await;
    load(&stack.app, 32).await;
    let proxy = stop(stack).await;
    ledger_matches(&proxy, &fake);
    let summary = proxy.ledger().summary();
    let duplicated: Vec<&str> = summary.duplicates.iter().map(|k| k.key.as_str()).collect();
    assert!(!duplicated.is_empty(), "{}", summary.render());
    // Exactly the keys with more than one ticket at the downstream.
    let mut expected: Vec<String> = fake
        .per_key()
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(k, _)| k)
        .collect();
    expected.sort();
    let mut named: Vec<String> = duplicated.iter().map(|k| k.to_string()).collect();
    named.sort();
    assert_eq!(named, expected);

    // The honest contract for the same downstream, under the same faults: never a resend
    // after an ambiguous answer, so never a duplicate; what cannot be proved is `unknown`.
    let fake = FakeService::start(Behaviour::plain()).await;
    let stack = start(&fake, Claims::default(), faults(11)).await;
    let labels = load(&stack.app, 32).await;
    let proxy = stop(stack).await;
    ledger_matches(&proxy, &fake);
    assert!(!proxy.ledger().summary().has_duplicates());
    assert!(
        labels.get("unknown").copied().unwrap_or(0) > 0,
        "{labels:?}"
    );
    for (key, n) in fake.per_key() {
        assert_eq!(n, 1, "{key}");
    }
}
