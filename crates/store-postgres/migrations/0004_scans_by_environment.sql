-- Recovery and retention are scoped by environment (DESIGN.md section 3: environments never
-- mix), and an approval now has a deadline of its own that the recoverer finds, instead of
-- expiring by compaction.
--
-- The environment, the key's second part (`split_part(key, ':', 2)`: key parts never contain
-- a colon), is indexed as an expression rather than kept in a generated column. A STORED
-- generated column (PostgreSQL 15 has no virtual ones) would make this migration rewrite the
-- whole table under an ACCESS EXCLUSIVE lock, stopping every gateway for as long as that takes
-- on a table of millions of settled rows, and would then be computed and stored again on every
-- claim and transition. An expression index costs only its own build, and the expression is
-- evaluated only where an index entry is written. The statements that scan by environment
-- repeat the expression exactly, as the planner matches an index expression by its form.
--
-- The planner keeps no statistics for the expression of a partial index, and without them
-- guesses that an environment holds half a percent of the table; with settled rows in one
-- environment by the million, it then read every due row of a sweep through a bitmap and sorted
-- them, instead of reading the first hundred in index order and stopping (measured on 20 000
-- rows). Statistics on the expression itself (PostgreSQL 14 and later) give it the true share.
CREATE STATISTICS operations_environment ON (split_part(key, ':', 2)) FROM operations;
ANALYZE operations;
--
-- Every new index is partial, with a predicate on `status` that only its own statements imply
-- (see 0002): a lookup by key says nothing of the status, and the transition's `status = $4`
-- is a parameter in its cached generic plan, so none of these can serve either.
--
-- The builds take ordinary (non-concurrent) locks; on a large table run this migration at a
-- quiet time (`idemgate migrate`).

-- An awaiting-approval record keeps its deadline in `lease_expires_at` (`Row::set_state`).
-- Until now such a record expired by compaction at `expires_at`; that instant becomes its
-- approval deadline, at which the recoverer now expires it with an ordinary transition.
UPDATE operations SET lease_expires_at = expires_at WHERE status = 'awaiting_approval';

-- The due scan: pending and awaiting-approval records of one environment, in deadline and key
-- order, read as one range of this index from the cursor on. Both statuses are the few records
-- in flight, so the index stays small while settled rows grow without bound. It also serves the
-- listing of pending records.
DROP INDEX operations_recoverable;
CREATE INDEX operations_due ON operations (split_part(key, ':', 2), lease_expires_at, key)
    WHERE status IN ('pending', 'awaiting_approval');

-- Retention, by environment, each step read in its own order (time, then key) up to its limit.
-- Only `applied` and `failed_permanent` records are compacted now: an approval that waits past
-- its deadline is expired by the recoverer, never swept.
DROP INDEX operations_expiring;
CREATE INDEX operations_expiring ON operations (split_part(key, ':', 2), expires_at, key)
    WHERE status IN ('applied', 'failed_permanent');
DROP INDEX operations_purgeable;
CREATE INDEX operations_purgeable ON operations (split_part(key, ':', 2), purge_at, key)
    WHERE status = 'tombstone';
