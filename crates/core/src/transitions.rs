//! Every transition the executor makes, built here as data: the next state, the fence, the
//! expectation the store compares, the trace entries, and the retention clock.
//!
//! The engine never assembles a [`Transition`] itself. That keeps three rules in one place:
//!
//! - **The fence grows in one function**, [`new_attempt`]: a takeover, an approval and an
//!   operator's `not_applied` start a new attempt; every other step keeps the attempt it
//!   continues, so a late finisher of an older attempt can never match.
//! - **Retention counts from settlement.** Every transition into a settled state sets
//!   `expires_at` and `purge_at` from its own `now` and the contract's retention; nothing else
//!   does, and an unsettled record carries [`NOT_SETTLED`].
//! - **The request sent is the request claimed.** No step replaces the stored request with a
//!   later delivery's arguments; only a takeover of a claim that never sent anything and kept no
//!   request may fill it.

use serde_json::Value;

use crate::CANONICALIZATION_VERSION;
use crate::contract::Contract;
use crate::fingerprint::Fingerprint;
use crate::key::OperationKey;
use crate::outcome::ErrorCode;
use crate::record::{
    Digest, Dispatch, Event, EventKind, Evidence, Lease, Millis, NOT_SETTLED, Receipt, Record,
    RecordState, Refusal,
};
use crate::store::{Expect, Expiry, RequestUpdate, Transition};

/// When and by whom a transition is made.
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    pub now: Millis,
    pub worker: &'a str,
}

impl At<'_> {
    pub fn event(&self, kind: EventKind, attempt: u64) -> Event {
        Event::new(kind, self.now, attempt, self.worker)
    }

    /// A lease of `contract`'s length owned by this worker.
    pub fn lease(&self, contract: &Contract) -> Lease {
        self.lease_until(self.now.saturating_add(contract.lease.millis()))
    }

    pub fn lease_until(&self, until: Millis) -> Lease {
        Lease {
            owner: Some(self.worker.to_string()),
            expires_at: until,
        }
    }
}

/// The retention of a record settled at `now` (see the module's rules).
pub fn settled_at(contract: &Contract, now: Millis) -> Expiry {
    let expires_at = now.saturating_add(contract.retention.record_ttl.millis());
    Expiry {
        expires_at,
        purge_at: expires_at.saturating_add(contract.retention.tombstone_ttl.millis()),
    }
}

/// How a new record starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Claimed by this worker, to perform the effect now.
    No,
    /// Held for an operator's approval (the contract's approval rule).
    ForApproval,
    /// Held for an operator: the same request ran under `other` within the contract's
    /// duplicate-intent window.
    ForDuplicateIntent(OperationKey),
}

/// What a delivery claims: the new record and the first entries of its trace.
#[allow(clippy::too_many_arguments)]
pub fn new_record(
    contract: &Contract,
    key: OperationKey,
    fingerprint: Fingerprint,
    actor: &str,
    arguments: &Value,
    hold: &Hold,
    at: At<'_>,
) -> (Record, Vec<Event>) {
    let until = at.now.saturating_add(contract.approval_window().millis());
    let state = match hold {
        Hold::No => RecordState::Pending {
            lease: at.lease(contract),
            dispatch: Dispatch::NotSent,
        },
        Hold::ForApproval | Hold::ForDuplicateIntent(_) => RecordState::AwaitingApproval { until },
    };
    let mut events = vec![
        at.event(EventKind::Proposed, 1),
        at.event(EventKind::Validated, 1)
            .with_detail(fingerprint.as_str()),
        at.event(EventKind::Claimed, 1),
    ];
    match hold {
        Hold::No => {}
        Hold::ForApproval => events.push(at.event(EventKind::AwaitingApproval, 1)),
        Hold::ForDuplicateIntent(other) => events.push(
            at.event(EventKind::AwaitingApproval, 1)
                .with_detail(format!("possible duplicate intent of {other}")),
        ),
    }
    let record = Record {
        key,
        tool: contract.name.clone(),
        tool_version: contract.version.clone(),
        fingerprint,
        canonicalization: CANONICALIZATION_VERSION,
        state,
        fence: 1,
        actor: actor.to_string(),
        request: Some(arguments.clone()),
        approved_by: None,
        created_at: at.now,
        updated_at: at.now,
        expires_at: NOT_SETTLED,
        purge_at: NOT_SETTLED,
        intent_window: contract.duplicate_intent_window().is_some(),
    };
    (record, events)
}

