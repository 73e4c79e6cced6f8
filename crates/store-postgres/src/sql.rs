//! The SQL text of every statement, and the mapping between result rows and the core's flat
//! [`Row`]. Each hot statement is a fixed string, so deadpool's per-connection statement cache
//! (keyed by the text) prepares it once per connection and PostgreSQL caches its generic plan;
//! the others run unnamed, planned for their values (`Conn::run_planned`).
//!
//! # Plans that cannot read more than their keys
//!
//! A generic plan is made on the statistics of the moment and kept; on an empty table every
//! plan costs nothing, so the cached plan may be any plan the statement allows. The hot
//! statements are therefore written so that every plan they allow is a lookup by key: the
//! read's and the claim's only usable index is the primary key (migration 0002 makes the
//! others partial, with predicates only other statements imply, and 0009 drops the one by key
//! alone);
//! sequential scans are off on the store's connections; the batch statements look each row up
//! by its own parameters (a lateral subquery, or one `UPDATE` per row) instead of joining the
//! input with the table, which the planner could hash against a scan of every row. The `plans`
//! test checks the generic plan of each of them on a fresh, a vacuumed-empty and a truncated
//! table.
//!
//! # Isolation
//!
//! Every statement runs at READ COMMITTED, pinned per connection in [`crate::PgStore::connect`]
//! so that a server configured with another default cannot change the behaviour. Each store
//! operation is **one statement**, in its own implicit transaction (a batch statement carries
//! several operations, each decided by the same rules below, row by row: see `batch`); the trace
//! entries a claim or a transition adds are written into the operation's own `trace` column by
//! that same statement (migration 0007, `idemgate_core::trace`), so the record and its trace
//! commit together or not at all. READ COMMITTED is enough because of how
//! PostgreSQL runs a write that meets a concurrent writer:
//!
//! - `INSERT … ON CONFLICT (tenant, key) DO NOTHING` checks the unique index, not a snapshot. If
//!   another transaction has inserted the same key and not yet committed, the insert waits for
//!   it; if it commits, this insert does nothing, if it rolls back, this insert proceeds. So
//!   exactly one of any number of concurrent claims inserts.
//! - `UPDATE … WHERE tenant AND key AND fence AND status [AND lease_expires_at <= now]` locks
//!   the row; if a concurrent transaction updated it first, PostgreSQL waits for that
//!   transaction and then re-evaluates the whole WHERE clause on the newest row version
//!   (EvalPlanQual) before writing. A late finisher whose fence was bumped by a takeover, or a
//!   takeover that lost to a lease renewal, therefore matches no row. The compare and the set
//!   are one atomic step.
//! - The sweep's `SELECT … FOR UPDATE SKIP LOCKED` likewise re-checks its condition on the
//!   newest version of each row it locks, and skips rows a transition is writing right now.
//!
//! What would break elsewhere:
//!
//! - PostgreSQL at REPEATABLE READ or SERIALIZABLE: still correct, but a statement that meets a
//!   concurrent update of its row fails with a serialization error (SQLSTATE 40001) instead of
//!   re-checking, so ordinary races would surface as `Unavailable` and need a retry loop.
//! - An engine that evaluates the WHERE clause only against the statement's snapshot and then
//!   writes without re-checking the row's current version would let two fenced updates with the
//!   same expectation both succeed (a lost update). There the compare-and-set needs SERIALIZABLE
//!   or a `SELECT … FOR UPDATE` before the update, in one explicit transaction.
//! - MySQL/InnoDB: an UPDATE reads the latest committed version (a locking read), so the fenced
//!   update holds, but `INSERT IGNORE` swallows errors other than a duplicate key.
//! - CockroachDB runs SERIALIZABLE and retries a conflicting single-statement transaction by
//!   itself, so these statements carry over, at the price of retries under contention.
//!
//! The one exception to "one statement" is the claim under a duplicate-intent window, an
//! explicit transaction of four statements ([`DUPLICATE_LOCK`], [`DUPLICATE`], [`CLAIM`],
//! `COMMIT`): a check for another key's record cannot be made atomic with the insert by the
//! unique key, so an advisory lock per request serialises the claims that could race, and the
//! check runs as a statement of its own after the lock is granted, so that its snapshot holds
//! the previous holder's commit.
//!
//! One subtlety of READ COMMITTED is handled in code, not SQL: the snapshot of a statement is
//! taken when it starts, so in the claim statement the branch that reads the existing row may
//! not see a row that a concurrent claim committed while this statement waited on the unique
//! index. The statement then returns nothing; the caller detects "neither inserted nor found"
//! and reads again with a new statement, hence a new snapshot.

