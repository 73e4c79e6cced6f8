//! The writes, each run by the writer thread inside the batch's transaction. They never choose a
//! state: they persist the one they are given, conditionally. Each may run twice (the writer
//! starts a batch over when one command fails half way), so they only read their inputs — which
//! the caller's task prepares (`Claim`, `Update`, encoded trace entries), leaving the writer
//! thread only the binding and the stepping.

use idemgate_core::audit::{Draft, Sealer};
use idemgate_core::key::OperationKey;
use idemgate_core::outcome::ErrorCode;
use idemgate_core::record::{
    Digest, Event, EventKind, Millis, Record, RecordState, RecordStatus, Row, json_text,
};
use idemgate_core::store::{Cas, Error, RequestUpdate, Transition};
use rusqlite::types::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{OptionalExtension, ToSql, params, params_from_iter};

use crate::error::Context;
use crate::read::{self, columns, int, limit};
use crate::webhooks;
use crate::writer::Tx;
use idemgate_core::trace;

/// The worker named in the trace of a compaction.
pub const SWEEPER: &str = "sweeper";

pub(crate) const CLAIM: &str = concat!(
    "INSERT INTO operations (",
    columns!(),
    ", trace) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
     ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25) ON CONFLICT (tenant, key) DO NOTHING"
);

/// A claim made ready by the caller's task — the row's values and the trace's first entries —
/// so that the writer thread, the store's bottleneck, only binds and steps.
pub(crate) struct Claim {
    pub(crate) record: Record,
    row: Row,
    trace: String,
}

impl Claim {
    pub(crate) fn new(record: Record, events: &[Event]) -> Claim {
        Claim {
            row: Row::from_record(&record),
            trace: trace::encode(events),
            record,
        }
    }
}

/// `None` when the claim inserted its row, else the row that was there first.
pub(crate) fn claim(tx: &mut Tx<'_>, claim: &Claim) -> Result<Option<Row>, Error> {
    let key = &claim.record.key;
    let what = || format!("claiming {key}");
    let r = &claim.row;
    // The unique constraint decides: no read-then-insert, so two claims can never both win,
    // whichever process or connection they come from.
    let inserted = tx
        .statement(CLAIM)
        .context(what)?
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
            claim.trace,
        ])
        .context(what)?;
    if inserted == 1 {
        return Ok(None);
    }
    // Read inside the same transaction: the row that beat us cannot change or vanish between
    // the failed insert and this read.
    match read::row_of(tx.statement(read::GET).context(what)?, key)? {
        Some(existing) => Ok(Some(existing)),
        None => Err(Error::Unavailable(format!(
            "claiming {key}: the insert conflicted but no row was found"
        ))),
    }
}

/// What a claim under a duplicate-intent window found.
pub(crate) enum Guarded {
    /// The claim inserted its row.
    Inserted,
    /// The key already had a record: this row, as stored. Boxed, being the rare answer and
    /// far the largest.
    Existing(Box<Row>),
    /// Another key holds the same request, recently: nothing was inserted.
    Duplicate(String),
}

/// The duplicate-intent check: the earliest record (then the smallest key) of the same tenant,
/// environment (`?6`: environments never mix), tool and fingerprint, created at or after `?4`,
/// claimed under a window, under another key than `?5`. It reads only `operations_fingerprint`, which holds only records claimed with the
/// window (migration 0004), and repeats that index's condition.
pub(crate) const DUPLICATE: &str = "SELECT key FROM operations \
    INDEXED BY operations_fingerprint \
    WHERE tenant = ?1 AND tool = ?2 AND fingerprint = ?3 AND created_at >= ?4 \
    AND intent_window AND key <> ?5 AND environment = ?6 \
    ORDER BY created_at, key LIMIT 1";

