//! SQL for the reconciliation report. Sums are aggregates in the database; transfers stream
//! in bounded batches: a report over millions of transfers holds a few thousand at a time,
//! plus per-method and per-day sums.

use futures_util::{Stream, StreamExt, TryStreamExt};
use payrecon_chain_core::{Amount, Method};
use sqlx::{AnyConnection, AnyPool, Row};

use super::payments::{decode_exception, parse_asset};
use super::{
    Backend, StoreError, decode_exact_sum, exact_sum, list_placeholders_after, placeholder,
};
#[cfg(feature = "bench")]
use super::{WriteTx, values_placeholders};
use crate::ledger::Account;
use crate::records::ExceptionRecord;
#[cfg(feature = "bench")]
use crate::records::StoredTransfer;

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

/// The report's columns of a transfer and the intent it paid, in the order both spellings of
/// [`transfers_in`] select them.
const TRANSFER_COLUMNS: [&str; 16] = [
    "t.network",
    "t.txid",
    "t.position",
    "t.to_address",
    "t.asset",
    "t.amount_base",
    "t.intent_id",
    "i.order_ref",
    "i.method",
    "i.status",
    "i.usd_cents",
    "t.confirmations",
    "t.block_height",
    "t.removed",
    "t.seen_at_ms",
    "t.credited_entry",
];

/// [`TRANSFER_COLUMNS`] as a select list, qualified by table or (outside the join) bare.
fn transfer_columns(qualified: bool) -> String {
    let names: Vec<&str> = TRANSFER_COLUMNS
        .iter()
        .map(|column| match column.split_once('.') {
            Some((_, name)) if !qualified => name,
            _ => column,
        })
        .collect();
    names.join(", ")
}

/// The order transfers are listed in: first seen, then their identity (unique).
const TRANSFER_ORDER: &str = "t.seen_at_ms, t.network, t.txid, t.position";

/// Transfers handed from the reading task to the caller at once: a page SQLite packs into one
/// answer row, a chunk of PostgreSQL's stream.
const BATCH_ROWS: usize = 2_000;

/// Batches read ahead of the caller: the reading task waits beyond that, so memory stays flat.
const READ_AHEAD_BATCHES: usize = 4;

/// Transfers first seen in `[from_ms, to_ms)`, oldest first, in the order the
/// `transfers_by_seen` index holds them (so nothing sorts).
///
/// A task of its own reads them on a connection of its own, a few batches ahead: the
/// database and the driver's decoding run beside the caller's formatting (over a million
/// transfers, each side alone is about as slow as the other). If the caller stops listening,
/// the task stops and gives its connection back.
///
/// PostgreSQL streams the rows. sqlx's SQLite driver hands every row across threads, a wake-up
/// each (5.4 s of the 8.2 s a million rows took), so SQLite packs pages of
/// [`BATCH_ROWS`] into one JSON array each, the next page starting after the last row of
/// the one before (keyset paging on the listing's unique order: no row skipped or listed
/// twice). PostgreSQL's JSON building costs more than its rows (16 ms a page of 2,000, against
/// 1.4 s for a million rows streamed), so it streams.
pub(crate) fn transfers_in(
    pool: AnyPool,
    from_ms: i64,
    to_ms: i64,
) -> impl Stream<Item = Result<ReportTransfer, StoreError>> + Send + 'static {
    let (batches, received) = tokio::sync::mpsc::channel(READ_AHEAD_BATCHES);
    tokio::spawn(async move {
        let read = read_transfers(&pool, from_ms, to_ms, &batches).await;
        if let Err(error) = read {
            let _ = batches.send(Err(error)).await;
        }
    });
    futures_util::stream::unfold(received, |mut received| async move {
        received.recv().await.map(|batch| (batch, received))
    })
    .map_ok(|batch| futures_util::stream::iter(batch.into_iter().map(Ok)))
    .try_flatten()
}

/// Sends the transfers of [`transfers_in`] in batches until done or nobody listens.
async fn read_transfers(
    pool: &AnyPool,
    from_ms: i64,
    to_ms: i64,
    batches: &tokio::sync::mpsc::Sender<Result<Vec<ReportTransfer>, StoreError>>,
) -> Result<(), StoreError> {
    let mut conn = pool.acquire().await?;
    match super::backend_of_conn(&conn) {
        Backend::Postgres => {
            let mut rows =
                std::pin::pin!(transfer_rows(&mut conn, from_ms, to_ms).try_chunks(BATCH_ROWS));
            while let Some(batch) = rows.try_next().await.map_err(|e| e.1)? {
                if batches.send(Ok(batch)).await.is_err() {
                    break;
                }
            }
        }
        Backend::Sqlite => {
            let mut pages =
                std::pin::pin!(transfer_pages(&mut conn, from_ms, to_ms, BATCH_ROWS as i64));
            while let Some(page) = pages.try_next().await? {
                if batches.send(Ok(page)).await.is_err() {
                    break;
                }
            }
        }
    }
    Ok(())
}

