-- The operations table becomes an ordinary rowid table, its primary key (tenant, key) an index
-- beside it (BENCHMARKS.md, "Where the 8-thread difference goes").
--
-- WITHOUT ROWID (migration 0001) stored each row in the primary key's own b-tree, for one
-- descent per claim or read instead of two. That layout suits short rows, and these are not: a
-- settled record is some 650 bytes, and such a b-tree's interior pages hold whole rows, five or
-- six to a page, so every write dirtied a deep path of pages besides its leaf (an 8-thread run's
-- commit wrote 9.3 log pages, 6.7 of them this table's). As a rowid table the rows are appended
-- in order of claim, the few in flight share the last leaves, and the interior pages hold only
-- rowids; the key's index holds the two key columns alone. Measured, the same store throughput
-- rose by 8% (the Rust library path) and 12% (in process) at 8 threads, unchanged at 1; a
-- point read is now two descents (the key's index, then the row), which made replays of keys
-- drawn uniformly among ten million 22% slower (docs/benchmarks/history.md, "The operations
-- table as a rowid table").
--
-- SQLite cannot change a table's layout in place: the table is rebuilt in this migration's own
-- transaction (create, copy, drop, rename, then its indexes again, as the earlier migrations left
-- them but one, below), so a crash leaves the file at version 9 with the old table intact.
-- The stored columns keep their order, `trace` last (migration 0004); `environment` stays a
-- virtual column (migration 0005), never copied. Nothing else refers to this table: no
-- trigger, view or foreign key.

CREATE TABLE operations_rebuilt (
    tenant            TEXT    NOT NULL,
    key               TEXT    NOT NULL,
    tool              TEXT    NOT NULL,
    tool_version      TEXT    NOT NULL,
    fingerprint       TEXT    NOT NULL,
    canonicalization  INTEGER NOT NULL,
    status            TEXT    NOT NULL,
    fence             INTEGER NOT NULL,
    lease_owner       TEXT,
    lease_expires_at  INTEGER,
    dispatch          TEXT,
    job_id            TEXT,
    effect_reference  TEXT,
    result            TEXT,
    error_code        TEXT,
    error_message     TEXT,
    actor             TEXT    NOT NULL,
    request           TEXT,
    approved_by       TEXT,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    expires_at        INTEGER NOT NULL,
    purge_at          INTEGER NOT NULL,
    intent_window     INTEGER NOT NULL DEFAULT 0,
    trace             TEXT    NOT NULL DEFAULT '',
    environment       TEXT GENERATED ALWAYS AS (
        substr(key, instr(key, ':') + 1, instr(substr(key, instr(key, ':') + 1), ':') - 1)
    ) VIRTUAL,
    PRIMARY KEY (tenant, key)
);

INSERT INTO operations_rebuilt (
    tenant, key, tool, tool_version, fingerprint, canonicalization, status, fence, lease_owner,
    lease_expires_at, dispatch, job_id, effect_reference, result, error_code, error_message,
    actor, request, approved_by, created_at, updated_at, expires_at, purge_at, intent_window,
    trace)
SELECT
    tenant, key, tool, tool_version, fingerprint, canonicalization, status, fence, lease_owner,
    lease_expires_at, dispatch, job_id, effect_reference, result, error_code, error_message,
    actor, request, approved_by, created_at, updated_at, expires_at, purge_at, intent_window,
    trace
FROM operations;

DROP TABLE operations;
ALTER TABLE operations_rebuilt RENAME TO operations;

-- An index of a rowid table ends with the rowid where one of a WITHOUT ROWID table ended with
-- the key: the duplicate-intent lookup, which reads its first match in (time, key) order, now
-- names the key itself. The other indexes already end with the key where an order needs it.
CREATE INDEX operations_fingerprint ON operations (tenant, tool, fingerprint, created_at, key)
    WHERE intent_window;
CREATE INDEX operations_list_by_tenant ON operations (tenant, status, tool, key)
    WHERE status <> 'pending' AND status <> 'applied';
CREATE INDEX operations_due ON operations (environment, lease_expires_at, key)
    WHERE status = 'pending' OR status = 'awaiting_approval';
CREATE INDEX operations_expiring ON operations (environment, expires_at, key)
    WHERE status = 'applied' OR status = 'failed_permanent';
CREATE INDEX operations_purgeable ON operations (environment, purge_at, key)
    WHERE status = 'tombstone';
CREATE INDEX operations_by_job ON operations (tenant, job_id)
    WHERE status = 'pending' AND dispatch = 'job';
CREATE INDEX operations_queue ON operations (tenant, environment, status, key)
    WHERE status <> 'pending' AND status <> 'applied';
CREATE INDEX operations_unknown_by_job ON operations (tenant, job_id)
    WHERE status = 'unknown' AND job_id IS NOT NULL;
