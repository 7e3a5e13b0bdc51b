-- What the witnesses (`witness_urls`) said of each receipt that reached its network's
-- confirmations: a receipt is held just below them until every witness holds the same
-- transaction in the same block paying the same amount. `first_asked_ms` starts the wait
-- (`witness_wait_seconds`) after which a silent witness's receipt is held as an exception, or
-- credited under `witness_policy = "warn"`.
CREATE TABLE witness_checks (
    network TEXT NOT NULL,
    txid TEXT NOT NULL,
    position BIGINT NOT NULL,
    state TEXT NOT NULL,
    first_asked_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    detail TEXT NOT NULL,
    PRIMARY KEY (network, txid, position)
);
