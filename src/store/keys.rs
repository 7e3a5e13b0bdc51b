//! SQL for the account keys that handed out addresses, their counters as watchers read them,
//! and the money found ahead of a counter.

use sqlx::{AnyConnection, Row};

use super::{Backend, StoreError};

/// One account key as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyRow {
    pub key_id: String,
    pub network: String,
    /// The extended public key as it was configured.
    pub account_key: String,
    pub key_origin: Option<String>,
    /// `current` or `retired`.
    pub state: String,
    pub first_seen_ms: i64,
    pub retired_at_ms: Option<i64>,
}

/// Makes `key` its network's current key: a key of the network that was current before is
/// retired. Returns the keys this call retired.
pub(crate) async fn make_current(
    conn: &mut AnyConnection,
    key: &KeyRow,
    now_ms: i64,
) -> Result<Vec<KeyRow>, StoreError> {
    let retired = keys_of(conn, &key.network)
        .await?
        .into_iter()
        .filter(|row| row.state == "current" && row.key_id != key.key_id)
        .collect::<Vec<_>>();
    sqlx::query(
        "UPDATE wallet_keys SET state = 'retired', retired_at_ms = $1 \
         WHERE network = $2 AND state = 'current' AND key_id <> $3",
    )
    .bind(now_ms)
    .bind(key.network.as_str())
    .bind(key.key_id.as_str())
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO wallet_keys (key_id, network, account_key, key_origin, state, first_seen_ms) \
         VALUES ($1, $2, $3, $4, 'current', $5) \
         ON CONFLICT (key_id) DO UPDATE SET state = 'current', retired_at_ms = NULL, \
           key_origin = COALESCE($6, wallet_keys.key_origin)",
    )
    .bind(key.key_id.as_str())
    .bind(key.network.as_str())
    .bind(key.account_key.as_str())
    .bind(key.key_origin.as_deref())
    .bind(now_ms)
    .bind(key.key_origin.as_deref())
    .execute(&mut *conn)
    .await?;
    Ok(retired)
}

/// Every key of `network`, the current one first, then the retired ones from the newest.
pub(crate) async fn keys_of(
    conn: &mut AnyConnection,
    network: &str,
) -> Result<Vec<KeyRow>, StoreError> {
    let rows = sqlx::query(
        "SELECT key_id, network, account_key, key_origin, state, first_seen_ms, retired_at_ms \
         FROM wallet_keys WHERE network = $1 \
         ORDER BY CASE state WHEN 'current' THEN 0 ELSE 1 END, first_seen_ms DESC, key_id",
    )
    .bind(network)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(KeyRow {
                key_id: row.try_get(0)?,
                network: row.try_get(1)?,
                account_key: row.try_get(2)?,
                key_origin: row.try_get(3)?,
                state: row.try_get(4)?,
                first_seen_ms: row.try_get(5)?,
                retired_at_ms: row.try_get(6)?,
            })
        })
        .collect()
}

/// What a watcher needs to place each key's look-ahead window: its next free index, and the
/// lowest index below it that may be unused and still needs watching: skipped by money found
/// ahead of it or by a restore, or in a block a process took, since `since_ms`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyWindow {
    pub next_index: u32,
    pub watched_from: Option<u32>,
    /// The key's database was restored and its watcher has not looked past the counter yet.
    pub restore_pending: bool,
}

