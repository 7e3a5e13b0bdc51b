-- Money sent back, one record per refund (several per exception): what an exception holds,
-- in the asset and network it arrived in, to the customer's address. `amount_base` is in the
-- method's base units, as every amount is stored. Its history is `refund_events`.
CREATE TABLE refunds (
    id TEXT PRIMARY KEY,
    exception_id TEXT NOT NULL,
    intent_id TEXT,
    order_ref TEXT,
    network TEXT NOT NULL,
    method TEXT NOT NULL,
    amount_base TEXT NOT NULL,
    amount_kind TEXT NOT NULL,
    address TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL
);
CREATE INDEX refunds_by_exception ON refunds (exception_id);
CREATE INDEX refunds_by_state ON refunds (state, updated_at_ms);

-- Every change of a refund's state: who, when, why.
CREATE TABLE refund_events (
    refund_id TEXT NOT NULL,
    state TEXT NOT NULL,
    actor TEXT NOT NULL,
    detail TEXT NOT NULL,
    at_ms BIGINT NOT NULL
);
CREATE INDEX refund_events_by_refund ON refund_events (refund_id, at_ms);
