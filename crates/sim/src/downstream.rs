//! [`SimDownstream`]: the simulated system of record, one per tool, all sharing one ledger.
//!
//! Configured per tool as its contract declares it ([`Semantics`]): deduplicating on the key
//! or not, with a receipt lookup or not, with asynchronous jobs or not. Every effect goes into
//! the [`Ledger`](crate::history::Ledger) with the task and worker that sent it and the steps at
//! which the send started and committed. A deduplicating downstream answers a resend of a
//! committed key with the same receipt and no new effect; one that does not deduplicate makes
//! a new effect each time it commits — exactly the duplicate the executor must never cause.
//!
//! Each call's fault is drawn from the choice stream (0 is "answer normally"): commit then lose
//! the answer, reset before processing, a 4xx refusal, a 5xx with and without a commit, a 429 or
//! a refused connection (provably not sent), a failed precondition, and slow answers that wait
//! on the simulated timer — before or after committing — so leases expire and recovery races a
//! live sender.

use std::sync::Arc;

use idemgate_core::ErrorCode;
use idemgate_core::effect::{Downstream, EffectOutcome, EffectRequest, JobStatus, Lookup};
use idemgate_core::key::OperationKey;
use idemgate_core::record::{Receipt, Record, Refusal};
use idemgate_core::store::BoxFuture;
use serde_json::{Value, json};

use crate::history::{Effect, Job, JobState, Perform};
use crate::runtime::{Point, Sim, Sleep, State, current, yield_point};

/// What the system of record behind one tool offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Semantics {
    pub deduplicates: bool,
    pub lookup: bool,
    pub jobs: bool,
}

/// Reads the stored record of a key outside the simulation (the checker's view at a send).
pub type Probe = Arc<dyn Fn(&OperationKey) -> Option<Record> + Send + Sync>;

pub struct SimDownstream {
    tool: String,
    semantics: Semantics,
    sim: Arc<Sim>,
    probe: Probe,
}

/// The worker name of a simulated process.
pub fn worker_of(process: u32) -> String {
    format!("p{process}")
}

/// What a call's fault draw means, in the order of the draw (0 first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    CommitThenDrop,
    ResetBeforeProcessing,
    Refuse,
    ServerErrorBefore,
    ServerErrorAfter,
    TooMany,
    ConnectionRefused,
    PreconditionFailed,
    SlowAfterCommit,
    SlowBeforeCommit,
}

fn fault_of(draw: u64) -> Fault {
    match draw {
        0..=69 => Fault::None,
        70..=74 => Fault::CommitThenDrop,
        75..=77 => Fault::ResetBeforeProcessing,
        78..=79 => Fault::Refuse,
        80..=82 => Fault::ServerErrorBefore,
        83..=84 => Fault::ServerErrorAfter,
        85..=86 => Fault::TooMany,
        87..=88 => Fault::ConnectionRefused,
        89..=90 => Fault::PreconditionFailed,
        91..=95 => Fault::SlowAfterCommit,
        _ => Fault::SlowBeforeCommit,
    }
}

/// Keeps a send counted as in flight until it commits, answers, or its task is dropped.
struct InFlight {
    sim: Arc<Sim>,
    key: OperationKey,
    open: bool,
}

impl InFlight {
    fn close(&mut self, s: &mut State) {
        if self.open {
            self.open = false;
            if let Some(n) = s.history.ledger.in_flight.get_mut(&self.key) {
                *n = n.saturating_sub(1);
            }
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.open {
            let sim = self.sim.clone();
            self.close(&mut sim.lock());
        }
    }
}

/// What the downstream answers for a commit: a receipt, or an accepted job.
enum Committed {
    Receipt(Receipt),
    Job(String),
}

impl SimDownstream {
    pub fn new(tool: &str, semantics: Semantics, sim: Arc<Sim>, probe: Probe) -> SimDownstream {
        SimDownstream {
            tool: tool.to_string(),
            semantics,
            sim,
            probe,
        }
    }

