-- Derivation indexes are handed out from blocks a process takes at once, so intents no longer
-- queue on their key's counter row. A block is kept while some of its indexes may be unused
-- (a process stopped or failed holding them): the watcher keeps those addresses watched for a
-- monitoring window.
CREATE TABLE index_blocks (
    key_id TEXT NOT NULL,
    first_index INTEGER NOT NULL,
    end_index INTEGER NOT NULL,
    taken_at_ms INTEGER NOT NULL,
    PRIMARY KEY (key_id, first_index)
);

-- Indexes a counter jumped over without handing them out (a restore): watched for a
-- monitoring window, in case a customer of a lost intent pays there.
CREATE TABLE counter_skips (
    key_id TEXT NOT NULL,
    from_index INTEGER NOT NULL,
    until_index INTEGER NOT NULL,
    skipped_at_ms INTEGER NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX counter_skips_by_key ON counter_skips (key_id, skipped_at_ms);

-- Facts about this database itself: 'backup_copy' marks a copy `payrecon backup` wrote, so a
-- start on it knows it runs on a restored database.
CREATE TABLE database_marks (
    name TEXT PRIMARY KEY,
    at_ms INTEGER NOT NULL
);

-- Keys of a restored database whose watcher has not yet looked past the counters: money
-- found ahead moves the counter past it plus the look-ahead, and no new block is taken.
CREATE TABLE restore_pending (
    key_id TEXT PRIMARY KEY,
    lookahead INTEGER NOT NULL,
    restored_at_ms INTEGER NOT NULL
);
