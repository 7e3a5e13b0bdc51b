//! SQL for operations: exception resolution and its audit log, API tokens, watcher health,
//! the stuck-payment queries and webhook deliveries.

use crate::records::{ExceptionRecord, FailingEndpoint, OperatorAction, WatcherHealth};
use chrono::{DateTime, Utc};
use sqlx::{AnyConnection, Row};

use super::StoreError;
use super::orders::millis;
use super::payments::decode_exception;

/// One exception by id.
pub(crate) async fn get_exception(
    conn: &mut AnyConnection,
    id: &str,
) -> Result<Option<ExceptionRecord>, StoreError> {
    let row = sqlx::query(
        "SELECT id, kind, intent_id, order_ref, transfer, detail, opened_at_ms, resolved_at_ms, resolution \
         FROM exceptions WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(decode_exception).transpose()
}

/// Exceptions nobody resolved yet, oldest first.
pub(crate) async fn open_exceptions(
    conn: &mut AnyConnection,
    after: (i64, &str),
    limit: i64,
) -> Result<Vec<ExceptionRecord>, StoreError> {
    super::payments::exceptions_page(conn, true, after, limit).await
}

/// Open exceptions per kind, for metrics.
pub(crate) async fn open_exceptions_by_kind(
    conn: &mut AnyConnection,
) -> Result<Vec<(String, i64)>, StoreError> {
    let rows = sqlx::query(
        "SELECT kind, COUNT(*) AS n FROM exceptions WHERE resolved_at_ms IS NULL GROUP BY kind ORDER BY kind",
    )
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| Ok((row.try_get("kind")?, row.try_get("n")?)))
        .collect()
}

/// Intents per state, for metrics.
pub(crate) async fn intents_by_status(
    conn: &mut AnyConnection,
) -> Result<Vec<(String, i64)>, StoreError> {
    let rows = sqlx::query(
        "SELECT status, COUNT(*) AS n FROM payment_intents GROUP BY status ORDER BY status",
    )
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| Ok((row.try_get("status")?, row.try_get("n")?)))
        .collect()
}

/// Appends to the audit log and closes the exception, in the caller's transaction.
pub(crate) async fn record_resolution(
    conn: &mut AnyConnection,
    action: &OperatorAction,
    resolution: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO operator_actions (exception_id, action, actor, reason, refund_txid, entry_key, at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(action.exception_id.as_str())
    .bind(action.action.as_str())
    .bind(action.actor.as_str())
    .bind(action.reason.as_str())
    .bind(action.refund_txid.as_deref())
    .bind(action.entry_key.as_deref())
    .bind(action.at.timestamp_millis())
    .execute(&mut *conn)
    .await?;
    let updated = sqlx::query(
        "UPDATE exceptions SET resolved_at_ms = $2, resolution = $3, resolved_by = $4 \
         WHERE id = $1 AND resolved_at_ms IS NULL",
    )
    .bind(action.exception_id.as_str())
    .bind(action.at.timestamp_millis())
    .bind(resolution)
    .bind(action.actor.as_str())
    .execute(conn)
    .await?;
    if updated.rows_affected() != 1 {
        return Err(StoreError::Corrupt(format!(
            "exception {} was resolved concurrently",
            action.exception_id
        )));
    }
    Ok(())
}

/// The audit log, oldest first; of one exception when given, else up to `limit` entries
/// after `after_seq`.
pub(crate) async fn actions(
    conn: &mut AnyConnection,
    exception_id: Option<&str>,
) -> Result<Vec<OperatorAction>, StoreError> {
    actions_page(conn, exception_id, 0, i64::MAX).await
}

/// One page of the audit log: up to `limit` entries after `after_seq`.
pub(crate) async fn actions_page(
    conn: &mut AnyConnection,
    exception_id: Option<&str>,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<OperatorAction>, StoreError> {
    let query = match exception_id {
        Some(id) => sqlx::query(
            "SELECT seq, exception_id, action, actor, reason, refund_txid, entry_key, at_ms \
             FROM operator_actions WHERE exception_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .bind(id),
        None => sqlx::query(
            "SELECT seq, exception_id, action, actor, reason, refund_txid, entry_key, at_ms \
             FROM operator_actions WHERE seq > $1 ORDER BY seq LIMIT $2",
        ),
    }
    .bind(after_seq)
    .bind(limit);
    query
        .fetch_all(conn)
        .await?
        .iter()
        .map(|row| {
            Ok(OperatorAction {
                seq: row.try_get("seq")?,
                exception_id: row.try_get("exception_id")?,
                action: row.try_get("action")?,
                actor: row.try_get("actor")?,
                reason: row.try_get("reason")?,
                refund_txid: row.try_get("refund_txid")?,
                entry_key: row.try_get("entry_key")?,
                at: millis(row.try_get("at_ms")?)?,
            })
        })
        .collect()
}

/// Journal entries operators posted for exceptions about one transfer: a reorg that removes
/// the transfer must take them back too.
pub(crate) async fn action_entries_for_transfer(
    conn: &mut AnyConnection,
    transfer: &str,
) -> Result<Vec<String>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT a.entry_key FROM operator_actions a JOIN exceptions e ON e.id = a.exception_id \
         WHERE e.transfer = $1 AND a.entry_key IS NOT NULL ORDER BY a.seq",
    )
    .bind(transfer)
    .fetch_all(conn)
    .await?)
}

