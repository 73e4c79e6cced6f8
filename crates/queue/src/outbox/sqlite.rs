//! The outbox in the application's SQLite database (rusqlite).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, Transaction, params};

use super::{Entry, Error, Parked, checked, now_millis};
use crate::envelope::{Envelope, Limits};

/// The outbox table and its index (`sql/outbox.sqlite.sql`), and the table of parked entries
/// (`sql/outbox_parked.sqlite.sql`). Idempotent.
pub const DDL: &str = concat!(
    include_str!("../../sql/outbox.sqlite.sql"),
    include_str!("../../sql/outbox_parked.sqlite.sql")
);

/// Creates the outbox table if it does not exist.
pub fn install(conn: &Connection) -> Result<(), Error> {
    conn.execute_batch(DDL)?;
    Ok(())
}

/// Writes `envelope` into the outbox inside the application's transaction `tx`: it commits
/// with the business write, or not at all. Returns the entry's row id. An envelope a consumer
/// with the default limits (256 KiB, depth 32) would refuse is refused here, nothing written.
pub fn enqueue(tx: &Transaction<'_>, envelope: &Envelope) -> Result<i64, Error> {
    enqueue_within(tx, envelope, Limits::default())
}

/// [`enqueue`] for a consumer configured with other `[limits]`.
pub fn enqueue_within(
    tx: &Transaction<'_>,
    envelope: &Envelope,
    limits: Limits,
) -> Result<i64, Error> {
    let text = checked(envelope, limits)?;
    tx.execute(
        "INSERT INTO idemgate_outbox (workflow_id, step_id, tool, envelope, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            envelope.workflow_id,
            envelope.step_id,
            envelope.tool,
            text,
            now_millis()
        ],
    )?;
    Ok(tx.last_insert_rowid())
}

/// A publisher's view of an SQLite outbox: its own connection to the application's file.
#[derive(Clone)]
pub struct SqliteOutbox {
    path: PathBuf,
    // A std mutex: each use is one short statement, never held across an await.
    conn: Arc<Mutex<Connection>>,
}

