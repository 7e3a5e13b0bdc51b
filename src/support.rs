//! Support lookup: what a customer who paid usually has (a transaction id, the address they
//! paid, their order reference, the intent id from the payment page) found in one call, with
//! everything support needs to answer them.

use serde::Serialize;

use crate::error::Error;
use crate::ledger::PostedEntry;
use crate::order::Order;
use crate::payments::PaymentInstructions;
use crate::records::{ExceptionRecord, StoredTransfer};

/// Longest text a lookup takes: a transaction id is 64 hex digits, a Solana signature 88
/// base58 characters, an order reference 64.
pub(crate) const MAX_LOOKUP_CHARS: usize = 128;

/// Everything about one order, as `payrecon order show` and a reference lookup give it.
#[derive(Clone, Debug, Serialize)]
pub struct OrderView {
    /// The order or top-up.
    #[serde(flatten)]
    pub order: Order,
    /// Its payment instructions, superseded ones too.
    pub payment_intents: Vec<PaymentInstructions>,
    /// Every transfer to any of their addresses.
    pub transfers: Vec<StoredTransfer>,
    /// Its exceptions.
    pub exceptions: Vec<ExceptionRecord>,
    /// Every journal entry that names it.
    pub ledger_entries: Vec<PostedEntry>,
}

/// A transfer with what it paid and what it caused.
#[derive(Clone, Debug, Serialize)]
pub struct TransferView {
    /// The transfer and its state.
    pub transfer: StoredTransfer,
    /// The intent whose address it paid, if any.
    pub intent: Option<PaymentInstructions>,
    /// That intent's order, if any.
    pub order: Option<Order>,
    /// Exceptions about this transfer.
    pub exceptions: Vec<ExceptionRecord>,
    /// The journal entries that account for it: its credit and any reversal or operator action.
    pub ledger_entries: Vec<PostedEntry>,
}

/// An address (or Solana reference) with its intent and every transfer to it.
#[derive(Clone, Debug, Serialize)]
pub struct AddressView {
    /// The address as looked up.
    pub address: String,
    /// The intent it was handed out for, if payrecon handed it out.
    pub intent: Option<PaymentInstructions>,
    /// That intent's order.
    pub order: Option<Order>,
    /// Every transfer to it, matched or not.
    pub transfers: Vec<StoredTransfer>,
}

/// What a lookup found.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "found", rename_all = "snake_case")]
pub enum Finding {
    /// The text is a transaction id: each of its outputs or logs to a watched address.
    Transfers {
        /// One per transfer in the transaction.
        transfers: Vec<TransferView>,
    },
    /// The text is an address (or a Solana reference) payrecon watched.
    Address(Box<AddressView>),
    /// The text is an order or top-up reference.
    Order(Box<OrderView>),
    /// The text is a payment intent id.
    Intent {
        /// The intent.
        intent: Box<PaymentInstructions>,
        /// Its order, as a reference lookup gives it.
        order: Box<OrderView>,
    },
}

/// The text must look like one of the things a lookup finds; anything else is refused
/// before it reaches the database.
pub(crate) fn checked(text: &str) -> Result<&str, Error> {
    let text = text.trim();
    if text.is_empty() || text.chars().count() > MAX_LOOKUP_CHARS {
        return Err(Error::InvalidInput(format!(
            "a lookup takes 1 to {MAX_LOOKUP_CHARS} characters: a transaction id, an address, an order reference or an intent id"
        )));
    }
    if !text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | ':'))
    {
        return Err(Error::InvalidInput(
            "a lookup is a transaction id, an address, an order reference or an intent id: letters, digits and _ . - : only".into(),
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_text_is_refused_before_the_database() {
        for text in [
            "",
            "  ",
            "x' OR '1'='1",
            "a b",
            "<script>",
            &"a".repeat(129),
            "ä",
        ] {
            assert!(checked(text).is_err(), "{text:?}");
        }
        for text in [
            "T-1",
            "4a5e1e4baab89f3a32518a88c31bc87f618f76673e2cc77ab2127b7afdeda33b",
            "bc1qar0srrr7xfkvy5l643lydnw9re59gtzzwf5mdq",
            "0x52908400098527886E0F7030069857D2E4169EE7",
        ] {
            assert_eq!(checked(&format!(" {text} ")).unwrap(), text);
        }
    }
}
