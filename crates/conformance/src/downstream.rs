//! [`FakeDownstream`]: an in-process system of record that counts effects on its own side.
//!
//! The executor keeps its own record of what it did; this fake keeps a separate table of every
//! effect it committed, keyed by the idempotency key it received (the operation key). Scenario
//! tests assert on this table, so a green executor result cannot hide a duplicate effect.
//!
//! Its behaviour is set per test and may change during one:
//!
//! - [`FakeDownstream::set_deduplicates`] — a second request under a committed key answers the
//!   original receipt without a new effect (a key-based API such as a payment provider's).
//! - [`FakeDownstream::set_receipt_lookup`] — whether [`Downstream::lookup_receipt`] can find a
//!   committed effect by key, or answers [`Lookup::Unavailable`].
//! - [`FakeDownstream::push_fault`] — a queue of scripted [`Fault`]s, each applying to one
//!   upcoming `perform` call in arrival order: commit then drop the answer, commit then fail,
//!   refuse, never receive, accept a job, answer slowly.
//! - [`FakeDownstream::before_commit`] and [`FakeDownstream::after_commit`] — [`Gate`]s around
//!   the commit, to pause a worker with its request arrived or its effect committed.
//!
//! Both knobs are off by default: the strictest downstream, where any executor bug shows up as
//! a duplicate effect rather than being absorbed by the fake.
//!
//! Receipts are `ticket_<n>` from one counter per fake (shared by its clones), so references
//! are unique within a system of record and the same on every run of a test, as deterministic
//! simulation needs. A receipt's result is `{"ticket_id": …, "key": …}`: the request body is
//! never echoed, as a replay-safe response should not.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idemgate_core::ErrorCode;
use idemgate_core::effect::{Downstream, EffectOutcome, EffectRequest, JobStatus, Lookup};
use idemgate_core::key::OperationKey;
use idemgate_core::record::{Receipt, Refusal};
use idemgate_core::store::BoxFuture;
use serde_json::{Value, json};

use crate::gate::Gate;

/// A scripted misbehaviour for one `perform` call.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Commit the effect, then answer [`EffectOutcome::Ambiguous`] as if the connection dropped
    /// before the response arrived.
    CommitThenDrop,
    /// Commit the effect, then answer ambiguous as a `500` would be.
    CommitThenFail,
    /// Commit the effect, then answer ambiguous as an unparseable body would be.
    Malformed,
    /// No effect; a deterministic refusal.
    Refuse { code: ErrorCode, message: String },
    /// No effect; provably never sent (connection refused). The request does not arrive, so
    /// neither gate is passed.
    NotSent,
    /// No effect, but the caller cannot know: a timeout where the request never arrived. Neither
    /// gate is passed.
    Timeout,
    /// Accept an asynchronous job and answer [`EffectOutcome::Accepted`]; the effect commits
    /// when the test calls [`FakeDownstream::complete_job`].
    AcceptJob,
    /// Commit the effect, then hold the answer this long: a slow downstream that did the work.
    /// A caller that gives up meanwhile sees a timeout while the effect exists.
    Delay(Duration),
    /// No effect; the version precondition did not hold.
    PreconditionFailed,
    /// A `503 Service Unavailable` with `Retry-After`: ambiguous (a 5xx may come after a
    /// commit), with the downstream's advice on when to ask again. Commits first when `commit`.
    Unavailable { retry_after: u64, commit: bool },
}

/// Reasons the fake gives in ambiguous and not-sent answers.
pub mod reason {
    pub const DROPPED: &str = "connection reset after the request was sent";
    pub const SERVER_ERROR: &str = "downstream answered 500 Internal Server Error";
    pub const MALFORMED: &str = "downstream answered a malformed body";
    pub const TIMEOUT: &str = "timed out waiting for the downstream";
    pub const REFUSED_CONNECTION: &str = "connection refused";
    pub const PRECONDITION: &str = "version precondition did not hold";
    pub const UNAVAILABLE: &str = "downstream answered 503 Service Unavailable";
}

