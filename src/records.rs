//! What the engine has recorded, as its callers read it: transfers as seen, exceptions,
//! operators' actions, the intent event stream, watcher health, failing webhook endpoints and
//! the books' valuations.
//! The store reads and writes these; the engine hands them out.

use chrono::{DateTime, Utc};
use payrecon_chain_core::{Amount, Method, ReceivedAsset, TransferId};
use rust_decimal::Decimal;
use serde::Serialize;

/// An operator's action, as the audit log keeps it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OperatorAction {
    /// Position in the log.
    pub seq: i64,
    /// The exception acted on.
    pub exception_id: String,
    /// accept_as_paid, credit_balance, mark_refunded or dismiss.
    pub action: String,
    /// Who.
    pub actor: String,
    /// Why, in the operator's words.
    pub reason: String,
    /// The transaction that returned the money, for refunds.
    pub refund_txid: Option<String>,
    /// The compensating journal entry, where money moved in the books.
    pub entry_key: Option<String>,
    /// When.
    pub at: DateTime<Utc>,
}

/// A watcher's health as it last wrote it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WatcherHealth {
    /// The network.
    pub network: String,
    /// starting, running, retrying or stopped.
    pub state: String,
    /// The newest block committed.
    pub cursor_height: Option<u64>,
    /// The node's newest block at the last scan.
    pub head_height: Option<u64>,
    /// Failed rounds in a row.
    pub failures: u64,
    /// Failed rounds since the watcher started.
    pub rpc_errors: u64,
    /// Answers of the source that left out part of a block, since the watcher started.
    pub incomplete_answers: u64,
    /// Zero-value transfers (address poisoning) ignored since the watcher started.
    pub zero_value_ignored: u64,
    /// The newest failure.
    pub last_error: Option<String>,
    /// The last successful scan.
    pub last_scan_at: Option<DateTime<Utc>>,
    /// How far in time the watcher has read its chain: the start (engine clock) of its last
    /// round that reached the source's newest block. Deadlines are judged against it.
    pub chain_read_until: Option<DateTime<Utc>>,
    /// Which of the network's sources served the last round, its credentials hidden.
    pub active_source: Option<String>,
    /// A stopped watcher's next attempt; `None` while it runs, or when it stays stopped (it
    /// serves the wrong chain, or was shut down).
    pub next_try_at: Option<DateTime<Utc>>,
    /// When this row was written.
    pub updated_at: DateTime<Utc>,
}

/// The last holdings check of one network: `payrecon stuck` and `/metrics` show it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct HoldingsCheck {
    /// The network.
    pub network: String,
    /// When it ran.
    pub checked_at: DateTime<Utc>,
    /// The block it read the chain at (the watcher's cursor); `None` when it could not run.
    pub block_height: Option<u64>,
    /// Addresses read.
    pub addresses_checked: u64,
    /// Balances that no receipt or outflow payrecon recorded explains: each booked, so that
    /// holdings equal the chain, and held in a `holdings_difference` exception.
    pub unexplained: u64,
    /// Why it could not run, if it could not.
    pub error: Option<String>,
}

/// An endpoint whose deliveries fail: what the stuck view and the metrics show.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FailingEndpoint {
    /// The endpoint's configured name.
    pub endpoint: String,
    /// Deliveries that failed at least once and wait for their next attempt.
    pub retrying: i64,
    /// Deliveries given up after the endpoint's retry window (an operator can replay them).
    pub abandoned: i64,
    /// The oldest event not delivered, and when it happened (Unix milliseconds).
    pub oldest_event_seq: i64,
    /// When that event happened (Unix milliseconds).
    pub oldest_event_at_ms: i64,
    /// What the newest failed attempt of that oldest delivery met.
    pub last_error: Option<String>,
}

/// A transfer as the matcher keeps it: its newest observed state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StoredTransfer {
    /// Where it sits on the chain.
    pub id: TransferId,
    /// The watch key it paid.
    pub to_address: String,
    /// What arrived.
    pub asset: ReceivedAsset,
    /// How much, in base units.
    pub amount: Amount,
    /// The address that sent it, on chains that name one (Ethereum, Tron).
    pub from_address: Option<String>,
    /// The intent whose watch key it paid, if any.
    pub intent_id: Option<String>,
    /// Confirmations at the newest observation.
    pub confirmations: u32,
    /// The block it was in at the newest observation; `None` while unconfirmed.
    pub block_height: Option<u64>,
    /// Taken out by a reorg or a replacement.
    pub removed: bool,
    /// Chain height of the newest observation.
    pub tip_height: u64,
    /// First seen, Unix milliseconds.
    pub seen_at_ms: i64,
    /// The journal entry that accounted for it, if any.
    pub credited_entry: Option<String>,
}

