-- A refund's life on the chain: who pays the network fee (fixed when it is asked for), the
-- change index a prepared Bitcoin-family refund sends its change to (kept, so preparing again
-- builds the same transaction), and the transaction that paid it with its block, once seen.
ALTER TABLE refunds ADD COLUMN fee_payer TEXT NOT NULL DEFAULT 'shop';
ALTER TABLE refunds ADD COLUMN change_index BIGINT;
ALTER TABLE refunds ADD COLUMN txid TEXT;
ALTER TABLE refunds ADD COLUMN block_height BIGINT;
ALTER TABLE refunds ADD COLUMN paid_base TEXT;
