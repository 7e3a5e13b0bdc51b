//! The Ethereum scanner: ETH, USDT and USDC to watched addresses, block by block, over alloy.
//!
//! Each scan continues after the committed cursor: it checks the cursor's block is still on the
//! chain (else walks its checkpoints back to the fork point and scans again from there), reads
//! the next range of blocks with their transactions, keeps native transfers to watched
//! addresses whose receipt succeeded, and asks `eth_getLogs` for ERC-20 `Transfer` logs whose
//! `to` topic is a watched address (address list in chunks; a range the node refuses as too
//! large is split). Every token contract counts: the configured USDT and USDC are those
//! methods, any other contract is reported as another token (never credited). Removals come
//! from diffing a rescanned range against what the engine recorded there.

use std::collections::{BTreeMap, HashMap, HashSet};

use alloy::consensus::Transaction as _;
use alloy::eips::BlockNumberOrTag;
use alloy::network::TransactionResponse as _;
use alloy::primitives::{Address, B256, U256, b256};
use alloy::providers::{Provider, ProviderBuilder, RootProvider};
use alloy::rpc::types::{Filter, Log};
use alloy::transports::{RpcError, TransportErrorKind};
use futures_util::{StreamExt as _, TryStreamExt as _};
use payrecon_chain_core::{
    Amount, BlockId, ChainCursor, ChainEvent, ChainScanner, KnownTransfer, Method, Network,
    ReceivedAsset, ScanBatch, ScanError, Transfer, TransferId, WatchView,
};

/// `keccak256("Transfer(address,address,uint256)")`, topic 0 of every ERC-20 transfer.
pub const TRANSFER_TOPIC: B256 =
    b256!("ddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef");

/// Blocks requested at once while catching up.
const BLOCKS_IN_FLIGHT: usize = 8;

/// Recent block ids kept in the cursor for finding a fork point.
const KEPT_CHECKPOINTS: usize = 64;

/// When a payment counts as final.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finality {
    /// After the configured number of confirmations.
    Depth,
    /// Once the node's `finalized` block has reached it.
    Finalized,
}

/// Where and how to watch one Ethereum network.
#[derive(Clone, Debug)]
pub struct EthereumSettings {
    /// JSON-RPC over HTTP.
    pub url: String,
    /// The node must serve this chain id.
    pub chain_id: u64,
    /// USDT's contract.
    pub usdt_contract: Address,
    /// USDC's contract.
    pub usdc_contract: Address,
    /// Depth or the `finalized` tag.
    pub finality: Finality,
    /// The first block to scan when there is no cursor yet (default: the head).
    pub start_block: Option<u64>,
    /// Blocks per scan at most.
    pub max_blocks_per_scan: u64,
    /// Watched addresses per `eth_getLogs` call.
    pub addresses_per_log_query: usize,
}

impl EthereumSettings {
    /// Settings for `url` on `chain_id` with the given token contracts: depth finality, 50
    /// blocks per scan, 1000 addresses per log query.
    pub fn new(
        url: impl Into<String>,
        chain_id: u64,
        usdt_contract: Address,
        usdc_contract: Address,
    ) -> EthereumSettings {
        EthereumSettings {
            url: url.into(),
            chain_id,
            usdt_contract,
            usdc_contract,
            finality: Finality::Depth,
            start_block: None,
            max_blocks_per_scan: 50,
            addresses_per_log_query: 1000,
        }
    }

    fn token(&self, contract: Address) -> ReceivedAsset {
        if contract == self.usdt_contract {
            ReceivedAsset::Method {
                method: Method::UsdtErc20,
            }
        } else if contract == self.usdc_contract {
            ReceivedAsset::Method {
                method: Method::UsdcErc20,
            }
        } else {
            ReceivedAsset::OtherToken {
                contract: contract.to_checksum(None),
            }
        }
    }
}

/// Scans one Ethereum network through one node.
pub struct EthereumScanner {
    settings: EthereumSettings,
    provider: Option<RootProvider>,
}

impl EthereumScanner {
    /// A scanner that connects on its first scan.
    pub fn new(settings: EthereumSettings) -> EthereumScanner {
        EthereumScanner {
            settings,
            provider: None,
        }
    }

