//! What operators look at and do: what is stuck, exceptions and their resolution, support
//! lookups, API tokens and webhook deliveries.

use crate::engine::Engine;
use crate::error::Error;
use crate::operator::{
    Action, Booking, MAX_ACTOR_LEN, MAX_REASON_LEN, Resolved, book_action, check_text, held_money,
    open_exception, resolution_key, settle,
};
use crate::order::OrderRef;
use crate::records::{ExceptionRecord, StoredTransfer};
use crate::records::{OperatorAction, WatcherHealth};
use crate::store::{StoreError, ledger, operations, orders, payments};
use crate::stuck::{
    MAX_STUCK_PAGE, Page, StuckCursor, StuckItem, StuckOptions, exception_actions, stale_rates,
    wallet_gap_item, watcher_item, webhook_item,
};
use crate::support::{AddressView, Finding, OrderView, TransferView, checked};
use crate::tokens::{Caller, Role, digest, fresh_token};
use chrono::DateTime;
use payrecon_chain_core::Network;

impl Engine {
    /// Every transfer to any address of the order's intents, old and superseded ones too.
    pub async fn transfers_for(
        &self,
        order_ref: &OrderRef,
    ) -> Result<Vec<crate::records::StoredTransfer>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(payments::transfers_of_order(&mut conn, order_ref.as_str()).await?)
    }

    /// Up to `limit` exceptions (only open ones with `open_only`) after `after`, a previous
    /// page's `next`, oldest first.
    pub async fn exceptions_page(
        &self,
        open_only: bool,
        after: Option<&str>,
        limit: usize,
    ) -> Result<crate::stuck::Page<ExceptionRecord>, Error> {
        let limit = limit.clamp(1, crate::stuck::MAX_STUCK_PAGE);
        let (opened_ms, id) = match after {
            None => (i64::MIN, ""),
            Some(text) => text
                .split_once('.')
                .and_then(|(ms, id)| Some((ms.parse().ok()?, id)))
                .ok_or_else(|| Error::InvalidInput("after: not a cursor of exceptions".into()))?,
        };
        let mut conn = self.db().pool().acquire().await?;
        let rows =
            payments::exceptions_page(&mut conn, open_only, (opened_ms, id), limit as i64 + 1)
                .await?;
        Ok(crate::stuck::Page::of(rows, limit, |e| {
            format!("{}.{}", e.opened_at.timestamp_millis(), e.id)
        }))
    }

    /// Exceptions of one order, or all.
    pub async fn exceptions(
        &self,
        order_ref: Option<&OrderRef>,
    ) -> Result<Vec<ExceptionRecord>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(payments::exceptions(&mut conn, order_ref.map(OrderRef::as_str)).await?)
    }

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
        if let Action::MarkRefunded { refund_txid } = action {
            return self
                .mark_refunded(exception_id, refund_txid, (actor, reason))
                .await;
        }
        let now = self.clock().now();
        let mut tx = self.db().begin_write().await?;
        let (exception, intent) = open_exception(&mut tx, exception_id).await?;
        let order = match &intent {
            Some(intent) => orders::lock_order(&mut tx, &intent.order_ref)
                .await?
                .map(|stored| stored.order),
            None => None,
        };
        let held = held_money(&mut tx, &exception, intent.as_ref()).await?;
        let held = less_refunded(tx.conn(), &exception, held).await?;
        let key = resolution_key(&exception.id);
        let Booking { entry, settles } = book_action(
            action,
            &exception,
            held.as_ref(),
            intent.as_ref(),
            order.as_ref(),
        )?;
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
        record_resolved(tx.conn(), &exception, &record).await?;
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

    /// Everything stuck now, oldest first within each category: the first
    /// 1,000 items (`payrecon stuck`); [`Engine::stuck_page`] pages further.
    pub async fn stuck(&self, options: &StuckOptions) -> Result<Vec<StuckItem>, Error> {
        Ok(self.stuck_page(options, None, MAX_STUCK_PAGE).await?.items)
    }

    /// Up to `limit` stuck items after `after` (a previous page's `next`), each category
    /// read with a bound, so a backlog of thousands costs one page.
    pub async fn stuck_page(
        &self,
        options: &StuckOptions,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<StuckItem>, Error> {
        let limit = limit.clamp(1, MAX_STUCK_PAGE);
        let cursor = after
            .map(StuckCursor::parse)
            .transpose()?
            .unwrap_or_else(StuckCursor::first);
        let now = self.clock().now();
        let mut conn = self.db().pool().acquire().await?;
        let mut items = Vec::new();
        let since = |ms: i64| DateTime::from_timestamp_millis(ms).unwrap_or(now);
        // One more than the page: the extra item says a next page exists.
        let wanted = |items: &Vec<StuckItem>| (limit + 1).saturating_sub(items.len()) as i64;
        if cursor.category == 0 {
            for intent in operations::marked_paid_unseen(
                &mut conn,
                (now - options.marked_paid_unseen).timestamp_millis(),
                cursor.within(0),
                wanted(&items),
            )
            .await?
            {
                items.push(StuckItem {
                    category: "marked_paid_unseen",
                    kind: intent.status.clone(),
                    what: format!(
                        "the customer marked {} ({}) paid; nothing arrived on chain",
                        intent.id, intent.method
                    ),
                    subject: intent.id,
                    order_ref: Some(intent.order_ref),
                    since: since(intent.since_ms),
                    actions: vec![
                        "ask the customer for the transaction id and check it in a block explorer",
                        "check that the watcher of the network is running",
                    ],
                });
            }
        }
        if cursor.category <= 1 && wanted(&items) > 0 {
            for intent in operations::seen_unconfirmed(
                &mut conn,
                (now - options.seen_unconfirmed).timestamp_millis(),
                cursor.within(1),
                wanted(&items),
            )
            .await?
            {
                items.push(StuckItem {
                    category: "seen_unconfirmed",
                    kind: intent.status.clone(),
                    what: format!(
                        "a payment to {} ({}) was seen but has not confirmed",
                        intent.id, intent.method
                    ),
                    subject: intent.id,
                    order_ref: Some(intent.order_ref),
                    since: since(intent.since_ms),
                    actions: vec![
                        "wait: a low fee can keep a transaction unconfirmed for hours",
                        "if it was dropped, the customer can pay again to the same instructions",
                    ],
                });
            }
        }
        if cursor.category <= 2 && wanted(&items) > 0 {
            let bound = cursor.within(2);
            for exception in operations::open_exceptions(&mut conn, bound, wanted(&items)).await? {
                items.push(StuckItem {
                    category: "exception",
                    actions: exception_actions(&exception.kind),
                    kind: exception.kind,
                    subject: exception.id,
                    order_ref: exception.order_ref,
                    what: exception.detail,
                    since: exception.opened_at,
                });
            }
        }
        if wanted(&items) > 0 {
            // The few rows of watchers, webhook endpoints, rates and the rest, ordered like
            // the rest.
            drop(conn);
            let few = self.few_stuck(options, now).await?;
            let mut few: Vec<(usize, StuckItem)> = few
                .into_iter()
                .map(|item| (StuckCursor::after(&item).category, item))
                .filter(|(category, item)| cursor.precedes(*category, item))
                .collect();
            few.sort_by(|(ca, a), (cb, b)| {
                (ca, a.since, &a.subject).cmp(&(cb, b.since, &b.subject))
            });
            items.extend(few.into_iter().map(|(_, item)| item));
        }
        Ok(Page::of(items, limit, |item| {
            StuckCursor::after(item).text()
        }))
    }

    /// The stuck view's categories of a few rows each: watchers, webhook endpoints, rates,
    /// wallets, the holdings check, refunds waiting, the books, retired keys.
    async fn few_stuck(
        &self,
        options: &StuckOptions,
        now: DateTime<chrono::Utc>,
    ) -> Result<Vec<StuckItem>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        let mut few = Vec::new();
        for health in operations::watcher_health(&mut conn).await? {
            few.extend(watcher_item(&health, options, now));
        }
        for failing in operations::failing_endpoints(&mut conn).await? {
            few.push(webhook_item(failing, now));
        }
        drop(conn);
        few.extend(stale_rates(self.payment_settings(), now).await);
        for (network, wallet) in &self.payment_settings().wallets {
            let export = self.wallet_export(*network).await?;
            few.extend(wallet_gap_item(&export, wallet.gap_limit_warning, now));
        }
        for check in self.holdings_checks().await? {
            few.extend(crate::stuck::holdings_check_item(check));
        }
        for refund in self.refunds_waiting().await? {
            few.extend(crate::stuck::refund_item(&refund, options, now));
        }
        if let (count, Some(oldest)) = self.unvalued_overdue().await? {
            few.push(crate::stuck::unvalued_item(count, oldest));
        }
        if self
            .payment_settings()
            .keys
            .values()
            .any(|keys| !keys.retired.is_empty())
        {
            let holdings = self
                .holdings(None, crate::wallet::HoldingsSort::Amount, false, 0, 1)
                .await?;
            few.extend(crate::stuck::retired_key_items(&holdings.key_totals, now));
        }
        Ok(few)
    }

    /// Every watcher's last written health.
    pub async fn watcher_health(&self) -> Result<Vec<WatcherHealth>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(operations::watcher_health(&mut conn).await?)
    }

    /// Payment intents per state.
    pub async fn intents_by_status(&self) -> Result<Vec<(String, i64)>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(operations::intents_by_status(&mut conn).await?)
    }

    /// Open exceptions per kind.
    pub async fn open_exceptions_by_kind(&self) -> Result<Vec<(String, i64)>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(operations::open_exceptions_by_kind(&mut conn).await?)
    }

    /// Everything about one order: the support view.
    pub async fn order_view(&self, reference: &OrderRef) -> Result<OrderView, Error> {
        Ok(OrderView {
            order: self.order(reference).await?,
            payment_intents: self.payments_for(reference).await?,
            transfers: self.transfers_for(reference).await?,
            exceptions: self.exceptions(Some(reference)).await?,
            ledger_entries: self.entries_for(reference.as_str()).await?,
        })
    }

    /// Finds what `text` names: a transaction id, an address, an order or top-up reference,
    /// or a payment intent id, tried in that order. `None` when it names nothing payrecon
    /// knows.
    pub async fn find(&self, text: &str) -> Result<Option<Finding>, Error> {
        let text = checked(text)?;
        let mut conn = self.db().pool().acquire().await?;
        let transfers = payments::transfers_by_txid(&mut conn, &Network::ALL, text).await?;
        if !transfers.is_empty() {
            let mut views = Vec::with_capacity(transfers.len());
            for transfer in transfers {
                views.push(self.transfer_view(&mut conn, transfer).await?);
            }
            return Ok(Some(Finding::Transfers { transfers: views }));
        }
        let intent_id =
            payments::intent_id_by_any_watch_key(&mut conn, &Network::ALL, text).await?;
        let to_address = payments::transfers_to_address(&mut conn, &Network::ALL, text).await?;
        if intent_id.is_some() || !to_address.is_empty() {
            drop(conn);
            let intent = match &intent_id {
                Some(id) => Some(self.payment(id).await?),
                None => None,
            };
            let order = match &intent {
                Some(intent) => Some(self.order(&intent.intent.order_ref).await?),
                None => None,
            };
            return Ok(Some(Finding::Address(Box::new(AddressView {
                address: text.to_owned(),
                intent,
                order,
                transfers: to_address,
            }))));
        }
        drop(conn);
        if let Ok(reference) = OrderRef::new(text) {
            match self.order_view(&reference).await {
                Ok(view) => return Ok(Some(Finding::Order(Box::new(view)))),
                Err(Error::OrderNotFound(_)) => {}
                Err(error) => return Err(error),
            }
        }
        match self.payment(text).await {
            Ok(intent) => {
                let order = self.order_view(&intent.intent.order_ref).await?;
                Ok(Some(Finding::Intent {
                    intent: Box::new(intent),
                    order: Box::new(order),
                }))
            }
            Err(Error::IntentNotFound(_)) => Ok(None),
            Err(error) => Err(error),
        }
    }

    async fn transfer_view(
        &self,
        conn: &mut sqlx::AnyConnection,
        transfer: StoredTransfer,
    ) -> Result<TransferView, Error> {
        let id = transfer.id.to_string();
        let exceptions = payments::exceptions_of_transfer(conn, &id).await?;
        let mut ledger_entries = Vec::new();
        if let Some(key) = &transfer.credited_entry {
            for key in [key.clone(), format!("reverse:{key}")] {
                if let Some(entry) = self.entry(&key).await? {
                    ledger_entries.push(entry);
                }
            }
        }
        for key in crate::store::operations::action_entries_for_transfer(conn, &id).await? {
            if let Some(entry) = self.entry(&key).await? {
                ledger_entries.push(entry);
            }
        }
        let intent = match &transfer.intent_id {
            Some(id) => Some(self.payment(id).await?),
            None => None,
        };
        let order = match &intent {
            Some(intent) => Some(self.order(&intent.intent.order_ref).await?),
            None => None,
        };
        Ok(TransferView {
            transfer,
            intent,
            order,
            exceptions,
            ledger_entries,
        })
    }

    /// Makes a token for `name` with `role` and returns it: the only time it is visible.
    pub async fn create_api_token(&self, name: &str, role: Role) -> Result<String, Error> {
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
        {
            return Err(Error::InvalidInput(
                "token name must be 1 to 64 of A-Z a-z 0-9 - _ . @".into(),
            ));
        }
        let token = fresh_token();
        let mut tx = self.db().begin_write().await?;
        if !operations::insert_token(
            tx.conn(),
            &digest(&token),
            name,
            role.as_str(),
            self.clock().now(),
        )
        .await?
        {
            return Err(Error::InvalidInput(format!("a token named {name} exists")));
        }
        tx.commit().await?;
        Ok(token)
    }

    /// Revokes the token named `name`; false if there was none live.
    pub async fn revoke_api_token(&self, name: &str) -> Result<bool, Error> {
        let mut tx = self.db().begin_write().await?;
        let revoked = operations::revoke_token(tx.conn(), name, self.clock().now()).await?;
        tx.commit().await?;
        Ok(revoked)
    }

    /// The caller `token` identifies, if it is live.
    pub async fn authenticate(&self, token: &str) -> Result<Option<Caller>, Error> {
        if !token.starts_with("prt_") || token.len() != 68 {
            return Ok(None);
        }
        let mut conn = self.db().pool().acquire().await?;
        let Some((name, role)) = operations::token_by_hash(&mut conn, &digest(token)).await? else {
            return Ok(None);
        };
        Ok(Some(Caller {
            name,
            role: role.parse()?,
        }))
    }

    /// Queues an endpoint's deliveries from event `from_seq` on again, delivered or not (an
    /// operator's replay; receivers deduplicate by event id). Returns how many.
    pub async fn replay_webhooks(
        &self,
        endpoint: &str,
        from_seq: i64,
        retry_hours: u32,
    ) -> Result<u64, Error> {
        let now = self.clock().now();
        let mut tx = self.db().begin_write().await?;
        let queued = operations::replay_deliveries(
            tx.conn(),
            endpoint,
            from_seq,
            now,
            chrono::Duration::hours(i64::from(retry_hours)),
        )
        .await?;
        tx.commit().await?;
        self.notify_events();
        Ok(queued)
    }

    /// Deliveries per endpoint and state.
    pub async fn webhook_counts(&self) -> Result<Vec<(String, String, i64)>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(operations::delivery_counts(&mut conn).await?)
    }

    /// Endpoints with deliveries that failed and wait for their next attempt, or that were
    /// given up: what operators see as a failing endpoint.
    pub async fn failing_webhooks(&self) -> Result<Vec<crate::records::FailingEndpoint>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(operations::failing_endpoints(&mut conn).await?)
    }
}

