//! The outbox's publisher: committed entries to NATS JetStream, at least once.
//!
//! One batch: read the oldest unsent entries, count the attempt, publish each and wait for
//! JetStream's acknowledgement of every one (the message is stored in the stream), and only
//! then mark the batch sent. A publisher that dies anywhere before the mark publishes the
//! batch again when it restarts — duplicates the consumer absorbs by the operation key. No
//! `Nats-Msg-Id` is set: JetStream's own duplicate window is a few minutes of one stream, while
//! the operation key holds for the record's whole retention, on every path.
//!
//! An entry the client refuses to send because it is over the server's `max_payload` would be
//! refused on every attempt: it is parked (recorded with the reason, counted, logged) rather
//! than failing the batch, so the entries after it keep publishing. Any other failure fails the
//! batch, which is published again: it may be the broker that is briefly away.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;

use super::Entry;
#[cfg(feature = "postgres")]
use super::postgres::PgOutbox;
#[cfg(feature = "sqlite")]
use super::sqlite::SqliteOutbox;

/// Where the entries are read and marked.
pub enum Source {
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteOutbox),
    #[cfg(feature = "postgres")]
    Postgres(PgOutbox),
}

impl Source {
    async fn unsent(&self, limit: usize) -> Result<Vec<Entry>, super::Error> {
        match self {
            #[cfg(feature = "sqlite")]
            Source::Sqlite(s) => s.unsent(limit),
            #[cfg(feature = "postgres")]
            Source::Postgres(p) => p.unsent(limit).await,
        }
    }

    async fn count_attempt(&self, ids: &[i64]) -> Result<(), super::Error> {
        match self {
            #[cfg(feature = "sqlite")]
            Source::Sqlite(s) => s.count_attempt(ids),
            #[cfg(feature = "postgres")]
            Source::Postgres(p) => p.count_attempt(ids).await,
        }
    }

    async fn park(&self, id: i64, reason: &str) -> Result<(), super::Error> {
        match self {
            #[cfg(feature = "sqlite")]
            Source::Sqlite(s) => s.park(id, reason),
            #[cfg(feature = "postgres")]
            Source::Postgres(p) => p.park(id, reason).await,
        }
    }

    /// Every parked entry, oldest first.
    pub async fn parked(&self) -> Result<Vec<super::Parked>, super::Error> {
        match self {
            #[cfg(feature = "sqlite")]
            Source::Sqlite(s) => s.parked(),
            #[cfg(feature = "postgres")]
            Source::Postgres(p) => p.parked().await,
        }
    }

    async fn mark_sent(&self, ids: &[i64]) -> Result<(), super::Error> {
        match self {
            #[cfg(feature = "sqlite")]
            Source::Sqlite(s) => s.mark_sent(ids),
            #[cfg(feature = "postgres")]
            Source::Postgres(p) => p.mark_sent(ids).await,
        }
    }
}

/// Why a batch was not published and marked. Nothing is marked sent that JetStream did not
/// acknowledge.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublisherError {
    #[error(transparent)]
    Outbox(#[from] super::Error),
    #[error("publishing outbox entry {id} to {subject}: {message}")]
    Publish {
        id: i64,
        subject: String,
        message: String,
    },
}

/// Called with a batch's ids once every entry of it is stored in the stream and before it is
/// marked sent: a test's way to stop a publisher exactly there.
pub type BeforeMark = Arc<dyn Fn(&[i64]) + Send + Sync>;

/// Delivers outbox entries to one subject.
pub struct Publisher {
    js: jetstream::Context,
    subject: String,
    batch: usize,
    before_mark: Option<(BeforeMark, Duration)>,
    /// Entries this publisher parked.
    parked: AtomicU64,
}

impl Publisher {
    pub fn new(client: async_nats::Client, subject: impl Into<String>) -> Publisher {
        Publisher {
            js: jetstream::new(client),
            subject: subject.into(),
            batch: 100,
            before_mark: None,
            parked: AtomicU64::new(0),
        }
    }

    /// Entries per batch (at least 1).
    pub fn batch(mut self, batch: usize) -> Publisher {
        self.batch = batch.max(1);
        self
    }

    /// A test's fault: call `hook` and wait `pause` between publishing a batch and marking it.
    pub fn pause_before_mark(mut self, hook: BeforeMark, pause: Duration) -> Publisher {
        self.before_mark = Some((hook, pause));
        self
    }

    /// How many entries this publisher parked (the outbox's own list: [`Source::parked`]).
    pub fn parked(&self) -> u64 {
        self.parked.load(Ordering::Relaxed)
    }

    /// Publishes one batch; returns how many entries it held (0: the outbox is drained),
    /// parked ones included.
    pub async fn publish_batch(&self, source: &Source) -> Result<usize, PublisherError> {
        let entries = source.unsent(self.batch).await?;
        if entries.is_empty() {
            return Ok(0);
        }
        let ids: Vec<i64> = entries.iter().map(|e| e.id).collect();
        source.count_attempt(&ids).await?;
        let fail = |id: i64, message: String| PublisherError::Publish {
            id,
            subject: self.subject.clone(),
            message,
        };
        let mut acks = Vec::with_capacity(entries.len());
        let mut poison = Vec::new();
        for entry in &entries {
            let mut headers = async_nats::HeaderMap::new();
            // Telemetry for whoever reads the stream: which row, which publication.
            headers.insert("Idemgate-Outbox-Entry", entry.id.to_string().as_str());
            headers.insert(
                "Idemgate-Outbox-Attempt",
                (entry.attempts + 1).to_string().as_str(),
            );
            let sent = self
                .js
                .publish_with_headers(
                    self.subject.clone(),
                    headers,
                    entry.envelope.clone().into_bytes().into(),
                )
                .await;
            match sent {
                Ok(ack) => acks.push((entry.id, ack)),
                // Refused before it was sent, and it would be on every attempt.
                Err(e) if e.kind() == jetstream::context::PublishErrorKind::MaxPayloadExceeded => {
                    poison.push((entry.id, e.to_string()));
                }
                Err(e) => return Err(fail(entry.id, e.to_string())),
            }
        }
        let mut sent = Vec::with_capacity(acks.len());
        for (id, ack) in acks {
            ack.await.map_err(|e| fail(id, e.to_string()))?;
            sent.push(id);
        }
        // Parked before the batch is marked: a publisher that dies in between parks the entry
        // again (a no-op) and publishes the rest again, as for any batch.
        for (id, reason) in &poison {
            source.park(*id, reason).await?;
            self.parked.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                entry = id,
                subject = %self.subject,
                reason = %reason,
                "outbox entry parked: the queue refuses it for good; later entries keep publishing"
            );
        }
        if let Some((hook, pause)) = &self.before_mark {
            hook(&sent);
            tokio::time::sleep(*pause).await;
        }
        source.mark_sent(&sent).await?;
        Ok(entries.len())
    }

    /// Publishes batches until the outbox holds no unsent entry; returns how many entries
    /// were published.
    pub async fn drain(&self, source: &Source) -> Result<usize, PublisherError> {
        let mut total = 0;
        loop {
            match self.publish_batch(source).await? {
                0 => return Ok(total),
                n => total += n,
            }
        }
    }
}
