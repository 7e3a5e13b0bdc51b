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
/// lowest index skipped by money found ahead of it since `since_ms` (still watched).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyWindow {
    pub next_index: u32,
    pub skipped_from: Option<u32>,
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
    let placeholders: Vec<String> = (3..3 + key_ids.len()).map(|n| format!("${n}")).collect();
    let sql = format!(
        "SELECT c.key_id, c.next_index, (SELECT MIN(u.counter_before) FROM unissued_payments u \
           WHERE u.network = $1 AND u.key_id = c.key_id AND u.found_at_ms > $2) \
         FROM derivation_counters c WHERE c.key_id IN ({})",
        placeholders.join(", ")
    );
    let mut query = sqlx::query_as::<_, (String, i64, Option<i64>)>(sqlx::AssertSqlSafe(sql))
        .bind(network)
        .bind(since_ms);
    for key_id in key_ids {
        query = query.bind(key_id.as_str());
    }
    for (key_id, next, skipped) in query.fetch_all(&mut *conn).await? {
        let index = |value: i64| {
            u32::try_from(value)
                .map_err(|_| StoreError::Corrupt(format!("derivation index {value} of {key_id}")))
        };
        let window = KeyWindow {
            next_index: index(next)?,
            skipped_from: skipped.map(index).transpose()?,
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
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO derivation_counters (key_id, next_index) VALUES ($1, $2) \
         ON CONFLICT (key_id) DO UPDATE SET \
           next_index = {greatest}(derivation_counters.next_index, $3)"
    )))
    .bind(row.key_id.as_str())
    .bind(i64::from(row.derivation_index) + 1)
    .bind(i64::from(row.derivation_index) + 1)
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
