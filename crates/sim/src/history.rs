//! [`History`]: what happened in one schedule, as the checker reads it.
//!
//! Everything here is written by the simulated parts at the moment it happens, stamped with
//! the scheduler step and a global sequence number (the order of entries within one step).
//! The downstream's [`Ledger`] is part of it: effects are counted on the system of record's own
//! side, never inferred from what the executor says.

use std::collections::{BTreeMap, BTreeSet};

use idemgate_core::effect::AuthStage;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::Outcome;
use idemgate_core::record::{Millis, Receipt, Record};
use serde_json::Value;

use crate::runtime::TaskId;

/// One effect as the downstream committed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    /// `#1`, `#2`, … in commit order.
    pub number: usize,
    /// The idempotency key it was requested under.
    pub key: OperationKey,
    pub receipt: Receipt,
    pub task: TaskId,
    pub worker: String,
    /// Step at which the send that made it started, and at which it committed.
    pub sent_at: u64,
    pub committed_at: u64,
    /// From a delivery without an operation key (the executor chose the idempotency key).
    pub keyless: bool,
    /// An accepted job's id: the job is the effect, counted at acceptance.
    pub job: Option<String>,
    /// The job later failed: no effect after all.
    pub voided: bool,
}

/// The state of an accepted job on the downstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Running,
    Done,
    Failed,
    /// The downstream forgot it (its poll answers 404).
    Gone,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Index into [`Ledger::effects`].
    pub effect: usize,
    pub state: JobState,
}

/// The simulated system of record's own table.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    pub effects: Vec<Effect>,
    /// The first effect under each key: what deduplication and lookups answer.
    pub first: BTreeMap<OperationKey, usize>,
    pub jobs: BTreeMap<String, Job>,
    /// Sends started and neither committed nor dropped, per key.
    pub in_flight: BTreeMap<OperationKey, usize>,
    pub next_reference: u64,
}

impl Ledger {
    /// Effects under `key` that stand (a failed job's do not).
    pub fn effects_of<'a>(
        &'a self,
        key: &'a OperationKey,
    ) -> impl Iterator<Item = &'a Effect> + use<'a> {
        self.effects
            .iter()
            .filter(move |e| &e.key == key && !e.voided && !e.keyless)
    }

    /// The standing effect of `key`, if any.
    pub fn committed<'a>(&'a self, key: &'a OperationKey) -> Option<&'a Effect> {
        self.effects_of(key).next()
    }

    /// The effect of `key` as an operator who looks at the system of record sees it: committed,
    /// and, for a job, finished.
    pub fn finished<'a>(&'a self, key: &'a OperationKey) -> Option<&'a Effect> {
        self.committed(key).filter(|e| match &e.job {
            None => true,
            Some(j) => self.jobs.get(j).is_some_and(|j| j.state == JobState::Done),
        })
    }

    pub fn in_flight(&self, key: &OperationKey) -> bool {
        self.in_flight.get(key).copied().unwrap_or(0) > 0
    }
}

/// One `perform` call, as the downstream received it.
#[derive(Debug, Clone, PartialEq)]
pub struct Perform {
    pub seq: u64,
    pub step: u64,
    pub task: TaskId,
    pub worker: String,
    pub tool: String,
    pub key: OperationKey,
    pub attempt: u64,
    pub arguments: Value,
    pub keyless: bool,
    /// The contract sends to a downstream that neither deduplicates nor has lookups: the
    /// dispatch marker must be on the record before the send.
    pub needs_marker: bool,
    /// The stored record at the send's start, read outside the simulation.
    pub record: Option<Record>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    Denied,
    Unavailable,
}

/// One answer of the authorization oracle.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub seq: u64,
    pub step: u64,
    pub task: TaskId,
    pub key: Option<OperationKey>,
    pub actor: String,
    pub stage: AuthStage,
    pub verdict: Verdict,
}

/// What kind of call an answer answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Deliver,
    Approve,
    Deny,
    Reconcile,
}

/// One outcome handed to a caller.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub seq: u64,
    pub step: u64,
    pub task: TaskId,
    pub call: Call,
    /// The key the call was about (`None` for a key-less delivery).
    pub key: Option<OperationKey>,
    pub outcome: Outcome,
}

#[derive(Debug, Default)]
pub struct History {
    pub ledger: Ledger,
    pub performs: Vec<Perform>,
    pub decisions: Vec<Decision>,
    pub answers: Vec<Answer>,
    /// Steps at which a key's record was found deleted by a sweep on time (its retention from
    /// settlement had passed): the store forgot it by design, and a later delivery is a new
    /// operation. A purge too early starts no new life, so an effect after it still counts as
    /// the operation's second.
    pub purges: BTreeMap<OperationKey, Vec<u64>>,
    /// Keys whose record has existed (claimed at least once).
    pub claimed: BTreeSet<OperationKey>,
    /// The actor every delivery of a key comes from.
    pub owners: BTreeMap<OperationKey, String>,
    /// Tasks that deliver without an operation key.
    pub keyless_tasks: BTreeSet<TaskId>,
    /// Store transitions written, for the trace's summary.
    pub writes: u64,
    /// Calls the executor made that the contract does not allow (a lookup on a tool without
    /// one, a poll of another key's job).
    pub misuse: Vec<String>,
    /// When each key last settled (by the clock), and whether straight into a tombstone.
    pub settled_at: BTreeMap<OperationKey, (Millis, bool)>,
    /// Record and tombstone lifetimes per tool, as the contracts declare them.
    pub retention: BTreeMap<String, (Millis, Millis)>,
    /// Sweeps that compacted or purged a record before its retention, counted from its
    /// settlement, had passed.
    pub early_sweeps: Vec<String>,
    /// Actors whose authorization is revoked right now (the oracle's state).
    pub revoked: BTreeSet<String>,
    /// The steps at which each task read each key's record from the store (a get, or the
    /// record a claim or a transition answered with): where a rejection's knowledge of the key
    /// comes from.
    pub reads: BTreeMap<(TaskId, OperationKey), Vec<u64>>,
    /// The key of every committed transition that recorded an operator action (an approved,
    /// denied or reconciled event), in commit order: each must have exactly one audit entry.
    pub operator_transitions: Vec<OperationKey>,
    seq: u64,
}

impl History {
    /// The last step at or before `step` at which `task` read `key`'s record.
    pub fn last_read(&self, task: TaskId, key: &OperationKey, step: u64) -> Option<u64> {
        self.reads
            .get(&(task, key.clone()))?
            .iter()
            .copied()
            .filter(|s| *s <= step)
            .max()
    }

    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// The step from which `key`'s current life counts: its latest purge at or before `step`.
    pub fn life_start(&self, key: &OperationKey, step: u64) -> u64 {
        self.purges
            .get(key)
            .and_then(|p| p.iter().rev().find(|&&s| s <= step).copied())
            .unwrap_or(0)
    }
}
