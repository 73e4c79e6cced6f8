//! The `Store` trait's contract, as cases every store runs.
//!
//! [`run`] takes a factory of fresh, empty stores and runs every case against its own store;
//! each case is also a `pub async fn` of its own, so a store's test file can run them one by one
//! and see which fails. Cases never read a clock: every instant is given, as the executor gives
//! them. Each case checks what a store actually kept (records, traces) through the trait's
//! reads, not only what the write answered.
//!
//! Concurrent cases spawn tasks, so they need a Tokio runtime; a multi-threaded one makes the
//! races real.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use idemgate_core::canonical;
use idemgate_core::contract::Contract;
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::ErrorCode;
use idemgate_core::record::{
    Digest, Dispatch, Event, EventKind, Evidence, Lease, Millis, Receipt, Record, RecordState,
    RecordStatus, Refusal,
};
use idemgate_core::store::{Cas, Claimed, Expect, Filter, RequestUpdate, Store, Transition};
use serde_json::{Value, json};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

/// The tool most records belong to.
pub const TOOL: &str = "tickets.create";
/// A second tool, for listings and fingerprint look-ups that must tell tools apart.
pub const OTHER_TOOL: &str = "refunds.issue";
pub const TOOL_VERSION: &str = "2026-08-18";
/// The worker named in the `expired` events a sweep appends.
pub const SWEEPER: &str = "sweeper";

/// Runs every case, each against a fresh store from `fresh`.
pub async fn run<S, F, Fut>(fresh: F)
where
    S: Store,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    claim_inserts_then_returns_existing(fresh().await).await;
    concurrent_claims_insert_once(fresh().await).await;
    transition_applies_and_appends_events(fresh().await).await;
    stale_fence_loses_and_changes_nothing(fresh().await).await;
    takeover_waits_for_lease_expiry(fresh().await).await;
    concurrent_takeovers_one_wins(fresh().await).await;
    request_update_keep_clear_set(fresh().await).await;
    approver_and_fingerprint_replacement(fresh().await).await;
    append_events_keeps_order(fresh().await).await;
    list_filters_and_pages(fresh().await).await;
    list_default_page(fresh().await).await;
    every_state_round_trips(fresh().await).await;
}

// ---------------------------------------------------------------------------------------------
// Building records.

/// A contract whose fingerprint covers every argument, so that fingerprints here come from
/// canonical bytes exactly as the executor makes them.
fn contract() -> &'static Contract {
    static CONTRACT: OnceLock<Contract> = OnceLock::new();
    CONTRACT.get_or_init(|| {
        let yaml = format!(
            "name: {TOOL}\nversion: \"{TOOL_VERSION}\"\neffect_class: natural_idempotent\n\
             input_schema: {{type: object}}\nrequest_fingerprint: {{fields: [\"*\"]}}\n"
        );
        Contract::load(&yaml, "store_suite.yaml").expect("the suite's contract loads")
    })
}

/// The fingerprint of `arguments` under the suite's tool.
pub fn fingerprint(arguments: &Value) -> Fingerprint {
    let material = contract()
        .material(arguments)
        .expect("the suite's arguments are an object");
    let canonical = canonical::canonicalize(TOOL, TOOL_VERSION, &material)
        .expect("the suite's arguments canonicalise");
    Fingerprint::of(&canonical)
}

pub fn key(text: &str) -> OperationKey {
    OperationKey::parse(text).expect("the suite's keys are valid")
}

/// A pending state owned by `owner` until `expires_at`, nothing sent.
pub fn pending(owner: &str, expires_at: Millis) -> RecordState {
    RecordState::Pending {
        lease: Lease {
            owner: Some(owner.into()),
            expires_at,
        },
        dispatch: Dispatch::NotSent,
    }
}

pub fn applied(reference: &str) -> RecordState {
    RecordState::Applied(Receipt {
        reference: reference.into(),
        result: json!({"id": reference, "ok": true}),
    })
}

