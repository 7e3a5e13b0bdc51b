//! The Ethereum scanner: ETH, USDT and USDC to watched addresses, block by block, over alloy.
//!
//! Each scan continues after the committed cursor: it checks the cursor's block is still on the
//! chain (else walks its checkpoints back to the fork point and scans again from there), reads
//! the next range of blocks with their transactions, keeps native transfers to watched
//! addresses whose receipt succeeded, and asks `eth_getLogs` for ERC-20 `Transfer` logs whose
//! `to` topic is a watched address (address list in chunks; a range the node refuses as too
//! large is split). Over a WebSocket URL the scanner also subscribes to new heads so a block
//! is scanned as it arrives; polling remains the fallback. Every token contract counts: the configured USDT and USDC are those
//! methods, any other contract is reported as another token (never credited). Removals come
//! from diffing a rescanned range against what the engine recorded there.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use alloy::consensus::Transaction as _;
use alloy::eips::BlockNumberOrTag;
use alloy::network::TransactionResponse as _;
use alloy::primitives::{Address, B256, Bytes, U256, b256};
use alloy::providers::{Provider, ProviderBuilder, RootProvider, WsConnect};
use alloy::pubsub::Subscription;
use alloy::rpc::client::ClientBuilder;
use alloy::rpc::types::{Block, Filter, Header, Log, TransactionReceipt, TransactionRequest};
use alloy::transports::layers::{RateLimitRetryPolicy, RetryBackoffLayer, RetryPolicy};
use alloy::transports::{RpcError, TransportError, TransportErrorKind};
use futures_util::{StreamExt as _, TryStreamExt as _};
use payrecon_chain_core::Paid;
use payrecon_chain_core::blocks::{self, BlockRange};
use payrecon_chain_core::{
    Amount, Attestation, BlockId, ChainScanner, Finding, KeyIndex, KnownTransfer, Method, Network,
    Outflow, Probe, ReceivedAsset, ScanBatch, ScanError, SecretUrl, SweepFees, Transfer,
    TransferId, WatchView,
};
use tokio::sync::broadcast::error::RecvError;

use crate::consistency::{self, WatchedBits};
use crate::internal::{Found, InternalWatch, NativeFlows};
use crate::transport::{CappedHttp, MAX_RETRY_AFTER};

/// `keccak256("Transfer(address,address,uint256)")`, topic 0 of every ERC-20 transfer.
pub const TRANSFER_TOPIC: B256 =
    b256!("ddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef");

/// Gas an ERC-20 `transfer` to a fresh holder costs, with room (USDT's about 63,000 and
/// USDC's about 60,000 on mainnet): what a token sweep is priced at.
pub const TOKEN_TRANSFER_GAS: u64 = 65_000;

/// Gas of a plain ETH transfer, fixed by the protocol.
pub const ETH_TRANSFER_GAS: u64 = 21_000;

/// The selector of ERC-20 `balanceOf(address)`.
const BALANCE_OF: [u8; 4] = [0x70, 0xa0, 0x82, 0x31];

/// Blocks requested at once while catching up.
const BLOCKS_IN_FLIGHT: usize = 8;

/// Retries of one request the node refused as rate-limited or failed with a retryable server
/// error, before the whole scan fails and the watcher backs off.
const REQUEST_RETRIES: u32 = 5;

/// The first pause before retrying a request, in milliseconds (or the node's own hint).
const REQUEST_BACKOFF_MS: u64 = 200;

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
    /// JSON-RPC over `http(s)://`, or `ws(s)://` to also follow new heads by subscription.
    pub url: SecretUrl,
    /// The node must serve this chain id.
    pub chain_id: u64,
    /// USDT's contract.
    pub usdt_contract: Address,
    /// USDC's contract.
    pub usdc_contract: Address,
    /// Depth or the `finalized` tag.
    pub finality: Finality,
    /// The first block to scan when there is no cursor yet. By default the block of the
    /// earliest watch key's birth (see [`blocks::start_height`]), or the head when there is none.
    pub start_block: Option<u64>,
    /// Blocks per scan at most.
    pub max_blocks_per_scan: u64,
    /// Watched addresses per `eth_getLogs` call.
    pub addresses_per_log_query: usize,
    /// Connecting and each request over HTTP, and connecting over a WebSocket.
    pub timeout: Duration,
    /// The largest answer read over HTTP; a larger one fails the request.
    pub max_answer_bytes: usize,
    /// Whether to look for money leaving watched addresses: on in every watcher payrecon
    /// runs; off only to measure what it costs (`payrecon bench ethereum`).
    pub outflows: bool,
    /// Whether to look for ETH moved inside calls (see [`crate::internal`]): on in every
    /// watcher payrecon runs; off only to measure what it costs (`payrecon bench ethereum`).
    pub internal_transfers: bool,
}

