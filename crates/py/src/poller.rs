//! Synchronous callers' engine futures, polled on one thread of the extension's while several
//! callers wait at once.
//!
//! A synchronous call polled on its caller's own thread is woken three times on the way for a
//! new key of a key-based tool — its claim committed (with its dispatch marker, where the tool
//! writes one), its function's answer from a runner, its record committed — each the wake-up
//! of a sleeping thread, and with eight callers on two processors each wake-up also waits its
//! turn for one.
//! While other callers wait too, a call's future is polled here instead, after its first poll
//! on the caller's thread: a commit answering eight callers wakes this one thread, which takes
//! each of their next steps in one go, and the caller's thread is woken once, with its answer.
//! A caller alone keeps polling its own future (`runtime::block_on`): nobody would share the
//! wake-ups, and it commits its own writes on its own thread.
//!
//! This thread never waits for the disk ([`idemgate_core::store::never_wait_on_this_thread`]):
//! a store hands every write polled here to its own thread, and the future is woken once the
//! write is durable. The runtime is entered while polling, so that timers (a function's
//! timeout) and spawned tasks run on it as on the caller's thread. A panic while polling is
//! the call's answer, as on the caller's thread (`runtime::futures_catch`).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Wake, Waker};

use tokio::runtime::Handle;

type Job = Pin<Box<dyn Future<Output = ()> + Send>>;
type Panic = Box<dyn std::any::Any + Send + 'static>;

/// Nobody polls the task and no wake-up is pending.
const IDLE: u8 = 0;
/// Woken: in the poller's queue.
const QUEUED: u8 = 1;
/// Being polled.
const POLLING: u8 = 2;
/// Woken while being polled: polled again at once.
const NOTIFIED: u8 = 3;
/// Finished.
const DONE: u8 = 4;

struct Task {
    state: AtomicU8,
    /// Only ever locked by the one thread polling (see the states): uncontended.
    future: Mutex<Option<Job>>,
    poller: &'static Poller,
}

impl Wake for Task {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let next = match state {
                IDLE => QUEUED,
                POLLING => NOTIFIED,
                _ => return,
            };
            match self
                .state
                .compare_exchange_weak(state, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if next == QUEUED => return self.poller.push(Arc::clone(self)),
                Ok(_) => return,
                Err(actual) => state = actual,
            }
        }
    }
}

impl Task {
    /// Polls the future (the state is [`POLLING`]) until it is pending with no wake-up missed,
    /// or finished.
    fn run(self: &Arc<Self>) {
        let waker = Waker::from(Arc::clone(self));
        let mut cx = Context::from_waker(&waker);
        let mut slot = self.future.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let Some(future) = slot.as_mut() else {
                self.state.store(DONE, Ordering::Release);
                return;
            };
            if future.as_mut().poll(&mut cx).is_ready() {
                *slot = None;
                self.state.store(DONE, Ordering::Release);
                return;
            }
            match self
                .state
                .compare_exchange(POLLING, IDLE, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                // Woken meanwhile: the wake-up found it being polled and left it to us.
                Err(_) => self.state.store(POLLING, Ordering::Release),
            }
        }
    }
}

#[derive(Default)]
struct Queue {
    tasks: VecDeque<Arc<Task>>,
    /// The poller waits for a task: a push must wake it.
    sleeping: bool,
}

struct Poller {
    queue: Mutex<Queue>,
    ready: Condvar,
}

impl Poller {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, task: Arc<Task>) {
        let mut queue = self.lock();
        queue.tasks.push_back(task);
        if queue.sleeping {
            queue.sleeping = false;
            drop(queue);
            self.ready.notify_one();
        }
    }
}

/// The poller, started on first use; `None` where its thread could not be started (callers
/// then poll their own futures).
fn poller(runtime: &Handle) -> Option<&'static Poller> {
    static POLLER: OnceLock<Option<&'static Poller>> = OnceLock::new();
    *POLLER.get_or_init(|| {
        let poller: &'static Poller = Box::leak(Box::new(Poller {
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
        }));
        let runtime = runtime.clone();
        std::thread::Builder::new()
            .name("idemgate-poll".into())
            .spawn(move || poll_forever(poller, &runtime))
            .ok()
            .map(|_| poller)
    })
}

fn poll_forever(poller: &'static Poller, runtime: &Handle) {
    idemgate_core::store::never_wait_on_this_thread();
    // An `async def` function or hook is started on the thread that polls its call.
    crate::runtime::keep_thread_state();
    let _entered = runtime.enter();
    loop {
        let ready: Vec<Arc<Task>> = {
            let mut queue = poller.lock();
            while queue.tasks.is_empty() {
                queue.sleeping = true;
                queue = poller
                    .ready
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            queue.tasks.drain(..).collect()
        };
        for task in ready {
            // Only this thread takes a task out of `QUEUED`.
            task.state.store(POLLING, Ordering::Release);
            task.run();
        }
    }
}

/// Runs `future` to its end for the calling thread, which must be a caller that is not alone
/// (see the module documentation): its first poll here, the rest on the poller; `Err` when
/// the poller could not be started, `future` then handed back. The caller waits meanwhile; the
/// runtime must be entered. `None` inside: the future was dropped unfinished (it never is while
/// it can still be woken; were it, the caller hears so instead of waiting forever).
pub fn run<F>(runtime: &Handle, future: F) -> Result<Option<Result<F::Output, Panic>>, F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let Some(poller) = poller(runtime) else {
        return Err(future);
    };
    let (answer_to, answer) = std::sync::mpsc::sync_channel(1);
    let job: Job = Box::pin(async move {
        let _ = answer_to.send(crate::runtime::futures_catch(future).await);
    });
    let task = Arc::new(Task {
        state: AtomicU8::new(POLLING),
        future: Mutex::new(Some(job)),
        poller,
    });
    task.run();
    drop(task);
    Ok(answer.recv().ok())
}
