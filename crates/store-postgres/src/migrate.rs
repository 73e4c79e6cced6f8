//! Versioned schema migrations, embedded in the binary and applied once however many gateway
//! processes start at the same moment.

use idemgate_core::store;

use crate::conn::{self, Conn};

/// Every migration this build knows, in order; the version of each is its position plus one.
/// A migration is never edited once released: a change is a new file.
pub const MIGRATIONS: &[(&str, &str)] = &[
    ("0001_init", include_str!("../migrations/0001_init.sql")),
    (
        "0002_plan_safe_indexes",
        include_str!("../migrations/0002_plan_safe_indexes.sql"),
    ),
    (
        "0003_intent_window",
        include_str!("../migrations/0003_intent_window.sql"),
    ),
    (
        "0004_scans_by_environment",
        include_str!("../migrations/0004_scans_by_environment.sql"),
    ),
    (
        "0005_audit_log",
        include_str!("../migrations/0005_audit_log.sql"),
    ),
    (
        "0006_webhook_events",
        include_str!("../migrations/0006_webhook_events.sql"),
    ),
    (
        "0007_trace_in_row",
        include_str!("../migrations/0007_trace_in_row.sql"),
    ),
    (
        "0008_listing_indexes_without_the_hot_statuses",
        include_str!("../migrations/0008_listing_indexes_without_the_hot_statuses.sql"),
    ),
    (
        "0009_no_cross_tenant_or_tool_index",
        include_str!("../migrations/0009_no_cross_tenant_or_tool_index.sql"),
    ),
    (
        "0010_webhooks_bound_to_tools",
        include_str!("../migrations/0010_webhooks_bound_to_tools.sql"),
    ),
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// The advisory-lock key that serialises migrations: "idemgate" in ASCII. Other applications
/// sharing the database are unlikely to pick the same 64-bit number.
const MIGRATION_LOCK: i64 = 0x6964_656d_6761_7465;

/// Applies the migrations the database lacks, and refuses a database newer than this build.
///
/// Everything runs in one transaction that first takes a transaction-level advisory lock. A
/// second process starting at the same moment blocks on the lock until the first commits, then
/// reads the version the first wrote and finds nothing left to do (the transaction runs at READ
/// COMMITTED, where each statement takes a fresh snapshot, so the read after the lock sees the
/// first process's commit; under REPEATABLE READ the snapshot would predate it). The lock is released by the
/// commit or rollback itself, so a process that dies mid-migration cannot leave it held, and
/// PostgreSQL's transactional DDL means it cannot leave half a migration behind either.
pub(crate) async fn migrate(conn: &mut Conn) -> Result<i32, store::Error> {
    // A migration that fails rolls back whole, so "unavailable" is accurate: nothing changed.
    // Even a commit whose answer was lost is harmless here: running `migrate` again reads the
    // version and either finds the work done or does it.
    let failed = |e: tokio_postgres::Error| {
        store::Error::Unavailable(format!("migration failed: {}", conn::describe(&e)))
    };
    let client = conn.client_mut();
    let tx = client.transaction().await.map_err(failed)?;
    // The per-connection statement timeout is meant for the hot path; a later migration that
    // builds an index over millions of rows must not be cut short by it. Still bounded, so a
    // stuck migrator cannot block every other process's start for ever.
    tx.batch_execute("SET LOCAL statement_timeout = '15min'")
        .await
        .map_err(failed)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(failed)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS idemgate_schema_version (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(failed)?;
    let row = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM idemgate_schema_version",
            &[],
        )
        .await
        .map_err(failed)?;
    let current: i32 = row.get(0);
    if current > SCHEMA_VERSION {
        // An older build must not write to a schema it does not understand: a newer release
        // may have added a column or a state whose rules this build would break.
        return Err(store::Error::Unavailable(format!(
            "the database schema is at version {current}, newer than the {SCHEMA_VERSION} this \
             idemgate build knows; upgrade idemgate"
        )));
    }
    for (index, (name, sql)) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let version = index as i32 + 1;
        tx.batch_execute(sql).await.map_err(failed)?;
        tx.execute(
            "INSERT INTO idemgate_schema_version (version, name) VALUES ($1, $2)",
            &[&version, name],
        )
        .await
        .map_err(failed)?;
    }
    tx.commit().await.map_err(failed)?;
    Ok(SCHEMA_VERSION)
}
