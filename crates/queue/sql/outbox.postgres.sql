-- idemgate's outbox, in the application's own PostgreSQL database (not idemgate's store).
-- One row per job enqueued in a business transaction; `sent_at` is set once a publisher's
-- message was accepted by the queue. The envelope carries the operation key's parts; the
-- row's id is the publisher's bookkeeping, never the operation's identity.
CREATE TABLE IF NOT EXISTS idemgate_outbox (
    id           BIGSERIAL PRIMARY KEY,
    workflow_id  TEXT   NOT NULL,
    step_id      TEXT   NOT NULL,
    tool         TEXT   NOT NULL,
    envelope     TEXT   NOT NULL,
    created_at   BIGINT NOT NULL,
    -- Publications of this row so far: each may have reached the queue.
    attempts     INTEGER NOT NULL DEFAULT 0,
    sent_at      BIGINT
);
CREATE INDEX IF NOT EXISTS idemgate_outbox_unsent ON idemgate_outbox (id) WHERE sent_at IS NULL;
