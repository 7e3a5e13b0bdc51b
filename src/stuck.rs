//! The operators' view of what is stuck: payments the customer says they sent that never
//! showed, payments that do not confirm, open exceptions, watchers behind or failing, stale
//! rates. Each row says what happened, since when and what can be done.

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::engine::Engine;
use crate::error::Error;
use crate::store::operations::{self, WatcherHealth};

/// When waiting turns into stuck.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StuckOptions {
    /// A customer's "I have paid" with nothing seen for this long.
    pub marked_paid_unseen: Duration,
    /// A payment seen but not confirmed for this long.
    pub seen_unconfirmed: Duration,
    /// A watcher that wrote no health for this long is not running.
    pub watcher_silent: Duration,
    /// A watcher this many blocks behind the node's head is behind.
    pub watcher_lag_blocks: u64,
}

impl Default for StuckOptions {
    fn default() -> StuckOptions {
        StuckOptions {
            marked_paid_unseen: Duration::minutes(30),
            seen_unconfirmed: Duration::hours(2),
            watcher_silent: Duration::minutes(5),
            watcher_lag_blocks: 20,
        }
    }
}

/// One thing an operator should look at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StuckItem {
    /// marked_paid_unseen, seen_unconfirmed, exception, watcher or rates.
    pub category: &'static str,
    /// The exception kind, watcher state or intent status.
    pub kind: String,
    /// The exception id, intent id, network or asset.
    pub subject: String,
    /// The order concerned, if any.
    pub order_ref: Option<String>,
    /// What happened, for people.
    pub what: String,
    /// Since when.
    pub since: DateTime<Utc>,
    /// What can be done about it.
    pub actions: Vec<&'static str>,
}

impl Engine {
    /// Everything stuck now, oldest first within each category.
    pub async fn stuck(&self, options: &StuckOptions) -> Result<Vec<StuckItem>, Error> {
        let now = self.clock().now();
        let mut conn = self.store().pool().acquire().await?;
        let mut items = Vec::new();
        let since = |ms: i64| DateTime::from_timestamp_millis(ms).unwrap_or(now);
        for intent in operations::marked_paid_unseen(
            &mut conn,
            (now - options.marked_paid_unseen).timestamp_millis(),
        )
        .await?
        {
            items.push(StuckItem {
                category: "marked_paid_unseen",
                kind: intent.status.clone(),
                what: format!(
                    "the customer marked {} ({}) paid; nothing arrived on chain",
                    intent.id, intent.method
                ),
                subject: intent.id,
                order_ref: Some(intent.order_ref),
                since: since(intent.since_ms),
                actions: vec![
                    "ask the customer for the transaction id and check it in a block explorer",
                    "check that the watcher of the network is running",
                ],
            });
        }
        for intent in operations::seen_unconfirmed(
            &mut conn,
            (now - options.seen_unconfirmed).timestamp_millis(),
        )
        .await?
        {
            items.push(StuckItem {
                category: "seen_unconfirmed",
                kind: intent.status.clone(),
                what: format!(
                    "a payment to {} ({}) was seen but has not confirmed",
                    intent.id, intent.method
                ),
                subject: intent.id,
                order_ref: Some(intent.order_ref),
                since: since(intent.since_ms),
                actions: vec![
                    "wait: a low fee can keep a transaction unconfirmed for hours",
                    "if it was dropped, the customer can pay again to the same instructions",
                ],
            });
        }
        for exception in operations::open_exceptions(&mut conn).await? {
            items.push(StuckItem {
                category: "exception",
                actions: exception_actions(&exception.kind),
                kind: exception.kind,
                subject: exception.id,
                order_ref: exception.order_ref,
                what: exception.detail,
                since: exception.opened_at,
            });
        }
        for health in operations::watcher_health(&mut conn).await? {
            if let Some(item) = watcher_item(&health, options, now) {
                items.push(item);
            }
        }
        drop(conn);
        items.extend(self.stale_rates(now).await);
        Ok(items)
    }

