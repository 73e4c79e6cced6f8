//! Cost as the store grows, on PostgreSQL: bulk-loads a fresh database to each size with the
//! mix of `idemgate_conformance::growth` and measures there, through the store, claim +
//! finalise, replay reading the store, the reconciliation queue's first page, the recoverer's
//! scan and a sweep of 1% of the rows (see that module). Prints one block per size;
//! docs/benchmarks/history.md ("Cost as the store grows") records the figures and the command.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!     cargo bench -p idemgate-store-postgres --bench growth -- \
//!     --sizes 10000,1000000 --seconds 5 --callers 16
//! ```
//!
//! Per size, a database `idemgate_grow_<size>` is created through `DATABASE_URL` (dropped
//! first if a run left it behind), the store migrates it, and the loader copies the rows of
//! the store's schema, each with its trace in the row, into `operations` with `COPY … FROM STDIN`
//! (text format), in key order, in one transaction; `VACUUM ANALYZE` follows, as autovacuum
//! would after a load. The database's size is measured, the operations run on a store of
//! `--callers` connections (batching as by default), and the database is dropped.

use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::Sink;
use idemgate_conformance::growth::{self, ms};
use idemgate_core::clock::{Clock, SystemClock};
use idemgate_core::store::Store;
use idemgate_core::trace;
use idemgate_store_postgres::{Options, PgStore};
use tokio_postgres::NoTls;

struct Args {
    admin: String,
    sizes: Vec<u64>,
    seconds: u64,
    callers: usize,
    keep: bool,
}

fn args() -> Args {
    let mut args = Args {
        admin: std::env::var("DATABASE_URL").unwrap_or_default(),
        sizes: vec![10_000, 1_000_000],
        seconds: 5,
        callers: 16,
        keep: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--url" => args.admin = value(),
            "--sizes" => {
                args.sizes = value()
                    .split(',')
                    .map(|s| s.trim().parse().expect("--sizes 10000,1000000"))
                    .collect()
            }
            "--seconds" => args.seconds = value().parse().expect("--seconds N"),
            "--callers" => args.callers = value().parse().expect("--callers N"),
            "--keep" => args.keep = true,
            // `cargo bench` passes `--bench` to every bench binary.
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(
        args.admin.starts_with("postgres://") || args.admin.starts_with("postgresql://"),
        "DATABASE_URL (or --url) must be an administrative postgres:// URL"
    );
    assert!(
        args.sizes.iter().all(|&n| n >= 10_000),
        "every size must be at least 10000 (a full queue page)"
    );
    args
}

/// `admin` with its database replaced by `name`.
fn database_url(admin: &str, name: &str) -> String {
    let (scheme, rest) = admin.split_once("://").expect("a URL");
    let (body, query) = rest
        .split_once('?')
        .map_or((rest, None), |(b, q)| (b, Some(q)));
    let authority = body.split_once('/').map_or(body, |(a, _)| a);
    match query {
        Some(q) => format!("{scheme}://{authority}/{name}?{q}"),
        None => format!("{scheme}://{authority}/{name}"),
    }
}

async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A value in COPY's text format: `\N` for NULL, backslash, tab, newline and carriage return
/// escaped.
fn field(out: &mut String, value: Option<&str>) {
    let Some(value) = value else {
        out.push_str("\\N");
        return;
    };
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
}

fn line(out: &mut String, values: &[Option<&str>]) {
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push('\t');
        }
        field(out, *v);
    }
    out.push('\n');
}

/// Sends `data` into a COPY that is running.
async fn send(
    sink: &mut std::pin::Pin<&mut tokio_postgres::CopyInSink<std::io::Cursor<Vec<u8>>>>,
    data: String,
) {
    poll_fn(|cx| sink.as_mut().poll_ready(cx))
        .await
        .expect("the copy takes more");
    sink.as_mut()
        .start_send(std::io::Cursor::new(data.into_bytes()))
        .expect("the copy takes more");
}

const OPERATIONS: &str = "COPY operations (tenant, key, tool, tool_version, fingerprint, \
    canonicalization, status, fence, lease_owner, lease_expires_at, dispatch, job_id, \
    effect_reference, result, error_code, error_message, actor, request, approved_by, created_at, \
    updated_at, expires_at, purge_at, intent_window, trace) FROM STDIN";