impl EthereumSettings {
    /// Settings for `url` on `chain_id` with the given token contracts: depth finality, 50
    /// blocks per scan, 1000 addresses per log query.
    pub fn new(
        url: impl Into<SecretUrl>,
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
            timeout: Duration::from_secs(30),
            max_answer_bytes: 64 << 20,
            outflows: true,
            internal_transfers: true,
        }
    }

    /// The ERC-20 transfer a `Transfer` log records, with its block, if it pays a watched
    /// address. Position 0 is the native value, so log `n` is position `n + 1`.
    pub(crate) fn token_transfer(
        &self,
        log: &Log,
        watched: &KeyIndex<Address>,
    ) -> Result<Option<(Transfer, u64)>, ScanError> {
        let Some(found) = self.transfer_log(log, watched, 2)? else {
            return Ok(None);
        };
        let transfer = Transfer {
            id: found.id,
            to_address: found.watched.to_string(),
            asset: found.asset,
            amount: found.amount,
            from_address: Some(found.counterparty.to_checksum(None)),
        };
        Ok(Some((transfer, found.height)))
    }

    /// The outflow a `Transfer` log records, with its block, if it takes USDT or USDC from a
    /// watched address. Any contract can log a transfer "from" any address, so only the
    /// configured tokens count; their fee is on the transaction's native row.
    fn token_outflow(
        &self,
        log: &Log,
        watched: &KeyIndex<Address>,
    ) -> Result<Option<(Outflow, u64)>, ScanError> {
        let Some(found) = self.transfer_log(log, watched, 1)? else {
            return Ok(None);
        };
        if !matches!(found.asset, ReceivedAsset::Method { .. }) {
            return Ok(None);
        }
        let outflow = Outflow {
            id: found.id,
            spends: None,
            from_address: found.watched.to_string(),
            asset: found.asset,
            amount: found.amount,
            fee: Amount::ZERO,
            to_address: Some(found.counterparty.to_checksum(None)),
        };
        Ok(Some((outflow, found.height)))
    }

    /// A mined ERC-20 `Transfer` log whose topic `side` (1: from, 2: to) is a watched address.
    fn transfer_log<'w>(
        &self,
        log: &Log,
        watched: &'w KeyIndex<Address>,
        side: usize,
    ) -> Result<Option<TransferLog<'w>>, ScanError> {
        if log.removed {
            return Ok(None);
        }
        let (Some(height), Some(index), Some(txid)) =
            (log.block_number, log.log_index, log.transaction_hash)
        else {
            return Err(ScanError::Fatal("a mined log without its position".into()));
        };
        let topics = log.topics();
        if topics.len() != 3 || log.data().data.len() != 32 {
            return Ok(None); // not an ERC-20 Transfer (ERC-721 has 4 topics)
        }
        let Some(key) = watched.get(&Address::from_word(topics[side])) else {
            return Ok(None);
        };
        let asset = self.token(log.address());
        let value = U256::from_be_slice(&log.data().data);
        let amount = match &asset {
            ReceivedAsset::Method { .. } => base_units(value, "token value")?,
            // A fake token may claim any amount; it is never credited anyway.
            ReceivedAsset::OtherToken { .. } => {
                Amount::from_base_units(u128::try_from(value).unwrap_or(u128::MAX))
            }
        };
        let position = index
            .checked_add(1)
            .and_then(|position| u32::try_from(position).ok())
            .ok_or_else(|| ScanError::Fatal(format!("log index {index} out of range")))?;
        Ok(Some(TransferLog {
            id: TransferId {
                network: Network::Ethereum,
                txid: txid.to_string(),
                position,
            },
            watched: key,
            counterparty: Address::from_word(topics[3 - side]),
            asset,
            amount,
            height,
        }))
    }

    /// The contract of a token method: what [`Self::token`] maps back to it.
    fn contract_of(&self, method: Method) -> Option<Address> {
        match method {
            Method::UsdtErc20 => Some(self.usdt_contract),
            Method::UsdcErc20 => Some(self.usdc_contract),
            _ => None,
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

/// A `Transfer` log touching a watched address.
struct TransferLog<'w> {
    id: TransferId,
    watched: &'w Arc<str>,
    counterparty: Address,
    asset: ReceivedAsset,
    amount: Amount,
    height: u64,
}

/// Scans one Ethereum network through one node.
pub struct EthereumScanner {
    settings: EthereumSettings,
    provider: Option<RootProvider>,
    heads: Option<Subscription<Header>>,
    /// The watched addresses, kept in step with the view's keys.
    watched: KeyIndex<Address>,
    /// The search for ETH moved inside calls.
    internal: InternalWatch,
    /// Answers found incomplete since the scanner was made.
    incomplete_answers: u64,
}

impl EthereumScanner {
    /// A scanner that connects on its first scan.
    pub fn new(settings: EthereumSettings) -> EthereumScanner {
        EthereumScanner {
            settings,
            provider: None,
            heads: None,
            watched: KeyIndex::default(),
            internal: InternalWatch::default(),
            incomplete_answers: 0,
        }
    }

    pub(crate) async fn provider(&mut self) -> Result<RootProvider, ScanError> {
        if let Some(provider) = &self.provider {
            return Ok(provider.clone());
        }
        let settings = &self.settings;
        let url: url::Url = settings
            .url
            .expose()
            .parse()
            .map_err(|e| ScanError::Fatal(format!("RPC URL {}: {e}", settings.url)))?;
        let client = ClientBuilder::default().layer(RetryBackoffLayer::new_with_policy(
            REQUEST_RETRIES,
            REQUEST_BACKOFF_MS,
            u64::from(u32::MAX),
            RetryRateLimitsNotRanges,
        ));
        let subscribe = matches!(url.scheme(), "ws" | "wss");
        let client = match url.scheme() {
            "http" | "https" => {
                let transport = CappedHttp::new(
                    settings.url.clone(),
                    settings.timeout,
                    settings.max_answer_bytes,
                )?;
                let is_local = alloy::transports::utils::guess_local_url(url.as_str());
                client.transport(transport, is_local)
            }
            "ws" | "wss" => {
                let connect = client.ws(WsConnect::new(url.as_str()));
                tokio::time::timeout(settings.timeout, connect)
                    .await
                    .map_err(|_| {
                        ScanError::Transient(format!(
                            "{} accepted no WebSocket within {:?}",
                            settings.url, settings.timeout
                        ))
                    })?
                    .map_err(classify)?
            }
            other => {
                return Err(ScanError::Fatal(format!(
                    "RPC URL {}: scheme {other:?} is neither http(s) nor ws(s)",
                    settings.url
                )));
            }
        };
        let provider = ProviderBuilder::new()
            .disable_recommended_fillers()
            .connect_client(client);
        let chain_id = provider.get_chain_id().await.map_err(classify)?;
        if chain_id != self.settings.chain_id {
            return Err(ScanError::WrongChain(format!(
                "{} serves chain id {chain_id}, not the configured {}",
                self.settings.url, self.settings.chain_id
            )));
        }
        if subscribe {
            match provider.subscribe_blocks().await {
                Ok(heads) => self.heads = Some(heads),
                Err(error) => tracing::warn!(
                    url = %self.settings.url,
                    %error,
                    "no new-head subscription: polling only"
                ),
            }
        }
        self.provider = Some(provider.clone());
        Ok(provider)
    }
}

impl ChainScanner for EthereumScanner {
    fn network(&self) -> Network {
        Network::Ethereum
    }

    fn source(&self) -> &SecretUrl {
        &self.settings.url
    }

    async fn scan(&mut self, view: &WatchView) -> Result<ScanBatch, ScanError> {
        let provider = self.provider().await?;
        let settings = &self.settings;
        self.watched
            .sync(&view.watch_keys, |key| key.parse::<Address>())
            .map_err(|(key, e)| {
                ScanError::Fatal(format!("watch key {key:?} is not an Ethereum address: {e}"))
            })?;
        let watched = &self.watched;
        let head = provider.get_block_number().await.map_err(classify)?;
        let start = blocks::start_height(
            settings.start_block,
            view,
            head,
            blocks::SLOT_CLOCK_SLACK_MS,
            |height| {
                let provider = provider.clone();
                async move { block_time(&provider, height).await }
            },
        )
        .await?;
        let resume = blocks::resume(view.cursor.as_ref(), start, |height| {
            let provider = provider.clone();
            async move {
                Ok(block_hash(&provider, height)
                    .await?
                    .map(|hash| hash.to_string()))
            }
        })
        .await?;
        let mut range = BlockRange::new(resume);
        let from = range.from();
        let to = head.min(from.saturating_add(settings.max_blocks_per_scan.max(1)) - 1);
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
            for block in &fetched {
                range.push_block(
                    block.header.number,
                    block.header.hash.to_string(),
                    &block.header.parent_hash.to_string(),
                    i64::try_from(block.header.timestamp)
                        .unwrap_or(i64::MAX / 1000)
                        .saturating_mul(1000),
                )?;
            }
            let addresses: Vec<Address> = watched.iter().map(|(address, _)| *address).collect();
            let logs = token_logs(&provider, settings, &addresses, from, to).await?;
            let reader = BlockReader {
                provider: &provider,
                settings,
                watched,
                bits: WatchedBits::new(&addresses),
            };
            let mut flows = NativeFlows::default();
            for block in &fetched {
                let healed = reader
                    .read(block, &logs, &mut range, &mut flows)
                    .await
                    .inspect_err(|e| self.incomplete_answers += u64::from(e.is_incomplete()))?;
                self.incomplete_answers += u64::from(healed);
            }
            if settings.internal_transfers {
                let found = Found {
                    watched,
                    flows: &flows,
                    track_outflows: settings.outflows,
                };
                self.internal
                    .scan(&provider, &fetched, view, &found, &mut range)
                    .await?;
            }
        }
        let finalized = finalized_height(&provider, settings.finality).await?;
        Ok(range.into_batch(view, head, |height, tip| {
            blocks::confirmations(height, tip, finalized, view.settle_depth)
        }))
    }

    fn reset(&mut self) {
        self.provider = None;
        self.heads = None;
        self.internal.reset();
    }

    fn incomplete_answers(&self) -> u64 {
        self.incomplete_answers
    }

    async fn probe(&mut self) -> Result<Probe, ScanError> {
        let provider = self.provider().await?;
        let head = provider.get_block_number().await.map_err(classify)?;
        let mut findings = Vec::new();
        for (method, contract, symbol) in [
            (Method::UsdtErc20, self.settings.usdt_contract, "USDT"),
            (Method::UsdcErc20, self.settings.usdc_contract, "USDC"),
        ] {
            let mainnet = self.settings.chain_id == 1;
            findings.push(Finding {
                method,
                what: format!("{symbol} contract {contract}"),
                outcome: token_identity(&provider, contract, mainnet.then_some(symbol)).await?,
                essential: true,
            });
        }
        findings.extend(node_api_findings(&provider, head, &self.settings.url).await?);
        Ok(Probe {
            tip_height: head,
            tip_time_ms: block_time(&provider, head).await?,
            syncing: false,
            findings,
        })
    }

    async fn attest(
        &mut self,
        transfers: &[KnownTransfer],
        settle_depth: u32,
    ) -> Result<Vec<Attestation>, ScanError> {
        let provider = self.provider().await?;
        let head = provider.get_block_number().await.map_err(classify)?;
        let finalized = finalized_height(&provider, self.settings.finality).await?;
        let depth = (head, finalized, settle_depth);
        crate::attest::attest(&provider, &self.settings, transfers, depth).await
    }

    /// The receipt, and for ETH the transaction (see [`crate::attest::paid_to`]).
    async fn paid_to(
        &mut self,
        txid: &str,
        to_address: &str,
        asset: &ReceivedAsset,
        _seen_at: Option<u64>,
    ) -> Result<Option<Paid>, ScanError> {
        let provider = self.provider().await?;
        let head = provider.get_block_number().await.map_err(classify)?;
        crate::attest::paid_to(&provider, &self.settings, (txid, to_address, asset), head).await
    }

    /// The balances at the last block before `until_ms` (see [`Self::balances_at_height`]).
    async fn balances_at(
        &mut self,
        holdings: &[(String, Method)],
        until_ms: i64,
    ) -> Result<(BlockId, Vec<Amount>), ScanError> {
        let provider = self.provider().await?;
        let head = provider.get_block_number().await.map_err(classify)?;
        let height = blocks::last_block_before(head, until_ms, |height| {
            let provider = provider.clone();
            async move { block_time(&provider, height).await }
        })
        .await?;
        self.balances_at_height(holdings, height).await
    }

    /// ETH through the deployless balance reader and the tokens by `balanceOf` in JSON-RPC
    /// batches, all pinned to the block's hash, so the answers hold still however the chain
    /// moves meanwhile.
    async fn balances_at_height(
        &mut self,
        holdings: &[(String, Method)],
        height: u64,
    ) -> Result<(BlockId, Vec<Amount>), ScanError> {
        let provider = self.provider().await?;
        let hash = block_hash(&provider, height)
            .await?
            .ok_or_else(|| blocks_moved(height))?;
        let mut owners: HashMap<Method, Vec<(usize, Address)>> = HashMap::new();
        for (index, (address, method)) in holdings.iter().enumerate() {
            let owner: Address = address.parse().map_err(|e| {
                ScanError::Fatal(format!("{address:?} is not an Ethereum address: {e}"))
            })?;
            if *method != Method::Eth && self.settings.contract_of(*method).is_none() {
                return Err(ScanError::Fatal(format!(
                    "{method} is not paid on Ethereum"
                )));
            }
            owners.entry(*method).or_default().push((index, owner));
        }
        let mut balances = vec![Amount::ZERO; holdings.len()];
        for (method, asked) in owners {
            let addresses: Vec<Address> = asked.iter().map(|(_, a)| *a).collect();
            let found = match self.settings.contract_of(method) {
                None => crate::internal::balances(&provider, &addresses, hash).await?,
                Some(contract) => token_balances(&provider, contract, &addresses, hash).await?,
            };
            for ((index, _), balance) in asked.into_iter().zip(found) {
                balances[index] = base_units(balance, "balance")?;
            }
        }
        Ok((
            BlockId {
                height,
                hash: hash.to_string(),
            },
            balances,
        ))
    }

    async fn sweep_fees(&mut self) -> Result<SweepFees, ScanError> {
        let provider = self.provider().await?;
        let gas_price = provider.get_gas_price().await.map_err(classify)?;
        let fee = |gas: u64| Amount::from_base_units(gas_price.saturating_mul(u128::from(gas)));
        Ok(SweepFees {
            per_token: fee(TOKEN_TRANSFER_GAS),
            native: fee(ETH_TRANSFER_GAS),
            basis: format!(
                "{gas_price} wei per gas: {TOKEN_TRANSFER_GAS} gas per token transfer, {ETH_TRANSFER_GAS} per ETH transfer"
            ),
        })
    }

    async fn news(&mut self) {
        let Some(heads) = &mut self.heads else {
            return std::future::pending().await;
        };
        match heads.recv_any().await {
            // Any push, even one that does not decode or a missed backlog, is worth a scan.
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            // Closed: scan once now and poll from then on; a reset subscribes again.
            Err(RecvError::Closed) => {
                tracing::warn!("new-head subscription ended: polling only");
                self.heads = None;
            }
        }
    }
}

