//! SQL for payment intents, transfers, exceptions and intent events.

use crate::records::{ExceptionRecord, IntentEvent, StoredTransfer};
use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use payrecon_chain_core::{Amount, Method, Network, ReceivedAsset, TransferId};
use sqlx::{AnyConnection, Row};

use super::orders::millis;
use super::{
    StoreError, WriteTx, list_placeholders, list_placeholders_after, rows_per_statement,
    values_placeholders,
};
use crate::intent::{IntentRate, PaymentIntent};
use crate::money::Usd;
use crate::order::OrderRef;

/// The intent query; `$suffix` picks the rows.
macro_rules! select_intents {
    ($suffix:literal) => {
        concat!(
            "SELECT id, order_ref, method, pay_to, watch_key, key_id, derivation_index, ",
            "amount_base, usd_cents, rate_usd, rate_source, rate_fetched_at_ms, created_at_ms, ",
            "deadline_ms, monitor_until_ms, status, superseded_by, marked_paid_at_ms, ",
            "first_seen_at_ms, settled_at_ms, settlement_count, checkout_key FROM payment_intents ",
            $suffix
        )
    };
}

/// Which of `order_refs` have a live (not superseded) payment intent. Read after the orders
/// are locked, in a statement of its own: on PostgreSQL a statement sees what the transactions
/// it waited for committed only if it starts after the wait.
pub(crate) async fn with_live_intents(
    tx: &mut WriteTx,
    order_refs: &[&str],
) -> Result<HashSet<String>, StoreError> {
    let mut live = HashSet::new();
    for chunk in order_refs.chunks(rows_per_statement(1)) {
        let sql = format!(
            "SELECT DISTINCT order_ref FROM payment_intents \
             WHERE order_ref IN ({}) AND superseded_by IS NULL",
            list_placeholders(tx.backend(), chunk.len())
        );
        let mut query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql));
        for order_ref in chunk {
            query = query.bind(*order_ref);
        }
        live.extend(query.fetch_all(tx.conn()).await?);
    }
    Ok(live)
}

/// Which of `watch_keys` on `network` money was found at before an intent owned them.
pub(crate) async fn found_ahead(
    tx: &mut WriteTx,
    network: &str,
    watch_keys: &[&str],
) -> Result<HashSet<String>, StoreError> {
    let mut found = HashSet::new();
    for chunk in watch_keys.chunks(rows_per_statement(1).saturating_sub(1).max(1)) {
        let sql = format!(
            "SELECT address FROM unissued_payments WHERE network = {} AND address IN ({})",
            super::placeholder(tx.backend(), 1),
            list_placeholders_after(tx.backend(), 1, chunk.len())
        );
        let mut query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql)).bind(network);
        for key in chunk {
            query = query.bind(*key);
        }
        found.extend(query.fetch_all(tx.conn()).await?);
    }
    Ok(found)
}

/// Stores a new intent, stamped with the transaction's feed position so watchers find it.
pub(crate) async fn insert_intent(
    tx: &mut WriteTx,
    intent: &PaymentIntent,
) -> Result<(), StoreError> {
    insert_intents(tx, &[intent]).await
}

