//! The store's contract against a real PostgreSQL, one fresh database per test.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::*;
use idemgate_core::ErrorCode;
use idemgate_core::record::{Dispatch, EventKind, RecordState, RecordStatus};
use idemgate_core::store::{Cas, Claimed, Filter, RequestUpdate, Store, SweepReport};
use idemgate_store_postgres::{Options, PgStore, migrate};
use serde_json::json;

const T0: i64 = 1_700_000_000_000;

/// Inserts `record` through a plain connection, as another process's claim would.
async fn insert_raw(client: &impl tokio_postgres::GenericClient, record: &idemgate_core::Record) {
    let r = idemgate_core::record::Row::from_record(record);
    client
        .execute(
            "INSERT INTO operations (tenant, key, tool, tool_version, fingerprint, canonicalization,
                 status, fence, lease_owner, lease_expires_at, dispatch, job_id, effect_reference,
                 result, error_code, error_message, actor, request, approved_by, created_at,
                 updated_at, expires_at, purge_at, intent_window)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                 $18, $19, $20, $21, $22, $23, $24)",
            &[
                &r.tenant, &r.key, &r.tool, &r.tool_version, &r.fingerprint, &r.canonicalization,
                &r.status, &r.fence, &r.lease_owner, &r.lease_expires_at, &r.dispatch, &r.job_id,
                &r.effect_reference, &r.result, &r.error_code, &r.error_message, &r.actor,
                &r.request, &r.approved_by, &r.created_at, &r.updated_at, &r.expires_at,
                &r.purge_at, &r.intent_window,
            ],
        )
        .await
        .unwrap();
}

