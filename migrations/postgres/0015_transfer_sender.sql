-- The address that sent a transfer, where its chain names one (Ethereum, Tron): native coin
-- from the merchant's treasury is a fee top-up, and operators see where a refund could go.
-- Transfers recorded before stay NULL until a watcher reports them again.
ALTER TABLE transfers ADD COLUMN from_address TEXT;
