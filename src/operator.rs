//! Operators' actions on exceptions: accept as paid, credit the balance, mark refunded,
//! dismiss. Each is one transaction that writes the audit log, closes the exception, appends
//! an event for the webhooks and, where money moves, posts a compensating journal entry.
//!
//! Where the money of an exception sits decides what can be done with it:
//! - held in suspense by the matcher (overpaid, paid late, paid after settlement, wrong
//!   asset, unmatched): the entry that held it names the suspense account and the amount;
//! - underpaid: the matcher books nothing until an operator decides, so the confirmed
//!   transfers are booked into custody by the action itself;
//! - nothing (a reorg that was already reversed, a token payrecon does not account for).

use chrono::{DateTime, Utc};
use payrecon_chain_core::{Amount, Method, ReceivedAsset};
use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::error::Error;
use crate::intent::{IntentStatus, PaymentIntent, usd_value_of};
use crate::ledger::{Account, Currency, EntryKind, NewEntry, Posting};
use crate::money::Usd;
use crate::order::{AccountId, Order, OrderKind, OrderStatus, SettledVia};
use crate::store::operations::{self, OperatorAction};
use crate::store::payments::{self, ExceptionRecord, StoredTransfer};
use crate::store::{StoreError, WriteTx, ledger, orders};

/// Longest actor name and reason accepted; the audit log is for people.
const MAX_ACTOR_LEN: usize = 64;
const MAX_REASON_LEN: usize = 500;

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
struct Held {
    /// Where the crypto sits now: a suspense account, or custody-to-be for underpayments.
    source: Option<Account>,
    method: Method,
    units: u128,
    /// Underpaid transfers to mark as accounted by the action.
    unbooked: Vec<StoredTransfer>,
}

