//! The threads that run tools' synchronous functions.
//!
//! A runner takes the interpreter lock once and runs every call waiting when it does, one after
//! another, before it lets the lock go. Concurrent callers come in waves (all claim, all mark,
//! all call their functions), so where one blocking thread per call (tokio's pool) made eight
//! threads wake and hand the lock to each other eight times, one runner wakes and takes it
//! once. A call that does not start within [`NUDGE_AFTER`] is stuck behind a slow function:
//! its waiter wakes (or starts) another runner, so a slow function delays the others by that
//! much at most. A runner idle for [`KEEP_ALIVE`] ends.
//!
//! A caller alone, polling its own call on its own thread ([`crate::here`]), takes its
//! function's job itself instead ([`submit`] with `here`): the runner's wake-up was then the
//! one hand-off left between thread and thread in its call.
//!
//! Nothing here decides anything about the call: a job is a closure that calls the function and
//! answers its waiter, and [`Ticket::abandon`] tells a waiter whose patience ran out whether the
//! call never started (then it never will).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use pyo3::prelude::*;

/// How long a queued call waits for a runner before its waiter wakes another.
pub const NUDGE_AFTER: Duration = Duration::from_millis(2);
/// How long a runner with nothing to do stays.
const KEEP_ALIVE: Duration = Duration::from_secs(10);
/// The most runners at once (as many as tokio's blocking pool allowed before).
const MAX_RUNNERS: usize = 512;

const QUEUED: u8 = 0;
const STARTED: u8 = 1;
const ABANDONED: u8 = 2;

/// What a job runs with: the interpreter, or `None` when it is shutting down (the job must then
/// answer that its function was not called).
pub type Run = Box<dyn FnOnce(Option<Python<'_>>) + Send>;

struct Job {
    state: Arc<AtomicU8>,
    run: Run,
}

/// A submitted call, as its waiter holds it.
pub struct Ticket {
    state: Arc<AtomicU8>,
    /// The call was queued alone and a runner was woken (or started) for it: that runner takes
    /// it first, behind nobody's function, so its waiter needs no [`NUDGE_AFTER`] watch.
    pub first: bool,
    /// The call was handed to the thread polling it, which runs it as soon as that poll ends
    /// ([`taking_here`]): nobody needs waking for it, and it is never behind another.
    pub here: bool,
}

impl Ticket {
    /// Gives the call up: `true` when it had not started, and now never will.
    pub fn abandon(&self) -> bool {
        self.state
            .compare_exchange(QUEUED, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// Runners alive.
    runners: usize,
    /// Of those, the ones waiting for work.
    idle: usize,
    /// Wake-ups sent to waiting runners and not yet taken up.
    woken: usize,
    /// Jobs taken by a runner and not finished: functions running now.
    running: usize,
}

impl State {
    /// Whether some runner is running, or about to.
    fn anyone_awake(&self) -> bool {
        self.runners - self.idle + self.woken > 0
    }

    /// Wakes a waiting runner, or starts one. `false` when neither could be done.
    fn add_runner(&mut self, pool: &'static Pool) -> bool {
        if self.idle > self.woken {
            self.woken += 1;
            pool.ready.notify_one();
            return true;
        }
        if self.runners >= MAX_RUNNERS {
            return false;
        }
        let started = std::thread::Builder::new()
            .name("idemgate-py".into())
            .spawn(move || runner(pool));
        match started {
            Ok(_) => {
                self.runners += 1;
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "a thread to run tools' functions could not be started");
                false
            }
        }
    }
}

struct Pool {
    state: Mutex<State>,
    ready: Condvar,
    /// Signalled when no job is queued or running any more ([`wait_until_quiet`]).
    quiet: Condvar,
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Held for queue operations only, never while a function runs.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        state: Mutex::new(State::default()),
        ready: Condvar::new(),
        quiet: Condvar::new(),
    })
}

thread_local! {
    /// On a caller's thread while it polls its own call ([`taking_here`]): `Some`, holding the
    /// job handed to it once there is one.
    static HERE: RefCell<Option<Option<Job>>> = const { RefCell::new(None) };
}

/// A job handed to the thread that polled its call, to be run there ([`run_here`]).
pub struct Here(Job);

/// Runs `poll` with this thread taking, instead of a runner, the job of a call [`submit`]ted
/// with `here` meanwhile; answers what `poll` returned and that job, if any.
pub fn taking_here<T>(poll: impl FnOnce() -> T) -> (T, Option<Here>) {
    let outer = HERE.with(|slot| slot.borrow_mut().replace(None));
    // Restored even if `poll` unwinds: a job handed over then is dropped, answering nothing,
    // with the future that waited for it.
    struct Restore(Option<Option<Job>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            HERE.with(|slot| *slot.borrow_mut() = outer);
        }
    }
    let restore = Restore(outer);
    let polled = poll();
    let job = HERE.with(|slot| slot.borrow_mut().as_mut().and_then(Option::take));
    drop(restore);
    (polled, job.map(Here))
}

