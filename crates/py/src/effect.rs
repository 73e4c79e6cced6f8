//! A tool's Python functions as the engine's traits: the decorated function is the tool's
//! [`Downstream`] (`perform`, with the optional lookup as `lookup_receipt` and the optional job
//! poller as `poll_job`), and the optional `authorize` callable is its [`Authorizer`].
//!
//! Nothing here decides anything about claims, fences, recovery or labels: each function's
//! answer is classified into the engine's terms ([`EffectOutcome`], [`Lookup`], [`JobStatus`],
//! [`Authorization`]) and the engine does the rest. The Python side hands over *adapters*
//! (`idemgate._local`), which call the user's function and answer a small tuple saying what it
//! did — `("committed", reference, result)`, `("not_sent", reason, retry_after)`, … — so every
//! exception of the user's function is caught in Python, where its type and message are read.
//!
//! Where a function runs: a synchronous one on a [`runner`] thread (never the engine's, whose
//! lease renewals and timeouts must keep running), with the interpreter lock taken only there
//! and its answer read there too — or, for a caller alone and a function without a timeout,
//! on the caller's own thread ([`crate::here`]); an `async def` one on an asyncio event loop —
//! the caller's, when an `AsyncLocal` call is waiting for this very operation, otherwise the
//! background loop the Python side started. The caller's `contextvars` go with the call when the caller is waiting
//! ([`Callers`]); the recoverer's calls have none.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemgate_core::effect::{
    AuthRequest, AuthStage, Authorization, Authorizer, Downstream, EffectOutcome, EffectRequest,
    JobStatus, Lookup,
};
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::ErrorCode;
use idemgate_core::record::{Receipt, Refusal};
use idemgate_core::store::BoxFuture;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::convert::{to_json, to_py};
use crate::runner;

/// Where a waiting caller's call runs: its `contextvars` and, for an `AsyncLocal` call, its
/// running event loop.
pub struct CallerContext {
    pub context: Py<PyAny>,
    pub event_loop: Option<Py<PyAny>>,
}

/// The callers waiting right now, by operation key, so that a tool's function called for a key
/// runs in its caller's context. Only a hint: a function called by the recoverer, or after its
/// caller left, runs without one.
#[derive(Default)]
pub struct Callers {
    next: AtomicU64,
    by_key: Mutex<HashMap<String, (u64, Arc<CallerContext>)>>,
}

/// A caller's entry, removed when the guard is dropped (if no later caller of the same key
/// replaced it).
pub struct Waiting {
    callers: Arc<Callers>,
    key: String,
    id: u64,
}

impl Callers {
    pub fn enter(self: &Arc<Self>, key: String, context: CallerContext) -> Waiting {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(key.clone(), (id, Arc::new(context)));
        Waiting {
            callers: self.clone(),
            key,
            id,
        }
    }

    fn get(&self, key: &str) -> Option<Arc<CallerContext>> {
        self.lock().get(key).map(|(_, c)| c.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, Arc<CallerContext>)>> {
        // A std mutex: it is held for one map operation, never across an await.
        self.by_key.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut by_key = self.callers.lock();
        if by_key.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            by_key.remove(&self.key);
        }
    }
}

/// Why a call of a Python function gave no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The function provably did not start: its arguments could not be made, its event loop
    /// is closed, the interpreter is shutting down.
    NotCalled(String),
    /// The function may have run: it did not return in time, or its call broke in a way that
    /// does not say how far it got.
    Broke(String),
}

/// One Python callable and how to call it.
pub struct Callable {
    pub function: Arc<Py<PyAny>>,
    pub is_async: bool,
    /// The event loop for a coroutine whose caller has none (the background loop).
    pub background: Option<Arc<Py<PyAny>>>,
}

