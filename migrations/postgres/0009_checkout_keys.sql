-- The customer's checkout page is public, so its link carries a key nobody can guess: 128 bits
-- from the operating system's random source, never derived from the intent id (a UUIDv7 id
-- is a timestamp and a counter, guessable from a neighbour). Intents made before this
-- version get one here from gen_random_uuid(), which draws from pg_strong_random().
ALTER TABLE payment_intents ADD COLUMN checkout_key TEXT;
UPDATE payment_intents SET checkout_key = replace(gen_random_uuid()::text, '-', '') WHERE checkout_key IS NULL;
CREATE UNIQUE INDEX payment_intents_by_checkout_key ON payment_intents (checkout_key);
