//! The async driver of idemgate: it carries out what `idemgate-core` decides.
//!
//! Reading order:
//!
//! - [`Executor`] — `execute(contract, operation, arguments, effect)`: validate, derive the
//!   key, fingerprint, claim or load, branch on the existing record, recheck authorization,
//!   perform the effect with the key as the downstream's idempotency key while renewing the
//!   lease, store the receipt, answer. Also the operator's transitions: [`Executor::approve`],
//!   [`Executor::deny`], [`Executor::reconcile`], and the poll target [`Executor::status`].
//! - [`Operation`] and [`Caller`] — who asks, and which workflow step this is.
//! - [`Recoverer`] — drives abandoned pending records and accepted jobs without waiting for a
//!   retry, and sweeps retention.
//! - [`sealed::SealedStore`] — wraps any store to encrypt stored requests and results at rest.
//! - [`settled`] — the settled records an executor keeps in memory, so that replays read no row.
//!
//! Time comes from an injected `Clock`, the store and downstream sit behind traits: the same
//! code runs against SQLite, PostgreSQL, or in-memory fakes under a test's control.

mod executor;
mod recoverer;
pub mod sealed;
pub mod settled;

pub use executor::{
    ActionError, Caller, Executor, Observer, Operation, Resolution, Settings, default_worker_id,
};
pub use recoverer::{Recoverer, RecoveryReport, Tools};
