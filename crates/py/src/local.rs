//! `NativeLocal`: one [`App`] in this process, the face `idemgate.Local` and
//! `idemgate.AsyncLocal` are written over.
//!
//! Each method converts its arguments, makes one call of the app, and converts the answer
//! back: an outcome is a tuple `(label, operation_key, effect_reference, safe_to_repeat,
//! next_action, retry_after_seconds, result, error_code, error_message)` that the Python side
//! turns into its outcome classes — except an invocation's `applied` or `replayed` outcome,
//! which is made here as the package's own class (every call that did its work answers so, and
//! each step of a caller through Python holds the interpreter lock the others wait for).
//! `call` takes the usual invocation as `Local.invoke` receives it and checks it here, or
//! answers `None` for the package to check any other. Every call either waits with the
//! interpreter lock released ([`runtime::block_on`]) or, with `asynchronous=True`, returns an
//! awaitable for asyncio ([`runtime::awaitable`]); the operator's calls are the same code
//! either way.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemgate_app::operations::reason_of;
use idemgate_app::views;
use idemgate_app::{ActError, App, Assembly, Background, Recovery, Tool, ToolSet};
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Outcome, Status};
use idemgate_core::record::{Record, RecordStatus};
use idemgate_core::store::Filter;
use idemgate_engine::{ActionError, Caller, Resolution, StatusRead};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple};
use serde_json::{Map, Value, json};

use crate::convert::{to_json, to_py};
use crate::effect::{Callable, CallerContext, Callers, PyEffect, PyHook};
use crate::runtime::{self, awaitable, block_on};
use crate::spec;

/// One application over one store, serving the tools registered on it.
#[pyclass(frozen, module = "idemgate._native")]
pub struct NativeLocal {
    app: App,
    caller: Caller,
    callers: Arc<Callers>,
    recoverer: Mutex<Option<Background>>,
    closed: std::sync::atomic::AtomicBool,
    shapes: Arc<Shapes>,
}

/// What the extension needs of the package to answer its usual call itself: the outcome classes
/// an `applied` and a `replayed` answer are made as, the `ContextVar` that `idemgate.workflow` /
/// `idemgate.step` set (its value has `workflow_id` and `step_id`), and the package's bound on
/// an identity part (`_identity.MAX_PART_BYTES`), so that the rule has one home.
pub struct Shapes {
    applied: Py<PyAny>,
    replayed: Py<PyAny>,
    scope: Py<PyAny>,
    max_part_bytes: usize,
}

/// A tool's functions as the Python side hands them over.
#[derive(FromPyObject)]
pub struct Functions {
    perform: Py<PyAny>,
    perform_is_async: bool,
    lookup: Option<Py<PyAny>>,
    lookup_is_async: bool,
    poll: Option<Py<PyAny>>,
    poll_is_async: bool,
    authorize: Option<Py<PyAny>>,
    authorize_is_async: bool,
    /// The background event loop, for coroutines whose caller has none.
    event_loop: Option<Py<PyAny>>,
}

fn check_part(name: &str, value: &str) -> PyResult<()> {
    // A key of these parts is checked by the same rules as every key.
    let (tenant, environment) = match name {
        "tenant" => (value, "e"),
        _ => ("t", value),
    };
    OperationKey::new(tenant, environment, "w", "s")
        .map(|_| ())
        .map_err(|e| PyValueError::new_err(format!("{name}: {e}")))
}

/// An outcome as the tuple the Python side reads.
fn outcome_tuple(py: Python<'_>, o: &Outcome) -> PyResult<Py<PyAny>> {
    let label = o.status.as_str();
    let next = o.next_action.as_str();
    let result = match &o.result {
        Some(value) => to_py(py, value)?,
        None => py.None().into_bound(py),
    };
    let items: [Bound<'_, PyAny>; 9] = [
        label.into_pyobject(py)?.into_any(),
        o.operation_key
            .as_ref()
            .map(|k| k.as_str())
            .into_pyobject(py)?,
        o.effect_reference.as_deref().into_pyobject(py)?,
        o.safe_to_repeat().into_pyobject(py)?.to_owned().into_any(),
        next.into_pyobject(py)?.into_any(),
        o.retry_after_seconds.into_pyobject(py)?,
        result,
        o.error
            .as_ref()
            .map(|e| e.code.as_str())
            .into_pyobject(py)?,
        o.error
            .as_ref()
            .map(|e| e.message.as_str())
            .into_pyobject(py)?,
    ];
    Ok(PyTuple::new(py, items)?.into_any().unbind())
}

