//! Batching: concurrent claims and transitions carried by multi-row statements answer every
//! caller exactly as single statements would (the `batch` module's rules).

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use idemgate_core::record::NOT_SETTLED;
use idemgate_core::record::{Dispatch, EventKind, RecordStatus};
use idemgate_core::store::{self, Cas, Claimed, Expiry, Store};
use idemgate_store_postgres::{Options, PgStore};

const T0: i64 = 1_700_000_000_000;

fn lease_owner(r: &idemgate_core::Record) -> Option<&str> {
    match &r.state {
        idemgate_core::record::RecordState::Pending { lease, .. } => lease.owner.as_deref(),
        _ => None,
    }
}

/// One batch statement at a time, so that concurrent callers queue behind it and share the
/// next one.
fn one_in_flight() -> Options {
    Options {
        batching: true,
        batch_in_flight: 1,
        batch_max_rows: 64,
        ..Options::default()
    }
}

/// The trace entries of every row, one per line of its `trace` column.
async fn trace_entries(client: &tokio_postgres::Client) -> i64 {
    count(
        client,
        "SELECT coalesce(sum(array_length(string_to_array(rtrim(trace, E'\\n'), E'\\n'), 1)), 0) \
         FROM operations",
    )
    .await
}

async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_insert_once_per_key() {
    let db = database!();
    let store = Arc::new(db.store_with(one_in_flight()).await);
    const KEYS: usize = 40;
    const CLAIMS_PER_KEY: usize = 5;
    let mut tasks = Vec::new();
    for round in 0..CLAIMS_PER_KEY {
        for k in 0..KEYS {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let owner = format!("w{round}");
                let rec = claimed(&format!("acme:prod:wf:s{k}"), &owner, T0);
                let events = vec![
                    event(EventKind::Proposed, T0, 1, &owner),
                    event(EventKind::Claimed, T0, 1, &owner),
                ];
                (k, owner, store.claim(rec, events).await.unwrap())
            }));
        }
    }
    let mut inserted: HashMap<usize, String> = HashMap::new();
    let mut existing = Vec::new();
    for t in tasks {
        let (k, owner, claimed) = t.await.unwrap();
        match claimed {
            Claimed::Inserted(r) => {
                assert_eq!(lease_owner(&r), Some(owner.as_str()));
                assert!(
                    inserted.insert(k, owner).is_none(),
                    "key {k} inserted twice"
                );
            }
            Claimed::Existing(r) => existing.push((k, r)),
            Claimed::DuplicateIntent(other) => panic!("a plain claim named {other}"),
        }
    }
    assert_eq!(inserted.len(), KEYS, "every key inserted once");
    assert_eq!(existing.len(), KEYS * (CLAIMS_PER_KEY - 1));
    for (k, r) in existing {
        assert_eq!(lease_owner(&r), Some(inserted[&k].as_str()), "key {k}");
    }
    let client = admin(db.url()).await;
    assert_eq!(
        count(&client, "SELECT count(*) FROM operations").await,
        KEYS as i64
    );
    // Only the winners' trace entries, two each, in the order given.
    assert_eq!(trace_entries(&client).await, 2 * KEYS as i64);
    for k in 0..KEYS {
        let trace = store
            .events(&key(&format!("acme:prod:wf:s{k}")))
            .await
            .unwrap();
        let kinds: Vec<_> = trace.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            vec![EventKind::Proposed, EventKind::Claimed],
            "key {k}"
        );
        assert!(trace.iter().all(|e| e.worker == inserted[&k]));
    }
    let (statements, rows) = store.batch_stats();
    assert!(statements > 0, "no claim was batched");
    assert!(rows > statements, "batches of one row only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_takeovers_apply_once_per_key() {
    let db = database!();
    let store = Arc::new(db.store_with(one_in_flight()).await);
    const KEYS: usize = 30;
    const RIVALS: usize = 4;
    let mut records = Vec::new();
    for k in 0..KEYS {
        let rec = claimed(&format!("acme:prod:wf:s{k}"), "w0", T0);
        assert!(matches!(
            store.claim(rec.clone(), vec![]).await.unwrap(),
            Claimed::Inserted(_)
        ));
        records.push(rec);
    }
    // Every lease has expired; RIVALS workers race to take each record over.
    let now = T0 + LEASE + 1;
    let mut tasks = Vec::new();
    for rival in 0..RIVALS {
        for rec in &records {
            let (store, rec) = (store.clone(), rec.clone());
            tasks.push(tokio::spawn(async move {
                let worker = format!("r{rival}");
                let answer = store
                    .transition(takeover(&rec, &worker, now))
                    .await
                    .unwrap();
                (rec.key.as_str().to_string(), worker, answer)
            }));
        }
    }
    let mut winners: HashMap<String, String> = HashMap::new();
    let mut losers = Vec::new();
    for t in tasks {
        let (k, worker, answer) = t.await.unwrap();
        match answer {
            Cas::Done(r) => {
                assert_eq!(r.fence, 2);
                assert_eq!(lease_owner(&r), Some(worker.as_str()));
                assert!(
                    winners.insert(k.clone(), worker).is_none(),
                    "{k} taken twice"
                );
            }
            Cas::Lost(r) => losers.push((k, r.expect("the record still exists"))),
        }
    }
    assert_eq!(winners.len(), KEYS);
    assert_eq!(losers.len(), KEYS * (RIVALS - 1));
    for (k, r) in losers {
        // A loser sees the winner's record, read after the winner's commit.
        assert_eq!(r.fence, 2, "{k}");
        assert_eq!(lease_owner(&r), Some(winners[&k].as_str()), "{k}");
    }
    for rec in &records {
        let trace = store.events(&rec.key).await.unwrap();
        assert_eq!(trace.len(), 1, "one recovered event per key");
        assert_eq!(trace[0].worker, winners[rec.key.as_str()]);
    }
    let (statements, rows) = store.batch_stats();
    assert!(statements > 0 && rows > statements, "nothing was batched");

    // The owners' steps now race with stale finishers holding the old fence: only the new
    // owners' steps apply.
    let mut tasks = Vec::new();
    for rec in &records {
        let current = store.get(&rec.key).await.unwrap().unwrap();
        let stale = rec.clone();
        let owner = store.clone();
        tasks.push(tokio::spawn(async move {
            let t = step(&current, applied("T-new"), now + 1, vec![]);
            owner.transition(t).await.unwrap()
        }));
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let t = step(&stale, applied("T-stale"), now + 1, vec![]);
            store.transition(t).await.unwrap()
        }));
    }
    let mut done = 0;
    for t in tasks {
        match t.await.unwrap() {
            Cas::Done(r) => {
                done += 1;
                assert_eq!(r.fence, 2);
                assert_eq!(r.status(), RecordStatus::Applied);
            }
            Cas::Lost(r) => assert_eq!(r.unwrap().fence, 2),
        }
    }
    assert_eq!(done, KEYS);
}

