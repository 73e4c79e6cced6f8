//! Every transition the executor makes, as one line of data each: the state it leads to, the
//! fence before and after, what the store must still see, the request, the retention clock
//! and the trace entries. Read as a table, it shows the rules of `transitions` at a glance:
//! the fence grows only on a new attempt, only settling starts retention, and no step replaces
//! the claimed request.

use std::path::Path;

use idemgate_core::contract::Contract;
use idemgate_core::outcome::ErrorCode;
use idemgate_core::record::{
    Dispatch, Evidence, Lease, Millis, NOT_SETTLED, Receipt, Record, RecordState, Refusal,
};
use idemgate_core::store::{RequestUpdate, Transition};
use idemgate_core::transitions::{self, At, Hold};
use idemgate_core::{Fingerprint, OperationKey};
use serde_json::json;

const NOW: Millis = 1_700_000_000_000;
const HOUR: Millis = 3_600_000;
const DAY: Millis = 24 * HOUR;
const AT: At<'static> = At {
    now: NOW,
    worker: "w2",
};

fn contract() -> Contract {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contracts/tickets.create.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    Contract::load(&text, "tickets.create.yaml").unwrap()
}

fn record(state: RecordState, fence: u64) -> Record {
    let c = contract();
    Record {
        key: OperationKey::parse("acme:production:run_827:record_issue").unwrap(),
        tool: c.name.clone(),
        tool_version: c.version.clone(),
        fingerprint: Fingerprint::parse(&format!("sha256:{}", "a".repeat(64))).unwrap(),
        canonicalization: idemgate_core::CANONICALIZATION_VERSION,
        state,
        fence,
        actor: "agent-7".into(),
        request: Some(json!({"subject": "Refund"})),
        approved_by: None,
        created_at: NOW - HOUR,
        updated_at: NOW - HOUR,
        expires_at: NOT_SETTLED,
        purge_at: NOT_SETTLED,
        intent_window: false,
    }
}

fn owned(owner: &str, dispatch: Dispatch) -> RecordState {
    RecordState::Pending {
        lease: Lease {
            owner: Some(owner.into()),
            expires_at: NOW - 1,
        },
        dispatch,
    }
}

fn receipt() -> Receipt {
    Receipt {
        reference: "ticket_1".into(),
        result: json!({"id": 1}),
    }
}

fn state(s: &RecordState) -> String {
    let lease = |l: &Lease| {
        let owner = l.owner.as_deref().unwrap_or("-");
        format!("{owner}@{:+}s", (l.expires_at - NOW) / 1000)
    };
    match s {
        RecordState::Pending { lease: l, dispatch } => {
            let d = match dispatch {
                Dispatch::NotSent => "not_sent".to_string(),
                Dispatch::Sent => "sent".to_string(),
                Dispatch::Job { job_id } => format!("job {job_id}"),
            };
            format!("pending({}, {d})", lease(l))
        }
        RecordState::AwaitingApproval { until } => {
            format!("awaiting({:+}h)", (until - NOW) / HOUR)
        }
        RecordState::Applied(r) => format!("applied({})", r.reference),
        RecordState::FailedPermanent(r) => format!("failed({})", r.code.as_str()),
        RecordState::Unknown(e) => format!("unknown({})", e.reason),
        RecordState::Tombstone(d) => format!("tombstone({d:?})"),
    }
}

/// `next | fence a→b | expect status[, lease expired] | request … | expiry … | events …`
fn show(t: &Transition) -> String {
    let request = match &t.request {
        RequestUpdate::Keep => "kept",
        RequestUpdate::Clear => "dropped",
        RequestUpdate::Set(_) => "SET",
    };
    let expiry = match t.expiry {
        None => "-".to_string(),
        Some(e) => format!(
            "+{}h/+{}h",
            (e.expires_at - NOW) / HOUR,
            (e.purge_at - NOW) / HOUR
        ),
    };
    let expect = format!(
        "{}{}{}",
        t.expect.status.as_str(),
        match t.expect.lease_expired_by {
            Some(_) => ", lease expired",
            None => "",
        },
        match t.expect.dispatch {
            Some(d) => format!(", {d}"),
            None => String::new(),
        }
    );
    let events: Vec<&str> = t.events.iter().map(|e| e.kind.as_str()).collect();
    format!(
        "{} | fence {}→{} | expect {expect} | request {request} | expiry {expiry} | events {}",
        state(&t.next),
        t.expect.fence,
        t.fence,
        events.join(",")
    )
}