    async fn provider(&mut self) -> Result<RootProvider, ScanError> {
        if let Some(provider) = &self.provider {
            return Ok(provider.clone());
        }
        let url = self
            .settings
            .url
            .parse()
            .map_err(|e| ScanError::Fatal(format!("RPC URL {:?}: {e}", self.settings.url)))?;
        let provider = ProviderBuilder::new()
            .disable_recommended_fillers()
            .connect_http(url);
        let chain_id = provider.get_chain_id().await.map_err(classify)?;
        if chain_id != self.settings.chain_id {
            return Err(ScanError::Fatal(format!(
                "{} serves chain id {chain_id}, not the configured {}",
                self.settings.url, self.settings.chain_id
            )));
        }
        self.provider = Some(provider.clone());
        Ok(provider)
    }
}

/// A block as the scanner keeps it.
struct ScannedBlock {
    hash: B256,
    parent: B256,
    time_ms: i64,
}

impl ChainScanner for EthereumScanner {
    fn network(&self) -> Network {
        Network::Ethereum
    }

    async fn scan(&mut self, view: &WatchView) -> Result<ScanBatch, ScanError> {
        let provider = self.provider().await?;
        let settings = &self.settings;
        let mut watched: HashMap<Address, &str> = HashMap::with_capacity(view.watch_keys.len());
        for key in &view.watch_keys {
            let address: Address = key.parse().map_err(|e| {
                ScanError::Fatal(format!("watch key {key:?} is not an Ethereum address: {e}"))
            })?;
            watched.insert(address, key);
        }
        let head = provider.get_block_number().await.map_err(classify)?;

        // Where to continue: after the cursor if it is still on the chain, else after the fork.
        let (from, mut checkpoints) = match &view.cursor {
            None => (settings.start_block.unwrap_or(head), Vec::new()),
            Some(cursor) => {
                let mut chain: Vec<BlockId> = cursor.checkpoints.clone();
                chain.push(cursor.tip.clone());
                let mut kept = None;
                for (i, block) in chain.iter().enumerate().rev() {
                    if block_hash(&provider, block.height)
                        .await?
                        .map(|h| h.to_string())
                        == Some(block.hash.clone())
                    {
                        kept = Some(i);
                        break;
                    }
                }
                let Some(kept) = kept else {
                    return Err(ScanError::Fatal(format!(
                        "none of the last {} blocks processed is on the chain any more: a reorg deeper than the cursor remembers",
                        chain.len()
                    )));
                };
                if kept + 1 < chain.len() {
                    tracing::warn!(
                        fork = chain[kept].height,
                        old_tip = cursor.tip.height,
                        "chain reorganisation: scanning again from the fork point"
                    );
                }
                chain.truncate(kept + 1);
                (chain[kept].height + 1, chain)
            }
        };
        let to = head.min(from.saturating_add(settings.max_blocks_per_scan.max(1)) - 1);

        let mut blocks: BTreeMap<u64, ScannedBlock> = BTreeMap::new();
        let mut found: Vec<(Transfer, u64)> = Vec::new();
        if from <= to {
            let fetched: Vec<_> = futures_util::stream::iter(from..=to)
                .map(|height| {
                    let provider = provider.clone();
                    async move {
                        provider
                            .get_block_by_number(BlockNumberOrTag::Number(height))
                            .full()
                            .await
                            .map_err(classify)?
                            .ok_or_else(|| {
                                ScanError::Transient(format!("block {height} is not served yet"))
                            })
                    }
                })
                .buffered(BLOCKS_IN_FLIGHT)
                .try_collect()
                .await?;
            for (height, block) in (from..=to).zip(fetched) {
                let scanned = ScannedBlock {
                    hash: block.header.hash,
                    parent: block.header.parent_hash,
                    time_ms: i64::try_from(block.header.timestamp)
                        .unwrap_or(i64::MAX / 1000)
                        .saturating_mul(1000),
                };
                let expected_parent = blocks
                    .get(&(height - 1))
                    .map(|b| b.hash.to_string())
                    .or_else(|| checkpoints.last().map(|b| b.hash.clone()));
                if let Some(expected) = expected_parent
                    && expected != scanned.parent.to_string()
                {
                    return Err(ScanError::Transient(format!(
                        "block {height} does not extend the block before it: the chain moved during the scan"
                    )));
                }
                let mut candidates = Vec::new();
                for tx in block.transactions.txns() {
                    if let Some(key) = tx.to().and_then(|to| watched.get(&to))
                        && !tx.value().is_zero()
                    {
                        candidates.push((tx.tx_hash(), tx.value(), (*key).to_owned()));
                    }
                }
                // Receipts only for blocks that pay a watched address: one call per block.
                let succeeded: HashMap<B256, bool> = if candidates.is_empty() {
                    HashMap::new()
                } else {
                    provider
                        .get_block_receipts(block.header.hash.into())
                        .await
                        .map_err(classify)?
                        .ok_or_else(|| {
                            ScanError::Transient(format!("no receipts yet for block {height}"))
                        })?
                        .iter()
                        .map(|r| (r.transaction_hash, r.status()))
                        .collect()
                };
                for (hash, value, key) in candidates {
                    match succeeded.get(&hash) {
                        Some(true) => {}
                        Some(false) => continue,
                        None => {
                            return Err(ScanError::Transient(format!(
                                "the receipts of block {height} lack {hash}"
                            )));
                        }
                    }
                    found.push((
                        Transfer {
                            id: TransferId {
                                network: Network::Ethereum,
                                txid: hash.to_string(),
                                position: 0,
                            },
                            to_address: key,
                            asset: ReceivedAsset::Method {
                                method: Method::Eth,
                            },
                            amount: base_units(value, "ETH value")?,
                        },
                        height,
                    ));
                }
                blocks.insert(height, scanned);
            }
            let addresses: Vec<Address> = watched.keys().copied().collect();
            for chunk in addresses.chunks(settings.addresses_per_log_query.max(1)) {
                for log in transfer_logs(&provider, chunk, from, to).await? {
                    if log.removed {
                        continue;
                    }
                    let (Some(height), Some(index), Some(txid)) =
                        (log.block_number, log.log_index, log.transaction_hash)
                    else {
                        return Err(ScanError::Fatal("a mined log without its position".into()));
                    };
                    if blocks.get(&height).map(|b| Some(b.hash)) != Some(log.block_hash) {
                        return Err(ScanError::Transient(format!(
                            "a log of block {height} names another block hash: the chain moved during the scan"
                        )));
                    }
                    let topics = log.topics();
                    if topics.len() != 3 || log.data().data.len() != 32 {
                        continue; // not an ERC-20 Transfer (ERC-721 has 4 topics)
                    }
                    let recipient = Address::from_word(topics[2]);
                    let Some(key) = watched.get(&recipient) else {
                        continue;
                    };
                    let asset = settings.token(log.address());
                    let value = U256::from_be_slice(&log.data().data);
                    let amount = match &asset {
                        ReceivedAsset::Method { .. } => base_units(value, "token value")?,
                        // A fake token may claim any amount; it is never credited anyway.
                        ReceivedAsset::OtherToken { .. } => {
                            Amount::from_base_units(u128::try_from(value).unwrap_or(u128::MAX))
                        }
                    };
                    let position = u32::try_from(index + 1)
                        .map_err(|_| ScanError::Fatal(format!("log index {index} out of range")))?;
                    found.push((
                        Transfer {
                            id: TransferId {
                                network: Network::Ethereum,
                                txid: txid.to_string(),
                                position,
                            },
                            to_address: (*key).to_owned(),
                            asset,
                            amount,
                        },
                        height,
                    ));
                }
            }
        }

        let tip = if from <= to { to } else { from - 1 };
        // The matcher keeps the observation with the highest tip and ignores older ones. Right
        // after a reorg the rescanned range may end below the tip already committed, yet what
        // it finds is newer: report it at least at the committed tip.
        let report_tip = view
            .cursor
            .as_ref()
            .map_or(tip, |cursor| tip.max(cursor.tip.height));
        let finalized = match settings.finality {
            Finality::Depth => None,
            Finality::Finalized => Some(
                provider
                    .get_block_by_number(BlockNumberOrTag::Finalized)
                    .await
                    .map_err(classify)?
                    .map_or(0, |b| b.header.number),
            ),
        };
        let confirmations = |height: u64| -> u32 {
            let depth = u32::try_from(tip.saturating_sub(height) + 1).unwrap_or(u32::MAX);
            match finalized {
                None => depth,
                Some(f) if height <= f => depth.max(view.settle_depth),
                Some(_) => depth.min(view.settle_depth.saturating_sub(1)),
            }
        };
        let mut events = Vec::new();
        let known: HashMap<&TransferId, &KnownTransfer> =
            view.known.iter().map(|k| (&k.transfer.id, k)).collect();
        let mut present = HashSet::new();
        for (transfer, height) in found {
            let confirmations = confirmations(height);
            let seen_at_ms = match known.get(&transfer.id) {
                Some(k) => k.seen_at_ms,
                None => blocks[&height].time_ms.min(view.now_ms),
            };
            let changed = known.get(&transfer.id).is_none_or(|k| {
                k.block_height() != Some(height)
                    || (k.confirmations != confirmations && k.confirmations < view.settle_depth)
            });
            present.insert(transfer.id.clone());
            if changed {
                events.push(ChainEvent::Observed {
                    transfer,
                    confirmations,
                    seen_at_ms,
                    tip_height: report_tip,
                });
            }
        }
        for k in &view.known {
            if present.contains(&k.transfer.id) {
                continue;
            }
            match k.block_height() {
                // Rescanned and not found again: a reorg took it.
                Some(height) if height >= from && height <= to => {
                    events.push(ChainEvent::Removed {
                        id: k.transfer.id.clone(),
                        tip_height: report_tip,
                    });
                }
                // Below the scanned range and still canonical: only its depth moved.
                Some(height) if height < from => {
                    let now = confirmations(height);
                    if now != k.confirmations && k.confirmations < view.settle_depth {
                        events.push(ChainEvent::Observed {
                            transfer: k.transfer.clone(),
                            confirmations: now,
                            seen_at_ms: k.seen_at_ms,
                            tip_height: report_tip,
                        });
                    }
                }
                _ => {}
            }
        }

        for (height, block) in &blocks {
            checkpoints.push(BlockId {
                height: *height,
                hash: block.hash.to_string(),
            });
        }
        let Some(tip_block) = checkpoints.pop() else {
            // Nothing processed yet and nothing new: start below the first block to scan.
            let start = from.saturating_sub(1);
            let hash = block_hash(&provider, start)
                .await?
                .ok_or_else(|| ScanError::Transient(format!("block {start} is not served")))?;
            return Ok(ScanBatch {
                events,
                cursor: ChainCursor {
                    tip: BlockId {
                        height: start,
                        hash: hash.to_string(),
                    },
                    checkpoints: Vec::new(),
                },
                more: false,
            });
        };
        let keep_from = checkpoints.len().saturating_sub(KEPT_CHECKPOINTS);
        Ok(ScanBatch {
            events,
            cursor: ChainCursor {
                tip: tip_block,
                checkpoints: checkpoints.split_off(keep_from),
            },
            more: to < head,
        })
    }

