//! SQL for money leaving watched addresses: outflow rows, and the held outputs a UTXO watcher
//! looks each input up in (receipts not removed and not spent by a standing outflow).

use chrono::{DateTime, Utc};
use payrecon_chain_core::{Amount, KnownOutflow, Network, Outflow, TransferId};
use sqlx::{AnyConnection, Row};

use super::payments::parse_asset;
use super::{StoreError, WriteTx};

/// An outflow as stored: the chain's report, where it went, and how it stands in the books.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OutflowRow {
    pub(crate) outflow: Outflow,
    /// `treasury` or `external`.
    pub(crate) destination: String,
    pub(crate) confirmations: u32,
    pub(crate) block_height: u64,
    pub(crate) removed: bool,
    pub(crate) tip_height: u64,
    pub(crate) seen_at_ms: i64,
    /// The entry booking it while it stands.
    pub(crate) posted_entry: Option<String>,
    /// Entries ever posted for it.
    pub(crate) postings: i64,
}

impl OutflowRow {
    /// As a watcher's view keeps it.
    pub(crate) fn known(&self) -> KnownOutflow {
        KnownOutflow {
            outflow: self.outflow.clone(),
            confirmations: self.confirmations,
            block_height: self.block_height,
            tip_height: self.tip_height,
            seen_at_ms: self.seen_at_ms,
        }
    }
}

const COLUMNS: &str = "network, txid, position, spent_txid, spent_position, from_address, asset, \
    amount_base, fee_base, to_address, destination, confirmations, block_height, removed, \
    tip_height, seen_at_ms, posted_entry, postings";

/// One outflow by id.
pub(crate) async fn get(
    conn: &mut AnyConnection,
    id: &TransferId,
) -> Result<Option<OutflowRow>, StoreError> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM outflows WHERE network = $1 AND txid = $2 AND position = $3"
    )))
    .bind(id.network.as_str())
    .bind(id.txid.as_str())
    .bind(i64::from(id.position))
    .fetch_optional(conn)
    .await?;
    row.map(|row| decode(&row)).transpose()
}

/// The outflows of one transaction, one per input (UTXO) or moved asset.
pub(crate) async fn of_transaction(
    conn: &mut AnyConnection,
    network: Network,
    txid: &str,
) -> Result<Vec<OutflowRow>, StoreError> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM outflows WHERE network = $1 AND txid = $2 ORDER BY position"
    )))
    .bind(network.as_str())
    .bind(txid)
    .fetch_all(conn)
    .await?;
    rows.iter().map(decode).collect()
}

/// The outflows that spent the output `spent` (UTXO chains), a reorg's removed ones too.
pub(crate) async fn spenders(
    conn: &mut AnyConnection,
    spent: &TransferId,
) -> Result<Vec<OutflowRow>, StoreError> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM outflows WHERE network = $1 AND spent_txid = $2 \
         AND spent_position = $3 ORDER BY txid, position"
    )))
    .bind(spent.network.as_str())
    .bind(spent.txid.as_str())
    .bind(i64::from(spent.position))
    .fetch_all(conn)
    .await?;
    rows.iter().map(decode).collect()
}

/// The outflows from `address` first seen at `since_ms` or later (account chains), a reorg's
/// removed ones too, oldest first, at most `limit`.
pub(crate) async fn from_address_since(
    conn: &mut AnyConnection,
    (network, address): (Network, &str),
    since_ms: i64,
    limit: i64,
) -> Result<Vec<OutflowRow>, StoreError> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM outflows WHERE network = $1 AND from_address = $2 \
         AND seen_at_ms >= $3 ORDER BY seen_at_ms, txid, position LIMIT $4"
    )))
    .bind(network.as_str())
    .bind(address)
    .bind(since_ms)
    .bind(limit)
    .fetch_all(conn)
    .await?;
    rows.iter().map(decode).collect()
}

