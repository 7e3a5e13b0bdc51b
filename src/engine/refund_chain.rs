//! Refunds and the chain: moving a refund as its transaction appears (`sent`), deepens
//! (`completed`, booked) or is taken out by a reorg (back to `approved`), and an operator's
//! txid checked on the chain (`refund sent`, `mark-refunded`). Preparing what the merchant's
//! wallet signs is `refund_prepare`.

use payrecon_chain_core::{Amount, Network, Paid, ReceivedAsset};

use crate::audit::Rechecker;
use crate::engine::Engine;
use crate::error::Error;
use crate::ledger::NewEntry;
use crate::operator::{
    MAX_ACTOR_LEN, Resolved, check_text, check_txid, held_money, open_exception,
};
use crate::records::{ExceptionRecord, OperatorAction, Refund, RefundState, StoredTransfer};
use crate::refund::{PaidFrom, completion_entry, covered_by, transfer_id};
use crate::store::refunds::OnChain;
use crate::store::{StoreError, ledger, operations, outflows, payments, refunds};

/// Refunds a watcher looks after at once, longest unchanged first.
const WATCHED_AT_ONCE: i64 = 200;

/// Outflows from one address looked at as a refund's transaction at once, oldest first.
const CANDIDATES_AT_ONCE: i64 = 20;

/// A transaction that may pay a refund, and what payrecon knows of it.
#[derive(Clone, Debug)]
pub(crate) struct Candidate {
    pub(crate) txid: String,
    /// The block payrecon saw it in (a node without an index looks there).
    pub(crate) seen_at: Option<u64>,
    /// Spent from payrecon's addresses, with the fee it paid there; else another wallet's.
    pub(crate) from: PaidFrom,
}

/// A refund waiting for the chain, with the transactions that may pay it.
pub(crate) struct Lookout {
    pub(crate) refund: Refund,
    pub(crate) candidates: Vec<Candidate>,
}

