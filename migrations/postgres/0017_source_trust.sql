-- How often a watcher's chain source answered incompletely (a log query that left out what the
-- block's bloom holds, receipts missing), and how many zero-value transfers (address
-- poisoning) it ignored: watcher health and /metrics show both.
ALTER TABLE watcher_health ADD COLUMN incomplete_answers BIGINT NOT NULL DEFAULT 0;
ALTER TABLE watcher_health ADD COLUMN zero_value_ignored BIGINT NOT NULL DEFAULT 0;
