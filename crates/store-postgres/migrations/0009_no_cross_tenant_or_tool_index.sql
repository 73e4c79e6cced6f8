-- Two fewer index entries on every claim and two on every finalise, as on SQLite (its migration
-- 0002 dropped the listing index without a tenant, and it never had one by tool).
--
-- `operations_by_key` ordered every record across tenants for a listing without a tenant, which
-- no caller makes: the API, the console and `idemgate` list within the caller's tenant (the
-- primary key, `(tenant, key)`, in key order), and the one listing across tenants, the
-- reconciliation-queue gauge of `/metrics`, lists by status and reads `operations_by_status`.
-- A listing without a tenant and without a status still works, with a sort.
--
-- `operations_by_tenant_tool` served a listing of one tool of a tenant; such a listing now reads
-- the tenant's primary-key range in key order and keeps the rows of that tool until the page is
-- full, as a listing of applied records already does (migration 0008), or, with a status other
-- than pending and applied, the few rows of `operations_by_tenant_status`. Both indexes took an
-- entry for the pending row of every claim and another for its applied row at the finalise
-- (the finalise changes the status, so it is never a heap-only update), for listings the
-- executor, the recoverer and the sweeper never make.
--
-- A lookup by key is left with the primary key alone, which the `plans` test checks.
DROP INDEX IF EXISTS operations_by_key;
DROP INDEX IF EXISTS operations_by_tenant_tool;