    fn reset(&mut self) {
        self.provider = None;
    }
}

async fn block_hash(provider: &RootProvider, height: u64) -> Result<Option<B256>, ScanError> {
    Ok(provider
        .get_block_by_number(BlockNumberOrTag::Number(height))
        .await
        .map_err(classify)?
        .map(|b| b.header.hash))
}

/// `Transfer` logs to `recipients` in `from..=to`, halving the range when the node refuses it
/// as too large.
async fn transfer_logs(
    provider: &RootProvider,
    recipients: &[Address],
    from: u64,
    to: u64,
) -> Result<Vec<Log>, ScanError> {
    let topics: Vec<B256> = recipients.iter().map(|a| a.into_word()).collect();
    let mut ranges = vec![(from, to)];
    let mut logs = Vec::new();
    while let Some((low, high)) = ranges.pop() {
        let filter = Filter::new()
            .from_block(low)
            .to_block(high)
            .event_signature(TRANSFER_TOPIC)
            .topic2(topics.clone());
        match provider.get_logs(&filter).await {
            Ok(found) => logs.extend(found),
            Err(error) if too_large(&error) && high > low => {
                let middle = low + (high - low) / 2;
                ranges.push((middle + 1, high));
                ranges.push((low, middle));
            }
            Err(error) => return Err(classify(error)),
        }
    }
    Ok(logs)
}

/// Nodes refuse large log queries with -32005 (limit exceeded) or a message saying so.
fn too_large(error: &RpcError<TransportErrorKind>) -> bool {
    match error {
        RpcError::ErrorResp(payload) => {
            let message = payload.message.to_lowercase();
            payload.code == -32005
                || ["range", "too many", "limit", "exceed"]
                    .iter()
                    .any(|word| message.contains(word))
        }
        _ => false,
    }
}

fn base_units(value: U256, what: &str) -> Result<Amount, ScanError> {
    u128::try_from(value)
        .map(Amount::from_base_units)
        .map_err(|_| ScanError::Fatal(format!("{what} {value} exceeds what payrecon accounts")))
}

/// Connection trouble, rate limits and node errors are temporary; a body that does not
/// decode is not.
fn classify(error: RpcError<TransportErrorKind>) -> ScanError {
    match error {
        RpcError::DeserError { .. } | RpcError::SerError(_) => {
            ScanError::Fatal(format!("the node answered something unreadable: {error}"))
        }
        other => ScanError::Transient(format!("Ethereum RPC: {other}")),
    }
}