/// Runs `f` attached to the interpreter, with a panic caught: a panic after the call may have
/// followed the effect, so it counts as [`Failure::Broke`]. An interpreter that is shutting
/// down is not attached to at all.
fn attached<T>(f: impl FnOnce(Python<'_>) -> Result<T, Failure>) -> Result<T, Failure> {
    crate::runtime::keep_thread_state();
    Python::try_attach(|py| with_interpreter(Some(py), f)).unwrap_or_else(|| {
        Err(Failure::NotCalled(
            "the Python interpreter is shutting down".into(),
        ))
    })
}

/// Runs `f` with the interpreter `py` (`None`: it is shutting down, and `f` is not called),
/// with a panic caught as in [`attached`].
fn with_interpreter<T>(
    py: Option<Python<'_>>,
    f: impl FnOnce(Python<'_>) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let Some(py) = py else {
        return Err(Failure::NotCalled(
            "the Python interpreter is shutting down".into(),
        ));
    };
    std::panic::catch_unwind(AssertUnwindSafe(|| f(py))).unwrap_or_else(|_| {
        Err(Failure::Broke(
            "idemgate's binding failed internally around the call".into(),
        ))
    })
}

/// An exception as `module.Type: message`, the evidence kept about it.
pub fn describe(py: Python<'_>, error: &PyErr) -> String {
    let kind = error.get_type(py);
    let name = kind
        .fully_qualified_name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into());
    match error.value(py).str() {
        Ok(text) if !text.to_string_lossy().is_empty() => {
            format!("{name}: {}", text.to_string_lossy())
        }
        _ => name,
    }
}