impl Engine {
    /// The refunds of `network` waiting for the chain, each with the transactions that may
    /// pay it: its own once sent; before, those that spent the outputs it holds.
    pub(crate) async fn refund_lookouts(&self, network: Network) -> Result<Vec<Lookout>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        let waiting = refunds::awaiting_chain(&mut conn, network.as_str(), WATCHED_AT_ONCE).await?;
        let mut lookouts = Vec::with_capacity(waiting.len());
        for refund in waiting {
            let mut candidates = Vec::new();
            if let Some(txid) = &refund.txid {
                candidates.push(Candidate {
                    txid: txid.clone(),
                    seen_at: refund.block_height,
                    from: paid_from(&mut conn, network, txid).await?,
                });
            } else if let Some(exception) =
                operations::get_exception(&mut conn, &refund.exception_id).await?
            {
                for transfer in held_outputs(&mut conn, &exception).await? {
                    for spender in spending(&mut conn, &refund, &transfer).await? {
                        if spender.removed
                            || candidates
                                .iter()
                                .any(|c: &Candidate| c.txid == spender.outflow.id.txid)
                        {
                            continue;
                        }
                        let txid = spender.outflow.id.txid;
                        candidates.push(Candidate {
                            from: paid_from(&mut conn, network, &txid).await?,
                            seen_at: Some(spender.block_height),
                            txid,
                        });
                    }
                }
            }
            lookouts.push(Lookout { refund, candidates });
        }
        Ok(lookouts)
    }

    /// What the chain shows of `refund` now: `seen`, a transaction in a block paying it
    /// whole, or none. Sent when first seen, completed and booked at the network's depth,
    /// back to `approved` when a sent refund's transaction is gone. A transaction other
    /// refunds to the same address already name, and that does not pay them all, changes
    /// nothing: the answer says why.
    pub(crate) async fn refund_seen(
        &self,
        refund: &Refund,
        seen: Option<(&Candidate, &Paid)>,
        actor: &str,
    ) -> Result<Option<String>, Error> {
        let needed = self.refund_depth(refund);
        let mut tx = self.db().begin_write().await?;
        let Some(current) = refunds::get(tx.conn(), &refund.id).await? else {
            return Ok(None);
        };
        if !current.state.awaits_chain() {
            return Ok(None);
        }
        if let Some((candidate, paid)) = seen
            && let Some(short) = shared_shortfall(tx.conn(), &current, candidate, paid).await?
        {
            return Ok(Some(short));
        }
        match seen {
            // Only a look that asked about the transaction now recorded can say it is gone: an
            // operator may have recorded one after the watcher took its list.
            None if current.state == RefundState::Sent && current.txid == refund.txid => {
                let detail = format!(
                    "reorg: {} no longer pays it",
                    current.txid.as_deref().unwrap_or("?")
                );
                self.move_in(
                    &mut tx,
                    &current,
                    RefundState::Approved,
                    None,
                    (actor, &detail),
                )
                .await?;
            }
            None => return Ok(None),
            Some((candidate, paid)) if paid.confirmations >= needed => {
                self.complete(&mut tx, &current, (candidate, paid), (actor, None))
                    .await?;
            }
            Some((candidate, paid)) => {
                let unchanged = current.state == RefundState::Sent
                    && current.txid.as_deref() == Some(candidate.txid.as_str())
                    && current.block_height == paid.block.as_ref().map(|b| b.height);
                if unchanged {
                    return Ok(None);
                }
                let detail = format!("seen in {}", candidate.txid);
                self.move_in(
                    &mut tx,
                    &current,
                    RefundState::Sent,
                    Some((candidate, paid)),
                    (actor, &detail),
                )
                .await?;
            }
        }
        tx.commit().await?;
        self.notify_events();
        Ok(None)
    }

    /// Completes `refund`: books it from the money its exception holds, and resolves the
    /// exception once all it holds went back, by `actor` for `reason` (by default, the
    /// transaction). The resolution's audit line and the entry, when there are.
    async fn complete(
        &self,
        tx: &mut crate::store::WriteTx,
        refund: &Refund,
        (candidate, paid): (&Candidate, &Paid),
        (actor, reason): (&str, Option<&str>),
    ) -> Result<(Option<OperatorAction>, Option<NewEntry>), Error> {
        let now = self.clock().now();
        let exception = operations::get_exception(tx.conn(), &refund.exception_id)
            .await?
            .ok_or_else(|| {
                StoreError::Corrupt(format!("refund {}'s exception is gone", refund.id))
            })?;
        let intent = match &exception.intent_id {
            Some(id) => payments::get_intent(tx.conn(), id).await?,
            None => None,
        };
        let held = match exception.resolution {
            None => held_money(tx, &exception, intent.as_ref()).await?,
            Some(_) => None,
        };
        let entry = match held.as_ref().and_then(|h| h.source.as_ref()) {
            Some(source) => {
                let entry = completion_entry(refund, source, candidate.from, &candidate.txid)?;
                entry.validate()?;
                ledger::post_batch(tx, std::slice::from_ref(&entry), now).await??;
                Some(entry)
            }
            None => None,
        };
        let detail = format!("{} deep in {}", paid.confirmations, candidate.txid);
        self.move_in(
            tx,
            refund,
            RefundState::Completed,
            Some((candidate, paid)),
            (actor, &detail),
        )
        .await?;
        let Some(held) = held else {
            return Ok((None, entry));
        };
        if completed_units(tx.conn(), &exception.id).await? < held.units {
            return Ok((None, entry));
        }
        let record = OperatorAction {
            seq: 0,
            exception_id: exception.id.clone(),
            action: "mark_refunded".into(),
            actor: actor.to_owned(),
            reason: reason.map_or_else(
                || format!("refunded on chain in {}", candidate.txid),
                str::to_owned,
            ),
            refund_txid: Some(candidate.txid.clone()),
            entry_key: entry.as_ref().map(|e| e.idempotency_key.clone()),
            at: now,
        };
        super::operators::record_resolved(tx.conn(), &exception, &record).await?;
        Ok((Some(record), entry))
    }

    /// The depth at which a refund on its network is completed: a payment's.
    pub(crate) fn refund_depth(&self, refund: &Refund) -> u32 {
        self.payment_settings()
            .policy
            .confirmations
            .get(&refund.method.network())
            .map_or(1, |rule| rule.confirmations)
            .max(1)
    }

    /// An operator's word that `txid` paid refund `id` (from the merchant's wallet, a
    /// treasury or an exchange): checked on the network's source, it must be in a block and
    /// pay the customer's address the refund's amount. The refund is then `sent`, or
    /// `completed` and booked when already as deep as a payment must be.
    pub async fn refund_sent(&self, id: &str, txid: &str, actor: &str) -> Result<Refund, Error> {
        check_text("actor", actor, MAX_ACTOR_LEN)?;
        check_txid(txid)?;
        let mut conn = self.db().pool().acquire().await?;
        let refund = approved_refund(&mut conn, id, "recorded as sent").await?;
        drop(conn);
        let (candidate, paid) = self.checked_on_chain(&refund, txid).await?;
        if let Some(short) = self
            .refund_seen(&refund, Some((&candidate, &paid)), actor)
            .await?
        {
            return Err(Error::InvalidInput(short));
        }
        let mut conn = self.db().pool().acquire().await?;
        refunds::get(&mut conn, id)
            .await?
            .ok_or_else(|| Error::RefundNotFound(id.chars().take(80).collect()))
    }

    /// `mark-refunded`: the exception's money went back in `txid`. Only on the chain's word:
    /// the exception's one open refund names the customer's address, and `txid` must pay it
    /// the refund's amount at the depth a payment needs. The refund is completed and booked,
    /// and the exception resolved by `actor`, in one transaction.
    pub(crate) async fn mark_refunded(
        &self,
        exception_id: &str,
        txid: &str,
        (actor, reason): (&str, &str),
    ) -> Result<Resolved, Error> {
        check_txid(txid)?;
        let mut conn = self.db().pool().acquire().await?;
        let refuse = |why: String| Error::ActionRefused {
            exception: exception_id.chars().take(80).collect(),
            reason: why,
        };
        let open: Vec<Refund> = refunds::list(&mut conn, Some(exception_id), i64::MAX)
            .await?
            .into_iter()
            .filter(|r| !matches!(r.state, RefundState::Cancelled | RefundState::Completed))
            .collect();
        drop(conn);
        let refund = match open.as_slice() {
            [] => {
                return Err(refuse(format!(
                    "no refund address is recorded for it, so nothing shows what {txid} should pay: payrecon refund request {exception_id} --address <the customer's> first"
                )));
            }
            [one] if one.state == RefundState::Requested => {
                return Err(refuse(format!(
                    "its refund {} is requested: approve it first",
                    one.id
                )));
            }
            [one] => one.clone(),
            _ => {
                return Err(refuse(
                    "it has several refunds under way: record the txid on the one it paid with payrecon refund sent".into(),
                ));
            }
        };
        let (candidate, paid) = self.checked_on_chain(&refund, txid).await?;
        let needed = self.refund_depth(&refund);
        if paid.confirmations < needed {
            return Err(refuse(format!(
                "{txid} is {} blocks deep, {needed} needed: payrecon refund sent {} --txid {txid} records it now and completes it at depth",
                paid.confirmations, refund.id
            )));
        }
        let mut tx = self.db().begin_write().await?;
        let (exception, _) = open_exception(&mut tx, exception_id).await?;
        let current = refunds::get(tx.conn(), &refund.id)
            .await?
            .filter(|r| r.state == refund.state)
            .ok_or_else(|| refuse(format!("refund {} changed meanwhile: try again", refund.id)))?;
        if let Some(short) = shared_shortfall(tx.conn(), &current, &candidate, &paid).await? {
            return Err(refuse(short));
        }
        let (record, entry) = self
            .complete(
                &mut tx,
                &current,
                (&candidate, &paid),
                (actor, Some(reason)),
            )
            .await?;
        let Some(record) = record else {
            return Err(refuse(format!(
                "refund {} takes {} of what it holds: record the rest as another refund first",
                refund.id,
                refund.method.format_with_asset(refund.amount)
            )));
        };
        let exception = operations::get_exception(tx.conn(), &exception.id)
            .await?
            .ok_or_else(|| StoreError::Corrupt("a resolved exception vanished".into()))?;
        let action = operations::actions(tx.conn(), Some(&exception.id))
            .await?
            .into_iter()
            .last()
            .unwrap_or(record);
        tx.commit().await?;
        self.notify_events();
        Ok(Resolved {
            exception,
            action,
            entry,
        })
    }

    /// What the network's source says `txid` paid `refund`'s address: refused unless it is
    /// in a block and pays the amount.
    async fn checked_on_chain(
        &self,
        refund: &Refund,
        txid: &str,
    ) -> Result<(Candidate, Paid), Error> {
        let network = refund.method.network();
        let mut conn = self.db().pool().acquire().await?;
        let seen_at = outflows::of_transaction(&mut conn, network, txid)
            .await?
            .first()
            .map(|row| row.block_height);
        let candidate = Candidate {
            txid: txid.to_owned(),
            seen_at,
            from: paid_from(&mut conn, network, txid).await?,
        };
        drop(conn);
        let mut source = Rechecker::for_network(&self.payment_settings().networks, network)
            .map_err(Error::InvalidInput)?;
        let paid = source
            .paid_to(txid, &refund.address, &refund.asset(), seen_at)
            .await
            .map_err(|e| Error::Chain(format!("{network}: {e}")))?
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "{network}'s source knows no transaction {txid} paying {}",
                    refund.address
                ))
            })?;
        if paid.block.is_none() {
            return Err(Error::InvalidInput(format!(
                "{txid} is not in a block yet: record it once it is mined"
            )));
        }
        if !settles(refund, &candidate, &paid) {
            return Err(Error::InvalidInput(format!(
                "{txid} pays {} {}, the refund is {}",
                refund.address,
                refund.method.format_with_asset(paid.amount),
                refund.method.format_with_asset(refund.amount)
            )));
        }
        Ok((candidate, paid))
    }

    /// Moves `refund` to `to` in `tx`, with what the chain shows of it (`None` clears it), and
    /// puts its new state on the event stream.
    pub(crate) async fn move_in(
        &self,
        tx: &mut crate::store::WriteTx,
        refund: &Refund,
        to: RefundState,
        seen: Option<(&Candidate, &Paid)>,
        (actor, detail): (&str, &str),
    ) -> Result<(), Error> {
        let on_chain = match seen {
            Some((candidate, paid)) => OnChain {
                txid: Some(&candidate.txid),
                block_height: paid.block.as_ref().map(|b| b.height),
                paid: Some(paid.amount),
            },
            None => OnChain {
                txid: None,
                block_height: None,
                paid: None,
            },
        };
        let now = self.clock().now();
        let moved = refunds::change_on_chain(
            tx.conn(),
            &refund.id,
            (refund.state, to),
            &on_chain,
            (actor, detail, now.timestamp_millis()),
        )
        .await?;
        if moved {
            let moved = refunds::get(tx.conn(), &refund.id)
                .await?
                .ok_or_else(|| StoreError::Corrupt(format!("refund {} vanished", refund.id)))?;
            super::refunds::record_event(tx.conn(), &moved, now).await?;
        }
        Ok(())
    }
}