/// An invocation's answer as the Python side takes it: an `applied` or `replayed` outcome made
/// here as the package's own class, any other label as the tuple (the package then reads it
/// and raises what it asks for). The engine typed the done answers already, so what
/// `parse_outcome` checks of a gateway's body holds by construction; the frozen dataclass's
/// fields are set as its `__init__` sets them (it has no `__post_init__`), `raw` the body a
/// gateway would have sent and `http_status` 0.
fn invocation_answer(py: Python<'_>, o: &Outcome, shapes: &Shapes) -> PyResult<Py<PyAny>> {
    let (class, label) = match o.status {
        Status::Applied => (&shapes.applied, "applied"),
        Status::Replayed => (&shapes.replayed, "replayed"),
        _ => return outcome_tuple(py, o),
    };
    static NEW: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let new = NEW.get_or_try_init(py, || {
        py.import("builtins")?
            .getattr("object")?
            .getattr("__new__")
            .map(Bound::unbind)
    })?;
    let result = match &o.result {
        Some(value) => to_py(py, value)?,
        None => py.None().into_bound(py),
    };
    let key = o.operation_key.as_ref().map(|k| k.as_str());
    let reference = o.effect_reference.as_deref();
    let safe = o.safe_to_repeat();
    let next = o.next_action.as_str();
    let error = match &o.error {
        Some(e) => {
            let error = PyDict::new(py);
            error.set_item(intern!(py, "code"), e.code.as_str())?;
            error.set_item(intern!(py, "message"), e.message.as_str())?;
            error.into_any()
        }
        None => py.None().into_bound(py),
    };
    let raw = PyDict::new(py);
    raw.set_item(intern!(py, "outcome"), label)?;
    raw.set_item(intern!(py, "status"), label)?;
    raw.set_item(intern!(py, "operation_key"), key)?;
    raw.set_item(intern!(py, "effect_reference"), reference)?;
    raw.set_item(intern!(py, "safe_to_repeat"), safe)?;
    raw.set_item(intern!(py, "next_action"), next)?;
    raw.set_item(intern!(py, "retry_after_seconds"), o.retry_after_seconds)?;
    raw.set_item(intern!(py, "result"), &result)?;
    raw.set_item(intern!(py, "error"), error)?;
    let outcome = new.bind(py).call1((class.bind(py),))?;
    let fields = outcome.getattr(intern!(py, "__dict__"))?;
    let fields = fields.cast::<PyDict>()?;
    fields.set_item(intern!(py, "effect_reference"), reference)?;
    fields.set_item(intern!(py, "result"), result)?;
    fields.set_item(intern!(py, "operation_key"), key)?;
    fields.set_item(intern!(py, "safe_to_repeat"), safe)?;
    fields.set_item(intern!(py, "next_action"), next)?;
    fields.set_item(intern!(py, "http_status"), 0)?;
    fields.set_item(intern!(py, "raw"), raw)?;
    Ok(outcome.unbind())
}

/// A part of the identity as the usual call passes it: `Some(None)` when absent, `Some(part)`
/// for a `str` the package's `check_part` accepts as it is (not empty, at most `max_bytes`, no
/// `:`), `None` for anything else — which the package then checks itself, raising what it finds.
fn plain_part<'a>(value: &'a Bound<'_, PyAny>, max_bytes: usize) -> Option<Option<&'a str>> {
    if value.is_none() {
        return Some(None);
    }
    let text = value.cast_exact::<PyString>().ok()?.to_str().ok()?;
    let fits = !text.is_empty() && text.len() <= max_bytes && !text.contains(':');
    fits.then_some(Some(text))
}

