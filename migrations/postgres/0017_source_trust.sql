-- How often a watcher's chain source answered incompletely (a log query that left out what the
-- block's bloom holds, receipts missing), and how many zero-value transfers (address
-- poisoning) it ignored: watcher health and /metrics show both.
ALTER TABLE watcher_health ADD COLUMN incomplete_answers BIGINT NOT NULL DEFAULT 0;
ALTER TABLE watcher_health ADD COLUMN zero_value_ignored BIGINT NOT NULL DEFAULT 0;

-- The holdings check's last result per network: every address payrecon watches (open and
-- recent intents, funded addresses, the look-ahead windows) read on the chain at the watcher's
-- cursor and compared with what payrecon recorded there.
CREATE TABLE holdings_checks (
    network TEXT PRIMARY KEY,
    checked_at_ms BIGINT NOT NULL,
    block_height BIGINT,
    addresses_checked BIGINT NOT NULL,
    unexplained BIGINT NOT NULL,
    error TEXT
);
