//! The consumer on NATS JetStream: a durable pull consumer whose messages go through
//! [`Consumer::handle`] and are acknowledged as the [`Disposition`] says.
//!
//! - **Durable**: the consumer's name is kept by the server, so a restarted (or killed)
//!   process resumes where the acknowledgements stopped; unacknowledged messages come back
//!   after `ack_wait`.
//! - **Bounded**: at most `max_in_flight` messages are delivered and unacknowledged at once
//!   (the server's `max_ack_pending`), and as many are handled concurrently.
//! - **Acknowledged after the record**: `+ACK` only for a settled or parked operation, a
//!   negative acknowledgement with the executor's advised delay for one still in flight,
//!   `+TERM` for a message that can never become an operation (logged with the problem).
//!   While a message is being handled its `ack_wait` is extended (`+WPI`), so a slow effect is
//!   not delivered again meanwhile.
//!
//! The stream sequence and the delivery count are logged with each message; neither is ever
//! part of the operation's identity.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::pull};
use futures_util::StreamExt;
use tokio::task::JoinSet;

use crate::consumer::{Consumer, Delivery};
use crate::disposition::Disposition;

/// How the JetStream consumer is set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// The stream to read. Created with `subjects` when it does not exist.
    pub stream: String,
    /// The subjects this consumer takes from the stream (its filter), and the stream's
    /// subjects when it is created here.
    pub subjects: Vec<String>,
    /// The durable consumer's name: processes sharing it share the work.
    pub durable: String,
    /// Messages delivered and not yet acknowledged, at most; as many are handled at once.
    pub max_in_flight: usize,
    /// How long the server waits for an acknowledgement before it delivers a message again.
    pub ack_wait: Duration,
    /// Deliveries of one message at most (-1: no bound). Only messages that stay in flight are
    /// delivered repeatedly; the bound ends a record that never settles for this consumer.
    pub max_deliver: i64,
    /// A test's fault: acknowledgements dropped on purpose.
    pub ack_fault: AckFault,
}

impl Options {
    pub fn new(stream: impl Into<String>, subjects: Vec<String>) -> Options {
        Options {
            stream: stream.into(),
            subjects,
            durable: "idemgate".into(),
            max_in_flight: 32,
            ack_wait: Duration::from_secs(30),
            max_deliver: -1,
            ack_fault: AckFault::none(),
        }
    }
}

/// Drops a share of the acknowledgements this process would send, so that a test can prove a
/// lost acknowledgement (the consumer crashed between the effect and the ack, or the ack was
/// lost on the way) is a redelivery and never a second effect. Off unless set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckFault {
    per_mille: u32,
    seed: u64,
}

impl AckFault {
    pub fn none() -> AckFault {
        AckFault {
            per_mille: 0,
            seed: 0,
        }
    }

    /// Drops `fraction` (0 to 1) of acknowledgements, chosen by `seed`.
    pub fn dropping(fraction: f64, seed: u64) -> Result<AckFault, String> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(format!(
                "the share of dropped acknowledgements must be within 0 and 1, not {fraction}"
            ));
        }
        Ok(AckFault {
            per_mille: (fraction * 1000.0).round() as u32,
            seed,
        })
    }

    pub fn is_active(&self) -> bool {
        self.per_mille > 0
    }

    fn drops(&self, stream_sequence: u64, attempt: u64) -> bool {
        if self.per_mille == 0 {
            return false;
        }
        // splitmix64 of (seed, sequence, attempt): every delivery its own draw.
        let mut z = self
            .seed
            .wrapping_add(stream_sequence.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_add(attempt.wrapping_mul(0xBF58_476D_1CE4_E5B9));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z % 1000) < u64::from(self.per_mille)
    }
}

/// Why the consumer stopped or could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("stream {stream}: {message}")]
    Stream { stream: String, message: String },
    #[error("consumer {durable} on stream {stream}: {message}")]
    Consumer {
        stream: String,
        durable: String,
        message: String,
    },
    #[error("reading messages of stream {stream}: {message}")]
    Messages { stream: String, message: String },
}

/// What a run did, by disposition.
#[derive(Debug, Default)]
pub struct Report {
    pub settled: AtomicU64,
    pub parked: AtomicU64,
    pub retried: AtomicU64,
    pub refused: AtomicU64,
    /// Acknowledgements not sent because of the [`AckFault`].
    pub acks_dropped: AtomicU64,
}

