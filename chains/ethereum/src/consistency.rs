//! Whether a node's answers about a block agree with the block itself.
//!
//! Hosted RPCs sit behind load balancers: a backend that is behind answers `eth_getLogs` with
//! `[]` for blocks another backend already served (go-ethereum issue 24078, besu issue 8007),
//! and believing it would move the cursor past a payment for good. Every block header carries
//! `logsBloom`, the bloom of every log's address and topics in the block; the scan reads it
//! with the block anyway. A block whose bloom holds the `Transfer` topic and a watched address
//! that no answered log explains is read again from its receipts by hash, which a node either
//! serves whole or not at all, and which must add up to the header's bloom. A log the bloom
//! cannot hold was never in the block. The scan trusts no answer about a block that fails
//! these checks: it fails (transiently), and its cursor stays where it was.

use alloy::primitives::{Address, B256, Bloom, BloomInput};
use alloy::providers::{Provider, RootProvider};
use alloy::rpc::types::{Block, Log, TransactionReceipt};
use payrecon_chain_core::ScanError;

use crate::watch::{TRANSFER_TOPIC, classify};

/// The (at most three) bits one bloom input sets: a membership test costs three byte reads
/// instead of hashing, for every watched address in every block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BloomBits([(usize, u8); 3]);

impl BloomBits {
    /// The bits `input` (an address, or a 32-byte topic) sets in a bloom.
    pub fn of(input: &[u8]) -> BloomBits {
        let single = Bloom::from(BloomInput::Raw(input));
        let set: Vec<(usize, u8)> = single
            .as_slice()
            .iter()
            .enumerate()
            .filter(|(_, byte)| **byte != 0)
            .flat_map(|(index, byte)| {
                (0..8)
                    .filter(move |bit| byte & (1 << bit) != 0)
                    .map(move |bit| (index, 1u8 << bit))
            })
            .collect();
        // Fewer than three distinct bits when two of the hashes coincide: repeat one.
        BloomBits([0, 1, 2].map(|i| set.get(i).copied().unwrap_or(set[0])))
    }

    /// Whether `bloom` may hold the input (a bloom has false positives, never false negatives).
    pub fn in_bloom(&self, bloom: &Bloom) -> bool {
        self.0
            .iter()
            .all(|(index, mask)| bloom.as_slice()[*index] & mask == *mask)
    }
}

/// The watched addresses as topics, with their bloom bits.
pub struct WatchedBits {
    transfer: BloomBits,
    addresses: Vec<(Address, BloomBits)>,
}

impl WatchedBits {
    /// The bits of every watched address as a topic word (a `Transfer`'s `from` or `to`).
    pub fn new(addresses: &[Address]) -> WatchedBits {
        WatchedBits {
            transfer: BloomBits::of(TRANSFER_TOPIC.as_slice()),
            addresses: addresses
                .iter()
                .map(|address| (*address, BloomBits::of(address.into_word().as_slice())))
                .collect(),
        }
    }

    /// Whether the block's bloom says a `Transfer` from or to a watched address may be in it
    /// that none of `answered` (the logs the node gave for this block) mentions.
    pub fn unexplained(&self, bloom: &Bloom, answered: &[&Log]) -> Option<Address> {
        if !self.transfer.in_bloom(bloom) {
            return None;
        }
        self.addresses
            .iter()
            .find(|(address, bits)| {
                bits.in_bloom(bloom)
                    && !answered.iter().any(|log| {
                        log.topics()
                            .iter()
                            .skip(1)
                            .any(|topic| Address::from_word(*topic) == *address)
                    })
            })
            .map(|(address, _)| *address)
    }
}

/// A log the node answered for a block whose bloom cannot hold it: it was never in that block.
pub fn check_in_bloom(log: &Log, bloom: &Bloom, height: u64) -> Result<(), ScanError> {
    let mut own = Bloom::default();
    own.accrue_raw_log(log.address(), log.topics());
    if bloom.contains(&own) {
        Ok(())
    } else {
        Err(ScanError::Transient(format!(
            "the node answered a log of transaction {} that block {height}'s bloom cannot hold: \
             an answer that is not the block's",
            log.transaction_hash.unwrap_or_default()
        )))
    }
}

