//! The webhook deduplication table (`webhook_events`, migrations 0006 and 0010), and the transition
//! caused by an event: the event's row and the transition commit in one explicit
//! transaction, or neither does.

use idemgate_core::key::OperationKey;
use idemgate_core::record::{Millis, Record};
use idemgate_core::store;
use idemgate_core::webhook::{Disposition, JobMatch, Recorded, WebhookEvent};
use tokio_postgres::types::Type;

use crate::conn::{Conn, Kind};
use crate::{PgStore, record_of};

/// The dedup rule of `WebhookEvent` as one statement: inserted, or written over an early
/// arrival, else nothing (no row returned). On a conflict with an uncommitted insert of the
/// same event it waits for that transaction, so concurrent deliveries of one event queue on
/// its row and only the first is written.
const UPSERT: &str = "INSERT INTO webhook_events (source, event_id, tenant, job_id, key, \
    disposition, finish, received_at, purge_at, environment, tools) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
    ON CONFLICT (source, event_id) DO UPDATE SET tenant = excluded.tenant, \
    job_id = excluded.job_id, key = excluded.key, disposition = excluded.disposition, \
    environment = excluded.environment, tools = excluded.tools, \
    finish = excluded.finish, purge_at = greatest(webhook_events.purge_at, excluded.purge_at) \
    WHERE webhook_events.disposition = 'early' RETURNING 1";

const GET: &str = "SELECT source, event_id, tenant, job_id, key, disposition, finish, \
    received_at, purge_at, environment, tools FROM webhook_events \
    WHERE source = $1 AND event_id = $2";

const FOR_JOB: &str = "SELECT source, event_id, tenant, job_id, key, disposition, finish, \
    received_at, purge_at, environment, tools FROM webhook_events WHERE tenant = $1 AND job_id = $2 \
    AND job_id IS NOT NULL ORDER BY received_at, event_id";

/// The columns of a record, as `record_of` reads them.
const RECORD_COLUMNS: &str = "tenant, key, tool, tool_version, fingerprint, canonicalization, \
    status, fence, lease_owner, lease_expires_at, dispatch, job_id, effect_reference, result, \
    error_code, error_message, actor, request, approved_by, created_at, updated_at, expires_at, \
    purge_at, intent_window";

/// The records an event may bind to by job id: the tenant's, of one environment (the key's
/// second part, as migration 0004 indexes it) and one of the source's tools, pending with the
/// job or `unknown` with it as evidence, each half read through its own partial index. Two
/// rows are enough to tell a match from an ambiguity.
fn open_jobs_sql() -> String {
    format!(
        "(SELECT {RECORD_COLUMNS} FROM operations WHERE tenant = $1 AND job_id = $2 \
         AND status = 'pending' AND dispatch = 'job' AND split_part(key, ':', 2) = $3 \
         AND tool = ANY($4)) UNION ALL (SELECT {RECORD_COLUMNS} FROM operations \
         WHERE tenant = $1 AND job_id = $2 AND status = 'unknown' AND job_id IS NOT NULL \
         AND split_part(key, ':', 2) = $3 AND tool = ANY($4)) ORDER BY key LIMIT 2"
    )
}

const SWEEP: &str = "DELETE FROM webhook_events WHERE (source, event_id) IN (SELECT source, \
    event_id FROM webhook_events WHERE purge_at <= $1 ORDER BY purge_at LIMIT $2 \
    FOR UPDATE SKIP LOCKED)";

fn corrupt(id: &str, what: impl std::fmt::Display) -> store::Error {
    store::Error::Corrupt(format!("webhook event {id}: {what}"))
}

