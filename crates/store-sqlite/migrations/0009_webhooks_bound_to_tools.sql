-- Webhook events are bound to the tools their source may finish (DESIGN.md section 12): an
-- event that arrives before its job id is recorded keeps the environment it arrived in and the
-- source's tools, and is applied only to a job of one of those tools in that environment.
-- Before this, an early row carried the tenant and the job id alone, and the first job of any
-- tool that recorded the same id took it.
--
-- `tools` is a JSON array of tool names, as the source was configured when the event arrived.
-- Rows written before this migration keep both columns NULL, and a NULL row is never applied
-- as an early arrival: its tool cannot be known, and a poll finishes the job instead.
ALTER TABLE webhook_events ADD COLUMN environment TEXT;
ALTER TABLE webhook_events ADD COLUMN tools TEXT;

-- An `unknown` record that was waiting on a job keeps the job id as its evidence; a later
-- event or poll that reports the job's end settles it (DESIGN.md section 3, "Waiting is not
-- ambiguity"). Found by the same lookup as a pending job, so an event is bound among both.
-- Partial: only unknown records of jobs are in it, the few of the reconciliation queue, and no
-- write on a delivery's path (claim, applied) touches it.
CREATE INDEX operations_unknown_by_job ON operations (tenant, job_id)
    WHERE status = 'unknown' AND job_id IS NOT NULL;
