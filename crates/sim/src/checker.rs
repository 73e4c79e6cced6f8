//! The invariants of DESIGN.md section 3, held against one schedule's [`History`].
//!
//! Effects are counted on the downstream's own ledger and every answer is held against it, so
//! a label cannot hide a duplicate. The record checks read the store directly, after
//! quiescence. Each check returns the first [`Violation`], named after the invariant.

use std::collections::BTreeMap;
use std::fmt;

use idemgate_core::audit::{Entry, Head, hex_array};
use idemgate_core::effect::AuthStage;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Status};
use idemgate_core::record::{Digest, Dispatch, Record, RecordState};

use crate::history::{Answer, Call, History, Perform, Verdict};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.invariant, self.detail)
    }
}

fn violation(invariant: &'static str, detail: String) -> Result<(), Violation> {
    Err(Violation { invariant, detail })
}

/// A violation of a tolerated invariant is no failure.
fn keep(result: Result<(), Violation>) -> Result<(), Violation> {
    match result {
        Err(v) if tolerated(v.invariant) => Ok(()),
        other => other,
    }
}

/// Invariants named in `IDEMGATE_SIM_TOLERATE` (comma-separated) are not reported: a way to
/// explore past a known finding while it is being fixed. Never set in CI.
pub fn tolerated(invariant: &str) -> bool {
    static LIST: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    LIST.get_or_init(|| {
        std::env::var("IDEMGATE_SIM_TOLERATE")
            .unwrap_or_default()
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    })
    .iter()
    .any(|t| t == invariant)
}

pub const ONE_EFFECT: &str = "one_effect_per_key";
pub const LABELS: &str = "applied_and_replayed_name_the_effect";
pub const SAFE_TO_REPEAT: &str = "safe_to_repeat_only_without_effect";
/// The same rule, for a rejection given before the key's record was read (invalid arguments):
/// named apart, because the executor then cannot know, and the fix differs.
pub const SAFE_UNREAD: &str = "safe_to_repeat_only_without_effect_unread";
pub const AUTHORIZED: &str = "no_send_without_fresh_authorization";
pub const FENCED: &str = "no_stale_attempt_sends";
pub const MARKER: &str = "dispatch_marker_before_send";
pub const REQUEST: &str = "request_sent_is_request_claimed";
pub const ANSWER_KEY: &str = "answer_names_its_key";
pub const SETTLED: &str = "nothing_stays_stuck";
pub const RECORDS: &str = "records_agree_with_the_ledger";
pub const DECLARED: &str = "downstream_used_as_declared";
pub const RETENTION: &str = "retention_counts_from_settlement";
pub const AUDITED: &str = "operator_actions_audited_once";

/// Every committed operator transition has exactly one audit entry, and the log is one chain:
/// sequence numbers 1, 2, 3, …, each entry linked to the one before and hashed as it reads.
pub fn check_audit(h: &History, entries: &[Entry]) -> Result<(), Violation> {
    let mut head = Head::GENESIS;
    for e in entries {
        let linked = e.seq == head.seq + 1
            && hex_array::<32>(&e.prev_hash) == Some(head.hash)
            && e.content_hash().is_ok_and(|hash| hash == e.hash);
        if !linked {
            return keep(violation(
                AUDITED,
                format!("audit entry {} does not follow entry {}", e.seq, head.seq),
            ));
        }
        head = match e.head() {
            Ok(next) => next,
            Err(err) => return keep(violation(AUDITED, format!("entry {}: {err}", e.seq))),
        };
    }
    let mut logged: Vec<&str> = entries.iter().map(|e| e.operation_key.as_str()).collect();
    let mut done: Vec<&str> = h.operator_transitions.iter().map(|k| k.as_str()).collect();
    logged.sort_unstable();
    done.sort_unstable();
    if logged != done {
        return keep(violation(
            AUDITED,
            format!(
                "{} operator transitions committed ({done:?}), {} audit entries ({logged:?})",
                done.len(),
                logged.len()
            ),
        ));
    }
    Ok(())
}

/// Every check over the history of calls and answers.
pub fn check_history(h: &History) -> Result<(), Violation> {
    one_effect_per_key(h)?;
    if let Some(what) = h.misuse.first() {
        keep(violation(DECLARED, what.clone()))?;
    }
    if let Some(what) = h.early_sweeps.first() {
        keep(violation(RETENTION, what.clone()))?;
    }
    answers(h)?;
    sends(h)?;
    Ok(())
}