/// Settling transitions carried by one batch statement each write their own expiry, and keep
/// the stored one when they carry none, exactly as the single statement does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_transitions_carry_their_expiry() {
    let db = database!();
    let store = Arc::new(db.store_with(one_in_flight()).await);
    const KEYS: usize = 40;
    let mut records = Vec::new();
    for k in 0..KEYS {
        let mut rec = claimed(&format!("acme:prod:wf:e{k:02}"), "w1", T0);
        rec.expires_at = NOT_SETTLED;
        rec.purge_at = NOT_SETTLED;
        store.claim(rec.clone(), vec![]).await.unwrap();
        records.push(rec);
    }
    let before = store.batch_stats();
    let expiry = |k: usize| {
        (!k.is_multiple_of(3)).then(|| Expiry {
            expires_at: T0 + 1_000 + k as i64,
            purge_at: T0 + 2_000 + k as i64,
        })
    };
    let mut tasks = Vec::new();
    for (k, rec) in records.iter().enumerate() {
        let (store, rec) = (store.clone(), rec.clone());
        tasks.push(tokio::spawn(async move {
            let mut t = step(&rec, applied(&format!("T-{k}")), T0 + 10, vec![]);
            t.expiry = expiry(k);
            (k, store.transition(t).await.unwrap())
        }));
    }
    for t in tasks {
        let (k, answer) = t.await.unwrap();
        let Cas::Done(r) = answer else {
            panic!("e{k:02} lost: {answer:?}")
        };
        let expected = expiry(k).map_or((NOT_SETTLED, NOT_SETTLED), |e| (e.expires_at, e.purge_at));
        assert_eq!((r.expires_at, r.purge_at), expected, "e{k:02}");
        assert_eq!(store.get(&r.key).await.unwrap(), Some(r), "e{k:02}");
    }
    let after = store.batch_stats();
    assert!(
        after.1 - before.1 > after.0 - before.0,
        "nothing was batched: {before:?} then {after:?}"
    );
}