/// An exception an operator must look at.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ExceptionRecord {
    /// Deterministic id: `<kind>:<intent or transfer>`.
    pub id: String,
    /// underpaid, overpaid, paid_late, wrong_asset, paid_after_settlement,
    /// reorged_after_credit, unmatched, unmatched_dust, unknown_token, unreadable_transaction,
    /// unexplained_balance or holdings_difference.
    pub kind: String,
    /// The intent concerned, if any.
    pub intent_id: Option<String>,
    /// The order concerned, if any.
    pub order_ref: Option<String>,
    /// The transfer concerned, if any.
    pub transfer: Option<String>,
    /// What happened, for people.
    pub detail: String,
    /// When it was opened.
    pub opened_at: DateTime<Utc>,
    /// When an operator resolved it.
    pub resolved_at: Option<DateTime<Utc>>,
    /// What the operator did, and who: `<action> by <actor>: <reason>`.
    pub resolution: Option<String>,
}

/// One entry of the intent event stream.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct IntentEvent {
    /// Position in the stream: resume after it.
    pub seq: i64,
    /// The intent concerned, if any.
    pub intent_id: Option<String>,
    /// The order concerned, if any.
    pub order_ref: Option<String>,
    /// `intent_created`, `status_changed`, `marked_paid`, `exception_opened`, `superseded`.
    pub kind: String,
    /// Details as JSON.
    pub detail: serde_json::Value,
    /// When.
    pub at: DateTime<Utc>,
}

/// A market price of one coin of a method, as quoted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CryptoRate {
    /// The method whose asset is priced.
    pub method: Method,
    /// USD for one whole coin.
    pub usd_per_unit: Decimal,
    /// The sources of the median.
    pub source: String,
    /// When the quote was current.
    pub at: DateTime<Utc>,
}

/// The reporting currency's price in USD.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReportingRate {
    /// The currency (`EUR`).
    pub currency: String,
    /// USD for one unit of it (the EUR/USD quote, 1.08 for example).
    pub usd_per_unit: Decimal,
    /// The sources of the median.
    pub source: String,
    /// When the quote was current.
    pub at: DateTime<Utc>,
}

/// An entry's valuation, written once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Valuation {
    /// The entry's position in the journal.
    pub entry_seq: i64,
    /// The rate of its crypto legs; none for an entry in USD alone.
    pub crypto: Option<CryptoRate>,
    /// Where the crypto rate comes from: `market` (the moment of the entry), `reverses <key>`
    /// or `held since <key>` (the rate of the entry that took the money in).
    pub basis: String,
    /// The transactions behind the entry, `+`-separated.
    pub txids: String,
    /// The reporting currency's rate, when one is configured.
    pub reporting: Option<ReportingRate>,
    /// A refund's: the rates its money was taken in at, which its suspense legs leave at.
    pub held: Option<HeldRate>,
    /// When it was written.
    pub valued_at: DateTime<Utc>,
}

/// The rates held money was taken in at (its hold entry's). A refund's suspense legs are
/// valued at these and its other legs at the market's, so its `fx:` legs hold the exchange
/// difference between receipt and refund.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeldRate {
    /// USD for one whole coin.
    pub usd_per_unit: Decimal,
    /// USD for one unit of the reporting currency, when the hold had one.
    pub usd_per_reporting: Option<Decimal>,
}

/// Receive indexes of one account key: how many were handed out and how they were paid.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FundedIndexes {
    /// Receive addresses handed out.
    pub handed_out: u64,
    /// The highest index handed out.
    pub highest_index: Option<u32>,
    /// Addresses that received anything (a transfer not removed by a reorg).
    pub funded: u64,
    /// The longest run of unpaid indexes before a paid one, from index 0.
    pub largest_unfunded_run: u32,
}