    pub fn semantics(&self) -> Semantics {
        self.semantics
    }

    /// Commits the effect of one request, or answers the first one's under a deduplicated key.
    fn commit(&self, s: &mut State, key: &OperationKey, keyless: bool, sent_at: u64) -> Committed {
        let ledger = &mut s.history.ledger;
        if self.semantics.deduplicates
            && let Some(&first) = ledger.first.get(key)
        {
            let e = &ledger.effects[first];
            let answer = match &e.job {
                Some(job) => Committed::Job(job.clone()),
                None => Committed::Receipt(e.receipt.clone()),
            };
            let number = e.number;
            s.note(|| {
                format!("downstream deduplicated {key}: effect #{number} again, no new effect")
            });
            return answer;
        }
        ledger.next_reference += 1;
        let n = ledger.next_reference;
        let reference = format!("r{n}");
        let job = self.semantics.jobs.then(|| format!("j{n}"));
        let c = current();
        let effect = Effect {
            number: ledger.effects.len() + 1,
            key: key.clone(),
            receipt: Receipt {
                result: json!({ "id": reference }),
                reference: reference.clone(),
            },
            task: c.map_or(0, |c| c.task),
            worker: c.map_or("-".into(), |c| worker_of(c.process)),
            sent_at,
            committed_at: s.step,
            keyless,
            job: job.clone(),
            voided: false,
        };
        let number = effect.number;
        let receipt = effect.receipt.clone();
        ledger.effects.push(effect);
        ledger.first.entry(key.clone()).or_insert(number - 1);
        if let Some(job) = &job {
            ledger.jobs.insert(
                job.clone(),
                Job {
                    effect: number - 1,
                    state: JobState::Running,
                },
            );
        }
        s.note(|| match &job {
            Some(j) => {
                format!("downstream accepted job {j} for {key}: ref {reference} (effect #{number})")
            }
            None => format!("downstream committed {key}: ref {reference} (effect #{number})"),
        });
        match job {
            Some(j) => Committed::Job(j),
            None => Committed::Receipt(receipt),
        }
    }

    fn answer(committed: Committed) -> EffectOutcome {
        match committed {
            Committed::Receipt(r) => EffectOutcome::Committed(r),
            Committed::Job(job_id) => EffectOutcome::Accepted { job_id },
        }
    }