/// Each of `key_ids`' [`KeyWindow`] on `network`, in one statement (a watcher reads it every
/// round); a key that never handed out starts at 0.
pub(crate) async fn windows(
    conn: &mut AnyConnection,
    network: &str,
    key_ids: &[String],
    since_ms: i64,
) -> Result<std::collections::HashMap<String, KeyWindow>, StoreError> {
    let mut windows: std::collections::HashMap<String, KeyWindow> = key_ids
        .iter()
        .map(|key_id| (key_id.clone(), KeyWindow::default()))
        .collect();
    if key_ids.is_empty() {
        return Ok(windows);
    }
    let placeholders: Vec<String> = (5..5 + key_ids.len()).map(|n| format!("${n}")).collect();
    let sql = format!(
        "SELECT c.key_id, c.next_index, \
           (SELECT MIN(u.counter_before) FROM unissued_payments u \
             WHERE u.network = $1 AND u.key_id = c.key_id AND u.found_at_ms > $2), \
           (SELECT MIN(s.from_index) FROM counter_skips s \
             WHERE s.key_id = c.key_id AND s.skipped_at_ms > $3), \
           (SELECT MIN(b.first_index) FROM index_blocks b \
             WHERE b.key_id = c.key_id AND b.taken_at_ms > $4), \
           (SELECT COUNT(*) FROM restore_pending r WHERE r.key_id = c.key_id) \
         FROM derivation_counters c WHERE c.key_id IN ({})",
        placeholders.join(", ")
    );
    type Row = (String, i64, Option<i64>, Option<i64>, Option<i64>, i64);
    let mut query = sqlx::query_as::<_, Row>(sqlx::AssertSqlSafe(sql))
        .bind(network)
        .bind(since_ms)
        .bind(since_ms)
        .bind(since_ms);
    for key_id in key_ids {
        query = query.bind(key_id.as_str());
    }
    for (key_id, next, unissued, skipped, blocks, pending) in query.fetch_all(&mut *conn).await? {
        let index = |value: i64| {
            u32::try_from(value)
                .map_err(|_| StoreError::Corrupt(format!("derivation index {value} of {key_id}")))
        };
        let lowest = [unissued, skipped, blocks].into_iter().flatten().min();
        let window = KeyWindow {
            next_index: index(next)?,
            watched_from: lowest.map(index).transpose()?,
            restore_pending: pending > 0,
        };
        windows.insert(key_id, window);
    }
    Ok(windows)
}

/// Money seen at an address ahead of its key's counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UnissuedRow {
    pub network: String,
    pub address: String,
    pub key_id: String,
    pub derivation_index: u32,
}

/// Records money found at `row`'s address, unless an intent owns it by now, and moves the
/// key's counter past its index (never backwards). The first sighting is kept.
pub(crate) async fn record_unissued(
    conn: &mut AnyConnection,
    backend: Backend,
    row: &UnissuedRow,
    now_ms: i64,
) -> Result<(), StoreError> {
    let owned: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM payment_intents WHERE network = $1 AND watch_key = $2 LIMIT 1",
    )
    .bind(row.network.as_str())
    .bind(row.address.as_str())
    .fetch_optional(&mut *conn)
    .await?;
    if owned.is_some() {
        return Ok(());
    }
    let before: Option<i64> =
        sqlx::query_scalar("SELECT next_index FROM derivation_counters WHERE key_id = $1")
            .bind(row.key_id.as_str())
            .fetch_optional(&mut *conn)
            .await?;
    sqlx::query(
        "INSERT INTO unissued_payments (network, address, key_id, derivation_index, \
           counter_before, found_at_ms) VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (network, address) DO NOTHING",
    )
    .bind(row.network.as_str())
    .bind(row.address.as_str())
    .bind(row.key_id.as_str())
    .bind(i64::from(row.derivation_index))
    .bind(before.unwrap_or(0))
    .bind(now_ms)
    .execute(&mut *conn)
    .await?;
    let greatest = match backend {
        Backend::Sqlite => "MAX",
        Backend::Postgres => "GREATEST",
    };
    // On a restored database not yet looked past, the addresses after a paid one may have been
    // handed out too: the counter moves past them, as far as the look-ahead reaches.
    let pending = restore_pending(conn, &row.key_id).await?;
    let past = i64::from(row.derivation_index) + 1 + i64::from(pending.unwrap_or(0));
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO derivation_counters (key_id, next_index) VALUES ($1, $2) \
         ON CONFLICT (key_id) DO UPDATE SET \
           next_index = {greatest}(derivation_counters.next_index, $3)"
    )))
    .bind(row.key_id.as_str())
    .bind(past)
    .bind(past)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The key and index of `address` on `network`, when money was found there ahead of the
