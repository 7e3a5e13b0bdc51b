-- Feed positions: where each change to an intent or a transfer lands in commit order, so a
-- watcher reads only what changed since its last round instead of every watched key again.
-- On PostgreSQL the position is the writing transaction's id (pg_current_xact_id); a reader
-- re-reads from the oldest transaction still running at its last read
-- (pg_snapshot_xmin), so a transaction that commits late is never skipped.
ALTER TABLE payment_intents ADD COLUMN feed_pos BIGINT NOT NULL DEFAULT 0;
ALTER TABLE transfers ADD COLUMN feed_pos BIGINT NOT NULL DEFAULT 0;
CREATE INDEX payment_intents_by_feed ON payment_intents (network, feed_pos);
CREATE INDEX transfers_by_feed ON transfers (network, feed_pos);

-- The matcher and support look exceptions up by the transfer or intent they concern.
CREATE INDEX exceptions_by_transfer ON exceptions (transfer);
CREATE INDEX exceptions_by_intent ON exceptions (intent_id);
