//! The operators' view of what is stuck: payments the customer says they sent that never
//! showed, payments that do not confirm, open exceptions, watchers behind or failing, stale
//! rates. Each row says what happened, since when and what can be done.

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::error::Error;
use crate::payments::PaymentSettings;
use crate::records::{FailingEndpoint, RefundState, WatcherHealth};
use crate::wallet::WalletExport;

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
    /// A refund asked for and not approved, or approved and not sent, for this long.
    pub refund_waiting: Duration,
}

impl Default for StuckOptions {
    fn default() -> StuckOptions {
        StuckOptions {
            marked_paid_unseen: Duration::minutes(30),
            seen_unconfirmed: Duration::hours(2),
            watcher_silent: Duration::minutes(5),
            watcher_lag_blocks: 20,
            refund_waiting: Duration::hours(24),
        }
    }
}

/// One thing an operator should look at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StuckItem {
    /// marked_paid_unseen, seen_unconfirmed, exception, watcher, webhook, rates or wallet.
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
const CATEGORIES: [&str; 9] = [
    "marked_paid_unseen",
    "seen_unconfirmed",
    "exception",
    "refund",
    "watcher",
    "webhook",
    "rates",
    "books",
    "wallet",
];

/// Items of one `payrecon stuck` or `GET /v1/stuck` page at most.
pub const MAX_STUCK_PAGE: usize = 1_000;

/// Where a page of the stuck view starts: after this category, time and subject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StuckCursor {
    pub(crate) category: usize,
    pub(crate) since_ms: i64,
    pub(crate) subject: String,
}

impl StuckCursor {
    pub(crate) fn first() -> StuckCursor {
        StuckCursor {
            category: 0,
            since_ms: i64::MIN,
            subject: String::new(),
        }
    }

    pub(crate) fn after(item: &StuckItem) -> StuckCursor {
        StuckCursor {
            category: CATEGORIES
                .iter()
                .position(|c| *c == item.category)
                .unwrap_or(CATEGORIES.len()),
            since_ms: item.since.timestamp_millis(),
            subject: item.subject.clone(),
        }
    }

