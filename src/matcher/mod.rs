//! The matcher: turns chain events into transfer states, intent states and ledger entries,
//! all inside the caller's transaction (with the watcher's cursor, when a watcher calls it), so
//! a crash at any point loses nothing and doubles nothing.
//!
//! Every ledger effect has a deterministic idempotency key, so replaying events, or evaluating
//! an intent twice, posts nothing twice:
//! `settle:<intent>:<n>`, `overpaid:<intent>:<n>`, `late:<transfer>`, `after-settlement:<transfer>`,
//! `wrong-asset:<transfer>`, `unmatched:<transfer>`, and `reverse:<key>` for each of them. A
//! transfer a reorg removed and the chain then mined again is booked again under the next key,
//! `late:<transfer>#2` and so on (a settlement's `<n>` counts the same way), with an exception
//! of that booking's own: a spent key is never posted to twice.
//!
//! The rules (`rules`) are written once, against [`MatchStore`]: what they read and write.
//! Two stores carry them out:
//! - `direct`, the reference: every read and write is its own statement, as they happen. A
//!   batch of N events costs about fifteen statements per event.
//! - `batch`, the one the engine uses: everything a batch of events can touch is read in a
//!   few set reads, the rules run against that working set in memory, event after event
//!   exactly as the reference would, and what changed is written in a few multi-row
//!   statements. The number of statements does not grow with the batch.
//!
//! `tests/matcher_paths.rs` runs random event logs through both and requires the same
//! database contents.

mod batch;
mod decide;
mod direct;
mod rules;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use chrono::{DateTime, Utc};
use payrecon_chain_core::{Amount, ChainEvent, Method, Network, ReceivedAsset, TransferId};
use serde::{Deserialize, Serialize};

use crate::config::{ConfirmationTier, CreditPolicy};
use crate::error::Error;
use crate::intent::{IntentStatus, PaymentIntent};
use crate::ledger::NewEntry;
use crate::money::Usd;
use crate::order::{AccountId, Order, OrderRef};
use crate::records::{ExceptionRecord, StoredTransfer};
use crate::store::WriteTx;
use crate::store::payments::NewEvent;

pub(crate) use batch::BatchStore;
#[cfg(feature = "test-utils")]
pub use decide::{Booking, BookingKey, Decision, Step, decide};
pub(crate) use direct::DirectStore;
pub(crate) use rules::booking_key;

/// Confirmations a network needs, more for larger payments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfirmationRule {
    /// Confirmations for any payment.
    pub confirmations: u32,
    /// Payments of at least `min_usd` need `confirmations`.
    #[serde(default)]
    pub tiers: Vec<ConfirmationTier>,
}

impl ConfirmationRule {
    /// Confirmations a payment of `usd` needs.
    pub fn required(&self, usd: Usd) -> u32 {
        self.tiers
            .iter()
            .filter(|tier| usd >= tier.min_usd)
            .map(|tier| tier.confirmations)
            .fold(self.confirmations, u32::max)
    }

    /// The most confirmations any payment needs: beyond it, a transfer's depth changes nothing.
    pub fn deepest(&self) -> u32 {
        self.tiers
            .iter()
            .map(|tier| tier.confirmations)
            .fold(self.confirmations, u32::max)
    }
}

/// The matcher's rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatchPolicy {
    /// An underpayment of at most this many basis points of the amount still settles.
    pub underpayment_tolerance_bps: u32,
    /// Money beyond the amount, and payments to an already settled intent.
    pub overpayment: CreditPolicy,
    /// Payments first seen after the deadline.
    pub late_payment: CreditPolicy,
    /// Per network.
    pub confirmations: BTreeMap<Network, ConfirmationRule>,
    /// Per method, the amount below which a receipt is dust (`payments.dust`): at an intent's
    /// address it never counts toward the intent and opens no exception, held in
    /// `suspense:dust`; to no payment instructions it is booked like any unmatched receipt,
    /// but counted in one exception per network and day instead of one each
    /// (address-poisoning and spam transfers come by the thousand).
    pub dust: BTreeMap<Method, Amount>,
    /// The merchant's own addresses per network (`treasury_addresses`): native coin from one
    /// of them to a token payment's address is the fee its sweep needs, not a payment, and
    /// an outflow to one is a move to treasury.
    pub treasury: BTreeMap<Network, BTreeSet<String>>,
}

