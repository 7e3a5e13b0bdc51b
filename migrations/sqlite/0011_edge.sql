-- The stuck view and the metrics read the deliveries not delivered, per endpoint: a few rows
-- among every delivery ever made.
CREATE INDEX webhook_deliveries_undelivered ON webhook_deliveries (state, endpoint, event_seq)
    WHERE state <> 'delivered';

-- A watcher stopped by an answer it could not trust tries again later; operators see when.
ALTER TABLE watcher_health ADD COLUMN next_try_at_ms BIGINT;
