//! The double-entry journal's rules: accounts, currencies and balanced entries.
//!
//! Sign convention, one for the whole ledger: a positive amount is a debit, a negative one a
//! credit. Assets (custody) grow with debits; what the shop owes (customer balances, revenue)
//! grows with credits, so a customer's available balance is the negated sum of their postings.
//! Storage lives in `store::ledger`; this module only decides what a valid entry is.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use payrecon_chain_core::{Method, Network};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::order::{AccountId, OrderRuleError};

/// Most legs one entry may carry; real entries have two to six.
pub const MAX_POSTINGS_PER_ENTRY: usize = 32;

/// Longest idempotency key accepted.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 160;

/// What a posting is counted in: USD cents, or one method's base units.
///
/// Crypto currencies are per method, not per ticker: USDT on Ethereum and USDT on Tron sit
/// on different chains, in different custody, and each must balance on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Currency {
    /// US dollars, counted in cents.
    Usd,
    /// One method's asset, counted in its base units.
    Crypto(Method),
}

impl Currency {
    /// Decimal places of one minor unit: 2 for USD, the method's decimals otherwise.
    pub const fn decimals(self) -> u8 {
        match self {
            Currency::Usd => 2,
            Currency::Crypto(method) => method.decimals(),
        }
    }

    /// Formats a signed amount in minor units as an exact decimal (`-420.00`, `0.00625`).
    pub fn format(self, minor_units: i128) -> String {
        let magnitude = payrecon_chain_core::Amount::from_base_units(minor_units.unsigned_abs());
        let sign = if minor_units < 0 { "-" } else { "" };
        match self {
            Currency::Usd => format!(
                "{sign}{}.{:02}",
                minor_units.unsigned_abs() / 100,
                minor_units.unsigned_abs() % 100
            ),
            Currency::Crypto(method) => format!("{sign}{}", method.format_amount(magnitude)),
        }
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Currency::Usd => f.write_str("USD"),
            Currency::Crypto(method) => f.write_str(method.id()),
        }
    }
}

impl FromStr for Currency {
    type Err = LedgerError;

    fn from_str(s: &str) -> Result<Currency, LedgerError> {
        if s == "USD" {
            return Ok(Currency::Usd);
        }
        s.parse()
            .map(Currency::Crypto)
            .map_err(|_| LedgerError::UnknownCurrency(s.to_owned()))
    }
}

impl From<Currency> for String {
    fn from(currency: Currency) -> String {
        currency.to_string()
    }
}

impl TryFrom<String> for Currency {
    type Error = LedgerError;
    fn try_from(value: String) -> Result<Currency, LedgerError> {
        value.parse()
    }
}

/// Why money sits in suspense, waiting for an operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SuspenseReason {
    /// More than was asked, or a second payment to a settled intent.
    Overpaid,
    /// Arrived after the deadline.
    Late,
    /// Another asset or network than the intent asked for.
    WrongAsset,
    /// Matched no intent.
    Unmatched,
    /// A credit taken back by a reorg that the balance could not cover.
    Reversed,
    /// Dust at an address payrecon handed out: below the method's dust limit, what address
    /// poisoning and spam send. Part of the holdings, never any intent's, no exception.
    Dust,
    /// Money the holdings check found on the chain that no receipt explains (it came while
    /// nothing watched the address): in custody, nobody's until an operator says whose.
    Unreconciled,
    /// A settled payment's money whose credit was taken back: it goes back to the customer.
    Refunding,
}

impl SuspenseReason {
    const ALL: [SuspenseReason; 8] = [
        SuspenseReason::Overpaid,
        SuspenseReason::Late,
        SuspenseReason::WrongAsset,
        SuspenseReason::Unmatched,
        SuspenseReason::Reversed,
        SuspenseReason::Dust,
        SuspenseReason::Unreconciled,
        SuspenseReason::Refunding,
    ];

