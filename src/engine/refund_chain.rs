//! Refunds and the chain: preparing what the merchant's wallet signs, and moving a refund as
//! its transaction appears (`sent`), deepens (`completed`, booked) or is taken out by a reorg
//! (back to `approved`).

use payrecon_chain_bitcoin::{RefundInput, RefundOrder, RefundSource, refund_psbt};
use payrecon_chain_core::bitcoin::{OutPoint, Txid};
use payrecon_chain_core::{Amount, Network, Paid, ReceivedAsset};
use serde::Serialize;

use crate::audit::Rechecker;
use crate::config::Config;
use crate::engine::Engine;
use crate::error::Error;
use crate::operator::{MAX_ACTOR_LEN, check_text, held_money};
use crate::records::{
    ExceptionRecord, FeePayer, OperatorAction, Refund, RefundState, StoredTransfer,
};
use crate::refund::{PaidFrom, completion_entry, covered_by, transfer_id};
use crate::store::refunds::OnChain;
use crate::store::{StoreError, ledger, operations, outflows, payments, refunds};

/// Refunds a watcher looks after at once, longest unchanged first.
const WATCHED_AT_ONCE: i64 = 200;

/// What `payrecon refund prepare` gives the merchant: a PSBT their wallet signs.
#[derive(Clone, Debug, Serialize)]
pub struct PreparedRefund {
    /// The refund, now `prepared`.
    pub refund: Refund,
    /// The PSBT (BIP 174), base64: what Sparrow, Electrum and `walletprocesspsbt` import.
    pub psbt: String,
    /// What the customer's address receives, in the asset's units.
    pub pays: String,
    /// The network fee, in the asset's units.
    pub fee: String,
    /// The fee rate, in satoshi (litoshi) per virtual byte.
    pub fee_rate: u64,
    /// Whether the rate is the source's estimate; `false`: its relay floor, for want of one.
    pub fee_rate_estimated: bool,
    /// The outputs it spends (`txid:vout`).
    pub inputs: Vec<String>,
    /// Where the change goes, on the account's change branch, when there is change.
    pub change_address: Option<String>,
    /// That address's path below the account key (`1/<index>`).
    pub change_path: Option<String>,
}

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
    /// Prepares the PSBT of an approved Bitcoin or Litecoin refund: it spends the outputs the
    /// refund's exception holds, pays the customer, sends the change to the account's change
    /// branch, at the source's fee rate. The refund becomes `prepared`; preparing again gives
    /// the same change address (the fee rate may have moved).
    pub async fn prepare_refund(
        &self,
        config: &Config,
        id: &str,
        actor: &str,
    ) -> Result<PreparedRefund, Error> {
        check_text("actor", actor, MAX_ACTOR_LEN)?;
        let mut conn = self.db().pool().acquire().await?;
        let not_found = || Error::RefundNotFound(id.chars().take(80).collect());
        let refund = refunds::get(&mut conn, id).await?.ok_or_else(not_found)?;
        if !matches!(refund.state, RefundState::Approved | RefundState::Prepared) {
            return Err(Error::InvalidInput(format!(
                "refund {id} is {}: only an approved refund is prepared",
                refund.state.as_str()
            )));
        }
        let network = refund.method.network();
        if !matches!(network, Network::Bitcoin | Network::Litecoin) {
            return Err(Error::InvalidInput(format!(
                "payrecon prepares Bitcoin and Litecoin refunds; send this {network} refund from the merchant's wallet: payrecon sees it on the chain"
            )));
        }
        let exception = operations::get_exception(&mut conn, &refund.exception_id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("refund {id}'s exception is gone")))?;
        let held = held_outputs(&mut conn, &exception).await?;
        let settings = self.payment_settings();
        let keys = settings
            .keys
            .get(&network)
            .ok_or_else(|| Error::InvalidInput(format!("network {network} is not configured")))?;
        let mut inputs = Vec::with_capacity(held.len());
        let mut wallet = None;
        for transfer in &held {
            if let Some(spent) = outflows::spenders(&mut conn, &transfer.id)
                .await?
                .into_iter()
                .find(|o| !o.removed)
            {
                return Err(Error::InvalidInput(format!(
                    "the output {} was already spent in {}: refund from the merchant's wallet, which payrecon sees on the chain",
                    transfer.id, spent.outflow.id.txid
                )));
            }
            let intent =
                payments::intents_by_watch_keys(&mut conn, network, &[&transfer.to_address])
                    .await?
                    .into_iter()
                    .next()
                    .ok_or_else(|| {
                        Error::InvalidInput(format!(
                            "{} is no address payrecon handed out",
                            transfer.to_address
                        ))
                    })?;
            let key = keys
                .get(&intent.key_id)
                .and_then(|k| k.wallet.clone())
                .ok_or_else(|| {
                    Error::InvalidInput(format!(
                        "key {} of {} is no longer configured: add it back as a retired key",
                        intent.key_id, transfer.to_address
                    ))
                })?;
            if wallet
                .as_ref()
                .is_some_and(|w: &crate::wallet::UtxoWallet| {
                    w.account.fingerprint() != key.account.fingerprint()
                })
            {
                return Err(Error::InvalidInput(
                    "the refund's outputs belong to two account keys: send it from the merchant's wallet".into(),
                ));
            }
            let txid: Txid = transfer.id.txid.parse().map_err(|_| {
                StoreError::Corrupt(format!("transfer {} has no Bitcoin txid", transfer.id))
            })?;
            inputs.push((
                RefundInput {
                    outpoint: OutPoint {
                        txid,
                        vout: transfer.id.position,
                    },
                    value: u64::try_from(transfer.amount.base_units()).map_err(|_| {
                        StoreError::Corrupt(format!("transfer {}: amount", transfer.id))
                    })?,
                    receive_index: intent.derivation_index,
                    previous: None,
                },
                transfer.block_height,
            ));
            wallet = Some(key);
        }
        drop(conn);
        let wallet = wallet.ok_or_else(|| {
            Error::InvalidInput(format!(
                "exception {} holds no output to spend",
                exception.id
            ))
        })?;
        let (previous, rate) = source_facts(config, network, &inputs).await?;
        let mut tx = self.db().begin_write().await?;
        let change_index = refunds::change_index(tx.conn(), id, network.as_str()).await?;
        let order = RefundOrder {
            inputs: inputs
                .into_iter()
                .zip(previous)
                .map(|((input, _), previous)| RefundInput {
                    previous: Some(previous),
                    ..input
                })
                .collect(),
            pay_to: payrecon_chain_bitcoin::customer_script(
                &refund.address,
                utxo_chain(network),
                wallet.network,
            )
            .map_err(|e| Error::InvalidInput(e.to_string()))?,
            amount: u64::try_from(refund.amount.base_units())
                .map_err(|_| Error::InvalidInput("refund amount out of range".into()))?,
            fee_from_amount: refund.fee_payer == FeePayer::Customer,
            change_index,
            fee_rate: rate.sat_per_vbyte,
        };
        let built = refund_psbt(&wallet.account, wallet.origin.as_ref(), &order)
            .map_err(|e| Error::InvalidInput(format!("refund {id}: {e}")))?;
        if refund.state == RefundState::Approved {
            self.move_to(
                &mut tx,
                &refund,
                RefundState::Prepared,
                (actor, "PSBT prepared"),
            )
            .await?;
        }
        let prepared = refunds::get(tx.conn(), id).await?.ok_or_else(not_found)?;
        tx.commit().await?;
        self.notify_events();
        let method = refund.method;
        let change_address = built.change.as_ref().and_then(|(script, _)| {
            payrecon_chain_bitcoin::segwit_address(script, utxo_chain(network), wallet.network)
        });
        Ok(PreparedRefund {
            refund: prepared,
            psbt: built.psbt.to_string(),
            pays: method.format_amount(Amount::from(built.pays)),
            fee: method.format_amount(Amount::from(built.fee)),
            fee_rate: rate.sat_per_vbyte,
            fee_rate_estimated: rate.estimated,
            inputs: order
                .inputs
                .iter()
                .map(|i| i.outpoint.to_string())
                .collect(),
            change_path: built.change.as_ref().map(|_| format!("1/{change_index}")),
            change_address,
        })
    }

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
                    for spender in outflows::spenders(&mut conn, &transfer.id).await? {
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
    /// back to `approved` when a sent refund's transaction is gone.
    pub(crate) async fn refund_seen(
        &self,
        refund: &Refund,
        seen: Option<(&Candidate, &Paid)>,
    ) -> Result<(), Error> {
        let needed = self
            .payment_settings()
            .policy
            .confirmations
            .get(&refund.method.network())
            .map_or(1, |rule| rule.confirmations)
            .max(1);
        let mut tx = self.db().begin_write().await?;
        let Some(current) = refunds::get(tx.conn(), &refund.id).await? else {
            return Ok(());
        };
        if !current.state.awaits_chain() {
            return Ok(());
        }
        match seen {
            None if current.state == RefundState::Sent => {
                let detail = format!(
                    "reorg: {} no longer pays it",
                    current.txid.as_deref().unwrap_or("?")
                );
                self.move_on_chain(&mut tx, &current, RefundState::Approved, None, &detail)
                    .await?;
            }
            None => return Ok(()),
            Some((candidate, paid)) if paid.confirmations >= needed => {
                self.complete(&mut tx, &current, candidate, paid).await?;
            }
            Some((candidate, paid)) => {
                let unchanged = current.state == RefundState::Sent
                    && current.txid.as_deref() == Some(candidate.txid.as_str())
                    && current.block_height == paid.block.as_ref().map(|b| b.height);
                if unchanged {
                    return Ok(());
                }
                let detail = format!("seen in {}", candidate.txid);
                self.move_on_chain(
                    &mut tx,
                    &current,
                    RefundState::Sent,
                    Some((candidate, paid)),
                    &detail,
                )
                .await?;
            }
        }
        tx.commit().await?;
        self.notify_events();
        Ok(())
    }

    /// Completes `refund`: books it from the money its exception holds, and resolves the
    /// exception once all it holds went back.
    async fn complete(
        &self,
        tx: &mut crate::store::WriteTx,
        refund: &Refund,
        candidate: &Candidate,
        paid: &Paid,
    ) -> Result<(), Error> {
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
                Some(entry.idempotency_key)
            }
            None => None,
        };
        let detail = format!("{} deep in {}", paid.confirmations, candidate.txid);
        self.move_on_chain(
            tx,
            refund,
            RefundState::Completed,
            Some((candidate, paid)),
            &detail,
        )
        .await?;
        let Some(held) = held else {
            return Ok(());
        };
        let completed: u128 = refunds::list(tx.conn(), Some(&exception.id), i64::MAX)
            .await?
            .iter()
            .filter(|r| r.state == RefundState::Completed)
            .map(|r| r.amount.base_units())
            .sum();
        if completed >= held.units {
            let why = format!("refunded on chain in {}", candidate.txid);
            let record = OperatorAction {
                seq: 0,
                exception_id: exception.id.clone(),
                action: "mark_refunded".into(),
                actor: "payrecon".into(),
                reason: why.clone(),
                refund_txid: Some(candidate.txid.clone()),
                entry_key: entry,
                at: now,
            };
            operations::record_resolution(
                tx.conn(),
                &record,
                &format!("mark_refunded by payrecon: {why}"),
            )
            .await?;
        }
        Ok(())
    }

    async fn move_on_chain(
        &self,
        tx: &mut crate::store::WriteTx,
        refund: &Refund,
        to: RefundState,
        seen: Option<(&Candidate, &Paid)>,
        detail: &str,
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
            ("payrecon", detail, now.timestamp_millis()),
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

    async fn move_to(
        &self,
        tx: &mut crate::store::WriteTx,
        refund: &Refund,
        to: RefundState,
        (actor, detail): (&str, &str),
    ) -> Result<(), Error> {
        let now = self.clock().now();
        if refunds::change_state(
            tx.conn(),
            &refund.id,
            &[refund.state],
            to,
            (actor, detail, now.timestamp_millis()),
        )
        .await?
        {
            let moved = refunds::get(tx.conn(), &refund.id)
                .await?
                .ok_or_else(|| StoreError::Corrupt(format!("refund {} vanished", refund.id)))?;
            super::refunds::record_event(tx.conn(), &moved, now).await?;
        }
        Ok(())
    }
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
async fn held_outputs(
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

/// The transactions the refund spends (whole, for hardware wallets) and the fee rate, from
/// the network's first source.
async fn source_facts(
    config: &Config,
    network: Network,
    inputs: &[(RefundInput, Option<u64>)],
) -> Result<
    (
        Vec<payrecon_chain_core::bitcoin::Transaction>,
        payrecon_chain_bitcoin::FeeRate,
    ),
    Error,
> {
    let wanted: Vec<(Txid, Option<u64>)> = inputs
        .iter()
        .map(|(input, seen_at)| (input.outpoint.txid, *seen_at))
        .collect();
    let failed = |e: payrecon_chain_core::ScanError| Error::Chain(format!("{network}: {e}"));
    let checker = Rechecker::for_network(config, network).map_err(Error::InvalidInput)?;
    let (previous, rate) = match checker {
        Rechecker::Electrum(mut source) => (
            source.transactions(&wanted).await.map_err(failed)?,
            source.fee_rate().await.map_err(failed)?,
        ),
        Rechecker::Node(mut source) => (
            source.transactions(&wanted).await.map_err(failed)?,
            source.fee_rate().await.map_err(failed)?,
        ),
        _ => {
            return Err(Error::InvalidInput(format!(
                "network {network} has no Bitcoin-family source"
            )));
        }
    };
    Ok((previous, rate))
}

fn utxo_chain(network: Network) -> payrecon_chain_bitcoin::UtxoChain {
    match network {
        Network::Bitcoin => payrecon_chain_bitcoin::UtxoChain::Bitcoin,
        _ => payrecon_chain_bitcoin::UtxoChain::Litecoin,
    }
}