/// A record of the suite's tool under `key`, at fence 1, created and updated at 1 000, due for
/// compaction at 100 000 and for purging at 200 000.
pub fn record(key_text: &str, state: RecordState) -> Record {
    let request = json!({"title": key_text, "priority": 2});
    Record {
        key: key(key_text),
        tool: TOOL.into(),
        tool_version: TOOL_VERSION.into(),
        fingerprint: fingerprint(&request),
        canonicalization: canonical::CANONICALIZATION_VERSION,
        state,
        fence: 1,
        actor: "agent-1".into(),
        request: Some(request),
        approved_by: None,
        created_at: 1_000,
        updated_at: 1_000,
        expires_at: 100_000,
        purge_at: 200_000,
        intent_window: true,
    }
}

/// An owner's own step from `from` to `next` at `now`: same fence, request kept.
pub fn step(from: &Record, next: RecordState, now: Millis) -> Transition {
    Transition {
        key: from.key.clone(),
        expect: Expect {
            fence: from.fence,
            status: from.status(),
            lease_expired_by: None,
        },
        next,
        fence: from.fence,
        request: RequestUpdate::Keep,
        approved_by: None,
        fingerprint: None,
        expiry: None,
        events: Vec::new(),
        now,
    }
}

/// `worker` taking over the expired lease of `from` at `now`: fence + 1, a new lease.
pub fn takeover(from: &Record, worker: &str, now: Millis) -> Transition {
    let mut t = step(from, pending(worker, now + 30_000), now);
    t.expect.lease_expired_by = Some(now);
    t.fence = from.fence + 1;
    t.events = vec![Event::new(EventKind::Recovered, now, t.fence, worker)];
    t
}

fn event(kind: EventKind, at: Millis, worker: &str) -> Event {
    Event::new(kind, at, 1, worker)
}

async fn stored<S: Store>(store: &S, key: &OperationKey) -> Record {
    store
        .get(key)
        .await
        .expect("get succeeds")
        .unwrap_or_else(|| panic!("{key} is stored"))
}

async fn trace<S: Store>(store: &S, key: &OperationKey) -> Vec<Event> {
    store.events(key).await.expect("events succeeds")
}

async fn claim_new<S: Store>(store: &S, record: &Record, events: Vec<Event>) {
    match store
        .claim(record.clone(), events)
        .await
        .expect("claim succeeds")
    {
        Claimed::Inserted(inserted) => assert_eq!(&inserted, record),
        Claimed::Existing(existing) => panic!("{} already existed: {existing:?}", record.key),
        Claimed::DuplicateIntent(other) => panic!("a plain claim answered a duplicate of {other}"),
    }
}

fn done(cas: Cas) -> Record {
    match cas {
        Cas::Done(record) => record,
        Cas::Lost(current) => panic!("the transition lost; the record is {current:?}"),
    }
}

fn keys(records: &[Record]) -> Vec<String> {
    records.iter().map(|r| r.key.as_str().to_string()).collect()
}

// ---------------------------------------------------------------------------------------------
// Claims.

/// The first claim inserts and appends its events; a second claim of the key returns the
/// stored record unchanged and appends nothing. Another tenant's identical key is its own.
pub async fn claim_inserts_then_returns_existing<S: Store>(store: S) {
    let first = record("acme:prod:wf-claim:s1", pending("w1", 31_000));
    let events = vec![
        event(EventKind::Proposed, 1_000, "w1"),
        event(EventKind::Claimed, 1_000, "w1").with_detail("lease 30s"),
    ];
    assert_eq!(store.get(&first.key).await.expect("get succeeds"), None);
    claim_new(&store, &first, events.clone()).await;
    assert_eq!(stored(&store, &first.key).await, first);
    assert_eq!(trace(&store, &first.key).await, events);

    let mut second = record("acme:prod:wf-claim:s1", pending("w2", 99_000));
    second.fingerprint = fingerprint(&json!({"title": "something else"}));
    second.actor = "agent-2".into();
    second.created_at = 5_000;
    let answer = store
        .claim(second, vec![event(EventKind::Claimed, 5_000, "w2")])
        .await
        .expect("claim succeeds");
    assert_eq!(answer, Claimed::Existing(first.clone()));
    assert_eq!(stored(&store, &first.key).await, first);
    assert_eq!(
        trace(&store, &first.key).await,
        events,
        "a lost claim appends nothing"
    );

    let other_tenant = record("other:prod:wf-claim:s1", pending("w3", 31_000));
    let other_events = vec![event(EventKind::Claimed, 1_000, "w3")];
    claim_new(&store, &other_tenant, other_events.clone()).await;
    assert_eq!(stored(&store, &other_tenant.key).await, other_tenant);
    assert_eq!(trace(&store, &other_tenant.key).await, other_events);
    assert_eq!(stored(&store, &first.key).await, first);
    assert_eq!(trace(&store, &first.key).await, events);
}

