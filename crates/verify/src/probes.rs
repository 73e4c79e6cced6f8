//! The probes, in the order a run makes them, each a scenario of the seed's release checklist
//! with the fewest effects that can check it.
//!
//! | probe | claim | effects at most | what it does |
//! |---|---|---|---|
//! | `authorization-hook` | authorization_hook | 0 | asks the hook about the verification's actor and an unknown one |
//! | `first-effect` | reference, async_jobs | 1 (+1 resend) | one delivery through idemgate; a job is followed to its end |
//! | `replay` | one_effect_per_key | 0 | the same delivery again: replayed, nothing sent |
//! | `receipt-lookup` | receipt_lookup | 0 | the lookup by the first effect's key, and by a key never used |
//! | `same-key-resend` | deduplicates_by_key | 1 | the first request sent again, straight to the downstream |
//! | `changed-request` | one_effect_per_key | 0 | the first key with a material field changed, through idemgate |
//! | `changed-request-resend` | deduplicates_by_key | 1 | the same, straight to the downstream |
//! | `lost-answer` | recovery | 1 (+1 resend) | the downstream commits, the proxy drops the answer |
//! | `concurrent-deliveries` | one_effect_per_key | 1 (+1 resend) | N deliveries of one new key at once, through idemgate |
//! | `concurrent-resends` | deduplicates_by_key | N | N sends of one new key at once, straight to the downstream |
//! | `server-error` | recovery | 1 (+1 resend) | the downstream commits, the proxy answers 502 |
//! | `malformed-answer` | recovery | 1 (+1 resend) | the downstream commits, the proxy answers a malformed 200 |
//!
//! The resend in parentheses is the executor's own, after an ambiguous answer, only where the
//! contract says the downstream deduplicates. A probe is admitted when its worst case fits in
//! what is left of the budget; a probe whose claim the contract does not make, or that needs a
//! first effect there is none of, is not run, and its finding says why.

use std::time::Instant;

use idemgate_chaos::{Fault, Rule};
use idemgate_core::effect::{
    AuthRequest, AuthStage, Authorization, Authorizer as _, EffectOutcome, JobStatus, Lookup,
};
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Outcome, Status};
use serde_json::Value;

use crate::claim::{Claim, Verdict, recovery_path};
use crate::report::{Evidence, Finding};
use crate::session::{First, Session, Settled, answer, sent_answer};

/// Every probe, in the order a run makes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    AuthorizationHook,
    FirstEffect,
    Replay,
    ReceiptLookup,
    SameKeyResend,
    ChangedRequest,
    ChangedRequestResend,
    LostAnswer,
    ConcurrentDeliveries,
    ConcurrentResends,
    ServerError,
    MalformedAnswer,
}

impl Probe {
    pub const ALL: [Probe; 12] = [
        Probe::AuthorizationHook,
        Probe::FirstEffect,
        Probe::Replay,
        Probe::ReceiptLookup,
        Probe::SameKeyResend,
        Probe::ChangedRequest,
        Probe::ChangedRequestResend,
        Probe::LostAnswer,
        Probe::ConcurrentDeliveries,
        Probe::ConcurrentResends,
        Probe::ServerError,
        Probe::MalformedAnswer,
    ];

