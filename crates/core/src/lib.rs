//! The pure core of idemgate: everything the executor decides, nothing it does.
//!
//! Reading order:
//!
//! - [`key::OperationKey`] — `tenant:environment:workflow_id:step_id`, the identity of one
//!   intended business action.
//! - [`contract::Contract`] — a versioned tool contract loaded from YAML: effect class, input
//!   schema, material fields, downstream semantics, approval, retention.
//! - [`json::parse`], [`canonical::Canonical`], [`fingerprint::Fingerprint`] — strict JSON in,
//!   RFC 8785 bytes of the material request, `sha256:<hex>` out. A fingerprint can only be made
//!   from canonical bytes.
//! - [`record::Record`] and [`record::RecordState`] — the durable operation row and its states,
//!   each carrying its data; [`record::Event`] — the append-only trace.
//! - [`store::Store`] — the durable store as a trait: atomic claim-or-load, compare-and-set
//!   transitions fenced by the attempt number, listing, events, sweeping.
//! - [`effect::Downstream`] and [`effect::Authorizer`] — the effect and the live authorization
//!   check, as traits.
//! - [`machine`] — the decisions: what a delivery does with an existing record, how an
//!   abandoned claim is recovered, what a downstream answer means.
//! - [`transitions`] — every transition the executor makes, as data: the next state, the
//!   fence (grown in one function), the trace entries, and retention counted from settlement.
//! - [`outcome::Outcome`] — the labelled answer every face returns.
//! - [`describe`] — the description a model reads of a tool, from its contract.
//! - [`webhook`] — a webhook event's deduplication row, bound to the operation it finished.
//! - [`audit`] — the operator actions' hash-chained, signed log: entries as data, their
//!   canonical bytes and hashes; the store seals each in its transition's transaction.
//! - [`lint`] — the review of a contract as a linter, ending with a decision.
//!
//! **This crate performs no I/O**: no clock reads (a [`clock::Clock`] is injected), no files,
//! no network, no database, no async runtime.

pub mod audit;
pub mod canonical;
pub mod clock;
pub mod contract;
pub mod describe;
pub mod duration;
pub mod effect;
pub mod fingerprint;
pub mod json;
pub mod key;
pub mod lint;
pub mod machine;
pub mod outcome;
pub mod record;
pub mod store;
pub mod trace;
pub mod transitions;
pub mod webhook;

pub use canonical::{CANONICALIZATION_VERSION, Canonical};
pub use contract::{Contract, EffectClass};
pub use fingerprint::Fingerprint;
pub use key::OperationKey;
pub use outcome::{ErrorCode, NextAction, Outcome, Status};
pub use record::{Event, EventKind, Millis, Record, RecordState, RecordStatus};