impl MatchPolicy {
    /// The brief's defaults: BTC 2, LTC 6, ETH 12, Tron 19, Solana 1 (its watcher reports a
    /// finalized transaction as one confirmation); no tolerance; hold everything unusual.
    pub fn defaults() -> MatchPolicy {
        let rule = |confirmations| ConfirmationRule {
            confirmations,
            tiers: Vec::new(),
        };
        MatchPolicy {
            underpayment_tolerance_bps: 0,
            overpayment: CreditPolicy::Hold,
            late_payment: CreditPolicy::Hold,
            confirmations: BTreeMap::from([
                (Network::Bitcoin, rule(2)),
                (Network::Litecoin, rule(6)),
                (Network::Ethereum, rule(12)),
                (Network::Tron, rule(19)),
                (Network::Solana, rule(1)),
            ]),
            dust: default_dust(),
            treasury: BTreeMap::new(),
        }
    }

    /// Whether `address` is one of the merchant's own on `network`.
    pub(crate) fn is_treasury(&self, network: Network, address: &str) -> bool {
        self.treasury
            .get(&network)
            .is_some_and(|own| own.contains(address))
    }

    /// Whether a receipt is dust: of one of the shop's methods, below that method's limit.
    pub(crate) fn is_dust(&self, transfer: &StoredTransfer) -> bool {
        match &transfer.asset {
            ReceivedAsset::Method { method } => self
                .dust
                .get(method)
                .is_some_and(|limit| transfer.amount < *limit),
            ReceivedAsset::OtherToken { .. } => false,
        }
    }

    fn required(&self, network: Network, usd: Usd) -> u32 {
        self.confirmations
            .get(&network)
            .map_or(1, |rule| rule.required(usd))
    }
}

/// Dust by default: a few hundredths of a cent to a cent, far below any payment the shop asks
/// for, and what address-poisoning and spam transfers send.
fn default_dust() -> BTreeMap<Method, Amount> {
    [
        (Method::Btc, "0.00001"),
        (Method::Ltc, "0.0001"),
        (Method::Eth, "0.000001"),
        (Method::UsdtErc20, "0.01"),
        (Method::UsdcErc20, "0.01"),
        (Method::Trx, "0.1"),
        (Method::UsdtTrc20, "0.01"),
        (Method::Sol, "0.00001"),
    ]
    .into_iter()
    .map(|(method, limit)| {
        let limit = method
            .parse_amount(limit)
            .expect("the default dust limits parse");
        (method, limit)
    })
    .collect()
}

/// What the rules read and write. Every method is one step of today's matcher; a store decides
/// whether the step is a statement now ([`DirectStore`]) or a lookup in a working set read
/// beforehand and a row written later ([`BatchStore`]). The two must be indistinguishable to
/// the rules.
pub(crate) trait MatchStore: Send {
    /// A transfer by id, as it stands now.
    fn transfer(
        &mut self,
        id: &TransferId,
    ) -> impl Future<Output = Result<Option<StoredTransfer>, Error>> + Send;

    /// The intent that owns `watch_key` on `network`, if any.
    fn intent_for_watch_key(
        &mut self,
        network: Network,
        watch_key: &str,
    ) -> impl Future<Output = Result<Option<String>, Error>> + Send;

    /// The key and derivation index of `address` on `network` when money was found there ahead
    /// of the key's counter (an address not yet handed out).
    fn unissued(
        &mut self,
        network: Network,
        address: &str,
    ) -> impl Future<Output = Result<Option<(String, u32)>, Error>> + Send;

    /// An intent by id, as it stands now.
    fn intent(
        &mut self,
        id: &str,
    ) -> impl Future<Output = Result<Option<PaymentIntent>, Error>> + Send;

    /// An order, locked until the transaction ends (on PostgreSQL).
    fn lock_order(
        &mut self,
        reference: &OrderRef,
    ) -> impl Future<Output = Result<Option<Order>, Error>> + Send;

    /// An order, as it stands now.
    fn order(
        &mut self,
        reference: &OrderRef,
    ) -> impl Future<Output = Result<Option<Order>, Error>> + Send;

    /// Every transfer that paid the intent, in `store::payments::transfer_order`.
    fn transfers_of_intent(
        &mut self,
        intent_id: &str,
    ) -> impl Future<Output = Result<Vec<StoredTransfer>, Error>> + Send;