#[test]
fn every_transition_as_data() {
    let c = contract();
    let mine = record(owned("w2", Dispatch::NotSent), 1);
    let sent = record(owned("w2", Dispatch::Sent), 3);
    let theirs = record(owned("w1", Dispatch::Sent), 3);
    let released = record(
        RecordState::Pending {
            lease: Lease {
                owner: None,
                expires_at: NOW + DAY,
            },
            dispatch: Dispatch::NotSent,
        },
        2,
    );
    let waiting = record(RecordState::AwaitingApproval { until: NOW - 1 }, 1);
    let unknown = record(
        RecordState::Unknown(Evidence {
            reason: "timeout".into(),
            reference: None,
            job_id: None,
        }),
        4,
    );
    let job = record(
        owned(
            "w2",
            Dispatch::Job {
                job_id: "job_7".into(),
            },
        ),
        1,
    );
    let refusal = Refusal {
        code: ErrorCode::DownstreamRejected,
        message: "no".into(),
    };
    let sent_event = || Some(AT.event(idemgate_core::EventKind::Sent, 1));
    let cases: Vec<(&str, Transition, &str)> = vec![
        // The owner's steps: the same attempt.
        (
            "mark_sent",
            transitions::mark_sent(&mine, &c, AT),
            "pending(w2@+30s, sent) | fence 1→1 | expect pending | request kept | expiry - | events sent",
        ),
        (
            "renew",
            transitions::renew(&mine, &c, AT),
            "pending(w2@+30s, not_sent) | fence 1→1 | expect pending | request kept | expiry - | events ",
        ),
        (
            "complete",
            transitions::complete(&mine, &c, receipt(), sent_event(), AT),
            "applied(ticket_1) | fence 1→1 | expect pending | request dropped | expiry +168h/+888h | events sent,committed,acknowledged",
        ),
        (
            "receipt_found",
            transitions::receipt_found(&sent, &c, receipt(), None, AT),
            "applied(ticket_1) | fence 3→3 | expect pending | request dropped | expiry +168h/+888h | events recovered,acknowledged",
        ),
        (
            "job_accepted",
            transitions::job_accepted(&mine, &c, "job_7".into(), None, AT),
            "pending(w2@+30s, job job_7) | fence 1→1 | expect pending | request kept | expiry - | events committed",
        ),
        (
            "refuse",
            transitions::refuse(&mine, &c, refusal.clone(), None, AT),
            "failed(downstream_rejected) | fence 1→1 | expect pending | request dropped | expiry +168h/+888h | events failed",
        ),
        (
            "release",
            transitions::release(&mine, &c, "429", None, AT),
            "pending(-@+86400s, not_sent) | fence 1→1 | expect pending | request kept | expiry - | events released",
        ),
        (
            "defer (own lease)",
            transitions::defer(&sent, NOW + 60_000, "503", None, AT),
            "pending(w2@+60s, sent) | fence 3→3 | expect pending | request kept | expiry - | events in_flight",
        ),
        (
            "defer, from outside",
            transitions::from_outside(
                transitions::defer(&theirs, NOW + 60_000, "lookup down", None, AT),
                &theirs,
                AT,
            ),
            "pending(w2@+60s, sent) | fence 3→3 | expect pending, lease expired, sent | request kept | expiry - | events in_flight",
        ),
        (
            "mark_unknown, from outside",
            transitions::from_outside(
                transitions::mark_unknown(&theirs, "no receipt", None, None, AT),
                &theirs,
                AT,
            ),
            "unknown(no receipt) | fence 3→3 | expect pending, lease expired, sent | request kept | expiry - | events unknown",
        ),
        (
            "mark_unknown",
            transitions::mark_unknown(&sent, "no receipt", None, None, AT),
            "unknown(no receipt) | fence 3→3 | expect pending | request kept | expiry - | events unknown",
        ),
        (
            "next_poll",
            transitions::next_poll(&job, NOW + 10_000, AT),
            "pending(w2@+10s, job job_7) | fence 1→1 | expect pending, lease expired | request kept | expiry - | events ",
        ),
        (
            "job_done",
            transitions::job_done(&job, &c, receipt(), AT),
            "applied(ticket_1) | fence 1→1 | expect pending | request dropped | expiry +168h/+888h | events acknowledged",
        ),
        (
            "job_failed",
            transitions::job_failed(&job, &c, refusal.clone(), AT),
            "failed(downstream_rejected) | fence 1→1 | expect pending | request dropped | expiry +168h/+888h | events failed",
        ),
        // New attempts: the only steps whose fence grows.
        (
            "take_over (expired)",
            transitions::take_over(&theirs, &c, None, AT),
            "pending(w2@+30s, sent) | fence 3→4 | expect pending, lease expired, sent | request kept | expiry - | events recovered",
        ),
        (
            "take_over (released)",
            transitions::take_over(&released, &c, Some(&json!({"other": 1})), AT),
            "pending(w2@+30s, not_sent) | fence 2→3 | expect pending, not_sent | request kept | expiry - | events recovered",
        ),
        (
            "approve",
            transitions::approve(&waiting, &c, "operator-7", AT),
            "pending(w2@+30s, not_sent) | fence 1→2 | expect awaiting_approval | request kept | expiry - | events approved",
        ),
        (
            "resolve_not_applied",
            transitions::resolve_not_applied(&unknown, &c, "operator-7", AT),
            "pending(-@+86400s, not_sent) | fence 4→5 | expect unknown | request kept | expiry - | events reconciled",
        ),
        // Settling what this worker did not send.
        (
            "deny",
            transitions::deny(&waiting, &c, "operator-7", "no", AT),
            "failed(approval_denied) | fence 1→1 | expect awaiting_approval | request dropped | expiry +168h/+888h | events denied",
        ),
        (
            "expire_approval",
            transitions::expire_approval(&waiting, &c, AT),
            "failed(approval_expired) | fence 1→1 | expect awaiting_approval | request dropped | expiry +168h/+888h | events expired",
        ),
        (
            "expire_unsent",
            transitions::expire_unsent(&released, &c, AT),
            "tombstone(NeverRan) | fence 2→2 | expect pending, not_sent | request dropped | expiry +0h/+720h | events expired",
        ),
        (
            "resolve_applied",
            transitions::resolve_applied(&unknown, &c, receipt(), "operator-7", AT),
            "applied(ticket_1) | fence 4→4 | expect unknown | request dropped | expiry +168h/+888h | events reconciled",
        ),
        (
            "reconciled_by_lookup",
            transitions::reconciled_by_lookup(&unknown, &c, receipt(), "operator-7", AT),
            "applied(ticket_1) | fence 4→4 | expect unknown | request dropped | expiry +168h/+888h | events reconciled",
        ),
    ];
    for (name, t, expect) in cases {
        assert_eq!(show(&t), expect, "{name}");
    }
}