/// Waits until `n` of the store's sessions are blocked on a lock.
async fn wait_for_lock_waiters(url: &str, n: i64) {
    let probe = admin(url).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let waiting = count(
            &probe,
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'idemgate'
               AND wait_event_type = 'Lock'",
        )
        .await;
        if waiting >= n {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "never blocked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The one batch slot, occupied: a transition of a record to applied, waiting on a row lock.
struct HeldSlot<'c> {
    lock: tokio_postgres::Transaction<'c>,
    waiting: tokio::task::JoinHandle<Result<Cas, store::Error>>,
}

/// Occupies the one batch slot with a transition of `held` that waits on a row lock taken by
/// `blocker`, so that the transitions after it queue and leave together, as one batch, once
/// the slot is released.
async fn hold_the_slot<'c>(
    store: &Arc<PgStore>,
    blocker: &'c mut tokio_postgres::Client,
    url: &str,
    held: &idemgate_core::Record,
) -> HeldSlot<'c> {
    let lock = lock_row(blocker, held.key.as_str()).await;
    let t = step(held, applied("T-held"), T0 + 1, vec![]);
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move { store.transition(t).await })
    };
    wait_for_lock_waiters(url, 1).await;
    HeldSlot { lock, waiting }
}

impl HeldSlot<'_> {
    /// Gives the queued transitions time to queue, releases the lock, checks that the held
    /// transition applied, and returns the batch counters from just before the release.
    async fn release(self, store: &PgStore) -> (u64, u64) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = store.batch_stats();
        self.lock.rollback().await.unwrap();
        assert!(matches!(self.waiting.await.unwrap().unwrap(), Cas::Done(_)));
        before
    }
}

