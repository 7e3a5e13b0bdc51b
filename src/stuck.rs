//! The operators' view of what is stuck: payments the customer says they sent that never
//! showed, payments that do not confirm, open exceptions, watchers behind or failing, stale
//! rates. Each row says what happened, since when and what can be done.

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::engine::Engine;
use crate::error::Error;
use crate::store::operations::{self, FailingEndpoint, WatcherHealth};

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
    /// marked_paid_unseen, seen_unconfirmed, exception, watcher, webhook or rates.
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

/// The categories of the stuck view, in the order it lists them.
const CATEGORIES: [&str; 6] = [
    "marked_paid_unseen",
    "seen_unconfirmed",
    "exception",
    "watcher",
    "webhook",
    "rates",
];

/// Items of one `payrecon stuck` or `GET /v1/stuck` page at most.
pub const MAX_STUCK_PAGE: usize = 1_000;

/// Where a page of the stuck view starts: after this category, time and subject.
#[derive(Clone, Debug, PartialEq, Eq)]
struct StuckCursor {
    category: usize,
    since_ms: i64,
    subject: String,
}

impl StuckCursor {
    fn first() -> StuckCursor {
        StuckCursor {
            category: 0,
            since_ms: i64::MIN,
            subject: String::new(),
        }
    }

    fn after(item: &StuckItem) -> StuckCursor {
        StuckCursor {
            category: CATEGORIES
                .iter()
                .position(|c| *c == item.category)
                .unwrap_or(CATEGORIES.len()),
            since_ms: item.since.timestamp_millis(),
            subject: item.subject.clone(),
        }
    }

    fn parse(text: &str) -> Result<StuckCursor, Error> {
        let invalid = || Error::InvalidInput("after: not a cursor of the stuck view".into());
        let mut parts = text.splitn(3, '.');
        let (Some(category), Some(since), Some(subject)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid());
        };
        Ok(StuckCursor {
            category: category.parse().map_err(|_| invalid())?,
            since_ms: since.parse().map_err(|_| invalid())?,
            subject: subject.to_owned(),
        })
    }

    fn text(&self) -> String {
        format!("{}.{}.{}", self.category, self.since_ms, self.subject)
    }

    /// Whether `item` of category `category` comes after this cursor.
    fn precedes(&self, category: usize, item: &StuckItem) -> bool {
        (
            category,
            item.since.timestamp_millis(),
            item.subject.as_str(),
        ) > (self.category, self.since_ms, self.subject.as_str())
    }

    /// The keyset bound of `category`'s query: after the cursor inside its own category,
    /// from the start in a later one.
    fn within(&self, category: usize) -> (i64, &str) {
        if category == self.category {
            (self.since_ms, self.subject.as_str())
        } else {
            (i64::MIN, "")
        }
    }
}

/// One page of a list, and the cursor of the next (`None` on the last).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Page<T> {
    /// The page's items, in the list's order.
    pub items: Vec<T>,
    /// Pass as `after` for the next page.
    pub next: Option<String>,
}

impl<T> Page<T> {
    /// `items` read with one more than `limit`: the extra one says a next page exists.
    pub(crate) fn of(mut items: Vec<T>, limit: usize, cursor: impl Fn(&T) -> String) -> Page<T> {
        let next = (items.len() > limit).then(|| {
            items.truncate(limit);
            items.last().map(&cursor)
        });
        Page {
            items,
            next: next.flatten(),
        }
    }
}

impl Engine {
    /// Everything stuck now, oldest first within each category: the first
    /// [`MAX_STUCK_PAGE`] items (`payrecon stuck`); [`Engine::stuck_page`] pages further.
    pub async fn stuck(&self, options: &StuckOptions) -> Result<Vec<StuckItem>, Error> {
        Ok(self.stuck_page(options, None, MAX_STUCK_PAGE).await?.items)
    }

