//! SQL for where the money is: the receive indexes an account handed out and which were paid.

use sqlx::{AnyConnection, Row};

use payrecon_chain_core::Network;

use super::StoreError;
use crate::records::{FundedIndexes, HoldingsCheck};

/// How `network`'s account `key_id` handed out and was paid: the longest run of unpaid
/// indexes comes from one window function over the paid ones (each paid index minus the one
/// before it), so no index list leaves the database.
pub(crate) async fn funded_indexes(
    conn: &mut AnyConnection,
    network: &str,
    key_id: &str,
) -> Result<FundedIndexes, StoreError> {
    // Addresses found paid ahead of the counter count as handed out and paid.
    let handed = sqlx::query(
        "SELECT COUNT(*), MAX(idx) FROM ( \
           SELECT derivation_index AS idx FROM payment_intents WHERE network = $1 AND key_id = $2 \
           UNION ALL \
           SELECT derivation_index FROM unissued_payments WHERE network = $3 AND key_id = $4) h",
    )
    .bind(network)
    .bind(key_id)
    .bind(network)
    .bind(key_id)
    .fetch_one(&mut *conn)
    .await?;
    let paid = sqlx::query(
        "WITH paid AS (SELECT i.derivation_index AS idx FROM payment_intents i \
           WHERE i.network = $1 AND i.key_id = $2 AND EXISTS \
             (SELECT 1 FROM transfers t WHERE t.intent_id = i.id AND t.removed = 0) \
           UNION \
           SELECT derivation_index FROM unissued_payments WHERE network = $3 AND key_id = $4), \
         runs AS (SELECT idx - LAG(idx, 1, -1) OVER (ORDER BY idx) - 1 AS run FROM paid) \
         SELECT COUNT(*), COALESCE(MAX(run), 0) FROM runs",
    )
    .bind(network)
    .bind(key_id)
    .bind(network)
    .bind(key_id)
    .fetch_one(&mut *conn)
    .await?;
    let count = |value: i64| u64::try_from(value).unwrap_or(0);
    let index = |value: i64| {
        u32::try_from(value).map_err(|_| {
            StoreError::Corrupt(format!(
                "derivation index {value} of {network} is not a BIP32 index"
            ))
        })
    };
    Ok(FundedIndexes {
        handed_out: count(handed.try_get(0)?),
        highest_index: handed
            .try_get::<Option<i64>, _>(1)?
            .map(index)
            .transpose()?,
        funded: count(paid.try_get(0)?),
        largest_unfunded_run: index(paid.try_get(1)?)?,
    })
}

/// What one address holds of one asset: its confirmed receipts not taken out by a reorg,
/// less what standing outflows (always in a block) took from it, fees included, and the
/// differences the holdings check booked, as of `until_ms` (by when the chain carried each,
/// or the check found it). A Solana Pay payment counts at the merchant recipient it paid, not
/// at its reference key.
pub(crate) async fn holdings(
    conn: &mut AnyConnection,
    network: Option<&str>,
    until_ms: i64,
) -> Result<Vec<HoldingRow>, StoreError> {
    holdings_of(conn, network, until_ms, None).await
}

/// What the addresses of `network` that a receipt or outflow written from feed position `from`
/// on touched hold now: the watcher's news of which addresses to keep following. The touched
/// addresses come from the feed indexes, then their sums from the address indexes, a bounded
/// list at a time; a round that touched nothing reads two empty index ranges.
pub(crate) async fn holdings_touched_since(
    conn: &mut AnyConnection,
    network: &str,
    from: i64,
) -> Result<Vec<HoldingRow>, StoreError> {
    let touched: Vec<String> = sqlx::query_scalar(
        "SELECT t.to_address FROM transfers t WHERE t.network = $1 AND t.feed_pos >= $2 \
         UNION SELECT o.from_address FROM outflows o WHERE o.network = $3 AND o.feed_pos >= $4",
    )
    .bind(network)
    .bind(from)
    .bind(network)
    .bind(from)
    .fetch_all(&mut *conn)
    .await?;
    let mut rows = Vec::new();
    for addresses in touched.chunks(ADDRESSES_PER_QUERY) {
        rows.extend(holdings_of(conn, Some(network), i64::MAX, Some(addresses)).await?);
    }
    Ok(rows)
}

/// Addresses summed per statement: four lists of them stay far below SQLite's limit of
/// bound values.
const ADDRESSES_PER_QUERY: usize = 500;