impl Callable {
    /// Calls the function with the arguments `args` makes, in the caller's context when one is
    /// given, waits for its answer up to `timeout`, and reads the answer with `read` while
    /// still attached to the interpreter (the lock is taken once per call, on the thread that
    /// called the function).
    pub async fn call<A, R, T>(
        &self,
        args: A,
        read: R,
        caller: Option<Arc<CallerContext>>,
        timeout: Option<Duration>,
    ) -> Result<T, Failure>
    where
        A: FnOnce(Python<'_>) -> PyResult<Py<PyTuple>> + Send + 'static,
        R: FnOnce(Python<'_>, &Py<PyAny>) -> T + Send + 'static,
        T: Send + 'static,
    {
        if self.is_async {
            let raw = self.call_async(args, caller, timeout).await?;
            attached(|py| Ok(read(py, &raw))).map_err(|f| match f {
                // The function answered; only reading its answer failed.
                Failure::NotCalled(why) | Failure::Broke(why) => Failure::Broke(why),
            })
        } else {
            self.call_sync(args, read, caller, timeout).await
        }
    }

    async fn call_sync<A, R, T>(
        &self,
        args: A,
        read: R,
        caller: Option<Arc<CallerContext>>,
        timeout: Option<Duration>,
    ) -> Result<T, Failure>
    where
        A: FnOnce(Python<'_>) -> PyResult<Py<PyTuple>> + Send + 'static,
        R: FnOnce(Python<'_>, &Py<PyAny>) -> T + Send + 'static,
        T: Send + 'static,
    {
        let function = self.function.clone();
        // A runner thread, never the engine's: the function may take seconds, and the delivery
        // renews its lease and keeps its timeout meanwhile (`runner`: the calls of a wave of
        // callers share one take of the interpreter lock).
        let (answer_to, mut answered) = tokio::sync::oneshot::channel();
        let run: runner::Run = Box::new(move |py| {
            let answer = with_interpreter(py, |py| {
                let args = args(py)
                    .map_err(|e| Failure::NotCalled(describe(py, &e)))?
                    .into_bound(py);
                let function = function.bind(py);
                let answer = match caller {
                    // A copy of the caller's context per call: a context is entered by one
                    // thread at a time.
                    Some(caller) => {
                        let context = caller
                            .context
                            .bind(py)
                            .call_method0("copy")
                            .map_err(|e| Failure::NotCalled(describe(py, &e)))?;
                        let mut all = vec![function.clone()];
                        all.extend(args.iter());
                        let all = PyTuple::new(py, all)
                            .map_err(|e| Failure::NotCalled(describe(py, &e)))?;
                        context.call_method1("run", all)
                    }
                    None => function.call1(args),
                };
                let raw = answer
                    .map(Bound::unbind)
                    .map_err(|e| Failure::Broke(describe(py, &e)))?;
                Ok(read(py, &raw))
            });
            // The waiter may have stopped waiting (its timeout); the answer is then dropped.
            let _ = answer_to.send(answer);
        });
        // The only caller waiting, polling its own call, with no timeout to answer it at while
        // its function still runs: its own thread runs the function once this poll ends
        // (`here`). With a timeout the function must run elsewhere, so that the caller can be
        // answered when it passes.
        let ticket = runner::submit(run, timeout.is_none() && crate::runtime::blocked_alone());
        let lost = || {
            Err(Failure::Broke(
                "the thread running the function failed".into(),
            ))
        };
        if ticket.here {
            // Answered before the next poll on this thread, which reads it: no waker is left
            // for the answer, so that the function's end wakes nobody. (The lease's renewals
            // still wake the call while the function runs; another thread then polls it.)
            let answered = std::future::poll_fn(|_| match answered.try_recv() {
                Ok(answer) => std::task::Poll::Ready(Some(answer)),
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                    std::task::Poll::Ready(None)
                }
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => std::task::Poll::Pending,
            });
            return answered.await.unwrap_or_else(lost);
        }
        let deadline = timeout.map(|limit| tokio::time::Instant::now() + limit);
        // The only caller waiting, its call queued alone with a runner woken for it: the
        // answer comes as soon as that runner has woken and called the function, usually well
        // within [`SPIN_FOR`]. Watching for it, on a thread that has nothing else to do, spares
        // the wake-up of this thread once it comes (tens of microseconds where an idle
        // processor must be woken for it, as on a virtual machine); a longer call is waited
        // for as any other.
        if ticket.first && crate::runtime::blocked_alone() {
            let began = std::time::Instant::now();
            loop {
                match answered.try_recv() {
                    Ok(answer) => return answer,
                    Err(tokio::sync::oneshot::error::TryRecvError::Closed) => return lost(),
                    Err(_) if began.elapsed() < SPIN_FOR => std::hint::spin_loop(),
                    Err(_) => break,
                }
            }
        }
        // Not started soon: stuck behind a slow function, so another runner takes the queue.
        // A call that a runner was woken for, alone, is started first by it: no watch (a timer
        // of a few milliseconds, on a runtime otherwise idle, wakes its driver for every call).
        if !ticket.first {
            let nudge = runner::NUDGE_AFTER.min(timeout.unwrap_or(runner::NUDGE_AFTER));
            if let Ok(answer) = tokio::time::timeout(nudge, &mut answered).await {
                return answer.unwrap_or_else(|_| lost());
            }
            runner::nudge();
        }
        let answer = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, &mut answered).await,
            None => Ok((&mut answered).await),
        };
        match answer {
            Ok(answer) => answer.unwrap_or_else(|_| lost()),
            Err(_) => {
                let limit = timeout.unwrap_or_default();
                if ticket.abandon() {
                    // Never started, and now never will: nothing was done.
                    Err(Failure::NotCalled(format!(
                        "no thread was free to call the function within its timeout of {} s",
                        limit.as_secs_f64()
                    )))
                } else {
                    Err(Failure::Broke(overdue(limit)))
                }
            }
        }
    }

    async fn call_async<A>(
        &self,
        args: A,
        caller: Option<Arc<CallerContext>>,
        timeout: Option<Duration>,
    ) -> Result<Py<PyAny>, Failure>
    where
        A: FnOnce(Python<'_>) -> PyResult<Py<PyTuple>> + Send + 'static,
    {
        let future = attached(|py| {
            let not_called = |e: PyErr| Failure::NotCalled(describe(py, &e));
            let args = args(py).map_err(not_called)?.into_bound(py);
            let (event_loop, context) = match &caller {
                Some(c) => (
                    c.event_loop
                        .as_ref()
                        .map(|l| l.clone_ref(py))
                        .or_else(|| self.background.as_ref().map(|l| l.clone_ref(py))),
                    Some(
                        c.context
                            .bind(py)
                            .call_method0("copy")
                            .map_err(not_called)?,
                    ),
                ),
                None => (self.background.as_ref().map(|l| l.clone_ref(py)), None),
            };
            let Some(event_loop) = event_loop else {
                return Err(Failure::NotCalled(
                    "no event loop to run the coroutine on".into(),
                ));
            };
            // Calling an `async def` function only makes its coroutine: nothing of its body
            // has run yet.
            let coroutine = self.function.bind(py).call1(args).map_err(not_called)?;
            let locals = pyo3_async_runtimes::TaskLocals::new(event_loop.into_bound(py));
            let locals = match context {
                Some(context) => locals.with_context(context),
                None => locals,
            };
            pyo3_async_runtimes::into_future_with_locals(&locals, coroutine.clone()).map_err(|e| {
                // Never scheduled: close it, so Python does not warn it was never awaited.
                let _ = coroutine.call_method0("close");
                not_called(e)
            })
        })?;
        let answer = match timeout {
            Some(limit) => match tokio::time::timeout(limit, future).await {
                Ok(answer) => answer,
                Err(_) => return Err(Failure::Broke(overdue(limit))),
            },
            None => future.await,
        };
        answer.map_err(|e| match attached(|py| Ok(describe(py, &e))) {
            Ok(text) | Err(Failure::NotCalled(text) | Failure::Broke(text)) => Failure::Broke(text),
        })
    }
}

/// How long the only waiting caller watches for its function's answer before it sleeps.
const SPIN_FOR: Duration = Duration::from_micros(150);

fn overdue(limit: Duration) -> String {
    format!(
        "the function did not return within its timeout of {} s",
        limit.as_secs_f64()
    )
}

/// The members of an adapter's answer tuple: its kind and the rest.
fn answer<'py>(
    py: Python<'py>,
    answer: &Py<PyAny>,
) -> Result<(String, Vec<Bound<'py, PyAny>>), String> {
    let tuple = answer
        .bind(py)
        .cast::<PyTuple>()
        .map_err(|_| "the adapter answered something that is not a tuple".to_string())?;
    let mut items: Vec<Bound<'py, PyAny>> = tuple.iter().collect();
    if items.is_empty() {
        return Err("the adapter answered an empty tuple".into());
    }
    let kind: String = items
        .remove(0)
        .extract()
        .map_err(|_| "the adapter answered no kind".to_string())?;
    Ok((kind, items))
}

fn text(item: Option<&Bound<'_, PyAny>>) -> Option<String> {
    item.and_then(|v| v.extract::<Option<String>>().ok().flatten())
}

/// A receipt from an adapter's `reference` and `result` members; `default_reference` when the
/// function named none (a plain JSON result).
fn receipt(
    items: &[Bound<'_, PyAny>],
    default_reference: Option<&str>,
    whose: &str,
) -> Result<Receipt, String> {
    let reference = match (text(items.first()), default_reference) {
        (Some(r), _) if !r.is_empty() => r,
        (_, Some(d)) => d.to_string(),
        _ => return Err(format!("{whose} gave a Receipt without a reference")),
    };
    let result = match items.get(1) {
        Some(result) => to_json(result, "result").map_err(|e| {
            format!("{whose} returned a result that is neither a Receipt nor JSON: {e}")
        })?,
        None => serde_json::Value::Null,
    };
    Ok(Receipt { reference, result })
}

/// What the function's adapter said it did, in the engine's terms.
fn effect_of(py: Python<'_>, raw: &Py<PyAny>, key: &str) -> EffectOutcome {
    let (kind, items) = match answer(py, raw) {
        Ok(parts) => parts,
        Err(why) => return EffectOutcome::ambiguous(why),
    };
    let retry_after = |i: usize| {
        items
            .get(i)
            .and_then(|v| v.extract::<Option<u64>>().ok().flatten())
    };
    match kind.as_str() {
        "committed" => match receipt(&items, Some(key), "the function") {
            Ok(receipt) => EffectOutcome::Committed(receipt),
            // The function returned normally, so the effect may well have happened: never a
            // release, never a refusal.
            Err(why) => EffectOutcome::ambiguous(format!("{why}; the effect may have happened")),
        },
        "job" => match text(items.first()) {
            Some(job_id) if !job_id.is_empty() => EffectOutcome::Accepted { job_id },
            _ => EffectOutcome::ambiguous("the function returned a Job without a job id"),
        },
        "not_sent" => EffectOutcome::NotSent {
            reason: text(items.first()).unwrap_or_else(|| "not sent".into()),
            retry_after: retry_after(1),
        },
        "refused" => EffectOutcome::Refused(Refusal {
            code: ErrorCode::DownstreamRejected,
            message: text(items.first()).unwrap_or_else(|| "refused".into()),
        }),
        "ambiguous" => EffectOutcome::Ambiguous {
            reason: text(items.first()).unwrap_or_else(|| "the function failed".into()),
            retry_after: retry_after(1),
        },
        other => {
            EffectOutcome::ambiguous(format!("the adapter answered an unknown kind {other:?}"))
        }
    }
}

fn lookup_of(py: Python<'_>, raw: &Py<PyAny>) -> Lookup {
    let (kind, items) = match answer(py, raw) {
        Ok(parts) => parts,
        Err(why) => return Lookup::Unavailable(why),
    };
    match kind.as_str() {
        "found" => match receipt(&items, None, "the lookup") {
            Ok(receipt) => Lookup::Found(receipt),
            Err(why) => Lookup::Unavailable(why),
        },
        "not_found" => Lookup::NotFound,
        _ => Lookup::Unavailable(text(items.first()).unwrap_or_else(|| kind.clone())),
    }
}

fn job_of(py: Python<'_>, raw: &Py<PyAny>) -> JobStatus {
    let (kind, items) = match answer(py, raw) {
        Ok(parts) => parts,
        Err(why) => return JobStatus::Unavailable(why),
    };
    let why = || text(items.first()).unwrap_or_else(|| kind.clone());
    match kind.as_str() {
        "running" => JobStatus::Running,
        "done" => match receipt(&items, None, "the job poller") {
            Ok(receipt) => JobStatus::Done(receipt),
            Err(why) => JobStatus::Unavailable(why),
        },
        "failed" => JobStatus::Failed(Refusal {
            code: ErrorCode::DownstreamRejected,
            message: why(),
        }),
        "gone" => JobStatus::Gone(why()),
        _ => JobStatus::Unavailable(why()),
    }
}

/// A tool's functions as its downstream.
pub struct PyEffect {
    pub perform: Callable,
    pub lookup: Option<Callable>,
    pub poll: Option<Callable>,
    /// How long the function may take before its answer counts as lost (ambiguous).
    pub timeout: Option<Duration>,
    pub callers: Arc<Callers>,
}

/// A panic while the function's call is under way may have followed the effect: it becomes an
/// ambiguous answer, which the engine recovers by the lookup or ends `unknown` — never a
/// refusal, and never a panic in the engine's task.
async fn guarded<T>(
    future: impl std::future::Future<Output = T>,
    on_panic: impl FnOnce(String) -> T,
) -> T {
    match crate::runtime::futures_catch(future).await {
        Ok(answer) => answer,
        Err(panic) => {
            let what = crate::runtime::internal(&*panic).to_string();
            tracing::error!(panic = %what, "idemgate's binding panicked around a tool's function");
            on_panic(what)
        }
    }
}

impl Downstream for PyEffect {
    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        let key = request.key.to_string();
        let arguments = request.arguments.clone();
        Box::pin(guarded(
            async move {
                let caller = self.callers.get(&key);
                let call_key = key.clone();
                let args = move |py: Python<'_>| {
                    let items = [
                        to_py(py, &arguments)?,
                        call_key.into_pyobject(py)?.into_any(),
                    ];
                    Ok(PyTuple::new(py, items)?.unbind())
                };
                let read = move |py: Python<'_>, raw: &Py<PyAny>| effect_of(py, raw, &key);
                let answer = self.perform.call(args, read, caller, self.timeout).await;
                // A panic after a call that may have had its effect: never a refusal.
                crate::runtime::test_panic("after_call");
                match answer {
                    Ok(outcome) => outcome,
                    Err(Failure::NotCalled(reason)) => EffectOutcome::NotSent {
                        reason: format!("the function was not called: {reason}"),
                        retry_after: None,
                    },
                    Err(Failure::Broke(reason)) => EffectOutcome::ambiguous(reason),
                }
            },
            EffectOutcome::ambiguous,
        ))
    }

