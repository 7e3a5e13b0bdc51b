//! SQL for watcher leases and their fencing tokens. Lease times are the database's own clock,
//! so processes on machines whose clocks disagree still agree on who holds a lease.

use sqlx::Row;

use super::{Backend, StoreError, WriteTx};

/// The database's clock in Unix milliseconds, per dialect.
fn now_ms(backend: Backend) -> &'static str {
    backend.pick(
        "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
        "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
    )
}

/// Takes the lease of `network` for `holder` if it is free, expired, or already `holder`'s;
/// returns the fencing token, or `None` when another holder's lease is live. Taking a lease
/// from another holder (or taking it anew) increments the token.
pub(crate) async fn acquire(
    tx: &mut WriteTx,
    network: &str,
    holder: &str,
    ttl_ms: i64,
) -> Result<Option<i64>, StoreError> {
    let now = now_ms(tx.backend());
    let sql = format!(
        "INSERT INTO watcher_leases (network, holder, fencing_token, expires_at_ms) VALUES ($1, $2, 1, {now} + $3) \
         ON CONFLICT (network) DO UPDATE SET \
         fencing_token = CASE WHEN watcher_leases.holder = excluded.holder AND watcher_leases.expires_at_ms >= {now} \
             THEN watcher_leases.fencing_token ELSE watcher_leases.fencing_token + 1 END, \
         holder = excluded.holder, expires_at_ms = excluded.expires_at_ms \
         WHERE watcher_leases.holder = excluded.holder OR watcher_leases.expires_at_ms < {now} \
         RETURNING fencing_token"
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(network)
        .bind(holder)
        .bind(ttl_ms)
        .fetch_optional(tx.conn())
        .await?;
    row.map(|row| row.try_get::<i64, _>("fencing_token"))
        .transpose()
        .map_err(StoreError::from)
}

/// Extends a live lease held with `token`. False when it was lost (expired and taken).
pub(crate) async fn renew(
    tx: &mut WriteTx,
    network: &str,
    holder: &str,
    token: i64,
    ttl_ms: i64,
) -> Result<bool, StoreError> {
    let now = now_ms(tx.backend());
    let sql = format!(
        "UPDATE watcher_leases SET expires_at_ms = {now} + $4 \
         WHERE network = $1 AND holder = $2 AND fencing_token = $3"
    );
    let result = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(network)
        .bind(holder)
        .bind(token)
        .bind(ttl_ms)
        .execute(tx.conn())
        .await?;
    Ok(result.rows_affected() == 1)
}

/// The fence every write of a watcher passes first, inside the write's transaction: true
/// while `token` is still the lease's. Updating the row locks it, so a takeover waits for this
/// transaction, and this transaction sees a takeover that committed before it.
pub(crate) async fn check_fence(
    tx: &mut WriteTx,
    network: &str,
    holder: &str,
    token: i64,
) -> Result<bool, StoreError> {
    let result = sqlx::query(
        "UPDATE watcher_leases SET holder = holder WHERE network = $1 AND holder = $2 AND fencing_token = $3",
    )
    .bind(network)
    .bind(holder)
    .bind(token)
    .execute(tx.conn())
    .await?;
    Ok(result.rows_affected() == 1)
}

/// Gives a lease up at once (a clean shutdown), so another process need not wait it out.
pub(crate) async fn release(
    tx: &mut WriteTx,
    network: &str,
    holder: &str,
    token: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE watcher_leases SET expires_at_ms = 0 WHERE network = $1 AND holder = $2 AND fencing_token = $3",
    )
    .bind(network)
    .bind(holder)
    .bind(token)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// Who holds `network`'s lease and with which token, if anyone ever did.
pub(crate) async fn holder(
    conn: &mut sqlx::AnyConnection,
    network: &str,
) -> Result<Option<(String, i64)>, StoreError> {
    let row = sqlx::query("SELECT holder, fencing_token FROM watcher_leases WHERE network = $1")
        .bind(network)
        .fetch_optional(conn)
        .await?;
    row.map(|row| Ok((row.try_get("holder")?, row.try_get("fencing_token")?)))
        .transpose()
}