/// A claim that first checks for the same request under another key, as one command: the
/// check and the insert run in one write transaction, which holds the file's write lock from
/// `BEGIN IMMEDIATE` to its commit, so no writer of this process (they all go through this
/// thread, one command after another) or of another process can insert a duplicate between
/// them. A claim earlier in the same batch is seen by the check, being in the same transaction.
pub(crate) fn claim_unless_duplicate(
    tx: &mut Tx<'_>,
    claim: &Claim,
    since: Millis,
) -> Result<Guarded, Error> {
    let key = &claim.record.key;
    let what = || format!("claiming {key} under a duplicate-intent window");
    let r = &claim.row;
    let duplicate: Option<String> = tx
        .statement(DUPLICATE)
        .context(what)?
        .query_row(
            params![
                r.tenant,
                r.tool,
                r.fingerprint,
                since,
                r.key,
                key.environment()
            ],
            |row| row.get(0),
        )
        .optional()
        .context(what)?;
    let Some(other) = duplicate else {
        // No duplicate: an ordinary claim, decided by the unique key.
        return Ok(match self::claim(tx, claim)? {
            None => Guarded::Inserted,
            Some(existing) => Guarded::Existing(Box::new(existing)),
        });
    };
    // The key's own record comes first: a delivery of an operation that exists is answered by
    // its record, whatever else holds the same request. The check above runs first only
    // because, without a duplicate, the insert settles the key's existence by itself.
    match read::row_of(tx.statement(read::GET).context(what)?, key)? {
        Some(existing) => Ok(Guarded::Existing(Box::new(existing))),
        None => Ok(Guarded::Duplicate(other)),
    }
}

/// A compare-and-set made ready by the caller's task: its statement, the state columns it
/// writes (from which the caller also rebuilds the row as written) and its other values.
pub(crate) struct Update {
    key: OperationKey,
    sql: String,
    state: Row,
    values: Vec<Value>,
    /// The webhook event the transition carries, written in the same command.
    webhook: Option<webhooks::Row>,
    /// The operator action's audit entry, appended only if the update applied.
    audit: Option<Draft>,
}

impl Update {
    pub(crate) fn new(t: &Transition) -> Update {
        // The state columns come from `Row::set_state`, the one place that maps states to
        // columns; it also clears the columns the next state does not use.
        let mut state = Row {
            tenant: t.key.tenant().into(),
            key: t.key.as_str().into(),
            fence: int(t.fence),
            updated_at: t.now,
            ..Row::default()
        };
        state.set_state(&t.next);
        let mut sql = String::from(
            "UPDATE operations SET status = ?, lease_owner = ?, lease_expires_at = ?, \
             dispatch = ?, job_id = ?, effect_reference = ?, result = ?, error_code = ?, \
             error_message = ?, fence = ?, updated_at = ?",
        );
        // Bound after the state columns, which are bound from `state` itself (see `params`).
        let mut values = Vec::new();
        match &t.request {
            RequestUpdate::Keep => {}
            RequestUpdate::Clear => sql.push_str(", request = NULL"),
            RequestUpdate::Set(request) => {
                sql.push_str(", request = ?");
                values.push(Value::Text(json_text(request)));
            }
        }
        if let Some(approver) = &t.approved_by {
            sql.push_str(", approved_by = ?");
            values.push(Value::Text(approver.clone()));
        }
        if let Some(fingerprint) = &t.fingerprint {
            sql.push_str(", fingerprint = ?");
            values.push(Value::Text(fingerprint.as_str().into()));
        }
        // Retention counts from settlement: the transition that settles a record (or leaves a
        // settled state) says when it expires, and only then are the columns written.
        if let Some(expiry) = &t.expiry {
            sql.push_str(", expires_at = ?, purge_at = ?");
            values.push(Value::Integer(expiry.expires_at));
            values.push(Value::Integer(expiry.purge_at));
        }
        if !t.events.is_empty() {
            sql.push_str(", trace = trace || ?");
            values.push(Value::Text(trace::encode(&t.events)));
        }
        // The compare half of compare-and-set: the fencing token, status and life (creation
        // instant) the executor saw, and for a takeover a lease that has run out, so that a
        // renewal racing the takeover wins.
        sql.push_str(
            " WHERE tenant = ? AND key = ? AND fence = ? AND status = ? AND created_at = ?",
        );
        values.extend([
            Value::Text(t.key.tenant().into()),
            Value::Text(t.key.as_str().into()),
            Value::Integer(int(t.expect.fence)),
            Value::Text(t.expect.status.as_str().into()),
            Value::Integer(t.expect.created_at),
        ]);
        if let Some(by) = t.expect.lease_expired_by {
            sql.push_str(" AND lease_expires_at <= ?");
            values.push(Value::Integer(by));
        }
        if let Some(dispatch) = t.expect.dispatch {
            sql.push_str(" AND dispatch = ?");
            values.push(Value::Text(dispatch.into()));
        }
        // A transition caused by a webhook event applies only while the event is undecided;
        // its row is written by the same command (see `transition`).
        let webhook = t.webhook.as_ref().map(webhooks::Row::new);
        if let Some(row) = &webhook {
            sql.push_str(webhooks::GUARD);
            values.extend(row.guard());
        }
        Update {
            key: t.key.clone(),
            sql,
            values,
            state,
            webhook,
            audit: t.audit.clone(),
        }
    }
}