/// Refund `id`, refused unless approved (or prepared): only such a refund is `doing`.
pub(crate) async fn approved_refund(
    conn: &mut sqlx::AnyConnection,
    id: &str,
    doing: &str,
) -> Result<Refund, Error> {
    let refund = refunds::get(conn, id)
        .await?
        .ok_or_else(|| Error::RefundNotFound(id.chars().take(80).collect()))?;
    if !matches!(refund.state, RefundState::Approved | RefundState::Prepared) {
        return Err(Error::InvalidInput(format!(
            "refund {id} is {}: only an approved refund is {doing}",
            refund.state.as_str()
        )));
    }
    Ok(refund)
}

/// What the completed refunds of an exception took, in base units.
async fn completed_units(
    conn: &mut sqlx::AnyConnection,
    exception_id: &str,
) -> Result<u128, Error> {
    Ok(refunds::list(conn, Some(exception_id), i64::MAX)
        .await?
        .iter()
        .filter(|r| r.state == RefundState::Completed)
        .map(|r| r.amount.base_units())
        .sum())
}

/// Why `candidate` cannot pay `refund` when other refunds to the same address already name
/// it: one transaction settles them all only when it pays them all. `None` when it can.
async fn shared_shortfall(
    conn: &mut sqlx::AnyConnection,
    refund: &Refund,
    candidate: &Candidate,
    paid: &Paid,
) -> Result<Option<String>, Error> {
    let network = refund.method.network();
    let others = refunds::paid_by_same(
        conn,
        (network.as_str(), &candidate.txid),
        &refund.address,
        &refund.id,
    )
    .await?;
    if others.is_empty() {
        return Ok(None);
    }
    let together = others
        .iter()
        .try_fold(refund.amount, |sum, other| sum.checked_add(other.amount))
        .ok_or_else(|| StoreError::Corrupt("refund amounts overflow".into()))?;
    let all = Refund {
        amount: together,
        ..refund.clone()
    };
    if settles(&all, candidate, paid) {
        return Ok(None);
    }
    let named: Vec<&str> = others.iter().map(|r| r.id.as_str()).collect();
    Ok(Some(format!(
        "{} already pays {} to {}; it pays {}, not also the {} of refund {}",
        candidate.txid,
        named.join(", "),
        refund.address,
        refund.method.format_with_asset(paid.amount),
        refund.method.format_with_asset(refund.amount),
        refund.id
    )))
}