    /// As written in account names.
    pub const fn as_str(self) -> &'static str {
        match self {
            SuspenseReason::Overpaid => "overpaid",
            SuspenseReason::Late => "late",
            SuspenseReason::WrongAsset => "wrong_asset",
            SuspenseReason::Unmatched => "unmatched",
            SuspenseReason::Reversed => "reversed",
            SuspenseReason::Dust => "dust",
            SuspenseReason::Unreconciled => "unreconciled",
            SuspenseReason::Refunding => "refunding",
        }
    }
}

/// A ledger account. Its name is its identity in the store (`customer:42:balance`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Account {
    /// Crypto on our addresses for one method: `custody:<network>:<ASSET>`.
    Custody(Method),
    /// Conversion at the locked rate for one method: crypto in, USD out. `fx:<method>`.
    Fx(Method),
    /// What the shop owes a customer as credit, in USD: `customer:<account>:balance`.
    CustomerBalance(AccountId),
    /// Settled rental orders, in USD: `revenue:rentals`.
    RevenueRentals,
    /// Money held for an operator: `suspense:<reason>`.
    Suspense(SuspenseReason),
    /// Crypto the merchant moved to one of its own configured addresses:
    /// `treasury:<network>:<ASSET>`.
    Treasury(Method),
    /// Crypto sent from a watched address anywhere else: `external:<network>:<ASSET>`.
    External(Method),
    /// Network fees paid from watched addresses: `expense:network_fees:<network>:<ASSET>`.
    NetworkFees(Method),
}

impl Account {
    /// Whether this account may hold `currency`: USD-only accounts never hold crypto and a
    /// method's custody holds nothing but that method's asset.
    pub fn allows(&self, currency: Currency) -> bool {
        match (self, currency) {
            (
                Account::Custody(m)
                | Account::Fx(m)
                | Account::Treasury(m)
                | Account::External(m)
                | Account::NetworkFees(m),
                Currency::Crypto(c),
            ) => *m == c,
            (
                Account::Custody(_)
                | Account::Treasury(_)
                | Account::External(_)
                | Account::NetworkFees(_),
                Currency::Usd,
            ) => false,
            (Account::Fx(_), Currency::Usd) => true,
            (Account::CustomerBalance(_) | Account::RevenueRentals, c) => c == Currency::Usd,
            (Account::Suspense(_), _) => true,
        }
    }

    /// The customer whose available balance this account is, if any: its sum may never turn
    /// into a debit (the balance never goes negative).
    pub fn customer(&self) -> Option<&AccountId> {
        match self {
            Account::CustomerBalance(id) => Some(id),
            _ => None,
        }
    }
}

impl fmt::Display for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Account::Custody(m) => write!(f, "custody:{}:{}", m.network(), m.asset()),
            Account::Fx(m) => write!(f, "fx:{m}"),
            Account::CustomerBalance(id) => write!(f, "customer:{id}:balance"),
            Account::RevenueRentals => f.write_str("revenue:rentals"),
            Account::Suspense(reason) => write!(f, "suspense:{}", reason.as_str()),
            Account::Treasury(m) => write!(f, "treasury:{}:{}", m.network(), m.asset()),
            Account::External(m) => write!(f, "external:{}:{}", m.network(), m.asset()),
            Account::NetworkFees(m) => {
                write!(f, "expense:network_fees:{}:{}", m.network(), m.asset())
            }
        }
    }
}

impl FromStr for Account {
    type Err = LedgerError;

