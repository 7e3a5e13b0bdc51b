//! SQL for customers and orders.

use chrono::{DateTime, Utc};
use sqlx::{AnyConnection, Row};

use super::{StoreError, WriteTx, list_placeholders, rows_per_statement, values_placeholders};
use crate::order::{
    AccountId, Order, OrderKind, OrderRef, OrderStatus, RentalDetails, SettledVia, ValidOrder,
};

/// The order columns every order query selects.
const ORDER_COLUMNS: &str = "reference, kind, account_id, gpu_model, duration_days, lots, \
     gpu_count, total_usd_cents, content_hash, status, settled_via, settlement_entry, \
     created_at_ms, settled_at_ms, attention";

/// The order query; `$suffix` adds the row lock on PostgreSQL.
macro_rules! select_order {
    ($suffix:literal) => {
        concat!(
            "SELECT reference, kind, account_id, gpu_model, duration_days, lots, gpu_count, ",
            "total_usd_cents, content_hash, status, settled_via, settlement_entry, ",
            "created_at_ms, settled_at_ms, attention FROM orders WHERE reference = $1",
            $suffix
        )
    };
}

/// An order with the fingerprint of what the shop sent, to tell a retry from a conflict.
pub(crate) struct StoredOrder {
    pub order: Order,
    pub content_hash: String,
}

/// Records the customer if new. Idempotent.
pub(crate) async fn ensure_customer(
    conn: &mut AnyConnection,
    account_id: &AccountId,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    ensure_customers(conn, &[(account_id, now)]).await
}