/// One row the server refuses (a NUL byte, which PostgreSQL's text cannot hold) fails the
/// whole statement; the other callers of that batch still get their own answers, and only the
/// bad row's caller gets an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_row_fails_alone() {
    let db = database!();
    let store = Arc::new(db.store_with(one_in_flight()).await);

    // Occupy the one batch slot: a claim waiting on another transaction's uncommitted insert.
    let mut blocker = admin(db.url()).await;
    let tx = blocker.transaction().await.unwrap();
    tx.execute(
        "INSERT INTO operations (tenant, key, tool, tool_version, fingerprint, canonicalization,
             status, fence, actor, created_at, updated_at, expires_at, purge_at)
         VALUES ('acme', 'acme:prod:wf:held', 't', '1', 'f', 1, 'unknown', 1, 'a', 0, 0, 0, 0)",
        &[],
    )
    .await
    .unwrap();
    let held = {
        let store = store.clone();
        tokio::spawn(async move {
            let rec = claimed("acme:prod:wf:held", "w1", T0);
            store.claim(rec, vec![]).await
        })
    };
    wait_for_lock_waiters(db.url(), 1).await;

    // These queue behind it and leave together in the next batch.
    let mut tasks = Vec::new();
    for k in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut rec = claimed(&format!("acme:prod:wf:s{k}"), "w1", T0);
            // PostgreSQL's text holds no NUL byte: this row's insert fails. (A trace entry's
            // detail may hold one: the stored form escapes it.)
            if k == 3 {
                rec.actor = "nul\0byte".into();
            }
            let ev = event(EventKind::Claimed, T0, 1, "w1");
            (k, store.claim(rec, vec![ev]).await)
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = store.batch_stats();
    tx.rollback().await.unwrap();
    assert!(matches!(held.await.unwrap().unwrap(), Claimed::Inserted(_)));
    for t in tasks {
        let (k, answer) = t.await.unwrap();
        if k == 3 {
            assert!(
                matches!(answer, Err(store::Error::Unavailable(_))),
                "{answer:?}"
            );
        } else {
            assert!(
                matches!(answer, Ok(Claimed::Inserted(_))),
                "{k}: {answer:?}"
            );
        }
    }
    let after = store.batch_stats();
    assert_eq!(after.0 - before.0, 1, "one batch statement");
    assert_eq!(after.1 - before.1, 8, "carrying all eight claims");
    let client = admin(db.url()).await;
    assert_eq!(count(&client, "SELECT count(*) FROM operations").await, 8);
    assert_eq!(trace_entries(&client).await, 7);
    assert!(store.get(&key("acme:prod:wf:s3")).await.unwrap().is_none());

    // The same for transitions: one bad row in a batch of steps.
    let held_rec = store.get(&key("acme:prod:wf:held")).await.unwrap().unwrap();
    let slot = hold_the_slot(&store, &mut blocker, db.url(), &held_rec).await;
    let mut tasks = Vec::new();
    for k in (0..8).filter(|k| *k != 3) {
        let store = store.clone();
        let current = store
            .get(&key(&format!("acme:prod:wf:s{k}")))
            .await
            .unwrap()
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let ev = event(EventKind::Sent, T0 + 1, 1, "w1");
            let owner = if k == 5 { "nul\0owner" } else { "w1" };
            let t = step(
                &current,
                pending(Some(owner), T0 + LEASE, Dispatch::Sent),
                T0 + 1,
                vec![ev],
            );
            (k, store.transition(t).await)
        }));
    }
    let before = slot.release(&store).await;
    for t in tasks {
        let (k, answer) = t.await.unwrap();
        if k == 5 {
            assert!(
                matches!(answer, Err(store::Error::Unavailable(_))),
                "{answer:?}"
            );
        } else {
            assert!(matches!(answer, Ok(Cas::Done(_))), "{k}: {answer:?}");
        }
    }
    let after = store.batch_stats();
    assert_eq!(after.0 - before.0, 1, "one batch statement");
    assert_eq!(after.1 - before.1, 7);
    let s5 = store.get(&key("acme:prod:wf:s5")).await.unwrap().unwrap();
    assert!(matches!(
        s5.state,
        idemgate_core::record::RecordState::Pending {
            dispatch: Dispatch::NotSent,
            ..
        }
    ));
}

