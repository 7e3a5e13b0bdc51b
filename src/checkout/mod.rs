//! The customer's checkout page: what one payment intent asks for and where it stands, as the
//! customer sees it by following the page's link, `/pay/<checkout_key>`. The page is public,
//! so it answers to the intent's random checkout key only (never its id), shows nothing the
//! customer does not already hold, and its one write is "I have paid", which credits nothing.
//!
//! This module decides what to show; [`page`] says it in the customer's language.

pub(crate) mod page;

use chrono::{DateTime, Utc};
use payrecon_chain_core::ReceivedAsset;

use crate::error::Error;
use crate::intent::{ChainRead, IntentStatus, PaymentIntent};
use crate::payments::PaymentInstructions;
use crate::records::StoredTransfer;
use crate::store::payments::{self};

/// A checkout key is 32 lowercase hexadecimal digits (a v4 UUID without dashes).
const CHECKOUT_KEY_LEN: usize = 32;

/// One intent as its checkout page shows it.
#[derive(Clone, Debug)]
pub struct Checkout {
    /// The instructions: amount, asset, address and payment URI.
    pub instructions: PaymentInstructions,
    /// Where it stands; what the live status pushes.
    pub status: CheckoutStatus,
    /// What arrived at the instructions' address, first seen first: the record a closed page
    /// keeps beside its instructions.
    pub arrived: Vec<Arrived>,
    /// Money of this payment the customer may ask back (overpaid, late, another asset, …)
    /// and has not yet: the page offers the refund form.
    pub refundable: bool,
    /// The refunds of this payment's money, oldest first, as the page shows them.
    pub refunds: Vec<crate::records::Refund>,
    /// The network's block explorer page of a transaction (`{txid}` where its id goes), where
    /// one is configured: a sent refund links there.
    pub explorer: Option<String>,
}

/// One payment that arrived, as the customer reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrived {
    /// Amount and asset (`1.3 LTC`).
    pub amount: String,
    /// The method it was paid in, for its network's name.
    pub method: payrecon_chain_core::Method,
    /// The transaction, as the chain's explorers print it.
    pub txid: String,
    /// Its page on the network's block explorer, where one is configured.
    pub explorer_url: Option<String>,
    /// When it was first seen (its block's time when first seen in a block).
    pub received_at: DateTime<Utc>,
    /// Its confirmations at the last observation.
    pub confirmations: u32,
}

impl Arrived {
    /// What arrived of `transfers`: the shop's methods' receipts still on the chain (another
    /// token is nobody's payment), with `explorer`'s page (`{txid}` replaced) of each.
    pub(crate) fn of(transfers: &[StoredTransfer], explorer: Option<&str>) -> Vec<Arrived> {
        let mut arrived: Vec<Arrived> = transfers
            .iter()
            .filter(|t| !t.removed)
            .filter_map(|t| {
                let ReceivedAsset::Method { method } = t.asset else {
                    return None;
                };
                Some(Arrived {
                    amount: method.format_with_asset(t.amount),
                    method,
                    txid: t.id.txid.clone(),
                    explorer_url: explorer.map(|url| url.replace("{txid}", &t.id.txid)),
                    received_at: DateTime::from_timestamp_millis(t.seen_at_ms)?,
                    confirmations: t.confirmations,
                })
            })
            .collect();
        arrived.sort_by_key(|a| a.received_at);
        arrived
    }
}

/// Where a checkout stands, in the terms the customer reads. Equal snapshots read the same,
/// so the live status sends one only when it changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckoutStatus {
    /// The intent's status; `expired` as soon as the deadline passed with nothing seen and
    /// the chain was read past it, before the deadline tick writes it.
    pub status: IntentStatus,
    /// The deadline passed but the chain was not yet read past it (a source down or behind):
    /// the page says the shop is checking the network, never that the payment expired.
    pub checking_network: bool,
    /// For a payment on its way: the confirmations of the least confirmed transfer paying it,
    /// and how many settling needs.
    pub confirmations: Option<(u32, u32)>,
    /// Whether the customer may still pay these instructions: deadline ahead and not paid.
    /// Only then does the page show the address, the amount and the QR code.
    pub open: bool,
    /// The customer said "I have paid".
    pub marked_paid: bool,
    /// The shop issued newer instructions for the same order.
    pub superseded: bool,
}

impl CheckoutStatus {
    /// Nothing will change what the page shows: the payment settled. (An expired page can
    /// still learn of late money, so it is not final.)
    pub fn is_final(&self) -> bool {
        self.status == IntentStatus::Settled
    }

    /// Whether "I have paid" is worth offering: nothing seen yet and not said before.
    pub fn offers_paid_button(&self) -> bool {
        !self.marked_paid
            && matches!(
                self.status,
                IntentStatus::AwaitingPayment | IntentStatus::Expired
            )
    }

    /// What the page code and the live status call it: the intent's status, or `checking`.
    pub fn code(&self) -> &'static str {
        if self.checking_network {
            "checking"
        } else {
            self.status.as_str()
        }
    }

    pub(crate) fn of(
        intent: &PaymentIntent,
        transfers: &[StoredTransfer],
        required: u32,
        now: DateTime<Utc>,
        read: ChainRead,
    ) -> Self {
        let before_deadline = now < intent.deadline;
        let status = match intent.status {
            IntentStatus::AwaitingPayment if read.passed(intent.deadline, now) => {
                IntentStatus::Expired
            }
            status => status,
        };
        let paying = ReceivedAsset::Method {
            method: intent.method,
        };
        let confirmations = (status == IntentStatus::Seen).then(|| {
            let least = transfers
                .iter()
                .filter(|t| !t.removed && t.asset == paying)
                .map(|t| t.confirmations)
                .min()
                .unwrap_or(0);
            (least.min(required), required)
        });
        CheckoutStatus {
            status,
            checking_network: read.checking(intent, now),
            confirmations,
            open: before_deadline
                && matches!(
                    status,
                    IntentStatus::AwaitingPayment | IntentStatus::Seen | IntentStatus::Confirmed
                ),
            marked_paid: intent.marked_paid_at.is_some(),
            superseded: intent.superseded_by.is_some(),
        }
    }
}

/// Refuses anything but the shape of a checkout key, before the database sees it.
fn check_key(key: &str) -> Result<(), Error> {
    if key.len() == CHECKOUT_KEY_LEN && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        Ok(())
    } else {
        Err(Error::InvalidInput(
            "a checkout key is 32 lowercase hexadecimal digits".into(),
        ))
    }
}

/// The intent whose checkout link carries `key`; a key of the wrong shape never reaches the
/// database.
pub(crate) async fn intent_by_key(
    conn: &mut sqlx::AnyConnection,
    key: &str,
) -> Result<PaymentIntent, Error> {
    check_key(key)?;
    payments::intent_by_checkout_key(conn, key)
        .await?
        .ok_or_else(|| Error::IntentNotFound("no payment has this checkout link".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_shape_of_a_key_reaches_the_database() {
        assert!(check_key("0123456789abcdef0123456789abcdef").is_ok());
        for refused in [
            "",
            "0123456789abcdef0123456789abcde",
            "0123456789ABCDEF0123456789ABCDEF",
            "0123456789abcdef0123456789abcdef0",
            "' OR 1=1 --                     ",
            "pi_0123456789abcdef0123456789ab",
        ] {
            assert!(check_key(refused).is_err(), "{refused:?}");
        }
    }
}