/// What the scanner needs of the node beyond the standard calls, tried on the head block:
/// `eth_getBlockReceipts` (a block's receipts whole, to read a block whose log answer was
/// incomplete), `eth_call` of creation code at a block (the balance reader), and a tracer
/// (`debug_traceBlockByHash` or `trace_block`, to say which call paid ETH inside a
/// transaction). Hosted providers differ here: `payrecon doctor` says which are served.
async fn node_api_findings(
    provider: &RootProvider,
    head: u64,
    source: &SecretUrl,
) -> Result<Vec<Finding>, ScanError> {
    let hash = block_hash(provider, head)
        .await?
        .ok_or_else(|| blocks_moved(head))?;
    let refused = |error: RpcError<TransportErrorKind>| match error {
        RpcError::ErrorResp(payload) => format!(
            "refused: {}",
            payrecon_chain_core::excerpt(&payload.message)
        ),
        other => format!(
            "failed: {}",
            payrecon_chain_core::excerpt(&source.scrub(&other.to_string()))
        ),
    };
    let served = "served".to_owned();
    let receipts = provider
        .get_block_receipts(hash.into())
        .await
        .map(|_| served.clone())
        .map_err(refused);
    let reader = crate::internal::balances(provider, &[Address::ZERO], hash)
        .await
        .map(|_| served)
        .map_err(|e| source.scrub(&e.to_string()));
    let tracer = match crate::internal::trace_block(provider, head, hash, None).await? {
        Ok((_, tracer)) => Ok(format!("served ({tracer:?})")),
        Err(crate::internal::NoTraces(why)) => Err(format!(
            "neither debug_traceBlockByHash nor trace_block is served ({why}): ETH paid inside \
             a contract's call is still found by balance, but becomes an exception instead of \
             a receipt"
        )),
    };
    Ok(vec![
        Finding {
            method: Method::UsdtErc20,
            what: "eth_getBlockReceipts (reading a block whose log answer was incomplete)".into(),
            outcome: receipts,
            essential: true,
        },
        Finding {
            method: Method::Eth,
            what: "eth_call of creation code at a block (the balance reader)".into(),
            outcome: reader,
            essential: true,
        },
        Finding {
            method: Method::Eth,
            what: "a tracer (ETH paid inside contract calls)".into(),
            outcome: tracer,
            essential: false,
        },
    ])
}

