//! The Tron scanner: TRX and USDT-TRC20 to watched addresses, block by block, over the
//! full-node HTTP API.
//!
//! Each scan continues after the committed cursor (or rejoins after a fork, see
//! `payrecon_chain_core::blocks`), reads the next blocks in order, keeps TRX
//! `TransferContract`s to watched addresses that succeeded, and for blocks with contract calls
//! reads the transaction infos for `Transfer` logs whose recipient is watched. Only the
//! configured USDT contract counts as USDT; a `Transfer` from any other contract (a fake
//! "USDT") and TRC-10 tokens are reported as other tokens, never credited. A call counts only
//! when both the block (`contractRet`) and its receipt say `SUCCESS`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures_util::{StreamExt as _, TryStreamExt as _};
use payrecon_chain_core::Paid;
use payrecon_chain_core::blocks::{self, BlockRange};
use payrecon_chain_core::{
    Amount, Attestation, BlockId, ChainScanner, Finding, KeyIndex, KnownTransfer, Method, Network,
    Outflow, Probe, ReceivedAsset, ScanBatch, ScanError, SecretUrl, SweepFees, Transfer,
    TransferId, Unreadable, WatchView, WatchedLookup,
};
use serde::Deserialize as _;

use crate::TronAddress;
use crate::api::{Block, OwnerValue, TransactionInfo, TransferValue, TronClient};
use crate::unsigned::BurnPrices;

/// topic 0 of every TRC-20 (ERC-20) `Transfer(address,address,uint256)`.
pub const TRANSFER_TOPIC: &str = "ddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef";

/// Energy a USDT `transfer` to an address already holding USDT takes (about 64,300 on
/// mainnet; a first transfer to a fresh holder takes about twice that).
pub const TRC20_TRANSFER_ENERGY: u64 = 65_000;

/// Bandwidth (bytes) a USDT `transfer` takes.
pub const TRC20_TRANSFER_BYTES: u64 = 345;

/// Bandwidth (bytes) a TRX transfer takes (the recorded one burned 267,000 sun at 1,000 a
/// byte).
pub const TRX_TRANSFER_BYTES: u64 = 270;

/// Blocks (with their transaction infos) requested at once while catching up.
const BLOCKS_IN_FLIGHT: usize = 8;

/// When a payment counts as final.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TronFinality {
    /// After the configured number of confirmations (19 is Tron's solidification depth).
    Depth,
    /// Once the solidity node's head (`/walletsolidity/getnowblock`) has reached it.
    Solidified,
}

/// Where and how to watch Tron.
#[derive(Clone)]
pub struct TronSettings {
    /// The full node's HTTP API (`https://api.trongrid.io` or your own node).
    pub url: SecretUrl,
    /// TronGrid's `TRON-PRO-API-KEY`.
    pub api_key: Option<String>,
    /// USDT's TRC-20 contract.
    pub usdt_contract: TronAddress,
    /// Depth or solidified blocks.
    pub finality: TronFinality,
    /// The first block to scan when there is no cursor yet. By default the block of the
    /// earliest watch key's birth (see [`blocks::start_height`]), or the head when there is none.
    pub start_block: Option<u64>,
    /// Blocks per scan at most.
    pub max_blocks_per_scan: u64,
    /// Per-request timeout, connecting included.
    pub timeout: Duration,
    /// The largest answer read; a larger one is refused (and retried).
    pub max_answer_bytes: usize,
}

impl std::fmt::Debug for TronSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TronSettings")
            .field("url", &self.url)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .field("usdt_contract", &self.usdt_contract)
            .field("finality", &self.finality)
            .field("start_block", &self.start_block)
            .field("max_blocks_per_scan", &self.max_blocks_per_scan)
            .field("timeout", &self.timeout)
            .field("max_answer_bytes", &self.max_answer_bytes)
            .finish()
    }
}

impl TronSettings {
    /// Settings for the node at `url` with USDT at `usdt_contract`: depth finality, 50 blocks
    /// per scan, 30 s per request.
    pub fn new(url: impl Into<SecretUrl>, usdt_contract: TronAddress) -> TronSettings {
        TronSettings {
            url: url.into(),
            api_key: None,
            usdt_contract,
            finality: TronFinality::Depth,
            start_block: None,
            max_blocks_per_scan: 50,
            timeout: Duration::from_secs(30),
            max_answer_bytes: 32 << 20,
        }
    }
}

/// Scans Tron through one full node.
pub struct TronScanner {
    settings: TronSettings,
    client: Option<TronClient>,
    /// The watched addresses, kept in step with the view's keys.
    watched: KeyIndex<TronAddress>,
    /// Answers found incomplete since the scanner was made.
    incomplete_answers: u64,
}

impl TronScanner {
    /// A scanner that connects on its first scan.
    pub fn new(settings: TronSettings) -> TronScanner {
        TronScanner {
            settings,
            client: None,
            incomplete_answers: 0,
            watched: KeyIndex::default(),
        }
    }

    pub(crate) fn client(&mut self) -> Result<TronClient, ScanError> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let client = TronClient::new(
            &self.settings.url,
            self.settings.api_key.clone(),
            self.settings.timeout,
            self.settings.max_answer_bytes,
        )?;
        self.client = Some(client.clone());
        Ok(client)
    }
}

