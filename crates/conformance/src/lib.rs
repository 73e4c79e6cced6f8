//! The fault matrix as a library.
//!
//! - [`downstream::FakeDownstream`] — an in-process system of record that counts effects on its
//!   own side and can commit then drop the answer, commit then fail, delay, answer malformed,
//!   refuse, or accept a job.
//! - [`faulty::FaultyStore`] — wraps a real store and fails the Nth write, before or after it
//!   commits.
//! - [`gate::Gate`] — timing control: pause a worker at a named point and release it in a
//!   chosen order.
//! - [`ledger::LedgerDownstream`] — a fake downstream whose effects live in a SQLite file, for
//!   tests that kill worker processes.
//! - [`mem::MemStore`] — the reference in-memory store.
//! - [`harness::Harness`] and [`scenarios`] — the seed's fault matrix as named scenarios over any
//!   store; `scenario_tests!(fresh)` makes them tests of a store crate.
//! - [`audit_suite`] — the audit log's contract: entries only with their transitions, one
//!   chain under concurrent appenders.
//! - [`store_suite`] — the `Store` trait's contract, run against every store.
//! - [`growth`] — cost as the store grows: the rows each store's growth benchmark bulk-loads,
//!   and the operations it measures at each size.

pub mod audit_suite;
pub mod downstream;
pub mod faulty;
pub mod gate;
pub mod growth;
pub mod harness;
#[cfg(feature = "http")]
pub mod http_fake;
pub mod ledger;
pub mod mem;
pub mod scenarios;
pub mod store_suite;
pub mod webhook_suite;