    fn from_str(s: &str) -> Result<Account, LedgerError> {
        let unknown = || LedgerError::UnknownAccount(s.chars().take(80).collect());
        let parts: Vec<&str> = s.split(':').collect();
        let method_of = |network: &str, asset: &str| -> Result<Method, LedgerError> {
            let network: Network = network.parse().map_err(|_| unknown())?;
            Method::ALL
                .into_iter()
                .find(|m| m.network() == network && m.asset().ticker() == asset)
                .ok_or_else(unknown)
        };
        match parts.as_slice() {
            ["custody", network, asset] => method_of(network, asset).map(Account::Custody),
            ["treasury", network, asset] => method_of(network, asset).map(Account::Treasury),
            ["external", network, asset] => method_of(network, asset).map(Account::External),
            ["expense", "network_fees", network, asset] => {
                method_of(network, asset).map(Account::NetworkFees)
            }
            ["fx", method] => method.parse().map(Account::Fx).map_err(|_| unknown()),
            ["customer", id, "balance"] => AccountId::new(*id)
                .map(Account::CustomerBalance)
                .map_err(|_| unknown()),
            ["revenue", "rentals"] => Ok(Account::RevenueRentals),
            ["suspense", reason] => SuspenseReason::ALL
                .into_iter()
                .find(|r| r.as_str() == *reason)
                .map(Account::Suspense)
                .ok_or_else(unknown),
            _ => Err(unknown()),
        }
    }
}

impl From<Account> for String {
    fn from(account: Account) -> String {
        account.to_string()
    }
}

impl TryFrom<String> for Account {
    type Error = LedgerError;
    fn try_from(value: String) -> Result<Account, LedgerError> {
        value.parse()
    }
}

/// One leg of an entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Posting {
    /// Where the money moves.
    pub account: Account,
    /// In what it is counted.
    pub currency: Currency,
    /// Signed minor units: positive debits, negative credits.
    #[serde(with = "i128_as_string")]
    pub amount_minor: i128,
}

impl Posting {
    /// A debit of `amount_minor` (must be positive to be valid).
    pub fn debit(account: Account, currency: Currency, amount_minor: i128) -> Posting {
        Posting {
            account,
            currency,
            amount_minor,
        }
    }

    /// A credit of `amount_minor` (given positive, stored negative).
    pub fn credit(account: Account, currency: Currency, amount_minor: i128) -> Posting {
        Posting {
            account,
            currency,
            amount_minor: -amount_minor,
        }
    }
}

/// Serde for `i128` as a decimal string: JSON numbers lose precision past 2^53.
pub(crate) mod i128_as_string {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(value: &i128, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<i128, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Why an entry was made; reports group by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A confirmed, matched crypto payment converted at its locked rate.
    Payment,
    /// A rental order paid from the customer's balance.
    BalancePayment,
    /// The exact opposite of an earlier entry.
    Reversal,
    /// An operator's correction.
    Adjustment,
    /// Crypto leaving a watched address, with its network fee.
    Outflow,
    /// Crypto the merchant moved between its own wallets: the native coin its treasury sends
    /// a payment address to pay for sweeping the tokens there.
    InternalTransfer,
    /// Held money sent back to a customer, booked once the chain carries it deep enough.
    Refund,
}

impl EntryKind {
    /// As stored.
    pub const fn as_str(self) -> &'static str {
        match self {
            EntryKind::Payment => "payment",
            EntryKind::BalancePayment => "balance_payment",
            EntryKind::Reversal => "reversal",
            EntryKind::Adjustment => "adjustment",
            EntryKind::Outflow => "outflow",
            EntryKind::InternalTransfer => "internal_transfer",
            EntryKind::Refund => "refund",
        }
    }
}

impl FromStr for EntryKind {
    type Err = LedgerError;

    fn from_str(s: &str) -> Result<EntryKind, LedgerError> {
        [
            EntryKind::Payment,
            EntryKind::BalancePayment,
            EntryKind::Reversal,
            EntryKind::Adjustment,
            EntryKind::Outflow,
            EntryKind::InternalTransfer,
            EntryKind::Refund,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
        .ok_or_else(|| LedgerError::Corrupt(format!("unknown entry kind {s:?}")))
    }
}

/// An entry to post: checked to balance before it reaches the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewEntry {
    /// Posting the same key twice posts once; the same key with other content is refused.
    pub idempotency_key: String,
    /// Why.
    pub kind: EntryKind,
    /// The order, top-up or intent it belongs to, so support finds it from the order.
    pub reference: Option<String>,
    /// A line for people.
    pub memo: String,
    /// The legs.
    pub postings: Vec<Posting>,
}