use idemgate_core::record::Row;

/// The columns of `operations`, in the order of [`Row`]'s fields.
macro_rules! columns {
    () => {
        "tenant, key, tool, tool_version, fingerprint, canonicalization, status, fence, \
         lease_owner, lease_expires_at, dispatch, job_id, effect_reference, result, error_code, \
         error_message, actor, request, approved_by, created_at, updated_at, expires_at, purge_at, \
         intent_window"
    };
}

/// What a claim returns for the row it inserted, in the place of [`columns`]: the key, and a
/// NULL for every other column (`UNION ALL` gives each the type of the other branch's column).
/// The caller answers with the record it sent, which is the row as inserted, so the server
/// neither forms nor sends a copy of it, and the caller does not decode one.
macro_rules! inserted_columns {
    () => {
        "tenant, key, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
         NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL"
    };
}

/// What a transition returns of the row it wrote: the columns it does not set. With the
/// state, fence and time the caller sent they make the row as written, so the server does not
/// send back the result and state it was just given, and the caller does not decode them.
/// The request, approver, fingerprint and expiry are returned even when the transition set
/// them, so that the rebuilt row never depends on which of them it set (as in the SQLite
/// store's read-back).
macro_rules! unset_columns {
    () => {
        "tool, tool_version, fingerprint, canonicalization, actor, request, approved_by, \
         created_at, expires_at, purge_at, intent_window"
    };
}

/// Reads one record by key.
pub(crate) const GET: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM operations WHERE tenant = $1 AND key = $2"
);

/// Claim-or-load in one round trip. `$1..$23` and `$25` are the row (`$25` its
/// `intent_window`), `$24` its first trace entries (`idemgate_core::trace::encode`).
///
/// The trace goes into the inserted row, so an existing key's row is left untouched: no tuple
/// written, no transaction id taken. The second branch reads the existing row from the statement's snapshot; when the insert
/// happened, that snapshot cannot contain the new row, so at most one row is returned — except
/// in one race (the existing row was purged after our snapshot and we inserted anew), where the
/// caller prefers the inserted row.
pub(crate) const CLAIM: &str = concat!(
    "WITH ins AS (
        INSERT INTO operations (",
    columns!(),
    ", trace)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                $18, $19, $20, $21, $22, $23, $25, $24)
        ON CONFLICT (tenant, key) DO NOTHING
        RETURNING tenant, key
    )
    SELECT true AS inserted, ",
    inserted_columns!(),
    " FROM ins
    UNION ALL
    SELECT false AS inserted, ",
    columns!(),
    " FROM operations WHERE tenant = $1 AND key = $2"
);

/// One fenced compare-and-set with its trace entries, in one statement.
///
/// `$1..$5` are the expectation (tenant, key, fence, status, lease expired by — NULL when the
/// transition is no takeover); `$6..$15` the new state's columns; `$16` whether to replace the
/// request and `$17` its new value; `$18` a new approver and `$19` a new fingerprint, each NULL
/// to keep the stored one; `$20` the time; `$21` the trace entries to append
/// (`idemgate_core::trace::encode`); `$22` and `$23` the new `expires_at` and `purge_at`, both
/// NULL to keep the stored ones (a transition's expiry sets both or neither); `$24` the
/// expected dispatch marker, NULL for any; `$25` the expected `created_at` (which life of the
/// key). Returns the columns of [`unset_columns`] of the row it wrote (`read_written`), nothing
/// when the expectation no longer held.
pub(crate) const TRANSITION: &str = concat!(
    "WITH upd AS (
        UPDATE operations SET
            status = $6, fence = $7, lease_owner = $8, lease_expires_at = $9, dispatch = $10,
            job_id = $11, effect_reference = $12, result = $13, error_code = $14,
            error_message = $15,
            request = CASE WHEN $16::boolean THEN $17::text ELSE request END,
            approved_by = COALESCE($18::text, approved_by),
            fingerprint = COALESCE($19::text, fingerprint),
            expires_at = COALESCE($22::bigint, expires_at),
            purge_at = COALESCE($23::bigint, purge_at),
            updated_at = $20,
            trace = trace || $21::text
        WHERE tenant = $1 AND key = $2 AND fence = $3 AND status = $4 AND created_at = $25
          AND ($5::bigint IS NULL OR lease_expires_at <= $5::bigint)
          AND ($24::text IS NULL OR dispatch = $24::text)
        RETURNING ",
    unset_columns!(),
    "
    )
    SELECT ",
    unset_columns!(),
    " FROM upd"
);

