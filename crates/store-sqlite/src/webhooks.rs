//! The webhook deduplication table (`webhook_events`, migrations 0007 and 0009): reads on the reader
//! pool, writes as writer commands, and the part of a transition that carries an event.

use idemgate_core::key::OperationKey;
use idemgate_core::record::{Millis, Record};
use idemgate_core::store::Error;
use idemgate_core::webhook::{Disposition, JobMatch, WebhookEvent};
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, params};

use crate::error::Context;
use crate::read::{self, columns};
use crate::writer::Tx;

const COLUMNS: &str = "source, event_id, tenant, job_id, key, disposition, finish, received_at, \
    purge_at, environment, tools";

/// The dedup rule of `WebhookEvent` as one statement: inserted, or written over an early
/// arrival, else nothing (0 rows changed).
const UPSERT: &str = "INSERT INTO webhook_events (source, event_id, tenant, job_id, key, \
    disposition, finish, received_at, purge_at, environment, tools) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
    ON CONFLICT (source, event_id) DO UPDATE SET tenant = excluded.tenant, \
    job_id = excluded.job_id, key = excluded.key, disposition = excluded.disposition, \
    environment = excluded.environment, tools = excluded.tools, \
    finish = excluded.finish, purge_at = max(webhook_events.purge_at, excluded.purge_at) \
    WHERE webhook_events.disposition = 'early'";

/// The guard a transition carrying an event adds to its `UPDATE`: no decided row for the
/// event exists. Inside the writer's transaction nothing can come between it and the upsert.
pub(crate) const GUARD: &str = " AND NOT EXISTS (SELECT 1 FROM webhook_events \
    WHERE source = ? AND event_id = ? AND disposition <> 'early')";

/// A webhook row made ready by the caller's task.
pub(crate) struct Row {
    values: [Value; 11],
    shown: String,
}

impl Row {
    pub(crate) fn new(e: &WebhookEvent) -> Row {
        let text = |v: Option<&str>| v.map_or(Value::Null, |v| Value::Text(v.into()));
        Row {
            values: [
                Value::Text(e.source.clone()),
                Value::Text(e.event_id.clone()),
                Value::Text(e.tenant.clone()),
                text(e.job_id.as_deref()),
                text(e.key.as_ref().map(OperationKey::as_str)),
                Value::Text(e.disposition.as_str().into()),
                e.finish_json().map_or(Value::Null, Value::Text),
                Value::Integer(e.received_at),
                Value::Integer(e.purge_at),
                text(e.environment.as_deref()),
                Value::Text(e.tools_json()),
            ],
            shown: format!("webhook event {} of source {}", e.event_id, e.source),
        }
    }

    /// The guard's parameters.
    pub(crate) fn guard(&self) -> [Value; 2] {
        [self.values[0].clone(), self.values[1].clone()]
    }
}

/// Writes `row` by the dedup rule; whether it was written.
pub(crate) fn upsert(tx: &mut Tx<'_>, row: &Row) -> Result<bool, Error> {
    let what = || format!("recording {}", row.shown);
    let changed = tx
        .statement(UPSERT)
        .context(what)?
        .execute(rusqlite::params_from_iter(row.values.iter()))
        .context(what)?;
    Ok(changed > 0)
}

/// A row as read, its text columns not yet decoded: their failures are the store's
/// (`Corrupt`), not SQLite's.
struct Raw {
    event: WebhookEvent,
    key: Option<String>,
    disposition: String,
    finish: Option<String>,
    tools: Option<String>,
}

fn event(r: &rusqlite::Row<'_>) -> rusqlite::Result<Raw> {
    Ok(Raw {
        event: WebhookEvent {
            source: r.get(0)?,
            event_id: r.get(1)?,
            tenant: r.get(2)?,
            environment: r.get(9)?,
            tools: Vec::new(),
            job_id: r.get(3)?,
            key: None,
            disposition: Disposition::Applied,
            finish: None,
            received_at: r.get(7)?,
            purge_at: r.get(8)?,
        },
        key: r.get(4)?,
        disposition: r.get(5)?,
        finish: r.get(6)?,
        tools: r.get(10)?,
    })
}

