-- The trace moves into the operation's row, as on SQLite (its migration 0004; the stored form
-- is `idemgate_core::trace`): one JSON array per entry (`[kind, at, attempt, worker, detail]`),
-- each ended by a newline, oldest first, appended with `trace = trace || $n`. The events table
-- cost every claim and every transition one more heap tuple and two index entries per entry
-- (its primary key and `events_by_key`), written in the same statement as the row: on a unique
-- call, six tuples and twelve index entries beside the operation's own. Every transition
-- rewrites the row anyway, so the entries ride along with it. The column comes last, and no
-- statement but the trace's read selects it.
--
-- Existing entries are carried over in the order they were appended (`id`); entries whose
-- record is gone (appended after a purge) were never read, and are not. Carrying them over
-- writes a new version of every row that has a trace, in the migration's one transaction:
-- on a large database, plan the upgrade for the time a full-table update takes there (and a
-- VACUUM after it), with the gateways of the older build stopped.
ALTER TABLE operations ADD COLUMN trace text NOT NULL DEFAULT '';
UPDATE operations o SET trace = t.text
FROM (
    SELECT tenant, key,
           string_agg(json_build_array(kind, at, attempt, worker, detail)::text || E'\n', ''
                      ORDER BY id) AS text
    FROM events
    GROUP BY tenant, key
) t
WHERE o.tenant = t.tenant AND o.key = t.key;
DROP TABLE events;
