//! One schedule: the real `Executor` and `Recoverer` of `idemgate-engine`, in simulated
//! processes, over a [`SimStore`], the simulated downstreams, clock, timer and authorizer —
//! every step chosen by the choice stream — then quiescence and the final checks.
//!
//! The main phase repeats one choice: poll a runnable task (0, the unremarkable step — or crash
//! its process instead when it stopped at a write or a send), deliver, run a recoverer pass,
//! sweep, act as an operator, revoke or restore an actor, move time, crash a process, start
//! one. Operators are truthful: they resolve `applied` only with the ledger's reference of a
//! committed key, and `not_applied` only when the ledger has no effect and no send in flight.
//! With [`Choices::with_lives`] a delivery may also pick a purged key, and a polled task may
//! be held until its key has been purged and claimed again.
//!
//! Quiescence turns faults off, moves time far past every lease, window and retention in
//! three jumps, and runs recoverer passes and sweeps until nothing changes; after the first
//! two jumps every key is delivered once more (late arrivals). Then nothing may be pending or
//! awaiting approval, and every record must agree with the ledger.

use std::collections::BTreeMap;
use std::sync::Arc;

use idemgate_core::clock::{Clock, Timer};
use idemgate_core::contract::Contract;
use idemgate_core::effect::{Authorizer, Downstream};
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::Outcome;
use idemgate_core::record::{Millis, RecordState};
use idemgate_core::store::Store;
use idemgate_engine::{Caller, Executor, Operation, Recoverer, Resolution, Settings, Tools};

use crate::authorizer::SimAuthorizer;
use crate::checker::{self, Violation};
use crate::choices::Choices;
use crate::downstream::{Probe, SimDownstream, worker_of};
use crate::history::{Answer, Call};
use crate::runtime::{ProcessId, Runtime, Sim, SimClock, SimTimer, TaskId, current};
use crate::store::{SimStore, brief};
use crate::workload::{Catalog, ENVIRONMENT, TENANT, Workload};

/// The simulated epoch: 2026-01-01T00:00:00Z.
pub const EPOCH: Millis = 1_767_225_600_000;

/// The store a schedule runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Mem,
    Sqlite,
}

impl StoreKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Mem => "mem",
            StoreKind::Sqlite => "sqlite",
        }
    }
}

/// Counts over one schedule, summed over many for the exploration's report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub steps: u64,
    pub deliveries: u64,
    pub crashes: u64,
    pub effects: u64,
    pub writes: u64,
    pub answers: BTreeMap<&'static str, u64>,
}

impl Stats {
    pub fn add(&mut self, other: &Stats) {
        self.steps += other.steps;
        self.deliveries += other.deliveries;
        self.crashes += other.crashes;
        self.effects += other.effects;
        self.writes += other.writes;
        for (k, v) in &other.answers {
            *self.answers.entry(k).or_default() += v;
        }
    }
}

/// What one schedule did.
pub struct Run {
    pub violation: Option<Violation>,
    /// The draws taken: replaying them repeats the schedule.
    pub draws: Vec<u64>,
    pub trace: Vec<String>,
    pub stats: Stats,
    /// Whether the schedule played keys' next lives: a replay of `draws` needs the same.
    pub lives: bool,
}

/// The recoverer's view of the tools: contract and downstream by name.
struct SimTools {
    tools: BTreeMap<String, (Arc<Contract>, Arc<dyn Downstream>)>,
}

impl Tools for SimTools {
    fn resolve(&self, tool: &str) -> Option<(Arc<Contract>, Arc<dyn Downstream>)> {
        self.tools.get(tool).cloned()
    }
}

/// One simulated gateway process.
struct Node {
    id: ProcessId,
    executor: Executor,
    recoverer: Recoverer,
}

struct Schedule<'c, S: Store> {
    sim: Arc<Sim>,
    rt: Runtime,
    store: SimStore<S>,
    shared: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    timer: Arc<dyn Timer>,
    authorizer: Arc<dyn Authorizer>,
    catalog: &'c Catalog,
    tools: Arc<SimTools>,
    downstreams: BTreeMap<usize, Arc<SimDownstream>>,
    workload: Workload,
    nodes: Vec<Node>,
    next_process: ProcessId,
    stats: Stats,
    /// Whether the schedule plays keys' next lives ([`Choices::with_lives`]).
    lives: bool,
    /// The key of each delivery's task.
    task_keys: BTreeMap<TaskId, OperationKey>,
    /// Tasks held until their key lives again: the key and its purges when held.
    held: BTreeMap<TaskId, (OperationKey, usize)>,
}

