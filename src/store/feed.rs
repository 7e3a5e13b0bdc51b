//! SQL for the watchers' view: what a network's watcher follows, read whole once and then only
//! what changed, by feed position (see [`super::WriteTx::feed_position`]).
//!
//! Every read here runs in one snapshot and returns where the next read starts. On SQLite the
//! feed position is a counter bumped by each write transaction in commit order, so the next
//! read starts after the counter's value. On PostgreSQL it is the writing transaction's id;
//! ids are handed out in start order, not commit order, so the next read starts at the oldest
//! transaction still running when this one read (`pg_snapshot_xmin`): a transaction that
//! commits late is read then, and rows read twice are simply applied twice.

use payrecon_chain_core::{ChainCursor, Network};
use sqlx::{AnyConnection, AnyPool, Row};

use super::outflows::{self, OutflowRow, OutputState};
use super::payments::{TRANSFER_COLUMNS, decode_transfer};
use super::{Backend, StoreError};
use crate::records::StoredTransfer;

/// A watched key, when it was handed out and the end of its monitoring window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WatchedKey {
    pub watch_key: String,
    pub created_at_ms: i64,
    pub monitor_until_ms: i64,
}

/// A transfer as it stands now, with the watch key and monitoring window of the intent it paid
/// (none for an unmatched transfer, which no watcher diffs against).
#[derive(Clone, Debug)]
pub(crate) struct WatchedTransfer {
    pub transfer: StoredTransfer,
    pub watch_key: Option<String>,
    pub monitor_until_ms: Option<i64>,
}

/// What one read found, and where the next read starts.
#[derive(Debug, Default)]
pub(crate) struct FeedRead {
    pub keys: Vec<WatchedKey>,
    pub transfers: Vec<WatchedTransfer>,
    /// The watcher's committed cursor, in the same snapshot.
    pub cursor: Option<ChainCursor>,
    pub next_from: i64,
    /// UTXO chains: the held outputs (a full read), or those whose state may have changed.
    pub outputs: Vec<OutputState>,
    /// Outflows to check for depth and reorgs (a full read), or those written since.
    pub outflows: Vec<OutflowRow>,
    /// Account chains: the addresses holding something (a full read), or whether each address
    /// touched since holds anything now.
    pub holders: Vec<(String, bool)>,
}

/// Everything `network`'s watcher follows at `now_ms`: keys inside their monitoring window, the
/// transfers to them not removed, and any matched transfer or outflow not yet `settle_depth`
/// deep, however old its intent (its depth must keep moving until it is booked). What a
/// watcher reads once, when it starts or takes a lease over.
pub(crate) async fn read_all(
    pool: &AnyPool,
    backend: Backend,
    network: Network,
    now_ms: i64,
    outflows_since_ms: i64,
    settle_depth: u32,
) -> Result<FeedRead, StoreError> {
    let mut tx = snapshot(pool, backend).await?;
    let next_from = next_from(&mut tx, backend).await?;
    let keys = sqlx::query(
        "SELECT watch_key, created_at_ms, monitor_until_ms FROM payment_intents WHERE network = $1 AND monitor_until_ms > $2",
    )
    .bind(network.as_str())
    .bind(now_ms)
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(decode_key)
    .collect::<Result<_, _>>()?;
    // Two statements rather than one with OR: the first goes from the open intents' index to
    // their transfers; the second reads the network's transfers for the few not yet final
    // past their window (about 0.12 s a million rows, measured on PostgreSQL) and joins their
    // intents by key.
    let open = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {TRANSFER_COLUMNS}, i.watch_key, i.monitor_until_ms FROM transfers t JOIN payment_intents i ON i.id = t.intent_id \
         WHERE t.network = $1 AND t.removed = 0 AND i.monitor_until_ms > $2"
    )))
    .bind(network.as_str())
    .bind(now_ms)
    .fetch_all(&mut *tx)
    .await?;
    let not_final = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {TRANSFER_COLUMNS}, i.watch_key, i.monitor_until_ms FROM transfers t JOIN payment_intents i ON i.id = t.intent_id \
         WHERE t.network = $1 AND t.removed = 0 AND t.confirmations < $2 AND i.monitor_until_ms <= $3"
    )))
    .bind(network.as_str())
    .bind(i64::from(settle_depth))
    .bind(now_ms)
    .fetch_all(&mut *tx)
    .await?;
    let transfers = open
        .iter()
        .chain(&not_final)
        .map(decode_watched_transfer)
        .collect::<Result<_, _>>()?;
    let outputs = if holds_outputs(network) {
        outflows::held_outputs(&mut tx, network).await?
    } else {
        Vec::new()
    };
    let outflows = outflows::recent(&mut tx, network, outflows_since_ms, settle_depth).await?;
    let holders = if follows_holders(network) {
        holders(super::wallet::holdings(&mut tx, Some(network.as_str()), i64::MAX).await?)
    } else {
        Vec::new()
    };
    let cursor = super::cursors::get(&mut tx, network).await?;
    tx.commit().await?;
    Ok(FeedRead {
        keys,
        transfers,
        cursor,
        next_from,
        outputs,
        outflows,
        holders,
    })
}