async fn holdings_of(
    conn: &mut AnyConnection,
    network: Option<&str>,
    until_ms: i64,
    addresses: Option<&[String]>,
) -> Result<Vec<HoldingRow>, StoreError> {
    let backend = super::backend_of_conn(conn);
    let sum = super::exact_sum(backend, "h.amount");
    // Each branch names the addresses itself, so each reads its own address index.
    let mut next = 10;
    let mut among = |column: &str| match addresses {
        Some(list) => {
            let placeholders: Vec<String> =
                (next..next + list.len()).map(|n| format!("${n}")).collect();
            next += list.len();
            format!(" AND {column} IN ({})", placeholders.join(", "))
        }
        None => String::new(),
    };
    let (received, sent, fees, differences) = (
        among("t.to_address"),
        among("o.from_address"),
        among("o.from_address"),
        among("d.address"),
    );
    let sql = format!(
        "SELECT h.network, h.address, h.asset, MIN(h.derivation_index), COALESCE(MIN(h.key_id), ''), {sum} FROM ( \
           SELECT t.network, COALESCE(i.pay_to, t.to_address) AS address, t.asset, \
                  COALESCE(i.derivation_index, u.derivation_index) AS derivation_index, \
                  t.amount_base AS amount, COALESCE(i.key_id, u.key_id) AS key_id \
           FROM transfers t LEFT JOIN payment_intents i ON i.id = t.intent_id \
             LEFT JOIN unissued_payments u ON u.network = t.network AND u.address = t.to_address \
           WHERE t.removed = 0 AND t.confirmations >= 1 AND ($1 = '' OR t.network = $2) \
             AND t.seen_at_ms < $7{received} \
           UNION ALL \
           SELECT o.network, o.from_address, o.asset, CAST(NULL AS BIGINT), '-' || o.amount_base, \
                  CAST(NULL AS TEXT) \
           FROM outflows o WHERE o.removed = 0 AND ($3 = '' OR o.network = $4) AND o.seen_at_ms < $8{sent} \
           UNION ALL \
           SELECT o.network, o.from_address, o.asset, CAST(NULL AS BIGINT), '-' || o.fee_base, \
                  CAST(NULL AS TEXT) \
           FROM outflows o WHERE o.removed = 0 AND o.fee_base <> '0' AND ($5 = '' OR o.network = $6) \
             AND o.seen_at_ms < $9{fees} \
           UNION ALL \
           SELECT d.network, d.address, d.asset, d.derivation_index, \
                  CASE WHEN d.direction = 'missing' THEN '-' || d.amount_base ELSE d.amount_base END, \
                  d.key_id \
           FROM holdings_differences d WHERE ($1 = '' OR d.network = $2) AND d.found_at_ms < $7{differences} \
         ) h GROUP BY h.network, h.address, h.asset"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for _ in 0..6 {
        query = query.bind(network.unwrap_or(""));
    }
    query = query.bind(until_ms).bind(until_ms).bind(until_ms);
    for _ in 0..4 {
        for address in addresses.unwrap_or_default() {
            query = query.bind(address.as_str());
        }
    }
    let rows = query.fetch_all(&mut *conn).await?;
    rows.iter()
        .map(|row| {
            Ok(HoldingRow {
                network: row.try_get(0)?,
                address: row.try_get(1)?,
                asset: row.try_get(2)?,
                derivation_index: row.try_get(3)?,
                // The sum may span several columns: it comes last.
                amount: super::decode_exact_sum(row, 5, backend)?,
                key_id: Some(row.try_get::<String, _>(4)?).filter(|key| !key.is_empty()),
            })
        })
        .collect()
}

/// One address's holding of one asset, as the store sums it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HoldingRow {
    pub(crate) network: String,
    pub(crate) address: String,
    pub(crate) asset: String,
    pub(crate) derivation_index: Option<i64>,
    pub(crate) amount: i128,
    /// The key that derived the address, when payrecon did.
    pub(crate) key_id: Option<String>,
}

/// One kind of movement of one asset on one network between two times: `received`,
/// `treasury`, `external`, `fee`, or the holdings check's `found` and `missing`, each a
/// non-negative sum of base units. Dated by when the chain carried it (a receipt's first
/// sight, an outflow's block) or the check found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MovementRow {
    pub(crate) network: String,
    pub(crate) asset: String,
    pub(crate) kind: String,
    pub(crate) amount: i128,
}

