//! Versioned migrations of our own, tracked by `PRAGMA user_version`.
//!
//! Migration crates pin database-driver versions, and ours are a handful of `.sql` files: each
//! is embedded at compile time and applied once, in order, in its own transaction, and the
//! version it brings the file to is written in the same transaction, so a crash mid-migration
//! leaves the file at the previous version, never between two.

use idemgate_core::store::Error;
use rusqlite::Connection;

use crate::error::Context;

/// Every migration, in order. Migration `i` (from 0) brings the file to version `i + 1`.
/// Append only: a released migration is never edited.
const MIGRATIONS: &[(&str, &str)] = &[
    ("0001_init", include_str!("../migrations/0001_init.sql")),
    (
        "0002_tenant_scoped_listing",
        include_str!("../migrations/0002_tenant_scoped_listing.sql"),
    ),
    (
        "0003_expiring_without_in_list",
        include_str!("../migrations/0003_expiring_without_in_list.sql"),
    ),
    (
        "0004_fewer_index_writes",
        include_str!("../migrations/0004_fewer_index_writes.sql"),
    ),
    (
        "0005_scans_by_environment",
        include_str!("../migrations/0005_scans_by_environment.sql"),
    ),
    (
        "0006_audit_log",
        include_str!("../migrations/0006_audit_log.sql"),
    ),
    (
        "0007_webhook_events",
        include_str!("../migrations/0007_webhook_events.sql"),
    ),
    (
        "0008_queue_by_environment",
        include_str!("../migrations/0008_queue_by_environment.sql"),
    ),
    (
        "0009_webhooks_bound_to_tools",
        include_str!("../migrations/0009_webhooks_bound_to_tools.sql"),
    ),
];

/// The schema version this code writes and understands.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

fn version(conn: &Connection) -> Result<i64, Error> {
    conn.pragma_query_value(None, "user_version", |r| r.get(0))
        .context(|| "reading the schema version".into())
}

fn refuse_newer(found: i64) -> Result<(), Error> {
    if found > SCHEMA_VERSION {
        // An older binary must not write a newer schema it does not understand: it could drop
        // columns' meaning on the floor. Upgrading idemgate is the fix, not a downgrade.
        return Err(Error::Unavailable(format!(
            "the database's schema version is {found}, newer than the {SCHEMA_VERSION} this \
             idemgate knows; upgrade idemgate to open it"
        )));
    }
    Ok(())
}