/// The newest finalized block with `finalized` finality; `None` with depth finality.
async fn finalized_height(
    provider: &RootProvider,
    finality: Finality,
) -> Result<Option<u64>, ScanError> {
    Ok(match finality {
        Finality::Depth => None,
        Finality::Finalized => Some(
            provider
                .get_block_by_number(BlockNumberOrTag::Finalized)
                .await
                .map_err(classify)?
                .map_or(0, |b| b.header.number),
        ),
    })
}

/// A log must come from the block this scan read at its height, or the chain moved between
/// reading the block and asking for its logs.
fn same_block(range: &BlockRange, log: &Log, height: u64) -> Result<(), ScanError> {
    if range.hash_of(height) != Some(log.block_hash.unwrap_or_default().to_string().as_str()) {
        return Err(ScanError::Transient(format!(
            "a log of block {height} names another block hash: the chain moved during the scan"
        )));
    }
    Ok(())
}

/// What a scan reads each block of its range with.
struct BlockReader<'a> {
    provider: &'a RootProvider,
    settings: &'a EthereumSettings,
    watched: &'a KeyIndex<Address>,
    bits: WatchedBits,
}

impl BlockReader<'_> {
    /// One block of the range into `range` and `flows`: its token transfers (from `logs`, the
    /// range's log answer, or from the block's receipts when its bloom doubts that answer), and
    /// the ETH its transactions paid watched addresses or cost them. Returns whether the log
    /// answer had left out what the receipts hold.
    async fn read(
        &self,
        block: &Block,
        logs: &[Log],
        range: &mut BlockRange,
        flows: &mut NativeFlows,
    ) -> Result<bool, ScanError> {
        let (settings, watched) = (self.settings, self.watched);
        let height = block.header.number;
        let answered: Vec<&Log> = logs
            .iter()
            .filter(|log| log.block_number == Some(height))
            .collect();
        for log in &answered {
            same_block(range, log, height)?;
            consistency::check_in_bloom(log, &block.header.logs_bloom, height)?;
        }
        let (received, sent) = top_level(block, watched, settings.outflows);
        let doubted = self.bits.unexplained(&block.header.logs_bloom, &answered);
        let receipts = if received.is_empty() && sent.is_empty() && doubted.is_none() {
            None
        } else {
            Some(consistency::verified_receipts(self.provider, block).await?)
        };
        let mut healed = false;
        let block_logs: Vec<&Log> = match (&receipts, doubted) {
            // The receipts are the block whole: what the log query left out is in them.
            (Some(receipts), Some(address)) => {
                let whole: Vec<&Log> = receipts.iter().flat_map(|r| r.logs()).collect();
                healed = count_found(settings, &whole, watched)?
                    > count_found(settings, &answered, watched)?;
                if healed {
                    tracing::warn!(
                        block = height,
                        %address,
                        "the node's log query left out transfers its block's receipts hold"
                    );
                }
                whole
            }
            _ => answered,
        };
        for log in block_logs {
            if let Some((transfer, height)) = settings.token_transfer(log, watched)? {
                range.push_transfer(transfer, height)?;
            }
            if settings.outflows
                && let Some((outflow, height)) = settings.token_outflow(log, watched)?
            {
                range.push_outflow(outflow, height)?;
            }
        }
        let (transfers, outflows) = native_movements(block, received, sent, receipts.as_deref())?;
        for transfer in transfers {
            flows.receive(height, &transfer.to_address, transfer.amount);
            range.push_transfer(transfer, height)?;
        }
        for outflow in outflows {
            flows.send(height, &outflow.from_address, outflow.amount, outflow.fee);
            range.push_outflow(outflow, height)?;
        }
        Ok(healed)
    }
}

