//! Payment intents ("payment instructions"): one order or top-up, one method, one fresh
//! address, one amount at a rate locked until a deadline.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use payrecon_chain_core::{Amount, Method, Network};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::money::Usd;
use crate::order::OrderRef;

/// Where an intent stands. Exceptions that stop it from settling on its own are states
/// too; the rest (overpaid, wrong asset, paid after settlement) are exception records beside
/// the state, see the engine's exception views.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntentStatus {
    /// Nothing seen yet, deadline ahead.
    AwaitingPayment,
    /// A payment is on its way (unconfirmed, or confirmed but not yet enough).
    Seen,
    /// Everything seen is confirmed, but it is less than asked and the deadline is ahead.
    Confirmed,
    /// Paid and credited.
    Settled,
    /// The deadline passed with nothing received.
    Expired,
    /// The deadline passed with less than asked received (beyond the tolerance).
    Underpaid,
    /// Money arrived only after the deadline: held for support, never lost.
    PaidLate,
    /// A credit was taken back by a reorg or a replaced transaction.
    ReorgedAfterCredit,
}

impl IntentStatus {
    const ALL: [IntentStatus; 8] = [
        IntentStatus::AwaitingPayment,
        IntentStatus::Seen,
        IntentStatus::Confirmed,
        IntentStatus::Settled,
        IntentStatus::Expired,
        IntentStatus::Underpaid,
        IntentStatus::PaidLate,
        IntentStatus::ReorgedAfterCredit,
    ];

    /// Whether an intent in this state may move to `next`. Only a settled intent can have its
    /// credit reorged away, and a settled one stays settled unless that happens: the matcher
    /// never unsettles an intent by re-deriving it.
    pub fn can_become(self, next: IntentStatus) -> bool {
        match (self, next) {
            (IntentStatus::Settled, next) => {
                matches!(
                    next,
                    IntentStatus::Settled | IntentStatus::ReorgedAfterCredit
                )
            }
            (IntentStatus::ReorgedAfterCredit, next) => {
                matches!(
                    next,
                    IntentStatus::Settled | IntentStatus::ReorgedAfterCredit
                )
            }
            (_, IntentStatus::ReorgedAfterCredit) => false,
            _ => true,
        }
    }

    /// As stored.
    pub const fn as_str(self) -> &'static str {
        match self {
            IntentStatus::AwaitingPayment => "awaiting_payment",
            IntentStatus::Seen => "seen",
            IntentStatus::Confirmed => "confirmed",
            IntentStatus::Settled => "settled",
            IntentStatus::Expired => "expired",
            IntentStatus::Underpaid => "underpaid",
            IntentStatus::PaidLate => "paid_late",
            IntentStatus::ReorgedAfterCredit => "reorged_after_credit",
        }
    }

    /// What the customer should be told. A customer who paid is never pushed to pay twice.
    pub const fn customer_message(self) -> &'static str {
        match self {
            IntentStatus::AwaitingPayment => "Waiting for your payment.",
            IntentStatus::Seen => "Payment received, waiting for confirmations.",
            IntentStatus::Confirmed => {
                "Part of the amount is confirmed; please send the rest before the deadline."
            }
            IntentStatus::Settled => "Paid. Thank you.",
            IntentStatus::Expired => {
                "These instructions expired without a payment. If you did pay, do not pay again: contact support with your order reference."
            }
            IntentStatus::Underpaid => {
                "Less than the amount due arrived before the deadline. Do not pay again: contact support with your order reference."
            }
            IntentStatus::PaidLate => {
                "Your payment arrived after the deadline. It is safe with us; do not pay again: contact support with your order reference."
            }
            IntentStatus::ReorgedAfterCredit => {
                "Your payment was reversed on the blockchain. Contact support with your order reference."
            }
        }
    }
}