/// One committed effect, as the system of record sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    /// The idempotency key the effect was requested under.
    pub key: OperationKey,
    pub reference: String,
    /// The fencing token of the attempt that caused it.
    pub attempt: u64,
    /// The arguments received, kept on the fake's side only so tests can check what was done.
    pub arguments: Value,
}

/// The state of an accepted job.
#[derive(Debug, Clone, PartialEq)]
pub enum JobState {
    Running,
    Done(Receipt),
    Failed(Refusal),
}

#[derive(Debug)]
struct Job {
    key: OperationKey,
    /// What the effect is made of once the job completes.
    attempt: u64,
    arguments: Value,
    state: JobState,
}

/// A fake system of record. Clones share one table, one set of knobs and the same gates, so
/// one clone can go to the executor while the test keeps another.
#[derive(Clone, Debug, Default)]
pub struct FakeDownstream {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    // A std mutex: held for table updates only, never across an await (the gates and delays
    // are awaited with it released).
    state: Mutex<State>,
    before_commit: Gate,
    after_commit: Gate,
}

#[derive(Debug, Default)]
struct State {
    deduplicates: bool,
    receipt_lookup: bool,
    faults: VecDeque<Fault>,
    /// Every committed effect, in commit order, duplicates included.
    effects: Vec<Effect>,
    /// The first receipt committed under each key: what deduplication and lookup answer.
    receipts: HashMap<OperationKey, Receipt>,
    /// Accepted jobs by id, and their ids in acceptance order.
    jobs: HashMap<String, Job>,
    job_order: Vec<String>,
    /// Jobs whose polls answer `Gone`.
    forgotten: Vec<String>,
    tickets: u64,
    /// What references start with; `ticket` unless set, so two fakes can be told apart.
    reference_prefix: Option<String>,
    calls: u64,
    /// The arguments of every `perform` call received, in order, whatever became of it.
    sent: Vec<Value>,
    deduplicated: u64,
    lookups: u64,
    polls: u64,
}

impl State {
    /// Commits the effect of one request — or, when deduplicating and the key already has an
    /// effect, answers that effect's receipt without a new one.
    fn commit(&mut self, key: &OperationKey, attempt: u64, arguments: &Value) -> Receipt {
        if self.deduplicates
            && let Some(receipt) = self.receipts.get(key)
        {
            self.deduplicated += 1;
            return receipt.clone();
        }
        self.tickets += 1;
        let prefix = self.reference_prefix.as_deref().unwrap_or("ticket");
        let reference = format!("{prefix}_{}", self.tickets);
        let receipt = Receipt {
            result: json!({ "ticket_id": reference, "key": key.as_str() }),
            reference: reference.clone(),
        };
        self.effects.push(Effect {
            key: key.clone(),
            reference,
            attempt,
            arguments: arguments.clone(),
        });
        self.receipts
            .entry(key.clone())
            .or_insert_with(|| receipt.clone());
        receipt
    }

    fn job_mut(&mut self, job_id: &str) -> &mut Job {
        match self.jobs.get_mut(job_id) {
            Some(job) => job,
            None => panic!("FakeDownstream: no job `{job_id}` was accepted"),
        }
    }
}

/// What `perform` does once the request has arrived.
enum Plan {
    /// Commit, then answer as given.
    Commit(Answer),
    Refuse(Refusal),
    PreconditionFailed,
    AcceptJob,
}

enum Answer {
    Receipt,
    Ambiguous(&'static str),
    /// A 503 with this `Retry-After` after the commit.
    Busy(u64),
    Slow(Duration),
}

impl FakeDownstream {
    /// A downstream that neither deduplicates nor offers a receipt lookup, with no faults.
    pub fn new() -> FakeDownstream {
        FakeDownstream::default()
    }

    /// Builder form of [`set_deduplicates`](FakeDownstream::set_deduplicates).
    pub fn deduplicating(self, on: bool) -> FakeDownstream {
        self.set_deduplicates(on);
        self
    }