/// Stores new intents (a newer one of the same order may already supersede one), one
/// statement per [`rows_per_statement`] intents.
pub(crate) async fn insert_intents(
    tx: &mut WriteTx,
    intents: &[&PaymentIntent],
) -> Result<(), StoreError> {
    const COLUMNS: usize = 21;
    if intents.is_empty() {
        return Ok(());
    }
    let feed_position = tx.feed_position().await?;
    for chunk in intents.chunks(rows_per_statement(COLUMNS)) {
        let sql = format!(
            "INSERT INTO payment_intents (id, order_ref, method, network, pay_to, watch_key, key_id, \
             derivation_index, amount_base, usd_cents, rate_usd, rate_source, rate_fetched_at_ms, \
             created_at_ms, deadline_ms, monitor_until_ms, status, settlement_count, superseded_by, feed_pos, \
             checkout_key) VALUES {}",
            values_placeholders(tx.backend(), COLUMNS, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for intent in chunk {
            query = query
                .bind(intent.id.as_str())
                .bind(intent.order_ref.as_str())
                .bind(intent.method.id())
                .bind(intent.network().as_str())
                .bind(intent.pay_to.as_str())
                .bind(intent.watch_key.as_str())
                .bind(intent.key_id.as_str())
                .bind(i64::from(intent.derivation_index))
                .bind(intent.amount.to_string())
                .bind(intent.usd.cents())
                .bind(intent.rate.usd_per_unit.to_string())
                .bind(intent.rate.source.as_str())
                .bind(intent.rate.fetched_at.timestamp_millis())
                .bind(intent.created_at.timestamp_millis())
                .bind(intent.deadline.timestamp_millis())
                .bind(intent.monitor_until.timestamp_millis())
                .bind(intent.status.as_str())
                .bind(i64::from(intent.settlement_count))
                .bind(intent.superseded_by.as_deref())
                .bind(feed_position)
                .bind(intent.checkout_key.as_str());
        }
        query.execute(tx.conn()).await?;
    }
    Ok(())
}

/// Marks every live intent of each order superseded by the order's newer intent given; returns
/// (superseded id, order) pairs. Run before the newer intents are stored.
pub(crate) async fn supersede_for_orders(
    tx: &mut WriteTx,
    newer: &[(&str, &str)],
) -> Result<Vec<(String, String)>, StoreError> {
    if newer.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "WITH v (order_ref, newer) AS (VALUES {}) \
         UPDATE payment_intents SET superseded_by = v.newer FROM v \
         WHERE payment_intents.order_ref = v.order_ref AND payment_intents.superseded_by IS NULL \
         RETURNING payment_intents.id, payment_intents.order_ref",
        values_placeholders(tx.backend(), 2, newer.len())
    );
    let mut query = sqlx::query_as::<_, (String, String)>(sqlx::AssertSqlSafe(sql));
    for (order_ref, id) in newer {
        query = query.bind(*order_ref).bind(*id);
    }
    Ok(query.fetch_all(tx.conn()).await?)
}

/// Marks every other live intent of the order as superseded by `newer`.
pub(crate) async fn supersede_others(
    conn: &mut AnyConnection,
    order_ref: &OrderRef,
    newer: &str,
) -> Result<Vec<String>, StoreError> {
    Ok(sqlx::query_scalar(
        "UPDATE payment_intents SET superseded_by = $2 \
         WHERE order_ref = $1 AND id <> $2 AND superseded_by IS NULL RETURNING id",
    )
    .bind(order_ref.as_str())
    .bind(newer)
    .fetch_all(conn)
    .await?)
}

/// One intent by id.
pub(crate) async fn get_intent(
    conn: &mut AnyConnection,
    id: &str,
) -> Result<Option<PaymentIntent>, StoreError> {
    let row = sqlx::query(select_intents!("WHERE id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await?;
    row.map(|row| decode_intent(&row)).transpose()
}

/// The intent whose checkout page link carries `key`.
pub(crate) async fn intent_by_checkout_key(
    conn: &mut AnyConnection,
    key: &str,
) -> Result<Option<PaymentIntent>, StoreError> {
    let row = sqlx::query(select_intents!("WHERE checkout_key = $1"))
        .bind(key)
        .fetch_optional(conn)
        .await?;
    row.map(|row| decode_intent(&row)).transpose()
}

/// Every intent of an order, oldest first.
pub(crate) async fn intents_of_order(
    conn: &mut AnyConnection,
    order_ref: &str,
) -> Result<Vec<PaymentIntent>, StoreError> {
    sqlx::query(select_intents!(
        "WHERE order_ref = $1 ORDER BY created_at_ms, id"
    ))
    .bind(order_ref)
    .fetch_all(conn)
    .await?
    .iter()
    .map(decode_intent)
    .collect()
}

/// Every intent of one customer's orders, oldest first.
pub(crate) async fn intents_of_account(
    conn: &mut AnyConnection,
    account_id: &str,
) -> Result<Vec<PaymentIntent>, StoreError> {
    sqlx::query(select_intents!(
        "WHERE order_ref IN (SELECT reference FROM orders WHERE account_id = $1) ORDER BY created_at_ms, id"
    ))
    .bind(account_id)
    .fetch_all(conn)
    .await?
    .iter()
    .map(decode_intent)
    .collect()
}

/// The intents with these ids, in no particular order: one statement per
/// [`rows_per_statement`] ids.
pub(crate) async fn intents_by_ids(
    conn: &mut AnyConnection,
    ids: &[&str],
) -> Result<Vec<PaymentIntent>, StoreError> {
    let mut intents = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(rows_per_statement(1)) {
        let sql = format!(
            "{} WHERE id IN ({})",
            select_intents!(""),
            list_placeholders(super::backend_of_conn(conn), chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in chunk {
            query = query.bind(*id);
        }
        for row in query.fetch_all(&mut *conn).await? {
            intents.push(decode_intent(&row)?);
        }
    }
    Ok(intents)
}

/// The intents of `network` whose watch keys are among `keys` (the rest match no intent).
pub(crate) async fn intents_by_watch_keys(
    conn: &mut AnyConnection,
    network: Network,
    keys: &[&str],
) -> Result<Vec<PaymentIntent>, StoreError> {
    let mut intents = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(rows_per_statement(1) - 1) {
        let backend = super::backend_of_conn(conn);
        let sql = format!(
            "{} WHERE network = {} AND watch_key IN ({})",
            select_intents!(""),
            super::placeholder(backend, 1),
            list_placeholders_after(backend, 1, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(network.as_str());
        for key in chunk {
            query = query.bind(*key);
        }
        for row in query.fetch_all(&mut *conn).await? {
            intents.push(decode_intent(&row)?);
        }
    }
    Ok(intents)
}

/// The intent whose watch key on `network` is `watch_key`.
pub(crate) async fn intent_id_by_watch_key(
    conn: &mut AnyConnection,
    network: Network,
    watch_key: &str,
) -> Result<Option<String>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT id FROM payment_intents WHERE network = $1 AND watch_key = $2")
            .bind(network.as_str())
            .bind(watch_key)
            .fetch_optional(conn)
            .await?,
    )
}

/// `network IN (…)` with the placeholders after `$after`: lookups by txid or address probe the
/// `(network, …)` indexes once per network instead of reading the table.
fn networks_in(conn: &mut AnyConnection, after: usize, networks: &[Network]) -> String {
    format!(
        "network IN ({})",
        list_placeholders_after(super::backend_of_conn(conn), after, networks.len())
    )
}

/// The intent whose watch key is `watch_key` on any of `networks` (support lookup).
pub(crate) async fn intent_id_by_any_watch_key(
    conn: &mut AnyConnection,
    networks: &[Network],
    watch_key: &str,
) -> Result<Option<String>, StoreError> {
    let sql = format!(
        "SELECT id FROM payment_intents WHERE watch_key = {} AND {} ORDER BY id LIMIT 1",
        super::placeholder(super::backend_of_conn(conn), 1),
        networks_in(conn, 1, networks)
    );
    let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(watch_key);
    for network in networks {
        query = query.bind(network.as_str());
    }
    Ok(query.fetch_optional(conn).await?)
}

/// Every transfer of the transaction `txid` on any of `networks` (support lookup).
pub(crate) async fn transfers_by_txid(
    conn: &mut AnyConnection,
    networks: &[Network],
    txid: &str,
) -> Result<Vec<StoredTransfer>, StoreError> {
    transfers_where(conn, "txid", networks, txid).await
}

/// Every transfer to `address` on any of `networks`, matched or not (support lookup).
pub(crate) async fn transfers_to_address(
    conn: &mut AnyConnection,
    networks: &[Network],
    address: &str,
) -> Result<Vec<StoredTransfer>, StoreError> {
    transfers_where(conn, "to_address", networks, address).await
}

async fn transfers_where(
    conn: &mut AnyConnection,
    column: &'static str,
    networks: &[Network],
    value: &str,
) -> Result<Vec<StoredTransfer>, StoreError> {
    let sql = format!(
        "SELECT {TRANSFER_COLUMNS} FROM transfers t WHERE t.{column} = {} AND t.{} \
         ORDER BY t.seen_at_ms, t.txid, t.position",
        super::placeholder(super::backend_of_conn(conn), 1),
        networks_in(conn, 1, networks)
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(value);
    for network in networks {
        query = query.bind(network.as_str());
    }
    query
        .fetch_all(conn)
        .await?
        .iter()
        .map(decode_transfer)
        .collect()
}

/// Intents whose deadline has passed in a state the deadline changes: nothing received
/// (becomes expired) or part received and confirmed (becomes underpaid). A `seen` intent waits
/// for its confirmations, which arrive as chain events, so the clock alone never moves it and
/// it is not selected: otherwise stuck ones would crowd every batch. Each network's deadlines
/// are judged against its own cutoff (see [`crate::intent::ChainRead`]).
pub(crate) async fn due_intent_ids(
    conn: &mut AnyConnection,
    cutoffs: &[(Network, DateTime<Utc>)],
    limit: i64,
) -> Result<Vec<String>, StoreError> {
    let mut due = Vec::new();
    for (network, cutoff) in cutoffs {
        let left = limit - due.len() as i64;
        if left <= 0 {
            break;
        }
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM payment_intents WHERE status IN ('awaiting_payment', 'confirmed') \
             AND deadline_ms < $1 AND network = $2 ORDER BY deadline_ms, id LIMIT $3",
        )
        .bind(cutoff.timestamp_millis())
        .bind(network.as_str())
        .bind(left)
        .fetch_all(&mut *conn)
        .await?;
        due.extend(ids);
    }
    Ok(due)
}

/// The watch keys of `network` a watcher must follow now: every intent inside its monitoring
/// window, expired and superseded ones included.
pub(crate) async fn watch_keys(
    conn: &mut AnyConnection,
    network: Network,
    now: DateTime<Utc>,
) -> Result<Vec<String>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT watch_key FROM payment_intents WHERE network = $1 AND monitor_until_ms > $2 ORDER BY watch_key",
    )
    .bind(network.as_str())
    .bind(now.timestamp_millis())
    .fetch_all(conn)
    .await?)
}

/// Records the customer's "I have paid" once; later calls keep the first time.
pub(crate) async fn mark_paid(
    conn: &mut AnyConnection,
    id: &str,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let result = sqlx::query(
        "UPDATE payment_intents SET marked_paid_at_ms = $2 WHERE id = $1 AND marked_paid_at_ms IS NULL",
    )
    .bind(id)
    .bind(now.timestamp_millis())
    .execute(conn)
    .await?;
    Ok(result.rows_affected() == 1)
}

/// Writes an intent's evaluated state.
pub(crate) async fn update_intent_state(
    conn: &mut AnyConnection,
    intent: &PaymentIntent,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE payment_intents SET status = $2, first_seen_at_ms = $3, settled_at_ms = $4, \
         settlement_count = $5 WHERE id = $1",
    )
    .bind(intent.id.as_str())
    .bind(intent.status.as_str())
    .bind(intent.first_seen_at.map(|t| t.timestamp_millis()))
    .bind(intent.settled_at.map(|t| t.timestamp_millis()))
    .bind(i64::from(intent.settlement_count))
    .execute(conn)
    .await?;
    Ok(())
}

/// Writes many intents' evaluated states, one statement per [`rows_per_statement`] intents.
pub(crate) async fn update_intent_states(
    tx: &mut WriteTx,
    intents: &[&PaymentIntent],
) -> Result<(), StoreError> {
    const COLUMNS: usize = 5;
    for chunk in intents.chunks(rows_per_statement(COLUMNS)) {
        let sql = format!(
            "WITH v (id, status, first_seen_at_ms, settled_at_ms, settlement_count) AS (VALUES {}) \
             UPDATE payment_intents SET status = v.status, first_seen_at_ms = v.first_seen_at_ms, \
             settled_at_ms = v.settled_at_ms, settlement_count = v.settlement_count \
             FROM v WHERE payment_intents.id = v.id",
            values_placeholders(tx.backend(), COLUMNS, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for intent in chunk {
            query = query
                .bind(intent.id.as_str())
                .bind(intent.status.as_str())
                .bind(intent.first_seen_at.map(|t| t.timestamp_millis()))
                .bind(intent.settled_at.map(|t| t.timestamp_millis()))
                .bind(i64::from(intent.settlement_count));
        }
        let updated = query.execute(tx.conn()).await?.rows_affected();
        if updated != chunk.len() as u64 {
            return Err(StoreError::Corrupt(format!(
                "{} of {} intents to update were found",
                updated,
                chunk.len()
            )));
        }
    }
    Ok(())
}

fn decode_intent(row: &sqlx::any::AnyRow) -> Result<PaymentIntent, StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("payment intent row: {what}"));
    let optional_time = |column: &str| -> Result<Option<DateTime<Utc>>, StoreError> {
        row.try_get::<Option<i64>, _>(column)?
            .map(millis)
            .transpose()
    };
    let amount: String = row.try_get("amount_base")?;
    Ok(PaymentIntent {
        id: row.try_get("id")?,
        order_ref: OrderRef::new(row.try_get::<String, _>("order_ref")?)
            .map_err(|e| corrupt(e.to_string()))?,
        method: row
            .try_get::<String, _>("method")?
            .parse::<Method>()
            .map_err(|e| corrupt(e.to_string()))?,
        pay_to: row.try_get("pay_to")?,
        watch_key: row.try_get("watch_key")?,
        amount: Amount::from_decimal_str(&amount, 0).map_err(|e| corrupt(e.to_string()))?,
        usd: Usd::from_cents(row.try_get("usd_cents")?).map_err(|e| corrupt(e.to_string()))?,
        rate: IntentRate {
            usd_per_unit: row
                .try_get::<String, _>("rate_usd")?
                .parse()
                .map_err(|_| corrupt("rate".into()))?,
            source: row.try_get("rate_source")?,
            fetched_at: millis(row.try_get("rate_fetched_at_ms")?)?,
        },
        created_at: millis(row.try_get("created_at_ms")?)?,
        deadline: millis(row.try_get("deadline_ms")?)?,
        monitor_until: millis(row.try_get("monitor_until_ms")?)?,
        status: row
            .try_get::<String, _>("status")?
            .parse()
            .map_err(corrupt)?,
        superseded_by: row.try_get("superseded_by")?,
        marked_paid_at: optional_time("marked_paid_at_ms")?,
        first_seen_at: optional_time("first_seen_at_ms")?,
        settled_at: optional_time("settled_at_ms")?,
        settlement_count: u32::try_from(row.try_get::<i64, _>("settlement_count")?)
            .map_err(|_| corrupt("settlement_count".into()))?,
        key_id: row.try_get("key_id")?,
        derivation_index: u32::try_from(row.try_get::<i64, _>("derivation_index")?)
            .map_err(|_| corrupt("derivation_index".into()))?,
        checkout_key: row.try_get("checkout_key")?,
    })
}

pub(crate) fn parse_asset(text: &str) -> Result<ReceivedAsset, StoreError> {
    match text.strip_prefix("token:") {
        Some(contract) => Ok(ReceivedAsset::OtherToken {
            contract: contract.to_owned(),
        }),
        None => text
            .parse()
            .map(|method| ReceivedAsset::Method { method })
            .map_err(|_| StoreError::Corrupt(format!("transfer asset {text:?}"))),
    }
}

/// The columns every transfer query selects, from `transfers t`, for [`decode_transfer`].
pub(crate) const TRANSFER_COLUMNS: &str = "t.network, t.txid, t.position, t.to_address, t.asset, \
     t.amount_base, t.intent_id, t.confirmations, t.block_height, t.removed, t.tip_height, \
     t.seen_at_ms, t.credited_entry, t.from_address";

/// How the matcher orders an intent's transfers: first seen first, then by id, byte-wise (not
/// by a database collation, so every store and every path agrees).
pub(crate) fn transfer_order(a: &StoredTransfer, b: &StoredTransfer) -> std::cmp::Ordering {
    (a.seen_at_ms, a.id.txid.as_bytes(), a.id.position).cmp(&(
        b.seen_at_ms,
        b.id.txid.as_bytes(),
        b.id.position,
    ))
}

/// One transfer by id.
pub(crate) async fn get_transfer(
    conn: &mut AnyConnection,
    id: &TransferId,
) -> Result<Option<StoredTransfer>, StoreError> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {TRANSFER_COLUMNS} FROM transfers t WHERE t.network = $1 AND t.txid = $2 AND t.position = $3"
    )))
    .bind(id.network.as_str())
    .bind(id.txid.as_str())
    .bind(i64::from(id.position))
    .fetch_optional(conn)
    .await?;
    row.map(|row| decode_transfer(&row)).transpose()
}

