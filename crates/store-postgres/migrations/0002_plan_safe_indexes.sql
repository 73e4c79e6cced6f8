-- Secondary indexes that a lookup by key cannot use, so that a cached generic plan for the hot
-- statements (read, claim, transition) is a lookup by key whatever the table's statistics say.
--
-- The trap this closes: the store's connections keep PostgreSQL's generic plans for the hot
-- statements. A generic plan is made once per connection, on the statistics of that moment,
-- and kept until the table is analysed again. While `operations` is empty (a fresh database, a
-- TRUNCATE, or a VACUUM after every record was purged) every index costs the same, and the
-- planner picked `operations_fingerprint` for `tenant = $1 AND key = $2`: the tenant prefix as
-- the index condition and `key` as a filter, i.e. every row of the tenant read for each lookup,
-- until autoanalyze replaced the plan. (A sequential scan, which is even cheaper on an empty
-- table, is switched off on the store's connections: see `PgStore::connect`.)
--
-- Each index below is partial, with a predicate that only the statements it exists for imply:
-- `status = $n` implies `status IS NOT NULL` (the operator is strict), and so on. A statement
-- without such a condition (the read by key) cannot use the index at all, so the indexes left
-- to it are the primary key and `operations_by_key`, both lookups by key. The predicates exclude
-- no row (the columns are NOT NULL); they only make the indexes invisible to the wrong query.
-- (That relies on the planner not proving `status IS NOT NULL` from the NOT NULL constraint for
-- a query that says nothing about `status`, true of PostgreSQL 15. The `plans` test checks the
-- plans on the server it runs against, and fails if a version does.)
--
-- The transition (`… AND fence = $3 AND status = $4`) may still use the status indexes, where
-- status and key are both index conditions: also a lookup of one key.
--
-- Rebuilding takes an ordinary (non-concurrent) lock for the duration of each build; on a large
-- table run this migration at a quiet time (`idemgate migrate`).
DROP INDEX operations_by_status;
CREATE INDEX operations_by_status ON operations (status, key) WHERE status IS NOT NULL;

DROP INDEX operations_by_tenant_status;
CREATE INDEX operations_by_tenant_status ON operations (tenant, status, key)
    WHERE status IS NOT NULL;

DROP INDEX operations_by_tenant_tool;
CREATE INDEX operations_by_tenant_tool ON operations (tenant, tool, key) WHERE tool IS NOT NULL;

DROP INDEX operations_fingerprint;
CREATE INDEX operations_fingerprint ON operations (tenant, tool, fingerprint, created_at)
    WHERE fingerprint IS NOT NULL;
