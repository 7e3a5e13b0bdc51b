//! Rental orders and balance top-ups, and the shop's rules for each.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::money::{Usd, UsdError};

/// Longest account id or order reference accepted; identifiers are keys, not prose.
pub const MAX_IDENTIFIER_LEN: usize = 64;

/// Checks an identifier: 1 to 64 of `A-Z a-z 0-9 _ . -`, so it is safe in account names,
/// URLs, CSV cells and log lines alike.
fn check_identifier(value: &str) -> Result<(), IdentifierProblem> {
    if value.is_empty() {
        return Err(IdentifierProblem::Empty);
    }
    if value.len() > MAX_IDENTIFIER_LEN {
        return Err(IdentifierProblem::TooLong);
    }
    match value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        Some(bad) => Err(IdentifierProblem::Character(bad)),
        None => Ok(()),
    }
}

/// What is wrong with an identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentifierProblem {
    /// Nothing was given.
    #[error("it is empty")]
    Empty,
    /// More than [`MAX_IDENTIFIER_LEN`] bytes.
    #[error("it is longer than 64 characters")]
    TooLong,
    /// A character outside `A-Z a-z 0-9 _ . -`.
    #[error("it contains {0:?}; allowed are A-Z, a-z, 0-9, '_', '.' and '-'")]
    Character(char),
}

/// The shop's id for a customer account. Orders and balances are keyed by it, never by
/// e-mail: a new account with a recycled e-mail address sees nothing of the old one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AccountId(String);

impl AccountId {
    /// Validates the shop's account id.
    pub fn new(value: impl Into<String>) -> Result<AccountId, OrderRuleError> {
        let value = value.into();
        if value.contains('@') {
            return Err(OrderRuleError::AccountIdIsEmail);
        }
        check_identifier(&value).map_err(OrderRuleError::AccountId)?;
        Ok(AccountId(value))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The shop's reference for an order or a top-up; unique across both.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OrderRef(String);

impl OrderRef {
    /// Validates an order reference.
    pub fn new(value: impl Into<String>) -> Result<OrderRef, OrderRuleError> {
        let value = value.into();
        check_identifier(&value).map_err(OrderRuleError::Reference)?;
        Ok(OrderRef(value))
    }

    /// The reference as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

macro_rules! string_newtype_conversions {
    ($($name:ident),*) => {$(
        impl TryFrom<String> for $name {
            type Error = OrderRuleError;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                $name::new(value)
            }
        }
        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    )*};
}
string_newtype_conversions!(AccountId, OrderRef);

/// GPU models whose one lot is more than one GPU, with their GPUs per lot.
const MULTI_GPU_LOTS: [(&str, u32); 1] = [("B200", 2)];

/// The rental durations the shop sells, in days.
pub const RENTAL_DURATIONS_DAYS: [u32; 3] = [3, 7, 30];

/// The fewest and most lots one order may rent.
pub const LOTS_RANGE: std::ops::RangeInclusive<u32> = 1..=10;

/// The only top-up amounts the shop sells, in whole USD.
pub const TOPUP_AMOUNTS_USD: [u32; 4] = [100, 500, 2000, 10000];

/// What the shop sends to create a rental order. The shop computes the total.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RentalOrderRequest {
    /// The shop's unique reference for the order.
    pub reference: String,
    /// The shop's account id of the customer.
    pub account_id: String,
    /// The GPU model, e.g. `H100` or `B200`.
    pub gpu_model: String,
    /// 3, 7 or 30.
    pub duration_days: u32,
    /// 1 to 10.
    pub lots: u32,
    /// The total the shop computed.
    pub total_usd: Usd,
}

/// What the shop sends to create a balance top-up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopupRequest {
    /// The shop's unique reference for the top-up.
    pub reference: String,
    /// The shop's account id of the customer.
    pub account_id: String,
    /// 100, 500, 2000 or 10000.
    pub amount_usd: Usd,
}

/// An order or a top-up that passed the shop's rules, ready to store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidOrder {
    /// Unique reference.
    pub reference: OrderRef,
    /// Owner.
    pub account_id: AccountId,
    /// Rental details, or top-up.
    pub kind: OrderKind,
    /// What the customer pays.
    pub total_usd: Usd,
}