    /// Builder form of [`set_receipt_lookup`](FakeDownstream::set_receipt_lookup).
    pub fn with_receipt_lookup(self, on: bool) -> FakeDownstream {
        self.set_receipt_lookup(on);
        self
    }

    /// References this fake hands out start with `prefix` (`ticket` by default): two fakes
    /// then never give the same reference, and a test can tell whose effect a record names.
    pub fn with_reference_prefix(self, prefix: &str) -> FakeDownstream {
        self.set_reference_prefix(prefix);
        self
    }

    /// Sets what later references start with (see
    /// [`with_reference_prefix`](FakeDownstream::with_reference_prefix)).
    pub fn set_reference_prefix(&self, prefix: &str) {
        self.lock().reference_prefix = Some(prefix.to_string());
    }

    /// Builder form of [`push_fault`](FakeDownstream::push_fault).
    pub fn with_fault(self, fault: Fault) -> FakeDownstream {
        self.push_fault(fault);
        self
    }

    /// Whether a request under a key that already has an effect answers the original receipt
    /// instead of committing another effect.
    pub fn set_deduplicates(&self, on: bool) {
        self.lock().deduplicates = on;
    }

    /// Whether [`Downstream::lookup_receipt`] can find effects; when off it answers
    /// [`Lookup::Unavailable`].
    pub fn set_receipt_lookup(&self, on: bool) {
        self.lock().receipt_lookup = on;
    }

    /// Queues a fault for the next `perform` call that has no fault queued before it.
    pub fn push_fault(&self, fault: Fault) {
        self.lock().faults.push_back(fault);
    }

    /// Queues several faults, one per upcoming call, in order.
    pub fn push_faults(&self, faults: impl IntoIterator<Item = Fault>) {
        self.lock().faults.extend(faults);
    }

    /// Drops every fault not yet used.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// Faults queued and not yet used.
    pub fn faults_pending(&self) -> usize {
        self.lock().faults.len()
    }

    /// Passed when a request has arrived, before anything is committed.
    pub fn before_commit(&self) -> &Gate {
        &self.inner.before_commit
    }

    /// Passed after the effect is committed, before the answer goes back.
    pub fn after_commit(&self) -> &Gate {
        &self.inner.after_commit
    }

    /// Effects committed, every one counted: duplicates under one key included.
    pub fn effects(&self) -> usize {
        self.lock().effects.len()
    }

    /// Effects committed under one key.
    pub fn effects_for(&self, key: &OperationKey) -> usize {
        self.lock().effects.iter().filter(|e| &e.key == key).count()
    }

    /// Every committed effect, in commit order.
    pub fn effect_log(&self) -> Vec<Effect> {
        self.lock().effects.clone()
    }

    /// The first receipt committed under `key`, read directly from the table (not counted as
    /// a lookup, and regardless of whether lookups are offered).
    pub fn receipt_for(&self, key: &OperationKey) -> Option<Receipt> {
        self.lock().receipts.get(key).cloned()
    }

    /// `perform` calls received, whatever became of them.
    pub fn calls(&self) -> u64 {
        self.lock().calls
    }

    /// The arguments each `perform` call carried, in order — resends and refused calls too.
    pub fn sent_arguments(&self) -> Vec<Value> {
        self.lock().sent.clone()
    }

    /// `perform` calls answered from the deduplication table without a new effect.
    pub fn deduplicated(&self) -> u64 {
        self.lock().deduplicated
    }

    /// `lookup_receipt` calls received.
    pub fn lookups(&self) -> u64 {
        self.lock().lookups
    }

    /// `poll_job` calls received.
    pub fn polls(&self) -> u64 {
        self.lock().polls
    }

    /// Ids of every accepted job, in acceptance order.
    pub fn job_ids(&self) -> Vec<String> {
        self.lock().job_order.clone()
    }

