//! A throwaway database per test, for this crate's tests and for every other crate whose tests
//! run against PostgreSQL (the conformance suite, the multi-process test).
//!
//! `DATABASE_URL` names an administrative connection (for instance
//! `postgres://postgres@127.0.0.1:5432/postgres`). [`fresh_database`] creates a database with a
//! unique name through it and drops it again when the [`TestDatabase`] is dropped, also when the
//! test panics. Without `DATABASE_URL`, or when the server cannot be reached, the test prints a
//! loud `SKIPPED (PostgreSQL)` line and gets `None` — unless `IDEMGATE_REQUIRE_POSTGRES=1`, as
//! in CI, where a skip would hide a broken set-up and therefore panics instead.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::NoTls;

use crate::{Options, PgStore};

/// The statements the store issues, word for word, for benchmarks that run them outside the
/// store (the pgbench baseline in `benches/executor.rs` substitutes their parameters).
pub mod statements {
    /// Claim-or-load with the claim's events; parameters as in the store's `claim`.
    pub const CLAIM: &str = crate::sql::CLAIM;
    /// One fenced transition with its events; parameters as in the store's `transition`.
    pub const TRANSITION: &str = crate::sql::TRANSITION;
    /// The read of one record by key, the only statement a replay issues.
    pub const GET: &str = crate::sql::GET;
    /// Many claims in one statement, as the batcher sends them.
    pub const CLAIM_BATCH: &str = crate::sql::CLAIM_BATCH;
    /// Many fenced transitions in one statement, as the batcher sends them for `rows` rows.
    pub fn transition_batch(rows: usize) -> String {
        crate::sql::transition_batch(rows)
    }
    /// The lock a claim under a duplicate-intent window takes first; `$1` the request.
    pub const DUPLICATE_LOCK: &str = crate::sql::DUPLICATE_LOCK;
    /// The text the lock of [`DUPLICATE_LOCK`] is taken on, for a test that holds it.
    pub fn duplicate_lock_request(tenant: &str, tool: &str, fingerprint: &str) -> String {
        crate::sql::duplicate_lock_request(tenant, tool, fingerprint)
    }
    /// The duplicate-intent check, planned for its values.
    pub const DUPLICATE: &str = crate::sql::DUPLICATE;
    /// The due scan's first page and later pages, planned for their values.
    pub const DUE: &str = crate::sql::DUE;
    pub const DUE_AFTER: &str = crate::sql::DUE_AFTER;
    /// One sweep of one environment, planned for its values.
    pub const SWEEP: &str = crate::sql::SWEEP;
    /// The listing statement for the filters present (tenant, environment, status, tool,
    /// after), planned for its values.
    pub fn list(tenant: bool, environment: bool, status: bool, tool: bool, after: bool) -> String {
        crate::sql::list(tenant, environment, status, tool, after)
    }
    /// The planner settings every store connection starts with, for tests that inspect the
    /// plans those connections get.
    pub const PLANNER_SETTINGS: &[(&str, &str)] = crate::PLANNER_SETTINGS;
}

/// The value of the run-time parameter `name` on a connection of each pool `store` holds: the
/// main pool's first, then the batch pool's when batching is on. For tests that check what
/// the store pins on its connections, whatever the server's or the database's defaults.
pub async fn settings(
    store: &PgStore,
    name: &str,
) -> Result<Vec<String>, idemgate_core::store::Error> {
    let mut pools = vec![&store.pool];
    if let Some(batcher) = &store.batcher {
        pools.push(batcher.pool());
    }
    let mut values = Vec::with_capacity(pools.len());
    for pool in pools {
        let mut conn = crate::conn::checkout(pool, store.deadline).await?;
        let rows = conn
            .run(
                crate::conn::Kind::Read,
                "SELECT current_setting($1)",
                &[&name],
            )
            .await?;
        let value = rows
            .first()
            .and_then(|r| r.try_get::<_, String>(0).ok())
            .unwrap_or_default();
        values.push(value);
    }
    Ok(values)
}

/// The administrative connection string tests read.
pub const DATABASE_URL: &str = "DATABASE_URL";
/// Set to `1` to turn every skip into a failure.
pub const REQUIRE_POSTGRES: &str = "IDEMGATE_REQUIRE_POSTGRES";

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A database that exists for one test and is dropped afterwards.
#[derive(Debug)]
pub struct TestDatabase {
    url: String,
    admin_url: String,
    name: String,
    dropped: bool,
}