impl RentalOrderRequest {
    /// Applies the shop's rental rules; the first rule broken is named in the error.
    pub fn validate(&self) -> Result<ValidOrder, OrderRuleError> {
        let reference = OrderRef::new(self.reference.clone())?;
        let account_id = AccountId::new(self.account_id.clone())?;
        let gpu_model = normalize_gpu_model(&self.gpu_model)?;
        if !RENTAL_DURATIONS_DAYS.contains(&self.duration_days) {
            return Err(OrderRuleError::Duration(self.duration_days));
        }
        if !LOTS_RANGE.contains(&self.lots) {
            return Err(OrderRuleError::Lots(self.lots));
        }
        if self.total_usd.is_zero() {
            return Err(OrderRuleError::TotalNotPositive);
        }
        let gpus_per_lot = MULTI_GPU_LOTS
            .iter()
            .find(|(model, _)| *model == gpu_model)
            .map_or(1, |(_, per_lot)| *per_lot);
        Ok(ValidOrder {
            reference,
            account_id,
            kind: OrderKind::Rental(RentalDetails {
                gpu_count: self.lots * gpus_per_lot,
                gpu_model,
                duration_days: self.duration_days,
                lots: self.lots,
            }),
            total_usd: self.total_usd,
        })
    }
}

impl TopupRequest {
    /// Applies the shop's top-up rules.
    pub fn validate(&self) -> Result<ValidOrder, OrderRuleError> {
        let reference = OrderRef::new(self.reference.clone())?;
        let account_id = AccountId::new(self.account_id.clone())?;
        let allowed = TOPUP_AMOUNTS_USD
            .iter()
            .any(|dollars| Usd::from_dollars(*dollars) == self.amount_usd);
        if !allowed {
            return Err(OrderRuleError::TopupAmount(self.amount_usd));
        }
        Ok(ValidOrder {
            reference,
            account_id,
            kind: OrderKind::Topup,
            total_usd: self.amount_usd,
        })
    }
}

/// Upper-cases and checks a GPU model name (`h100` and `H100` are one model).
fn normalize_gpu_model(model: &str) -> Result<String, OrderRuleError> {
    let model = model.trim().to_ascii_uppercase();
    let well_formed = (1..=32).contains(&model.len())
        && model
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '-' | '_' | '.'));
    if well_formed {
        Ok(model)
    } else {
        Err(OrderRuleError::GpuModel)
    }
}

/// A rental order or a top-up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OrderKind {
    /// GPUs for a number of days.
    Rental(RentalDetails),
    /// USD for the customer's balance.
    Topup,
}

impl OrderKind {
    /// `rental` or `topup`, as stored.
    pub const fn as_str(&self) -> &'static str {
        match self {
            OrderKind::Rental(_) => "rental",
            OrderKind::Topup => "topup",
        }
    }
}

/// What a rental order rents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RentalDetails {
    /// Normalized model name.
    pub gpu_model: String,
    /// 3, 7 or 30.
    pub duration_days: u32,
    /// 1 to 10.
    pub lots: u32,
    /// GPUs rented: lots, times two for B200.
    pub gpu_count: u32,
}

/// An order as stored, with where it stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// Unique reference.
    pub reference: OrderRef,
    /// Owner.
    pub account_id: AccountId,
    /// Rental details, or top-up.
    #[serde(flatten)]
    pub kind: OrderKind,
    /// What the customer pays.
    pub total_usd: Usd,
    /// Open or settled, and how.
    pub status: OrderStatus,
    /// When payrecon first stored it.
    pub created_at: DateTime<Utc>,
    /// Set when an operator must look at the order (a payment that settled it was reversed).
    pub attention: Option<String>,
}

/// Open until paid; then settled, with how and by which journal entry.
///
/// "Settled" is payrecon's word: the money is in. It never claims a rental has started;
/// provisioning is the shop's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum OrderStatus {
    /// Waiting for payment.
    Open,
    /// Paid.
    Settled {
        /// From the balance or by a crypto payment.
        via: SettledVia,
        /// The journal entry that settled it.
        entry_key: String,
        /// When.
        at: DateTime<Utc>,
    },
}

/// How an order was settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SettledVia {
    /// Debited from the customer's USD balance.
    Balance,
    /// By a confirmed, matched crypto payment.
    Payment,
}

impl SettledVia {
    /// As stored.
    pub const fn as_str(self) -> &'static str {
        match self {
            SettledVia::Balance => "balance",
            SettledVia::Payment => "payment",
        }
    }
}