/// 32 tasks claim one key at once: exactly one inserts, every other sees its record.
pub async fn concurrent_claims_insert_once<S: Store>(store: S) {
    const CLAIMANTS: usize = 32;
    let store = Arc::new(store);
    let start = Arc::new(Barrier::new(CLAIMANTS));
    let mut tasks = JoinSet::new();
    for i in 0..CLAIMANTS {
        let store = Arc::clone(&store);
        let start = Arc::clone(&start);
        tasks.spawn(async move {
            let worker = format!("w{i}");
            let mut r = record("acme:prod:wf-race:s1", pending(&worker, 31_000));
            r.actor = format!("agent-{i}");
            start.wait().await;
            let events = vec![event(EventKind::Claimed, 1_000, &worker)];
            store.claim(r, events).await.expect("claim succeeds")
        });
    }
    let mut inserted = Vec::new();
    let mut existing = Vec::new();
    while let Some(answer) = tasks.join_next().await {
        match answer.expect("a claimant panicked") {
            Claimed::Inserted(r) => inserted.push(r),
            Claimed::Existing(r) => existing.push(r),
            Claimed::DuplicateIntent(other) => {
                panic!("a plain claim answered a duplicate of {other}")
            }
        }
    }
    assert_eq!(inserted.len(), 1, "exactly one claim inserts");
    assert_eq!(existing.len(), CLAIMANTS - 1);
    let winner = &inserted[0];
    for r in &existing {
        assert_eq!(r, winner, "every loser sees the winner's record");
    }
    assert_eq!(&stored(&*store, &winner.key).await, winner);
    let events = trace(&*store, &winner.key).await;
    assert_eq!(
        events.len(),
        1,
        "only the winner's events are appended: {events:?}"
    );
    let owner = winner.lease().and_then(|l| l.owner.clone());
    assert_eq!(Some(events[0].worker.clone()), owner);
}

// ---------------------------------------------------------------------------------------------
// Compare-and-set.

/// With the fence and status it expects, a transition is written whole: state, fence,
/// `updated_at`, and its events; what it does not name stays as it was.
pub async fn transition_applies_and_appends_events<S: Store>(store: S) {
    let claimed = record("acme:prod:wf-cas:s1", pending("w1", 31_000));
    let claim_events = vec![event(EventKind::Claimed, 1_000, "w1")];
    claim_new(&store, &claimed, claim_events.clone()).await;

    let sent = RecordState::Pending {
        lease: Lease {
            owner: Some("w1".into()),
            expires_at: 31_000,
        },
        dispatch: Dispatch::Sent,
    };
    let mut marker = step(&claimed, sent.clone(), 1_500);
    marker.events = vec![event(EventKind::Sent, 1_500, "w1")];
    let after_marker = done(store.transition(marker).await.expect("transition succeeds"));
    let mut expected = claimed.clone();
    expected.state = sent;
    expected.updated_at = 1_500;
    assert_eq!(after_marker, expected);

    let mut finish = step(&after_marker, applied("ticket-1"), 2_000);
    finish.events = vec![
        event(EventKind::Committed, 2_000, "w1"),
        event(EventKind::Acknowledged, 2_000, "w1").with_detail("ticket-1"),
    ];
    let after = done(
        store
            .transition(finish.clone())
            .await
            .expect("transition succeeds"),
    );
    expected.state = applied("ticket-1");
    expected.updated_at = 2_000;
    assert_eq!(after, expected, "the answer is the record as now stored");
    assert_eq!(stored(&store, &claimed.key).await, expected);
    let mut all = claim_events;
    all.push(event(EventKind::Sent, 1_500, "w1"));
    all.extend(finish.events);
    assert_eq!(trace(&store, &claimed.key).await, all);
}

