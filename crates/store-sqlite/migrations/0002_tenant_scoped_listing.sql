-- Every listing the gateway serves is scoped by tenant, and the recoverer and the sweeper have
-- partial indexes of their own: the listing index without a tenant only cost index maintenance
-- on every claim and every transition. A listing across tenants still works, with a scan.
DROP INDEX IF EXISTS operations_list;
