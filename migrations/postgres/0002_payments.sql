-- Payment instructions, the transfers watchers report, exceptions for operators and the
-- intent event stream. Amounts in base units as decimal text (see 0001).

-- Next unused derivation index per key: reserved in the transaction that stores the intent.
CREATE TABLE derivation_counters (
    key_id      TEXT PRIMARY KEY,
    next_index  BIGINT NOT NULL
);

CREATE TABLE payment_intents (
    id                  TEXT PRIMARY KEY,
    order_ref           TEXT NOT NULL REFERENCES orders (reference),
    method              TEXT NOT NULL,
    network             TEXT NOT NULL,
    pay_to              TEXT NOT NULL,
    watch_key           TEXT NOT NULL,
    key_id              TEXT NOT NULL,
    derivation_index    BIGINT NOT NULL,
    amount_base         TEXT NOT NULL,
    usd_cents           BIGINT NOT NULL,
    rate_usd            TEXT NOT NULL,
    rate_source         TEXT NOT NULL,
    rate_fetched_at_ms  BIGINT NOT NULL,
    created_at_ms       BIGINT NOT NULL,
    deadline_ms         BIGINT NOT NULL,
    monitor_until_ms    BIGINT NOT NULL,
    status              TEXT NOT NULL,
    superseded_by       TEXT,
    marked_paid_at_ms   BIGINT,
    first_seen_at_ms    BIGINT,
    settled_at_ms       BIGINT,
    settlement_count    BIGINT NOT NULL,
    UNIQUE (network, watch_key),
    UNIQUE (key_id, derivation_index)
);
CREATE INDEX payment_intents_by_order ON payment_intents (order_ref, created_at_ms);
CREATE INDEX payment_intents_by_deadline ON payment_intents (status, deadline_ms);
CREATE INDEX payment_intents_by_monitoring ON payment_intents (network, monitor_until_ms);

-- Every transfer a watcher reported, matched or not. One row per (network, txid, position):
-- the same transfer seen twice is one transfer.
CREATE TABLE transfers (
    network         TEXT NOT NULL,
    txid            TEXT NOT NULL,
    position        BIGINT NOT NULL,
    to_address      TEXT NOT NULL,
    asset           TEXT NOT NULL,
    amount_base     TEXT NOT NULL,
    intent_id       TEXT REFERENCES payment_intents (id),
    confirmations   BIGINT NOT NULL,
    removed         BIGINT NOT NULL,
    tip_height      BIGINT NOT NULL,
    seen_at_ms      BIGINT NOT NULL,
    updated_at_ms   BIGINT NOT NULL,
    credited_entry  TEXT,
    PRIMARY KEY (network, txid, position)
);
CREATE INDEX transfers_by_intent ON transfers (intent_id);

-- Money or states an operator must look at. Ids are deterministic, so opening one twice is
-- one exception.
CREATE TABLE exceptions (
    id              TEXT PRIMARY KEY,
    kind            TEXT NOT NULL,
    intent_id       TEXT,
    order_ref       TEXT,
    transfer        TEXT,
    detail          TEXT NOT NULL,
    opened_at_ms    BIGINT NOT NULL,
    resolved_at_ms  BIGINT,
    resolution      TEXT
);
CREATE INDEX exceptions_open ON exceptions (resolved_at_ms, opened_at_ms);

-- The intent event stream: every state change and exception, in commit order.
CREATE TABLE intent_events (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    intent_id   TEXT,
    order_ref   TEXT,
    kind        TEXT NOT NULL,
    detail      TEXT NOT NULL,
    at_ms       BIGINT NOT NULL
);

-- Set when an order needs an operator (a credit that settled it was reversed).
ALTER TABLE orders ADD COLUMN attention TEXT;
