-- The refunds one transaction paid: a transaction that pays one customer's address is never
-- counted for two of its refunds unless it pays both.
CREATE INDEX refunds_by_txid ON refunds (network, txid);