/// What `held` leaves once the exception's completed refunds took their part; refused while a
/// refund of it is under way, whose money an action must not book a second time.
async fn less_refunded(
    conn: &mut sqlx::AnyConnection,
    exception: &crate::records::ExceptionRecord,
    held: Option<crate::operator::Held>,
) -> Result<Option<crate::operator::Held>, Error> {
    let refunds = crate::store::refunds::list(conn, Some(&exception.id), i64::MAX).await?;
    if let Some(open) = refunds.iter().find(|r| {
        !matches!(
            r.state,
            crate::records::RefundState::Cancelled | crate::records::RefundState::Completed
        )
    }) {
        return Err(Error::ActionRefused {
            exception: exception.id.clone(),
            reason: format!(
                "refund {} of it is {}: cancel it first, or let the chain complete it",
                open.id,
                open.state.as_str()
            ),
        });
    }
    let refunded: u128 = refunds
        .iter()
        .filter(|r| r.state == crate::records::RefundState::Completed)
        .map(|r| r.amount.base_units())
        .sum();
    Ok(held.and_then(|mut held| {
        held.units = held.units.checked_sub(refunded).filter(|left| *left > 0)?;
        Some(held)
    }))
}

/// Resolves `exception` as `record` says: its audit line, the resolution it reads
/// (`<action> by <actor>: <reason>`), and an `exception_resolved` event, in the caller's
/// transaction.
pub(super) async fn record_resolved(
    conn: &mut sqlx::AnyConnection,
    exception: &crate::records::ExceptionRecord,
    record: &OperatorAction,
) -> Result<(), Error> {
    let resolution = format!("{} by {}: {}", record.action, record.actor, record.reason);
    operations::record_resolution(conn, record, &resolution).await?;
    let detail = serde_json::json!({
        "exception": exception.id,
        "kind": exception.kind,
        "action": record.action,
        "actor": record.actor,
        "reason": record.reason,
        "entry": record.entry_key,
        "refund_txid": record.refund_txid,
    });
    payments::append_event(
        conn,
        exception.intent_id.as_deref(),
        exception.order_ref.as_deref(),
        "exception_resolved",
        &detail,
        record.at,
    )
    .await?;
    Ok(())
}