    pub(crate) fn parse(text: &str) -> Result<StuckCursor, Error> {
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

    pub(crate) fn text(&self) -> String {
        format!("{}.{}.{}", self.category, self.since_ms, self.subject)
    }

    /// Whether `item` of category `category` comes after this cursor.
    pub(crate) fn precedes(&self, category: usize, item: &StuckItem) -> bool {
        (
            category,
            item.since.timestamp_millis(),
            item.subject.as_str(),
        ) > (self.category, self.since_ms, self.subject.as_str())
    }

    /// The keyset bound of `category`'s query: after the cursor inside its own category,
    /// from the start in a later one.
    pub(crate) fn within(&self, category: usize) -> (i64, &str) {
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

/// A row when a wallet restored from `network`'s account key, at its default gap limit, would
/// miss paid addresses: the merchant must import with a wider one.
pub(crate) fn wallet_gap_item(
    export: &WalletExport,
    warning: u32,
    now: DateTime<Utc>,
) -> Option<StuckItem> {
    (export.gap_limit_needed > warning).then(|| StuckItem {
        category: "wallet",
        kind: "gap_limit".into(),
        subject: export.network.to_string(),
        order_ref: None,
        what: format!(
            "a wallet restored from the {} account needs a gap limit of {} to find every paid address ({} unpaid in a row); the threshold is {warning}",
            export.network, export.gap_limit_needed, export.largest_unfunded_run
        ),
        since: now,
        actions: vec![
            "run `payrecon wallet export` and import with its recommended gap limit",
            "set the gap limit in the merchant's wallet (Electrum, Sparrow) at least that high",
        ],
    })
}

/// A row per retired account key that still holds money: the merchant's wallet must import
/// that key too, or the money stays where only payrecon sees it.
pub(crate) fn retired_key_items(
    totals: &[crate::wallet::HoldingKeyTotal],
    now: DateTime<Utc>,
) -> Vec<StuckItem> {
    let mut held: std::collections::BTreeMap<(&str, &str), Vec<String>> = Default::default();
    for total in totals {
        if total.state == crate::keys::KeyState::Retired && total.addresses > 0 {
            held.entry((&total.network, &total.key_id))
                .or_default()
                .push(format!(
                    "{} {}",
                    total.amount_decimal.as_deref().unwrap_or(&total.amount),
                    total.asset.to_uppercase()
                ));
        }
    }
    held.into_iter()
        .map(|((network, key_id), amounts)| StuckItem {
            category: "wallet",
            kind: "retired_key_holds".into(),
            subject: key_id.to_owned(),
            order_ref: None,
            what: format!(
                "the retired {network} key {key_id} still holds {}; payrecon keeps watching it, and a wallet that imports only the current key does not see this money",
                amounts.join(", ")
            ),
            since: now,
            actions: vec![
                "run `payrecon wallet export --network <network> --key <key>` and import it into the merchant's wallet",
                "sweep the money to the treasury from that wallet",
            ],
        })
        .collect()
}

/// A row when entries wait for their fiat value past a valuation pass: their month cannot
/// close until they have one.
pub(crate) fn unvalued_item(count: u64, oldest: DateTime<Utc>) -> StuckItem {
    StuckItem {
        category: "books",
        kind: "unvalued".into(),
        subject: format!("{count} entries"),
        order_ref: None,
        what: format!(
            "{count} ledger entries have no fiat value, the oldest booked at {}: their month cannot close",
            oldest.to_rfc3339()
        ),
        since: oldest,
        actions: vec![
            "see why with `payrecon books value` once the rate sources answer again",
            "value one by hand: `payrecon books value-by-hand --entry PR-… --usd-per-coin … --reason …`",
        ],
    }
}

/// A row per enabled asset whose rate cannot be locked now.
pub(crate) async fn stale_rates(settings: &PaymentSettings, now: DateTime<Utc>) -> Vec<StuckItem> {
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

/// A row for a webhook endpoint whose deliveries fail or were given up: the shop is not
/// hearing about payments, so nothing it provisions on them happens.
pub(crate) fn webhook_item(failing: FailingEndpoint, now: DateTime<Utc>) -> StuckItem {
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

/// The last holdings check of a network, when it found money no receipt explains or could not
/// run; `None` when it found the chain and the records agreeing.
pub(crate) fn holdings_check_item(check: crate::records::HoldingsCheck) -> Option<StuckItem> {
    let what = match (&check.error, check.unexplained) {
        (Some(error), _) => format!("the holdings check could not read the chain: {error}"),
        (None, 0) => return None,
        (None, found) => format!(
            "the holdings check read {} addresses at block {} and found {found} balances no \
             receipt explains: each booked and held in a holdings_difference exception",
            check.addresses_checked,
            check.block_height.unwrap_or_default()
        ),
    };
    Some(StuckItem {
        category: "wallet",
        kind: "holdings_check".into(),
        subject: check.network,
        order_ref: None,
        what,
        since: check.checked_at,
        actions: vec![
            "look each holdings_difference exception up in a block explorer: a payment made while nothing watched the address, or a withdrawal or block reward",
            "check that the network's node serves eth_call at past blocks (payrecon doctor)",
        ],
    })
}

/// A refund waiting past `options.refund_waiting`: for an operator's approval, or, approved,
/// for the merchant's wallet to send it, or, sent, for the depth that completes it; `None`
/// otherwise.
pub(crate) fn refund_item(
    refund: &crate::records::Refund,
    options: &StuckOptions,
    now: DateTime<Utc>,
) -> Option<StuckItem> {
    if now - refund.updated_at < options.refund_waiting {
        return None;
    }
    let amount = refund.method.format_with_asset(refund.amount);
    let (what, actions) = match refund.state {
        RefundState::Requested => (
            format!(
                "a refund of {amount} to {} waits for an operator's approval",
                refund.address
            ),
            vec![
                "check the address with the customer, then payrecon refund approve",
                "or payrecon refund cancel, saying why",
            ],
        ),
        RefundState::Approved | RefundState::Prepared => (
            format!(
                "an approved refund of {amount} to {} has not been sent",
                refund.address
            ),
            vec![
                "payrecon refund prepare, sign it in the merchant's wallet and broadcast it",
                "or, paid from another wallet, payrecon refund sent with the txid",
            ],
        ),
        RefundState::Sent => (
            format!(
                "a refund of {amount} to {} sent in {} is not yet as deep as it must be",
                refund.address,
                refund.txid.as_deref().unwrap_or("?")
            ),
            vec![
                "look the transaction up in a block explorer: a fee too low to be mined soon",
                "check the watcher's health (payrecon status)",
            ],
        ),
        RefundState::Completed | RefundState::Cancelled => return None,
    };
    Some(StuckItem {
        category: "refund",
        kind: format!("refund_{}", refund.state.as_str()),
        what,
        subject: refund.id.clone(),
        order_ref: refund.order_ref.clone(),
        since: refund.updated_at,
        actions,
    })
}

/// What an operator can do about an exception of `kind`.
pub(crate) fn exception_actions(kind: &str) -> Vec<&'static str> {
    match kind {
        "underpaid" | "paid_late" => vec!["accept_as_paid", "credit_balance", "mark_refunded"],
        "overpaid" | "paid_after_settlement" => {
            vec!["credit_balance", "mark_refunded", "dismiss"]
        }
        // Also what a gas top-up from the merchant's wallet looks like.
        "wrong_asset" | "unmatched" => vec![
            "credit_balance",
            "mark_refunded",
            "mark_own_funds",
            "dismiss",
        ],
        // Money found with no receipt can be its intent's payment; money missing holds nothing.
        "holdings_difference" => vec![
            "accept_as_paid",
            "credit_balance",
            "mark_refunded",
            "mark_own_funds",
            "dismiss",
        ],
        _ => vec!["dismiss"],
    }
}

/// A row for a watcher that is failing, silent or behind; `None` when it is healthy.
pub(crate) fn watcher_item(
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
    let what = match &health.active_source {
        Some(source) => format!("{what} (source {source})"),
        None => what,
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