/// The `Transfer` logs of `from..=to` that concern watched addresses: to any of them, of any
/// contract, and (when outflows are followed) out of them, of USDT and USDC. Each log once: a
/// transfer between two watched addresses, or of USDT to one when outflows are read by
/// contract, answers both queries, and every log of the answer is read both ways.
async fn token_logs(
    provider: &RootProvider,
    settings: &EthereumSettings,
    addresses: &[Address],
    from: u64,
    to: u64,
) -> Result<Vec<Log>, ScanError> {
    let mut logs = Vec::new();
    if addresses.is_empty() {
        return Ok(logs);
    }
    let chunk_size = settings.addresses_per_log_query.max(1);
    for chunk in addresses.chunks(chunk_size) {
        logs.extend(transfer_logs(provider, LogQuery::To(chunk), from, to).await?);
    }
    // Outflows count for USDT and USDC only: past one chunk of addresses, every transfer of the
    // two contracts in the range costs one query where asking by sender would cost one per
    // chunk.
    if settings.outflows {
        let outflow_query = if addresses.len() <= chunk_size {
            LogQuery::From(addresses)
        } else {
            LogQuery::Contracts(&[settings.usdt_contract, settings.usdc_contract])
        };
        let asked: HashSet<(Option<B256>, Option<u64>)> = logs
            .iter()
            .map(|log| (log.transaction_hash, log.log_index))
            .collect();
        logs.extend(
            transfer_logs(provider, outflow_query, from, to)
                .await?
                .into_iter()
                .filter(|log| !asked.contains(&(log.transaction_hash, log.log_index))),
        );
    }
    Ok(logs)
}

/// How many token transfers and outflows of watched addresses `logs` carry.
fn count_found(
    settings: &EthereumSettings,
    logs: &[&Log],
    watched: &KeyIndex<Address>,
) -> Result<usize, ScanError> {
    let mut found = 0;
    for log in logs {
        found += usize::from(settings.token_transfer(log, watched)?.is_some());
        found += usize::from(settings.outflows && settings.token_outflow(log, watched)?.is_some());
    }
    Ok(found)
}

/// A transaction of the block paying a watched address ETH at its top level: hash, value,
/// the watched key, the sender.
type TopLevelReceipt = (B256, U256, String, Address);

/// A transaction of the block a watched address sent: hash, value, the watched key, recipient.
type TopLevelSend = (B256, U256, String, Option<Address>);

/// The block's transactions that pay a watched address ETH at their top level, and those a
/// watched address sent (when outflows are followed).
fn top_level(
    block: &Block,
    watched: &KeyIndex<Address>,
    track_outflows: bool,
) -> (Vec<TopLevelReceipt>, Vec<TopLevelSend>) {
    let mut received = Vec::new();
    let mut sent = Vec::new();
    for tx in block.transactions.txns() {
        if let Some(key) = tx.to().and_then(|to| watched.get(&to))
            && !tx.value().is_zero()
        {
            received.push((tx.tx_hash(), tx.value(), key.to_string(), tx.from()));
        }
        if track_outflows && let Some(key) = watched.get(&tx.from()) {
            sent.push((tx.tx_hash(), tx.value(), key.to_string(), tx.to()));
        }
    }
    (received, sent)
}