/// Many claims in one statement (see `batch`): `$1..$23` are the rows as parallel arrays, one
/// per column of [`Row`] (`$25` the `intent_window`), sorted by (tenant, key) with no key twice;
/// `$24` each row's first trace entries.
///
/// Rows are inserted in array order (`ORDER BY ord`), which is the lock order. Each key is
/// decided on the unique index as in [`CLAIM`]; a key that existed keeps its row and trace. The last branch reads the rows that existed, from
/// the statement's snapshot, which cannot contain the rows this statement inserted. It is a
/// lateral subquery fenced by `OFFSET 0` rather than a join, so that its plan is one lookup by
/// key per input row whatever the statistics: as a join, the planner was free to hash the input
/// against a scan of the whole table, and on an empty table (where every plan costs nothing)
/// that is the generic plan it cached.
pub(crate) const CLAIM_BATCH: &str = concat!(
    "WITH input AS (
        SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                             $6::bigint[], $7::text[], $8::bigint[], $9::text[], $10::bigint[],
                             $11::text[], $12::text[], $13::text[], $14::text[], $15::text[],
                             $16::text[], $17::text[], $18::text[], $19::text[], $20::bigint[],
                             $21::bigint[], $22::bigint[], $23::bigint[], $25::boolean[],
                             $24::text[])
            WITH ORDINALITY AS i(",
    columns!(),
    ", trace, ord)
    ), ins AS (
        INSERT INTO operations (",
    columns!(),
    ", trace)
        SELECT ",
    columns!(),
    ", trace FROM input ORDER BY ord
        ON CONFLICT (tenant, key) DO NOTHING
        RETURNING tenant, key
    )
    SELECT true AS inserted, ",
    inserted_columns!(),
    " FROM ins
    UNION ALL
    SELECT false AS inserted, existing.* FROM input,
         LATERAL (SELECT ",
    columns!(),
    " FROM operations
                  WHERE operations.tenant = input.tenant AND operations.key = input.key
                  OFFSET 0) AS existing"
);

/// Many fenced compare-and-sets in one statement (see `batch`), for `rows` transitions. The
/// parameters are those of [`TRANSITION`] as parallel arrays, `$1..$20`, sorted by (tenant,
/// key) with no key twice, then each transition's trace entries to append `$21`, its new
/// `expires_at` and `purge_at`, `$22` and `$23` (NULL to keep the stored ones), its expected
/// dispatch marker `$24` and its expected `created_at` `$25`. Returns the position of each
/// transition that applied, then the columns of its row it did not set ([`unset_columns`]). Positions past the arrays' length
/// read NULL and match no row, so a batch may be sent with a statement for more rows than it
/// has (the batcher rounds a batch of more than eight rows up to a power of two, so that a
/// connection prepares a handful of these, not one per size).
///
/// Each row is its own `UPDATE` in its own CTE, the single [`TRANSITION`] with array elements
/// for parameters: a lookup by key, fenced and re-checked on the newest row version after a
/// wait exactly like the single statement, with a plan that cannot be anything else. One
/// `UPDATE … FROM unnest(…)` would be shorter, but its generic plan cached on an empty table
/// (where every plan costs nothing) was a hash join of the input with a scan of every row.
/// The CTEs run in the order the final `UNION ALL` reads them, which is the sorted order, so
/// rows are locked in (tenant, key) order.
pub(crate) fn transition_batch(rows: usize) -> String {
    let mut sql = String::from("WITH ");
    for n in 1..=rows {
        let at = |p: usize, ty: &str| format!("(${p}::{ty}[])[{n}]");
        sql.push_str(&format!(
            "u{n} AS (
        UPDATE operations SET
            status = {status}, fence = {fence}, lease_owner = {owner},
            lease_expires_at = {expires}, dispatch = {dispatch}, job_id = {job},
            effect_reference = {reference}, result = {result}, error_code = {code},
            error_message = {message},
            request = CASE WHEN {replace} THEN {request} ELSE request END,
            approved_by = COALESCE({approver}, approved_by),
            fingerprint = COALESCE({fingerprint}, fingerprint),
            expires_at = COALESCE({expires_at}, expires_at),
            purge_at = COALESCE({purge_at}, purge_at),
            updated_at = {now},
            trace = trace || {trace}
        WHERE tenant = {tenant} AND key = {key} AND fence = {expect_fence}
          AND status = {expect_status} AND created_at = {expect_created}
          AND ({expired_by} IS NULL OR lease_expires_at <= {expired_by})
          AND ({expect_dispatch} IS NULL OR dispatch = {expect_dispatch})
        RETURNING {n}::bigint AS ord, {columns}
    ), ",
            tenant = at(1, "text"),
            key = at(2, "text"),
            expect_fence = at(3, "bigint"),
            expect_status = at(4, "text"),
            expired_by = at(5, "bigint"),
            status = at(6, "text"),
            fence = at(7, "bigint"),
            owner = at(8, "text"),
            expires = at(9, "bigint"),
            dispatch = at(10, "text"),
            job = at(11, "text"),
            reference = at(12, "text"),
            result = at(13, "text"),
            code = at(14, "text"),
            message = at(15, "text"),
            replace = at(16, "boolean"),
            request = at(17, "text"),
            approver = at(18, "text"),
            fingerprint = at(19, "text"),
            now = at(20, "bigint"),
            trace = at(21, "text"),
            expires_at = at(22, "bigint"),
            purge_at = at(23, "bigint"),
            expect_dispatch = at(24, "text"),
            expect_created = at(25, "bigint"),
            columns = unset_columns!(),
        ));
    }
    sql.push_str("upd AS (\n        ");
    let union: Vec<String> = (1..=rows).map(|n| format!("SELECT * FROM u{n}")).collect();
    sql.push_str(&union.join("\n        UNION ALL "));
    sql.push_str(concat!(
        "
    )
    SELECT ord, ",
        unset_columns!(),
        " FROM upd"
    ));
    sql
}

