//! SQL for the reconciliation report. Every query streams its rows: a report over millions of
//! transfers holds one row at a time, plus per-method and per-day sums.

use futures_util::{Stream, StreamExt};
use payrecon_chain_core::Amount;
use sqlx::{AnyConnection, Row};

use super::payments::{ExceptionRecord, decode_exception, parse_asset};
use super::payments::{StoredTransfer, asset_text};
use super::{StoreError, WriteTx, decode_exact_sum, exact_sum, values_placeholders};

/// A transfer with the intent and order it paid, as the report lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReportTransfer {
    pub network: String,
    pub txid: String,
    pub position: i64,
    pub to_address: String,
    pub asset: payrecon_chain_core::ReceivedAsset,
    pub amount: Amount,
    pub intent_id: Option<String>,
    pub order_ref: Option<String>,
    pub intent_method: Option<String>,
    pub intent_status: Option<String>,
    pub intent_usd_cents: Option<i64>,
    pub confirmations: i64,
    pub block_height: Option<i64>,
    pub removed: bool,
    pub seen_at_ms: i64,
    pub credited_entry: Option<String>,
}

/// Transfers first seen in `[from_ms, to_ms)`, oldest first.
pub(crate) fn transfers_in(
    conn: &mut AnyConnection,
    from_ms: i64,
    to_ms: i64,
) -> impl Stream<Item = Result<ReportTransfer, StoreError>> + '_ {
    sqlx::query(
        "SELECT t.network, t.txid, t.position, t.to_address, t.asset, t.amount_base, t.intent_id, \
         i.order_ref, i.method, i.status, i.usd_cents, t.confirmations, t.block_height, t.removed, t.seen_at_ms, t.credited_entry \
         FROM transfers t LEFT JOIN payment_intents i ON i.id = t.intent_id \
         WHERE t.seen_at_ms >= $1 AND t.seen_at_ms < $2 ORDER BY t.seen_at_ms, t.network, t.txid, t.position",
    )
    .bind(from_ms)
    .bind(to_ms)
    .fetch(conn)
    .map(|row| {
        let row = row?;
        Ok(ReportTransfer {
            network: row.try_get("network")?,
            txid: row.try_get("txid")?,
            position: row.try_get("position")?,
            to_address: row.try_get("to_address")?,
            asset: parse_asset(&row.try_get::<String, _>("asset")?)?,
            amount: base_units(&row)?,
            intent_id: row.try_get("intent_id")?,
            order_ref: row.try_get("order_ref")?,
            intent_method: row.try_get("method")?,
            intent_status: row.try_get("status")?,
            intent_usd_cents: row.try_get("usd_cents")?,
            confirmations: row.try_get("confirmations")?,
            block_height: row.try_get("block_height")?,
            removed: row.try_get::<i64, _>("removed")? != 0,
            seen_at_ms: row.try_get("seen_at_ms")?,
            credited_entry: row.try_get("credited_entry")?,
        })
    })
}

/// Intents created in a period, counted by method, status and whether a newer intent
/// superseded them, with the crypto they asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IntentSums {
    pub method: String,
    pub status: String,
    pub superseded: bool,
    pub count: i64,
    pub expected: i128,
}