/// [`transfers_in`] a row at a time.
fn transfer_rows(
    conn: &mut AnyConnection,
    from_ms: i64,
    to_ms: i64,
) -> impl Stream<Item = Result<ReportTransfer, StoreError>> + Send + '_ {
    let sql = format!(
        "SELECT {} FROM transfers t LEFT JOIN payment_intents i ON i.id = t.intent_id \
         WHERE t.seen_at_ms >= $1 AND t.seen_at_ms < $2 ORDER BY {TRANSFER_ORDER}",
        transfer_columns(true)
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(from_ms)
        .bind(to_ms)
        .fetch(conn)
        .map(|row| {
            let row = row?;
            let text = |index: usize| row.try_get::<String, _>(index);
            let optional = |index: usize| row.try_get::<Option<String>, _>(index);
            let number = |index: usize| row.try_get::<i64, _>(index);
            ReportTransfer::from_columns((
                text(0)?,
                text(1)?,
                number(2)?,
                text(3)?,
                text(4)?,
                text(5)?,
                optional(6)?,
                optional(7)?,
                optional(8)?,
                optional(9)?,
                row.try_get(10)?,
                number(11)?,
                row.try_get(12)?,
                number(13)?,
                number(14)?,
                optional(15)?,
            ))
        })
}

/// The columns of one transfer as a JSON page holds them.
type TransferColumns = (
    String,
    String,
    i64,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i64>,
    i64,
    Option<i64>,
    i64,
    i64,
    Option<String>,
);

/// Where a page starts: after this transfer in the listing's order.
type PageStart = (i64, String, String, i64);

/// One page of [`transfers_in`], with the connection back and whether more may follow.
type Page<'c> = (&'c mut AnyConnection, Vec<ReportTransfer>, bool);

/// [`transfers_in`] on SQLite, `page_rows` transfers per answer.
fn transfer_pages(
    conn: &mut AnyConnection,
    from_ms: i64,
    to_ms: i64,
    page_rows: i64,
) -> impl Stream<Item = Result<Vec<ReportTransfer>, StoreError>> + Send + '_ {
    // Before every transfer of the period: no network is the empty string.
    let first = (from_ms, String::new(), String::new(), i64::MIN);
    futures_util::stream::try_unfold((conn, Some(first)), move |(conn, after)| async move {
        let Some(after) = after else {
            return Ok(None);
        };
        let (conn, page, full) = transfer_page(conn, after, to_ms, page_rows).await?;
        let next = match page.last() {
            Some(last) if full => Some((
                last.seen_at_ms,
                last.network.clone(),
                last.txid.clone(),
                last.position,
            )),
            _ => None,
        };
        Ok(Some((page, (conn, next))))
    })
}

/// The page of at most `page_rows` transfers first seen before `to_ms` that follows `after`.
async fn transfer_page(
    conn: &mut AnyConnection,
    after: PageStart,
    to_ms: i64,
    page_rows: i64,
) -> Result<Page<'_>, StoreError> {
    let sql = format!(
        "SELECT json_group_array(json_array({}) ORDER BY {TRANSFER_ORDER}) FROM (\
         SELECT {} FROM transfers t LEFT JOIN payment_intents i ON i.id = t.intent_id \
         WHERE t.seen_at_ms >= $1 AND t.seen_at_ms < $2 \
         AND (t.seen_at_ms, t.network, t.txid, t.position) > ($1, $3, $4, $5) \
         ORDER BY {TRANSFER_ORDER} LIMIT $6) AS t",
        transfer_columns(false),
        transfer_columns(true),
    );
    let (seen_at_ms, network, txid, position) = after;
    let page: String = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(seen_at_ms)
        .bind(to_ms)
        .bind(network)
        .bind(txid)
        .bind(position)
        .bind(page_rows)
        .fetch_one(&mut *conn)
        .await?;
    let columns: Vec<TransferColumns> = serde_json::from_str(&page)
        .map_err(|e| StoreError::Corrupt(format!("a page of transfers: {e}")))?;
    let full = columns.len() as i64 == page_rows;
    let page = columns
        .into_iter()
        .map(ReportTransfer::from_columns)
        .collect::<Result<Vec<_>, _>>()?;
    Ok((conn, page, full))
}

