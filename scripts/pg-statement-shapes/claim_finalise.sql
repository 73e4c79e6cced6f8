-- A unique call's two statements as the PostgreSQL store sends them one at a time (`sql::CLAIM`
-- without its read-back branch, `sql::TRANSITION` without its RETURNING), with rows of the
-- gateway's size: a request body, a fingerprint, three trace entries written by the claim and
-- three appended by the finalise. Each statement commits on its own, as in the store.
--
-- pgbench turns `:name` into a parameter even inside a string literal, so the literals spell
-- a colon as E'\x3a'. The expected status is an expression of a parameter so that, as with the
-- store's `status = $4`, a generic plan cannot prove a partial index's predicate from it.
\set k random(1, 9000000000000000)
\set c :client_id % 8
INSERT INTO operations (tenant, key, tool, tool_version, fingerprint, canonicalization, status,
    fence, lease_owner, lease_expires_at, dispatch, job_id, effect_reference, result,
    error_code, error_message, actor, request, approved_by, created_at, updated_at, expires_at,
    purge_at, intent_window, trace)
VALUES ('t' || (:c)::text,
    't' || (:c)::text || E'\x3aprod\x3awf-' || (:client_id)::text || '-' || (:k)::text || E'\x3acreate',
    'tickets.create', '1',
    E'sha256\x3ae3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855', 1, 'pending', 1,
    'gw-1', (extract(epoch from now()) * 1000)::bigint + 30000, 'inline', NULL, NULL, NULL, NULL,
    NULL, 'bench',
    '{"title":"Printer on floor 3 is jammed","body":"The printer on the third floor shows error 52 and will not print","priority":"high","requester":"user-42"}',
    NULL, 1764650000000, 1764650000000, 1764650000000 + 86400000, 1764650000000 + 2 * 86400000,
    false,
    '["proposed",1764650000000,1,"gw-1",null]' || E'\n' || '["validated",1764650000000,1,"gw-1",null]'
        || E'\n' || '["claimed",1764650000000,1,"gw-1",null]' || E'\n')
ON CONFLICT (tenant, key) DO NOTHING
RETURNING status;
UPDATE operations SET status = 'applied', fence = 1, lease_owner = NULL, lease_expires_at = NULL,
    dispatch = 'inline', job_id = NULL, effect_reference = 'TCK-' || (:k)::text,
    result = '{"ticket_id":"TCK-123456","status":"open","url":"https://tickets.example/TCK-123456"}',
    error_code = NULL, error_message = NULL, expires_at = 1764650000000 + 86400000,
    purge_at = 1764650000000 + 2 * 86400000, updated_at = 1764650000001,
    trace = trace || '["sent",1764650000000,1,"gw-1",null]' || E'\n'
        || '["committed",1764650000000,1,"gw-1",null]' || E'\n'
        || '["acknowledged",1764650000000,1,"gw-1","TCK-1"]' || E'\n'
WHERE tenant = 't' || (:c)::text
  AND key = 't' || (:c)::text || E'\x3aprod\x3awf-' || (:client_id)::text || '-' || (:k)::text || E'\x3acreate'
  AND fence = 1 AND status = CASE WHEN (:c)::int >= 0 THEN 'pending' ELSE 'x' END;
