//! The matcher's decision about one intent, as a pure function of the intent, its order, its
//! transfers, the policy and the clock: which exceptions open, what is booked under which key,
//! whether the order settles, and the intent's next state. It reads nothing and writes
//! nothing; [`super::rules::evaluate_intent`] reads its inputs and applies what it returns.

use chrono::{DateTime, Utc};
use payrecon_chain_core::{Amount, Method, ReceivedAsset};

use super::{CreditPolicy, MatchPolicy};
use crate::error::Error;
use crate::intent::{IntentStatus, PaymentIntent, usd_value_of};
use crate::ledger::{Account, Currency, EntryKind, NewEntry, Posting, SuspenseReason};
use crate::order::{Order, OrderKind, OrderStatus};
use crate::records::StoredTransfer;
use crate::store::StoreError;

/// What the matcher does about one intent, in the order it is done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The exceptions, bookings and settlement, in order.
    pub steps: Vec<Step>,
    /// The intent's state afterwards.
    pub intent: PaymentIntent,
}

/// One thing the matcher does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// An exception about the intent (and, when given, one of its transfers by index).
    Exception {
        /// `wrong_asset`, `paid_late`, `paid_after_settlement`, `overpaid` or `underpaid`.
        kind: &'static str,
        /// The transfer concerned, as an index into the decision's transfers.
        transfer: Option<usize>,
        /// What operators read.
        detail: String,
    },
    /// An entry to post, crediting the transfers it names.
    Booking(Booking),
    /// The order is settled by the entry under this key.
    SettleOrder {
        /// The settlement's key.
        key: String,
    },
    /// A token of a contract payrecon does not accept reached the intent's address: one
    /// exception per contract, however many transfers and addresses (`unknown_token:`).
    UnknownToken {
        /// The transfer, as an index into the decision's transfers.
        transfer: usize,
    },
}

/// An entry the decision posts and the transfers it credits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Booking {
    /// Under which key.
    pub key: BookingKey,
    /// The entry; its idempotency key is the resolved key.
    pub entry: NewEntry,
    /// The transfers (indexes) this entry credits.
    pub credits: Vec<usize>,
}

/// The key of a booking: fixed, or the next free generation under a base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BookingKey {
    /// A settlement's own keys (`settle:<intent>:<n>`, `overpaid:<intent>:<n>`).
    Fixed(String),
    /// One transfer's booking (`late:<t>`, `wrong-asset:<t>`, `after-settlement:<t>`): its
    /// first key no entry holds yet, `base`, `base#2`, …; a booking after the first opens an
    /// exception of `rebooking_kind` of its own, when it has one (money held again).
    Next {
        /// The first generation's key.
        base: String,
        /// The kind of the exception a later generation opens.
        rebooking_kind: Option<&'static str>,
    },
}