/// Every transfer that paid an intent's watch key, in [`transfer_order`].
pub(crate) async fn transfers_of_intent(
    conn: &mut AnyConnection,
    intent_id: &str,
) -> Result<Vec<StoredTransfer>, StoreError> {
    let mut transfers = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {TRANSFER_COLUMNS} FROM transfers t WHERE t.intent_id = $1"
    )))
    .bind(intent_id)
    .fetch_all(conn)
    .await?
    .iter()
    .map(decode_transfer)
    .collect::<Result<Vec<_>, _>>()?;
    transfers.sort_by(transfer_order);
    Ok(transfers)
}

/// The transfers with these ids that exist.
pub(crate) async fn transfers_by_ids(
    conn: &mut AnyConnection,
    ids: &[&TransferId],
) -> Result<Vec<StoredTransfer>, StoreError> {
    let mut by_network: BTreeMap<Network, Vec<&str>> = BTreeMap::new();
    for id in ids {
        by_network.entry(id.network).or_default().push(&id.txid);
    }
    let wanted: HashSet<&TransferId> = ids.iter().copied().collect();
    let backend = super::backend_of_conn(conn);
    let mut transfers = Vec::with_capacity(ids.len());
    for (network, mut txids) in by_network {
        txids.sort_unstable();
        txids.dedup();
        for chunk in txids.chunks(rows_per_statement(1) - 1) {
            let sql = format!(
                "SELECT {TRANSFER_COLUMNS} FROM transfers t WHERE t.network = {} AND t.txid IN ({})",
                super::placeholder(backend, 1),
                list_placeholders_after(backend, 1, chunk.len())
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(network.as_str());
            for txid in chunk {
                query = query.bind(*txid);
            }
            for row in query.fetch_all(&mut *conn).await? {
                let transfer = decode_transfer(&row)?;
                if wanted.contains(&transfer.id) {
                    transfers.push(transfer);
                }
            }
        }
    }
    Ok(transfers)
}

/// Every transfer that paid any of these intents.
pub(crate) async fn transfers_of_intents(
    conn: &mut AnyConnection,
    intent_ids: &[&str],
) -> Result<Vec<StoredTransfer>, StoreError> {
    let mut transfers = Vec::new();
    for chunk in intent_ids.chunks(rows_per_statement(1)) {
        let sql = format!(
            "SELECT {TRANSFER_COLUMNS} FROM transfers t WHERE t.intent_id IN ({})",
            list_placeholders(super::backend_of_conn(conn), chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in chunk {
            query = query.bind(*id);
        }
        for row in query.fetch_all(&mut *conn).await? {
            transfers.push(decode_transfer(&row)?);
        }
    }
    Ok(transfers)
}

/// Every transfer to any of an order's intents, oldest first.
pub(crate) async fn transfers_of_order(
    conn: &mut AnyConnection,
    order_ref: &str,
) -> Result<Vec<StoredTransfer>, StoreError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {TRANSFER_COLUMNS} FROM transfers t JOIN payment_intents i ON i.id = t.intent_id \
         WHERE i.order_ref = $1 ORDER BY t.seen_at_ms, t.txid, t.position"
    )))
    .bind(order_ref)
    .fetch_all(conn)
    .await?
    .iter()
    .map(decode_transfer)
    .collect()
}

