//! Amounts of crypto in base units, exact from the decimal string to the database.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The largest number of decimals any asset may declare; 10^38 still fits a `u128`.
const MAX_DECIMALS: u8 = 38;

/// A non-negative quantity of one asset, counted in its indivisible base unit.
///
/// A `u128` holds every real on-chain value with room to spare: all ether that exists is
/// about 1.2e26 wei, while `u128::MAX` is about 3.4e38. The asset and its decimals travel
/// beside the amount (in a [`crate::Method`]); the amount alone never guesses them.
/// Floating point is never involved: parsing and formatting work on the digits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Amount(u128);

impl Amount {
    /// Nothing.
    pub const ZERO: Amount = Amount(0);

    /// An amount of `base_units` (satoshi, wei, sun, lamports, token units).
    pub const fn from_base_units(base_units: u128) -> Amount {
        Amount(base_units)
    }

    /// The amount in base units.
    pub const fn base_units(self) -> u128 {
        self.0
    }

    /// Whether the amount is zero.
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// The sum, or `None` if it would not fit.
    pub const fn checked_add(self, other: Amount) -> Option<Amount> {
        match self.0.checked_add(other.0) {
            Some(sum) => Some(Amount(sum)),
            None => None,
        }
    }

    /// The difference, or `None` if `other` is larger.
    pub const fn checked_sub(self, other: Amount) -> Option<Amount> {
        match self.0.checked_sub(other.0) {
            Some(difference) => Some(Amount(difference)),
            None => None,
        }
    }

    /// Parses a plain decimal (`0.00012345`, `1.5`, `42`) of an asset with `decimals` places.
    ///
    /// Refused: an empty string, signs, exponents, separators or spaces, a dot without digits
    /// on both sides, more fractional digits than the asset has, and values beyond `u128`.
    pub fn from_decimal_str(input: &str, decimals: u8) -> Result<Amount, ParseAmountError> {
        let error = |kind| ParseAmountError {
            input: truncate_for_message(input),
            kind,
        };
        if decimals > MAX_DECIMALS {
            return Err(error(ParseAmountErrorKind::UnsupportedDecimals(decimals)));
        }
        if input.is_empty() {
            return Err(error(ParseAmountErrorKind::Empty));
        }
        let (whole, fraction) = match input.split_once('.') {
            Some((whole, fraction)) => (whole, Some(fraction)),
            None => (input, None),
        };
        if let Some(bad) = input.chars().find(|c| !c.is_ascii_digit() && *c != '.') {
            return Err(error(if bad == '-' {
                ParseAmountErrorKind::Negative
            } else {
                ParseAmountErrorKind::InvalidCharacter(bad)
            }));
        }
        if whole.is_empty() || fraction.is_some_and(|f| f.is_empty() || f.contains('.')) {
            return Err(error(ParseAmountErrorKind::Malformed));
        }
        let fraction = fraction.unwrap_or("");
        if fraction.len() > usize::from(decimals) {
            return Err(error(ParseAmountErrorKind::TooManyDecimals {
                allowed: decimals,
                found: fraction.len(),
            }));
        }
        let scale = 10u128.pow(u32::from(decimals));
        let whole_units = parse_digits(whole)
            .and_then(|w| w.checked_mul(scale))
            .ok_or_else(|| error(ParseAmountErrorKind::TooLarge))?;
        let padding = 10u128.pow(u32::from(decimals) - fraction.len() as u32);
        let fraction_units = if fraction.is_empty() {
            0
        } else {
            parse_digits(fraction)
                .and_then(|f| f.checked_mul(padding))
                .ok_or_else(|| error(ParseAmountErrorKind::TooLarge))?
        };
        whole_units
            .checked_add(fraction_units)
            .map(Amount)
            .ok_or_else(|| error(ParseAmountErrorKind::TooLarge))
    }

    /// Formats as an exact decimal with `decimals` places, trailing zeros dropped (`1.5`, `42`).
    pub fn to_decimal_string(self, decimals: u8) -> String {
        let digits = self.0.to_string();
        let decimals = usize::from(decimals);
        if decimals == 0 {
            return digits;
        }
        let padded = format!("{digits:0>width$}", width = decimals + 1);
        let (whole, fraction) = padded.split_at(padded.len() - decimals);
        let fraction = fraction.trim_end_matches('0');
        if fraction.is_empty() {
            whole.to_owned()
        } else {
            format!("{whole}.{fraction}")
        }
    }
}

/// Parses ASCII digits into a `u128`, `None` on overflow.
fn parse_digits(digits: &str) -> Option<u128> {
    digits.bytes().try_fold(0u128, |acc, digit| {
        acc.checked_mul(10)?.checked_add(u128::from(digit - b'0'))
    })
}

/// Keeps error messages one line and bounded, whatever the caller sent.
fn truncate_for_message(input: &str) -> String {
    const LIMIT: usize = 64;
    match input.char_indices().nth(LIMIT) {
        Some((cut, _)) => format!("{}…", &input[..cut]),
        None => input.to_owned(),
    }
}

impl fmt::Display for Amount {
    /// Base units, because an amount does not know its asset's decimals.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<u64> for Amount {
    fn from(base_units: u64) -> Amount {
        Amount(u128::from(base_units))
    }
}