/// Appends trace entries; `$1, $2` the tenant and key, `$3` the encoded entries. A key without
/// a record matches no row and nothing is written: a trace is never read without its record.
/// No indexed column changes, so PostgreSQL can make it a heap-only update.
pub(crate) const APPEND_EVENTS: &str =
    "UPDATE operations SET trace = trace || $3::text WHERE tenant = $1 AND key = $2";

/// The stored trace of one operation (`idemgate_core::trace::decode` reads it).
pub(crate) const EVENTS: &str = "SELECT trace FROM operations WHERE tenant = $1 AND key = $2";

/// The records of one status in one environment, across tenants (`/metrics`' reconciliation
/// queue). The environment is the key's second part, written as the indexes write it.
pub(crate) const COUNT: &str =
    "SELECT count(*) FROM operations WHERE status = $1 AND split_part(key, ':', 2) = $2";

/// The due scan's statement: the pending and awaiting-approval records of environment `$1`
/// whose deadline (`lease_expires_at`) is at or before `$2`, in (deadline, key) order, at most
/// `$3`; with `after`, only those strictly after the cursor (`$4`, `$5`) in that order.
///
/// Both read one range of the partial index `operations_due` in the answer's order, the
/// environment as its first column (the index's expression, repeated exactly), and stop at the
/// limit. The cursor is a row comparison, which PostgreSQL turns into the lower bound of that
/// range, where `a > x OR (a = x AND b > y)` would only filter. Planned for its values on every
/// call, like every scan whose best plan depends on them.
macro_rules! due {
    ($after:literal) => {
        concat!(
            "SELECT ",
            columns!(),
            " FROM operations
    WHERE status IN ('pending', 'awaiting_approval') AND split_part(key, ':', 2) = $1
      AND lease_expires_at <= $2",
            $after,
            "
    ORDER BY lease_expires_at, key
    LIMIT $3"
        )
    };
}

/// The first page of a due scan.
pub(crate) const DUE: &str = due!("");
/// A later page, after the cursor.
pub(crate) const DUE_AFTER: &str = due!("\n      AND (lease_expires_at, key) > ($4, $5)");

/// The lock a claim under a duplicate-intent window holds until its transaction ends: one per
/// (tenant, tool, fingerprint), `$1` those three joined. Two claims of one request under two
/// keys therefore take turns, so the second one's check sees the first one's insert. The hash
/// is PostgreSQL's own (`hashtextextended`, the hash of hash partitioning, stable across
/// versions), so every gateway process derives the same lock whatever build it runs. Two
/// requests whose hashes collide merely wait for each other.
pub(crate) const DUPLICATE_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))";

/// The text [`DUPLICATE_LOCK`] hashes for a request: tenant, tool and fingerprint, one per line
/// (a tenant has no newline, nor has a fingerprint).
pub(crate) fn duplicate_lock_request(tenant: &str, tool: &str, fingerprint: &str) -> String {
    format!("{tenant}\n{tool}\n{fingerprint}")
}