    /// Every watcher's last written health.
    pub async fn watcher_health(&self) -> Result<Vec<WatcherHealth>, Error> {
        let mut conn = self.store().pool().acquire().await?;
        Ok(operations::watcher_health(&mut conn).await?)
    }

    /// Payment intents per state.
    pub async fn intents_by_status(&self) -> Result<Vec<(String, i64)>, Error> {
        let mut conn = self.store().pool().acquire().await?;
        Ok(operations::intents_by_status(&mut conn).await?)
    }

    /// Open exceptions per kind.
    pub async fn open_exceptions_by_kind(&self) -> Result<Vec<(String, i64)>, Error> {
        let mut conn = self.store().pool().acquire().await?;
        Ok(operations::open_exceptions_by_kind(&mut conn).await?)
    }

    /// Records a watcher's health (the watcher loop calls it after every round).
    pub async fn record_watcher_health(&self, health: &WatcherHealth) -> Result<(), Error> {
        let mut conn = self.store().pool().acquire().await?;
        Ok(operations::put_watcher_health(&mut conn, health).await?)
    }

    /// A row per enabled asset whose rate cannot be locked now.
    async fn stale_rates(&self, now: DateTime<Utc>) -> Vec<StuckItem> {
        let settings = self.payment_settings();
        let Some(rates) = &settings.rates else {
            return Vec::new();
        };
        let assets: BTreeSet<_> = settings.enabled.iter().map(|m| m.asset()).collect();
        let mut items = Vec::new();
        for asset in assets {
            if let Err(error) = rates.rate(asset, now).await {
                items.push(StuckItem {
                    category: "rates",
                    kind: "stale".into(),
                    subject: asset.to_string(),
                    order_ref: None,
                    what: format!("no usable {asset} rate: {error}; new payment instructions in {asset} are refused"),
                    since: now,
                    actions: vec!["check the rate sources and their API keys"],
                });
            }
        }
        items
    }
}

/// What an operator can do about an exception of `kind`.
fn exception_actions(kind: &str) -> Vec<&'static str> {
    match kind {
        "underpaid" | "paid_late" => vec!["accept_as_paid", "credit_balance", "mark_refunded"],
        "overpaid" | "paid_after_settlement" | "wrong_asset" | "unmatched" => {
            vec!["credit_balance", "mark_refunded", "dismiss"]
        }
        _ => vec!["dismiss"],
    }
}

/// A row for a watcher that is failing, silent or behind; `None` when it is healthy.
fn watcher_item(
    health: &WatcherHealth,
    options: &StuckOptions,
    now: DateTime<Utc>,
) -> Option<StuckItem> {
    let lag = match (health.head_height, health.cursor_height) {
        (Some(head), Some(cursor)) => head.saturating_sub(cursor),
        _ => 0,
    };
    let (kind, what, since, actions) = if health.state == "retrying" || health.state == "stopped" {
        (
            health.state.clone(),
            format!(
                "the {} watcher is {}: {}",
                health.network,
                health.state,
                health.last_error.as_deref().unwrap_or("shut down")
            ),
            health.last_scan_at.unwrap_or(health.updated_at),
            vec![
                "check the node and the watcher's logs",
                "restart payrecon serve",
            ],
        )
    } else if now - health.updated_at > options.watcher_silent {
        (
            "silent".to_owned(),
            format!(
                "the {} watcher has not reported since {}",
                health.network,
                health.updated_at.to_rfc3339()
            ),
            health.updated_at,
            vec!["check that payrecon serve is running"],
        )
    } else if lag > options.watcher_lag_blocks {
        (
            "behind".to_owned(),
            format!(
                "the {} watcher is {lag} blocks behind the node",
                health.network
            ),
            health.last_scan_at.unwrap_or(health.updated_at),
            vec!["wait for it to catch up; if the lag grows, check the node's speed"],
        )
    } else {
        return None;
    };
    Some(StuckItem {
        category: "watcher",
        kind,
        subject: health.network.clone(),
        order_ref: None,
        what,
        since,
        actions,
    })
}