/// counter.
pub(crate) async fn unissued(
    conn: &mut AnyConnection,
    network: &str,
    address: &str,
) -> Result<Option<(String, u32)>, StoreError> {
    let row: Option<(String, i64)> = sqlx::query_as(
        "SELECT key_id, derivation_index FROM unissued_payments WHERE network = $1 AND address = $2",
    )
    .bind(network)
    .bind(address)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|(key, index)| {
        u32::try_from(index)
            .map(|index| (key, index))
            .map_err(|_| StoreError::Corrupt(format!("derivation index {index} of {address}")))
    })
    .transpose()
}

/// Takes the next `size` indexes of `key_id` as one block: its counter moves past them, and
/// the block is recorded so the watcher follows those addresses while some may be unused.
/// Blocks of this key taken before `prune_before_ms`, and `spent` ones (every index of them
/// used), are forgotten in the same transaction. Returns the block's first index.
pub(crate) async fn take_block(
    tx: &mut super::WriteTx,
    key_id: &str,
    size: u32,
    now_ms: i64,
    (spent, prune_before_ms): (&[u32], i64),
) -> Result<u32, StoreError> {
    let end: i64 = sqlx::query_scalar(
        "INSERT INTO derivation_counters (key_id, next_index) VALUES ($1, $2) \
         ON CONFLICT (key_id) DO UPDATE SET next_index = derivation_counters.next_index + $2 \
         RETURNING next_index",
    )
    .bind(key_id)
    .bind(i64::from(size))
    .fetch_one(tx.conn())
    .await?;
    let first = end - i64::from(size);
    sqlx::query(
        "INSERT INTO index_blocks (key_id, first_index, end_index, taken_at_ms) \
         VALUES ($1, $2, $3, $4)",
    )
    .bind(key_id)
    .bind(first)
    .bind(end)
    .bind(now_ms)
    .execute(tx.conn())
    .await?;
    let backend = tx.backend();
    let sql = format!(
        "DELETE FROM index_blocks WHERE key_id = {} AND (taken_at_ms < {}{})",
        super::placeholder(backend, 1),
        super::placeholder(backend, 2),
        if spent.is_empty() {
            String::new()
        } else {
            format!(
                " OR first_index IN ({})",
                super::list_placeholders_after(backend, 2, spent.len())
            )
        }
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(key_id)
        .bind(prune_before_ms);
    for first in spent {
        query = query.bind(i64::from(*first));
    }
    query.execute(tx.conn()).await?;
    u32::try_from(first)
        .ok()
        .filter(|_| end <= i64::from(u32::MAX))
        .ok_or_else(|| StoreError::Corrupt(format!("index {end} of {key_id}")))
}

/// Whether this database is a copy `payrecon backup` wrote that nobody started on yet.
pub(crate) async fn is_backup_copy(conn: &mut AnyConnection) -> Result<bool, StoreError> {
    let mark: Option<i64> =
        sqlx::query_scalar("SELECT at_ms FROM database_marks WHERE name = 'backup_copy'")
            .fetch_optional(&mut *conn)
            .await?;
    Ok(mark.is_some())
}

/// Marks a database as a backup copy (written into the copy, never into the live database).
pub(crate) async fn mark_backup_copy(
    conn: &mut AnyConnection,
    now_ms: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO database_marks (name, at_ms) VALUES ('backup_copy', $1) \
         ON CONFLICT (name) DO UPDATE SET at_ms = excluded.at_ms",
    )
    .bind(now_ms)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// One key's counter as a restore moved it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RestoredCounter {
    pub key_id: String,
    /// The lowest index the lost database may have handed out after the backup: the counter,
    /// or lower where a process held a block.
    pub watched_from: u32,
    pub from_index: u32,
    /// How far past `from_index` the counter moves, and past a payment found until the
    /// watcher has looked.
    pub lookahead: u32,
}

impl RestoredCounter {
    /// The counter after the restore.
    pub(crate) fn until_index(&self) -> u32 {
        self.from_index.saturating_add(self.lookahead)
    }
}

