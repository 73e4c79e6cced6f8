-- Outbox entries the queue refused for good (a message over the broker's payload limit):
-- parked here instead of blocking every later entry. One row per parked outbox row, with the
-- broker's reason; the outbox row stays unsent and is no longer offered to a publisher.
-- Idempotent: `install` applies it beside the outbox table, on old and new databases alike.
CREATE TABLE IF NOT EXISTS idemgate_outbox_parked (
    id         BIGINT PRIMARY KEY,
    reason     TEXT   NOT NULL,
    parked_at  BIGINT NOT NULL
);