/// Brings the file to `SCHEMA_VERSION`, or refuses a newer one.
pub(crate) fn migrate(conn: &Connection) -> Result<(), Error> {
    let found = version(conn)?;
    refuse_newer(found)?;
    for (index, (name, sql)) in MIGRATIONS.iter().enumerate() {
        let target = index as i64 + 1;
        if target <= found {
            continue;
        }
        let what = || format!("applying migration {name}");
        // IMMEDIATE, and the version read again inside: two processes opening a new file at
        // once take turns, and the second finds the migration applied.
        conn.execute_batch("BEGIN IMMEDIATE").context(what)?;
        let applied = (|| {
            let now = version(conn)?;
            refuse_newer(now)?;
            if now >= target {
                return Ok(());
            }
            conn.execute_batch(sql).context(what)?;
            conn.pragma_update(None, "user_version", target)
                .context(what)
        })();
        match applied {
            Ok(()) => conn.execute_batch("COMMIT").context(what)?,
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(e);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use idemgate_core::key::OperationKey;
    use idemgate_core::record::{Event, EventKind, RecordState};
    use idemgate_core::store::Due;
    use rusqlite::{Connection, params};

    use super::{MIGRATIONS, SCHEMA_VERSION, migrate};
    use crate::read;

    #[test]
    fn the_trace_table_moves_into_the_rows_in_order() {
        // A file as version 3 left it: a record, its entries in a table of their own (appended
        // out of key order, one with a detail), and an entry whose record is gone.
        let conn = Connection::open_in_memory().expect("an in-memory database");
        for (_, sql) in &MIGRATIONS[..3] {
            conn.execute_batch(sql).expect("an old migration applies");
        }
        conn.pragma_update(None, "user_version", 3)
            .expect("the version is set");
        conn.execute(
            "INSERT INTO operations (tenant, key, tool, tool_version, fingerprint, \
             canonicalization, status, fence, actor, created_at, updated_at, expires_at, \
             purge_at) VALUES ('acme', ?1, 't', '1', 'sha256:00', 1, 'unknown', 2, 'a', 1, 1, \
             9, 9)",
            ["acme:prod:wf:one"],
        )
        .expect("a version-3 row");
        let entries = [
            ("acme:prod:wf:one", "claimed", 10, 1, None),
            ("acme:prod:wf:gone", "claimed", 11, 1, None),
            (
                "acme:prod:wf:one",
                "sent",
                12,
                1,
                Some("line one\nline \"two\""),
            ),
            ("acme:prod:wf:one", "unknown", 13, 2, None),
        ];
        for (key, kind, at, attempt, detail) in entries {
            conn.execute(
                "INSERT INTO events (tenant, key, kind, at, attempt, worker, detail) \
                 VALUES ('acme', ?1, ?2, ?3, ?4, 'w1', ?5)",
                params![key, kind, at, attempt, detail],
            )
            .expect("a version-3 entry");
        }

        migrate(&conn).expect("the file is brought up to date");

        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .expect("the version reads");
        assert_eq!(version, SCHEMA_VERSION);
        let key = OperationKey::parse("acme:prod:wf:one").expect("a valid key");
        assert_eq!(
            read::events(&conn, &key).expect("the trace reads"),
            vec![
                Event::new(EventKind::Claimed, 10, 1, "w1"),
                Event::new(EventKind::Sent, 12, 1, "w1").with_detail("line one\nline \"two\""),
                Event::new(EventKind::Unknown, 13, 2, "w1"),
            ]
        );
        // Claimed before the flag was kept: still found by the duplicate-intent lookup.
        let watched: bool = conn
            .query_row(
                "SELECT intent_window FROM operations WHERE key = ?1",
                [key.as_str()],
                |r| r.get(0),
            )
            .expect("the flag reads");
        assert!(watched);
        let gone = OperationKey::parse("acme:prod:wf:gone").expect("a valid key");
        assert_eq!(read::events(&conn, &gone).expect("no trace"), vec![]);
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'events'",
                [],
                |r| r.get(0),
            )
            .expect("the schema reads");
        assert_eq!(tables, 0, "the entries table is gone");
    }

    #[test]
    fn awaiting_approvals_get_their_deadline_and_keys_their_environment() {
        // A file as version 4 left it: an approval that expired by compaction at `expires_at`
        // (no deadline of its own), a pending record, and records of another environment.
        let conn = Connection::open_in_memory().expect("an in-memory database");
        for (_, sql) in &MIGRATIONS[..4] {
            conn.execute_batch(sql).expect("an old migration applies");
        }
        conn.pragma_update(None, "user_version", 4)
            .expect("the version is set");
        let rows = [
            (
                "acme:prod:wf:waiting",
                "awaiting_approval",
                None,
                None,
                5_000,
            ),
            (
                "acme:prod:wf:pending",
                "pending",
                Some(4_000),
                Some("not_sent"),
                9_000,
            ),
            (
                "acme:staging:wf:waiting",
                "awaiting_approval",
                None,
                None,
                1_000,
            ),
            ("zeta:prod:wf:done", "applied", None, None, 1_000),
        ];
        for (key, status, lease, dispatch, expires_at) in rows {
            conn.execute(
                "INSERT INTO operations (tenant, key, tool, tool_version, fingerprint, \
                 canonicalization, status, fence, lease_owner, lease_expires_at, dispatch, \
                 effect_reference, actor, created_at, updated_at, expires_at, purge_at) \
                 VALUES (substr(?1, 1, instr(?1, ':') - 1), ?1, 't', '1', ?6, 1, ?2, 1, 'w1', \
                 ?3, ?4, CASE ?2 WHEN 'applied' THEN 'ref-1' END, 'a', 1, 1, ?5, ?5)",
                params![
                    key,
                    status,
                    lease,
                    dispatch,
                    expires_at,
                    format!("sha256:{}", "0".repeat(64))
                ],
            )
            .expect("a version-4 row");
        }

        migrate(&conn).expect("the file is brought up to date");

        let environments: Vec<(String, String)> = conn
            .prepare("SELECT key, environment FROM operations ORDER BY key")
            .expect("the query prepares")
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("the query runs")
            .collect::<rusqlite::Result<_>>()
            .expect("the rows read");
        let expected = [
            ("acme:prod:wf:pending", "prod"),
            ("acme:prod:wf:waiting", "prod"),
            ("acme:staging:wf:waiting", "staging"),
            ("zeta:prod:wf:done", "prod"),
        ];
        assert_eq!(
            environments,
            expected.map(|(k, e)| (k.to_string(), e.to_string()))
        );
        let waiting = OperationKey::parse("acme:prod:wf:waiting").expect("a valid key");
        let record = read::get(&conn, &waiting)
            .expect("the record reads")
            .expect("the record is there");
        assert_eq!(record.state, RecordState::AwaitingApproval { until: 5_000 });
        // The recoverer finds the approval at its deadline, in deadline order with the pending
        // record, and only in its own environment.
        let due = |environment: &str, now| {
            read::due(
                &conn,
                &Due {
                    environment: environment.into(),
                    now,
                    after: None,
                    limit: 10,
                },
            )
            .expect("the scan runs")
            .into_iter()
            .map(|r| r.key.to_string())
            .collect::<Vec<_>>()
        };
        assert_eq!(due("prod", 4_999), ["acme:prod:wf:pending"]);
        assert_eq!(
            due("prod", 5_000),
            ["acme:prod:wf:pending", "acme:prod:wf:waiting"]
        );
        assert_eq!(due("staging", 5_000), ["acme:staging:wf:waiting"]);
    }
}