    /// The state of an accepted job, if there is one with this id.
    pub fn job(&self, job_id: &str) -> Option<JobState> {
        self.lock().jobs.get(job_id).map(|job| job.state.clone())
    }

    /// Finishes a running job: commits its effect (deduplicated like a request) and returns the
    /// receipt that polling will report. Panics if the job is unknown or already finished,
    /// because that is a broken test.
    pub fn complete_job(&self, job_id: &str) -> Receipt {
        let mut state = self.lock();
        let job = state.job_mut(job_id);
        if job.state != JobState::Running {
            panic!(
                "FakeDownstream: job `{job_id}` already finished: {:?}",
                job.state
            );
        }
        let (key, attempt, arguments) = (job.key.clone(), job.attempt, job.arguments.clone());
        let receipt = state.commit(&key, attempt, &arguments);
        state.job_mut(job_id).state = JobState::Done(receipt.clone());
        receipt
    }

    /// Fails a running job without an effect; polling reports the refusal. Panics if the job is
    /// unknown or already finished.
    pub fn fail_job(&self, job_id: &str, message: &str) -> Refusal {
        let mut state = self.lock();
        let job = state.job_mut(job_id);
        if job.state != JobState::Running {
            panic!(
                "FakeDownstream: job `{job_id}` already finished: {:?}",
                job.state
            );
        }
        let refusal = Refusal {
            code: ErrorCode::DownstreamRejected,
            message: message.to_string(),
        };
        job.state = JobState::Failed(refusal.clone());
        refusal
    }

    /// Forgets a job, as a downstream that expired or lost it: its polls answer `Gone`.
    pub fn forget_job(&self, job_id: &str) {
        self.lock().forgotten.push(job_id.to_string());
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A test that panicked with the lock held reports itself; the table stays readable.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Downstream for FakeDownstream {
    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        Box::pin(async move {
            let fault = {
                let mut state = self.lock();
                state.calls += 1;
                state.sent.push(request.arguments.clone());
                state.faults.pop_front()
            };
            let plan = match fault {
                None => Plan::Commit(Answer::Receipt),
                // These two never reach the system of record: no gate, no effect.
                Some(Fault::NotSent) => {
                    return EffectOutcome::NotSent {
                        reason: reason::REFUSED_CONNECTION.into(),
                        retry_after: None,
                    };
                }
                Some(Fault::Timeout) => {
                    return EffectOutcome::ambiguous(reason::TIMEOUT);
                }
                Some(Fault::CommitThenDrop) => Plan::Commit(Answer::Ambiguous(reason::DROPPED)),
                Some(Fault::CommitThenFail) => {
                    Plan::Commit(Answer::Ambiguous(reason::SERVER_ERROR))
                }
                Some(Fault::Malformed) => Plan::Commit(Answer::Ambiguous(reason::MALFORMED)),
                Some(Fault::Delay(d)) => Plan::Commit(Answer::Slow(d)),
                Some(Fault::Refuse { code, message }) => Plan::Refuse(Refusal { code, message }),
                Some(Fault::PreconditionFailed) => Plan::PreconditionFailed,
                Some(Fault::AcceptJob) => Plan::AcceptJob,
                Some(Fault::Unavailable {
                    retry_after,
                    commit: false,
                }) => {
                    return EffectOutcome::Ambiguous {
                        reason: reason::UNAVAILABLE.into(),
                        retry_after: Some(retry_after),
                    };
                }
                Some(Fault::Unavailable {
                    retry_after,
                    commit: true,
                }) => Plan::Commit(Answer::Busy(retry_after)),
            };

            self.inner.before_commit.pass().await;

            let answer = match plan {
                Plan::Refuse(refusal) => return EffectOutcome::Refused(refusal),
                Plan::PreconditionFailed => {
                    return EffectOutcome::PreconditionFailed(reason::PRECONDITION.into());
                }
                Plan::AcceptJob => return self.accept_job(&request),
                Plan::Commit(answer) => answer,
            };

            let receipt = self
                .lock()
                .commit(request.key, request.attempt, request.arguments);
            self.inner.after_commit.pass().await;
            match answer {
                Answer::Receipt => EffectOutcome::Committed(receipt),
                Answer::Ambiguous(reason) => EffectOutcome::ambiguous(reason),
                Answer::Busy(retry_after) => EffectOutcome::Ambiguous {
                    reason: reason::UNAVAILABLE.into(),
                    retry_after: Some(retry_after),
                },
                Answer::Slow(delay) => {
                    tokio::time::sleep(delay).await;
                    EffectOutcome::Committed(receipt)
                }
            }
        })
    }

    fn lookup_receipt<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        // Like a request on the wire, nothing is counted or read until the future is polled.
        Box::pin(async move {
            let mut state = self.lock();
            state.lookups += 1;
            if !state.receipt_lookup {
                Lookup::Unavailable("this downstream offers no receipt lookup".into())
            } else {
                match state.receipts.get(key) {
                    Some(receipt) => Lookup::Found(receipt.clone()),
                    None => Lookup::NotFound,
                }
            }
        })
    }