    pub fn id(self) -> &'static str {
        match self {
            Probe::AuthorizationHook => "authorization-hook",
            Probe::FirstEffect => "first-effect",
            Probe::Replay => "replay",
            Probe::ReceiptLookup => "receipt-lookup",
            Probe::SameKeyResend => "same-key-resend",
            Probe::ChangedRequest => "changed-request",
            Probe::ChangedRequestResend => "changed-request-resend",
            Probe::LostAnswer => "lost-answer",
            Probe::ConcurrentDeliveries => "concurrent-deliveries",
            Probe::ConcurrentResends => "concurrent-resends",
            Probe::ServerError => "server-error",
            Probe::MalformedAnswer => "malformed-answer",
        }
    }

    /// The claims its finding bears on.
    pub(crate) fn claims(self, session: &Session<'_>) -> Vec<Claim> {
        match self {
            Probe::AuthorizationHook => vec![Claim::AuthorizationHook],
            Probe::FirstEffect if session.target.contract.async_jobs() => {
                vec![Claim::Reference, Claim::AsyncJobs]
            }
            Probe::FirstEffect => vec![Claim::Reference],
            Probe::Replay | Probe::ChangedRequest | Probe::ConcurrentDeliveries => {
                vec![Claim::OneEffectPerKey]
            }
            Probe::ReceiptLookup => vec![Claim::ReceiptLookup],
            Probe::SameKeyResend | Probe::ChangedRequestResend | Probe::ConcurrentResends => {
                vec![Claim::DeduplicatesByKey]
            }
            Probe::LostAnswer | Probe::ServerError | Probe::MalformedAnswer => {
                vec![Claim::Recovery]
            }
        }
    }

    /// The seed's scenario.
    pub fn scenario(self) -> &'static str {
        match self {
            Probe::AuthorizationHook => {
                "The authorization hook is asked about a known and an unknown actor"
            }
            Probe::FirstEffect => "Same key, same fingerprint, first call",
            Probe::Replay => "Same key, same fingerprint, second call",
            Probe::ReceiptLookup => "Receipt lookup by operation key",
            Probe::SameKeyResend => "Same key twice at the downstream",
            Probe::ChangedRequest => "Same key with changed material arguments",
            Probe::ChangedRequestResend => {
                "Same key with changed material arguments at the downstream"
            }
            Probe::LostAnswer => "Same key, same fingerprint, first response is lost",
            Probe::ConcurrentDeliveries => "Concurrent deliveries of one key",
            Probe::ConcurrentResends => "Concurrent requests of one key at the downstream",
            Probe::ServerError => "A 5xx answer after the downstream committed",
            Probe::MalformedAnswer => "A malformed answer after the downstream committed",
        }
    }

    /// What it expects, in general (a finding that ran says it for this contract).
    pub fn expectation(self) -> &'static str {
        match self {
            Probe::AuthorizationHook => "the verification's actor allowed, an unknown actor denied",
            Probe::FirstEffect => "one effect, answered with its reference",
            Probe::Replay => "`replayed` with the first effect; nothing sent",
            Probe::ReceiptLookup => {
                "the first effect found by its key; nothing for a key never used"
            }
            Probe::SameKeyResend | Probe::ChangedRequestResend => "no second effect",
            Probe::ChangedRequest => "`rejected`; nothing sent",
            Probe::LostAnswer | Probe::ServerError | Probe::MalformedAnswer => {
                "the one effect, or `unknown` where nothing settles it; never a second"
            }
            Probe::ConcurrentDeliveries | Probe::ConcurrentResends => "one effect",
        }
    }

    /// The most effects it can make, with the executor's resend after an ambiguous answer
    /// where the contract allows one.
    pub(crate) fn worst(self, session: &Session<'_>) -> u32 {
        let resend = u32::from(session.target.contract.deduplicates());
        match self {
            Probe::AuthorizationHook
            | Probe::Replay
            | Probe::ReceiptLookup
            | Probe::ChangedRequest => 0,
            Probe::SameKeyResend | Probe::ChangedRequestResend => 1,
            Probe::FirstEffect
            | Probe::LostAnswer
            | Probe::ConcurrentDeliveries
            | Probe::ServerError
            | Probe::MalformedAnswer => 1 + resend,
            Probe::ConcurrentResends => session.options.concurrency as u32,
        }
    }

    /// Why it does not run for this contract, if it does not.
    pub(crate) fn skip(self, session: &Session<'_>) -> Option<String> {
        let contract = &session.target.contract;
        let needs_first = matches!(
            self,
            Probe::Replay
                | Probe::SameKeyResend
                | Probe::ChangedRequest
                | Probe::ChangedRequestResend
        );
        match self {
            Probe::AuthorizationHook if session.hook.is_none() => {
                Some("the contract declares no authorization hook".into())
            }
            Probe::ReceiptLookup if !contract.receipt_lookup() => {
                Some("the contract does not claim a receipt lookup".into())
            }
            Probe::SameKeyResend | Probe::ChangedRequestResend | Probe::ConcurrentResends
                if !contract.deduplicates() =>
            {
                Some("the contract does not claim deduplication on the key (a repeat would make a second effect)".into())
            }
            _ if needs_first && session.first.is_none() => {
                Some("no first effect to compare with (see first-effect)".into())
            }
            _ => None,
        }
    }

    /// Runs it; `deadline` bounds how long it follows an operation.
    pub(crate) async fn run(self, session: &mut Session<'_>, deadline: Instant) -> Finding {
        match self {
            Probe::AuthorizationHook => authorization_hook(session).await,
            Probe::FirstEffect => first_effect(session, deadline).await,
            Probe::Replay => replay(session).await,
            Probe::ReceiptLookup => receipt_lookup(session).await,
            Probe::SameKeyResend => same_key_resend(session).await,
            Probe::ChangedRequest => changed_request(session).await,
            Probe::ChangedRequestResend => changed_request_resend(session).await,
            Probe::LostAnswer => broken_answer(session, self, Fault::Drop, deadline).await,
            Probe::ConcurrentDeliveries => concurrent_deliveries(session, deadline).await,
            Probe::ConcurrentResends => concurrent_resends(session).await,
            Probe::ServerError => broken_answer(session, self, Fault::Error(502), deadline).await,
            Probe::MalformedAnswer => {
                broken_answer(session, self, Fault::Malformed, deadline).await
            }
        }
    }

    /// A finding for a probe that did not run, or did not finish.
    pub(crate) fn not_run(self, session: &Session<'_>, why: String) -> Finding {
        Finding {
            probe: self.id(),
            claims: self.claims(session),
            scenario: self.scenario().into(),
            expected: self.expectation().into(),
            observed: why,
            verdict: Verdict::NotChecked,
            effects: 0,
            evidence: Evidence::default(),
        }
    }
}

