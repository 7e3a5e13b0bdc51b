//! Rental orders and balance top-ups, and the shop's rules for each.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::catalog::{Catalog, GpuRefusal};
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

/// What the shop sends to create a rental order. The shop computes the total.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RentalOrderRequest {
    /// The shop's unique reference for the order.
    pub reference: String,
    /// The shop's account id of the customer.
    pub account_id: String,
    /// The GPU model, e.g. `H100` or `B200`.
    pub gpu_model: String,
    /// One of the catalog's rental durations (3, 7 or 30 by default).
    pub duration_days: u32,
    /// Within the catalog's lot limits (1 to 10 by default).
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
    /// One of the catalog's top-up amounts (100, 500, 2000 or 10000 by default).
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
    pub(crate) fn validate(&self, catalog: &Catalog) -> Result<ValidOrder, OrderRuleError> {
        let reference = OrderRef::new(self.reference.clone())?;
        let account_id = AccountId::new(self.account_id.clone())?;
        let gpu_model = catalog
            .gpu_kind(&self.gpu_model)
            .map_err(|refusal| match refusal {
                GpuRefusal::Malformed => OrderRuleError::GpuModel,
                GpuRefusal::NotRented(model) => OrderRuleError::GpuKind(model),
            })?;
        if !catalog.sells_duration(self.duration_days) {
            return Err(OrderRuleError::Duration {
                got: self.duration_days,
                sold: catalog.rental_days.clone(),
            });
        }
        if !catalog.allows_lots(self.lots) {
            return Err(OrderRuleError::Lots {
                got: self.lots,
                min: catalog.min_lots,
                max: catalog.max_lots,
            });
        }
        if self.total_usd.is_zero() {
            return Err(OrderRuleError::TotalNotPositive);
        }
        Ok(ValidOrder {
            reference,
            account_id,
            kind: OrderKind::Rental(RentalDetails {
                gpu_count: self.lots * catalog.gpus_per_lot(&gpu_model),
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
    pub(crate) fn validate(&self, catalog: &Catalog) -> Result<ValidOrder, OrderRuleError> {
        let reference = OrderRef::new(self.reference.clone())?;
        let account_id = AccountId::new(self.account_id.clone())?;
        if !catalog.sells_topup(self.amount_usd) {
            return Err(OrderRuleError::TopupAmount {
                got: self.amount_usd,
                sold: catalog.topup_amounts_usd.clone(),
            });
        }
        Ok(ValidOrder {
            reference,
            account_id,
            kind: OrderKind::Topup,
            total_usd: self.amount_usd,
        })
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
    /// One of the catalog's rental durations (3, 7 or 30 by default).
    pub duration_days: u32,
    /// Within the catalog's lot limits (1 to 10 by default).
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
#[non_exhaustive]
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
    /// A GPU kind the shop does not rent.
    #[error("the shop does not rent {0} GPUs")]
    GpuKind(String),
    /// Not a duration the shop sells.
    #[error("rental duration must be {} days, got {got}", or_list(sold))]
    Duration {
        /// What was asked.
        got: u32,
        /// What the catalog sells.
        sold: Vec<u32>,
    },
    /// Too few or too many lots.
    #[error("lots must be {min} to {max}, got {got}")]
    Lots {
        /// What was asked.
        got: u32,
        /// The catalog's fewest.
        min: u32,
        /// The catalog's most.
        max: u32,
    },
    /// A total of zero.
    #[error("order total must be greater than 0 USD")]
    TotalNotPositive,
    /// Not a top-up amount the shop sells.
    #[error("a top-up must be exactly {} USD, got {got}", or_list(sold))]
    TopupAmount {
        /// What was asked.
        got: Usd,
        /// The amounts the catalog sells, in whole USD.
        sold: Vec<u32>,
    },
    /// A USD amount that is not one.
    #[error(transparent)]
    Usd(#[from] UsdError),
}

/// `3, 7 or 30`: a catalog's values as a sentence names them.
fn or_list(values: &[u32]) -> String {
    match values {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => {
            let init: Vec<String> = init.iter().map(u32::to_string).collect();
            format!("{} or {last}", init.join(", "))
        }
    }
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
        let order = rental(7, 3, "b200").validate(&Catalog::default()).unwrap();
        let OrderKind::Rental(details) = order.kind else {
            panic!("a rental")
        };
        assert_eq!((details.gpu_model.as_str(), details.gpu_count), ("B200", 6));
        let OrderKind::Rental(h100) = rental(30, 10, "H100")
            .validate(&Catalog::default())
            .unwrap()
            .kind
        else {
            panic!("a rental")
        };
        assert_eq!(h100.gpu_count, 10);
    }

    #[test]
    fn impossible_rentals_name_the_rule() {
        assert_eq!(
            rental(7, 11, "H100").validate(&Catalog::default()),
            Err(OrderRuleError::Lots {
                got: 11,
                min: 1,
                max: 10
            })
        );
        assert_eq!(
            rental(7, 0, "H100").validate(&Catalog::default()),
            Err(OrderRuleError::Lots {
                got: 0,
                min: 1,
                max: 10
            })
        );
        assert_eq!(
            rental(5, 1, "H100").validate(&Catalog::default()),
            Err(OrderRuleError::Duration {
                got: 5,
                sold: vec![3, 7, 30]
            })
        );
        assert_eq!(
            rental(5, 1, "H100")
                .validate(&Catalog::default())
                .unwrap_err()
                .to_string(),
            "rental duration must be 3, 7 or 30 days, got 5"
        );
        assert_eq!(
            rental(7, 1, "").validate(&Catalog::default()),
            Err(OrderRuleError::GpuModel)
        );
        let mut free = rental(7, 1, "H100");
        free.total_usd = Usd::ZERO;
        assert_eq!(
            free.validate(&Catalog::default()),
            Err(OrderRuleError::TotalNotPositive)
        );
    }

    #[test]
    fn top_ups_are_exactly_the_four_amounts() {
        for dollars in Catalog::default().topup_amounts_usd {
            let request = TopupRequest {
                reference: format!("T{dollars}"),
                account_id: "42".into(),
                amount_usd: Usd::from_dollars(dollars),
            };
            assert!(request.validate(&Catalog::default()).is_ok());
        }
        let odd = TopupRequest {
            reference: "T".into(),
            account_id: "42".into(),
            amount_usd: Usd::from_dollars(250),
        };
        assert_eq!(
            odd.validate(&Catalog::default()).unwrap_err().to_string(),
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
