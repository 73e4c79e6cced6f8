-- Webhook intake (`POST /v1/webhooks/{source}`): one row per verified event, keyed by the
-- sender's identity of the delivery, (source, event id), and kept for at least the sender's
-- retry window (`purge_at`), so that a redelivery finds it and changes nothing. A row that
-- finished a job commits in the same transaction as that transition.
--
-- `disposition` says what the event did (`idemgate_core::webhook::Disposition`); `finish`
-- holds, for an early arrival only, the receipt or refusal to record once its job id appears.
-- Numbered after the audit log's migration, developed at the same time.
CREATE TABLE webhook_events (
    source       text   NOT NULL,
    event_id     text   NOT NULL,
    tenant       text   NOT NULL,
    job_id       text,
    key          text,
    disposition  text   NOT NULL,
    finish       text,
    received_at  bigint NOT NULL,
    purge_at     bigint NOT NULL,
    PRIMARY KEY (source, event_id)
);

-- The events that named a job: early arrivals waiting for it, and the ones that bound it.
CREATE INDEX webhook_events_by_job ON webhook_events (tenant, job_id) WHERE job_id IS NOT NULL;
-- The sweep's range.
CREATE INDEX webhook_events_purgeable ON webhook_events (purge_at);

-- A pending job found by its id, for an event that names the job rather than the operation.
-- Partial, with a predicate no lookup by key implies (see 0002): the hot statements cannot
-- use it, and only records waiting on a job are in it.
CREATE INDEX operations_by_job ON operations (tenant, job_id)
    WHERE status = 'pending' AND dispatch = 'job';