/// What an operator's action that was not carried out answers: `not_found` for a key this
/// caller has no operation under, `store_unavailable`, or `conflict` with the engine's reason
/// — the same codes API v1 answers.
fn refused(key: Option<&OperationKey>, e: ActError) -> Outcome {
    let (code, message) = match e {
        ActError::NotFound(_) | ActError::Action(ActionError::NotFound(_)) => {
            (ErrorCode::NotFound, "no such operation".to_string())
        }
        ActError::Action(ActionError::Store(e)) => {
            tracing::warn!(error = %e, "operator action: store unavailable");
            (
                ErrorCode::StoreUnavailable,
                "the operation store could not be read".to_string(),
            )
        }
        other => (ErrorCode::Conflict, other.to_string()),
    };
    Outcome::rejected(key.cloned(), code, message)
}

/// What reading one operation found, before it is converted for Python.
enum Seen {
    Found(Box<Record>, Outcome, Vec<idemgate_core::record::Event>),
    Denied(Outcome),
}

/// The answer for a key that names no operation of this caller (a malformed one included).
fn no_operation() -> Outcome {
    Outcome::rejected(None, ErrorCode::NotFound, "no such operation")
}

impl NativeLocal {
    fn app(&self) -> PyResult<&App> {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(PyRuntimeError::new_err(
                "this Local is closed; make a new one to go on",
            ));
        }
        Ok(&self.app)
    }

    /// [`NativeLocal::invoke`]'s delivery, its parts checked (see its documentation).
    #[allow(clippy::too_many_arguments)] // the invocation's parts, one each
    fn deliver<'py>(
        &self,
        py: Python<'py>,
        tool: &str,
        arguments: &Bound<'py, PyDict>,
        workflow_id: Option<&str>,
        step_id: Option<&str>,
        wait: Option<Duration>,
        asynchronous: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let app = self.app()?.clone();
        let mut members = Map::new();
        for (name, value) in arguments.iter() {
            let name: String = name
                .extract()
                .map_err(|_| PyTypeError::new_err("argument names are strings"))?;
            let converted = to_json(&value, &name)
                .map_err(|e| PyTypeError::new_err(format!("argument {e}")))?;
            members.insert(name, converted);
        }
        let arguments = Value::Object(members);
        // A replay the engine's memory answers is answered here, holding the interpreter lock
        // for the few microseconds it takes: that path reads no store and asks no hook, so it
        // never waits, and the runtime's threads (and the lock's release and retaking) are
        // spared. Anything else goes to the runtime below, with the lock released.
        let now = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let outcome =
                app.replay_from_memory(&self.caller, tool, workflow_id, step_id, &arguments)?;
            runtime::test_panic("replay_from_memory");
            Some(outcome)
        }))
        .map_err(|panic| runtime::internal(&*panic))?;
        if let Some(outcome) = now {
            return answered(py, asynchronous, &outcome, Some(&self.shapes));
        }
        let key = match (workflow_id, step_id) {
            (Some(w), Some(s)) => {
                OperationKey::new(&self.caller.tenant, app.environment(), w, s).ok()
            }
            _ => None,
        };
        let waiting = match key {
            Some(key) => {
                static COPY_CONTEXT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
                let copy_context = COPY_CONTEXT.import(py, "contextvars", "copy_context")?;
                let context = copy_context.call0()?.unbind();
                let event_loop = if asynchronous {
                    Some(pyo3_async_runtimes::get_running_loop(py)?.unbind())
                } else {
                    None
                };
                Some(self.callers.enter(
                    key.as_str().to_string(),
                    CallerContext {
                        context,
                        event_loop,
                    },
                ))
            }
            None => None,
        };
        let caller = self.caller.clone();
        let (tool, workflow_id, step_id) = (
            tool.to_string(),
            workflow_id.map(str::to_string),
            step_id.map(str::to_string),
        );
        self.answer(py, asynchronous, Some(self.shapes.clone()), async move {
            // Held until the answer: the tool's function runs in this caller's context.
            let _waiting = waiting;
            if asynchronous {
                // An awaitable can be cancelled: the delivery gets a task of its own.
                app.invoke_waiting(caller, &tool, workflow_id, step_id, arguments, wait)
                    .await
            } else {
                // This thread waits for the answer with the lock released and nothing can
                // stop the wait, so the delivery runs right here.
                app.invoke_awaited(caller, &tool, workflow_id, step_id, arguments, wait)
                    .await
            }
        })
    }

    /// Runs an operator's call to its outcome, waiting here or as an awaitable.
    fn outcome<'py, F>(
        &self,
        py: Python<'py>,
        asynchronous: bool,
        call: F,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        F: Future<Output = Outcome> + Send + 'static,
    {
        self.answer(py, asynchronous, None, call)
    }

    /// Runs a call to its outcome, waiting here or as an awaitable; with `shapes`, an
    /// invocation's (see [`invocation_answer`]).
    fn answer<'py, F>(
        &self,
        py: Python<'py>,
        asynchronous: bool,
        shapes: Option<Arc<Shapes>>,
        call: F,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        F: Future<Output = Outcome> + Send + 'static,
    {
        if !asynchronous {
            // The answer is made once the wait is over and this thread holds the interpreter
            // lock again: made inside the wait, it took the lock a second time per call, which
            // with other threads waiting for the lock is a second hand-off of it.
            // An invocation may be polled with other callers' (`poller`); an operator's call,
            // which may read many rows, is polled here.
            let outcome = if shapes.is_some() {
                runtime::block_on_shared(py, call)?
            } else {
                block_on(py, call)?
            };
            return answer_of(py, &outcome, shapes.as_deref()).map(|answer| answer.into_bound(py));
        }
        awaitable(py, async move {
            let outcome = call.await;
            runtime::keep_thread_state();
            Python::attach(|py| answer_of(py, &outcome, shapes.as_deref()))
        })
    }
}