/// A transition batch goes as a statement of exactly its rows up to eight, and above that as
/// one rounded up to a power of two whose positions past the rows match nothing: at every size
/// each row is updated once, by its own expectation, and no other record is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transition_batches_of_every_size_update_their_rows_only() {
    let db = database!();
    let store = Arc::new(db.store_with(one_in_flight()).await);
    let client = admin(db.url()).await;
    let mut blocker = admin(db.url()).await;
    // A record no batch names, which must keep its state throughout.
    let bystander = claimed("acme:prod:wf:bystander", "w1", T0);
    store.claim(bystander.clone(), vec![]).await.unwrap();
    let bystander = store.get(&bystander.key).await.unwrap().unwrap();
    for size in [2usize, 3, 5, 8, 9, 13] {
        let held_rec = claimed(&format!("acme:prod:wf:held{size}"), "w1", T0);
        store.claim(held_rec.clone(), vec![]).await.unwrap();
        let mut records = Vec::new();
        for k in 0..size {
            let rec = claimed(&format!("acme:prod:wf:n{size}-{k:02}"), "w1", T0);
            store.claim(rec.clone(), vec![]).await.unwrap();
            records.push(rec);
        }
        let slot = hold_the_slot(&store, &mut blocker, db.url(), &held_rec).await;
        let mut tasks = Vec::new();
        for (k, rec) in records.iter().enumerate() {
            let (store, rec) = (store.clone(), rec.clone());
            tasks.push(tokio::spawn(async move {
                let ev = event(EventKind::Committed, T0 + 2, 1, "w1");
                let t = step(&rec, applied(&format!("T-{size}-{k}")), T0 + 2, vec![ev]);
                (k, store.transition(t).await)
            }));
        }
        let before = slot.release(&store).await;
        for t in tasks {
            let (k, answer) = t.await.unwrap();
            let Ok(Cas::Done(r)) = answer else {
                panic!("batch of {size}, row {k}: {answer:?}")
            };
            assert_eq!(
                r.status(),
                RecordStatus::Applied,
                "batch of {size}, row {k}"
            );
            assert_eq!(store.get(&r.key).await.unwrap(), Some(r), "batch of {size}");
        }
        let after = store.batch_stats();
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (1, size as u64),
            "one statement carrying the batch of {size}"
        );
        let settled = count(
            &client,
            &format!("SELECT count(*) FROM operations WHERE key LIKE 'acme:prod:wf:n{size}-%' AND status = 'applied' AND effect_reference LIKE 'T-{size}-%'"),
        )
        .await;
        assert_eq!(settled, size as i64, "batch of {size}");
        assert_eq!(
            store.get(&bystander.key).await.unwrap(),
            Some(bystander.clone()),
            "a record outside the batch of {size} changed"
        );
    }
}

/// A batched transition names the life of its key like the single statement does: a row
/// planned from a record created at another instant (a life of the key since purged, whose
/// fence and status the new life repeats) loses, and the rest of its batch applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batched_row_of_a_past_life_loses() {
    let db = database!();
    let store = Arc::new(db.store_with(one_in_flight()).await);
    let mut blocker = admin(db.url()).await;
    let held = claimed("acme:prod:wf:lives-held", "w1", T0);
    store.claim(held.clone(), vec![]).await.unwrap();
    let current = claimed("acme:prod:wf:lives-new", "w2", T0);
    store.claim(current.clone(), vec![]).await.unwrap();
    let other = claimed("acme:prod:wf:lives-other", "w1", T0);
    store.claim(other.clone(), vec![]).await.unwrap();
    // What a worker of the key's first life, created earlier, would write.
    let mut past = current.clone();
    past.created_at = T0 - 60_000;

    let slot = hold_the_slot(&store, &mut blocker, db.url(), &held).await;
    let stale = {
        let store = store.clone();
        let t = step(&past, applied("T-stale"), T0 + 2, vec![]);
        tokio::spawn(async move { store.transition(t).await })
    };
    let own = {
        let store = store.clone();
        let t = step(&other, applied("T-own"), T0 + 2, vec![]);
        tokio::spawn(async move { store.transition(t).await })
    };
    let before = slot.release(&store).await;
    let stale = stale.await.unwrap().unwrap();
    let own = own.await.unwrap().unwrap();
    let after = store.batch_stats();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (1, 2),
        "both rows rode one statement"
    );
    assert_eq!(stale, Cas::Lost(Some(current.clone())));
    assert_eq!(store.get(&current.key).await.unwrap(), Some(current));
    let Cas::Done(written) = own else {
        panic!("the current life's row lost: {own:?}")
    };
    assert_eq!(written.status(), RecordStatus::Applied);
    assert_eq!(store.get(&other.key).await.unwrap(), Some(written));
}

