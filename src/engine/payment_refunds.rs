//! Refunds of a settled payment: the credit it bought is taken back first, at the intent's
//! locked rate, from the customer's balance or the rental revenue into `suspense:refunding`,
//! under an exception of kind `returned` whose money a refund then sends back like any other
//! exception's (`refunds`, `refund_prepare`, `refund_chain`).

use payrecon_chain_core::{Amount, Method};

use crate::engine::Engine;
use crate::error::Error;
use crate::ledger::{Account, Currency, EntryKind, LedgerError, NewEntry, Posting, SuspenseReason};
use crate::operator::{MAX_ACTOR_LEN, RETURNED, check_text};
use crate::records::{ExceptionRecord, Refund};
use crate::refund::RefundAmount;
use crate::store::{self, StoreError, WriteTx, payments};

/// What a settlement credited, and what earlier refunds already took back.
struct Settled {
    /// The crypto the settlement took into custody, in base units.
    units: u128,
    /// The USD it credited, in cents, and where.
    cents: i128,
    credited: Account,
    /// Units and cents already taken back, and how many times.
    returned_units: u128,
    returned_cents: i128,
    returns: u32,
}

impl Engine {
    /// Records a refund of the settled payment `intent_id`: `amount` (`all` that is not taken
    /// back yet, or an amount in the asset's units) goes back to the customer's `address`.
    /// The credit it bought is taken back first, at the locked rate and in proportion: from
    /// the customer's balance (refused when the balance no longer holds it) or from rental
    /// revenue, into `suspense:refunding`, under an exception of kind `returned` that the
    /// refund then settles. Several per payment, never more in all than it settled.
    pub async fn request_payment_refund(
        &self,
        intent_id: &str,
        address: &str,
        amount: &str,
        actor: &str,
    ) -> Result<Refund, Error> {
        check_text("actor", actor, MAX_ACTOR_LEN)?;
        let mut tx = self.db().begin_write().await?;
        let intent = payments::get_intent(tx.conn(), intent_id)
            .await?
            .ok_or_else(|| Error::IntentNotFound(intent_id.chars().take(80).collect()))?;
        // Two requests for one payment are decided one after the other.
        store::orders::lock_order(&mut tx, &intent.order_ref).await?;
        let settled = settled_of(&mut tx, &intent).await?;
        let left = settled.units.saturating_sub(settled.returned_units);
        let describe = |units: u128| {
            intent
                .method
                .format_with_asset(Amount::from_base_units(units))
        };
        let units = match RefundAmount::parse(amount, intent.method)? {
            RefundAmount::All => left,
            RefundAmount::Exact(amount) => amount.base_units(),
            RefundAmount::Overpaid => {
                return Err(Error::InvalidInput(
                    "a settled payment's refund is all that is left or an amount; an overpaid part is its exception's".into(),
                ));
            }
        };
        if units == 0 || units > left {
            return Err(Error::InvalidInput(format!(
                "{} asked, but {} of the {} settled is left to refund",
                describe(units),
                describe(left),
                describe(settled.units)
            )));
        }
        let address = self
            .customers_address(&mut tx, intent.method.network(), address)
            .await?;
        let cents = if units == left {
            settled.cents - settled.returned_cents
        } else {
            settled.cents * i128::try_from(units).unwrap_or(i128::MAX)
                / i128::try_from(settled.units).unwrap_or(i128::MAX)
        };
        let now = self.clock().now();
        let exception = ExceptionRecord {
            id: format!("{RETURNED}:{}:{}", intent.id, settled.returns + 1),
            kind: RETURNED.to_owned(),
            intent_id: Some(intent.id.clone()),
            order_ref: Some(intent.order_ref.to_string()),
            transfer: None,
            detail: format!(
                "{} of the settled payment goes back to the customer ({} USD taken back from {})",
                describe(units),
                Currency::Usd.format(cents),
                settled.credited
            ),
            opened_at: now,
            resolved_at: None,
            resolution: None,
        };
        let entry = return_entry(
            &exception.id,
            &intent.order_ref,
            intent.method,
            units,
            cents,
            &settled.credited,
        )?;
        match store::ledger::post_batch(&mut tx, std::slice::from_ref(&entry), now).await? {
            Ok(_) => {}
            Err(LedgerError::Overdraft { available, .. }) => {
                return Err(Error::InvalidInput(format!(
                    "the customer's balance holds {available} USD, less than the {} USD this refund takes back: it was spent",
                    Currency::Usd.format(cents)
                )));
            }
            Err(other) => return Err(other.into()),
        }
        payments::open_exception(tx.conn(), &exception).await?;
        payments::append_events(
            tx.conn(),
            &[payments::exception_opened_event(&exception)],
            now,
        )
        .await?;
        let kind = if units == left { "all" } else { "exact" };
        let refund = self.new_refund(&exception, intent.method, units, kind, address);
        self.record_request(tx, refund, actor).await
    }
}

