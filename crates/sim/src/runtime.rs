//! A minimal single-threaded async runtime whose every step is chosen by the schedule.
//!
//! There is no tokio here, on purpose: tokio's scheduler, timers and I/O readiness are the
//! nondeterminism a simulation has to remove. Tasks are boxed futures tagged with the simulated
//! *process* that runs them; [`Runtime::poll`] polls one chosen task once, with a thread-local
//! naming it, so that every simulated interface can tell who called it.
//!
//! Every simulated interface call is a **yield point** ([`yield_point`]): its future returns
//! `Pending` once, recording where the task stopped, and wakes itself, so the task is runnable
//! again but goes on only when the scheduler picks it. That is where interleavings and crashes
//! happen. Waiting for time ([`SimTimer`]) parks the task until the scheduler moves the
//! simulated clock ([`Sim::advance_to`]) past its deadline.
//!
//! Wakers are real wakers (setting the task's bit in a woken set), so futures that wait on
//! something else the simulation contains — a channel, a lock — also work.
//!
//! [`Sim`] is the state every simulated part shares behind one mutex: the clock, the woken set
//! and the timers, the choice stream, the history the checker reads, and the trace.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use idemgate_core::clock::{Clock, Timer};
use idemgate_core::record::Millis;
use idemgate_core::store::BoxFuture;

use crate::choices::Choices;
use crate::history::History;

pub type TaskId = u64;
pub type ProcessId = u32;

/// Where a task stopped, for the trace and for the scheduler's choice of crash points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Spawned, not yet polled.
    Start,
    /// Before a store write: a crash here means the write never happened.
    BeforeWrite,
    /// After a store write committed: a crash here loses the answer, not the write.
    AfterWrite,
    BeforeRead,
    /// Before a request leaves for the downstream: a crash here means it never left.
    BeforeSend,
    /// After the downstream committed, before its answer arrives.
    AfterCommit,
    /// Before a receipt lookup or a job poll.
    BeforeAsk,
    BeforeAuthorize,
    /// Waiting on the simulated timer.
    Sleeping,
}

