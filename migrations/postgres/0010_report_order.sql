-- The reconciliation report lists a period's transfers by first seen, then identity. With the
-- identity in the index, that order is the index's own: no sort of a million rows, and each
-- page of the report starts where the last one stopped.
DROP INDEX transfers_by_seen;
CREATE INDEX transfers_by_seen ON transfers (seen_at_ms, network, txid, position);
