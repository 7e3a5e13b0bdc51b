//! The closed set of networks, assets and payment methods the shop accepts.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A blockchain network payrecon watches.
///
/// Two methods on different networks are different payments even when the asset shares a
/// ticker (USDT on Ethereum is not USDT on Tron).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Bitcoin mainnet (and its test networks, by configuration).
    Bitcoin,
    /// Ethereum mainnet, native ETH and ERC-20 tokens.
    Ethereum,
    /// Tron, native TRX and TRC-20 tokens.
    Tron,
    /// Solana, native SOL.
    Solana,
    /// Litecoin.
    Litecoin,
}

impl Network {
    /// Every network, in a stable order for reports.
    pub const ALL: [Network; 5] = [
        Network::Bitcoin,
        Network::Ethereum,
        Network::Tron,
        Network::Solana,
        Network::Litecoin,
    ];

    /// The lowercase identifier used in configuration, account names and the database.
    pub const fn as_str(self) -> &'static str {
        match self {
            Network::Bitcoin => "bitcoin",
            Network::Ethereum => "ethereum",
            Network::Tron => "tron",
            Network::Solana => "solana",
            Network::Litecoin => "litecoin",
        }
    }

    /// The chain's own coin: what its fees are paid in, and the one method of a UTXO chain.
    pub const fn native_method(self) -> Method {
        match self {
            Network::Bitcoin => Method::Btc,
            Network::Ethereum => Method::Eth,
            Network::Tron => Method::Trx,
            Network::Solana => Method::Sol,
            Network::Litecoin => Method::Ltc,
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A network name that is not one of the five payrecon watches.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown network {input:?}: expected one of bitcoin, ethereum, tron, solana, litecoin")]
pub struct ParseNetworkError {
    /// What the caller gave.
    pub input: String,
}

impl FromStr for Network {
    type Err = ParseNetworkError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Network::ALL
            .into_iter()
            .find(|network| network.as_str() == s)
            .ok_or_else(|| ParseNetworkError {
                input: s.to_owned(),
            })
    }
}

/// An asset by its ticker. On its own it does not say which network carries it; see [`Method`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Asset {
    /// Bitcoin.
    Btc,
    /// Ether.
    Eth,
    /// Tether USD (a stablecoin, on Ethereum and Tron).
    Usdt,
    /// USD Coin (a stablecoin, on Ethereum).
    Usdc,
    /// Tronix.
    Trx,
    /// Solana's native coin.
    Sol,
    /// Litecoin.
    Ltc,
}

impl Asset {
    /// The ticker as finance staff read it.
    pub const fn ticker(self) -> &'static str {
        match self {
            Asset::Btc => "BTC",
            Asset::Eth => "ETH",
            Asset::Usdt => "USDT",
            Asset::Usdc => "USDC",
            Asset::Trx => "TRX",
            Asset::Sol => "SOL",
            Asset::Ltc => "LTC",
        }
    }

    /// Decimal places people read an amount at (pages, booking texts): a cent of the
    /// stablecoins and of Tronix, a satoshi of the Bitcoin family, a millionth of an ether,
    /// a ten-thousandth of a sol. The exact base units stay in the exports.
    pub const fn display_decimals(self) -> u32 {
        match self {
            Asset::Btc | Asset::Ltc => 8,
            Asset::Eth => 6,
            Asset::Sol => 4,
            Asset::Usdt | Asset::Usdc | Asset::Trx => 2,
        }
    }

    /// Stablecoins are quoted too, so that a depeg is visible instead of assumed away.
    pub const fn is_usd_stablecoin(self) -> bool {
        matches!(self, Asset::Usdt | Asset::Usdc)
    }
}

impl fmt::Display for Asset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.ticker())
    }
}

/// One way to pay: exactly one asset on exactly one network.
///
/// Payment instructions are always for one method; money that arrives as another method is
/// not the same payment (see the matcher's wrong-asset rule).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// BTC on Bitcoin, in satoshi.
    Btc,
    /// ETH on Ethereum, in wei.
    Eth,
    /// USDT as an ERC-20 token on Ethereum.
    UsdtErc20,
    /// USDC as an ERC-20 token on Ethereum.
    UsdcErc20,
    /// TRX on Tron, in sun.
    Trx,
    /// USDT as a TRC-20 token on Tron.
    UsdtTrc20,
    /// SOL on Solana, in lamports.
    Sol,
    /// LTC on Litecoin, in litoshi.
    Ltc,
}

impl Method {
    /// Every method the shop offers, in the order of its FAQ.
    pub const ALL: [Method; 8] = [
        Method::Btc,
        Method::Eth,
        Method::UsdtErc20,
        Method::UsdcErc20,
        Method::Trx,
        Method::UsdtTrc20,
        Method::Sol,
        Method::Ltc,
    ];