/// ETH paid to watched addresses by the block's successful transactions, and what the
/// transactions watched addresses sent cost them: the value when the transaction succeeded
/// and, succeeded or not, the gas (and blob gas) it burned, from the block's receipts.
fn native_movements(
    block: &Block,
    received: Vec<TopLevelReceipt>,
    sent: Vec<TopLevelSend>,
    receipts: Option<&[TransactionReceipt]>,
) -> Result<(Vec<Transfer>, Vec<Outflow>), ScanError> {
    let height = block.header.number;
    let receipts: HashMap<B256, (bool, U256)> = receipts
        .unwrap_or_default()
        .iter()
        .map(|r| {
            let gas = U256::from(r.gas_used) * U256::from(r.effective_gas_price);
            let blob_gas = U256::from(r.blob_gas_used.unwrap_or(0))
                * U256::from(r.blob_gas_price.unwrap_or(0));
            (r.transaction_hash, (r.status(), gas + blob_gas))
        })
        .collect();
    let receipt = |hash: &B256| {
        receipts
            .get(hash)
            .copied()
            .ok_or_else(|| consistency::incomplete(height, &format!("its receipts lack {hash}")))
    };
    let native = ReceivedAsset::Method {
        method: Method::Eth,
    };
    let mut transfers = Vec::new();
    for (hash, value, key, from) in received {
        if receipt(&hash)?.0 {
            transfers.push(Transfer {
                id: native_row(hash),
                to_address: key,
                asset: native.clone(),
                amount: base_units(value, "ETH value")?,
                from_address: Some(from.to_checksum(None)),
            });
        }
    }
    let mut outflows = Vec::new();
    for (hash, value, key, to) in sent {
        let (succeeded, fee) = receipt(&hash)?;
        let amount = if succeeded { value } else { U256::ZERO };
        if amount.is_zero() && fee.is_zero() {
            continue;
        }
        outflows.push(Outflow {
            id: native_row(hash),
            spends: None,
            from_address: key,
            asset: native.clone(),
            amount: base_units(amount, "ETH value")?,
            fee: base_units(fee, "gas paid")?,
            to_address: to.map(|to| to.to_checksum(None)),
        });
    }
    Ok((transfers, outflows))
}

/// A transaction's native value: position 0, before its logs.
pub(crate) fn native_row(hash: B256) -> TransferId {
    TransferId {
        network: Network::Ethereum,
        txid: hash.to_string(),
        position: 0,
    }
}

/// `balanceOf` calls sent in one JSON-RPC batch.
const BALANCE_CALLS_PER_BATCH: usize = 500;

/// What each of `owners` held of the token at `contract` at the block `at`: ERC-20
/// `balanceOf` by `eth_call`, a batch of [`BALANCE_CALLS_PER_BATCH`] per request.
async fn token_balances(
    provider: &RootProvider,
    contract: Address,
    owners: &[Address],
    at: B256,
) -> Result<Vec<U256>, ScanError> {
    let mut balances = Vec::with_capacity(owners.len());
    for chunk in owners.chunks(BALANCE_CALLS_PER_BATCH) {
        let mut batch = alloy::rpc::client::BatchRequest::new(provider.client());
        let mut waiters = Vec::with_capacity(chunk.len());
        for owner in chunk {
            let mut call = BALANCE_OF.to_vec();
            call.extend_from_slice(owner.into_word().as_slice());
            let request = TransactionRequest::default()
                .to(contract)
                .input(Bytes::from(call).into());
            let waiter = batch
                .add_call::<_, Bytes>("eth_call", &(request, alloy::eips::BlockId::hash(at)))
                .map_err(classify)?;
            waiters.push(waiter);
        }
        batch.send().await.map_err(classify)?;
        for waiter in waiters {
            let answer = waiter.await.map_err(classify)?;
            if answer.len() != 32 {
                return Err(ScanError::Fatal(format!(
                    "balanceOf on {contract} answered {} bytes, not 32",
                    answer.len()
                )));
            }
            balances.push(U256::from_be_slice(&answer));
        }
    }
    Ok(balances)
}

/// ERC-20 `symbol()` and `decimals()`.
const SYMBOL: [u8; 4] = [0x95, 0xd8, 0x9b, 0x41];
const DECIMALS: [u8; 4] = [0x31, 0x3c, 0xe5, 0x67];

/// Whether `contract` is a 6-decimal token (named `symbol`, where the chain's real one is
/// known): code at the address, and what `symbol()` and `decimals()` answer. A node that does
/// not answer is an error; a contract that is not the token is the `Err` outcome.
async fn token_identity(
    provider: &RootProvider,
    contract: Address,
    symbol: Option<&str>,
) -> Result<Result<String, String>, ScanError> {
    let code = provider.get_code_at(contract).await.map_err(classify)?;
    if code.is_empty() {
        return Ok(Err(format!(
            "no contract at {contract}: an address from another chain, or a typo"
        )));
    }
    let call = |selector: [u8; 4]| {
        TransactionRequest::default()
            .to(contract)
            .input(Bytes::from(selector.to_vec()).into())
    };
    let said = match provider.call(call(SYMBOL)).await {
        Ok(answer) => abi_text(&answer),
        Err(_) => None,
    };
    let decimals = match provider.call(call(DECIMALS)).await {
        Ok(answer) if answer.len() == 32 => Some(U256::from_be_slice(&answer)),
        _ => None,
    };
    let Some(said) = said else {
        return Ok(Err(format!("{contract} answers no ERC-20 symbol()")));
    };
    if let Some(symbol) = symbol
        && said != symbol
    {
        return Ok(Err(format!("{contract} is {said:?}, not {symbol}")));
    }
    Ok(match decimals {
        Some(d) if d == U256::from(6) => Ok(format!("{said}, 6 decimals")),
        Some(d) => Err(format!("{contract} ({said}) has {d} decimals, not 6")),
        None => Err(format!("{contract} ({said}) answers no decimals()")),
    })
}