/// Copies the `n` records, each with its trace in the row, into `operations` in one transaction.
async fn load(client: &mut tokio_postgres::Client, n: u64, now: i64) {
    let contract = growth::contract();
    let tx = client.transaction().await.expect("a transaction");
    {
        let sink = tx.copy_in(OPERATIONS).await.expect("the copy starts");
        let mut sink = pin!(sink);
        let mut chunk = String::with_capacity(1 << 20);
        for i in 0..n {
            let (r, events) = growth::row(&contract, i, n, now);
            {
                let (canon, fence, created, updated, expires, purge) = (
                    r.canonicalization.to_string(),
                    r.fence.to_string(),
                    r.created_at.to_string(),
                    r.updated_at.to_string(),
                    r.expires_at.to_string(),
                    r.purge_at.to_string(),
                );
                let lease = r.lease_expires_at.map(|l| l.to_string());
                line(
                    &mut chunk,
                    &[
                        Some(&r.tenant),
                        Some(&r.key),
                        Some(&r.tool),
                        Some(&r.tool_version),
                        Some(&r.fingerprint),
                        Some(&canon),
                        Some(&r.status),
                        Some(&fence),
                        r.lease_owner.as_deref(),
                        lease.as_deref(),
                        r.dispatch.as_deref(),
                        r.job_id.as_deref(),
                        r.effect_reference.as_deref(),
                        r.result.as_deref(),
                        r.error_code.as_deref(),
                        r.error_message.as_deref(),
                        Some(&r.actor),
                        r.request.as_deref(),
                        r.approved_by.as_deref(),
                        Some(&created),
                        Some(&updated),
                        Some(&expires),
                        Some(&purge),
                        Some(if r.intent_window { "t" } else { "f" }),
                        Some(&trace::encode(&events)),
                    ],
                );
            }
            if chunk.len() > 1 << 20 {
                send(&mut sink, std::mem::take(&mut chunk)).await;
            }
        }
        if !chunk.is_empty() {
            send(&mut sink, chunk).await;
        }
        sink.as_mut().finish().await.expect("the copy completes");
    }
    tx.commit().await.expect("the load commits");
}

fn main() {
    let args = args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let run = Duration::from_secs(args.seconds);
    println!(
        "PostgreSQL, {} callers on a pool of as many connections (batching on), {} s per rate",
        args.callers, args.seconds
    );
    rt.block_on(async {
        let admin = client(&args.admin).await;
        let version: String = admin
            .query_one("SHOW server_version", &[])
            .await
            .unwrap()
            .get(0);
        println!("server {version}");
        for &n in &args.sizes {
            let name = format!("idemgate_grow_{n}");
            // Two statements: neither may run inside the transaction a batch of them is.
            for statement in [
                format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
                format!("CREATE DATABASE {name}"),
            ] {
                admin
                    .batch_execute(&statement)
                    .await
                    .expect("a fresh database");
            }
            let url = database_url(&args.admin, &name);
            let options = Options {
                pool_size: args.callers,
                ..Options::default()
            };
            // The store migrates the new database.
            drop(
                PgStore::connect(&url, options.clone())
                    .await
                    .expect("the store migrates"),
            );
            let now = SystemClock.now();
            let started = Instant::now();
            let mut loader = client(&url).await;
            load(&mut loader, n, now).await;
            let loaded = started.elapsed();
            loader
                .batch_execute("VACUUM ANALYZE operations")
                .await
                .expect("vacuum");
            let bytes: i64 = loader
                .query_one("SELECT pg_database_size(current_database())", &[])
                .await
                .unwrap()
                .get(0);
            let operations: i64 = loader
                .query_one("SELECT pg_total_relation_size('operations')", &[])
                .await
                .unwrap()
                .get(0);
            let per_million = |b: i64| b as f64 / 1e6 / (n as f64 / 1e6);
            println!(
                "\n## {n} records: loaded in {:.1} s (+ vacuum {:.1} s), database {:.1} MB \
                 ({:.0} MB per million records, operations with their traces {:.0})",
                loaded.as_secs_f64(),
                (started.elapsed() - loaded).as_secs_f64(),
                bytes as f64 / 1e6,
                per_million(bytes),
                per_million(operations),
            );
            let store: Arc<dyn Store> = Arc::new(
                PgStore::connect(&url, options)
                    .await
                    .expect("the store connects"),
            );
            growth::reads_and_rates(store.clone(), n, now, args.callers, run, n).await;
            let swept = growth::sweep(store.clone(), n, now).await;
            println!(
                "sweep of {} rows ({} purged, {} compacted): {} ms; a probe's {} claims beside \
                 it took at most {} ms",
                swept.report.purged + swept.report.compacted,
                swept.report.purged,
                swept.report.compacted,
                ms(swept.elapsed),
                swept.probes,
                ms(swept.longest_probe),
            );
            drop(store);
            drop(loader);
            if !args.keep {
                admin
                    .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
                    .await
                    .expect("the database drops");
            }
        }
    });
}
