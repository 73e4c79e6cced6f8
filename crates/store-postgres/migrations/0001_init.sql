-- The first schema: one row per operation, one column per field of `idemgate_core::record::Row`,
-- and the append-only event trace.
--
-- Keys and tenants use the "C" collation: listing is ordered by key and paged with `key > $after`,
-- and that order must be plain byte order, the same as in SQLite, whatever the database's default
-- collation is. A locale-aware collation would also make every key comparison slower.
--
-- Times and the fence are bigint (epoch milliseconds, attempt number). `result` and `request` are
-- text rather than jsonb: jsonb would reorder members and drop duplicate whitespace, and the
-- stored bytes are replayed to callers exactly as they were written.
CREATE TABLE operations (
    tenant            text COLLATE "C" NOT NULL,
    key               text COLLATE "C" NOT NULL,
    tool              text COLLATE "C" NOT NULL,
    tool_version      text NOT NULL,
    fingerprint       text COLLATE "C" NOT NULL,
    canonicalization  bigint NOT NULL,
    status            text COLLATE "C" NOT NULL CHECK (status IN
                          ('pending', 'awaiting_approval', 'applied', 'failed_permanent',
                           'unknown', 'tombstone')),
    fence             bigint NOT NULL,
    lease_owner       text,
    lease_expires_at  bigint,
    dispatch          text COLLATE "C",
    job_id            text,
    effect_reference  text,
    result            text,
    error_code        text,
    error_message     text,
    actor             text NOT NULL,
    request           text,
    approved_by       text,
    created_at        bigint NOT NULL,
    updated_at        bigint NOT NULL,
    expires_at        bigint NOT NULL,
    purge_at          bigint NOT NULL,
    -- Every query is scoped by tenant, and a claim is decided by this unique constraint.
    PRIMARY KEY (tenant, key)
);

-- Listing across tenants, in key order. (Listing within a tenant walks the primary key.)
CREATE INDEX operations_by_key ON operations (key);
-- Listing by status, with and without a tenant; `status = 'unknown'` is the reconciliation queue.
-- The key comes last so that a page is read in key order without a sort.
CREATE INDEX operations_by_status ON operations (status, key);
CREATE INDEX operations_by_tenant_status ON operations (tenant, status, key);
-- Listing one tool of one tenant.
CREATE INDEX operations_by_tenant_tool ON operations (tenant, tool, key);

-- The recoverer's scans. Only pending rows are indexed: they are the few in flight, while
-- terminal rows grow without bound. The same small index serves the scan for jobs to poll and
-- released claims, which filters the pending rows instead of ranging over expiry.
CREATE INDEX operations_recoverable ON operations (lease_expires_at) WHERE status = 'pending';

-- The duplicate-intent window: the same fingerprint under another key, recently.
CREATE INDEX operations_fingerprint ON operations (tenant, tool, fingerprint, created_at);

-- Retention. Each partial index holds only the rows its sweep step can touch, and the sweep's
-- statements repeat these WHERE clauses word for word so that the planner can prove they apply.
CREATE INDEX operations_expiring ON operations (expires_at)
    WHERE status IN ('applied', 'failed_permanent', 'awaiting_approval');
CREATE INDEX operations_purgeable ON operations (purge_at) WHERE status = 'tombstone';

-- The trace. A bigserial id keeps growing after purges, so "ordered by id" is "ordered by append".
-- There is deliberately no foreign key to `operations`: a trace entry may be appended for a key
-- whose record is being purged at the same moment, and the append must not fail for that.
CREATE TABLE events (
    id       bigserial PRIMARY KEY,
    tenant   text COLLATE "C" NOT NULL,
    key      text COLLATE "C" NOT NULL,
    kind     text NOT NULL,
    at       bigint NOT NULL,
    attempt  bigint NOT NULL,
    worker   text NOT NULL,
    detail   text
);

CREATE INDEX events_by_key ON events (tenant, key, id);
