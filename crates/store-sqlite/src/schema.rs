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