/// A stale fence, a wrong status or a missing record loses: the answer carries the record as
/// it is, and neither the record nor its trace changes.
pub async fn stale_fence_loses_and_changes_nothing<S: Store>(store: S) {
    let mut current = record("acme:prod:wf-stale:s1", pending("w2", 61_000));
    current.fence = 2;
    let events = vec![event(EventKind::Recovered, 1_000, "w2")];
    claim_new(&store, &current, events.clone()).await;

    let mut late = step(&current, applied("ticket-late"), 9_000);
    late.expect.fence = 1;
    late.fence = 1;
    late.request = RequestUpdate::Clear;
    late.approved_by = Some("nobody".into());
    late.fingerprint = Some(fingerprint(&json!({"late": true})));
    late.events = vec![event(EventKind::Committed, 9_000, "w1")];
    let answer = store
        .transition(late.clone())
        .await
        .expect("transition succeeds");
    assert_eq!(answer, Cas::Lost(Some(current.clone())));

    let mut wrong_status = late.clone();
    wrong_status.expect.fence = 2;
    wrong_status.expect.status = RecordStatus::Unknown;
    let answer = store
        .transition(wrong_status)
        .await
        .expect("transition succeeds");
    assert_eq!(answer, Cas::Lost(Some(current.clone())));

    assert_eq!(stored(&store, &current.key).await, current);
    assert_eq!(trace(&store, &current.key).await, events);

    let missing = key("acme:prod:wf-stale:missing");
    let mut ghost = late;
    ghost.key = missing.clone();
    let answer = store.transition(ghost).await.expect("transition succeeds");
    assert_eq!(answer, Cas::Lost(None));
    assert_eq!(store.get(&missing).await.expect("get succeeds"), None);
    assert_eq!(trace(&store, &missing).await, Vec::new());
}

/// A takeover (`lease_expired_by`) fails while the lease is live, including after a renewal
/// that raced it, succeeds once the lease has expired, and then fences out the old owner.
pub async fn takeover_waits_for_lease_expiry<S: Store>(store: S) {
    let claimed = record("acme:prod:wf-takeover:s1", pending("w1", 5_000));
    claim_new(&store, &claimed, Vec::new()).await;

    let early = store
        .transition(takeover(&claimed, "w2", 4_999))
        .await
        .expect("transition succeeds");
    assert_eq!(
        early,
        Cas::Lost(Some(claimed.clone())),
        "the lease is still live"
    );

    // The owner renews; a takeover judged on the old expiry must now lose.
    let renewed = done(
        store
            .transition(step(&claimed, pending("w1", 10_000), 4_000))
            .await
            .expect("transition succeeds"),
    );
    let raced = store
        .transition(takeover(&claimed, "w2", 5_000))
        .await
        .expect("transition succeeds");
    assert_eq!(raced, Cas::Lost(Some(renewed.clone())), "the renewal wins");

    let taken = done(
        store
            .transition(takeover(&renewed, "w2", 10_000))
            .await
            .expect("transition succeeds"),
    );
    assert_eq!(taken.fence, 2);
    assert_eq!(taken.state, pending("w2", 40_000));
    assert_eq!(taken.updated_at, 10_000);
    assert_eq!(stored(&store, &claimed.key).await, taken);
    assert_eq!(
        trace(&store, &claimed.key).await,
        vec![Event::new(EventKind::Recovered, 10_000, 2, "w2")]
    );

    // The old owner comes back late with fence 1: it can no longer write.
    let late = store
        .transition(step(&renewed, applied("ticket-old"), 11_000))
        .await
        .expect("transition succeeds");
    assert_eq!(late, Cas::Lost(Some(taken.clone())));
    assert_eq!(stored(&store, &claimed.key).await, taken);
}

