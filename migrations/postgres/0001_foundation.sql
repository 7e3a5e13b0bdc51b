-- payrecon foundation schema (PostgreSQL). Same tables as migrations/sqlite; see that file
-- and docs/ARCHITECTURE.md for the meaning of each column.

CREATE TABLE customers (
    account_id     TEXT PRIMARY KEY,
    created_at_ms  BIGINT NOT NULL
);

CREATE TABLE orders (
    reference          TEXT PRIMARY KEY,
    kind               TEXT NOT NULL CHECK (kind IN ('rental', 'topup')),
    account_id         TEXT NOT NULL REFERENCES customers (account_id),
    gpu_model          TEXT,
    duration_days      BIGINT,
    lots               BIGINT,
    gpu_count          BIGINT,
    total_usd_cents    BIGINT NOT NULL CHECK (total_usd_cents > 0),
    content_hash       TEXT NOT NULL,
    status             TEXT NOT NULL CHECK (status IN ('open', 'settled')),
    settled_via        TEXT CHECK (settled_via IN ('balance', 'payment')),
    settlement_entry   TEXT,
    created_at_ms      BIGINT NOT NULL,
    settled_at_ms      BIGINT,
    CHECK ((kind = 'rental') = (gpu_model IS NOT NULL AND duration_days IS NOT NULL
                                AND lots IS NOT NULL AND gpu_count IS NOT NULL)),
    CHECK ((status = 'settled') = (settled_via IS NOT NULL AND settlement_entry IS NOT NULL
                                   AND settled_at_ms IS NOT NULL))
);
CREATE INDEX orders_by_account ON orders (account_id, created_at_ms);

CREATE TABLE journal_entries (
    seq              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key  TEXT NOT NULL UNIQUE,
    kind             TEXT NOT NULL,
    reference        TEXT,
    memo             TEXT NOT NULL,
    content_hash     TEXT NOT NULL,
    posted_at_ms     BIGINT NOT NULL
);
CREATE INDEX journal_entries_by_reference ON journal_entries (reference);

CREATE TABLE postings (
    entry_seq  BIGINT NOT NULL REFERENCES journal_entries (seq),
    leg        BIGINT NOT NULL,
    account    TEXT NOT NULL,
    currency   TEXT NOT NULL,
    amount     TEXT NOT NULL,
    PRIMARY KEY (entry_seq, leg)
);
CREATE INDEX postings_by_account ON postings (account, currency);

CREATE FUNCTION journal_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the journal is append-only: post a compensating entry';
END;
$$;
CREATE TRIGGER journal_entries_append_only BEFORE UPDATE OR DELETE ON journal_entries
    FOR EACH ROW EXECUTE FUNCTION journal_append_only();
CREATE TRIGGER postings_append_only BEFORE UPDATE OR DELETE ON postings
    FOR EACH ROW EXECUTE FUNCTION journal_append_only();
