//! A transfer looked up again on one node, on its own: the witness's answer before a receipt
//! is credited, and the finance audit's recheck. One receipt per transfer, plus the
//! transaction for a top-level ETH payment and the block's traces for ETH a contract moved.

use alloy::consensus::Transaction as _;
use alloy::network::TransactionResponse as _;
use alloy::primitives::{Address, B256};
use alloy::providers::{Provider, RootProvider};
use alloy::rpc::types::TransactionReceipt;
use payrecon_chain_core::{
    Amount, Attestation, BlockId, KeyIndex, KnownTransfer, Method, Paid, ReceivedAsset, ScanError,
    Transfer, TransferId, WatchKeys,
};

use crate::internal::{self, NoTraces};
use crate::watch::{EthereumSettings, base_units, classify, native_row};

/// What `provider` says of each of `transfers`, its depth counted from `head` (and the
/// finalized block, with finalized finality) as a scan with `settle_depth` counts it.
pub(crate) async fn attest(
    provider: &RootProvider,
    settings: &EthereumSettings,
    transfers: &[KnownTransfer],
    (head, finalized, settle_depth): (u64, Option<u64>, u32),
) -> Result<Vec<Attestation>, ScanError> {
    let mut answers = Vec::with_capacity(transfers.len());
    for known in transfers {
        let reported = &known.transfer;
        let hash: B256 = reported.id.txid.parse().map_err(|e| {
            ScanError::Fatal(format!(
                "{} is not a transaction hash: {e}",
                reported.id.txid
            ))
        })?;
        // A node answers receipts of canonical transactions only: no receipt, no transfer.
        let receipt = provider
            .get_transaction_receipt(hash)
            .await
            .map_err(classify)?;
        let Some(receipt) = receipt else {
            answers.push(Attestation::Missing(
                "no such transaction is known there".into(),
            ));
            continue;
        };
        let (Some(height), Some(block_hash)) = (receipt.block_number, receipt.block_hash) else {
            answers.push(Attestation::Missing("it is unmined there".into()));
            continue;
        };
        if !receipt.status() {
            answers.push(Attestation::Missing("it failed there".into()));
            continue;
        }
        if height > head {
            answers.push(Attestation::Behind { head });
            continue;
        }
        let block = BlockId {
            height,
            hash: block_hash.to_string(),
        };
        let confirmations =
            payrecon_chain_core::blocks::confirmations(height, head, finalized, settle_depth);
        let found = found(provider, settings, reported, &receipt, hash).await?;
        answers.push(match found {
            Ok(found) => {
                Attestation::of_found(reported, found.as_ref(), Some(block), confirmations)
            }
            Err(why) => Attestation::Missing(why),
        });
    }
    Ok(answers)
}

/// What transaction `txid` paid `to_address` of `asset` on this node: ETH as the
/// transaction's own value, a token as the configured contract's `Transfer` logs to it in the
/// receipt. `None` when the node has no mined receipt of it (unknown, pending, or taken out
/// by a reorg: a node answers receipts of canonical transactions only); a failed transaction
/// pays nothing.
pub(crate) async fn paid_to(
    provider: &RootProvider,
    settings: &EthereumSettings,
    (txid, to_address, asset): (&str, &str, &ReceivedAsset),
    head: u64,
) -> Result<Option<Paid>, ScanError> {
    let hash: B256 = txid
        .parse()
        .map_err(|e| ScanError::Fatal(format!("{txid} is not a transaction hash: {e}")))?;
    let to: Address = to_address
        .parse()
        .map_err(|e| ScanError::Fatal(format!("{to_address:?} is not an Ethereum address: {e}")))?;
    let receipt = provider
        .get_transaction_receipt(hash)
        .await
        .map_err(classify)?;
    let Some(receipt) = receipt else {
        return Ok(None);
    };
    let (Some(height), Some(block_hash)) = (receipt.block_number, receipt.block_hash) else {
        return Ok(None);
    };
    if height > head {
        return Err(ScanError::Transient(format!(
            "the node is at block {head}, behind the receipt's block {height}"
        )));
    }
    let amount = if !receipt.status() {
        Amount::ZERO
    } else if *asset
        == (ReceivedAsset::Method {
            method: Method::Eth,
        })
    {
        let tx = provider
            .get_transaction_by_hash(hash)
            .await
            .map_err(classify)?;
        match tx.filter(|tx| tx.to() == Some(to)) {
            Some(tx) => base_units(tx.value(), "ETH value")?,
            None => Amount::ZERO,
        }
    } else {
        let keys: WatchKeys = [to.to_checksum(None)].into_iter().collect();
        let mut watched = KeyIndex::default();
        watched
            .sync(&keys, |key| key.parse::<Address>())
            .map_err(|(key, e)| ScanError::Fatal(format!("{key}: {e}")))?;
        let mut sum = Amount::ZERO;
        for log in receipt.inner.logs() {
            if let Some((transfer, _)) = settings.token_transfer(log, &watched)?
                && transfer.asset == *asset
            {
                sum = sum
                    .checked_add(transfer.amount)
                    .ok_or_else(|| ScanError::Fatal(format!("{txid}'s transfers overflow")))?;
            }
        }
        sum
    };
    Ok(Some(Paid {
        amount,
        block: Some(BlockId {
            height,
            hash: block_hash.to_string(),
        }),
        confirmations: payrecon_chain_core::blocks::depth(height, head),
    }))
}