/// [`action_entries_for_transfer`] for many transfers at once: per transfer, its operators'
/// entry keys in the order they were posted.
pub(crate) async fn action_entries_for_transfers(
    conn: &mut AnyConnection,
    transfers: &[&str],
) -> Result<std::collections::HashMap<String, Vec<String>>, StoreError> {
    let mut entries: std::collections::HashMap<String, Vec<String>> = Default::default();
    for chunk in transfers.chunks(super::rows_per_statement(1)) {
        let sql = format!(
            "SELECT e.transfer, a.entry_key FROM operator_actions a JOIN exceptions e ON e.id = a.exception_id \
             WHERE e.transfer IN ({}) AND a.entry_key IS NOT NULL ORDER BY a.seq",
            super::list_placeholders(super::backend_of_conn(conn), chunk.len())
        );
        let mut query = sqlx::query_as::<_, (String, String)>(sqlx::AssertSqlSafe(sql));
        for transfer in chunk {
            query = query.bind(*transfer);
        }
        for (transfer, key) in query.fetch_all(&mut *conn).await? {
            entries.entry(transfer).or_default().push(key);
        }
    }
    Ok(entries)
}

/// Stores a token's hash under a name. Refused if the name exists.
pub(crate) async fn insert_token(
    conn: &mut AnyConnection,
    token_sha256: &str,
    name: &str,
    role: &str,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let result = sqlx::query(
        "INSERT INTO api_tokens (token_sha256, name, role, created_at_ms) VALUES ($1, $2, $3, $4) \
         ON CONFLICT DO NOTHING",
    )
    .bind(token_sha256)
    .bind(name)
    .bind(role)
    .bind(now.timestamp_millis())
    .execute(conn)
    .await?;
    Ok(result.rows_affected() == 1)
}

/// The name and role of a live token, by hash.
pub(crate) async fn token_by_hash(
    conn: &mut AnyConnection,
    token_sha256: &str,
) -> Result<Option<(String, String)>, StoreError> {
    let row = sqlx::query(
        "SELECT name, role FROM api_tokens WHERE token_sha256 = $1 AND revoked_at_ms IS NULL",
    )
    .bind(token_sha256)
    .fetch_optional(conn)
    .await?;
    row.map(|row| Ok((row.try_get("name")?, row.try_get("role")?)))
        .transpose()
}

