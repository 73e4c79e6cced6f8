//! A synchronous caller alone polls its own call, and calls its tool's function itself.
//!
//! Polled on its caller's thread, a new key's call of a key-based tool writes its claim and
//! its record there too (the SQLite store lets a lone writer commit on its own thread), so the
//! one hand-off left between threads was the function's: a [`runner`] woken for it, on a
//! machine whose other processor is usually asleep, then the caller woken (or spinning) for
//! its answer. Here the poll ends when the call is waiting for its function, this thread takes
//! the function's job ([`runner::taking_here`]) and runs it, and polls again.
//!
//! Only for a function without a timeout, on a thread other than the main one (the callers'
//! side decides: `effect`, `runtime::block_on_shared`). A timeout must answer the caller while
//! the function still runs, which a function on the caller's own thread cannot; and on the main
//! thread Python runs its signal handlers, so a Ctrl-C would stop the function midway (its
//! exception then taken for the function's) instead of the program once the call is answered.
//! Without a timeout, the caller waits for the function however it runs: here it only runs on
//! another thread's stack, in a copy of the same context.
//!
//! While the function runs, its call must still be polled when woken: the lease is renewed by
//! a timer of the runtime's. So the future lives behind a mutex, and a wake-up that comes while
//! this thread is running the function has a task of the runtime's poll the future instead
//! ([`Call::poll_elsewhere`]). In the usual call nothing wakes the future while its function
//! runs (the function's answer is read by the next poll here, with no waker) and no other
//! thread takes part.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

use tokio::runtime::Handle;

use crate::runner;

type Panic = Box<dyn std::any::Any + Send + 'static>;

struct Call<F: Future> {
    /// The caller's thread, parked while its call waits.
    caller: Thread,
    runtime: Handle,
    /// Woken since the caller's last poll began.
    woken: AtomicBool,
    /// The caller is running the call's function: a wake-up is for another thread's poll.
    working: AtomicBool,
    /// `None` once finished, its output then in `output`.
    future: Mutex<Option<Pin<Box<F>>>>,
    /// The output of a future another thread finished.
    output: Mutex<Option<Result<F::Output, Panic>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<F> Wake for Call<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Sequentially consistent with the caller's `working` then `woken` (in `run`): a
        // wake-up that comes as the caller starts its function is seen by one of the two.
        self.woken.store(true, Ordering::SeqCst);
        if self.working.load(Ordering::SeqCst) {
            self.poll_elsewhere();
        } else {
            self.caller.unpark();
        }
    }
}

impl<F> Call<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    /// Polls the future once on a task of the runtime's: the caller is busy with its function.
    fn poll_elsewhere(self: &Arc<Self>) {
        let call = Arc::clone(self);
        self.runtime.spawn(async move { call.poll_once() });
    }

    fn poll_once(self: &Arc<Self>) {
        let mut slot = lock(&self.future);
        let waker = Waker::from(Arc::clone(self));
        let Poll::Ready(output) = poll_slot(&mut slot, &waker) else {
            return;
        };
        *lock(&self.output) = Some(output);
        drop(slot);
        self.woken.store(true, Ordering::SeqCst);
        self.caller.unpark();
    }
}

/// Polls the future in `slot` once, if it is still there, a panic caught. A future that
/// finished (or panicked) is dropped here and now, so that a task still due to poll it
/// (`poll_elsewhere`) finds none.
fn poll_slot<F: Future>(
    slot: &mut Option<Pin<Box<F>>>,
    waker: &Waker,
) -> Poll<Result<F::Output, Panic>> {
    let Some(future) = slot.as_mut() else {
        return Poll::Pending;
    };
    let output = match catch_unwind(AssertUnwindSafe(|| {
        future.as_mut().poll(&mut Context::from_waker(waker))
    })) {
        Ok(Poll::Pending) => return Poll::Pending,
        Ok(Poll::Ready(output)) => Ok(output),
        Err(panic) => Err(panic),
    };
    *slot = None;
    Poll::Ready(output)
}

/// Runs `future` to its end on this thread, a caller blocked alone, running its tool's
/// function itself when the call hands it over (see the module documentation). A panic while
/// polling is the answer, as with [`crate::runtime::block_on`]'s.
pub fn run<F>(runtime: &Handle, future: F) -> Result<F::Output, Panic>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let call = Arc::new(Call {
        caller: std::thread::current(),
        runtime: runtime.clone(),
        woken: AtomicBool::new(false),
        working: AtomicBool::new(false),
        future: Mutex::new(Some(Box::pin(future))),
        output: Mutex::new(None),
    });
    let waker = Waker::from(Arc::clone(&call));
    loop {
        let job = {
            let mut slot = lock(&call.future);
            if slot.is_none() {
                // Finished by a task of the runtime's while this thread ran the function.
                drop(slot);
                let output = lock(&call.output).take();
                return output.unwrap_or_else(|| Err(Box::new("a call finished unanswered")));
            }
            call.woken.store(false, Ordering::SeqCst);
            // The runtime entered for the poll only (its timers, its tasks): the function then
            // runs outside it, as on a runner.
            let _entered = runtime.enter();
            match runner::taking_here(|| poll_slot(&mut slot, &waker)) {
                (Poll::Pending, job) => job,
                (Poll::Ready(output), _) => return output,
            }
        };
        if let Some(job) = job {
            call.working.store(true, Ordering::SeqCst);
            if call.woken.load(Ordering::SeqCst) {
                // Woken during the poll or since: whatever for, it must not wait for the
                // function.
                call.poll_elsewhere();
            }
            runner::run_here(job);
            call.working.store(false, Ordering::SeqCst);
            // The function's answer is in; the next poll reads it.
            continue;
        }
        while !call.woken.swap(false, Ordering::SeqCst) {
            std::thread::park();
        }
    }
}