    fn misuse(&self, what: String) {
        let mut s = self.sim.lock();
        s.note(|| format!("downstream misused: {what}"));
        s.history.misuse.push(what);
    }
}

/// How long a slow answer takes: past a lease, sometimes far past.
fn slow_millis(draw: u64) -> i64 {
    [2_000, 6_000, 20_000, 90_000][draw as usize % 4]
}

fn retry_after(draw: u64) -> Option<u64> {
    [None, Some(1), Some(30)][draw as usize % 3]
}

impl Downstream for SimDownstream {
    fn check(&self, arguments: &Value) -> Result<(), String> {
        // As a URL template would: a path segment that moves the path is refused.
        match arguments.get("path").and_then(Value::as_str) {
            Some("." | "..") => Err("`path` cannot be placed in the URL".into()),
            _ => Ok(()),
        }
    }

    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        Box::pin(async move {
            let key = request.key.clone();
            let record = (self.probe)(&key);
            let (sent_at, keyless) = {
                let mut s = self.sim.lock();
                let c = current();
                let task = c.map_or(0, |c| c.task);
                let keyless = s.history.keyless_tasks.contains(&task);
                let seq = s.history.next_seq();
                let step = s.step;
                s.history.performs.push(Perform {
                    seq,
                    step,
                    task,
                    worker: c.map_or("-".into(), |c| worker_of(c.process)),
                    tool: self.tool.clone(),
                    key: key.clone(),
                    attempt: request.attempt,
                    arguments: request.arguments.clone(),
                    keyless,
                    needs_marker: !self.semantics.deduplicates && !keyless,
                    record,
                });
                *s.history.ledger.in_flight.entry(key.clone()).or_default() += 1;
                s.note(|| {
                    format!(
                        "downstream {} send {key} attempt {}",
                        self.tool, request.attempt
                    )
                });
                (step, keyless)
            };
            let mut flight = InFlight {
                sim: self.sim.clone(),
                key: key.clone(),
                open: true,
            };
            yield_point(&self.sim, Point::BeforeSend).await;
            let (fault, extra) = {
                let mut s = self.sim.lock();
                let f = fault_of(s.fault(100));
                let extra = match f {
                    Fault::None
                    | Fault::CommitThenDrop
                    | Fault::ResetBeforeProcessing
                    | Fault::Refuse
                    | Fault::ConnectionRefused
                    | Fault::PreconditionFailed => 0,
                    Fault::ServerErrorBefore
                    | Fault::ServerErrorAfter
                    | Fault::TooMany
                    | Fault::SlowAfterCommit
                    | Fault::SlowBeforeCommit => s.fault(12),
                };
                (f, extra)
            };
            let fault = match fault {
                Fault::PreconditionFailed if request.precondition.is_none() => Fault::None,
                f => f,
            };
            let before = |s: &mut State, why: &str| {
                s.note(|| format!("downstream {key}: {why}, nothing committed"));
            };
            match fault {
                Fault::ResetBeforeProcessing => {
                    let mut s = self.sim.lock();
                    before(&mut s, "connection reset before processing");
                    flight.close(&mut s);
                    return EffectOutcome::ambiguous("simulated: connection reset");
                }
                Fault::Refuse => {
                    let mut s = self.sim.lock();
                    before(&mut s, "refused 422");
                    flight.close(&mut s);
                    return EffectOutcome::Refused(Refusal {
                        code: ErrorCode::DownstreamRejected,
                        message: "simulated: 422 unprocessable".into(),
                    });
                }
                Fault::ServerErrorBefore => {
                    let mut s = self.sim.lock();
                    before(&mut s, "503 before processing");
                    flight.close(&mut s);
                    return EffectOutcome::Ambiguous {
                        reason: "simulated: 503".into(),
                        retry_after: retry_after(extra),
                    };
                }
                Fault::TooMany => {
                    let mut s = self.sim.lock();
                    before(&mut s, "429");
                    flight.close(&mut s);
                    return EffectOutcome::NotSent {
                        reason: "simulated: 429".into(),
                        retry_after: retry_after(extra).or(Some(1)),
                    };
                }
                Fault::ConnectionRefused => {
                    let mut s = self.sim.lock();
                    before(&mut s, "connection refused");
                    flight.close(&mut s);
                    return EffectOutcome::NotSent {
                        reason: "simulated: connection refused".into(),
                        retry_after: None,
                    };
                }
                Fault::PreconditionFailed => {
                    let mut s = self.sim.lock();
                    before(&mut s, "precondition failed 412");
                    flight.close(&mut s);
                    return EffectOutcome::PreconditionFailed("simulated: 412".into());
                }
                Fault::SlowBeforeCommit => {
                    let wait = slow_millis(extra);
                    self.sim
                        .lock()
                        .note(|| format!("downstream {key}: slow, {wait}ms before committing"));
                    Sleep::new(&self.sim, wait).await;
                }
                Fault::None
                | Fault::CommitThenDrop
                | Fault::ServerErrorAfter
                | Fault::SlowAfterCommit => {}
            }
            let committed = {
                let mut s = self.sim.lock();
                let c = self.commit(&mut s, &key, keyless, sent_at);
                flight.close(&mut s);
                c
            };
            if fault == Fault::SlowAfterCommit {
                let wait = slow_millis(extra);
                self.sim
                    .lock()
                    .note(|| format!("downstream {key}: slow, {wait}ms before answering"));
                Sleep::new(&self.sim, wait).await;
            }
            yield_point(&self.sim, Point::AfterCommit).await;
            match fault {
                Fault::CommitThenDrop => {
                    self.sim
                        .lock()
                        .note(|| format!("downstream {key}: answer dropped after commit"));
                    EffectOutcome::ambiguous("simulated: connection reset after commit")
                }
                Fault::ServerErrorAfter => {
                    self.sim
                        .lock()
                        .note(|| format!("downstream {key}: 500 after commit"));
                    EffectOutcome::Ambiguous {
                        reason: "simulated: 500 after commit".into(),
                        retry_after: retry_after(extra),
                    }
                }
                _ => SimDownstream::answer(committed),
            }
        })
    }

