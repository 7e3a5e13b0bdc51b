-- Operators may mark money in suspense as the merchant's own (a gas top-up sent before a
-- sweep). SQLite cannot change a CHECK constraint in place: the audit log is copied into a
-- table with the wider one, in the migration's transaction.
CREATE TABLE operator_actions_new (
    seq            INTEGER PRIMARY KEY,
    exception_id   TEXT NOT NULL REFERENCES exceptions (id),
    action         TEXT NOT NULL CHECK (action IN ('accept_as_paid', 'credit_balance', 'mark_refunded', 'mark_own_funds', 'dismiss')),
    actor          TEXT NOT NULL,
    reason         TEXT NOT NULL,
    refund_txid    TEXT,
    entry_key      TEXT,
    at_ms          BIGINT NOT NULL
);
INSERT INTO operator_actions_new (seq, exception_id, action, actor, reason, refund_txid, entry_key, at_ms)
    SELECT seq, exception_id, action, actor, reason, refund_txid, entry_key, at_ms FROM operator_actions;
DROP TABLE operator_actions;
ALTER TABLE operator_actions_new RENAME TO operator_actions;
CREATE INDEX operator_actions_by_exception ON operator_actions (exception_id, seq);
