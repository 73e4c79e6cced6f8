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
    (
        "0010_operations_by_rowid",
        include_str!("../migrations/0010_operations_by_rowid.sql"),
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
    migrate_to(conn, SCHEMA_VERSION)
}

/// Brings the file to `last` (at most `SCHEMA_VERSION`), or refuses a newer one than it knows.
pub(crate) fn migrate_to(conn: &Connection, last: i64) -> Result<(), Error> {
    let found = version(conn)?;
    refuse_newer(found)?;
    let last = usize::try_from(last.clamp(0, SCHEMA_VERSION)).unwrap_or(0);
    for (index, (name, sql)) in MIGRATIONS[..last].iter().enumerate() {
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

    use super::{SCHEMA_VERSION, migrate, migrate_to};
    use crate::read;

    #[test]
    fn the_trace_table_moves_into_the_rows_in_order() {
        // A file as version 3 left it: a record, its entries in a table of their own (appended
        // out of key order, one with a detail), and an entry whose record is gone.
        let conn = Connection::open_in_memory().expect("an in-memory database");
        migrate_to(&conn, 3).expect("the old migrations apply");
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
        migrate_to(&conn, 4).expect("the old migrations apply");
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

    /// Every column of every row, the virtual `environment` included, in key order.
    fn all_rows(conn: &Connection) -> Vec<Vec<rusqlite::types::Value>> {
        let mut stmt = conn
            .prepare("SELECT *, environment FROM operations ORDER BY tenant, key")
            .expect("the query prepares");
        let columns = stmt.column_count();
        stmt.query_map([], |r| {
            (0..columns)
                .map(|i| r.get::<_, rusqlite::types::Value>(i))
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .expect("the query runs")
        .collect::<rusqlite::Result<_>>()
        .expect("the rows read")
    }

    /// The definitions of the operations table's own indexes, by name.
    fn index_definitions(conn: &Connection) -> Vec<(String, String)> {
        conn.prepare(
            "SELECT name, sql FROM sqlite_schema WHERE type = 'index' AND tbl_name = \
             'operations' AND sql IS NOT NULL ORDER BY name",
        )
        .expect("the query prepares")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("the query runs")
        .collect::<rusqlite::Result<_>>()
        .expect("the schema reads")
    }

    #[test]
    fn the_operations_table_is_rebuilt_with_every_row_and_index_as_it_was() {
        // A file as version 9 left it: records of every status, in two tenants and two
        // environments, with and without a job, a request, a trace, a duplicate-intent window.
        let conn = Connection::open_in_memory().expect("an in-memory database");
        migrate_to(&conn, 9).expect("the old migrations apply");
        let statuses = [
            "pending",
            "applied",
            "awaiting_approval",
            "failed_permanent",
            "unknown",
            "tombstone",
        ];
        let mut keys = Vec::new();
        for (i, status) in statuses.iter().enumerate() {
            for (tenant, environment) in [("acme", "prod"), ("acme", "staging"), ("zeta", "prod")] {
                let key = format!("{tenant}:{environment}:wf-{i}:step");
                let job = (i % 2 == 0).then(|| format!("job-{i}"));
                conn.execute(
                    "INSERT INTO operations (tenant, key, tool, tool_version, fingerprint, \
                     canonicalization, status, fence, lease_owner, lease_expires_at, dispatch, \
                     job_id, effect_reference, result, error_code, error_message, actor, \
                     request, approved_by, created_at, updated_at, expires_at, purge_at, \
                     intent_window, trace) VALUES (?1, ?2, 'tickets.create', '3', ?3, 1, ?4, \
                     ?5, 'w1', ?6, CASE WHEN ?7 IS NULL THEN 'sent' ELSE 'job' END, ?7, \
                     CASE ?4 WHEN 'failed_permanent' THEN NULL ELSE 'ref-1' END, \
                     '{\"id\":1}', CASE ?4 WHEN 'failed_permanent' THEN 'downstream_rejected' \
                     END, CASE ?4 WHEN 'failed_permanent' THEN 'no' END, 'agent', '{\"a\":1}', 'op', ?5, \
                     ?6, ?8, ?9, ?10, ?11)",
                    params![
                        tenant,
                        key,
                        format!("sha256:{}", format!("{i:x}").repeat(64)),
                        status,
                        i as i64 + 1,
                        1_000 + i as i64,
                        job,
                        90_000 + i as i64,
                        180_000 + i as i64,
                        (i % 2) as i64,
                        format!("[\"claimed\",{i},1,\"w1\",null]\n"),
                    ],
                )
                .expect("a version-9 row");
                keys.push(OperationKey::parse(&key).expect("a valid key"));
            }
        }
        let rows = all_rows(&conn);
        let records: Vec<_> = keys
            .iter()
            .map(|k| read::get(&conn, k).expect("the record reads"))
            .collect();
        let indexes = index_definitions(&conn);
        assert_eq!(indexes.len(), 8, "{indexes:?}");

        migrate(&conn).expect("the file is brought up to date");

        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .expect("the version reads");
        assert_eq!(version, SCHEMA_VERSION);
        assert_eq!(all_rows(&conn), rows);
        let after: Vec<_> = keys
            .iter()
            .map(|k| read::get(&conn, k).expect("the record reads"))
            .collect();
        assert_eq!(after, records);
        assert!(after.iter().all(Option::is_some));
        // The same indexes, word for word but the duplicate-intent one, which now names the key
        // its lookup is ordered by; every one of them holding what the table holds.
        let expected: Vec<(String, String)> = indexes
            .into_iter()
            .map(|(name, sql)| {
                let sql = sql.replace("fingerprint, created_at)", "fingerprint, created_at, key)");
                (name, sql)
            })
            .collect();
        assert_eq!(index_definitions(&conn), expected);
        assert!(expected[3].1.contains("created_at, key)"), "{expected:?}");
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .expect("the check runs");
        assert_eq!(check, "ok");
        let without_rowid: i64 = conn
            .query_row(
                "SELECT wr FROM pragma_table_list WHERE name = 'operations'",
                [],
                |r| r.get(0),
            )
            .expect("the table is listed");
        assert_eq!(without_rowid, 0, "a rowid table now");
        let leftovers: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE name LIKE '%rebuilt%'",
                [],
                |r| r.get(0),
            )
            .expect("the schema reads");
        assert_eq!(leftovers, 0);
        // The key still decides a claim: a second row under a taken key is refused.
        let duplicate = conn.execute(
            "INSERT INTO operations (tenant, key, tool, tool_version, fingerprint, \
             canonicalization, status, fence, actor, created_at, updated_at, expires_at, \
             purge_at) SELECT tenant, key, tool, tool_version, fingerprint, canonicalization, \
             status, fence, actor, created_at, updated_at, expires_at, purge_at FROM \
             operations LIMIT 1",
            [],
        );
        assert!(duplicate.is_err(), "a duplicate key was inserted");
    }
}
