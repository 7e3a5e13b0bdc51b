//! Operators' actions on exceptions: accept as paid, credit the balance, mark refunded,
//! dismiss. Each is one transaction that writes the audit log, closes the exception, appends
//! an event for the webhooks and, where money moves, posts a compensating journal entry.
//!
//! Where the money of an exception sits decides what can be done with it:
//! - held in suspense by the matcher (overpaid, paid late, paid after settlement, wrong
//!   asset, unmatched) or by the holdings check (money found with no receipt): the entry that
//!   held it names the suspense account and the amount;
//! - underpaid: the matcher books nothing until an operator decides, so the confirmed
//!   transfers are booked into custody by the action itself;
//! - nothing (a reorg that was already reversed, a token payrecon does not account for).

use chrono::{DateTime, Utc};
use payrecon_chain_core::{Amount, Method, ReceivedAsset};
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::intent::{IntentStatus, PaymentIntent, usd_value_of};
use crate::ledger::{Account, Currency, EntryKind, NewEntry, Posting};
use crate::money::Usd;
use crate::order::{AccountId, Order, OrderKind, OrderStatus, SettledVia};
use crate::records::OperatorAction;
use crate::records::{ExceptionRecord, StoredTransfer};
use crate::store::payments::{self};
use crate::store::{StoreError, WriteTx, ledger, orders};

/// Longest actor name and reason accepted; the audit log is for people.
pub(crate) const MAX_ACTOR_LEN: usize = 64;
pub(crate) const MAX_REASON_LEN: usize = 500;

/// What an operator decided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Settle the intent's order with the money received (underpaid, paid late).
    AcceptAsPaid,
    /// Convert the money to USD and credit a customer's balance. `usd` defaults to the value
    /// at the intent's locked rate; `account` to the intent's customer. Both are required
    /// when there is no intent (unmatched) or no locked rate (another asset).
    CreditBalance {
        /// The customer to credit.
        #[serde(default)]
        account: Option<String>,
        /// The USD to credit.
        #[serde(default)]
        usd: Option<Usd>,
    },
    /// The money was sent back in `refund_txid`: it leaves custody.
    MarkRefunded {
        /// The refund's transaction id.
        refund_txid: String,
    },
    /// The money is the merchant's own, sent from its wallet (native coin topping an
    /// address up to pay a sweep's gas): it leaves the customers' suspense for the treasury
    /// it came from, and stays in custody until swept.
    MarkOwnFunds,
    /// Nothing to do with money (it holds none): close it.
    Dismiss,
}

impl Action {
    /// As the audit log writes it.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Action::AcceptAsPaid => "accept_as_paid",
            Action::CreditBalance { .. } => "credit_balance",
            Action::MarkRefunded { .. } => "mark_refunded",
            Action::MarkOwnFunds => "mark_own_funds",
            Action::Dismiss => "dismiss",
        }
    }
}

/// An exception closed by an operator, with what moved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Resolved {
    /// The exception, now resolved.
    pub exception: ExceptionRecord,
    /// The audit log line.
    pub action: OperatorAction,
    /// The compensating entry, where money moved in the books.
    pub entry: Option<NewEntry>,
}

/// Money an exception holds, and where.
pub(crate) struct Held {
    /// Where the crypto sits now: a suspense account, or custody-to-be for underpayments.
    pub(crate) source: Option<Account>,
    pub(crate) method: Method,
    pub(crate) units: u128,
    /// Underpaid transfers to mark as accounted by the action.
    pub(crate) unbooked: Vec<StoredTransfer>,
}

/// Settles an intent and its order by an operator's acceptance.
pub(crate) async fn settle(
    tx: &mut WriteTx,
    mut intent: PaymentIntent,
    order: &Order,
    n: u32,
    key: &str,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    orders::mark_settled(tx.conn(), &order.reference, SettledVia::Payment, key, now).await?;
    let from = intent.status;
    intent.status = IntentStatus::Settled;
    intent.settled_at = Some(now);
    intent.settlement_count = n;
    payments::update_intent_state(tx.conn(), &intent).await?;
    crate::matcher::record_status_change(tx, &intent, from, now).await
}