/// Invariant 1: at most one effect per operation key, ever — per life of the key: a key whose record a
/// sweep purged may run again as a new operation, by design.
pub fn one_effect_per_key(h: &History) -> Result<(), Violation> {
    let mut seen: BTreeMap<(&OperationKey, u64), usize> = BTreeMap::new();
    for e in h.ledger.effects.iter().filter(|e| !e.voided && !e.keyless) {
        let life = h.life_start(&e.key, e.sent_at);
        if let Some(first) = seen.insert((&e.key, life), e.number) {
            keep(violation(
                ONE_EFFECT,
                format!(
                    "{} has effects #{first} and #{} ({} sent by {} at step {})",
                    e.key, e.number, e.receipt.reference, e.worker, e.sent_at
                ),
            ))?;
        }
    }
    Ok(())
}

/// Invariants 2 and 3, and that every answer is about the key it was asked about.
pub fn answers(h: &History) -> Result<(), Violation> {
    for a in &h.answers {
        keep(answer_names_its_key(a))?;
        keep(label(h, a))?;
        keep(safe_to_repeat(h, a))?;
    }
    Ok(())
}

fn answer_names_its_key(a: &Answer) -> Result<(), Violation> {
    match (&a.key, &a.outcome.operation_key) {
        (Some(asked), Some(told)) if asked != told => violation(
            ANSWER_KEY,
            format!(
                "T{} asked about {asked} and was answered about {told}",
                a.task
            ),
        ),
        _ => Ok(()),
    }
}

fn describe(a: &Answer) -> String {
    let o = &a.outcome;
    format!(
        "T{} ({:?}) at step {} was answered {} ref {:?} safe_to_repeat {} ({})",
        a.task,
        a.call,
        a.step,
        o.status.as_str(),
        o.effect_reference,
        o.safe_to_repeat(),
        o.error_code().map_or("-", |c| c.as_str())
    )
}

/// Invariant 2: every `applied` / `replayed` names the key's one effect; an `applied` answer's task
/// sent for that key itself.
fn label(h: &History, a: &Answer) -> Result<(), Violation> {
    let o = &a.outcome;
    if !matches!(o.status, Status::Applied | Status::Replayed) {
        return Ok(());
    }
    let Some(reference) = o.effect_reference.as_deref() else {
        return violation(LABELS, format!("{} without a reference", describe(a)));
    };
    match o.operation_key.as_ref().or(a.key.as_ref()) {
        Some(key) => {
            if !h
                .ledger
                .effects_of(key)
                .any(|e| e.receipt.reference == reference)
            {
                return violation(
                    LABELS,
                    format!(
                        "{}: the ledger has no effect {reference} under {key} (it has {:?})",
                        describe(a),
                        h.ledger
                            .effects_of(key)
                            .map(|e| e.receipt.reference.as_str())
                            .collect::<Vec<_>>()
                    ),
                );
            }
            let sent = h
                .performs
                .iter()
                .any(|p| p.task == a.task && &p.key == key && p.seq < a.seq);
            if o.status == Status::Applied && a.call == Call::Deliver && !sent {
                return violation(
                    LABELS,
                    format!(
                        "{}: applied, but that task never sent for {key}",
                        describe(a)
                    ),
                );
            }
        }
        None => {
            // A key-less call: its effect is one this task made.
            if !h
                .ledger
                .effects
                .iter()
                .any(|e| e.task == a.task && e.receipt.reference == reference)
            {
                return violation(
                    LABELS,
                    format!("{}: no effect {reference} of this task", describe(a)),
                );
            }
        }
    }
    Ok(())
}