impl ReportTransfer {
    fn from_columns(columns: TransferColumns) -> Result<ReportTransfer, StoreError> {
        let (
            network,
            txid,
            position,
            to_address,
            asset,
            amount_base,
            intent_id,
            order_ref,
            intent_method,
            intent_status,
            intent_usd_cents,
            confirmations,
            block_height,
            removed,
            seen_at_ms,
            credited_entry,
        ) = columns;
        Ok(ReportTransfer {
            network,
            txid,
            position,
            to_address,
            asset: parse_asset(&asset)?,
            amount: Amount::from_decimal_str(&amount_base, 0)
                .map_err(|_| StoreError::Corrupt(format!("amount_base {amount_base:?}")))?,
            intent_id,
            order_ref,
            intent_method,
            intent_status,
            intent_usd_cents,
            confirmations,
            block_height,
            removed: removed != 0,
            seen_at_ms,
            credited_entry,
        })
    }
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
/// currency, refunds (an operator's `resolve:` entry taking money out of custody, and a
/// completed refund's `refund:` entry taking it out of suspense) apart; and to the
/// treasury accounts, of the entries that took the merchant's own money into custody.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PostingSums {
    pub account: String,
    pub currency: String,
    pub refund: bool,
    pub sum: i128,
}

/// [`PostingSums`] of entries posted in `[from_ms, to_ms)`.
///
/// Refunds are summed by a second, narrow query and taken out of the totals, rather than
/// grouped on: a group key over an expression of two tables gave PostgreSQL no estimate of how
/// few groups there are, so it sorted two million postings on disk (2.3 s) where a hash of the
/// accounts takes 1.3 s. The treasury's are read through the accounts' index: they are few.
pub(crate) async fn posting_sums(
    conn: &mut AnyConnection,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<PostingSums>, StoreError> {
    let totals = posting_sums_where(conn, from_ms, to_ms, "").await?;
    let refunds = posting_sums_where(
        conn,
        from_ms,
        to_ms,
        "AND ((j.idempotency_key LIKE 'resolve:%' AND p.amount LIKE '-%') \
         OR (j.idempotency_key LIKE 'refund:%' AND p.account LIKE 'suspense:%'))",
    )
    .await?;
    let mut sums = Vec::with_capacity(totals.len() + refunds.len());
    for (account, currency, total) in totals {
        let refunded = refunds
            .iter()
            .find(|(a, c, _)| *a == account && *c == currency)
            .map_or(0, |(_, _, sum)| *sum);
        if refunded != 0 {
            sums.push(PostingSums {
                account: account.clone(),
                currency: currency.clone(),
                refund: true,
                sum: refunded,
            });
        }
        let sum = total
            .checked_sub(refunded)
            .ok_or_else(|| StoreError::Corrupt(format!("the sum of {account} overflows")))?;
        sums.push(PostingSums {
            account,
            currency,
            refund: false,
            sum,
        });
    }
    for (account, currency, sum) in own_funds_sums(conn, from_ms, to_ms).await? {
        sums.push(PostingSums {
            account,
            currency,
            refund: false,
            sum,
        });
    }
    Ok(sums)
}

/// Treasury postings of the fee top-ups the matcher booked (`top-up:`) and of operators'
/// entries (`resolve:`: only marking money as the merchant's own posts to a treasury), with
/// their reversals, in `[from_ms, to_ms)`: the merchant's own money among what arrived.
async fn own_funds_sums(
    conn: &mut AnyConnection,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<(String, String, i128)>, StoreError> {
    let backend = super::backend_of_conn(conn);
    let treasuries: Vec<String> = Method::ALL
        .iter()
        .map(|method| Account::Treasury(*method).to_string())
        .collect();
    // On SQLite every placeholder is an anonymous `?`, bound in the order it appears.
    let sql = format!(
        "SELECT p.account, p.currency, {} \
         FROM postings p JOIN journal_entries j ON j.seq = p.entry_seq \
         WHERE j.posted_at_ms >= {} AND j.posted_at_ms < {} AND p.account IN ({}) \
         AND (j.idempotency_key LIKE 'top-up:%' OR j.idempotency_key LIKE 'resolve:%' \
         OR j.idempotency_key LIKE 'reverse:top-up:%' OR j.idempotency_key LIKE 'reverse:resolve:%') \
         GROUP BY p.account, p.currency",
        exact_sum(backend, "p.amount"),
        placeholder(backend, 1),
        placeholder(backend, 2),
        list_placeholders_after(backend, 2, treasuries.len())
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(from_ms)
        .bind(to_ms);
    for account in &treasuries {
        query = query.bind(account.as_str());
    }
    account_sums(&query.fetch_all(conn).await?, backend)
}

/// Sums per account and currency of the custody, conversion and suspense postings of entries
/// posted in `[from_ms, to_ms)` that also meet `condition` (fixed SQL, no input).
async fn posting_sums_where(
    conn: &mut AnyConnection,
    from_ms: i64,
    to_ms: i64,
    condition: &str,
) -> Result<Vec<(String, String, i128)>, StoreError> {
    let backend = super::backend_of_conn(conn);
    let sql = format!(
        "SELECT p.account, p.currency, {} \
         FROM postings p JOIN journal_entries j ON j.seq = p.entry_seq \
         WHERE j.posted_at_ms >= $1 AND j.posted_at_ms < $2 {condition} \
         AND (p.account LIKE 'custody:%' OR p.account LIKE 'fx:%' OR p.account LIKE 'suspense:%') \
         GROUP BY p.account, p.currency",
        exact_sum(backend, "p.amount")
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(conn)
        .await?;
    account_sums(&rows, backend)
}

/// Rows of account, currency and exact sum, decoded.
fn account_sums(
    rows: &[sqlx::any::AnyRow],
    backend: Backend,
) -> Result<Vec<(String, String, i128)>, StoreError> {
    rows.iter()
        .map(|row| {
            Ok((
                row.try_get(0)?,
                row.try_get(1)?,
                decode_exact_sum(row, 2, backend)?,
            ))
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

/// Rows per multi-row insert of [`load_transfers`], under both databases' parameter limits.
#[cfg(feature = "bench")]
const TRANSFERS_PER_INSERT: usize = 2_000;

/// Loads transfers as the matcher would have stored them, many rows per statement: how the
/// report benchmark builds a period of a million transfers in reasonable time.
#[cfg(feature = "bench")]
pub async fn load_transfers(
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
                .bind(t.asset.to_string())
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

#[cfg(test)]
mod tests {
    use payrecon_chain_core::{Method, Network, ReceivedAsset, TransferId};

    use super::*;
    use crate::store::Store;

    fn transfer(seen_at_ms: i64, network: Network, txid: u32, position: u32) -> StoredTransfer {
        StoredTransfer {
            id: TransferId {
                network,
                txid: format!("{txid:064x}"),
                position,
            },
            to_address: format!("address-{txid}"),
            asset: ReceivedAsset::Method {
                method: Method::Btc,
            },
            amount: Amount::from_base_units(u128::from(txid) * 1_000 + u128::from(position)),
            from_address: None,
            intent_id: None,
            confirmations: 1,
            block_height: Some(100),
            removed: txid % 5 == 4,
            tip_height: 100,
            seen_at_ms,
            credited_entry: None,
        }
    }

    #[tokio::test]
    async fn sqlite_pages_list_exactly_what_the_row_stream_lists() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("pages.db").display());
        let store = Store::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        // Many transfers share a first-seen time, across networks, transactions and outputs,
        // so page boundaries fall inside ties; some lie outside the period.
        let transfers: Vec<StoredTransfer> = (0..60u32)
            .map(|i| {
                let network = [Network::Bitcoin, Network::Litecoin][(i % 2) as usize];
                transfer(1_000 + i64::from(i / 7), network, i / 3, i % 3)
            })
            .collect();
        let mut tx = store.begin_write().await.unwrap();
        load_transfers(&mut tx, &transfers, 0).await.unwrap();
        tx.commit().await.unwrap();

        let (from, to) = (1_001, 1_008);
        let mut conn = store.pool().acquire().await.unwrap();
        let rows: Vec<ReportTransfer> = transfer_rows(&mut conn, from, to)
            .try_collect()
            .await
            .unwrap();
        let inside = transfers
            .iter()
            .filter(|t| (from..to).contains(&t.seen_at_ms))
            .count();
        assert_eq!(rows.len(), inside);
        assert!(inside > 0 && inside < transfers.len());
        for page_rows in [1, 2, 3, 7, 1_000] {
            let pages: Vec<Vec<ReportTransfer>> = transfer_pages(&mut conn, from, to, page_rows)
                .try_collect()
                .await
                .unwrap();
            assert!(pages.iter().all(|page| page.len() <= page_rows as usize));
            assert_eq!(pages.concat(), rows, "{page_rows} transfers a page");
        }
        let listed: Vec<ReportTransfer> = transfers_in(store.pool().clone(), from, to)
            .try_collect()
            .await
            .unwrap();
        assert_eq!(listed, rows);
    }
}
