//! The transactional outbox end to end: an application commits its business write and an
//! outbox entry in one transaction, `idemgate outbox publish` (a real process) is killed with
//! SIGKILL between publishing a batch and marking it sent — so the batch is published again by
//! the next run — and `idemgate consume` turns the duplicates into one effect per order,
//! counted by the fake provider on its own side. A transaction rolled back leaves no entry and
//! no effect.
//!
//! Once on an SQLite application database, once on PostgreSQL (skipped, loudly, without
//! `DATABASE_URL`; a failure under `IDEMGATE_REQUIRE_POSTGRES=1`). Each skips without NATS
//! unless `IDEMGATE_REQUIRE_NATS=1`.

mod consume_support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use consume_support::{ConsumeProcess, Nats, config, contracts, key, provider, records};
use idemgate_core::record::RecordStatus;
use idemgate_queue::Envelope;
use idemgate_queue::outbox;
use idemgate_store_postgres::testing::{TestDatabase, fresh_database};

const ORDERS: usize = 300;
const BATCH: &str = "50";
/// Publisher runs killed between publishing and marking.
const KILLS: usize = 3;

fn order_envelope(n: usize) -> Envelope {
    Envelope {
        workflow_id: format!("order_{n}"),
        step_id: "confirmation".into(),
        tool: "jobs.email".into(),
        arguments: serde_json::json!({"to": format!("buyer{n}@example.com"), "body": format!("order {n} confirmed")}),
        actor: Some("checkout".into()),
    }
}

/// The application's database.
enum AppDb {
    Sqlite(PathBuf),
    Postgres(TestDatabase),
}

impl AppDb {
    fn url(&self) -> String {
        match self {
            AppDb::Sqlite(path) => format!("sqlite://{}", path.display()),
            AppDb::Postgres(db) => db.url().to_string(),
        }
    }

    /// The application's own work: each order and its confirmation job in one transaction,
    /// and one order whose transaction rolls back.
    async fn place_orders(&self) {
        match self {
            AppDb::Sqlite(path) => {
                let mut conn = rusqlite::Connection::open(path).unwrap();
                conn.execute_batch(
                    "PRAGMA journal_mode = WAL; CREATE TABLE orders (id INTEGER PRIMARY KEY, buyer TEXT NOT NULL);",
                )
                .unwrap();
                outbox::sqlite::install(&conn).unwrap();
                for n in 0..=ORDERS {
                    let tx = conn.transaction().unwrap();
                    tx.execute(
                        "INSERT INTO orders (id, buyer) VALUES (?1, ?2)",
                        rusqlite::params![n as i64, format!("buyer{n}")],
                    )
                    .unwrap();
                    outbox::sqlite::enqueue(&tx, &order_envelope(n)).unwrap();
                    if n == ORDERS {
                        tx.rollback().unwrap();
                    } else {
                        tx.commit().unwrap();
                    }
                }
            }
            AppDb::Postgres(db) => {
                let (mut client, connection) =
                    tokio_postgres::connect(db.url(), tokio_postgres::NoTls)
                        .await
                        .unwrap();
                tokio::spawn(connection);
                client
                    .batch_execute(
                        "CREATE TABLE orders (id BIGINT PRIMARY KEY, buyer TEXT NOT NULL)",
                    )
                    .await
                    .unwrap();
                outbox::postgres::install(&client).await.unwrap();
                for n in 0..=ORDERS {
                    let tx = client.transaction().await.unwrap();
                    tx.execute(
                        "INSERT INTO orders (id, buyer) VALUES ($1, $2)",
                        &[&(n as i64), &format!("buyer{n}")],
                    )
                    .await
                    .unwrap();
                    outbox::postgres::enqueue(&tx, &order_envelope(n))
                        .await
                        .unwrap();
                    if n == ORDERS {
                        tx.rollback().await.unwrap();
                    } else {
                        tx.commit().await.unwrap();
                    }
                }
            }
        }
    }

    /// (entries, unsent entries) in the outbox.
    async fn outbox_counts(&self) -> (i64, i64) {
        let sql = "SELECT count(*), count(*) FILTER (WHERE sent_at IS NULL) FROM idemgate_outbox";
        match self {
            AppDb::Sqlite(path) => {
                let conn = rusqlite::Connection::open(path).unwrap();
                conn.query_row(sql, [], |r| Ok((r.get(0)?, r.get(1)?)))
                    .unwrap()
            }
            AppDb::Postgres(db) => {
                let (client, connection) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(connection);
                let row = client.query_one(sql, &[]).await.unwrap();
                (row.get(0), row.get(1))
            }
        }
    }
}

