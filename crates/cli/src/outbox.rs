//! `idemgate outbox publish`: the transactional outbox's publisher, for an application's own
//! SQLite or PostgreSQL database (the table `idemgate_outbox`, see the queue crate).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use idemgate_queue::outbox::postgres::PgOutbox;
use idemgate_queue::outbox::sqlite::SqliteOutbox;
use idemgate_queue::outbox::{Publisher, Source};

/// The test-only fault switch: after a batch is stored in the stream, print its ids and wait
/// this many milliseconds before marking it sent, so a test can kill the publisher there.
const PAUSE_VAR: &str = "IDEMGATE_FAULT_OUTBOX_PAUSE_BEFORE_MARK_MS";

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Deliver the outbox's unsent entries to NATS JetStream, at least once, and mark them
    /// sent.
    Publish(PublishArgs),
}

#[derive(Debug, clap::Args)]
pub struct PublishArgs {
    /// The application's database: `sqlite://PATH` or `postgres://…`. The outbox table is
    /// created there when it does not exist.
    #[arg(long, value_name = "URL")]
    database: String,
    /// The NATS server.
    #[arg(
        long,
        value_name = "URL",
        env = "IDEMGATE_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    nats: String,
    /// The subject every entry is published to (a stream must capture it).
    #[arg(long, value_name = "SUBJECT")]
    subject: String,
    /// Entries per batch.
    #[arg(long, value_name = "N", default_value_t = 100)]
    batch: usize,
    /// Stop once no entry is left unsent, instead of polling for new ones.
    #[arg(long)]
    until_empty: bool,
    /// Pause between polls of an empty outbox, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    interval_ms: u64,
}

async fn source(url: &str) -> anyhow::Result<Source> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        anyhow::ensure!(
            !path.is_empty(),
            "--database names no file; write sqlite://PATH"
        );
        let outbox = SqliteOutbox::open(path).with_context(|| format!("opening {url}"))?;
        return Ok(Source::Sqlite(outbox));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let shown = idemgate_app::redact(url);
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .with_context(|| format!("connecting to {shown}"))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("idemgate outbox: database connection: {e}");
            }
        });
        let outbox = PgOutbox::new(client)
            .await
            .with_context(|| format!("the outbox table in {shown}"))?;
        return Ok(Source::Postgres(outbox));
    }
    anyhow::bail!("--database must start with sqlite:// or postgres://, not {url:?}")
}

pub async fn run(command: Command) -> anyhow::Result<()> {
    let Command::Publish(args) = command;
    let source = source(&args.database).await?;
    let client = async_nats::connect(args.nats.as_str())
        .await
        .with_context(|| format!("connecting to NATS at {}", args.nats))?;
    let mut publisher = Publisher::new(client.clone(), args.subject.clone()).batch(args.batch);
    if let Ok(text) = std::env::var(PAUSE_VAR) {
        let ms: u64 = text
            .trim()
            .parse()
            .with_context(|| format!("{PAUSE_VAR}={text:?} is not a number of milliseconds"))?;
        let hook = Arc::new(|ids: &[i64]| {
            use std::io::Write;
            let first = ids.first().copied().unwrap_or_default();
            let last = ids.last().copied().unwrap_or_default();
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "outbox: published entries {first}..={last}; marking them sent"
            );
            let _ = out.flush();
        });
        publisher = publisher.pause_before_mark(hook, Duration::from_millis(ms));
    }
    println!(
        "idemgate outbox publishing {} to {} at {}",
        idemgate_app::redact(&args.database),
        args.subject,
        args.nats
    );
    let mut total = 0usize;
    let shutdown = crate::signals::shutdown();
    tokio::pin!(shutdown);
    loop {
        let published = tokio::select! {
            _ = &mut shutdown => break,
            n = publisher.publish_batch(&source) => n?,
        };
        total += published;
        if published == 0 {
            if args.until_empty {
                break;
            }
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tokio::time::sleep(Duration::from_millis(args.interval_ms)) => {}
            }
        }
    }
    let _ = client.flush().await;
    let parked = publisher.parked();
    if parked > 0 {
        println!(
            "idemgate outbox: handled {total} entries, {parked} of them parked (the queue refuses them; see idemgate_outbox_parked)"
        );
    } else {
        println!("idemgate outbox: published {total} entries");
    }
    Ok(())
}
