-- Support finds a payment by the address a customer paid: every transfer to it, matched or
-- not, without reading the whole table.
CREATE INDEX transfers_by_address ON transfers (network, to_address);
