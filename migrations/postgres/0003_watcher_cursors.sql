-- Each network's watcher position, written in the same transaction as the events it produced.
CREATE TABLE watcher_cursors (
    network        TEXT PRIMARY KEY,
    tip_height     BIGINT NOT NULL,
    tip_hash       TEXT NOT NULL,
    checkpoints    TEXT NOT NULL,
    updated_at_ms  BIGINT NOT NULL
);
