//! The sandbox: an in-process system of record per tool, for trying idemgate without one.
//!
//! `idemgate serve` without a downstream (`sandbox = true`, the default), `idemgate mcp
//! --fake-downstream` and `idemgate demo` all run their effects here. A [`Sandbox`] is set up as
//! its tool's contract declares — it deduplicates on the idempotency key only when the contract
//! says the real system does, offers a receipt lookup only when the contract says so — so it is
//! no more forgiving than the real system would be: a duplicate the executor let through shows
//! up as a second effect in the sandbox's own count.
//!
//! It can be made to misbehave in two ways:
//!
//! - a workflow id starting with `sandbox-timeout` (nothing committed, the answer times out),
//!   `sandbox-drop` (committed, the answer lost) or `sandbox-refuse` (a deterministic refusal),
//!   so that the whole outcome table can be shown with curl;
//! - a queue of scripted [`Fault`]s, one per upcoming `perform` ([`Sandbox::push_fault`]), as the
//!   demo and the MCP face's hidden control tool use.
//!
//! # What it keeps, and for how long
//!
//! Memory is bounded: per tool the sandbox remembers at most [`DEFAULT_CAPACITY`] (57,344)
//! receipts (16 bytes of key digest and a number each; about 3.2 MB for a full tool), the
//! last [`LOG_LEN`] effects in full for [`Sandbox::effect_log`], and at most the capacity of
//! accepted jobs. What it may forget follows from when the executor asks a downstream about a
//! key again: only while the gateway's own record of that key is unsettled — after an ambiguous
//! answer, or when it could not record an answer it received (a store failure; the next
//! delivery or the recoverer takes the claim over once its lease expires). A settled record is
//! replayed from the gateway's store for as long as its retention keeps it (DESIGN §7) and
//! never reaches the downstream again, so the sandbox need not keep receipts for the retention.
//!
//! - A receipt whose answer was **not** delivered (the effect committed, the answer ambiguous)
//!   is pinned: it is kept for the capacity's count of later pinned receipts, ahead of every
//!   delivered one. A lookup or a resend under its key finds it.
//! - A receipt whose answer was delivered is kept for the next [`DEFAULT_CAPACITY`] effects of
//!   its tool (at 8,600 unique calls a second, the gateway's best measured SQLite rate, about
//!   7 s), then forgotten, oldest first.
//! - Once it has forgotten anything, a lookup of a key it does not hold answers
//!   [`Lookup::Unavailable`] instead of [`Lookup::NotFound`]: "not found" would tell the
//!   executor that a forgotten effect never happened, and so invite a second one.
//!
//! Everything is lost when the process ends: the effects are not real.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use idemgate_core::ErrorCode;
use idemgate_core::contract::Contract;
use idemgate_core::effect::{Downstream, EffectOutcome, EffectRequest, JobStatus, Lookup};
use idemgate_core::key::OperationKey;
use idemgate_core::record::{Receipt, Refusal};
use idemgate_core::store::BoxFuture;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Receipts remembered per tool: delivered ones, and separately as many pinned ones.
/// 7/8 of 2^16: the most a hash table of 2^16 slots holds before it doubles, so a full
/// sandbox's table takes about 2.2 MB (slots of 32 bytes and a control byte) and its queue
/// 1 MB, not twice that. (7/8 of 2^18 measured 103 MiB RSS for the whole default `serve`
/// under load, past the 100 MB budget; a quarter of it leaves room.)
pub const DEFAULT_CAPACITY: usize = 7 << 13;

/// Effects kept in full (key, reference, attempt) for [`Sandbox::effect_log`].
pub const LOG_LEN: usize = 100;