/// A step within the record's current attempt.
fn same_attempt(
    record: &Record,
    next: RecordState,
    request: RequestUpdate,
    events: Vec<Event>,
    at: At<'_>,
) -> Transition {
    Transition {
        key: record.key.clone(),
        expect: Expect {
            fence: record.fence,
            status: record.status(),
            created_at: record.created_at,
            lease_expired_by: None,
            dispatch: None,
        },
        next,
        fence: record.fence,
        request,
        approved_by: None,
        fingerprint: None,
        expiry: None,
        events,
        now: at.now,
        webhook: None,
        audit: None,
    }
}

/// A new record of a tool that writes the dispatch marker, claimed with the marker in it: the
/// claim and the note that dispatch is starting are one durable write, made just before the
/// first byte leaves, as the marker alone was. A crash before that write leaves no record (a
/// later delivery runs it); after it, the record is maybe sent, as after the marker. What goes
/// is only the state in between, claimed and not yet marked, which no fresh claim needs: nothing
/// that could stop the send happens between the two writes.
pub fn claimed_as_sent(
    mut record: Record,
    mut events: Vec<Event>,
    at: At<'_>,
) -> (Record, Vec<Event>) {
    debug_assert!(
        matches!(record.state, RecordState::Pending { .. }),
        "only a claim sent at once is claimed as sent"
    );
    if let RecordState::Pending { dispatch, .. } = &mut record.state {
        *dispatch = Dispatch::Sent;
    }
    events.push(at.event(EventKind::Sent, record.fence));
    (record, events)
}

/// A new attempt: the only place the fencing token grows. An owned lease must have expired by
/// `now`, so that a renewal by a live owner that raced this step wins.
fn new_attempt(record: &Record, next: RecordState, events: Vec<Event>, at: At<'_>) -> Transition {
    let lease_expired_by = match &record.state {
        RecordState::Pending { lease, .. } if lease.owner.is_some() => Some(at.now),
        RecordState::Pending { .. }
        | RecordState::AwaitingApproval { .. }
        | RecordState::Applied(_)
        | RecordState::FailedPermanent(_)
        | RecordState::Unknown(_)
        | RecordState::Tombstone(_) => None,
    };
    Transition {
        key: record.key.clone(),
        expect: Expect {
            fence: record.fence,
            status: record.status(),
            created_at: record.created_at,
            lease_expired_by,
            // A new attempt is planned from the dispatch it read: a marker written since wins.
            dispatch: record.pending_dispatch().map(Dispatch::tag),
        },
        next,
        fence: record.fence + 1,
        request: RequestUpdate::Keep,
        approved_by: None,
        fingerprint: None,
        expiry: None,
        events,
        now: at.now,
        webhook: None,
        audit: None,
    }
}

/// A settling step: the record leaves the states an effect may still come from, its request is
/// dropped, and its retention starts now.
fn settle(
    record: &Record,
    contract: &Contract,
    next: RecordState,
    events: Vec<Event>,
    at: At<'_>,
) -> Transition {
    let mut t = same_attempt(record, next, RequestUpdate::Clear, events, at);
    t.expiry = Some(settled_at(contract, at.now));
    t
}

fn with(sent: Option<Event>, rest: impl IntoIterator<Item = Event>) -> Vec<Event> {
    sent.into_iter().chain(rest).collect()
}

fn dispatch_of(record: &Record) -> Dispatch {
    match &record.state {
        RecordState::Pending { dispatch, .. } => dispatch.clone(),
        RecordState::AwaitingApproval { .. }
        | RecordState::Applied(_)
        | RecordState::FailedPermanent(_)
        | RecordState::Unknown(_)
        | RecordState::Tombstone(_) => Dispatch::NotSent,
    }
}

fn job_of(record: &Record) -> Option<String> {
    record.job_id().map(str::to_owned)
}

// ---------------------------------------------------------------------------------------------
// The owner's steps.

/// Guards a step made on a pending record by somebody who does not hold its claim (the
/// recoverer, another delivery, a poll) from the record as it was read: the dispatch must be
/// unchanged — so a marker the owner wrote since wins, and "maybe sent" is never settled as
/// "never sent" — and a worker's lease on a record not yet sent or maybe sent must have
/// expired by `now`, so a renewal (or a marker) since wins. A job's lease is its next poll, not
/// an owner's, so only the dispatch is compared.
pub fn from_outside(mut t: Transition, record: &Record, at: At<'_>) -> Transition {
    if let RecordState::Pending { lease, dispatch } = &record.state {
        t.expect.dispatch = Some(dispatch.tag());
        match dispatch {
            Dispatch::NotSent | Dispatch::Sent if lease.owner.is_some() => {
                t.expect.lease_expired_by = Some(at.now);
            }
            Dispatch::NotSent | Dispatch::Sent | Dispatch::Job { .. } => {}
        }
    }
    t
}