/// Waits until `n` of the store's sessions are blocked on a lock.
async fn wait_for_lock_waiters(url: &str, n: i64) {
    let probe = admin(url).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let waiting: i64 = probe
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'idemgate'
                   AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting >= n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the store's statement never blocked"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_starts_migrate_once() {
    let db = database!();
    let starts: Vec<_> = (0..8)
        .map(|_| {
            let url = db.url().to_string();
            tokio::spawn(async move { PgStore::connect(&url, Options::default()).await })
        })
        .collect();
    for start in starts {
        start
            .await
            .unwrap()
            .expect("every concurrent start connects");
    }
    let store = db.store().await;
    assert_eq!(store.migrate().await.unwrap(), migrate::SCHEMA_VERSION);
    let client = admin(db.url()).await;
    let rows = client
        .query(
            "SELECT version FROM idemgate_schema_version ORDER BY version",
            &[],
        )
        .await
        .unwrap();
    let versions: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(versions, (1..=migrate::SCHEMA_VERSION).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let db = database!();
    drop(db.store().await);
    let client = admin(db.url()).await;
    client
        .execute(
            "INSERT INTO idemgate_schema_version (version, name) VALUES (999, 'future')",
            &[],
        )
        .await
        .unwrap();
    let err = PgStore::connect(db.url(), Options::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("newer"), "{err}");
}

#[tokio::test]
async fn claim_inserts_then_loads_unchanged() {
    let db = database!();
    let store = db.store().await;
    let first = claimed("acme:prod:wf:s1", "w1", T0);
    let events = vec![
        event(EventKind::Proposed, T0, 1, "w1"),
        event(EventKind::Claimed, T0, 1, "w1").with_detail("lease 30s"),
    ];
    assert_eq!(
        store.claim(first.clone(), events.clone()).await.unwrap(),
        Claimed::Inserted(first.clone())
    );

    let mut second = claimed("acme:prod:wf:s1", "w2", T0 + 5);
    second.fingerprint = fingerprint(2);
    let answer = store
        .claim(second, vec![event(EventKind::Claimed, T0 + 5, 1, "w2")])
        .await
        .unwrap();
    assert_eq!(answer, Claimed::Existing(first.clone()));
    // Events come only with the insert.
    assert_eq!(store.events(&first.key).await.unwrap(), events);
    assert_eq!(store.get(&first.key).await.unwrap(), Some(first));
    assert_eq!(store.get(&key("acme:prod:wf:other")).await.unwrap(), None);
}

#[tokio::test]
async fn tenants_do_not_share_keys() {
    let db = database!();
    let store = db.store().await;
    let a = claimed("acme:prod:wf:s1", "w1", T0);
    let b = claimed("globex:prod:wf:s1", "w1", T0);
    assert!(matches!(
        store.claim(a.clone(), vec![]).await.unwrap(),
        Claimed::Inserted(_)
    ));
    assert!(matches!(
        store.claim(b.clone(), vec![]).await.unwrap(),
        Claimed::Inserted(_)
    ));
    let listed = store
        .list(Filter {
            tenant: Some("globex".into()),
            ..Filter::default()
        })
        .await
        .unwrap();
    assert_eq!(listed, vec![b]);
}

/// Many processes' worth of claims on one key: the unique key lets exactly one insert, and
/// every other claim sees the winner's row — also those whose statement snapshot predates the
/// winner's commit (the READ COMMITTED gap the store re-reads across).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_insert_exactly_once() {
    let db = database!();
    let store = db
        .store_with(Options {
            pool_size: 12,
            ..Options::default()
        })
        .await;
    for round in 0..20 {
        let key_text = format!("acme:prod:race:{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(48));
        let tasks: Vec<_> = (0..48)
            .map(|i| {
                let store = store.clone();
                let barrier = barrier.clone();
                let record = claimed(&key_text, &format!("w{i}"), T0);
                tokio::spawn(async move {
                    let events = vec![event(EventKind::Claimed, T0, 1, &format!("w{i}"))];
                    barrier.wait().await;
                    store.claim(record, events).await.unwrap()
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut seen = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                Claimed::Inserted(r) => winners.push(r),
                Claimed::Existing(r) => seen.push(r),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one claim inserts");
        assert_eq!(seen.len(), 47);
        assert!(
            seen.iter().all(|r| *r == winners[0]),
            "round {round}: losers see the winner"
        );
        let trace = store.events(&winners[0].key).await.unwrap();
        assert_eq!(trace.len(), 1, "only the winner's events are stored");
        assert_eq!(
            Some(trace[0].worker.as_str()),
            winners[0].lease().unwrap().owner.as_deref()
        );
    }
}

/// The READ COMMITTED gap, made deterministic: a claim starts while another transaction has
/// inserted the same key but not committed. The claim's insert waits; after the commit it does
/// nothing, and its own snapshot (older than the commit) cannot show the row. The store must
/// notice and read again — answering `Existing` with the committed row, never an error.
#[tokio::test]
async fn a_claim_waiting_on_an_uncommitted_insert_sees_it_committed() {
    for commit in [true, false] {
        let db = database!();
        let store = db.store().await;
        let theirs = claimed("acme:prod:wf:s1", "other-process", T0);
        let mut admin = admin(db.url()).await;
        let tx = admin.transaction().await.unwrap();
        insert_raw(&tx, &theirs).await;

        let ours = claimed("acme:prod:wf:s1", "w1", T0 + 1);
        let claim = {
            let store = store.clone();
            let ours = ours.clone();
            tokio::spawn(async move {
                store
                    .claim(ours, vec![event(EventKind::Claimed, T0 + 1, 1, "w1")])
                    .await
            })
        };
        wait_for_lock_waiters(db.url(), 1).await;
        if commit {
            tx.commit().await.unwrap();
            assert_eq!(
                claim.await.unwrap().unwrap(),
                Claimed::Existing(theirs.clone())
            );
            assert!(store.events(&ours.key).await.unwrap().is_empty());
        } else {
            tx.rollback().await.unwrap();
            assert_eq!(
                claim.await.unwrap().unwrap(),
                Claimed::Inserted(ours.clone())
            );
            assert_eq!(store.events(&ours.key).await.unwrap().len(), 1);
        }
    }
}

#[tokio::test]
async fn transitions_are_fenced() {
    let db = database!();
    let store = db.store().await;
    let rec = claimed("acme:prod:wf:s1", "w1", T0);
    store.claim(rec.clone(), vec![]).await.unwrap();

    // A stale fence loses and writes nothing, events included.
    let mut stale = step(
        &rec,
        applied("T-1"),
        T0 + 10,
        vec![event(EventKind::Committed, T0 + 10, 0, "w0")],
    );
    stale.expect.fence = 0;
    assert_eq!(
        store.transition(stale).await.unwrap(),
        Cas::Lost(Some(rec.clone()))
    );
    // So does a wrong status.
    let mut wrong = step(&rec, applied("T-1"), T0 + 10, vec![]);
    wrong.expect.status = RecordStatus::Unknown;
    assert_eq!(
        store.transition(wrong).await.unwrap(),
        Cas::Lost(Some(rec.clone()))
    );
    assert!(store.events(&rec.key).await.unwrap().is_empty());

    // The owner's step applies, with its events.
    let sent = step(
        &rec,
        pending(Some("w1"), T0 + LEASE, Dispatch::Sent),
        T0 + 20,
        vec![event(EventKind::Sent, T0 + 20, 1, "w1")],
    );
    let Cas::Done(sent) = store.transition(sent).await.unwrap() else {
        panic!("the owner's step applies")
    };
    assert_eq!(sent.state, pending(Some("w1"), T0 + LEASE, Dispatch::Sent));
    assert_eq!(sent.updated_at, T0 + 20);
    assert_eq!(sent.created_at, T0);

    // A takeover after the lease expired bumps the fence; the late finisher then loses.
    let late = T0 + LEASE + 1;
    let Cas::Done(taken) = store.transition(takeover(&sent, "w2", late)).await.unwrap() else {
        panic!("an expired lease can be taken over")
    };
    assert_eq!(taken.fence, 2);
    let finish = step(
        &sent,
        applied("T-1"),
        late + 1,
        vec![event(EventKind::Committed, late + 1, 1, "w1")],
    );
    assert_eq!(
        store.transition(finish).await.unwrap(),
        Cas::Lost(Some(taken.clone()))
    );
    let kinds: Vec<_> = store
        .events(&rec.key)
        .await
        .unwrap()
        .iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, vec![EventKind::Sent, EventKind::Recovered]);

    // A transition on a missing record loses with nothing to show.
    let mut missing = step(&rec, applied("T-1"), T0, vec![]);
    missing.key = key("acme:prod:wf:missing");
    assert_eq!(store.transition(missing).await.unwrap(), Cas::Lost(None));
}

#[tokio::test]
async fn a_live_lease_cannot_be_taken_over() {
    let db = database!();
    let store = db.store().await;
    let rec = claimed("acme:prod:wf:s1", "w1", T0);
    store.claim(rec.clone(), vec![]).await.unwrap();
    let expiry = T0 + LEASE;
    // One millisecond early: the lease is live.
    assert_eq!(
        store
            .transition(takeover(&rec, "w2", expiry - 1))
            .await
            .unwrap(),
        Cas::Lost(Some(rec.clone()))
    );
    // At the expiry instant it has expired ("at or before").
    assert!(
        matches!(store.transition(takeover(&rec, "w2", expiry)).await.unwrap(), Cas::Done(r) if r.fence == 2)
    );
}

/// Many workers take over one expired lease at once, round after round: exactly one takeover
/// applies, and the record and its trace show that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_takeovers_apply_once() {
    let db = database!();
    let store = db
        .store_with(Options {
            pool_size: 12,
            ..Options::default()
        })
        .await;
    for round in 0..20 {
        let rec = claimed(&format!("acme:prod:cas:{round}"), "w0", T0);
        store.claim(rec.clone(), vec![]).await.unwrap();
        let now = T0 + LEASE;
        let tasks: Vec<_> = (0..24)
            .map(|i| {
                let store = store.clone();
                let t = takeover(&rec, &format!("w{i}"), now);
                tokio::spawn(async move { store.transition(t).await.unwrap() })
            })
            .collect();
        let mut done = Vec::new();
        let mut lost = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                Cas::Done(r) => done.push(r),
                Cas::Lost(r) => lost.push(r),
            }
        }
        assert_eq!(done.len(), 1, "round {round}: exactly one takeover applies");
        assert_eq!(done[0].fence, 2);
        // A loser sees the winner's record (or, racing ahead of its commit, the original).
        assert!(
            lost.iter()
                .all(|r| r.as_ref() == Some(&done[0]) || r.as_ref() == Some(&rec))
        );
        assert_eq!(store.get(&rec.key).await.unwrap().as_ref(), Some(&done[0]));
        let trace = store.events(&rec.key).await.unwrap();
        assert_eq!(trace.len(), 1);
        assert_eq!(
            Some(trace[0].worker.as_str()),
            done[0].lease().unwrap().owner.as_deref()
        );
    }
}

/// The owner renews its lease while others try to take it over at the instant it expires. A
/// renewal keeps the fence, so several renewals may apply; but a takeover applies only if it
/// came before every renewal, and then every renewal loses: never both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewal_and_a_takeover_never_both_apply() {
    let db = database!();
    let store = db
        .store_with(Options {
            pool_size: 12,
            ..Options::default()
        })
        .await;
    for round in 0..20 {
        let rec = claimed(&format!("acme:prod:renew:{round}"), "w0", T0);
        store.claim(rec.clone(), vec![]).await.unwrap();
        let now = T0 + LEASE;
        let tasks: Vec<_> = (0..24)
            .map(|i| {
                let store = store.clone();
                let t = if i % 2 == 0 {
                    let renewed = pending(Some("w0"), now + LEASE, Dispatch::NotSent);
                    step(
                        &rec,
                        renewed,
                        now,
                        vec![event(EventKind::Claimed, now, 1, "w0")],
                    )
                } else {
                    takeover(&rec, &format!("w{i}"), now)
                };
                tokio::spawn(async move { (i % 2 == 0, store.transition(t).await.unwrap()) })
            })
            .collect();
        let (mut renewals, mut takeovers) = (0, 0);
        for task in tasks {
            match task.await.unwrap() {
                (true, Cas::Done(_)) => renewals += 1,
                (false, Cas::Done(_)) => takeovers += 1,
                (_, Cas::Lost(_)) => {}
            }
        }
        assert!(
            takeovers <= 1,
            "round {round}: {takeovers} takeovers applied"
        );
        assert!(
            (takeovers == 1 && renewals == 0) || (takeovers == 0 && renewals >= 1),
            "round {round}: {takeovers} takeovers and {renewals} renewals applied"
        );
        let current = store.get(&rec.key).await.unwrap().unwrap();
        assert_eq!(current.fence, 1 + takeovers);
        assert_eq!(
            store.events(&rec.key).await.unwrap().len() as u64,
            takeovers + renewals
        );
    }
}

