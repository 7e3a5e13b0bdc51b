//! Refunds and their history.

use chrono::DateTime;
use payrecon_chain_core::{Amount, Method};
use sqlx::{AnyConnection, Row};

use super::StoreError;
use crate::records::{Refund, RefundState};

const COLUMNS: &str = "id, exception_id, intent_id, order_ref, method, amount_base, amount_kind, \
                       address, state, created_at_ms, updated_at_ms";

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
         amount_kind, address, state, created_at_ms, updated_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
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
        state: RefundState::parse(&state).ok_or_else(|| corrupt(format!("state {state:?}")))?,
        created_at: at("created_at_ms")?,
        updated_at: at("updated_at_ms")?,
    })
}