/// An ABI-encoded `string` (or, as some old tokens answer, a `bytes32`) as text.
fn abi_text(answer: &[u8]) -> Option<String> {
    let text = if answer.len() == 32 {
        answer.split(|b| *b == 0).next()?.to_vec()
    } else {
        let length = usize::try_from(U256::from_be_slice(answer.get(32..64)?)).ok()?;
        answer.get(64..64usize.checked_add(length)?)?.to_vec()
    };
    String::from_utf8(text).ok()
}

/// A block the node named a moment ago is gone: the chain moved; ask again.
fn blocks_moved(height: u64) -> ScanError {
    ScanError::Transient(format!("block {height} is not served: the chain moved"))
}

async fn block_hash(provider: &RootProvider, height: u64) -> Result<Option<B256>, ScanError> {
    Ok(block_header(provider, height)
        .await?
        .map(|header| header.hash))
}

/// The time of the canonical block at `height`, Unix milliseconds.
async fn block_time(provider: &RootProvider, height: u64) -> Result<Option<i64>, ScanError> {
    Ok(block_header(provider, height).await?.map(|header| {
        i64::try_from(header.timestamp)
            .unwrap_or(i64::MAX)
            .saturating_mul(1000)
    }))
}

async fn block_header(provider: &RootProvider, height: u64) -> Result<Option<Header>, ScanError> {
    Ok(provider
        .get_block_by_number(BlockNumberOrTag::Number(height))
        .await
        .map_err(classify)?
        .map(|block| block.header))
}