/// Records many customers, each if new, in one statement per [`rows_per_statement`] rows.
pub(crate) async fn ensure_customers(
    conn: &mut AnyConnection,
    customers: &[(&AccountId, DateTime<Utc>)],
) -> Result<(), StoreError> {
    for chunk in customers.chunks(rows_per_statement(2)) {
        let sql = format!(
            "INSERT INTO customers (account_id, created_at_ms) VALUES {} ON CONFLICT (account_id) DO NOTHING",
            values_placeholders(super::backend_of_conn(conn), 2, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (account, at) in chunk {
            query = query.bind(account.as_str()).bind(at.timestamp_millis());
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// Inserts the order unless its reference exists. Returns whether it was inserted.
pub(crate) async fn insert_order(
    conn: &mut AnyConnection,
    order: &ValidOrder,
    content_hash: &str,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    Ok(!insert_orders(conn, &[(order, content_hash, now)])
        .await?
        .is_empty())
}

/// Inserts orders whose references are new (each reference at most once in `orders`), in one
/// statement per [`rows_per_statement`] rows. Returns the references inserted.
pub(crate) async fn insert_orders(
    conn: &mut AnyConnection,
    orders: &[(&ValidOrder, &str, DateTime<Utc>)],
) -> Result<std::collections::HashSet<String>, StoreError> {
    const COLUMNS: usize = 11;
    let mut inserted = std::collections::HashSet::new();
    for chunk in orders.chunks(rows_per_statement(COLUMNS)) {
        let sql = format!(
            "INSERT INTO orders (reference, kind, account_id, gpu_model, duration_days, lots, gpu_count, \
             total_usd_cents, content_hash, created_at_ms, status) VALUES {} \
             ON CONFLICT (reference) DO NOTHING RETURNING reference",
            values_placeholders(super::backend_of_conn(conn), COLUMNS, chunk.len())
        );
        let mut query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql));
        for (order, content_hash, now) in chunk {
            let rental = match &order.kind {
                OrderKind::Rental(details) => Some(details),
                OrderKind::Topup => None,
            };
            query = query
                .bind(order.reference.as_str())
                .bind(order.kind.as_str())
                .bind(order.account_id.as_str())
                .bind(rental.map(|r| r.gpu_model.clone()))
                .bind(rental.map(|r| i64::from(r.duration_days)))
                .bind(rental.map(|r| i64::from(r.lots)))
                .bind(rental.map(|r| i64::from(r.gpu_count)))
                .bind(order.total_usd.cents())
                .bind(*content_hash)
                .bind(now.timestamp_millis())
                .bind("open");
        }
        inserted.extend(query.fetch_all(&mut *conn).await?);
    }
    Ok(inserted)
}

/// Reads many orders (without locks).
pub(crate) async fn get_orders(
    conn: &mut AnyConnection,
    references: &[&str],
) -> Result<Vec<StoredOrder>, StoreError> {
    let mut orders = Vec::with_capacity(references.len());
    for chunk in references.chunks(rows_per_statement(1)) {
        let sql = format!(
            "SELECT {ORDER_COLUMNS} FROM orders WHERE reference IN ({})",
            list_placeholders(super::backend_of_conn(conn), chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for reference in chunk {
            query = query.bind(*reference);
        }
        for row in query.fetch_all(&mut *conn).await? {
            orders.push(decode_order(&row)?);
        }
    }
    Ok(orders)
}

/// Every order and top-up of one customer, oldest first (`orders_by_account`).
pub(crate) async fn orders_of_account(
    conn: &mut AnyConnection,
    account_id: &str,
) -> Result<Vec<StoredOrder>, StoreError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {ORDER_COLUMNS} FROM orders WHERE account_id = $1 ORDER BY created_at_ms, reference"
    )))
    .bind(account_id)
    .fetch_all(conn)
    .await?
    .iter()
    .map(decode_order)
    .collect()
}

/// Reads an order.
pub(crate) async fn get_order(
    conn: &mut AnyConnection,
    reference: &OrderRef,
) -> Result<Option<StoredOrder>, StoreError> {
    let row = sqlx::query(select_order!(""))
        .bind(reference.as_str())
        .fetch_optional(conn)
        .await?;
    row.map(|row| decode_order(&row)).transpose()
}

/// Reads an order and, on PostgreSQL, locks it until the transaction ends, so two settlements
/// of one order cannot both see it open.
pub(crate) async fn lock_order(
    tx: &mut WriteTx,
    reference: &OrderRef,
) -> Result<Option<StoredOrder>, StoreError> {
    let sql = tx
        .backend()
        .pick(select_order!(""), select_order!(" FOR UPDATE"));
    let row = sqlx::query(sql)
        .bind(reference.as_str())
        .fetch_optional(tx.conn())
        .await?;
    row.map(|row| decode_order(&row)).transpose()
}

/// Reads many orders and, on PostgreSQL, locks them until the transaction ends, in reference
/// order, so two transactions locking overlapping sets never wait on each other crosswise.
pub(crate) async fn lock_orders(
    tx: &mut WriteTx,
    references: &[&str],
) -> Result<Vec<StoredOrder>, StoreError> {
    let mut references = references.to_vec();
    references.sort_unstable();
    references.dedup();
    let lock = tx.backend().pick("", " FOR UPDATE");
    let mut orders = Vec::with_capacity(references.len());
    for chunk in references.chunks(rows_per_statement(1)) {
        let sql = format!(
            "SELECT {ORDER_COLUMNS} FROM orders WHERE reference IN ({}) ORDER BY reference{lock}",
            list_placeholders(tx.backend(), chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for reference in chunk {
            query = query.bind(*reference);
        }
        for row in query.fetch_all(tx.conn()).await? {
            orders.push(decode_order(&row)?);
        }
    }
    Ok(orders)
}

/// Writes many orders' settlement state (status, how, by which entry, when, attention) as the
/// caller decided it under the orders' locks, one statement per [`rows_per_statement`] orders.
pub(crate) async fn write_settlement_states(
    tx: &mut WriteTx,
    orders: &[&Order],
) -> Result<(), StoreError> {
    const COLUMNS: usize = 6;
    for chunk in orders.chunks(rows_per_statement(COLUMNS)) {
        let sql = format!(
            "WITH v (reference, status, settled_via, settlement_entry, settled_at_ms, attention) AS (VALUES {}) \
             UPDATE orders SET status = v.status, settled_via = v.settled_via, settlement_entry = v.settlement_entry, \
             settled_at_ms = v.settled_at_ms, attention = v.attention FROM v WHERE orders.reference = v.reference",
            values_placeholders(tx.backend(), COLUMNS, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for order in chunk {
            let (status, via, entry, at) = match &order.status {
                OrderStatus::Open => ("open", None, None, None),
                OrderStatus::Settled { via, entry_key, at } => (
                    "settled",
                    Some(via.as_str()),
                    Some(entry_key.as_str()),
                    Some(at.timestamp_millis()),
                ),
            };
            query = query
                .bind(order.reference.as_str())
                .bind(status)
                .bind(via)
                .bind(entry)
                .bind(at)
                .bind(order.attention.as_deref());
        }
        let updated = query.execute(tx.conn()).await?.rows_affected();
        if updated != chunk.len() as u64 {
            return Err(StoreError::Corrupt(format!(
                "{updated} of {} orders to update were found",
                chunk.len()
            )));
        }
    }
    Ok(())
}

/// Marks an open order settled. Fails if it was not open: a settlement is written once.
pub(crate) async fn mark_settled(
    conn: &mut AnyConnection,
    reference: &OrderRef,
    via: SettledVia,
    entry_key: &str,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let result = sqlx::query(
        "UPDATE orders SET status = 'settled', settled_via = $2, settlement_entry = $3, settled_at_ms = $4 \
         WHERE reference = $1 AND status = 'open'",
    )
    .bind(reference.as_str())
    .bind(via.as_str())
    .bind(entry_key)
    .bind(now.timestamp_millis())
    .execute(conn)
    .await?;
    if result.rows_affected() != 1 {
        return Err(StoreError::Corrupt(format!(
            "order {reference} was not open when settling it"
        )));
    }
    Ok(())
}

/// Reopens an order whose settlement entry `entry_key` was reversed, flagging it for operators.
pub(crate) async fn reopen_order(
    conn: &mut AnyConnection,
    reference: &OrderRef,
    entry_key: &str,
    attention: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE orders SET status = 'open', settled_via = NULL, settlement_entry = NULL, \
         settled_at_ms = NULL, attention = $3 WHERE reference = $1 AND settlement_entry = $2",
    )
    .bind(reference.as_str())
    .bind(entry_key)
    .bind(attention)
    .execute(conn)
    .await?;
    Ok(())
}

/// Clears an order's attention flag once an operator has dealt with it.
pub(crate) async fn clear_attention(
    conn: &mut AnyConnection,
    reference: &str,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE orders SET attention = NULL WHERE reference = $1")
        .bind(reference)
        .execute(conn)
        .await?;
    Ok(())
}

fn decode_order(row: &sqlx::any::AnyRow) -> Result<StoredOrder, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("order row: {what}"));
    let reference = OrderRef::new(row.try_get::<String, _>("reference")?)
        .map_err(|e| corrupt(&e.to_string()))?;
    let account_id = AccountId::new(row.try_get::<String, _>("account_id")?)
        .map_err(|e| corrupt(&e.to_string()))?;
    let small = |column: &str| -> Result<u32, StoreError> {
        let value: i64 = row.try_get(column)?;
        u32::try_from(value).map_err(|_| corrupt(column))
    };
    let kind = match row.try_get::<String, _>("kind")?.as_str() {
        "rental" => OrderKind::Rental(RentalDetails {
            gpu_model: row.try_get("gpu_model")?,
            duration_days: small("duration_days")?,
            lots: small("lots")?,
            gpu_count: small("gpu_count")?,
        }),
        "topup" => OrderKind::Topup,
        other => return Err(corrupt(&format!("kind {other:?}"))),
    };
    let total_usd = crate::money::Usd::from_cents(row.try_get("total_usd_cents")?)
        .map_err(|e| corrupt(&e.to_string()))?;
    let status = match row.try_get::<String, _>("status")?.as_str() {
        "open" => OrderStatus::Open,
        "settled" => OrderStatus::Settled {
            via: match row.try_get::<String, _>("settled_via")?.as_str() {
                "balance" => SettledVia::Balance,
                "payment" => SettledVia::Payment,
                other => return Err(corrupt(&format!("settled_via {other:?}"))),
            },
            entry_key: row.try_get("settlement_entry")?,
            at: millis(row.try_get("settled_at_ms")?)?,
        },
        other => return Err(corrupt(&format!("status {other:?}"))),
    };
    Ok(StoredOrder {
        order: Order {
            reference,
            account_id,
            kind,
            total_usd,
            status,
            created_at: millis(row.try_get("created_at_ms")?)?,
            attention: row.try_get("attention")?,
        },
        content_hash: row.try_get("content_hash")?,
    })
}

/// A stored millisecond timestamp.
pub(crate) fn millis(value: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(value)
        .ok_or_else(|| StoreError::Corrupt(format!("timestamp {value} out of range")))
}