/// The dispatch marker: durable before the first byte leaves. It renews the lease too, so a
/// takeover planned from the record as it was before the marker (its lease about to expire)
/// cannot match it any more.
pub fn mark_sent(record: &Record, contract: &Contract, at: At<'_>) -> Transition {
    same_attempt(
        record,
        RecordState::Pending {
            lease: at.lease(contract),
            dispatch: Dispatch::Sent,
        },
        RequestUpdate::Keep,
        vec![at.event(EventKind::Sent, record.fence)],
        at,
    )
}

/// A lease renewal while the effect runs.
pub fn renew(record: &Record, contract: &Contract, at: At<'_>) -> Transition {
    same_attempt(
        record,
        RecordState::Pending {
            lease: at.lease(contract),
            dispatch: dispatch_of(record),
        },
        RequestUpdate::Keep,
        Vec::new(),
        at,
    )
}

/// The downstream committed: the receipt and the replay-safe result.
pub fn complete(
    record: &Record,
    contract: &Contract,
    receipt: Receipt,
    sent: Option<Event>,
    at: At<'_>,
) -> Transition {
    let fence = record.fence;
    let events = with(
        sent,
        [
            at.event(EventKind::Committed, fence)
                .with_detail(receipt.reference.clone()),
            at.event(EventKind::Acknowledged, fence),
        ],
    );
    settle(record, contract, RecordState::Applied(receipt), events, at)
}

/// A receipt found by key after an ambiguous attempt or an abandoned claim.
pub fn receipt_found(
    record: &Record,
    contract: &Contract,
    receipt: Receipt,
    sent: Option<Event>,
    at: At<'_>,
) -> Transition {
    let fence = record.fence;
    let events = with(
        sent,
        [
            at.event(EventKind::Recovered, fence)
                .with_detail("receipt found by key"),
            at.event(EventKind::Acknowledged, fence)
                .with_detail(receipt.reference.clone()),
        ],
    );
    settle(record, contract, RecordState::Applied(receipt), events, at)
}

/// The downstream accepted an asynchronous job: pending with its id; the lease is the time of
/// the next poll.
pub fn job_accepted(
    record: &Record,
    contract: &Contract,
    job_id: String,
    sent: Option<Event>,
    at: At<'_>,
) -> Transition {
    let events = with(
        sent,
        [at.event(EventKind::Committed, record.fence)
            .with_detail(format!("job {job_id} accepted"))],
    );
    same_attempt(
        record,
        RecordState::Pending {
            lease: at.lease(contract),
            dispatch: Dispatch::Job { job_id },
        },
        RequestUpdate::Keep,
        events,
        at,
    )
}

/// A deterministic refusal on a clean attempt: nothing happened.
pub fn refuse(
    record: &Record,
    contract: &Contract,
    refusal: Refusal,
    sent: Option<Event>,
    at: At<'_>,
) -> Transition {
    let events = with(
        sent,
        [at.event(EventKind::Failed, record.fence)
            .with_detail(refusal.code.as_str())],
    );
    settle(
        record,
        contract,
        RecordState::FailedPermanent(refusal),
        events,
        at,
    )
}

/// Provably nothing was sent: no owner, nothing sent. Only a new delivery runs it again; past
/// `max_retry_window` it expires as never run.
pub fn release(
    record: &Record,
    contract: &Contract,
    reason: &str,
    sent: Option<Event>,
    at: At<'_>,
) -> Transition {
    let events = with(
        sent,
        [at.event(EventKind::Released, record.fence)
            .with_detail(reason.to_string())],
    );
    same_attempt(
        record,
        RecordState::Pending {
            lease: Lease {
                owner: None,
                expires_at: at
                    .now
                    .saturating_add(contract.retention.max_retry_window.millis()),
            },
            dispatch: Dispatch::NotSent,
        },
        RequestUpdate::Keep,
        events,
        at,
    )
}