/// Without batching, nothing is batched (the option turns it off).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batching_can_be_turned_off() {
    let db = database!();
    let store = Arc::new(
        PgStore::connect(
            db.url(),
            Options {
                batching: false,
                ..Options::default()
            },
        )
        .await
        .unwrap(),
    );
    let tasks: Vec<_> = (0..16)
        .map(|k| {
            let store = store.clone();
            tokio::spawn(async move {
                let rec = claimed(&format!("acme:prod:wf:s{k}"), "w1", T0);
                store.claim(rec, vec![]).await.unwrap()
            })
        })
        .collect();
    for t in tasks {
        assert!(matches!(t.await.unwrap(), Claimed::Inserted(_)));
    }
    assert_eq!(store.batch_stats(), (0, 0));
}

/// The connection of a batch in flight is lost: no answer says whether the statement
/// committed, so every caller of that batch gets `Ambiguous`, as a single statement would.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_cut_off_midway_is_ambiguous_for_every_caller() {
    let db = database!();
    let store = Arc::new(db.store_with(one_in_flight()).await);
    let mut records = Vec::new();
    for k in 0..3 {
        let rec = claimed(&format!("acme:prod:wf:s{k}"), "w1", T0);
        store.claim(rec.clone(), vec![]).await.unwrap();
        records.push(rec);
    }

    // Occupy the one batch slot with a claim waiting on an uncommitted insert, so that the
    // three transitions queue and leave together.
    let mut inserter = admin(db.url()).await;
    let insert = inserter.transaction().await.unwrap();
    insert
        .execute(
            "INSERT INTO operations (tenant, key, tool, tool_version, fingerprint,
                 canonicalization, status, fence, actor, created_at, updated_at, expires_at,
                 purge_at)
             VALUES ('acme', 'acme:prod:wf:held', 't', '1', 'f', 1, 'unknown', 1, 'a', 0, 0, 0,
                 0)",
            &[],
        )
        .await
        .unwrap();
    let held = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .claim(claimed("acme:prod:wf:held", "w1", T0), vec![])
                .await
        })
    };
    wait_for_lock_waiters(db.url(), 1).await;
    // The batch will wait on these row locks.
    let mut locker = admin(db.url()).await;
    let locks = locker.transaction().await.unwrap();
    locks
        .execute(
            "SELECT 1 FROM operations WHERE key LIKE 'acme:prod:wf:s%' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    let tasks: Vec<_> = records
        .iter()
        .map(|rec| {
            let (store, rec) = (store.clone(), rec.clone());
            tokio::spawn(async move {
                let t = step(&rec, applied("T-1"), T0 + 1, vec![]);
                store.transition(t).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    insert.rollback().await.unwrap();
    assert!(matches!(held.await.unwrap().unwrap(), Claimed::Inserted(_)));
    wait_for_lock_waiters(db.url(), 1).await;
    let killer = admin(db.url()).await;
    let killed = count(
        &killer,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'idemgate'
           AND wait_event_type = 'Lock'",
    )
    .await;
    assert_eq!(killed, 1, "one batch statement waiting");
    for t in tasks {
        let answer = t.await.unwrap();
        assert!(
            matches!(answer, Err(store::Error::Ambiguous(_))),
            "{answer:?}"
        );
    }
    locks.rollback().await.unwrap();
    assert_eq!(
        store.batch_stats().1,
        3,
        "the three transitions were one batch"
    );
    // Nothing committed; the store works on afterwards.
    for rec in &records {
        assert_eq!(store.get(&rec.key).await.unwrap().as_ref(), Some(rec));
        let t = step(rec, applied("T-1"), T0 + 2, vec![]);
        assert!(matches!(store.transition(t).await.unwrap(), Cas::Done(_)));
    }
}
