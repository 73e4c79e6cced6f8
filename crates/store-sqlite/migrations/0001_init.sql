-- The first schema: one row per operation, one column per field of `idemgate_core::record::Row`,
-- and the append-only event trace.

-- The primary key is (tenant, key) so that every query is scoped by tenant and a claim is decided
-- by the unique constraint. WITHOUT ROWID stores the rows in the primary-key b-tree itself: a
-- claim or a get is one b-tree descent instead of two.
CREATE TABLE operations (
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
    PRIMARY KEY (tenant, key)
) WITHOUT ROWID;

-- Listing (`GET /v1/operations?status=..&tool=..`), with and without a tenant. The key comes last
-- so that a filter on status and tool reads its page in key order without sorting.
CREATE INDEX operations_list ON operations (status, tool, key);
CREATE INDEX operations_list_by_tenant ON operations (tenant, status, tool, key);

-- The recoverer's scan. Only pending rows are indexed: they are the few in flight, while
-- applied rows grow without bound.
CREATE INDEX operations_recoverable ON operations (lease_expires_at) WHERE status = 'pending';

-- The duplicate-intent window: the same fingerprint under another key, recently.
CREATE INDEX operations_fingerprint ON operations (tenant, tool, fingerprint, created_at);

-- Retention. Each partial index holds only the rows its sweep step can touch, and the sweep's
-- queries repeat these WHERE clauses word for word so that SQLite can use them.
CREATE INDEX operations_expiring ON operations (expires_at)
    WHERE status IN ('applied', 'failed_permanent', 'awaiting_approval');
CREATE INDEX operations_purgeable ON operations (purge_at) WHERE status = 'tombstone';

-- The trace. AUTOINCREMENT keeps ids growing even after the newest rows were purged, so that
-- "ordered by id" stays "ordered by time of append".
CREATE TABLE events (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant   TEXT    NOT NULL,
    key      TEXT    NOT NULL,
    kind     TEXT    NOT NULL,
    at       INTEGER NOT NULL,
    attempt  INTEGER NOT NULL,
    worker   TEXT    NOT NULL,
    detail   TEXT
);

CREATE INDEX events_by_key ON events (tenant, key, id);
