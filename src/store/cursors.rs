//! SQL for watcher cursors.

use chrono::{DateTime, Utc};
use payrecon_chain_core::{BlockId, ChainCursor, Network};
use sqlx::{AnyConnection, Row};

use super::StoreError;

/// The cursor of `network`'s watcher, if it has committed one.
pub(crate) async fn get(
    conn: &mut AnyConnection,
    network: Network,
) -> Result<Option<ChainCursor>, StoreError> {
    let row = sqlx::query(
        "SELECT tip_height, tip_hash, checkpoints FROM watcher_cursors WHERE network = $1",
    )
    .bind(network.as_str())
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let corrupt = |what: &str| StoreError::Corrupt(format!("cursor of {network}: {what}"));
    let checkpoints: Vec<BlockId> = serde_json::from_str(&row.try_get::<String, _>("checkpoints")?)
        .map_err(|_| corrupt("checkpoints"))?;
    Ok(Some(ChainCursor {
        tip: BlockId {
            height: u64::try_from(row.try_get::<i64, _>("tip_height")?)
                .map_err(|_| corrupt("height"))?,
            hash: row.try_get("tip_hash")?,
        },
        checkpoints,
    }))
}

/// Writes the cursor of `network`'s watcher.
pub(crate) async fn put(
    conn: &mut AnyConnection,
    network: Network,
    cursor: &ChainCursor,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let checkpoints = serde_json::to_string(&cursor.checkpoints)
        .map_err(|e| StoreError::Corrupt(format!("checkpoints: {e}")))?;
    sqlx::query(
        "INSERT INTO watcher_cursors (network, tip_height, tip_hash, checkpoints, updated_at_ms) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (network) DO UPDATE SET \
         tip_height = excluded.tip_height, tip_hash = excluded.tip_hash, \
         checkpoints = excluded.checkpoints, updated_at_ms = excluded.updated_at_ms",
    )
    .bind(network.as_str())
    .bind(i64::try_from(cursor.tip.height).map_err(|_| StoreError::Corrupt("height".into()))?)
    .bind(cursor.tip.hash.as_str())
    .bind(checkpoints)
    .bind(now.timestamp_millis())
    .execute(conn)
    .await?;
    Ok(())
}
