//! Refunds: money an exception holds sent back to the customer, in the asset and on the
//! network it arrived in, to an address the customer gave. A refund is a record of its own,
//! several per exception, never more in all than the exception holds.
//!
//! payrecon never signs: it prepares what the merchant's wallet signs, and the chain decides
//! when a refund happened. A refund is `sent` once a transaction in a block pays the
//! customer's address its amount, and `completed`, and only then booked, at the depth a
//! payment on its network needs.

use payrecon_chain_bitcoin::{UtxoChain, UtxoNetwork};
use payrecon_chain_core::{Amount, Method, Network, TransferId};

use crate::error::Error;
use crate::ledger::{Account, Currency, EntryKind, NewEntry, Posting};
use crate::records::{FeePayer, Refund};

/// How much of what an exception holds goes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefundAmount {
    /// All that is held and not yet refunded.
    All,
    /// The part paid beyond the order's amount: what an `overpaid` exception holds.
    Overpaid,
    /// This much, in the method's base units.
    Exact(Amount),
}

impl RefundAmount {
    /// `all`, `overpaid`, or an amount in the asset's units (`0.3`).
    pub fn parse(text: &str, method: Method) -> Result<RefundAmount, Error> {
        match text.trim() {
            "all" => Ok(RefundAmount::All),
            "overpaid" => Ok(RefundAmount::Overpaid),
            amount => method
                .parse_amount(amount)
                .map(RefundAmount::Exact)
                .map_err(|e| {
                    Error::InvalidInput(format!(
                        "refund amount {:?}: all, overpaid, or an amount of {} ({e})",
                        payrecon_chain_core::excerpt(amount),
                        method.asset()
                    ))
                }),
        }
    }

    /// `all`, `overpaid` or `exact`, as stored.
    fn kind(self) -> &'static str {
        match self {
            RefundAmount::All => "all",
            RefundAmount::Overpaid => "overpaid",
            RefundAmount::Exact(_) => "exact",
        }
    }
}

/// The amount a new refund takes from `held` units, of which `refunded` are already taken by
/// refunds not cancelled: never more than what is left.
pub(crate) fn amount_of(
    asked: RefundAmount,
    kind: &str,
    method: Method,
    (held, refunded): (u128, u128),
) -> Result<(u128, &'static str), Error> {
    let left = held.saturating_sub(refunded);
    let describe = |units: u128| method.format_with_asset(Amount::from_base_units(units));
    let units = match asked {
        RefundAmount::All => left,
        RefundAmount::Overpaid if kind == "overpaid" => left,
        RefundAmount::Overpaid => {
            return Err(Error::InvalidInput(format!(
                "the overpaid part is what an overpaid exception holds; this one is {kind}: ask for all or an amount"
            )));
        }
        RefundAmount::Exact(amount) => amount.base_units(),
    };
    if units == 0 || units > left {
        return Err(Error::InvalidInput(format!(
            "{} asked, but {} is left to refund of the {} held",
            describe(units),
            describe(left),
            describe(held)
        )));
    }
    Ok((units, asked.kind()))
}

/// Whether a transaction paying the customer's address `paid` settles `refund`: the whole
/// amount, or for a refund whose customer pays the fee, the amount less `fee`, the fee the
/// transaction paid from payrecon's own addresses (none from another wallet).
pub(crate) fn covered_by(refund: &Refund, paid: Amount, fee: Amount) -> bool {
    let due = match refund.fee_payer {
        FeePayer::Shop => refund.amount.base_units(),
        FeePayer::Customer => refund.amount.base_units().saturating_sub(fee.base_units()),
    };
    due > 0 && paid.base_units() >= due
}

/// Where a completed refund's money came from: `custody` when the transaction spent what
/// payrecon's addresses hold (the outflow that booked it leaves custody for `external`), else
/// the merchant's treasury wallet paid it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PaidFrom {
    /// From the addresses payrecon watches, with the fee that transaction paid there.
    Custody { fee: Amount },
    /// From another of the merchant's wallets.
    Treasury,
}

/// The entry that books a completed refund of money held in `held` (a suspense account):
/// what the customer got back leaves suspense for where it went (the outflow's `external`,
/// or the treasury that paid it), and for a refund whose customer pays the fee, the fee its
/// transaction paid leaves suspense for the fee expense the outflow booked. It passes through
/// `fx:` (nothing stays there in coins): valued, suspense leaves at the rates the money was
/// held at and the rest goes at the market's, and `fx:` keeps the exchange difference.
pub(crate) fn completion_entry(
    refund: &Refund,
    held: &Account,
    from: PaidFrom,
    txid: &str,
) -> Result<NewEntry, Error> {
    let method = refund.method;
    let units = i128::try_from(refund.amount.base_units())
        .map_err(|_| Error::InvalidInput(format!("refund {}: amount out of range", refund.id)))?;
    let customer_fee = match (refund.fee_payer, from) {
        (FeePayer::Customer, PaidFrom::Custody { fee }) => i128::try_from(fee.base_units())
            .unwrap_or(i128::MAX)
            .min(units),
        _ => 0,
    };
    let crypto = Currency::Crypto(method);
    let to = match from {
        PaidFrom::Custody { .. } => Account::External(method),
        PaidFrom::Treasury => Account::Treasury(method),
    };
    let mut postings = vec![
        Posting::debit(held.clone(), crypto, units),
        Posting::credit(Account::Fx(method), crypto, units),
        Posting::debit(Account::Fx(method), crypto, units),
        Posting::credit(to, crypto, units - customer_fee),
    ];
    if customer_fee > 0 {
        postings.push(Posting::credit(
            Account::NetworkFees(method),
            crypto,
            customer_fee,
        ));
    }
    postings.retain(|p| p.amount_minor != 0);
    Ok(NewEntry {
        idempotency_key: format!("refund:{}", refund.id),
        kind: EntryKind::Refund,
        reference: refund.order_ref.clone(),
        memo: format!(
            "refund {} of {} to {} in {txid}",
            refund.id,
            method.format_with_asset(refund.amount),
            refund.address
        ),
        postings,
    })
}