/// Whether a refund's transaction paying `paid` settles it, given where it came from.
pub(crate) fn settles(refund: &Refund, candidate: &Candidate, paid: &Paid) -> bool {
    let fee = match candidate.from {
        PaidFrom::Custody { fee } => fee,
        PaidFrom::Treasury => Amount::ZERO,
    };
    paid.block.is_some() && covered_by(refund, paid.amount, fee)
}

/// The outputs an exception's money sits in: its own transfer, else its intent's receipts
/// in the intent's asset (an overpayment is the part of them beyond the amount; an
/// underpayment's are those not booked).
pub(crate) async fn held_outputs(
    conn: &mut sqlx::AnyConnection,
    exception: &ExceptionRecord,
) -> Result<Vec<StoredTransfer>, Error> {
    if let Some(id) = exception.transfer.as_deref().and_then(transfer_id) {
        return Ok(payments::get_transfer(conn, &id)
            .await?
            .into_iter()
            .collect());
    }
    let Some(intent_id) = &exception.intent_id else {
        return Ok(Vec::new());
    };
    let Some(intent) = payments::get_intent(conn, intent_id).await? else {
        return Ok(Vec::new());
    };
    let own = ReceivedAsset::Method {
        method: intent.method,
    };
    let underpaid = exception.kind == "underpaid";
    Ok(payments::transfers_of_intent(conn, intent_id)
        .await?
        .into_iter()
        .filter(|t| !t.removed && t.asset == own && (!underpaid || t.credited_entry.is_none()))
        .collect())
}

