//! Refunds: recording where an exception's money goes back, and an operator's approval (the
//! chain's part is `refund_chain`).

use payrecon_chain_core::{Amount, Method, Network};

use crate::engine::Engine;
use crate::error::Error;
use crate::operator::{MAX_ACTOR_LEN, MAX_REASON_LEN, check_text, held_money, open_exception};
use crate::records::{ExceptionRecord, Refund, RefundState};
use crate::refund::{RefundAmount, amount_of, customer_address};
use crate::store::{WriteTx, payments, refunds};

/// Refunds listed at most at once.
const MAX_LISTED: i64 = 10_000;

impl Engine {
    /// Records a refund of what `exception_id` holds, to the customer's `address` (checked as
    /// a payment address on the network the money arrived on; none of the shop's own), of
    /// `amount`: `all` that is left, the `overpaid` part, or an amount in the asset's units.
    /// Never more than is held and not yet taken by another refund; two requests at once are
    /// decided one after the other.
    pub async fn request_refund(
        &self,
        exception_id: &str,
        address: &str,
        amount: &str,
        actor: &str,
    ) -> Result<Refund, Error> {
        check_text("actor", actor, MAX_ACTOR_LEN)?;
        let mut tx = self.db().begin_write().await?;
        refunds::lock_exception(tx.conn(), exception_id).await?;
        let (exception, intent) = open_exception(&mut tx, exception_id).await?;
        let held = held_money(&mut tx, &exception, intent.as_ref())
            .await?
            .ok_or_else(|| Error::ActionRefused {
                exception: exception.id.clone(),
                reason: "it holds no money to refund".into(),
            })?;
        let asked = RefundAmount::parse(amount, held.method)?;
        let address = self
            .customers_address(&mut tx, held.method.network(), address)
            .await?;
        let refunded = refunds::list(tx.conn(), Some(&exception.id), MAX_LISTED)
            .await?
            .iter()
            .filter(|r| r.state != RefundState::Cancelled)
            .map(|r| r.amount.base_units())
            .sum();
        let (units, kind) = amount_of(asked, &exception.kind, held.method, (held.units, refunded))?;
        let refund = self.new_refund(&exception, held.method, units, kind, address);
        self.record_request(tx, refund, actor).await
    }

    /// `address` checked as a payment address of `network` and refused when it is one of the
    /// shop's own (a treasury, Solana's recipient, an address payrecon handed out).
    pub(super) async fn customers_address(
        &self,
        tx: &mut WriteTx,
        network: Network,
        address: &str,
    ) -> Result<String, Error> {
        let settings = self.payment_settings();
        let utxo_network = settings.wallets.get(&network).map(|w| w.network);
        let address = customer_address(network, utxo_network, address)?;
        let recipient = match network {
            Network::Solana => self.solana_recipient(),
            _ => None,
        };
        let own = settings.policy.is_treasury(network, &address)
            || recipient.as_deref() == Some(address.as_str())
            || !payments::intents_by_watch_keys(tx.conn(), network, &[&address])
                .await?
                .is_empty();
        if own {
            return Err(Error::InvalidInput(format!(
                "refund address {address} is one of the shop's own: give the customer's"
            )));
        }
        Ok(address)
    }

    /// A requested refund of `units` of `method` from what `exception` holds.
    pub(super) fn new_refund(
        &self,
        exception: &ExceptionRecord,
        method: Method,
        units: u128,
        kind: &str,
        address: String,
    ) -> Refund {
        let now = self.clock().now();
        let amount = Amount::from_base_units(units);
        Refund {
            id: format!("rf_{}", uuid::Uuid::new_v4().simple()),
            exception_id: exception.id.clone(),
            intent_id: exception.intent_id.clone(),
            order_ref: exception.order_ref.clone(),
            method,
            amount,
            amount_decimal: method.format_amount(amount),
            amount_kind: kind.to_owned(),
            address,
            fee_payer: self
                .payment_settings()
                .refund_fee_payer
                .get(&method)
                .copied()
                .unwrap_or_default(),
            state: RefundState::Requested,
            txid: None,
            block_height: None,
            paid: None,
            created_at: now,
            updated_at: now,
        }
    }

    /// Writes a requested refund and its event, and commits.
    pub(super) async fn record_request(
        &self,
        mut tx: WriteTx,
        refund: Refund,
        actor: &str,
    ) -> Result<Refund, Error> {
        refunds::insert(tx.conn(), &refund, actor).await?;
        record_event(tx.conn(), &refund, refund.created_at).await?;
        tx.commit().await?;
        self.notify_events();
        tracing::info!(refund = %refund.id, exception = %refund.exception_id, amount = %refund.amount_decimal, method = %refund.method, "refund requested");
        Ok(refund)
    }

