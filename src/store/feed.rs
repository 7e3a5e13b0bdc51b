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

use super::payments::{StoredTransfer, TRANSFER_COLUMNS, decode_transfer};
use super::{Backend, StoreError};

/// A watched key, when it was handed out and the end of its monitoring window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WatchedKey {
    pub watch_key: String,
    pub created_at_ms: i64,
    pub monitor_until_ms: i64,
}

/// A transfer as it stands now, with the monitoring window of the intent it paid (none for an
/// unmatched transfer, which no watcher diffs against).
#[derive(Clone, Debug)]
pub(crate) struct WatchedTransfer {
    pub transfer: StoredTransfer,
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
}

/// Everything `network`'s watcher follows at `now_ms`: keys inside their monitoring window and
/// the transfers to them not removed. What a watcher reads once, when it starts or takes a
/// lease over.
pub(crate) async fn read_all(
    pool: &AnyPool,
    backend: Backend,
    network: Network,
    now_ms: i64,
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
    let transfers = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {TRANSFER_COLUMNS}, i.monitor_until_ms FROM transfers t JOIN payment_intents i ON i.id = t.intent_id \
         WHERE t.network = $1 AND t.removed = 0 AND i.monitor_until_ms > $2"
    )))
    .bind(network.as_str())
    .bind(now_ms)
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(decode_watched_transfer)
    .collect::<Result<_, _>>()?;
    let cursor = super::cursors::get(&mut tx, network).await?;
    tx.commit().await?;
    Ok(FeedRead {
        keys,
        transfers,
        cursor,
        next_from,
    })
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
        "SELECT {TRANSFER_COLUMNS}, i.monitor_until_ms FROM transfers t LEFT JOIN payment_intents i ON i.id = t.intent_id \
         WHERE t.network = $1 AND t.feed_pos >= $2"
    )))
    .bind(network.as_str())
    .bind(from)
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(decode_watched_transfer)
    .collect::<Result<_, _>>()?;
    let cursor = super::cursors::get(&mut tx, network).await?;
    tx.commit().await?;
    Ok(FeedRead {
        keys,
        transfers,
        cursor,
        next_from,
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
        monitor_until_ms: row.try_get("monitor_until_ms")?,
    })
}