/// Still ambiguous: left to the recoverer, which looks again at `until` (a backoff, or the
/// downstream's `Retry-After`). Maybe sent, so only a receipt or a deduplicated resend may
/// settle it. Made by the claim's holder; from outside, wrap it in [`from_outside`].
pub fn defer(
    record: &Record,
    until: Millis,
    reason: &str,
    sent: Option<Event>,
    at: At<'_>,
) -> Transition {
    let dispatch = match dispatch_of(record) {
        Dispatch::NotSent | Dispatch::Sent => Dispatch::Sent,
        job @ Dispatch::Job { .. } => job,
    };
    same_attempt(
        record,
        RecordState::Pending {
            lease: at.lease_until(until),
            dispatch,
        },
        RequestUpdate::Keep,
        with(
            sent,
            [at.event(EventKind::InFlight, record.fence)
                .with_detail(format!("left to recovery: {reason}"))],
        ),
        at,
    )
}

/// The outcome cannot be proved: `unknown`, to reconciliation. The request is kept for an
/// operator.
pub fn mark_unknown(
    record: &Record,
    reason: &str,
    reference: Option<String>,
    sent: Option<Event>,
    at: At<'_>,
) -> Transition {
    let evidence = Evidence {
        reason: reason.to_string(),
        reference,
        job_id: job_of(record),
    };
    same_attempt(
        record,
        RecordState::Unknown(evidence),
        RequestUpdate::Keep,
        with(
            sent,
            [at.event(EventKind::Unknown, record.fence)
                .with_detail(reason.to_string())],
        ),
        at,
    )
}

// ---------------------------------------------------------------------------------------------
// New attempts.

/// Takes over an expired or released claim: a new attempt under this worker, with the
/// dispatch as it was and the request as claimed. `fill` is used only where the record kept no
/// request and nothing was ever sent.
pub fn take_over(
    record: &Record,
    contract: &Contract,
    fill: Option<&Value>,
    at: At<'_>,
) -> Transition {
    let mut t = new_attempt(
        record,
        RecordState::Pending {
            lease: at.lease(contract),
            dispatch: dispatch_of(record),
        },
        vec![
            at.event(EventKind::Recovered, record.fence + 1)
                .with_detail(format!("took over attempt {}", record.fence)),
        ],
        at,
    );
    if let (None, Some(arguments), Dispatch::NotSent) = (&record.request, fill, dispatch_of(record))
    {
        t.request = RequestUpdate::Set(arguments.clone());
    }
    t
}

/// An operator approves: a new attempt, claimed by this worker, nothing sent yet.
pub fn approve(record: &Record, contract: &Contract, approver: &str, at: At<'_>) -> Transition {
    let mut t = new_attempt(
        record,
        RecordState::Pending {
            lease: at.lease(contract),
            dispatch: Dispatch::NotSent,
        },
        vec![
            at.event(EventKind::Approved, record.fence + 1)
                .with_detail(format!("by {approver}")),
        ],
        at,
    );
    t.approved_by = Some(approver.to_string());
    t
}

/// An operator resolves `not_applied`: the key may run again, by a new delivery only.
pub fn resolve_not_applied(
    record: &Record,
    contract: &Contract,
    actor: &str,
    at: At<'_>,
) -> Transition {
    new_attempt(
        record,
        RecordState::Pending {
            lease: Lease {
                owner: None,
                expires_at: at
                    .now
                    .saturating_add(contract.retention.max_retry_window.millis()),
            },
            dispatch: Dispatch::NotSent,
        },
        vec![
            at.event(EventKind::Reconciled, record.fence + 1)
                .with_detail(format!("not applied, by {actor}")),
        ],
        at,
    )
}

// ---------------------------------------------------------------------------------------------
// Settling without an effect of this worker's.

/// An operator denies an approval: a refusal every later delivery replays.
pub fn deny(
    record: &Record,
    contract: &Contract,
    approver: &str,
    reason: &str,
    at: At<'_>,
) -> Transition {
    let refusal = Refusal {
        code: ErrorCode::ApprovalDenied,
        message: format!("denied by an operator: {reason}"),
    };
    let events = vec![
        at.event(EventKind::Denied, record.fence)
            .with_detail(format!("by {approver}")),
    ];
    settle(
        record,
        contract,
        RecordState::FailedPermanent(refusal),
        events,
        at,
    )
}

/// The refusal an approval that waited past its window becomes.
pub fn approval_expired(contract: &Contract) -> Refusal {
    Refusal {
        code: ErrorCode::ApprovalExpired,
        message: format!(
            "no operator approved this operation within its approval window of {}; nothing ran",
            contract.approval_window()
        ),
    }
}