/// Revokes a token by name. Returns whether one was live.
pub(crate) async fn revoke_token(
    conn: &mut AnyConnection,
    name: &str,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let result = sqlx::query(
        "UPDATE api_tokens SET revoked_at_ms = $2 WHERE name = $1 AND revoked_at_ms IS NULL",
    )
    .bind(name)
    .bind(now.timestamp_millis())
    .execute(conn)
    .await?;
    Ok(result.rows_affected() == 1)
}

/// Replaces a watcher's health row; how far it read its chain never moves back (nor is it
/// forgotten by a row that does not know it).
pub(crate) async fn put_watcher_health(
    conn: &mut AnyConnection,
    health: &WatcherHealth,
) -> Result<(), StoreError> {
    let height = |h: Option<u64>| h.map(|h| i64::try_from(h).unwrap_or(i64::MAX));
    let greatest = match super::backend_of_conn(conn) {
        super::Backend::Sqlite => "MAX",
        super::Backend::Postgres => "GREATEST",
    };
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO watcher_health (network, state, cursor_height, head_height, failures, rpc_errors, last_error, last_scan_at_ms, updated_at_ms, next_try_at_ms, incomplete_answers, zero_value_ignored, chain_read_until_ms, active_source) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) ON CONFLICT (network) DO UPDATE SET \
         active_source = COALESCE(excluded.active_source, watcher_health.active_source), \
         chain_read_until_ms = COALESCE({greatest}(watcher_health.chain_read_until_ms, excluded.chain_read_until_ms), \
           watcher_health.chain_read_until_ms, excluded.chain_read_until_ms), \
         state = excluded.state, cursor_height = excluded.cursor_height, head_height = excluded.head_height, \
         failures = excluded.failures, rpc_errors = excluded.rpc_errors, last_error = excluded.last_error, \
         last_scan_at_ms = excluded.last_scan_at_ms, updated_at_ms = excluded.updated_at_ms, \
         next_try_at_ms = excluded.next_try_at_ms, incomplete_answers = excluded.incomplete_answers, \
         zero_value_ignored = excluded.zero_value_ignored"
    )))
    .bind(health.network.as_str())
    .bind(health.state.as_str())
    .bind(height(health.cursor_height))
    .bind(height(health.head_height))
    .bind(i64::try_from(health.failures).unwrap_or(i64::MAX))
    .bind(i64::try_from(health.rpc_errors).unwrap_or(i64::MAX))
    .bind(health.last_error.as_deref())
    .bind(health.last_scan_at.map(|at| at.timestamp_millis()))
    .bind(health.updated_at.timestamp_millis())
    .bind(health.next_try_at.map(|at| at.timestamp_millis()))
    .bind(i64::try_from(health.incomplete_answers).unwrap_or(i64::MAX))
    .bind(i64::try_from(health.zero_value_ignored).unwrap_or(i64::MAX))
    .bind(health.chain_read_until.map(|at| at.timestamp_millis()))
    .bind(health.active_source.as_deref())
    .execute(conn)
    .await?;
    Ok(())
}

/// How far each network's watcher has read its chain (Unix ms; `None`: not yet), for every
/// network a watcher reported for.
pub(crate) async fn chain_reads(
    conn: &mut AnyConnection,
) -> Result<Vec<(String, Option<i64>)>, StoreError> {
    Ok(
        sqlx::query_as("SELECT network, chain_read_until_ms FROM watcher_health")
            .fetch_all(conn)
            .await?,
    )
}