impl Report {
    fn count(&self, d: &Disposition) {
        let counter = match d {
            Disposition::Settled => &self.settled,
            Disposition::Parked => &self.parked,
            Disposition::Retry { .. } => &self.retried,
            Disposition::Refused { .. } => &self.refused,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn summary(&self) -> String {
        format!(
            "settled {}, parked {}, returned {}, refused {}, acknowledgements dropped {}",
            self.settled.load(Ordering::Relaxed),
            self.parked.load(Ordering::Relaxed),
            self.retried.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
            self.acks_dropped.load(Ordering::Relaxed),
        )
    }
}

/// The stream named by `options`, created with its subjects when it does not exist.
pub async fn ensure_stream(
    js: &jetstream::Context,
    options: &Options,
) -> Result<jetstream::stream::Stream, Error> {
    let fail = |message: String| Error::Stream {
        stream: options.stream.clone(),
        message,
    };
    match js.get_stream(&options.stream).await {
        Ok(stream) => Ok(stream),
        Err(e)
            if matches!(
                e.kind(),
                jetstream::context::GetStreamErrorKind::JetStream(ref j)
                    if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
            ) =>
        {
            js.create_stream(jetstream::stream::Config {
                name: options.stream.clone(),
                subjects: options.subjects.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| fail(e.to_string()))
        }
        Err(e) => Err(fail(e.to_string())),
    }
}

/// Consumes until `shutdown` completes, then stops taking messages, lets the ones being
/// handled finish (their acknowledgements included), and returns what it did.
pub async fn run(
    client: async_nats::Client,
    consumer: Consumer,
    options: Options,
    report: Arc<Report>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let js = jetstream::new(client.clone());
    let stream = ensure_stream(&js, &options).await?;
    let consumer_fail = |message: String| Error::Consumer {
        stream: options.stream.clone(),
        durable: options.durable.clone(),
        message,
    };
    let max_in_flight = options.max_in_flight.max(1);
    let pull_consumer = stream
        .get_or_create_consumer(
            &options.durable,
            pull::Config {
                durable_name: Some(options.durable.clone()),
                filter_subjects: options.subjects.clone(),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: options.ack_wait,
                max_deliver: options.max_deliver,
                max_ack_pending: max_in_flight as i64,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| consumer_fail(e.to_string()))?;
    let mut messages = pull_consumer
        .stream()
        .max_messages_per_batch(max_in_flight)
        .messages()
        .await
        .map_err(|e| Error::Messages {
            stream: options.stream.clone(),
            message: e.to_string(),
        })?;
    if options.ack_fault.is_active() {
        tracing::warn!(
            per_mille = options.ack_fault.per_mille,
            "test fault: dropping acknowledgements on purpose"
        );
    }
    let permits = Arc::new(tokio::sync::Semaphore::new(max_in_flight));
    let mut running = JoinSet::new();
    let consumer = Arc::new(consumer);
    tokio::pin!(shutdown);
    let result = loop {
        // Reap finished handlers so the set does not grow with the run.
        while running.try_join_next().is_some() {}
        let permit = tokio::select! {
            _ = &mut shutdown => break Ok(()),
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let next = tokio::select! {
            _ = &mut shutdown => break Ok(()),
            next = messages.next() => next,
        };
        let message = match next {
            Some(Ok(message)) => message,
            Some(Err(e)) => {
                // Heartbeats missed, a reconnect: the stream resumes by itself. A pause, so a
                // lasting fault logs a line a second at most rather than spinning.
                tracing::warn!(error = %e, "reading messages");
                drop(permit);
                tokio::select! {
                    _ = &mut shutdown => break Ok(()),
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            None => {
                break Err(Error::Messages {
                    stream: options.stream.clone(),
                    message: "the message stream ended".into(),
                });
            }
        };
        let consumer = consumer.clone();
        let report = report.clone();
        let fault = options.ack_fault;
        let ack_wait = options.ack_wait;
        running.spawn(async move {
            handle(&consumer, message, fault, ack_wait, &report).await;
            drop(permit);
        });
    };
    // Let the handlers finish: their effects are under way, and each one's acknowledgement is
    // what keeps its message from being delivered again for nothing.
    while running.join_next().await.is_some() {}
    let _ = client.flush().await;
    result
}

async fn handle(
    consumer: &Consumer,
    message: jetstream::Message,
    fault: AckFault,
    ack_wait: Duration,
    report: &Report,
) {
    let (sequence, attempt) = match message.info() {
        Ok(info) => (info.stream_sequence, info.delivered.max(0) as u64),
        Err(_) => (0, 0),
    };
    let delivery = Delivery {
        message_id: Some(sequence.to_string()),
        attempt: Some(attempt),
    };
    let handled = {
        let work = consumer.handle(&message.payload, &delivery);
        tokio::pin!(work);
        // Tell the server the work goes on, at half the ack wait, so a slow effect is not
        // delivered to another handler meanwhile (that one would only hear `in_flight`).
        let mut progress = tokio::time::interval((ack_wait / 2).max(Duration::from_millis(100)));
        progress.tick().await;
        loop {
            tokio::select! {
                handled = &mut work => break handled,
                _ = progress.tick() => {
                    let _ = message.ack_with(AckKind::Progress).await;
                }
            }
        }
    };
    let disposition = handled.disposition;
    report.count(&disposition);
    let kind = match &disposition {
        Disposition::Settled | Disposition::Parked => AckKind::Ack,
        Disposition::Retry { after } => AckKind::Nak(Some(*after)),
        Disposition::Refused { .. } => AckKind::Term,
    };
    if matches!(kind, AckKind::Ack) && fault.drops(sequence, attempt) {
        report.acks_dropped.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            stream_sequence = sequence,
            attempt,
            "test fault: acknowledgement dropped"
        );
        return;
    }
    if let Err(e) = message.ack_with(kind).await {
        // The message comes back after its ack wait and is answered from its record.
        tracing::warn!(stream_sequence = sequence, attempt, error = %e, "acknowledgement not sent");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ack_fault_drops_about_its_share() {
        let fault = AckFault::dropping(0.25, 7).unwrap();
        let dropped = (0..10_000).filter(|s| fault.drops(*s, 1)).count();
        assert!((2_200..2_800).contains(&dropped), "dropped {dropped}");
        assert_eq!(
            (0..1000).filter(|s| AckFault::none().drops(*s, 1)).count(),
            0
        );
        assert!(AckFault::dropping(1.5, 0).is_err());
    }
}