/// The tuple of [`outcome_tuple`], or with `shapes` an invocation's answer.
fn answer_of(py: Python<'_>, o: &Outcome, shapes: Option<&Shapes>) -> PyResult<Py<PyAny>> {
    match shapes {
        Some(shapes) => invocation_answer(py, o, shapes),
        None => outcome_tuple(py, o),
    }
}

/// An outcome known now: the answer itself, or for asyncio a future already done with it.
fn answered<'py>(
    py: Python<'py>,
    asynchronous: bool,
    outcome: &Outcome,
    shapes: Option<&Shapes>,
) -> PyResult<Bound<'py, PyAny>> {
    let answer = answer_of(py, outcome, shapes)?.into_bound(py);
    if !asynchronous {
        return Ok(answer);
    }
    let future = pyo3_async_runtimes::get_running_loop(py)?.call_method0("create_future")?;
    future.call_method1("set_result", (answer,))?;
    Ok(future)
}

/// `future` waited for here (lock released), or handed to asyncio.
fn run<'py, F>(py: Python<'py>, asynchronous: bool, future: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<Py<PyAny>>> + Send + 'static,
{
    if asynchronous {
        awaitable(py, future)
    } else {
        block_on(py, future)?.map(|answer| answer.into_bound(py))
    }
}

fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| PyValueError::new_err(format!("{name} is a number of seconds above 0")))
}

