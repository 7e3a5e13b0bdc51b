//! Table statistics on PostgreSQL, kept fresh by payrecon itself.
//!
//! PostgreSQL plans each statement from its statistics of the tables. A table that grew
//! without being analyzed is planned as if it held a guess, and a set-based statement over
//! it (an `UPDATE … FROM (VALUES …)` of 64 orders, say) is then planned as a hash join over a
//! sequential scan of the whole table instead of 64 index probes. Measured on the payments
//! bench at 100k intents on a server with `autovacuum = off`: 4,915 sequential scans of
//! `payment_intents` reading 277M rows, settlement at 0.09 of its line (0.73 at 10k); after
//! `ANALYZE` the same statement plans as a nested loop over the index. Autovacuum's own
//! analyze fixes it too, when it is on and has caught up, which a burst of growth outruns.
//!
//! So a store on PostgreSQL runs a small keeper: every few seconds it asks which of its tables
//! changed by more than autovacuum's own threshold since their last analyze, and analyzes
//! those (`SKIP_LOCKED`: several processes never queue behind each other). With autovacuum
//! on and keeping up, it finds nothing to do.

use std::time::Duration;

use sqlx::AnyPool;

/// How often the keeper looks.
const CHECK_INTERVAL: Duration = Duration::from_secs(3);

/// Rows changed since the last analyze before a table is analyzed again: a fixed part and a
/// share of the table, as autovacuum's `analyze_threshold` and `analyze_scale_factor`.
const ANALYZE_BASE_ROWS: i64 = 500;
const ANALYZE_SHARE_PERCENT: i64 = 10;

/// The keeper's task; stopped when the last clone of its store is dropped.
#[derive(Debug)]
pub(crate) struct StatisticsKeeper(tokio::task::JoinHandle<()>);

impl Drop for StatisticsKeeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl StatisticsKeeper {
    /// Starts the keeper for the tables of the schema `pool`'s connections use.
    pub(crate) fn start(pool: AnyPool) -> StatisticsKeeper {
        StatisticsKeeper(tokio::spawn(async move {
            loop {
                tokio::time::sleep(CHECK_INTERVAL).await;
                if let Err(error) = analyze_stale(&pool).await {
                    tracing::debug!(%error, "table statistics check failed; next time");
                }
            }
        }))
    }
}

/// Analyzes the tables that changed past the threshold since their last analyze.
async fn analyze_stale(pool: &AnyPool) -> Result<(), sqlx::Error> {
    let stale: Vec<String> = sqlx::query_scalar(
        "SELECT relname::text FROM pg_stat_user_tables \
         WHERE schemaname = current_schema() AND n_mod_since_analyze > $1 + n_live_tup * $2 / 100",
    )
    .bind(ANALYZE_BASE_ROWS)
    .bind(ANALYZE_SHARE_PERCENT)
    .fetch_all(pool)
    .await?;
    for table in stale {
        // The name comes from the catalogue; quoted all the same.
        let quoted = format!("\"{}\"", table.replace('"', "\"\""));
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ANALYZE (SKIP_LOCKED) {quoted}"
        )))
        .execute(pool)
        .await?;
        tracing::debug!(%table, "analyzed");
    }
    Ok(())
}