/// What `intent`'s standing settlement credited, and what refunds took back before.
async fn settled_of(
    tx: &mut WriteTx,
    intent: &crate::intent::PaymentIntent,
) -> Result<Settled, Error> {
    let refuse = |why: String| Error::InvalidInput(format!("payment {}: {why}", intent.id));
    let key = format!("settle:{}:{}", intent.id, intent.settlement_count);
    let standing = intent.settlement_count > 0
        && store::ledger::get_entry(tx.conn(), &format!("reverse:{key}"))
            .await?
            .is_none();
    let posted = match standing {
        true => store::ledger::get_entry(tx.conn(), &key).await?,
        false => None,
    };
    let Some(posted) = posted else {
        return Err(refuse(format!(
            "it is {}, not settled: refund what it holds through its exceptions",
            intent.status
        )));
    };
    let legs = &posted.entry.postings;
    let units = legs
        .iter()
        .find(|p| matches!(p.account, Account::Custody(_)))
        .and_then(|p| u128::try_from(p.amount_minor).ok())
        .ok_or_else(|| StoreError::Corrupt(format!("settlement {key} has no custody leg")))?;
    let credit = legs
        .iter()
        .find(|p| p.currency == Currency::Usd && p.amount_minor < 0)
        .ok_or_else(|| StoreError::Corrupt(format!("settlement {key} credits no USD")))?;
    let mut settled = Settled {
        units,
        cents: -credit.amount_minor,
        credited: credit.account.clone(),
        returned_units: 0,
        returned_cents: 0,
        returns: 0,
    };
    // The returns of this payment are numbered from 1; a gap never occurs.
    loop {
        let key = format!("{RETURNED}:{}:{}", intent.id, settled.returns + 1);
        let Some(returned) = store::ledger::get_entry(tx.conn(), &key).await? else {
            break;
        };
        for leg in &returned.entry.postings {
            match (&leg.account, leg.currency) {
                (Account::Suspense(_), Currency::Crypto(_)) => {
                    settled.returned_units += u128::try_from(-leg.amount_minor).unwrap_or(0);
                }
                (account, Currency::Usd) if *account == settled.credited => {
                    settled.returned_cents += leg.amount_minor;
                }
                _ => {}
            }
        }
        settled.returns += 1;
    }
    Ok(settled)
}

/// The settlement's conversion run backwards for `units` of it: `cents` leave what it
/// credited, and the crypto goes from the conversion account into `suspense:refunding`.
fn return_entry(
    key: &str,
    reference: &crate::order::OrderRef,
    method: Method,
    units: u128,
    cents: i128,
    credited: &Account,
) -> Result<NewEntry, Error> {
    let minor = i128::try_from(units)
        .map_err(|_| Error::InvalidInput(format!("{key}: amount out of range")))?;
    let crypto = Currency::Crypto(method);
    let mut postings = vec![
        Posting::debit(Account::Fx(method), crypto, minor),
        Posting::credit(Account::Suspense(SuspenseReason::Refunding), crypto, minor),
    ];
    if cents > 0 {
        postings.push(Posting::debit(credited.clone(), Currency::Usd, cents));
        postings.push(Posting::credit(Account::Fx(method), Currency::Usd, cents));
    }
    let entry = NewEntry {
        idempotency_key: key.to_owned(),
        kind: EntryKind::Refund,
        reference: Some(reference.to_string()),
        memo: format!(
            "refund: {} {} of {reference} taken back to go back to the customer",
            method.format_amount(Amount::from_base_units(units)),
            method.asset()
        ),
        postings,
    };
    entry.validate()?;
    Ok(entry)
}