    /// The customer's refund address from the checkout page: for each open exception of the
    /// intent that holds money and has no refund yet, a refund of all that is left to
    /// `address`, requested by `customer` (an operator approves it before anything is sent).
    /// An address refused for one is refused for all; nothing to refund is refused too.
    pub async fn checkout_request_refund(
        &self,
        key: &str,
        address: &str,
    ) -> Result<Vec<Refund>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        let intent = crate::checkout::intent_by_key(&mut conn, key).await?;
        let refunds = refunds::of_intent(&mut conn, &intent.id).await?;
        let waiting = refundable(&mut conn, &intent, &refunds).await?;
        drop(conn);
        let mut requested = Vec::new();
        for exception in waiting {
            match self
                .request_refund(&exception, address, "all", "customer")
                .await
            {
                Ok(refund) => requested.push(refund),
                // Its money was taken meanwhile, or it holds none to send back.
                Err(Error::ActionRefused { .. }) => {}
                Err(other) => return Err(other),
            }
        }
        if requested.is_empty() {
            return Err(Error::InvalidInput(
                "nothing of this payment is waiting to be refunded".into(),
            ));
        }
        Ok(requested)
    }

    /// An operator approves a requested refund: the merchant's wallet is to send it.
    pub async fn approve_refund(&self, id: &str, actor: &str) -> Result<Refund, Error> {
        check_text("actor", actor, MAX_ACTOR_LEN)?;
        self.move_refund(
            id,
            &[RefundState::Requested],
            RefundState::Approved,
            (actor, "approved"),
        )
        .await
    }

    /// Withdraws a refund not yet sent, with why: its amount is free for another.
    pub async fn cancel_refund(
        &self,
        id: &str,
        actor: &str,
        reason: &str,
    ) -> Result<Refund, Error> {
        check_text("actor", actor, MAX_ACTOR_LEN)?;
        check_text("reason", reason, MAX_REASON_LEN)?;
        self.move_refund(
            id,
            &[RefundState::Requested, RefundState::Approved],
            RefundState::Cancelled,
            (actor, reason),
        )
        .await
    }

    /// The refunds of one exception, or all, oldest first.
    pub async fn refunds(&self, exception_id: Option<&str>) -> Result<Vec<Refund>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(refunds::list(&mut conn, exception_id, MAX_LISTED).await?)
    }

    /// Refunds not yet completed nor cancelled: what the stuck view weighs.
    pub(crate) async fn refunds_waiting(&self) -> Result<Vec<Refund>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(refunds::in_states(
            &mut conn,
            &[
                RefundState::Requested,
                RefundState::Approved,
                RefundState::Prepared,
                RefundState::Sent,
            ],
            MAX_LISTED,
        )
        .await?)
    }

    async fn move_refund(
        &self,
        id: &str,
        from: &[RefundState],
        to: RefundState,
        (actor, detail): (&str, &str),
    ) -> Result<Refund, Error> {
        let now = self.clock().now().timestamp_millis();
        let mut tx = self.db().begin_write().await?;
        let not_found = || Error::RefundNotFound(id.chars().take(80).collect());
        let refund = refunds::get(tx.conn(), id).await?.ok_or_else(not_found)?;
        if !refunds::change_state(tx.conn(), id, from, to, (actor, detail, now)).await? {
            return Err(Error::InvalidInput(format!(
                "refund {id} is {}: it cannot become {}",
                refund.state.as_str(),
                to.as_str()
            )));
        }
        let moved = refunds::get(tx.conn(), id).await?.ok_or_else(not_found)?;
        record_event(tx.conn(), &moved, self.clock().now()).await?;
        tx.commit().await?;
        self.notify_events();
        Ok(moved)
    }
}

/// The refund's new state on the event stream, in its transaction: webhooks tell the shop of
/// every change (`refund_requested`, `refund_approved`, `refund_cancelled`).
pub(super) async fn record_event(
    conn: &mut sqlx::AnyConnection,
    refund: &Refund,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), Error> {
    let kind = match refund.state {
        RefundState::Requested => "refund_requested",
        RefundState::Approved => "refund_approved",
        RefundState::Prepared => "refund_prepared",
        RefundState::Sent => "refund_sent",
        RefundState::Completed => "refund_completed",
        RefundState::Cancelled => "refund_cancelled",
    };
    let detail = serde_json::json!({
        "refund": refund.id,
        "exception": refund.exception_id,
        "state": refund.state,
        "amount": refund.amount_decimal,
        "asset": refund.method.asset(),
        "method": refund.method,
        "address": refund.address,
        "txid": refund.txid,
    });
    payments::append_event(
        conn,
        refund.intent_id.as_deref(),
        refund.order_ref.as_deref(),
        kind,
        &detail,
        now,
    )
    .await?;
    Ok(())
}

/// Exceptions whose money a customer may ask back: overpaid, late, underpaid, another asset,
/// after settlement.
const REFUNDABLE: [&str; 5] = [
    "overpaid",
    "paid_late",
    "underpaid",
    "wrong_asset",
    "paid_after_settlement",
];

/// The open exceptions of `intent` that hold a customer's money and have none of its `refunds`
/// (not cancelled): what its checkout page offers to send back.
pub(crate) async fn refundable(
    conn: &mut sqlx::AnyConnection,
    intent: &crate::intent::PaymentIntent,
    refunds: &[Refund],
) -> Result<Vec<String>, Error> {
    Ok(payments::open_exceptions_of_intent(conn, &intent.id)
        .await?
        .into_iter()
        .filter(|e| {
            REFUNDABLE.contains(&e.kind.as_str())
                && !refunds
                    .iter()
                    .any(|r| r.exception_id == e.id && r.state != RefundState::Cancelled)
        })
        .map(|e| e.id)
        .collect())
}
