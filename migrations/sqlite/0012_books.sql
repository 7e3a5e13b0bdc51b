-- The books: value at receipt, periods that close, and the date an entry counts in.

-- The accounting date of an entry posted while its posting time fell in a closed period:
-- the start of the first open period. NULL (nearly always) means the posting time itself.
ALTER TABLE journal_entries ADD COLUMN booked_at_ms BIGINT;
-- Periods, exports and the close read entries by that date, in journal order within it.
CREATE INDEX journal_entries_by_booking ON journal_entries ((COALESCE(booked_at_ms, posted_at_ms)), seq);

-- One row: entries cannot be booked before `closed_through_ms` (the end of the last closed
-- period). The time zone periods were cut in is fixed by the first close.
CREATE TABLE books_state (
    id                 INTEGER PRIMARY KEY CHECK (id = 1),
    closed_through_ms  BIGINT NOT NULL,
    timezone           TEXT
);
INSERT INTO books_state (id, closed_through_ms, timezone) VALUES (1, 0, NULL);

-- Every close and reopen, append-only: who, when, why, and what the period held when closed.
CREATE TABLE period_events (
    seq              INTEGER PRIMARY KEY,
    period           TEXT NOT NULL,
    action           TEXT NOT NULL CHECK (action IN ('close', 'reopen')),
    actor            TEXT NOT NULL,
    reason           TEXT NOT NULL,
    at_ms            BIGINT NOT NULL,
    entries          BIGINT,
    entries_sha256   TEXT,
    snapshot         TEXT
);
CREATE INDEX period_events_by_period ON period_events (period, seq);

-- The valuation pass finds the transactions behind an entry from the entry's key.
CREATE INDEX transfers_by_credited_entry ON transfers (credited_entry) WHERE credited_entry IS NOT NULL;

-- The fiat value of each entry's crypto legs at the moment it happened (value at receipt for
-- a payment), and the USD rate of the reporting currency. Written once, never changed.
CREATE TABLE entry_valuations (
    entry_seq            BIGINT PRIMARY KEY REFERENCES journal_entries (seq),
    crypto_currency      TEXT,
    usd_per_unit         TEXT,
    crypto_source        TEXT,
    crypto_at_ms         BIGINT,
    basis                TEXT NOT NULL,
    txids                TEXT NOT NULL,
    reporting_currency   TEXT,
    usd_per_reporting    TEXT,
    reporting_source     TEXT,
    reporting_at_ms      BIGINT,
    valued_at_ms         BIGINT NOT NULL
);

CREATE TRIGGER period_events_append_only_update BEFORE UPDATE ON period_events
BEGIN SELECT RAISE(ABORT, 'the period log is append-only'); END;
CREATE TRIGGER period_events_append_only_delete BEFORE DELETE ON period_events
BEGIN SELECT RAISE(ABORT, 'the period log is append-only'); END;
CREATE TRIGGER entry_valuations_append_only_update BEFORE UPDATE ON entry_valuations
BEGIN SELECT RAISE(ABORT, 'a valuation is written once'); END;
CREATE TRIGGER entry_valuations_append_only_delete BEFORE DELETE ON entry_valuations
BEGIN SELECT RAISE(ABORT, 'a valuation is written once'); END;