/// Inserts or replaces a transfer's state, stamped with the transaction's feed position.
pub(crate) async fn upsert_transfer(
    tx: &mut WriteTx,
    transfer: &StoredTransfer,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    upsert_transfers(tx, &[transfer], now).await
}

/// Inserts or replaces many transfers' states, one statement per [`rows_per_statement`] rows.
/// What identifies a transfer (address, asset, amount, intent) never changes once written; a
/// sender is filled in when a transfer recorded before payrecon kept senders is seen again.
pub(crate) async fn upsert_transfers(
    tx: &mut WriteTx,
    transfers: &[&StoredTransfer],
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    const COLUMNS: usize = 16;
    if transfers.is_empty() {
        return Ok(());
    }
    let feed_position = tx.feed_position().await?;
    for chunk in transfers.chunks(rows_per_statement(COLUMNS)) {
        let sql = format!(
            "INSERT INTO transfers (network, txid, position, to_address, asset, amount_base, intent_id, confirmations, \
             removed, tip_height, seen_at_ms, updated_at_ms, credited_entry, block_height, feed_pos, from_address) \
             VALUES {} ON CONFLICT (network, txid, position) DO UPDATE SET confirmations = excluded.confirmations, \
             block_height = excluded.block_height, removed = excluded.removed, tip_height = excluded.tip_height, \
             seen_at_ms = excluded.seen_at_ms, updated_at_ms = excluded.updated_at_ms, \
             credited_entry = excluded.credited_entry, feed_pos = excluded.feed_pos, \
             from_address = excluded.from_address",
            values_placeholders(tx.backend(), COLUMNS, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for transfer in chunk {
            query = query
                .bind(transfer.id.network.as_str())
                .bind(transfer.id.txid.as_str())
                .bind(i64::from(transfer.id.position))
                .bind(transfer.to_address.as_str())
                .bind(transfer.asset.to_string())
                .bind(transfer.amount.to_string())
                .bind(transfer.intent_id.as_deref())
                .bind(i64::from(transfer.confirmations))
                .bind(i64::from(transfer.removed))
                .bind(i64::try_from(transfer.tip_height).unwrap_or(i64::MAX))
                .bind(transfer.seen_at_ms)
                .bind(now.timestamp_millis())
                .bind(transfer.credited_entry.as_deref())
                .bind(
                    transfer
                        .block_height
                        .map(|height| i64::try_from(height).unwrap_or(i64::MAX)),
                )
                .bind(feed_position)
                .bind(transfer.from_address.as_deref());
        }
        query.execute(tx.conn()).await?;
    }
    Ok(())
}

/// A transfer row as [`TRANSFER_COLUMNS`] selects it.
pub(crate) fn decode_transfer(row: &sqlx::any::AnyRow) -> Result<StoredTransfer, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("transfer row: {what}"));
    let network: String = row.try_get("network")?;
    let amount: String = row.try_get("amount_base")?;
    Ok(StoredTransfer {
        id: TransferId {
            network: network.parse().map_err(|_| corrupt("network"))?,
            txid: row.try_get("txid")?,
            position: u32::try_from(row.try_get::<i64, _>("position")?)
                .map_err(|_| corrupt("position"))?,
        },
        to_address: row.try_get("to_address")?,
        asset: parse_asset(&row.try_get::<String, _>("asset")?)?,
        amount: Amount::from_decimal_str(&amount, 0).map_err(|_| corrupt("amount"))?,
        from_address: row.try_get("from_address")?,
        intent_id: row.try_get("intent_id")?,
        confirmations: u32::try_from(row.try_get::<i64, _>("confirmations")?)
            .map_err(|_| corrupt("confirmations"))?,
        block_height: row
            .try_get::<Option<i64>, _>("block_height")?
            .map(|height| u64::try_from(height).map_err(|_| corrupt("block_height")))
            .transpose()?,
        removed: row.try_get::<i64, _>("removed")? != 0,
        tip_height: u64::try_from(row.try_get::<i64, _>("tip_height")?)
            .map_err(|_| corrupt("tip_height"))?,
        seen_at_ms: row.try_get("seen_at_ms")?,
        credited_entry: row.try_get("credited_entry")?,
    })
}