/// How far a network's chain has been read, which is what deadlines are judged against: an
/// intent that received nothing is expired only once its chain was read past its deadline, so a
/// source's outage or lag never tells a customer who paid in time that the payment expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainRead {
    /// No payrecon watcher reports for the network (an embedding application feeds its own
    /// events): the clock decides.
    Unwatched,
    /// A watcher reports: it has read everything its source held up to this time (`None`:
    /// nothing yet).
    Until(Option<DateTime<Utc>>),
}

impl ChainRead {
    /// The moment before which deadlines can be judged now, if any.
    pub fn cutoff(self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            ChainRead::Unwatched => Some(now),
            ChainRead::Until(read) => read.map(|read| read.min(now)),
        }
    }

    /// Whether `deadline` is behind what was read: only then does "nothing received" mean
    /// expired.
    pub fn passed(self, deadline: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        self.cutoff(now).is_some_and(|cutoff| deadline < cutoff)
    }

    /// What the API reports: the time read up to, when a watcher reports.
    pub fn until(self) -> Option<DateTime<Utc>> {
        match self {
            ChainRead::Unwatched => None,
            ChainRead::Until(read) => read,
        }
    }

    /// Whether `intent` waits on its chain being read: its deadline passed, nothing settles
    /// it yet, and its chain was not read past the deadline, so whether it expired (or was
    /// underpaid) is not known.
    pub fn checking(self, intent: &PaymentIntent, now: DateTime<Utc>) -> bool {
        now >= intent.deadline
            && matches!(
                intent.status,
                IntentStatus::AwaitingPayment | IntentStatus::Confirmed
            )
            && !self.passed(intent.deadline, now)
    }
}

/// What the customer is told while the shop reads the network past a deadline.
pub const CHECKING_MESSAGE: &str = "The deadline has passed and the shop is still reading the network for your payment. If you paid in time, it will be credited: do not pay again.";

impl fmt::Display for IntentStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for IntentStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<IntentStatus, String> {
        IntentStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| format!("unknown intent status {s:?}"))
    }
}

/// The rate an intent locked, and where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntentRate {
    /// USD for one whole coin.
    pub usd_per_unit: Decimal,
    /// The sources of the median (a `file:` source says it came from a recorded file).
    pub source: String,
    /// When the quotes were current.
    pub fetched_at: DateTime<Utc>,
}

/// A payment intent as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentIntent {
    /// `pi_…`, unique.
    pub id: String,
    /// The order or top-up it pays.
    pub order_ref: OrderRef,
    /// The one method it accepts.
    pub method: Method,
    /// What the customer pays to (for Solana Pay: the merchant recipient).
    pub pay_to: String,
    /// What the watcher matches transfers by (for Solana Pay: the reference key).
    pub watch_key: String,
    /// Exactly this much, in base units.
    pub amount: Amount,
    /// The USD it stands for.
    pub usd: Usd,
    /// The locked rate.
    pub rate: IntentRate,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// Pay before this.
    pub deadline: DateTime<Utc>,
    /// Watched until this, so that late money is found and classified.
    pub monitor_until: DateTime<Utc>,
    /// Where it stands.
    pub status: IntentStatus,
    /// The newer intent for the same order, if any; this one stays watched.
    pub superseded_by: Option<String>,
    /// When the customer said "I have paid" (it confirms nothing).
    pub marked_paid_at: Option<DateTime<Utc>>,
    /// When the first payment to it was seen.
    pub first_seen_at: Option<DateTime<Utc>>,
    /// When it was settled.
    pub settled_at: Option<DateTime<Utc>>,
    /// How many times it has been settled (more than once only after a reorg reversal).
    pub settlement_count: u32,
    /// Which key derived its address.
    pub key_id: String,
    /// The derivation index of its address.
    pub derivation_index: u32,
    /// The secret part of the customer's checkout page link, `/pay/<checkout_key>`: 122
    /// random bits, so the public page cannot be found by guessing (the id can).
    pub checkout_key: String,
}

impl PaymentIntent {
    /// The network its method lives on.
    pub fn network(&self) -> Network {
        self.method.network()
    }