/// The duplicate-intent check: the earliest record (then the smallest key) of tenant `$1`,
/// tool `$2` and fingerprint `$3`, created at or after `$4`, claimed with the window (the only
/// records `operations_fingerprint` holds, migration 0003), under another key than `$5`, in
/// environment `$6` (environments never mix).
pub(crate) const DUPLICATE: &str = "
    SELECT key FROM operations
    WHERE tenant = $1 AND tool = $2 AND fingerprint = $3 AND created_at >= $4 AND intent_window
      AND key <> $5 AND split_part(key, ':', 2) = $6
    ORDER BY created_at, key
    LIMIT 1";

/// One batch of a retention sweep of one environment, as one statement, so that it commits
/// whole or not at all and its failure classifies exactly like any other write's. `$1` is now,
/// `$2` the most tombstones to purge, `$3` the worker named in the `expired` trace entries, `$4` the
/// environment, `$5` the most records to compact. The store runs a sweep as batches of
/// purges (`$5` = 0) and then batches of compactions (`$2` = 0), see `PgStore::sweep_once`.
///
/// - Purge: at most `$2` tombstones past `purge_at` are deleted, their trace (in the row) with
///   them.
/// - Compact: at most `$5` settled records (`applied`, `failed_permanent`) past `expires_at`
///   become tombstones, each with an `expired` event. The columns cleared are those
///   `Row::set_state` clears for a tombstone: the reference (of an applied record) or the
///   refusal code (of a refused one) is kept, which is the digest of what it settled as; the
///   result, the request and the rest are dropped.
///
/// Each step reads its partial index (migration 0004) from the environment's first due row in
/// (time, key) order and stops at the limit. Every part reads the statement's one snapshot, so
/// a record compacted by this sweep is not yet a tombstone to the purge: it keeps its tombstone
/// until the next sweep even when its purge time has passed too, and the late-arrival policy
/// sees every tombstone at least once. `FOR UPDATE SKIP LOCKED` bounds the work, lets several
/// sweepers run at once without waiting on each other, and leaves alone any row a transition
/// is writing right now; the UPDATE and DELETE repeat their conditions so that they hold on
/// the row version they write. Records that have not settled (pending, awaiting approval,
/// unknown) match neither condition and are never swept.
pub(crate) const SWEEP: &str = "
    WITH purge_due AS (
        SELECT tenant, key FROM operations
        WHERE status = 'tombstone' AND split_part(key, ':', 2) = $4 AND purge_at <= $1
        ORDER BY purge_at, key
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ), purged AS (
        DELETE FROM operations o USING purge_due d
        WHERE o.tenant = d.tenant AND o.key = d.key
          AND o.status = 'tombstone' AND o.purge_at <= $1
        RETURNING o.tenant, o.key
    ), compact_due AS (
        SELECT tenant, key FROM operations
        WHERE status IN ('applied', 'failed_permanent') AND split_part(key, ':', 2) = $4
          AND expires_at <= $1
        ORDER BY expires_at, key
        LIMIT $5
        FOR UPDATE SKIP LOCKED
    ), compacted AS (
        UPDATE operations o SET
            status = 'tombstone', lease_owner = NULL, lease_expires_at = NULL, dispatch = NULL,
            job_id = NULL, result = NULL, error_message = NULL, request = NULL,
            updated_at = $1,
            trace = o.trace || json_build_array('expired', $1::bigint, o.fence, $3::text, NULL)::text
                || E'\n'
        FROM compact_due d
        WHERE o.tenant = d.tenant AND o.key = d.key
          AND o.status IN ('applied', 'failed_permanent')
          AND o.expires_at <= $1
        RETURNING o.tenant, o.key
    )
    SELECT (SELECT count(*) FROM compacted), (SELECT count(*) FROM purged)";