impl Engine {
    /// Applies an operator's decision to an open exception; refused with nothing written if
    /// the action does not fit where its money is.
    pub async fn resolve_exception(
        &self,
        exception_id: &str,
        action: &Action,
        actor: &str,
        reason: &str,
    ) -> Result<Resolved, Error> {
        check_text("actor", actor, MAX_ACTOR_LEN)?;
        check_text("reason", reason, MAX_REASON_LEN)?;
        let now = self.clock().now();
        let mut tx = self.db().begin_write().await?;
        let exception = operations::get_exception(tx.conn(), exception_id)
            .await?
            .ok_or_else(|| Error::ExceptionNotFound(exception_id.chars().take(80).collect()))?;
        let refuse = |why: String| Error::ActionRefused {
            exception: exception.id.clone(),
            reason: why,
        };
        if let Some(resolution) = &exception.resolution {
            return Err(refuse(format!("already resolved ({resolution})")));
        }
        let intent = match &exception.intent_id {
            Some(id) => payments::get_intent(tx.conn(), id).await?,
            None => None,
        };
        let order = match &intent {
            Some(intent) => orders::lock_order(&mut tx, &intent.order_ref)
                .await?
                .map(|stored| stored.order),
            None => None,
        };
        let held = held_money(&mut tx, &exception, intent.as_ref()).await?;
        let key = format!("resolve:{}", exception.id);
        let mut settles = None;
        let entry = match (action, &held) {
            (Action::Dismiss, Some(held)) => {
                return Err(refuse(format!(
                    "it holds {} {}: accept it, credit it or refund it",
                    held.method
                        .format_amount(Amount::from_base_units(held.units)),
                    held.method.asset()
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
            (Action::CreditBalance { account, usd }, Some(held)) => {
                let account = match (account, &order) {
                    (Some(account), _) => AccountId::new(account.clone())?,
                    (None, Some(order)) => order.account_id.clone(),
                    (None, None) => {
                        return Err(refuse("name the customer account to credit".into()));
                    }
                };
                let cents = match (usd, &intent) {
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
                Some(conversion(
                    &key,
                    held,
                    cents,
                    Account::CustomerBalance(account),
                    format!("{} credited to the balance by an operator", describe(held)),
                    intent.as_ref(),
                ))
            }
            (Action::AcceptAsPaid, Some(held)) => {
                let (Some(intent), Some(order)) = (&intent, &order) else {
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
                settles = Some((intent.clone(), order.clone(), n));
                Some(conversion(
                    &settle_key,
                    held,
                    intent.usd.cents(),
                    target,
                    format!(
                        "{} accepted as payment of {} by an operator",
                        describe(held),
                        order.reference
                    ),
                    Some(intent),
                ))
            }
            (_, None) => return Err(refuse("it holds no money".into())),
        };
        if let Some(entry) = &entry {
            entry.validate()?;
            ledger::post_batch(&mut tx, std::slice::from_ref(entry), now).await??;
        }
        let accounted_as = entry
            .as_ref()
            .map(|e| e.idempotency_key.clone())
            .unwrap_or_else(|| key.clone());
        if let Some(held) = &held {
            for transfer in &held.unbooked {
                let mut transfer = transfer.clone();
                transfer.credited_entry = Some(accounted_as.clone());
                payments::upsert_transfer(&mut tx, &transfer, now).await?;
            }
        }
        if let Some((intent, order, n)) = settles {
            settle(&mut tx, intent, &order, n, &accounted_as, now).await?;
        }
        if exception.kind == "reorged_after_credit"
            && let Some(order_ref) = &exception.order_ref
        {
            orders::clear_attention(tx.conn(), order_ref).await?;
        }
        let record = OperatorAction {
            seq: 0,
            exception_id: exception.id.clone(),
            action: action.as_str().to_owned(),
            actor: actor.to_owned(),
            reason: reason.to_owned(),
            refund_txid: match action {
                Action::MarkRefunded { refund_txid } => Some(refund_txid.clone()),
                _ => None,
            },
            entry_key: entry.as_ref().map(|e| e.idempotency_key.clone()),
            at: now,
        };
        let resolution = format!("{} by {actor}: {reason}", action.as_str());
        operations::record_resolution(tx.conn(), &record, &resolution).await?;
        let detail = serde_json::json!({
            "exception": exception.id,
            "kind": exception.kind,
            "action": action.as_str(),
            "actor": actor,
            "reason": reason,
            "entry": record.entry_key,
            "refund_txid": record.refund_txid,
        });
        payments::append_event(
            tx.conn(),
            exception.intent_id.as_deref(),
            exception.order_ref.as_deref(),
            "exception_resolved",
            &detail,
            now,
        )
        .await?;
        let exception = operations::get_exception(tx.conn(), &exception.id)
            .await?
            .ok_or_else(|| StoreError::Corrupt("a resolved exception vanished".into()))?;
        let actions = operations::actions(tx.conn(), Some(&exception.id)).await?;
        tx.commit().await?;
        self.notify_events();
        Ok(Resolved {
            exception,
            action: actions.into_iter().last().unwrap_or(record),
            entry,
        })
    }

    /// The operators' audit log, oldest first.
    pub async fn operator_actions(&self) -> Result<Vec<OperatorAction>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(operations::actions(&mut conn, None).await?)
    }

    /// Up to `limit` entries of the audit log after `after`, a previous page's `next`.
    pub async fn operator_actions_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<crate::stuck::Page<OperatorAction>, Error> {
        let limit = limit.clamp(1, crate::stuck::MAX_STUCK_PAGE);
        let after_seq = match after {
            None => 0,
            Some(text) => text
                .parse()
                .map_err(|_| Error::InvalidInput("after: not a cursor of the audit log".into()))?,
        };
        let mut conn = self.db().pool().acquire().await?;
        let rows = operations::actions_page(&mut conn, None, after_seq, limit as i64 + 1).await?;
        Ok(crate::stuck::Page::of(rows, limit, |a| a.seq.to_string()))
    }
}

/// Settles an intent and its order by an operator's acceptance.
async fn settle(
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

/// Where the money of `exception` sits, if it holds any.
async fn held_money(
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

/// The matcher's entry that put an exception's money in suspense (see `matcher`'s keys).
/// A transfer booked again after a reorg has an exception of that booking's own, its id ending
/// in `#<n>`: it names the `n`th booking's key.
fn hold_key(exception: &ExceptionRecord, intent: Option<&PaymentIntent>) -> Option<String> {
    let transfer = exception.transfer.as_deref();
    let base = match (exception.kind.as_str(), transfer) {
        ("overpaid", _) => {
            return intent.map(|i| format!("overpaid:{}:{}", i.id, i.settlement_count));
        }
        ("paid_late", Some(t)) => format!("late:{t}"),
        ("paid_after_settlement", Some(t)) => format!("after-settlement:{t}"),
        ("wrong_asset", Some(t)) => format!("wrong-asset:{t}"),
        ("unmatched", Some(t)) => format!("unmatched:{t}"),
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
fn conversion(
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
fn refund_entry(
    key: &str,
    source: &Account,
    method: Method,
    units: u128,
    refund_txid: &str,
) -> NewEntry {
    let crypto = Currency::Crypto(method);
    NewEntry {
        idempotency_key: key.to_owned(),
        kind: EntryKind::Adjustment,
        reference: None,
        memo: format!(
            "{} {} refunded in {refund_txid}",
            method.format_amount(Amount::from_base_units(units)),
            method.asset()
        ),
        postings: vec![
            Posting::debit(source.clone(), crypto, units as i128),
            Posting::credit(Account::Custody(method), crypto, units as i128),
        ],
    }
}

fn describe(held: &Held) -> String {
    format!(
        "{} {}",
        held.method
            .format_amount(Amount::from_base_units(held.units)),
        held.method.asset()
    )
}

fn check_text(what: &str, text: &str, max: usize) -> Result<(), Error> {
    let text = text.trim();
    if text.is_empty() || text.chars().count() > max || text.chars().any(char::is_control) {
        return Err(Error::InvalidInput(format!(
            "{what} must be 1 to {max} printable characters"
        )));
    }
    Ok(())
}

fn check_txid(txid: &str) -> Result<(), Error> {
    if txid.is_empty() || txid.len() > 128 || !txid.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(Error::InvalidInput(
            "refund_txid must be a transaction id (1 to 128 letters and digits, 0x allowed)".into(),
        ));
    }
    Ok(())
}
