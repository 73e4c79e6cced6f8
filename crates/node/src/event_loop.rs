//! The engine's futures polled on Node's event loop itself.
//!
//! A call of a tool polled on the runtime's threads crossed between them and the event loop
//! four times: the call to a runtime worker, the tool's JavaScript function back onto the event
//! loop, the function's answer to a worker again, and the outcome back to settle the promise —
//! each the wake-up of a sleeping thread. Polled here instead, the call starts, calls its
//! function and settles its promise on the thread it began on; it leaves it only where the
//! library path's task leaves its own: for the store's writer thread (a commit) and back.
//!
//! The event loop never waits: a future polled here is woken, not waited for. Its thread is
//! marked as one that must never wait ([`idemgate_core::store::never_wait_on_this_thread`]), so
//! a store hands every commit to its own thread rather than making it on the caller's, and the
//! future is woken when the write is durable. A waker may be called on any thread: it queues
//! its task and, when none is queued yet, asks the event loop (a Node-API thread-safe function)
//! to poll what is queued. The runtime is entered while a future is polled, so that its timers
//! (a function's timeout) and the tasks it spawns run on the runtime as before.
//!
//! A panic while a future is polled rejects its promise with an error; it never unwinds into
//! Node. Pending calls keep the process alive, as the runtime's promises did; none pending,
//! the thread-safe function no longer does.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use napi::bindgen_prelude::{Function, Object, ToNapiValue};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::{Env, Error, JsError, Status, sys};

use crate::runtime::{futures_catch, internal, runtime};

type Answer = napi::Result<String>;
type Job = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// Wakes the event loop: its callback polls the queued tasks (the JavaScript function it then
/// calls does nothing). Weak: it keeps the process alive only while calls are pending
/// ([`Loop::pending`]).
type WakeFn = ThreadsafeFunction<(), (), (), Status, false, true>;

/// A promise's deferred, touched on its event loop's thread only.
struct Deferred(sys::napi_deferred);

// SAFETY: a `Deferred` is created, resolved and rejected on its event loop's thread only
// (`promise` and `poll`); other threads only hold the task it belongs to.
unsafe impl Send for Deferred {}

/// What a waker needs, shared with every thread.
struct Shared {
    ready: Mutex<Vec<Arc<Task>>>,
    /// A poll of the queue is asked of the event loop and has not begun.
    scheduled: AtomicBool,
    wake: Mutex<WakeFn>,
}

impl Shared {
    fn schedule(&self) {
        if !self.scheduled.swap(true, Ordering::AcqRel) {
            // Closing (the environment is being torn down): nothing is left to answer.
            let _ = self
                .wake
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .call((), ThreadsafeFunctionCallMode::NonBlocking);
        }
    }
}

/// A call not settled yet: its future, and the promise it settles.
struct Running {
    future: Job,
    deferred: Deferred,
}

struct Task {
    shared: Arc<Shared>,
    /// In the ready queue, or about to be.
    queued: AtomicBool,
    /// Taken when the future finishes.
    running: Mutex<Option<Running>>,
}

impl Wake for Task {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.shared
                .ready
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Arc::clone(self));
            self.shared.schedule();
        }
    }
}

/// This event loop's queue, kept by its thread.
struct Loop {
    shared: Arc<Shared>,
    /// Calls whose promise is not settled yet.
    pending: Cell<usize>,
}

thread_local! {
    static LOOP: RefCell<Option<Rc<Loop>>> = const { RefCell::new(None) };
}

fn this_loop(env: &Env) -> napi::Result<Rc<Loop>> {
    if let Some(found) = LOOP.with_borrow(Clone::clone) {
        return Ok(found);
    }
    let noop: Function<'_, (), ()> =
        env.create_function_from_closure("idemgatePoll", |_| Ok(()))?;
    let wake: WakeFn = noop
        .build_threadsafe_function::<()>()
        .callee_handled::<false>()
        .weak::<true>()
        .build_callback(|ctx| {
            drain(&ctx.env);
            Ok(())
        })?;
    // From now on no store commits a write on this thread: the event loop never waits.
    idemgate_core::store::never_wait_on_this_thread();
    let made = Rc::new(Loop {
        shared: Arc::new(Shared {
            ready: Mutex::new(Vec::new()),
            scheduled: AtomicBool::new(false),
            wake: Mutex::new(wake),
        }),
        pending: Cell::new(0),
    });
    LOOP.set(Some(Rc::clone(&made)));
    Ok(made)
}