impl NewEntry {
    /// Checks the double-entry rules: a valid key, 2 to 32 legs, no zero leg, each account in
    /// a currency it may hold, and every currency summing to zero.
    pub fn validate(&self) -> Result<(), LedgerError> {
        check_idempotency_key(&self.idempotency_key)?;
        if self.postings.len() < 2 {
            return Err(LedgerError::TooFewPostings);
        }
        if self.postings.len() > MAX_POSTINGS_PER_ENTRY {
            return Err(LedgerError::TooManyPostings);
        }
        let mut sums: BTreeMap<Currency, i128> = BTreeMap::new();
        for (leg, posting) in self.postings.iter().enumerate() {
            if posting.amount_minor == 0 {
                return Err(LedgerError::ZeroPosting { leg });
            }
            if !posting.account.allows(posting.currency) {
                return Err(LedgerError::CurrencyNotAllowed {
                    account: posting.account.to_string(),
                    currency: posting.currency,
                });
            }
            let sum = sums.entry(posting.currency).or_insert(0);
            *sum = sum
                .checked_add(posting.amount_minor)
                .ok_or(LedgerError::AmountOverflow)?;
        }
        match sums.into_iter().find(|(_, sum)| *sum != 0) {
            Some((currency, sum)) => Err(LedgerError::Unbalanced {
                currency,
                off_by: currency.format(sum),
            }),
            None => Ok(()),
        }
    }

    /// Whether every currency's legs sum to zero: the invariant an entry keeps from before it
    /// is inserted to after it is read back.
    pub fn balances(&self) -> bool {
        let mut sums: BTreeMap<Currency, i128> = BTreeMap::new();
        for posting in &self.postings {
            *sums.entry(posting.currency).or_insert(0) += posting.amount_minor;
        }
        sums.values().all(|sum| *sum == 0)
    }

    /// A fingerprint of everything that makes two postings of one key the same posting.
    pub fn content_hash(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.kind.as_str());
        hasher.update([0]);
        hasher.update(self.reference.as_deref().unwrap_or(""));
        hasher.update([0]);
        hasher.update(&self.memo);
        for posting in &self.postings {
            hasher.update([0]);
            hasher.update(format!(
                "{}|{}|{}",
                posting.account, posting.currency, posting.amount_minor
            ));
        }
        hex::encode(hasher.finalize())
    }

    /// The compensating entry for `original`: every leg negated, keyed `reverse:<key>`.
    pub fn reversal_of(original: &PostedEntry, memo: impl Into<String>) -> NewEntry {
        NewEntry::reversal_of_entry(&original.entry, memo)
    }

    /// [`NewEntry::reversal_of`] an entry known by its content alone.
    pub fn reversal_of_entry(original: &NewEntry, memo: impl Into<String>) -> NewEntry {
        NewEntry {
            idempotency_key: format!("reverse:{}", original.idempotency_key),
            kind: EntryKind::Reversal,
            reference: original.reference.clone(),
            memo: memo.into(),
            postings: original
                .postings
                .iter()
                .map(|p| Posting {
                    amount_minor: -p.amount_minor,
                    ..p.clone()
                })
                .collect(),
        }
    }

    /// Each customer's net change in cents (negative credits, positive debits).
    pub fn customer_nets(&self) -> BTreeMap<AccountId, i128> {
        let mut nets = BTreeMap::new();
        for posting in &self.postings {
            if let Some(customer) = posting.account.customer() {
                *nets.entry(customer.clone()).or_insert(0) += posting.amount_minor;
            }
        }
        nets
    }
}

fn check_idempotency_key(key: &str) -> Result<(), LedgerError> {
    let printable = key.chars().all(|c| c.is_ascii_graphic());
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_LEN || !printable {
        return Err(LedgerError::InvalidIdempotencyKey);
    }
    Ok(())
}

/// An entry as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostedEntry {
    /// Position in the journal.
    pub seq: i64,
    /// When it was posted.
    pub posted_at: DateTime<Utc>,
    /// What was posted.
    #[serde(flatten)]
    pub entry: NewEntry,
}