/// A scripted misbehaviour for one `perform` call.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Commit, then answer ambiguous as if the connection dropped before the answer arrived.
    CommitThenDrop,
    /// Commit, then answer ambiguous as a `500` would be.
    CommitThenFail,
    /// Commit, then answer ambiguous as an unparseable body would be.
    Malformed,
    /// No effect; a deterministic refusal.
    Refuse { code: ErrorCode, message: String },
    /// No effect; provably never sent.
    NotSent,
    /// No effect, but the caller cannot know: the answer times out.
    Timeout,
    /// Accept an asynchronous job; [`Sandbox::complete_job`] or a poll (see [`Jobs`]) ends it.
    AcceptJob,
    /// No effect; the version precondition did not hold.
    PreconditionFailed,
}

/// Reasons the sandbox gives in ambiguous and not-sent answers.
pub mod reason {
    pub const DROPPED: &str = "connection reset after the request was sent";
    pub const SERVER_ERROR: &str = "downstream answered 500 Internal Server Error";
    pub const MALFORMED: &str = "downstream answered a malformed body";
    pub const TIMEOUT: &str = "timed out waiting for the downstream";
    pub const REFUSED_CONNECTION: &str = "connection refused";
    pub const PRECONDITION: &str = "version precondition did not hold";
    /// A workflow id starting with `sandbox-timeout`.
    pub const SANDBOX_TIMEOUT: &str = "timed out waiting for the sandbox";
}

/// How the sandbox answers a request of an async-job contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jobs {
    /// Every request of an async contract is accepted as a job that finishes by its first poll
    /// (`serve`'s sandbox).
    FirstPoll,
    /// Jobs are accepted only on [`Fault::AcceptJob`] and end by [`Sandbox::complete_job`] or
    /// [`Sandbox::fail_job`] (the fakes of `mcp --fake-downstream`, scripted by a test).
    Scripted,
}

/// One committed effect, as the sandbox saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    pub key: OperationKey,
    pub reference: String,
    /// The fencing token of the attempt that caused it.
    pub attempt: u64,
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
    attempt: u64,
    state: JobState,
}

/// A key's digest: the table holds 16 bytes per key instead of the key.
type KeyDigest = [u8; 16];

fn digest(key: &OperationKey) -> KeyDigest {
    let full = Sha256::digest(key.as_str().as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The receipt's number: the reference is `<noun>_<number>`.
    number: u64,
    /// Effects committed under the key (more than one only without deduplication).
    effects: u32,
    pinned: bool,
}

/// One tool's sandbox. Clones share one table, so one clone can serve the executor while a
/// test or the control tool reads another.
#[derive(Debug, Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    noun: String,
    // A std mutex: held for table updates only, never across an await.
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    deduplicates: bool,
    receipt_lookup: bool,
    async_jobs: bool,
    jobs_mode: Jobs,
    capacity: usize,
    faults: VecDeque<Fault>,
    receipts: HashMap<KeyDigest, Entry>,
    /// Delivered receipts, oldest first: the first to be forgotten.
    delivered: VecDeque<KeyDigest>,
    /// Pinned receipts (answer not delivered), oldest first.
    pinned: VecDeque<KeyDigest>,
    forgotten: u64,
    log: VecDeque<Effect>,
    jobs: HashMap<String, Job>,
    job_order: VecDeque<String>,
    jobs_accepted: u64,
    next: u64,
    effects: u64,
    calls: u64,
    deduplicated: u64,
    lookups: u64,
    polls: u64,
}

/// What a commit is followed by: the answer delivered, or lost.
#[derive(Clone, Copy, PartialEq)]
enum Delivery {
    Delivered,
    Lost,
}

impl State {
    fn receipt(noun: &str, number: u64) -> Receipt {
        let reference = format!("{noun}_{number}");
        Receipt {
            result: json!({ "id": reference, "sandbox": true }),
            reference,
        }
    }

