//! Cost as the store grows, on SQLite: bulk-loads a file to each size with the mix of
//! `idemgate_conformance::growth` and measures there, through the store, claim + finalise,
//! replay reading the store, the reconciliation queue's first page, the recoverer's scan and a
//! sweep of 1% of the rows (see that module). Prints one block per size; BENCHMARKS.md
//! ("Cost as the store grows") records the figures and the command.
//!
//! ```text
//! cargo bench -p idemgate-store-sqlite --bench growth -- \
//!     --sizes 10000,1000000 --dir /var/tmp/grow --seconds 5 --callers 16
//! ```
//!
//! The loader writes the rows the store's own schema holds (the store creates the file and
//! its schema first) with one prepared statement in one transaction, without a journal or
//! fsync, in a fixed random order (`--order random`, the default: pages some 85 % full, as
//! the executor's inserts of random keys grow them) or in key order (`--order
//! sorted`: every page full, so that nearly every new key splits one). Then the file goes
//! back to WAL mode, is synced (its writeback would otherwise compete with what is measured),
//! and the store opens it as it would any file (its `PRAGMA optimize` at open gathers the
//! planner's statistics). Each file is deleted after its size is measured, unless `--keep`;
//! `--reuse` measures a kept file again as it is, without loading it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemgate_conformance::growth::{self, ms};
use idemgate_core::clock::{Clock, SystemClock};
use idemgate_core::store::Store;
use idemgate_core::trace;
use idemgate_store_sqlite::{Options, SWEEP_BATCH, SqliteStore, Synchronous};
use rusqlite::{Connection, params};

struct Args {
    sizes: Vec<u64>,
    dir: PathBuf,
    seconds: u64,
    callers: usize,
    keep: bool,
    reuse: bool,
    order: Order,
}

/// The order the loader inserts the rows in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    /// A fixed pseudo-random permutation: the b-trees come out as the executor's inserts of
    /// random keys would have grown them, pages some 85 % full (SQLite spreads a split over
    /// three siblings).
    Random,
    /// Key order: every page packed full, so that nearly every new key splits one.
    Sorted,
}

fn args() -> Args {
    let mut args = Args {
        sizes: vec![10_000, 1_000_000],
        dir: PathBuf::from("/var/tmp/grow"),
        seconds: 5,
        callers: 16,
        keep: false,
        reuse: false,
        order: Order::Random,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--sizes" => {
                args.sizes = value()
                    .split(',')
                    .map(|s| s.trim().parse().expect("--sizes 10000,1000000"))
                    .collect()
            }
            "--dir" => args.dir = PathBuf::from(value()),
            "--seconds" => args.seconds = value().parse().expect("--seconds N"),
            "--callers" => args.callers = value().parse().expect("--callers N"),
            "--keep" => args.keep = true,
            // Measure a file kept by an earlier `--keep` as it is (with the rows that run added)
            // instead of loading it again; the file is kept.
            "--reuse" => {
                args.reuse = true;
                args.keep = true;
            }
            "--order" => {
                args.order = match value().as_str() {
                    "random" => Order::Random,
                    "sorted" => Order::Sorted,
                    other => panic!("--order random|sorted, not {other}"),
                }
            }
            // `cargo bench` passes `--bench` to every bench binary.
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(
        args.sizes.iter().all(|&n| n >= 10_000),
        "every size must be at least 10000 (a full queue page)"
    );
    args
}

const INSERT: &str = "INSERT INTO operations (tenant, key, tool, tool_version, fingerprint, \
    canonicalization, status, fence, lease_owner, lease_expires_at, dispatch, job_id, \
    effect_reference, result, error_code, error_message, actor, request, approved_by, created_at, \
    updated_at, expires_at, purge_at, intent_window, trace) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, \
    ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25)";