/// Runs a job handed over by [`taking_here`] on this thread, with the interpreter lock taken for
/// it (none when the interpreter is shutting down: the job then answers that its function was
/// not called). Counted as running, as a runner's job is, for [`wait_until_quiet`].
pub fn run_here(job: Here) {
    let pool = pool();
    pool.lock().running += 1;
    let _running = Running(pool);
    let mut job = Some(job.0);
    Python::try_attach(|py| job.take().map(|job| start(job, Some(py))));
    if let Some(job) = job {
        start(job, None);
    }
}

/// Queues `run` for a runner, waking or starting one if none is awake; with `here`, hands it to
/// this thread instead where it is polling its own call ([`taking_here`]) and holds no job yet.
pub fn submit(run: Run, here: bool) -> Ticket {
    let state = Arc::new(AtomicU8::new(QUEUED));
    let mut run = Some(run);
    if here {
        HERE.with(|slot| {
            if let Some(empty @ None) = slot.borrow_mut().as_mut() {
                *empty = run.take().map(|run| Job {
                    state: state.clone(),
                    run,
                });
            }
        });
    }
    let Some(run) = run else {
        return Ticket {
            state,
            first: true,
            here: true,
        };
    };
    let pool = pool();
    let mut s = pool.lock();
    let alone = s.jobs.is_empty();
    s.jobs.push_back(Job {
        state: state.clone(),
        run,
    });
    let mut first = false;
    if !s.anyone_awake() {
        if !s.add_runner(pool) {
            // No runner could be started: the call is answered now as not called, rather than
            // left waiting.
            let job = s.jobs.pop_back();
            drop(s);
            if let Some(job) = job {
                start(job, None);
            }
            return Ticket {
                state,
                first: true,
                here: false,
            };
        }
        first = alone;
    }
    Ticket {
        state,
        first,
        here: false,
    }
}

/// For a waiter whose call has not started after [`NUDGE_AFTER`]: another runner for the queue.
pub fn nudge() {
    let pool = pool();
    let mut s = pool.lock();
    if !s.jobs.is_empty() {
        s.add_runner(pool);
    }
}

/// Runs `job` unless its waiter gave it up.
fn start(job: Job, py: Option<Python<'_>>) {
    if job
        .state
        .compare_exchange(QUEUED, STARTED, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        (job.run)(py);
    }
}

/// Runs every queued job, one after another, with `py`.
fn drain(pool: &Pool, py: Option<Python<'_>>) {
    loop {
        let job = {
            let mut s = pool.lock();
            let job = s.jobs.pop_front();
            s.running += usize::from(job.is_some());
            job
        };
        let Some(job) = job else { return };
        // Counted out when it ends, even by unwinding (a job catches its own panics; the count
        // does not rely on it: a job counted forever would hold the interpreter's exit).
        let _running = Running(pool);
        start(job, py);
    }
}

/// A job taken by a runner, counted in [`State::running`] until dropped.
struct Running<'a>(&'a Pool);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.running -= 1;
        if s.running == 0 && s.jobs.is_empty() {
            self.0.quiet.notify_all();
        }
    }
}

/// Waits until no function is queued for a runner or running on one. For the interpreter's
/// exit: once it has begun, a thread that takes the interpreter lock back (a function returning
/// from a sleep or a read it made with the lock released) is ended by the interpreter on the
/// spot, and ending a runner that way aborts the process. Python waits for its own threads
/// still running the same way (`threading`, `concurrent.futures`).
pub fn wait_until_quiet() {
    let pool = pool();
    let mut s = pool.lock();
    while s.running > 0 || !s.jobs.is_empty() {
        s = pool.quiet.wait(s).unwrap_or_else(PoisonError::into_inner);
    }
}

fn runner(pool: &'static Pool) {
    // Taking the interpreter lock then only restores this thread's state (`runtime::keep_thread_state`).
    crate::runtime::keep_thread_state();
    loop {
        {
            let mut s = pool.lock();
            while s.jobs.is_empty() {
                s.idle += 1;
                let (guard, waited) = pool
                    .ready
                    .wait_timeout(s, KEEP_ALIVE)
                    .unwrap_or_else(PoisonError::into_inner);
                s = guard;
                s.idle -= 1;
                if s.woken > 0 {
                    s.woken -= 1;
                } else if waited.timed_out() && s.jobs.is_empty() {
                    s.runners -= 1;
                    return;
                }
            }
        }
        // The interpreter lock once for the whole queue; none when it is shutting down, and
        // every job then answers that its function was not called.
        if Python::try_attach(|py| drain(pool, Some(py))).is_none() {
            drain(pool, None);
        }
    }
}
