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
    Digest, Dispatch, Event, EventKind, Evidence, Lease, Millis, NOT_SETTLED, Receipt, Record,
    RecordState, RecordStatus, Refusal,
};
use idemgate_core::store::{
    Cas, Claimed, Cursor, Due, Expect, Expiry, Filter, RequestUpdate, Store, SweepReport,
    Transition, Waiting, WaitingOn, due_at,
};
use serde_json::{Value, json};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

/// The tool most records belong to.
pub const TOOL: &str = "tickets.create";
/// A second tool, for listings and duplicate-intent checks that must tell tools apart.
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
    a_purged_keys_next_life_fences_out_the_last(fresh().await).await;
    takeover_waits_for_lease_expiry(fresh().await).await;
    concurrent_takeovers_one_wins(fresh().await).await;
    request_update_keep_clear_set(fresh().await).await;
    approver_and_fingerprint_replacement(fresh().await).await;
    append_events_keeps_order(fresh().await).await;
    transition_sets_expiry_only_when_given(fresh().await).await;
    list_filters_and_pages(fresh().await).await;
    list_filters_by_environment(fresh().await).await;
    list_default_page(fresh().await).await;
    count_is_exact_past_a_page(fresh().await).await;
    due_finds_deadlines_passed_in_order(fresh().await).await;
    due_pages_by_cursor_and_limit(fresh().await).await;
    waiting_lists_expired_claims_and_jobs(fresh().await).await;
    duplicate_intent_names_the_earliest_match(fresh().await).await;
    duplicate_intent_inserts_nothing(fresh().await).await;
    concurrent_duplicate_intents_insert_once(fresh().await).await;
    sweep_compacts_and_purges(fresh().await).await;
    sweep_is_scoped_by_environment(fresh().await).await;
    sweep_never_touches_unsettled_records(fresh().await).await;
    sweep_respects_limit(fresh().await).await;
    every_state_round_trips(fresh().await).await;
    digests_round_trip(fresh().await).await;
}

/// How many cases [`run`] runs, for store crates that check they ran them all.
pub const CASES: usize = 27;

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

/// A record of the suite's tool under `key`, at fence 1, created and updated at 1 000. A
/// settled one is due for compaction at 100 000 and for purging at 200 000; one that has not
/// settled has no expiry yet ([`NOT_SETTLED`]), as the executor claims it.
pub fn record(key_text: &str, state: RecordState) -> Record {
    let request = json!({"title": key_text, "priority": 2});
    let (expires_at, purge_at) = match state {
        RecordState::Applied(_) | RecordState::FailedPermanent(_) | RecordState::Tombstone(_) => {
            (100_000, 200_000)
        }
        RecordState::Pending { .. }
        | RecordState::AwaitingApproval { .. }
        | RecordState::Unknown(_) => (NOT_SETTLED, NOT_SETTLED),
    };
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
        expires_at,
        purge_at,
        intent_window: true,
    }
}

/// A record awaiting approval until `until`.
pub fn awaiting(until: Millis) -> RecordState {
    RecordState::AwaitingApproval { until }
}

/// A refusal by the downstream.
pub fn refused(code: ErrorCode) -> RecordState {
    RecordState::FailedPermanent(Refusal {
        code,
        message: "customer account closed".into(),
    })
}

/// An unknown outcome.
pub fn unknown() -> RecordState {
    RecordState::Unknown(Evidence {
        reason: "timeout after dispatch".into(),
        reference: None,
        job_id: None,
    })
}

