//! The store's contract against a real PostgreSQL, one fresh database per test.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::*;
use idemgate_core::ErrorCode;
use idemgate_core::record::{Dispatch, EventKind, RecordState, RecordStatus};
use idemgate_core::store::{
    self, Cas, Claimed, Cursor, Due, Filter, RequestUpdate, Store, SweepReport,
};
use idemgate_store_postgres::testing::{self, statements};
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
                Claimed::DuplicateIntent(other) => panic!("a plain claim named {other}"),
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

    let mut t = step(
        &rec,
        RecordState::AwaitingApproval { until: T0 + 60_000 },
        T0 + 1,
        vec![],
    );
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
    // The trace lives in the record's row: appended to a record, and oldest first after the
    // claim's own entries (none here).
    assert!(matches!(
        store
            .claim(claimed("acme:prod:wf:s1", "w1", T0), vec![])
            .await
            .unwrap(),
        Claimed::Inserted(_)
    ));
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
    // Any detail is kept as given, a NUL byte and line breaks included (PostgreSQL's text
    // cannot hold a NUL byte; the stored form escapes it).
    let awkward =
        vec![event(EventKind::Failed, T0 + 20, 5, "w1").with_detail("nul\0byte\nnext \"line\"")];
    store.append_events(&k, awkward.clone()).await.unwrap();
    expected.extend(awkward);
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

/// The schema a database of `version` had: the migrations up to it, applied in a transaction
/// of the test's own and recorded as `migrate` records them.
async fn migrated_to(
    client: &mut tokio_postgres::Client,
    version: usize,
) -> tokio_postgres::Transaction<'_> {
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
    for (index, (name, sql)) in migrate::MIGRATIONS[..version].iter().enumerate() {
        tx.batch_execute(sql).await.unwrap();
        tx.execute(
            "INSERT INTO idemgate_schema_version (version, name) VALUES ($1, $2)",
            &[&(index as i32 + 1), name],
        )
        .await
        .unwrap();
    }
    tx
}

async fn due_steps(
    store: &PgStore,
    environment: &str,
    now: i64,
    after: Option<Cursor>,
    limit: usize,
) -> Vec<String> {
    store
        .due(Due {
            environment: environment.into(),
            now,
            after,
            limit,
        })
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key.step_id().to_string())
        .collect()
}

#[tokio::test]
async fn due_finds_expired_released_polled_and_awaiting_records() {
    let db = database!();
    let store = db.store().await;
    let now = T0 + 100_000;
    let job = || Dispatch::Job {
        job_id: "j-1".into(),
    };
    let cases = [
        ("live", pending(Some("w1"), now + 1, Dispatch::Sent)),
        ("expired", pending(Some("w1"), now - 1, Dispatch::Sent)),
        ("boundary", pending(Some("w1"), now, Dispatch::NotSent)),
        ("released", pending(None, now - 50, Dispatch::NotSent)),
        (
            "released_later",
            pending(None, now + 50_000, Dispatch::NotSent),
        ),
        ("job", pending(Some("w1"), now - 10, job())),
        ("job_later", pending(Some("w1"), now + 50_000, job())),
        (
            "approval",
            RecordState::AwaitingApproval { until: now - 20 },
        ),
        (
            "approval_later",
            RecordState::AwaitingApproval { until: now + 1 },
        ),
        ("applied", applied("T-1")),
        ("unknown", unknown()),
    ];
    for (step_id, state) in &cases {
        let mut r = claimed(&format!("acme:prod:wf:{step_id}"), "w1", T0);
        r.state = state.clone();
        store.claim(r, vec![]).await.unwrap();
    }
    let mut elsewhere = claimed("acme:staging:wf:expired", "w1", T0);
    elsewhere.state = pending(Some("w1"), now - 1_000, Dispatch::Sent);
    store.claim(elsewhere, vec![]).await.unwrap();

    // Deadline first, then key.
    assert_eq!(
        due_steps(&store, "prod", now, None, 10).await,
        vec!["released", "approval", "job", "expired", "boundary"]
    );
    assert_eq!(
        due_steps(&store, "prod", now, None, 2).await,
        vec!["released", "approval"]
    );
    let after = Some(Cursor {
        due_at: now - 20,
        key: key("acme:prod:wf:approval"),
    });
    assert_eq!(
        due_steps(&store, "prod", now, after, 2).await,
        vec!["job", "expired"]
    );
    assert!(due_steps(&store, "prod", now, None, 0).await.is_empty());
    assert_eq!(
        due_steps(&store, "staging", now, None, 10).await,
        vec!["expired"]
    );
}