/// An exception not yet resolved, and its intent where it has one: what an operator acts on.
pub(crate) async fn open_exception(
    tx: &mut WriteTx,
    exception_id: &str,
) -> Result<(ExceptionRecord, Option<PaymentIntent>), Error> {
    let exception = crate::store::operations::get_exception(tx.conn(), exception_id)
        .await?
        .ok_or_else(|| Error::ExceptionNotFound(exception_id.chars().take(80).collect()))?;
    if let Some(resolution) = &exception.resolution {
        return Err(Error::ActionRefused {
            exception: exception.id.clone(),
            reason: format!("already resolved ({resolution})"),
        });
    }
    let intent = match &exception.intent_id {
        Some(id) => payments::get_intent(tx.conn(), id).await?,
        None => None,
    };
    Ok((exception, intent))
}

/// Where the money of `exception` sits, if it holds any.
pub(crate) async fn held_money(
    tx: &mut WriteTx,
    exception: &ExceptionRecord,
    intent: Option<&PaymentIntent>,
) -> Result<Option<Held>, Error> {
    if exception.kind == "underpaid" {
        let Some(intent) = intent else {
            return Ok(None);
        };
        let own = ReceivedAsset::Method {
            method: intent.method,
        };
        let unbooked: Vec<StoredTransfer> = payments::transfers_of_intent(tx.conn(), &intent.id)
            .await?
            .into_iter()
            .filter(|t| !t.removed && t.asset == own && t.credited_entry.is_none())
            .collect();
        let units = unbooked
            .iter()
            .try_fold(0u128, |sum, t| sum.checked_add(t.amount.base_units()))
            .ok_or_else(|| StoreError::Corrupt("underpaid amounts overflow".into()))?;
        return Ok((units > 0).then_some(Held {
            source: None,
            method: intent.method,
            units,
            unbooked,
        }));
    }
    let Some(key) = hold_key(exception, intent) else {
        return Ok(None);
    };
    if ledger::get_entry(tx.conn(), &format!("reverse:{key}"))
        .await?
        .is_some()
    {
        return Ok(None);
    }
    let Some(posted) = ledger::get_entry(tx.conn(), &key).await? else {
        return Ok(None);
    };
    Ok(posted
        .entry
        .postings
        .iter()
        .find_map(|leg| match (&leg.account, leg.currency) {
            (Account::Suspense(_), Currency::Crypto(method)) if leg.amount_minor < 0 => {
                Some(Held {
                    source: Some(leg.account.clone()),
                    method,
                    units: u128::try_from(-leg.amount_minor).ok()?,
                    unbooked: Vec::new(),
                })
            }
            _ => None,
        }))
}

/// The exception kind of a settled payment's money taken back to go to the customer
/// (`engine::payment_refunds`).
pub(crate) const RETURNED: &str = "returned";

/// The matcher's entry that put an exception's money in suspense (see `matcher`'s keys).
/// A transfer booked again after a reorg has an exception of that booking's own, its id ending
/// in `#<n>`: it names the `n`th booking's key.
pub(crate) fn hold_key(
    exception: &ExceptionRecord,
    intent: Option<&PaymentIntent>,
) -> Option<String> {
    let transfer = exception.transfer.as_deref();
    let base = match (exception.kind.as_str(), transfer) {
        ("overpaid", _) => {
            return intent.map(|i| format!("overpaid:{}:{}", i.id, i.settlement_count));
        }
        ("paid_late", Some(t)) => format!("late:{t}"),
        ("paid_after_settlement", Some(t)) => format!("after-settlement:{t}"),
        ("wrong_asset", Some(t)) => format!("wrong-asset:{t}"),
        ("unmatched", Some(t)) => format!("unmatched:{t}"),
        // The holdings check books what it found under the exception's own id, and so does
        // a settled payment's refund what it takes back.
        ("holdings_difference" | RETURNED, _) => {
            return Some(exception.id.clone());
        }
        _ => return None,
    };
    let generation = exception
        .id
        .rsplit_once('#')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(1);
    Some(crate::matcher::booking_key(&base, generation))
}