/// Every watcher's health row.
pub(crate) async fn watcher_health(
    conn: &mut AnyConnection,
) -> Result<Vec<WatcherHealth>, StoreError> {
    let rows = sqlx::query(
        "SELECT network, state, cursor_height, head_height, failures, rpc_errors, last_error, last_scan_at_ms, updated_at_ms, \
         next_try_at_ms, incomplete_answers, zero_value_ignored, chain_read_until_ms, active_source FROM watcher_health ORDER BY network",
    )
    .fetch_all(conn)
    .await?;
    let unsigned = |value: i64| u64::try_from(value).unwrap_or(0);
    rows.iter()
        .map(|row| {
            Ok(WatcherHealth {
                network: row.try_get("network")?,
                state: row.try_get("state")?,
                cursor_height: row
                    .try_get::<Option<i64>, _>("cursor_height")?
                    .map(unsigned),
                head_height: row.try_get::<Option<i64>, _>("head_height")?.map(unsigned),
                failures: unsigned(row.try_get("failures")?),
                rpc_errors: unsigned(row.try_get("rpc_errors")?),
                incomplete_answers: unsigned(row.try_get("incomplete_answers")?),
                zero_value_ignored: unsigned(row.try_get("zero_value_ignored")?),
                last_error: row.try_get("last_error")?,
                last_scan_at: row
                    .try_get::<Option<i64>, _>("last_scan_at_ms")?
                    .map(millis)
                    .transpose()?,
                next_try_at: row
                    .try_get::<Option<i64>, _>("next_try_at_ms")?
                    .map(millis)
                    .transpose()?,
                chain_read_until: row
                    .try_get::<Option<i64>, _>("chain_read_until_ms")?
                    .map(millis)
                    .transpose()?,
                active_source: row.try_get("active_source")?,
                updated_at: millis(row.try_get("updated_at_ms")?)?,
            })
        })
        .collect()
}

/// An intent that is waiting on something, for the stuck view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WaitingIntent {
    pub id: String,
    pub order_ref: String,
    pub method: String,
    pub status: String,
    pub since_ms: i64,
}

/// Intents the customer marked paid before `before_ms` on which nothing was ever seen.
pub(crate) async fn marked_paid_unseen(
    conn: &mut AnyConnection,
    before_ms: i64,
    after: (i64, &str),
    limit: i64,
) -> Result<Vec<WaitingIntent>, StoreError> {
    waiting(
        sqlx::query(
            "SELECT id, order_ref, method, status, marked_paid_at_ms AS since_ms FROM payment_intents \
             WHERE marked_paid_at_ms IS NOT NULL AND marked_paid_at_ms < $1 AND first_seen_at_ms IS NULL \
             AND status IN ('awaiting_payment', 'expired') \
             AND (marked_paid_at_ms > $2 OR (marked_paid_at_ms = $2 AND id > $3)) \
             ORDER BY marked_paid_at_ms, id LIMIT $4",
        )
        .bind(before_ms)
        .bind(after.0)
        .bind(after.1)
        .bind(limit)
        .fetch_all(conn)
        .await?,
    )
}

/// Intents seen before `before_ms` whose payment is still not confirmed enough.
pub(crate) async fn seen_unconfirmed(
    conn: &mut AnyConnection,
    before_ms: i64,
    after: (i64, &str),
    limit: i64,
) -> Result<Vec<WaitingIntent>, StoreError> {
    waiting(
        sqlx::query(
            "SELECT id, order_ref, method, status, first_seen_at_ms AS since_ms FROM payment_intents \
             WHERE status = 'seen' AND first_seen_at_ms < $1 \
             AND (first_seen_at_ms > $2 OR (first_seen_at_ms = $2 AND id > $3)) \
             ORDER BY first_seen_at_ms, id LIMIT $4",
        )
        .bind(before_ms)
        .bind(after.0)
        .bind(after.1)
        .bind(limit)
        .fetch_all(conn)
        .await?,
    )
}

fn waiting(rows: Vec<sqlx::any::AnyRow>) -> Result<Vec<WaitingIntent>, StoreError> {
    rows.iter()
        .map(|row| {
            Ok(WaitingIntent {
                id: row.try_get("id")?,
                order_ref: row.try_get("order_ref")?,
                method: row.try_get("method")?,
                status: row.try_get("status")?,
                since_ms: row.try_get("since_ms")?,
            })
        })
        .collect()
}

