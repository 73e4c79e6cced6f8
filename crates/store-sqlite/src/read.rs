//! Queries that only read. The reader pool runs them, and the writer reuses `get` to answer
//! with the record as stored inside its own transaction.

use idemgate_core::key::OperationKey;
use idemgate_core::record::{Event, Record, RecordStatus, Row};
use idemgate_core::store::{Due, Error, Filter, Waiting, WaitingOn};
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, Statement, params, params_from_iter};

use crate::error::Context;
use idemgate_core::trace;

/// The columns of `operations` in the order `row` reads them. A macro rather than a constant so
/// that `concat!` can build whole statements at compile time.
macro_rules! columns {
    () => {
        "tenant, key, tool, tool_version, fingerprint, canonicalization, status, fence, \
         lease_owner, lease_expires_at, dispatch, job_id, effect_reference, result, error_code, \
         error_message, actor, request, approved_by, created_at, updated_at, expires_at, purge_at, \
         intent_window"
    };
}
pub(crate) use columns;

/// A page of a listing when the caller does not say.
pub const DEFAULT_LIST_LIMIT: usize = 100;
/// The largest page a listing returns, whatever the caller asks: a page is built in memory.
pub const MAX_LIST_LIMIT: usize = 1000;

/// Reads one `operations` row selected with `columns!()`.
pub(crate) fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        tenant: r.get(0)?,
        key: r.get(1)?,
        tool: r.get(2)?,
        tool_version: r.get(3)?,
        fingerprint: r.get(4)?,
        canonicalization: r.get(5)?,
        status: r.get(6)?,
        fence: r.get(7)?,
        lease_owner: r.get(8)?,
        lease_expires_at: r.get(9)?,
        dispatch: r.get(10)?,
        job_id: r.get(11)?,
        effect_reference: r.get(12)?,
        result: r.get(13)?,
        error_code: r.get(14)?,
        error_message: r.get(15)?,
        actor: r.get(16)?,
        request: r.get(17)?,
        approved_by: r.get(18)?,
        created_at: r.get(19)?,
        updated_at: r.get(20)?,
        expires_at: r.get(21)?,
        purge_at: r.get(22)?,
        intent_window: r.get(23)?,
    })
}

pub(crate) fn record(row: Row) -> Result<Record, Error> {
    row.into_record().map_err(|e| Error::Corrupt(e.to_string()))
}

/// Fences and attempts are `u64` in the core and `INTEGER` (i64) in SQLite. The same
/// conversion as `Row::from_record`, so that a compare-and-set compares like with like.
pub(crate) fn int(value: u64) -> i64 {
    value as i64
}

pub(crate) fn limit(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

pub(crate) fn get(conn: &Connection, key: &OperationKey) -> Result<Option<Record>, Error> {
    get_row(conn, key)?.map(record).transpose()
}

/// Reads one row by key.
pub(crate) const GET: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM operations WHERE tenant = ?1 AND key = ?2"
);

/// The row of `key` as stored, not yet decoded: the writer thread reads rows back with this
/// and leaves the decoding (the request's and the result's JSON among it) to the caller's task.
pub(crate) fn get_row(conn: &Connection, key: &OperationKey) -> Result<Option<Row>, Error> {
    let mut statement = conn
        .prepare_cached(GET)
        .context(|| format!("reading {key}"))?;
    row_of(&mut statement, key)
}

/// `get_row` with the statement `GET` already prepared.
pub(crate) fn row_of(
    statement: &mut Statement<'_>,
    key: &OperationKey,
) -> Result<Option<Row>, Error> {
    statement
        .query_row(params![key.tenant(), key.as_str()], row)
        .optional()
        .context(|| format!("reading {key}"))
}

pub(crate) fn events(conn: &Connection, key: &OperationKey) -> Result<Vec<Event>, Error> {
    let what = || format!("reading the events of {key}");
    let stored: Option<String> = conn
        .prepare_cached("SELECT trace FROM operations WHERE tenant = ?1 AND key = ?2")
        .context(what)?
        .query_row(params![key.tenant(), key.as_str()], |r| r.get(0))
        .optional()
        .context(what)?;
    stored.map_or(Ok(Vec::new()), |text| trace::decode(key, &text))
}