/// What posting an entry did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PostOutcome {
    /// Written now.
    Posted,
    /// Its key was posted before with the same content; nothing was written.
    AlreadyPosted,
}

/// A ledger rule broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// Debits and credits of a currency differ.
    #[error("entry does not balance: {currency} legs sum to {off_by}, not zero")]
    Unbalanced {
        /// The currency that does not sum to zero.
        currency: Currency,
        /// Its sum, as a decimal.
        off_by: String,
    },
    /// One leg alone moves nothing anywhere.
    #[error("an entry needs at least two postings")]
    TooFewPostings,
    /// More legs than any real entry has.
    #[error("an entry may have at most {MAX_POSTINGS_PER_ENTRY} postings")]
    TooManyPostings,
    /// A leg of zero.
    #[error("posting {leg} has a zero amount")]
    ZeroPosting {
        /// Its position in the entry.
        leg: usize,
    },
    /// An account given a currency it cannot hold.
    #[error("account {account} cannot hold {currency}")]
    CurrencyNotAllowed {
        /// The account.
        account: String,
        /// The currency.
        currency: Currency,
    },
    /// Sums beyond 128 bits.
    #[error("amounts overflow")]
    AmountOverflow,
    /// A key that is empty, too long or not printable ASCII.
    #[error("idempotency key must be 1 to 160 printable ASCII characters")]
    InvalidIdempotencyKey,
    /// The same key was posted with different content.
    #[error("idempotency key {0:?} was already posted with different content")]
    IdempotencyConflict(String),
    /// The entry would take a customer's balance below zero.
    #[error(
        "insufficient balance: account {account} has {available} USD available, the entry debits {debit} USD"
    )]
    Overdraft {
        /// The customer.
        account: AccountId,
        /// What they have.
        available: String,
        /// What the entry takes.
        debit: String,
    },
    /// No entry with that key.
    #[error("no journal entry with key {0:?}")]
    EntryNotFound(String),
    /// Not an account name payrecon knows.
    #[error("unknown ledger account {0:?}")]
    UnknownAccount(String),
    /// Not a currency payrecon knows.
    #[error("unknown currency {0:?}")]
    UnknownCurrency(String),
    /// The store holds something that cannot be: a bug or tampering, never user input.
    #[error("ledger invariant broken: {0}")]
    Corrupt(String),
    /// An account id in an account name broke the identifier rules.
    #[error(transparent)]
    Identifier(#[from] OrderRuleError),
}

/// One line of the trial balance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AccountBalance {
    /// Account name.
    pub account: String,
    /// Currency.
    pub currency: Currency,
    /// Signed, debit positive, as an exact decimal.
    pub balance: String,
    /// The same in minor units (cents or base units).
    #[serde(with = "i128_as_string")]
    pub balance_minor: i128,
}

/// Every account's balance and each currency's total, which must be zero.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TrialBalance {
    /// Per account and currency.
    pub accounts: Vec<AccountBalance>,
    /// Per currency: the sum over all accounts.
    pub totals: Vec<AccountBalance>,
    /// Entries in the journal.
    pub entries: u64,
    /// Postings in the journal.
    pub postings: u64,
    /// Journal positions (`seq`) of entries that do not balance (always empty unless the
    /// store was tampered with).
    pub unbalanced_entries: Vec<i64>,
    /// Customers whose balance is negative (always empty unless tampered with).
    pub negative_balances: Vec<String>,
}

