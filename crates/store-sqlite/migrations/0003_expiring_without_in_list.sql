-- The retention index's condition as a chain of equalities instead of an IN list. SQLite checks
-- a partial index's condition on every insert and update of the table, and it evaluates an IN
-- list of three or more values through a temporary table built for the statement: three of
-- them per claim and finalise, measured at some 20% of the writer's instructions. The sweep's
-- query repeats this condition word for word.
DROP INDEX IF EXISTS operations_expiring;
CREATE INDEX operations_expiring ON operations (expires_at)
    WHERE status = 'applied' OR status = 'failed_permanent' OR status = 'awaiting_approval';