/// The event that announces a newly opened exception.
pub(crate) fn exception_opened_event(exception: &ExceptionRecord) -> NewEvent {
    NewEvent {
        intent_id: exception.intent_id.clone(),
        order_ref: exception.order_ref.clone(),
        kind: "exception_opened",
        detail: serde_json::json!({
            "exception": exception.id,
            "kind": exception.kind,
            "detail": exception.detail,
        }),
    }
}

/// Opens an exception unless one with that id exists. Returns whether it is new.
pub(crate) async fn open_exception(
    conn: &mut AnyConnection,
    exception: &ExceptionRecord,
) -> Result<bool, StoreError> {
    let result = sqlx::query(
        "INSERT INTO exceptions (id, kind, intent_id, order_ref, transfer, detail, opened_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING",
    )
    .bind(exception.id.as_str())
    .bind(exception.kind.as_str())
    .bind(exception.intent_id.as_deref())
    .bind(exception.order_ref.as_deref())
    .bind(exception.transfer.as_deref())
    .bind(exception.detail.as_str())
    .bind(exception.opened_at.timestamp_millis())
    .execute(conn)
    .await?;
    Ok(result.rows_affected() == 1)
}

/// Closes an open exception payrecon itself settled (a witness that confirmed what it held),
/// with `resolution`; returns whether it was open.
pub(crate) async fn close_exception(
    conn: &mut AnyConnection,
    id: &str,
    resolution: &str,
    at_ms: i64,
) -> Result<bool, StoreError> {
    let updated = sqlx::query(
        "UPDATE exceptions SET resolved_at_ms = $2, resolution = $3, resolved_by = 'payrecon' \
         WHERE id = $1 AND resolved_at_ms IS NULL",
    )
    .bind(id)
    .bind(at_ms)
    .bind(resolution)
    .execute(conn)
    .await?;
    Ok(updated.rows_affected() == 1)
}

