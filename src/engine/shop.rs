//! What the shop backend does: orders and top-ups, balances, payment instructions, the
//! customer's checkout page and history, and the event stream it follows.

use super::watchers::ChainReads;
use super::{BalancePayment, Created, NewOrder, customer_balance, debit_for_order};
use crate::checkout::{Arrived, Checkout, CheckoutStatus, intent_by_key};
use crate::engine::Engine;
use crate::error::Error;
use crate::history::{AccountHistory, HistoryItem, MAX_HISTORY_PAGE, Position};
use crate::intent::{CHECKING_MESSAGE, ChainRead, IntentRate, PaymentIntent, payment_uri, qr_svg};
use crate::ledger::{Account, Currency};
use crate::money::Usd;
use crate::order::{
    AccountId, Order, OrderRef, OrderStatus, RentalOrderRequest, TopupRequest, ValidOrder,
};
use crate::payments::{IntentDraft, PaymentInstructions, record_marked_paid};
use crate::records::IntentEvent;
use crate::store;
use crate::store::feed::{ChangedIntents, LivePosition};
use crate::store::{feed, payments};
use chrono::{DateTime, Utc};
use payrecon_chain_core::Method;
use std::sync::Arc;

/// Addresses found paid in a row before a new intent gives up with
/// [`Error::AddressFoundPaid`].
const MAX_FOUND_PAID_IN_A_ROW: u32 = 8;

impl Engine {
    /// Creates payment instructions for an order or top-up in one method: a fresh address,
    /// the amount at a freshly locked rate (rounded up), and a deadline. Refused, with nothing
    /// stored, when the method is disabled, no fresh rate exists, or the order is unknown or
    /// settled. A newer intent supersedes the order's older ones, which stay watched.
    pub async fn create_payment(
        &self,
        order_ref: &OrderRef,
        method: Method,
    ) -> Result<PaymentInstructions, Error> {
        let settings = self.payment_settings();
        let deriver = settings
            .derivers
            .get(&method.network())
            .filter(|_| settings.enabled.contains(&method))
            .ok_or(Error::MethodDisabled(method))?
            .clone();
        self.handout()
            .wait(method.network(), crate::keys::HANDOUT_WAIT)
            .await?;
        let now = self.now();
        let rate = match settings.rates.as_ref() {
            Some(rates) => rates.rate(method.asset(), now).await,
            None => Err(crate::rates::RateError::NoSources),
        };
        // Without a rate nothing is written: say first what is wrong with the order, if
        // anything (the write checks the order again, under its lock).
        let rate = match rate {
            Ok(rate) => rate,
            Err(no_rate) => {
                let order = self.order(order_ref).await?;
                if order.status != OrderStatus::Open {
                    return Err(Error::AlreadySettled(order_ref.clone()));
                }
                return Err(no_rate.into());
            }
        };
        let deadline = now
            + settings
                .deadlines
                .get(&method)
                .copied()
                .unwrap_or(settings.default_deadline);

        // An index whose address was found paid before anyone was given it is never handed
        // out: the next one is taken.
        let mut found_paid = 0;
        let intent = loop {
            let taken = self
                .take_index(method.network(), &deriver, order_ref)
                .await?;
            let draft = IntentDraft {
                order_ref: order_ref.clone(),
                method,
                index: taken.index(),
                deriver: deriver.clone(),
                rate: IntentRate {
                    usd_per_unit: rate.usd_per_unit,
                    source: rate.source.clone(),
                    fetched_at: rate.fetched_at,
                },
                created_at: now,
                deadline,
                monitor_until: deadline + settings.monitoring_window,
            };
            match self.db().write_batched(draft).await {
                Ok(intent) => {
                    taken.stored();
                    break intent;
                }
                Err(found @ Error::AddressFoundPaid { .. }) => {
                    taken.lost();
                    found_paid += 1;
                    if found_paid == MAX_FOUND_PAID_IN_A_ROW {
                        return Err(found);
                    }
                }
                // The database failed: the intent may be stored after all, so its index never
                // goes out again.
                Err(failed @ Error::Database(_)) => {
                    taken.lost();
                    return Err(failed);
                }
                // Refused before anything was written: the index goes back.
                Err(refused) => return Err(refused),
            }
        };
        self.notify_events();
        // Its deadline is ahead: how far its chain was read does not change what it says.
        Ok(self.instructions(intent, None))
    }

    /// `intent` as the shop reads it, with how far its chain was read (`reads`; not known
    /// to the answer that creates it): past the deadline and not read that far, it says the
    /// network is being checked, never that it expired.
    pub(crate) fn instructions(
        &self,
        intent: PaymentIntent,
        reads: Option<&ChainReads>,
    ) -> PaymentInstructions {
        let read = reads.map(|reads| reads.of(intent.network()));
        let checking = read.is_some_and(|read| read.checking(&intent, self.now()));
        PaymentInstructions {
            amount_decimal: intent.amount_decimal(),
            asset: intent.method.asset().to_string(),
            payment_uri: payment_uri(&intent, &self.payment_settings().uri),
            customer_message: if checking {
                CHECKING_MESSAGE
            } else {
                intent.status.customer_message()
            }
            .to_owned(),
            checkout_path: format!("/pay/{}", intent.checkout_key),
            chain_read_until: read.and_then(ChainRead::until),
            intent,
        }
    }