/// One run of `idemgate outbox publish`. With `kill_at = Some(k)` the fault switch pauses
/// before each mark and the run is killed with SIGKILL at its `k`-th pause: that batch is in
/// the stream and not marked. Returns the batches the run announced.
fn publish_run(dir: &Path, db: &AppDb, nats: &Nats, kill_at: Option<usize>, run: usize) -> usize {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idemgate"));
    cmd.args([
        "outbox",
        "publish",
        "--database",
        &db.url(),
        "--nats",
        &nats.url,
    ])
    .args([
        "--subject",
        &nats.subject,
        "--batch",
        BATCH,
        "--until-empty",
    ])
    .env_remove("RUST_LOG")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(std::fs::File::create(dir.join(format!("publish-{run}.err"))).unwrap());
    if kill_at.is_some() {
        cmd.env("IDEMGATE_FAULT_OUTBOX_PAUSE_BEFORE_MARK_MS", "800");
    }
    let mut child = cmd.spawn().expect("the idemgate binary starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut pauses = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "publisher run {run} did not finish in time"
        );
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("marking them sent") => {
                pauses += 1;
                if Some(pauses) == kill_at {
                    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
                    let _ = child.wait();
                    return pauses;
                }
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "publisher run {run} failed: {}",
        std::fs::read_to_string(dir.join(format!("publish-{run}.err"))).unwrap_or_default()
    );
    assert!(
        kill_at.is_none(),
        "publisher run {run} ended before its kill"
    );
    pauses
}

async fn duplicates_from_a_killed_publisher_cause_one_effect(
    db: AppDb,
    nats: Nats,
    dir: tempfile::TempDir,
) {
    let provider = provider().await;
    let config = config(dir.path(), &contracts(dir.path(), &provider));
    db.place_orders().await;
    assert_eq!(
        db.outbox_counts().await,
        (ORDERS as i64, ORDERS as i64),
        "the rolled-back order left no entry"
    );

    // Killed at the 1st, 2nd, 1st pause: batches 1 and 2 published twice or more.
    for (run, kill_at) in [1, 2, 1].into_iter().take(KILLS).enumerate() {
        publish_run(dir.path(), &db, &nats, Some(kill_at), run);
    }
    publish_run(dir.path(), &db, &nats, None, KILLS);
    let (_, unsent) = db.outbox_counts().await;
    assert_eq!(unsent, 0, "every entry is marked sent");
    let messages = nats.messages().await;
    assert!(
        messages > ORDERS as u64,
        "the killed runs published duplicates: {messages} messages for {ORDERS} entries"
    );

    let mut consumer = ConsumeProcess::new(dir.path(), &config, &nats, &[]);
    consumer.start();
    nats.wait_drained(
        Instant::now() + Duration::from_secs(120),
        "the outbox's messages",
    )
    .await;
    let summary = consumer.stop();

    for n in 0..ORDERS {
        let k = key(&format!("order_{n}"), "confirmation");
        assert_eq!(provider.downstream().effects_for(&k), 1, "order {n}");
    }
    let rolled_back = key(&format!("order_{ORDERS}"), "confirmation");
    assert_eq!(
        provider.downstream().effects_for(&rolled_back),
        0,
        "a rolled-back order has no effect"
    );
    assert_eq!(provider.downstream().effects(), ORDERS);
    let records = records(dir.path()).await;
    assert_eq!(records.len(), ORDERS);
    assert!(
        records
            .iter()
            .all(|r| r.state.status() == RecordStatus::Applied)
    );
    eprintln!(
        "{ORDERS} orders, {messages} messages published by {} publisher runs ({KILLS} killed before marking), {} effects; {}",
        KILLS + 1,
        provider.downstream().effects(),
        summary.lines().last().unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_on_sqlite_killed_publisher_duplicates_cause_one_effect() {
    let Some(nats) = Nats::fresh("outbox_sqlite").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = AppDb::Sqlite(dir.path().join("app.db"));
    duplicates_from_a_killed_publisher_cause_one_effect(db, nats, dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_on_postgres_killed_publisher_duplicates_cause_one_effect() {
    let Some(nats) = Nats::fresh("outbox_pg").await else {
        return;
    };
    let Some(db) = fresh_database().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    duplicates_from_a_killed_publisher_cause_one_effect(AppDb::Postgres(db), nats, dir).await;
}
