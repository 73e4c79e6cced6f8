-- The operator actions' audit log: one row per approval, denial or resolution, written in the
-- transaction of the transition it records. The columns are the exported entry's fields,
-- hashes, keys and signatures as hex. The log is never swept.
CREATE TABLE audit_log (
    seq bigint PRIMARY KEY,
    at bigint NOT NULL,
    tenant text NOT NULL,
    environment text NOT NULL,
    operation_key text NOT NULL,
    tool text NOT NULL,
    action text NOT NULL,
    actor text NOT NULL,
    reason text NOT NULL,
    fingerprint text NOT NULL,
    status text NOT NULL,
    reference text,
    prev_hash text NOT NULL,
    hash text NOT NULL,
    public_key text,
    signature text
);

-- The chain's head, one row. Every appender locks it (`SELECT … FOR UPDATE`) in its own
-- transaction before it seals an entry, so gateways sharing the database append one at a time
-- and each entry follows the one committed before it. It is locked after the operation's row,
-- always in that order, so two appenders cannot deadlock.
CREATE TABLE audit_head (
    id integer PRIMARY KEY CHECK (id = 1),
    seq bigint NOT NULL,
    hash text NOT NULL
);
INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, repeat('0', 64));
