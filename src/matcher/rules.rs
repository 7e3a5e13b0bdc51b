//! The matcher's rules, written once against [`MatchStore`]: how an event changes a
//! transfer, and how what [`decide`] decides about an intent is written, with the bookings
//! that take a reorged credit back and hold money no intent owns.

use chrono::{DateTime, Utc};
use payrecon_chain_core::{ChainEvent, ReceivedAsset};

use super::decide::{Booking, BookingKey, Decision, Step, decide, describe, hold_entry};
use super::{MatchPolicy, MatchStore};
use crate::error::Error;
use crate::intent::{IntentStatus, PaymentIntent};
use crate::ledger::{Account, Currency, NewEntry, Posting, SuspenseReason};
use crate::money::Usd;
use crate::order::Order;
use crate::records::{ExceptionRecord, StoredTransfer};
use crate::store::StoreError;
use crate::store::payments::NewEvent;

/// Applies one chain event (already checked with [`check_event`]).
pub(crate) async fn apply_event<S: MatchStore>(
    store: &mut S,
    policy: &MatchPolicy,
    event: &ChainEvent,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let id = event.transfer_id();
    let existing = store.transfer(id).await?;
    let mut state = match (existing, event) {
        (None, ChainEvent::Removed { .. }) => return Ok(()),
        (
            None,
            ChainEvent::Observed {
                transfer,
                confirmations,
                block_height,
                seen_at_ms,
                tip_height,
            },
        ) => StoredTransfer {
            id: transfer.id.clone(),
            to_address: transfer.to_address.clone(),
            asset: transfer.asset.clone(),
            amount: transfer.amount,
            from_address: transfer.from_address.clone(),
            intent_id: store
                .intent_for_watch_key(transfer.id.network, &transfer.to_address)
                .await?,
            confirmations: *confirmations,
            block_height: *block_height,
            removed: false,
            tip_height: *tip_height,
            seen_at_ms: *seen_at_ms,
            credited_entry: None,
        },
        (Some(old), event) if event.tip_height() < old.tip_height => return Ok(()),
        (
            Some(old),
            ChainEvent::Observed {
                transfer,
                confirmations,
                block_height,
                seen_at_ms,
                tip_height,
            },
        ) => {
            let other_sender = matches!(
                (&transfer.from_address, &old.from_address),
                (Some(now), Some(before)) if now != before
            );
            if transfer.amount != old.amount
                || transfer.asset != old.asset
                || transfer.to_address != old.to_address
                || other_sender
            {
                return Err(Error::InvalidEvent(format!(
                    "transfer {} reported with another amount, asset, address or sender than before",
                    transfer.id
                )));
            }
            if *tip_height == old.tip_height && old.removed {
                return Ok(());
            }
            // Two observations at one tip: the more confirmed one wins, with its block.
            let (confirmations, block_height) =
                if *tip_height == old.tip_height && old.confirmations > *confirmations {
                    (old.confirmations, old.block_height)
                } else {
                    (*confirmations, *block_height)
                };
            StoredTransfer {
                confirmations,
                block_height,
                removed: false,
                tip_height: *tip_height,
                seen_at_ms: old.seen_at_ms.min(*seen_at_ms),
                // Recorded before payrecon kept senders: filled in now.
                from_address: old.from_address.or_else(|| transfer.from_address.clone()),
                ..old
            }
        }
        (Some(old), ChainEvent::Removed { tip_height, .. }) => {
            if old.removed {
                return Ok(());
            }
            StoredTransfer {
                removed: true,
                tip_height: *tip_height,
                ..old
            }
        }
    };
    if state.removed
        && let Some(key) = state.credited_entry.take()
    {
        take_back_credit(store, &state, &key, now).await?;
    }
    store.put_transfer(&state).await?;
    match state.intent_id.clone() {
        Some(intent_id) => evaluate_intent(store, policy, &intent_id, now).await,
        None => account_unmatched(store, policy, state, now).await,
    }
}

/// Longest txid or address accepted from a watcher; real ones are at most 90 characters.
const MAX_CHAIN_TEXT_LEN: usize = 128;