impl TronScanner {
    /// The committee's prices of what a transaction burns without staked resources.
    pub(crate) async fn burn_prices(&mut self) -> Result<BurnPrices, ScanError> {
        let parameters = self.client()?.chain_parameters().await?;
        let price = |key: &str| {
            parameters
                .get(key)
                .and_then(|value| u128::try_from(value).ok())
                .ok_or_else(|| ScanError::Fatal(format!("the node's chain parameters lack {key}")))
        };
        Ok(BurnPrices {
            energy: price("getEnergyFee")?,
            bandwidth: price("getTransactionFee")?,
        })
    }
}

impl ChainScanner for TronScanner {
    fn network(&self) -> Network {
        Network::Tron
    }

    fn source(&self) -> &SecretUrl {
        &self.settings.url
    }

    async fn scan(&mut self, view: &WatchView) -> Result<ScanBatch, ScanError> {
        let client = self.client()?;
        let settings = &self.settings;
        self.watched
            .sync(&view.watch_keys, |key| key.parse::<TronAddress>())
            .map_err(|(key, e)| {
                ScanError::Fatal(format!("watch key {key:?} is not a Tron address: {e}"))
            })?;
        let watched = &self.watched;
        let head = client.now_block(false).await?.block_header.raw_data.number;
        let start = blocks::start_height(
            settings.start_block,
            view,
            head,
            blocks::SLOT_CLOCK_SLACK_MS,
            |height| {
                let client = client.clone();
                async move {
                    Ok(client
                        .block(height)
                        .await?
                        .map(|b| b.block_header.raw_data.timestamp))
                }
            },
        )
        .await?;
        let resume = blocks::resume(view.cursor.as_ref(), start, |height| {
            let client = client.clone();
            async move { Ok(client.block(height).await?.map(|b| b.block_id)) }
        })
        .await?;
        let mut range = BlockRange::new(resume);
        let from = range.from();
        let to = head.min(from.saturating_add(settings.max_blocks_per_scan.max(1)) - 1);
        if from <= to {
            let fetched: Vec<ReadBlock> = futures_util::stream::iter(from..=to)
                .map(|height| read_block(&client, height, watched))
                .buffered(BLOCKS_IN_FLIGHT)
                .try_collect()
                .await
                .inspect_err(|e| self.incomplete_answers += u64::from(e.is_incomplete()))?;
            for read in fetched {
                let (block, infos) = (&read.block, &read.infos);
                let raw = &block.block_header.raw_data;
                let height = raw.number;
                range.push_block(
                    height,
                    block.block_id.clone(),
                    &raw.parent_hash,
                    raw.timestamp,
                )?;
                let (found, unreadable) = transfers(settings, block, infos, watched)?;
                for transfer in found {
                    range.push_transfer(transfer, height)?;
                }
                for item in unreadable {
                    range.push_unreadable(item);
                }
                for outflow in outflows(settings, &read, watched)? {
                    range.push_outflow(outflow, height)?;
                }
            }
        }
        let solidified = solidified_height(&client, settings.finality).await?;
        Ok(range.into_batch(view, head, |height, tip| {
            blocks::confirmations(height, tip, solidified, view.settle_depth)
        }))
    }

    fn reset(&mut self) {
        self.client = None;
    }

    fn incomplete_answers(&self) -> u64 {
        self.incomplete_answers
    }

    async fn probe(&mut self) -> Result<Probe, ScanError> {
        let client = self.client()?;
        let head = client.now_block(false).await?.block_header.raw_data;
        let usdt = self.settings.usdt_contract.to_string();
        let outcome = match client.contract_name(&usdt).await? {
            None => Err(format!(
                "no contract at {usdt}: an address from another chain, or a typo"
            )),
            Some(name) => Ok(format!("contract {name:?}")),
        };
        Ok(Probe {
            tip_height: head.number,
            tip_time_ms: Some(head.timestamp),
            syncing: false,
            findings: vec![Finding {
                method: Method::UsdtTrc20,
                what: format!("USDT contract {usdt}"),
                outcome,
                essential: true,
            }],
        })
    }

    async fn attest(
        &mut self,
        transfers_to_check: &[KnownTransfer],
        settle_depth: u32,
    ) -> Result<Vec<Attestation>, ScanError> {
        let client = self.client()?;
        let head = client.now_block(false).await?.block_header.raw_data.number;
        let solidified = solidified_height(&client, self.settings.finality).await?;
        let mut answers = Vec::with_capacity(transfers_to_check.len());
        for known in transfers_to_check {
            // Read its block again and decode it as a scan would: the transfer must be there,
            // successful, paying the same address the same amount of the same asset.
            let Some(height) = known.block_height else {
                answers.push(Attestation::Missing("it was reported unmined".into()));
                continue;
            };
            if height > head {
                answers.push(Attestation::Behind { head });
                continue;
            }
            let reported = &known.transfer;
            let address: TronAddress = reported.to_address.parse().map_err(|e| {
                ScanError::Fatal(format!(
                    "{} is not a Tron address: {e}",
                    reported.to_address
                ))
            })?;
            let watched = HashMap::from([(address, reported.to_address.as_str())]);
            let read = read_block(&client, height, &watched).await?;
            let found = transfers(&self.settings, &read.block, &read.infos, &watched)?.0;
            let block = BlockId {
                height,
                hash: read.block.block_id.clone(),
            };
            let confirmations = blocks::confirmations(height, head, solidified, settle_depth);
            answers.push(Attestation::of_found(
                reported,
                found.iter().find(|t| t.id == reported.id),
                Some(block),
                confirmations,
            ));
        }
        Ok(answers)
    }