/// Builds a finding; the effects are those the session made since `before`.
struct Draft {
    probe: Probe,
    expected: String,
    before: u32,
    /// The proxy's last request before the probe: its evidence is what came after.
    since: u64,
    evidence: Evidence,
}

impl Draft {
    fn new(session: &Session<'_>, probe: Probe, expected: impl Into<String>) -> Draft {
        Draft {
            probe,
            expected: expected.into(),
            before: session.sent(),
            since: session.ledger().arrived(),
            evidence: Evidence::default(),
        }
    }

    fn key(&mut self, key: &OperationKey) {
        let key = key.as_str().to_string();
        if !self.evidence.keys.contains(&key) {
            self.evidence.keys.push(key);
        }
    }

    /// The finding of a probe that needs a material field changed, when none can be.
    fn unchangeable(self, session: &Session<'_>) -> Finding {
        self.done(
            session,
            Verdict::NotChecked,
            "no material field can change within the input schema",
        )
    }

    fn done(
        mut self,
        session: &Session<'_>,
        verdict: Verdict,
        observed: impl Into<String>,
    ) -> Finding {
        for key in self.evidence.keys.clone() {
            let entries = session.ledger().entries_for(&key);
            let since = self.since;
            self.evidence
                .exchanges
                .extend(entries.into_iter().filter(|e| e.seq > since));
        }
        self.evidence.exchanges.sort_by_key(|e| e.seq);
        Finding {
            probe: self.probe.id(),
            claims: self.probe.claims(session),
            scenario: self.probe.scenario().into(),
            expected: self.expected,
            observed: observed.into(),
            verdict,
            effects: session.sent() - self.before,
            evidence: self.evidence,
        }
    }
}

/// The first request that could commit (not a lookup or a poll) under `key`, and its status.
fn first_effect_status(session: &Session<'_>, key: &OperationKey) -> Option<(u16, Option<String>)> {
    session
        .exchanges(key)
        .into_iter()
        .filter(|e| !matches!(e.method.as_str(), "GET" | "HEAD" | "OPTIONS"))
        .flat_map(|e| e.upstream)
        .find_map(|u| u.status.map(|s| (s, u.reference)))
}

/// The status of the last request under `key` that could commit.
fn last_effect_status(session: &Session<'_>, key: &OperationKey) -> Option<u16> {
    session
        .exchanges(key)
        .into_iter()
        .filter(|e| !matches!(e.method.as_str(), "GET" | "HEAD" | "OPTIONS"))
        .flat_map(|e| e.upstream)
        .filter_map(|u| u.status)
        .next_back()
}

fn is_effect(outcome: &Outcome) -> bool {
    matches!(outcome.status, Status::Applied | Status::Replayed)
}

