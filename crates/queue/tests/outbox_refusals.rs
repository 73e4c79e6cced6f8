//! The outbox's two refusals (issue 31). An envelope its consumer would terminate (over the
//! consumer's 256 KiB) is refused by `enqueue` inside the business transaction, with an error
//! naming the limit, and nothing is written. An entry the broker refuses for good (over the
//! NATS server's `max_payload`) is parked — recorded with the reason, counted — and the entries
//! after it keep publishing: the stream holds every other entry, in order.
//!
//! Against the real NATS at 127.0.0.1:4222 (`IDEMGATE_NATS_URL` overrides): without it a test
//! prints that it skipped, unless `IDEMGATE_REQUIRE_NATS=1`, which makes the skip a failure.
//! The PostgreSQL cases skip the same way without `DATABASE_URL`.

use std::time::Duration;

use async_nats::jetstream;
use futures_util::StreamExt;
use idemgate_queue::Envelope;
use idemgate_queue::envelope::{DEFAULT_MAX_BYTES, Limits};
use idemgate_queue::outbox::postgres::PgOutbox;
use idemgate_queue::outbox::sqlite::SqliteOutbox;
use idemgate_queue::outbox::{self, Publisher, Source};

fn envelope(step: &str, text_bytes: usize) -> Envelope {
    Envelope {
        workflow_id: "order_7".into(),
        step_id: step.into(),
        tool: "jobs.email".into(),
        arguments: serde_json::json!({"to": "a@example.com", "body": "x".repeat(text_bytes)}),
        actor: None,
    }
}

struct Nats {
    js: jetstream::Context,
    stream: String,
    subject: String,
    max_payload: usize,
}

impl Nats {
    async fn fresh(label: &str) -> Option<Nats> {
        let url = std::env::var("IDEMGATE_NATS_URL")
            .unwrap_or_else(|_| "nats://127.0.0.1:4222".to_string());
        let connected = tokio::time::timeout(
            Duration::from_secs(5),
            async_nats::ConnectOptions::new()
                .max_reconnects(Some(2))
                .connect(url.as_str()),
        )
        .await;
        let client = match connected {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return skip(&url, &e.to_string()),
            Err(_) => return skip(&url, "no answer within 5 s"),
        };
        let max_payload = client.server_info().max_payload;
        let js = jetstream::new(client);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let stream = format!("IDEMGATE_TEST_{label}_{}_{nanos}", std::process::id());
        let subject = format!("idemgate.test.{label}.{}.{nanos}", std::process::id());
        js.create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![subject.clone()],
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .expect("JetStream creates the test's stream");
        Some(Nats {
            js,
            stream,
            subject,
            max_payload,
        })
    }

    /// The step ids of every message in the stream, in stream order.
    async fn steps(&self) -> Vec<String> {
        let stream = self.js.get_stream(&self.stream).await.unwrap();
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig::default())
            .await
            .unwrap();
        let count = stream.get_info().await.unwrap().state.messages as usize;
        let mut messages = consumer.messages().await.unwrap().take(count);
        let mut steps = Vec::new();
        while let Some(m) = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("the stream's messages arrive")
        {
            let m = m.unwrap();
            let envelope = Envelope::parse(&m.payload, Limits::default()).unwrap();
            steps.push(envelope.step_id);
        }
        steps
    }

    async fn delete(self) {
        let _ = self.js.delete_stream(&self.stream).await;
    }
}

fn skip(url: &str, why: &str) -> Option<Nats> {
    let message = format!("NATS JetStream at {url} is unreachable ({why})");
    if std::env::var("IDEMGATE_REQUIRE_NATS").as_deref() == Ok("1") {
        panic!("{message}, and IDEMGATE_REQUIRE_NATS=1");
    }
    eprintln!("SKIPPED: {message}; set IDEMGATE_REQUIRE_NATS=1 to make this a failure");
    None
}

/// The entries of both cases: three, one over the broker's limit (enqueued for a consumer
/// configured with a larger bound, as an application may), three more.
fn entries(max_payload: usize) -> Vec<(Envelope, Limits)> {
    let generous = Limits {
        max_bytes: 4 * max_payload,
        ..Limits::default()
    };
    let mut all: Vec<(Envelope, Limits)> = (0..3)
        .map(|i| (envelope(&format!("before{i}"), 10), Limits::default()))
        .collect();
    all.push((envelope("poison", max_payload + 1024), generous));
    all.extend((0..3).map(|i| (envelope(&format!("after{i}"), 10), Limits::default())));
    all
}