impl Update {
    /// The statement's text, for the tests that read its program.
    #[cfg(test)]
    pub(crate) fn sql(&self) -> &str {
        &self.sql
    }

    /// The statement's parameters in order: the state columns, then the rest.
    fn params(&self) -> Vec<&dyn ToSql> {
        let s = &self.state;
        let mut params: Vec<&dyn ToSql> = vec![
            &s.status,
            &s.lease_owner,
            &s.lease_expires_at,
            &s.dispatch,
            &s.job_id,
            &s.effect_reference,
            &s.result,
            &s.error_code,
            &s.error_message,
            &s.fence,
            &s.updated_at,
        ];
        params.extend(self.values.iter().map(|v| v as &dyn ToSql));
        params
    }
}

/// The columns a transition does not set, read back after it: with the update's own state
/// columns they make the row as written. Reading only these halves what the writer thread
/// decodes per transition; the request, approver, fingerprint and expiry are read even when
/// the update set them, so that the rebuilt row never depends on which of them it set.
const UNSET: &str = "SELECT tool, tool_version, fingerprint, canonicalization, actor, request, \
    approved_by, created_at, expires_at, purge_at, intent_window FROM operations \
    WHERE tenant = ?1 AND key = ?2";

/// What `UNSET` reads.
pub(crate) struct Unset {
    tool: String,
    tool_version: String,
    fingerprint: String,
    canonicalization: i64,
    actor: String,
    request: Option<String>,
    approved_by: Option<String>,
    created_at: i64,
    expires_at: i64,
    purge_at: i64,
    intent_window: bool,
}

fn unset(r: &rusqlite::Row<'_>) -> rusqlite::Result<Unset> {
    Ok(Unset {
        tool: r.get(0)?,
        tool_version: r.get(1)?,
        fingerprint: r.get(2)?,
        canonicalization: r.get(3)?,
        actor: r.get(4)?,
        request: r.get(5)?,
        approved_by: r.get(6)?,
        created_at: r.get(7)?,
        expires_at: r.get(8)?,
        purge_at: r.get(9)?,
        intent_window: r.get(10)?,
    })
}

/// A transition's outcome with the row not yet decoded (see `read::get_row`).
pub(crate) enum Written {
    Done(Unset),
    /// Rare, and so the one boxed: the whole row as found.
    Lost(Option<Box<Row>>),
}

impl Written {
    /// The compare-and-set's answer, with the row as written rebuilt from `update` (taken back
    /// from the writer's command, which has dropped its share by now, so without a copy).
    pub(crate) fn decode(self, update: Arc<Update>) -> Result<Cas, Error> {
        Ok(match self {
            Written::Done(unset) => {
                let state = Arc::try_unwrap(update).map_or_else(|u| u.state.clone(), |u| u.state);
                Cas::Done(read::record(Row {
                    tool: unset.tool,
                    tool_version: unset.tool_version,
                    fingerprint: unset.fingerprint,
                    canonicalization: unset.canonicalization,
                    actor: unset.actor,
                    request: unset.request,
                    approved_by: unset.approved_by,
                    created_at: unset.created_at,
                    expires_at: unset.expires_at,
                    purge_at: unset.purge_at,
                    intent_window: unset.intent_window,
                    ..state
                })?)
            }
            Written::Lost(row) => Cas::Lost(row.map(|row| read::record(*row)).transpose()?),
        })
    }
}