/// A database of schema version 3 (before the due index): its awaiting-approval records get
/// their deadline from `expires_at`, at which the due scan finds them.
#[tokio::test]
async fn awaiting_approvals_from_before_the_due_index_get_their_deadline() {
    let db = database!();
    let mut client = admin(db.url()).await;
    let tx = migrated_to(&mut client, 3).await;
    let mut waiting = claimed("acme:prod:wf:waiting", "w1", T0);
    waiting.state = RecordState::AwaitingApproval { until: 0 };
    waiting.expires_at = T0 + 5_000;
    insert_raw(&tx, &waiting).await;
    // Version 3 kept no deadline for an approval.
    tx.execute(
        "UPDATE operations SET lease_expires_at = NULL WHERE key = $1",
        &[&waiting.key.as_str()],
    )
    .await
    .unwrap();
    let mut other = claimed("acme:staging:wf:waiting", "w1", T0);
    other.state = RecordState::AwaitingApproval { until: 0 };
    other.expires_at = T0;
    insert_raw(&tx, &other).await;
    tx.commit().await.unwrap();

    let store = db.store().await;
    let record = store.get(&waiting.key).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        RecordState::AwaitingApproval { until: T0 + 5_000 }
    );
    assert!(
        due_steps(&store, "prod", T0 + 4_999, None, 10)
            .await
            .is_empty()
    );
    assert_eq!(
        due_steps(&store, "prod", T0 + 5_000, None, 10).await,
        vec!["waiting"]
    );
    assert_eq!(
        due_steps(&store, "staging", T0 + 5_000, None, 10).await,
        vec!["waiting"]
    );
    // Never compacted any more, however long past its old expiry.
    assert_eq!(
        store.sweep("prod", T0 + 1_000_000_000, 100).await.unwrap(),
        SweepReport::default()
    );
}

#[tokio::test]
async fn claim_unless_duplicate_within_the_window() {
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
    let probe = |tenant: &'static str, tool: &'static str, n: u64, since: i64| {
        let store = store.clone();
        async move {
            let mut r = claimed(
                &format!("{tenant}:prod:wf:{tool}-{n}-{since}"),
                "w2",
                T0 + 5_000,
            );
            r.tool = tool.into();
            r.fingerprint = fingerprint(n);
            match store
                .claim_unless_duplicate(r, vec![], since)
                .await
                .unwrap()
            {
                Claimed::DuplicateIntent(other) => Some(other.as_str().to_string()),
                Claimed::Inserted(_) => None,
                Claimed::Existing(r) => panic!("a new key existed: {}", r.key),
            }
        }
    };
    assert_eq!(
        probe("acme", "create_ticket", 7, T0).await.as_deref(),
        Some("acme:prod:wf:old")
    );
    assert_eq!(
        probe("acme", "create_ticket", 7, T0 + 1).await.as_deref(),
        Some("acme:prod:wf:new")
    );
    // Inserted (and so watched from now on) when nothing matches.
    assert_eq!(probe("acme", "create_ticket", 7, T0 + 5_001).await, None);
    assert_eq!(probe("acme", "create_ticket", 8, T0).await, None);
    assert_eq!(probe("acme", "create_ticket", 9, T0).await, None);
    assert_eq!(
        probe("acme", "refund", 8, T0).await.as_deref(),
        Some("acme:prod:wf:other_tool")
    );
}

/// Claims of one request under different keys from several gateway processes (separate
/// pools): the advisory lock serialises them across processes, so exactly one inserts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_intents_from_many_gateways_insert_once() {
    const GATEWAYS: usize = 4;
    const PER_GATEWAY: usize = 8;
    let db = database!();
    let mut stores = Vec::new();
    for _ in 0..GATEWAYS {
        stores.push(db.store().await);
    }
    for round in 0..5 {
        let barrier = Arc::new(tokio::sync::Barrier::new(GATEWAYS * PER_GATEWAY));
        let mut tasks = Vec::new();
        for (g, store) in stores.iter().enumerate() {
            for i in 0..PER_GATEWAY {
                let store = store.clone();
                let barrier = Arc::clone(&barrier);
                let mut r = claimed(&format!("acme:prod:wf{round}:g{g}-{i}"), "w1", T0);
                r.fingerprint = fingerprint(100 + round);
                tasks.push(tokio::spawn(async move {
                    barrier.wait().await;
                    store.claim_unless_duplicate(r, vec![], T0).await.unwrap()
                }));
            }
        }
        let mut inserted = Vec::new();
        let mut named = HashSet::new();
        for t in tasks {
            match t.await.unwrap() {
                Claimed::Inserted(r) => inserted.push(r.key),
                Claimed::DuplicateIntent(other) => {
                    named.insert(other);
                }
                Claimed::Existing(r) => panic!("a new key existed: {}", r.key),
            }
        }
        assert_eq!(inserted.len(), 1, "round {round}: exactly one inserts");
        assert_eq!(named, HashSet::from([inserted[0].clone()]), "round {round}");
    }
}