/// The outflows that may carry `refund` from the output or address `transfer` paid: those
/// spending the output (UTXO chains), else those from its address since the money arrived,
/// of the refund's asset (account chains).
async fn spending(
    conn: &mut sqlx::AnyConnection,
    refund: &Refund,
    transfer: &StoredTransfer,
) -> Result<Vec<outflows::OutflowRow>, Error> {
    let network = refund.method.network();
    if matches!(network, Network::Bitcoin | Network::Litecoin) {
        return Ok(outflows::spenders(conn, &transfer.id).await?);
    }
    let asset = refund.asset();
    // Chain times on both sides: an outflow after the money arrived may carry the refund.
    let since = transfer.seen_at_ms;
    Ok(outflows::from_address_since(
        conn,
        (network, &transfer.to_address),
        since,
        CANDIDATES_AT_ONCE,
    )
    .await?
    .into_iter()
    .filter(|row| row.outflow.asset == asset)
    .collect())
}

/// Where `txid` took its money from: payrecon's addresses (with the fee it paid there) when
/// it is an outflow payrecon recorded, else another of the merchant's wallets.
async fn paid_from(
    conn: &mut sqlx::AnyConnection,
    network: Network,
    txid: &str,
) -> Result<PaidFrom, Error> {
    let rows = outflows::of_transaction(conn, network, txid).await?;
    if rows.is_empty() {
        return Ok(PaidFrom::Treasury);
    }
    let fee = rows
        .iter()
        .try_fold(Amount::ZERO, |sum, row| sum.checked_add(row.outflow.fee))
        .ok_or_else(|| StoreError::Corrupt(format!("outflow {txid}: fees overflow")))?;
    Ok(PaidFrom::Custody { fee })
}