/// The compare-and-set, and with it, once it applied, the audit entry it carries: an append
/// that fails fails the command after it wrote, so the writer rolls the transition back with it.
pub(crate) fn transition(tx: &mut Tx<'_>, t: &Update, sealer: &Sealer) -> Result<Written, Error> {
    let what = || format!("transition of {} to {}", t.key, t.state.status);
    let changed = tx
        .statement(&t.sql)
        .context(what)?
        .execute(params_from_iter(t.params()))
        .context(what)?;
    if changed == 0 {
        let found = read::row_of(tx.statement(read::GET).context(what)?, &t.key)?;
        return Ok(Written::Lost(found.map(Box::new)));
    }
    // Read back by primary key rather than with `RETURNING`: SQLite collects returned rows in a
    // temporary table of their own, which measured some 30k instructions per transition
    // against 12k for a second read.
    let unset = tx
        .statement(UNSET)
        .context(what)?
        .query_row(params![t.key.tenant(), t.key.as_str()], unset)
        .optional()
        .context(what)?;
    // The event's row, in the same transaction: the guard above proved it undecided, and no
    // other write runs inside this one, so the upsert writes. Should it fail, the command
    // fails after writing and the writer rolls the transition back with it.
    if let Some(row) = &t.webhook
        && !webhooks::upsert(tx, row)?
    {
        return Err(Error::Unavailable(format!(
            "{}: its webhook event was decided meanwhile",
            what()
        )));
    }
    if let (Some(_), Some(draft)) = (&unset, &t.audit) {
        crate::audit::append(tx, draft, sealer)?;
    }
    match unset {
        Some(unset) => Ok(Written::Done(unset)),
        None => Err(Error::Unavailable(format!(
            "{}: the updated row cannot be read back",
            what()
        ))),
    }
}

/// Appends encoded entries (`trace::encode`) to the trace of `key`. A key without a record
/// is accepted and nothing is written: a trace is never read without its record.
pub(crate) fn append(tx: &mut Tx<'_>, key: &OperationKey, entries: &str) -> Result<(), Error> {
    if entries.is_empty() {
        return Ok(());
    }
    tx.statement("UPDATE operations SET trace = trace || ?3 WHERE tenant = ?1 AND key = ?2")
        .context(|| format!("appending events to {key}"))?
        .execute(params![key.tenant(), key.as_str(), entries])
        .context(|| format!("appending events to {key}"))?;
    Ok(())
}

// Both sweep queries name their partial index (INDEXED BY) and repeat its WHERE clause, so they
// read only the rows of the environment that are due: a planner without statistics would
// otherwise pick the listing index on `status` and read every applied row there is. Each reads
// its index in the order of the answer, (environment, time, key), and stops at the limit.
pub(crate) const PURGEABLE: &str = "SELECT tenant, key FROM operations \
    INDEXED BY operations_purgeable WHERE status = 'tombstone' \
    AND environment = ?1 AND purge_at <= ?2 ORDER BY purge_at, key LIMIT ?3";
pub(crate) const COMPACTABLE: &str = "SELECT tenant, key, status, fence, effect_reference, \
    error_code FROM operations INDEXED BY operations_expiring \
    WHERE (status = 'applied' OR status = 'failed_permanent') \
    AND environment = ?1 AND expires_at <= ?2 ORDER BY expires_at, key LIMIT ?3";

/// A record due for compaction: what the tombstone keeps, and what the update compares.
struct Compactable {
    tenant: String,
    key: String,
    status: String,
    fence: i64,
    reference: Option<String>,
    code: Option<String>,
}

/// What one batch of a sweep step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Batch {
    /// Rows purged or compacted.
    pub(crate) done: u64,
    /// Whether due rows may remain: the batch took as many as it could, or stopped at its
    /// time budget.
    pub(crate) more: bool,
}

/// How long one batch of a sweep works before it stops, whatever its row limit: on a large
/// file whose pages are not in memory, each row costs reads from disk, and the batch holds
/// the write lock while it makes them. The commit comes on top.
pub(crate) const SWEEP_BUDGET: Duration = Duration::from_millis(20);