#[tokio::test]
async fn request_approver_and_fingerprint_updates() {
    let db = database!();
    let store = db.store().await;
    let rec = claimed("acme:prod:wf:s1", "w1", T0);
    store.claim(rec.clone(), vec![]).await.unwrap();

    let mut t = step(&rec, RecordState::AwaitingApproval, T0 + 1, vec![]);
    t.request = RequestUpdate::Keep;
    let Cas::Done(r) = store.transition(t).await.unwrap() else {
        panic!()
    };
    assert_eq!(r.request, rec.request);
    assert_eq!(r.lease(), None);

    let mut t = step(
        &r,
        pending(Some("w1"), T0 + LEASE, Dispatch::NotSent),
        T0 + 2,
        vec![],
    );
    t.approved_by = Some("operator-7".into());
    t.request = RequestUpdate::Set(json!({"title": "Printer on fire", "priority": 1}));
    let Cas::Done(r) = store.transition(t).await.unwrap() else {
        panic!()
    };
    assert_eq!(r.approved_by.as_deref(), Some("operator-7"));
    assert_eq!(
        r.request,
        Some(json!({"title": "Printer on fire", "priority": 1}))
    );

    let mut t = step(&r, applied("T-9"), T0 + 3, vec![]);
    t.request = RequestUpdate::Clear;
    t.fingerprint = Some(fingerprint(9));
    let Cas::Done(r) = store.transition(t).await.unwrap() else {
        panic!()
    };
    assert_eq!(r.request, None);
    assert_eq!(r.fingerprint, fingerprint(9));
    // The approver is kept when a later step names none.
    assert_eq!(r.approved_by.as_deref(), Some("operator-7"));
    assert_eq!(r.state, applied("T-9"));
    assert_eq!(store.get(&rec.key).await.unwrap(), Some(r));
}