/// Which `Transfer` logs a query asks for.
#[derive(Clone, Copy, Debug)]
enum LogQuery<'a> {
    /// From these addresses, of any contract.
    From(&'a [Address]),
    /// To these addresses, of any contract.
    To(&'a [Address]),
    /// Every transfer of these contracts.
    Contracts(&'a [Address]),
}

/// The `Transfer` logs `query` asks for in `from..=to`, halving the range when the node
/// refuses it as too large.
async fn transfer_logs(
    provider: &RootProvider,
    query: LogQuery<'_>,
    from: u64,
    to: u64,
) -> Result<Vec<Log>, ScanError> {
    let topics =
        |addresses: &[Address]| -> Vec<B256> { addresses.iter().map(|a| a.into_word()).collect() };
    let mut ranges = vec![(from, to)];
    let mut logs = Vec::new();
    while let Some((low, high)) = ranges.pop() {
        let filter = Filter::new()
            .from_block(low)
            .to_block(high)
            .event_signature(TRANSFER_TOPIC);
        let filter = match query {
            LogQuery::From(addresses) => filter.topic1(topics(addresses)),
            LogQuery::To(addresses) => filter.topic2(topics(addresses)),
            LogQuery::Contracts(contracts) => filter.address(contracts.to_vec()),
        };
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

/// Nodes refuse large log queries with -32005 (limit exceeded) or a message saying so; the
/// same code also means a rate limit on some providers, which the message tells apart.
fn too_large(error: &RpcError<TransportErrorKind>) -> bool {
    match error {
        RpcError::ErrorResp(payload) => {
            let message = payload.message.to_lowercase();
            if message.contains("rate") || message.contains("requests") {
                return false;
            }
            payload.code == -32005
                || [
                    "range",
                    "more than",
                    "results",
                    "response size",
                    "too large",
                    "limited to",
                ]
                .iter()
                .any(|words| message.contains(words))
        }
        _ => false,
    }
}

/// alloy's rate-limit policy, except for a log query refused as too large: retrying that
/// as-is cannot succeed, it has to be split.
#[derive(Clone, Copy, Debug)]
struct RetryRateLimitsNotRanges;

impl RetryPolicy for RetryRateLimitsNotRanges {
    fn should_retry(&self, error: &TransportError) -> bool {
        RateLimitRetryPolicy::default().should_retry(error) && !too_large(error)
    }

    /// The node's own hint, capped: a `Retry-After` of a day must not stall the watcher.
    fn backoff_hint(&self, error: &TransportError) -> Option<std::time::Duration> {
        RateLimitRetryPolicy::default()
            .backoff_hint(error)
            .map(|hint| hint.min(MAX_RETRY_AFTER))
    }
}

pub(crate) fn base_units(value: U256, what: &str) -> Result<Amount, ScanError> {
    u128::try_from(value)
        .map(Amount::from_base_units)
        .map_err(|_| ScanError::Fatal(format!("{what} {value} exceeds what payrecon accounts")))
}

/// Connection trouble, rate limits and node errors are temporary; a body that does not
/// decode is not.
pub(crate) fn classify(error: RpcError<TransportErrorKind>) -> ScanError {
    match error {
        // The deserializer's error carries the whole answer (a block can be 400 KiB): quote
        // an excerpt.
        RpcError::DeserError { err, text } => {
            ScanError::Fatal(payrecon_chain_core::malformed("the node", &err, &text))
        }
        RpcError::SerError(_) => {
            ScanError::Fatal(format!("the node answered something unreadable: {error}"))
        }
        other => ScanError::Transient(format!("Ethereum RPC: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use alloy::primitives::{Bytes, LogData, address};
    use payrecon_chain_core::WatchKeys;

    use super::*;

    /// DAI's contract in the recorded log, configured here as the "USDC" so the recorded
    /// transfer takes the credited path.
    const RECORDED_TOKEN: Address = address!("6b175474e89094c44da98b954eedeac495271d0f");

    /// The recorded log's recipient.
    const RECIPIENT: Address = address!("56178a0d5f301baf6cf3e1cd53d9863437345bf9");

    fn settings() -> EthereumSettings {
        EthereumSettings::new(
            "http://node.invalid",
            1,
            address!("dac17f958d2ee523a2206206994597c13d831ec7"),
            RECORDED_TOKEN,
        )
    }

    fn watched() -> KeyIndex<Address> {
        let keys: WatchKeys = [RECIPIENT.to_string()].into_iter().collect();
        let mut index = KeyIndex::default();
        index.sync(&keys, |key| key.parse::<Address>()).unwrap();
        index
    }

    fn recorded_logs() -> serde_json::Value {
        let fixture: serde_json::Value = serde_json::from_str(include_str!(
            "../../../fixtures/ethereum/eth_getLogs_erc20_transfer_dai_mainnet.json"
        ))
        .unwrap();
        fixture["response"]["result"].clone()
    }

    #[test]
    fn the_recorded_log_is_a_token_transfer_to_the_watched_recipient() {
        let logs: Vec<Log> = serde_json::from_value(recorded_logs()).unwrap();
        let (transfer, height) = settings()
            .token_transfer(&logs[0], &watched())
            .unwrap()
            .unwrap();
        assert_eq!(height, 0xe20360);
        assert_eq!(transfer.id.position, 0xf0 + 1);
        assert_eq!(transfer.to_address, RECIPIENT.to_string());
        assert_eq!(
            transfer.asset,
            ReceivedAsset::Method {
                method: Method::UsdcErc20
            }
        );
        assert_eq!(transfer.amount.base_units(), 771_618_057_897_599_959_040);
        assert_eq!(
            transfer.from_address.as_deref(),
            Some("0xBE09e43A57F2980998cEdD08517eae7d5aE683Bb"),
            "the log's sender, checksummed as treasury addresses are"
        );
    }

    #[test]
    fn the_recorded_log_is_an_outflow_of_its_sender_and_a_fake_token_never_is() {
        let logs: Vec<Log> = serde_json::from_value(recorded_logs()).unwrap();
        let sender = Address::from_word(logs[0].topics()[1]);
        let keys: WatchKeys = [sender.to_string()].into_iter().collect();
        let mut watched = KeyIndex::default();
        watched.sync(&keys, |key| key.parse::<Address>()).unwrap();
        let (outflow, height) = settings()
            .token_outflow(&logs[0], &watched)
            .unwrap()
            .unwrap();
        assert_eq!(height, 0xe20360);
        assert_eq!(outflow.id.position, 0xf0 + 1);
        assert_eq!(outflow.from_address, sender.to_string());
        assert_eq!(outflow.to_address, Some(RECIPIENT.to_checksum(None)));
        assert_eq!(outflow.amount.base_units(), 771_618_057_897_599_959_040);
        assert_eq!(outflow.fee, Amount::ZERO, "the gas is on the native row");
        // The recipient's side of the same log is no outflow, and a contract payrecon does not
        // accept cannot make one up.
        assert!(
            settings()
                .token_outflow(&logs[0], &self::watched())
                .unwrap()
                .is_none()
        );
        let mut other = settings();
        other.usdc_contract = Address::repeat_byte(9);
        assert!(other.token_outflow(&logs[0], &watched).unwrap().is_none());
    }

    #[test]
    fn a_log_index_beyond_u32_is_refused_not_wrapped() {
        let mut logs = recorded_logs();
        logs[0]["logIndex"] = serde_json::json!(u64::MAX);
        let logs: Vec<Log> = serde_json::from_value(logs).unwrap();
        let refused = settings().token_transfer(&logs[0], &watched());
        assert!(
            matches!(refused, Err(ScanError::Fatal(message)) if message.contains("out of range"))
        );
    }

    proptest::proptest! {
        /// A corrupted `eth_getLogs` answer either fails to decode or decodes into logs that
        /// yield an error or transfers to the watched recipient only; never a panic.
        #[test]
        fn corrupted_log_answers_never_panic(value in payrecon_chain_core::fuzz::mutated_n(&recorded_logs())) {
            if let Ok(logs) = serde_json::from_value::<Vec<Log>>(value) {
                for log in &logs {
                    if let Ok(Some((transfer, _))) = settings().token_transfer(log, &watched()) {
                        proptest::prop_assert_eq!(transfer.to_address, RECIPIENT.to_string());
                    }
                }
            }
        }

        /// Logs of every shape a contract can emit: wrong topic counts (ERC-721 has four),
        /// short or long data, values past `u128`, log indexes at the edge.
        #[test]
        fn any_log_shape_is_a_transfer_an_error_or_nothing(
            topics in proptest::collection::vec(proptest::prelude::any::<[u8; 32]>(), 0..5),
            to_watched in proptest::prelude::any::<bool>(),
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..70),
            credited_token in proptest::prelude::any::<bool>(),
            log_index in proptest::prelude::any::<u64>(),
        ) {
            let mut topics: Vec<B256> = topics.into_iter().map(B256::from).collect();
            if to_watched && topics.len() >= 3 {
                topics[2] = RECIPIENT.into_word();
            }
            let contract = if credited_token { RECORDED_TOKEN } else { Address::repeat_byte(7) };
            let log = Log {
                inner: alloy::primitives::Log {
                    address: contract,
                    data: LogData::new_unchecked(topics.clone(), Bytes::from(data.clone())),
                },
                block_number: Some(1),
                log_index: Some(log_index),
                transaction_hash: Some(B256::repeat_byte(1)),
                ..Log::default()
            };
            match settings().token_transfer(&log, &watched()) {
                Ok(Some((transfer, _))) => {
                    proptest::prop_assert!(topics.len() == 3 && data.len() == 32 && topics[2] == RECIPIENT.into_word());
                    let value = U256::from_be_slice(&data);
                    if credited_token {
                        proptest::prop_assert_eq!(U256::from(transfer.amount.base_units()), value);
                    }
                }
                Ok(None) => proptest::prop_assert!(topics.len() != 3 || data.len() != 32 || topics[2] != RECIPIENT.into_word()),
                Err(_) => {}
            }
        }
    }
}
