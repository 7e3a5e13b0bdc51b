//! payrecon: a blockchain payment reconciliation engine.
//!
//! The shop embeds [`Engine`]: it records rental orders and balance top-ups, keeps each
//! customer's USD balance in a double-entry [`ledger`], and settles orders from that balance.
//! Payment instructions give each order a fresh address and a locked amount; chain watchers
//! report what arrives and the matcher settles it. Money always flows one way:
//! watcher -> chain event -> matcher -> ledger -> reports.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use payrecon::{Engine, RentalOrderRequest, TopupRequest, Usd};
//!
//! let engine = Engine::open("sqlite::memory:").await?;
//! // A top-up, credited here by hand as a confirmed payment would credit it.
//! let topup = engine
//!     .create_topup(&TopupRequest {
//!         reference: "topup-1".into(),
//!         account_id: "customer-7".into(),
//!         amount_usd: "500".parse()?,
//!     })
//!     .await?;
//! assert!(topup.created);
//! let order = engine
//!     .create_rental_order(&RentalOrderRequest {
//!         reference: "order-1".into(),
//!         account_id: "customer-7".into(),
//!         gpu_model: "H100".into(),
//!         duration_days: 7,
//!         lots: 1,
//!         total_usd: Usd::from_dollars(420),
//!     })
//!     .await?;
//! assert_eq!(order.value.total_usd, Usd::from_dollars(420));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! The shop guide's library example (docs/shop.md) runs the whole shop flow (instructions, a watcher's report,
//! the event stream, a rental paid from the balance, the report); `examples/embed` is a crate
//! that does it through this public API alone.
//!
//! Inside, each module names only its own layer or those below (`scripts/layers.py` checks
//! it): the edge and services (`api`, `serve`, `watcher`, `webhooks`; the binary's CLI), the
//! `engine` with one method per thing a user does, the domain's rules and views (`matcher`,
//! `operator`, `report`, …) over a transaction or plain data, the `store` with every SQL
//! statement, and plain types (`money`, `order`, `ledger`, `records`, …).

#![warn(missing_docs)]
// Every `pub` item is reachable from the root, or in a build with the workshop's hooks from
// `test_utils`: the lint checks that build, where the second door exists.
#![cfg_attr(feature = "test-utils", warn(unreachable_pub))]

mod api;
mod audit;
mod books;
mod catalog;
mod checkout;
mod clock;
pub mod config;
mod crash;
mod doctor;
mod engine;
mod error;
mod history;
mod indexes;
mod intent;
mod keys;
mod leases;
pub mod ledger;
mod matcher;
mod money;
mod networks;
mod operator;
mod order;
mod outbox;
mod outflows;
mod payments;
mod rates;
mod records;
mod refund;
mod report;
mod serve;
mod shutdown;
mod store;
mod stuck;
mod support;
mod tokens;
mod wallet;
mod watcher;
mod webhooks;

#[cfg(feature = "test-utils")]
#[doc(hidden)]
pub mod test_utils;

/// README's Rust examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// Every `payrecon::…` path a guide names, compiled (tests/it/docs.rs checks that each one a
/// guide names is imported here):
///
/// ```
/// use payrecon::Engine;
/// use payrecon::chain;
/// use payrecon::chain::Method;
/// use payrecon::test_utils;
/// use payrecon::verify_signature;
/// ```
#[cfg(doctest)]
struct GuidePaths;

/// The shop's guide's Rust examples (the library's whole flow), compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/shop.md")]
struct ShopGuideDoctests;

pub use api::{ApiOptions, parse_time, router};
pub use books::{
    Cents, DailyReceipts, ExportTotals, FX_GAIN_LOSS, GlMovement, JournalFormat, Period,
    PeriodLogLine, PeriodReport, PeriodStatus, ReceiptValue, RollForward, UnvaluedEntry,
    ValuationPass, XERO_LINES_PER_FILE, entry_id,
};
pub use catalog::Catalog;
pub use config::Config;
pub use config::{DEFAULT_LOOKAHEAD, Durability, MAX_LOOKAHEAD};
pub use doctor::{DoctorCheck, Verdict, doctor};
pub use engine::refund_prepare::{PreparedRefund, RefundPsbt, UnsignedRefund};
pub use engine::{BalancePayment, Created, Engine};
pub use error::Error;
pub use history::{AccountHistory, HistoryItem};
pub use intent::{IntentStatus, PaymentIntent};
pub use keys::{AccountKey, CounterMoved, KeyState, NetworkKeys, UtxoWallet, UtxoWallets};
pub use leases::Lease;
pub use ledger::{AccountBalance, TrialBalance};
pub use money::Usd;
pub use operator::{Action, Resolved};
pub use order::{
    AccountId, Order, OrderKind, OrderRef, OrderRuleError, OrderStatus, RentalOrderRequest,
    TopupRequest,
};
pub use payments::{PaymentInstructions, PaymentSettings};
pub use records::{
    AssetRollForward, CryptoRate, ExceptionRecord, FailingEndpoint, FeePayer, FundedIndexes,
    HoldingsCheck, IntentEvent, OperatorAction, Refund, RefundState, ReportingRate, StoredTransfer,
    Valuation, WatcherHealth,
};
pub use refund::RefundAmount;
pub use report::{CsvSection, ReportFormat, ReportQuery, ReportTotals};
pub use serve::serve;
pub use store::{BackupReport, SCHEMA_VERSION, StoreError as DatabaseError};
pub use stuck::{Page, StuckItem, StuckOptions};
pub use support::{AddressView, Finding, OrderView, TransferView};
pub use tokens::Role;
pub use wallet::{
    GAP_MARGIN, Holding, HoldingDifference, HoldingKeyTotal, HoldingTotal, HoldingsRollForward,
    HoldingsSort, HoldingsVerification, HoldingsView, MAX_HOLDINGS_PAGE, SweepAddress, SweepList,
    UnknownToken, WalletExport, derivation_path,
};
pub use webhooks::{EVENT_ID_HEADER, SIGNATURE_HEADER, SIGNATURE_TOLERANCE, verify_signature};

/// The chain types a caller names: [`chain::Method`], [`chain::Network`], amounts and
/// addresses.
pub use payrecon_chain_core as chain;
