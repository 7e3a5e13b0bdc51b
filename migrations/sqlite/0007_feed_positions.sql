-- Feed positions: where each change to an intent or a transfer lands in commit order, so a
-- watcher reads only what changed since its last round instead of every watched key again.
-- SQLite commits one writer at a time, so a counter bumped once per write transaction orders
-- commits; the row is the counter.
CREATE TABLE feed_counter (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    position  BIGINT NOT NULL
);
INSERT INTO feed_counter (id, position) VALUES (1, 0);

ALTER TABLE payment_intents ADD COLUMN feed_pos BIGINT NOT NULL DEFAULT 0;
ALTER TABLE transfers ADD COLUMN feed_pos BIGINT NOT NULL DEFAULT 0;
CREATE INDEX payment_intents_by_feed ON payment_intents (network, feed_pos);
CREATE INDEX transfers_by_feed ON transfers (network, feed_pos);

-- The matcher and support look exceptions up by the transfer or intent they concern.
CREATE INDEX exceptions_by_transfer ON exceptions (transfer);
CREATE INDEX exceptions_by_intent ON exceptions (intent_id);