/// The crypto leaves `source` (or enters custody, for an underpayment), is converted in
/// `fx:<method>`, and `cents` USD are credited to `credited`.
pub(crate) fn conversion(
    key: &str,
    held: &Held,
    cents: i64,
    credited: Account,
    memo: String,
    intent: Option<&PaymentIntent>,
) -> NewEntry {
    let crypto = Currency::Crypto(held.method);
    let units = held.units as i128;
    let source = held.source.clone().unwrap_or(Account::Custody(held.method));
    NewEntry {
        idempotency_key: key.to_owned(),
        kind: EntryKind::Adjustment,
        reference: intent.map(|i| i.order_ref.to_string()),
        memo,
        postings: vec![
            Posting::debit(source, crypto, units),
            Posting::credit(Account::Fx(held.method), crypto, units),
            Posting::debit(Account::Fx(held.method), Currency::Usd, i128::from(cents)),
            Posting::credit(credited, Currency::Usd, i128::from(cents)),
        ],
    }
}

/// Held crypto sent back: it leaves suspense and custody.
pub(crate) fn refund_entry(
    key: &str,
    source: &Account,
    method: Method,
    units: u128,
    refund_txid: &str,
) -> NewEntry {
    release_entry(
        key,
        source,
        (method, units),
        Account::Custody(method),
        &format!("refunded in {refund_txid}"),
    )
}

/// Suspense gives the money back to the treasury that sent it; custody keeps it until swept.
fn own_funds_entry(key: &str, source: &Account, method: Method, units: u128) -> NewEntry {
    release_entry(
        key,
        source,
        (method, units),
        Account::Treasury(method),
        "came from the merchant's own wallet",
    )
}

/// Money held in `source` released to `to`, as an operator's adjustment.
fn release_entry(
    key: &str,
    source: &Account,
    (method, units): (Method, u128),
    to: Account,
    why: &str,
) -> NewEntry {
    let crypto = Currency::Crypto(method);
    NewEntry {
        idempotency_key: key.to_owned(),
        kind: EntryKind::Adjustment,
        reference: None,
        memo: format!(
            "{} {why}",
            method.format_with_asset(Amount::from_base_units(units))
        ),
        postings: vec![
            Posting::debit(source.clone(), crypto, units as i128),
            Posting::credit(to, crypto, units as i128),
        ],
    }
}

pub(crate) fn describe(held: &Held) -> String {
    held.method
        .format_with_asset(Amount::from_base_units(held.units))
}

pub(crate) fn check_text(what: &str, text: &str, max: usize) -> Result<(), Error> {
    let text = text.trim();
    if text.is_empty() || text.chars().count() > max || text.chars().any(char::is_control) {
        return Err(Error::InvalidInput(format!(
            "{what} must be 1 to {max} printable characters"
        )));
    }
    Ok(())
}

pub(crate) fn check_txid(txid: &str) -> Result<(), Error> {
    if txid.is_empty() || txid.len() > 128 || !txid.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(Error::InvalidInput(
            "refund_txid must be a transaction id (1 to 128 letters and digits, 0x allowed)".into(),
        ));
    }
    Ok(())
}

/// What an operator's action books: the entry, if money moves, and the settlement it makes
/// when money is accepted as an order's payment.
pub(crate) struct Booking {
    /// The entry to post.
    pub(crate) entry: Option<NewEntry>,
    /// The intent and order accepted as paid, and the settlement's number.
    pub(crate) settles: Option<(PaymentIntent, Order, u32)>,
}

/// The key an operator's resolution of `exception_id` books under, and what marks the
/// transfers it accounts for when no money moves.
pub(crate) fn resolution_key(exception_id: &str) -> String {
    format!("resolve:{exception_id}")
}