/// Whether `network` pays to outputs a watcher follows until they are spent.
fn holds_outputs(network: Network) -> bool {
    matches!(network, Network::Bitcoin | Network::Litecoin)
}

/// Whether `network`'s watcher follows an account address for as long as it holds anything
/// (the account chains whose scanners report outflows).
fn follows_holders(network: Network) -> bool {
    matches!(network, Network::Ethereum | Network::Tron)
}

/// Whether each address holds any of its network's assets (a fake token holds nothing).
fn holders(rows: Vec<super::wallet::HoldingRow>) -> Vec<(String, bool)> {
    let mut holds: std::collections::BTreeMap<String, bool> = std::collections::BTreeMap::new();
    for row in rows {
        let counts = row.asset.parse::<payrecon_chain_core::Method>().is_ok() && row.amount > 0;
        *holds.entry(row.address).or_default() |= counts;
    }
    holds.into_iter().collect()
}

/// What changed on `network` from feed position `from` on: intents created, and transfers
/// written (removed ones and unmatched ones included, for the caller to sort out).
pub(crate) async fn read_changes(
    pool: &AnyPool,
    backend: Backend,
    network: Network,
    from: i64,
) -> Result<FeedRead, StoreError> {
    let mut tx = snapshot(pool, backend).await?;
    let next_from = next_from(&mut tx, backend).await?;
    // SQLite's counter only grows, and PostgreSQL's oldest running transaction only gets
    // younger: a watcher never reads its feed from further back than before.
    debug_assert!(
        next_from >= from,
        "the feed position moved back from {from} to {next_from}"
    );
    let keys = sqlx::query(
        "SELECT watch_key, created_at_ms, monitor_until_ms FROM payment_intents WHERE network = $1 AND feed_pos >= $2",
    )
    .bind(network.as_str())
    .bind(from)
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(decode_key)
    .collect::<Result<_, _>>()?;
    let transfers = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {TRANSFER_COLUMNS}, i.watch_key, i.monitor_until_ms FROM transfers t LEFT JOIN payment_intents i ON i.id = t.intent_id \
         WHERE t.network = $1 AND t.feed_pos >= $2"
    )))
    .bind(network.as_str())
    .bind(from)
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(decode_watched_transfer)
    .collect::<Result<_, _>>()?;
    let outputs = if holds_outputs(network) {
        outflows::output_changes(&mut tx, network, from).await?
    } else {
        Vec::new()
    };
    let outflows = outflows::changed(&mut tx, network, from).await?;
    let holders = if follows_holders(network) {
        holders(super::wallet::holdings_touched_since(&mut tx, network.as_str(), from).await?)
    } else {
        Vec::new()
    };
    let cursor = super::cursors::get(&mut tx, network).await?;
    tx.commit().await?;
    Ok(FeedRead {
        keys,
        transfers,
        cursor,
        next_from,
        outputs,
        outflows,
        holders,
    })
}

/// Where the live statuses' reads of what changed stand: the newest intent event read, and the
/// transfers' feed position.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LivePosition {
    pub event_seq: i64,
    pub feed: i64,
}

/// Events re-read behind the newest one on PostgreSQL, where sequence numbers are handed out
/// in start order and a transaction that began earlier can commit later. The caller keeps the
/// sequence numbers it has seen within this margin, so a page is woken once per change.
pub(crate) const LATE_EVENTS: i64 = 256;

/// Changes read at most at once; past it, every open page looks again.
const MAX_CHANGES: i64 = 10_000;

/// What the live statuses must look at again.
#[derive(Debug, Default)]
pub(crate) struct ChangedIntents {
    /// Events written (sequence number and intent), some perhaps read before (see
    /// [`LATE_EVENTS`]).
    pub events: Vec<(i64, String)>,
    /// The intents whose transfers were written.
    pub intents: Vec<String>,
    /// More changed than was read: every open page looks again.
    pub everything: bool,
    pub next: LivePosition,
}