/// Opens many exceptions, each unless one with its id exists. Returns the ids that are new.
pub(crate) async fn open_exceptions(
    conn: &mut AnyConnection,
    records: &[&ExceptionRecord],
) -> Result<HashSet<String>, StoreError> {
    const COLUMNS: usize = 7;
    let mut opened = HashSet::new();
    for chunk in records.chunks(rows_per_statement(COLUMNS)) {
        let sql = format!(
            "INSERT INTO exceptions (id, kind, intent_id, order_ref, transfer, detail, opened_at_ms) \
             VALUES {} ON CONFLICT (id) DO NOTHING RETURNING id",
            values_placeholders(super::backend_of_conn(conn), COLUMNS, chunk.len())
        );
        let mut query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql));
        for exception in chunk {
            query = query
                .bind(exception.id.as_str())
                .bind(exception.kind.as_str())
                .bind(exception.intent_id.as_deref())
                .bind(exception.order_ref.as_deref())
                .bind(exception.transfer.as_deref())
                .bind(exception.detail.as_str())
                .bind(exception.opened_at.timestamp_millis());
        }
        opened.extend(query.fetch_all(&mut *conn).await?);
    }
    Ok(opened)
}

/// The open exceptions of one intent, oldest first (by `exceptions_by_intent`): what its
/// checkout page weighs on each view.
pub(crate) async fn open_exceptions_of_intent(
    conn: &mut AnyConnection,
    intent_id: &str,
) -> Result<Vec<ExceptionRecord>, StoreError> {
    let rows = sqlx::query(
        "SELECT id, kind, intent_id, order_ref, transfer, detail, opened_at_ms, resolved_at_ms, resolution \
         FROM exceptions WHERE intent_id = $1 AND resolved_at_ms IS NULL ORDER BY opened_at_ms, id",
    )
    .bind(intent_id)
    .fetch_all(conn)
    .await?;
    rows.iter().map(decode_exception).collect()
}