    /// The transaction's block (where it was seen, else its execution result's), decoded as
    /// a scan decodes it: what it paid `to_address` of `asset`.
    async fn paid_to(
        &mut self,
        txid: &str,
        to_address: &str,
        asset: &ReceivedAsset,
        seen_at: Option<u64>,
    ) -> Result<Option<Paid>, ScanError> {
        let client = self.client()?;
        let head = client.now_block(false).await?.block_header.raw_data.number;
        let height = match seen_at {
            Some(height) => height,
            None => match client.transaction_info(txid).await? {
                Some(info) if info.block_number > 0 => info.block_number,
                _ => return Ok(None),
            },
        };
        if height > head {
            return Err(ScanError::Transient(format!(
                "the node is at block {head}, behind block {height}"
            )));
        }
        let address: TronAddress = to_address
            .parse()
            .map_err(|e| ScanError::Fatal(format!("{to_address} is not a Tron address: {e}")))?;
        let watched = HashMap::from([(address, to_address)]);
        let read = read_block(&client, height, &watched).await?;
        if !read.block.transactions.iter().any(|tx| tx.tx_id == txid) {
            return Ok(None);
        }
        let found = transfers(&self.settings, &read.block, &read.infos, &watched)?.0;
        let paid = found
            .iter()
            .filter(|t| t.id.txid == txid && t.asset == *asset)
            .try_fold(Amount::ZERO, |sum, t| sum.checked_add(t.amount))
            .ok_or_else(|| ScanError::Fatal(format!("{txid}'s transfers overflow")))?;
        Ok(Some(Paid {
            amount: paid,
            block: Some(BlockId {
                height,
                hash: read.block.block_id.clone(),
            }),
            confirmations: blocks::depth(height, head),
        }))
    }

    /// Burned resources at the committee's prices: a USDT sweep's energy and bytes, a TRX
    /// sweep's bytes, as if the address had no staked or free bandwidth left (its first
    /// transaction of a day may well be free: the list errs on the side of enough).
    async fn sweep_fees(&mut self) -> Result<SweepFees, ScanError> {
        let BurnPrices { energy, bandwidth } = self.burn_prices().await?;
        Ok(SweepFees {
            per_token: Amount::from_base_units(
                energy * u128::from(TRC20_TRANSFER_ENERGY)
                    + bandwidth * u128::from(TRC20_TRANSFER_BYTES),
            ),
            native: Amount::from_base_units(bandwidth * u128::from(TRX_TRANSFER_BYTES)),
            basis: format!(
                "{energy} sun per energy, {bandwidth} sun per byte: {TRC20_TRANSFER_ENERGY} energy and {TRC20_TRANSFER_BYTES} bytes per USDT transfer, {TRX_TRANSFER_BYTES} bytes per TRX transfer"
            ),
        })
    }
}

/// The solidified head with solidified finality; `None` with depth finality.
async fn solidified_height(
    client: &TronClient,
    finality: TronFinality,
) -> Result<Option<u64>, ScanError> {
    Ok(match finality {
        TronFinality::Depth => None,
        TronFinality::Solidified => {
            Some(client.now_block(true).await?.block_header.raw_data.number)
        }
    })
}

/// A block as one scan reads it.
struct ReadBlock {
    block: Block,
    /// Its transaction infos, when it holds contract calls or a watched address signed one of
    /// its transactions (whose fee is in the infos); else none are read.
    infos: Vec<TransactionInfo>,
    /// The transactions watched addresses signed: their index in the block and the key.
    signed: Vec<(usize, String)>,
}

async fn read_block(
    client: &TronClient,
    height: u64,
    watched: &impl WatchedLookup<TronAddress>,
) -> Result<ReadBlock, ScanError> {
    let block = client
        .block(height)
        .await?
        .ok_or_else(|| ScanError::Transient(format!("block {height} is not served yet")))?;
    let calls_contracts = block.transactions.iter().any(|tx| {
        tx.raw_data
            .contract
            .iter()
            .any(|c| c.kind == "TriggerSmartContract" || c.kind == "CreateSmartContract")
    });
    let signed = signed_by_watched(&block, watched)?;
    let infos = if calls_contracts || !signed.is_empty() {
        client.transaction_infos(height).await?
    } else {
        Vec::new()
    };
    // A node behind its balancer's others answers `[]` for a block it has not executed yet:
    // every transaction has its info, or the block is not read.
    if (calls_contracts || !signed.is_empty()) && infos.len() != block.transactions.len() {
        return Err(ScanError::incomplete(format!(
            "block {height}: {} transaction infos for {} transactions",
            infos.len(),
            block.transactions.len()
        )));
    }
    Ok(ReadBlock {
        block,
        infos,
        signed,
    })
}