/// How many records of `environment` are in `status`, across tenants. A status the listing
/// index holds (neither pending nor applied: the reconciliation queue among them) is counted
/// from that index, its condition repeated word for word so that SQLite may use it.
pub(crate) fn count(
    conn: &Connection,
    environment: &str,
    status: RecordStatus,
) -> Result<u64, Error> {
    let sql = match status {
        RecordStatus::Pending | RecordStatus::Applied => {
            "SELECT count(*) FROM operations WHERE status = ?1 AND environment = ?2"
        }
        RecordStatus::AwaitingApproval
        | RecordStatus::FailedPermanent
        | RecordStatus::Unknown
        | RecordStatus::Tombstone => concat!(
            "SELECT count(*) FROM operations INDEXED BY operations_list_by_tenant ",
            "WHERE status <> 'pending' AND status <> 'applied' ",
            "AND status = ?1 AND environment = ?2"
        ),
    };
    let what = || format!("counting {} operations", status.as_str());
    let mut stmt = conn.prepare_cached(sql).context(what)?;
    let n: i64 = stmt
        .query_row(rusqlite::params![status.as_str(), environment], |r| {
            r.get(0)
        })
        .context(what)?;
    Ok(n as u64)
}

pub(crate) fn list(conn: &Connection, filter: &Filter) -> Result<Vec<Record>, Error> {
    let (sql, values) = list_query(filter);
    collect(conn, &sql, values, || {
        format!("listing operations ({filter:?})")
    })
}

/// The statement and values of a listing.
pub(crate) fn list_query(filter: &Filter) -> (String, Vec<Value>) {
    let mut sql = String::from(concat!("SELECT ", columns!(), " FROM operations"));
    let mut clauses = Vec::new();
    let mut values = Vec::new();
    // The listing index holds neither pending nor applied rows (see migration 0004): a listing
    // of another status repeats the index's condition word for word so that SQLite may use it;
    // a listing of pending rows reads the due index (migration 0005), which holds only those
    // and the awaiting-approval ones, and repeats its condition; a listing of applied rows
    // reads the primary key in key order.
    match filter.status {
        Some(RecordStatus::Pending) => {
            sql.push_str(" INDEXED BY operations_due");
            clauses.push("(status = 'pending' OR status = 'awaiting_approval')");
            clauses.push("status = 'pending'");
        }
        Some(RecordStatus::Applied) => clauses.push("status = 'applied'"),
        Some(status)
            if filter.tool.is_none() && filter.tenant.is_some() && filter.environment.is_some() =>
        {
            // The reconciliation queue as the console and the API read it: one range of the
            // queue index (migration 0008) in key order, stopping after the page. Its condition
            // is the listing index's, repeated word for word.
            sql.push_str(" INDEXED BY operations_queue");
            clauses.push("status <> 'pending' AND status <> 'applied'");
            clauses.push("status = ?");
            values.push(Value::Text(status.as_str().into()));
        }
        Some(status) => {
            // Named, because without statistics SQLite's estimate no longer favours it once
            // the table has the generated column of migration 0005 (measured: a listing by
            // tenant, status and tool then read the tenant's whole primary-key range, every
            // applied row included, to find a few unknown ones). This index holds only the
            // statuses listed here, so it is never the wrong one for them.
            sql.push_str(" INDEXED BY operations_list_by_tenant");
            clauses.push("status <> 'pending' AND status <> 'applied'");
            clauses.push("status = ?");
            values.push(Value::Text(status.as_str().into()));
        }
        None => {}
    }
    if let Some(tenant) = &filter.tenant {
        clauses.push("tenant = ?");
        values.push(Value::Text(tenant.clone()));
    }
    if let Some(environment) = &filter.environment {
        // The generated column of migration 0005, computed from the key.
        clauses.push("environment = ?");
        values.push(Value::Text(environment.clone()));
    }
    if let Some(tool) = &filter.tool {
        clauses.push("tool = ?");
        values.push(Value::Text(tool.clone()));
    }
    if let Some(after) = &filter.after {
        clauses.push("key > ?");
        values.push(Value::Text(after.clone()));
    }
    if !clauses.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&clauses.join(" AND "));
    }
    sql.push_str(" ORDER BY key LIMIT ?");
    let page = match filter.limit {
        0 => DEFAULT_LIST_LIMIT,
        n => n.min(MAX_LIST_LIMIT),
    };
    values.push(Value::Integer(limit(page)));
    (sql, values)
}