/// Eight workers take over one expired lease at once: exactly one wins.
pub async fn concurrent_takeovers_one_wins<S: Store>(store: S) {
    const WORKERS: usize = 8;
    let abandoned = record("acme:prod:wf-takeovers:s1", pending("w0", 5_000));
    claim_new(&store, &abandoned, Vec::new()).await;
    let store = Arc::new(store);
    let start = Arc::new(Barrier::new(WORKERS));
    let mut tasks = JoinSet::new();
    for i in 1..=WORKERS {
        let store = Arc::clone(&store);
        let start = Arc::clone(&start);
        let takeover = takeover(&abandoned, &format!("w{i}"), 6_000);
        tasks.spawn(async move {
            start.wait().await;
            store
                .transition(takeover)
                .await
                .expect("transition succeeds")
        });
    }
    let mut winners = Vec::new();
    let mut losers = 0;
    while let Some(answer) = tasks.join_next().await {
        match answer.expect("a worker panicked") {
            Cas::Done(record) => winners.push(record),
            Cas::Lost(current) => {
                assert_eq!(
                    current.map(|r| r.fence),
                    Some(2),
                    "a loser sees the new fence"
                );
                losers += 1;
            }
        }
    }
    assert_eq!(winners.len(), 1, "exactly one takeover wins");
    assert_eq!(losers, WORKERS - 1);
    let winner = &winners[0];
    assert_eq!(&stored(&*store, &abandoned.key).await, winner);
    let events = trace(&*store, &abandoned.key).await;
    assert_eq!(
        events.len(),
        1,
        "only the winner's event is appended: {events:?}"
    );
    assert_eq!(
        Some(events[0].worker.clone()),
        winner.lease().and_then(|l| l.owner.clone())
    );
}

/// The stored request is kept, replaced or cleared exactly as the transition says.
pub async fn request_update_keep_clear_set<S: Store>(store: S) {
    let claimed = record("acme:prod:wf-request:s1", pending("w1", 31_000));
    claim_new(&store, &claimed, Vec::new()).await;
    let original = claimed.request.clone();
    assert!(original.is_some());

    let kept = done(
        store
            .transition(step(&claimed, pending("w1", 32_000), 2_000))
            .await
            .expect("transition succeeds"),
    );
    assert_eq!(kept.request, original);
    assert_eq!(stored(&store, &claimed.key).await.request, original);

    let replacement = json!({"title": "edited", "priority": 1, "tags": ["a", "b"]});
    let mut set = step(&kept, pending("w1", 33_000), 3_000);
    set.request = RequestUpdate::Set(replacement.clone());
    let replaced = done(store.transition(set).await.expect("transition succeeds"));
    assert_eq!(replaced.request, Some(replacement.clone()));
    assert_eq!(
        stored(&store, &claimed.key).await.request,
        Some(replacement)
    );

    let mut clear = step(&replaced, applied("ticket-1"), 4_000);
    clear.request = RequestUpdate::Clear;
    let cleared = done(store.transition(clear).await.expect("transition succeeds"));
    assert_eq!(cleared.request, None);

    let still = done(
        store
            .transition(step(&cleared, applied("ticket-1"), 5_000))
            .await
            .expect("transition succeeds"),
    );
    assert_eq!(
        still.request, None,
        "keep does not bring a cleared request back"
    );
    assert_eq!(stored(&store, &claimed.key).await, still);
}