#[test]
fn a_released_claim_without_its_request_is_filled_only_when_nothing_was_sent() {
    let c = contract();
    let mut bare = record(
        RecordState::Pending {
            lease: Lease {
                owner: None,
                expires_at: NOW + DAY,
            },
            dispatch: Dispatch::NotSent,
        },
        2,
    );
    bare.request = None;
    let t = transitions::take_over(&bare, &c, Some(&json!({"subject": "x"})), AT);
    assert_eq!(t.request, RequestUpdate::Set(json!({"subject": "x"})));
    let mut maybe = record(owned("w1", Dispatch::Sent), 2);
    maybe.request = None;
    let t = transitions::take_over(&maybe, &c, Some(&json!({"subject": "x"})), AT);
    assert_eq!(
        t.request,
        RequestUpdate::Keep,
        "a maybe-sent claim is never refilled"
    );
}

#[test]
fn new_records_start_unsettled() {
    let c = contract();
    let key = OperationKey::parse("acme:production:run_827:record_issue").unwrap();
    let fp = Fingerprint::parse(&format!("sha256:{}", "b".repeat(64))).unwrap();
    for (hold, expect, entries) in [
        (Hold::No, "pending(w2@+30s, not_sent)", 3),
        (Hold::ForApproval, "awaiting(+24h)", 4),
        (Hold::ForDuplicateIntent(key.clone()), "awaiting(+24h)", 4),
    ] {
        let (r, events) = transitions::new_record(
            &c,
            key.clone(),
            fp.clone(),
            "agent-7",
            &json!({"subject": "Refund"}),
            &hold,
            AT,
        );
        assert_eq!(state(&r.state), expect, "{hold:?}");
        assert_eq!((r.expires_at, r.purge_at), (NOT_SETTLED, NOT_SETTLED));
        assert_eq!((r.fence, r.created_at), (1, NOW));
        assert_eq!(events.len(), entries);
    }
}