    fn lookup_receipt<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        let key = key.to_string();
        Box::pin(guarded(
            async move {
                let Some(lookup) = &self.lookup else {
                    return Lookup::Unavailable("this tool has no lookup".into());
                };
                let args = move |py: Python<'_>| Ok(PyTuple::new(py, [key])?.unbind());
                match lookup.call(args, lookup_of, None, self.timeout).await {
                    Ok(found) => found,
                    Err(Failure::NotCalled(why) | Failure::Broke(why)) => Lookup::Unavailable(why),
                }
            },
            Lookup::Unavailable,
        ))
    }

    fn poll_job<'a>(&'a self, key: &'a OperationKey, job_id: &'a str) -> BoxFuture<'a, JobStatus> {
        let key = key.to_string();
        let job_id = job_id.to_string();
        Box::pin(guarded(
            async move {
                let Some(poll) = &self.poll else {
                    return JobStatus::Unavailable("this tool has no job poller".into());
                };
                let args = move |py: Python<'_>| Ok(PyTuple::new(py, [job_id, key])?.unbind());
                match poll.call(args, job_of, None, self.timeout).await {
                    Ok(status) => status,
                    Err(Failure::NotCalled(why) | Failure::Broke(why)) => {
                        JobStatus::Unavailable(why)
                    }
                }
            },
            JobStatus::Unavailable,
        ))
    }
}