/// An approval that waited past its window expires as a refusal: nothing ran.
pub fn expire_approval(record: &Record, contract: &Contract, at: At<'_>) -> Transition {
    let events = vec![
        at.event(EventKind::Expired, record.fence)
            .with_detail("approval window passed; nothing ran"),
    ];
    settle(
        record,
        contract,
        RecordState::FailedPermanent(approval_expired(contract)),
        events,
        at,
    )
}

/// A claim that provably never sent anything and that nothing took up within the retry
/// window: a tombstone that remembers it never ran. Made from outside the claim, so guarded by
/// [`from_outside`]: a marker the owner wrote since the record was read wins.
pub fn expire_unsent(record: &Record, contract: &Contract, at: At<'_>) -> Transition {
    let events = vec![
        at.event(EventKind::Expired, record.fence)
            .with_detail("never ran; the retry window passed"),
    ];
    let mut t = same_attempt(
        record,
        RecordState::Tombstone(Digest::NeverRan),
        RequestUpdate::Clear,
        events,
        at,
    );
    t.expiry = Some(Expiry {
        expires_at: at.now,
        purge_at: at
            .now
            .saturating_add(contract.retention.tombstone_ttl.millis()),
    });
    from_outside(t, record, at)
}

/// An operator resolves `applied` with the reference and result they found.
pub fn resolve_applied(
    record: &Record,
    contract: &Contract,
    receipt: Receipt,
    actor: &str,
    at: At<'_>,
) -> Transition {
    let events = vec![
        at.event(EventKind::Reconciled, record.fence)
            .with_detail(format!("applied as {} by {actor}", receipt.reference)),
    ];
    settle(record, contract, RecordState::Applied(receipt), events, at)
}

/// An operator's receipt lookup found the effect.
pub fn reconciled_by_lookup(
    record: &Record,
    contract: &Contract,
    receipt: Receipt,
    actor: &str,
    at: At<'_>,
) -> Transition {
    let events = vec![
        at.event(EventKind::Reconciled, record.fence)
            .with_detail(format!("receipt {} found by {actor}", receipt.reference)),
    ];
    settle(record, contract, RecordState::Applied(receipt), events, at)
}

/// The actor (and worker) of a settlement made by later evidence.
pub const EVIDENCE: &str = "evidence";

/// Later evidence settles an `unknown` record: a poll or a webhook event that reports its
/// job's end (`Ok` a receipt, `Err` a refusal), or a receipt lookup that finds it. The attempt
/// is unchanged and nothing is sent; `how` says which evidence, for the trace. Made with `at`'s
/// worker, [`EVIDENCE`] by convention.
pub fn settled_by_evidence(
    record: &Record,
    contract: &Contract,
    end: Result<Receipt, Refusal>,
    how: &str,
    at: At<'_>,
) -> Transition {
    let (next, detail) = match end {
        Ok(receipt) => {
            let detail = format!("applied as {} by evidence: {how}", receipt.reference);
            (RecordState::Applied(receipt), detail)
        }
        Err(refusal) => {
            let detail = format!("refused ({}) by evidence: {how}", refusal.code.as_str());
            (RecordState::FailedPermanent(refusal), detail)
        }
    };
    let events = vec![
        at.event(EventKind::Reconciled, record.fence)
            .with_detail(detail),
    ];
    settle(record, contract, next, events, at)
}

/// A polled job finished.
pub fn job_done(record: &Record, contract: &Contract, receipt: Receipt, at: At<'_>) -> Transition {
    let job = job_of(record).unwrap_or_default();
    let events = vec![
        at.event(EventKind::Acknowledged, record.fence)
            .with_detail(format!("job {job} done: {}", receipt.reference)),
    ];
    settle(record, contract, RecordState::Applied(receipt), events, at)
}

/// A polled job failed: a refusal.
pub fn job_failed(
    record: &Record,
    contract: &Contract,
    refusal: Refusal,
    at: At<'_>,
) -> Transition {
    let job = job_of(record).unwrap_or_default();
    let events = vec![
        at.event(EventKind::Failed, record.fence)
            .with_detail(format!("job {job} failed: {}", refusal.code.as_str())),
    ];
    settle(
        record,
        contract,
        RecordState::FailedPermanent(refusal),
        events,
        at,
    )
}

/// A running job's next poll, pushed to `until` by the recoverer.
pub fn next_poll(record: &Record, until: Millis, at: At<'_>) -> Transition {
    let mut t = same_attempt(
        record,
        RecordState::Pending {
            lease: at.lease_until(until),
            dispatch: dispatch_of(record),
        },
        RequestUpdate::Keep,
        Vec::new(),
        at,
    );
    t.expect.lease_expired_by = Some(at.now);
    t
}
