//! `LedgerDownstream`: a fake system of record whose effects live in a SQLite file of its own.
//!
//! Crash tests kill worker processes with SIGKILL; the effects those processes caused must be
//! counted somewhere that survives them and that the executor never writes. Each committed
//! effect is a row in the ledger file, written by the downstream side only, so the test counts
//! effects there — not through the executor's records.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemgate_core::effect::{Downstream, EffectOutcome, EffectRequest, JobStatus, Lookup};
use idemgate_core::key::OperationKey;
use idemgate_core::record::Receipt;
use idemgate_core::store::BoxFuture;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::json;

/// Called right after an effect is committed, before the answer leaves: a crash test makes it
/// announce itself and wait to be killed.
pub type AfterCommit = Arc<dyn Fn(&OperationKey) + Send + Sync>;

pub struct LedgerDownstream {
    path: PathBuf,
    conn: Mutex<Connection>,
    deduplicates: bool,
    receipt_lookup: bool,
    after_commit: Option<AfterCommit>,
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    const PATIENCE: Duration = Duration::from_secs(30);
    let conn = Connection::open(path)?;
    conn.busy_timeout(PATIENCE)?;
    // Several processes may open a new ledger at the same moment. Switching a new file to WAL
    // takes an exclusive lock, and SQLite answers "busy" at once, without its busy handler,
    // when waiting could deadlock — so the set-up is retried here, boundedly.
    let started = Instant::now();
    loop {
        match set_up(&conn) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && started.elapsed() < PATIENCE =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other.map(|()| conn),
        }
    }
}

fn set_up(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS effects (
             seq INTEGER PRIMARY KEY AUTOINCREMENT,
             key TEXT NOT NULL,
             reference TEXT NOT NULL,
             at_ms INTEGER NOT NULL
         );
         CREATE INDEX IF NOT EXISTS effects_key ON effects(key);",
    )
}

impl LedgerDownstream {
    pub fn open(
        path: impl AsRef<Path>,
        deduplicates: bool,
        receipt_lookup: bool,
    ) -> rusqlite::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let conn = open(&path)?;
        Ok(LedgerDownstream {
            path,
            conn: Mutex::new(conn),
            deduplicates,
            receipt_lookup,
            after_commit: None,
        })
    }

    pub fn with_after_commit(mut self, hook: AfterCommit) -> Self {
        self.after_commit = Some(hook);
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every effect the ledger holds, counted on the downstream's side.
    pub fn effects(path: impl AsRef<Path>) -> rusqlite::Result<u64> {
        let conn = open(path.as_ref())?;
        conn.query_row("SELECT count(*) FROM effects", [], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
    }

    /// Effects per key: `(key, count)` for every key with at least one effect.
    pub fn effects_by_key(path: impl AsRef<Path>) -> rusqlite::Result<Vec<(String, u64)>> {
        let conn = open(path.as_ref())?;
        let mut stmt =
            conn.prepare("SELECT key, count(*) FROM effects GROUP BY key ORDER BY key")?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
        })?;
        rows.collect()
    }

    fn find(conn: &Connection, key: &str) -> rusqlite::Result<Option<String>> {
        conn.query_row(
            "SELECT reference FROM effects WHERE key = ?1 ORDER BY seq LIMIT 1",
            [key],
            |r| r.get(0),
        )
        .optional()
    }

    fn receipt(key: &OperationKey, reference: String) -> Receipt {
        Receipt {
            result: json!({ "ticket_id": reference, "operation_key": key.as_str() }),
            reference,
        }
    }

    fn commit(&self, key: &OperationKey) -> rusqlite::Result<String> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        // IMMEDIATE: the dedup check and the insert are one decision, even across processes.
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        if self.deduplicates
            && let Some(existing) = Self::find(&tx, key.as_str())?
        {
            return Ok(existing);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or_default();
        tx.execute(
            "INSERT INTO effects (key, reference, at_ms) VALUES (?1, '', ?2)",
            params![key.as_str(), now],
        )?;
        let seq = tx.last_insert_rowid();
        let reference = format!("ticket_{seq}");
        tx.execute(
            "UPDATE effects SET reference = ?1 WHERE seq = ?2",
            params![reference, seq],
        )?;
        tx.commit()?;
        Ok(reference)
    }
}

impl Downstream for LedgerDownstream {
    fn perform<'a>(&'a self, request: EffectRequest<'a>) -> BoxFuture<'a, EffectOutcome> {
        Box::pin(async move {
            match self.commit(request.key) {
                Ok(reference) => {
                    if let Some(hook) = &self.after_commit {
                        hook(request.key);
                    }
                    EffectOutcome::Committed(Self::receipt(request.key, reference))
                }
                // The ledger could not commit: nothing happened on the downstream's side.
                Err(e) => EffectOutcome::NotSent {
                    reason: format!("ledger unavailable: {e}"),
                    retry_after: Some(1),
                },
            }
        })
    }

    fn lookup_receipt<'a>(&'a self, key: &'a OperationKey) -> BoxFuture<'a, Lookup> {
        Box::pin(async move {
            if !self.receipt_lookup {
                return Lookup::Unavailable("this downstream offers no receipt lookup".into());
            }
            let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
            match Self::find(&conn, key.as_str()) {
                Ok(Some(reference)) => Lookup::Found(Self::receipt(key, reference)),
                Ok(None) => Lookup::NotFound,
                Err(e) => Lookup::Unavailable(e.to_string()),
            }
        })
    }

    fn poll_job<'a>(
        &'a self,
        _key: &'a OperationKey,
        _job_id: &'a str,
    ) -> BoxFuture<'a, JobStatus> {
        Box::pin(std::future::ready(JobStatus::Unavailable(
            "the ledger runs no jobs".into(),
        )))
    }
}