/// A tool's `authorize` callable as its hook. Its adapter answers `("allowed",)`,
/// `("denied", reason)` or `("unavailable", reason)`; a hook that cannot answer fails closed.
pub struct PyHook {
    pub authorize: Callable,
    pub callers: Arc<Callers>,
    pub timeout: Option<Duration>,
}

impl Authorizer for PyHook {
    fn authorize<'a>(&'a self, request: AuthRequest<'a>) -> BoxFuture<'a, Authorization> {
        let key = request.key.map(|k| k.to_string());
        let fields = [
            request.tenant.to_string(),
            request.actor.to_string(),
            request.role.to_string(),
            request.tool.to_string(),
            key.clone().unwrap_or_default(),
            request.fingerprint.as_str().to_string(),
            match request.stage {
                AuthStage::BeforeEffect => "before_effect",
                AuthStage::BeforeReplay => "before_replay",
            }
            .to_string(),
        ];
        Box::pin(guarded(
            async move {
                let caller = key.as_deref().and_then(|k| self.callers.get(k));
                let args = move |py: Python<'_>| Ok(PyTuple::new(py, fields)?.unbind());
                let read = |py: Python<'_>, raw: &Py<PyAny>| {
                    let (kind, items) = answer(py, raw).map_err(Failure::Broke)?;
                    let why = text(items.first()).unwrap_or_else(|| kind.clone());
                    Ok(match kind.as_str() {
                        "allowed" => Authorization::Allowed,
                        "denied" => Authorization::Denied(why),
                        _ => Authorization::Unavailable(why),
                    })
                };
                let decided = self
                    .authorize
                    .call(args, read, caller, self.timeout)
                    .await
                    .and_then(|decided| decided);
                decided.unwrap_or_else(|(Failure::NotCalled(why) | Failure::Broke(why))| {
                    Authorization::Unavailable(why)
                })
            },
            Authorization::Unavailable,
        ))
    }
}