/// The block's transactions a watched address signed: index and that address's key.
fn signed_by_watched(
    block: &Block,
    watched: &impl WatchedLookup<TronAddress>,
) -> Result<Vec<(usize, String)>, ScanError> {
    let height = block.block_header.raw_data.number;
    let mut signed = Vec::new();
    for (index, tx) in block.transactions.iter().enumerate() {
        let Some(contract) = tx.raw_data.contract.first() else {
            continue;
        };
        let owner = OwnerValue::deserialize(&contract.parameter.value)
            .ok()
            .and_then(|v| TronAddress::from_hex(&v.owner_address).ok())
            .ok_or_else(|| {
                ScanError::Fatal(format!(
                    "block {height}: transaction {} names no signer",
                    tx.tx_id
                ))
            })?;
        if let Some(key) = watched.watch_key(&owner) {
            signed.push((index, key.to_owned()));
        }
    }
    Ok(signed)
}

/// What left watched addresses in one block: per transaction a watched address signed, the
/// TRX it sent (when it succeeded) and the fee it burned (whether or not), as position 0; then
/// each USDT `Transfer` log out of a watched address, as its log's position. Other tokens
/// never count: any contract can log a transfer "from" anyone.
fn outflows(
    settings: &TronSettings,
    read: &ReadBlock,
    watched: &impl WatchedLookup<TronAddress>,
) -> Result<Vec<Outflow>, ScanError> {
    let (block, infos) = (&read.block, &read.infos);
    let height = block.block_header.raw_data.number;
    let fees: HashMap<&str, u64> = infos.iter().map(|i| (i.id.as_str(), i.fee)).collect();
    let mut found = Vec::new();
    for (index, key) in &read.signed {
        let tx = &block.transactions[*index];
        let fee = *fees.get(tx.tx_id.as_str()).ok_or_else(|| {
            ScanError::Transient(format!(
                "the transaction infos of block {height} lack {}",
                tx.tx_id
            ))
        })?;
        let contract = &tx.raw_data.contract[0];
        let (amount, to) = match contract.kind.as_str() {
            "TransferContract" => {
                let value = TransferValue::deserialize(&contract.parameter.value).map_err(|e| {
                    ScanError::Fatal(format!(
                        "block {height}: transaction {} has a malformed TransferContract: {e}",
                        tx.tx_id
                    ))
                })?;
                let to = TronAddress::from_hex(&value.to_address)
                    .ok()
                    .map(|a| a.to_string());
                (if tx.succeeded() { value.amount } else { 0 }, to)
            }
            // TRX sent with a contract call (a sweep through a batching contract).
            "TriggerSmartContract" => {
                let value = &contract.parameter.value;
                let sent = value["call_value"].as_u64().unwrap_or(0);
                let to = value["contract_address"]
                    .as_str()
                    .and_then(|hex| TronAddress::from_hex(hex).ok())
                    .map(|a| a.to_string());
                (if tx.succeeded() { sent } else { 0 }, to)
            }
            _ => (0, None),
        };
        if amount == 0 && fee == 0 {
            continue;
        }
        found.push(Outflow {
            id: tron_id(&tx.tx_id, 0),
            spends: None,
            from_address: key.clone(),
            asset: ReceivedAsset::Method {
                method: Method::Trx,
            },
            amount: Amount::from_base_units(u128::from(amount)),
            fee: Amount::from_base_units(u128::from(fee)),
            to_address: to,
        });
    }
    let succeeded: HashSet<&str> = block
        .transactions
        .iter()
        .filter(|tx| tx.succeeded())
        .map(|tx| tx.tx_id.as_str())
        .collect();
    for info in infos
        .iter()
        .filter(|i| i.succeeded() && succeeded.contains(i.id.as_str()))
    {
        log_outflows(settings, height, info, watched, &mut found)?;
    }
    Ok(found)
}

/// The USDT `Transfer` logs of one successful transaction out of watched addresses.
fn log_outflows(
    settings: &TronSettings,
    height: u64,
    info: &TransactionInfo,
    watched: &impl WatchedLookup<TronAddress>,
    found: &mut Vec<Outflow>,
) -> Result<(), ScanError> {
    for (index, log) in info.log.iter().enumerate() {
        let Some(transfer) = trc20_transfer(log.topics.as_slice(), &log.data) else {
            continue;
        };
        let Some(key) = watched.watch_key(&transfer.from) else {
            continue;
        };
        if TronAddress::from_hex(&format!("41{}", log.address)).ok() != Some(settings.usdt_contract)
        {
            continue;
        }
        let amount = transfer.value.ok_or_else(|| {
            ScanError::Fatal(format!(
                "block {height}: the USDT value of {} exceeds what payrecon accounts",
                info.id
            ))
        })?;
        found.push(Outflow {
            id: tron_id(&info.id, log_position(height, &info.id, index)?),
            spends: None,
            from_address: key.to_owned(),
            asset: ReceivedAsset::Method {
                method: Method::UsdtTrc20,
            },
            amount: Amount::from_base_units(amount),
            fee: Amount::ZERO,
            to_address: Some(transfer.to.to_string()),
        });
    }
    Ok(())
}

