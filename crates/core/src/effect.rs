//! The downstream effect and the authorization hook, as traits the executor calls.

use serde_json::Value;

use crate::fingerprint::Fingerprint;
use crate::key::OperationKey;
use crate::record::{Receipt, Refusal};
use crate::store::BoxFuture;

/// One request to perform the effect. The operation key travels as the downstream's
/// idempotency key on every attempt, so a deduplicating downstream recognises a resend.
#[derive(Debug, Clone, Copy)]
pub struct EffectRequest<'a> {
    pub key: &'a OperationKey,
    pub tool: &'a str,
    pub tool_version: &'a str,
    pub arguments: &'a Value,
    /// The fencing token of this attempt.
    pub attempt: u64,
    /// A version precondition declared by a natural-idempotent contract (sent as `If-Match`
    /// by an HTTP downstream).
    pub precondition: Option<&'a Value>,
}

/// What the downstream answered, classified by where any failure happened.
#[derive(Debug, Clone, PartialEq)]
pub enum EffectOutcome {
    /// The effect happened; the downstream's reference and a replay-safe result.
    Committed(Receipt),
    /// The downstream accepted an asynchronous job (HTTP 202); polling finishes it.
    Accepted { job_id: String },
    /// A deterministic refusal: nothing happened and nothing will on a resend.
    Refused(Refusal),
    /// A version precondition did not hold: nothing happened.
    PreconditionFailed(String),
    /// Provably nothing was sent (connection refused before any byte; 408, 425, 429).
    NotSent {
        reason: String,
        retry_after: Option<u64>,
    },
    /// The effect may or may not have happened: timeout, reset, 5xx, malformed answer.
    /// `retry_after` is the downstream's advice (a 503's `Retry-After`), honoured before any
    /// resend.
    Ambiguous {
        reason: String,
        retry_after: Option<u64>,
    },
}

impl EffectOutcome {
    /// An ambiguous answer without advice on when to ask again.
    pub fn ambiguous(reason: impl Into<String>) -> EffectOutcome {
        EffectOutcome::Ambiguous {
            reason: reason.into(),
            retry_after: None,
        }
    }
}

/// What a receipt lookup by operation key found.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    Found(Receipt),
    NotFound,
    Unavailable(String),
}

/// What polling an accepted job found.
#[derive(Debug, Clone, PartialEq)]
pub enum JobStatus {
    Running,
    Done(Receipt),
    Failed(Refusal),
    /// The downstream no longer knows the job (its poll answers 404): the outcome cannot be
    /// proved.
    Gone(String),
    Unavailable(String),
}

/// The system of record, seen from the executor. Implementations classify their own transport
/// failures into [`EffectOutcome`]; the executor never guesses from an error string.
pub trait Downstream: Send + Sync {
    /// Whether this downstream can take `arguments` at all (a URL template's placeholders,
    /// say), checked before any record is written: an answer of `Err` is invalid arguments and
    /// leaves nothing behind. The message names the argument, never its value.
    fn check(&self, arguments: &Value) -> Result<(), String> {
        let _ = arguments;
        Ok(())
    }

    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome>;

    /// Looks up the receipt of an effect by operation key. Only called when the contract says
    /// a lookup is available.
    fn lookup_receipt<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Lookup>;

    /// Polls an accepted job. Only called for contracts with asynchronous jobs.
    fn poll_job<'a>(&'a self, key: &'a OperationKey, job_id: &'a str) -> BoxFuture<'a, JobStatus>;
}

/// When the authorization hook is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthStage {
    /// Before a new effect, a resend, or an approved effect.
    BeforeEffect,
    /// Before a stored result is handed out again: an idempotency hit is no bypass.
    BeforeReplay,
}

/// What the hook is asked about: never the arguments themselves, only their fingerprint.
#[derive(Debug, Clone, Copy)]
pub struct AuthRequest<'a> {
    pub tenant: &'a str,
    pub actor: &'a str,
    pub role: &'a str,
    pub tool: &'a str,
    pub key: Option<&'a OperationKey>,
    pub fingerprint: &'a Fingerprint,
    pub stage: AuthStage,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authorization {
    Allowed,
    Denied(String),
    /// The hook could not answer; the executor fails closed.
    Unavailable(String),
}

/// The live authorization check against the system of record.
pub trait Authorizer: Send + Sync {
    fn authorize<'a>(&'a self, request: AuthRequest<'a>) -> BoxFuture<'a, Authorization>;

    /// Whether a decision about `tool` asks anything: `false` when every request for it is
    /// allowed without consulting a hook, so that the order of the executor's steps around the
    /// decision cannot matter. `true` unless an authorizer knows better.
    fn asks(&self, tool: &str) -> bool {
        let _ = tool;
        true
    }
}

/// Allows everything: for contracts that do not ask for a recheck, and for tests.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl Authorizer for AllowAll {
    fn authorize<'a>(&'a self, _request: AuthRequest<'a>) -> BoxFuture<'a, Authorization> {
        Box::pin(std::future::ready(Authorization::Allowed))
    }
    fn asks(&self, _tool: &str) -> bool {
        false
    }
}