/// Every asset's movements by kind in `[from_ms, to_ms)`.
pub(crate) async fn holding_movements(
    conn: &mut AnyConnection,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<MovementRow>, StoreError> {
    let backend = super::backend_of_conn(conn);
    let sum = super::exact_sum(backend, "m.amount");
    let sql = format!(
        "SELECT m.network, m.asset, m.kind, {sum} FROM ( \
           SELECT t.network, t.asset, 'received' AS kind, t.amount_base AS amount FROM transfers t \
           WHERE t.removed = 0 AND t.confirmations >= 1 AND t.seen_at_ms >= $1 AND t.seen_at_ms < $2 \
           UNION ALL \
           SELECT o.network, o.asset, o.destination, o.amount_base FROM outflows o \
           WHERE o.removed = 0 AND o.seen_at_ms >= $3 AND o.seen_at_ms < $4 \
           UNION ALL \
           SELECT o.network, o.asset, 'fee', o.fee_base FROM outflows o \
           WHERE o.removed = 0 AND o.fee_base <> '0' AND o.seen_at_ms >= $5 AND o.seen_at_ms < $6 \
           UNION ALL \
           SELECT d.network, d.asset, d.direction, d.amount_base FROM holdings_differences d \
           WHERE d.found_at_ms >= $7 AND d.found_at_ms < $8 \
         ) m GROUP BY m.network, m.asset, m.kind"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(from_ms)
        .bind(to_ms)
        .bind(from_ms)
        .bind(to_ms)
        .bind(from_ms)
        .bind(to_ms)
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *conn)
        .await?;
    rows.iter()
        .map(|row| {
            Ok(MovementRow {
                network: row.try_get(0)?,
                asset: row.try_get(1)?,
                kind: row.try_get(2)?,
                amount: super::decode_exact_sum(row, 3, backend)?,
            })
        })
        .collect()
}

/// What payrecon recorded for `network` and how far its watcher read, as of one moment: both
/// in one read transaction (a snapshot; PostgreSQL's repeatable read), so a watcher's commit
/// in between cannot make the holdings and the cursor disagree.
pub(crate) async fn holdings_at_cursor(
    pool: &sqlx::AnyPool,
    network: Network,
) -> Result<(Option<u64>, Vec<HoldingRow>), StoreError> {
    let mut tx = pool.begin().await?;
    if super::backend_of_conn(&tx) == super::Backend::Postgres {
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .execute(&mut *tx)
            .await?;
    }
    let cursor = super::cursors::get(&mut tx, network).await?;
    let rows = holdings(&mut tx, Some(network.as_str()), i64::MAX).await?;
    tx.commit().await?;
    Ok((cursor.map(|c| c.tip.height), rows))
}

/// A difference the holdings check found between the chain and payrecon's records at one
/// address, asset and block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HoldingsDifference {
    /// `holdings_difference:<network>:<address>:<asset>:<height>`: the exception's id and the
    /// key of the entry that books it.
    pub(crate) id: String,
    pub(crate) network: String,
    pub(crate) address: String,
    pub(crate) asset: String,
    /// The chain held more than recorded (`found`) or less (`missing`).
    pub(crate) found: bool,
    pub(crate) amount_base: u128,
    pub(crate) block_height: u64,
    pub(crate) block_hash: String,
    pub(crate) key_id: Option<String>,
    pub(crate) derivation_index: Option<u32>,
}

/// Records `difference`, once: false when it was recorded before.
pub(crate) async fn put_holdings_difference(
    conn: &mut AnyConnection,
    difference: &HoldingsDifference,
    found_at_ms: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO holdings_differences (id, network, address, asset, direction, amount_base, \
           block_height, block_hash, key_id, derivation_index, found_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (id) DO NOTHING",
    )
    .bind(difference.id.as_str())
    .bind(difference.network.as_str())
    .bind(difference.address.as_str())
    .bind(difference.asset.as_str())
    .bind(if difference.found { "found" } else { "missing" })
    .bind(difference.amount_base.to_string())
    .bind(i64::try_from(difference.block_height).unwrap_or(i64::MAX))
    .bind(difference.block_hash.as_str())
    .bind(difference.key_id.as_deref())
    .bind(difference.derivation_index.map(i64::from))
    .bind(found_at_ms)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records a network's holdings check, replacing the one before.
pub(crate) async fn put_holdings_check(
    conn: &mut AnyConnection,
    check: &HoldingsCheck,
) -> Result<(), StoreError> {
    let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    sqlx::query(
        "INSERT INTO holdings_checks (network, checked_at_ms, block_height, addresses_checked, unexplained, error) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (network) DO UPDATE SET \
         checked_at_ms = excluded.checked_at_ms, block_height = excluded.block_height, \
         addresses_checked = excluded.addresses_checked, unexplained = excluded.unexplained, \
         error = excluded.error",
    )
    .bind(check.network.as_str())
    .bind(check.checked_at.timestamp_millis())
    .bind(check.block_height.map(signed))
    .bind(signed(check.addresses_checked))
    .bind(signed(check.unexplained))
    .bind(check.error.as_deref())
    .execute(conn)
    .await?;
    Ok(())
}

/// Every network's last holdings check.
pub(crate) async fn holdings_checks(
    conn: &mut AnyConnection,
) -> Result<Vec<HoldingsCheck>, StoreError> {
    let rows = sqlx::query(
        "SELECT network, checked_at_ms, block_height, addresses_checked, unexplained, error \
         FROM holdings_checks ORDER BY network",
    )
    .fetch_all(conn)
    .await?;
    let unsigned = |n: i64| u64::try_from(n).unwrap_or(0);
    rows.iter()
        .map(|row| {
            Ok(HoldingsCheck {
                network: row.try_get("network")?,
                checked_at: super::orders::millis(row.try_get("checked_at_ms")?)?,
                block_height: row.try_get::<Option<i64>, _>("block_height")?.map(unsigned),
                addresses_checked: unsigned(row.try_get("addresses_checked")?),
                unexplained: unsigned(row.try_get("unexplained")?),
                error: row.try_get("error")?,
            })
        })
        .collect()
}