/// A log's position: 0 is the transaction's own value, so log `n` is `n + 1`.
fn log_position(height: u64, txid: &str, index: usize) -> Result<u32, ScanError> {
    u32::try_from(index + 1)
        .map_err(|_| ScanError::Fatal(format!("block {height}: too many logs in {txid}")))
}

/// The transfers to watched addresses one block carries: TRX and TRC-10 contracts of its
/// successful transactions, then TRC-20 logs of those transactions' receipts.
fn transfers(
    settings: &TronSettings,
    block: &Block,
    infos: &[TransactionInfo],
    watched: &impl WatchedLookup<TronAddress>,
) -> Result<(Vec<Transfer>, Vec<Unreadable>), ScanError> {
    let mut found = Vec::new();
    let mut unreadable = Vec::new();
    let succeeded = contract_transfers(block, watched, &mut found, &mut unreadable);
    let height = block.block_header.raw_data.number;
    for info in infos {
        if info.block_number != height {
            return Err(ScanError::Transient(format!(
                "the transaction infos of block {height} include one of block {}",
                info.block_number
            )));
        }
        if info.succeeded() && succeeded.contains(info.id.as_str()) {
            log_transfers(settings, height, info, watched, &mut found)?;
            internal_transfers(height, info, watched, &mut found)?;
        }
    }
    Ok((found, unreadable))
}

/// One transfer as a watcher reports it.
fn tron_transfer(
    txid: &str,
    position: u32,
    (from, key): (&TronAddress, &str),
    asset: ReceivedAsset,
    amount: Amount,
) -> Transfer {
    Transfer {
        id: tron_id(txid, position),
        to_address: key.to_owned(),
        asset,
        amount,
        from_address: Some(from.to_string()),
    }
}

fn tron_id(txid: &str, position: u32) -> TransferId {
    TransferId {
        network: Network::Tron,
        txid: txid.to_owned(),
        position,
    }
}

/// TRX (`TransferContract`) and TRC-10 (`TransferAssetContract`, never credited) payments to
/// watched addresses; returns the block's successful transactions. A transfer to a watched
/// address whose value or sender cannot be read is quarantined in `unreadable`; one whose
/// recipient cannot be read is too, as it may be ours; one that reads as paying an address not
/// watched is none of payrecon's business.
fn contract_transfers<'b>(
    block: &'b Block,
    watched: &impl WatchedLookup<TronAddress>,
    found: &mut Vec<Transfer>,
    unreadable: &mut Vec<Unreadable>,
) -> HashSet<&'b str> {
    let height = block.block_header.raw_data.number;
    let mut succeeded = HashSet::new();
    for tx in block.transactions.iter().filter(|tx| tx.succeeded()) {
        succeeded.insert(tx.tx_id.as_str());
        for contract in &tx.raw_data.contract {
            let trc10 = match contract.kind.as_str() {
                "TransferContract" => false,
                "TransferAssetContract" => true,
                _ => continue,
            };
            let recipient = contract.parameter.value["to_address"]
                .as_str()
                .and_then(|hex| TronAddress::from_hex(hex).ok());
            let key = match recipient {
                Some(to) => match watched.watch_key(&to) {
                    Some(key) => Some(key),
                    None => continue,
                },
                None => None,
            };
            let read = TransferValue::deserialize(&contract.parameter.value)
                .map_err(|e| e.to_string())
                .and_then(|value| match TronAddress::from_hex(&value.owner_address) {
                    Ok(from) => Ok((value, from)),
                    Err(e) => Err(format!("its sender {:?}: {e}", value.owner_address)),
                });
            let (key, value, from) = match (key, read) {
                (Some(key), Ok((value, from))) => (key, value, from),
                (key, read) => {
                    let why = read
                        .err()
                        .unwrap_or_else(|| "its recipient is not a Tron address".into());
                    let reason = format!(
                        "block {height}: transaction {} has a malformed {}: {why}",
                        tx.tx_id, contract.kind
                    );
                    unreadable.push(Unreadable::new(
                        tx.tx_id.as_str(),
                        key.unwrap_or_default(),
                        &reason,
                    ));
                    continue;
                }
            };
            let asset = if trc10 {
                ReceivedAsset::OtherToken {
                    contract: format!("trc10:{}", value.asset_name.unwrap_or_default()),
                }
            } else {
                ReceivedAsset::Method {
                    method: Method::Trx,
                }
            };
            let amount = Amount::from_base_units(u128::from(value.amount));
            found.push(tron_transfer(&tx.tx_id, 0, (&from, key), asset, amount));
        }
    }
    succeeded
}

