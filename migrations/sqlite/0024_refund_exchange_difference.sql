-- A refund leaves suspense at the rates its money was taken in at, so the difference to its
-- value when it left is an exchange gain or loss on its `fx:` legs: the valuation keeps those
-- rates beside the market's. NULL on every other entry.
ALTER TABLE entry_valuations ADD COLUMN held_usd_per_unit TEXT;
ALTER TABLE entry_valuations ADD COLUMN held_usd_per_reporting TEXT;
-- Two refunds of a network never take one change index (two `refund prepare` at once on
-- PostgreSQL could read the same highest one): the second is refused and takes the next.
CREATE UNIQUE INDEX refunds_by_change_index ON refunds (network, change_index)
    WHERE change_index IS NOT NULL;
