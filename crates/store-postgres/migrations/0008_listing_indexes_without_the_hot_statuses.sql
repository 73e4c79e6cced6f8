-- Fewer index entries per operation, as on SQLite (its migration 0004, part 3): the listing
-- indexes by status hold only the statuses an operator looks for by status. Every unique
-- call inserted its pending row into both (`(status, key)` and `(tenant, status, key)`), and
-- its finalise, which changes the status and so cannot be a heap-only update, inserted the
-- applied row into both again: four of the operation's index entries, for listings that
-- neither the executor nor the recoverer makes. Pending and awaiting-approval rows are the few
-- in flight, all in the partial index `operations_due` (led by the environment), which a
-- listing of them reads; applied rows are most of the table, and a listing of them reads the
-- primary key in key order, the listing's own order, skipping the other statuses' rows.
DROP INDEX operations_by_status;
CREATE INDEX operations_by_status ON operations (status, key)
    WHERE status <> 'pending' AND status <> 'applied';

DROP INDEX operations_by_tenant_status;
CREATE INDEX operations_by_tenant_status ON operations (tenant, status, key)
    WHERE status <> 'pending' AND status <> 'applied';