/// TRC-20 `Transfer` logs of one successful transaction to watched addresses: USDT from its
/// contract, any other contract as another token (never credited).
fn log_transfers(
    settings: &TronSettings,
    height: u64,
    info: &TransactionInfo,
    watched: &impl WatchedLookup<TronAddress>,
    found: &mut Vec<Transfer>,
) -> Result<(), ScanError> {
    for (index, log) in info.log.iter().enumerate() {
        let Some(TokenTransfer { from, to, value }) =
            trc20_transfer(log.topics.as_slice(), &log.data)
        else {
            continue;
        };
        let Some(key) = watched.watch_key(&to) else {
            continue;
        };
        let contract = TronAddress::from_hex(&format!("41{}", log.address)).map_err(|e| {
            ScanError::Fatal(format!(
                "block {height}: a log of {} names contract {:?}: {e}",
                info.id, log.address
            ))
        })?;
        let (asset, amount) = if contract == settings.usdt_contract {
            let amount = value.ok_or_else(|| {
                ScanError::Fatal(format!(
                    "block {height}: the USDT value of {} exceeds what payrecon accounts",
                    info.id
                ))
            })?;
            (
                ReceivedAsset::Method {
                    method: Method::UsdtTrc20,
                },
                amount,
            )
        } else {
            // A fake token may claim any amount; it is never credited anyway.
            (
                ReceivedAsset::OtherToken {
                    contract: contract.to_string(),
                },
                value.unwrap_or(u128::MAX),
            )
        };
        found.push(tron_transfer(
            &info.id,
            log_position(height, &info.id, index)?,
            (&from, key),
            asset,
            Amount::from_base_units(amount),
        ));
    }
    Ok(())
}

/// TRX (and TRC-10 tokens, never credited) that a contract paid a watched address inside one
/// successful transaction: each internal call not rejected, at the internal position of its
/// ordinal among the transaction's value-carrying calls (rejected ones included, so the
/// numbering never shifts).
fn internal_transfers(
    height: u64,
    info: &TransactionInfo,
    watched: &impl WatchedLookup<TronAddress>,
    found: &mut Vec<Transfer>,
) -> Result<(), ScanError> {
    let values = info.internal_transactions.iter().flat_map(|call| {
        call.call_value_info
            .iter()
            .filter(|value| value.call_value.unwrap_or(0) > 0)
            .map(move |value| (call, value))
    });
    for (ordinal, (call, value)) in values.enumerate() {
        if call.rejected {
            continue;
        }
        let Some(key) = TronAddress::from_hex(&call.transfer_to_address)
            .ok()
            .and_then(|to| watched.watch_key(&to))
        else {
            continue;
        };
        let from = TronAddress::from_hex(&call.caller_address).map_err(|e| {
            ScanError::Fatal(format!(
                "block {height}: an internal call of {} names caller {:?}: {e}",
                info.id, call.caller_address
            ))
        })?;
        let position = TransferId::internal_position(ordinal).ok_or_else(|| {
            ScanError::Fatal(format!(
                "block {height}: too many internal calls in {}",
                info.id
            ))
        })?;
        let asset = match &value.token_id {
            None => ReceivedAsset::Method {
                method: Method::Trx,
            },
            Some(token) => ReceivedAsset::OtherToken {
                contract: format!("trc10:{token}"),
            },
        };
        let amount = Amount::from_base_units(u128::from(value.call_value.unwrap_or(0)));
        found.push(tron_transfer(
            &info.id,
            position,
            (&from, key),
            asset,
            amount,
        ));
    }
    Ok(())
}

/// A TRC-20 `Transfer` log decoded.
struct TokenTransfer {
    from: TronAddress,
    to: TronAddress,
    /// `None` when it exceeds `u128`.
    value: Option<u128>,
}

/// The sender, recipient and value of a TRC-20 `Transfer` log, or `None` for any other log
/// (TRC-721 transfers have four topics and no data).
fn trc20_transfer(topics: &[String], data: &str) -> Option<TokenTransfer> {
    let [topic, from, to] = topics else {
        return None;
    };
    if !topic.eq_ignore_ascii_case(TRANSFER_TOPIC) || data.len() != 64 || !data.is_ascii() {
        return None;
    }
    let high = u128::from_str_radix(&data[..32], 16).ok()?;
    let low = u128::from_str_radix(&data[32..], 16).ok()?;
    Some(TokenTransfer {
        from: address_word(from)?,
        to: address_word(to)?,
        value: (high == 0).then_some(low),
    })
}

