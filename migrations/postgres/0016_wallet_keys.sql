-- Every account key that handed out addresses: the one configured now (`current`) and those
-- it replaced (`retired`), whose addresses stay watched and exported.
CREATE TABLE wallet_keys (
    key_id TEXT PRIMARY KEY,
    network TEXT NOT NULL,
    account_key TEXT NOT NULL,
    key_origin TEXT,
    state TEXT NOT NULL CHECK (state IN ('current', 'retired')),
    first_seen_ms BIGINT NOT NULL,
    retired_at_ms BIGINT
);
CREATE INDEX wallet_keys_by_network ON wallet_keys (network, state);

-- Money found at an address ahead of its key's counter (one handed out by a database since
-- restored from a backup): the counter moved from `counter_before` past the index, and the
-- skipped indexes stay watched for a monitoring window.
CREATE TABLE unissued_payments (
    network TEXT NOT NULL,
    address TEXT NOT NULL,
    key_id TEXT NOT NULL,
    derivation_index BIGINT NOT NULL,
    counter_before BIGINT NOT NULL,
    found_at_ms BIGINT NOT NULL,
    PRIMARY KEY (network, address)
);
CREATE INDEX unissued_payments_by_time ON unissued_payments (network, found_at_ms);