/// Decides what evaluating `intent` does now. `transfers` are every transfer to it, in the
/// order the store keeps them; the decision names them by index.
pub fn decide(
    intent: &PaymentIntent,
    order: &Order,
    transfers: &[StoredTransfer],
    policy: &MatchPolicy,
    now: DateTime<Utc>,
) -> Result<Decision, Error> {
    let mut decision = Decision {
        steps: Vec::new(),
        intent: intent.clone(),
    };
    let mut credited: Vec<usize> = Vec::new();
    let required = policy.required(intent.network(), intent.usd);
    let deadline_ms = intent.deadline.timestamp_millis();
    let own = ReceivedAsset::Method {
        method: intent.method,
    };

    for (index, transfer) in transfers.iter().enumerate() {
        if transfer.removed {
            continue;
        }
        let step = Side {
            intent,
            order,
            policy,
            index,
            transfer,
            confirmed: transfer.confirmations >= required,
        };
        if step.is_dust() {
            step.dust(&mut decision.steps, &mut credited);
        } else if transfer.asset.is_unknown_token() {
            decision.steps.push(Step::UnknownToken { transfer: index });
        } else if transfer.asset != own {
            if step.is_fee_top_up() {
                step.fee_top_up(&mut decision.steps, &mut credited);
            } else {
                step.wrong_asset(&mut decision.steps, &mut credited);
            }
        } else if transfer.credited_entry.is_some() {
            continue;
        } else if intent.status == IntentStatus::Settled {
            step.after_settlement(
                "arrived after the intent was settled",
                &mut decision.steps,
                &mut credited,
            );
        } else if transfer.seen_at_ms > deadline_ms {
            step.late(&mut decision.steps, &mut credited);
        }
    }

    let good: Vec<usize> = (0..transfers.len())
        .filter(|i| !transfers[*i].removed && transfers[*i].asset == own)
        .filter(|i| !policy.is_dust(&transfers[*i]))
        .collect();
    decision.intent.first_seen_at = good
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
        settle(
            &mut decision,
            order,
            transfers,
            &on_time,
            policy,
            required,
            now,
            &mut credited,
        )?;
    }
    if decision.intent.status != IntentStatus::Settled {
        let pending: Vec<usize> = on_time
            .iter()
            .copied()
            .filter(|i| !credited.contains(i))
            .collect();
        let late_money = good.iter().any(|i| transfers[*i].seen_at_ms > deadline_ms);
        decision.intent.status = unsettled_status(
            &decision.intent,
            pending
                .iter()
                .all(|i| transfers[*i].confirmations >= required),
            !pending.is_empty(),
            late_money,
            now.timestamp_millis() > deadline_ms,
        );
        if decision.intent.status == IntentStatus::Underpaid {
            let received = sum(pending.iter().map(|i| transfers[*i].amount))?;
            decision.steps.push(Step::Exception {
                kind: "underpaid",
                transfer: None,
                detail: format!(
                    "{} of {} {} received by the deadline",
                    intent.method.format_amount(received),
                    intent.amount_decimal(),
                    intent.method.asset()
                ),
            });
        }
    }
    debug_assert!(
        intent.status.can_become(decision.intent.status),
        "{} cannot become {}",
        intent.status,
        decision.intent.status
    );
    Ok(decision)
}

/// Settles the intent when its confirmed on-time money reaches the amount (less the
/// tolerance): the order if it is open, else each transfer as money after settlement.
#[allow(clippy::too_many_arguments)]
fn settle(
    decision: &mut Decision,
    order: &Order,
    transfers: &[StoredTransfer],
    on_time: &[usize],
    policy: &MatchPolicy,
    required: u32,
    now: DateTime<Utc>,
    credited: &mut Vec<usize>,
) -> Result<(), Error> {
    let intent = decision.intent.clone();
    let confirmed: Vec<usize> = on_time
        .iter()
        .copied()
        .filter(|i| transfers[*i].confirmations >= required)
        .collect();
    let received = sum(confirmed.iter().map(|i| transfers[*i].amount))?;
    let tolerance =
        intent.amount.base_units() * u128::from(policy.underpayment_tolerance_bps) / 10_000;
    let threshold = Amount::from_base_units(intent.amount.base_units() - tolerance);
    if confirmed.is_empty() || received < threshold {
        return Ok(());
    }
    if order.status != OrderStatus::Open {
        for index in confirmed {
            let side = Side {
                intent: &intent,
                order,
                policy,
                index,
                transfer: &transfers[index],
                confirmed: true,
            };
            side.after_settlement(
                "paid an order that was already settled",
                &mut decision.steps,
                credited,
            );
        }
        return Ok(());
    }
    let n = intent.settlement_count + 1;
    let key = format!("settle:{}:{n}", intent.id);
    let paid = received.min(intent.amount);
    decision.steps.push(Step::Booking(Booking {
        key: BookingKey::Fixed(key.clone()),
        entry: settlement_entry(&key, &intent, order, paid),
        credits: confirmed.clone(),
    }));
    credited.extend(&confirmed);
    if let Some(excess) = received.checked_sub(intent.amount).filter(|e| !e.is_zero()) {
        let overpaid_key = format!("overpaid:{}:{n}", intent.id);
        let entry = extra_money_entry(
            &overpaid_key,
            &intent,
            order,
            excess,
            policy.overpayment,
            SuspenseReason::Overpaid,
        );
        decision.steps.push(Step::Booking(Booking {
            key: BookingKey::Fixed(overpaid_key),
            entry,
            credits: Vec::new(),
        }));
        decision.steps.push(Step::Exception {
            kind: "overpaid",
            transfer: None,
            detail: format!(
                "{} {} more than the {} asked",
                intent.method.format_amount(excess),
                intent.method.asset(),
                intent.amount_decimal()
            ),
        });
    }
    decision.steps.push(Step::SettleOrder { key });
    decision.intent.status = IntentStatus::Settled;
    decision.intent.settled_at = Some(now);
    decision.intent.settlement_count = n;
    Ok(())
}

