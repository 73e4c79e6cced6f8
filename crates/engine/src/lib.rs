//! The async driver of idemgate: it carries out what `idemgate-core` decides.
//!
//! Reading order:
//!
//! - [`Executor`] — `execute(contract, operation, arguments, effect)`: validate, derive the
//!   key, fingerprint, claim or load, branch on the existing record, recheck authorization,
//!   perform the effect with the key as the downstream's idempotency key while renewing the
//!   lease, store the receipt, answer. One module per path (delivery, perform, recovery, jobs,
//!   operator actions); every transition is built by `idemgate_core::transitions`, and the
//!   only code that sends takes a proof only a fresh authorization makes. Also the operator's
//!   transitions: [`Executor::approve`], [`Executor::deny`], [`Executor::reconcile`], the poll
//!   target [`Executor::status`], and [`Executor::execute_detached`] for faces whose callers
//!   may leave while an effect runs.
//! - [`Operation`] and [`Caller`] — who asks, and which workflow step this is.
//! - [`Recoverer`] — drives records abandoned while owned and accepted jobs of one environment
//!   without waiting for a retry, expires approvals and released claims past their deadlines,
//!   and sweeps retention.
//! - [`TokioTimer`] — the default `Timer` for lease renewals and pauses.
//! - [`sealed::SealedStore`] — wraps any store to encrypt stored requests and results at rest.
//! - [`settled`] — the settled records an executor keeps in memory, so that replays read no row.
//!
//! Time comes from an injected `Clock`, the store and downstream sit behind traits: the same
//! code runs against SQLite, PostgreSQL, or in-memory fakes under a test's control.

mod executor;
mod recoverer;
pub mod sealed;
pub mod settled;
mod timer;

pub use executor::{
    ActionError, Binding, Caller, Contracts, EventAnswer, Executor, JobEvent, Observer, Operation,
    Resolution, Settings, StatusRead, default_worker_id,
};
pub use recoverer::{Recoverer, RecoveryReport, Tools};
pub use timer::TokioTimer;