/// The intents with events or transfers written since `from`; with `None`, where the next read
/// starts and the events within the margin behind it (to be taken as seen). Two indexed range
/// reads, however many pages are open.
pub(crate) async fn changed_intents(
    pool: &AnyPool,
    backend: Backend,
    from: Option<LivePosition>,
) -> Result<ChangedIntents, StoreError> {
    let mut tx = snapshot(pool, backend).await?;
    let feed = next_from(&mut tx, backend).await?;
    let newest: Option<i64> = sqlx::query_scalar("SELECT MAX(seq) FROM intent_events")
        .fetch_one(&mut *tx)
        .await?;
    let newest = newest.unwrap_or(0);
    let next = LivePosition {
        event_seq: newest,
        feed,
    };
    let margin = match backend {
        Backend::Sqlite => 0,
        Backend::Postgres => LATE_EVENTS,
    };
    let after = from.map_or(newest, |from| from.event_seq) - margin;
    let events: Vec<(i64, String)> = sqlx::query(
        "SELECT seq, intent_id FROM intent_events WHERE seq > $1 AND intent_id IS NOT NULL ORDER BY seq LIMIT $2",
    )
    .bind(after)
    .bind(MAX_CHANGES)
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(|row| Ok((row.try_get("seq")?, row.try_get("intent_id")?)))
    .collect::<Result<_, StoreError>>()?;
    let mut everything = events.len() as i64 == MAX_CHANGES;
    let Some(from) = from else {
        tx.commit().await?;
        return Ok(ChangedIntents {
            events,
            next,
            ..ChangedIntents::default()
        });
    };
    let networks: Vec<&str> = payrecon_chain_core::Network::ALL
        .iter()
        .map(|n| n.as_str())
        .collect();
    let placeholders: Vec<String> = (0..networks.len()).map(|i| format!("${}", i + 3)).collect();
    let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT intent_id FROM transfers WHERE network IN ({}) AND feed_pos >= $1 \
         AND intent_id IS NOT NULL LIMIT $2",
        placeholders.join(", ")
    )))
    .bind(from.feed)
    .bind(MAX_CHANGES);
    for network in &networks {
        query = query.bind(*network);
    }
    let mut intents: Vec<String> = query.fetch_all(&mut *tx).await?;
    everything |= intents.len() as i64 == MAX_CHANGES;
    tx.commit().await?;
    intents.sort_unstable();
    intents.dedup();
    Ok(ChangedIntents {
        events,
        intents,
        everything,
        next,
    })
}

/// A read-only transaction whose statements all see one snapshot.
async fn snapshot(
    pool: &AnyPool,
    backend: Backend,
) -> Result<sqlx::Transaction<'static, sqlx::Any>, StoreError> {
    let begin = match backend {
        // A deferred transaction in WAL mode keeps the snapshot of its first read.
        Backend::Sqlite => "BEGIN",
        Backend::Postgres => "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
    };
    super::begin_detached(pool, begin).await
}

/// Where the read after this one starts.
async fn next_from(conn: &mut AnyConnection, backend: Backend) -> Result<i64, StoreError> {
    match backend {
        Backend::Sqlite => {
            let position: i64 =
                sqlx::query_scalar("SELECT position FROM feed_counter WHERE id = 1")
                    .fetch_one(conn)
                    .await?;
            Ok(position + 1)
        }
        Backend::Postgres => {
            let xmin: String =
                sqlx::query_scalar("SELECT pg_snapshot_xmin(pg_current_snapshot())::text")
                    .fetch_one(conn)
                    .await?;
            xmin.parse()
                .map_err(|_| StoreError::Corrupt(format!("snapshot xmin {xmin:?}")))
        }
    }
}

fn decode_key(row: &sqlx::any::AnyRow) -> Result<WatchedKey, StoreError> {
    Ok(WatchedKey {
        watch_key: row.try_get("watch_key")?,
        created_at_ms: row.try_get("created_at_ms")?,
        monitor_until_ms: row.try_get("monitor_until_ms")?,
    })
}

fn decode_watched_transfer(row: &sqlx::any::AnyRow) -> Result<WatchedTransfer, StoreError> {
    Ok(WatchedTransfer {
        transfer: decode_transfer(row)?,
        watch_key: row.try_get("watch_key")?,
        monitor_until_ms: row.try_get("monitor_until_ms")?,
    })
}