/// Invariant 3: `rejected` with `safe_to_repeat: true` only for a key with no effect from a send that
/// started before the answering task last read the key's record (in the key's current life). The
/// read is where the answer's knowledge comes from — its linearization point: a send that
/// started after it belongs to an operation that came later. An answer given without any read
/// of the key counts from the answer itself.
fn safe_to_repeat(h: &History, a: &Answer) -> Result<(), Violation> {
    let o = &a.outcome;
    if o.status != Status::Rejected || !o.safe_to_repeat() {
        return Ok(());
    }
    // An answer given before any key was derived (invalid arguments) speaks of no key.
    let Some(key) = &o.operation_key else {
        return Ok(());
    };
    let life = h.life_start(key, a.step);
    let known = h.last_read(a.task, key, a.step).unwrap_or(a.step);
    let unread = matches!(
        o.error_code(),
        Some(
            ErrorCode::InvalidArguments
                | ErrorCode::MissingOperationKey
                | ErrorCode::InvalidOperationKey
        )
    );
    if let Some(e) = h
        .ledger
        .effects_of(key)
        .find(|e| e.sent_at >= life && e.sent_at < known)
    {
        return violation(
            if unread { SAFE_UNREAD } else { SAFE_TO_REPEAT },
            format!(
                "{}, but {key} has effect #{} ({}) sent at step {}",
                describe(a),
                e.number,
                e.receipt.reference,
                e.sent_at
            ),
        );
    }
    Ok(())
}

/// Invariants 4 and 5, the dispatch marker, and the request sent being the request claimed.
pub fn sends(h: &History) -> Result<(), Violation> {
    for p in &h.performs {
        keep(authorized(h, p))?;
        keep(fenced(p))?;
    }
    Ok(())
}

