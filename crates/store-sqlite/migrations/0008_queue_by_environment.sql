-- The reconciliation queue's first page, as the console and the API read it: one tenant's
-- records of one status in one environment, in key order, with no tool named. The listing
-- index of migration 0004 leads with (tenant, status, tool): without a tool it could only
-- gather every record of the status and sort them, and a queue of 10 000 unknown records
-- took 170 ms for its first page on a file of a million (BENCHMARKS.md, "Cost as the store
-- grows"). This one is read in key order from the page's first key and stops after the page.
-- It holds the same rows as that index (neither pending nor applied ones, which would cost
-- every claim and finalise an index write) and repeats its condition, which the listing
-- repeats word for word.
CREATE INDEX operations_queue ON operations (tenant, environment, status, key)
    WHERE status <> 'pending' AND status <> 'applied';
