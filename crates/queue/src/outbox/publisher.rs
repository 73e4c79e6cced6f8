//! The outbox's publisher: committed entries to NATS JetStream, at least once.
//!
//! One batch: read the oldest unsent entries, count the attempt, publish each and wait for
//! JetStream's acknowledgement of every one (the message is stored in the stream), and only
//! then mark the batch sent. A publisher that dies anywhere before the mark publishes the
//! batch again when it restarts — duplicates the consumer absorbs by the operation key. No
//! `Nats-Msg-Id` is set: JetStream's own duplicate window is a few minutes of one stream, while
//! the operation key holds for the record's whole retention, on every path.

use std::sync::Arc;
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
}

impl Publisher {
    pub fn new(client: async_nats::Client, subject: impl Into<String>) -> Publisher {
        Publisher {
            js: jetstream::new(client),
            subject: subject.into(),
            batch: 100,
            before_mark: None,
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

    /// Publishes one batch; returns how many entries it held (0: the outbox is drained).
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
        for entry in &entries {
            let mut headers = async_nats::HeaderMap::new();
            // Telemetry for whoever reads the stream: which row, which publication.
            headers.insert("Idemgate-Outbox-Entry", entry.id.to_string().as_str());
            headers.insert(
                "Idemgate-Outbox-Attempt",
                (entry.attempts + 1).to_string().as_str(),
            );
            let ack = self
                .js
                .publish_with_headers(
                    self.subject.clone(),
                    headers,
                    entry.envelope.clone().into_bytes().into(),
                )
                .await
                .map_err(|e| fail(entry.id, e.to_string()))?;
            acks.push((entry.id, ack));
        }
        for (id, ack) in acks {
            ack.await.map_err(|e| fail(id, e.to_string()))?;
        }
        if let Some((hook, pause)) = &self.before_mark {
            hook(&ids);
            tokio::time::sleep(*pause).await;
        }
        source.mark_sent(&ids).await?;
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