/// A claim that waits for the request's lock longer than the statement timeout fails as
/// `Unavailable` (nothing was written), and its connection goes back to the pool outside any
/// transaction: the next operation on the one connection of the pool works.
#[tokio::test]
async fn a_claim_stuck_on_the_request_lock_changes_nothing() {
    let db = database!();
    let store = db
        .store_with(Options {
            pool_size: 1,
            batching: false,
            statement_timeout: std::time::Duration::from_millis(300),
            ..Options::default()
        })
        .await;
    let r = claimed("acme:prod:wf:s1", "w1", T0);
    let holder = admin(db.url()).await;
    let request =
        statements::duplicate_lock_request(r.key.tenant(), &r.tool, r.fingerprint.as_str());
    holder
        .execute(
            "SELECT pg_advisory_lock(hashtextextended($1, 0))",
            &[&request],
        )
        .await
        .unwrap();
    let refused = store.claim_unless_duplicate(r.clone(), vec![], 0).await;
    assert!(
        matches!(refused, Err(store::Error::Unavailable(_))),
        "{refused:?}"
    );
    assert_eq!(store.get(&r.key).await.unwrap(), None);
    let open: i64 = holder
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(open, 0, "no session is left inside a transaction");
    holder
        .execute(
            "SELECT pg_advisory_unlock(hashtextextended($1, 0))",
            &[&request],
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .claim_unless_duplicate(r.clone(), vec![], 0)
            .await
            .unwrap(),
        Claimed::Inserted(r)
    );
}

/// A database of schema version 2 (before `intent_window`): its records stay watched for
/// duplicate intents after the upgrade, while a record claimed afterwards without the window
/// is not.
#[tokio::test]
async fn records_from_before_the_intent_flag_stay_watched() {
    let db = database!();
    let mut client = admin(db.url()).await;
    let tx = migrated_to(&mut client, 2).await;
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
    let mut probe = claimed("acme:prod:wf:probe", "w1", T0 + 1);
    probe.fingerprint = fingerprint(7);
    let found = store
        .claim_unless_duplicate(probe, vec![], 0)
        .await
        .unwrap();
    assert_eq!(found, Claimed::DuplicateIntent(key("acme:prod:wf:old")));
}