/// An event of the outbox, with the stream its deliveries are ordered in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OutboxEvent {
    pub seq: i64,
    pub stream: String,
}

/// Copies undispatched events into every endpoint's deliveries and marks them dispatched,
/// in one transaction (the caller's). Returns how many events were dispatched.
pub(crate) async fn dispatch_events(
    conn: &mut AnyConnection,
    endpoints: &[(String, chrono::Duration)],
    limit: i64,
    now: DateTime<Utc>,
) -> Result<usize, StoreError> {
    let rows = sqlx::query(
        "SELECT seq, COALESCE(intent_id, order_ref, 'shop') AS stream FROM intent_events \
         WHERE dispatched_at_ms IS NULL ORDER BY seq LIMIT $1",
    )
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    let events: Vec<OutboxEvent> = rows
        .iter()
        .map(|row| {
            Ok(OutboxEvent {
                seq: row.try_get("seq")?,
                stream: row.try_get("stream")?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    for event in &events {
        for (endpoint, give_up_after) in endpoints {
            sqlx::query(
                "INSERT INTO webhook_deliveries (endpoint, event_seq, stream, state, attempts, next_attempt_at_ms, give_up_at_ms) \
                 VALUES ($1, $2, $3, 'pending', 0, $4, $5) ON CONFLICT (endpoint, event_seq) DO NOTHING",
            )
            .bind(endpoint.as_str())
            .bind(event.seq)
            .bind(event.stream.as_str())
            .bind(now.timestamp_millis())
            .bind((now + *give_up_after).timestamp_millis())
            .execute(&mut *conn)
            .await?;
        }
        sqlx::query("UPDATE intent_events SET dispatched_at_ms = $2 WHERE seq = $1")
            .bind(event.seq)
            .bind(now.timestamp_millis())
            .execute(&mut *conn)
            .await?;
    }
    Ok(events.len())
}

/// A delivery that is due, with the event it carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DueDelivery {
    pub event_seq: i64,
    pub attempts: i64,
    pub give_up_at_ms: i64,
    pub intent_id: Option<String>,
    pub order_ref: Option<String>,
    pub kind: String,
    pub detail: String,
    pub at_ms: i64,
}

/// Deliveries of `endpoint` due now: per stream only the oldest pending one, so a stream's
/// events go out in order and one at a time.
pub(crate) async fn due_deliveries(
    conn: &mut AnyConnection,
    endpoint: &str,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<DueDelivery>, StoreError> {
    let rows = sqlx::query(
        "SELECT d.event_seq, d.attempts, d.give_up_at_ms, e.intent_id, e.order_ref, e.kind, e.detail, e.at_ms \
         FROM webhook_deliveries d JOIN intent_events e ON e.seq = d.event_seq \
         WHERE d.endpoint = $1 AND d.state = 'pending' AND d.next_attempt_at_ms <= $2 \
         AND NOT EXISTS (SELECT 1 FROM webhook_deliveries o WHERE o.endpoint = d.endpoint \
             AND o.stream = d.stream AND o.state = 'pending' AND o.event_seq < d.event_seq) \
         ORDER BY d.event_seq LIMIT $3",
    )
    .bind(endpoint)
    .bind(now.timestamp_millis())
    .bind(limit)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(DueDelivery {
                event_seq: row.try_get("event_seq")?,
                attempts: row.try_get("attempts")?,
                give_up_at_ms: row.try_get("give_up_at_ms")?,
                intent_id: row.try_get("intent_id")?,
                order_ref: row.try_get("order_ref")?,
                kind: row.try_get("kind")?,
                detail: row.try_get("detail")?,
                at_ms: row.try_get("at_ms")?,
            })
        })
        .collect()
}

/// Records a delivery's outcome: delivered, retried at `next_attempt_ms`, or abandoned.
pub(crate) async fn finish_delivery(
    conn: &mut AnyConnection,
    endpoint: &str,
    event_seq: i64,
    state: &str,
    next_attempt_ms: i64,
    error: Option<&str>,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE webhook_deliveries SET state = $3, attempts = attempts + 1, next_attempt_at_ms = $4, \
         last_error = $5, delivered_at_ms = CASE WHEN $3 = 'delivered' THEN $6 ELSE delivered_at_ms END \
         WHERE endpoint = $1 AND event_seq = $2 AND state = 'pending'",
    )
    .bind(endpoint)
    .bind(event_seq)
    .bind(state)
    .bind(next_attempt_ms)
    .bind(error)
    .bind(now.timestamp_millis())
    .execute(conn)
    .await?;
    Ok(())
}

/// Queues every delivery of `endpoint` from `from_seq` on again (an operator's replay).
/// Returns how many.
pub(crate) async fn replay_deliveries(
    conn: &mut AnyConnection,
    endpoint: &str,
    from_seq: i64,
    now: DateTime<Utc>,
    give_up_after: chrono::Duration,
) -> Result<u64, StoreError> {
    let result = sqlx::query(
        "UPDATE webhook_deliveries SET state = 'pending', attempts = 0, next_attempt_at_ms = $3, \
         give_up_at_ms = $4, last_error = NULL WHERE endpoint = $1 AND event_seq >= $2",
    )
    .bind(endpoint)
    .bind(from_seq)
    .bind(now.timestamp_millis())
    .bind((now + give_up_after).timestamp_millis())
    .execute(conn)
    .await?;
    Ok(result.rows_affected())
}

/// Endpoints with deliveries retrying or abandoned, by name.
pub(crate) async fn failing_endpoints(
    conn: &mut AnyConnection,
) -> Result<Vec<FailingEndpoint>, StoreError> {
    let rows = sqlx::query(
        "SELECT d.endpoint, \
           SUM(CASE WHEN d.state = 'pending' THEN 1 ELSE 0 END) AS retrying, \
           SUM(CASE WHEN d.state = 'abandoned' THEN 1 ELSE 0 END) AS abandoned, \
           MIN(d.event_seq) AS oldest_seq \
         FROM webhook_deliveries d \
         WHERE d.state <> 'delivered' AND (d.state = 'abandoned' OR d.attempts > 0) \
         GROUP BY d.endpoint ORDER BY d.endpoint",
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut failing = Vec::with_capacity(rows.len());
    for row in rows {
        let endpoint: String = row.try_get("endpoint")?;
        let oldest_event_seq: i64 = row.try_get("oldest_seq")?;
        let oldest = sqlx::query(
            "SELECT e.at_ms, d.last_error FROM webhook_deliveries d \
             JOIN intent_events e ON e.seq = d.event_seq WHERE d.endpoint = $1 AND d.event_seq = $2",
        )
        .bind(endpoint.as_str())
        .bind(oldest_event_seq)
        .fetch_one(&mut *conn)
        .await?;
        failing.push(FailingEndpoint {
            endpoint,
            retrying: row.try_get("retrying")?,
            abandoned: row.try_get("abandoned")?,
            oldest_event_seq,
            oldest_event_at_ms: oldest.try_get("at_ms")?,
            last_error: oldest.try_get("last_error")?,
        });
    }
    Ok(failing)
}

/// Deliveries per endpoint and state, for metrics and the operators.
pub(crate) async fn delivery_counts(
    conn: &mut AnyConnection,
) -> Result<Vec<(String, String, i64)>, StoreError> {
    let rows = sqlx::query(
        "SELECT endpoint, state, COUNT(*) AS n FROM webhook_deliveries GROUP BY endpoint, state ORDER BY endpoint, state",
    )
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            Ok((
                row.try_get("endpoint")?,
                row.try_get("state")?,
                row.try_get("n")?,
            ))
        })
        .collect()
}
