//! The line the benchmarks measure payrecon against: the same rows payrecon writes for a
//! top-up, a payment intent, a settlement or a ledger credit, written by plain multi-row SQL
//! into the same database at the same durability, with no reads and no rules. What payrecon
//! adds on top (reads, decisions, checks, savepoints) is the ratio between the two.
//!
//! Rows are keyed `line-<run>-<n>` so they never collide with payrecon's; the benchmark writes
//! them after the checks it makes on payrecon's own rows. Addresses and checkout keys are
//! scattered over their key space as real ones are ([`address`], [`checkout_key`]): a derived
//! address and a random checkout key land anywhere in their unique indexes, and sequential
//! stand-ins, which only ever append, made the line's intent inserts 2-3 times cheaper than any
//! real intent's could be. Top-ups come from returning customers and settle onto their balances
//! for the same reason ([`topups`], [`settlements`]).

use chrono::{DateTime, Utc};

use super::{StoreError, WriteTx, rows_per_statement, values_placeholders};

/// `count` rows of `columns` parameters each, by multi-row statements: `bind` binds row `i`.
async fn insert_rows<'q>(
    tx: &mut WriteTx,
    head: &str,
    tail: &str,
    columns: usize,
    rows: std::ops::Range<usize>,
    bind: impl Fn(
        sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
        usize,
    ) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
) -> Result<u64, StoreError> {
    let mut written = 0;
    let all: Vec<usize> = rows.collect();
    for chunk in all.chunks(rows_per_statement(columns)) {
        let sql = format!(
            "{head} {} {tail}",
            values_placeholders(tx.backend(), columns, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for i in chunk {
            query = bind(query, *i);
        }
        written += query.execute(tx.conn()).await?.rows_affected();
    }
    Ok(written)
}

/// The network the line's intents and transfers claim: none that a watcher follows, so the
/// line never shows in a watcher's view.
const LINE_NETWORK: &str = "line";

fn name(run: &str, i: usize) -> String {
    format!("line-{run}-{i}")
}

/// `len` hex digits that look random and are the same for the same `(run, i, what)`.
fn scattered(run: &str, i: usize, what: &str, len: usize) -> String {
    use std::fmt::Write as _;
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let mut text = String::with_capacity(len.next_multiple_of(16));
    for part in 0..len.div_ceil(16) {
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one((run, i, what, part));
        let _ = write!(text, "{hash:016x}");
    }
    text.truncate(len);
    text
}

/// The customer of line top-up `i`, one of the shop's `customers` returning customers.
fn customer(run: &str, i: usize, customers: usize) -> String {
    format!("line-{run}-c{}", i % customers)
}

/// Line intent `i`'s address, as long as a P2WPKH one (42 characters) and as scattered.
fn address(run: &str, i: usize) -> String {
    format!("bc1q{}", scattered(run, i, "address", 38))
}

/// Line intent `i`'s checkout key, a 32-digit hex string as scattered as a random one.
fn checkout_key(run: &str, i: usize) -> String {
    scattered(run, i, "checkout", 32)
}

/// What a top-up writes: its customer (if new) and its order row. Top-ups come from a shop's
/// `customers` returning customers, as the benchmark's do: each order then lands in its
/// customer's stretch of `orders_by_account`, anywhere in the index, where orders of a new
/// customer each would only ever append to it.
pub async fn topups(
    tx: &mut WriteTx,
    run: &str,
    rows: std::ops::Range<usize>,
    customers: usize,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let now_ms = now.timestamp_millis();
    let customer_of = |i: usize| customer(run, i, customers);
    insert_rows(
        tx,
        "INSERT INTO customers (account_id, created_at_ms) VALUES",
        "ON CONFLICT (account_id) DO NOTHING",
        2,
        rows.clone(),
        |q, i| q.bind(customer_of(i)).bind(now_ms),
    )
    .await?;
    insert_rows(
        tx,
        "INSERT INTO orders (reference, kind, account_id, total_usd_cents, content_hash, status, created_at_ms) VALUES",
        "",
        7,
        rows,
        |q, i| {
            q.bind(name(run, i))
                .bind("topup")
                .bind(customer_of(i))
                .bind(50_000i64)
                .bind("line")
                .bind("open")
                .bind(now_ms)
        },
    )
    .await?;
    Ok(())
}

/// What payment intents write: the derivation counter moved on by as many, the intent rows and
/// their `intent_created` events. Each intent pays the line's top-up of the same number.
pub async fn intents(
    tx: &mut WriteTx,
    run: &str,
    rows: std::ops::Range<usize>,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let now_ms = now.timestamp_millis();
    let feed = tx.feed_position().await?;
    sqlx::query(
        "INSERT INTO derivation_counters (key_id, next_index) VALUES ($1, $2) \
         ON CONFLICT (key_id) DO UPDATE SET next_index = derivation_counters.next_index + $2",
    )
    .bind(format!("line-{run}"))
    .bind(rows.len() as i64)
    .execute(tx.conn())
    .await?;
    insert_rows(
        tx,
        "INSERT INTO payment_intents (id, order_ref, method, network, pay_to, watch_key, key_id, \
         derivation_index, amount_base, usd_cents, rate_usd, rate_source, rate_fetched_at_ms, \
         created_at_ms, deadline_ms, monitor_until_ms, status, settlement_count, feed_pos, \
         checkout_key) VALUES",
        "",
        20,
        rows.clone(),
        |q, i| {
            q.bind(name(run, i))
                .bind(name(run, i))
                .bind("btc")
                .bind(LINE_NETWORK)
                .bind(address(run, i))
                .bind(address(run, i))
                .bind(format!("line-{run}"))
                .bind(i as i64)
                .bind("625000")
                .bind(50_000i64)
                .bind("80000")
                .bind("line")
                .bind(now_ms)
                .bind(now_ms)
                .bind(now_ms + 3_600_000)
                .bind(now_ms + 7 * 86_400_000)
                .bind("awaiting_payment")
                .bind(0i64)
                .bind(feed)
                .bind(checkout_key(run, i))
        },
    )
    .await?;
    insert_rows(
        tx,
        "INSERT INTO intent_events (intent_id, order_ref, kind, detail, at_ms) VALUES",
        "",
        5,
        rows,
        |q, i| {
            q.bind(name(run, i))
                .bind(name(run, i))
                .bind("intent_created")
                .bind(
                    serde_json::json!({
                        "method": "btc", "address": address(run, i), "amount": "0.00625",
                        "deadline": now + chrono::Duration::hours(1), "supersedes": [],
                    })
                    .to_string(),
                )
                .bind(now_ms)
        },
    )
    .await?;
    Ok(())
}

/// What settling top-up intents by one confirming transfer each writes: the transfer, the
/// intent's new state, the journal entry and its four legs (the last on the balance of the
/// top-up's customer, one of `customers`), the order settled, the `status_changed` event.
pub async fn settlements(
    tx: &mut WriteTx,
    run: &str,
    rows: std::ops::Range<usize>,
    customers: usize,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let now_ms = now.timestamp_millis();
    let feed = tx.feed_position().await?;
    insert_rows(
        tx,
        "INSERT INTO transfers (network, txid, position, to_address, asset, amount_base, intent_id, \
         confirmations, removed, tip_height, seen_at_ms, updated_at_ms, credited_entry, block_height, feed_pos) VALUES",
        "",
        15,
        rows.clone(),
        |q, i| {
            q.bind(LINE_NETWORK)
                .bind(name(run, i))
                .bind(0i64)
                .bind(address(run, i))
                .bind("btc")
                .bind("625000")
                .bind(name(run, i))
                .bind(2i64)
                .bind(0i64)
                .bind(2i64)
                .bind(now_ms)
                .bind(now_ms)
                .bind(format!("settle:{}:1", name(run, i)))
                .bind(1i64)
                .bind(feed)
        },
    )
    .await?;
    let all: Vec<usize> = rows.clone().collect();
    for chunk in all.chunks(rows_per_statement(5)) {
        let sql = format!(
            "WITH v (id, status, first_seen_at_ms, settled_at_ms, settlement_count) AS (VALUES {}) \
             UPDATE payment_intents SET status = v.status, first_seen_at_ms = v.first_seen_at_ms, \
             settled_at_ms = v.settled_at_ms, settlement_count = v.settlement_count \
             FROM v WHERE payment_intents.id = v.id",
            values_placeholders(tx.backend(), 5, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for i in chunk {
            query = query
                .bind(name(run, *i))
                .bind("settled")
                .bind(now_ms)
                .bind(now_ms)
                .bind(1i64);
        }
        query.execute(tx.conn()).await?;
    }
    settlement_journal(tx, run, &all, customers, now_ms).await?;
    for chunk in all.chunks(rows_per_statement(4)) {
        let sql = format!(
            "WITH v (reference, settled_via, settlement_entry, settled_at_ms) AS (VALUES {}) \
             UPDATE orders SET status = 'settled', settled_via = v.settled_via, \
             settlement_entry = v.settlement_entry, settled_at_ms = v.settled_at_ms \
             FROM v WHERE orders.reference = v.reference",
            values_placeholders(tx.backend(), 4, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for i in chunk {
            query = query
                .bind(name(run, *i))
                .bind("payment")
                .bind(format!("settle:{}:1", name(run, *i)))
                .bind(now_ms);
        }
        query.execute(tx.conn()).await?;
    }
    insert_rows(
        tx,
        "INSERT INTO intent_events (intent_id, order_ref, kind, detail, at_ms) VALUES",
        "",
        5,
        rows,
        |q, i| {
            q.bind(name(run, i))
                .bind(name(run, i))
                .bind("status_changed")
                .bind(r#"{"from":"awaiting_payment","to":"settled"}"#)
                .bind(now_ms)
        },
    )
    .await?;
    Ok(())
}

/// The settlements' journal entries and their four legs each.
async fn settlement_journal(
    tx: &mut WriteTx,
    run: &str,
    all: &[usize],
    customers: usize,
    now_ms: i64,
) -> Result<(), StoreError> {
    let mut seqs = Vec::with_capacity(all.len());
    for chunk in all.chunks(rows_per_statement(6)) {
        let sql = format!(
            "INSERT INTO journal_entries (idempotency_key, kind, reference, memo, content_hash, posted_at_ms) \
             VALUES {} RETURNING seq",
            values_placeholders(tx.backend(), 6, chunk.len())
        );
        let mut query = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql));
        for i in chunk {
            query = query
                .bind(format!("settle:{}:1", name(run, *i)))
                .bind("payment")
                .bind(name(run, *i))
                .bind("line settlement")
                .bind("line")
                .bind(now_ms);
        }
        seqs.extend(query.fetch_all(tx.conn()).await?);
    }
    // Three legs on the shop's own accounts, the fourth on the customer's balance.
    const SHOP_LEGS: [(&str, &str, &str); 3] = [
        ("custody:bitcoin:BTC", "btc", "625000"),
        ("fx:btc", "btc", "-625000"),
        ("fx:btc", "USD", "50000"),
    ];
    const LEGS: usize = SHOP_LEGS.len() + 1;
    insert_rows(
        tx,
        "INSERT INTO postings (entry_seq, leg, account, currency, amount) VALUES",
        "",
        5,
        0..seqs.len() * LEGS,
        |q, row| {
            let (entry, leg) = (row / LEGS, row % LEGS);
            let (account, currency, amount) = match SHOP_LEGS.get(leg) {
                Some(&(account, currency, amount)) => (account.to_owned(), currency, amount),
                None => (
                    format!("customer:{}:balance", customer(run, all[entry], customers)),
                    "USD",
                    "-50000",
                ),
            };
            q.bind(seqs[entry])
                .bind(leg as i64)
                .bind(account)
                .bind(currency)
                .bind(amount)
        },
    )
    .await?;
    Ok(())
}

/// Top-ups and intents for [`settlements`] to settle, written in large batches (not what is
/// measured).
pub async fn prepare_settlements(
    store: &super::Store,
    run: &str,
    count: usize,
    customers: usize,
) -> Result<(), StoreError> {
    const PER_COMMIT: usize = 10_000;
    let now = Utc::now();
    for first in (0..count).step_by(PER_COMMIT) {
        let rows = first..(first + PER_COMMIT).min(count);
        let mut tx = store.begin_write().await?;
        topups(&mut tx, run, rows.clone(), customers, now).await?;
        intents(&mut tx, run, rows, now).await?;
        tx.commit().await?;
    }
    Ok(())
}

/// What a ledger credit writes: one journal entry and its four legs.
pub async fn credit(
    tx: &mut WriteTx,
    key: &str,
    customer_account: &str,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let seq: i64 = sqlx::query_scalar(
        "INSERT INTO journal_entries (idempotency_key, kind, reference, memo, content_hash, posted_at_ms) \
         VALUES ($1, 'payment', $1, 'line credit', 'line', $2) RETURNING seq",
    )
    .bind(key)
    .bind(now.timestamp_millis())
    .fetch_one(tx.conn())
    .await?;
    let legs: [(&str, &str, &str); 4] = [
        ("custody:bitcoin:BTC", "btc", "625000"),
        ("fx:btc", "btc", "-625000"),
        ("fx:btc", "USD", "50000"),
        (customer_account, "USD", "-50000"),
    ];
    insert_rows(
        tx,
        "INSERT INTO postings (entry_seq, leg, account, currency, amount) VALUES",
        "",
        5,
        0..legs.len(),
        |q, leg| {
            let (account, currency, amount) = legs[leg];
            q.bind(seq)
                .bind(leg as i64)
                .bind(account)
                .bind(currency)
                .bind(amount)
        },
    )
    .await?;
    Ok(())
}
