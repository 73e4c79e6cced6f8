//! `idemgate chaos`: a fault-injecting HTTP proxy for end-to-end tests of side-effecting tools
//! (an agent → idemgate → the proxy → the system of record), and the fault injector of
//! `idemgate verify`.
//!
//! Reading order:
//!
//! - [`Fault`] — what happens to one request: passed through; its answer dropped after the
//!   upstream got it; the connection reset before forwarding (the upstream never sees it);
//!   delayed; a 5xx or a malformed body answered after forwarding; delivered to the upstream
//!   twice. [`Faults`] chooses one per request: the first scripted [`Rule`] that matches
//!   (`nth=1 drop`, `key=*:charge-* error=503`), else a draw at the configured [`Rates`] from a
//!   seed, so a run replays.
//! - [`Proxy`] — the server: each request forwarded (its path and query appended to the
//!   upstream URL, hop-by-hop headers left out), its fault applied, its entry written.
//! - [`Ledger`] — every request per `Idempotency-Key`: each copy forwarded and what the
//!   upstream answered, what the caller was told. Its [`Summary`] names every key that reached
//!   the upstream's commit twice with different references: a duplicate effect.
//!
//! The proxy is for loopback and staging. It is transparent to everything but its faults: it
//! makes no decisions for the caller and keeps no state besides the ledger.

mod fault;
mod ledger;
mod proxy;

pub use fault::{
    Fault, Faults, Rates, Rule, ScriptError, parse_duration, parse_script, parse_status,
};
pub use ledger::{Arrival, Entry, KeySummary, Ledger, Summary, Told, Upstream};
pub use proxy::{Config, Error, Proxy, Running};