/// Creates a fresh, empty database, or returns `None` after printing why the test is skipped.
/// Panics instead of skipping when `IDEMGATE_REQUIRE_POSTGRES=1`.
pub async fn fresh_database() -> Option<TestDatabase> {
    let admin_url = match std::env::var(DATABASE_URL) {
        Ok(url) if !url.trim().is_empty() => url,
        _ => return skip("DATABASE_URL is not set"),
    };
    let admin = match admin_client(&admin_url).await {
        Ok(client) => client,
        Err(e) => return skip(&format!("cannot connect through DATABASE_URL ({e})")),
    };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name = format!(
        "idemgate_test_{}_{:08x}_{}",
        std::process::id(),
        nanos,
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    // The name is made of digits, letters and underscores only, so quoting it is enough.
    if let Err(e) = admin
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await
    {
        return skip(&format!("cannot create a test database ({e})"));
    }
    let url = with_database(&admin_url, &name);
    Some(TestDatabase {
        url,
        admin_url,
        name,
        dropped: false,
    })
}

fn skip(reason: &str) -> Option<TestDatabase> {
    if std::env::var(REQUIRE_POSTGRES).as_deref() == Ok("1") {
        panic!("PostgreSQL is required ({REQUIRE_POSTGRES}=1) but {reason}");
    }
    // Written to the stderr handle rather than with `eprintln!`, which the test harness
    // captures and hides for a passing test: a skip must be seen.
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED (PostgreSQL): {reason} — this test did not run"
    );
    None
}

async fn admin_client(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config: tokio_postgres::Config = url.parse()?;
    config.connect_timeout(Duration::from_secs(5));
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        // The connection ends when the client is dropped; its error, if any, is the test's
        // business only through the client's own calls.
        let _ = connection.await;
    });
    Ok(client)
}

/// `admin_url` with its database replaced by `name`, for both URL and `key=value` forms.
fn with_database(admin_url: &str, name: &str) -> String {
    for scheme in ["postgres://", "postgresql://"] {
        if let Some(rest) = admin_url.strip_prefix(scheme) {
            let (body, query) = match rest.split_once('?') {
                Some((body, query)) => (body, Some(query)),
                None => (rest, None),
            };
            let authority = body
                .split_once('/')
                .map_or(body, |(authority, _)| authority);
            let mut url = format!("{scheme}{authority}/{name}");
            if let Some(query) = query {
                url.push('?');
                url.push_str(query);
            }
            return url;
        }
    }
    // In the key=value form a later setting overrides an earlier one.
    format!("{admin_url} dbname={name}")
}

impl TestDatabase {
    /// The connection string of the fresh database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A store connected to the fresh database with default options (migrations applied).
    pub async fn store(&self) -> PgStore {
        self.store_with(Options::default()).await
    }

    /// A store connected with `options`.
    pub async fn store_with(&self, options: Options) -> PgStore {
        PgStore::connect(&self.url, options)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to test database {}: {e}", self.name))
    }

    /// Empties the store's tables, for suites that reuse one database across cases.
    pub async fn truncate(&self) {
        let client = admin_client(&self.url)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to test database {}: {e}", self.name));
        client
            .batch_execute(
                "TRUNCATE operations, webhook_events, audit_log RESTART IDENTITY; \
                 UPDATE audit_head SET seq = 0, hash = repeat('0', 64)",
            )
            .await
            .unwrap_or_else(|e| panic!("cannot truncate test database {}: {e}", self.name));
    }

    /// A plain client of the fresh database, for tests that change its schema (a trigger).
    pub async fn client(&self) -> tokio_postgres::Client {
        admin_client(&self.url)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to test database {}: {e}", self.name))
    }

    /// Drops the database now (ending its connections), instead of when dropped.
    pub async fn drop_now(mut self) {
        self.dropped = true;
        if let Err(e) = drop_database(&self.admin_url, &self.name).await {
            eprintln!("could not drop test database {}: {e}", self.name);
        }
    }
}

async fn drop_database(admin_url: &str, name: &str) -> Result<(), tokio_postgres::Error> {
    let admin = admin_client(admin_url).await?;
    // FORCE ends the connections a test's pool still holds (PostgreSQL 13 and later).
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .await
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        // `Drop` cannot await, and may run inside a runtime that must not be blocked on, so the
        // drop runs on a thread with a runtime of its own; joining it keeps the database from
        // outliving the test process.
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        let worker = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match runtime {
                Ok(runtime) => {
                    if let Err(e) = runtime.block_on(drop_database(&admin_url, &name)) {
                        eprintln!("could not drop test database {name}: {e}");
                    }
                }
                Err(e) => eprintln!("could not drop test database {name}: {e}"),
            }
        });
        let _ = worker.join();
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_name_replaces_the_admin_one() {
        let check = |admin: &str, expect: &str| assert_eq!(with_database(admin, "t1"), expect);
        check(
            "postgres://postgres@127.0.0.1:5432/postgres",
            "postgres://postgres@127.0.0.1:5432/t1",
        );
        check(
            "postgres://u:p@h/db?sslmode=disable",
            "postgres://u:p@h/t1?sslmode=disable",
        );
        check("postgresql://h:5432", "postgresql://h:5432/t1");
        check(
            "postgres://h?connect_timeout=3",
            "postgres://h/t1?connect_timeout=3",
        );
        check(
            "host=127.0.0.1 user=postgres",
            "host=127.0.0.1 user=postgres dbname=t1",
        );
    }
}