    /// The amount as a decimal of the asset (`0.00625`).
    pub fn amount_decimal(&self) -> String {
        self.method.format_amount(self.amount)
    }
}

/// The base units of `method` worth `usd` at `usd_per_unit`, rounded UP to the last unit so
/// that the customer never underpays by rounding. Exact integer arithmetic: `None` if the
/// rate is not positive or the numbers overflow 128 bits.
pub fn crypto_amount_for(usd: Usd, usd_per_unit: Decimal, method: Method) -> Option<Amount> {
    let rate = usd_per_unit.normalize();
    if rate <= Decimal::ZERO {
        return None;
    }
    let rate_mantissa = u128::try_from(rate.mantissa()).ok()?;
    let numerator = u128::try_from(usd.cents())
        .ok()?
        .checked_mul(10u128.checked_pow(u32::from(method.decimals()))?)?
        .checked_mul(10u128.checked_pow(rate.scale())?)?;
    let denominator = rate_mantissa.checked_mul(100)?;
    Some(Amount::from_base_units(numerator.div_ceil(denominator)))
}

/// The USD value of `amount` at `usd_per_unit`, rounded DOWN to the cent: what a late or
/// extra payment is worth when credited to a balance.
pub fn usd_value_of(amount: Amount, usd_per_unit: Decimal, method: Method) -> Option<i64> {
    let rate = usd_per_unit.normalize();
    let rate_mantissa = u128::try_from(rate.mantissa()).ok()?;
    let numerator = amount
        .base_units()
        .checked_mul(rate_mantissa)?
        .checked_mul(100)?;
    let denominator = 10u128
        .checked_pow(u32::from(method.decimals()))?
        .checked_mul(10u128.checked_pow(rate.scale())?)?;
    i64::try_from(numerator / denominator).ok()
}

/// Chain parameters payment URIs need beyond the intent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UriParams {
    /// EIP-155 chain id of the Ethereum network (1 on mainnet).
    pub ethereum_chain_id: u64,
    /// USDT contract on Ethereum.
    pub usdt_erc20_contract: String,
    /// USDC contract on Ethereum.
    pub usdc_erc20_contract: String,
    /// USDT contract on Tron.
    pub usdt_trc20_contract: String,
    /// Shown by wallets that support labels.
    pub label: String,
}

/// The payment URI a wallet understands: BIP21 (bitcoin, litecoin), EIP-681 (ETH and
/// ERC-20), a Solana Pay transfer request, and the `tron:` form TRON wallets accept.
pub fn payment_uri(intent: &PaymentIntent, params: &UriParams) -> String {
    wallet_uri(
        intent.method,
        &intent.pay_to,
        intent.amount,
        (
            &format!("Order {}", intent.order_ref),
            Some(&intent.watch_key),
        ),
        params,
    )
}