/// One batch of a retention sweep's purge step: at most `max` tombstones of `environment` past
/// their purge time are deleted, their trace (kept in the row) with them, for at most
/// [`SWEEP_BUDGET`]. The store runs a sweep as batches of these and of [`compact`], each one
/// writer command (see `SqliteStore::sweep`), all the purges before the first compaction.
pub(crate) fn purge(
    tx: &mut Tx<'_>,
    environment: &str,
    now: Millis,
    max: usize,
) -> Result<Batch, Error> {
    let started = Instant::now();
    let conn = tx.conn;
    let what = || format!("purging {environment} at {now}");
    let gone: Vec<(String, String)> = {
        let mut stmt = conn.prepare_cached(PURGEABLE).context(what)?;
        let rows = stmt
            .query_map(params![environment, now, limit(max)], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .context(what)?;
        rows.collect::<rusqlite::Result<_>>().context(what)?
    };
    let mut purged = 0;
    let found = gone.len();
    for (tenant, key) in gone {
        if started.elapsed() >= SWEEP_BUDGET {
            return Ok(Batch {
                done: purged,
                more: true,
            });
        }
        purged += conn
            .prepare_cached("DELETE FROM operations WHERE tenant = ?1 AND key = ?2")
            .context(what)?
            .execute(params![tenant, key])
            .context(what)? as u64;
    }
    Ok(Batch {
        done: purged,
        more: found == max,
    })
}

/// One batch of a retention sweep's compaction step: at most `max` settled records of
/// `environment` past their expiry become tombstones, each with an `expired` entry, for at most
/// [`SWEEP_BUDGET`].
pub(crate) fn compact(
    tx: &mut Tx<'_>,
    environment: &str,
    now: Millis,
    max: usize,
) -> Result<Batch, Error> {
    let started = Instant::now();
    let conn = tx.conn;
    let mut compacted = 0;
    let what = || format!("compacting {environment} at {now}");
    let due: Vec<Compactable> = {
        let mut stmt = conn.prepare_cached(COMPACTABLE).context(what)?;
        let rows = stmt
            .query_map(params![environment, now, limit(max)], |r| {
                Ok(Compactable {
                    tenant: r.get(0)?,
                    key: r.get(1)?,
                    status: r.get(2)?,
                    fence: r.get(3)?,
                    reference: r.get(4)?,
                    code: r.get(5)?,
                })
            })
            .context(what)?;
        rows.collect::<rusqlite::Result<_>>().context(what)?
    };
    let found = due.len();
    for Compactable {
        tenant,
        key,
        status,
        fence,
        reference,
        code,
    } in due
    {
        if started.elapsed() >= SWEEP_BUDGET {
            return Ok(Batch {
                done: compacted,
                more: true,
            });
        }
        let corrupt = |about: String| Error::Corrupt(format!("sweeping {key}: {about}"));
        let status =
            RecordStatus::parse(&status).ok_or_else(|| corrupt(format!("status `{status}`")))?;
        // What a tombstone keeps: what the record settled as — the effect's reference, or the
        // refusal's code — so that a late arrival is answered by the contract's policy and never
        // hears `replayed` for an effect that did not happen.
        let digest = match status {
            RecordStatus::Applied => Digest::Applied {
                reference: reference
                    .ok_or_else(|| corrupt("applied without an effect reference".into()))?,
            },
            RecordStatus::FailedPermanent => Digest::Refused {
                code: code
                    .as_deref()
                    .and_then(ErrorCode::parse)
                    .ok_or_else(|| corrupt(format!("refusal code {code:?}")))?,
            },
            // The query selects none of these; they are named so that a new status must be
            // considered here.
            RecordStatus::Pending
            | RecordStatus::AwaitingApproval
            | RecordStatus::Unknown
            | RecordStatus::Tombstone => continue,
        };
        let attempt = u64::try_from(fence).map_err(|_| corrupt(format!("fence {fence}")))?;
        let expired = trace::encode(&[Event::new(EventKind::Expired, now, attempt, SWEEPER)]);
        let mut compact = Row::default();
        compact.set_state(&RecordState::Tombstone(digest));
        let changed = conn
            .prepare_cached(
                "UPDATE operations SET status = ?1, lease_owner = ?2, lease_expires_at = ?3, \
                 dispatch = ?4, job_id = ?5, effect_reference = ?6, result = ?7, \
                 error_code = ?8, error_message = ?9, request = NULL, updated_at = ?10, \
                 trace = trace || ?15 \
                 WHERE tenant = ?11 AND key = ?12 AND fence = ?13 AND status = ?14",
            )
            .context(what)?
            .execute(params![
                compact.status,
                compact.lease_owner,
                compact.lease_expires_at,
                compact.dispatch,
                compact.job_id,
                compact.effect_reference,
                compact.result,
                compact.error_code,
                compact.error_message,
                now,
                tenant,
                key,
                fence,
                status.as_str(),
                expired,
            ])
            .context(what)?;
        compacted += changed as u64;
    }
    Ok(Batch {
        done: compacted,
        more: found == max,
    })
}
