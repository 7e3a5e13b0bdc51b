-- Where a transfer sits, apart from how final it is: with `finalized` finality a transfer
-- may be many blocks deep and still not final, so its block cannot be derived from its
-- confirmations and tip any more.
ALTER TABLE transfers ADD COLUMN block_height BIGINT;
UPDATE transfers SET block_height = tip_height + 1 - confirmations WHERE confirmations > 0;
