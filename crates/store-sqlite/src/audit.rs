//! The audit log's table (migration 0006): entries appended inside the writer's transaction,
//! after the transition they record, and read back in sequence order for an export.
//!
//! The chain's head is the row with the highest `seq`. Every write transaction holds SQLite's
//! write lock (`BEGIN IMMEDIATE`, from this process's writer thread or another process's), so
//! reading the head and inserting after it is one step no other appender can come between.

use idemgate_core::audit::{Draft, Entry, Head, Sealer};
use idemgate_core::store::Error;
use rusqlite::{Connection, OptionalExtension, params};

use crate::error::Context;
use crate::writer::Tx;

const HEAD: &str = "SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1";

const INSERT: &str = "INSERT INTO audit_log (seq, at, tenant, environment, operation_key, tool, \
    action, actor, reason, fingerprint, status, reference, prev_hash, hash, public_key, signature) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)";

const AFTER: &str = "SELECT seq, at, tenant, environment, operation_key, tool, action, actor, \
    reason, fingerprint, status, reference, prev_hash, hash, public_key, signature \
    FROM audit_log WHERE seq > ?1 ORDER BY seq LIMIT ?2";

/// Seals `draft` after the chain's head and inserts it, in the caller's transaction.
pub(crate) fn append(tx: &mut Tx<'_>, draft: &Draft, sealer: &Sealer) -> Result<Entry, Error> {
    let what = || format!("appending the audit entry of {}", draft.key);
    let found: Option<(i64, String)> = tx
        .statement(HEAD)
        .context(what)?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .context(what)?;
    let head = match found {
        None => Head::GENESIS,
        Some((seq, hash)) => Head {
            seq: u64::try_from(seq)
                .map_err(|_| Error::Corrupt(format!("{}: audit seq {seq}", what())))?,
            hash: idemgate_core::audit::hex_array::<32>(&hash).ok_or_else(|| {
                Error::Corrupt(format!("{}: audit entry {seq} has hash {hash:?}", what()))
            })?,
        },
    };
    let e = sealer.seal(draft, head);
    let seq = i64::try_from(e.seq).map_err(|_| Error::Corrupt(format!("{}: seq", what())))?;
    tx.statement(INSERT)
        .context(what)?
        .execute(params![
            seq,
            e.at,
            e.tenant,
            e.environment,
            e.operation_key,
            e.tool,
            e.action,
            e.actor,
            e.reason,
            e.fingerprint,
            e.status,
            e.reference,
            e.prev_hash,
            e.hash,
            e.public_key,
            e.signature,
        ])
        .context(what)?;
    Ok(e)
}

/// Entries after `after`, oldest first, at most `limit` (a page of 1000 when 0).
pub(crate) fn after(conn: &Connection, after: u64, limit: usize) -> Result<Vec<Entry>, Error> {
    let what = || format!("reading the audit log after entry {after}");
    let limit = if limit == 0 { 1000 } else { limit };
    let after = i64::try_from(after).unwrap_or(i64::MAX);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut statement = conn.prepare_cached(AFTER).context(what)?;
    let rows = statement
        .query_map(params![after, limit], |r| {
            Ok(Entry {
                seq: r.get::<_, i64>(0)?.try_into().unwrap_or(0),
                at: r.get(1)?,
                tenant: r.get(2)?,
                environment: r.get(3)?,
                operation_key: r.get(4)?,
                tool: r.get(5)?,
                action: r.get(6)?,
                actor: r.get(7)?,
                reason: r.get(8)?,
                fingerprint: r.get(9)?,
                status: r.get(10)?,
                reference: r.get(11)?,
                prev_hash: r.get(12)?,
                hash: r.get(13)?,
                public_key: r.get(14)?,
                signature: r.get(15)?,
            })
        })
        .context(what)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().context(what)
}