impl TrialBalance {
    /// Whether every invariant holds: each entry and each currency sums to zero, no customer
    /// balance is negative.
    pub fn is_sound(&self) -> bool {
        self.unbalanced_entries.is_empty()
            && self.negative_balances.is_empty()
            && self.totals.iter().all(|t| t.balance_minor == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn btc_topup_entry() -> NewEntry {
        let btc = Currency::Crypto(Method::Btc);
        let customer = Account::CustomerBalance(AccountId::new("42").unwrap());
        NewEntry {
            idempotency_key: "settle:intent-1".into(),
            kind: EntryKind::Payment,
            reference: Some("T1".into()),
            memo: "top-up 500 USD paid with 0.00625 BTC".into(),
            postings: vec![
                Posting::debit(Account::Custody(Method::Btc), btc, 625_000),
                Posting::credit(Account::Fx(Method::Btc), btc, 625_000),
                Posting::debit(Account::Fx(Method::Btc), Currency::Usd, 50_000),
                Posting::credit(customer, Currency::Usd, 50_000),
            ],
        }
    }

    #[test]
    fn the_brief_example_balances() {
        assert_eq!(btc_topup_entry().validate(), Ok(()));
    }

    #[test]
    fn unbalanced_entries_are_refused_per_currency() {
        let mut entry = btc_topup_entry();
        entry.postings[3].amount_minor = -49_999;
        assert_eq!(
            entry.validate(),
            Err(LedgerError::Unbalanced {
                currency: Currency::Usd,
                off_by: "0.01".into()
            })
        );
        // USD and BTC may not offset each other.
        let mut mixed = btc_topup_entry();
        mixed.postings[1].amount_minor = -575_000;
        mixed.postings[3].amount_minor = -100_000;
        assert!(matches!(
            mixed.validate(),
            Err(LedgerError::Unbalanced { .. })
        ));
    }

    #[test]
    fn malformed_entries_are_refused() {
        let mut one_leg = btc_topup_entry();
        one_leg.postings.truncate(1);
        assert_eq!(one_leg.validate(), Err(LedgerError::TooFewPostings));

        let mut zero = btc_topup_entry();
        zero.postings[0].amount_minor = 0;
        assert_eq!(zero.validate(), Err(LedgerError::ZeroPosting { leg: 0 }));

        let mut wrong_currency = btc_topup_entry();
        wrong_currency.postings[0].account = Account::Custody(Method::Eth);
        assert!(matches!(
            wrong_currency.validate(),
            Err(LedgerError::CurrencyNotAllowed { .. })
        ));

        let mut bad_key = btc_topup_entry();
        bad_key.idempotency_key = "has space".into();
        assert_eq!(bad_key.validate(), Err(LedgerError::InvalidIdempotencyKey));
    }

    #[test]
    fn account_names_round_trip() {
        let accounts = [
            Account::Custody(Method::UsdtTrc20),
            Account::Custody(Method::UsdtErc20),
            Account::Fx(Method::Sol),
            Account::CustomerBalance(AccountId::new("42").unwrap()),
            Account::RevenueRentals,
            Account::Suspense(SuspenseReason::WrongAsset),
        ];
        for account in accounts {
            let name = account.to_string();
            assert_eq!(name.parse::<Account>(), Ok(account), "{name}");
        }
        assert_eq!(
            Account::Custody(Method::UsdtTrc20).to_string(),
            "custody:tron:USDT"
        );
        assert!("custody:tron:BTC".parse::<Account>().is_err());
        assert!("customer:a@b:balance".parse::<Account>().is_err());
    }

    #[test]
    fn reversal_negates_every_leg() {
        let original = PostedEntry {
            seq: 1,
            posted_at: Utc::now(),
            entry: btc_topup_entry(),
        };
        let reversal = NewEntry::reversal_of(&original, "reorg");
        assert_eq!(reversal.idempotency_key, "reverse:settle:intent-1");
        assert_eq!(reversal.validate(), Ok(()));
        for (a, b) in original.entry.postings.iter().zip(&reversal.postings) {
            assert_eq!(a.amount_minor, -b.amount_minor);
        }
    }

    #[test]
    fn currency_formats_exactly() {
        assert_eq!(Currency::Usd.format(-42_000), "-420.00");
        assert_eq!(Currency::Usd.format(5), "0.05");
        assert_eq!(Currency::Crypto(Method::Btc).format(625_000), "0.00625");
    }
}