impl Point {
    /// Points where a crash tells the executor's crash-safety something.
    pub fn crash_worthy(self) -> bool {
        matches!(
            self,
            Point::BeforeWrite | Point::AfterWrite | Point::BeforeSend | Point::AfterCommit
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Current {
    pub task: TaskId,
    pub process: ProcessId,
}

thread_local! {
    static CURRENT: Cell<Option<Current>> = const { Cell::new(None) };
}

/// The task being polled, if any.
pub fn current() -> Option<Current> {
    CURRENT.with(Cell::get)
}

struct TimerEntry {
    waker: Waker,
}

/// Everything the simulated parts share. Locked briefly, never across a poll or a drop.
pub struct State {
    pub now: Millis,
    pub start: Millis,
    /// Scheduler steps taken: the history's timestamps.
    pub step: u64,
    pub choices: Choices,
    /// Whether interfaces inject faults (off during quiescence).
    pub faults: bool,
    pub history: History,
    /// The readable trace, when kept.
    pub trace: Option<Vec<String>>,
    woken: BTreeSet<TaskId>,
    timers: BTreeMap<(Millis, u64), TimerEntry>,
    next_timer: u64,
    parked: BTreeMap<TaskId, Point>,
}

impl State {
    /// Appends a trace line stamped with the time and the current task; `text` is only built
    /// when the trace is kept.
    pub fn note(&mut self, text: impl FnOnce() -> String) {
        if let Some(lines) = self.trace.as_mut() {
            let who = match current() {
                Some(c) => format!("p{}/T{} ", c.process, c.task),
                None => String::new(),
            };
            lines.push(format!("t={}ms {who}{}", self.now - self.start, text()));
        }
    }

    /// A draw from the choice stream, or 0 when faults are off.
    pub fn fault(&mut self, n: u64) -> u64 {
        if self.faults {
            self.choices.choose(n)
        } else {
            0
        }
    }
}

pub struct Sim {
    state: Mutex<State>,
}

impl Sim {
    pub fn new(choices: Choices, start: Millis, trace: bool) -> Arc<Sim> {
        Arc::new(Sim {
            state: Mutex::new(State {
                now: start,
                start,
                step: 0,
                choices,
                faults: true,
                history: History::default(),
                trace: trace.then(Vec::new),
                woken: BTreeSet::new(),
                timers: BTreeMap::new(),
                next_timer: 0,
                parked: BTreeMap::new(),
            }),
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock is held (a checker assertion, say) must not hide the trace.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn now(&self) -> Millis {
        self.lock().now
    }

    /// Tasks ready to be polled, in id order.
    pub fn runnable(&self) -> Vec<TaskId> {
        self.lock().woken.iter().copied().collect()
    }

    pub fn parked_at(&self, task: TaskId) -> Point {
        self.lock()
            .parked
            .get(&task)
            .copied()
            .unwrap_or(Point::Start)
    }

    /// The earliest timer's deadline.
    pub fn next_timer(&self) -> Option<Millis> {
        self.lock().timers.keys().next().map(|(at, _)| *at)
    }

    /// Moves the clock to `at` (never backwards) and wakes every timer due by then.
    pub fn advance_to(&self, at: Millis) {
        let due: Vec<Waker> = {
            let mut s = self.lock();
            s.now = s.now.max(at);
            let now = s.now;
            let keys: Vec<(Millis, u64)> = s
                .timers
                .range(..=(now, u64::MAX))
                .map(|(k, _)| *k)
                .collect();
            keys.into_iter()
                .filter_map(|k| s.timers.remove(&k))
                .map(|e| e.waker)
                .collect()
        };
        // Woken outside the lock: a waker takes it again.
        for waker in due {
            waker.wake();
        }
    }

    fn park(&self, point: Point) {
        if let Some(c) = current() {
            self.lock().parked.insert(c.task, point);
        }
    }
}

struct TaskWaker {
    task: TaskId,
    sim: Weak<Sim>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(sim) = self.sim.upgrade() {
            sim.lock().woken.insert(self.task);
        }
    }
}

/// A future that stops once at `point`: the scheduler decides when the task goes on. Outside
/// a simulated task it does not stop at all.
pub fn yield_point(sim: &Arc<Sim>, point: Point) -> YieldPoint {
    YieldPoint {
        sim: sim.clone(),
        point,
        stopped: false,
    }
}

pub struct YieldPoint {
    sim: Arc<Sim>,
    point: Point,
    stopped: bool,
}

impl Future for YieldPoint {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.stopped || current().is_none() {
            return Poll::Ready(());
        }
        self.stopped = true;
        self.sim.park(self.point);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The simulated clock: the executor's `Clock`.
#[derive(Clone)]
pub struct SimClock(pub Arc<Sim>);

impl Clock for SimClock {
    fn now(&self) -> Millis {
        self.0.now()
    }
}

/// The simulated timer: a sleep ends when the scheduler moves the clock past it.
#[derive(Clone)]
pub struct SimTimer(pub Arc<Sim>);

impl Timer for SimTimer {
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        Box::pin(Sleep {
            deadline: self.0.now().saturating_add(millis),
            sim: self.0.clone(),
            entry: None,
        })
    }
}

/// One wait on the simulated timer.
pub struct Sleep {
    sim: Arc<Sim>,
    deadline: Millis,
    entry: Option<(Millis, u64)>,
}

impl Sleep {
    pub fn new(sim: &Arc<Sim>, duration: Millis) -> Sleep {
        Sleep {
            deadline: sim.now().saturating_add(duration),
            sim: sim.clone(),
            entry: None,
        }
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        let sim = self.sim.clone();
        let mut s = sim.lock();
        if s.now >= deadline {
            if let Some(k) = self.entry.take() {
                s.timers.remove(&k);
            }
            return Poll::Ready(());
        }
        let key = match self.entry {
            Some(k) => k,
            None => {
                s.next_timer += 1;
                (deadline, s.next_timer)
            }
        };
        s.timers.insert(
            key,
            TimerEntry {
                waker: cx.waker().clone(),
            },
        );
        if let Some(c) = current() {
            s.parked.insert(c.task, Point::Sleeping);
        }
        drop(s);
        self.entry = Some(key);
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(k) = self.entry.take() {
            self.sim.lock().timers.remove(&k);
        }
    }
}

type LocalFuture = Pin<Box<dyn Future<Output = ()>>>;

struct Slot {
    process: ProcessId,
    future: LocalFuture,
    waker: Waker,
}

/// The tasks, owned on this thread, each polled only when the schedule says so.
pub struct Runtime {
    sim: Arc<Sim>,
    tasks: BTreeMap<TaskId, Slot>,
    next: TaskId,
}

impl Runtime {
    pub fn new(sim: Arc<Sim>) -> Runtime {
        Runtime {
            sim,
            tasks: BTreeMap::new(),
            next: 0,
        }
    }

    pub fn sim(&self) -> &Arc<Sim> {
        &self.sim
    }

    /// Adds a task to `process`; it is runnable and first polled when the scheduler picks it.
    pub fn spawn(
        &mut self,
        process: ProcessId,
        future: impl Future<Output = ()> + 'static,
    ) -> TaskId {
        self.next += 1;
        let task = self.next;
        let waker = Waker::from(Arc::new(TaskWaker {
            task,
            sim: Arc::downgrade(&self.sim),
        }));
        self.tasks.insert(
            task,
            Slot {
                process,
                future: Box::pin(future),
                waker,
            },
        );
        self.sim.lock().woken.insert(task);
        task
    }

    pub fn process_of(&self, task: TaskId) -> Option<ProcessId> {
        self.tasks.get(&task).map(|s| s.process)
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Tasks of `process`, in id order.
    pub fn tasks_of(&self, process: ProcessId) -> Vec<TaskId> {
        self.tasks
            .iter()
            .filter(|(_, s)| s.process == process)
            .map(|(t, _)| *t)
            .collect()
    }

    /// Polls `task` once. Returns whether it finished.
    pub fn poll(&mut self, task: TaskId) -> bool {
        if !self.tasks.contains_key(&task) {
            self.sim.lock().woken.remove(&task);
            return true;
        }
        {
            let mut s = self.sim.lock();
            s.woken.remove(&task);
            s.parked.remove(&task);
        }
        let slot = self.tasks.get_mut(&task).expect("checked above");
        let waker = slot.waker.clone();
        let mut cx = Context::from_waker(&waker);
        let previous = CURRENT.with(|c| {
            c.replace(Some(Current {
                task,
                process: slot.process,
            }))
        });
        let done = slot.future.as_mut().poll(&mut cx).is_ready();
        CURRENT.with(|c| c.set(previous));
        if done {
            self.tasks.remove(&task);
            let mut s = self.sim.lock();
            s.woken.remove(&task);
            s.parked.remove(&task);
        }
        done
    }

    /// Drops every task of `process` at once, wherever each stopped: a crash. Shared state
    /// (the store, the downstream) keeps whatever they had already done.
    pub fn kill(&mut self, process: ProcessId) -> usize {
        let doomed: Vec<TaskId> = self.tasks_of(process);
        let slots: Vec<Slot> = doomed.iter().filter_map(|t| self.tasks.remove(t)).collect();
        {
            let mut s = self.sim.lock();
            for t in &doomed {
                s.woken.remove(t);
                s.parked.remove(t);
            }
        }
        // Dropped outside the lock: a future's drop (a timer entry, a send in flight) takes it.
        let n = slots.len();
        drop(slots);
        n
    }
}

/// Runs a future to completion on this thread, parking until its waker is called. For the
/// stores whose futures complete on a thread of their own (SQLite's writer): the simulation
/// waits for each call whole, so scheduling stays its own.
pub fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    // Not a simulated task while inside: yield points in the future pass straight through.
    let previous = CURRENT.with(|c| c.replace(None));
    let out = loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            break out;
        }
        std::thread::park();
    };
    CURRENT.with(|c| c.set(previous));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three tasks that each yield a few times and write their steps in order: the order is a
    /// function of the choice stream alone.
    fn interleaving(seed: u64) -> Vec<String> {
        let sim = Sim::new(Choices::seeded(seed), 0, false);
        let mut rt = Runtime::new(sim.clone());
        let log = Arc::new(Mutex::new(Vec::new()));
        for name in ["a", "b", "c"] {
            let (sim, log) = (sim.clone(), log.clone());
            rt.spawn(1, async move {
                for i in 0..3 {
                    log.lock().unwrap().push(format!("{name}{i}"));
                    yield_point(&sim, Point::BeforeRead).await;
                }
                Sleep::new(&sim, 50).await;
                log.lock().unwrap().push(format!("{name}-woke"));
            });
        }
        let mut steps = 0;
        while !rt.is_empty() && steps < 1000 {
            steps += 1;
            let runnable = sim.runnable();
            if runnable.is_empty() {
                let at = sim.next_timer().expect("a task waits on a timer");
                sim.advance_to(at);
                continue;
            }
            let i = sim.lock().choices.pick(runnable.len());
            rt.poll(runnable[i]);
        }
        assert!(rt.is_empty());
        log.lock().unwrap().clone()
    }

    #[test]
    fn the_same_seed_interleaves_the_same_way() {
        assert_eq!(interleaving(1), interleaving(1));
        let differs = (2..20).any(|seed| interleaving(seed) != interleaving(1));
        assert!(differs, "seeds should reach different interleavings");
    }

    #[test]
    fn a_kill_drops_a_process_tasks_and_their_timers() {
        let sim = Sim::new(Choices::replay(vec![]), 0, false);
        let mut rt = Runtime::new(sim.clone());
        let s = sim.clone();
        let a = rt.spawn(1, async move { Sleep::new(&s, 100).await });
        let s = sim.clone();
        let b = rt.spawn(2, async move { yield_point(&s, Point::BeforeSend).await });
        rt.poll(a);
        rt.poll(b);
        assert_eq!(sim.next_timer(), Some(100));
        assert_eq!(sim.parked_at(b), Point::BeforeSend);
        assert_eq!(sim.runnable(), [b]);
        assert_eq!(rt.kill(1), 1);
        assert_eq!(sim.next_timer(), None);
        assert!(rt.poll(b));
        assert!(rt.is_empty());
    }

    #[test]
    fn a_sleep_ends_only_when_time_passes_it() {
        let sim = Sim::new(Choices::replay(vec![]), 1_000, false);
        let mut rt = Runtime::new(sim.clone());
        let timer = SimTimer(sim.clone());
        let t = rt.spawn(
            1,
            async move { timer.sleep(Duration::from_millis(30)).await },
        );
        assert!(!rt.poll(t));
        assert!(sim.runnable().is_empty());
        sim.advance_to(1_029);
        assert!(sim.runnable().is_empty());
        sim.advance_to(1_030);
        assert_eq!(sim.runnable(), [t]);
        assert!(rt.poll(t));
    }
}