/// The exceptions of an order (through its intents), or of everything when `None`.
pub(crate) async fn exceptions(
    conn: &mut AnyConnection,
    order_ref: Option<&str>,
) -> Result<Vec<ExceptionRecord>, StoreError> {
    let rows = match order_ref {
        Some(order_ref) => sqlx::query(
            "SELECT id, kind, intent_id, order_ref, transfer, detail, opened_at_ms, resolved_at_ms, resolution \
                 FROM exceptions WHERE order_ref = $1 ORDER BY opened_at_ms, id",
        )
        .bind(order_ref)
        .fetch_all(conn)
        .await?,
        None => sqlx::query(
            "SELECT id, kind, intent_id, order_ref, transfer, detail, opened_at_ms, resolved_at_ms, resolution \
                 FROM exceptions ORDER BY opened_at_ms, id",
        )
        .fetch_all(conn)
        .await?,
    };
    rows.iter().map(decode_exception).collect()
}

/// Up to `limit` exceptions after `after` (opened time, id), oldest first; only open ones
/// when `open_only`.
pub(crate) async fn exceptions_page(
    conn: &mut AnyConnection,
    open_only: bool,
    after: (i64, &str),
    limit: i64,
) -> Result<Vec<ExceptionRecord>, StoreError> {
    let open = if open_only {
        "AND resolved_at_ms IS NULL"
    } else {
        ""
    };
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT id, kind, intent_id, order_ref, transfer, detail, opened_at_ms, resolved_at_ms, resolution \
         FROM exceptions WHERE (opened_at_ms > $1 OR (opened_at_ms = $1 AND id > $2)) {open} \
         ORDER BY opened_at_ms, id LIMIT $3"
    )))
    .bind(after.0)
    .bind(after.1)
    .bind(limit)
    .fetch_all(conn)
    .await?
    .iter()
    .map(decode_exception)
    .collect()
}