/// [`IntentSums`] of intents created in `[from_ms, to_ms)`: one aggregate, however many.
pub(crate) async fn intent_sums(
    conn: &mut AnyConnection,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<IntentSums>, StoreError> {
    let backend = super::backend_of_conn(conn);
    let sql = format!(
        "SELECT method, status, CAST(CASE WHEN superseded_by IS NULL THEN 0 ELSE 1 END AS BIGINT) AS superseded, \
         COUNT(*) AS n, {} FROM payment_intents WHERE created_at_ms >= $1 AND created_at_ms < $2 \
         GROUP BY method, status, CASE WHEN superseded_by IS NULL THEN 0 ELSE 1 END",
        exact_sum(backend, "amount_base")
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(conn)
        .await?;
    rows.iter()
        .map(|row| {
            Ok(IntentSums {
                method: row.try_get(0)?,
                status: row.try_get(1)?,
                superseded: row.try_get::<i64, _>(2)? != 0,
                count: row.try_get(3)?,
                expected: decode_exact_sum(row, 4, backend)?,
            })
        })
        .collect()
}

/// Transfers first seen in a period and not removed, summed by asset, day and whether an
/// entry accounts for them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TransferSums {
    pub asset: String,
    /// Days since the Unix epoch (UTC).
    pub day: i64,
    pub unbooked: bool,
    pub received: i128,
}

/// [`TransferSums`] of transfers first seen in `[from_ms, to_ms)`.
pub(crate) async fn transfer_sums(
    conn: &mut AnyConnection,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<TransferSums>, StoreError> {
    let backend = super::backend_of_conn(conn);
    let sql = format!(
        "SELECT asset, seen_at_ms / 86400000 AS day, CAST(CASE WHEN credited_entry IS NULL THEN 1 ELSE 0 END AS BIGINT) AS unbooked, {} \
         FROM transfers WHERE seen_at_ms >= $1 AND seen_at_ms < $2 AND removed = 0 \
         GROUP BY asset, seen_at_ms / 86400000, CASE WHEN credited_entry IS NULL THEN 1 ELSE 0 END",
        exact_sum(backend, "amount_base")
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(conn)
        .await?;
    rows.iter()
        .map(|row| {
            Ok(TransferSums {
                asset: row.try_get(0)?,
                day: row.try_get(1)?,
                unbooked: row.try_get::<i64, _>(2)? != 0,
                received: decode_exact_sum(row, 3, backend)?,
            })
        })
        .collect()
}

/// Postings of a period to custody, conversion and suspense accounts, summed per account and
/// currency, refunds (an operator's `resolve:` entry taking money out) apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PostingSums {
    pub account: String,
    pub currency: String,
    pub refund: bool,
    pub sum: i128,
}

/// [`PostingSums`] of entries posted in `[from_ms, to_ms)`.
pub(crate) async fn posting_sums(
    conn: &mut AnyConnection,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<PostingSums>, StoreError> {
    let backend = super::backend_of_conn(conn);
    let refund =
        "CASE WHEN j.idempotency_key LIKE 'resolve:%' AND p.amount LIKE '-%' THEN 1 ELSE 0 END";
    let sql = format!(
        "SELECT p.account, p.currency, CAST({refund} AS BIGINT) AS refund, {} \
         FROM postings p JOIN journal_entries j ON j.seq = p.entry_seq \
         WHERE j.posted_at_ms >= $1 AND j.posted_at_ms < $2 \
         AND (p.account LIKE 'custody:%' OR p.account LIKE 'fx:%' OR p.account LIKE 'suspense:%') \
         GROUP BY p.account, p.currency, {refund}",
        exact_sum(backend, "p.amount")
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(conn)
        .await?;
    rows.iter()
        .map(|row| {
            Ok(PostingSums {
                account: row.try_get(0)?,
                currency: row.try_get(1)?,
                refund: row.try_get::<i64, _>(2)? != 0,
                sum: decode_exact_sum(row, 3, backend)?,
            })
        })
        .collect()
}

/// Intents with an open exception, created in `[from_ms, to_ms)`.
pub(crate) async fn intents_with_open_exceptions(
    conn: &mut AnyConnection,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<(String, i64)>, StoreError> {
    let rows = sqlx::query(
        "SELECT i.method, COUNT(DISTINCT i.id) AS n FROM payment_intents i JOIN exceptions e ON e.intent_id = i.id \
         WHERE e.resolved_at_ms IS NULL AND i.created_at_ms >= $1 AND i.created_at_ms < $2 GROUP BY i.method",
    )
    .bind(from_ms)
    .bind(to_ms)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| Ok((row.try_get("method")?, row.try_get("n")?)))
        .collect()
}

/// Exceptions opened in `[from_ms, to_ms)`, with how they were resolved.
pub(crate) fn exceptions_in(
    conn: &mut AnyConnection,
    from_ms: i64,
    to_ms: i64,
) -> impl Stream<Item = Result<ExceptionRecord, StoreError>> + '_ {
    sqlx::query(
        "SELECT id, kind, intent_id, order_ref, transfer, detail, opened_at_ms, resolved_at_ms, resolution \
         FROM exceptions WHERE opened_at_ms >= $1 AND opened_at_ms < $2 ORDER BY opened_at_ms, id",
    )
    .bind(from_ms)
    .bind(to_ms)
    .fetch(conn)
    .map(|row| decode_exception(&row?))
}

/// The row's `amount_base` column: base units as decimal text.
fn base_units(row: &sqlx::any::AnyRow) -> Result<Amount, StoreError> {
    let text: String = row.try_get("amount_base")?;
    Amount::from_decimal_str(&text, 0)
        .map_err(|_| StoreError::Corrupt(format!("amount_base {text:?}")))
}

/// Rows per multi-row insert of [`load_transfers`], under both databases' parameter limits.
const TRANSFERS_PER_INSERT: usize = 2_000;

/// Loads transfers as the matcher would have stored them, many rows per statement: how the
/// report benchmark builds a period of a million transfers in reasonable time.
pub(crate) async fn load_transfers(
    tx: &mut WriteTx,
    transfers: &[StoredTransfer],
    now_ms: i64,
) -> Result<(), StoreError> {
    for chunk in transfers.chunks(TRANSFERS_PER_INSERT) {
        let sql = format!(
            "INSERT INTO transfers (network, txid, position, to_address, asset, amount_base, intent_id, confirmations, \
             removed, tip_height, seen_at_ms, updated_at_ms, credited_entry, block_height) VALUES {}",
            values_placeholders(tx.backend(), 14, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for t in chunk {
            query = query
                .bind(t.id.network.as_str())
                .bind(t.id.txid.as_str())
                .bind(i64::from(t.id.position))
                .bind(t.to_address.as_str())
                .bind(asset_text(&t.asset))
                .bind(t.amount.to_string())
                .bind(t.intent_id.as_deref())
                .bind(i64::from(t.confirmations))
                .bind(i64::from(t.removed))
                .bind(i64::try_from(t.tip_height).unwrap_or(i64::MAX))
                .bind(t.seen_at_ms)
                .bind(now_ms)
                .bind(t.credited_entry.as_deref())
                .bind(t.block_height.map(|h| i64::try_from(h).unwrap_or(i64::MAX)));
        }
        query.execute(tx.conn()).await?;
    }
    Ok(())
}