/// Keeps the process alive while a call is pending, and lets it go when none is.
#[allow(deprecated)] // `refer`/`unref`: the thread-safe function is one per event loop, not cloned
fn count(env: &Env, lp: &Loop, delta: isize) {
    let before = lp.pending.get();
    let after = before.saturating_add_signed(delta);
    lp.pending.set(after);
    let mut wake = lp
        .shared
        .wake
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let done = match (before, after) {
        (0, 1..) => wake.refer(env),
        (1.., 0) => wake.unref(env),
        _ => Ok(()),
    };
    if let Err(e) = done {
        tracing::warn!(error = %e, "idemgate could not change whether its calls keep Node alive");
    }
}

/// Polls `future` on this event loop and answers a promise of its output: settled at once when
/// the first poll finishes it, else when a later poll does.
pub fn promise<'env, F>(env: &'env Env, future: F) -> napi::Result<Object<'env>>
where
    F: Future<Output = Answer> + Send + 'static,
{
    runtime()?;
    let lp = this_loop(env)?;
    let mut deferred = std::ptr::null_mut();
    let mut promise = std::ptr::null_mut();
    // SAFETY: on the event loop's thread, with its environment.
    let status = unsafe { sys::napi_create_promise(env.raw(), &mut deferred, &mut promise) };
    if status != sys::Status::napi_ok {
        return Err(Error::new(
            Status::GenericFailure,
            "idemgate could not create a promise".to_string(),
        ));
    }
    // A panic while the future is polled ends it with an error; it never unwinds into Node.
    let future = async move {
        futures_catch(future)
            .await
            .unwrap_or_else(|p| Err(internal(&*p)))
    };
    let task = Arc::new(Task {
        shared: Arc::clone(&lp.shared),
        queued: AtomicBool::new(false),
        running: Mutex::new(Some(Running {
            future: Box::pin(future),
            deferred: Deferred(deferred),
        })),
    });
    count(env, &lp, 1);
    poll(env, &lp, &task);
    Ok(Object::from_raw(env.raw(), promise))
}

/// Polls every task queued when it begins; a task woken meanwhile asks for the next round.
fn drain(env: &Env) {
    let Some(lp) = LOOP.with_borrow(Clone::clone) else {
        return;
    };
    lp.shared.scheduled.store(false, Ordering::Release);
    let tasks = std::mem::take(
        &mut *lp
            .shared
            .ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    for task in tasks {
        task.queued.store(false, Ordering::Release);
        poll(env, &lp, &task);
    }
}

fn poll(env: &Env, lp: &Loop, task: &Arc<Task>) {
    let mut running = task.running.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(Running { future, .. }) = running.as_mut() else {
        return;
    };
    let waker = Waker::from(Arc::clone(task));
    // Timers and spawned tasks belong to the runtime, whichever thread polls; a future left
    // unfinished by a panic is dropped inside it too (what it holds may deregister there).
    let _entered = runtime().ok().map(|rt| rt.enter());
    let Poll::Ready(answer) = future.as_mut().poll(&mut Context::from_waker(&waker)) else {
        return;
    };
    let Some(Running { future, deferred }) = running.take() else {
        return;
    };
    // A panic while dropping what a panicked future held is caught as its poll's was.
    if std::panic::catch_unwind(AssertUnwindSafe(|| drop(future))).is_err() {
        tracing::error!("idemgate: a call's future panicked while it was dropped");
    }
    drop(running);
    settle(env, deferred, answer);
    count(env, lp, -1);
}

fn settle(env: &Env, deferred: Deferred, answer: Answer) {
    let raw = env.raw();
    // SAFETY: on the event loop's thread, with its environment; each deferred is settled once
    // (taken out of its task).
    unsafe {
        let value = answer.and_then(|text| String::to_napi_value(raw, text));
        let status = match value {
            Ok(value) => sys::napi_resolve_deferred(raw, deferred.0, value),
            Err(error) => {
                sys::napi_reject_deferred(raw, deferred.0, JsError::from(error).into_value(raw))
            }
        };
        if status != sys::Status::napi_ok {
            tracing::warn!(status, "idemgate could not settle a call's promise");
        }
    }
}