fn quoted(items: &[String]) -> String {
    items
        .iter()
        .map(|i| format!("`{i}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn authorization_hook(session: &mut Session<'_>) -> Finding {
    let options = session.options;
    let denied_actor = options
        .denied_actor
        .clone()
        .unwrap_or_else(|| format!("idemgate-verify-unknown-{}", session.run));
    let mut draft = Draft::new(
        session,
        Probe::AuthorizationHook,
        format!("allows `{}` and denies `{denied_actor}`", options.actor),
    );
    let Some(hook) = &session.hook else {
        return draft.done(session, Verdict::NotChecked, "no hook");
    };
    let contract = &session.target.contract;
    let key = session.key("hook");
    draft.key(&key);
    let Ok(fingerprint) = contract.fingerprint(&session.target.arguments) else {
        return draft.done(
            session,
            Verdict::NotChecked,
            "the arguments have no fingerprint",
        );
    };
    let ask = |actor: String| {
        let key = key.clone();
        let fingerprint = fingerprint.clone();
        let tenant = options.tenant.clone();
        let role = options.role.clone();
        let tool = contract.name.clone();
        async move {
            hook.authorize(AuthRequest {
                tenant: &tenant,
                actor: &actor,
                role: &role,
                tool: &tool,
                key: Some(&key),
                fingerprint: &fingerprint,
                stage: AuthStage::BeforeEffect,
            })
            .await
        }
    };
    let allowed = ask(options.actor.clone()).await;
    let denied = ask(denied_actor.clone()).await;
    let describe = |actor: &str, a: &Authorization| match a {
        Authorization::Allowed => format!("`{actor}` allowed"),
        Authorization::Denied(why) => format!("`{actor}` denied ({why})"),
        Authorization::Unavailable(why) => format!("`{actor}`: no answer ({why})"),
    };
    draft
        .evidence
        .notes
        .push(describe(&options.actor, &allowed));
    draft.evidence.notes.push(describe(&denied_actor, &denied));
    match (&allowed, &denied) {
        (Authorization::Allowed, Authorization::Denied(_)) => draft.done(
            session,
            Verdict::Confirmed,
            format!("allowed `{}`, denied `{denied_actor}`", options.actor),
        ),
        (_, Authorization::Allowed) => draft.done(
            session,
            Verdict::Refuted,
            format!("the hook allowed `{denied_actor}`, an actor no system knows: the recheck before every effect stops nobody"),
        ),
        (Authorization::Unavailable(why), _) | (_, Authorization::Unavailable(why)) => draft.done(
            session,
            Verdict::Refuted,
            format!("the hook gave no clear answer ({why}): idemgate fails closed, so every call of the tool would be refused"),
        ),
        (Authorization::Denied(why), _) => draft.done(
            session,
            Verdict::NotChecked,
            format!("the hook denied the verification's actor `{}` ({why}): pass --actor with an actor it allows", options.actor),
        ),
    }
}

async fn first_effect(session: &mut Session<'_>, deadline: Instant) -> Finding {
    let contract = &session.target.contract;
    let jobs = contract.async_jobs();
    let expected = if jobs {
        "one effect: a 202 naming a job, polled to its end; the effect's reference is the poll's"
    } else {
        "one effect: a 2xx answer naming its reference; `applied`"
    };
    let mut draft = Draft::new(session, Probe::FirstEffect, expected);
    let key = session.key("first");
    draft.key(&key);
    let arguments = session.target.arguments.clone();
    let answered = session.deliver("first", &arguments).await;
    let settled = session.settle(&key, answered, deadline).await;
    record_settled(&mut draft, &key, &settled);
    let outcome = &settled.outcome;
    let committed = session.committed(&key);
    let pointer = reference_pointer(session);
    if let Some((status, None)) = first_effect_status(session, &key)
        && (200..300).contains(&status)
        && status != 202
    {
        // The effect exists, settled another way (the lookup, say): later probes can still
        // repeat and compare with it.
        if is_effect(outcome)
            && let Some(reference) = outcome.effect_reference.clone()
        {
            session.first = Some(First {
                key: key.clone(),
                reference,
                job_id: settled.job_id.clone(),
            });
        }
        return draft.done(
            session,
            Verdict::Refuted,
            format!("the downstream answered {status} with no usable reference at `{pointer}`: idemgate cannot tell that answer from a failure, so every call goes to recovery"),
        );
    }
    let references: Vec<&String> = committed
        .iter()
        .filter(|r| !r.starts_with("job "))
        .collect();
    if references.len() > 1 || committed.iter().filter(|r| r.starts_with("job ")).count() > 1 {
        return draft.done(
            session,
            Verdict::Refuted,
            format!(
                "one delivery made more than one effect: {}",
                quoted(&committed)
            ),
        );
    }
    match outcome.status {
        Status::Applied | Status::Replayed => {
            let reference = outcome.effect_reference.clone().unwrap_or_default();
            if let Some(other) = references.first()
                && **other != reference
            {
                return draft.done(
                    session,
                    Verdict::Refuted,
                    format!(
                        "idemgate answered `{reference}`, the downstream's answer named `{other}`"
                    ),
                );
            }
            let mut observed =
                format!("`{}` with reference `{reference}`", outcome.status.as_str());
            let mut verdict = Verdict::Confirmed;
            if jobs {
                match &settled.job_id {
                    Some(job_id) => {
                        let polled = session.tool.downstream.poll_job(&key, job_id).await;
                        let reference_polled = match &polled {
                            JobStatus::Done(r) => Some(r.reference.clone()),
                            _ => None,
                        };
                        let polled_text = describe_job(&polled);
                        draft
                            .evidence
                            .notes
                            .push(format!("job `{job_id}`, polled again: {polled_text}"));
                        if reference_polled.as_deref() != Some(reference.as_str()) {
                            verdict = Verdict::Refuted;
                            observed = format!(
                                "job `{job_id}` settled as `{reference}`, but its poll now answers: {polled_text}"
                            );
                        } else {
                            observed = format!(
                                "202 with job `{job_id}`, polled to its end: `{reference}`, as its poll says"
                            );
                        }
                    }
                    None => {
                        observed.push_str(
                            " at once (no job to follow: the downstream did not answer 202)",
                        );
                    }
                }
            }
            session.first = Some(First {
                key: key.clone(),
                reference,
                job_id: settled.job_id.clone(),
            });
            draft.done(session, verdict, observed)
        }
        Status::Unknown => {
            let why = outcome
                .error
                .as_ref()
                .map(|e| e.message.clone())
                .unwrap_or_default();
            draft.done(
                session,
                Verdict::NotChecked,
                format!("`unknown`: the downstream's answer was ambiguous ({why}); the later probes need a first effect"),
            )
        }
        Status::Rejected => {
            let code = outcome.error.as_ref().map(|e| e.code);
            let message = outcome
                .error
                .as_ref()
                .map(|e| e.message.clone())
                .unwrap_or_default();
            let hint = match code {
                Some(ErrorCode::Forbidden | ErrorCode::AuthorizationUnavailable) => {
                    "the authorization hook refused the verification's actor: pass --actor"
                }
                Some(ErrorCode::DownstreamRejected) => {
                    "the downstream refused the arguments: give ones it accepts with --args"
                }
                _ => "nothing to verify against",
            };
            draft.done(
                session,
                Verdict::NotChecked,
                format!("`rejected` ({message}): {hint}"),
            )
        }
        Status::InFlight => draft.done(
            session,
            Verdict::NotChecked,
            "still in flight when the probe's time ran out (raise --probe-timeout)",
        ),
    }
}

fn describe_job(status: &JobStatus) -> String {
    match status {
        JobStatus::Running => "running".into(),
        JobStatus::Done(r) => format!("done, `{}`", r.reference),
        JobStatus::Failed(r) => format!("failed ({})", r.message),
        JobStatus::Gone(why) => format!("gone ({why})"),
        JobStatus::Unavailable(why) => format!("no answer ({why})"),
    }
}

fn reference_pointer(session: &Session<'_>) -> String {
    session
        .target
        .contract
        .file
        .downstream
        .http
        .as_ref()
        .and_then(|h| h.get("reference"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

fn record_settled(draft: &mut Draft, key: &OperationKey, settled: &Settled) {
    draft.evidence.answers.push(answer(key, &settled.answered));
    if settled.outcome != settled.answered {
        draft.evidence.answers.push(answer(key, &settled.outcome));
    }
    if settled.approved {
        draft
            .evidence
            .notes
            .push("awaited approval; approved by the verification".into());
    }
}

async fn replay(session: &mut Session<'_>) -> Finding {
    let first = session.first.clone().expect("checked by skip");
    let mut draft = Draft::new(
        session,
        Probe::Replay,
        format!("`replayed` with `{}`; nothing sent", first.reference),
    );
    draft.key(&first.key);
    let before = session.sent();
    let arguments = session.target.arguments.clone();
    let outcome = session.deliver("first", &arguments).await;
    draft.evidence.answers.push(answer(&first.key, &outcome));
    let sent = session.sent() - before;
    if sent > 0 {
        return draft.done(
            session,
            Verdict::Refuted,
            format!("idemgate sent the request again ({sent} times)"),
        );
    }
    match (outcome.status, &outcome.effect_reference) {
        (Status::Replayed, Some(r)) if *r == first.reference => draft.done(
            session,
            Verdict::Confirmed,
            format!("`replayed` with `{r}`, nothing sent"),
        ),
        (Status::Applied | Status::Replayed, r) => draft.done(
            session,
            Verdict::Refuted,
            format!(
                "`{}` with {r:?}, not the first effect's `{}`",
                outcome.status.as_str(),
                first.reference
            ),
        ),
        (status, _) => draft.done(
            session,
            Verdict::NotChecked,
            format!("`{}` ({})", status.as_str(), detail(&outcome)),
        ),
    }
}

fn detail(outcome: &Outcome) -> String {
    outcome
        .error
        .as_ref()
        .map(|e| format!("{}: {}", e.code.as_str(), e.message))
        .unwrap_or_default()
}

async fn receipt_lookup(session: &mut Session<'_>) -> Finding {
    let never = session.key("never-used");
    let first = session.first.clone();
    let expected = match &first {
        Some(f) => format!(
            "finds `{}` by its key; finds nothing for a key never used",
            f.reference
        ),
        None => "finds nothing for a key never used".to_string(),
    };
    let mut draft = Draft::new(session, Probe::ReceiptLookup, expected);
    let found = match &first {
        Some(f) => {
            draft.key(&f.key);
            Some(session.lookup(&f.key).await)
        }
        None => None,
    };
    draft.key(&never);
    let unused = session.lookup(&never).await;
    let describe = |l: &Lookup| match l {
        Lookup::Found(r) => format!("found `{}`", r.reference),
        Lookup::NotFound => "found nothing".to_string(),
        Lookup::Unavailable(why) => format!("no answer ({why})"),
    };
    if let Some(l) = &found {
        draft
            .evidence
            .notes
            .push(format!("lookup of the first effect's key: {}", describe(l)));
    }
    draft
        .evidence
        .notes
        .push(format!("lookup of a key never used: {}", describe(&unused)));
    let mut refuted = Vec::new();
    let mut unchecked = Vec::new();
    let mut found_ok = false;
    match (&first, &found) {
        (Some(f), Some(Lookup::Found(r))) if r.reference == f.reference => found_ok = true,
        (Some(f), Some(Lookup::Found(r))) => refuted.push(format!(
            "the first effect's key found `{}`, but its effect was `{}`",
            r.reference, f.reference
        )),
        (Some(f), Some(Lookup::NotFound)) => refuted.push(format!(
            "the first effect's key found nothing after `{}` was committed: a lost answer could not be settled by it",
            f.reference
        )),
        (Some(_), Some(Lookup::Unavailable(why))) => {
            unchecked.push(format!("the lookup of the first effect gave no answer ({why})"))
        }
        _ => unchecked.push("no first effect to look up".into()),
    }
    match &unused {
        Lookup::NotFound => {}
        Lookup::Found(r) => refuted.push(format!(
            "a key never used found `{}`: a false hit would settle an effect that never happened",
            r.reference
        )),
        Lookup::Unavailable(why) if found_ok => refuted.push(format!(
            "a key never used answered an error ({why}), not \"not found\": idemgate cannot tell a key never sent from a lookup that is down"
        )),
        Lookup::Unavailable(why) => unchecked.push(format!("a key never used: no answer ({why})")),
    }
    if !refuted.is_empty() {
        return draft.done(session, Verdict::Refuted, refuted.join("; "));
    }
    if !unchecked.is_empty() {
        return draft.done(session, Verdict::NotChecked, unchecked.join("; "));
    }
    draft.done(
        session,
        Verdict::Confirmed,
        "found the first effect by its key; found nothing for a key never used",
    )
}

/// What a downstream's answer to a repeat under a used key says about a second effect: the
/// first effect again, or a refusal, confirms that there was none; a new reference or job
/// refutes it; an ambiguous answer says nothing.
fn judge_repeat(
    session: &Session<'_>,
    key: &OperationKey,
    first: &First,
    outcome: &EffectOutcome,
) -> (Verdict, String) {
    let status = last_effect_status(session, key)
        .map(|s| s.to_string())
        .unwrap_or_else(|| "no status".into());
    match outcome {
        EffectOutcome::Committed(r) if r.reference == first.reference => (
            Verdict::Confirmed,
            format!("answered {status} with the first effect's `{}`", r.reference),
        ),
        EffectOutcome::Committed(r) => (
            Verdict::Refuted,
            format!("a second effect under one key: `{}`, then `{}` ({status})", first.reference, r.reference),
        ),
        EffectOutcome::Accepted { job_id } => match &first.job_id {
            Some(j) if j == job_id => (Verdict::Confirmed, format!("answered the first job `{job_id}` again")),
            Some(j) => (
                Verdict::Refuted,
                format!("a second job under one key: `{j}`, then `{job_id}`"),
            ),
            None => (Verdict::NotChecked, format!("accepted a job `{job_id}` for a key that committed at once")),
        },
        EffectOutcome::Refused(r) => (
            Verdict::Confirmed,
            format!("refused it ({status}: {}): no second effect — but a refusal cannot settle a lost answer, so recovery needs the receipt lookup", r.message),
        ),
        EffectOutcome::Ambiguous { .. } if status == "409" => (
            Verdict::Confirmed,
            "answered 409: no second effect — but a conflict cannot settle a lost answer, so recovery needs the receipt lookup".into(),
        ),
        EffectOutcome::Ambiguous { reason, .. } => (
            Verdict::NotChecked,
            format!("an ambiguous answer ({status}: {reason}): nothing can be concluded"),
        ),
        EffectOutcome::NotSent { reason, .. } => (Verdict::NotChecked, format!("not sent: {reason}")),
        EffectOutcome::PreconditionFailed(m) => (Verdict::NotChecked, format!("a failed precondition: {m}")),
    }
}

async fn same_key_resend(session: &mut Session<'_>) -> Finding {
    let first = session.first.clone().expect("checked by skip");
    let mut draft = Draft::new(
        session,
        Probe::SameKeyResend,
        format!(
            "the first effect `{}` again, or a refusal: no second effect",
            first.reference
        ),
    );
    draft.key(&first.key);
    let arguments = session.target.arguments.clone();
    let outcome = session.send(&first.key, &arguments).await;
    draft
        .evidence
        .answers
        .push(sent_answer(&first.key, &outcome));
    let (verdict, observed) = judge_repeat(session, &first.key, &first, &outcome);
    draft.done(session, verdict, observed)
}

async fn changed_request(session: &mut Session<'_>) -> Finding {
    let first = session.first.clone().expect("checked by skip");
    let contract = &session.target.contract;
    let arguments = session.target.arguments.clone();
    let mut draft = Draft::new(
        session,
        Probe::ChangedRequest,
        "`rejected` (idempotency_key_reused_with_different_request); nothing sent",
    );
    draft.key(&first.key);
    let Some((field, changed)) = crate::sample::changed(contract, &arguments) else {
        return draft.unchangeable(session);
    };
    if let (Ok(stored), Ok(incoming)) = (
        contract.fingerprint(&arguments),
        contract.fingerprint(&changed),
    ) {
        draft
            .evidence
            .fingerprints
            .push(stored.as_str().to_string());
        draft
            .evidence
            .fingerprints
            .push(incoming.as_str().to_string());
    }
    draft.evidence.notes.push(format!("`{field}` changed"));
    let before = session.sent();
    let outcome = session.deliver("first", &changed).await;
    draft.evidence.answers.push(answer(&first.key, &outcome));
    let sent = session.sent() - before;
    let mismatch =
        outcome.error_code() == Some(ErrorCode::IdempotencyKeyReusedWithDifferentRequest);
    if sent > 0 || is_effect(&outcome) {
        return draft.done(
            session,
            Verdict::Refuted,
            format!(
                "`{}` after sending {sent} requests: a changed request borrowed the key",
                outcome.status.as_str()
            ),
        );
    }
    match (outcome.status, mismatch) {
        (Status::Rejected, true) => draft.done(
            session,
            Verdict::Confirmed,
            format!("`rejected` for the changed `{field}`; nothing sent"),
        ),
        (status, _) => draft.done(
            session,
            Verdict::NotChecked,
            format!("`{}` ({})", status.as_str(), detail(&outcome)),
        ),
    }
}

async fn changed_request_resend(session: &mut Session<'_>) -> Finding {
    let first = session.first.clone().expect("checked by skip");
    let contract = &session.target.contract;
    let arguments = session.target.arguments.clone();
    let mut draft = Draft::new(
        session,
        Probe::ChangedRequestResend,
        format!(
            "a refusal, or the first effect `{}`: no second effect",
            first.reference
        ),
    );
    draft.key(&first.key);
    let Some((field, changed)) = crate::sample::changed(contract, &arguments) else {
        return draft.unchangeable(session);
    };
    draft.evidence.notes.push(format!("`{field}` changed"));
    let outcome = session.send(&first.key, &changed).await;
    draft
        .evidence
        .answers
        .push(sent_answer(&first.key, &outcome));
    let (verdict, observed) = judge_repeat(session, &first.key, &first, &outcome);
    let observed = match verdict {
        Verdict::Refuted => format!("accepted a changed request under a used key — {observed}"),
        Verdict::Confirmed | Verdict::NotChecked => observed,
    };
    draft.done(session, verdict, observed)
}

/// The downstream commits, and the answer is lost (`Drop`), replaced by a 5xx (`Error`) or
/// broken (`Malformed`) on its way back.
async fn broken_answer(
    session: &mut Session<'_>,
    probe: Probe,
    fault: Fault,
    deadline: Instant,
) -> Finding {
    let cf = &session.target.contract.file;
    let path = recovery_path(cf);
    let expected = match path {
        Some(path) => format!(
            "settled by {path}: `applied` or `replayed` naming the one effect the downstream committed"
        ),
        None => "`unknown`: nothing can prove the effect, and nothing is sent again".to_string(),
    };
    let mut draft = Draft::new(session, probe, expected);
    let key = session.key(probe.id());
    draft.key(&key);
    session.script(Rule::for_key(key.as_str(), 1, fault));
    let arguments = session.target.arguments.clone();
    let answered = session.deliver(probe.id(), &arguments).await;
    let settled = session.settle(&key, answered, deadline).await;
    record_settled(&mut draft, &key, &settled);
    let committed = session.committed(&key);
    // The request whose answer the proxy broke: the key's first, never a lookup or a poll.
    let first_status = session
        .exchanges(&key)
        .into_iter()
        .next()
        .and_then(|e| e.upstream.first().and_then(|u| u.status));
    if first_status.is_none_or(|s| !(200..300).contains(&s)) {
        return draft.done(
            session,
            Verdict::NotChecked,
            format!(
                "the downstream did not commit the request whose answer was to be broken ({})",
                first_status.map_or("no answer".into(), |s| s.to_string())
            ),
        );
    }
    if committed.len() > 1 {
        return draft.done(
            session,
            Verdict::Refuted,
            format!(
                "one key reached the downstream's commit twice: {}",
                quoted(&committed)
            ),
        );
    }
    let outcome = &settled.outcome;
    match outcome.status {
        Status::Applied | Status::Replayed => {
            let reference = outcome.effect_reference.clone().unwrap_or_default();
            match committed.first() {
                Some(c) if *c == reference || c.starts_with("job ") => draft.done(
                    session,
                    Verdict::Confirmed,
                    format!("`{}` with `{reference}`, the one effect the downstream committed", outcome.status.as_str()),
                ),
                Some(c) => draft.done(
                    session,
                    Verdict::Refuted,
                    format!("`{}` with `{reference}`, but the downstream committed `{c}`", outcome.status.as_str()),
                ),
                None => draft.done(
                    session,
                    Verdict::Confirmed,
                    format!("`{}` with `{reference}`", outcome.status.as_str()),
                ),
            }
        }
        Status::Unknown => match path {
            None => draft.done(
                session,
                Verdict::Confirmed,
                "`unknown`, sent once: nothing can prove the effect, as the contract says",
            ),
            Some(path) => draft.done(
                session,
                Verdict::Refuted,
                format!("`unknown` although the contract says {path} settles it ({}); the downstream committed {}", detail(outcome), quoted(&committed)),
            ),
        },
        Status::Rejected if outcome.safe_to_repeat() => draft.done(
            session,
            Verdict::Refuted,
            format!("`rejected` as safe to repeat after the downstream committed ({})", detail(outcome)),
        ),
        Status::Rejected => draft.done(
            session,
            Verdict::NotChecked,
            format!("`rejected` ({})", detail(outcome)),
        ),
        Status::InFlight => draft.done(
            session,
            Verdict::NotChecked,
            "still in flight when the probe's time ran out (left for the recoverer)",
        ),
    }
}

async fn concurrent_deliveries(session: &mut Session<'_>, deadline: Instant) -> Finding {
    let n = session.options.concurrency;
    let mut draft = Draft::new(
        session,
        Probe::ConcurrentDeliveries,
        format!("{n} deliveries at once: one effect; every `applied` or `replayed` names it"),
    );
    let probe = Probe::ConcurrentDeliveries.id();
    let key = session.key(probe);
    draft.key(&key);
    let arguments = session.target.arguments.clone();
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..n {
        let app = session.app.clone();
        let caller = session.caller.clone();
        let tool = session.target.tool().to_string();
        let workflow = session.workflow(probe);
        let arguments = arguments.clone();
        calls.spawn(async move {
            app.invoke(
                caller,
                &tool,
                Some(workflow),
                Some(crate::session::STEP.into()),
                arguments,
            )
            .await
        });
    }
    let mut answers = Vec::new();
    while let Some(joined) = calls.join_next().await {
        if let Ok(outcome) = joined {
            answers.push(outcome);
        }
    }
    let applied = answers
        .iter()
        .filter(|o| o.status == Status::Applied)
        .count();
    let mut references = Vec::new();
    for outcome in answers {
        let settled = session.settle(&key, outcome, deadline).await;
        record_settled(&mut draft, &key, &settled);
        if is_effect(&settled.outcome)
            && let Some(r) = &settled.outcome.effect_reference
            && !references.contains(r)
        {
            references.push(r.clone());
        }
    }
    let committed = session.committed(&key);
    if committed.len() > 1 || references.len() > 1 {
        let mut all = committed.clone();
        all.extend(
            references
                .iter()
                .filter(|r| !committed.contains(r))
                .cloned(),
        );
        return draft.done(
            session,
            Verdict::Refuted,
            format!(
                "{n} deliveries of one key made or named more than one effect: {}",
                quoted(&all)
            ),
        );
    }
    if applied > 1 {
        return draft.done(
            session,
            Verdict::Refuted,
            format!("{applied} deliveries each answered `applied`: only one performed the effect"),
        );
    }
    match references.first() {
        Some(r) => draft.done(
            session,
            Verdict::Confirmed,
            format!("one effect `{r}`: {applied} `applied`, the others replayed or waited for it"),
        ),
        None => draft.done(
            session,
            Verdict::NotChecked,
            "no delivery settled to an effect within the probe's time",
        ),
    }
}

async fn concurrent_resends(session: &mut Session<'_>) -> Finding {
    let n = session.options.concurrency;
    let mut draft = Draft::new(
        session,
        Probe::ConcurrentResends,
        format!(
            "{n} requests of one key at once: one effect (the others answer it, or are refused)"
        ),
    );
    let key = session.key(Probe::ConcurrentResends.id());
    draft.key(&key);
    let arguments = session.target.arguments.clone();
    let sends = (0..n).map(|_| session.send(&key, &arguments));
    let outcomes = futures_util::future::join_all(sends).await;
    let mut answered: Vec<String> = Vec::new();
    for outcome in &outcomes {
        draft.evidence.answers.push(sent_answer(&key, outcome));
        let named = match outcome {
            EffectOutcome::Committed(r) => Some(r.reference.clone()),
            EffectOutcome::Accepted { job_id } => Some(format!("job {job_id}")),
            _ => None,
        };
        if let Some(named) = named
            && !answered.contains(&named)
        {
            answered.push(named);
        }
    }
    let mut effects = session.committed(&key);
    for named in answered {
        if !effects.contains(&named) {
            effects.push(named);
        }
    }
    match effects.len() {
        0 => draft.done(
            session,
            Verdict::NotChecked,
            "no request committed: nothing can be concluded",
        ),
        1 => draft.done(
            session,
            Verdict::Confirmed,
            format!("one effect `{}` for {n} requests at once", effects[0]),
        ),
        k => draft.done(
            session,
            Verdict::Refuted,
            format!(
                "{n} requests of one key at once made {k} effects: {}",
                quoted(&effects)
            ),
        ),
    }
}