/// The transfer at the reported position of the transaction, as this node has it: `Ok(None)`
/// when nothing is paid there, `Err` when this node cannot say (no traces served).
async fn found(
    provider: &RootProvider,
    settings: &EthereumSettings,
    reported: &Transfer,
    receipt: &TransactionReceipt,
    hash: B256,
) -> Result<Result<Option<Transfer>, String>, ScanError> {
    let Ok(address) = reported.to_address.parse::<Address>() else {
        return Err(ScanError::Fatal(format!(
            "{:?} is not an Ethereum address",
            reported.to_address
        )));
    };
    let eth = ReceivedAsset::Method {
        method: Method::Eth,
    };
    let id = &reported.id;
    if id.position == 0 {
        let tx = provider
            .get_transaction_by_hash(hash)
            .await
            .map_err(classify)?;
        return Ok(Ok(tx.and_then(|tx| {
            let to = tx.to()?;
            let amount = base_units(tx.value(), "ETH value").ok()?;
            Some(Transfer {
                id: native_row(hash),
                to_address: named(to, address, reported),
                asset: eth.clone(),
                amount,
                from_address: Some(tx.from().to_checksum(None)),
            })
        })));
    }
    if id.is_internal() {
        let ordinal = (id.position - TransferId::INTERNAL_POSITIONS) as usize;
        let Some(block_hash) = receipt.block_hash else {
            return Ok(Ok(None));
        };
        let height = receipt.block_number.unwrap_or_default();
        return Ok(
            match internal::trace_block(provider, height, block_hash, None).await? {
                Err(NoTraces(why)) => Err(format!("it serves no traces: {why}")),
                Ok((moves, _)) => Ok(moves
                    .into_iter()
                    .find(|m| m.tx == hash && m.ordinal == ordinal)
                    .and_then(|m| {
                        Some(Transfer {
                            id: id.clone(),
                            to_address: named(m.to, address, reported),
                            asset: eth.clone(),
                            amount: base_units(m.value, "ETH value").ok()?,
                            from_address: Some(m.from.to_checksum(None)),
                        })
                    })),
            },
        );
    }
    // A token transfer: the receipt's log at the position's log index, decoded as a scan does.
    let log_index = u64::from(id.position - 1);
    let Some(log) = receipt
        .inner
        .logs()
        .iter()
        .find(|log| log.log_index == Some(log_index))
    else {
        return Ok(Ok(None));
    };
    let keys: WatchKeys = [reported.to_address.clone()].into_iter().collect();
    let mut watched = KeyIndex::default();
    watched
        .sync(&keys, |key| key.parse::<Address>())
        .map_err(|(key, e)| ScanError::Fatal(format!("{key} is not an Ethereum address: {e}")))?;
    Ok(Ok(settings
        .token_transfer(log, &watched)?
        .map(|(transfer, _)| transfer)
        // A log paying another address than the reported one: say where it went.
        .or_else(|| other_recipient(settings, log))))
}

/// The reported spelling of `to` when it is the reported address, else its own.
fn named(to: Address, reported_address: Address, reported: &Transfer) -> String {
    if to == reported_address {
        reported.to_address.clone()
    } else {
        to.to_checksum(None)
    }
}

/// A token `Transfer` log to an address other than the reported one, for the answer's text.
fn other_recipient(settings: &EthereumSettings, log: &alloy::rpc::types::Log) -> Option<Transfer> {
    let topics = log.topics();
    if topics.len() != 3 || log.data().data.len() != 32 {
        return None;
    }
    let to = Address::from_word(topics[2]);
    let keys: WatchKeys = [to.to_checksum(None)].into_iter().collect();
    let mut watched = KeyIndex::default();
    watched.sync(&keys, |key| key.parse::<Address>()).ok()?;
    settings
        .token_transfer(log, &watched)
        .ok()
        .flatten()
        .map(|(transfer, _)| transfer)
}