    /// Commits one request's effect — or, deduplicating and with the key already committed,
    /// answers that receipt without a new effect.
    fn commit(&mut self, noun: &str, key: &OperationKey, attempt: u64, how: Delivery) -> Receipt {
        let d = digest(key);
        if let Some(entry) = self.receipts.get_mut(&d) {
            let number = entry.number;
            let newly_pinned = how == Delivery::Lost && !entry.pinned;
            if self.deduplicates {
                self.deduplicated += 1;
                if newly_pinned {
                    entry.pinned = true;
                    self.make_room();
                    self.pinned.push_back(d);
                }
                return Self::receipt(noun, number);
            }
            entry.effects += 1;
        }
        self.next += 1;
        self.effects += 1;
        let number = self.next;
        let pinned = how == Delivery::Lost;
        let known = self.receipts.contains_key(&d);
        if !known {
            self.make_room();
            self.receipts.insert(
                d,
                Entry {
                    number,
                    effects: 1,
                    pinned,
                },
            );
            if pinned {
                self.pinned.push_back(d);
            } else {
                self.delivered.push_back(d);
            }
        }
        let receipt = Self::receipt(noun, number);
        if self.log.len() == LOG_LEN {
            self.log.pop_front();
        }
        self.log.push_back(Effect {
            key: key.clone(),
            reference: receipt.reference.clone(),
            attempt,
        });
        // Without deduplication a second effect answers its own receipt; the first one under
        // the key stays what a lookup finds.
        receipt
    }

    /// Forgets the oldest receipts until one more of each kind fits in the capacity:
    /// delivered ones from their queue, pinned ones from theirs (an entry pinned after it was
    /// queued as delivered is skipped). Run before an insert, so that the table never holds
    /// more than the capacity and never grows past the size that holds it.
    fn make_room(&mut self) {
        while self.delivered.len() >= self.capacity {
            if let Some(d) = self.delivered.pop_front()
                && self.receipts.get(&d).is_some_and(|e| !e.pinned)
            {
                self.receipts.remove(&d);
                self.forgotten += 1;
            }
        }
        while self.pinned.len() >= self.capacity {
            if let Some(d) = self.pinned.pop_front() {
                self.receipts.remove(&d);
                self.forgotten += 1;
            }
        }
        while self.job_order.len() >= self.capacity {
            if let Some(id) = self.job_order.pop_front() {
                self.jobs.remove(&id);
            }
        }
    }

    fn lookup(&self, noun: &str, key: &OperationKey) -> Lookup {
        match self.receipts.get(&digest(key)) {
            Some(entry) => Lookup::Found(Self::receipt(noun, entry.number)),
            None if self.forgotten > 0 => Lookup::Unavailable(format!(
                "the sandbox keeps the last {} receipts of this tool and may have forgotten this one",
                self.capacity
            )),
            None => Lookup::NotFound,
        }
    }

    fn accept_job(&mut self, noun: &str, key: &OperationKey, attempt: u64) -> EffectOutcome {
        if self.deduplicates {
            if let Some(entry) = self.receipts.get(&digest(key)) {
                self.deduplicated += 1;
                return EffectOutcome::Committed(Self::receipt(noun, entry.number));
            }
            let running = self.job_order.iter().find(|id| {
                self.jobs
                    .get(id.as_str())
                    .is_some_and(|j| &j.key == key && j.state == JobState::Running)
            });
            if let Some(job_id) = running {
                let job_id = job_id.clone();
                self.deduplicated += 1;
                return EffectOutcome::Accepted { job_id };
            }
        }
        self.make_room();
        self.jobs_accepted += 1;
        let job_id = format!("job_{}", self.jobs_accepted);
        self.jobs.insert(
            job_id.clone(),
            Job {
                key: key.clone(),
                attempt,
                state: JobState::Running,
            },
        );
        self.job_order.push_back(job_id.clone());
        EffectOutcome::Accepted { job_id }
    }

    fn finish_job(&mut self, noun: &str, job_id: &str) -> Result<Receipt, String> {
        let (key, attempt) = self.running(job_id)?;
        let receipt = self.commit(noun, &key, attempt, Delivery::Lost);
        if let Some(job) = self.jobs.get_mut(job_id) {
            job.state = JobState::Done(receipt.clone());
        }
        Ok(receipt)
    }