    fn poll_job<'a>(&'a self, key: &'a OperationKey, job_id: &'a str) -> BoxFuture<'a, JobStatus> {
        Box::pin(async move {
            let mut state = self.lock();
            state.polls += 1;
            if state.forgotten.iter().any(|id| id == job_id) {
                return JobStatus::Gone(format!("job `{job_id}` is no longer known"));
            }
            match state.jobs.get(job_id) {
                // Like a poll answered 404: the downstream no longer knows the job.
                None => JobStatus::Gone(format!("no job `{job_id}`")),
                // Answering another operation's job would let one key settle another's record.
                Some(job) if &job.key != key => {
                    JobStatus::Unavailable(format!("job `{job_id}` belongs to another operation"))
                }
                Some(job) => match &job.state {
                    JobState::Running => JobStatus::Running,
                    JobState::Done(receipt) => JobStatus::Done(receipt.clone()),
                    JobState::Failed(refusal) => JobStatus::Failed(refusal.clone()),
                },
            }
        })
    }
}

impl FakeDownstream {
    /// Accepts a job for the request. A deduplicating downstream answers a key that already has
    /// an effect with its receipt, and a key with a running job with that job.
    fn accept_job(&self, request: &EffectRequest<'_>) -> EffectOutcome {
        let mut state = self.lock();
        if state.deduplicates {
            if let Some(receipt) = state.receipts.get(request.key) {
                let receipt = receipt.clone();
                state.deduplicated += 1;
                return EffectOutcome::Committed(receipt);
            }
            let running = state.job_order.iter().find(|id| {
                let job = &state.jobs[id.as_str()];
                &job.key == request.key && job.state == JobState::Running
            });
            if let Some(job_id) = running {
                let job_id = job_id.clone();
                state.deduplicated += 1;
                return EffectOutcome::Accepted { job_id };
            }
        }
        let job_id = format!("job_{}", state.job_order.len() + 1);
        state.jobs.insert(
            job_id.clone(),
            Job {
                key: request.key.clone(),
                attempt: request.attempt,
                arguments: request.arguments.clone(),
                state: JobState::Running,
            },
        );
        state.job_order.push(job_id.clone());
        EffectOutcome::Accepted { job_id }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::bounded;

    fn key(step: &str) -> OperationKey {
        OperationKey::new("acme", "test", "wf", step).unwrap()
    }

    fn args() -> Value {
        json!({"title": "printer on fire", "secret_note": "do not echo"})
    }

    async fn perform(fake: &FakeDownstream, key: &OperationKey) -> EffectOutcome {
        let arguments = args();
        fake.perform(EffectRequest {
            key,
            tool: "create_ticket",
            tool_version: "1",
            arguments: &arguments,
            attempt: 1,
            precondition: None,
        })
        .await
    }

    fn committed(reference: &str, key: &OperationKey) -> EffectOutcome {
        EffectOutcome::Committed(Receipt {
            reference: reference.into(),
            result: json!({"ticket_id": reference, "key": key.as_str()}),
        })
    }

    fn ambiguous(reason: &str) -> EffectOutcome {
        EffectOutcome::ambiguous(reason)
    }

    #[tokio::test]
    async fn counts_duplicates_when_not_deduplicating() {
        let fake = FakeDownstream::new();
        let k = key("s1");
        assert_eq!(perform(&fake, &k).await, committed("ticket_1", &k));
        assert_eq!(perform(&fake, &k).await, committed("ticket_2", &k));
        assert_eq!(fake.effects(), 2);
        assert_eq!(fake.effects_for(&k), 2);
        assert_eq!(fake.effects_for(&key("other")), 0);
        assert_eq!((fake.calls(), fake.deduplicated()), (2, 0));
        // The first receipt stays the one a lookup would find.
        assert_eq!(fake.receipt_for(&k).unwrap().reference, "ticket_1");
    }

    #[tokio::test]
    async fn deduplicates_on_the_key_when_asked() {
        let fake = FakeDownstream::new().deduplicating(true);
        let (k1, k2) = (key("s1"), key("s2"));
        assert_eq!(perform(&fake, &k1).await, committed("ticket_1", &k1));
        assert_eq!(perform(&fake, &k1).await, committed("ticket_1", &k1));
        assert_eq!(perform(&fake, &k2).await, committed("ticket_2", &k2));
        assert_eq!((fake.effects(), fake.effects_for(&k1)), (2, 1));
        assert_eq!((fake.calls(), fake.deduplicated()), (3, 1));
        // A knob changed mid-test takes effect on the next call.
        fake.set_deduplicates(false);
        perform(&fake, &k1).await;
        assert_eq!(fake.effects_for(&k1), 2);
    }

    #[tokio::test]
    async fn receipts_never_echo_the_request() {
        let fake = FakeDownstream::new();
        let k = key("s1");
        let EffectOutcome::Committed(receipt) = perform(&fake, &k).await else {
            panic!("expected a commit");
        };
        assert!(!receipt.result.to_string().contains("do not echo"));
        // The fake's own log keeps what it received, for assertions.
        assert_eq!(fake.effect_log()[0].arguments, args());
    }

    #[tokio::test]
    async fn lookup_finds_committed_effects_only_when_offered() {
        let fake = FakeDownstream::new();
        let k = key("s1");
        perform(&fake, &k).await;
        assert!(matches!(
            fake.lookup_receipt(&k).await,
            Lookup::Unavailable(_)
        ));
        fake.set_receipt_lookup(true);
        assert_eq!(
            fake.lookup_receipt(&k).await,
            Lookup::Found(fake.receipt_for(&k).unwrap())
        );
        assert_eq!(fake.lookup_receipt(&key("s2")).await, Lookup::NotFound);
        assert_eq!(fake.lookups(), 3);
    }

    /// One fault, one call: what the caller is told, and how many effects the downstream has.
    async fn check(fault: Fault, expect: EffectOutcome, effects: usize) {
        let fake = FakeDownstream::new()
            .with_receipt_lookup(true)
            .with_fault(fault.clone());
        let k = key("s1");
        assert_eq!(perform(&fake, &k).await, expect, "{fault:?}");
        assert_eq!(fake.effects(), effects, "{fault:?}: effects");
        assert_eq!(fake.effects_for(&k), effects, "{fault:?}: effects for key");
        let lookup = fake.lookup_receipt(&k).await;
        assert_eq!(
            matches!(lookup, Lookup::Found(_)),
            effects == 1,
            "{fault:?}: lookup {lookup:?}"
        );
        // The fault was used up: the next call behaves normally.
        assert_eq!(fake.faults_pending(), 0);
        let reference = format!("ticket_{}", effects + 1);
        assert_eq!(perform(&fake, &k).await, committed(&reference, &k));
    }

    #[tokio::test]
    async fn each_fault_does_what_it_says_on_the_downstream_side() {
        check(Fault::CommitThenDrop, ambiguous(reason::DROPPED), 1).await;
        check(Fault::CommitThenFail, ambiguous(reason::SERVER_ERROR), 1).await;
        check(Fault::Malformed, ambiguous(reason::MALFORMED), 1).await;
        check(Fault::Timeout, ambiguous(reason::TIMEOUT), 0).await;
        let not_sent = EffectOutcome::NotSent {
            reason: reason::REFUSED_CONNECTION.into(),
            retry_after: None,
        };
        check(Fault::NotSent, not_sent, 0).await;
        let refusal = Refusal {
            code: ErrorCode::DownstreamRejected,
            message: "queue closed".into(),
        };
        let refuse = Fault::Refuse {
            code: refusal.code,
            message: refusal.message.clone(),
        };
        check(refuse, EffectOutcome::Refused(refusal), 0).await;
        let precondition = EffectOutcome::PreconditionFailed(reason::PRECONDITION.into());
        check(Fault::PreconditionFailed, precondition, 0).await;
        let k = key("s1");
        check(Fault::Delay(Duration::ZERO), committed("ticket_1", &k), 1).await;
        let job = EffectOutcome::Accepted {
            job_id: "job_1".into(),
        };
        check(Fault::AcceptJob, job, 0).await;
    }

    #[tokio::test]
    async fn faults_apply_to_one_call_each_in_order() {
        let fake = FakeDownstream::new();
        fake.push_faults([Fault::NotSent, Fault::CommitThenDrop]);
        let k = key("s1");
        assert!(matches!(
            perform(&fake, &k).await,
            EffectOutcome::NotSent { .. }
        ));
        assert_eq!(perform(&fake, &k).await, ambiguous(reason::DROPPED));
        assert_eq!(perform(&fake, &k).await, committed("ticket_2", &k));
        assert_eq!((fake.calls(), fake.effects()), (3, 2));
    }

    #[tokio::test]
    async fn commit_then_drop_with_dedup_answers_the_original_on_resend() {
        let fake = FakeDownstream::new()
            .deduplicating(true)
            .with_fault(Fault::CommitThenDrop);
        let k = key("s1");
        assert_eq!(perform(&fake, &k).await, ambiguous(reason::DROPPED));
        assert_eq!(perform(&fake, &k).await, committed("ticket_1", &k));
        assert_eq!(fake.effects(), 1);
    }

    #[tokio::test]
    async fn a_job_commits_when_completed() {
        let fake = FakeDownstream::new()
            .with_receipt_lookup(true)
            .with_fault(Fault::AcceptJob);
        let k = key("s1");
        let EffectOutcome::Accepted { job_id } = perform(&fake, &k).await else {
            panic!("expected an accepted job");
        };
        assert_eq!(fake.poll_job(&k, &job_id).await, JobStatus::Running);
        assert_eq!(fake.lookup_receipt(&k).await, Lookup::NotFound);
        assert_eq!(fake.effects(), 0);
        let receipt = fake.complete_job(&job_id);
        assert_eq!(fake.effects(), 1);
        assert_eq!(
            fake.poll_job(&k, &job_id).await,
            JobStatus::Done(receipt.clone())
        );
        assert_eq!(fake.lookup_receipt(&k).await, Lookup::Found(receipt));
        // Another operation cannot read this job.
        assert!(matches!(
            fake.poll_job(&key("s2"), &job_id).await,
            JobStatus::Unavailable(_)
        ));
        assert!(matches!(
            fake.poll_job(&k, "job_99").await,
            JobStatus::Gone(_)
        ));
        assert_eq!(fake.polls(), 4);
    }

    #[tokio::test]
    async fn a_failed_job_has_no_effect() {
        let fake = FakeDownstream::new().with_fault(Fault::AcceptJob);
        let k = key("s1");
        perform(&fake, &k).await;
        let job_id = fake.job_ids().pop().unwrap();
        let refusal = fake.fail_job(&job_id, "render failed");
        assert_eq!(fake.poll_job(&k, &job_id).await, JobStatus::Failed(refusal));
        assert_eq!(fake.effects(), 0);
    }

    #[tokio::test]
    async fn a_deduplicating_downstream_answers_a_resend_with_the_running_job() {
        let fake = FakeDownstream::new().deduplicating(true);
        fake.push_faults([Fault::AcceptJob, Fault::AcceptJob, Fault::AcceptJob]);
        let k = key("s1");
        let first = perform(&fake, &k).await;
        assert_eq!(perform(&fake, &k).await, first);
        assert_eq!(fake.job_ids(), ["job_1"]);
        let receipt = fake.complete_job("job_1");
        assert_eq!(perform(&fake, &k).await, EffectOutcome::Committed(receipt));
        assert_eq!(fake.effects(), 1);
    }

    #[tokio::test]
    #[should_panic(expected = "already finished")]
    async fn completing_a_job_twice_is_a_test_bug() {
        let fake = FakeDownstream::new().with_fault(Fault::AcceptJob);
        perform(&fake, &key("s1")).await;
        fake.complete_job("job_1");
        fake.complete_job("job_1");
    }

    #[tokio::test]
    async fn before_commit_gate_holds_the_request_before_any_effect() {
        let fake = FakeDownstream::new();
        fake.before_commit().arm();
        let k = key("s1");
        let worker = tokio::spawn({
            let (fake, k) = (fake.clone(), k.clone());
            async move { perform(&fake, &k).await }
        });
        fake.before_commit().reached().await;
        assert_eq!((fake.calls(), fake.effects()), (1, 0));
        fake.before_commit().release();
        assert_eq!(
            bounded("worker", worker).await.unwrap(),
            committed("ticket_1", &k)
        );
        assert_eq!(fake.effects(), 1);
    }

    #[tokio::test]
    async fn after_commit_gate_holds_the_answer_of_a_committed_effect() {
        let fake = FakeDownstream::new().with_receipt_lookup(true);
        fake.after_commit().arm_nth(1);
        let k = key("s1");
        let worker = tokio::spawn({
            let (fake, k) = (fake.clone(), k.clone());
            async move { perform(&fake, &k).await }
        });
        fake.after_commit().reached().await;
        // The effect exists and is visible to a lookup while its first answer is held.
        assert_eq!(fake.effects(), 1);
        assert!(matches!(fake.lookup_receipt(&k).await, Lookup::Found(_)));
        assert!(!worker.is_finished());
        fake.after_commit().release();
        assert_eq!(
            bounded("worker", worker).await.unwrap(),
            committed("ticket_1", &k)
        );
    }

    #[tokio::test]
    async fn gates_are_not_passed_by_requests_that_never_arrive() {
        let fake = FakeDownstream::new();
        fake.push_faults([
            Fault::NotSent,
            Fault::Timeout,
            Fault::Refuse {
                code: ErrorCode::DownstreamRejected,
                message: "no".into(),
            },
        ]);
        let k = key("s1");
        for _ in 0..3 {
            perform(&fake, &k).await;
        }
        assert_eq!(fake.before_commit().passes(), 1);
        assert_eq!(fake.after_commit().passes(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_gives_up_on_a_slow_answer_leaves_the_effect_behind() {
        let fake = FakeDownstream::new().with_fault(Fault::Delay(Duration::from_secs(30)));
        let k = key("s1");
        let gave_up = tokio::time::timeout(Duration::from_secs(5), perform(&fake, &k)).await;
        assert!(gave_up.is_err());
        assert_eq!(fake.effects(), 1);
    }

    #[tokio::test]
    async fn clones_share_one_system_of_record() {
        let fake = FakeDownstream::new();
        let clone = fake.clone();
        clone.set_deduplicates(true);
        let k = key("s1");
        perform(&clone, &k).await;
        perform(&fake, &k).await;
        assert_eq!((fake.effects(), fake.calls()), (1, 2));
    }
}
