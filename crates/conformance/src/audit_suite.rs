//! The audit log's contract, as cases every store runs: an entry exists exactly when the
//! transition it records committed, and concurrent appenders — tasks of one store, or two
//! stores on one database — leave one unbroken, verifiable chain.
//!
//! The stores are given already sealing with [`signing_key`]'s key, so that every case also
//! checks the signatures offline with [`idemgate_audit::verify`], as an operator would.

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use idemgate_audit::{Expect, PublicKey, SigningKey};
use idemgate_core::audit::{Action, Draft, Entry, Sealer};
use idemgate_core::outcome::ErrorCode;
use idemgate_core::record::{Record, RecordState, Refusal};
use idemgate_core::store::{Cas, Claimed, Store, Transition};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::store_suite::{awaiting, record, step};

/// The suite's fixed signing key (a test seed, never a real one).
pub fn signing_key() -> Arc<SigningKey> {
    static KEY: OnceLock<Arc<SigningKey>> = OnceLock::new();
    KEY.get_or_init(|| {
        Arc::new(SigningKey::parse("test seed", &"5eed".repeat(16)).expect("a valid test seed"))
    })
    .clone()
}

/// A sealer signing with [`signing_key`].
pub fn sealer() -> Sealer {
    Sealer::signed(signing_key())
}

pub fn public_key() -> PublicKey {
    signing_key().public()
}

/// The denial of `from`, carrying its audit entry.
pub fn denial(from: &Record, actor: &str, now: i64) -> Transition {
    let mut t = step(
        from,
        RecordState::FailedPermanent(Refusal {
            code: ErrorCode::ApprovalDenied,
            message: "denied by an operator".into(),
        }),
        now,
    );
    t.audit = Some(Draft::of(
        from,
        &t,
        Action::Denied,
        actor,
        "not this customer",
    ));
    t
}

/// Every entry of the store's log, paged as an export pages it.
pub async fn all_entries<S: Store>(store: &S) -> Vec<Entry> {
    let mut entries: Vec<Entry> = Vec::new();
    loop {
        let after = entries.last().map_or(0, |e| e.seq);
        let page = store.audit_log(after, 7).await.expect("audit_log succeeds");
        if page.is_empty() {
            return entries;
        }
        entries.extend(page);
    }
}

/// The entries as an export writes them: one JSON object per line.
pub fn export(entries: &[Entry]) -> String {
    entries
        .iter()
        .map(|e| serde_json::to_string(e).expect("an entry serialises") + "\n")
        .collect()
}

async fn awaiting_record<S: Store>(store: &S, key: &str) -> Record {
    let r = record(key, awaiting(90_000));
    match store.claim(r.clone(), Vec::new()).await.expect("claim") {
        Claimed::Inserted(r) => r,
        other => panic!("{key} was not fresh: {other:?}"),
    }
}

/// A transition that loses its compare-and-set appends nothing; the one that applies appends
/// exactly its entry, with the fields it was given and the status it left.
pub async fn entry_only_with_its_transition<S: Store>(store: S) {
    let r = awaiting_record(&store, "acme:prod:wf:audit-1").await;
    let mut stale = denial(&r, "alice", 2_000);
    stale.expect.fence = r.fence + 1;
    assert!(matches!(
        store.transition(stale).await.expect("transition"),
        Cas::Lost(_)
    ));
    assert!(
        all_entries(&store).await.is_empty(),
        "a lost transition appended an entry"
    );

    let done = store.transition(denial(&r, "alice", 2_000)).await;
    assert!(matches!(done, Ok(Cas::Done(_))), "{done:?}");
    let entries = all_entries(&store).await;
    assert_eq!(entries.len(), 1);
    let e = &entries[0];
    assert_eq!(
        (e.seq, e.at, e.tenant.as_str(), e.environment.as_str()),
        (1, 2_000, "acme", "prod")
    );
    assert_eq!(e.operation_key, "acme:prod:wf:audit-1");
    assert_eq!((e.action.as_str(), e.actor.as_str()), ("denied", "alice"));
    assert_eq!(e.reason, "not this customer");
    assert_eq!(e.status, "failed_permanent");
    assert_eq!(e.fingerprint, r.fingerprint.as_str());

    // The same denial again no longer matches: still one entry.
    let again = store.transition(denial(&r, "alice", 3_000)).await;
    assert!(matches!(again, Ok(Cas::Lost(_))), "{again:?}");
    assert_eq!(all_entries(&store).await.len(), 1);
    let report =
        idemgate_audit::verify(export(&entries).as_bytes(), Expect::SignedBy(public_key()))
            .expect("the log verifies");
    assert_eq!(report.last_seq, 1);
}

