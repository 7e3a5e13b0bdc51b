//! An account's history for the shop: its orders and top-ups, every payment intent with its
//! status, and its balance statement (every movement with its journal entry and the running
//! balance), as one timeline ordered by time and read a page at a time. Keyed by the shop's
//! account id only: nothing else about a customer (an e-mail address) ever selects rows.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::Error;
use crate::order::{AccountId, Order};
use crate::payments::PaymentInstructions;

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
pub(crate) struct Position {
    pub(crate) at_ms: i64,
    pub(crate) rank: u8,
    pub(crate) id: String,
}

impl Position {
    pub(crate) fn cursor(&self) -> String {
        format!("{}.{}.{}", self.at_ms, self.rank, self.id)
    }

    /// A cursor given back by a caller: refused unless it is one this module wrote.
    pub(crate) fn parse(text: &str) -> Result<Position, Error> {
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