    fn running(&self, job_id: &str) -> Result<(OperationKey, u64), String> {
        match self.jobs.get(job_id) {
            Some(job) if job.state == JobState::Running => Ok((job.key.clone(), job.attempt)),
            Some(_) => Err(format!("job `{job_id}` already finished")),
            None => Err(format!("no job `{job_id}`")),
        }
    }
}

impl Sandbox {
    /// A sandbox making `<noun>_<n>` receipts that neither deduplicates nor offers a lookup,
    /// with scripted jobs and the default capacity.
    pub fn new(noun: impl Into<String>) -> Sandbox {
        Sandbox {
            inner: Arc::new(Inner {
                noun: noun.into(),
                state: Mutex::new(State {
                    deduplicates: false,
                    receipt_lookup: false,
                    async_jobs: false,
                    jobs_mode: Jobs::Scripted,
                    capacity: DEFAULT_CAPACITY,
                    faults: VecDeque::new(),
                    receipts: HashMap::new(),
                    delivered: VecDeque::new(),
                    pinned: VecDeque::new(),
                    forgotten: 0,
                    log: VecDeque::new(),
                    jobs: HashMap::new(),
                    job_order: VecDeque::new(),
                    jobs_accepted: 0,
                    next: 0,
                    effects: 0,
                    calls: 0,
                    deduplicated: 0,
                    lookups: 0,
                    polls: 0,
                }),
            }),
        }
    }

    /// The sandbox of one tool, as its contract declares: `tickets.create` makes `ticket_1`,
    /// `email.send` makes `email_1`.
    pub fn for_contract(contract: &Contract, jobs: Jobs) -> Sandbox {
        let first = contract.name.split('.').next().unwrap_or("effect");
        let noun = first.strip_suffix('s').unwrap_or(first);
        let sandbox = Sandbox::new(noun)
            .deduplicating(contract.deduplicates())
            .with_receipt_lookup(contract.receipt_lookup());
        {
            let mut state = sandbox.lock();
            state.async_jobs = contract.async_jobs();
            state.jobs_mode = jobs;
        }
        sandbox
    }

    pub fn deduplicating(self, on: bool) -> Sandbox {
        self.lock().deduplicates = on;
        self
    }

    pub fn with_receipt_lookup(self, on: bool) -> Sandbox {
        self.set_receipt_lookup(on);
        self
    }

    /// Whether a receipt lookup is offered from now on (the demo turns it off and on).
    pub fn set_receipt_lookup(&self, on: bool) {
        self.lock().receipt_lookup = on;
    }

    /// How many delivered (and, separately, pinned) receipts are remembered; at least 1.
    pub fn with_capacity(self, receipts: usize) -> Sandbox {
        self.lock().capacity = receipts.max(1);
        self
    }

    /// Queues a fault for the next `perform` call that has none queued before it.
    pub fn push_fault(&self, fault: Fault) {
        self.lock().faults.push_back(fault);
    }

    pub fn faults_pending(&self) -> usize {
        self.lock().faults.len()
    }

    /// Effects committed so far, duplicates included.
    pub fn effects(&self) -> u64 {
        self.lock().effects
    }

    /// Effects committed under `key`, while the sandbox remembers it.
    pub fn effects_for(&self, key: &OperationKey) -> u64 {
        self.lock()
            .receipts
            .get(&digest(key))
            .map_or(0, |e| u64::from(e.effects))
    }

    /// The last [`LOG_LEN`] effects, oldest first.
    pub fn effect_log(&self) -> Vec<Effect> {
        self.lock().log.iter().cloned().collect()
    }

    /// Receipts held now (delivered and pinned): never more than twice the capacity.
    pub fn remembered(&self) -> usize {
        self.lock().receipts.len()
    }

