//! The process's one tokio runtime, and the two ways Python waits on it.
//!
//! The runtime is built on first use (never at import) and shared by every `Local` of the
//! process: building one per call, or per `Local`, would cost threads and a scheduler each time.
//! It is `pyo3_async_runtimes`' runtime, so awaitables handed to asyncio
//! ([`pyo3_async_runtimes::tokio::future_into_py`]) run on the same threads as the synchronous
//! calls.

use std::cell::{Cell, OnceCell};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use tokio::runtime::Runtime;

/// The process the runtime was started in. A runtime's threads do not survive `fork`: a child
/// forked after the runtime started has its state but none of its threads, and would wait
/// forever on the first call.
static STARTED_IN: OnceLock<u32> = OnceLock::new();

/// The runtime, started on first use in this process.
pub fn runtime() -> PyResult<&'static Runtime> {
    let pid = std::process::id();
    let started = *STARTED_IN.get_or_init(|| {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.enable_all().thread_name("idemgate");
        pyo3_async_runtimes::tokio::init(builder);
        pid
    });
    if started != pid {
        return Err(PyRuntimeError::new_err(format!(
            "idemgate's engine was started in process {started} and this process ({pid}) was \
             forked from it: its threads did not come along. Create each Local in the process \
             that uses it, after forking (in a web server's post-fork hook, say)"
        )));
    }
    Ok(pyo3_async_runtimes::tokio::get_runtime())
}

/// Runs `future` on the runtime and waits for it on this thread, with the interpreter lock
/// released the whole time, so other Python threads run while the engine waits on the store
/// or on a tool's function. A panic is caught here and becomes a `RuntimeError`: it never
/// unwinds into the interpreter.
pub fn block_on<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let runtime = runtime()?;
    py.detach(|| {
        let _blocked = Blocked::enter();
        poll_here(runtime, future)
    })
}

/// Polls `future` to its end on this thread, a panic caught.
fn poll_here<F: Future>(runtime: &Runtime, future: F) -> PyResult<F::Output> {
    std::panic::catch_unwind(AssertUnwindSafe(|| runtime.handle().block_on(future)))
        .map_err(|panic| internal(&panic))
}

/// [`block_on`] for a call that may be polled elsewhere: while other callers wait too, its
/// future is polled on the extension's poller thread after its first poll here
/// ([`crate::poller`]); a caller alone polls its own, and runs its tool's function itself where
/// it may ([`crate::here`]) — never on the main thread, where Python runs its signal handlers:
/// a Ctrl-C there must stop the program once the call is answered, not the function midway.
pub fn block_on_shared<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let runtime = runtime()?;
    let main = is_main_thread(py);
    py.detach(|| {
        let others = BLOCKED.load(Ordering::Relaxed) > 0;
        let _blocked = Blocked::enter();
        if !others {
            if main {
                return poll_here(runtime, future);
            }
            return crate::here::run(runtime.handle(), future).map_err(|panic| internal(&*panic));
        }
        let _entered = runtime.enter();
        match crate::poller::run(runtime.handle(), future) {
            Ok(Some(output)) => output.map_err(|panic| internal(&*panic)),
            Ok(None) => Err(PyRuntimeError::new_err(
                "idemgate's engine dropped a call unanswered",
            )),
            Err(future) => poll_here(runtime, future),
        }
    })
}

/// Whether this is the interpreter's main thread (asked of Python once per thread).
fn is_main_thread(py: Python<'_>) -> bool {
    thread_local! {
        static MAIN: OnceCell<bool> = const { OnceCell::new() };
    }
    MAIN.with(|main| {
        *main.get_or_init(|| {
            let main = || -> PyResult<bool> {
                let threading = py.import("threading")?;
                let current = threading.call_method0("current_thread")?;
                Ok(current.is(&threading.call_method0("main_thread")?))
            };
            // Unknown: taken as the main thread, which keeps the function off it.
            main().unwrap_or(true)
        })
    })
}

/// How many callers are blocked in [`block_on`] right now, in the whole process.
static BLOCKED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread is a caller blocked in [`block_on`].
    static BLOCKED_HERE: Cell<bool> = const { Cell::new(false) };
}

/// A caller's time in [`block_on`], counted in [`BLOCKED`] until dropped.
struct Blocked;