/// The state of an intent that is not settled, from what it holds and the clock.
fn unsettled_status(
    intent: &PaymentIntent,
    all_pending_confirmed: bool,
    any_pending: bool,
    late_money: bool,
    past_deadline: bool,
) -> IntentStatus {
    if intent.settlement_count > 0 {
        IntentStatus::ReorgedAfterCredit
    } else if any_pending {
        match (past_deadline, all_pending_confirmed) {
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
    }
}

/// One transfer that is not part of the intent's settlement: the wrong asset, money after the
/// settlement, or money after the deadline.
struct Side<'a> {
    intent: &'a PaymentIntent,
    order: &'a Order,
    policy: &'a MatchPolicy,
    index: usize,
    transfer: &'a StoredTransfer,
    confirmed: bool,
}

impl Side<'_> {
    fn exception(&self, kind: &'static str, detail: String) -> Step {
        Step::Exception {
            kind,
            transfer: Some(self.index),
            detail,
        }
    }

    fn booking(&self, base: String, rebooking_kind: &'static str, entry: NewEntry) -> Step {
        Step::Booking(Booking {
            key: BookingKey::Next {
                base,
                rebooking_kind: Some(rebooking_kind),
            },
            entry,
            credits: vec![self.index],
        })
    }

    /// Books this transfer alone under `base`, opening no exception however often a reorg
    /// makes it book again: money that is nobody's case (dust, the merchant's own).
    fn book_quietly(
        &self,
        base: String,
        entry: NewEntry,
        steps: &mut Vec<Step>,
        credited: &mut Vec<usize>,
    ) {
        steps.push(Step::Booking(Booking {
            key: BookingKey::Next {
                base,
                rebooking_kind: None,
            },
            entry,
            credits: vec![self.index],
        }));
        credited.push(self.index);
    }

    /// Below its method's dust limit, and not the merchant's own fee top-up.
    fn is_dust(&self) -> bool {
        self.policy.is_dust(self.transfer) && !self.is_fee_top_up()
    }

    /// Dust is no payment: it never counts toward the intent, opens no exception and sends no
    /// webhook; once confirmed it is held in `suspense:dust`, part of the holdings, and the
    /// reconciliation report sums it in one line per method and period.
    fn dust(&self, steps: &mut Vec<Step>, credited: &mut Vec<usize>) {
        let ReceivedAsset::Method { method } = &self.transfer.asset else {
            return;
        };
        if !self.confirmed || self.transfer.credited_entry.is_some() {
            return;
        }
        let base = format!("dust:{}", self.transfer.id);
        let entry = hold_entry(
            &base,
            *method,
            self.transfer.amount,
            SuspenseReason::Dust,
            Some(self.intent),
        );
        self.book_quietly(base, entry, steps, credited);
    }

    /// The native coin from one of the merchant's treasury addresses to an intent that asked
    /// for a token: what the address needs to pay its sweep's fees, sent by the merchant.
    fn is_fee_top_up(&self) -> bool {
        let network = self.transfer.id.network;
        self.transfer.asset
            == (ReceivedAsset::Method {
                method: network.native_method(),
            })
            && self
                .transfer
                .from_address
                .as_deref()
                .is_some_and(|from| self.policy.is_treasury(network, from))
    }

    /// A fee top-up moves the merchant's own coin from its treasury into custody once
    /// confirmed: no exception, nothing in suspense, never credited to the order.
    fn fee_top_up(&self, steps: &mut Vec<Step>, credited: &mut Vec<usize>) {
        if !self.confirmed || self.transfer.credited_entry.is_some() {
            return;
        }
        let base = format!("top-up:{}", self.transfer.id);
        let method = self.transfer.id.network.native_method();
        let units = self.transfer.amount.base_units() as i128;
        let crypto = Currency::Crypto(method);
        let entry = NewEntry {
            idempotency_key: base.clone(),
            kind: EntryKind::InternalTransfer,
            reference: Some(self.intent.order_ref.to_string()),
            memo: format!(
                "{} {} from the treasury to pay the sweep's fees",
                method.format_amount(self.transfer.amount),
                method.asset()
            ),
            postings: vec![
                Posting::debit(Account::Custody(method), crypto, units),
                Posting::credit(Account::Treasury(method), crypto, units),
            ],
        };
        self.book_quietly(base, entry, steps, credited);
    }

    /// Another asset than the intent's: never credited as it, held once confirmed (a token
    /// payrecon does not know is never booked at all).
    fn wrong_asset(&self, steps: &mut Vec<Step>, credited: &mut Vec<usize>) {
        let method = self.intent.method;
        steps.push(self.exception(
            "wrong_asset",
            format!(
                "{} sent to a {method} intent: never credited as {method}",
                describe(self.transfer)
            ),
        ));
        if let (ReceivedAsset::Method { method }, true, None) = (
            &self.transfer.asset,
            self.confirmed,
            &self.transfer.credited_entry,
        ) {
            let base = format!("wrong-asset:{}", self.transfer.id);
            let entry = hold_entry(
                &base,
                *method,
                self.transfer.amount,
                SuspenseReason::WrongAsset,
                Some(self.intent),
            );
            steps.push(self.booking(base, "wrong_asset", entry));
            credited.push(self.index);
        }
    }

    /// Money to an intent whose order is already paid: never absorbed into the order, booked
    /// under the overpayment policy once confirmed.
    fn after_settlement(&self, what: &str, steps: &mut Vec<Step>, credited: &mut Vec<usize>) {
        steps.push(self.exception(
            "paid_after_settlement",
            format!("{} {what}", describe(self.transfer)),
        ));
        if self.confirmed {
            let base = format!("after-settlement:{}", self.transfer.id);
            let entry = extra_money_entry(
                &base,
                self.intent,
                self.order,
                self.transfer.amount,
                self.policy.overpayment,
                SuspenseReason::Overpaid,
            );
            steps.push(self.booking(base, "paid_after_settlement", entry));
            credited.push(self.index);
        }
    }

    /// Money first seen after the deadline: held for support (or credited, by policy).
    fn late(&self, steps: &mut Vec<Step>, credited: &mut Vec<usize>) {
        steps.push(self.exception(
            "paid_late",
            format!(
                "{} first seen after the deadline {}",
                describe(self.transfer),
                self.intent.deadline.to_rfc3339()
            ),
        ));
        if self.confirmed {
            let base = format!("late:{}", self.transfer.id);
            let entry = extra_money_entry(
                &base,
                self.intent,
                self.order,
                self.transfer.amount,
                self.policy.late_payment,
                SuspenseReason::Late,
            );
            steps.push(self.booking(base, "paid_late", entry));
            credited.push(self.index);
        }
    }
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

/// Crypto into custody, held in suspense for an operator.
pub(super) fn hold_entry(
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

/// A transfer as exceptions describe it.
pub(super) fn describe(transfer: &StoredTransfer) -> String {
    let what = match &transfer.asset {
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
    };
    // Where a refund or a question would go, on the chains that name a sender.
    match &transfer.from_address {
        Some(sender) => format!("{what} from {sender}"),
        None => what,
    }
}

fn sum(mut amounts: impl Iterator<Item = Amount>) -> Result<Amount, Error> {
    amounts
        .try_fold(Amount::ZERO, Amount::checked_add)
        .ok_or_else(|| StoreError::Corrupt("received amounts overflow".into()).into())
}
