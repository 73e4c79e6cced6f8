//! The executor on PostgreSQL against pgbench running the store's own statements on the same
//! schema, at the same client counts, in one run. `scripts/bench-postgres` creates the database
//! and calls this; the figures go to BENCHMARKS.md.
//!
//! Per client count, each for a fixed duration:
//!
//! - **pgbench, unique**: one pgbench transaction is the store's claim statement (insert with
//!   its three trace entries, `testing::statements::CLAIM`) followed by its finalise statement
//!   (the fenced update to `applied` appending three entries, `TRANSITION`), each in its own implicit
//!   transaction, prepared (`-M prepared`), on a new key each time — the text of both is taken
//!   from the store and only its parameters are filled in. pgbench's sessions get the store's
//!   planner settings (`PGOPTIONS`), so both sides run the same plans.
//! - **executor, unique**: `Executor::execute` on a new operation key with a no-op effect, on a
//!   `PgStore` whose pool has as many connections as there are callers. It issues what pgbench
//!   issues plus the read that precedes every claim (a delivery first looks for a record).
//!   With the store's default options concurrent claims and transitions are batched (its own
//!   `batch_in_flight` connections come on top of the pool); the run prints how many batch
//!   statements were sent and their mean size.
//! - **executor, replay**: each caller delivers an applied key again. The store is wrapped in a
//!   write counter and the run asserts that no replay wrote anything. Measured twice: with
//!   `settled_records: 0`, so that every replay reads its record from the store (the column
//!   compared with pgbench's read), and with the executor's defaults, which answer a replay of
//!   a settled record from memory without reading the store at all.
//! - **pgbench, read**: the store's read of one record by key (`GET`), on the same applied keys:
//!   all a replay costs the database.
//!
//! Arguments (after `--`): `--url URL` (a database the caller created; its tables are
//! truncated between runs), `--seconds N` (default 10), `--clients 1,8,32,64`, `--pgbench PATH`,
//! `--batch-in-flight N` (the store's `batch_in_flight`; 0 turns batching off; default: the
//! store's default options).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idemgate_conformance::faulty::FaultyStore;
use idemgate_conformance::harness::{Noop, Spec, op, ticket};
use idemgate_core::Contract;
use idemgate_core::clock::SystemClock;
use idemgate_core::effect::AllowAll;
use idemgate_core::outcome::Status;
use idemgate_core::store::Store;
use idemgate_engine::{Executor, Settings};
use idemgate_store_postgres::testing::statements;
use idemgate_store_postgres::{Options, PgStore};

struct Args {
    url: String,
    seconds: u64,
    clients: Vec<usize>,
    pgbench: String,
    /// Batch statements in flight at once; 0 turns batching off.
    batch_in_flight: Option<usize>,
}

fn args() -> Args {
    let mut args = Args {
        url: std::env::var("IDEMGATE_BENCH_URL").unwrap_or_default(),
        seconds: 10,
        clients: vec![1, 8, 32, 64],
        pgbench: "pgbench".into(),
        batch_in_flight: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--url" => args.url = value(),
            "--seconds" => args.seconds = value().parse().expect("--seconds N"),
            "--clients" => {
                args.clients = value()
                    .split(',')
                    .map(|c| c.trim().parse().expect("--clients 1,8,32,64"))
                    .collect()
            }
            "--pgbench" => args.pgbench = value(),
            "--batch-in-flight" => {
                args.batch_in_flight = Some(value().parse().expect("--batch-in-flight N"))
            }
            // `cargo bench` passes `--bench`; filters are not supported.
            _ => {}
        }
    }
    assert!(
        !args.url.is_empty(),
        "name the benchmark database with --url (scripts/bench-postgres does)"
    );
    args
}

/// Replaces `$n` in a statement with pgbench text, highest number first so that `$2` never
/// eats the start of `$24`.
fn fill(statement: &str, params: &[&str]) -> String {
    let mut text = statement.to_string();
    for (i, value) in params.iter().enumerate().rev() {
        text = text.replace(&format!("${}", i + 1), value);
    }
    assert!(!text.contains('$'), "unfilled parameter in {text}");
    // pgbench reads one SQL command per `;`-terminated block.
    format!("{};\n", text.trim())
}