/// The address in a 32-byte topic word (12 zero bytes, then 20).
fn address_word(word: &str) -> Option<TronAddress> {
    if word.len() != 64 || !word.is_ascii() || !word[..24].bytes().all(|b| b == b'0') {
        return None;
    }
    TronAddress::from_hex(&format!("41{}", &word[24..])).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_usdt_log_decodes_to_its_recipient_and_value() {
        let topics = [
            TRANSFER_TOPIC.to_owned(),
            "0000000000000000000000002b41b215051fabb8fa7a82348e6802cf43b9e319".to_owned(),
            "000000000000000000000000e54f448d91153818a4573d6c151171ce8e607bbe".to_owned(),
        ];
        let transfer = trc20_transfer(
            &topics,
            "0000000000000000000000000000000000000000000000000000000004b571c0",
        )
        .unwrap();
        assert_eq!(
            transfer.to.to_string(),
            "TWsghcMkFXe1hnwZAWVQ9fUrZBtYv2aGJ8"
        );
        assert_eq!(
            transfer.from.to_hex(),
            "412b41b215051fabb8fa7a82348e6802cf43b9e319"
        );
        assert_eq!(transfer.value, Some(79_000_000));
        assert!(trc20_transfer(&topics[..2], "00").is_none());
        let mut dirty = topics.clone();
        dirty[2] = format!("ff{}", &topics[2][2..]);
        assert!(
            trc20_transfer(&dirty, &"0".repeat(64)).is_none(),
            "not an address word"
        );
        let huge = format!("{}{}", "1".repeat(32), "0".repeat(32));
        assert_eq!(trc20_transfer(&topics, &huge).unwrap().value, None);
    }

    fn recorded_info(text: &str) -> TransactionInfo {
        let envelope: serde_json::Value = serde_json::from_str(text).unwrap();
        serde_json::from_value(envelope["response"].clone()).unwrap()
    }

    #[test]
    fn trx_a_router_paid_inside_a_recorded_mainnet_swap_is_a_receipt_of_its_signer() {
        let info = recorded_info(include_str!(
            "../../../fixtures/tron/wallet_gettransactioninfobyid_internal_trx_mainnet.json"
        ));
        let signer = TronAddress::from_hex("4197b779963e3778985b4429d30169aa88e7c7d91f").unwrap();
        let watched: HashMap<TronAddress, &str> = [(signer, "signer")].into_iter().collect();
        let mut found = Vec::new();
        internal_transfers(83_506_570, &info, &watched, &mut found).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].to_address, "signer");
        assert_eq!(found[0].amount.base_units(), 3_111_255);
        assert_eq!(
            found[0].asset,
            ReceivedAsset::Method {
                method: Method::Trx
            }
        );
        assert_eq!(
            found[0].id.position,
            TransferId::INTERNAL_POSITIONS + 1,
            "the second value-carrying call of the transaction"
        );
        assert_eq!(
            found[0].from_address.as_deref(),
            Some(
                TronAddress::from_hex("41a31d689a84244bc01be56e07aeafb7686f56bb89")
                    .unwrap()
                    .to_string()
                    .as_str()
            )
        );
    }

    #[test]
    fn rejected_internal_calls_of_a_failed_recorded_transaction_pay_nobody() {
        let info = recorded_info(include_str!(
            "../../../fixtures/tron/wallet_gettransactioninfobyid_failed_rejected_internals_mainnet.json"
        ));
        assert!(!info.succeeded());
        let every: HashMap<TronAddress, String> = info
            .internal_transactions
            .iter()
            .map(|call| {
                let to = TronAddress::from_hex(&call.transfer_to_address).unwrap();
                (to, to.to_string())
            })
            .collect();
        let mut found = Vec::new();
        internal_transfers(81_512_025, &info, &every, &mut found).unwrap();
        assert!(found.is_empty(), "every call was rejected: {found:?}");
    }

    /// A recorded block with its TRX transfer, plus the recorded USDT call as one more
    /// transaction of that block, and the USDT call's recorded receipt: one TRX and one USDT
    /// transfer to the two watched recipients.
    fn recorded_block_and_infos() -> serde_json::Value {
        let fixture = |text: &str| -> serde_json::Value { serde_json::from_str(text).unwrap() };
        let mut block = fixture(include_str!(
            "../../../fixtures/tron/wallet_getblockbynum_with_transfercontract.json"
        ))["response"]
            .clone();
        let info = fixture(include_str!(
            "../../../fixtures/tron/wallet_gettransactioninfobyid_usdt_transfer_mainnet.json"
        ))["response"]
            .clone();
        let mut call = fixture(include_str!(
            "../../../fixtures/tron/usdt_transfer_transaction_raw_data_mainnet.json"
        ))["transaction"]
            .clone();
        call["txID"] = info["id"].clone();
        call["ret"] = serde_json::json!([{"contractRet": "SUCCESS"}]);
        block["block_header"]["raw_data"]["number"] = info["blockNumber"].clone();
        block["transactions"].as_array_mut().unwrap().push(call);
        serde_json::json!({"block": block, "infos": [info]})
    }

    fn usdt() -> TronAddress {
        "TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6t".parse().unwrap()
    }

    /// The two recipients of the recorded transfers, watched.
    fn watched() -> HashMap<TronAddress, &'static str> {
        HashMap::from([
            (
                TronAddress::from_hex("4108a8954b7862d07cf4ce6ac78c3a83d72bd917e4").unwrap(),
                "trx-key",
            ),
            (
                "TWsghcMkFXe1hnwZAWVQ9fUrZBtYv2aGJ8".parse().unwrap(),
                "usdt-key",
            ),
        ])
    }

    /// Decodes the two bodies the way the client does and extracts the block's transfers.
    fn transfers_of(value: &serde_json::Value) -> Result<Vec<Transfer>, ScanError> {
        let block: Block =
            crate::api::decode("/wallet/getblockbynum", &value["block"].to_string())?;
        let infos: Vec<TransactionInfo> = crate::api::decode(
            "/wallet/gettransactioninfobyblocknum",
            &value["infos"].to_string(),
        )?;
        transfers(
            &TronSettings::new("http://node.invalid", usdt()),
            &block,
            &infos,
            &watched(),
        )
        .map(|(found, _)| found)
    }

    #[test]
    fn the_recorded_block_yields_its_trx_and_usdt_transfers() {
        let found = transfers_of(&recorded_block_and_infos()).unwrap();
        let summary: Vec<(&str, &ReceivedAsset, u128, Option<&str>)> = found
            .iter()
            .map(|t| {
                let from = t.from_address.as_deref();
                (t.to_address.as_str(), &t.asset, t.amount.base_units(), from)
            })
            .collect();
        let paid = |method| ReceivedAsset::Method { method };
        // The senders: the TRX contract's owner_address and the USDT log's first topic.
        assert_eq!(
            summary,
            [
                (
                    "trx-key",
                    &paid(Method::Trx),
                    1_000_000_000,
                    Some("TEQrkTwY43gnKH62mH8xQo1DKPorVZvv5r")
                ),
                (
                    "usdt-key",
                    &paid(Method::UsdtTrc20),
                    79_000_000,
                    Some("TDuvkvLEhHvy3VQDWowtt16n3W5khHgsaL")
                )
            ]
        );
    }

    #[test]
    fn the_recorded_senders_outflows_carry_the_fees_their_infos_burned() {
        let mut value = recorded_block_and_infos();
        let mut trx_info: serde_json::Value = serde_json::from_str::<serde_json::Value>(
            include_str!("../../../fixtures/tron/wallet_gettransactioninfobyblocknum_nile.json"),
        )
        .unwrap()["response"][0]
            .clone();
        trx_info["id"] = value["block"]["transactions"][0]["txID"].clone();
        trx_info["blockNumber"] = value["block"]["block_header"]["raw_data"]["number"].clone();
        value["infos"].as_array_mut().unwrap().push(trx_info);
        let block: Block = serde_json::from_value(value["block"].clone()).unwrap();
        let infos: Vec<TransactionInfo> = serde_json::from_value(value["infos"].clone()).unwrap();
        let senders = HashMap::from([
            (
                TronAddress::from_hex("4130ba69b6b9746c2a15d6a7f9b9bea1f97ba3b023").unwrap(),
                "trx-sender",
            ),
            (
                TronAddress::from_hex("412b41b215051fabb8fa7a82348e6802cf43b9e319").unwrap(),
                "usdt-sender",
            ),
        ]);
        let settings = TronSettings::new("http://node.invalid", usdt());
        let signed = signed_by_watched(&block, &senders).unwrap();
        let read = ReadBlock {
            block,
            infos,
            signed,
        };
        let found = outflows(&settings, &read, &senders).unwrap();
        let summary: Vec<(&str, u32, u128, u128)> = found
            .iter()
            .map(|o| {
                (
                    o.from_address.as_str(),
                    o.id.position,
                    o.amount.base_units(),
                    o.fee.base_units(),
                )
            })
            .collect();
        // The recorded call's signer is not its log's sender (the two come from different
        // records), so the token's sender pays no fee in this block: only its log counts.
        assert_eq!(
            summary,
            [
                ("trx-sender", 0, 1_000_000_000, 267_000),
                ("usdt-sender", 1, 79_000_000, 0),
            ]
        );
        assert_eq!(
            found[1].to_address.as_deref(),
            Some("TWsghcMkFXe1hnwZAWVQ9fUrZBtYv2aGJ8")
        );
        // Without the infos the fees cannot be known: the scan is repeated, never guessed.
        let without_infos = ReadBlock {
            infos: Vec::new(),
            ..read
        };
        assert!(matches!(
            outflows(&settings, &without_infos, &senders),
            Err(ScanError::Transient(_))
        ));
    }

    proptest::proptest! {
        /// A node (or anything between it and us) answering a corrupted block or receipt
        /// gets an error or a subset of honest-looking transfers, never a panic, and never a
        /// transfer to an address nobody watches.
        #[test]
        fn corrupted_blocks_and_receipts_never_panic(value in payrecon_chain_core::fuzz::mutated_n(&recorded_block_and_infos())) {
            if let Ok(found) = transfers_of(&value) {
                for transfer in found {
                    proptest::prop_assert!(["trx-key", "usdt-key"].contains(&transfer.to_address.as_str()));
                }
            }
        }

        #[test]
        fn any_log_decodes_or_is_ignored(topics in proptest::collection::vec("[0-9a-fA-F]{0,70}|.{0,70}", 0..5), data in "[0-9a-fA-F]{0,70}|.{0,70}") {
            let _ = trc20_transfer(&topics, &data);
        }

        #[test]
        fn every_transfer_log_round_trips(from in proptest::prelude::any::<[u8; 20]>(), to in proptest::prelude::any::<[u8; 20]>(), high in proptest::prelude::any::<u128>(), low in proptest::prelude::any::<u128>()) {
            let word = |bytes: &[u8; 20]| format!("{}{}", "0".repeat(24), hex_of(bytes));
            let topics = [TRANSFER_TOPIC.to_owned(), word(&from), word(&to)];
            let data = format!("{high:032x}{low:032x}");
            let transfer = trc20_transfer(&topics, &data).unwrap();
            proptest::prop_assert_eq!(transfer.from, TronAddress::from_account_bytes(from));
            proptest::prop_assert_eq!(transfer.to, TronAddress::from_account_bytes(to));
            proptest::prop_assert_eq!(transfer.value, (high == 0).then_some(low));
        }
    }

    fn hex_of(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