#[tokio::test]
async fn events_keep_their_order_and_detail() {
    let db = database!();
    let store = db.store().await;
    let k = key("acme:prod:wf:s1");
    let mut expected = Vec::new();
    for batch in 0..5u64 {
        let events: Vec<_> = (0..3)
            .map(|i| {
                event(
                    EventKind::ALL[(batch * 3 + i) as usize % EventKind::ALL.len()],
                    T0 + (batch * 3 + i) as i64,
                    batch,
                    "w1",
                )
                .with_detail(format!("n={batch}.{i}"))
            })
            .collect();
        store.append_events(&k, events.clone()).await.unwrap();
        expected.extend(events);
    }
    store.append_events(&k, vec![]).await.unwrap();
    assert_eq!(store.events(&k).await.unwrap(), expected);
    assert!(
        store
            .events(&key("globex:prod:wf:s1"))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn list_pages_in_byte_order() {
    let db = database!();
    let store = db.store().await;
    // Mixed case and punctuation: byte order differs from any locale's order.
    let mut keys = Vec::new();
    for i in 0..150 {
        for tenant in ["acme", "Zeta"] {
            let step_id = match i % 3 {
                0 => format!("a{i:03}"),
                1 => format!("B{i:03}"),
                _ => format!("_{i:03}"),
            };
            let mut r = claimed(&format!("{tenant}:prod:wf:{step_id}"), "w1", T0);
            if i % 5 == 0 {
                r.state = unknown();
            }
            if i % 2 == 0 {
                r.tool = "refund".into();
            }
            keys.push(r.key.as_str().to_string());
            store.claim(r, vec![]).await.unwrap();
        }
    }
    let mut sorted = keys.clone();
    sorted.sort(); // Rust's string order is byte order.

    // Walk all pages of 100 (limit 0 means the default page).
    let mut walked = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list(Filter {
                after: after.clone(),
                limit: 0,
                ..Filter::default()
            })
            .await
            .unwrap();
        assert!(page.len() <= 100);
        if page.is_empty() {
            break;
        }
        after = Some(page.last().unwrap().key.as_str().to_string());
        walked.extend(page.into_iter().map(|r| r.key.as_str().to_string()));
    }
    assert_eq!(walked, sorted);

    // A limit over the cap is cut to it; 300 rows fit.
    assert_eq!(
        store
            .list(Filter {
                limit: 5000,
                ..Filter::default()
            })
            .await
            .unwrap()
            .len(),
        300
    );

    // Filters combine.
    let unknown_acme_refunds = store
        .list(Filter {
            tenant: Some("acme".into()),
            status: Some(RecordStatus::Unknown),
            tool: Some("refund".into()),
            limit: 1000,
            ..Filter::default()
        })
        .await
        .unwrap();
    assert_eq!(unknown_acme_refunds.len(), 15); // i % 10 == 0
    assert!(unknown_acme_refunds.iter().all(|r| r.tenant() == "acme"
        && r.tool == "refund"
        && r.status() == RecordStatus::Unknown));
    let queue = store
        .list(Filter {
            status: Some(RecordStatus::Unknown),
            limit: 7,
            ..Filter::default()
        })
        .await
        .unwrap();
    assert_eq!(queue.len(), 7);
    assert!(
        queue
            .windows(2)
            .all(|w| w[0].key.as_str() < w[1].key.as_str())
    );
}

#[tokio::test]
async fn recoverable_finds_expired_released_and_polled_records() {
    let db = database!();
    let store = db.store().await;
    let now = T0 + 100_000;
    let cases = [
        // (step, state, updated_at, due)
        (
            "live",
            pending(Some("w1"), now + 1, Dispatch::Sent),
            T0 + 1,
            false,
        ),
        (
            "expired",
            pending(Some("w1"), now - 1, Dispatch::Sent),
            T0 + 5,
            true,
        ),
        (
            "boundary",
            pending(Some("w1"), now, Dispatch::NotSent),
            T0 + 4,
            true,
        ),
        (
            "released",
            pending(None, now + 50_000, Dispatch::NotSent),
            T0 + 3,
            true,
        ),
        (
            "job",
            pending(
                Some("w1"),
                now + 50_000,
                Dispatch::Job {
                    job_id: "j-1".into(),
                },
            ),
            T0 + 2,
            true,
        ),
        ("applied", applied("T-1"), T0, false),
        ("unknown", unknown(), T0, false),
    ];
    for (step_id, state, updated_at, _) in &cases {
        let mut r = claimed(&format!("acme:prod:wf:{step_id}"), "w1", T0);
        r.state = state.clone();
        r.updated_at = *updated_at;
        store.claim(r, vec![]).await.unwrap();
    }
    let due: Vec<_> = store
        .recoverable(now, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key.step_id().to_string())
        .collect();
    // Oldest update first.
    assert_eq!(due, vec!["job", "released", "boundary", "expired"]);
    let first_two: Vec<_> = store
        .recoverable(now, 2)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key.step_id().to_string())
        .collect();
    assert_eq!(first_two, vec!["job", "released"]);
    assert!(store.recoverable(now, 0).await.unwrap().is_empty());
}

