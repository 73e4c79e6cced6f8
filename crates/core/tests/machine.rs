//! The executor's decisions as tables: every branch of `branch`, `plan_recovery`,
//! `after_effect` and `status_outcome`, with records built by one small helper and outcomes
//! shown in one compact line so that each case reads as data.

use std::path::Path;

use idemgate_core::contract::Contract;
use idemgate_core::effect::EffectOutcome;
use idemgate_core::machine::{self, AfterEffect, Bounds, Branch, Miss, Prior, Recovery};
use idemgate_core::outcome::{ErrorCode, Outcome, Status};
use idemgate_core::record::{
    Digest, Dispatch, Evidence, Lease, Millis, Receipt, Record, RecordState, Refusal,
};
use idemgate_core::{Fingerprint, OperationKey, json};
use serde_json::json;

/// The clock reading every case is decided at.
const NOW: Millis = 1_700_000_000_000;

const ARGS: &str = r#"{"queue_id":"support","subject":"Refund request","body":"Customer reports a duplicate charge."}"#;

fn read(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../contracts")
        .join(name);
    std::fs::read_to_string(path).unwrap()
}

fn contract(name: &str) -> Contract {
    Contract::load(&read(name), name).unwrap_or_else(|e| panic!("{e}"))
}

/// `tickets.create` with one line of its YAML replaced.
fn tickets_with(from: &str, to: &str) -> Contract {
    let text = read("tickets.create.yaml");
    assert_eq!(text.matches(from).count(), 1, "{from}");
    Contract::load(&text.replacen(from, to, 1), "tickets.create.yaml")
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `tickets.create` with the given downstream abilities.
fn tickets_downstream(dedup: bool, lookup: bool) -> Contract {
    tickets_with(
        "  deduplicates_by_key: true\n  receipt_lookup: true\n",
        &format!("  deduplicates_by_key: {dedup}\n  receipt_lookup: {lookup}\n"),
    )
}

fn fingerprint_of(c: &Contract, arguments: &str) -> Fingerprint {
    c.fingerprint(&json::parse(arguments.as_bytes()).unwrap())
        .unwrap()
}

fn key() -> OperationKey {
    OperationKey::parse("acme:production:run_827:record_issue").unwrap()
}

/// A record of `ARGS` under `c`, claimed a minute ago, expiring in a day.
fn record(c: &Contract, state: RecordState) -> Record {
    Record {
        key: key(),
        tool: c.name.clone(),
        tool_version: c.version.clone(),
        fingerprint: fingerprint_of(c, ARGS),
        canonicalization: idemgate_core::CANONICALIZATION_VERSION,
        state,
        fence: 1,
        actor: "agent-7".into(),
        request: Some(json::parse(ARGS.as_bytes()).unwrap()),
        approved_by: None,
        created_at: NOW - 60_000,
        updated_at: NOW - 60_000,
        expires_at: NOW + 86_400_000,
        purge_at: NOW + 30 * 86_400_000,
        intent_window: false,
    }
}

fn expired(mut r: Record, ago: Millis) -> Record {
    r.expires_at = NOW - ago;
    r
}

// States in one call each.

fn pending(owner: Option<&str>, lease_ms_left: Millis, dispatch: Dispatch) -> RecordState {
    RecordState::Pending {
        lease: Lease {
            owner: owner.map(str::to_string),
            expires_at: NOW + lease_ms_left,
        },
        dispatch,
    }
}

fn job(id: &str) -> Dispatch {
    Dispatch::Job { job_id: id.into() }
}

fn applied(reference: &str) -> RecordState {
    RecordState::Applied(Receipt {
        reference: reference.into(),
        result: json!({"ticket_id": reference}),
    })
}

fn refusal(code: ErrorCode, message: &str) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

fn unknown(reason: &str, reference: Option<&str>) -> RecordState {
    RecordState::Unknown(Evidence {
        reason: reason.into(),
        reference: reference.map(str::to_string),
        job_id: None,
    })
}

fn tombstone(reference: Option<&str>, refused: Option<ErrorCode>) -> RecordState {
    RecordState::Tombstone(match (reference, refused) {
        (Some(reference), _) => Digest::Applied {
            reference: reference.into(),
        },
        (None, Some(code)) => Digest::Refused { code },
        (None, None) => Digest::NeverRan,
    })
}

fn awaiting(ms_left: Millis) -> RecordState {
    RecordState::AwaitingApproval {
        until: NOW + ms_left,
    }
}

fn snake<T: serde::Serialize>(v: T) -> String {
    serde_json::to_value(v)
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

/// `status [unsafe] [next=..] [retry=..] [ref=..] [code=..] [result=..]`, checking on the way
/// the rules every outcome keeps: the operation key is the record's, and only a rejection may
/// be safe to repeat — `unsafe` marks a rejection that is not (its key may have had an effect).
fn show(o: &Outcome) -> String {
    assert_eq!(o.operation_key.as_ref(), Some(&key()), "{o:?}");
    if o.status != Status::Rejected {
        assert!(!o.safe_to_repeat(), "{o:?}");
    }
    let mut s = snake(o.status);
    if o.status == Status::Rejected && !o.safe_to_repeat() {
        s += " unsafe";
    }
    if snake(o.next_action) != "none" {
        s += &format!(" next={}", snake(o.next_action));
    }
    if let Some(r) = o.retry_after_seconds {
        s += &format!(" retry={r}");
    }
    if let Some(r) = &o.effect_reference {
        s += &format!(" ref={r}");
    }
    if let Some(e) = &o.error {
        s += &format!(" code={}", snake(e.code));
    }
    if let Some(r) = &o.result {
        s += &format!(" result={r}");
    }
    s
}

fn show_branch(b: &Branch) -> String {
    match b {
        Branch::Replay(o) => format!("replay: {}", show(o)),
        Branch::Refuse(o) => format!("refuse: {}", show(o)),
        Branch::Wait(o) => format!("wait: {}", show(o)),
        Branch::PollJob { job_id } => format!("poll_job {job_id}"),
        Branch::Recover => "recover".into(),
        Branch::ExpireApproval => "expire_approval".into(),
        Branch::Unknown(o) => format!("unknown: {}", show(o)),
    }
}

// ---------------------------------------------------------------------------------------------
// branch

fn check(c: &Contract, r: Record, expect: &str) {
    let incoming = fingerprint_of(c, ARGS);
    assert_eq!(
        show_branch(&machine::branch(c, &r, &incoming, NOW)),
        expect,
        "{:?}",
        r.state
    );
}

#[test]
fn branch_table() {
    let t = contract("tickets.create.yaml"); // late arrival: reject
    let e = contract("email.send.yaml"); // late arrival: tombstone
    let rc = tickets_with("late_arrival: reject", "late_arrival: reconcile");
    let applied_1042 = r#"ref=ticket_1042 result={"ticket_id":"ticket_1042"}"#;

    // Applied: replay while the record lives; after expires_at, the late-arrival policy.
    check(
        &t,
        record(&t, applied("ticket_1042")),
        &format!("replay: replayed {applied_1042}"),
    );
    check(
        &t,
        expired(record(&t, applied("ticket_1042")), 0),
        "refuse: rejected unsafe next=inspect_operation ref=ticket_1042 code=expired_operation",
    );
    check(
        &t,
        expired(record(&t, applied("ticket_1042")), 1),
        "refuse: rejected unsafe next=inspect_operation ref=ticket_1042 code=expired_operation",
    );
    check(
        &e,
        expired(record(&e, applied("msg_9")), 1),
        "replay: replayed ref=msg_9 code=expired_operation",
    );
    check(
        &rc,
        expired(record(&rc, applied("ticket_1042")), 1),
        "unknown: unknown next=reconcile ref=ticket_1042 code=expired_operation",
    );

    // A stored refusal is replayed as the same refusal, before and after expiry.
    let refused =
        RecordState::FailedPermanent(refusal(ErrorCode::DownstreamRejected, "queue is closed"));
    check(
        &t,
        record(&t, refused.clone()),
        "refuse: rejected next=inspect_operation code=downstream_rejected",
    );
    check(
        &t,
        expired(record(&t, refused), 1),
        "refuse: rejected next=inspect_operation code=downstream_rejected",
    );
    let denied = RecordState::FailedPermanent(refusal(ErrorCode::ApprovalDenied, "denied by ops"));
    check(
        &t,
        record(&t, denied),
        "refuse: rejected next=ask_for_approval code=approval_denied",
    );

    // Pending with a live lease: wait, told to come back when the lease ends (rounded up).
    check(
        &t,
        record(&t, pending(Some("w1"), 1, Dispatch::NotSent)),
        "wait: in_flight next=poll retry=1",
    );
    check(
        &t,
        record(&t, pending(Some("w1"), 1_000, Dispatch::Sent)),
        "wait: in_flight next=poll retry=1",
    );
    check(
        &t,
        record(&t, pending(Some("w1"), 1_001, Dispatch::Sent)),
        "wait: in_flight next=poll retry=2",
    );
    check(
        &t,
        record(&t, pending(Some("w1"), 30_000, Dispatch::NotSent)),
        "wait: in_flight next=poll retry=30",
    );
    // Expired (at or past its end) or released lease: recovery, never re-execution here.
    check(
        &t,
        record(&t, pending(Some("w1"), 0, Dispatch::NotSent)),
        "recover",
    );
    check(
        &t,
        record(&t, pending(Some("w1"), -5_000, Dispatch::Sent)),
        "recover",
    );
    check(
        &t,
        record(&t, pending(None, 30_000, Dispatch::NotSent)),
        "recover",
    );
    check(&t, record(&t, pending(None, -1, Dispatch::Sent)), "recover");
    // An accepted job is polled, whatever its lease says.
    let r = contract("reports.generate.yaml");
    check(
        &r,
        record(&r, pending(Some("w1"), 30_000, job("job-7"))),
        "poll_job job-7",
    );
    check(
        &r,
        record(&r, pending(Some("w1"), -30_000, job("job-7"))),
        "poll_job job-7",
    );
    check(
        &r,
        record(&r, pending(None, 0, job("job-8"))),
        "poll_job job-8",
    );

    // Awaiting approval: wait, and say that a person is needed; at its deadline, it expires.
    check(
        &t,
        record(&t, awaiting(1)),
        "wait: in_flight next=ask_for_approval retry=30",
    );
    check(&t, record(&t, awaiting(0)), "expire_approval");
    // Unknown: unknown, to reconciliation, with whatever reference is known.
    check(
        &t,
        record(&t, unknown("timeout after dispatch", None)),
        "unknown: unknown next=reconcile code=outcome_unknown",
    );
    check(
        &t,
        record(&t, unknown("malformed answer", Some("ticket_77"))),
        "unknown: unknown next=reconcile ref=ticket_77 code=outcome_unknown",
    );

    // Tombstones follow the contract's late-arrival policy; a compacted refusal stays one, and
    // an operation that never ran is never `replayed`, whatever the policy.
    check(
        &t,
        record(&t, tombstone(Some("ticket_1042"), None)),
        "refuse: rejected unsafe next=inspect_operation ref=ticket_1042 code=expired_operation",
    );
    for c in [&t, &e, &rc] {
        check(
            c,
            record(c, tombstone(None, None)),
            "refuse: rejected next=inspect_operation code=expired_operation",
        );
    }
    check(
        &e,
        record(&e, tombstone(Some("msg_9"), None)),
        "replay: replayed ref=msg_9 code=expired_operation",
    );
    check(
        &rc,
        record(&rc, tombstone(Some("ticket_1042"), None)),
        "unknown: unknown next=reconcile ref=ticket_1042 code=expired_operation",
    );
    for c in [&t, &e, &rc] {
        check(
            c,
            record(c, tombstone(None, Some(ErrorCode::DownstreamRejected))),
            "refuse: rejected next=inspect_operation code=downstream_rejected",
        );
    }
}

#[test]
fn a_fingerprint_mismatch_is_decided_before_any_state() {
    let t = contract("tickets.create.yaml");
    let other = fingerprint_of(
        &t,
        r#"{"queue_id":"support","subject":"Refund request","body":"A different body."}"#,
    );
    // Each state, and whether its key may already have had an effect (then the mismatch is
    // not safe to repeat).
    let states = [
        (applied("ticket_1042"), true),
        (
            RecordState::FailedPermanent(refusal(ErrorCode::DownstreamRejected, "no")),
            false,
        ),
        (pending(Some("w1"), 30_000, Dispatch::NotSent), true),
        (pending(None, 30_000, Dispatch::NotSent), false),
        (pending(Some("w1"), -1, Dispatch::Sent), true),
        (pending(Some("w1"), 30_000, job("job-7")), true),
        (awaiting(30_000), false),
        (unknown("timeout", None), true),
        (tombstone(Some("ticket_1042"), None), true),
        (tombstone(None, Some(ErrorCode::ApprovalExpired)), false),
        (tombstone(None, None), false),
    ];
    for (state, effect_possible) in states {
        for r in [record(&t, state.clone()), expired(record(&t, state), 1)] {
            let b = machine::branch(&t, &r, &other, NOW);
            let unsafe_ = if effect_possible { " unsafe" } else { "" };
            assert_eq!(
                show_branch(&b),
                format!(
                    "refuse: rejected{unsafe_} next=inspect_operation code=idempotency_key_reused_with_different_request"
                ),
                "{:?}",
                r.state
            );
            // The message names both fingerprints and nothing of the request.
            let Branch::Refuse(o) = b else { unreachable!() };
            let message = o.error.unwrap().message;
            assert!(
                message.contains(r.fingerprint.as_str()) && message.contains(other.as_str()),
                "{message}"
            );
            assert!(
                !message.contains("body") && !message.contains("Refund"),
                "{message}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// plan_recovery

fn show_recovery(r: &Recovery) -> &'static str {
    match r {
        Recovery::Execute => "execute",
        Recovery::Lookup {
            on_miss: Miss::Resend,
        } => "lookup/resend",
        Recovery::Lookup {
            on_miss: Miss::Unknown,
        } => "lookup/unknown",
        Recovery::Resend => "resend",
        Recovery::Expire => "expire",
        Recovery::GiveUp(_) => "give_up",
    }
}

/// Within every bound: attempts left, the retry window open.
const BOUNDS: Bounds = Bounds {
    max_attempts: 8,
    now: NOW,
};

/// One row per contract shape and record version; the six columns are the pending records
/// (NotSent, owned) (NotSent, released) (Sent, owned) (Sent, released) (Job, owned) (Job, released).
fn check_recovery(dedup: bool, lookup: bool, older: bool, expect: [&str; 6]) {
    let c = tickets_downstream(dedup, lookup);
    let states = [
        pending(Some("w1"), -1, Dispatch::NotSent),
        pending(None, -1, Dispatch::NotSent),
        pending(Some("w1"), -1, Dispatch::Sent),
        pending(None, -1, Dispatch::Sent),
        pending(Some("w1"), -1, job("job-7")),
        pending(None, -1, job("job-7")),
    ];
    let got = states.map(|s| {
        let mut r = record(&c, s);
        if older {
            r.tool_version = "2026-01-01".into();
        }
        show_recovery(&machine::plan_recovery(&c, &r, BOUNDS))
    });
    assert_eq!(got, expect, "dedup={dedup} lookup={lookup} older={older}");
}

#[test]
fn recovery_table() {
    //            dedup  lookup older   NotSent/owned   NotSent/released Sent/owned        Sent/released     Job/owned         Job/released
    // No dedup: the dispatch marker is kept, so NotSent proves that nothing left.
    check_recovery(
        false,
        false,
        false,
        [
            "execute", "execute", "give_up", "give_up", "give_up", "give_up",
        ],
    );
    check_recovery(
        false,
        true,
        false,
        [
            "execute",
            "execute",
            "lookup/unknown",
            "lookup/unknown",
            "lookup/unknown",
            "lookup/unknown",
        ],
    );
    // Dedup: no marker, so NotSent proves nothing unless the claim was released; a resend is safe.
    check_recovery(
        true,
        false,
        false,
        ["resend", "execute", "resend", "resend", "resend", "resend"],
    );
    check_recovery(
        true,
        true,
        false,
        [
            "lookup/resend",
            "execute",
            "lookup/resend",
            "lookup/resend",
            "lookup/resend",
            "lookup/resend",
        ],
    );
    // Claimed under an older version: only a receipt or an operator settles it.
    check_recovery(false, false, true, ["give_up"; 6]);
    check_recovery(false, true, true, ["lookup/unknown"; 6]);
    check_recovery(true, false, true, ["give_up"; 6]);
    check_recovery(true, true, true, ["lookup/unknown"; 6]);
}

#[test]
fn recovery_is_bounded() {
    let plan = |c: &Contract, state: RecordState, fence: u64, age: Millis| {
        let mut r = record(c, state);
        r.fence = fence;
        r.created_at = NOW - age;
        show_recovery(&machine::plan_recovery(c, &r, BOUNDS))
    };
    let day = 86_400_000;
    let both = tickets_downstream(true, true);
    let dedup = tickets_downstream(true, false);
    let marker = tickets_downstream(false, true);
    let sent = || pending(Some("w1"), -1, Dispatch::Sent);
    let unsent = || pending(Some("w1"), -1, Dispatch::NotSent);
    // Attempts left and the window open: the ordinary plans.
    assert_eq!(plan(&both, sent(), 7, 1), "lookup/resend");
    assert_eq!(plan(&dedup, sent(), 7, 1), "resend");
    // Out of attempts: no more resends; a lookup may still settle it.
    assert_eq!(plan(&both, sent(), 8, 1), "lookup/unknown");
    assert_eq!(plan(&dedup, sent(), 8, 1), "give_up");
    // Past the retry window (max_retry_window is 1d): no lookup, no resend, nothing sent.
    assert_eq!(plan(&both, sent(), 2, day), "give_up");
    assert_eq!(plan(&dedup, sent(), 2, day), "give_up");
    assert_eq!(plan(&marker, unsent(), 1, day), "expire");
    assert_eq!(
        plan(&marker, pending(None, 1, Dispatch::NotSent), 1, day),
        "expire"
    );
    assert_eq!(plan(&marker, unsent(), 1, day - 1), "execute");
    // An approved record's window starts after its approval window.
    let mut r = record(&marker, unsent());
    r.created_at = NOW - day;
    r.approved_by = Some("operator-7".into());
    assert_eq!(
        show_recovery(&machine::plan_recovery(&marker, &r, BOUNDS)),
        "execute"
    );
}

#[test]
fn recovery_of_a_settled_record_gives_up() {
    let t = contract("tickets.create.yaml");
    for (state, status) in [
        (applied("ticket_1042"), "applied"),
        (
            RecordState::FailedPermanent(refusal(ErrorCode::DownstreamRejected, "no")),
            "failed_permanent",
        ),
        (awaiting(1), "awaiting_approval"),
        (unknown("timeout", None), "unknown"),
        (tombstone(None, None), "tombstone"),
    ] {
        let plan = machine::plan_recovery(&t, &record(&t, state), BOUNDS);
        assert_eq!(
            plan,
            Recovery::GiveUp(format!("record is {status}, not pending"))
        );
    }
}

#[test]
fn giving_up_says_why() {
    let c = tickets_downstream(false, false);
    let r = record(&c, pending(Some("w1"), -1, Dispatch::Sent));
    let Recovery::GiveUp(why) = machine::plan_recovery(&c, &r, BOUNDS) else {
        panic!()
    };
    assert!(
        why.contains("neither deduplicates on the key nor offers a receipt lookup"),
        "{why}"
    );
    let mut r = record(&c, pending(Some("w1"), -1, Dispatch::Sent));
    r.tool_version = "2026-01-01".into();
    let Recovery::GiveUp(why) = machine::plan_recovery(&c, &r, BOUNDS) else {
        panic!()
    };
    assert_eq!(
        why,
        "claimed under version 2026-01-01 and the contract is now 2026-08-18; an operator must reconcile"
    );
}

// ---------------------------------------------------------------------------------------------
// after_effect

fn show_after(a: &AfterEffect) -> String {
    match a {
        AfterEffect::Apply(r) => format!("apply {} {}", r.reference, r.result),
        AfterEffect::Job(id) => format!("job {id}"),
        AfterEffect::Refuse(r) => format!("refuse {} {}", snake(r.code), r.message),
        AfterEffect::Release {
            code,
            reason,
            retry_after,
        } => {
            format!("release {} {reason} retry={retry_after:?}", snake(code))
        }
        AfterEffect::Ambiguous {
            reason,
            retry_after,
        } => format!("ambiguous {reason} retry={retry_after:?}"),
        AfterEffect::Unproven(why) => format!("unproven {why}"),
    }
}

#[test]
fn after_effect_table() {
    let t = contract("tickets.create.yaml"); // no async jobs
    let r = contract("reports.generate.yaml"); // async jobs
    let check = |c: &Contract, outcome: EffectOutcome, expect: &str| {
        assert_eq!(
            show_after(&machine::after_effect(c, outcome.clone(), Prior::Clean)),
            expect,
            "{outcome:?}"
        );
    };
    let committed = |reference: &str| {
        EffectOutcome::Committed(Receipt {
            reference: reference.into(),
            result: json!({"id": 1}),
        })
    };
    check(
        &t,
        committed("ticket_1042"),
        r#"apply ticket_1042 {"id":1}"#,
    );
    check(
        &t,
        committed(""),
        "ambiguous the downstream answered without an effect reference retry=None",
    );
    check(
        &r,
        EffectOutcome::Accepted {
            job_id: "job-7".into(),
        },
        "job job-7",
    );
    check(
        &r,
        EffectOutcome::Accepted {
            job_id: String::new(),
        },
        "ambiguous the downstream accepted a job the contract does not declare retry=None",
    );
    check(
        &t,
        EffectOutcome::Accepted {
            job_id: "job-7".into(),
        },
        "ambiguous the downstream accepted a job the contract does not declare retry=None",
    );
    check(
        &t,
        EffectOutcome::Refused(refusal(ErrorCode::DownstreamRejected, "queue closed")),
        "refuse downstream_rejected queue closed",
    );
    check(
        &t,
        EffectOutcome::PreconditionFailed("version 4 is now 5".into()),
        "release precondition_failed version 4 is now 5 retry=None",
    );
    check(
        &t,
        EffectOutcome::NotSent {
            reason: "connection refused".into(),
            retry_after: Some(5),
        },
        "release downstream_unavailable connection refused retry=Some(5)",
    );
    check(
        &t,
        EffectOutcome::NotSent {
            reason: "429".into(),
            retry_after: None,
        },
        "release downstream_unavailable 429 retry=None",
    );
    check(
        &t,
        EffectOutcome::ambiguous("timeout after 10s"),
        "ambiguous timeout after 10s retry=None",
    );
    check(
        &r,
        EffectOutcome::Ambiguous {
            reason: "503".into(),
            retry_after: Some(30),
        },
        "ambiguous 503 retry=Some(30)",
    );
}

#[test]
fn after_an_ambiguous_attempt_no_refusal_proves_anything() {
    // The answer to a resend (or to a takeover of a maybe-sent claim) cannot prove that the
    // earlier attempt did not commit: refusals need a receipt, "not processed" stays ambiguous.
    let t = contract("tickets.create.yaml");
    let check = |outcome: EffectOutcome, expect: &str| {
        assert_eq!(
            show_after(&machine::after_effect(
                &t,
                outcome.clone(),
                Prior::MaybeSent
            )),
            expect,
            "{outcome:?}"
        );
    };
    check(
        EffectOutcome::Committed(Receipt {
            reference: "ticket_1042".into(),
            result: json!({}),
        }),
        "apply ticket_1042 {}",
    );
    check(
        EffectOutcome::Refused(refusal(ErrorCode::DownstreamRejected, "409 key in use")),
        "unproven an earlier attempt may have committed, and the resend was refused (downstream_rejected): 409 key in use",
    );
    check(
        EffectOutcome::PreconditionFailed("412".into()),
        "unproven an earlier attempt may have committed, and the resend's precondition failed: 412",
    );
    check(
        EffectOutcome::NotSent {
            reason: "429".into(),
            retry_after: Some(7),
        },
        "ambiguous an earlier attempt may have committed; the resend was not processed: 429 retry=Some(7)",
    );
}

// ---------------------------------------------------------------------------------------------
// status_outcome

#[test]
fn status_outcome_table() {
    let t = contract("tickets.create.yaml");
    let e = contract("email.send.yaml");
    let rc = tickets_with("late_arrival: reject", "late_arrival: reconcile");
    let check = |c: Option<&Contract>, r: Record, expect: &str| {
        assert_eq!(
            show(&machine::status_outcome(c, &r, NOW)),
            expect,
            "{:?}",
            r.state
        );
    };
    let s = Some(&t);
    check(
        s,
        record(&t, applied("ticket_1042")),
        r#"replayed ref=ticket_1042 result={"ticket_id":"ticket_1042"}"#,
    );
    check(
        None,
        record(&t, applied("ticket_1042")),
        r#"replayed ref=ticket_1042 result={"ticket_id":"ticket_1042"}"#,
    );
    check(
        s,
        record(
            &t,
            RecordState::FailedPermanent(refusal(ErrorCode::DownstreamRejected, "no")),
        ),
        "rejected next=inspect_operation code=downstream_rejected",
    );
    // Pending: poll no sooner than the lease ends, and never more often than every 2 seconds.
    check(
        s,
        record(&t, pending(Some("w1"), 10_000, Dispatch::Sent)),
        "in_flight next=poll retry=10",
    );
    check(
        s,
        record(&t, pending(Some("w1"), 9_001, Dispatch::Sent)),
        "in_flight next=poll retry=10",
    );
    check(
        s,
        record(&t, pending(Some("w1"), 500, Dispatch::NotSent)),
        "in_flight next=poll retry=2",
    );
    check(
        s,
        record(&t, pending(Some("w1"), -60_000, Dispatch::Sent)),
        "in_flight next=poll retry=2",
    );
    check(
        s,
        record(&t, pending(Some("w1"), 30_000, job("job-7"))),
        "in_flight next=poll retry=2",
    );
    // A released claim waits for a new delivery, not for time.
    check(
        s,
        record(&t, pending(None, 86_400_000, Dispatch::NotSent)),
        "in_flight next=poll retry=1",
    );
    check(
        s,
        record(&t, awaiting(1)),
        "in_flight next=ask_for_approval retry=30",
    );
    check(s, record(&t, awaiting(0)), "rejected code=approval_expired");
    check(
        s,
        record(&t, unknown("timeout", Some("ticket_5"))),
        "unknown next=reconcile ref=ticket_5 code=outcome_unknown",
    );
    check(
        s,
        record(&t, tombstone(Some("ticket_1042"), None)),
        "rejected unsafe next=inspect_operation ref=ticket_1042 code=expired_operation",
    );
    check(
        Some(&e),
        record(&e, tombstone(None, None)),
        "rejected next=inspect_operation code=expired_operation",
    );
    check(
        Some(&e),
        record(&e, tombstone(Some("msg_9"), None)),
        "replayed ref=msg_9 code=expired_operation",
    );
    check(
        Some(&rc),
        record(&rc, tombstone(Some("ticket_1042"), None)),
        "unknown next=reconcile ref=ticket_1042 code=expired_operation",
    );
    check(
        s,
        record(&t, tombstone(None, Some(ErrorCode::ApprovalDenied))),
        "rejected next=ask_for_approval code=approval_denied",
    );
    // Without the contract (a tool no longer loaded), a tombstone is an expired operation.
    check(
        None,
        record(&t, tombstone(Some("ticket_1042"), None)),
        "rejected unsafe next=inspect_operation ref=ticket_1042 code=expired_operation",
    );
    check(
        None,
        record(&t, tombstone(None, None)),
        "rejected next=inspect_operation code=expired_operation",
    );
}