/// `approved_by` and `fingerprint` are written only when the transition carries them.
pub async fn approver_and_fingerprint_replacement<S: Store>(store: S) {
    let waiting = record(
        "acme:prod:wf-approve:s1",
        RecordState::AwaitingApproval { until: 500 },
    );
    claim_new(&store, &waiting, Vec::new()).await;

    let mut approve = step(&waiting, pending("w1", 40_000), 10_000);
    approve.approved_by = Some("operator-7".into());
    approve.events = vec![event(EventKind::Approved, 10_000, "operator-7")];
    let approved = done(
        store
            .transition(approve)
            .await
            .expect("transition succeeds"),
    );
    assert_eq!(approved.approved_by.as_deref(), Some("operator-7"));
    assert_eq!(approved.fingerprint, waiting.fingerprint);

    let finished = done(
        store
            .transition(step(&approved, applied("ticket-9"), 11_000))
            .await
            .expect("transition succeeds"),
    );
    assert_eq!(
        finished.approved_by.as_deref(),
        Some("operator-7"),
        "no approver in a transition keeps the stored one"
    );

    // An operator's `not_applied` on an unknown record lets a new request run under the key.
    let unknown = record(
        "acme:prod:wf-approve:s2",
        RecordState::Unknown(Evidence {
            reason: "timeout after dispatch".into(),
            reference: None,
            job_id: None,
        }),
    );
    claim_new(&store, &unknown, Vec::new()).await;
    let replacement = fingerprint(&json!({"title": "the corrected request"}));
    assert_ne!(replacement, unknown.fingerprint);
    let released = RecordState::Pending {
        lease: Lease {
            owner: None,
            expires_at: 12_000,
        },
        dispatch: Dispatch::NotSent,
    };
    let mut reconcile = step(&unknown, released, 12_000);
    reconcile.fingerprint = Some(replacement.clone());
    reconcile.request = RequestUpdate::Clear;
    let reconciled = done(
        store
            .transition(reconcile)
            .await
            .expect("transition succeeds"),
    );
    assert_eq!(reconciled.fingerprint, replacement);
    assert_eq!(reconciled.approved_by, None);
    assert_eq!(stored(&store, &unknown.key).await.fingerprint, replacement);

    let next = done(
        store
            .transition(step(&reconciled, pending("w2", 50_000), 13_000))
            .await
            .expect("transition succeeds"),
    );
    assert_eq!(
        next.fingerprint, replacement,
        "no fingerprint keeps the stored one"
    );
    assert_eq!(stored(&store, &waiting.key).await, finished);
    assert_eq!(stored(&store, &unknown.key).await, next);
}

/// Appended events follow the existing trace in order and leave the record alone.
pub async fn append_events_keeps_order<S: Store>(store: S) {
    let claimed = record("acme:prod:wf-append:s1", applied("ticket-1"));
    let first = vec![event(EventKind::Claimed, 1_000, "w1")];
    claim_new(&store, &claimed, first.clone()).await;
    let neighbour = record("acme:prod:wf-append:s2", applied("ticket-2"));
    claim_new(&store, &neighbour, Vec::new()).await;

    let more = vec![
        event(EventKind::Replayed, 2_000, "w2"),
        event(EventKind::InFlight, 2_001, "w3").with_detail("poll in 2s"),
        Event::new(EventKind::Replayed, 2_002, 7, "w4"),
    ];
    store
        .append_events(&claimed.key, more.clone())
        .await
        .expect("append succeeds");
    store
        .append_events(&claimed.key, Vec::new())
        .await
        .expect("appending nothing succeeds");
    let mut all = first;
    all.extend(more);
    assert_eq!(trace(&store, &claimed.key).await, all);
    assert_eq!(
        stored(&store, &claimed.key).await,
        claimed,
        "the record is untouched"
    );
    assert_eq!(trace(&store, &neighbour.key).await, Vec::new());
}

// ---------------------------------------------------------------------------------------------
// Reads.