    /// The identifier the shop and the configuration use (`usdt-trc20`).
    pub const fn id(self) -> &'static str {
        match self {
            Method::Btc => "btc",
            Method::Eth => "eth",
            Method::UsdtErc20 => "usdt-erc20",
            Method::UsdcErc20 => "usdc-erc20",
            Method::Trx => "trx",
            Method::UsdtTrc20 => "usdt-trc20",
            Method::Sol => "sol",
            Method::Ltc => "ltc",
        }
    }

    /// The asset this method pays in.
    pub const fn asset(self) -> Asset {
        match self {
            Method::Btc => Asset::Btc,
            Method::Eth => Asset::Eth,
            Method::UsdtErc20 | Method::UsdtTrc20 => Asset::Usdt,
            Method::UsdcErc20 => Asset::Usdc,
            Method::Trx => Asset::Trx,
            Method::Sol => Asset::Sol,
            Method::Ltc => Asset::Ltc,
        }
    }

    /// The network that carries this method's transfers.
    pub const fn network(self) -> Network {
        match self {
            Method::Btc => Network::Bitcoin,
            Method::Eth | Method::UsdtErc20 | Method::UsdcErc20 => Network::Ethereum,
            Method::Trx | Method::UsdtTrc20 => Network::Tron,
            Method::Sol => Network::Solana,
            Method::Ltc => Network::Litecoin,
        }
    }

    /// How many decimal places one whole coin has in base units on this network.
    pub const fn decimals(self) -> u8 {
        match self {
            Method::Btc | Method::Ltc => 8,
            Method::Eth => 18,
            Method::UsdtErc20 | Method::UsdcErc20 | Method::Trx | Method::UsdtTrc20 => 6,
            Method::Sol => 9,
        }
    }

    /// The name of the indivisible unit amounts are counted in.
    pub const fn base_unit(self) -> &'static str {
        match self {
            Method::Btc => "satoshi",
            Method::Eth => "wei",
            Method::UsdtErc20 | Method::UsdcErc20 | Method::UsdtTrc20 => "token unit",
            Method::Trx => "sun",
            Method::Sol => "lamport",
            Method::Ltc => "litoshi",
        }
    }

    /// Parses a decimal amount of this method's asset, refusing more decimals than it has.
    pub fn parse_amount(self, decimal: &str) -> Result<crate::Amount, crate::ParseAmountError> {
        crate::Amount::from_decimal_str(decimal, self.decimals())
    }

    /// Formats base units as an exact decimal of this method's asset (`0.00012345`).
    pub fn format_amount(self, amount: crate::Amount) -> String {
        amount.to_decimal_string(self.decimals())
    }

    /// The amount with its asset, as people read it (`1.3 LTC`).
    pub fn format_with_asset(self, amount: crate::Amount) -> String {
        format!("{} {}", self.format_amount(amount), self.asset())
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// A method id that is not one of the eight the shop offers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown payment method {input:?}: expected one of btc, eth, usdt-erc20, usdc-erc20, trx, usdt-trc20, sol, ltc"
)]
pub struct ParseMethodError {
    /// What the caller gave.
    pub input: String,
}

impl FromStr for Method {
    type Err = ParseMethodError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Method::ALL
            .into_iter()
            .find(|method| method.id() == s)
            .ok_or_else(|| ParseMethodError {
                input: s.to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_round_trips_through_its_id() {
        for method in Method::ALL {
            assert_eq!(method.id().parse::<Method>(), Ok(method));
            let json = serde_json::to_string(&method).unwrap();
            assert_eq!(json, format!("\"{}\"", method.id()));
            assert_eq!(serde_json::from_str::<Method>(&json).unwrap(), method);
        }
    }

    #[test]
    fn unknown_method_names_the_input() {
        let err = "usdt".parse::<Method>().unwrap_err();
        assert_eq!(err.input, "usdt");
        assert!(err.to_string().contains("usdt-trc20"));
        assert!("USDT-TRC20".parse::<Method>().is_err(), "ids are exact");
        assert!("".parse::<Method>().is_err());
    }

    #[test]
    fn methods_carry_the_brief_table() {
        let table = [
            (Method::Btc, Asset::Btc, Network::Bitcoin, 8),
            (Method::Eth, Asset::Eth, Network::Ethereum, 18),
            (Method::UsdtErc20, Asset::Usdt, Network::Ethereum, 6),
            (Method::UsdcErc20, Asset::Usdc, Network::Ethereum, 6),
            (Method::Trx, Asset::Trx, Network::Tron, 6),
            (Method::UsdtTrc20, Asset::Usdt, Network::Tron, 6),
            (Method::Sol, Asset::Sol, Network::Solana, 9),
            (Method::Ltc, Asset::Ltc, Network::Litecoin, 8),
        ];
        for (method, asset, network, decimals) in table {
            assert_eq!(method.asset(), asset);
            assert_eq!(method.network(), network);
            assert_eq!(method.decimals(), decimals);
        }
        assert_ne!(Method::UsdtErc20, Method::UsdtTrc20);
        let units: Vec<&str> = Method::ALL.iter().map(|m| m.base_unit()).collect();
        assert_eq!(
            units,
            [
                "satoshi",
                "wei",
                "token unit",
                "token unit",
                "sun",
                "token unit",
                "lamport",
                "litoshi"
            ]
        );
    }

    #[test]
    fn networks_parse() {
        for network in Network::ALL {
            assert_eq!(network.as_str().parse::<Network>(), Ok(network));
        }
        assert!("polygon".parse::<Network>().is_err());
    }
}
