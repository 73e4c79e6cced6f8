-- Only records claimed under a duplicate-intent window are indexed by fingerprint
-- (`Record::intent_window`). A fingerprint is random, so every claim wrote to a random leaf of
-- this index, for a lookup that only contracts with the window make; and since a fingerprint
-- names its tool and version, every record such a lookup could match was claimed under the same
-- contract version, with the window.
--
-- Records claimed before this version stay findable: the column is added with `true` for every
-- existing row (a stored default, no table rewrite); a row inserted later without saying is
-- not watched, like a claim of a contract without the window.
ALTER TABLE operations ADD COLUMN intent_window boolean NOT NULL DEFAULT true;
ALTER TABLE operations ALTER COLUMN intent_window SET DEFAULT false;

-- Still partial (see 0002): a lookup by key does not imply `intent_window`, so it cannot use
-- this index. Rebuilding takes an ordinary lock; on a large table run this migration at a quiet
-- time (`idemgate migrate`).
DROP INDEX operations_fingerprint;
CREATE INDEX operations_fingerprint ON operations (tenant, tool, fingerprint, created_at)
    WHERE intent_window;
