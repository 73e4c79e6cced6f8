//! idemgate's second effect boundary: work that arrives through a queue.
//!
//! An asynchronous tool has two boundaries — accepting work and performing it — and a queue
//! redelivers: a lost acknowledgement or a killed consumer runs the same job again. Here the
//! job's envelope carries the operation's identity, and the consumer claims the same durable
//! record as every other face before anything is sent, so a redelivery replays instead of
//! acting twice.
//!
//! Reading order:
//!
//! - [`Envelope`] — what a message carries: workflow and step (the key's parts), tool,
//!   arguments, optionally the actor. The tenant comes from the consumer's configuration.
//! - [`Consumer`] — hands an envelope to the application (`idemgate_app::App::invoke`, as
//!   every face does) and answers a [`Disposition`]:
//!   acknowledge a settled or parked operation, return one still in flight, refuse a message
//!   that can never become an operation. [`Delivery`] is the queue's telemetry (message id,
//!   attempt), never identity.
//! - [`nats`] — the consumer on NATS JetStream: a durable pull consumer, bounded in flight
//!   (`idemgate consume`).
//! - [`outbox`] — for applications that write their own state in SQLite or PostgreSQL: an
//!   outbox entry enqueued in the application's own transaction, and a publisher that delivers
//!   the entries at least once (`idemgate outbox publish`).

pub mod consumer;
pub mod disposition;
pub mod envelope;
#[cfg(feature = "nats")]
pub mod nats;
pub mod outbox;

pub use consumer::{Consumer, Delivery, Handled};
pub use disposition::Disposition;
pub use envelope::Envelope;