    /// Writes a transfer's state.
    fn put_transfer(
        &mut self,
        transfer: &StoredTransfer,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Writes an intent's evaluated state.
    fn put_intent_state(
        &mut self,
        intent: &PaymentIntent,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Marks an open order settled by a payment; an order not open is corrupt state.
    fn mark_settled(
        &mut self,
        reference: &OrderRef,
        entry_key: &str,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Reopens an order if `entry_key` is what settled it, flagging it for operators.
    fn reopen_order(
        &mut self,
        reference: &OrderRef,
        entry_key: &str,
        attention: &str,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Opens an exception unless one with its id exists; a new one also goes to the event
    /// stream (`exception_opened`).
    fn open_exception(
        &mut self,
        exception: ExceptionRecord,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Appends to the event stream.
    fn append_event(&mut self, event: NewEvent) -> impl Future<Output = Result<(), Error>> + Send;

    /// Posts validated entries, each once per idempotency key.
    fn post(&mut self, entries: Vec<NewEntry>) -> impl Future<Output = Result<(), Error>> + Send;

    /// A journal entry by key, as posted.
    fn entry(&mut self, key: &str) -> impl Future<Output = Result<Option<NewEntry>, Error>> + Send;

    /// Locks a customer and sums their balance postings (credits negative).
    fn lock_and_sum_customer(
        &mut self,
        customer: &AccountId,
    ) -> impl Future<Output = Result<i128, Error>> + Send;

    /// The entries operators posted about this transfer, oldest first.
    fn action_entries(
        &mut self,
        transfer: &TransferId,
    ) -> impl Future<Output = Result<Vec<String>, Error>> + Send;
}

/// Which store carries the rules out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatcherPath {
    /// Set reads, decisions in memory, multi-row writes: a fixed number of statements per
    /// batch. What the engine uses.
    #[default]
    Batched,
    /// Every step its own statement, as it happens: the reference the batched path is held
    /// to (`tests/matcher_paths.rs`), and a baseline for benchmarks; only in a build with
    /// the workshop's hooks.
    #[cfg(feature = "test-utils")]
    OneByOne,
}

/// Applies a batch of events in order inside `tx` along `path`. `after_event` runs after each
/// event is decided.
pub(crate) async fn apply_events(
    path: MatcherPath,
    tx: &mut WriteTx,
    policy: &MatchPolicy,
    events: &[ChainEvent],
    now: DateTime<Utc>,
    after_event: impl FnMut() + Send,
) -> Result<(), Error> {
    match path {
        MatcherPath::Batched => apply_batch(tx, policy, events, now, after_event).await,
        #[cfg(feature = "test-utils")]
        MatcherPath::OneByOne => apply_one_by_one(tx, policy, events, now, after_event).await,
    }
}

/// One working set for the whole batch, a fixed number of statements.
async fn apply_batch(
    tx: &mut WriteTx,
    policy: &MatchPolicy,
    events: &[ChainEvent],
    now: DateTime<Utc>,
    mut after_event: impl FnMut() + Send,
) -> Result<(), Error> {
    for event in events {
        rules::check_event(event)?;
    }
    let mut store = BatchStore::load_for_events(tx, events, now).await?;
    for event in events {
        rules::apply_event(&mut store, policy, event, now).await?;
        after_event();
    }
    store.flush().await
}

#[cfg(feature = "test-utils")]
/// Each step a statement, as it happens.
async fn apply_one_by_one(
    tx: &mut WriteTx,
    policy: &MatchPolicy,
    events: &[ChainEvent],
    now: DateTime<Utc>,
    mut after_event: impl FnMut() + Send,
) -> Result<(), Error> {
    let mut store = DirectStore::new(tx, now);
    for event in events {
        rules::check_event(event)?;
        rules::apply_event(&mut store, policy, event, now).await?;
        after_event();
    }
    Ok(())
}

/// Re-evaluates intents whose deadline passed, along `path`.
pub(crate) async fn evaluate_due(
    path: MatcherPath,
    tx: &mut WriteTx,
    policy: &MatchPolicy,
    intent_ids: &[String],
    now: DateTime<Utc>,
) -> Result<(), Error> {
    match path {
        MatcherPath::Batched => {
            let mut store = BatchStore::load_for_intents(tx, intent_ids, now).await?;
            for id in intent_ids {
                rules::evaluate_intent(&mut store, policy, id, now).await?;
            }
            store.flush().await
        }
        #[cfg(feature = "test-utils")]
        MatcherPath::OneByOne => {
            let mut store = DirectStore::new(tx, now);
            for id in intent_ids {
                rules::evaluate_intent(&mut store, policy, id, now).await?;
            }
            Ok(())
        }
    }
}

/// Appends an intent's state change to the event stream (and so to the webhooks' outbox),
/// for callers outside the matcher that change an intent's state (operators).
pub(crate) async fn record_status_change(
    tx: &mut WriteTx,
    intent: &PaymentIntent,
    from: IntentStatus,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    rules::record_status_change(&mut DirectStore::new(tx, now), intent, from).await
}