/// A multiplier coprime with `n`: `i * m % n` runs through `0..n` in a fixed pseudo-random
/// order.
fn permutation(n: u64) -> u64 {
    let mut m = (0x9E37_79B9_7F4A_7C15u64 % n) | 1;
    while gcd(m, n) != 1 {
        m += 2;
    }
    m
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn load(path: &Path, n: u64, now: i64, order: Order) {
    // The store creates the file and its schema, then closes it.
    drop(
        SqliteStore::open(
            path,
            Options {
                synchronous: Synchronous::Off,
                ..Options::default()
            },
        )
        .expect("the store creates the file"),
    );
    let mut conn = Connection::open(path).expect("the file opens");
    conn.execute_batch(
        "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -2097152;",
    )
    .expect("load settings");
    let contract = growth::contract();
    let tx = conn.transaction().expect("a transaction");
    {
        let mut insert = tx.prepare(INSERT).expect("the insert prepares");
        let m = permutation(n);
        for j in 0..n {
            let i = match order {
                Order::Random => ((u128::from(j) * u128::from(m)) % u128::from(n)) as u64,
                Order::Sorted => j,
            };
            let (r, events) = growth::row(&contract, i, n, now);
            insert
                .execute(params![
                    r.tenant,
                    r.key,
                    r.tool,
                    r.tool_version,
                    r.fingerprint,
                    r.canonicalization,
                    r.status,
                    r.fence,
                    r.lease_owner,
                    r.lease_expires_at,
                    r.dispatch,
                    r.job_id,
                    r.effect_reference,
                    r.result,
                    r.error_code,
                    r.error_message,
                    r.actor,
                    r.request,
                    r.approved_by,
                    r.created_at,
                    r.updated_at,
                    r.expires_at,
                    r.purge_at,
                    r.intent_window,
                    trace::encode(&events),
                ])
                .expect("a row inserts");
        }
    }
    tx.commit().expect("the load commits");
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .expect("back to WAL");
    assert_eq!(mode, "wal");
    drop(conn);
    // The load wrote without fsync: its pages are still on their way to the disk, and their
    // writeback would compete with what is measured next (at 10M, 7.5 GB of it: claims ran at
    // 0.6x and single commits took up to 0.9 s while it lasted). Measure the file at rest.
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .expect("the loaded file syncs");
}

fn remove(path: &Path) {
    for suffix in ["", "-wal", "-shm", ".now"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn main() {
    let args = args();
    std::fs::create_dir_all(&args.dir).expect("the bench directory");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let run = Duration::from_secs(args.seconds);
    println!(
        "SQLite, synchronous=FULL, {} callers, {} s per rate, sweep batches of {SWEEP_BATCH}",
        args.callers, args.seconds
    );
    for &n in &args.sizes {
        let path = args.dir.join(format!("grow-{n}.sqlite"));
        // The rows are laid out around the loader's clock, which a reused file keeps beside it.
        let clock = path.with_extension("sqlite.now");
        let reused = args.reuse && path.exists() && clock.exists();
        let started = Instant::now();
        let now = if reused {
            let text = std::fs::read_to_string(&clock).expect("the loader's clock reads");
            text.trim().parse().expect("the loader's clock is a number")
        } else {
            let now = SystemClock.now();
            remove(&path);
            load(&path, n, now, args.order);
            std::fs::write(&clock, now.to_string()).expect("the loader's clock writes");
            now
        };
        let loaded = started.elapsed();
        let bytes = size(&path);
        println!(
            "\n## {n} records: loaded in {:.1} s, file {:.1} MB ({:.0} MB per million records)",
            loaded.as_secs_f64(),
            bytes as f64 / 1e6,
            bytes as f64 / 1e6 / (n as f64 / 1e6)
        );
        let store = SqliteStore::open(&path, Options::default()).expect("the store opens");
        let shared: Arc<dyn Store> = Arc::new(store.clone());
        rt.block_on(growth::reads_and_rates(
            shared.clone(),
            n,
            now,
            args.callers,
            run,
            if reused { SystemClock.now() as u64 } else { n },
        ));
        let before = store.stats();
        drop(shared);
        drop(store);
        if reused {
            // Its due rows were swept when it was kept; the sweep's counts no longer apply.
            println!("sweep: not run again on a reused file");
            continue;
        }
        // A store of its own for the sweep, so that its longest write transaction is the
        // sweep's (or the probe's).
        let store = SqliteStore::open(&path, Options::default()).expect("the store opens");
        let shared: Arc<dyn Store> = Arc::new(store.clone());
        let swept = rt.block_on(growth::sweep(shared.clone(), n, now));
        let stats = store.stats();
        println!(
            "sweep of {} rows ({} purged, {} compacted): {} ms, {} transactions, longest write \
             lock held {} ms (of which work before COMMIT at most {} ms); a probe's {} claims \
             beside it took at most {} ms (longest transaction before the sweep: {} ms, work {} ms)",
            swept.report.purged + swept.report.compacted,
            swept.report.purged,
            swept.report.compacted,
            ms(swept.elapsed),
            stats.commits,
            ms(stats.longest_hold),
            ms(stats.longest_work),
            swept.probes,
            ms(swept.longest_probe),
            ms(before.longest_hold),
            ms(before.longest_work),
        );
        drop(shared);
        drop(store);
        println!("file after the run: {:.1} MB", size(&path) as f64 / 1e6);
        if !args.keep {
            remove(&path);
        }
    }
}
