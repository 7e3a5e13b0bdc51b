//! Refunds and their history.

use chrono::DateTime;
use payrecon_chain_core::{Amount, Method};
use sqlx::{AnyConnection, Row};

use super::StoreError;
use crate::records::{FeePayer, Refund, RefundState};

const COLUMNS: &str = "id, exception_id, intent_id, order_ref, method, amount_base, amount_kind, \
                       address, fee_payer, state, txid, block_height, paid_base, created_at_ms, \
                       updated_at_ms";

/// Holds the exception's row until the transaction ends, so two refunds of it are decided one
/// after the other and never take more than it holds together.
pub(crate) async fn lock_exception(conn: &mut AnyConnection, id: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE exceptions SET id = id WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Records a new refund and its first event.
pub(crate) async fn insert(
    conn: &mut AnyConnection,
    refund: &Refund,
    actor: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO refunds (id, exception_id, intent_id, order_ref, network, method, amount_base, \
         amount_kind, address, state, created_at_ms, updated_at_ms, fee_payer) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
    )
    .bind(refund.id.as_str())
    .bind(refund.exception_id.as_str())
    .bind(refund.intent_id.as_deref())
    .bind(refund.order_ref.as_deref())
    .bind(refund.method.network().as_str())
    .bind(refund.method.id())
    .bind(refund.amount.base_units().to_string())
    .bind(refund.amount_kind.as_str())
    .bind(refund.address.as_str())
    .bind(refund.state.as_str())
    .bind(refund.created_at.timestamp_millis())
    .bind(refund.updated_at.timestamp_millis())
    .bind(refund.fee_payer.as_str())
    .execute(&mut *conn)
    .await?;
    record_event(
        conn,
        &refund.id,
        refund.state,
        actor,
        "requested",
        refund.created_at.timestamp_millis(),
    )
    .await
}

/// Moves a refund to `state` if it is in one of `from`, with its event; returns whether it
/// moved.
pub(crate) async fn change_state(
    conn: &mut AnyConnection,
    id: &str,
    from: &[RefundState],
    state: RefundState,
    (actor, detail, at_ms): (&str, &str, i64),
) -> Result<bool, StoreError> {
    let mut moved = false;
    for before in from {
        let updated = sqlx::query(
            "UPDATE refunds SET state = $3, updated_at_ms = $4 WHERE id = $1 AND state = $2",
        )
        .bind(id)
        .bind(before.as_str())
        .bind(state.as_str())
        .bind(at_ms)
        .execute(&mut *conn)
        .await?;
        moved |= updated.rows_affected() == 1;
    }
    if moved {
        record_event(conn, id, state, actor, detail, at_ms).await?;
    }
    Ok(moved)
}

/// Where a refund stands on the chain: the transaction that pays it, its block and what it
/// paid, or none of them (before it is seen, and after a reorg took it out).
pub(crate) struct OnChain<'a> {
    pub(crate) txid: Option<&'a str>,
    pub(crate) block_height: Option<u64>,
    pub(crate) paid: Option<Amount>,
}

/// Moves a refund from `from` to `state` with what the chain shows of it and its event;
/// returns whether it moved.
pub(crate) async fn change_on_chain(
    conn: &mut AnyConnection,
    id: &str,
    (from, state): (RefundState, RefundState),
    on_chain: &OnChain<'_>,
    (actor, detail, at_ms): (&str, &str, i64),
) -> Result<bool, StoreError> {
    let height = on_chain
        .block_height
        .map(i64::try_from)
        .transpose()
        .map_err(|_| StoreError::Corrupt(format!("refund {id}: block height out of range")))?;
    let updated = sqlx::query(
        "UPDATE refunds SET state = $3, txid = $4, block_height = $5, paid_base = $6, \
         updated_at_ms = $7 WHERE id = $1 AND state = $2",
    )
    .bind(id)
    .bind(from.as_str())
    .bind(state.as_str())
    .bind(on_chain.txid)
    .bind(height)
    .bind(on_chain.paid.map(|paid| paid.base_units().to_string()))
    .bind(at_ms)
    .execute(&mut *conn)
    .await?;
    let moved = updated.rows_affected() == 1;
    if moved {
        record_event(conn, id, state, actor, detail, at_ms).await?;
    }
    Ok(moved)
}

/// The change index a prepared refund of `network` keeps, taking the next one the first time:
/// one past the highest any refund of the network took. Preparing again reuses it, so the
/// same refund is always the same transaction.
pub(crate) async fn change_index(
    conn: &mut AnyConnection,
    id: &str,
    network: &str,
) -> Result<u32, StoreError> {
    let kept: Option<i64> = sqlx::query_scalar("SELECT change_index FROM refunds WHERE id = $1")
        .bind(id)
        .fetch_one(&mut *conn)
        .await?;
    let index = match kept {
        Some(index) => index,
        None => {
            let highest: Option<i64> =
                sqlx::query_scalar("SELECT MAX(change_index) FROM refunds WHERE network = $1")
                    .bind(network)
                    .fetch_one(&mut *conn)
                    .await?;
            let next = highest.map_or(0, |h| h + 1);
            sqlx::query("UPDATE refunds SET change_index = $2 WHERE id = $1")
                .bind(id)
                .bind(next)
                .execute(&mut *conn)
                .await?;
            next
        }
    };
    u32::try_from(index)
        .map_err(|_| StoreError::Corrupt(format!("refund {id}: change index {index}")))
}