/// Listing filters by tenant, status and tool, orders by key, and pages by `after`.
pub async fn list_filters_and_pages<S: Store>(store: S) {
    let statuses = [
        pending("w1", 31_000),
        RecordState::Unknown(Evidence {
            reason: "timeout".into(),
            reference: None,
            job_id: None,
        }),
        applied("ticket"),
        RecordState::FailedPermanent(Refusal {
            code: ErrorCode::DownstreamRejected,
            message: "refused".into(),
        }),
    ];
    let mut all = Vec::new();
    // Inserted out of key order, so that the order of the answers is the store's doing.
    for i in (0..13).rev() {
        let tenant = if i % 3 == 0 { "zeta" } else { "acme" };
        let mut r = record(
            &format!("{tenant}:prod:wf-list:s{i:02}"),
            statuses[i % 4].clone(),
        );
        if i % 2 == 1 {
            r.tool = OTHER_TOOL.into();
        }
        claim_new(&store, &r, Vec::new()).await;
        all.push(r);
    }
    all.sort_by(|a, b| a.key.as_str().cmp(b.key.as_str()));

    let page = 1000;
    check_list(
        &store,
        Filter {
            limit: page,
            ..Filter::default()
        },
        all.iter().collect(),
    )
    .await;
    check_list(
        &store,
        Filter {
            status: Some(RecordStatus::Unknown),
            limit: page,
            ..Filter::default()
        },
        all.iter()
            .filter(|r| r.status() == RecordStatus::Unknown)
            .collect(),
    )
    .await;
    check_list(
        &store,
        Filter {
            tool: Some(OTHER_TOOL.into()),
            limit: page,
            ..Filter::default()
        },
        all.iter().filter(|r| r.tool == OTHER_TOOL).collect(),
    )
    .await;
    check_list(
        &store,
        Filter {
            tenant: Some("zeta".into()),
            limit: page,
            ..Filter::default()
        },
        all.iter().filter(|r| r.tenant() == "zeta").collect(),
    )
    .await;
    check_list(
        &store,
        Filter {
            tenant: Some("acme".into()),
            status: Some(RecordStatus::Applied),
            tool: Some(TOOL.into()),
            limit: page,
            ..Filter::default()
        },
        all.iter()
            .filter(|r| {
                r.tenant() == "acme" && r.status() == RecordStatus::Applied && r.tool == TOOL
            })
            .collect(),
    )
    .await;
    check_list(
        &store,
        Filter {
            tenant: Some("nobody".into()),
            limit: page,
            ..Filter::default()
        },
        Vec::new(),
    )
    .await;

    // Keyset pagination: pages of 5 cover everything once, in order, then run dry.
    let mut seen = Vec::new();
    let mut after = None;
    for _ in 0..10 {
        let got = store
            .list(Filter {
                after: after.clone(),
                limit: 5,
                ..Filter::default()
            })
            .await
            .expect("list succeeds");
        assert!(got.len() <= 5, "a page holds at most its limit");
        let Some(last) = got.last() else { break };
        after = Some(last.key.as_str().to_string());
        seen.extend(got);
    }
    assert_eq!(keys(&seen), keys(&all));

    // The same within one filter.
    let pending_acme: Vec<&Record> = all
        .iter()
        .filter(|r| r.tenant() == "acme" && r.status() == RecordStatus::Pending)
        .collect();
    assert!(pending_acme.len() >= 2);
    let first = store
        .list(Filter {
            tenant: Some("acme".into()),
            status: Some(RecordStatus::Pending),
            limit: 1,
            ..Filter::default()
        })
        .await
        .expect("list succeeds");
    assert_eq!(keys(&first), vec![pending_acme[0].key.as_str().to_string()]);
    let rest = store
        .list(Filter {
            tenant: Some("acme".into()),
            status: Some(RecordStatus::Pending),
            after: Some(first[0].key.as_str().into()),
            limit: page,
            ..Filter::default()
        })
        .await
        .expect("list succeeds");
    assert_eq!(
        keys(&rest),
        pending_acme[1..]
            .iter()
            .map(|r| r.key.as_str().to_string())
            .collect::<Vec<_>>()
    );
}

async fn check_list<S: Store>(store: &S, filter: Filter, expected: Vec<&Record>) {
    let got = store.list(filter.clone()).await.expect("list succeeds");
    let expected: Vec<Record> = expected.into_iter().cloned().collect();
    assert_eq!(keys(&got), keys(&expected), "{filter:?}");
    assert_eq!(got, expected, "{filter:?}");
}