/// Publishes everything in batches of two (so the poison entry shares a batch), then checks
/// the stream, the parked list and the outbox.
async fn drain_and_check(nats: &Nats, source: &Source, poison_id: i64) {
    let publisher = Publisher::new(
        async_nats::connect(
            std::env::var("IDEMGATE_NATS_URL")
                .unwrap_or_else(|_| "nats://127.0.0.1:4222".to_string()),
        )
        .await
        .unwrap(),
        nats.subject.clone(),
    )
    .batch(2);
    let handled = tokio::time::timeout(Duration::from_secs(60), publisher.drain(source))
        .await
        .expect("the drain ends")
        .expect("no batch fails for the poison entry");
    assert_eq!(handled, 7);
    assert_eq!(publisher.parked(), 1);
    let parked = source.parked().await.unwrap();
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!(parked[0].id, poison_id);
    assert!(parked[0].reason.contains("max payload"), "{parked:?}");
    // What the queue received: every entry but the poison one, once, in order.
    assert_eq!(
        nats.steps().await,
        [
            "before0", "before1", "before2", "after0", "after1", "after2"
        ]
    );
    // Nothing is offered again: a second drain publishes nothing and parks nothing more.
    assert_eq!(publisher.drain(source).await.unwrap(), 0);
    assert_eq!(source.parked().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_entry_is_parked_and_later_ones_publish_sqlite() {
    let Some(nats) = Nats::fresh("poison_sqlite").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let mut conn = rusqlite::Connection::open(&path).unwrap();
    outbox::sqlite::install(&conn).unwrap();
    let mut poison_id = 0;
    for (e, limits) in entries(nats.max_payload) {
        let tx = conn.transaction().unwrap();
        let id = outbox::sqlite::enqueue_within(&tx, &e, limits).unwrap();
        tx.commit().unwrap();
        if e.step_id == "poison" {
            poison_id = id;
        }
    }
    let source = Source::Sqlite(SqliteOutbox::open(&path).unwrap());
    drain_and_check(&nats, &source, poison_id).await;
    nats.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_entry_is_parked_and_later_ones_publish_postgres() {
    let Some(db) = idemgate_store_postgres::testing::fresh_database().await else {
        return;
    };
    let Some(nats) = Nats::fresh("poison_pg").await else {
        db.drop_now().await;
        return;
    };
    let mut client = db.client().await;
    outbox::postgres::install(&client).await.unwrap();
    let mut poison_id = 0;
    for (e, limits) in entries(nats.max_payload) {
        let tx = client.transaction().await.unwrap();
        let id = outbox::postgres::enqueue_within(&tx, &e, limits)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        if e.step_id == "poison" {
            poison_id = id;
        }
    }
    let source = Source::Postgres(PgOutbox::new(db.client().await).await.unwrap());
    drain_and_check(&nats, &source, poison_id).await;
    nats.delete().await;
    drop(source);
    db.drop_now().await;
}

/// The consumer's bound, checked where the application can still roll back.
#[tokio::test]
async fn an_envelope_over_the_consumers_limit_is_refused_in_the_transaction_postgres() {
    let Some(db) = idemgate_store_postgres::testing::fresh_database().await else {
        return;
    };
    let mut client = db.client().await;
    outbox::postgres::install(&client).await.unwrap();
    client
        .batch_execute("CREATE TABLE orders (id BIGINT PRIMARY KEY)")
        .await
        .unwrap();
    let tx = client.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES (1)", &[])
        .await
        .unwrap();
    let e = outbox::postgres::enqueue(&tx, &envelope("big", DEFAULT_MAX_BYTES))
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("more than the {DEFAULT_MAX_BYTES}")),
        "{e}"
    );
    // The transaction is still usable: the application decides; even committing it leaves no
    // entry the consumer would terminate.
    tx.commit().await.unwrap();
    let rows: i64 = client
        .query_one("SELECT count(*) FROM idemgate_outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);
    let orders: i64 = client
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(orders, 1);
    drop(client);
    db.drop_now().await;
}