/// The refunds of `network` waiting for the chain (approved, prepared or sent), longest
/// unchanged first.
pub(crate) async fn awaiting_chain(
    conn: &mut AnyConnection,
    network: &str,
    limit: i64,
) -> Result<Vec<Refund>, StoreError> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM refunds WHERE network = $1 \
         AND state IN ('approved', 'prepared', 'sent') ORDER BY updated_at_ms, id LIMIT $2"
    )))
    .bind(network)
    .bind(limit)
    .fetch_all(conn)
    .await?;
    rows.iter().map(read).collect()
}

/// The other refunds, not withdrawn, that name transaction `txid` of `network` as what paid
/// them to `address` (by the `refunds_by_txid` index).
pub(crate) async fn paid_by_same(
    conn: &mut AnyConnection,
    (network, txid): (&str, &str),
    address: &str,
    except: &str,
) -> Result<Vec<Refund>, StoreError> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM refunds WHERE network = $1 AND txid = $2 AND address = $3 \
         AND id <> $4 AND state <> 'cancelled' ORDER BY id"
    )))
    .bind(network)
    .bind(txid)
    .bind(address)
    .bind(except)
    .fetch_all(conn)
    .await?;
    rows.iter().map(read).collect()
}

async fn record_event(
    conn: &mut AnyConnection,
    id: &str,
    state: RefundState,
    actor: &str,
    detail: &str,
    at_ms: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO refund_events (refund_id, state, actor, detail, at_ms) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(state.as_str())
    .bind(actor)
    .bind(detail)
    .bind(at_ms)
    .execute(conn)
    .await?;
    Ok(())
}

/// One refund.
pub(crate) async fn get(conn: &mut AnyConnection, id: &str) -> Result<Option<Refund>, StoreError> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM refunds WHERE id = $1"
    )))
    .bind(id)
    .fetch_optional(conn)
    .await?;
    row.map(|row| read(&row)).transpose()
}

/// The refunds of one exception, or all, oldest first (at most `limit`).
pub(crate) async fn list(
    conn: &mut AnyConnection,
    exception_id: Option<&str>,
    limit: i64,
) -> Result<Vec<Refund>, StoreError> {
    let rows = match exception_id {
        Some(exception_id) => {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT {COLUMNS} FROM refunds WHERE exception_id = $1 \
                 ORDER BY created_at_ms, id LIMIT $2"
            )))
            .bind(exception_id)
            .bind(limit)
            .fetch_all(conn)
            .await?
        }
        None => {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT {COLUMNS} FROM refunds ORDER BY created_at_ms, id LIMIT $1"
            )))
            .bind(limit)
            .fetch_all(conn)
            .await?
        }
    };
    rows.iter().map(read).collect()
}

/// Refunds in any of `states`, longest unchanged first (at most `limit`).
pub(crate) async fn in_states(
    conn: &mut AnyConnection,
    states: &[RefundState],
    limit: i64,
) -> Result<Vec<Refund>, StoreError> {
    let backend = super::backend_of_conn(conn);
    let sql = format!(
        "SELECT {COLUMNS} FROM refunds WHERE state IN ({}) ORDER BY updated_at_ms, id LIMIT {}",
        super::list_placeholders_after(backend, 0, states.len()),
        super::placeholder(backend, states.len() + 1)
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for state in states {
        query = query.bind(state.as_str());
    }
    let rows = query.bind(limit).fetch_all(conn).await?;
    rows.iter().map(read).collect()
}

/// The refunds of one intent's exceptions, oldest first.
pub(crate) async fn of_intent(
    conn: &mut AnyConnection,
    intent_id: &str,
) -> Result<Vec<Refund>, StoreError> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM refunds WHERE intent_id = $1 ORDER BY created_at_ms, id"
    )))
    .bind(intent_id)
    .fetch_all(conn)
    .await?;
    rows.iter().map(read).collect()
}

fn read(row: &sqlx::any::AnyRow) -> Result<Refund, StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("refund: {what}"));
    let method: String = row.try_get("method")?;
    let method: Method = method
        .parse()
        .map_err(|e| corrupt(format!("method: {e}")))?;
    let amount: String = row.try_get("amount_base")?;
    let amount = Amount::from_base_units(
        amount
            .parse()
            .map_err(|_| corrupt(format!("amount {amount:?}")))?,
    );
    let state: String = row.try_get("state")?;
    let fee_payer: String = row.try_get("fee_payer")?;
    let fee_payer = match fee_payer.as_str() {
        "shop" => FeePayer::Shop,
        "customer" => FeePayer::Customer,
        other => return Err(corrupt(format!("fee payer {other:?}"))),
    };
    let height: Option<i64> = row.try_get("block_height")?;
    let paid: Option<String> = row.try_get("paid_base")?;
    let paid = paid
        .map(|paid| {
            paid.parse()
                .map(Amount::from_base_units)
                .map_err(|_| corrupt(format!("paid {paid:?}")))
        })
        .transpose()?;
    let at = |column: &str| -> Result<DateTime<chrono::Utc>, StoreError> {
        let ms: i64 = row.try_get(column)?;
        DateTime::from_timestamp_millis(ms).ok_or_else(|| corrupt(format!("{column} {ms}")))
    };
    Ok(Refund {
        id: row.try_get("id")?,
        exception_id: row.try_get("exception_id")?,
        intent_id: row.try_get("intent_id")?,
        order_ref: row.try_get("order_ref")?,
        method,
        amount_decimal: method.format_amount(amount),
        amount,
        amount_kind: row.try_get("amount_kind")?,
        address: row.try_get("address")?,
        fee_payer,
        state: RefundState::parse(&state).ok_or_else(|| corrupt(format!("state {state:?}")))?,
        txid: row.try_get("txid")?,
        block_height: height
            .map(u64::try_from)
            .transpose()
            .map_err(|_| corrupt("block height".into()))?,
        paid,
        created_at: at("created_at_ms")?,
        updated_at: at("updated_at_ms")?,
    })
}