    /// A payment intent with its URI.
    pub async fn payment(&self, intent_id: &str) -> Result<PaymentInstructions, Error> {
        let mut conn = self.db().pool().acquire().await?;
        let intent = payments::get_intent(&mut conn, intent_id)
            .await?
            .ok_or_else(|| Error::IntentNotFound(intent_id.to_owned()))?;
        drop(conn);
        let reads = self.chain_reads().await?;
        Ok(self.instructions(intent, Some(&reads)))
    }

    /// Every intent of an order, old and superseded ones too.
    pub async fn payments_for(
        &self,
        order_ref: &OrderRef,
    ) -> Result<Vec<PaymentInstructions>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        let intents = payments::intents_of_order(&mut conn, order_ref.as_str()).await?;
        drop(conn);
        let reads = self.chain_reads().await?;
        Ok(intents
            .into_iter()
            .map(|i| self.instructions(i, Some(&reads)))
            .collect())
    }

    /// The payment URI of an intent as a QR code (SVG).
    pub async fn payment_qr_svg(&self, intent_id: &str) -> Result<String, Error> {
        let instructions = self.payment(intent_id).await?;
        qr_svg(&instructions.payment_uri).map_err(|e| Error::Config(format!("QR code: {e}")))
    }

    /// Records the customer's "I have paid". It confirms nothing and credits nothing; it is
    /// shown in tracking and feeds the stuck-payment monitor. Marking twice keeps the first time.
    pub async fn mark_paid(&self, intent_id: &str) -> Result<PaymentInstructions, Error> {
        let now = self.now();
        let id: Arc<str> = Arc::from(intent_id);
        let recorded = self
            .db()
            .write(move |tx| {
                let id = id.clone();
                Box::pin(async move { record_marked_paid(tx, &id, now).await })
            })
            .await?;
        // Only a new "I have paid" is news: one said again wakes no watcher and no page.
        if recorded {
            self.notify_events();
        }
        self.payment(intent_id).await
    }

    /// Stream entries after `after_seq`, in commit order; resume from the last `seq` seen.
    pub async fn events_after(
        &self,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<IntentEvent>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(payments::events_after(&mut conn, after_seq, limit).await?)
    }

    /// The checkout page's content for the intent whose link carries `key`.
    pub async fn checkout(&self, key: &str) -> Result<Checkout, Error> {
        let mut conn = self.db().pool().acquire().await?;
        let intent = intent_by_key(&mut conn, key).await?;
        let mut transfers = payments::transfers_of_intent(&mut conn, &intent.id).await?;
        let refunds = crate::store::refunds::of_intent(&mut conn, &intent.id).await?;
        let refundable = !crate::engine::refunds::refundable(&mut conn, &intent, &refunds)
            .await?
            .is_empty();
        drop(conn);
        let policy = &self.payment_settings().policy;
        // Dust is nobody's payment: the customer never reads of it.
        transfers.retain(|t| !policy.is_dust(t));
        let required = policy
            .confirmations
            .get(&intent.network())
            .map_or(1, |rule| rule.required(intent.usd));
        let reads = self.chain_reads().await?;
        let read = reads.of(intent.network());
        let status = CheckoutStatus::of(&intent, &transfers, required, self.clock().now(), read);
        let explorer = self.payment_settings().explorers.get(&intent.network());
        Ok(Checkout {
            arrived: Arrived::of(&transfers, explorer.map(String::as_str)),
            refundable,
            refunds,
            explorer: explorer.cloned(),
            instructions: self.instructions(intent, Some(&reads)),
            status,
        })
    }

    /// The customer's "I have paid" from the checkout page: [`Engine::mark_paid`] by the
    /// page's key. It confirms nothing and credits nothing; said again, it writes nothing.
    pub async fn checkout_mark_paid(&self, key: &str) -> Result<(), Error> {
        let mut conn = self.db().pool().acquire().await?;
        let intent = intent_by_key(&mut conn, key).await?;
        drop(conn);
        if intent.marked_paid_at.is_none() {
            self.mark_paid(&intent.id).await?;
        }
        Ok(())
    }

    /// The intents whose page may show something new since `from` (see `api::live`).
    pub(crate) async fn live_changes(
        &self,
        from: Option<LivePosition>,
    ) -> Result<ChangedIntents, Error> {
        let store = self.db();
        Ok(feed::changed_intents(store.pool(), store.backend(), from).await?)
    }

    /// One page of `account`'s history: up to `limit` items after the cursor `after` (from
    /// the previous page's `next`), oldest first.
    pub async fn account_history(
        &self,
        account: &AccountId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<AccountHistory, Error> {
        if !(1..=MAX_HISTORY_PAGE).contains(&limit) {
            return Err(Error::InvalidInput(format!(
                "limit: 1 to {MAX_HISTORY_PAGE} items per page"
            )));
        }
        let after = after.map(Position::parse).transpose()?;
        let mut conn = self.db().pool().acquire().await?;
        let orders = store::orders::orders_of_account(&mut conn, account.as_str()).await?;
        let intents = store::payments::intents_of_account(&mut conn, account.as_str()).await?;
        let balance_account = Account::CustomerBalance(account.clone());
        let movements =
            store::ledger::movements(&mut conn, &balance_account, Currency::Usd).await?;
        drop(conn);
        let reads = self.chain_reads().await?;

        let mut timeline: Vec<(Position, HistoryItem)> =
            Vec::with_capacity(orders.len() + intents.len() + movements.len());
        for stored in orders {
            let order = stored.order;
            timeline.push((
                Position {
                    at_ms: order.created_at.timestamp_millis(),
                    rank: 0,
                    id: order.reference.to_string(),
                },
                HistoryItem::Order {
                    at: order.created_at,
                    order: Box::new(order),
                },
            ));
        }
        for intent in intents {
            let at = intent.created_at;
            let id = intent.id.clone();
            timeline.push((
                Position {
                    at_ms: at.timestamp_millis(),
                    rank: 1,
                    id,
                },
                HistoryItem::Payment {
                    at,
                    payment: Box::new(self.instructions(intent, Some(&reads))),
                },
            ));
        }
        // The customer's balance is the negated sum of the postings (credits are negative).
        let mut balance: i128 = 0;
        for movement in movements {
            balance -= movement.amount;
            let at =
                DateTime::<Utc>::from_timestamp_millis(movement.posted_at_ms).unwrap_or_default();
            timeline.push((
                Position {
                    at_ms: movement.posted_at_ms,
                    rank: 2,
                    id: format!("{:020}", movement.seq),
                },
                HistoryItem::Balance {
                    at,
                    entry: movement.key,
                    kind: movement.kind,
                    reference: movement.reference,
                    memo: movement.memo,
                    change_usd: Currency::Usd.format(-movement.amount),
                    balance_usd: Currency::Usd.format(balance),
                },
            ));
        }
        timeline.sort_by(|a, b| a.0.cmp(&b.0));
        let mut page: Vec<(Position, HistoryItem)> = timeline
            .into_iter()
            .filter(|(position, _)| after.as_ref().is_none_or(|after| position > after))
            .take(limit + 1)
            .collect();
        let next = (page.len() > limit).then(|| {
            page.truncate(limit);
            page.last().map(|(position, _)| position.cursor())
        });
        Ok(AccountHistory {
            account_id: account.clone(),
            balance_usd: self.available_balance(account).await?.to_string(),
            items: page.into_iter().map(|(_, item)| item).collect(),
            next: next.flatten(),
        })
    }

    /// Records a rental order. Sending the same order again returns it unchanged; the same
    /// reference with other content is [`Error::OrderConflict`].
    pub async fn create_rental_order(
        &self,
        request: &RentalOrderRequest,
    ) -> Result<Created<Order>, Error> {
        self.create_order(request.validate(&self.catalog)?).await
    }

    /// Records a balance top-up (100, 500, 2000 or 10000 USD). Idempotent like orders.
    pub async fn create_topup(&self, request: &TopupRequest) -> Result<Created<Order>, Error> {
        self.create_order(request.validate(&self.catalog)?).await
    }

    async fn create_order(&self, order: ValidOrder) -> Result<Created<Order>, Error> {
        let now = self.clock.now();
        self.store.write_batched(NewOrder { order, now }).await
    }

    /// An order or top-up by reference.
    pub async fn order(&self, reference: &OrderRef) -> Result<Order, Error> {
        let mut conn = self.store.pool().acquire().await?;
        store::orders::get_order(&mut conn, reference)
            .await?
            .map(|stored| stored.order)
            .ok_or_else(|| Error::OrderNotFound(reference.clone()))
    }

    /// The USD the customer can spend now: confirmed credits minus debits. Money still
    /// waiting for confirmation is not in it.
    pub async fn available_balance(&self, account_id: &AccountId) -> Result<Usd, Error> {
        let mut conn = self.store.pool().acquire().await?;
        let account = Account::CustomerBalance(account_id.clone());
        let sum = store::ledger::account_sum(&mut conn, &account, Currency::Usd).await?;
        customer_balance(account_id, sum)
    }

    /// Settles a rental order by debiting the customer's balance, if it covers the whole
    /// total. Refused otherwise, with nothing written. Calling it again for an order it
    /// already paid returns that payment (a safe retry), never a second debit.
    pub async fn pay_order_from_balance(
        &self,
        reference: &OrderRef,
    ) -> Result<BalancePayment, Error> {
        let now = self.clock.now();
        let reference = Arc::new(reference.clone());
        self.store
            .write(move |tx| {
                let reference = reference.clone();
                Box::pin(async move { debit_for_order(tx, &reference, now).await })
            })
            .await
    }
}