/// `per_store` denials through each of `a` and `b` (two handles of one database, or the same
/// store twice), all at once: one chain, `1..=2 * per_store`, every key exactly once, and it
/// verifies.
pub async fn concurrent_appenders_keep_one_chain<S: Store + Clone>(a: S, b: S, per_store: usize) {
    let mut records = Vec::new();
    for i in 0..2 * per_store {
        records.push(awaiting_record(&a, &format!("acme:prod:wf:race-{i:03}")).await);
    }
    let barrier = Arc::new(Barrier::new(records.len()));
    let mut tasks = JoinSet::new();
    for (i, r) in records.into_iter().enumerate() {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        let barrier = Arc::clone(&barrier);
        tasks.spawn(async move {
            barrier.wait().await;
            let t = denial(&r, &format!("operator-{}", i % 2), 5_000 + i as i64);
            match store.transition(t).await {
                Ok(Cas::Done(_)) => {}
                other => panic!("{} not denied: {other:?}", r.key),
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a denial task panicked");
    }
    for store in [&a, &b] {
        let entries = all_entries(store).await;
        let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
        let expected: Vec<u64> = (1..=(2 * per_store) as u64).collect();
        assert_eq!(seqs, expected, "one unbroken sequence");
        let keys: BTreeSet<&str> = entries.iter().map(|e| e.operation_key.as_str()).collect();
        assert_eq!(keys.len(), 2 * per_store, "every key exactly once");
        let report =
            idemgate_audit::verify(export(&entries).as_bytes(), Expect::SignedBy(public_key()))
                .unwrap_or_else(|broken| panic!("the concurrent chain is broken: {broken}"));
        assert_eq!(report.entries, (2 * per_store) as u64);
    }
}

/// Claims a record awaiting approval for the rollback case: the store's test then makes its
/// audit insert fail (a trigger) and calls [`failed_append_changed_nothing`].
pub async fn record_for_rollback<S: Store>(store: &S) -> Record {
    awaiting_record(store, "acme:prod:wf:refused-audit").await
}

/// With the store's audit insert made to fail, the denial of `r` fails whole: the record, its
/// trace and the log are as before.
pub async fn failed_append_changed_nothing<S: Store>(store: &S, r: &Record) {
    let failed = store.transition(denial(r, "alice", 2_000)).await;
    assert!(failed.is_err(), "the transition must fail: {failed:?}");
    let now = store
        .get(&r.key)
        .await
        .unwrap()
        .expect("the record is kept");
    assert_eq!(
        now.status(),
        idemgate_core::record::RecordStatus::AwaitingApproval,
        "rolled back"
    );
    assert_eq!(now.fence, r.fence);
    assert!(store.events(&r.key).await.unwrap().is_empty());
    assert!(all_entries(store).await.is_empty());
}

/// With the insert allowed again, the same denial applies and its entry is the first.
pub async fn append_works_again<S: Store>(store: &S, r: &Record) {
    assert!(store.transition(denial(r, "alice", 3_000)).await.is_ok());
    let entries = all_entries(store).await;
    assert_eq!(entries.len(), 1);
    assert_eq!((entries[0].seq, entries[0].at), (1, 3_000));
}
