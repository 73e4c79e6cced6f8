-- Fewer b-tree writes per operation: every claim and transition goes through one writer
-- thread, and what it writes besides the row itself bounds the operations per second.

-- 1. Only records claimed under a duplicate-intent window are indexed by fingerprint
-- (`Record::intent_window`): a fingerprint is random, so every claim wrote a leaf page of its
-- own to this index, for a lookup that only contracts with the window make. Records claimed
-- before this version stay findable: they are marked as if every one had the window.
ALTER TABLE operations ADD COLUMN intent_window INTEGER NOT NULL DEFAULT 0;
DROP INDEX operations_fingerprint;
CREATE INDEX operations_fingerprint ON operations (tenant, tool, fingerprint, created_at)
    WHERE intent_window;

-- 2. The trace moves into the operation's row (see src/trace.rs): one JSON array per entry
-- (`[kind, at, attempt, worker, detail]`), each ended by a newline, oldest first, appended
-- with `trace = trace || ?`. The entries table cost two b-tree inserts per entry, a statement
-- journal per append and the AUTOINCREMENT counter: the largest share of every operation's
-- writes. The column comes last, so that reading the others never reads past it. Existing
-- entries are carried over in their order of append; entries whose record is gone (appended
-- after a purge) were never read, and are not.
ALTER TABLE operations ADD COLUMN trace TEXT NOT NULL DEFAULT '';
UPDATE operations SET intent_window = 1, trace = coalesce((
    SELECT group_concat(
        json_array(kind, at, attempt, worker, detail) || char(10),
        '' ORDER BY id)
    FROM events
    WHERE events.tenant = operations.tenant AND events.key = operations.key
), '');
DROP TABLE events;
DELETE FROM sqlite_sequence WHERE name = 'events';

-- 3. The listing index holds only the statuses an operator looks for: neither pending rows (a
-- claim inserted an entry for its pending row, and the finalise moved it to `applied` — a
-- delete and an insert) nor applied ones (in key order, every settled operation wrote a leaf
-- page of its own to this index: a sixth of the log's page writes). Pending rows are the few
-- in flight, all in the partial index `operations_recoverable`, and a listing of them reads
-- that one; applied rows are most of the table, and a listing of them reads the primary key
-- in key order, the listing's own order, skipping the other statuses' rows.
DROP INDEX operations_list_by_tenant;
CREATE INDEX operations_list_by_tenant ON operations (tenant, status, tool, key)
    WHERE status <> 'pending' AND status <> 'applied';