impl SqliteOutbox {
    /// Opens the application's database at `path` and makes sure the table exists. The
    /// application keeps writing through its own connections meanwhile (WAL is advised).
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteOutbox, Error> {
        let path = path.as_ref().to_path_buf();
        let conn = Connection::open(&path)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        install(&conn)?;
        Ok(SqliteOutbox {
            path,
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Up to `limit` unsent entries, oldest first.
    pub fn unsent(&self, limit: usize) -> Result<Vec<Entry>, Error> {
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(
            "SELECT id, envelope, attempts FROM idemgate_outbox o
             WHERE sent_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM idemgate_outbox_parked p WHERE p.id = o.id)
             ORDER BY id LIMIT ?1",
        )?;
        let rows = stmt.query_map([limit as i64], |r| {
            Ok(Entry {
                id: r.get(0)?,
                envelope: r.get(1)?,
                attempts: r.get(2)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Counts a publication of `ids` before it starts (telemetry: how often rows went out).
    pub fn count_attempt(&self, ids: &[i64]) -> Result<(), Error> {
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        for id in ids {
            tx.execute(
                "UPDATE idemgate_outbox SET attempts = attempts + 1 WHERE id = ?1",
                [id],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Parks entry `id`: never offered again, kept with `reason`.
    pub fn park(&self, id: i64, reason: &str) -> Result<(), Error> {
        self.lock().execute(
            "INSERT INTO idemgate_outbox_parked (id, reason, parked_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (id) DO NOTHING",
            params![id, reason, now_millis()],
        )?;
        Ok(())
    }

    /// Every parked entry, oldest first.
    pub fn parked(&self) -> Result<Vec<Parked>, Error> {
        let conn = self.lock();
        let mut stmt =
            conn.prepare_cached("SELECT id, reason FROM idemgate_outbox_parked ORDER BY id")?;
        let rows = stmt.query_map([], |r| {
            Ok(Parked {
                id: r.get(0)?,
                reason: r.get(1)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Marks `ids` sent, in one transaction.
    pub fn mark_sent(&self, ids: &[i64]) -> Result<(), Error> {
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        let now = now_millis();
        for id in ids {
            tx.execute(
                "UPDATE idemgate_outbox SET sent_at = ?1 WHERE id = ?2 AND sent_at IS NULL",
                params![now, id],
            )?;
        }
        tx.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(step: &str) -> Envelope {
        Envelope {
            workflow_id: "order_1".into(),
            step_id: step.into(),
            tool: "email.send".into(),
            arguments: serde_json::json!({"to": "a@b.c"}),
            actor: None,
        }
    }

    #[test]
    fn an_entry_commits_or_rolls_back_with_the_business_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.db");
        let mut conn = Connection::open(&path).unwrap();
        install(&conn).unwrap();
        conn.execute_batch("CREATE TABLE orders (id TEXT PRIMARY KEY)")
            .unwrap();

        let tx = conn.transaction().unwrap();
        tx.execute("INSERT INTO orders VALUES ('kept')", [])
            .unwrap();
        enqueue(&tx, &envelope("kept")).unwrap();
        tx.commit().unwrap();

        let tx = conn.transaction().unwrap();
        tx.execute("INSERT INTO orders VALUES ('dropped')", [])
            .unwrap();
        enqueue(&tx, &envelope("dropped")).unwrap();
        tx.rollback().unwrap();

        let outbox = SqliteOutbox::open(&path).unwrap();
        let unsent = outbox.unsent(10).unwrap();
        assert_eq!(unsent.len(), 1);
        let read = Envelope::parse(unsent[0].envelope.as_bytes(), Default::default()).unwrap();
        assert_eq!(read, envelope("kept"));
        outbox.mark_sent(&[unsent[0].id]).unwrap();
        assert!(outbox.unsent(10).unwrap().is_empty());
    }

    /// Regression (issue 31): an envelope over the consumer's 256 KiB (or too deep) was
    /// accepted, and the consumer terminated it after the business write committed.
    #[test]
    fn an_envelope_the_consumer_would_refuse_is_refused_in_the_transaction() {
        let mut conn = Connection::open_in_memory().unwrap();
        install(&conn).unwrap();
        conn.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
            .unwrap();
        let tx = conn.transaction().unwrap();
        tx.execute("INSERT INTO orders VALUES (1)", []).unwrap();
        let mut big = envelope("big");
        big.arguments = serde_json::json!({"to": "a@b.c", "body": "x".repeat(256 * 1024)});
        let e = enqueue(&tx, &big).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("the outbox entry would be refused by its consumer: the envelope is "),
            "{e}"
        );
        assert!(
            e.to_string()
                .ends_with("more than the 262144 this consumer reads"),
            "{e}"
        );
        let mut deep = envelope("deep");
        for _ in 0..40 {
            deep.arguments = serde_json::json!([deep.arguments]);
        }
        let e = enqueue(&tx, &deep).unwrap_err();
        assert!(e.to_string().contains("deep"), "{e}");
        // Within the bound, the same entry is accepted.
        let mut fits = envelope("fits");
        fits.arguments = serde_json::json!({"body": "x".repeat(200 * 1024)});
        enqueue(&tx, &fits).unwrap();
        tx.commit().unwrap();
        let outbox: Vec<String> = conn
            .prepare("SELECT step_id FROM idemgate_outbox")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(outbox, ["fits"]);
        // A larger configured bound lets the big one through.
        let tx = conn.transaction().unwrap();
        let generous = Limits {
            max_bytes: 1024 * 1024,
            ..Limits::default()
        };
        enqueue_within(&tx, &big, generous).unwrap();
    }

    #[test]
    fn an_entry_without_a_step_is_refused_before_it_is_written() {
        let mut conn = Connection::open_in_memory().unwrap();
        install(&conn).unwrap();
        let tx = conn.transaction().unwrap();
        let e = enqueue(&tx, &envelope("")).unwrap_err();
        assert_eq!(e.to_string(), "the outbox entry names no step_id");
    }
}