    /// Receipts forgotten so far.
    pub fn forgotten(&self) -> u64 {
        self.lock().forgotten
    }

    /// `perform` calls received.
    pub fn calls(&self) -> u64 {
        self.lock().calls
    }

    /// Requests answered with an earlier receipt by deduplication.
    pub fn deduplicated(&self) -> u64 {
        self.lock().deduplicated
    }

    pub fn lookups(&self) -> u64 {
        self.lock().lookups
    }

    pub fn polls(&self) -> u64 {
        self.lock().polls
    }

    /// Ids of the accepted jobs still held, in acceptance order.
    pub fn job_ids(&self) -> Vec<String> {
        self.lock().job_order.iter().cloned().collect()
    }

    pub fn job(&self, job_id: &str) -> Option<JobState> {
        self.lock().jobs.get(job_id).map(|j| j.state.clone())
    }

    /// Finishes a running job with its effect (deduplicated like a request).
    pub fn complete_job(&self, job_id: &str) -> Result<Receipt, String> {
        let noun = &self.inner.noun;
        self.lock().finish_job(noun, job_id)
    }

    /// Fails a running job without an effect.
    pub fn fail_job(&self, job_id: &str, message: &str) -> Result<Refusal, String> {
        let mut state = self.lock();
        state.running(job_id)?;
        let refusal = Refusal {
            code: ErrorCode::DownstreamRejected,
            message: message.to_string(),
        };
        if let Some(job) = state.jobs.get_mut(job_id) {
            job.state = JobState::Failed(refusal.clone());
        }
        Ok(refusal)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn answer(&self, request: &EffectRequest<'_>) -> EffectOutcome {
        let noun = self.inner.noun.as_str();
        let workflow = request.key.workflow_id();
        let mut state = self.lock();
        state.calls += 1;
        if workflow.starts_with("sandbox-timeout") {
            return EffectOutcome::ambiguous(reason::SANDBOX_TIMEOUT);
        }
        let fault = if workflow.starts_with("sandbox-drop") {
            Some(Fault::CommitThenDrop)
        } else if workflow.starts_with("sandbox-refuse") {
            Some(Fault::Refuse {
                code: ErrorCode::DownstreamRejected,
                message: "the sandbox refused the request".into(),
            })
        } else {
            state.faults.pop_front()
        };
        let (key, attempt) = (request.key, request.attempt);
        let lost = |state: &mut State, why: &str| {
            state.commit(noun, key, attempt, Delivery::Lost);
            EffectOutcome::ambiguous(why)
        };
        match fault {
            None if state.async_jobs && state.jobs_mode == Jobs::FirstPoll => {
                state.accept_job(noun, key, attempt)
            }
            None => EffectOutcome::Committed(state.commit(noun, key, attempt, Delivery::Delivered)),
            Some(Fault::AcceptJob) => state.accept_job(noun, key, attempt),
            Some(Fault::NotSent) => EffectOutcome::NotSent {
                reason: reason::REFUSED_CONNECTION.into(),
                retry_after: None,
            },
            Some(Fault::Timeout) => EffectOutcome::ambiguous(reason::TIMEOUT),
            Some(Fault::CommitThenDrop) => lost(&mut state, reason::DROPPED),
            Some(Fault::CommitThenFail) => lost(&mut state, reason::SERVER_ERROR),
            Some(Fault::Malformed) => lost(&mut state, reason::MALFORMED),
            Some(Fault::Refuse { code, message }) => {
                EffectOutcome::Refused(Refusal { code, message })
            }
            Some(Fault::PreconditionFailed) => {
                EffectOutcome::PreconditionFailed(reason::PRECONDITION.into())
            }
        }
    }
}

impl Downstream for Sandbox {
    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        Box::pin(std::future::ready(self.answer(&request)))
    }

