//! The audit log's tables (migration 0005): `audit_log`, and `audit_head`, the one row every
//! appender locks, so that gateways sharing the database append one after the other.

use idemgate_core::audit::{Draft, Entry, Head, Sealer, hex, hex_array};
use idemgate_core::store;

use crate::conn::{Conn, Kind};

/// Locks the head until the appender's transaction ends; READ COMMITTED re-reads the row once
/// the lock is granted, so a waiter sees the head the previous appender committed.
const HEAD: &str = "SELECT seq, hash FROM audit_head WHERE id = 1 FOR UPDATE";

const INSERT: &str = "INSERT INTO audit_log (seq, at, tenant, environment, operation_key, tool, \
    action, actor, reason, fingerprint, status, reference, prev_hash, hash, public_key, signature) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)";

const MOVE_HEAD: &str = "UPDATE audit_head SET seq = $1, hash = $2 WHERE id = 1";

const AFTER: &str = "SELECT seq, at, tenant, environment, operation_key, tool, action, actor, \
    reason, fingerprint, status, reference, prev_hash, hash, public_key, signature \
    FROM audit_log WHERE seq > $1 ORDER BY seq LIMIT $2";

/// Seals `draft` after the locked head and writes it, inside the caller's open transaction.
pub(crate) async fn append(
    conn: &mut Conn,
    draft: &Draft,
    sealer: &Sealer,
) -> Result<Entry, store::Error> {
    let rows = conn.run(Kind::Write, HEAD, &[]).await?;
    let row = rows.first().ok_or_else(|| {
        store::Error::Corrupt("the audit log's head row is missing (migration 0005)".into())
    })?;
    let seq: i64 = row.get(0);
    let hash: String = row.get(1);
    let head = Head {
        seq: u64::try_from(seq)
            .map_err(|_| store::Error::Corrupt(format!("the audit head's seq is {seq}")))?,
        hash: hex_array::<32>(&hash)
            .ok_or_else(|| store::Error::Corrupt(format!("the audit head's hash is {hash:?}")))?,
    };
    let e = sealer.seal(draft, head);
    let seq = seq + 1;
    conn.run(
        Kind::Write,
        INSERT,
        &[
            &seq,
            &e.at,
            &e.tenant,
            &e.environment,
            &e.operation_key,
            &e.tool,
            &e.action,
            &e.actor,
            &e.reason,
            &e.fingerprint,
            &e.status,
            &e.reference,
            &e.prev_hash,
            &e.hash,
            &e.public_key,
            &e.signature,
        ],
    )
    .await?;
    debug_assert_eq!(hex(&e.head().expect("sealed here").hash), e.hash);
    conn.run(Kind::Write, MOVE_HEAD, &[&seq, &e.hash]).await?;
    Ok(e)
}

/// Entries after `after`, oldest first, at most `limit` (a page of 1000 when 0).
pub(crate) async fn after(
    conn: &mut Conn,
    after: u64,
    limit: usize,
) -> Result<Vec<Entry>, store::Error> {
    let limit = if limit == 0 { 1000 } else { limit };
    let after = i64::try_from(after).unwrap_or(i64::MAX);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = conn.run(Kind::Read, AFTER, &[&after, &limit]).await?;
    rows.iter()
        .map(|r| {
            let seq: i64 = r.get(0);
            Ok(Entry {
                seq: u64::try_from(seq)
                    .map_err(|_| store::Error::Corrupt(format!("audit seq {seq}")))?,
                at: r.get(1),
                tenant: r.get(2),
                environment: r.get(3),
                operation_key: r.get(4),
                tool: r.get(5),
                action: r.get(6),
                actor: r.get(7),
                reason: r.get(8),
                fingerprint: r.get(9),
                status: r.get(10),
                reference: r.get(11),
                prev_hash: r.get(12),
                hash: r.get(13),
                public_key: r.get(14),
                signature: r.get(15),
            })
        })
        .collect()
}