fn event_of(r: &tokio_postgres::Row) -> Result<WebhookEvent, store::Error> {
    let text = |i: usize| r.try_get::<_, String>(i);
    let opt = |i: usize| r.try_get::<_, Option<String>>(i);
    let int = |i: usize| r.try_get::<_, i64>(i);
    let id = text(1).map_err(|e| corrupt("?", e))?;
    let bad = |e: tokio_postgres::Error| corrupt(&id, e);
    let disposition = text(5).map_err(bad)?;
    let key = opt(4).map_err(bad)?;
    Ok(WebhookEvent {
        source: text(0).map_err(bad)?,
        event_id: id.clone(),
        tenant: text(2).map_err(bad)?,
        environment: opt(9).map_err(bad)?,
        tools: WebhookEvent::parse_tools(opt(10).map_err(bad)?.as_deref())
            .map_err(|m| corrupt(&id, m))?,
        job_id: opt(3).map_err(bad)?,
        key: key
            .map(|k| OperationKey::parse(&k).map_err(|e| corrupt(&id, format!("key `{k}`: {e}"))))
            .transpose()?,
        disposition: Disposition::parse(&disposition)
            .ok_or_else(|| corrupt(&id, format!("unknown disposition `{disposition}`")))?,
        finish: WebhookEvent::parse_finish(opt(6).map_err(bad)?.as_deref())
            .map_err(|m| corrupt(&id, m))?,
        received_at: int(7).map_err(bad)?,
        purge_at: int(8).map_err(bad)?,
    })
}

/// Writes `e` by the dedup rule on `conn`; whether it was written.
pub(crate) async fn upsert(
    conn: &mut Conn,
    kind: Kind,
    e: &WebhookEvent,
) -> Result<bool, store::Error> {
    let key = e.key.as_ref().map(|k| k.as_str().to_string());
    let finish = e.finish_json();
    let tools = e.tools_json();
    let rows = conn
        .run(
            kind,
            UPSERT,
            &[
                &e.source,
                &e.event_id,
                &e.tenant,
                &e.job_id,
                &key,
                &e.disposition.as_str(),
                &finish,
                &e.received_at,
                &e.purge_at,
                &e.environment,
                &tools,
            ],
        )
        .await?;
    Ok(!rows.is_empty())
}

async fn get_on(
    conn: &mut Conn,
    source: &str,
    event_id: &str,
) -> Result<Option<WebhookEvent>, store::Error> {
    let rows = conn.run(Kind::Read, GET, &[&source, &event_id]).await?;
    rows.first().map(event_of).transpose()
}

impl PgStore {
    pub(crate) async fn webhook_event(
        &self,
        source: &str,
        event_id: &str,
    ) -> Result<Option<WebhookEvent>, store::Error> {
        let mut conn = self.conn().await?;
        get_on(&mut conn, source, event_id).await
    }

    pub(crate) async fn record_webhook_event(
        &self,
        event: WebhookEvent,
    ) -> Result<Recorded, store::Error> {
        let mut conn = self.conn().await?;
        if upsert(&mut conn, Kind::Write, &event).await? {
            return Ok(Recorded::Written);
        }
        // A decided row stood in the way; rows are never updated once decided, so reading it
        // after the statement gives the one that did.
        match get_on(&mut conn, &event.source, &event.event_id).await? {
            Some(existing) => Ok(Recorded::Exists(Box::new(existing))),
            None => Err(store::Error::Unavailable(format!(
                "webhook event {} of source {} was neither written nor found (swept meanwhile)",
                event.event_id, event.source
            ))),
        }
    }

    pub(crate) async fn webhook_events_for_job(
        &self,
        tenant: &str,
        job_id: &str,
    ) -> Result<Vec<WebhookEvent>, store::Error> {
        let mut conn = self.conn().await?;
        let rows = conn.run(Kind::Read, FOR_JOB, &[&tenant, &job_id]).await?;
        rows.iter().map(event_of).collect()
    }

    pub(crate) async fn open_job_records(
        &self,
        m: JobMatch<'_>,
    ) -> Result<Vec<Record>, store::Error> {
        let mut conn = self.conn().await?;
        let tools = m.tools.to_vec();
        let rows = conn
            .run(
                Kind::Read,
                &open_jobs_sql(),
                &[&m.tenant, &m.job_id, &m.environment, &tools],
            )
            .await?;
        rows.iter().map(|r| record_of(r, 0)).collect()
    }

    pub(crate) async fn sweep_webhook_events(
        &self,
        now: Millis,
        limit: usize,
    ) -> Result<u64, store::Error> {
        if limit == 0 {
            return Ok(0);
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut conn = self.conn().await?;
        let rows = conn
            .run_planned(
                Kind::Write,
                &format!("WITH gone AS ({SWEEP} RETURNING 1) SELECT count(*) FROM gone"),
                &[(&now, Type::INT8), (&limit, Type::INT8)],
            )
            .await?;
        Ok(rows
            .first()
            .and_then(|r| r.try_get::<_, i64>(0).ok())
            .unwrap_or(0)
            .max(0) as u64)
    }
}