fn authorized(h: &History, p: &Perform) -> Result<(), Violation> {
    {
        // 4. The latest authorization-or-send event of this task for this key, before this
        // send, is an `Allowed` decision about the key's actor, taken before an effect.
        let same_key = |k: &Option<OperationKey>| {
            if p.keyless {
                k.is_none()
            } else {
                k.as_ref() == Some(&p.key)
            }
        };
        let last_decision = h
            .decisions
            .iter()
            .filter(|d| d.task == p.task && d.seq < p.seq && d.stage == AuthStage::BeforeEffect)
            .rfind(|d| same_key(&d.key));
        let last_send = h
            .performs
            .iter()
            .rfind(|q| q.task == p.task && q.seq < p.seq && q.key == p.key);
        let owner = h.owners.get(&p.key);
        let fresh = match (last_decision, last_send) {
            (Some(d), Some(q)) if q.seq > d.seq => None,
            (Some(d), _) => Some(d),
            (None, _) => None,
        };
        match fresh {
            None => {
                return violation(
                    AUTHORIZED,
                    format!(
                        "T{} ({}) sent {} attempt {} at step {} with no authorization since its last send",
                        p.task, p.worker, p.key, p.attempt, p.step
                    ),
                );
            }
            Some(d) if d.verdict != Verdict::Allowed => {
                return violation(
                    AUTHORIZED,
                    format!(
                        "T{} sent {} at step {} after a {:?} decision",
                        p.task, p.key, p.step, d.verdict
                    ),
                );
            }
            Some(d) if !p.keyless && owner.is_some_and(|o| o != &d.actor) => {
                return violation(
                    AUTHORIZED,
                    format!(
                        "T{} sent {} at step {} on a decision about {}, not the key's actor {}",
                        p.task,
                        p.key,
                        p.step,
                        d.actor,
                        owner.map_or("?", |o| o.as_str())
                    ),
                );
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn owned_by(record: &idemgate_core::record::Record, p: &Perform) -> bool {
    match &record.state {
        RecordState::Pending { lease, .. } => {
            record.fence == p.attempt && lease.owner.as_deref() == Some(p.worker.as_str())
        }
        RecordState::AwaitingApproval { .. }
        | RecordState::Applied(_)
        | RecordState::FailedPermanent(_)
        | RecordState::Unknown(_)
        | RecordState::Tombstone(_) => false,
    }
}

fn fenced(p: &Perform) -> Result<(), Violation> {
    {
        if p.keyless {
            return Ok(());
        }
        // 5. At the send's start the stored record is pending under this attempt, owned by
        // the sender — or the send is a stale one that cannot harm: no lease can stop a worker
        // paused past its lease from sending (DESIGN §3: a lease "never proves that the old
        // owner did not reach the downstream"), so what is checked is that such a send can
        // make no second effect and no dishonest record. To a downstream that deduplicates on
        // the key it is absorbed; to one that does not, the owner wrote the marker first, so
        // the only record it may meet is its own attempt given up on as `unknown`.
        if let Some(record) = &p.record
            && !owned_by(record, p)
            && (!p.needs_marker
                || (matches!(record.state, RecordState::Unknown(_)) && record.fence == p.attempt))
        {
            return Ok(());
        }
        let Some(record) = &p.record else {
            return violation(
                FENCED,
                format!(
                    "T{} sent {} at step {} with no record stored",
                    p.task, p.key, p.step
                ),
            );
        };
        let (owner, dispatch) = match &record.state {
            RecordState::Pending { lease, dispatch } => (lease.owner.as_deref(), dispatch),
            other => {
                return violation(
                    FENCED,
                    format!(
                        "T{} sent {} attempt {} at step {} while the record is {}",
                        p.task,
                        p.key,
                        p.attempt,
                        p.step,
                        other.status().as_str()
                    ),
                );
            }
        };
        if record.fence != p.attempt || owner != Some(p.worker.as_str()) {
            return violation(
                FENCED,
                format!(
                    "{} sent {} attempt {} at step {} while the record is at fence {} owned by {:?}",
                    p.worker, p.key, p.attempt, p.step, record.fence, owner
                ),
            );
        }
        if p.needs_marker && *dispatch != Dispatch::Sent {
            return violation(
                MARKER,
                format!(
                    "T{} sent {} at step {} without the dispatch marker (dispatch {:?})",
                    p.task, p.key, p.step, dispatch
                ),
            );
        }
        if record.request.as_ref() != Some(&p.arguments) {
            return violation(
                REQUEST,
                format!(
                    "T{} sent {} at step {} with arguments {} while the record holds {:?}",
                    p.task,
                    p.key,
                    p.step,
                    p.arguments,
                    record.request.as_ref().map(|v| v.to_string())
                ),
            );
        }
    }
    Ok(())
}

/// Invariant 6: the records left after quiescence, against the ledger. `settled`: leases, windows and
/// retry windows have all passed, so nothing may still be pending or awaiting approval.
pub fn check_records(
    h: &History,
    records: &[Record],
    step: u64,
    settled: bool,
) -> Result<(), Violation> {
    for r in records {
        keep(check_record(h, r, step, settled))?;
    }
    Ok(())
}

fn check_record(h: &History, r: &Record, step: u64, settled: bool) -> Result<(), Violation> {
    {
        let key = &r.key;
        let life = h.life_start(key, step);
        let current = || h.ledger.effects_of(key).find(|e| e.sent_at >= life);
        let names = |reference: &str| {
            h.ledger
                .effects_of(key)
                .any(|e| e.receipt.reference == reference)
        };
        match &r.state {
            RecordState::Pending { .. } | RecordState::AwaitingApproval { .. } => {
                if settled {
                    return violation(
                        SETTLED,
                        format!("{key} is still {} after quiescence", r.status().as_str()),
                    );
                }
            }
            RecordState::Applied(receipt) => {
                if !names(&receipt.reference) {
                    return violation(
                        RECORDS,
                        format!(
                            "{key} is applied as {} but the ledger has {:?}",
                            receipt.reference,
                            h.ledger
                                .effects_of(key)
                                .map(|e| e.receipt.reference.as_str())
                                .collect::<Vec<_>>()
                        ),
                    );
                }
            }
            RecordState::FailedPermanent(refusal) => {
                if let Some(e) = current() {
                    return violation(
                        RECORDS,
                        format!(
                            "{key} is failed_permanent ({}) but has effect #{} ({})",
                            refusal.code.as_str(),
                            e.number,
                            e.receipt.reference
                        ),
                    );
                }
            }
            RecordState::Tombstone(Digest::Applied { reference }) => {
                if !names(reference) {
                    return violation(
                        RECORDS,
                        format!(
                            "{key}'s tombstone names {reference}, which the ledger does not have"
                        ),
                    );
                }
            }
            RecordState::Tombstone(digest @ (Digest::NeverRan | Digest::Refused { .. })) => {
                if let Some(e) = current() {
                    return violation(
                        RECORDS,
                        format!(
                            "{key}'s tombstone says {digest:?} but it has effect #{} ({})",
                            e.number, e.receipt.reference
                        ),
                    );
                }
            }
            RecordState::Unknown(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use idemgate_core::effect::AuthStage;
    use idemgate_core::fingerprint::Fingerprint;
    use idemgate_core::outcome::Outcome;
    use idemgate_core::record::{Lease, Receipt, Refusal};
    use serde_json::json;

    use super::*;
    use crate::history::{Decision, Effect, Perform};

    fn key(step: &str) -> OperationKey {
        OperationKey::new("acme", "sim", "wf1", step).unwrap()
    }

    /// A history in which T1 of p1, authorized, sent s1 once at attempt 1 and was answered
    /// applied with r1: every check passes.
    fn good() -> History {
        let mut h = History::default();
        h.owners.insert(key("s1"), "agent-1".into());
        let seq = h.next_seq();
        h.decisions.push(Decision {
            seq,
            step: 1,
            task: 1,
            key: Some(key("s1")),
            actor: "agent-1".into(),
            stage: AuthStage::BeforeEffect,
            verdict: Verdict::Allowed,
        });
        let seq = h.next_seq();
        h.performs.push(Perform {
            seq,
            step: 2,
            task: 1,
            worker: "p1".into(),
            tool: "t".into(),
            key: key("s1"),
            attempt: 1,
            arguments: json!({"a": 1}),
            keyless: false,
            needs_marker: false,
            record: Some(record("s1", pending("p1"), 1)),
        });
        h.ledger.effects.push(effect(1, "s1", "r1", 2));
        let seq = h.next_seq();
        h.answers.push(answer(
            seq,
            3,
            1,
            Outcome::applied(key("s1"), "r1".into(), json!({})),
        ));
        h
    }

    fn pending(owner: &str) -> RecordState {
        RecordState::Pending {
            lease: Lease {
                owner: Some(owner.into()),
                expires_at: 10_000,
            },
            dispatch: Dispatch::NotSent,
        }
    }

    fn record(step: &str, state: RecordState, fence: u64) -> Record {
        Record {
            key: key(step),
            tool: "t".into(),
            tool_version: "1".into(),
            fingerprint: Fingerprint::parse(&format!("sha256:{}", "a".repeat(64))).unwrap(),
            canonicalization: 1,
            state,
            fence,
            actor: "agent-1".into(),
            request: Some(json!({"a": 1})),
            approved_by: None,
            created_at: 0,
            updated_at: 0,
            expires_at: i64::MAX,
            purge_at: i64::MAX,
            intent_window: false,
        }
    }

    fn effect(number: usize, step: &str, reference: &str, sent_at: u64) -> Effect {
        Effect {
            number,
            key: key(step),
            receipt: Receipt {
                reference: reference.into(),
                result: json!({}),
            },
            task: 1,
            worker: "p1".into(),
            sent_at,
            committed_at: sent_at,
            keyless: false,
            job: None,
            voided: false,
        }
    }

    fn answer(seq: u64, step: u64, task: u64, outcome: Outcome) -> Answer {
        Answer {
            seq,
            step,
            task,
            call: Call::Deliver,
            key: outcome.operation_key.clone(),
            outcome,
        }
    }

    fn broken(h: &History) -> &'static str {
        match check_history(h) {
            Ok(()) => "none",
            Err(v) => v.invariant,
        }
    }

    #[test]
    fn a_clean_history_passes() {
        assert_eq!(broken(&good()), "none");
    }

    #[test]
    fn catches_hand_made_bad_histories() {
        type Mutation = Box<dyn Fn(&mut History)>;
        let cases: Vec<(&str, Mutation)> = vec![
            (
                ONE_EFFECT,
                Box::new(|h| h.ledger.effects.push(effect(2, "s1", "r2", 5))),
            ),
            // A purge in between makes the second effect a new operation's.
            (
                "none",
                Box::new(|h| {
                    h.purges.insert(key("s1"), vec![4]);
                    h.ledger.effects.push(effect(2, "s1", "r2", 5));
                }),
            ),
            (
                LABELS,
                Box::new(|h| {
                    let seq = h.next_seq();
                    h.answers.push(answer(
                        seq,
                        4,
                        2,
                        Outcome::replayed(key("s1"), Some("r9".into()), None),
                    ));
                }),
            ),
            (
                LABELS,
                Box::new(|h| {
                    let seq = h.next_seq();
                    h.answers.push(answer(
                        seq,
                        4,
                        2,
                        Outcome::applied(key("s1"), "r1".into(), json!({})),
                    ));
                }),
            ),
            (
                LABELS,
                Box::new(|h| {
                    let seq = h.next_seq();
                    h.answers
                        .push(answer(seq, 4, 2, Outcome::replayed(key("s1"), None, None)));
                }),
            ),
            (
                SAFE_TO_REPEAT,
                Box::new(|h| {
                    let seq = h.next_seq();
                    h.answers.push(answer(seq, 4, 2, forged_safe_refusal()));
                }),
            ),
            // A safe rejection before the send started is honest.
            (
                "none",
                Box::new(|h| {
                    let seq = h.next_seq();
                    h.answers.push(answer(seq, 1, 2, forged_safe_refusal()));
                }),
            ),
            (
                AUTHORIZED,
                Box::new(|h| h.decisions[0].verdict = Verdict::Denied),
            ),
            (
                AUTHORIZED,
                Box::new(|h| h.decisions[0].actor = "agent-2".into()),
            ),
            (AUTHORIZED, Box::new(|h| h.decisions[0].task = 7)),
            (
                AUTHORIZED,
                Box::new(|h| h.decisions[0].stage = AuthStage::BeforeReplay),
            ),
            // A second send by the same task needs a decision of its own.
            (
                AUTHORIZED,
                Box::new(|h| {
                    let mut again = h.performs[0].clone();
                    again.seq = h.next_seq();
                    h.performs.push(again);
                }),
            ),
            // A stale send to a downstream that deduplicates is absorbed: no violation.
            ("none", Box::new(|h| h.performs[0].attempt = 2)),
            // To one that does not, it is one.
            (
                FENCED,
                Box::new(|h| {
                    h.performs[0].attempt = 2;
                    h.performs[0].needs_marker = true;
                }),
            ),
            (
                FENCED,
                Box::new(|h| {
                    h.performs[0].worker = "p2".into();
                    h.performs[0].needs_marker = true;
                }),
            ),
            (
                FENCED,
                Box::new(|h| {
                    let unknown = RecordState::Unknown(idemgate_core::record::Evidence {
                        reason: "x".into(),
                        reference: None,
                        job_id: None,
                    });
                    // Given up as unknown under another attempt than the one sent.
                    h.performs[0].record = Some(record("s1", unknown, 2));
                    h.performs[0].needs_marker = true;
                }),
            ),
            (MARKER, Box::new(|h| h.performs[0].needs_marker = true)),
            (
                REQUEST,
                Box::new(|h| h.performs[0].arguments = json!({"a": 2})),
            ),
            (ANSWER_KEY, Box::new(|h| h.answers[0].key = Some(key("s2")))),
        ];
        for (i, (expect, mutate)) in cases.iter().enumerate() {
            let mut h = good();
            mutate(&mut h);
            assert_eq!(broken(&h), *expect, "case {i}");
        }
    }

    /// A rejection of `s1` that says `safe_to_repeat`, made without the machine's proof (the
    /// product cannot make one by hand; a history under test can be anything).
    fn forged_safe_refusal() -> Outcome {
        let refusal = Outcome::rejected(Some(key("s1")), ErrorCode::Forbidden, "x");
        let mut shape = serde_json::to_value(refusal).unwrap();
        shape["safe_to_repeat"] = json!(true);
        serde_json::from_value(shape).unwrap()
    }

    #[test]
    fn records_are_held_against_the_ledger() {
        let h = good();
        let applied = |r: &str| {
            RecordState::Applied(Receipt {
                reference: r.into(),
                result: json!({}),
            })
        };
        let refused = RecordState::FailedPermanent(Refusal {
            code: ErrorCode::DownstreamRejected,
            message: "no".into(),
        });
        let check = |state: RecordState, settled: bool| match check_records(
            &h,
            &[record("s1", state, 1)],
            10,
            settled,
        ) {
            Ok(()) => "none",
            Err(v) => v.invariant,
        };
        assert_eq!(check(applied("r1"), true), "none");
        assert_eq!(check(applied("r2"), true), RECORDS);
        assert_eq!(check(refused, true), RECORDS);
        assert_eq!(
            check(RecordState::Tombstone(Digest::NeverRan), true),
            RECORDS
        );
        assert_eq!(
            check(
                RecordState::Tombstone(Digest::Applied {
                    reference: "r1".into()
                }),
                true
            ),
            "none"
        );
        assert_eq!(check(pending("p1"), false), "none");
        assert_eq!(check(pending("p1"), true), SETTLED);
        assert_eq!(
            check(RecordState::AwaitingApproval { until: 5 }, true),
            SETTLED
        );
    }
}