/// Refuses events no real chain produces, before anything is stored.
pub(crate) fn check_event(event: &ChainEvent) -> Result<(), Error> {
    let text_ok = |text: &str| {
        !text.is_empty()
            && text.len() <= MAX_CHAIN_TEXT_LEN
            && text.chars().all(|c| c.is_ascii_graphic())
    };
    let id = event.transfer_id();
    if !text_ok(&id.txid) {
        return Err(Error::InvalidEvent(format!(
            "transfer id {:?} is not a transaction id",
            id.txid.chars().take(40).collect::<String>()
        )));
    }
    if let ChainEvent::Observed {
        transfer,
        confirmations,
        block_height,
        tip_height,
        ..
    } = event
    {
        if !text_ok(&transfer.to_address) {
            return Err(Error::InvalidEvent(format!(
                "transfer {id} pays no valid address"
            )));
        }
        match block_height {
            None if *confirmations > 0 => {
                return Err(Error::InvalidEvent(format!(
                    "transfer {id} has {confirmations} confirmations but no block"
                )));
            }
            // In a block at zero confirmations is a coin the chain does not let be spent yet
            // (a Litecoin peg-out before its maturity): seen, never confirmed.
            Some(height) if height > tip_height => {
                return Err(Error::InvalidEvent(format!(
                    "transfer {id} in block {height} reported above the tip {tip_height}"
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A transfer to an address no intent owns (for Solana: to the recipient without a known
/// reference): an exception, and once confirmed, custody with the money in suspense.
async fn account_unmatched<S: MatchStore>(
    store: &mut S,
    policy: &MatchPolicy,
    mut transfer: StoredTransfer,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    if transfer.removed {
        return Ok(());
    }
    if transfer.asset.is_unknown_token() {
        return open_unknown_token_exception(store, &transfer, now).await;
    }
    let dust = policy.is_dust(&transfer);
    let unissued = store
        .unissued(transfer.id.network, &transfer.to_address)
        .await?;
    if dust && unissued.is_none() {
        open_dust_exception(store, &transfer, now).await?;
    } else {
        let detail = match unissued {
            Some((key_id, index)) => format!(
                "{} paid to an address not yet handed out ({}, key {key_id}, index {index}): \
                 an address a database since restored from a backup may have given a customer; \
                 the key's counter moved past it",
                describe(&transfer),
                transfer.to_address
            ),
            None => format!(
                "{} to {} matched no payment instructions",
                describe(&transfer),
                transfer.to_address
            ),
        };
        open_exception(store, "unmatched", None, None, Some(&transfer), detail, now).await?;
    }
    let required = policy.required(transfer.id.network, Usd::ZERO);
    if let (ReceivedAsset::Method { method }, None) = (&transfer.asset, &transfer.credited_entry)
        && transfer.confirmations >= required
    {
        let key = next_booking_key(store, &format!("unmatched:{}", transfer.id)).await?;
        let concerns = Concerns {
            transfer: Some(&transfer),
            ..Concerns::default()
        };
        open_rebooking_exception(store, "unmatched", concerns, &key, now).await?;
        let entry = hold_entry(
            &key,
            *method,
            transfer.amount,
            SuspenseReason::Unmatched,
            None,
        );
        post(store, vec![entry]).await?;
        transfer.credited_entry = Some(key);
        store.put_transfer(&transfer).await?;
    }
    Ok(())
}

/// Re-derives an intent's state from its transfers and the clock, posting what became due:
/// reads what [`decide`] needs, then applies what it decided.
pub(crate) async fn evaluate_intent<S: MatchStore>(
    store: &mut S,
    policy: &MatchPolicy,
    intent_id: &str,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let intent = store
        .intent(intent_id)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("intent {intent_id} vanished")))?;
    let order = store
        .lock_order(&intent.order_ref)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("order {} vanished", intent.order_ref)))?;
    let transfers = store.transfers_of_intent(intent_id).await?;
    let decision = decide(&intent, &order, &transfers, policy, now)?;
    apply(store, &intent, &order, transfers, decision, now).await
}

/// Writes a [`Decision`]: exceptions and the order's settlement in order, every booking under
/// its resolved key in one post, the credited transfers, and the intent's new state.
async fn apply<S: MatchStore>(
    store: &mut S,
    before: &PaymentIntent,
    order: &Order,
    mut transfers: Vec<StoredTransfer>,
    decision: Decision,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let intent = decision.intent;
    let mut entries = Vec::new();
    let mut credited = Vec::new();
    for step in decision.steps {
        match step {
            Step::Exception {
                kind,
                transfer,
                detail,
            } => {
                let transfer = transfer.map(|i| &transfers[i]);
                open_exception(
                    store,
                    kind,
                    Some(&intent),
                    Some(order),
                    transfer,
                    detail,
                    now,
                )
                .await?;
            }
            Step::Booking(Booking {
                key,
                mut entry,
                credits,
            }) => {
                entry.idempotency_key = match key {
                    BookingKey::Fixed(key) => key,
                    BookingKey::Next {
                        base,
                        rebooking_kind,
                    } => {
                        let key = next_booking_key(store, &base).await?;
                        let concerns = Concerns {
                            intent: Some(&intent),
                            order: Some(order),
                            transfer: credits.first().map(|i| &transfers[*i]),
                        };
                        if let Some(kind) = rebooking_kind {
                            open_rebooking_exception(store, kind, concerns, &key, now).await?;
                        }
                        key
                    }
                };
                credited.extend(
                    credits
                        .into_iter()
                        .map(|i| (i, entry.idempotency_key.clone())),
                );
                entries.push(entry);
            }
            Step::SettleOrder { key } => store.mark_settled(&order.reference, &key).await?,
            Step::UnknownToken { transfer } => {
                open_unknown_token_exception(store, &transfers[transfer], now).await?
            }
        }
    }
    post(store, entries).await?;
    for (index, key) in credited {
        debug_assert!(
            transfers[index].credited_entry.is_none(),
            "a transfer is credited once"
        );
        transfers[index].credited_entry = Some(key);
        store.put_transfer(&transfers[index]).await?;
    }
    if intent != *before {
        store.put_intent_state(&intent).await?;
    }
    if intent.status != before.status {
        record_status_change(store, &intent, before.status).await?;
    }
    Ok(())
}

/// Appends an intent's state change to the event stream (and so to the webhooks' outbox).
pub(crate) async fn record_status_change<S: MatchStore>(
    store: &mut S,
    intent: &PaymentIntent,
    from: IntentStatus,
) -> Result<(), Error> {
    let detail = serde_json::json!({
        "from": from,
        "to": intent.status,
        "message": intent.status.customer_message(),
    });
    store
        .append_event(NewEvent {
            intent_id: Some(intent.id.clone()),
            order_ref: Some(intent.order_ref.to_string()),
            kind: "status_changed",
            detail,
        })
        .await
}

/// Takes back the credit a removed transfer had earned, by compensating entries. A
/// settlement is reversed whole (with its overpayment), its order reopened and flagged.
async fn take_back_credit<S: MatchStore>(
    store: &mut S,
    transfer: &StoredTransfer,
    key: &str,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let mut keys = vec![key.to_owned()];
    if let Some(rest) = key.strip_prefix("settle:") {
        keys.push(format!("overpaid:{rest}"));
    }
    // What operators did with this transfer's money moved it on in the books: undo that too.
    let resolutions = store.action_entries(&transfer.id).await?;
    keys.extend(resolutions.iter().cloned());
    for key in &keys {
        reverse_with_coverage(store, key).await?;
    }
    let intent = match &transfer.intent_id {
        Some(id) => store.intent(id).await?,
        None => None,
    };
    if let Some(mut intent) = intent {
        for mut sibling in store.transfers_of_intent(&intent.id).await? {
            if sibling.credited_entry.as_deref() == Some(key) && sibling.id != transfer.id {
                sibling.credited_entry = None;
                store.put_transfer(&sibling).await?;
            }
        }
        for settled in resolutions.iter().filter(|k| k.starts_with("settle:")) {
            store
                .reopen_order(&intent.order_ref, settled, "reorged_after_credit")
                .await?;
            intent.status = IntentStatus::ReorgedAfterCredit;
            intent.settled_at = None;
            store.put_intent_state(&intent).await?;
        }
        if key.starts_with("settle:") {
            store
                .reopen_order(&intent.order_ref, key, "reorged_after_credit")
                .await?;
            intent.status = IntentStatus::ReorgedAfterCredit;
            intent.settled_at = None;
            store.put_intent_state(&intent).await?;
        }
        let order = store.order(&intent.order_ref).await?;
        open_exception(store, "reorged_after_credit", Some(&intent), order.as_ref(), Some(transfer),
            format!("{} was removed from the chain after it was credited ({key}); the credit was reversed", describe(transfer)), now).await?;
    } else {
        open_exception(
            store,
            "reorged_after_credit",
            None,
            None,
            Some(transfer),
            format!(
                "{} was removed from the chain after it was accounted ({key})",
                describe(transfer)
            ),
            now,
        )
        .await?;
    }
    Ok(())
}

/// Posts the opposite of `key`'s entry. What a customer's balance can no longer cover (it was
/// spent) is charged to `suspense:reversed` instead: the balance never goes negative.
async fn reverse_with_coverage<S: MatchStore>(store: &mut S, key: &str) -> Result<(), Error> {
    let Some(original) = store.entry(key).await? else {
        return Ok(());
    };
    let mut reversal = NewEntry::reversal_of_entry(
        &original,
        format!("reversal of {key}: transfer removed from the chain"),
    );
    let mut shortfalls = Vec::new();
    for (customer, debit) in reversal.customer_nets() {
        if debit <= 0 {
            continue;
        }
        let available = -store.lock_and_sum_customer(&customer).await?;
        let shortfall = debit - available.max(0);
        if shortfall > 0 {
            shortfalls.push((customer, shortfall));
        }
    }
    for (customer, shortfall) in shortfalls {
        let leg = reversal
            .postings
            .iter_mut()
            .find(|p| p.account.customer() == Some(&customer))
            .expect("the customer has a leg");
        leg.amount_minor -= shortfall;
        reversal.postings.retain(|p| p.amount_minor != 0);
        reversal.postings.push(Posting::debit(
            Account::Suspense(SuspenseReason::Reversed),
            Currency::Usd,
            shortfall,
        ));
    }
    post(store, vec![reversal]).await
}

async fn post<S: MatchStore>(store: &mut S, entries: Vec<NewEntry>) -> Result<(), Error> {
    if entries.is_empty() {
        return Ok(());
    }
    for entry in &entries {
        entry.validate()?;
    }
    store.post(entries).await
}

/// The key of a transfer's `n`th booking under `base` (1-based): `base`, then `base#2`, …
///
/// A transfer that a reorg took out and the chain then put back is booked again: its first
/// key is spent (the entry stands beside its `reverse:` entry), so posting under it again
/// would be taken as a replay and the money would be in no account.
pub(crate) fn booking_key(base: &str, n: u32) -> String {
    if n <= 1 {
        base.to_owned()
    } else {
        format!("{base}#{n}")
    }
}

/// The first booking key under `base` that no entry holds yet. Only called for a transfer
/// without a credit, so every earlier key under `base` is one a reorg reversed.
async fn next_booking_key<S: MatchStore>(store: &mut S, base: &str) -> Result<String, Error> {
    for n in 1..=MAX_BOOKINGS {
        let key = booking_key(base, n);
        if store.entry(&key).await?.is_none() {
            return Ok(key);
        }
    }
    Err(StoreError::Corrupt(format!(
        "{base} was booked {MAX_BOOKINGS} times: no chain reorganises one transfer that often"
    ))
    .into())
}

/// Bookings of one transfer a store accepts; each one past the first needs a reorg that
/// removed the transfer and a chain that mined it again.
const MAX_BOOKINGS: u32 = 1_000;

async fn open_exception<S: MatchStore>(
    store: &mut S,
    kind: &str,
    intent: Option<&PaymentIntent>,
    order: Option<&Order>,
    transfer: Option<&StoredTransfer>,
    detail: String,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let subject = match (transfer, intent) {
        (Some(t), _) => t.id.to_string(),
        (None, Some(i)) => i.id.clone(),
        (None, None) => "unknown".into(),
    };
    let concerns = Concerns {
        intent,
        order,
        transfer,
    };
    let record = concerns.exception(format!("{kind}:{subject}"), kind, detail, now);
    store.open_exception(record).await
}

/// What an exception is about.
#[derive(Clone, Copy, Default)]
struct Concerns<'a> {
    intent: Option<&'a PaymentIntent>,
    order: Option<&'a Order>,
    transfer: Option<&'a StoredTransfer>,
}

impl Concerns<'_> {
    /// An open exception `id` of `kind` about these.
    fn exception(
        self,
        id: String,
        kind: &str,
        detail: String,
        now: DateTime<Utc>,
    ) -> ExceptionRecord {
        ExceptionRecord {
            id,
            kind: kind.to_owned(),
            intent_id: self.intent.map(|i| i.id.clone()),
            order_ref: self.order.map(|o| o.reference.to_string()),
            transfer: self.transfer.map(|t| t.id.to_string()),
            detail,
            opened_at: now,
            resolved_at: None,
            resolution: None,
        }
    }
}

/// The one exception for a token contract payrecon does not accept (a fake "USDT", airdrop
/// spam, a poisoning token): opened by its first transfer to a watched address, and standing
/// for every later one; `payrecon holdings` counts them per contract, apart from real assets.
/// Nothing of it is ever booked.
async fn open_unknown_token_exception<S: MatchStore>(
    store: &mut S,
    transfer: &StoredTransfer,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let network = transfer.id.network;
    let ReceivedAsset::OtherToken { contract } = &transfer.asset else {
        return Ok(());
    };
    let detail = format!(
        "transfers of the token contract {contract} on {network}, which payrecon does not \
         accept, reach the shop's addresses (the first: {} to {}); never credited, never \
         booked. `payrecon holdings` counts them per contract; dismiss once looked at",
        describe(transfer),
        transfer.to_address
    );
    let id = format!("unknown_token:{network}:{contract}");
    let record = Concerns::default().exception(id, "unknown_token", detail, now);
    store.open_exception(record).await
}

/// The one exception for a network's dust on one day (UTC, by when it was first seen): opened
/// by its first receipt, and standing for every later one.
async fn open_dust_exception<S: MatchStore>(
    store: &mut S,
    transfer: &StoredTransfer,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let network = transfer.id.network;
    let day = DateTime::from_timestamp_millis(transfer.seen_at_ms)
        .unwrap_or(now)
        .format("%Y-%m-%d");
    let detail = format!(
        "receipts below the dust limit matched no payment instructions on {network} on {day} \
         (the first: {} to {}); each is held in suspense:unmatched and listed in the \
         reconciliation report as unmatched",
        describe(transfer),
        transfer.to_address
    );
    let id = format!("unmatched_dust:{network}:{day}");
    let record = Concerns::default().exception(id, "unmatched_dust", detail, now);
    store.open_exception(record).await
}

/// A transfer booked again after a reorg (`key` of generation 2 or later) holds its money anew:
/// its first exception may be resolved already, so operators get one of this booking's own,
/// `<kind>:<transfer>#<n>`, whose money is the entry under `key`.
async fn open_rebooking_exception<S: MatchStore>(
    store: &mut S,
    kind: &str,
    concerns: Concerns<'_>,
    key: &str,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let (Some((_, generation)), Some(transfer)) = (key.rsplit_once('#'), concerns.transfer) else {
        return Ok(());
    };
    let id = format!("{kind}:{}#{generation}", transfer.id);
    let detail = format!(
        "{} is on the chain again after a reorg removed it, and is held again ({key})",
        describe(transfer)
    );
    store
        .open_exception(concerns.exception(id, kind, detail, now))
        .await
}
