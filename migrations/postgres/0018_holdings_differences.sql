-- What the holdings check found on the chain that no receipt or outflow explains, booked so
-- that holdings and their roll-forward equal the chain: `found` when the chain held more than
-- payrecon recorded (money that came while nothing watched the address), `missing` when it
-- held less. One row per address, asset and checked block; the amount is in base units.
CREATE TABLE holdings_differences (
    id TEXT PRIMARY KEY,
    network TEXT NOT NULL,
    address TEXT NOT NULL,
    asset TEXT NOT NULL,
    direction TEXT NOT NULL CHECK (direction IN ('found', 'missing')),
    amount_base TEXT NOT NULL,
    block_height BIGINT NOT NULL,
    block_hash TEXT NOT NULL,
    key_id TEXT,
    derivation_index BIGINT,
    found_at_ms BIGINT NOT NULL
);
CREATE INDEX holdings_differences_address ON holdings_differences (network, address);
CREATE INDEX holdings_differences_found_at ON holdings_differences (found_at_ms);
