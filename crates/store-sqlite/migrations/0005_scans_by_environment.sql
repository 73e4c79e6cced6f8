-- Recovery and retention are scoped by environment (DESIGN.md section 3: environments never
-- mix), and an approval now has a deadline of its own that the recoverer finds, instead of
-- expiring by compaction.

-- 1. The environment, the key's second part, as a column the indexes below can lead with. It
-- is VIRTUAL, computed from `key` whenever it is read or indexed, for two reasons: SQLite can
-- only add a VIRTUAL generated column to an existing table (a STORED one would need the table
-- rebuilt), and a virtual column occupies no space in the stored row, so `trace` stays the last
-- column of the record as it is laid out on disk (see migration 0004: reading the other columns
-- never reads past the trace). It is not among the columns the store reads back into a record;
-- the key already says it. Key parts never contain `:`, so the environment is whatever lies
-- between the first and the second colon.
ALTER TABLE operations ADD COLUMN environment TEXT GENERATED ALWAYS AS (
    substr(key, instr(key, ':') + 1, instr(substr(key, instr(key, ':') + 1), ':') - 1)
) VIRTUAL;

-- 2. An awaiting-approval record keeps its deadline in `lease_expires_at` (`Row::set_state`).
-- Until now such a record expired by compaction at `expires_at`; that instant becomes its
-- approval deadline, at which the recoverer now expires it with an ordinary transition.
UPDATE operations SET lease_expires_at = expires_at WHERE status = 'awaiting_approval';

-- 3. The due scan: pending and awaiting-approval records of one environment, in deadline and
-- key order, read as a range of this index from the cursor on. Both statuses are the few
-- records in flight, so the index stays small while settled rows grow without bound. The
-- condition is a chain of equalities rather than an IN list, for the reason migration 0003
-- gives; the scan and the listing of pending rows repeat it word for word.
DROP INDEX operations_recoverable;
CREATE INDEX operations_due ON operations (environment, lease_expires_at, key)
    WHERE status = 'pending' OR status = 'awaiting_approval';

-- 4. Retention, by environment. Only `applied` and `failed_permanent` records are compacted
-- now: an approval that waits past its deadline is expired by the recoverer, never swept. The
-- key is named last so that each sweep step reads its rows in its own order, (time, key), and
-- stops at its limit without sorting; it costs nothing, since every entry of an index of this
-- table carries the primary key anyway (only the tenant is then appended after it).
DROP INDEX operations_expiring;
CREATE INDEX operations_expiring ON operations (environment, expires_at, key)
    WHERE status = 'applied' OR status = 'failed_permanent';
DROP INDEX operations_purgeable;
CREATE INDEX operations_purgeable ON operations (environment, purge_at, key)
    WHERE status = 'tombstone';