/// An operator's queue of pending records ([`WaitingOn`](idemgate_core::store::WaitingOn)) of
/// environment `$1` and tenant `$2`: with `lease_expired`, claims (not jobs) whose lease ran
/// out at or before `$3`; else accepted jobs. Then the tool and the cursor when given, in that
/// order, and the limit last. The environment expression and the status condition are those
/// of `operations_due` (migration 0004), which holds only the few records in flight.
pub(crate) fn waiting(lease_expired: bool, tool: bool, after: bool) -> String {
    let mut sql = format!(
        "SELECT {} FROM operations WHERE status IN ('pending', 'awaiting_approval') \
         AND status = 'pending' AND split_part(key, ':', 2) = $1 AND tenant = $2",
        columns!()
    );
    let mut n = 2;
    let mut next = || {
        n += 1;
        n
    };
    if lease_expired {
        sql.push_str(&format!(
            " AND lease_expires_at <= ${} AND dispatch <> 'job'",
            next()
        ));
    } else {
        sql.push_str(" AND dispatch = 'job'");
    }
    if tool {
        sql.push_str(&format!(" AND tool = ${}", next()));
    }
    if after {
        sql.push_str(&format!(" AND key > ${}", next()));
    }
    sql.push_str(&format!(" ORDER BY key LIMIT ${}", next()));
    sql
}

/// Builds the listing statement for the filters present, so that each combination gets a plan
/// that uses its index (a single statement with `$n IS NULL OR …` clauses would get a generic
/// plan that can use none). Listings run planned for their values (`Conn::run_planned`).
pub(crate) fn list(
    tenant: bool,
    environment: bool,
    status: bool,
    tool: bool,
    after: bool,
) -> String {
    let mut sql = format!("SELECT {} FROM operations", columns!());
    let mut clauses = Vec::new();
    let mut n = 0;
    let mut next = || {
        n += 1;
        n
    };
    if tenant {
        clauses.push(format!("tenant = ${}", next()));
    }
    if environment {
        // The expression of the environment indexes (migration 0004), exactly: a listing of
        // pending records of an environment reads a range of `operations_due`.
        clauses.push(format!("split_part(key, ':', 2) = ${}", next()));
    }
    if status {
        clauses.push(format!("status = ${}", next()));
    }
    if tool {
        clauses.push(format!("tool = ${}", next()));
    }
    if after {
        clauses.push(format!("key > ${}", next()));
    }
    if !clauses.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&clauses.join(" AND "));
    }
    sql.push_str(&format!(" ORDER BY key LIMIT ${}", next()));
    sql
}

/// The row a transition wrote: `written` (its key, and the state, fence and time it set, as
/// the caller sent them) with the columns of [`unset_columns`] read from a result row,
/// starting at column `offset` (the batch puts the position in front of them).
pub(crate) fn read_written(
    r: &tokio_postgres::Row,
    offset: usize,
    written: Row,
) -> Result<Row, tokio_postgres::Error> {
    let at = |i: usize| offset + i;
    Ok(Row {
        tool: r.try_get(at(0))?,
        tool_version: r.try_get(at(1))?,
        fingerprint: r.try_get(at(2))?,
        canonicalization: r.try_get(at(3))?,
        actor: r.try_get(at(4))?,
        request: r.try_get(at(5))?,
        approved_by: r.try_get(at(6))?,
        created_at: r.try_get(at(7))?,
        expires_at: r.try_get(at(8))?,
        purge_at: r.try_get(at(9))?,
        intent_window: r.try_get(at(10))?,
        ..written
    })
}

/// Reads the operation columns of a result row, starting at column `offset` (the claim puts a
/// flag in front of them). Columns are read by position: the statements above list them in
/// the order of [`Row`]'s fields.
pub(crate) fn read_row(
    r: &tokio_postgres::Row,
    offset: usize,
) -> Result<Row, tokio_postgres::Error> {
    let at = |i: usize| offset + i;
    Ok(Row {
        tenant: r.try_get(at(0))?,
        key: r.try_get(at(1))?,
        tool: r.try_get(at(2))?,
        tool_version: r.try_get(at(3))?,
        fingerprint: r.try_get(at(4))?,
        canonicalization: r.try_get(at(5))?,
        status: r.try_get(at(6))?,
        fence: r.try_get(at(7))?,
        lease_owner: r.try_get(at(8))?,
        lease_expires_at: r.try_get(at(9))?,
        dispatch: r.try_get(at(10))?,
        job_id: r.try_get(at(11))?,
        effect_reference: r.try_get(at(12))?,
        result: r.try_get(at(13))?,
        error_code: r.try_get(at(14))?,
        error_message: r.try_get(at(15))?,
        actor: r.try_get(at(16))?,
        request: r.try_get(at(17))?,
        approved_by: r.try_get(at(18))?,
        created_at: r.try_get(at(19))?,
        updated_at: r.try_get(at(20))?,
        expires_at: r.try_get(at(21))?,
        purge_at: r.try_get(at(22))?,
        intent_window: r.try_get(at(23))?,
    })
}