    /// Up to `limit` stuck items after `after` (a previous page's `next`), each category
    /// read with a bound, so a backlog of thousands costs one page.
    pub async fn stuck_page(
        &self,
        options: &StuckOptions,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<StuckItem>, Error> {
        let limit = limit.clamp(1, MAX_STUCK_PAGE);
        let cursor = after
            .map(StuckCursor::parse)
            .transpose()?
            .unwrap_or_else(StuckCursor::first);
        let now = self.clock().now();
        let mut conn = self.db().pool().acquire().await?;
        let mut items = Vec::new();
        let since = |ms: i64| DateTime::from_timestamp_millis(ms).unwrap_or(now);
        // One more than the page: the extra item says a next page exists.
        let wanted = |items: &Vec<StuckItem>| (limit + 1).saturating_sub(items.len()) as i64;
        if cursor.category == 0 {
            for intent in operations::marked_paid_unseen(
                &mut conn,
                (now - options.marked_paid_unseen).timestamp_millis(),
                cursor.within(0),
                wanted(&items),
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
        }
        if cursor.category <= 1 && wanted(&items) > 0 {
            for intent in operations::seen_unconfirmed(
                &mut conn,
                (now - options.seen_unconfirmed).timestamp_millis(),
                cursor.within(1),
                wanted(&items),
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
        }
        if cursor.category <= 2 && wanted(&items) > 0 {
            let bound = cursor.within(2);
            for exception in operations::open_exceptions(&mut conn, bound, wanted(&items)).await? {
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
        }
        if wanted(&items) > 0 {
            // The few rows of watchers, webhook endpoints and rates, ordered like the rest.
            let mut few = Vec::new();
            for health in operations::watcher_health(&mut conn).await? {
                few.extend(watcher_item(&health, options, now));
            }
            for failing in operations::failing_endpoints(&mut conn).await? {
                few.push(webhook_item(failing, now));
            }
            drop(conn);
            few.extend(self.stale_rates(now).await);
            let mut few: Vec<(usize, StuckItem)> = few
                .into_iter()
                .map(|item| (StuckCursor::after(&item).category, item))
                .filter(|(category, item)| cursor.precedes(*category, item))
                .collect();
            few.sort_by(|(ca, a), (cb, b)| {
                (ca, a.since, &a.subject).cmp(&(cb, b.since, &b.subject))
            });
            items.extend(few.into_iter().map(|(_, item)| item));
        }
        Ok(Page::of(items, limit, |item| {
            StuckCursor::after(item).text()
        }))
    }

    /// Every watcher's last written health.
    pub async fn watcher_health(&self) -> Result<Vec<WatcherHealth>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(operations::watcher_health(&mut conn).await?)
    }

    /// Payment intents per state.
    pub async fn intents_by_status(&self) -> Result<Vec<(String, i64)>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(operations::intents_by_status(&mut conn).await?)
    }

    /// Open exceptions per kind.
    pub async fn open_exceptions_by_kind(&self) -> Result<Vec<(String, i64)>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(operations::open_exceptions_by_kind(&mut conn).await?)
    }

    /// Records a watcher's health (the watcher loop calls it after every round).
    pub async fn record_watcher_health(&self, health: &WatcherHealth) -> Result<(), Error> {
        let mut conn = self.db().pool().acquire().await?;
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

/// A row for a webhook endpoint whose deliveries fail or were given up: the shop is not
/// hearing about payments, so nothing it provisions on them happens.
fn webhook_item(failing: FailingEndpoint, now: DateTime<Utc>) -> StuckItem {
    let kind = if failing.abandoned > 0 {
        "abandoned"
    } else {
        "failing"
    };
    let since = DateTime::from_timestamp_millis(failing.oldest_event_at_ms).unwrap_or(now);
    let error = failing
        .last_error
        .as_deref()
        .map(|e| format!(" (last attempt: {e})"))
        .unwrap_or_default();
    StuckItem {
        category: "webhook",
        kind: kind.to_owned(),
        what: format!(
            "webhook endpoint {}: {} deliveries retrying, {} given up; the oldest undelivered is evt_{} of {}{error}",
            failing.endpoint,
            failing.retrying,
            failing.abandoned,
            failing.oldest_event_seq,
            since.to_rfc3339()
        ),
        subject: failing.endpoint,
        order_ref: None,
        since,
        actions: vec![
            "check that the receiver answers 2xx at its configured url within timeout_ms (redirects count as failures)",
            "once it does, retrying deliveries go out by themselves; given-up ones need `payrecon webhook replay --endpoint <name> --from-seq <oldest>`",
        ],
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
    let error = health.last_error.as_deref().unwrap_or("shut down");
    let since = health.last_scan_at.unwrap_or(health.updated_at);
    let (kind, what, since, actions) = if health.state == "stopped"
        && error.starts_with("wrong chain")
    {
        (
            "wrong_chain".to_owned(),
            format!(
                "the {} watcher is stopped for good: {error}",
                health.network
            ),
            since,
            vec![
                "point the network's URL at a node of the configured chain, or correct the configured network or chain id",
                "then restart payrecon serve: until then no payment on this network is seen",
            ],
        )
    } else if let (true, Some(next_try_at)) = (health.state == "stopped", health.next_try_at) {
        (
            health.state.clone(),
            format!(
                "the {} watcher is stopped: {error}; next try at {}",
                health.network,
                next_try_at.to_rfc3339()
            ),
            since,
            vec![
                "check the node (or what stands between payrecon and it) and the watcher's logs",
                "it tries again by itself; restarting payrecon serve tries at once",
            ],
        )
    } else if health.state == "retrying" || health.state == "stopped" {
        (
            health.state.clone(),
            format!(
                "the {} watcher is {}: {error}",
                health.network, health.state
            ),
            since,
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