/// Runs one schedule on `inner`. The schedule is a function of `choices` alone.
pub fn run<S: Store>(catalog: &Catalog, inner: Arc<S>, choices: Choices, trace: bool) -> Run {
    let lives = choices.lives();
    let sim = Sim::new(choices, EPOCH, trace);
    let store = SimStore::new(inner, sim.clone()).forgetting(lives);
    let workload = {
        let mut s = sim.lock();
        Workload::draw(&mut s.choices, catalog)
    };
    let probe: Probe = {
        let store = store.clone();
        Arc::new(move |key: &OperationKey| store.peek(key))
    };
    let mut downstreams = BTreeMap::new();
    let mut tools = BTreeMap::new();
    for &t in &workload.tools {
        let (variant, contract) = &catalog.tools[t];
        let d = Arc::new(SimDownstream::new(
            variant.name,
            variant.semantics,
            sim.clone(),
            probe.clone(),
        ));
        tools.insert(
            variant.name.to_string(),
            (contract.clone(), d.clone() as Arc<dyn Downstream>),
        );
        downstreams.insert(t, d);
    }
    {
        let mut s = sim.lock();
        for &t in &workload.tools {
            let (v, c) = &catalog.tools[t];
            let r = &c.retention;
            s.history.retention.insert(
                v.name.to_string(),
                (r.record_ttl.millis(), r.tombstone_ttl.millis()),
            );
        }
        for step in &workload.steps {
            if let Some(k) = &step.key {
                s.history.owners.insert(k.clone(), step.actor.clone());
            }
        }
        let names: Vec<&str> = workload
            .tools
            .iter()
            .map(|&t| catalog.tools[t].0.name)
            .collect();
        let keys: Vec<String> = workload
            .steps
            .iter()
            .map(|st| match &st.key {
                Some(k) => format!("{k} ({}, {})", catalog.tools[st.tool].0.name, st.actor),
                None => format!("key-less ({}, {})", catalog.tools[st.tool].0.name, st.actor),
            })
            .collect();
        s.note(|| format!("workload: tools {names:?}; keys {keys:?}"));
    }
    let mut schedule = Schedule {
        rt: Runtime::new(sim.clone()),
        shared: Arc::new(store.clone()),
        store,
        clock: Arc::new(SimClock(sim.clone())),
        timer: Arc::new(SimTimer(sim.clone())),
        authorizer: Arc::new(SimAuthorizer::new(sim.clone())),
        sim,
        catalog,
        tools: Arc::new(SimTools { tools }),
        downstreams,
        workload,
        nodes: Vec::new(),
        next_process: 0,
        stats: Stats::default(),
        lives,
        task_keys: BTreeMap::new(),
        held: BTreeMap::new(),
    };
    let violation = schedule.main().err();
    // Every task is dropped before the history is read: futures hold parts of it.
    let n = schedule.nodes.iter().map(|n| n.id).collect::<Vec<_>>();
    for id in n {
        schedule.rt.kill(id);
    }
    let mut s = schedule.sim.lock();
    let mut stats = schedule.stats.clone();
    stats.steps = s.step;
    stats.effects = s.history.ledger.effects.len() as u64;
    stats.writes = s.history.writes;
    for a in &s.history.answers {
        *stats.answers.entry(a.outcome.status.as_str()).or_default() += 1;
    }
    if let Some(v) = &violation {
        s.note(|| format!("VIOLATION {v}"));
    }
    let trace = s.trace.take().unwrap_or_default();
    let draws = std::mem::replace(&mut s.choices, Choices::replay(Vec::new())).into_taken();
    Run {
        violation,
        draws,
        trace,
        stats,
        lives,
    }
}