#[pymethods]
impl NativeLocal {
    /// Opens the store (creating a SQLite file and its schema, or connecting to PostgreSQL and
    /// migrating it) and starts the recoverer when `recover`.
    #[new]
    #[pyo3(signature = (url, tenant, environment, actor, recover, recovery_every, sweep_every, shapes, encryption_key_env=None))]
    #[allow(clippy::too_many_arguments)] // the constructor's keywords, one each
    fn new(
        py: Python<'_>,
        url: String,
        tenant: String,
        environment: String,
        actor: String,
        recover: bool,
        recovery_every: f64,
        sweep_every: f64,
        shapes: (Py<PyAny>, Py<PyAny>, Py<PyAny>, usize),
        encryption_key_env: Option<String>,
    ) -> PyResult<NativeLocal> {
        check_part("tenant", &tenant)?;
        check_part("environment", &environment)?;
        if actor.trim().is_empty() {
            return Err(PyValueError::new_err("actor is empty"));
        }
        let recovery = Recovery {
            every: seconds("recovery_interval", recovery_every)?,
            sweep_every: seconds("sweep_interval", sweep_every)?,
        };
        let store = block_on(py, async {
            idemgate_app::open_gateway_store(&url, encryption_key_env.as_deref()).await
        })?
        .map_err(|e| PyValueError::new_err(format!("url: {e}")))?;
        let app = Assembly::new(store, ToolSet::default(), environment)
            .recovery(recovery)
            .build();
        let recoverer = if recover {
            let _entered = runtime::runtime()?.enter();
            Some(app.start_recoverer())
        } else {
            None
        };
        Ok(NativeLocal {
            app,
            caller: Caller {
                tenant,
                actor,
                role: "agent".into(),
            },
            callers: Arc::new(Callers::default()),
            recoverer: Mutex::new(recoverer),
            closed: Default::default(),
            shapes: Arc::new(Shapes {
                applied: shapes.0,
                replayed: shapes.1,
                scope: shapes.2,
                max_part_bytes: shapes.3,
            }),
        })
    }

    /// Registers a tool: its contract (the decorator's arguments shaped as a contract, or the
    /// path of a contract file) and its functions. Answers the linter's findings on a file.
    #[pyo3(signature = (name, functions, timeout, spec=None, contract_path=None))]
    fn register(
        &self,
        name: String,
        functions: Functions,
        timeout: Option<f64>,
        spec: Option<Bound<'_, PyAny>>,
        contract_path: Option<String>,
    ) -> PyResult<Vec<spec::Finding>> {
        let app = self.app()?;
        if app.tools().get(&name).is_some() {
            return Err(PyValueError::new_err(format!(
                "a tool named {name:?} is already registered on this Local"
            )));
        }
        let (contract, findings) = match (spec, contract_path) {
            (_, Some(path)) => spec::from_file(&path).map_err(PyValueError::new_err)?,
            (Some(spec), None) => {
                let spec =
                    to_json(&spec, "spec").map_err(|e| PyTypeError::new_err(e.to_string()))?;
                let contract = spec::from_arguments(&name, &spec)
                    .map_err(|r| PyValueError::new_err((r.message, r.field)))?;
                (contract, Vec::new())
            }
            (None, None) => return Err(PyValueError::new_err("a tool needs a contract")),
        };
        if contract.name != name {
            return Err(PyValueError::new_err(format!(
                "the contract names the tool {:?}, not {name:?}",
                contract.name
            )));
        }
        // The functions the contract's downstream section promises, and only those: a lookup
        // the contract does not declare would never be asked, one it declares must be there.
        for (declared, given, field, argument) in [
            (
                contract.receipt_lookup(),
                functions.lookup.is_some(),
                "downstream.receipt_lookup",
                "lookup",
            ),
            (
                contract.async_jobs(),
                functions.poll.is_some(),
                "downstream.async_jobs",
                "poll",
            ),
        ] {
            if declared != given {
                let message = if declared {
                    format!("the contract declares {field}, so give {argument}=")
                } else {
                    format!("{argument}= is given, but the contract does not declare {field}")
                };
                return Err(PyValueError::new_err(message));
            }
        }
        let timeout = timeout.map(|t| seconds("timeout", t)).transpose()?;
        let background = functions.event_loop.map(Arc::new);
        let callable = |function: Py<PyAny>, is_async: bool| Callable {
            function: Arc::new(function),
            is_async,
            background: background.clone(),
        };
        let downstream = PyEffect {
            perform: callable(functions.perform, functions.perform_is_async),
            lookup: functions
                .lookup
                .map(|f| callable(f, functions.lookup_is_async)),
            poll: functions.poll.map(|f| callable(f, functions.poll_is_async)),
            timeout,
            callers: self.callers.clone(),
        };
        let authorizer = functions.authorize.map(|f| {
            Arc::new(PyHook {
                authorize: callable(f, functions.authorize_is_async),
                callers: self.callers.clone(),
                timeout,
            }) as Arc<dyn idemgate_core::effect::Authorizer>
        });
        app.tools().serve(Tool {
            contract: Arc::new(contract),
            downstream: Arc::new(downstream),
            authorizer,
        });
        Ok(findings)
    }