#[tokio::test]
async fn find_fingerprint_within_the_window() {
    let db = database!();
    let store = db.store().await;
    for (step_id, tenant, tool, n, created) in [
        ("old", "acme", "create_ticket", 7, T0),
        ("new", "acme", "create_ticket", 7, T0 + 1000),
        ("other_tool", "acme", "refund", 8, T0 + 2000),
        ("other_tenant", "globex", "create_ticket", 9, T0 + 2000),
    ] {
        let mut r = claimed(&format!("{tenant}:prod:wf:{step_id}"), "w1", created);
        r.tool = tool.into();
        r.fingerprint = fingerprint(n);
        store.claim(r, vec![]).await.unwrap();
    }
    let find = |tenant: &'static str, tool: &'static str, n: u64, since: i64| {
        let store = store.clone();
        async move {
            store
                .find_fingerprint(tenant, tool, &fingerprint(n), since)
                .await
                .unwrap()
                .map(|k| k.as_str().to_string())
        }
    };
    assert_eq!(
        find("acme", "create_ticket", 7, T0).await.as_deref(),
        Some("acme:prod:wf:old")
    );
    assert_eq!(
        find("acme", "create_ticket", 7, T0 + 1).await.as_deref(),
        Some("acme:prod:wf:new")
    );
    assert_eq!(find("acme", "create_ticket", 7, T0 + 1001).await, None);
    assert_eq!(find("acme", "create_ticket", 8, T0).await, None);
    assert_eq!(find("acme", "create_ticket", 9, T0).await, None);
}