impl<S: Store> Schedule<'_, S> {
    fn draw(&self, n: u64) -> u64 {
        self.sim.lock().choices.choose(n)
    }

    fn note(&self, text: impl FnOnce() -> String) {
        self.sim.lock().note(text);
    }

    fn start_process(&mut self) -> usize {
        self.next_process += 1;
        let id = self.next_process;
        let executor = Executor::new(
            self.shared.clone(),
            self.clock.clone(),
            self.authorizer.clone(),
            Settings {
                worker: worker_of(id),
                ..Settings::default()
            },
        )
        .with_timer(self.timer.clone());
        // A small batch now and then, so the recoverer's paging is exercised.
        let batch = if self.draw(4) == 3 { 1 } else { 100 };
        let recoverer =
            Recoverer::new(executor.clone(), self.tools.clone(), ENVIRONMENT).with_batch(batch);
        self.nodes.push(Node {
            id,
            executor,
            recoverer,
        });
        self.note(|| format!("p{id} started"));
        self.nodes.len() - 1
    }

    /// A live process, started if there is none.
    fn some_node(&mut self) -> usize {
        if self.nodes.is_empty() {
            return self.start_process();
        }
        self.draw(self.nodes.len() as u64) as usize
    }

    fn crash(&mut self, node: usize, why: &str) {
        let id = self.nodes[node].id;
        self.nodes.remove(node);
        let dropped = self.rt.kill(id);
        self.stats.crashes += 1;
        self.note(|| format!("p{id} crashed {why}; {dropped} tasks dropped"));
    }

    fn main(&mut self) -> Result<(), Violation> {
        self.start_process();
        self.start_process();
        let steps = 40 + self.draw(200);
        for _ in 0..steps {
            self.sim.lock().step += 1;
            self.act();
        }
        self.quiesce()
    }

    fn act(&mut self) {
        match self.draw(100) {
            0..=59 => self.poll_one(),
            60..=71 => self.deliver(),
            72..=76 => self.recover(),
            77..=78 => self.sweep(),
            79..=82 => self.operate(),
            83..=84 => self.toggle_revocation(),
            85..=92 => self.advance(),
            93..=95 => {
                if !self.nodes.is_empty() {
                    let n = self.draw(self.nodes.len() as u64) as usize;
                    self.crash(n, "(scheduler action)");
                }
            }
            _ => {
                if self.nodes.len() < 3 {
                    self.start_process();
                }
            }
        }
    }

    fn purges_of(&self, key: &OperationKey) -> usize {
        self.sim.lock().history.purges.get(key).map_or(0, Vec::len)
    }

    /// The runnable tasks the scheduler may pick: a held task waits until its key was purged
    /// and claimed again.
    fn pickable(&mut self) -> Vec<TaskId> {
        let mut runnable = self.sim.runnable();
        if self.held.is_empty() {
            return runnable;
        }
        let held: Vec<(TaskId, OperationKey, usize)> = self
            .held
            .iter()
            .map(|(t, (k, n))| (*t, k.clone(), *n))
            .collect();
        for (task, key, purges) in held {
            if self.purges_of(&key) > purges && self.store.peek(&key).is_some() {
                self.held.remove(&task);
                self.note(|| format!("T{task} released: {key} lives again"));
            } else {
                runnable.retain(|&t| t != task);
            }
        }
        runnable
    }

    fn poll_one(&mut self) {
        let runnable = self.pickable();
        if runnable.is_empty() {
            if let Some(at) = self.sim.next_timer() {
                self.sim.advance_to(at);
                self.note(|| "time moved to the next timer".into());
            }
            return;
        }
        let task = runnable[self.draw(runnable.len() as u64) as usize];
        let point = self.sim.parked_at(task);
        if self.lives && point.crash_worthy() && self.draw(8) == 7 {
            // Not while a send of the key is in flight: the hold stands for a worker paused
            // between its steps, not for a request that takes a retention to land.
            let key = self.task_keys.get(&task).cloned().filter(|k| {
                let s = self.sim.lock();
                s.history.ledger.in_flight.get(k).copied().unwrap_or(0) == 0
            });
            if let Some(key) = key {
                let purges = self.purges_of(&key);
                self.held.insert(task, (key, purges));
                self.note(|| format!("T{task} held at {point:?} until its key's next life"));
                return;
            }
        }
        if point.crash_worthy() && self.draw(12) == 11 {
            let process = self.rt.process_of(task);
            if let Some(node) = self.nodes.iter().position(|n| Some(n.id) == process) {
                self.crash(node, &format!("with T{task} at {point:?}"));
                return;
            }
        }
        self.rt.poll(task);
    }

    fn deliver(&mut self) {
        let mut index = self.draw(self.workload.steps.len() as u64) as usize;
        if self.workload.may_duplicate()
            && self.draw(10) == 9
            && let Some(dup) = self.workload.duplicate_of(index)
        {
            if let Some(k) = self.workload.steps[dup].key.clone() {
                let actor = self.workload.steps[dup].actor.clone();
                self.sim.lock().history.owners.insert(k, actor);
            }
            index = dup;
        }
        if self.lives && self.draw(3) == 2 {
            let purged: Vec<usize> = {
                let s = self.sim.lock();
                (0..self.workload.steps.len())
                    .filter(|&i| {
                        self.workload.steps[i]
                            .key
                            .as_ref()
                            .is_some_and(|k| s.history.purges.contains_key(k))
                    })
                    .collect()
            };
            if !purged.is_empty() {
                index = purged[self.draw(purged.len() as u64) as usize];
            }
        }
        let (arguments, how) = if self.workload.steps[index].step.starts_with("dup") {
            // The same intent under a new key: the same arguments.
            (
                self.workload.steps[index].arguments.clone(),
                " (a new key for the same request)",
            )
        } else {
            let mut s = self.sim.lock();
            self.workload.arguments(&mut s.choices, index)
        };
        self.spawn_delivery(index, arguments, how);
    }

    fn spawn_delivery(&mut self, index: usize, arguments: serde_json::Value, how: &str) {
        let step = self.workload.steps[index].clone();
        let (variant, contract) = &self.catalog.tools[step.tool];
        let contract = contract.clone();
        let downstream = self.downstreams[&step.tool].clone();
        let node = self.some_node();
        let executor = self.nodes[node].executor.clone();
        let process = self.nodes[node].id;
        let keyless = step.key.is_none();
        let operation = Operation {
            caller: Caller {
                tenant: TENANT.into(),
                actor: step.actor.clone(),
                role: "agent".into(),
            },
            environment: ENVIRONMENT.into(),
            workflow_id: (!keyless).then(|| step.workflow.clone()),
            step_id: (!keyless).then(|| step.step.clone()),
        };
        let sim = self.sim.clone();
        let key = step.key.clone();
        let task = self.rt.spawn(process, async move {
            let outcome = executor
                .execute(&contract, &operation, &arguments, downstream.as_ref())
                .await;
            answered(&sim, Call::Deliver, key, outcome);
        });
        self.stats.deliveries += 1;
        if let Some(key) = &step.key {
            self.task_keys.insert(task, key.clone());
        }
        let mut s = self.sim.lock();
        if keyless {
            s.history.keyless_tasks.insert(task);
        }
        let name = variant.name;
        s.note(|| {
            format!(
                "deliver {} {name} by {} on p{process} as T{task}{how}",
                step.key.as_ref().map_or("(no key)", |k| k.as_str()),
                step.actor
            )
        });
    }

    fn recover(&mut self) {
        let node = self.some_node();
        let recoverer = self.nodes[node].recoverer.clone();
        let sim = self.sim.clone();
        let process = self.nodes[node].id;
        let task = self.rt.spawn(process, async move {
            let report = recoverer.run_once().await;
            sim.lock().note(|| match report {
                Ok(r) => format!("recoverer pass: examined {}, {:?}", r.examined, r.outcomes),
                Err(e) => format!("recoverer pass failed: {e}"),
            });
        });
        self.note(|| format!("recoverer pass on p{process} as T{task}"));
    }

    fn sweep(&mut self) {
        let node = self.some_node();
        let executor = self.nodes[node].executor.clone();
        let limit = if self.draw(3) == 2 { 1 } else { 100 };
        let sim = self.sim.clone();
        let process = self.nodes[node].id;
        let task = self.rt.spawn(process, async move {
            let report = executor.sweep(ENVIRONMENT, limit).await;
            sim.lock().note(|| match report {
                Ok(r) => format!("sweep: compacted {}, purged {}", r.compacted, r.purged),
                Err(e) => format!("sweep failed: {e}"),
            });
        });
        self.note(|| format!("sweep (limit {limit}) on p{process} as T{task}"));
    }

    /// An operator acts on one key, deciding at the task's first step from what is true then.
    fn operate(&mut self) {
        // Mostly a key that has work for an operator (read outside the simulation, as an
        // operator's console would list it); sometimes any key.
        let open: Vec<usize> = (0..self.workload.steps.len())
            .filter(|&i| {
                let key = self.workload.steps[i].key.as_ref();
                key.and_then(|k| self.store.peek(k))
                    .is_some_and(|r| !r.is_settled())
            })
            .collect();
        let index = if !open.is_empty() && self.draw(4) != 3 {
            open[self.draw(open.len() as u64) as usize]
        } else {
            self.draw(self.workload.steps.len() as u64) as usize
        };
        let step = self.workload.steps[index].clone();
        let Some(key) = step.key.clone() else {
            return;
        };
        let how = self.draw(4);
        let (_, contract) = &self.catalog.tools[step.tool];
        let contract = contract.clone();
        let downstream = self.downstreams[&step.tool].clone();
        let node = self.some_node();
        let executor = self.nodes[node].executor.clone();
        let process = self.nodes[node].id;
        let sim = self.sim.clone();
        let store = self.store.clone();
        let task = self.rt.spawn(process, async move {
            let Some(record) = store.peek(&key) else {
                sim.lock().note(|| format!("operator: {key} has no record"));
                return;
            };
            let (call, result) = match &record.state {
                RecordState::AwaitingApproval { .. } if how < 3 => {
                    let expected = (how == 0).then(|| record.fingerprint.clone());
                    sim.lock().note(|| format!("operator approves {key}"));
                    let r = executor
                        .approve(
                            &contract,
                            &key,
                            "operator",
                            "simulated",
                            expected.as_ref(),
                            downstream.as_ref(),
                        )
                        .await;
                    (Call::Approve, r)
                }
                RecordState::AwaitingApproval { .. } => {
                    sim.lock().note(|| format!("operator denies {key}"));
                    (
                        Call::Deny,
                        executor
                            .deny(&contract, &key, "operator", "simulated")
                            .await,
                    )
                }
                _ => {
                    let resolution = {
                        let s = sim.lock();
                        let ledger = &s.history.ledger;
                        // Applied only with a finished effect; not applied only when there is
                        // none at all (a running job is one), and nothing in flight.
                        let none = ledger.committed(&key).is_none() && !ledger.in_flight(&key);
                        match (ledger.finished(&key), none, how % 2) {
                            (Some(e), _, 0) => Some(Resolution::Applied {
                                reference: e.receipt.reference.clone(),
                                result: e.receipt.result.clone(),
                            }),
                            (None, true, 0) => Some(Resolution::NotApplied),
                            _ => None,
                        }
                    };
                    sim.lock().note(|| {
                        format!(
                            "operator reconciles {key} ({}): {}",
                            brief(&record.state),
                            match &resolution {
                                Some(Resolution::Applied { reference, .. }) =>
                                    format!("applied {reference}"),
                                Some(Resolution::NotApplied) => "not applied".into(),
                                None => "look the receipt up".into(),
                            }
                        )
                    });
                    let r = executor
                        .reconcile(
                            &contract,
                            &key,
                            resolution,
                            "operator",
                            "simulated",
                            downstream.as_ref(),
                        )
                        .await;
                    (Call::Reconcile, r)
                }
            };
            match result {
                Ok(outcome) => answered(&sim, call, Some(key), outcome),
                Err(e) => sim
                    .lock()
                    .note(|| format!("operator action on {key} refused: {e}")),
            }
        });
        self.note(|| format!("operator on p{process} as T{task} for {}", step.workflow));
    }

    fn toggle_revocation(&mut self) {
        let actors: Vec<String> = {
            let mut a: Vec<String> = self
                .workload
                .steps
                .iter()
                .map(|s| s.actor.clone())
                .collect();
            a.dedup();
            a
        };
        let actor = actors[self.draw(actors.len() as u64) as usize].clone();
        let mut s = self.sim.lock();
        let revoked = if s.history.revoked.remove(&actor) {
            false
        } else {
            s.history.revoked.insert(actor.clone());
            true
        };
        s.note(|| format!("{actor} {}", if revoked { "revoked" } else { "restored" }));
    }

    fn advance(&mut self) {
        let by: Millis = match self.draw(10) {
            0..=5 => 100 * (1 + self.draw(20) as i64),
            6..=7 => 5_000 + 1_000 * self.draw(8) as i64,
            8 => 60_000 * (1 + self.draw(5) as i64),
            _ => 3_600_000 * [1, 24, 72][self.draw(3) as usize],
        };
        let at = self.sim.now() + by;
        self.sim.advance_to(at);
        self.note(|| format!("time advanced {by}ms"));
    }

    /// Polls the first runnable task until none is left, moving time to each timer.
    fn drain(&mut self) {
        for _ in 0..20_000 {
            self.sim.lock().step += 1;
            let runnable = self.sim.runnable();
            if let Some(&task) = runnable.first() {
                self.rt.poll(task);
            } else if let Some(at) = self.sim.next_timer() {
                self.sim.advance_to(at);
            } else {
                return;
            }
        }
        self.note(|| "drain gave up after 20000 steps".into());
    }

    /// Recoverer passes and sweeps until the store stops changing.
    fn settle(&mut self) {
        for _ in 0..12 {
            let before = {
                let s = self.sim.lock();
                (s.history.writes, s.history.ledger.effects.len())
            };
            self.recover();
            self.sweep_all();
            self.drain();
            let after = {
                let s = self.sim.lock();
                (s.history.writes, s.history.ledger.effects.len())
            };
            if before == after {
                return;
            }
        }
    }

    fn sweep_all(&mut self) {
        let node = self.some_node();
        let executor = self.nodes[node].executor.clone();
        let process = self.nodes[node].id;
        self.rt.spawn(process, async move {
            let _ = executor.sweep(ENVIRONMENT, 1000).await;
        });
    }

    fn late_deliveries(&mut self) {
        for index in 0..self.workload.steps.len() {
            let arguments = self.workload.steps[index].arguments.clone();
            self.spawn_delivery(index, arguments, " (late)");
        }
        self.drain();
    }

    fn quiesce(&mut self) -> Result<(), Violation> {
        {
            let mut s = self.sim.lock();
            s.faults = false;
            s.note(|| "quiescence: faults off".into());
        }
        if self.nodes.is_empty() {
            self.start_process();
        }
        self.drain();
        checker::check_history(&self.sim.lock().history)?;
        let jumps: [Millis; 3] = [60_000, 2 * 86_400_000, 10 * 86_400_000];
        for (i, by) in jumps.into_iter().enumerate() {
            let at = self.sim.now() + by;
            self.sim.advance_to(at);
            self.note(|| format!("quiescence: time advanced {by}ms"));
            self.settle();
            if i < 2 {
                self.late_deliveries();
                self.settle();
            }
            let records = self.store.all();
            let entries = self.store.audit_entries();
            let s = self.sim.lock();
            checker::check_history(&s.history)?;
            // Late deliveries may start new operations; only after the last jump, with none
            // since, must everything have settled.
            checker::check_records(&s.history, &records, s.step, i == jumps.len() - 1)?;
            checker::check_audit(&s.history, &entries)?;
        }
        Ok(())
    }
}

/// Records an answer for the checker and the trace.
fn answered(sim: &Sim, call: Call, key: Option<OperationKey>, outcome: Outcome) {
    let mut s = sim.lock();
    let seq = s.history.next_seq();
    let step = s.step;
    let task = current().map_or(0, |c| c.task);
    s.note(|| {
        format!(
            "answer {:?} {}: {}{}{} safe_to_repeat={}",
            call,
            key.as_ref().map_or("(no key)", |k| k.as_str()),
            outcome.status.as_str(),
            outcome
                .effect_reference
                .as_ref()
                .map_or(String::new(), |r| format!(" ref {r}")),
            outcome
                .error_code()
                .map_or(String::new(), |c| format!(" ({})", c.as_str())),
            outcome.safe_to_repeat()
        )
    });
    s.history.answers.push(Answer {
        seq,
        step,
        task,
        call,
        key,
        outcome,
    });
}