/// A shop rule an order or top-up broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderRuleError {
    /// The reference is not a valid identifier.
    #[error("invalid order reference: {0}")]
    Reference(IdentifierProblem),
    /// The account id is not a valid identifier.
    #[error("invalid account id: {0}")]
    AccountId(IdentifierProblem),
    /// An e-mail address was given as the account id.
    #[error("account id looks like an e-mail address; pass the shop's account id instead")]
    AccountIdIsEmail,
    /// The GPU model name is empty or malformed.
    #[error("GPU model must be 1 to 32 characters of letters, digits, ' ', '-', '_' or '.'")]
    GpuModel,
    /// Not a duration the shop sells.
    #[error("rental duration must be 3, 7 or 30 days, got {0}")]
    Duration(u32),
    /// Too few or too many lots.
    #[error("lots must be 1 to 10, got {0}")]
    Lots(u32),
    /// A total of zero.
    #[error("order total must be greater than 0 USD")]
    TotalNotPositive,
    /// Not a top-up amount the shop sells.
    #[error("a top-up must be exactly 100, 500, 2000 or 10000 USD, got {0}")]
    TopupAmount(Usd),
    /// A USD amount that is not one.
    #[error(transparent)]
    Usd(#[from] UsdError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rental(duration_days: u32, lots: u32, model: &str) -> RentalOrderRequest {
        RentalOrderRequest {
            reference: "R1".into(),
            account_id: "42".into(),
            gpu_model: model.into(),
            duration_days,
            lots,
            total_usd: "420".parse().unwrap(),
        }
    }

    #[test]
    fn b200_lots_are_two_gpus() {
        let order = rental(7, 3, "b200").validate().unwrap();
        let OrderKind::Rental(details) = order.kind else {
            panic!("a rental")
        };
        assert_eq!((details.gpu_model.as_str(), details.gpu_count), ("B200", 6));
        let OrderKind::Rental(h100) = rental(30, 10, "H100").validate().unwrap().kind else {
            panic!("a rental")
        };
        assert_eq!(h100.gpu_count, 10);
    }

    #[test]
    fn impossible_rentals_name_the_rule() {
        assert_eq!(
            rental(7, 11, "H100").validate(),
            Err(OrderRuleError::Lots(11))
        );
        assert_eq!(
            rental(7, 0, "H100").validate(),
            Err(OrderRuleError::Lots(0))
        );
        assert_eq!(
            rental(5, 1, "H100").validate(),
            Err(OrderRuleError::Duration(5))
        );
        assert_eq!(
            rental(5, 1, "H100").validate().unwrap_err().to_string(),
            "rental duration must be 3, 7 or 30 days, got 5"
        );
        assert_eq!(rental(7, 1, "").validate(), Err(OrderRuleError::GpuModel));
        let mut free = rental(7, 1, "H100");
        free.total_usd = Usd::ZERO;
        assert_eq!(free.validate(), Err(OrderRuleError::TotalNotPositive));
    }

    #[test]
    fn top_ups_are_exactly_the_four_amounts() {
        for dollars in TOPUP_AMOUNTS_USD {
            let request = TopupRequest {
                reference: format!("T{dollars}"),
                account_id: "42".into(),
                amount_usd: Usd::from_dollars(dollars),
            };
            assert!(request.validate().is_ok());
        }
        let odd = TopupRequest {
            reference: "T".into(),
            account_id: "42".into(),
            amount_usd: Usd::from_dollars(250),
        };
        assert_eq!(
            odd.validate().unwrap_err().to_string(),
            "a top-up must be exactly 100, 500, 2000 or 10000 USD, got 250.00"
        );
    }

    #[test]
    fn identifiers_refuse_e_mail_and_injection() {
        assert_eq!(
            AccountId::new("alice@example.com"),
            Err(OrderRuleError::AccountIdIsEmail)
        );
        assert_eq!(
            OrderRef::new("R1'; DROP TABLE orders;--"),
            Err(OrderRuleError::Reference(IdentifierProblem::Character(
                '\''
            )))
        );
        assert_eq!(
            OrderRef::new("x".repeat(65)),
            Err(OrderRuleError::Reference(IdentifierProblem::TooLong))
        );
        assert!(AccountId::new("").is_err());
        assert!(AccountId::new("cust_42.a-b").is_ok());
    }
}
