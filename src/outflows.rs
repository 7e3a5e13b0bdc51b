//! Money leaving watched addresses: recording the watchers' outflow reports and booking them.
//!
//! An outflow is booked once it is as deep as a payment on its network must be: the custody
//! account gives up what left, the destination (`treasury` when it went to one of the
//! merchant's configured addresses, `external` otherwise) receives the amount and the network
//! fee goes to an expense account. A reorg that takes a booked outflow out posts the exact
//! opposite entry; seen again, it is booked again under the next key. Reports carry state, so
//! a replayed or older report changes nothing.

use chrono::{DateTime, Utc};
use payrecon_chain_core::{OutflowEvent, ReceivedAsset};

use crate::error::Error;
use crate::ledger::{Account, Currency, EntryKind, NewEntry, Posting};
use crate::matcher::MatchPolicy;
use crate::store::outflows::{self, OutflowRow};
use crate::store::{WriteTx, ledger, payments};

/// Applies outflow reports in the caller's transaction. An outflow to one of the policy's
/// treasury addresses is a move to treasury, anything else is sent out; it is booked at the
/// confirmations a payment on its network needs.
pub(crate) async fn apply(
    tx: &mut WriteTx,
    policy: &MatchPolicy,
    events: &[OutflowEvent],
    now: DateTime<Utc>,
) -> Result<(), Error> {
    for event in events {
        let existing = outflows::get(tx.conn(), event.id()).await?;
        let row = match event {
            OutflowEvent::Sent {
                outflow,
                confirmations,
                block_height,
                seen_at_ms,
                tip_height,
            } => {
                if existing
                    .as_ref()
                    .is_some_and(|e| e.tip_height > *tip_height)
                {
                    continue;
                }
                let mut outflow = outflow.clone();
                if let Some(spent) = &outflow.spends {
                    let transfer =
                        payments::get_transfer(tx.conn(), spent)
                            .await?
                            .ok_or_else(|| {
                                Error::InvalidEvent(format!(
                                    "outflow {} spends {spent}, which payrecon never recorded",
                                    outflow.id
                                ))
                            })?;
                    if outflow.amount.checked_add(outflow.fee) != Some(transfer.amount) {
                        return Err(Error::InvalidEvent(format!(
                            "outflow {} spends {spent} of {} base units, not {} plus a fee of {}",
                            outflow.id, transfer.amount, outflow.amount, outflow.fee
                        )));
                    }
                    outflow.from_address = transfer.to_address;
                }
                if let Some(existing) = &existing
                    && existing.outflow != outflow
                {
                    return Err(Error::InvalidEvent(format!(
                        "outflow {} was reported before with other content: a transaction never changes",
                        outflow.id
                    )));
                }
                let network = outflow.id.network;
                let to_treasury = outflow
                    .to_address
                    .as_ref()
                    .is_some_and(|to| policy.is_treasury(network, to));
                let mut row = OutflowRow {
                    outflow,
                    destination: if to_treasury { "treasury" } else { "external" }.into(),
                    confirmations: *confirmations,
                    block_height: *block_height,
                    removed: false,
                    tip_height: *tip_height,
                    seen_at_ms: existing.as_ref().map_or(*seen_at_ms, |e| e.seen_at_ms),
                    posted_entry: existing.as_ref().and_then(|e| e.posted_entry.clone()),
                    postings: existing.as_ref().map_or(0, |e| e.postings),
                };
                let needed = policy
                    .confirmations
                    .get(&network)
                    .map_or(1, |rule| rule.confirmations);
                if row.posted_entry.is_none() && row.confirmations >= needed.max(1) {
                    let entry = booking(&row, row.postings + 1)?;
                    post(tx, entry.clone(), now).await?;
                    row.posted_entry = Some(entry.idempotency_key);
                    row.postings += 1;
                }
                row
            }
            OutflowEvent::Removed { tip_height, .. } => {
                let Some(mut row) = existing else { continue };
                if row.removed || row.tip_height > *tip_height {
                    continue;
                }
                row.removed = true;
                row.tip_height = *tip_height;
                if row.posted_entry.take().is_some() {
                    let original = booking(&row, row.postings)?;
                    let memo = format!(
                        "reorg: outflow {} is no longer on the chain",
                        row.outflow.id
                    );
                    post(tx, NewEntry::reversal_of_entry(&original, memo), now).await?;
                }
                row
            }
        };
        outflows::upsert(tx, &row, now).await?;
    }
    Ok(())
}

/// The entry that books `row`, the `generation`th time it is booked.
fn booking(row: &OutflowRow, generation: i64) -> Result<NewEntry, Error> {
    let outflow = &row.outflow;
    let ReceivedAsset::Method { method } = outflow.asset else {
        return Err(Error::InvalidEvent(format!(
            "outflow {} is of {}, which payrecon never took in custody",
            outflow.id, outflow.asset
        )));
    };
    let native = outflow.id.network.native_method();
    let units = |amount: payrecon_chain_core::Amount| {
        i128::try_from(amount.base_units()).map_err(|_| {
            Error::InvalidEvent(format!("outflow {}: amount out of range", outflow.id))
        })
    };
    let (amount, fee) = (units(outflow.amount)?, units(outflow.fee)?);
    let destination = match row.destination.as_str() {
        "treasury" => Account::Treasury(method),
        _ => Account::External(method),
    };
    // Each movement leaves custody for its account, in its own currency.
    let mut postings = Vec::new();
    for (to, coin, units) in [
        (destination, method, amount),
        (Account::NetworkFees(native), native, fee),
    ] {
        if units > 0 {
            postings.push(Posting::debit(to, Currency::Crypto(coin), units));
            postings.push(Posting::credit(
                Account::Custody(coin),
                Currency::Crypto(coin),
                units,
            ));
        }
    }
    if postings.is_empty() {
        return Err(Error::InvalidEvent(format!(
            "outflow {} moved nothing",
            outflow.id
        )));
    }
    Ok(NewEntry {
        idempotency_key: format!("outflow:{}:{generation}", outflow.id),
        kind: EntryKind::Outflow,
        reference: None,
        memo: format!(
            "{} sent from {} to {}",
            outflow.asset,
            outflow.from_address,
            outflow.to_address.as_deref().unwrap_or("several outputs")
        ),
        postings,
    })
}

async fn post(tx: &mut WriteTx, entry: NewEntry, now: DateTime<Utc>) -> Result<(), Error> {
    entry.validate()?;
    ledger::post_batch(tx, &[entry], now).await??;
    Ok(())
}
