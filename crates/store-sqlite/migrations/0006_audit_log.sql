-- The operator actions' audit log: one row per approval, denial or resolution, written in the
-- transaction of the transition it records. `seq` is the chain's order (the last row is its
-- head); the columns are the exported entry's fields, hashes, keys and signatures as hex. The
-- log is never swept: retention applies to operations, not to the record of what people did.
CREATE TABLE audit_log (
    seq INTEGER PRIMARY KEY,
    at INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    environment TEXT NOT NULL,
    operation_key TEXT NOT NULL,
    tool TEXT NOT NULL,
    action TEXT NOT NULL,
    actor TEXT NOT NULL,
    reason TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL,
    reference TEXT,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL,
    public_key TEXT,
    signature TEXT
) STRICT;
