-- How far in time each network's watcher has read its chain: the start of its last round that
-- reached the source's newest block. Every transaction the source held then has been read, so
-- an intent whose deadline is before it and that received nothing expired; one whose deadline
-- is after it waits (an outage is not an expiry). It never moves back.
ALTER TABLE watcher_health ADD COLUMN chain_read_until_ms BIGINT;