/// Inserts or replaces an outflow's state, stamped with the transaction's feed position.
pub(crate) async fn upsert(
    tx: &mut WriteTx,
    row: &OutflowRow,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let feed_position = tx.feed_position().await?;
    let outflow = &row.outflow;
    let height = |h: u64| i64::try_from(h).unwrap_or(i64::MAX);
    sqlx::query(
        "INSERT INTO outflows (network, txid, position, spent_txid, spent_position, from_address, asset, \
         amount_base, fee_base, to_address, destination, confirmations, block_height, removed, tip_height, \
         seen_at_ms, updated_at_ms, posted_entry, postings, feed_pos) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20) \
         ON CONFLICT (network, txid, position) DO UPDATE SET confirmations = excluded.confirmations, \
         block_height = excluded.block_height, removed = excluded.removed, tip_height = excluded.tip_height, \
         updated_at_ms = excluded.updated_at_ms, posted_entry = excluded.posted_entry, \
         postings = excluded.postings, feed_pos = excluded.feed_pos",
    )
    .bind(outflow.id.network.as_str())
    .bind(outflow.id.txid.as_str())
    .bind(i64::from(outflow.id.position))
    .bind(outflow.spends.as_ref().map(|s| s.txid.as_str()))
    .bind(outflow.spends.as_ref().map(|s| i64::from(s.position)))
    .bind(outflow.from_address.as_str())
    .bind(outflow.asset.to_string())
    .bind(outflow.amount.to_string())
    .bind(outflow.fee.to_string())
    .bind(outflow.to_address.as_deref())
    .bind(row.destination.as_str())
    .bind(i64::from(row.confirmations))
    .bind(height(row.block_height))
    .bind(i64::from(row.removed))
    .bind(height(row.tip_height))
    .bind(row.seen_at_ms)
    .bind(now.timestamp_millis())
    .bind(row.posted_entry.as_deref())
    .bind(row.postings)
    .bind(feed_position)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// `network`'s outflows not removed that were first seen after `since_ms` or are not yet
/// `settle_depth` deep: what its watcher checks for depth and reorgs.
pub(crate) async fn recent(
    conn: &mut AnyConnection,
    network: Network,
    since_ms: i64,
    settle_depth: u32,
) -> Result<Vec<OutflowRow>, StoreError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM outflows WHERE network = $1 AND removed = 0 AND (seen_at_ms > $2 OR confirmations < $3)"
    )))
    .bind(network.as_str())
    .bind(since_ms)
    .bind(i64::from(settle_depth))
    .fetch_all(conn)
    .await?
    .iter()
    .map(decode)
    .collect()
}

/// `network`'s outflows written at feed position `from` or later.
pub(crate) async fn changed(
    conn: &mut AnyConnection,
    network: Network,
    from: i64,
) -> Result<Vec<OutflowRow>, StoreError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM outflows WHERE network = $1 AND feed_pos >= $2"
    )))
    .bind(network.as_str())
    .bind(from)
    .fetch_all(conn)
    .await?
    .iter()
    .map(decode)
    .collect()
}

/// An output a watcher follows, and whether it is held now (received, not removed, not spent
/// by a standing outflow).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OutputState {
    /// The watched address it pays.
    pub(crate) address: String,
    pub(crate) txid: String,
    pub(crate) vout: u32,
    pub(crate) value: u64,
    pub(crate) held: bool,
}

/// Whether a transfer `t` is held: SQL shared by the reads below.
const HELD: &str = "CAST(CASE WHEN t.removed = 0 AND NOT EXISTS (SELECT 1 FROM outflows o \
    WHERE o.network = t.network AND o.spent_txid = t.txid AND o.spent_position = t.position \
    AND o.removed = 0) THEN 1 ELSE 0 END AS BIGINT)";

/// Every output `network`'s watched addresses hold now.
pub(crate) async fn held_outputs(
    conn: &mut AnyConnection,
    network: Network,
) -> Result<Vec<OutputState>, StoreError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT * FROM (SELECT t.txid, t.position, t.amount_base, {HELD} AS held, t.to_address \
         FROM transfers t WHERE t.network = $1 AND t.removed = 0) h WHERE h.held = 1"
    )))
    .bind(network.as_str())
    .fetch_all(conn)
    .await?
    .iter()
    .map(decode_output)
    .collect()
}

