//! A transactional outbox for applications that keep their own state in SQLite or
//! PostgreSQL.
//!
//! The gap it closes: an application that commits its business write and then publishes a job
//! can crash in between, and the job is lost; one that publishes first can crash before its
//! commit, and the job describes a write that never happened. Instead the application writes
//! the job's [`Envelope`] into an outbox table **in the same transaction** as its business
//! write ([`sqlite::enqueue`], [`postgres::enqueue`], each taking the application's own
//! transaction), and a [`Publisher`] delivers the committed entries to the queue and marks them
//! sent. A publisher that dies between publishing and marking publishes the entry again: the
//! hand-off is at least once, and the consumer deduplicates by the operation key the envelope
//! carries.
//!
//! What it does not do: make the effect itself idempotent. The consumer's executor does that,
//! with the operation's durable record; a downstream that neither deduplicates nor offers a
//! receipt lookup can still end an ambiguous attempt in `unknown`.
//!
//! The table lives in the application's database, not idemgate's store: its DDL is
//! [`sqlite::DDL`] / [`postgres::DDL`] (also `sql/` in this crate), applied by `install`.
//!
//! Two things can never be delivered, and neither may stop the rest. An envelope the consumer
//! would refuse (over its 256 KiB, too deep, not a job) is refused by `enqueue` itself, inside
//! the business transaction, with an error naming the bound — so the application can roll back
//! or fix it while it still can. An entry the broker refuses for good (larger than NATS's
//! `max_payload`, possible for an entry enqueued with larger limits or before this check) is
//! *parked* by the publisher: recorded in `idemgate_outbox_parked` with the broker's reason,
//! counted, no longer offered, while the entries after it keep publishing.

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "nats")]
mod publisher;
#[cfg(feature = "sqlite")]
pub mod sqlite;

#[cfg(feature = "nats")]
pub use publisher::{Publisher, PublisherError, Source};

use crate::envelope::{Envelope, Limits};

/// One committed outbox row waiting to be published.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The row's id: the publisher's bookkeeping (which rows to mark), never identity.
    pub id: i64,
    /// The envelope's bytes as enqueued.
    pub envelope: String,
    /// Publications before this one.
    pub attempts: i64,
}

/// Why an outbox operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("the outbox entry names no {0}")]
    Empty(&'static str),
    /// The consumer would refuse the envelope (terminate the message): refused before it is
    /// written, so the business transaction can still roll back.
    #[error("the outbox entry would be refused by its consumer: {0}")]
    Refused(#[from] crate::envelope::Error),
    #[cfg(feature = "sqlite")]
    #[error("outbox (SQLite): {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[cfg(feature = "postgres")]
    #[error("outbox (PostgreSQL): {0}")]
    Postgres(#[from] tokio_postgres::Error),
}

/// One outbox row the publisher parked instead of publishing.
#[derive(Debug, Clone, PartialEq)]
pub struct Parked {
    /// The outbox row's id.
    pub id: i64,
    /// What the broker said.
    pub reason: String,
}

/// The checks an entry passes before it is written: an envelope whose key parts are empty, or
/// that the consumer reading it with `limits` would refuse (too large, too deep), could only be
/// refused by the consumer later, after the business write committed.
fn checked(envelope: &Envelope, limits: Limits) -> Result<String, Error> {
    if envelope.workflow_id.is_empty() {
        return Err(Error::Empty("workflow_id"));
    }
    if envelope.step_id.is_empty() {
        return Err(Error::Empty("step_id"));
    }
    if envelope.tool.is_empty() {
        return Err(Error::Empty("tool"));
    }
    let bytes = envelope.to_bytes();
    // Read back exactly as the consumer reads a message: the same bound, the same parser.
    Envelope::parse(&bytes, limits)?;
    Ok(String::from_utf8(bytes).expect("JSON is UTF-8"))
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}