/// A transfer's id as exceptions name it: `<network>:<txid>:<position>`.
pub(crate) fn transfer_id(text: &str) -> Option<TransferId> {
    let (network, rest) = text.split_once(':')?;
    let (txid, position) = rest.rsplit_once(':')?;
    Some(TransferId {
        network: network.parse().ok()?,
        txid: txid.to_owned(),
        position: position.parse().ok()?,
    })
}

/// The customer's address in the form the chain's explorers print it, checked as a payment
/// address is: the network's format and checksum (an address of another network is refused
/// saying which), on `utxo_network` for the Bitcoin family.
pub(crate) fn customer_address(
    network: Network,
    utxo_network: Option<UtxoNetwork>,
    text: &str,
) -> Result<String, Error> {
    let text = text.trim();
    let refuse = |why: String| Error::InvalidInput(format!("refund address: {why}"));
    if text.is_empty() || text.len() > 128 {
        return Err(refuse("1 to 128 characters".into()));
    }
    match network {
        Network::Bitcoin | Network::Litecoin => {
            let chain = match network {
                Network::Bitcoin => UtxoChain::Bitcoin,
                _ => UtxoChain::Litecoin,
            };
            let utxo_network = utxo_network.unwrap_or(UtxoNetwork::Mainnet);
            payrecon_chain_bitcoin::customer_script(text, chain, utxo_network)
                .map_err(|e| refuse(plain(e)))?;
            // Bech32 may be written in capitals (QR codes do); explorers print it in small.
            let bech32 = text.contains('1') && text == text.to_ascii_uppercase();
            Ok(if bech32 {
                text.to_ascii_lowercase()
            } else {
                text.to_owned()
            })
        }
        Network::Ethereum => {
            let mixed = text.chars().any(|c| c.is_ascii_uppercase())
                && text.chars().any(|c| c.is_ascii_lowercase());
            let parsed = if mixed {
                alloy_primitives::Address::parse_checksummed(text, None)
                    .map_err(|e| refuse(format!("{text:?} is not an Ethereum address: {e}")))?
            } else {
                text.parse::<alloy_primitives::Address>()
                    .map_err(|e| refuse(format!("{text:?} is not an Ethereum address: {e}")))?
            };
            Ok(parsed.to_checksum(None))
        }
        Network::Tron => text
            .parse::<payrecon_chain_tron::TronAddress>()
            .map(|a| a.to_string())
            .map_err(|e| refuse(format!("{text:?} is not a Tron address: {e}"))),
        Network::Solana => {
            payrecon_chain_solana::solana_address(text).map_err(|e| refuse(plain(e)))
        }
    }
}

/// What a chain's address check says, without the key-configuration wording its error type
/// wraps it in: a customer reads it.
fn plain(error: payrecon_chain_core::DeriveError) -> String {
    match error {
        payrecon_chain_core::DeriveError::Config(why) => why,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refund_takes_no_more_than_is_left() {
        let ltc = Method::Ltc;
        assert_eq!(
            amount_of(RefundAmount::Overpaid, "overpaid", ltc, (30, 0)).unwrap(),
            (30, "overpaid")
        );
        assert_eq!(
            amount_of(RefundAmount::All, "paid_late", ltc, (100, 40)).unwrap(),
            (60, "all")
        );
        let beyond = amount_of(
            RefundAmount::Exact(Amount::from(61u64)),
            "paid_late",
            ltc,
            (100, 40),
        )
        .unwrap_err()
        .to_string();
        assert!(beyond.contains("is left to refund"), "{beyond}");
        let nothing_left = amount_of(RefundAmount::All, "paid_late", ltc, (100, 100));
        assert!(nothing_left.is_err());
        let not_overpaid = amount_of(RefundAmount::Overpaid, "paid_late", ltc, (100, 0));
        assert!(not_overpaid.is_err());
    }

    #[test]
    fn a_refund_address_is_of_its_network() {
        let eth = customer_address(
            Network::Ethereum,
            None,
            "0x52908400098527886e0f7030069857d2e4169ee7",
        )
        .unwrap();
        assert_eq!(eth, "0x52908400098527886E0F7030069857D2E4169EE7");
        let bad_checksum = customer_address(
            Network::Ethereum,
            None,
            "0x52908400098527886E0F7030069857D2E4169Ee7",
        );
        assert!(bad_checksum.is_err());
        let bitcoin_on_litecoin = customer_address(
            Network::Litecoin,
            Some(UtxoNetwork::Mainnet),
            "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4",
        )
        .unwrap_err()
        .to_string();
        assert!(
            bitcoin_on_litecoin.contains("Bitcoin mainnet"),
            "{bitcoin_on_litecoin}"
        );
        let capitals = customer_address(
            Network::Bitcoin,
            Some(UtxoNetwork::Mainnet),
            "BC1QW508D6QEJXTDG4Y5R3ZARVARY0C5XW7KV8F3T4",
        )
        .unwrap();
        assert_eq!(capitals, "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4");
        let tron_on_ethereum = customer_address(
            Network::Ethereum,
            None,
            "TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6t",
        );
        assert!(tron_on_ethereum.is_err());
    }
}