/// Decides what `action` on `exception` books, from the money it holds and the intent and
/// order it concerns: reads nothing and writes nothing, and refuses what does not fit.
pub(crate) fn book_action(
    action: &Action,
    exception: &ExceptionRecord,
    held: Option<&Held>,
    intent: Option<&PaymentIntent>,
    order: Option<&Order>,
) -> Result<Booking, Error> {
    let refuse = |why: String| Error::ActionRefused {
        exception: exception.id.clone(),
        reason: why,
    };
    let key = resolution_key(&exception.id);
    let entry = match (action, held) {
        (Action::Dismiss, Some(held)) => {
            return Err(refuse(format!(
                "it holds {}: accept it, credit it or refund it",
                describe(held)
            )));
        }
        (Action::Dismiss, None) => None,
        (Action::MarkRefunded { refund_txid }, held) => {
            check_txid(refund_txid)?;
            match held {
                Some(Held {
                    source: Some(source),
                    method,
                    units,
                    ..
                }) => Some(refund_entry(&key, source, *method, *units, refund_txid)),
                Some(_) => None,
                None if exception.transfer.is_some()
                    && exception.kind != "reorged_after_credit" =>
                {
                    None
                }
                None => return Err(refuse("it holds no money to refund".into())),
            }
        }
        (Action::MarkOwnFunds, held) => match held {
            Some(Held {
                source: Some(source),
                method,
                units,
                ..
            }) => Some(own_funds_entry(&key, source, *method, *units)),
            _ => {
                return Err(refuse(
                    "it holds no money in suspense that could be the merchant's own".into(),
                ));
            }
        },
        (Action::CreditBalance { account, usd }, Some(held)) => Some(credit_entry(
            &key,
            held,
            account.as_deref(),
            *usd,
            intent,
            order,
            &refuse,
        )?),
        (Action::AcceptAsPaid, Some(held)) => {
            let (Some(intent), Some(order)) = (intent, order) else {
                return Err(refuse("it belongs to no order".into()));
            };
            if order.status != OrderStatus::Open {
                return Err(refuse(format!(
                    "order {} is already settled",
                    order.reference
                )));
            }
            if intent.method != held.method {
                return Err(refuse(format!(
                    "the money is {}, the order asked for {}",
                    held.method, intent.method
                )));
            }
            let n = intent.settlement_count + 1;
            let settle_key = format!("settle:{}:{n}", intent.id);
            let target = match order.kind {
                OrderKind::Rental(_) => Account::RevenueRentals,
                OrderKind::Topup => Account::CustomerBalance(order.account_id.clone()),
            };
            let memo = format!(
                "{} accepted as payment of {} by an operator",
                describe(held),
                order.reference
            );
            let entry = conversion(
                &settle_key,
                held,
                intent.usd.cents(),
                target,
                memo,
                Some(intent),
            );
            return Ok(Booking {
                entry: Some(entry),
                settles: Some((intent.clone(), order.clone(), n)),
            });
        }
        (_, None) => return Err(refuse("it holds no money".into())),
    };
    Ok(Booking {
        entry,
        settles: None,
    })
}

/// The held money credited to a customer's balance: the account named, else the order's; the
/// USD given, else the value at the intent's locked rate.
fn credit_entry(
    key: &str,
    held: &Held,
    account: Option<&str>,
    usd: Option<Usd>,
    intent: Option<&PaymentIntent>,
    order: Option<&Order>,
    refuse: &dyn Fn(String) -> Error,
) -> Result<NewEntry, Error> {
    let account = match (account, order) {
        (Some(account), _) => AccountId::new(account)?,
        (None, Some(order)) => order.account_id.clone(),
        (None, None) => return Err(refuse("name the customer account to credit".into())),
    };
    let cents = match (usd, intent) {
        (Some(usd), _) => usd.cents(),
        (None, Some(intent)) if intent.method == held.method => usd_value_of(
            Amount::from_base_units(held.units),
            intent.rate.usd_per_unit,
            held.method,
        )
        .ok_or_else(|| refuse("its USD value overflows".into()))?,
        (None, _) => {
            return Err(refuse(format!(
                "no locked {} rate applies: give the USD to credit",
                held.method.asset()
            )));
        }
    };
    if cents <= 0 {
        return Err(refuse("the USD to credit must be above zero".into()));
    }
    let memo = format!("{} credited to the balance by an operator", describe(held));
    Ok(conversion(
        key,
        held,
        cents,
        Account::CustomerBalance(account),
        memo,
        intent,
    ))
}