/// The exceptions about one transfer (`network:txid:position`).
pub(crate) async fn exceptions_of_transfer(
    conn: &mut AnyConnection,
    transfer: &str,
) -> Result<Vec<ExceptionRecord>, StoreError> {
    sqlx::query(
        "SELECT id, kind, intent_id, order_ref, transfer, detail, opened_at_ms, resolved_at_ms, resolution \
             FROM exceptions WHERE transfer = $1 ORDER BY opened_at_ms, id",
    )
    .bind(transfer)
    .fetch_all(conn)
    .await?
    .iter()
    .map(decode_exception)
    .collect()
}

/// An exception row, as every exception query selects it.
pub(crate) fn decode_exception(row: &sqlx::any::AnyRow) -> Result<ExceptionRecord, StoreError> {
    Ok(ExceptionRecord {
        id: row.try_get("id")?,
        kind: row.try_get("kind")?,
        intent_id: row.try_get("intent_id")?,
        order_ref: row.try_get("order_ref")?,
        transfer: row.try_get("transfer")?,
        detail: row.try_get("detail")?,
        opened_at: millis(row.try_get("opened_at_ms")?)?,
        resolved_at: row
            .try_get::<Option<i64>, _>("resolved_at_ms")?
            .map(millis)
            .transpose()?,
        resolution: row.try_get("resolution")?,
    })
}

/// An entry of the event stream about to be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NewEvent {
    pub intent_id: Option<String>,
    pub order_ref: Option<String>,
    pub kind: &'static str,
    pub detail: serde_json::Value,
}

/// Appends to the event stream inside the transaction that made the change.
pub(crate) async fn append_event(
    conn: &mut AnyConnection,
    intent_id: Option<&str>,
    order_ref: Option<&str>,
    kind: &'static str,
    detail: &serde_json::Value,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let event = NewEvent {
        intent_id: intent_id.map(str::to_owned),
        order_ref: order_ref.map(str::to_owned),
        kind,
        detail: detail.clone(),
    };
    append_events(conn, &[event], now).await
}

/// Appends many events in order, all at `now`.
pub(crate) async fn append_events(
    conn: &mut AnyConnection,
    events: &[NewEvent],
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let timed: Vec<(&NewEvent, DateTime<Utc>)> = events.iter().map(|e| (e, now)).collect();
    append_events_at(conn, &timed).await
}

/// Appends many events in order, each at its own time, one statement per
/// [`rows_per_statement`] events.
pub(crate) async fn append_events_at(
    conn: &mut AnyConnection,
    events: &[(&NewEvent, DateTime<Utc>)],
) -> Result<(), StoreError> {
    const COLUMNS: usize = 5;
    for chunk in events.chunks(rows_per_statement(COLUMNS)) {
        let sql = format!(
            "INSERT INTO intent_events (intent_id, order_ref, kind, detail, at_ms) VALUES {}",
            values_placeholders(super::backend_of_conn(conn), COLUMNS, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (event, at) in chunk {
            query = query
                .bind(event.intent_id.as_deref())
                .bind(event.order_ref.as_deref())
                .bind(event.kind)
                .bind(event.detail.to_string())
                .bind(at.timestamp_millis());
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// Events after `after_seq`, at most `limit`, in order.
pub(crate) async fn events_after(
    conn: &mut AnyConnection,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<IntentEvent>, StoreError> {
    sqlx::query(
        "SELECT seq, intent_id, order_ref, kind, detail, at_ms FROM intent_events WHERE seq > $1 ORDER BY seq LIMIT $2",
    )
    .bind(after_seq)
    .bind(limit)
    .fetch_all(conn)
    .await?
    .iter()
    .map(|row| {
        let detail: String = row.try_get("detail")?;
        Ok(IntentEvent {
            seq: row.try_get("seq")?,
            intent_id: row.try_get("intent_id")?,
            order_ref: row.try_get("order_ref")?,
            kind: row.try_get("kind")?,
            detail: serde_json::from_str(&detail)
                .map_err(|e| StoreError::Corrupt(format!("event detail: {e}")))?,
            at: millis(row.try_get("at_ms")?)?,
        })
    })
    .collect()
}
