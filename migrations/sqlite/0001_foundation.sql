-- payrecon foundation schema (SQLite). Amounts: see docs/ARCHITECTURE.md, "Amounts in the store".

-- One row per shop account that owns orders or a balance. Keyed by the shop's account id,
-- never by e-mail. The row is also what a balance debit locks.
CREATE TABLE customers (
    account_id     TEXT PRIMARY KEY,
    created_at_ms  BIGINT NOT NULL
);

-- Rental orders and balance top-ups: both are something a customer pays for.
CREATE TABLE orders (
    reference          TEXT PRIMARY KEY,
    kind               TEXT NOT NULL CHECK (kind IN ('rental', 'topup')),
    account_id         TEXT NOT NULL REFERENCES customers (account_id),
    gpu_model          TEXT,
    duration_days      INTEGER,
    lots               INTEGER,
    gpu_count          INTEGER,
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

-- The journal: append-only. `seq` orders entries for streaming reports.
CREATE TABLE journal_entries (
    seq              INTEGER PRIMARY KEY,
    idempotency_key  TEXT NOT NULL UNIQUE,
    kind             TEXT NOT NULL,
    reference        TEXT,
    memo             TEXT NOT NULL,
    content_hash     TEXT NOT NULL,
    posted_at_ms     BIGINT NOT NULL
);
CREATE INDEX journal_entries_by_reference ON journal_entries (reference);

-- One row per leg. `amount` is a signed integer in the currency's minor unit, as text:
-- debit positive, credit negative; wei exceed every integer column type both databases share.
CREATE TABLE postings (
    entry_seq  BIGINT NOT NULL REFERENCES journal_entries (seq),
    leg        INTEGER NOT NULL,
    account    TEXT NOT NULL,
    currency   TEXT NOT NULL,
    amount     TEXT NOT NULL,
    PRIMARY KEY (entry_seq, leg)
);
CREATE INDEX postings_by_account ON postings (account, currency);

CREATE TRIGGER journal_entries_append_only_update BEFORE UPDATE ON journal_entries
BEGIN SELECT RAISE(ABORT, 'the journal is append-only: post a compensating entry'); END;
CREATE TRIGGER journal_entries_append_only_delete BEFORE DELETE ON journal_entries
BEGIN SELECT RAISE(ABORT, 'the journal is append-only: post a compensating entry'); END;
CREATE TRIGGER postings_append_only_update BEFORE UPDATE ON postings
BEGIN SELECT RAISE(ABORT, 'the journal is append-only: post a compensating entry'); END;
CREATE TRIGGER postings_append_only_delete BEFORE DELETE ON postings
BEGIN SELECT RAISE(ABORT, 'the journal is append-only: post a compensating entry'); END;