/// An owner's own step from `from` to `next` at `now`: same fence, request kept.
pub fn step(from: &Record, next: RecordState, now: Millis) -> Transition {
    Transition {
        key: from.key.clone(),
        expect: Expect {
            fence: from.fence,
            status: from.status(),
            created_at: from.created_at,
            lease_expired_by: None,
            dispatch: None,
        },
        next,
        fence: from.fence,
        request: RequestUpdate::Keep,
        approved_by: None,
        fingerprint: None,
        expiry: None,
        events: Vec::new(),
        now,
        webhook: None,
        audit: None,
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
        Claimed::DuplicateIntent(other) => {
            panic!(
                "{} is no duplicate-intent claim, yet {other} was named",
                record.key
            )
        }
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
            Claimed::DuplicateIntent(other) => panic!("a plain claim named {other}"),
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

/// A key whose tombstone was purged is claimed again at fence 1, like its first life was: a
/// worker of the first life, paused through the purge, still holds fence 1 and a pending
/// status, and its transition must lose to the second life's claim (the expectation names
/// the life by its creation instant), or it would mark, and send, someone else's claim.
pub async fn a_purged_keys_next_life_fences_out_the_last<S: Store>(store: S) {
    let first = record("acme:prod:wf-lives:s1", pending("w1", 31_000));
    claim_new(&store, &first, vec![event(EventKind::Claimed, 1_000, "w1")]).await;
    // What w1 would write after a pause: its own step, planned from the first life.
    let mut paused = step(
        &first,
        RecordState::Pending {
            lease: Lease {
                owner: Some("w1".into()),
                expires_at: 31_000,
            },
            dispatch: Dispatch::Sent,
        },
        90_000,
    );
    paused.events = vec![event(EventKind::Sent, 90_000, "w1")];

    // The lease runs out; nothing was sent, so a recoverer ends the first life as never run,
    // and a sweep purges it.
    let mut ended = takeover(&first, "recoverer", 40_000);
    ended.next = RecordState::Tombstone(Digest::NeverRan);
    ended.expiry = Some(Expiry {
        expires_at: 40_000,
        purge_at: 40_000,
    });
    done(store.transition(ended).await.expect("transition succeeds"));
    assert_eq!(
        store
            .sweep("prod", 50_000, 100)
            .await
            .expect("sweep succeeds"),
        SweepReport {
            compacted: 0,
            purged: 1
        }
    );
    assert_eq!(store.get(&first.key).await.expect("get succeeds"), None);

    // The second life: the same key, fence 1 and pending again, claimed by w2.
    let mut second = record("acme:prod:wf-lives:s1", pending("w2", 90_000));
    second.created_at = 60_000;
    second.updated_at = 60_000;
    let second_events = vec![event(EventKind::Claimed, 60_000, "w2")];
    claim_new(&store, &second, second_events.clone()).await;

    let answer = store.transition(paused).await.expect("transition succeeds");
    assert_eq!(answer, Cas::Lost(Some(second.clone())));
    assert_eq!(stored(&store, &second.key).await, second);
    assert_eq!(trace(&store, &second.key).await, second_events);

    // The second life's own owner still moves it.
    let own = step(&second, applied("ticket-2"), 61_000);
    let written = done(store.transition(own).await.expect("transition succeeds"));
    assert_eq!(written.status(), RecordStatus::Applied);
    assert_eq!(stored(&store, &second.key).await, written);
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
    let waiting = record("acme:prod:wf-approve:s1", awaiting(20_000));
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

/// A transition with an expiry writes both `expires_at` and `purge_at`; one without leaves
/// them as stored; one that leaves a settled state sets them back to [`NOT_SETTLED`]; one that
/// loses writes neither. Concurrent settling transitions (which a store may carry together)
/// each write their own.
pub async fn transition_sets_expiry_only_when_given<S: Store>(store: S) {
    let claimed = record("acme:prod:wf-expiry:s1", pending("w1", 31_000));
    claim_new(&store, &claimed, Vec::new()).await;
    let expiry_of = |r: &Record| (r.expires_at, r.purge_at);
    assert_eq!(expiry_of(&claimed), (NOT_SETTLED, NOT_SETTLED));

    let renewed = done(
        store
            .transition(step(&claimed, pending("w1", 32_000), 1_500))
            .await
            .expect("transition succeeds"),
    );
    assert_eq!(expiry_of(&renewed), (NOT_SETTLED, NOT_SETTLED));

    let mut settle = step(&renewed, applied("ticket-1"), 2_000);
    settle.expiry = Some(Expiry {
        expires_at: 86_402_000,
        purge_at: 172_802_000,
    });
    let settled = done(store.transition(settle).await.expect("transition succeeds"));
    assert_eq!(expiry_of(&settled), (86_402_000, 172_802_000));
    assert_eq!(stored(&store, &claimed.key).await, settled);

    let kept = done(
        store
            .transition(step(&settled, applied("ticket-1"), 3_000))
            .await
            .expect("transition succeeds"),
    );
    assert_eq!(
        expiry_of(&kept),
        expiry_of(&settled),
        "no expiry keeps the stored one"
    );

    // An operator reopens the record: it has not settled any more.
    let mut reopen = step(&kept, unknown(), 4_000);
    reopen.expiry = Some(Expiry {
        expires_at: NOT_SETTLED,
        purge_at: NOT_SETTLED,
    });
    let reopened = done(store.transition(reopen).await.expect("transition succeeds"));
    assert_eq!(expiry_of(&reopened), (NOT_SETTLED, NOT_SETTLED));

    let mut late = step(&settled, applied("ticket-late"), 5_000);
    late.expiry = Some(Expiry {
        expires_at: 1,
        purge_at: 2,
    });
    let answer = store.transition(late).await.expect("transition succeeds");
    assert_eq!(answer, Cas::Lost(Some(reopened.clone())));
    assert_eq!(stored(&store, &claimed.key).await, reopened);

    const SETTLING: usize = 16;
    let store = Arc::new(store);
    let start = Arc::new(Barrier::new(SETTLING));
    let mut tasks = JoinSet::new();
    for i in 0..SETTLING {
        let r = record(
            &format!("acme:prod:wf-expiry:c{i:02}"),
            pending("w1", 31_000),
        );
        claim_new(&*store, &r, Vec::new()).await;
        let store = Arc::clone(&store);
        let start = Arc::clone(&start);
        tasks.spawn(async move {
            let mut settle = step(&r, applied(&format!("ticket-{i}")), 2_000);
            // Every other one settles without an expiry, so a store that carries several
            // transitions in one statement must keep each one's own.
            settle.expiry = (i % 2 == 0).then(|| Expiry {
                expires_at: 10_000 + i as Millis,
                purge_at: 20_000 + i as Millis,
            });
            start.wait().await;
            let answer = store.transition(settle).await.expect("transition succeeds");
            (i, done(answer))
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let (i, answer) = joined.expect("a settler panicked");
        let expected = if i % 2 == 0 {
            (10_000 + i as Millis, 20_000 + i as Millis)
        } else {
            (NOT_SETTLED, NOT_SETTLED)
        };
        assert_eq!(expiry_of(&answer), expected, "c{i:02}");
        assert_eq!(stored(&*store, &answer.key).await, answer, "c{i:02}");
    }
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

/// Listing by environment takes the key's second part exactly: not a prefix of it, not the
/// tenant; alone or with the other filters, and paged like any listing.
pub async fn list_filters_by_environment<S: Store>(store: S) {
    let states = [
        pending("w1", 31_000),
        unknown(),
        applied("ticket"),
        refused(ErrorCode::DownstreamRejected),
        awaiting(50_000),
    ];
    let mut all = Vec::new();
    for i in (0..15).rev() {
        let tenant = if i % 2 == 0 { "acme" } else { "zeta" };
        let environment = ["prod", "staging", "production"][i % 3];
        let r = record(
            &format!("{tenant}:{environment}:wf-env:s{i:02}"),
            states[i % 5].clone(),
        );
        claim_new(&store, &r, Vec::new()).await;
        all.push(r);
    }
    // A tenant named like an environment: its key's environment is still the second part.
    let confusing = record("prod:staging:wf-env:x", pending("w1", 31_000));
    claim_new(&store, &confusing, Vec::new()).await;
    all.push(confusing);
    all.sort_by(|a, b| a.key.as_str().cmp(b.key.as_str()));

    let in_env = |environment: &'static str| move |r: &&Record| r.key.environment() == environment;
    for environment in ["prod", "staging", "production"] {
        check_list(
            &store,
            Filter {
                environment: Some(environment.into()),
                limit: 1000,
                ..Filter::default()
            },
            all.iter().filter(in_env(environment)).collect(),
        )
        .await;
        for status in RecordStatus::ALL {
            check_list(
                &store,
                Filter {
                    environment: Some(environment.into()),
                    status: Some(status),
                    limit: 1000,
                    ..Filter::default()
                },
                all.iter()
                    .filter(in_env(environment))
                    .filter(|r| r.status() == status)
                    .collect(),
            )
            .await;
        }
    }
    check_list(
        &store,
        Filter {
            tenant: Some("acme".into()),
            environment: Some("staging".into()),
            status: Some(RecordStatus::Pending),
            tool: Some(TOOL.into()),
            limit: 1000,
            ..Filter::default()
        },
        all.iter()
            .filter(|r| {
                r.tenant() == "acme"
                    && r.key.environment() == "staging"
                    && r.status() == RecordStatus::Pending
            })
            .collect(),
    )
    .await;
    for nowhere in ["prod:staging", "prodx", "prod%", "", "acme"] {
        check_list(
            &store,
            Filter {
                environment: Some(nowhere.into()),
                limit: 1000,
                ..Filter::default()
            },
            Vec::new(),
        )
        .await;
    }

    // Pages of 2 cover the environment once, in key order.
    let mut seen = Vec::new();
    let mut after = None;
    for _ in 0..20 {
        let page = store
            .list(Filter {
                environment: Some("staging".into()),
                after: after.clone(),
                limit: 2,
                ..Filter::default()
            })
            .await
            .expect("list succeeds");
        assert!(page.len() <= 2, "a page holds at most its limit");
        let Some(last) = page.last() else { break };
        after = Some(last.key.as_str().to_string());
        seen.extend(page);
    }
    let staging: Vec<Record> = all.iter().filter(in_env("staging")).cloned().collect();
    assert_eq!(keys(&seen), keys(&staging));
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

/// `count` is exact past the largest page a listing returns (1 000): the reconciliation
/// queue's gauge once counted by listing, and stopped there. Only the environment and the
/// status asked for count; tenants are summed.
pub async fn count_is_exact_past_a_page<S: Store>(store: S) {
    const UNKNOWN: usize = 1_050;
    let store = Arc::new(store);
    let mut tasks = JoinSet::new();
    for i in 0..UNKNOWN {
        let store = Arc::clone(&store);
        tasks.spawn(async move {
            // Two tenants, so that the count is across them.
            let tenant = if i % 2 == 0 { "acme" } else { "globex" };
            let r = record(&format!("{tenant}:prod:wf-count:s{i:04}"), unknown());
            claim_new(&*store, &r, Vec::new()).await;
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("a claimant panicked");
    }
    // Others that must not count: other statuses here, `unknown` in another environment.
    let others = [
        record("acme:prod:wf-count-other:a", applied("t-1")),
        record("acme:prod:wf-count-other:p", pending("w1", 5_000)),
        record(
            "acme:prod:wf-count-other:f",
            refused(ErrorCode::DownstreamRejected),
        ),
        record("acme:staging:wf-count-other:u1", unknown()),
        record("globex:staging:wf-count-other:u2", unknown()),
    ];
    for r in &others {
        claim_new(&*store, r, Vec::new()).await;
    }
    let count = |environment: &'static str, status: RecordStatus| {
        let store = Arc::clone(&store);
        async move {
            store
                .count(environment, status)
                .await
                .expect("count succeeds")
        }
    };
    assert_eq!(count("prod", RecordStatus::Unknown).await, UNKNOWN as u64);
    assert_eq!(count("staging", RecordStatus::Unknown).await, 2);
    assert_eq!(count("prod", RecordStatus::Applied).await, 1);
    assert_eq!(count("prod", RecordStatus::Pending).await, 1);
    assert_eq!(count("prod", RecordStatus::FailedPermanent).await, 1);
    assert_eq!(count("prod", RecordStatus::Tombstone).await, 0);
    assert_eq!(count("nowhere", RecordStatus::Unknown).await, 0);
}

// ---------------------------------------------------------------------------------------------
// Due records.

/// One page of a due scan of `environment`.
async fn due<S: Store>(
    store: &S,
    environment: &str,
    now: Millis,
    after: Option<Cursor>,
    limit: usize,
) -> Vec<Record> {
    let found = store
        .due(Due {
            environment: environment.into(),
            now,
            after,
            limit,
        })
        .await
        .expect("due succeeds");
    assert!(found.len() <= limit, "a page holds at most its limit");
    found
}

/// Where a due scan continues after `record`.
fn cursor(record: &Record) -> Cursor {
    Cursor {
        due_at: due_at(record).expect("a due record has a deadline"),
        key: record.key.clone(),
    }
}

/// The due scan finds the pending and awaiting-approval records of one environment whose
/// deadline is at or before `now` — owned, released and job records alike, each by its lease
/// expiry; approvals by their deadline — in (deadline, key) order. Records that are not due
/// yet, records of another state and records of another environment are not found.
pub async fn due_finds_deadlines_passed_in_order<S: Store>(store: S) {
    const NOW: Millis = 10_000;
    let lease = |owner: Option<&str>, expires_at, dispatch| RecordState::Pending {
        lease: Lease {
            owner: owner.map(str::to_string),
            expires_at,
        },
        dispatch,
    };
    let job = || Dispatch::Job {
        job_id: "job-7".into(),
    };
    let released = record(
        "acme:prod:wf-due:released",
        lease(None, 5_000, Dispatch::NotSent),
    );
    let approval = record("acme:prod:wf-due:approval", awaiting(6_000));
    let polled = record("acme:prod:wf-due:job", lease(Some("w1"), 7_000, job()));
    let sent = record(
        "zeta:prod:wf-due:sent",
        lease(Some("w9"), 8_000, Dispatch::Sent),
    );
    // Three deadlines at one instant: key order decides, across tenants too.
    let tie_a = record("acme:prod:wf-due:a-tie", pending("w1", 9_000));
    let expired = record("acme:prod:wf-due:expired", pending("w1", 9_000));
    let tie_z = record("zeta:prod:wf-due:tie", pending("w2", 9_000));
    let boundary = record("acme:prod:wf-due:boundary", pending("w1", NOW));
    let due_now = [
        &released, &approval, &polled, &sent, &tie_a, &expired, &tie_z, &boundary,
    ];

    let not_yet = [
        record("acme:prod:wf-due:live", pending("w1", NOW + 1)),
        // Released with time left: due when that time is up, not before.
        record(
            "acme:prod:wf-due:released-later",
            lease(None, 20_000, Dispatch::NotSent),
        ),
        record(
            "acme:prod:wf-due:job-later",
            lease(Some("w1"), 15_000, job()),
        ),
        record("acme:prod:wf-due:approval-later", awaiting(NOW + 1)),
    ];
    let mut never = vec![
        record("acme:prod:wf-due:unknown", unknown()),
        record("acme:prod:wf-due:applied", applied("ticket-1")),
        record(
            "acme:prod:wf-due:failed",
            refused(ErrorCode::DownstreamRejected),
        ),
        record(
            "acme:prod:wf-due:tombstone",
            RecordState::Tombstone(Digest::NeverRan),
        ),
    ];
    for r in &mut never {
        // Long past every time a store could mistake for a deadline.
        r.expires_at = 0;
        r.purge_at = 0;
        r.created_at = 0;
        r.updated_at = 0;
    }
    let elsewhere = [
        record("acme:staging:wf-due:expired", pending("w1", 1_000)),
        record("acme:production:wf-due:expired", pending("w1", 1_000)),
        record("prod:staging:wf-due:approval", awaiting(1_000)),
    ];
    for r in due_now
        .iter()
        .copied()
        .chain(&not_yet)
        .chain(&never)
        .chain(&elsewhere)
    {
        claim_new(&store, r, Vec::new()).await;
    }

    let found = due(&store, "prod", NOW, None, 100).await;
    let expected: Vec<Record> = [
        &released, &approval, &polled, &sent, &tie_a, &expired, &tie_z, &boundary,
    ]
    .into_iter()
    .cloned()
    .collect();
    assert_eq!(keys(&found), keys(&expected));
    assert_eq!(found, expected, "the records as stored");

    let staging = due(&store, "staging", NOW, None, 100).await;
    assert_eq!(
        keys(&staging),
        vec![
            "acme:staging:wf-due:expired",
            "prod:staging:wf-due:approval"
        ]
    );
    assert_eq!(due(&store, "nowhere", NOW, None, 100).await, Vec::new());
    assert_eq!(due(&store, "prod", NOW, None, 0).await, Vec::new());
    assert_eq!(due(&store, "prod", 4_999, None, 100).await, Vec::new());

    // Later, the records not due yet are due too, each at its deadline; the others never.
    let later = due(&store, "prod", 1_000_000, None, 100).await;
    let mut expected: Vec<&Record> = due_now.iter().copied().chain(&not_yet).collect();
    expected.sort_by(|a, b| (due_at(a), a.key.as_str()).cmp(&(due_at(b), b.key.as_str())));
    assert_eq!(
        keys(&later),
        expected
            .iter()
            .map(|r| r.key.as_str().to_string())
            .collect::<Vec<_>>()
    );

    // A record stops being due once a transition moves its deadline or settles it.
    let renewed = done(
        store
            .transition(step(&expired, pending("w1", 40_000), NOW))
            .await
            .expect("transition succeeds"),
    );
    let mut settle = step(&approval, refused(ErrorCode::ApprovalExpired), NOW);
    settle.expiry = Some(Expiry {
        expires_at: NOW,
        purge_at: NOW,
    });
    done(store.transition(settle).await.expect("transition succeeds"));
    let found = due(&store, "prod", NOW, None, 100).await;
    assert_eq!(
        keys(&found),
        keys(&[
            released.clone(),
            polled.clone(),
            sent.clone(),
            tie_a.clone(),
            tie_z.clone(),
            boundary.clone()
        ])
    );
    assert!(!found.contains(&renewed));
}

/// Pages of a due scan follow one another through the cursor, strictly after it in (deadline,
/// key) order — a later key at the same deadline is next, an earlier key at a later deadline
/// too — and together list every due record once.
pub async fn due_pages_by_cursor_and_limit<S: Store>(store: S) {
    // Three records per deadline, approvals among them.
    let mut all = Vec::new();
    for i in 0..12 {
        let deadline = 1_000 * (i / 3) as Millis;
        let state = if i % 4 == 1 {
            awaiting(deadline)
        } else {
            pending("w1", deadline)
        };
        // Keys run against deadlines, so that key order alone would page wrongly.
        let r = record(&format!("acme:prod:wf-cursor:s{:02}", 20 - i), state);
        claim_new(&store, &r, Vec::new()).await;
        all.push(r);
    }
    all.sort_by(|a, b| (due_at(a), a.key.as_str()).cmp(&(due_at(b), b.key.as_str())));
    assert_eq!(due(&store, "prod", 3_000, None, 100).await, all);

    for limit in [1, 2, 5] {
        let mut seen = Vec::new();
        let mut after = None;
        for _ in 0..20 {
            let page = due(&store, "prod", 3_000, after.clone(), limit).await;
            let Some(last) = page.last() else { break };
            after = Some(cursor(last));
            seen.extend(page);
        }
        assert_eq!(keys(&seen), keys(&all), "pages of {limit}");
    }

    let from = |due_at: Millis, key_text: &str| {
        Some(Cursor {
            due_at,
            key: key(key_text),
        })
    };
    // At a deadline shared by three records, after the first of them: the other two, then on.
    let after_first = due(
        &store,
        "prod",
        3_000,
        from(1_000, "acme:prod:wf-cursor:s15"),
        3,
    )
    .await;
    assert_eq!(
        keys(&after_first),
        vec![
            "acme:prod:wf-cursor:s16",
            "acme:prod:wf-cursor:s17",
            "acme:prod:wf-cursor:s12"
        ]
    );
    // A cursor between keys that are stored.
    let between = due(
        &store,
        "prod",
        3_000,
        from(1_000, "acme:prod:wf-cursor:s16x"),
        2,
    )
    .await;
    assert_eq!(
        keys(&between),
        vec!["acme:prod:wf-cursor:s17", "acme:prod:wf-cursor:s12"]
    );
    // A key later than all at an earlier deadline: the deadline decides first.
    let later_key = due(&store, "prod", 3_000, from(0, "zzzz:prod:wf:z"), 1).await;
    assert_eq!(keys(&later_key), vec!["acme:prod:wf-cursor:s15"]);
    // After the last record: nothing, and `now` still bounds what comes after a cursor.
    let last = all.last().expect("records");
    assert_eq!(
        due(&store, "prod", 3_000, Some(cursor(last)), 10).await,
        Vec::new()
    );
    assert_eq!(
        keys(
            &due(
                &store,
                "prod",
                2_999,
                from(1_000, "acme:prod:wf-cursor:s17"),
                10
            )
            .await
        ),
        vec![
            "acme:prod:wf-cursor:s12",
            "acme:prod:wf-cursor:s13",
            "acme:prod:wf-cursor:s14"
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Duplicate intent.

/// A record of the suite's tool claimed with the duplicate-intent window, created at `at`, for
/// the request `arguments`.
fn intent(key_text: &str, arguments: &Value, at: Millis) -> Record {
    let mut r = record(key_text, applied("ticket"));
    r.fingerprint = fingerprint(arguments);
    r.request = Some(arguments.clone());
    r.created_at = at;
    r.updated_at = at;
    r
}

async fn claim_guarded<S: Store>(store: &S, record: &Record, since: Millis) -> Claimed {
    store
        .claim_unless_duplicate(record.clone(), Vec::new(), since)
        .await
        .expect("claim_unless_duplicate succeeds")
}

/// The operator's queues of pending records: claims past their lease (owned or released, never
/// a job, never one still live) and jobs in progress, each of one tenant and one environment,
/// by tool, in key order, paged after a cursor. Nothing else (approvals, unknown, applied)
/// appears in either.
pub async fn waiting_lists_expired_claims_and_jobs<S: Store>(store: S) {
    let job = |expires_at| RecordState::Pending {
        lease: Lease {
            owner: Some("w".into()),
            expires_at,
        },
        dispatch: Dispatch::Job {
            job_id: "job-1".into(),
        },
    };
    let released = RecordState::Pending {
        lease: Lease {
            owner: None,
            expires_at: 4_000,
        },
        dispatch: Dispatch::NotSent,
    };
    let sent = RecordState::Pending {
        lease: Lease {
            owner: Some("w".into()),
            expires_at: 3_000,
        },
        dispatch: Dispatch::Sent,
    };
    let mut other_tool = record("acme:prod:wf-wait:s06", pending("w", 2_000));
    other_tool.tool = OTHER_TOOL.into();
    let records = vec![
        record("acme:prod:wf-wait:s01", pending("w", 2_000)),
        record("acme:prod:wf-wait:s02", pending("w", 9_000)),
        record("acme:prod:wf-wait:s03", released),
        record("acme:prod:wf-wait:s04", sent),
        record("acme:prod:wf-wait:s05", job(1_000)),
        other_tool,
        record("acme:prod:wf-wait:s07", job(90_000)),
        record("acme:prod:wf-wait:s08", awaiting(1_500)),
        record("acme:prod:wf-wait:s09", unknown()),
        record("acme:prod:wf-wait:s10", applied("t-10")),
        record("acme:staging:wf-wait:s11", pending("w", 2_000)),
        record("globex:prod:wf-wait:s12", pending("w", 2_000)),
        record("globex:prod:wf-wait:s13", job(1_000)),
    ];
    for r in &records {
        claim_new(&store, r, Vec::new()).await;
    }
    let query = |on, tool: Option<&str>, after: Option<&str>, limit| Waiting {
        tenant: "acme".into(),
        environment: "prod".into(),
        on,
        tool: tool.map(str::to_string),
        after: after.map(str::to_string),
        limit,
    };
    let expired = WaitingOn::LeaseExpired { now: 5_000 };
    let found = store
        .waiting(query(expired, None, None, 0))
        .await
        .expect("waiting succeeds");
    assert_eq!(
        keys(&found),
        [
            "acme:prod:wf-wait:s01",
            "acme:prod:wf-wait:s03",
            "acme:prod:wf-wait:s04",
            "acme:prod:wf-wait:s06",
        ],
        "claims past their lease: owned, released, maybe sent, of any tool"
    );
    assert!(found.iter().all(|r| expired.holds(r)));
    // The lease that runs out at 9 000 is live at 5 000 and past at 9 000 ("at or before").
    let later = store
        .waiting(query(WaitingOn::LeaseExpired { now: 9_000 }, None, None, 0))
        .await
        .expect("waiting succeeds");
    assert!(keys(&later).contains(&"acme:prod:wf-wait:s02".to_string()));
    let by_tool = store
        .waiting(query(expired, Some(OTHER_TOOL), None, 0))
        .await
        .expect("waiting succeeds");
    assert_eq!(keys(&by_tool), ["acme:prod:wf-wait:s06"]);
    let first = store
        .waiting(query(expired, None, None, 2))
        .await
        .expect("waiting succeeds");
    assert_eq!(
        keys(&first),
        ["acme:prod:wf-wait:s01", "acme:prod:wf-wait:s03"]
    );
    let rest = store
        .waiting(query(expired, None, Some("acme:prod:wf-wait:s03"), 2))
        .await
        .expect("waiting succeeds");
    assert_eq!(
        keys(&rest),
        ["acme:prod:wf-wait:s04", "acme:prod:wf-wait:s06"]
    );
    let jobs = store
        .waiting(query(WaitingOn::Job, None, None, 0))
        .await
        .expect("waiting succeeds");
    assert_eq!(
        keys(&jobs),
        ["acme:prod:wf-wait:s05", "acme:prod:wf-wait:s07"],
        "jobs in progress, due for a poll or not"
    );
    assert_eq!(stored(&store, &key("acme:prod:wf-wait:s05")).await, jobs[0]);
}

/// The same fingerprint under another key of the same tenant and tool, claimed with the window
/// and created at or after `since`, is a duplicate intent; of several, the earliest created,
/// the smallest key on a tie. Another tool's, another tenant's, another request's and an
/// unwatched record never are; the key's own record is `Existing`, never a duplicate of itself.
pub async fn duplicate_intent_names_the_earliest_match<S: Store>(store: S) {
    let arguments = json!({"title": "printer on fire", "priority": 1});
    let b = intent("acme:prod:wf-intent:b", &arguments, 1_000);
    let a = intent("acme:prod:wf-intent:a", &arguments, 1_000);
    // Environments never mix: another environment of the tenant never matches.
    let staging = intent("acme:staging:wf-intent:e", &arguments, 1_200);
    let c = intent("acme:prod:wf-intent:c", &arguments, 2_000);
    let mut unwatched = intent("acme:prod:wf-intent:0", &arguments, 500);
    unwatched.intent_window = false;
    let mut other_tool = intent("acme:prod:wf-intent:t", &arguments, 100);
    other_tool.tool = OTHER_TOOL.into();
    let other_tenant = intent("zeta:prod:wf-intent:z", &arguments, 100);
    let different = intent(
        "acme:prod:wf-intent:d",
        &json!({"title": "printer on fire", "priority": 2}),
        100,
    );
    for r in [
        &b,
        &a,
        &staging,
        &c,
        &unwatched,
        &other_tool,
        &other_tenant,
        &different,
    ] {
        claim_new(&store, r, Vec::new()).await;
    }

    let probe = |key_text: &str| {
        let mut r = intent(key_text, &arguments, 5_000);
        r.state = pending("w1", 35_000);
        r
    };
    let fresh = probe("acme:prod:wf-intent:new");
    for (since, named) in [(0, &a), (1_000, &a), (1_001, &c), (1_201, &c)] {
        assert_eq!(
            claim_guarded(&store, &fresh, since).await,
            Claimed::DuplicateIntent(named.key.clone()),
            "since {since}"
        );
    }
    assert_eq!(store.get(&fresh.key).await.expect("get succeeds"), None);
    assert_eq!(
        claim_guarded(&store, &fresh, 2_001).await,
        Claimed::Inserted(fresh.clone())
    );
    assert_eq!(stored(&store, &fresh.key).await, fresh);
    // The claim just inserted is watched in its turn.
    assert_eq!(
        claim_guarded(&store, &probe("acme:prod:wf-intent:new2"), 2_001).await,
        Claimed::DuplicateIntent(fresh.key.clone())
    );
    // Its own key: the record comes back, though an earlier match exists.
    let mut again = probe("acme:prod:wf-intent:b");
    again.actor = "agent-2".into();
    assert_eq!(
        claim_guarded(&store, &again, 0).await,
        Claimed::Existing(b.clone())
    );
    assert_eq!(stored(&store, &b.key).await, b);

    // Tools and tenants are apart.
    let mut refund = probe("acme:prod:wf-intent:refund");
    refund.tool = OTHER_TOOL.into();
    assert_eq!(
        claim_guarded(&store, &refund, 0).await,
        Claimed::DuplicateIntent(other_tool.key.clone())
    );
    assert_eq!(
        claim_guarded(&store, &probe("zeta:prod:wf-intent:y"), 0).await,
        Claimed::DuplicateIntent(other_tenant.key.clone())
    );
    let mut in_staging = probe("acme:staging:wf-intent:s2");
    in_staging.created_at = 1_300;
    assert_eq!(
        claim_guarded(&store, &in_staging, 1_100).await,
        Claimed::DuplicateIntent(staging.key.clone())
    );
    let lonely = probe("nobody:prod:wf-intent:x");
    assert_eq!(
        claim_guarded(&store, &lonely, 0).await,
        Claimed::Inserted(lonely.clone())
    );
}

/// A duplicate intent inserts nothing and appends nothing; without one, the claim inserts with
/// its events exactly like `claim`, and a second claim of the key returns the record unchanged.
pub async fn duplicate_intent_inserts_nothing<S: Store>(store: S) {
    let arguments = json!({"title": "refund order 4711"});
    let first = intent("acme:prod:wf-dup:s1", &arguments, 1_000);
    let events = vec![event(EventKind::Claimed, 1_000, "w1")];
    let answer = store
        .claim_unless_duplicate(first.clone(), events.clone(), 0)
        .await
        .expect("claim_unless_duplicate succeeds");
    assert_eq!(answer, Claimed::Inserted(first.clone()));
    assert_eq!(stored(&store, &first.key).await, first);
    assert_eq!(trace(&store, &first.key).await, events);

    let mut second = intent("acme:prod:wf-dup:s2", &arguments, 2_000);
    second.state = pending("w2", 32_000);
    let answer = store
        .claim_unless_duplicate(
            second.clone(),
            vec![event(EventKind::Claimed, 2_000, "w2")],
            0,
        )
        .await
        .expect("claim_unless_duplicate succeeds");
    assert_eq!(answer, Claimed::DuplicateIntent(first.key.clone()));
    assert_eq!(store.get(&second.key).await.expect("get succeeds"), None);
    assert_eq!(trace(&store, &second.key).await, Vec::new());
    assert_eq!(stored(&store, &first.key).await, first);
    assert_eq!(trace(&store, &first.key).await, events);

    let mut replaced = first.clone();
    replaced.state = pending("w3", 99_000);
    let answer = store
        .claim_unless_duplicate(replaced, vec![event(EventKind::Claimed, 3_000, "w3")], 0)
        .await
        .expect("claim_unless_duplicate succeeds");
    assert_eq!(answer, Claimed::Existing(first.clone()));
    assert_eq!(
        trace(&store, &first.key).await,
        events,
        "a lost claim appends nothing"
    );
    let listed = store
        .list(Filter {
            tenant: Some("acme".into()),
            limit: 1000,
            ..Filter::default()
        })
        .await
        .expect("list succeeds");
    assert_eq!(listed, vec![first]);
}

/// Many claims of one request under different keys at once: exactly one inserts, every other
/// names it as the duplicate, and nothing else is stored.
pub async fn concurrent_duplicate_intents_insert_once<S: Store>(store: S) {
    const CLAIMANTS: usize = 24;
    let arguments = json!({"title": "the same request, re-planned", "priority": 3});
    let store = Arc::new(store);
    let start = Arc::new(Barrier::new(CLAIMANTS));
    let mut tasks = JoinSet::new();
    for i in 0..CLAIMANTS {
        let store = Arc::clone(&store);
        let start = Arc::clone(&start);
        let mut r = intent(
            &format!("acme:prod:wf-intent-race:s{i:02}"),
            &arguments,
            1_000,
        );
        r.state = pending(&format!("w{i}"), 31_000);
        tasks.spawn(async move {
            let events = vec![event(EventKind::Claimed, 1_000, &format!("w{i}"))];
            start.wait().await;
            store
                .claim_unless_duplicate(r, events, 0)
                .await
                .expect("claim_unless_duplicate succeeds")
        });
    }
    let mut inserted = Vec::new();
    let mut named = Vec::new();
    while let Some(answer) = tasks.join_next().await {
        match answer.expect("a claimant panicked") {
            Claimed::Inserted(r) => inserted.push(r),
            Claimed::DuplicateIntent(other) => named.push(other),
            Claimed::Existing(r) => panic!("every key is new, yet {} existed", r.key),
        }
    }
    assert_eq!(inserted.len(), 1, "exactly one claim inserts");
    assert_eq!(named.len(), CLAIMANTS - 1);
    let winner = &inserted[0];
    for other in &named {
        assert_eq!(
            other, &winner.key,
            "every other claim names the one inserted"
        );
    }
    let listed = store
        .list(Filter {
            tenant: Some("acme".into()),
            limit: 1000,
            ..Filter::default()
        })
        .await
        .expect("list succeeds");
    assert_eq!(listed, vec![winner.clone()]);
    assert_eq!(trace(&*store, &winner.key).await.len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Retention.

/// A record of `state` with its expiry set, at fence 3.
fn expiring(key_text: &str, state: RecordState, expires_at: Millis, purge_at: Millis) -> Record {
    let mut r = record(key_text, state);
    r.expires_at = expires_at;
    r.purge_at = purge_at;
    r.fence = 3;
    r
}

/// Checks that `from` was compacted by a sweep at `now` into a tombstone of `digest`: the
/// request dropped, expiry and fence kept, an `expired` event appended to its one claimed event.
async fn compacted<S: Store>(store: &S, from: &Record, digest: Digest, now: Millis) {
    let after = stored(store, &from.key).await;
    let mut expected = from.clone();
    expected.state = RecordState::Tombstone(digest);
    expected.request = None;
    // When a compaction counts as an update is the store's business.
    expected.updated_at = after.updated_at;
    assert_eq!(after, expected);
    let events = trace(store, &from.key).await;
    assert_eq!(events.len(), 2, "{}: {events:?}", from.key);
    let expired = &events[1];
    assert_eq!(
        (
            expired.kind,
            expired.at,
            expired.attempt,
            expired.worker.as_str()
        ),
        (EventKind::Expired, now, from.fence, SWEEPER)
    );
}

/// Settled records past `expires_at` become tombstones of what they settled as; tombstones
/// past `purge_at` go with their trace; "past" includes the instant itself; a record compacted
/// by a sweep is purged by a later one at the earliest.
pub async fn sweep_compacts_and_purges<S: Store>(store: S) {
    const NOW: Millis = 10_000;
    let done_record = expiring(
        "acme:prod:wf-sweep:applied",
        applied("ticket-1"),
        9_000,
        50_000,
    );
    let failed = expiring(
        "acme:prod:wf-sweep:failed",
        refused(ErrorCode::DownstreamRejected),
        9_500,
        50_000,
    );
    let boundary = expiring(
        "acme:prod:wf-sweep:boundary",
        applied("ticket-2"),
        NOW,
        50_000,
    );
    let fresh = expiring(
        "acme:prod:wf-sweep:fresh",
        applied("ticket-3"),
        NOW + 1,
        50_000,
    );
    let old = expiring(
        "acme:prod:wf-sweep:old",
        RecordState::Tombstone(Digest::Applied {
            reference: "ticket-0".into(),
        }),
        0,
        9_000,
    );
    let never_ran = expiring(
        "acme:prod:wf-sweep:never-ran",
        RecordState::Tombstone(Digest::NeverRan),
        0,
        NOW,
    );
    let young = expiring(
        "acme:prod:wf-sweep:young",
        RecordState::Tombstone(Digest::Refused {
            code: ErrorCode::ApprovalExpired,
        }),
        0,
        NOW + 1,
    );
    // Both due dates passed: compacted by this sweep, purged only by the next one.
    let both = expiring("acme:prod:wf-sweep:both", applied("ticket-b"), 1_000, 2_000);
    let records = [
        &done_record,
        &failed,
        &boundary,
        &fresh,
        &old,
        &never_ran,
        &young,
        &both,
    ];
    for r in records {
        claim_new(&store, r, vec![event(EventKind::Claimed, 1_000, "w1")]).await;
    }

    assert_eq!(
        store
            .sweep("prod", 8_999, 100)
            .await
            .expect("sweep succeeds"),
        SweepReport {
            compacted: 1,
            purged: 0
        },
        "only `both` is due before 9 000"
    );
    let report = store.sweep("prod", NOW, 100).await.expect("sweep succeeds");
    assert_eq!(
        report,
        SweepReport {
            compacted: 3,
            purged: 3
        },
        "applied, failed and boundary compacted; old, never-ran and both purged"
    );
    compacted(
        &store,
        &done_record,
        Digest::Applied {
            reference: "ticket-1".into(),
        },
        NOW,
    )
    .await;
    compacted(
        &store,
        &failed,
        Digest::Refused {
            code: ErrorCode::DownstreamRejected,
        },
        NOW,
    )
    .await;
    compacted(
        &store,
        &boundary,
        Digest::Applied {
            reference: "ticket-2".into(),
        },
        NOW,
    )
    .await;
    for untouched in [&fresh, &young] {
        assert_eq!(&stored(&store, &untouched.key).await, untouched);
        assert_eq!(trace(&store, &untouched.key).await.len(), 1);
    }
    for gone in [&old, &never_ran, &both] {
        assert_eq!(store.get(&gone.key).await.expect("get succeeds"), None);
        assert_eq!(
            trace(&store, &gone.key).await,
            Vec::new(),
            "a purge takes the trace too"
        );
    }

    let again = store.sweep("prod", NOW, 100).await.expect("sweep succeeds");
    assert_eq!(
        again,
        SweepReport::default(),
        "nothing more is due at {NOW}"
    );

    // Far in the future: `fresh` is compacted, and every other tombstone purged.
    let last = store
        .sweep("prod", 1_000_000, 100)
        .await
        .expect("sweep succeeds");
    assert_eq!(
        last,
        SweepReport {
            compacted: 1,
            purged: 4
        }
    );
    let left = store.list(Filter::default()).await.expect("list succeeds");
    assert_eq!(keys(&left), vec![fresh.key.as_str().to_string()]);
    assert_eq!(left[0].status(), RecordStatus::Tombstone);
    let end = store
        .sweep("prod", 1_000_000, 100)
        .await
        .expect("sweep succeeds");
    assert_eq!(
        end,
        SweepReport {
            compacted: 0,
            purged: 1
        }
    );
}

/// A sweep of one environment leaves every other environment's records alone, even a tenant
/// that bears the environment's name, or an environment it is a prefix of.
pub async fn sweep_is_scoped_by_environment<S: Store>(store: S) {
    let make = |key_text: &str| {
        [
            expiring(&format!("{key_text}:applied"), applied("t"), 100, 50_000),
            expiring(
                &format!("{key_text}:tombstone"),
                RecordState::Tombstone(Digest::NeverRan),
                0,
                100,
            ),
        ]
    };
    let prod = make("acme:prod:wf-scope");
    let staging = make("acme:staging:wf-scope");
    let production = make("acme:production:wf-scope");
    let named = make("prod:staging:wf-scope");
    for r in prod.iter().chain(&staging).chain(&production).chain(&named) {
        claim_new(&store, r, vec![event(EventKind::Claimed, 1_000, "w1")]).await;
    }

    let report = store
        .sweep("prod", 1_000, 100)
        .await
        .expect("sweep succeeds");
    assert_eq!(
        report,
        SweepReport {
            compacted: 1,
            purged: 1
        }
    );
    assert_eq!(
        stored(&store, &prod[0].key).await.status(),
        RecordStatus::Tombstone
    );
    assert_eq!(store.get(&prod[1].key).await.expect("get succeeds"), None);
    for r in staging.iter().chain(&production).chain(&named) {
        assert_eq!(&stored(&store, &r.key).await, r, "{}", r.key);
        assert_eq!(trace(&store, &r.key).await.len(), 1, "{}", r.key);
    }

    let report = store
        .sweep("staging", 1_000, 100)
        .await
        .expect("sweep succeeds");
    assert_eq!(
        report,
        SweepReport {
            compacted: 2,
            purged: 2
        },
        "acme's and the tenant named prod's"
    );
    for r in &production {
        assert_eq!(&stored(&store, &r.key).await, r, "{}", r.key);
    }
    assert_eq!(
        store
            .sweep("nowhere", 1_000, 100)
            .await
            .expect("sweep succeeds"),
        SweepReport::default()
    );
}

/// Records that have not settled — pending (owned, released, a job), awaiting approval,
/// unknown — are never swept, however long past every date they carry.
pub async fn sweep_never_touches_unsettled_records<S: Store>(store: S) {
    let released = RecordState::Pending {
        lease: Lease {
            owner: None,
            expires_at: 0,
        },
        dispatch: Dispatch::NotSent,
    };
    let job = RecordState::Pending {
        lease: Lease {
            owner: Some("w1".into()),
            expires_at: 0,
        },
        dispatch: Dispatch::Job {
            job_id: "job-1".into(),
        },
    };
    let unsettled = [
        expiring("acme:prod:wf-unsettled:owned", pending("w1", 0), 0, 0),
        expiring("acme:prod:wf-unsettled:released", released, 0, 0),
        expiring("acme:prod:wf-unsettled:job", job, 0, 0),
        expiring("acme:prod:wf-unsettled:approval", awaiting(0), 0, 0),
        expiring("acme:prod:wf-unsettled:unknown", unknown(), 0, 0),
    ];
    for r in &unsettled {
        claim_new(&store, r, vec![event(EventKind::Claimed, 1_000, "w1")]).await;
    }
    let report = store
        .sweep("prod", 1_000_000_000, 100)
        .await
        .expect("sweep succeeds");
    assert_eq!(report, SweepReport::default());
    for r in &unsettled {
        assert_eq!(&stored(&store, &r.key).await, r, "{}", r.key);
        assert_eq!(trace(&store, &r.key).await.len(), 1, "{}", r.key);
    }
}

/// A sweep touches at most `limit` records of each kind, the earliest due first (then by
/// key); a limit of 0 touches none.
pub async fn sweep_respects_limit<S: Store>(store: S) {
    for i in 0..3 {
        let r = expiring(
            &format!("acme:prod:wf-limit:applied{i}"),
            applied("t"),
            100 + i,
            50_000,
        );
        claim_new(&store, &r, Vec::new()).await;
    }
    // Two tombstones due at one instant: key order decides.
    for (name, purge_at) in [
        ("tomb0", 300),
        ("tomb1", 299),
        ("tomb2", 298),
        ("tomb3", 298),
    ] {
        let r = expiring(
            &format!("acme:prod:wf-limit:{name}"),
            RecordState::Tombstone(Digest::NeverRan),
            0,
            purge_at,
        );
        claim_new(&store, &r, Vec::new()).await;
    }
    let nothing = store.sweep("prod", 1_000, 0).await.expect("sweep succeeds");
    assert_eq!(
        nothing,
        SweepReport::default(),
        "a limit of 0 sweeps nothing"
    );
    let first = store.sweep("prod", 1_000, 2).await.expect("sweep succeeds");
    assert_eq!(
        first,
        SweepReport {
            compacted: 2,
            purged: 2
        }
    );
    let gone = |name: &str| {
        let store = &store;
        let key = key(&format!("acme:prod:wf-limit:{name}"));
        async move { store.get(&key).await.expect("get succeeds").is_none() }
    };
    assert!(gone("tomb2").await && gone("tomb3").await);
    assert!(!gone("tomb1").await && !gone("tomb0").await);
    let status = |name: &str| {
        let store = &store;
        let key = key(&format!("acme:prod:wf-limit:{name}"));
        async move { stored(store, &key).await.status() }
    };
    assert_eq!(status("applied0").await, RecordStatus::Tombstone);
    assert_eq!(status("applied1").await, RecordStatus::Tombstone);
    assert_eq!(status("applied2").await, RecordStatus::Applied);

    let rest = store.sweep("prod", 1_000, 2).await.expect("sweep succeeds");
    assert_eq!(
        rest,
        SweepReport {
            compacted: 1,
            purged: 2
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Round trips.

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
        awaiting(77_000),
        awaiting(NOT_SETTLED),
        RecordState::Applied(Receipt {
            reference: "ticket_1".into(),
            result: json!({"id": 1, "nested": {"list": [1, "two", null, true]}, "text": "é ✓"}),
        }),
        RecordState::Applied(Receipt {
            reference: "ticket_2".into(),
            result: Value::Null,
        }),
        refused(ErrorCode::DownstreamRejected),
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
        claimed.intent_window = i % 2 == 1;
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

/// A tombstone remembers what it settled as — an effect's reference, a refusal's code, or that
/// nothing ever ran — whether claimed as one, reached by a transition that settles it, or made
/// by a sweep; listings by status return it so.
pub async fn digests_round_trip<S: Store>(store: S) {
    let digests = [
        Digest::Applied {
            reference: "ticket-9".into(),
        },
        Digest::Refused {
            code: ErrorCode::ApprovalExpired,
        },
        Digest::Refused {
            code: ErrorCode::ApprovalDenied,
        },
        Digest::NeverRan,
    ];
    let mut tombstones = Vec::new();
    for (i, digest) in digests.iter().enumerate() {
        let claimed = record(
            &format!("acme:prod:wf-digest:c{i}"),
            RecordState::Tombstone(digest.clone()),
        );
        claim_new(&store, &claimed, Vec::new()).await;
        assert_eq!(stored(&store, &claimed.key).await, claimed);
        tombstones.push(claimed);

        // Straight to a tombstone, as an approval that expired or a released claim that no
        // delivery took up again: the transition settles it and fixes its expiry.
        let start = record(&format!("acme:prod:wf-digest:t{i}"), awaiting(5_000));
        claim_new(&store, &start, Vec::new()).await;
        let mut settle = step(&start, RecordState::Tombstone(digest.clone()), 5_000);
        settle.request = RequestUpdate::Clear;
        settle.expiry = Some(Expiry {
            expires_at: 5_000,
            purge_at: 5_000 + 86_400_000,
        });
        let reached = done(store.transition(settle).await.expect("transition succeeds"));
        assert_eq!(reached.state, RecordState::Tombstone(digest.clone()));
        assert_eq!(reached.effect_reference(), digest.reference());
        assert_eq!(stored(&store, &start.key).await, reached);
        tombstones.push(reached);
    }
    tombstones.sort_by(|a, b| a.key.as_str().cmp(b.key.as_str()));
    let listed = store
        .list(Filter {
            status: Some(RecordStatus::Tombstone),
            limit: 1000,
            ..Filter::default()
        })
        .await
        .expect("list succeeds");
    assert_eq!(listed, tombstones);

    // Made by a sweep: each refusal keeps its own code.
    let settled = [
        (
            applied("ticket-s"),
            Digest::Applied {
                reference: "ticket-s".into(),
            },
        ),
        (
            refused(ErrorCode::DownstreamRejected),
            Digest::Refused {
                code: ErrorCode::DownstreamRejected,
            },
        ),
        (
            refused(ErrorCode::ApprovalDenied),
            Digest::Refused {
                code: ErrorCode::ApprovalDenied,
            },
        ),
    ];
    let mut swept = Vec::new();
    for (i, (state, _)) in settled.iter().enumerate() {
        let r = expiring(
            &format!("acme:prod:wf-digest:s{i}"),
            state.clone(),
            6_000,
            900_000,
        );
        claim_new(&store, &r, vec![event(EventKind::Claimed, 1_000, "w1")]).await;
        swept.push(r);
    }
    let report = store
        .sweep("prod", 6_000, 100)
        .await
        .expect("sweep succeeds");
    assert_eq!(
        report,
        SweepReport {
            compacted: 3,
            purged: 0
        }
    );
    for (r, (_, digest)) in swept.iter().zip(settled) {
        compacted(&store, r, digest, 6_000).await;
    }
}