impl Blocked {
    fn enter() -> Self {
        BLOCKED.fetch_add(1, Ordering::Relaxed);
        BLOCKED_HERE.set(true);
        Blocked
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        BLOCKED_HERE.set(false);
        BLOCKED.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether this thread is a caller blocked in [`block_on`] and the only one: a thread with
/// nothing else to do, on a process where no other caller waits for the processor.
pub fn blocked_alone() -> bool {
    BLOCKED_HERE.get() && BLOCKED.load(Ordering::Relaxed) == 1
}

/// A panic's payload as an error for Python.
pub fn internal(panic: &(dyn std::any::Any + Send)) -> PyErr {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into());
    PyRuntimeError::new_err(format!("idemgate's engine failed internally: {what}"))
}

/// Debug builds only: `IDEMGATE_PY_TEST_PANIC=<point>` panics at that point of the binding
/// (`after_call`: after every call of a tool's function; `replay_from_memory`: on the
/// memory-only replay path), so the Python tests can prove a panic there never reaches the
/// interpreter and never turns a call that may have had its effect into a refusal. Release
/// builds have no such hook.
pub fn test_panic(point: &str) {
    #[cfg(debug_assertions)]
    if std::env::var("IDEMGATE_PY_TEST_PANIC").as_deref() == Ok(point) {
        panic!("IDEMGATE_PY_TEST_PANIC={point}");
    }
    #[cfg(not(debug_assertions))]
    let _ = point;
}

/// A future for Python's asyncio: awaitable from the running event loop, run on the runtime.
/// Cancelling the awaitable stops only the wait; a delivery already claimed runs to its end on
/// a task of its own (the engine detaches it).
pub fn awaitable<'py, F, T>(py: Python<'py>, future: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    runtime()?;
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        // A panic inside the engine's call must not unwind through the bridge's task.
        match futures_catch(future).await {
            Ok(result) => result,
            Err(panic) => Err(internal(&*panic)),
        }
    })
}

/// Awaits `future`, catching a panic raised while it is polled.
pub async fn futures_catch<F: Future>(
    future: F,
) -> Result<F::Output, Box<dyn std::any::Any + Send + 'static>> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(std::task::Poll::Ready(output)) => std::task::Poll::Ready(Ok(output)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    })
    .await
}

/// A Python thread state made for a thread the interpreter did not start (a runner, one of the
/// runtime's threads) and kept while this lives. Without it, every take of the interpreter
/// lock on such a thread makes a thread state and throws it away after — with its frame stack,
/// a mapping of fresh memory each time, and a system call or two; with it, taking the lock
/// only restores it.
struct ThreadState {
    gstate: ffi::PyGILState_STATE,
    saved: *mut ffi::PyThreadState,
}

impl ThreadState {
    /// A thread state kept for this thread, or `None` where it has one already (a Python
    /// thread, which the interpreter owns) or the interpreter is not running.
    fn keep() -> Option<Self> {
        // SAFETY: `PyGILState_GetThisThreadState` only reads this thread's slot. The state
        // `PyGILState_Ensure` makes is handed back at once with `PyEval_SaveThread`, which
        // lets the lock go; `drop` restores and releases it, in pair, on the same thread.
        unsafe {
            if ffi::Py_IsInitialized() == 0 || !ffi::PyGILState_GetThisThreadState().is_null() {
                return None;
            }
            let gstate = ffi::PyGILState_Ensure();
            let saved = ffi::PyEval_SaveThread();
            Some(ThreadState { gstate, saved })
        }
    }
}

impl Drop for ThreadState {
    fn drop(&mut self) {
        // SAFETY: the pair of `keep`'s calls, on the same thread (the type is not `Send`). An
        // interpreter already finalized has freed every thread state with itself: nothing is
        // left to release.
        unsafe {
            if ffi::Py_IsInitialized() == 0 {
                return;
            }
            ffi::PyEval_RestoreThread(self.saved);
            ffi::PyGILState_Release(self.gstate);
        }
    }
}

thread_local! {
    /// This thread's kept state, when [`keep_thread_state`] made one; released when the thread
    /// ends (a runner or a blocking thread of the runtime idle for long enough).
    static KEPT: OnceCell<Option<ThreadState>> = const { OnceCell::new() };
}

/// Keeps a thread state for this thread from now on (see [`ThreadState`]), once per thread:
/// for a runner when it starts, for the runtime's threads at their first call into the
/// interpreter (an `async def` function, an awaitable's outcome, a hook). Must not be called
/// while attached to the interpreter (it then does nothing: the thread has a state).
pub fn keep_thread_state() {
    KEPT.with(|kept| {
        kept.get_or_init(ThreadState::keep);
    });
}
