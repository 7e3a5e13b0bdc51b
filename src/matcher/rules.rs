//! The matcher's rules, written once against [`MatchStore`]: how an event changes a
//! transfer, how an intent's state follows from its transfers and the clock, and which ledger
//! entries each change posts.

use chrono::{DateTime, Utc};
use payrecon_chain_core::{Amount, ChainEvent, Method, ReceivedAsset};

use super::{MatchPolicy, MatchStore};
use crate::error::Error;
use crate::intent::{IntentStatus, PaymentIntent, usd_value_of};
use crate::ledger::{Account, Currency, EntryKind, NewEntry, Posting, SuspenseReason};
use crate::money::Usd;
use crate::order::{Order, OrderKind, OrderStatus};
use crate::store::StoreError;
use crate::store::payments::{ExceptionRecord, NewEvent, StoredTransfer};

use super::CreditPolicy;

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
            if transfer.amount != old.amount
                || transfer.asset != old.asset
                || transfer.to_address != old.to_address
            {
                return Err(Error::InvalidEvent(format!(
                    "transfer {} reported with another amount, asset or address than before",
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
            Some(height) if *confirmations == 0 || height > tip_height => {
                return Err(Error::InvalidEvent(format!(
                    "transfer {id} in block {height} reported unconfirmed or above the tip {tip_height}"
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
    let dust = match &transfer.asset {
        ReceivedAsset::Method { method } => policy.is_dust(*method, transfer.amount),
        ReceivedAsset::OtherToken { .. } => false,
    };
    if dust {
        open_dust_exception(store, &transfer, now).await?;
    } else {
        open_exception(
            store,
            "unmatched",
            None,
            None,
            Some(&transfer),
            format!(
                "{} to {} matched no payment instructions",
                describe(&transfer),
                transfer.to_address
            ),
            now,
        )
        .await?;
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

/// Re-derives an intent's state from its transfers and the clock, posting what became due.
pub(crate) async fn evaluate_intent<S: MatchStore>(
    store: &mut S,
    policy: &MatchPolicy,
    intent_id: &str,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let mut intent = store
        .intent(intent_id)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("intent {intent_id} vanished")))?;
    let order = store
        .lock_order(&intent.order_ref)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("order {} vanished", intent.order_ref)))?;
    let mut transfers = store.transfers_of_intent(intent_id).await?;
    let before = intent.clone();
    let required = policy.required(intent.network(), intent.usd);
    let deadline_ms = intent.deadline.timestamp_millis();
    let is_own_asset = |t: &StoredTransfer| {
        t.asset
            == (ReceivedAsset::Method {
                method: intent.method,
            })
    };
    let mut entries = Vec::new();
    let mut credited = Vec::new();

    for (index, transfer) in transfers.iter().enumerate() {
        if transfer.removed {
            continue;
        }
        let confirmed = transfer.confirmations >= required;
        let uncredited = transfer.credited_entry.is_none();
        if !is_own_asset(transfer) {
            open_exception(
                store,
                "wrong_asset",
                Some(&intent),
                Some(&order),
                Some(transfer),
                format!(
                    "{} sent to a {} intent: never credited as {}",
                    describe(transfer),
                    intent.method,
                    intent.method
                ),
                now,
            )
            .await?;
            if let (ReceivedAsset::Method { method }, true, true) =
                (&transfer.asset, confirmed, uncredited)
            {
                let key = next_booking_key(store, &format!("wrong-asset:{}", transfer.id)).await?;
                let concerns = Concerns {
                    intent: Some(&intent),
                    order: Some(&order),
                    transfer: Some(transfer),
                };
                open_rebooking_exception(store, "wrong_asset", concerns, &key, now).await?;
                entries.push(hold_entry(
                    &key,
                    *method,
                    transfer.amount,
                    SuspenseReason::WrongAsset,
                    Some(&intent),
                ));
                credited.push((index, key));
            }
        } else if intent.status == IntentStatus::Settled {
            if uncredited {
                open_exception(
                    store,
                    "paid_after_settlement",
                    Some(&intent),
                    Some(&order),
                    Some(transfer),
                    format!(
                        "{} arrived after the intent was settled",
                        describe(transfer)
                    ),
                    now,
                )
                .await?;
                if confirmed {
                    let entry =
                        book_after_settlement(store, transfer, &intent, &order, policy, now)
                            .await?;
                    credited.push((index, entry.idempotency_key.clone()));
                    entries.push(entry);
                }
            }
        } else if transfer.seen_at_ms > deadline_ms && uncredited {
            open_exception(
                store,
                "paid_late",
                Some(&intent),
                Some(&order),
                Some(transfer),
                format!(
                    "{} first seen after the deadline {}",
                    describe(transfer),
                    intent.deadline.to_rfc3339()
                ),
                now,
            )
            .await?;
            if confirmed {
                let key = next_booking_key(store, &format!("late:{}", transfer.id)).await?;
                let concerns = Concerns {
                    intent: Some(&intent),
                    order: Some(&order),
                    transfer: Some(transfer),
                };
                open_rebooking_exception(store, "paid_late", concerns, &key, now).await?;
                entries.push(extra_money_entry(
                    &key,
                    &intent,
                    &order,
                    transfer.amount,
                    policy.late_payment,
                    SuspenseReason::Late,
                ));
                credited.push((index, key));
            }
        }
    }

    let good: Vec<usize> = (0..transfers.len())
        .filter(|i| !transfers[*i].removed && is_own_asset(&transfers[*i]))
        .collect();
    intent.first_seen_at = good
        .iter()
        .map(|i| transfers[*i].seen_at_ms)
        .min()
        .and_then(DateTime::from_timestamp_millis);
    let on_time: Vec<usize> = good
        .iter()
        .copied()
        .filter(|i| {
            transfers[*i].seen_at_ms <= deadline_ms && transfers[*i].credited_entry.is_none()
        })
        .collect();

    if intent.status != IntentStatus::Settled {
        let confirmed: Vec<usize> = on_time
            .iter()
            .copied()
            .filter(|i| transfers[*i].confirmations >= required)
            .collect();
        let received = sum(confirmed.iter().map(|i| transfers[*i].amount))?;
        let tolerance =
            intent.amount.base_units() * u128::from(policy.underpayment_tolerance_bps) / 10_000;
        let threshold = Amount::from_base_units(intent.amount.base_units() - tolerance);
        if !confirmed.is_empty() && received >= threshold {
            if order.status == OrderStatus::Open {
                let n = intent.settlement_count + 1;
                let key = format!("settle:{}:{n}", intent.id);
                let paid = received.min(intent.amount);
                entries.push(settlement_entry(&key, &intent, &order, paid));
                if let Some(excess) = received.checked_sub(intent.amount).filter(|e| !e.is_zero()) {
                    let overpaid_key = format!("overpaid:{}:{n}", intent.id);
                    entries.push(extra_money_entry(
                        &overpaid_key,
                        &intent,
                        &order,
                        excess,
                        policy.overpayment,
                        SuspenseReason::Overpaid,
                    ));
                    open_exception(
                        store,
                        "overpaid",
                        Some(&intent),
                        Some(&order),
                        None,
                        format!(
                            "{} {} more than the {} asked",
                            intent.method.format_amount(excess),
                            intent.method.asset(),
                            intent.amount_decimal()
                        ),
                        now,
                    )
                    .await?;
                }
                for index in &confirmed {
                    credited.push((*index, key.clone()));
                }
                store.mark_settled(&order.reference, &key).await?;
                intent.status = IntentStatus::Settled;
                intent.settled_at = Some(now);
                intent.settlement_count = n;
            } else {
                for index in confirmed {
                    let transfer = &transfers[index];
                    open_exception(
                        store,
                        "paid_after_settlement",
                        Some(&intent),
                        Some(&order),
                        Some(transfer),
                        format!(
                            "{} paid an order that was already settled",
                            describe(transfer)
                        ),
                        now,
                    )
                    .await?;
                    let entry =
                        book_after_settlement(store, transfer, &intent, &order, policy, now)
                            .await?;
                    credited.push((index, entry.idempotency_key.clone()));
                    entries.push(entry);
                }
            }
        }
    }

    if intent.status != IntentStatus::Settled {
        let pending: Vec<usize> = on_time
            .iter()
            .copied()
            .filter(|i| !credited.iter().any(|(c, _)| c == i))
            .collect();
        let all_confirmed = pending
            .iter()
            .all(|i| transfers[*i].confirmations >= required);
        let past_deadline = now.timestamp_millis() > deadline_ms;
        let late_money = good.iter().any(|i| transfers[*i].seen_at_ms > deadline_ms);
        intent.status = if intent.settlement_count > 0 {
            IntentStatus::ReorgedAfterCredit
        } else if !pending.is_empty() {
            match (past_deadline, all_confirmed) {
                (true, true) => IntentStatus::Underpaid,
                (false, true) => IntentStatus::Confirmed,
                (_, false) => IntentStatus::Seen,
            }
        } else if late_money {
            IntentStatus::PaidLate
        } else if past_deadline {
            IntentStatus::Expired
        } else {
            IntentStatus::AwaitingPayment
        };
        if intent.status == IntentStatus::Underpaid {
            let received = sum(pending.iter().map(|i| transfers[*i].amount))?;
            open_exception(
                store,
                "underpaid",
                Some(&intent),
                Some(&order),
                None,
                format!(
                    "{} of {} {} received by the deadline",
                    intent.method.format_amount(received),
                    intent.amount_decimal(),
                    intent.method.asset()
                ),
                now,
            )
            .await?;
        }
    }

    post(store, entries).await?;
    for (index, key) in credited {
        transfers[index].credited_entry = Some(key);
        store.put_transfer(&transfers[index]).await?;
    }
    if intent != before {
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

/// Where an intent's USD goes: revenue for a rental, the customer's balance for a top-up.
fn usd_target(order: &Order) -> Account {
    match order.kind {
        OrderKind::Rental(_) => Account::RevenueRentals,
        OrderKind::Topup => Account::CustomerBalance(order.account_id.clone()),
    }
}

/// The brief's settlement: crypto into custody, converted at the locked rate, USD to the order.
fn settlement_entry(key: &str, intent: &PaymentIntent, order: &Order, paid: Amount) -> NewEntry {
    let memo = format!(
        "{} {} {} settles {} at {} USD/{}",
        intent.id,
        intent.method.format_amount(paid),
        intent.method.asset(),
        order.reference,
        intent.rate.usd_per_unit,
        intent.method.asset()
    );
    conversion_entry(
        key,
        memo,
        intent,
        paid,
        intent.usd.cents(),
        usd_target(order),
    )
}

/// Crypto into custody, converted at the intent's locked rate in `fx:<method>`, and the USD
/// credited to `credited`: the one shape every credit of a payment takes.
fn conversion_entry(
    key: &str,
    memo: String,
    intent: &PaymentIntent,
    amount: Amount,
    cents: i64,
    credited: Account,
) -> NewEntry {
    let crypto = Currency::Crypto(intent.method);
    let units = amount.base_units() as i128;
    NewEntry {
        idempotency_key: key.to_owned(),
        kind: EntryKind::Payment,
        reference: Some(intent.order_ref.to_string()),
        memo,
        postings: vec![
            Posting::debit(Account::Custody(intent.method), crypto, units),
            Posting::credit(Account::Fx(intent.method), crypto, units),
            Posting::debit(Account::Fx(intent.method), Currency::Usd, i128::from(cents)),
            Posting::credit(credited, Currency::Usd, i128::from(cents)),
        ],
    }
}

/// Money beyond what was asked or after the deadline: held in suspense, or (by policy) its
/// USD value at the locked rate credited to the customer's balance.
fn extra_money_entry(
    key: &str,
    intent: &PaymentIntent,
    order: &Order,
    amount: Amount,
    policy: CreditPolicy,
    reason: SuspenseReason,
) -> NewEntry {
    let cents = usd_value_of(amount, intent.rate.usd_per_unit, intent.method).unwrap_or(0);
    if policy == CreditPolicy::Hold || cents == 0 {
        return hold_entry(key, intent.method, amount, reason, Some(intent));
    }
    let memo = format!(
        "{} {} credited to the balance at the locked rate",
        intent.method.format_amount(amount),
        intent.method.asset()
    );
    let customer = Account::CustomerBalance(order.account_id.clone());
    conversion_entry(key, memo, intent, amount, cents, customer)
}

/// Money to an intent whose order is already paid: never absorbed into the order, treated as
/// an overpayment under the overpayment policy.
fn after_settlement_entry(
    key: &str,
    transfer: &StoredTransfer,
    intent: &PaymentIntent,
    order: &Order,
    policy: &MatchPolicy,
) -> NewEntry {
    extra_money_entry(
        key,
        intent,
        order,
        transfer.amount,
        policy.overpayment,
        SuspenseReason::Overpaid,
    )
}

/// Money to an intent whose order is already paid, booked under its next key (with its own
/// exception when a reorg spent the earlier one).
async fn book_after_settlement<S: MatchStore>(
    store: &mut S,
    transfer: &StoredTransfer,
    intent: &PaymentIntent,
    order: &Order,
    policy: &MatchPolicy,
    now: DateTime<Utc>,
) -> Result<NewEntry, Error> {
    let key = next_booking_key(store, &format!("after-settlement:{}", transfer.id)).await?;
    let concerns = Concerns {
        intent: Some(intent),
        order: Some(order),
        transfer: Some(transfer),
    };
    open_rebooking_exception(store, "paid_after_settlement", concerns, &key, now).await?;
    Ok(after_settlement_entry(
        &key, transfer, intent, order, policy,
    ))
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

/// Crypto into custody, held in suspense for an operator.
fn hold_entry(
    key: &str,
    method: Method,
    amount: Amount,
    reason: SuspenseReason,
    intent: Option<&PaymentIntent>,
) -> NewEntry {
    let crypto = Currency::Crypto(method);
    let units = amount.base_units() as i128;
    NewEntry {
        idempotency_key: key.to_owned(),
        kind: EntryKind::Payment,
        reference: intent.map(|i| i.order_ref.to_string()),
        memo: format!(
            "{} {} held: {}",
            method.format_amount(amount),
            method.asset(),
            reason.as_str()
        ),
        postings: vec![
            Posting::debit(Account::Custody(method), crypto, units),
            Posting::credit(Account::Suspense(reason), crypto, units),
        ],
    }
}

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

fn describe(transfer: &StoredTransfer) -> String {
    match &transfer.asset {
        ReceivedAsset::Method { method } => format!(
            "{} {} ({})",
            method.format_amount(transfer.amount),
            method.asset(),
            transfer.id
        ),
        ReceivedAsset::OtherToken { contract } => format!(
            "{} units of token {contract} ({})",
            transfer.amount, transfer.id
        ),
    }
}

fn sum(mut amounts: impl Iterator<Item = Amount>) -> Result<Amount, Error> {
    amounts
        .try_fold(Amount::ZERO, Amount::checked_add)
        .ok_or_else(|| StoreError::Corrupt("received amounts overflow".into()).into())
}