/// A database of schema version 2 (before `intent_window`): its records stay findable by
/// fingerprint after the upgrade, while a record claimed afterwards without the window is not.
#[tokio::test]
async fn records_from_before_the_intent_flag_stay_findable() {
    let db = database!();
    let mut client = admin(db.url()).await;
    let tx = client.transaction().await.unwrap();
    tx.batch_execute(
        "CREATE TABLE idemgate_schema_version (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .unwrap();
    for (index, (name, sql)) in migrate::MIGRATIONS[..2].iter().enumerate() {
        tx.batch_execute(sql).await.unwrap();
        tx.execute(
            "INSERT INTO idemgate_schema_version (version, name) VALUES ($1, $2)",
            &[&(index as i32 + 1), name],
        )
        .await
        .unwrap();
    }
    let mut old = claimed("acme:prod:wf:old", "w1", T0);
    old.fingerprint = fingerprint(7);
    let r = idemgate_core::record::Row::from_record(&old);
    tx.execute(
        "INSERT INTO operations (tenant, key, tool, tool_version, fingerprint, canonicalization,
             status, fence, actor, created_at, updated_at, expires_at, purge_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        &[
            &r.tenant,
            &r.key,
            &r.tool,
            &r.tool_version,
            &r.fingerprint,
            &r.canonicalization,
            &"unknown",
            &r.fence,
            &r.actor,
            &r.created_at,
            &r.updated_at,
            &r.expires_at,
            &r.purge_at,
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let store = db.store().await;
    let mut unwatched = claimed("acme:prod:wf:new", "w1", T0 - 1);
    unwatched.fingerprint = fingerprint(7);
    unwatched.intent_window = false;
    store.claim(unwatched, vec![]).await.unwrap();
    let found = store
        .find_fingerprint("acme", &old.tool, &fingerprint(7), 0)
        .await
        .unwrap();
    assert_eq!(found.as_ref().map(|k| k.as_str()), Some("acme:prod:wf:old"));
}

#[tokio::test]
async fn sweep_follows_the_trait_rule() {
    let db = database!();
    let store = db.store().await;
    let now = T0 + 10_000;
    // (step, state, expires_at, purge_at)
    let rows = [
        ("applied_due", applied("T-1"), now, now + 5),
        ("refused_due", refused(), now - 1, now + 5),
        (
            "approval_due",
            RecordState::AwaitingApproval,
            now - 1,
            now + 5,
        ),
        ("applied_live", applied("T-2"), now + 100, now + 200),
        (
            "pending_due",
            pending(Some("w1"), now - 1, Dispatch::Sent),
            now - 1,
            now - 1,
        ),
        ("unknown_due", unknown(), now - 1, now - 1),
        ("tomb_due", tombstone(Some("T-0"), None), now - 100, now),
        (
            "tomb_live",
            tombstone(Some("T-00"), None),
            now - 100,
            now + 1,
        ),
    ];
    for (step_id, state, expires_at, purge_at) in &rows {
        let mut r = claimed(&format!("acme:prod:wf:{step_id}"), "w1", T0);
        r.state = state.clone();
        r.expires_at = *expires_at;
        r.purge_at = *purge_at;
        store
            .claim(r, vec![event(EventKind::Claimed, T0, 1, "w1")])
            .await
            .unwrap();
    }
    let get = |step_id: &str| {
        let store = store.clone();
        let k = key(&format!("acme:prod:wf:{step_id}"));
        async move { store.get(&k).await.unwrap() }
    };

    assert_eq!(store.sweep(now, 0).await.unwrap(), SweepReport::default());
    // A limit of two per kind: two of the three due records are compacted, the one due
    // tombstone is purged.
    assert_eq!(
        store.sweep(now, 2).await.unwrap(),
        SweepReport {
            compacted: 2,
            purged: 1
        }
    );
    assert_eq!(
        store.sweep(now, 2).await.unwrap(),
        SweepReport {
            compacted: 1,
            purged: 0
        }
    );
    assert_eq!(store.sweep(now, 2).await.unwrap(), SweepReport::default());

    let t = get("applied_due").await.unwrap();
    assert_eq!(t.state, tombstone(Some("T-1"), None));
    assert_eq!((t.request.clone(), t.updated_at), (None, now));
    assert_eq!(
        get("refused_due").await.unwrap().state,
        tombstone(None, Some(ErrorCode::DownstreamRejected))
    );
    assert_eq!(
        get("approval_due").await.unwrap().state,
        tombstone(None, None)
    );
    let trace = store.events(&t.key).await.unwrap();
    assert_eq!(
        trace.iter().map(|e| e.kind).collect::<Vec<_>>(),
        vec![EventKind::Claimed, EventKind::Expired]
    );
    assert_eq!((trace[1].at, trace[1].attempt), (now, 1));

    assert_eq!(get("applied_live").await.unwrap().state, applied("T-2"));
    assert_eq!(
        get("pending_due").await.unwrap().status(),
        RecordStatus::Pending
    );
    assert_eq!(
        get("unknown_due").await.unwrap().status(),
        RecordStatus::Unknown
    );
    assert_eq!(get("tomb_due").await, None);
    assert!(
        store
            .events(&key("acme:prod:wf:tomb_due"))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(get("tomb_live").await.is_some());

    // Later, the compacted records' tombstones are purged too, with their events.
    let report = store.sweep(now + 5, 100).await.unwrap();
    assert_eq!(
        report,
        SweepReport {
            compacted: 0,
            purged: 4
        }
    );
    let left: HashSet<_> = store
        .list(Filter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key.step_id().to_string())
        .collect();
    assert_eq!(
        left,
        HashSet::from([
            "applied_live".to_string(),
            "pending_due".into(),
            "unknown_due".into()
        ])
    );
}

/// Sweepers in several processes at once compact each record once: `SKIP LOCKED` splits the
/// work, and each record gets exactly one `expired` event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_sweeps_compact_each_record_once() {
    let db = database!();
    let store = db.store().await;
    let now = T0 + 10_000;
    for i in 0..200 {
        let mut r = claimed(&format!("acme:prod:sweep:{i:03}"), "w1", T0);
        r.state = applied(&format!("T-{i}"));
        r.expires_at = now - 1;
        store.claim(r, vec![]).await.unwrap();
    }
    let sweepers: Vec<_> = (0..6)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut total = 0;
                loop {
                    let report = store.sweep(now, 15).await.unwrap();
                    total += report.compacted;
                    if report.compacted == 0 {
                        return total;
                    }
                }
            })
        })
        .collect();
    let mut total = 0;
    for s in sweepers {
        total += s.await.unwrap();
    }
    assert_eq!(total, 200);
    for r in store
        .list(Filter {
            limit: 1000,
            ..Filter::default()
        })
        .await
        .unwrap()
    {
        assert_eq!(r.status(), RecordStatus::Tombstone);
        assert_eq!(store.events(&r.key).await.unwrap().len(), 1, "{}", r.key);
    }
}

#[tokio::test]
async fn stored_json_survives_exactly() {
    let db = database!();
    let store = db.store().await;
    let mut r = claimed("acme:prod:wf:s1", "w1", T0);
    let request = json!({"z": 1, "a": [1.5, "\u{0000}\u{1F600}", null, {"nested": true}], "big": 9007199254740991_i64});
    r.request = Some(request.clone());
    store.claim(r.clone(), vec![]).await.unwrap();
    let back = store.get(&r.key).await.unwrap().unwrap();
    assert_eq!(back.request, Some(request.clone()));
    // The text column holds exactly the bytes written; jsonb would have reordered the members.
    let client = admin(db.url()).await;
    let stored: String = client
        .query_one("SELECT request FROM operations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, request.to_string());
}