/// A limit of 0 means the default page of 100.
pub async fn list_default_page<S: Store>(store: S) {
    const RECORDS: usize = 101;
    let store = Arc::new(store);
    let mut tasks = JoinSet::new();
    for i in 0..RECORDS {
        let store = Arc::clone(&store);
        tasks.spawn(async move {
            let r = record(&format!("acme:prod:wf-page:s{i:03}"), applied("t"));
            claim_new(&*store, &r, Vec::new()).await;
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("a claimant panicked");
    }
    let default_page = store.list(Filter::default()).await.expect("list succeeds");
    assert_eq!(default_page.len(), 100);
    assert_eq!(default_page[0].key.as_str(), "acme:prod:wf-page:s000");
    assert_eq!(default_page[99].key.as_str(), "acme:prod:wf-page:s099");
    let everything = store
        .list(Filter {
            limit: 1000,
            ..Filter::default()
        })
        .await
        .expect("list succeeds");
    assert_eq!(everything.len(), RECORDS);
}

/// Every state comes back from the store exactly as it went in, whether claimed with it or
/// reached by a transition.
pub async fn every_state_round_trips<S: Store>(store: S) {
    let states = [
        pending("w1", 10),
        RecordState::Pending {
            lease: Lease {
                owner: None,
                expires_at: 10,
            },
            dispatch: Dispatch::Sent,
        },
        RecordState::Pending {
            lease: Lease {
                owner: Some("w1".into()),
                expires_at: 10,
            },
            dispatch: Dispatch::Job {
                job_id: "job-7".into(),
            },
        },
        RecordState::AwaitingApproval { until: 900 },
        RecordState::Applied(Receipt {
            reference: "ticket_1".into(),
            result: json!({"id": 1, "nested": {"list": [1, "two", null, true]}, "text": "é ✓"}),
        }),
        RecordState::Applied(Receipt {
            reference: "ticket_2".into(),
            result: Value::Null,
        }),
        RecordState::FailedPermanent(Refusal {
            code: ErrorCode::DownstreamRejected,
            message: "no".into(),
        }),
        RecordState::FailedPermanent(Refusal {
            code: ErrorCode::ApprovalDenied,
            message: String::new(),
        }),
        RecordState::Unknown(Evidence {
            reason: "timeout".into(),
            reference: None,
            job_id: Some("j".into()),
        }),
        RecordState::Unknown(Evidence {
            reason: "malformed answer".into(),
            reference: Some("ref-9".into()),
            job_id: None,
        }),
        RecordState::Tombstone(Digest::Applied {
            reference: "ticket_1".into(),
        }),
        RecordState::Tombstone(Digest::Refused {
            code: ErrorCode::DownstreamRejected,
        }),
        RecordState::Tombstone(Digest::NeverRan),
    ];
    for (i, state) in states.iter().enumerate() {
        let mut claimed = record(&format!("acme:prod:wf-states:c{i}"), state.clone());
        claimed.approved_by = (i % 2 == 0).then(|| "operator-1".to_string());
        claimed.request = (i % 3 != 0).then(|| json!({"i": i, "big": 9_007_199_254_740_991_i64}));
        claimed.fence = 1 + i as u64;
        claimed.created_at = -5 + i as Millis;
        claim_new(&store, &claimed, Vec::new()).await;
        assert_eq!(
            stored(&store, &claimed.key).await,
            claimed,
            "claimed with {state:?}"
        );

        let start = record(&format!("acme:prod:wf-states:t{i}"), pending("w0", 5));
        claim_new(&store, &start, Vec::new()).await;
        let reached = done(
            store
                .transition(step(&start, state.clone(), 2_000 + i as Millis))
                .await
                .expect("transition succeeds"),
        );
        assert_eq!(&reached.state, state);
        assert_eq!(
            stored(&store, &start.key).await,
            reached,
            "reached {state:?}"
        );
    }
}