/// Serialized as a string of base units: JSON numbers lose precision beyond 2^53.
impl Serialize for Amount {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Amount, D::Error> {
        let text = String::deserialize(deserializer)?;
        Amount::from_decimal_str(&text, 0).map_err(serde::de::Error::custom)
    }
}

/// Why a decimal string is not an amount.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid amount {input:?}: {kind}")]
pub struct ParseAmountError {
    /// What the caller gave (cut to a readable length).
    pub input: String,
    /// What is wrong with it.
    pub kind: ParseAmountErrorKind,
}

/// The rule an amount string broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseAmountErrorKind {
    /// Nothing was given.
    #[error("empty")]
    Empty,
    /// A minus sign: amounts are never negative.
    #[error("negative amounts are not allowed")]
    Negative,
    /// Something other than digits and one dot.
    #[error("unexpected character {0:?}; use plain digits with an optional '.'")]
    InvalidCharacter(char),
    /// A dot without digits on both sides, or two dots.
    #[error("expected digits, optionally followed by '.' and more digits")]
    Malformed,
    /// Finer than the asset's base unit.
    #[error("{found} decimal places, but the asset has only {allowed}")]
    TooManyDecimals {
        /// The asset's decimals.
        allowed: u8,
        /// The decimals given.
        found: usize,
    },
    /// Beyond any real on-chain value.
    #[error("too large")]
    TooLarge,
    /// No asset has this many decimals.
    #[error("{0} decimals is not a supported asset precision")]
    UnsupportedDecimals(u8),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Method;
    use proptest::prelude::*;

    #[test]
    fn parses_and_formats_the_examples_exactly() {
        let btc = Method::Btc.parse_amount("0.00012345").unwrap();
        assert_eq!(btc.base_units(), 12_345);
        assert_eq!(Method::Btc.format_amount(btc), "0.00012345");

        let eth = Method::Eth.parse_amount("1.5").unwrap();
        assert_eq!(eth.base_units(), 1_500_000_000_000_000_000);
        assert_eq!(Method::Eth.format_amount(eth), "1.5");

        assert_eq!(
            Method::UsdtTrc20.parse_amount("420").unwrap().base_units(),
            420_000_000
        );
        assert_eq!(Method::Sol.format_amount(Amount::ZERO), "0");
        assert_eq!(Method::Btc.format_amount(Amount::from(100_000_000u64)), "1");
    }

    #[test]
    fn holds_wei_far_beyond_u64() {
        let supply = Method::Eth
            .parse_amount("120000000.123456789012345678")
            .unwrap();
        assert!(supply.base_units() > u128::from(u64::MAX));
        assert_eq!(
            Method::Eth.format_amount(supply),
            "120000000.123456789012345678"
        );
    }

    #[test]
    fn refuses_what_is_not_an_amount() {
        let kind = |s: &str, method: Method| method.parse_amount(s).unwrap_err().kind;
        assert_eq!(
            kind("0.123456789", Method::Btc),
            ParseAmountErrorKind::TooManyDecimals {
                allowed: 8,
                found: 9
            }
        );
        assert_eq!(
            kind("1.0000001", Method::UsdtErc20),
            ParseAmountErrorKind::TooManyDecimals {
                allowed: 6,
                found: 7
            }
        );
        assert_eq!(kind("", Method::Btc), ParseAmountErrorKind::Empty);
        assert_eq!(kind("-1", Method::Btc), ParseAmountErrorKind::Negative);
        assert_eq!(
            kind("1e5", Method::Btc),
            ParseAmountErrorKind::InvalidCharacter('e')
        );
        assert_eq!(
            kind("1,5", Method::Btc),
            ParseAmountErrorKind::InvalidCharacter(',')
        );
        assert_eq!(
            kind(" 1", Method::Btc),
            ParseAmountErrorKind::InvalidCharacter(' ')
        );
        for malformed in [".", ".5", "5.", "1.2.3"] {
            assert_eq!(
                kind(malformed, Method::Btc),
                ParseAmountErrorKind::Malformed
            );
        }
        assert_eq!(
            kind("999999999999999999999999999999", Method::Eth),
            ParseAmountErrorKind::TooLarge
        );
        let message = Method::Btc
            .parse_amount("0.123456789")
            .unwrap_err()
            .to_string();
        assert!(message.contains("9 decimal places"), "{message}");
    }

    #[test]
    fn serde_uses_base_unit_strings() {
        let amount = Amount::from_base_units(u128::from(u64::MAX) * 1000);
        let json = serde_json::to_string(&amount).unwrap();
        assert_eq!(json, "\"18446744073709551615000\"");
        assert_eq!(serde_json::from_str::<Amount>(&json).unwrap(), amount);
        assert!(serde_json::from_str::<Amount>("\"1.5\"").is_err());
    }

    proptest! {
        #[test]
        fn format_then_parse_is_identity(units in any::<u128>(), method_index in 0usize..8) {
            let method = Method::ALL[method_index];
            let amount = Amount::from_base_units(units);
            let text = method.format_amount(amount);
            prop_assert_eq!(method.parse_amount(&text), Ok(amount));
        }

        #[test]
        fn parsing_never_panics(input in "\\PC{0,48}", decimals in 0u8..40) {
            let _ = Amount::from_decimal_str(&input, decimals);
        }
    }
}
