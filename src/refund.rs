//! Refunds: money an exception holds sent back to the customer, in the asset and on the
//! network it arrived in, to an address the customer gave. A refund is a record of its own,
//! several per exception, never more in all than the exception holds.
//!
//! Built so far: the record, its amount and address rules, and its first states (requested,
//! approved, cancelled). payrecon never signs: preparing what the merchant's wallet signs and
//! seeing the refund on the chain before the books say so come next (issue 45).

use payrecon_chain_bitcoin::{UtxoChain, UtxoNetwork};
use payrecon_chain_core::{Amount, Method, Network};

use crate::error::Error;

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