/// A SQL string literal pgbench leaves alone: pgbench reads `:name` as a variable even inside
/// quotes, so a colon followed by a name character is split into its own literal
/// (`'sha256:' || '00…'`).
fn lit(text: &str) -> String {
    let mut out = String::from("'");
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => out.push_str("''"),
            ':' if chars
                .peek()
                .is_some_and(|n| n.is_alphanumeric() || *n == '_') =>
            {
                out.push_str(":' || '")
            }
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// The pgbench scripts: claim + finalise on a new key, and the read of an applied key.
fn pgbench_scripts(dir: &Path) -> (PathBuf, PathBuf) {
    // A new key per transaction: the client number and a random number from a range so large
    // that a repeat within a run is practically impossible (and would only make one finalise
    // match nothing).
    let key = &format!(
        "({} || CAST(:client_id AS text) || 'r' || CAST(:r AS text))",
        lit("acme:test:pgbench:c")
    );
    let request = lit(&ticket("Refund").to_string());
    let fingerprint = lit(&format!("sha256:{}", "0".repeat(64)));
    let claim = fill(
        statements::CLAIM,
        &[
            "'acme'",
            key,
            "'tickets.create'",
            "'2026-08-18'",
            &fingerprint,
            "1",
            "'pending'",
            "1",
            "'pgbench'",
            "1800000030000",
            "'not_sent'",
            "NULL",
            "NULL",
            "NULL",
            "NULL",
            "NULL",
            "'agent-1'",
            &request,
            "NULL",
            "1800000000000",
            "1800000000000",
            // Not settled yet: no expiry until the finalise sets one, as the executor claims.
            "9223372036854775807",
            "9223372036854775807",
            r#"E'["proposed",1800000000000,1,"pgbench",null]\n["validated",1800000000000,1,"pgbench",null]\n["claimed",1800000000000,1,"pgbench",null]\n'"#,
            "false",
        ],
    );
    let finalise = fill(
        statements::TRANSITION,
        &[
            "'acme'",
            key,
            "1",
            "'pending'",
            "NULL",
            "'applied'",
            "1",
            "NULL",
            "NULL",
            "NULL",
            "NULL",
            "'ticket'",
            &lit(r#"{"ok":true}"#),
            "NULL",
            "NULL",
            "true",
            "NULL",
            "NULL",
            "NULL",
            "1800000000001",
            r#"E'["sent",1800000000001,1,"pgbench",null]\n["committed",1800000000001,1,"pgbench","ticket"]\n["acknowledged",1800000000001,1,"pgbench",null]\n'"#,
            // The expiry the settling finalise fixes: retention counts from settlement.
            "1800086400001",
            "1800172800001",
            // Any dispatch marker.
            "NULL",
            // The life claimed above.
            "1800000000000",
        ],
    );
    let unique = dir.join("claim_finalise.sql");
    std::fs::write(
        &unique,
        format!("\\set r random(1, 1000000000000000)\n{claim}{finalise}"),
    )
    .unwrap();
    // The executor's replay keys are `acme:test:run_827:r<caller>`; pgbench clients are
    // numbered from 0 like the callers.
    let read = dir.join("read.sql");
    std::fs::write(
        &read,
        fill(
            statements::GET,
            &[
                "'acme'",
                &format!(
                    "({} || CAST(:client_id AS text))",
                    lit("acme:test:run_827:r")
                ),
            ],
        ),
    )
    .unwrap();
    (unique, read)
}

/// Runs pgbench and returns its transactions per second.
fn pgbench(args: &Args, script: &Path, clients: usize) -> f64 {
    // The store's planner settings, so that pgbench's prepared statements get the plans the
    // store's do. Without them pgbench's generic plan, cached on the freshly truncated table,
    // was the sequential scan the store's connections rule out, and the baseline slowed down
    // as its own table grew during the run.
    let planner: Vec<String> = statements::PLANNER_SETTINGS
        .iter()
        .map(|(name, value)| format!("-c {name}={value}"))
        .collect();
    let out = Command::new(&args.pgbench)
        .env("PGOPTIONS", planner.join(" "))
        .args(["-n", "-M", "prepared", "-c", &clients.to_string()])
        .args(["-j", &clients.min(2).to_string()])
        .args(["-T", &args.seconds.to_string(), "-f"])
        .arg(script)
        .arg(&args.url)
        .output()
        .expect("pgbench runs (scripts/bench-postgres installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pgbench failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let failed = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("number of failed transactions: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or("0");
    assert_eq!(failed, "0", "pgbench transactions failed: {stdout}");
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no tps in pgbench's output: {stdout}"))
}

async fn truncate(url: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    // Separate calls: a multi-statement string runs as one transaction, where VACUUM may not.
    for sql in ["TRUNCATE operations", "VACUUM ANALYZE operations"] {
        client.batch_execute(sql).await.unwrap();
    }
    drop(client);
    let _ = connection.await;
}

/// `callers` tasks deliver for `seconds`; returns operations per second. `step` names the
/// operation of caller `i`; `expect` is the status every answer must have.
async fn drive(
    executor: &Executor,
    contract: &Arc<Contract>,
    callers: usize,
    seconds: u64,
    step: impl Fn(usize) -> String + Clone + Send + 'static,
    expect: Status,
) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for i in 0..callers {
        let (executor, contract, done, step) = (
            executor.clone(),
            contract.clone(),
            done.clone(),
            step.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let o = executor
                    .execute(&contract, &op(&step(i)), &ticket("Refund"), &Noop)
                    .await;
                assert_eq!(o.status, expect, "{o:?}");
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let args = args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = std::env::temp_dir().join(format!("idemgate-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (unique_script, read_script) = pgbench_scripts(&dir);
    // Connecting applies the schema.
    runtime.block_on(async {
        PgStore::connect(&args.url, Options::default())
            .await
            .expect("the benchmark database")
    });
    let contract = Spec::key_based().contract();
    let next = Arc::new(AtomicU64::new(0));
    let mut rows = Vec::new();
    for &clients in &args.clients {
        runtime.block_on(truncate(&args.url));
        let pg_unique = pgbench(&args, &unique_script, clients);

        let (ex_unique, ex_replay_read, ex_replay) = runtime.block_on(async {
            truncate(&args.url).await;
            let defaults = Options::default();
            let options = Options {
                pool_size: clients,
                batching: args.batch_in_flight != Some(0),
                batch_in_flight: args.batch_in_flight.unwrap_or(defaults.batch_in_flight),
                ..defaults
            };
            let store = PgStore::connect(&args.url, options).await.unwrap();
            let stats = store.clone();
            let counted = Arc::new(FaultyStore::new(store));
            let executor = Executor::new(
                counted.clone() as Arc<dyn Store>,
                Arc::new(SystemClock),
                Arc::new(AllowAll),
                Settings::default(),
            );
            // The same, without the executor's memory of settled records, so that each replay
            // reads its record from the store: the path pgbench's read measures.
            let reading = Executor::new(
                counted.clone() as Arc<dyn Store>,
                Arc::new(SystemClock),
                Arc::new(AllowAll),
                Settings {
                    settled_records: 0,
                    ..Settings::default()
                },
            );
            let unique = |next: Arc<AtomicU64>| {
                move |_| format!("u{}", next.fetch_add(1, Ordering::Relaxed))
            };
            // Warm-up: opens the pool's connections and prepares the statements on each.
            drive(
                &executor,
                &contract,
                clients,
                1,
                unique(next.clone()),
                Status::Applied,
            )
            .await;
            let before = stats.batch_stats();
            let ex_unique = drive(
                &executor,
                &contract,
                clients,
                args.seconds,
                unique(next.clone()),
                Status::Applied,
            )
            .await;
            let after = stats.batch_stats();
            let (statements, rows) = (after.0 - before.0, after.1 - before.1);
            if statements > 0 {
                eprintln!(
                    "clients {clients}: {statements} batch statements, {:.1} rows each",
                    rows as f64 / statements as f64
                );
            }

            for i in 0..clients {
                let o = executor
                    .execute(&contract, &op(&format!("r{i}")), &ticket("Refund"), &Noop)
                    .await;
                assert_eq!(o.status, Status::Applied, "{o:?}");
            }
            let writes = counted.writes();
            let ex_replay_read = drive(
                &reading,
                &contract,
                clients,
                args.seconds,
                |i| format!("r{i}"),
                Status::Replayed,
            )
            .await;
            let ex_replay = drive(
                &executor,
                &contract,
                clients,
                args.seconds,
                |i| format!("r{i}"),
                Status::Replayed,
            )
            .await;
            assert_eq!(counted.writes(), writes, "a replay wrote to the store");
            (ex_unique, ex_replay_read, ex_replay)
        });
        let pg_read = pgbench(&args, &read_script, clients);
        let row = (
            clients,
            pg_unique,
            ex_unique,
            pg_read,
            ex_replay_read,
            ex_replay,
        );
        eprintln!(
            "clients {clients}: pgbench {pg_unique:.0}/s, executor {ex_unique:.0}/s; \
             pgbench read {pg_read:.0}/s, executor replay {ex_replay_read:.0}/s reading the \
             store, {ex_replay:.0}/s from memory"
        );
        rows.push(row);
    }
    let _ = std::fs::remove_dir_all(&dir);

    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "\n| clients | pgbench claim+finalise (ops/s) | executor unique (ops/s) | ratio | \
         pgbench read (ops/s) | executor replay, store read (ops/s) | ratio | \
         executor replay, default (ops/s) |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (clients, pg_unique, ex_unique, pg_read, ex_replay_read, ex_replay) in rows {
        let _ = writeln!(
            out,
            "| {clients} | {pg_unique:.0} | {ex_unique:.0} | {:.2}× | {pg_read:.0} | \
             {ex_replay_read:.0} | {:.2}× | {ex_replay:.0} |",
            ex_unique / pg_unique,
            ex_replay_read / pg_read
        );
    }
    let _ = writeln!(
        out,
        "\n{} s per measurement; every replay answered `replayed` and wrote nothing.",
        args.seconds
    );
}