/// Every connection the store opens pins `synchronous_commit = on` and READ COMMITTED, whatever
/// the database was configured with: a commit is acknowledged only once it is durable, and the
/// statements' correctness argument holds.
#[tokio::test]
async fn durability_and_isolation_are_pinned_on_every_connection() {
    let db = database!();
    let client = admin(db.url()).await;
    client
        .batch_execute(&format!(
            "ALTER DATABASE \"{name}\" SET synchronous_commit = off;
             ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'serializable'",
            name = db.name()
        ))
        .await
        .unwrap();
    // A plain session of the database gets the database's settings...
    let plain = admin(db.url()).await;
    let off: String = plain
        .query_one("SHOW synchronous_commit", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(off, "off");
    // ...the store's sessions, of both pools, do not.
    for batching in [false, true] {
        let store = db
            .store_with(Options {
                batching,
                ..Options::default()
            })
            .await;
        let pools = if batching { 2 } else { 1 };
        assert_eq!(
            testing::settings(&store, "synchronous_commit")
                .await
                .unwrap(),
            vec!["on"; pools]
        );
        assert_eq!(
            testing::settings(&store, "transaction_isolation")
                .await
                .unwrap(),
            vec!["read committed"; pools]
        );
    }
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
            RecordState::AwaitingApproval { until: now - 1 },
            now - 1,
            now - 1,
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
        for environment in ["prod", "staging"] {
            let mut r = claimed(&format!("acme:{environment}:wf:{step_id}"), "w1", T0);
            r.state = state.clone();
            r.expires_at = *expires_at;
            r.purge_at = *purge_at;
            store
                .claim(r, vec![event(EventKind::Claimed, T0, 1, "w1")])
                .await
                .unwrap();
        }
    }
    let get = |step_id: &str| {
        let store = store.clone();
        let k = key(&format!("acme:prod:wf:{step_id}"));
        async move { store.get(&k).await.unwrap() }
    };

    assert_eq!(
        store.sweep("prod", now, 0).await.unwrap(),
        SweepReport::default()
    );
    // A limit of one per kind: one of the two due records is compacted, the one due tombstone
    // is purged.
    assert_eq!(
        store.sweep("prod", now, 1).await.unwrap(),
        SweepReport {
            compacted: 1,
            purged: 1
        }
    );
    assert_eq!(
        store.sweep("prod", now, 1).await.unwrap(),
        SweepReport {
            compacted: 1,
            purged: 0
        }
    );
    assert_eq!(
        store.sweep("prod", now, 1).await.unwrap(),
        SweepReport::default()
    );

    let t = get("applied_due").await.unwrap();
    assert_eq!(t.state, tombstone(Some("T-1"), None));
    assert_eq!((t.request.clone(), t.updated_at), (None, now));
    assert_eq!(
        get("refused_due").await.unwrap().state,
        tombstone(None, Some(ErrorCode::DownstreamRejected))
    );
    let trace = store.events(&t.key).await.unwrap();
    assert_eq!(
        trace.iter().map(|e| e.kind).collect::<Vec<_>>(),
        vec![EventKind::Claimed, EventKind::Expired]
    );
    assert_eq!((trace[1].at, trace[1].attempt), (now, 1));

    assert_eq!(get("applied_live").await.unwrap().state, applied("T-2"));
    // Not settled, so never swept: awaiting approval, pending and unknown.
    assert_eq!(
        get("approval_due").await.unwrap().status(),
        RecordStatus::AwaitingApproval
    );
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
    let report = store.sweep("prod", now + 5, 100).await.unwrap();
    assert_eq!(
        report,
        SweepReport {
            compacted: 0,
            purged: 3
        }
    );
    let left: HashSet<_> = store
        .list(Filter {
            environment: Some("prod".into()),
            ..Filter::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key.step_id().to_string())
        .collect();
    assert_eq!(
        left,
        HashSet::from([
            "applied_live".to_string(),
            "approval_due".into(),
            "pending_due".into(),
            "unknown_due".into()
        ])
    );
    // The other environment was never touched.
    let staging = store
        .list(Filter {
            environment: Some("staging".into()),
            ..Filter::default()
        })
        .await
        .unwrap();
    assert_eq!(staging.len(), rows.len());
    for r in staging {
        let (_, state, _, _) = rows
            .iter()
            .find(|(step_id, ..)| *step_id == r.key.step_id())
            .expect("one of the rows");
        assert_eq!(&r.state, state, "{}", r.key);
        assert_eq!(store.events(&r.key).await.unwrap().len(), 1, "{}", r.key);
    }
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
                    let report = store.sweep("prod", now, 15).await.unwrap();
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

/// Migration 0007 carries each record's events into its row's trace, in the order they were
/// appended, whatever their detail holds; events of a key without a record are dropped with
/// their table.
#[tokio::test]
async fn the_events_table_moves_into_the_rows_in_order() {
    let db = database!();
    let mut client = admin(db.url()).await;
    let tx = migrated_to(&mut client, 6).await;
    let first = claimed("acme:prod:wf:first", "w1", T0);
    let second = claimed("acme:prod:wf:second", "w1", T0);
    insert_raw(&tx, &first).await;
    insert_raw(&tx, &second).await;
    // Interleaved, so that only the id orders each key's entries.
    let rows: [(&str, &str, i64, Option<&str>); 5] = [
        ("acme:prod:wf:first", "claimed", T0, None),
        ("acme:prod:wf:second", "claimed", T0 + 1, Some("plain")),
        (
            "acme:prod:wf:first",
            "sent",
            T0 + 2,
            Some("line\nbreak \"quoted\" \\ é"),
        ),
        ("acme:prod:wf:gone", "sent", T0 + 3, None),
        ("acme:prod:wf:first", "committed", T0 + 4, Some("T-1")),
    ];
    for (k, kind, at, detail) in rows {
        tx.execute(
            "INSERT INTO events (tenant, key, kind, at, attempt, worker, detail) \
             VALUES ('acme', $1, $2, $3, 1, 'w1', $4)",
            &[&k, &kind, &at, &detail],
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();

    let store = db.store().await;
    assert_eq!(
        store.events(&first.key).await.unwrap(),
        vec![
            event(EventKind::Claimed, T0, 1, "w1"),
            event(EventKind::Sent, T0 + 2, 1, "w1").with_detail("line\nbreak \"quoted\" \\ é"),
            event(EventKind::Committed, T0 + 4, 1, "w1").with_detail("T-1"),
        ]
    );
    assert_eq!(
        store.events(&second.key).await.unwrap(),
        vec![event(EventKind::Claimed, T0 + 1, 1, "w1").with_detail("plain")]
    );
    assert!(
        store
            .events(&key("acme:prod:wf:gone"))
            .await
            .unwrap()
            .is_empty()
    );
    // Appending after the migration continues the carried-over trace.
    store
        .append_events(&second.key, vec![event(EventKind::Sent, T0 + 5, 1, "w1")])
        .await
        .unwrap();
    assert_eq!(store.events(&second.key).await.unwrap().len(), 2);
    let tables: i64 = admin(db.url())
        .await
        .query_one(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'events'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 0, "the events table is gone");
}
