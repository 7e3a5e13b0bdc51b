-- Operations: the operators' audit log, API tokens, watcher health and webhook deliveries.

-- Who resolved which exception, how and why. Append-only, like the journal: a mistaken
-- action is corrected by a new one, never by editing the log.
CREATE TABLE operator_actions (
    seq            INTEGER PRIMARY KEY,
    exception_id   TEXT NOT NULL REFERENCES exceptions (id),
    action         TEXT NOT NULL CHECK (action IN ('accept_as_paid', 'credit_balance', 'mark_refunded', 'dismiss')),
    actor          TEXT NOT NULL,
    reason         TEXT NOT NULL,
    refund_txid    TEXT,
    entry_key      TEXT,
    at_ms          BIGINT NOT NULL
);
CREATE INDEX operator_actions_by_exception ON operator_actions (exception_id, seq);
ALTER TABLE exceptions ADD COLUMN resolved_by TEXT;

-- Bearer tokens of the HTTP API. Only the SHA-256 of a token is kept: a leaked database
-- does not leak working tokens.
CREATE TABLE api_tokens (
    token_sha256   TEXT PRIMARY KEY,
    name           TEXT NOT NULL UNIQUE,
    role           TEXT NOT NULL CHECK (role IN ('shop', 'finance', 'operator')),
    created_at_ms  BIGINT NOT NULL,
    revoked_at_ms  BIGINT
);

-- Each watcher's health, written after every round, so any process (the CLI, another
-- server) sees it.
CREATE TABLE watcher_health (
    network           TEXT PRIMARY KEY,
    state             TEXT NOT NULL,
    cursor_height     BIGINT,
    head_height       BIGINT,
    failures          BIGINT NOT NULL,
    rpc_errors        BIGINT NOT NULL,
    last_error        TEXT,
    last_scan_at_ms   BIGINT,
    updated_at_ms     BIGINT NOT NULL
);

-- The transactional outbox is `intent_events` itself (written in the transaction of each
-- change). `dispatched_at_ms` marks events already copied to every endpoint's deliveries.
ALTER TABLE intent_events ADD COLUMN dispatched_at_ms BIGINT;
CREATE INDEX intent_events_undispatched ON intent_events (dispatched_at_ms, seq);

-- One row per (endpoint, event). `stream` is the intent (or order) the event belongs to:
-- deliveries of one stream go out in `event_seq` order, one at a time.
CREATE TABLE webhook_deliveries (
    endpoint            TEXT NOT NULL,
    event_seq           BIGINT NOT NULL REFERENCES intent_events (seq),
    stream              TEXT NOT NULL,
    state               TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'abandoned')),
    attempts            BIGINT NOT NULL,
    next_attempt_at_ms  BIGINT NOT NULL,
    give_up_at_ms       BIGINT NOT NULL,
    last_error          TEXT,
    delivered_at_ms     BIGINT,
    PRIMARY KEY (endpoint, event_seq)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (endpoint, state, next_attempt_at_ms);
CREATE INDEX webhook_deliveries_by_stream ON webhook_deliveries (endpoint, stream, state, event_seq);

-- The reconciliation report reads a period: transfers by first sighting, entries by posting
-- time, intents by creation, exceptions by opening.
CREATE INDEX transfers_by_seen ON transfers (seen_at_ms);
CREATE INDEX journal_entries_by_posted ON journal_entries (posted_at_ms);
CREATE INDEX payment_intents_by_created ON payment_intents (created_at_ms);
CREATE INDEX exceptions_by_opened ON exceptions (opened_at_ms);