/// One asset's holdings roll-forward over a period, in base units:
/// opening + received + found − sent − fees − missing = closing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct AssetRollForward {
    /// The network.
    pub network: String,
    /// The asset: a method id, or `token:<contract>`.
    pub asset: String,
    /// Decimal places of one whole coin in the base units below, for a method's asset.
    pub decimals: Option<u8>,
    /// Decimal places people read the asset at (its display precision), for a method's asset.
    pub display_decimals: Option<u32>,
    /// Held at the period's start.
    pub opening: String,
    /// Received on watched addresses in the period.
    pub received: String,
    /// Sent to the merchant's configured treasury addresses.
    pub sent_to_treasury: String,
    /// Sent anywhere else.
    pub sent_elsewhere: String,
    /// Network fees paid from watched addresses (in the native coin's row).
    pub fees: String,
    /// Found by the holdings check on the chain with no receipt to explain it (money that
    /// came while nothing watched the address), held in `suspense:unreconciled`.
    #[serde(default = "zero")]
    pub found_by_check: String,
    /// Missing on the chain by the holdings check with no outflow to explain it, booked as
    /// sent elsewhere.
    #[serde(default = "zero")]
    pub missing_by_check: String,
    /// opening + received + found − sent − fees − missing.
    pub closing: String,
    /// What the watched addresses held at the period's end, summed address by address.
    pub held_at_end: String,
    /// Whether `closing` equals `held_at_end` exactly.
    pub closes: bool,
    /// USD for one coin at the period's start, when a rate could be had.
    pub rate_at_start_usd: Option<String>,
    /// The opening at that rate.
    pub opening_value_usd: Option<String>,
    /// USD for one coin at the period's end (or now, for a period still running).
    pub rate_at_end_usd: Option<String>,
    /// The closing at that rate.
    pub closing_value_usd: Option<String>,
}

/// A roll-forward stored before the holdings check booked its differences had none.
fn zero() -> String {
    "0".to_owned()
}

/// Where a refund stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundState {
    /// An address and an amount are recorded; an operator has not approved it yet.
    Requested,
    /// An operator approved it: the merchant's wallet is to send it.
    Approved,
    /// payrecon prepared what the merchant's wallet signs (a PSBT); nothing is sent yet.
    Prepared,
    /// A transaction paying it is in a block, not yet as deep as a payment must be.
    Sent,
    /// Its transaction is as deep as a payment must be: booked, and never changes again.
    Completed,
    /// Withdrawn before it was sent: its amount is free again.
    Cancelled,
}

impl RefundState {
    /// Every state, in the order a refund lives them.
    pub const ALL: [RefundState; 6] = [
        RefundState::Requested,
        RefundState::Approved,
        RefundState::Prepared,
        RefundState::Sent,
        RefundState::Completed,
        RefundState::Cancelled,
    ];

    /// `requested`, `approved`, `prepared`, `sent`, `completed`, `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            RefundState::Requested => "requested",
            RefundState::Approved => "approved",
            RefundState::Prepared => "prepared",
            RefundState::Sent => "sent",
            RefundState::Completed => "completed",
            RefundState::Cancelled => "cancelled",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<RefundState> {
        RefundState::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Approved and waiting for the chain: the watcher looks for its transaction.
    pub fn awaits_chain(self) -> bool {
        matches!(
            self,
            RefundState::Approved | RefundState::Prepared | RefundState::Sent
        )
    }
}

impl Refund {
    /// What it goes back in, as a transfer names it: the asset the money arrived in.
    pub fn asset(&self) -> ReceivedAsset {
        ReceivedAsset::Method {
            method: self.method,
        }
    }
}

/// Who pays a refund's network fee.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeePayer {
    /// The shop: the customer receives the whole amount.
    #[default]
    Shop,
    /// The customer: the fee is taken from the amount (native coins only: a token's fee is
    /// paid in another coin).
    Customer,
}

impl FeePayer {
    /// `shop` or `customer`.
    pub fn as_str(self) -> &'static str {
        match self {
            FeePayer::Shop => "shop",
            FeePayer::Customer => "customer",
        }
    }
}

/// One refund.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Refund {
    /// `rf_<32 hex digits>`.
    pub id: String,
    /// The exception whose money goes back.
    pub exception_id: String,
    /// Its intent and order, where it has them.
    pub intent_id: Option<String>,
    /// The order.
    pub order_ref: Option<String>,
    /// The method the money arrived in, which it goes back in.
    pub method: Method,
    /// How much, in base units.
    pub amount: Amount,
    /// How much, in the asset's units (`0.3`).
    pub amount_decimal: String,
    /// `all`, `overpaid` or `exact`: how the amount was asked for.
    pub amount_kind: String,
    /// The customer's address, as the chain's explorers print it.
    pub address: String,
    /// Who pays the network fee: `shop` (the customer receives the whole amount) or
    /// `customer` (the fee is taken from it).
    pub fee_payer: FeePayer,
    /// Where it stands.
    pub state: RefundState,
    /// The transaction that paid it, once seen in a block.
    pub txid: Option<String>,
    /// The block that carries it.
    pub block_height: Option<u64>,
    /// What the transaction paid the customer's address, in base units.
    pub paid: Option<Amount>,
    /// When it was requested.
    pub created_at: DateTime<Utc>,
    /// When its state last changed.
    pub updated_at: DateTime<Utc>,
}
