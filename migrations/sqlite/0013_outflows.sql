-- Money leaving watched addresses: the merchant's wallet collecting payments, or anything else
-- spending from them. One row per spent output (UTXO chains: the spending transaction and the
-- input's index) or per transfer out (account chains), holding its newest state, as
-- `transfers` does for receipts. `fee_base` is the network fee the row paid, in the network's
-- native coin (only rows of that coin carry one).
CREATE TABLE outflows (
    network         TEXT NOT NULL,
    txid            TEXT NOT NULL,
    position        BIGINT NOT NULL,
    spent_txid      TEXT,
    spent_position  BIGINT,
    from_address    TEXT NOT NULL,
    asset           TEXT NOT NULL,
    amount_base     TEXT NOT NULL,
    fee_base        TEXT NOT NULL,
    to_address      TEXT,
    destination     TEXT NOT NULL CHECK (destination IN ('treasury', 'external')),
    confirmations   BIGINT NOT NULL,
    block_height    BIGINT NOT NULL,
    removed         BIGINT NOT NULL,
    tip_height      BIGINT NOT NULL,
    seen_at_ms      BIGINT NOT NULL,
    updated_at_ms   BIGINT NOT NULL,
    -- The journal entry that booked it while it stands; NULL before it is deep enough and
    -- after a reorg reversed it. `postings` counts the entries ever posted, for the next key.
    posted_entry    TEXT,
    postings        BIGINT NOT NULL DEFAULT 0,
    feed_pos        BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (network, txid, position)
);
CREATE INDEX outflows_by_spent ON outflows (network, spent_txid, spent_position);
CREATE INDEX outflows_by_address ON outflows (network, from_address);
CREATE INDEX outflows_by_feed ON outflows (network, feed_pos);
