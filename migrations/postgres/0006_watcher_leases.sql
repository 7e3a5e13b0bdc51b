-- Which process runs each network's watcher. Several `payrecon serve` processes share one
-- PostgreSQL database; each network's watcher runs in one of them at a time, under a lease
-- that expires unless renewed. `fencing_token` grows by one at every change of holder, and
-- every write of a watcher carries its token: a holder that stalled past its lease, and lost
-- it, has its late writes refused.
CREATE TABLE watcher_leases (
    network         TEXT PRIMARY KEY,
    holder          TEXT NOT NULL,
    fencing_token   BIGINT NOT NULL,
    expires_at_ms   BIGINT NOT NULL
);