/// Every key's derivation counter, with the lowest index of the blocks processes held (the
/// counter when none): what a restore moves.
pub(crate) async fn counters(
    conn: &mut AnyConnection,
) -> Result<Vec<(String, u32, u32)>, StoreError> {
    let rows: Vec<(String, i64, Option<i64>)> = sqlx::query_as(
        "SELECT c.key_id, c.next_index, \
           (SELECT MIN(b.first_index) FROM index_blocks b WHERE b.key_id = c.key_id) \
         FROM derivation_counters c ORDER BY c.key_id",
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|(key, next, held)| {
            let index = |value: i64| {
                u32::try_from(value)
                    .map_err(|_| StoreError::Corrupt(format!("index {value} of {key}")))
            };
            let next = index(next)?;
            let held = held.map(index).transpose()?.unwrap_or(next).min(next);
            Ok((key.clone(), next, held))
        })
        .collect()
}

/// Records a restore: each counter jumps as `moved` says (the skipped indexes stay watched for
/// a monitoring window), each key waits for its watcher's look past the counter (money found
/// ahead moves the counter its look-ahead further), every block taken before is forgotten (its
/// process is gone).
pub(crate) async fn record_restore(
    conn: &mut AnyConnection,
    moved: &[RestoredCounter],
    now_ms: i64,
) -> Result<(), StoreError> {
    for counter in moved {
        sqlx::query("UPDATE derivation_counters SET next_index = $2 WHERE key_id = $1")
            .bind(counter.key_id.as_str())
            .bind(i64::from(counter.until_index()))
            .execute(&mut *conn)
            .await?;
        sqlx::query(
            "INSERT INTO counter_skips (key_id, from_index, until_index, skipped_at_ms, reason) \
             VALUES ($1, $2, $3, $4, 'restore')",
        )
        .bind(counter.key_id.as_str())
        .bind(i64::from(counter.watched_from))
        .bind(i64::from(counter.until_index()))
        .bind(now_ms)
        .execute(&mut *conn)
        .await?;
        sqlx::query(
            "INSERT INTO restore_pending (key_id, lookahead, restored_at_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (key_id) DO UPDATE SET lookahead = excluded.lookahead, \
               restored_at_ms = excluded.restored_at_ms",
        )
        .bind(counter.key_id.as_str())
        .bind(i64::from(counter.lookahead))
        .bind(now_ms)
        .execute(&mut *conn)
        .await?;
    }
    sqlx::query("DELETE FROM index_blocks")
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Clears the backup mark; true if there was one (the first of several starts at once).
pub(crate) async fn take_backup_mark(conn: &mut AnyConnection) -> Result<bool, StoreError> {
    let taken = sqlx::query("DELETE FROM database_marks WHERE name = 'backup_copy'")
        .execute(&mut *conn)
        .await?;
    Ok(taken.rows_affected() > 0)
}

/// The look-ahead of `key_id` while it still waits for its watcher's first look past the
/// counters of a restored database; `None` when it does not.
pub(crate) async fn restore_pending(
    conn: &mut AnyConnection,
    key_id: &str,
) -> Result<Option<u32>, StoreError> {
    let row: Option<i64> =
        sqlx::query_scalar("SELECT lookahead FROM restore_pending WHERE key_id = $1")
            .bind(key_id)
            .fetch_optional(&mut *conn)
            .await?;
    row.map(|lookahead| {
        u32::try_from(lookahead)
            .map_err(|_| StoreError::Corrupt(format!("look-ahead {lookahead} of {key_id}")))
    })
    .transpose()
}

/// The watcher of `key_ids` looked past their counters and found nothing more: new blocks may
/// be taken again.
pub(crate) async fn settle_restore(
    conn: &mut AnyConnection,
    backend: Backend,
    key_ids: &[String],
) -> Result<u64, StoreError> {
    if key_ids.is_empty() {
        return Ok(0);
    }
    let sql = format!(
        "DELETE FROM restore_pending WHERE key_id IN ({})",
        super::list_placeholders(backend, key_ids.len())
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for key_id in key_ids {
        query = query.bind(key_id.as_str());
    }
    Ok(query.execute(&mut *conn).await?.rows_affected())
}
