//! US dollars, the currency of orders, top-ups and customer balances.

use std::fmt;
use std::str::FromStr;

use rust_decimal::Decimal;
use rust_decimal::prelude::ToPrimitive;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The largest USD amount payrecon accepts anywhere (one trillion dollars, in cents): far
/// beyond any order, far inside `i64`.
pub const MAX_USD_CENTS: i64 = 100_000_000_000_000;

/// A non-negative USD amount in whole cents.
///
/// Cents, not a float and not an open-ended decimal: prices, top-ups and balances are
/// quoted to the cent, so a fraction of a cent can only come from a bug or bad input and is
/// refused at the edge instead of being rounded somewhere inside.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Usd {
    cents: i64,
}

impl Usd {
    /// Zero dollars.
    pub const ZERO: Usd = Usd { cents: 0 };

    /// A USD amount of `cents`, refused when negative or beyond a trillion dollars.
    pub fn from_cents(cents: i64) -> Result<Usd, UsdError> {
        if cents < 0 {
            return Err(UsdError::Negative);
        }
        if cents > MAX_USD_CENTS {
            return Err(UsdError::TooLarge);
        }
        Ok(Usd { cents })
    }

    /// Whole dollars.
    pub const fn from_dollars(dollars: u32) -> Usd {
        Usd {
            cents: dollars as i64 * 100,
        }
    }

    /// A USD amount from a decimal, refused when negative, finer than a cent or too large.
    pub fn from_decimal(value: Decimal) -> Result<Usd, UsdError> {
        if value.is_sign_negative() && !value.is_zero() {
            return Err(UsdError::Negative);
        }
        let normalized = value.normalize();
        if normalized.scale() > 2 {
            return Err(UsdError::FinerThanCents);
        }
        let cents = (normalized * Decimal::ONE_HUNDRED)
            .to_i64()
            .ok_or(UsdError::TooLarge)?;
        Usd::from_cents(cents)
    }

    /// The amount in cents.
    pub const fn cents(self) -> i64 {
        self.cents
    }

    /// The amount as a decimal with two places (`420.00`).
    pub fn to_decimal(self) -> Decimal {
        Decimal::new(self.cents, 2)
    }

    /// Whether the amount is zero.
    pub const fn is_zero(self) -> bool {
        self.cents == 0
    }
}

impl fmt::Display for Usd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_decimal())
    }
}

impl FromStr for Usd {
    type Err = UsdError;

    /// Plain decimals only (`420`, `420.5`, `420.50`): no exponent, sign, separators or spaces.
    fn from_str(s: &str) -> Result<Usd, UsdError> {
        let plain = !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            && s.bytes().filter(|b| *b == b'.').count() <= 1
            && !s.starts_with('.')
            && !s.ends_with('.');
        if s.starts_with('-') {
            return Err(UsdError::Negative);
        }
        if !plain || s.len() > 32 {
            return Err(UsdError::NotADecimal(s.chars().take(40).collect()));
        }
        let value = Decimal::from_str_exact(s).map_err(|_| UsdError::TooLarge)?;
        Usd::from_decimal(value)
    }
}

/// Serialized as a decimal string (`"420.00"`) so that no JSON reader turns it into a float.
impl Serialize for Usd {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Read from a decimal string or a whole JSON number of dollars; never from a float.
impl<'de> Deserialize<'de> for Usd {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Usd, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Text(String),
            Whole(u64),
        }
        match Wire::deserialize(deserializer)? {
            Wire::Text(text) => text.parse().map_err(serde::de::Error::custom),
            Wire::Whole(dollars) => i64::try_from(dollars)
                .ok()
                .and_then(|d| d.checked_mul(100))
                .ok_or(UsdError::TooLarge)
                .and_then(Usd::from_cents)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Why a value is not a USD amount.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsdError {
    /// USD amounts here are never negative.
    #[error("USD amount must not be negative")]
    Negative,
    /// A fraction of a cent.
    #[error("USD amount must have at most 2 decimal places (whole cents)")]
    FinerThanCents,
    /// Beyond any order payrecon handles.
    #[error("USD amount is too large")]
    TooLarge,
    /// Not a plain decimal number.
    #[error("{0:?} is not a USD amount; use digits with an optional '.' and up to 2 decimals")]
    NotADecimal(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cents_exactly() {
        assert_eq!("420".parse::<Usd>().unwrap().cents(), 42_000);
        assert_eq!("420.5".parse::<Usd>().unwrap().cents(), 42_050);
        assert_eq!("0.01".parse::<Usd>().unwrap().cents(), 1);
        assert_eq!("420.50".parse::<Usd>().unwrap().to_string(), "420.50");
        assert_eq!(
            Usd::from_decimal(Decimal::new(1_2300, 4)).unwrap().cents(),
            123
        );
    }

    #[test]
    fn refuses_what_is_not_a_usd_amount() {
        assert_eq!("0.001".parse::<Usd>(), Err(UsdError::FinerThanCents));
        assert_eq!("-5".parse::<Usd>(), Err(UsdError::Negative));
        assert!(matches!(
            "1e3".parse::<Usd>(),
            Err(UsdError::NotADecimal(_))
        ));
        assert!(matches!("".parse::<Usd>(), Err(UsdError::NotADecimal(_))));
        assert!(matches!("1.".parse::<Usd>(), Err(UsdError::NotADecimal(_))));
        assert_eq!(
            "99999999999999999999".parse::<Usd>(),
            Err(UsdError::TooLarge)
        );
        assert_eq!(Usd::from_cents(-1), Err(UsdError::Negative));
    }

    #[test]
    fn json_is_a_string_and_accepts_whole_numbers() {
        let usd: Usd = serde_json::from_str("\"420.00\"").unwrap();
        assert_eq!(serde_json::to_string(&usd).unwrap(), "\"420.00\"");
        let whole: Usd = serde_json::from_str("500").unwrap();
        assert_eq!(whole.cents(), 50_000);
        assert!(
            serde_json::from_str::<Usd>("500.5").is_err(),
            "floats are refused"
        );
    }
}