    fn lookup_receipt<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        Box::pin(async move {
            if !self.semantics.lookup {
                self.misuse(format!(
                    "lookup_receipt({key}) on {}, which declares no lookup",
                    self.tool
                ));
            }
            yield_point(&self.sim, Point::BeforeAsk).await;
            let mut s = self.sim.lock();
            if s.fault(20) == 19 || !self.semantics.lookup {
                s.note(|| format!("downstream lookup {key}: unavailable"));
                return Lookup::Unavailable("simulated: lookup unavailable".into());
            }
            let ledger = &s.history.ledger;
            let found = ledger
                .first
                .get(key)
                .map(|&i| &ledger.effects[i])
                .and_then(|e| {
                    let finished = match &e.job {
                        None => true,
                        Some(j) => ledger
                            .jobs
                            .get(j)
                            .is_some_and(|j| j.state == JobState::Done),
                    };
                    (finished && !e.voided).then(|| e.receipt.clone())
                });
            s.note(|| match &found {
                Some(r) => format!("downstream lookup {key}: found {}", r.reference),
                None => format!("downstream lookup {key}: not found"),
            });
            match found {
                Some(r) => Lookup::Found(r),
                None => Lookup::NotFound,
            }
        })
    }

    fn poll_job<'a>(&'a self, key: &'a OperationKey, job_id: &'a str) -> BoxFuture<'a, JobStatus> {
        Box::pin(async move {
            if !self.semantics.jobs {
                self.misuse(format!(
                    "poll_job({key}, {job_id}) on {}, which declares no jobs",
                    self.tool
                ));
            }
            yield_point(&self.sim, Point::BeforeAsk).await;
            let mut s = self.sim.lock();
            let draw = s.fault(10);
            let Some(job) = s.history.ledger.jobs.get(job_id).cloned() else {
                s.note(|| format!("downstream poll {key} job {job_id}: no such job (404)"));
                return JobStatus::Gone("simulated: no such job".into());
            };
            let effect = s.history.ledger.effects[job.effect].clone();
            if effect.key != *key {
                drop(s);
                self.misuse(format!(
                    "poll_job({key}, {job_id}): the job belongs to {}",
                    effect.key
                ));
                s = self.sim.lock();
            }
            let state = match job.state {
                JobState::Running => match draw {
                    0..=4 => JobState::Done,
                    5..=6 => JobState::Running,
                    7 => JobState::Failed,
                    8 => JobState::Gone,
                    _ => {
                        s.note(|| format!("downstream poll {key} job {job_id}: unavailable"));
                        return JobStatus::Unavailable("simulated: poll unavailable".into());
                    }
                },
                settled => settled,
            };
            if let Some(j) = s.history.ledger.jobs.get_mut(job_id) {
                j.state = state;
            }
            if state == JobState::Failed {
                s.history.ledger.effects[job.effect].voided = true;
            }
            s.note(|| format!("downstream poll {key} job {job_id}: {state:?}"));
            match state {
                JobState::Running => JobStatus::Running,
                JobState::Done => JobStatus::Done(effect.receipt),
                JobState::Failed => JobStatus::Failed(Refusal {
                    code: ErrorCode::DownstreamRejected,
                    message: "simulated: the job failed".into(),
                }),
                JobState::Gone => JobStatus::Gone("simulated: 404".into()),
            }
        })
    }
}