fn decode(raw: Raw) -> Result<WebhookEvent, Error> {
    let mut e = raw.event;
    let id = e.event_id.clone();
    e.disposition = Disposition::parse(&raw.disposition).ok_or_else(|| {
        Error::Corrupt(format!(
            "webhook event {id} holds an unknown disposition `{}`",
            raw.disposition
        ))
    })?;
    e.finish = WebhookEvent::parse_finish(raw.finish.as_deref())
        .map_err(|m| Error::Corrupt(format!("webhook event {id}: {m}")))?;
    e.tools = WebhookEvent::parse_tools(raw.tools.as_deref())
        .map_err(|m| Error::Corrupt(format!("webhook event {id}: {m}")))?;
    e.key = raw
        .key
        .map(|k| {
            OperationKey::parse(&k)
                .map_err(|err| Error::Corrupt(format!("webhook event {id} names key `{k}`: {err}")))
        })
        .transpose()?;
    Ok(e)
}

pub(crate) fn get(
    conn: &Connection,
    source: &str,
    event_id: &str,
) -> Result<Option<WebhookEvent>, Error> {
    let what = || format!("reading webhook event {event_id} of source {source}");
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM webhook_events WHERE source = ?1 AND event_id = ?2"
    ))
    .context(what)?
    .query_row(params![source, event_id], event)
    .optional()
    .context(what)?
    .map(decode)
    .transpose()
}

/// `get` inside the writer's transaction, for the answer of a write that found a decided row.
pub(crate) fn get_in(
    tx: &mut Tx<'_>,
    source: &str,
    event_id: &str,
) -> Result<Option<WebhookEvent>, Error> {
    get(tx.conn, source, event_id)
}

pub(crate) fn for_job(
    conn: &Connection,
    tenant: &str,
    job_id: &str,
) -> Result<Vec<WebhookEvent>, Error> {
    let what = || format!("reading the webhook events of job {job_id}");
    let rows = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM webhook_events INDEXED BY webhook_events_by_job \
             WHERE tenant = ?1 AND job_id = ?2 AND job_id IS NOT NULL \
             ORDER BY received_at, event_id"
        ))
        .context(what)?
        .query_map(params![tenant, job_id], event)
        .context(what)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .context(what)?;
    rows.into_iter().map(decode).collect()
}

/// The records an event may bind to by job id: the tenant's, of one environment and one of
/// the source's tools (`?4`, a JSON array), pending with the job or `unknown` with it as
/// evidence, each half read through its own partial index. Two rows are enough to tell a
/// match from an ambiguity. The environment is the generated column of migration 0005.
const OPEN_JOBS: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM operations INDEXED BY operations_by_job WHERE tenant = ?1 AND job_id = ?2 \
     AND status = 'pending' AND dispatch = 'job' AND environment = ?3 \
     AND tool IN (SELECT value FROM json_each(?4)) \
     UNION ALL SELECT ",
    columns!(),
    " FROM operations INDEXED BY operations_unknown_by_job WHERE tenant = ?1 AND job_id = ?2 \
     AND status = 'unknown' AND job_id IS NOT NULL AND environment = ?3 \
     AND tool IN (SELECT value FROM json_each(?4)) ORDER BY key LIMIT 2"
);

pub(crate) fn open_jobs(conn: &Connection, m: JobMatch<'_>) -> Result<Vec<Record>, Error> {
    let what = || format!("looking up the pending records of job {}", m.job_id);
    // A list of strings always serialises.
    let tools = serde_json::to_string(m.tools).unwrap_or_else(|_| "[]".into());
    let rows = conn
        .prepare_cached(OPEN_JOBS)
        .context(what)?
        .query_map(params![m.tenant, m.job_id, m.environment, tools], read::row)
        .context(what)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .context(what)?;
    rows.into_iter().map(read::record).collect()
}

pub(crate) fn sweep(tx: &mut Tx<'_>, now: Millis, limit: usize) -> Result<u64, Error> {
    let what = || "sweeping webhook events".to_string();
    let deleted = tx
        .statement(
            "DELETE FROM webhook_events WHERE (source, event_id) IN (SELECT source, event_id \
             FROM webhook_events INDEXED BY webhook_events_purgeable WHERE purge_at <= ?1 \
             ORDER BY purge_at LIMIT ?2)",
        )
        .context(what)?
        .execute(params![now, read::limit(limit)])
        .context(what)?;
    Ok(deleted as u64)
}