    fn lookup_receipt<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        let mut state = self.lock();
        state.lookups += 1;
        let answer = if state.receipt_lookup {
            state.lookup(&self.inner.noun, key)
        } else {
            Lookup::Unavailable("the sandbox offers no receipt lookup for this tool".into())
        };
        Box::pin(std::future::ready(answer))
    }

    fn poll_job<'a>(&'a self, key: &'a OperationKey, job_id: &'a str) -> BoxFuture<'a, JobStatus> {
        let noun = self.inner.noun.as_str();
        let mut state = self.lock();
        state.polls += 1;
        let first_poll = state.jobs_mode == Jobs::FirstPoll;
        let answer = match state.jobs.get(job_id) {
            // A job the sandbox does not hold was lost with a restart or forgotten past the
            // capacity: gone, not failed, since nothing proves it never ran.
            None => JobStatus::Gone(format!("the sandbox has no job `{job_id}`")),
            // Answering another operation's job would let one key settle another's record.
            Some(job) if &job.key != key => {
                JobStatus::Unavailable(format!("job `{job_id}` belongs to another operation"))
            }
            Some(job) => match job.state.clone() {
                JobState::Running if first_poll => match state.finish_job(noun, job_id) {
                    Ok(receipt) => JobStatus::Done(receipt),
                    Err(e) => JobStatus::Unavailable(e),
                },
                JobState::Running => JobStatus::Running,
                JobState::Done(receipt) => JobStatus::Done(receipt),
                JobState::Failed(refusal) => JobStatus::Failed(refusal),
            },
        };
        Box::pin(std::future::ready(answer))
    }
}

/// One sandbox per contract, by contract name.
#[derive(Clone, Debug, Default)]
pub struct Sandboxes {
    by_name: BTreeMap<String, Sandbox>,
}

impl Sandboxes {
    pub fn for_contracts<'a>(
        contracts: impl IntoIterator<Item = &'a Contract>,
        jobs: Jobs,
    ) -> Sandboxes {
        let by_name = contracts
            .into_iter()
            .map(|c| (c.name.clone(), Sandbox::for_contract(c, jobs)))
            .collect();
        Sandboxes { by_name }
    }

    pub fn get(&self, contract: &str) -> Option<&Sandbox> {
        self.by_name.get(contract)
    }

    /// The sandbox of one contract, as the executor's downstream.
    pub fn downstream(&self, contract: &str) -> Option<Arc<dyn Downstream>> {
        self.get(contract)
            .map(|s| Arc::new(s.clone()) as Arc<dyn Downstream>)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Sandbox)> {
        self.by_name.iter().map(|(n, s)| (n.as_str(), s))
    }

    pub fn insert(&mut self, contract: impl Into<String>, sandbox: Sandbox) {
        self.by_name.insert(contract.into(), sandbox);
    }
}

/// The sandbox's own counts as JSON: what the system of record saw, independent of the
/// gateway's store.
pub fn stats(name: &str, sandbox: &Sandbox) -> Value {
    let jobs: Vec<Value> = sandbox
        .job_ids()
        .into_iter()
        .map(|id| {
            let state = match sandbox.job(&id) {
                Some(JobState::Running) => "running",
                Some(JobState::Done(_)) => "done",
                Some(JobState::Failed(_)) => "failed",
                None => "missing",
            };
            json!({"job_id": id, "state": state})
        })
        .collect();
    let effects: Vec<Value> = sandbox
        .effect_log()
        .into_iter()
        .map(|e| json!({"key": e.key.as_str(), "reference": e.reference, "attempt": e.attempt}))
        .collect();
    json!({
        "tool": name,
        "effects": sandbox.effects(),
        "calls": sandbox.calls(),
        "deduplicated": sandbox.deduplicated(),
        "lookups": sandbox.lookups(),
        "polls": sandbox.polls(),
        "faults_pending": sandbox.faults_pending(),
        "remembered": sandbox.remembered(),
        "forgotten": sandbox.forgotten(),
        "effect_log": effects,
        "jobs": jobs,
    })
}
