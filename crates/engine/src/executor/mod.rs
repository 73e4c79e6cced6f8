//! The executor: one delivery in, one labelled outcome out, at most one effect per operation.
//!
//! Every path follows the same shape: read what is stored, ask [`idemgate_core::machine`] what
//! that means, build the next state with [`idemgate_core::transitions`], write it with one
//! compare-and-set, and only then talk to the downstream. One file per path:
//!
//! - `delivery` — a delivery: validate, key, fingerprint, claim or load, branch.
//! - `perform` — an owned [`Claim`](perform::Claim) sent to the downstream and settled; the
//!   only code that calls `Downstream::perform`, and only with an
//!   [`Authorized`](authorize::Authorized) proof.
//! - `recovery` — an abandoned or released claim: receipt lookup, takeover, resend, `unknown`.
//! - `jobs` — polling an accepted asynchronous job.
//! - `evidence` — later evidence (a poll, a receipt lookup) settling an `unknown` record.
//! - `webhooks` — a verified webhook event bound to its job and applied with its dedup row.
//! - `operator` — approve, deny, reconcile, and the status read.
//! - `authorize` — the authorization hook, and the proof a send requires.
//! - `detached` — a delivery run on its own task, so the caller's patience is not the effect's.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use idemgate_core::clock::{Clock, Timer};
use idemgate_core::effect::Authorizer;
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::{ErrorCode, Outcome};
use idemgate_core::record::{Millis, Receipt};
use idemgate_core::store::{self, Store};
use idemgate_core::transitions::At;

use crate::settled::Settled;
use crate::timer::TokioTimer;

mod authorize;
mod delivery;
mod detached;
mod evidence;
mod jobs;
mod operator;
mod perform;
mod recovery;
mod webhooks;

pub(crate) use jobs::Poller;
pub use operator::{ActionError, Resolution, StatusRead};
pub use webhooks::{Binding, Contracts, EventAnswer, JobEvent};

/// Who is asking. The tenant comes from the caller's credentials, never from the arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub tenant: String,
    /// The authenticated principal, recorded with the operation for later rechecks.
    pub actor: String,
    /// `agent` or `operator`; passed to the authorization hook.
    pub role: String,
}

/// One delivery's identity: the caller, the configured environment, and the workflow step the
/// calling application names. A model's tool-call id is never any of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    pub caller: Caller,
    pub environment: String,
    pub workflow_id: Option<String>,
    pub step_id: Option<String>,
}

/// Sees every delivery and its outcome, whether or not anything was written: replays, waits and
/// rejections leave no row in the store, so this is where they are counted and logged.
pub trait Observer: Send + Sync {
    fn delivery(&self, tool: &str, fingerprint: Option<&Fingerprint>, outcome: &Outcome);
}

/// Tunables of the executor. The defaults suit a gateway; tests shorten them.
#[derive(Debug, Clone)]
pub struct Settings {
    /// This process's identity as a lease owner. Unique per process.
    pub worker: String,
    /// Resends to a deduplicating downstream within one delivery after an ambiguous answer,
    /// before the record is left to the recoverer.
    pub max_resends: u32,
    /// Attempts (takeovers and their resends) after which a maybe-sent record is no longer
    /// resent and ends `unknown`.
    pub max_attempts: u64,
    /// How many settled (`applied`, `failed_permanent`) records to keep in memory, so that a
    /// replay of one reads no row (see the `settled` module); 0 reads the store every time.
    /// Each costs the size of its record, result included.
    pub settled_records: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            worker: default_worker_id(),
            max_resends: 2,
            max_attempts: 8,
            settled_records: 10_000,
        }
    }
}

/// A worker id unique enough across processes and restarts: process id and start time.
pub fn default_worker_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("w{}-{:x}", std::process::id(), nanos & 0xffff_ffff_ffff)
}

/// The executor. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct Executor {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    timer: Arc<dyn Timer>,
    authorizer: Arc<dyn Authorizer>,
    observer: Option<Arc<dyn Observer>>,
    settings: Arc<Settings>,
    settled: Arc<Settled>,
    /// Numbers the key-less deliveries of this process, each sent under an idempotency key of
    /// its own.
    unkeyed: Arc<AtomicU64>,
}

impl Executor {
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        authorizer: Arc<dyn Authorizer>,
        settings: Settings,
    ) -> Executor {
        Executor {
            store,
            clock,
            timer: Arc::new(TokioTimer),
            authorizer,
            observer: None,
            settled: Arc::new(Settled::new(settings.settled_records)),
            settings: Arc::new(settings),
            unkeyed: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Executor {
        self.observer = Some(observer);
        self
    }

    /// Waits (lease renewals, pauses before a resend) through `timer` instead of the async
    /// runtime's clock: for a simulator that decides when each wait ends.
    pub fn with_timer(mut self, timer: Arc<dyn Timer>) -> Executor {
        self.timer = timer;
        self
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn worker(&self) -> &str {
        &self.settings.worker
    }

    fn now(&self) -> Millis {
        self.clock.now()
    }

    /// Now, by this worker: what every transition is stamped with.
    fn at(&self) -> At<'_> {
        At {
            now: self.clock.now(),
            worker: &self.settings.worker,
        }
    }

    fn observe(&self, tool: &str, fp: Option<&Fingerprint>, outcome: Outcome) -> Outcome {
        // On the delivery's span (a no-op on any other).
        let span = tracing::Span::current();
        span.record("outcome", outcome.status.as_str());
        if let Some(key) = &outcome.operation_key {
            span.record("operation_key", key.as_str());
        }
        tracing::info!(
            tool,
            operation_key = outcome.operation_key.as_ref().map(|k| k.as_str()),
            fingerprint = fp.map(|f| f.as_str()),
            status = outcome.status.as_str(),
            error = outcome.error_code().map(|c| c.as_str()),
            reference = outcome.effect_reference.as_deref(),
            "delivery"
        );
        if let Some(o) = &self.observer {
            o.delivery(tool, fp, &outcome);
        }
        outcome
    }
}

/// The store could not be reached; this delivery sent nothing. Retryable under the same key,
/// but not `safe_to_repeat`: what the key's record holds could not be read, so nothing proves
/// that it had no effect.
fn store_down(key: Option<OperationKey>, e: &store::Error) -> Outcome {
    tracing::warn!(error = %e, "store error");
    let mut o = Outcome::rejected(
        key,
        ErrorCode::StoreUnavailable,
        "the operation store is unavailable; this delivery sent nothing; retry later under the same key",
    );
    o.retry_after_seconds = Some(1);
    o
}

/// The effect happened but its record could not be written: say so, with the reference.
fn unrecorded(key: OperationKey, receipt: &Receipt, e: &store::Error) -> Outcome {
    tracing::error!(operation_key = key.as_str(), error = %e, reference = receipt.reference, "effect applied but not recorded");
    Outcome::unknown(
        key,
        "the downstream applied the effect but the record could not be written; a retry recovers the receipt",
    )
    .with_reference(Some(receipt.reference.clone()))
}