/// The outputs whose held state may have changed since feed position `from`: receipts written
/// since, and the outputs that outflows written since spend.
pub(crate) async fn output_changes(
    conn: &mut AnyConnection,
    network: Network,
    from: i64,
) -> Result<Vec<OutputState>, StoreError> {
    let mut changes = Vec::new();
    for sql in [
        format!(
            "SELECT t.txid, t.position, t.amount_base, {HELD}, t.to_address FROM transfers t \
             WHERE t.network = $1 AND t.feed_pos >= $2"
        ),
        format!(
            "SELECT t.txid, t.position, t.amount_base, {HELD}, t.to_address FROM outflows s \
             JOIN transfers t ON t.network = s.network AND t.txid = s.spent_txid \
               AND t.position = s.spent_position \
             WHERE s.network = $1 AND s.feed_pos >= $2"
        ),
    ] {
        for row in sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(network.as_str())
            .bind(from)
            .fetch_all(&mut *conn)
            .await?
        {
            changes.push(decode_output(&row)?);
        }
    }
    Ok(changes)
}

fn decode_output(row: &sqlx::any::AnyRow) -> Result<OutputState, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("held output: {what}"));
    let amount: String = row.try_get(2)?;
    Ok(OutputState {
        address: row.try_get(4)?,
        txid: row.try_get(0)?,
        vout: u32::try_from(row.try_get::<i64, _>(1)?).map_err(|_| corrupt("position"))?,
        value: amount.parse().map_err(|_| corrupt("value"))?,
        held: row.try_get::<i64, _>(3)? != 0,
    })
}

fn decode(row: &sqlx::any::AnyRow) -> Result<OutflowRow, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("outflow row: {what}"));
    let network: Network = row
        .try_get::<String, _>("network")?
        .parse()
        .map_err(|_| corrupt("network"))?;
    let unsigned = |name: &str| -> Result<u64, StoreError> {
        u64::try_from(row.try_get::<i64, _>(name)?).map_err(|_| corrupt(name))
    };
    let amount = |name: &str| -> Result<Amount, StoreError> {
        Amount::from_decimal_str(&row.try_get::<String, _>(name)?, 0).map_err(|_| corrupt(name))
    };
    let spent_txid: Option<String> = row.try_get("spent_txid")?;
    let spent_position: Option<i64> = row.try_get("spent_position")?;
    Ok(OutflowRow {
        outflow: Outflow {
            id: TransferId {
                network,
                txid: row.try_get("txid")?,
                position: u32::try_from(unsigned("position")?).map_err(|_| corrupt("position"))?,
            },
            spends: match (spent_txid, spent_position) {
                (Some(txid), Some(position)) => Some(TransferId {
                    network,
                    txid,
                    position: u32::try_from(position).map_err(|_| corrupt("spent_position"))?,
                }),
                _ => None,
            },
            from_address: row.try_get("from_address")?,
            asset: parse_asset(&row.try_get::<String, _>("asset")?)?,
            amount: amount("amount_base")?,
            fee: amount("fee_base")?,
            to_address: row.try_get("to_address")?,
        },
        destination: row.try_get("destination")?,
        confirmations: u32::try_from(unsigned("confirmations")?)
            .map_err(|_| corrupt("confirmations"))?,
        block_height: unsigned("block_height")?,
        removed: row.try_get::<i64, _>("removed")? != 0,
        tip_height: unsigned("tip_height")?,
        seen_at_ms: row.try_get("seen_at_ms")?,
        posted_entry: row.try_get("posted_entry")?,
        postings: row.try_get("postings")?,
    })
}

/// The entries booking the outflows of transaction `txid` on `network`, one per outflow in
/// output order: `None` for one not booked (not deep enough yet, or reversed by a reorg).
pub(crate) async fn posted_entries(
    conn: &mut AnyConnection,
    network: Network,
    txid: &str,
) -> Result<Vec<Option<String>>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT posted_entry FROM outflows WHERE network = $1 AND txid = $2 ORDER BY position",
    )
    .bind(network.as_str())
    .bind(txid)
    .fetch_all(conn)
    .await?)
}