    /// The registered tools' names, sorted.
    fn tools(&self) -> PyResult<Vec<String>> {
        Ok(self.app()?.tools().names())
    }

    /// One delivery of a call of `tool`. `arguments` is converted to JSON here (a value that
    /// is not JSON is a `TypeError` naming the argument, before anything is stored); the
    /// caller's `contextvars` (and running event loop, for an awaitable) go with the call of
    /// the tool's function. `wait` delivers again while the answer is `in_flight`, for up to
    /// that many seconds. Answers as [`invocation_answer`] does.
    #[pyo3(signature = (tool, arguments, workflow_id, step_id, wait, asynchronous))]
    #[allow(clippy::too_many_arguments)] // the invocation's parts, one each
    fn invoke<'py>(
        &self,
        py: Python<'py>,
        tool: &str,
        arguments: Bound<'py, PyDict>,
        workflow_id: Option<&str>,
        step_id: Option<&str>,
        wait: Option<f64>,
        asynchronous: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let wait = wait.map(|w| seconds("wait", w)).transpose()?;
        self.deliver(
            py,
            tool,
            &arguments,
            workflow_id,
            step_id,
            wait,
            asynchronous,
        )
    }

    /// `Local.invoke`'s usual call, checked and delivered here, synchronously: a tool's name,
    /// a `dict` of arguments or `None`, and an identity whose parts are each absent or a plain
    /// `str` (see [`plain_part`]), an absent part taken from the `workflow`/`step` scope. Any
    /// other call is answered `None` with nothing done, for the package to check it and
    /// deliver it through `invoke` (it raises what is wrong, as it words it).
    fn call<'py>(
        &self,
        py: Python<'py>,
        tool: &Bound<'py, PyAny>,
        arguments: &Bound<'py, PyAny>,
        workflow_id: &Bound<'py, PyAny>,
        step_id: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Ok(tool) = tool.cast_exact::<PyString>() else {
            return Ok(None);
        };
        let tool = match tool.to_str() {
            Ok(name) if !name.is_empty() => name,
            _ => return Ok(None),
        };
        let none;
        let arguments = if arguments.is_none() {
            none = PyDict::new(py);
            &none
        } else {
            match arguments.cast_exact::<PyDict>() {
                Ok(dict) => dict,
                Err(_) => return Ok(None),
            }
        };
        let limit = self.shapes.max_part_bytes;
        let (Some(mut w), Some(mut s)) =
            (plain_part(workflow_id, limit), plain_part(step_id, limit))
        else {
            return Ok(None);
        };
        let scope;
        let (scope_w, scope_s);
        if w.is_none() || s.is_none() {
            scope = self
                .shapes
                .scope
                .bind(py)
                .call_method0(intern!(py, "get"))?;
            scope_w = scope.getattr(intern!(py, "workflow_id"))?;
            scope_s = scope.getattr(intern!(py, "step_id"))?;
            if w.is_none() {
                let Some(part) = plain_part(&scope_w, limit) else {
                    return Ok(None);
                };
                w = part;
            }
            if s.is_none() {
                let Some(part) = plain_part(&scope_s, limit) else {
                    return Ok(None);
                };
                s = part;
            }
            if w.is_none() != s.is_none() {
                // Half an identity: the package names the part missing.
                return Ok(None);
            }
        }
        self.deliver(py, tool, arguments, w, s, None, false)
            .map(Some)
    }

    /// An operation for this Local's tenant: `None` when there is none, else
    /// `("found", body, outcome)` — `body` the members API v1 gives it (record, `receipt`,
    /// `events`) — `("denied", outcome)` when the tool's hook refused the reader, or
    /// `("error", outcome)` when the store could not be read.
    fn operation<'py>(
        &self,
        py: Python<'py>,
        key: String,
        asynchronous: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let app = self.app()?.clone();
        let caller = self.caller.clone();
        run(py, asynchronous, async move {
            let Ok(key) = OperationKey::parse(&key) else {
                return Ok(Python::attach(|py| py.None()));
            };
            let read: Result<Option<Seen>, idemgate_core::store::Error> = async {
                Ok(match app.operation(&caller, &key).await? {
                    None => None,
                    Some(StatusRead::Denied(outcome)) => Some(Seen::Denied(outcome)),
                    Some(StatusRead::Found { record, outcome }) => {
                        // Read after the record, as API v1 does: the trace that led there.
                        let events = app.executor().store().events(&key).await?;
                        Some(Seen::Found(Box::new(record), outcome, events))
                    }
                })
            }
            .await;
            Python::attach(|py| {
                let tagged = |tag: &str, outcome: &Outcome| -> PyResult<Bound<'_, PyAny>> {
                    let items = [
                        tag.into_pyobject(py)?.into_any(),
                        outcome_tuple(py, outcome)?.into_bound(py),
                    ];
                    Ok(PyTuple::new(py, items)?.into_any())
                };
                let answer = match read {
                    Ok(None) => py.None().into_bound(py),
                    Ok(Some(Seen::Denied(outcome))) => tagged("denied", &outcome)?,
                    Ok(Some(Seen::Found(record, outcome, events))) => {
                        let mut body = views::in_process_summary(&record);
                        body["receipt"] = json!(views::receipt_view(&record));
                        body["events"] = events
                            .into_iter()
                            .map(|e| {
                                json!({"kind": e.kind.as_str(), "at": e.at, "attempt": e.attempt,
                                       "worker": e.worker, "detail": e.detail})
                            })
                            .collect();
                        let items = [
                            "found".into_pyobject(py)?.into_any(),
                            to_py(py, &body)?,
                            outcome_tuple(py, &outcome)?.into_bound(py),
                        ];
                        PyTuple::new(py, items)?.into_any()
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "operation read: store unavailable");
                        let outcome = Outcome::rejected(
                            Some(key),
                            ErrorCode::StoreUnavailable,
                            "the operation store could not be read",
                        );
                        tagged("error", &outcome)?
                    }
                };
                Ok(answer.unbind())
            })
        })
    }

    /// A page of this Local's operations: `{"operations": [...], "next_after": ...}` as API v1
    /// answers it.
    #[pyo3(signature = (status, tool, after, limit, asynchronous))]
    fn operations<'py>(
        &self,
        py: Python<'py>,
        status: Option<String>,
        tool: Option<String>,
        after: Option<String>,
        limit: Option<usize>,
        asynchronous: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let app = self.app()?.clone();
        let caller = self.caller.clone();
        let status = match status.as_deref() {
            None => None,
            Some(text) => Some(RecordStatus::parse(text).ok_or_else(|| {
                PyValueError::new_err(
                    "status is one of pending, awaiting_approval, applied, failed_permanent, \
                     unknown, tombstone",
                )
            })?),
        };
        let limit = limit.unwrap_or(100);
        if !(1..=500).contains(&limit) {
            return Err(PyValueError::new_err("limit is between 1 and 500"));
        }
        run(py, asynchronous, async move {
            let filter = Filter {
                status,
                tool,
                after,
                limit,
                ..Filter::default()
            };
            let records = app.list(&caller.tenant, filter).await.map_err(|e| {
                tracing::warn!(error = %e, "listing: store unavailable");
                PyRuntimeError::new_err("the operation store could not be read")
            })?;
            let next_after = (records.len() == limit)
                .then(|| records.last().map(|r| r.key.to_string()))
                .flatten();
            let page = json!({
                "operations": records.iter().map(views::in_process_summary).collect::<Vec<_>>(),
                "next_after": next_after,
            });
            Python::attach(|py| Ok(to_py(py, &page)?.unbind()))
        })
    }

    /// Reconciles an operation: `resolution` None looks the receipt up now; `"applied"` (with
    /// `reference` and `result`) and `"not_applied"` record the operator's finding.
    #[pyo3(signature = (key, resolution, reference, result, reason, asynchronous))]
    #[allow(clippy::too_many_arguments)] // the action's parts, one each
    fn reconcile<'py>(
        &self,
        py: Python<'py>,
        key: String,
        resolution: Option<String>,
        reference: Option<String>,
        result: Option<Bound<'py, PyAny>>,
        reason: Option<String>,
        asynchronous: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let app = self.app()?.clone();
        let caller = self.operator();
        let resolution = match resolution.as_deref() {
            None => None,
            Some("not_applied") => Some(Resolution::NotApplied),
            Some("applied") => {
                let reference = reference
                    .filter(|r| !r.trim().is_empty())
                    .ok_or_else(|| PyValueError::new_err("effect_reference is empty"))?;
                let result = match result {
                    Some(result) => to_json(&result, "result")
                        .map_err(|e| PyTypeError::new_err(e.to_string()))?,
                    None => Value::Null,
                };
                Some(Resolution::Applied { reference, result })
            }
            Some(_) => {
                return Err(PyValueError::new_err(
                    "resolution is None, \"applied\" or \"not_applied\"",
                ));
            }
        };
        let reason = reason_of(reason);
        self.outcome(py, asynchronous, async move {
            let Ok(key) = OperationKey::parse(&key) else {
                return no_operation();
            };
            app.reconcile(&caller, &key, resolution, &reason)
                .await
                .unwrap_or_else(|e| refused(Some(&key), e))
        })
    }

    /// Approves an operation awaiting approval, bound to `fingerprint` when given; its effect
    /// then runs.
    #[pyo3(signature = (key, fingerprint, reason, asynchronous))]
    fn approve<'py>(
        &self,
        py: Python<'py>,
        key: String,
        fingerprint: Option<String>,
        reason: Option<String>,
        asynchronous: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let app = self.app()?.clone();
        let caller = self.operator();
        let expected = fingerprint
            .map(|f| {
                Fingerprint::parse(&f).map_err(|_| {
                    PyValueError::new_err("fingerprint is `sha256:` and 64 hex digits")
                })
            })
            .transpose()?;
        let reason = reason_of(reason);
        self.outcome(py, asynchronous, async move {
            let Ok(key) = OperationKey::parse(&key) else {
                return no_operation();
            };
            app.approve(&caller, &key, expected, &reason)
                .await
                .unwrap_or_else(|e| refused(Some(&key), e))
        })
    }

    /// Denies an operation awaiting approval.
    #[pyo3(signature = (key, reason, asynchronous))]
    fn deny<'py>(
        &self,
        py: Python<'py>,
        key: String,
        reason: Option<String>,
        asynchronous: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let app = self.app()?.clone();
        let caller = self.operator();
        let reason = reason_of(reason);
        self.outcome(py, asynchronous, async move {
            let Ok(key) = OperationKey::parse(&key) else {
                return no_operation();
            };
            app.deny(&caller, &key, &reason)
                .await
                .unwrap_or_else(|e| refused(Some(&key), e))
        })
    }

    /// Stops the recoverer and refuses every later call. Closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        let background = self
            .recoverer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(background) = background {
            block_on(py, background.stop())?;
        }
        Ok(())
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The environment part of this Local's keys.
    #[getter]
    fn environment(&self) -> String {
        self.app.environment().to_string()
    }

    /// The tenant part of this Local's keys.
    #[getter]
    fn tenant(&self) -> String {
        self.caller.tenant.clone()
    }
}

impl NativeLocal {
    /// The caller of an operator's action: this Local's actor, as an operator.
    fn operator(&self) -> Caller {
        Caller {
            role: "operator".into(),
            ..self.caller.clone()
        }
    }
}