/// The receipts of `block`, read by its hash and checked whole: one per transaction, each of
/// this block, and their blooms adding up to the header's. A node that does not have the block
/// answers nothing, not a partial list, and a partial one fails the check.
pub async fn verified_receipts(
    provider: &RootProvider,
    block: &Block,
) -> Result<Vec<TransactionReceipt>, ScanError> {
    let height = block.header.number;
    let hash = block.header.hash;
    let receipts = provider
        .get_block_receipts(hash.into())
        .await
        .map_err(classify)?
        .ok_or_else(|| incomplete(height, "no receipts for it"))?;
    check_receipts(block, &receipts)?;
    Ok(receipts)
}

/// [`verified_receipts`]' check of an answer.
pub fn check_receipts(block: &Block, receipts: &[TransactionReceipt]) -> Result<(), ScanError> {
    let height = block.header.number;
    if receipts.len() != block.transactions.len() {
        return Err(incomplete(
            height,
            &format!(
                "{} receipts for {} transactions",
                receipts.len(),
                block.transactions.len()
            ),
        ));
    }
    if let Some(other) = receipts
        .iter()
        .find(|r| r.block_hash.is_some_and(|h| h != block.header.hash))
    {
        return Err(ScanError::Transient(format!(
            "a receipt of block {height} names block {}: the chain moved",
            other.block_hash.unwrap_or(B256::ZERO)
        )));
    }
    let mut bloom = Bloom::default();
    for receipt in receipts {
        bloom.accrue_bloom(receipt.inner.logs_bloom());
    }
    if bloom != block.header.logs_bloom {
        return Err(incomplete(
            height,
            "its receipts' blooms do not add up to the header's",
        ));
    }
    Ok(())
}

/// The error of an answer that leaves out part of a block.
pub fn incomplete(height: u64, what: &str) -> ScanError {
    ScanError::incomplete(format!("block {height}: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bloom_bits_agree_with_the_bloom_itself() {
        for seed in 0u8..=255 {
            let address = Address::repeat_byte(seed);
            let word = address.into_word();
            let mut bloom = Bloom::default();
            bloom.accrue(BloomInput::Raw(word.as_slice()));
            assert!(BloomBits::of(word.as_slice()).in_bloom(&bloom));
            let other = Address::repeat_byte(seed.wrapping_add(1)).into_word();
            assert_eq!(
                BloomBits::of(other.as_slice()).in_bloom(&bloom),
                bloom.contains_input(BloomInput::Raw(other.as_slice()))
            );
        }
    }

    #[test]
    fn a_bloom_with_a_watched_transfer_and_no_log_for_it_is_unexplained() {
        let watched = Address::repeat_byte(7);
        let bits = WatchedBits::new(&[watched]);
        let mut bloom = Bloom::default();
        assert_eq!(bits.unexplained(&bloom, &[]), None, "an empty block");
        bloom.accrue_raw_log(
            Address::repeat_byte(1),
            &[
                TRANSFER_TOPIC,
                Address::repeat_byte(2).into_word(),
                watched.into_word(),
            ],
        );
        assert_eq!(bits.unexplained(&bloom, &[]), Some(watched));
        let log = Log {
            inner: alloy::primitives::Log::new_unchecked(
                Address::repeat_byte(1),
                vec![
                    TRANSFER_TOPIC,
                    Address::repeat_byte(2).into_word(),
                    watched.into_word(),
                ],
                Default::default(),
            ),
            ..Log::default()
        };
        assert_eq!(bits.unexplained(&bloom, &[&log]), None);
        check_in_bloom(&log, &bloom, 1).unwrap();
        assert!(
            check_in_bloom(&log, &Bloom::default(), 1).is_err(),
            "a log the block cannot hold"
        );
    }
}
