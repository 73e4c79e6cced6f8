//! `idemgate._native`: idemgate's engine inside a Python program. The Python package
//! `idemgate` (clients/python) is the public face — `Local`, `AsyncLocal`, `@local.tool` —
//! and this extension is the thin layer under it: a face over `idemgate-app` that converts
//! arguments and maps errors, and decides nothing about claims, fences, recovery or labels.
//!
//! Reading order:
//!
//! - [`local::NativeLocal`] — one [`idemgate_app::App`] over one store (`sqlite://PATH` or
//!   `postgres://…`, in the gateway's schema): `register` a tool, `invoke` it, read and list
//!   operations, and the operator's actions; each either waits with the interpreter lock
//!   released or returns an awaitable for asyncio.
//! - [`effect`] — a tool's Python functions as the engine's `Downstream` (the function is
//!   `perform`, the lookup `lookup_receipt`, the job poller `poll_job`) and `Authorizer`; sync
//!   functions on [`runner`] threads, `async def` ones on an event loop; a panic or a Python
//!   exception never crosses into the engine as anything but an answer the engine classifies.
//! - [`spec`] — a tool's contract from the decorator's arguments or a contract file.
//! - [`convert`] — Python values to JSON and back, once at the edge.
//! - [`runtime`] — the process's one tokio runtime (started on first use) and the two ways
//!   Python waits on it.
//! - [`poller`] — the thread that polls synchronous callers' futures while several wait at
//!   once.
//! - [`here`] — a synchronous caller alone polls its own call and, for a function without a
//!   timeout, runs the function itself.

mod convert;
mod effect;
mod here;
mod local;
mod poller;
mod runner;
mod runtime;
mod spec;

use pyo3::prelude::*;

/// Waits, with the interpreter lock released, until no tool function is queued for or running
/// on a runner thread: called at the interpreter's exit (`runner::wait_until_quiet`).
#[pyfunction]
fn wait_for_functions(py: Python<'_>) {
    py.detach(runner::wait_until_quiet);
}

/// The extension module, `idemgate._native`.
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<local::NativeLocal>()?;
    m.add_function(wrap_pyfunction!(wait_for_functions, m)?)?;
    Ok(())
}