// The due scan reads the partial index `operations_due`, which holds only pending and
// awaiting-approval rows (the few in flight), led by the environment and ordered by deadline
// and key: one range of it from the cursor on, read in the answer's order, with no sort. The
// index is named with INDEXED BY and its condition repeated word for word, because a planner
// without statistics may prefer the listing index on `status`, which cannot tell a handful of
// pending rows from millions of settled ones.
macro_rules! due {
    ($after:literal) => {
        concat!(
            "SELECT ",
            columns!(),
            " FROM operations INDEXED BY operations_due \
             WHERE (status = 'pending' OR status = 'awaiting_approval') \
             AND environment = ?1 AND lease_expires_at <= ?2",
            $after,
            " ORDER BY lease_expires_at, key LIMIT ?3"
        )
    };
}

/// The first page of a due scan: `?1` the environment, `?2` now, `?3` the limit.
pub(crate) const DUE: &str = due!("");
/// A later page, strictly after the cursor `(?4, ?5)` in (deadline, key) order. A row value
/// rather than `a > x OR (a = x AND b > y)`, because SQLite turns the row value into the lower
/// bound of the index range, where the `OR` would only filter.
pub(crate) const DUE_AFTER: &str = due!(" AND (lease_expires_at, key) > (?4, ?5)");

pub(crate) fn due(conn: &Connection, query: &Due) -> Result<Vec<Record>, Error> {
    let mut values = vec![
        Value::Text(query.environment.clone()),
        Value::Integer(query.now),
        Value::Integer(limit(query.limit)),
    ];
    let sql = match &query.after {
        None => DUE,
        Some(cursor) => {
            values.push(Value::Integer(cursor.due_at));
            values.push(Value::Text(cursor.key.as_str().into()));
            DUE_AFTER
        }
    };
    collect(conn, sql, values, || {
        format!(
            "finding operations of {} due at {}",
            query.environment, query.now
        )
    })
}

/// An operator's queue of pending records ([`WaitingOn`]). It reads the due index, which holds
/// only pending and awaiting-approval rows (the few in flight), led by the environment, and
/// repeats its condition word for word; the rows of one tenant's queue are then sorted by key,
/// a sort of a handful.
pub(crate) fn waiting(conn: &Connection, query: &Waiting) -> Result<Vec<Record>, Error> {
    let mut sql = String::from(concat!(
        "SELECT ",
        columns!(),
        " FROM operations INDEXED BY operations_due \
         WHERE (status = 'pending' OR status = 'awaiting_approval') AND status = 'pending' \
         AND environment = ? AND tenant = ?"
    ));
    let mut values = vec![
        Value::Text(query.environment.clone()),
        Value::Text(query.tenant.clone()),
    ];
    match query.on {
        WaitingOn::LeaseExpired { now } => {
            sql.push_str(" AND lease_expires_at <= ? AND dispatch <> 'job'");
            values.push(Value::Integer(now));
        }
        WaitingOn::Job => sql.push_str(" AND dispatch = 'job'"),
    }
    if let Some(tool) = &query.tool {
        sql.push_str(" AND tool = ?");
        values.push(Value::Text(tool.clone()));
    }
    if let Some(after) = &query.after {
        sql.push_str(" AND key > ?");
        values.push(Value::Text(after.clone()));
    }
    sql.push_str(" ORDER BY key LIMIT ?");
    let page = match query.limit {
        0 => DEFAULT_LIST_LIMIT,
        n => n.min(MAX_LIST_LIMIT),
    };
    values.push(Value::Integer(limit(page)));
    collect(conn, &sql, values, || {
        format!(
            "listing the pending operations of {} in {} ({:?})",
            query.tenant, query.environment, query.on
        )
    })
}

fn collect(
    conn: &Connection,
    sql: &str,
    values: Vec<Value>,
    what: impl Fn() -> String,
) -> Result<Vec<Record>, Error> {
    let mut stmt = conn.prepare_cached(sql).context(&what)?;
    let rows = stmt
        .query_map(params_from_iter(values), row)
        .context(&what)?;
    let mut records = Vec::new();
    for r in rows {
        records.push(record(r.context(&what)?)?);
    }
    Ok(records)
}