/// A wallet URI paying `amount` of `method` to `to`, with `message` (BIP21 and Solana Pay)
/// and a Solana Pay `reference` key when given: what a payment's instructions carry, and
/// what a refund sent from a treasury wallet is paid from.
pub(crate) fn wallet_uri(
    method: Method,
    to: &str,
    amount: Amount,
    (message, reference): (&str, Option<&str>),
    params: &UriParams,
) -> String {
    let decimal = method.format_amount(amount);
    let units = amount.base_units();
    let label = urlencode(&params.label);
    let message = urlencode(message);
    match method {
        Method::Btc => format!("bitcoin:{to}?amount={decimal}&label={label}&message={message}"),
        Method::Ltc => format!("litecoin:{to}?amount={decimal}&label={label}&message={message}"),
        Method::Eth => format!("ethereum:{to}@{}?value={units}", params.ethereum_chain_id),
        Method::UsdtErc20 | Method::UsdcErc20 => {
            let contract = if method == Method::UsdtErc20 {
                &params.usdt_erc20_contract
            } else {
                &params.usdc_erc20_contract
            };
            format!(
                "ethereum:{contract}@{}/transfer?address={to}&uint256={units}",
                params.ethereum_chain_id
            )
        }
        Method::Trx => format!("tron:{to}?amount={decimal}"),
        Method::UsdtTrc20 => format!(
            "tron:{to}?amount={decimal}&token={}",
            params.usdt_trc20_contract
        ),
        Method::Sol => {
            let reference = reference
                .map(|key| format!("&reference={key}"))
                .unwrap_or_default();
            format!("solana:{to}?amount={decimal}{reference}&label={label}&message={message}")
        }
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The payment URI as a scannable QR code, in SVG.
pub fn qr_svg(uri: &str) -> Result<String, qrcode::types::QrError> {
    let code = qrcode::QrCode::new(uri.as_bytes())?;
    Ok(code
        .render::<qrcode::render::svg::Color>()
        .min_dimensions(240, 240)
        .quiet_zone(true)
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_has_passed_only_once_the_chain_was_read_past_it() {
        let at = |minute: u32| {
            DateTime::parse_from_rfc3339(&format!("2026-12-06T12:{minute:02}:00Z"))
                .unwrap()
                .with_timezone(&Utc)
        };
        let (deadline, now) = (at(10), at(30));
        // No watcher of payrecon reports: the clock decides.
        assert!(ChainRead::Unwatched.passed(deadline, now));
        assert!(!ChainRead::Unwatched.passed(deadline, at(5)));
        // A watcher that read nothing yet, or not past the deadline: not known.
        assert!(!ChainRead::Until(None).passed(deadline, now));
        assert!(!ChainRead::Until(Some(at(9))).passed(deadline, now));
        assert!(!ChainRead::Until(Some(deadline)).passed(deadline, now));
        // Read past it.
        assert!(ChainRead::Until(Some(at(11))).passed(deadline, now));
        // Never past the clock, whatever a row says.
        assert_eq!(ChainRead::Until(Some(at(50))).cutoff(now), Some(now));
        assert_eq!(ChainRead::Until(Some(at(11))).until(), Some(at(11)));
        assert_eq!(ChainRead::Unwatched.until(), None);
    }

    fn rate(text: &str) -> Decimal {
        text.parse().unwrap()
    }

    #[test]
    fn the_brief_example_converts_exactly() {
        let btc = crypto_amount_for(Usd::from_dollars(500), rate("80000"), Method::Btc).unwrap();
        assert_eq!(Method::Btc.format_amount(btc), "0.00625");
        assert_eq!(usd_value_of(btc, rate("80000"), Method::Btc), Some(50_000));
    }

    #[test]
    fn amounts_round_up_to_the_last_unit() {
        // 100 USD at 3 USD/ETH is 33.333… ETH: the customer pays the next wei up.
        let eth = crypto_amount_for(Usd::from_dollars(100), rate("3"), Method::Eth).unwrap();
        assert_eq!(eth.base_units(), 33_333_333_333_333_333_334);
        // And pays at least the USD asked at the locked rate.
        assert!(usd_value_of(eth, rate("3"), Method::Eth).unwrap() >= 10_000);
        let usdt =
            crypto_amount_for(Usd::from_dollars(420), rate("0.9993"), Method::UsdtTrc20).unwrap();
        assert_eq!(usdt.base_units(), 420_294_206);
    }

    #[test]
    fn refuses_a_non_positive_rate() {
        assert_eq!(
            crypto_amount_for(Usd::from_dollars(1), Decimal::ZERO, Method::Btc),
            None
        );
        assert_eq!(
            crypto_amount_for(Usd::from_dollars(1), rate("-1"), Method::Btc),
            None
        );
    }

    #[test]
    fn a_qr_code_is_svg() {
        let svg =
            qr_svg("bitcoin:bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu?amount=0.00625").unwrap();
        assert!(svg.contains("<svg") && svg.contains("</svg>"));
    }
}
