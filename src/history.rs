//! An account's history for the shop: its orders and top-ups, every payment intent with its
//! status, and its balance statement (every movement with its journal entry and the running
//! balance), as one timeline ordered by time and read a page at a time. Keyed by the shop's
//! account id only: nothing else about a customer (an e-mail address) ever selects rows.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::engine::Engine;
use crate::error::Error;
use crate::ledger::{Account, Currency};
use crate::order::{AccountId, Order};
use crate::payments::PaymentInstructions;
use crate::store;

/// Items per page when the caller does not say.
pub(crate) const DEFAULT_HISTORY_PAGE: usize = 50;

/// The most items one page holds.
pub(crate) const MAX_HISTORY_PAGE: usize = 200;

/// One line of the timeline.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HistoryItem {
    /// A rental order or a top-up was recorded.
    Order {
        /// When payrecon recorded it.
        at: DateTime<Utc>,
        /// The order as it stands now.
        #[serde(flatten)]
        order: Box<Order>,
    },
    /// Payment instructions were handed out.
    Payment {
        /// When.
        at: DateTime<Utc>,
        /// The intent as it stands now (its status, superseded or not).
        #[serde(flatten)]
        payment: Box<PaymentInstructions>,
    },
    /// The balance moved.
    Balance {
        /// When the entry was posted.
        at: DateTime<Utc>,
        /// The journal entry's key.
        entry: String,
        /// Its kind (`topup_credit`, `balance_payment`, …).
        kind: String,
        /// The order or top-up it names.
        reference: String,
        /// Its memo.
        memo: String,
        /// What it added (negative: took away), USD.
        change_usd: String,
        /// The balance after it, USD.
        balance_usd: String,
    },
}

/// One page of an account's history.
#[derive(Clone, Debug, Serialize)]
pub struct AccountHistory {
    /// The shop's account id.
    pub account_id: AccountId,
    /// What the customer can spend now, USD.
    pub balance_usd: String,
    /// The page, oldest first.
    pub items: Vec<HistoryItem>,
    /// Pass as `after` for the next page; absent on the last.
    pub next: Option<String>,
}

/// Where an item sits in the timeline: time, then orders before their payments before the
/// balance movements they cause, then the item's own id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Position {
    at_ms: i64,
    rank: u8,
    id: String,
}

impl Position {
    fn cursor(&self) -> String {
        format!("{}.{}.{}", self.at_ms, self.rank, self.id)
    }

    /// A cursor given back by a caller: refused unless it is one this module wrote.
    fn parse(text: &str) -> Result<Position, Error> {
        let invalid = || Error::InvalidInput(format!("after: {text:?} is not a history cursor"));
        let mut parts = text.splitn(3, '.');
        let at_ms = parts
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(invalid)?;
        let rank = parts
            .next()
            .and_then(|p| p.parse().ok())
            .filter(|r| *r <= 2)
            .ok_or_else(invalid)?;
        let id = parts
            .next()
            .filter(|id| {
                !id.is_empty()
                    && id.len() <= 128
                    && id
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | ':'))
            })
            .ok_or_else(invalid)?;
        Ok(Position {
            at_ms,
            rank,
            id: id.to_owned(),
        })
    }
}

impl Engine {
    /// One page of `account`'s history: up to `limit` items after the cursor `after` (from
    /// the previous page's `next`), oldest first.
    pub async fn account_history(
        &self,
        account: &AccountId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<AccountHistory, Error> {
        if !(1..=MAX_HISTORY_PAGE).contains(&limit) {
            return Err(Error::InvalidInput(format!(
                "limit: 1 to {MAX_HISTORY_PAGE} items per page"
            )));
        }
        let after = after.map(Position::parse).transpose()?;
        let mut conn = self.db().pool().acquire().await?;
        let orders = store::orders::orders_of_account(&mut conn, account.as_str()).await?;
        let intents = store::payments::intents_of_account(&mut conn, account.as_str()).await?;
        let balance_account = Account::CustomerBalance(account.clone());
        let movements =
            store::ledger::movements(&mut conn, &balance_account, Currency::Usd).await?;
        drop(conn);

        let mut timeline: Vec<(Position, HistoryItem)> =
            Vec::with_capacity(orders.len() + intents.len() + movements.len());
        for stored in orders {
            let order = stored.order;
            timeline.push((
                Position {
                    at_ms: order.created_at.timestamp_millis(),
                    rank: 0,
                    id: order.reference.to_string(),
                },
                HistoryItem::Order {
                    at: order.created_at,
                    order: Box::new(order),
                },
            ));
        }
        for intent in intents {
            let at = intent.created_at;
            let id = intent.id.clone();
            timeline.push((
                Position {
                    at_ms: at.timestamp_millis(),
                    rank: 1,
                    id,
                },
                HistoryItem::Payment {
                    at,
                    payment: Box::new(self.instructions(intent)),
                },
            ));
        }
        // The customer's balance is the negated sum of the postings (credits are negative).
        let mut balance: i128 = 0;
        for movement in movements {
            balance -= movement.amount;
            let at =
                DateTime::<Utc>::from_timestamp_millis(movement.posted_at_ms).unwrap_or_default();
            timeline.push((
                Position {
                    at_ms: movement.posted_at_ms,
                    rank: 2,
                    id: format!("{:020}", movement.seq),
                },
                HistoryItem::Balance {
                    at,
                    entry: movement.key,
                    kind: movement.kind,
                    reference: movement.reference,
                    memo: movement.memo,
                    change_usd: Currency::Usd.format(-movement.amount),
                    balance_usd: Currency::Usd.format(balance),
                },
            ));
        }
        timeline.sort_by(|a, b| a.0.cmp(&b.0));
        let mut page: Vec<(Position, HistoryItem)> = timeline
            .into_iter()
            .filter(|(position, _)| after.as_ref().is_none_or(|after| position > after))
            .take(limit + 1)
            .collect();
        let next = (page.len() > limit).then(|| {
            page.truncate(limit);
            page.last().map(|(position, _)| position.cursor())
        });
        Ok(AccountHistory {
            account_id: account.clone(),
            balance_usd: self.available_balance(account).await?.to_string(),
            items: page.into_iter().map(|(_, item)| item).collect(),
            next: next.flatten(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_and_anything_else_is_refused() {
        let position = Position {
            at_ms: 1_764_000_000_000,
            rank: 1,
            id: "pi_01.x".into(),
        };
        assert_eq!(Position::parse(&position.cursor()).unwrap(), position);
        for bad in ["", "x.1.a", "1.3.a", "1.1.", "1.1.a b", "1.1.'--", "1"] {
            assert!(Position::parse(bad).is_err(), "{bad:?}");
        }
    }
}
