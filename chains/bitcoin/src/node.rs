//! The Bitcoin and Litecoin scanner, straight from a full node's JSON-RPC.
//!
//! It reads blocks in order (`getblockhash`, then `getblock <hash> 2`: every transaction with
//! its outputs, no transaction index needed), checks each block extends the one before it,
//! and rejoins the chain after a reorg through the checkpoints in the cursor, exactly as the
//! Ethereum and Tron scanners do (`payrecon_chain_core::blocks`). Every output is looked up in
//! an in-memory index of the watched output scripts, so the cost of a block depends on the
//! block, not on how many addresses are watched.
//!
//! Caught up with the node, it also reads the mempool: transactions it has not looked at yet
//! are fetched once (`getrawtransaction <txid> true`), and a watched payment that leaves the
//! mempool without being mined (replaced by fee, double spent, expired) is reported removed.
//!
//! News: with `push_peer`, a P2P connection to the node ([`crate::p2p`]) wakes the watcher the
//! moment the node announces a block or a transaction; polling stays the fallback.
//!
//! Trust: the node is your own, reached over loopback or a private network with credentials;
//! what it answers is the chain. Its genesis block is still checked against the configured
//! network, so a node of another chain stops the watcher.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use payrecon_chain_core::bitcoin::hex::FromHex;
use payrecon_chain_core::bitcoin::{ScriptBuf, Transaction, Txid};
use payrecon_chain_core::blocks::{self, BlockRange};
use payrecon_chain_core::{
    Amount, Attestation, BlockId, ChainEvent, ChainScanner, HeldOutputs, KeyIndex, KnownTransfer,
    Method, Network, Paid, Probe, ReceivedAsset, ScanBatch, ScanError, SecretUrl, Transfer,
    TransferId, Unreadable, WatchView, excerpt,
};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use crate::derive::output_as_transfer;
use crate::mweb;
use crate::p2p::PushChannel;
use crate::psbt::{FEE_TARGET_BLOCKS, FeeRate, RefundSource};
use crate::rpc::{NodeAuth, NodeRpc, RpcError};
use crate::spends::{Lookup, Spending, coin_units};
use crate::{UtxoTarget, script_pubkey};

/// `RPC_INVALID_ADDRESS_OR_KEY`: no such transaction (in the mempool, or at all).
const RPC_NOT_FOUND: i64 = -5;

/// `RPC_INVALID_PARAMETER`: a height above the node's tip.
const RPC_INVALID_PARAMETER: i64 = -8;

/// Transactions asked for in one batched request.
const TRANSACTIONS_PER_REQUEST: usize = 200;

/// Decimals of a coin amount in the node's JSON (satoshi, litoshi).
const COIN_DECIMALS: u8 = 8;

/// How far a block's time may trail the moment it was mined: Bitcoin Core accepts block times
/// up to two hours ahead of its own clock (`MAX_FUTURE_BLOCK_TIME`) and rescans wallets from
/// two hours before a key's birth for the same reason.
const BLOCK_TIME_SLACK_MS: i64 = 2 * 60 * 60 * 1000;

/// The default largest answer of a full node: 256 MiB.
pub const DEFAULT_MAX_ANSWER_BYTES: usize = 256 << 20;

/// Where and how to reach one network's full node.
#[derive(Clone, Debug)]
pub struct NodeSettings {
    /// The node's JSON-RPC, `http://host:port` (`rpcport`: 8332 Bitcoin, 9332 Litecoin).
    pub rpc_url: SecretUrl,
    /// Credentials, or the cookie file.
    pub auth: NodeAuth,
    /// The chain the node must serve.
    pub target: UtxoTarget,
    /// The node's P2P `host:port`, heard for block and transaction announcements.
    pub push_peer: Option<String>,
    /// The height the very first scan starts at. By default the block of the earliest
    /// watch key's birth (see [`blocks::start_height`]), or the tip when there is none.
    pub start_height: Option<u64>,
    /// Timeout of one request.
    pub timeout: Duration,
    /// The largest answer read: ten blocks in full JSON (`getblock <hash> 2`) of a busy
    /// Bitcoin chain stay well below the default.
    pub max_answer_bytes: usize,
    /// Blocks read in one scan at most, so a long catch-up commits as it goes.
    pub blocks_per_scan: u64,
    /// Blocks asked for in one batched request.
    pub blocks_per_request: usize,
}

impl NodeSettings {
    /// Settings with a 30 s timeout, scans of at most 100 blocks asked 10 at a time.
    pub fn new(rpc_url: impl Into<SecretUrl>, auth: NodeAuth, target: UtxoTarget) -> NodeSettings {
        NodeSettings {
            rpc_url: rpc_url.into(),
            auth,
            target,
            push_peer: None,
            start_height: None,
            timeout: Duration::from_secs(30),
            max_answer_bytes: DEFAULT_MAX_ANSWER_BYTES,
            blocks_per_scan: 100,
            blocks_per_request: 10,
        }
    }
}

/// A block header as `getblockheader <hash> true` answers it: the field read.
#[derive(Deserialize)]
struct BlockHeader {
    time: i64,
}

/// A block as `getblock <hash> 2` answers it: the fields read. Its transactions are read one
/// by one, so one that cannot be read is quarantined instead of refusing the block.
#[derive(Deserialize)]
struct NodeBlock {
    hash: String,
    height: u64,
    #[serde(default)]
    previousblockhash: String,
    time: i64,
    tx: Vec<Box<RawValue>>,
}

/// A transaction inside a block, or as `getrawtransaction <txid> true` answers it.
#[derive(Deserialize)]
struct NodeTransaction {
    txid: String,
    /// Its inputs: what an outflow spends.
    #[serde(default)]
    vin: Vec<NodeInput>,
    vout: Vec<NodeOutput>,
    /// `getrawtransaction` only: depth of its block, absent while in the mempool.
    #[serde(default)]
    confirmations: Option<u32>,
    /// `getrawtransaction` only: its block, absent while in the mempool.
    #[serde(default)]
    blockhash: Option<String>,
}

/// An input's previous outpoint; a coinbase input has none.
#[derive(Deserialize)]
struct NodeInput {
    #[serde(default)]
    txid: Option<String>,
    #[serde(default)]
    vout: Option<u32>,
}

/// An output. Litecoin lists a transaction's MWEB outputs beside the ordinary ones
/// (`"ismweb": true`, an `output_id`, no value, index or script): no ordinary address can see
/// them, and payrecon hands out no MWEB address, so they are skipped.
#[derive(Deserialize)]
struct NodeOutput {
    /// The amount in coins, a JSON number with eight decimals: read exactly from its text.
    #[serde(default)]
    value: Option<Box<RawValue>>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(rename = "scriptPubKey", default)]
    script_pubkey: Option<NodeScript>,
    #[serde(default)]
    ismweb: bool,
}

#[derive(Deserialize)]
struct NodeScript {
    hex: String,
}

/// A watched output of a mempool transaction.
#[derive(Clone, Debug)]
struct MempoolHit {
    vout: u32,
    script: ScriptBuf,
    amount: Amount,
}

/// An ordinary output as read: its index, script and amount.
struct ReadOutput {
    n: u32,
    script: ScriptBuf,
    amount: Amount,
}

impl NodeOutput {
    /// The output, `None` for an MWEB one; why not when a field cannot be read.
    fn read(&self) -> Result<Option<ReadOutput>, String> {
        if self.ismweb {
            return Ok(None);
        }
        let (Some(n), Some(value), Some(script)) = (self.n, &self.value, &self.script_pubkey)
        else {
            return Err("an ordinary output lacks its index, value or script".into());
        };
        let script = Vec::<u8>::from_hex(&script.hex)
            .map(ScriptBuf::from_bytes)
            .map_err(|e| format!("output {n}'s script is not hex: {e}"))?;
        let amount = Amount::from_decimal_str(value.get(), COIN_DECIMALS)
            .map_err(|e| format!("output {n}'s value {}: {e}", excerpt(value.get())))?;
        Ok(Some(ReadOutput { n, script, amount }))
    }
}

impl NodeTransaction {
    /// Its ordinary outputs.
    fn outputs(&self) -> Result<Vec<ReadOutput>, String> {
        let mut outputs = Vec::with_capacity(self.vout.len());
        for output in &self.vout {
            outputs.extend(output.read()?);
        }
        Ok(outputs)
    }
}

/// A transaction of a block or the mempool as read, with its ordinary outputs, or why it
/// cannot be read.
fn read_transaction(raw: &RawValue) -> Result<(NodeTransaction, Vec<ReadOutput>), String> {
    let tx: NodeTransaction = serde_json::from_str(raw.get()).map_err(|e| {
        format!(
            "the node's JSON for it does not read ({})",
            excerpt(&e.to_string())
        )
    })?;
    let outputs = tx.outputs()?;
    Ok((tx, outputs))
}

/// Whether a transaction that cannot be read touches a watched address, judged from its JSON
/// as loosely as it reads: its id as the answer names it, and the watched address it pays (an
/// empty one when it spends a held output or has an output whose script cannot be read: it
/// may be ours); `None` when it is none of payrecon's business.
fn touched_by(
    raw: &RawValue,
    scripts: &KeyIndex<ScriptBuf>,
    held: &HeldOutputs,
) -> Option<(String, String)> {
    let value: serde_json::Value = serde_json::from_str(raw.get()).ok()?;
    let txid = value["txid"]
        .as_str()
        .unwrap_or("(no txid in the answer)")
        .to_owned();
    let mut unknown = false;
    for output in value["vout"].as_array().into_iter().flatten() {
        if output["ismweb"].as_bool() == Some(true) {
            continue;
        }
        match output["scriptPubKey"]["hex"]
            .as_str()
            .and_then(|hex| Vec::<u8>::from_hex(hex).ok())
        {
            Some(bytes) => {
                if let Some(key) = scripts.get(&ScriptBuf::from_bytes(bytes)) {
                    return Some((txid, key.to_string()));
                }
            }
            None => unknown = true,
        }
    }
    let spends_held = value["vin"].as_array().into_iter().flatten().any(|input| {
        match (input["txid"].as_str(), input["vout"].as_u64()) {
            (Some(txid), Some(vout)) => u32::try_from(vout)
                .ok()
                .and_then(|vout| held.get(txid, vout))
                .is_some(),
            _ => false,
        }
    });
    (unknown || spends_held).then(|| (txid, String::new()))
}

/// What a block scan looks each transaction up in.
struct BlockScan<'a> {
    scripts: &'a KeyIndex<ScriptBuf>,
    held: &'a HeldOutputs,
    spent: &'a HeldOutputs,
    network: Network,
    method: Method,
    hrp: &'a str,
}

impl BlockScan<'_> {
    /// Adds what the block at `height` carries to `range`: each input spending a held output
    /// (or one `received` earlier in this scan, or one a known outflow spent) as an outflow,
    /// then each output paying a watched script as a transfer, remembered in `received`.
    fn read(
        &self,
        height: u64,
        transactions: Vec<Box<RawValue>>,
        received: &mut HeldOutputs,
        range: &mut BlockRange,
    ) -> Result<(), ScanError> {
        for raw in transactions {
            let (tx, outputs) = match read_transaction(&raw) {
                Ok(read) => read,
                Err(reason) => {
                    if let Some((txid, address)) = touched_by(&raw, self.scripts, self.held) {
                        let reason = format!("block {height}: transaction {txid}: {reason}");
                        range.push_unreadable(Unreadable::new(txid, address, &reason));
                    }
                    continue;
                }
            };
            let spending = Spending {
                txid: &tx.txid,
                inputs: tx
                    .vin
                    .iter()
                    .map(|input| input.txid.clone().zip(input.vout))
                    .collect(),
                outputs: outputs
                    .iter()
                    .map(|output| Ok((output.script.as_script(), coin_units(output.amount)?)))
                    .collect::<Result<_, ScanError>>()?,
            };
            let lookup = Lookup {
                held: self.held,
                received,
                spent: self.spent,
                network: self.network,
                method: self.method,
                hrp: self.hrp,
            };
            for outflow in lookup.outflows(&spending) {
                range.push_outflow(outflow, height)?;
            }
            let pegouts =
                mweb::carries_pegouts(self.network, outputs.first().map(|o| o.script.as_script()));
            for output in &outputs {
                let Some(key) = self.scripts.get(&output.script) else {
                    continue;
                };
                received.insert(&tx.txid, output.n, coin_units(output.amount)?);
                let transfer = Transfer {
                    id: TransferId {
                        network: self.network,
                        txid: tx.txid.clone(),
                        position: output.n,
                    },
                    to_address: key.to_string(),
                    asset: ReceivedAsset::Method {
                        method: self.method,
                    },
                    amount: output.amount,
                    from_address: None,
                };
                if pegouts {
                    range.push_maturing_transfer(transfer, height)?;
                } else {
                    range.push_transfer(transfer, height)?;
                }
            }
        }
        Ok(())
    }
}

/// Scans one UTXO network through one full node.
pub struct NodeScanner {
    settings: NodeSettings,
    rpc: Option<NodeRpc>,
    /// The node serves the configured chain (checked once per connection).
    checked: bool,
    /// The watched output scripts.
    scripts: KeyIndex<ScriptBuf>,
    /// Mempool transactions already looked at.
    mempool_seen: HashSet<String>,
    /// Those of them that pay a watched script (as watched when fetched).
    mempool_hits: HashMap<String, Vec<MempoolHit>>,
    /// Those of them that touch a watched address and cannot be read.
    mempool_unreadable: HashMap<String, Unreadable>,
    push: Option<PushChannel>,
}

impl NodeScanner {
    /// A scanner that connects on its first scan.
    pub fn new(settings: NodeSettings) -> NodeScanner {
        NodeScanner {
            settings,
            rpc: None,
            checked: false,
            scripts: KeyIndex::default(),
            mempool_seen: HashSet::new(),
            mempool_hits: HashMap::new(),
            mempool_unreadable: HashMap::new(),
            push: None,
        }
    }

    /// Whether `url` can be a node's RPC URL: what configuration checks at start.
    pub fn check_url(url: &SecretUrl) -> Result<(), ScanError> {
        NodeRpc::new(url, NodeAuth::None, Duration::from_secs(1), 0).map(drop)
    }

    fn network_id(&self) -> Network {
        self.settings.target.network_id()
    }

    async fn connect(&mut self) -> Result<&NodeRpc, ScanError> {
        if self.rpc.is_none() {
            self.rpc = Some(NodeRpc::new(
                &self.settings.rpc_url,
                self.settings.auth.clone(),
                self.settings.timeout,
                self.settings.max_answer_bytes,
            )?);
        }
        if self.push.is_none()
            && let Some(peer) = &self.settings.push_peer
        {
            self.push = Some(PushChannel::start(
                peer.clone(),
                self.settings.target.magic(),
            ));
        }
        let rpc = self.rpc.as_ref().expect("just made");
        if !self.checked {
            check_chain(rpc, &self.settings.target).await?;
            self.checked = true;
        }
        Ok(rpc)
    }
}

/// The node's tip, its time, and whether it is still in its initial block download.
async fn node_tip(rpc: &NodeRpc) -> Result<Probe, ScanError> {
    #[derive(Deserialize)]
    struct ChainInfo {
        blocks: u64,
        #[serde(default)]
        initialblockdownload: bool,
    }
    let info: ChainInfo = rpc.call("getblockchaininfo", json!([])).await?;
    Ok(Probe {
        tip_height: info.blocks,
        tip_time_ms: block_time(rpc, info.blocks).await?,
        syncing: info.initialblockdownload,
        findings: Vec::new(),
    })
}

/// The node must serve the configured chain: its genesis block, and its chain name.
async fn check_chain(rpc: &NodeRpc, target: &UtxoTarget) -> Result<(), ScanError> {
    #[derive(Deserialize)]
    struct ChainInfo {
        chain: String,
        blocks: u64,
        #[serde(default)]
        initialblockdownload: bool,
    }
    let info: ChainInfo = rpc.call("getblockchaininfo", json!([])).await?;
    let expected = target.expected_genesis()?;
    let genesis: String = rpc.call("getblockhash", json!([0])).await?;
    if genesis != expected.to_string() {
        return Err(ScanError::WrongChain(format!(
            "the node at {} serves the {:?} chain with genesis block {genesis}, not {:?} {:?} ({expected})",
            rpc.url(),
            info.chain,
            target.chain,
            target.network
        )));
    }
    if info.initialblockdownload {
        tracing::warn!(network = %target.network_id(), tip = info.blocks, "the node is still syncing: payments show up as it catches up");
    }
    tracing::info!(network = %target.network_id(), url = %rpc.url(), tip = info.blocks, "connected to the full node");
    Ok(())
}

/// The hash of the block at `height` on the node's chain, `None` above its tip.
async fn block_hash(rpc: &NodeRpc, height: u64) -> Result<Option<String>, ScanError> {
    match rpc.try_call("getblockhash", json!([height])).await? {
        Ok(hash) => Ok(Some(hash)),
        Err(RpcError { code, .. }) if code == RPC_INVALID_PARAMETER => Ok(None),
        Err(error) => Err(error.into_scan_error("getblockhash")),
    }
}

/// The time of the block at `height` on the node's chain, Unix milliseconds; `None` above its
/// tip.
async fn block_time(rpc: &NodeRpc, height: u64) -> Result<Option<i64>, ScanError> {
    let Some(hash) = block_hash(rpc, height).await? else {
        return Ok(None);
    };
    let header: BlockHeader = rpc.call("getblockheader", json!([hash, true])).await?;
    Ok(Some(header.time.saturating_mul(1000)))
}

/// The blocks at `heights`, in order, asked in one request for the hashes and one for the
/// blocks.
async fn read_blocks(rpc: &NodeRpc, heights: &[u64]) -> Result<Vec<NodeBlock>, ScanError> {
    let params: Vec<_> = heights.iter().map(|h| json!([h])).collect();
    let hashes: Vec<String> = rpc
        .batch::<String>("getblockhash", &params)
        .await?
        .into_iter()
        .map(|hash| {
            hash.map_err(|e| {
                // A tip that went down between asking the count and the hash: a reorg.
                ScanError::Transient(format!("getblockhash: {e} (the chain moved)"))
            })
        })
        .collect::<Result<_, _>>()?;
    let params: Vec<_> = hashes.iter().map(|h| json!([h, 2])).collect();
    rpc.batch::<NodeBlock>("getblock", &params)
        .await?
        .into_iter()
        .zip(heights)
        .map(|(block, height)| {
            let block = block.map_err(|e| e.into_scan_error("getblock"))?;
            if block.height != *height {
                return Err(ScanError::Fatal(format!(
                    "asked for block {height}, the node answered block {}",
                    block.height
                )));
            }
            Ok(block)
        })
        .collect()
}

impl ChainScanner for NodeScanner {
    fn network(&self) -> Network {
        self.network_id()
    }

    fn source(&self) -> &SecretUrl {
        &self.settings.rpc_url
    }

    async fn scan(&mut self, view: &WatchView) -> Result<ScanBatch, ScanError> {
        let network = self.network_id();
        let method = self.settings.target.method();
        let (per_scan, per_request) = (
            self.settings.blocks_per_scan.max(1),
            self.settings.blocks_per_request.max(1),
        );
        let start_height = self.settings.start_height;
        self.connect().await?;
        let rpc = self.rpc.as_ref().expect("connected");
        let scripts = &mut self.scripts;
        scripts
            .sync(&view.watch_keys, script_pubkey)
            .map_err(|(key, e)| {
                ScanError::Fatal(format!("watch key {key:?} is not a segwit address: {e}"))
            })?;

        let head: u64 = rpc.call("getblockcount", json!([])).await?;
        if let Some(cursor) = &view.cursor
            && cursor.tip.height > head
        {
            return Err(ScanError::Transient(format!(
                "the node at {} is at height {head}, behind the {} already processed",
                rpc.url(),
                cursor.tip.height
            )));
        }
        let start = blocks::start_height(start_height, view, head, BLOCK_TIME_SLACK_MS, |height| {
            block_time(rpc, height)
        })
        .await?;
        let resume = blocks::resume(view.cursor.as_ref(), start, |height| {
            block_hash(rpc, height)
        })
        .await?;
        let mut range = BlockRange::new(resume).with_maturity(mweb::PEGOUT_MATURITY);
        let last = head.min(range.from().saturating_add(per_scan - 1));
        let heights: Vec<u64> = (range.from()..=last).collect();
        let hrp = self.settings.target.hrp();
        let mut received = HeldOutputs::default();
        for chunk in heights.chunks(per_request) {
            for block in read_blocks(rpc, chunk).await? {
                range.push_block(
                    block.height,
                    block.hash,
                    &block.previousblockhash,
                    block.time.saturating_mul(1000),
                )?;
                let found = BlockScan {
                    scripts,
                    held: &view.held,
                    spent: &view.spent,
                    network,
                    method,
                    hrp,
                };
                found.read(block.height, block.tx, &mut received, &mut range)?;
            }
        }
        let mut batch = range.into_batch(view, head, blocks::depth);
        if batch.more {
            // Still catching up: the mempool is judged against the node's tip only.
            return Ok(batch);
        }
        let tip_hash = batch.cursor.tip.hash.clone();
        let mempool = Mempool {
            rpc,
            seen: &mut self.mempool_seen,
            hits: &mut self.mempool_hits,
            unreadable: &mut self.mempool_unreadable,
            scripts,
            held: &view.held,
        };
        if !mempool.refresh(&tip_hash).await? {
            // A block came in while the mempool was read: a transaction missing from both
            // may be in it. Scan again at once instead of judging.
            batch.more = true;
            return Ok(batch);
        }
        let report_tip = batch
            .cursor
            .tip
            .height
            .max(view.cursor.as_ref().map_or(0, |cursor| cursor.tip.height));
        batch
            .unreadable
            .extend(self.mempool_unreadable.values().cloned());
        merge_mempool(
            &mut batch,
            view,
            &self.mempool_hits,
            &self.scripts,
            network,
            method,
            report_tip,
        );
        Ok(batch)
    }

    async fn probe(&mut self) -> Result<Probe, ScanError> {
        let rpc = self.connect().await?;
        node_tip(rpc).await
    }

    fn reset(&mut self) {
        self.rpc = None;
        self.checked = false;
        self.mempool_seen.clear();
        self.mempool_hits.clear();
        self.mempool_unreadable.clear();
    }

    /// The transaction from the node's index (or mempool), else from the block it was
    /// reported in, and the output at the transfer's position.
    async fn attest(
        &mut self,
        transfers: &[KnownTransfer],
        _settle_depth: u32,
    ) -> Result<Vec<Attestation>, ScanError> {
        let method = self.settings.target.method();
        let rpc = self.connect().await?;
        let head: u64 = rpc.call("getblockcount", json!([])).await?;
        let mut answers = Vec::with_capacity(transfers.len());
        for known in transfers {
            let reported = &known.transfer;
            let read = match located(rpc, &reported.id.txid, known.block_height, head).await? {
                Located::Found(read) => read,
                Located::Not(answer) => {
                    answers.push(answer);
                    continue;
                }
            };
            let (tx, block) = read;
            let outputs = tx.outputs().map_err(ScanError::Fatal)?;
            let found = outputs
                .iter()
                .find(|o| o.n == reported.id.position)
                .map(|o| output_as_transfer(reported, method, &o.script, o.amount));
            let confirmations = block.as_ref().map_or(0, |b| blocks::depth(b.height, head));
            answers.push(Attestation::of_found(
                reported,
                found.as_ref(),
                block,
                confirmations,
            ));
        }
        Ok(answers)
    }

    /// The transaction as [`attest`](ChainScanner::attest) finds it, and its outputs to the
    /// customer's address. A node behind the block it was seen in cannot say: an error, not
    /// `None`, so a refund is not taken back for a node's lag.
    async fn paid_to(
        &mut self,
        txid: &str,
        to_address: &str,
        asset: &ReceivedAsset,
        seen_at: Option<u64>,
    ) -> Result<Option<Paid>, ScanError> {
        let Some(script) = self.settings.target.paid_script(to_address, asset)? else {
            return Ok(None);
        };
        let rpc = self.connect().await?;
        let head: u64 = rpc.call("getblockcount", json!([])).await?;
        let (tx, block) = match located(rpc, txid, seen_at, head).await? {
            Located::Found(read) => read,
            Located::Not(Attestation::Behind { head }) => {
                return Err(ScanError::Transient(format!(
                    "the node is at block {head}, behind the block {txid} was seen in"
                )));
            }
            Located::Not(_) => return Ok(None),
        };
        let paid = tx
            .outputs()
            .map_err(ScanError::Fatal)?
            .iter()
            .filter(|o| o.script == script)
            .try_fold(Amount::ZERO, |sum, o| sum.checked_add(o.amount))
            .ok_or_else(|| ScanError::Fatal(format!("{txid}'s outputs overflow")))?;
        let confirmations = block.as_ref().map_or(0, |b| blocks::depth(b.height, head));
        Ok(Some(Paid {
            amount: paid,
            block,
            confirmations,
        }))
    }

    async fn news(&mut self) {
        match &self.push {
            Some(push) => push.news().await,
            None => std::future::pending().await,
        }
    }
}

impl RefundSource for NodeScanner {
    /// `getrawtransaction`, through the index or the mempool, else in the block named.
    async fn transactions(
        &mut self,
        wanted: &[(Txid, Option<u64>)],
    ) -> Result<Vec<Transaction>, ScanError> {
        let rpc = self.connect().await?;
        let mut found = Vec::with_capacity(wanted.len());
        for (txid, seen_at) in wanted {
            let mut answer: Result<String, RpcError> = rpc
                .try_call("getrawtransaction", json!([txid.to_string(), false]))
                .await?;
            if let (Err(RpcError { code, .. }), Some(height)) = (&answer, seen_at)
                && *code == RPC_NOT_FOUND
                && let Some(hash) = block_hash(rpc, *height).await?
            {
                answer = rpc
                    .try_call("getrawtransaction", json!([txid.to_string(), false, hash]))
                    .await?;
            }
            let hex = answer.map_err(|e| e.into_scan_error("getrawtransaction"))?;
            let raw = Vec::<u8>::from_hex(&hex)
                .map_err(|e| ScanError::Fatal(format!("transaction {txid} is not hex: {e}")))?;
            let tx = match mweb::decode(&raw) {
                Ok(mweb::Decoded::Canonical(tx)) if tx.compute_txid() == *txid => tx,
                Ok(_) => {
                    return Err(ScanError::Fatal(format!(
                        "the node answered another transaction, or one no address holds, for {txid}"
                    )));
                }
                Err(e) => {
                    return Err(ScanError::Fatal(format!(
                        "transaction {txid} does not decode: {e}"
                    )));
                }
            };
            found.push(tx);
        }
        Ok(found)
    }

    /// `estimatesmartfee` for the next two blocks, else the mempool's minimum fee.
    async fn fee_rate(&mut self) -> Result<FeeRate, ScanError> {
        #[derive(Deserialize)]
        struct Estimate {
            #[serde(default)]
            feerate: Option<Box<RawValue>>,
        }
        #[derive(Deserialize)]
        struct MempoolInfo {
            mempoolminfee: Box<RawValue>,
        }
        let per_kvb = |value: &RawValue| {
            Amount::from_decimal_str(value.get(), COIN_DECIMALS)
                .ok()
                .and_then(|a| u64::try_from(a.base_units()).ok())
        };
        let rpc = self.connect().await?;
        let estimate: Estimate = rpc
            .call("estimatesmartfee", json!([FEE_TARGET_BLOCKS]))
            .await?;
        if let Some(rate) = estimate
            .feerate
            .as_deref()
            .and_then(per_kvb)
            .and_then(|units| FeeRate::per_kvb(units, true))
        {
            return Ok(rate);
        }
        let info: MempoolInfo = rpc.call("getmempoolinfo", json!([])).await?;
        per_kvb(&info.mempoolminfee)
            .and_then(|units| FeeRate::per_kvb(units, false))
            .ok_or_else(|| {
                ScanError::Fatal(format!(
                    "the node's mempool minimum fee {} is no fee rate",
                    excerpt(info.mempoolminfee.get())
                ))
            })
    }
}

/// Where [`NodeScanner::attest`] found a reported transaction.
enum Located {
    /// The transaction and its block (`None` in the mempool).
    Found((NodeTransaction, Option<BlockId>)),
    /// Not found, or the node is behind: the answer to give.
    Not(Attestation),
}

/// Finds transaction `txid`: through the node's index (`txindex`, or the mempool), else in
/// the block at `seen_at`, where it was reported.
async fn located(
    rpc: &NodeRpc,
    txid: &str,
    seen_at: Option<u64>,
    head: u64,
) -> Result<Located, ScanError> {
    let answer: Result<NodeTransaction, RpcError> = rpc
        .try_call("getrawtransaction", json!([txid, true]))
        .await?;
    match answer {
        Ok(tx) => {
            let mined = tx
                .blockhash
                .clone()
                .filter(|_| tx.confirmations.unwrap_or(0) > 0);
            let block = match mined {
                Some(hash) => {
                    #[derive(Deserialize)]
                    struct Height {
                        height: u64,
                    }
                    let header: Height = rpc.call("getblockheader", json!([hash])).await?;
                    Some(BlockId {
                        height: header.height,
                        hash,
                    })
                }
                // The index still knows a transaction a reorg took out of the chain (with its
                // stale block, zero confirmations): only the mempool can hold it now.
                None if tx.blockhash.is_some() => {
                    let pooled = rpc
                        .try_call::<serde_json::Value>("getmempoolentry", json!([txid]))
                        .await?;
                    match pooled {
                        Ok(_) => None,
                        Err(RpcError { code, .. }) if code == RPC_NOT_FOUND => {
                            return Ok(Located::Not(Attestation::Missing(
                                "the node holds it in a block no longer on its chain".into(),
                            )));
                        }
                        Err(error) => return Err(error.into_scan_error("getmempoolentry")),
                    }
                }
                None => None,
            };
            Ok(Located::Found((tx, block)))
        }
        Err(RpcError { code, .. }) if code == RPC_NOT_FOUND => {
            let Some(height) = seen_at else {
                return Ok(Located::Not(Attestation::Missing(
                    "the node knows no such transaction".into(),
                )));
            };
            if height > head {
                return Ok(Located::Not(Attestation::Behind { head }));
            }
            let Some(hash) = block_hash(rpc, height).await? else {
                return Ok(Located::Not(Attestation::Behind { head }));
            };
            #[derive(Deserialize)]
            struct Transactions {
                tx: Vec<NodeTransaction>,
            }
            let block: Transactions = rpc.call("getblock", json!([hash, 2])).await?;
            Ok(match block.tx.into_iter().find(|tx| tx.txid == *txid) {
                Some(tx) => Located::Found((tx, Some(BlockId { height, hash }))),
                None => Located::Not(Attestation::Missing(format!(
                    "the node's block {height} does not hold it"
                ))),
            })
        }
        Err(error) => Err(error.into_scan_error("getrawtransaction")),
    }
}

/// The scanner's copy of the node's mempool, brought up to date once per scan.
struct Mempool<'a> {
    rpc: &'a NodeRpc,
    seen: &'a mut HashSet<String>,
    hits: &'a mut HashMap<String, Vec<MempoolHit>>,
    /// Those that touch a watched address and cannot be read.
    unreadable: &'a mut HashMap<String, Unreadable>,
    scripts: &'a KeyIndex<ScriptBuf>,
    held: &'a HeldOutputs,
}

impl Mempool<'_> {
    /// Forgets what left the mempool and fetches what entered it. False when the node's tip
    /// is no longer `tip_hash` by the end, so the copy cannot be judged against the blocks.
    async fn refresh(self, tip_hash: &str) -> Result<bool, ScanError> {
        let now: Vec<String> = self.rpc.call("getrawmempool", json!([false])).await?;
        let current: HashSet<&str> = now.iter().map(String::as_str).collect();
        self.seen.retain(|txid| current.contains(txid.as_str()));
        self.hits.retain(|txid, _| current.contains(txid.as_str()));
        self.unreadable
            .retain(|txid, _| current.contains(txid.as_str()));
        let new: Vec<&String> = now.iter().filter(|t| !self.seen.contains(*t)).collect();
        for chunk in new.chunks(TRANSACTIONS_PER_REQUEST) {
            let params: Vec<_> = chunk.iter().map(|txid| json!([txid, true])).collect();
            let answers = self
                .rpc
                .batch::<Box<RawValue>>("getrawtransaction", &params)
                .await?;
            for (txid, answer) in chunk.iter().zip(answers) {
                let raw = match answer {
                    Ok(raw) => raw,
                    // Mined or dropped since the list: the blocks or the next list say which.
                    Err(RpcError { code, .. }) if code == RPC_NOT_FOUND => continue,
                    Err(error) => return Err(error.into_scan_error("getrawtransaction")),
                };
                let (tx, outputs) = match read_transaction(&raw) {
                    Ok(read) => read,
                    Err(reason) => {
                        if let Some((_, address)) = touched_by(&raw, self.scripts, self.held) {
                            let reason = format!("mempool transaction {txid}: {reason}");
                            self.unreadable
                                .insert((*txid).clone(), Unreadable::new(*txid, address, &reason));
                        }
                        self.seen.insert((*txid).clone());
                        continue;
                    }
                };
                if tx.txid != **txid {
                    return Err(ScanError::Fatal(format!(
                        "asked for transaction {txid}, the node answered {}",
                        tx.txid
                    )));
                }
                let paid: Vec<MempoolHit> = outputs
                    .into_iter()
                    .filter(|output| self.scripts.contains(&output.script))
                    .map(|output| MempoolHit {
                        vout: output.n,
                        script: output.script,
                        amount: output.amount,
                    })
                    .collect();
                if !paid.is_empty() {
                    self.hits.insert((*txid).clone(), paid);
                }
                self.seen.insert((*txid).clone());
            }
        }
        let best: String = self.rpc.call("getbestblockhash", json!([])).await?;
        Ok(best == tip_hash)
    }
}

/// Adds the mempool's news to a scan caught up with the node: watched payments new in the
/// mempool or back in it after a reorg, and unconfirmed ones that left it unmined.
fn merge_mempool(
    batch: &mut ScanBatch,
    view: &WatchView,
    hits: &HashMap<String, Vec<MempoolHit>>,
    scripts: &KeyIndex<ScriptBuf>,
    network: Network,
    method: payrecon_chain_core::Method,
    tip_height: u64,
) {
    let mined: HashSet<TransferId> = batch
        .events
        .iter()
        .filter_map(|event| match event {
            ChainEvent::Observed {
                transfer,
                block_height: Some(_),
                ..
            } => Some(transfer.id.clone()),
            _ => None,
        })
        .collect();
    let mut pending = HashSet::new();
    let mut observed = Vec::new();
    for (txid, paid) in hits {
        for hit in paid {
            let Some(key) = scripts.get(&hit.script) else {
                continue;
            };
            let id = TransferId {
                network,
                txid: txid.clone(),
                position: hit.vout,
            };
            if mined.contains(&id) {
                continue;
            }
            pending.insert(id.clone());
            let previous = view.known.get(&id);
            if previous.is_some_and(|k| k.block_height.is_none() && k.confirmations == 0) {
                continue;
            }
            observed.push(ChainEvent::Observed {
                transfer: Transfer {
                    id,
                    to_address: key.to_string(),
                    asset: ReceivedAsset::Method { method },
                    amount: hit.amount,
                    from_address: None,
                },
                confirmations: 0,
                block_height: None,
                seen_at_ms: previous.map_or(view.now_ms, |k| k.seen_at_ms),
                tip_height,
            });
        }
    }
    // A reorg sent it back to the mempool: it is pending again, not gone.
    batch
        .events
        .retain(|event| !matches!(event, ChainEvent::Removed { id, .. } if pending.contains(id)));
    batch.events.extend(observed);
    for known in view.known.values() {
        let id = &known.transfer.id;
        if known.block_height.is_none() && !mined.contains(id) && !pending.contains(id) {
            batch.events.push(ChainEvent::Removed {
                id: id.clone(),
                tip_height,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!(
            "{}/../../fixtures/litecoin/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn a_recorded_block_reads_with_exact_amounts() {
        let block: NodeBlock = serde_json::from_str(
            r#"{"hash":"ab","height":7,"previousblockhash":"aa","time":1700000000,"nTx":1,
                "tx":[{"txid":"t1","hex":"00","vout":[
                  {"value":0.00000001,"n":0,"scriptPubKey":{"hex":"0014aabbccddeeff00112233445566778899aabbccdd","type":"witness_v0_keyhash"}},
                  {"value":20999999.97690000,"n":1,"scriptPubKey":{"hex":"6a","type":"nulldata"}}]}]}"#,
        )
        .unwrap();
        let (_, outputs) = read_transaction(&block.tx[0]).unwrap();
        assert_eq!(outputs[0].amount, Amount::from_base_units(1));
        assert_eq!(
            outputs[1].amount,
            Amount::from_base_units(2_099_999_997_690_000)
        );
        assert_eq!(outputs[0].script.len(), 22);
    }

    #[test]
    fn a_value_that_is_not_an_exact_coin_amount_is_refused() {
        for value in ["-1", "0.000000001", "1e-8", "\"1\""] {
            let output: NodeOutput = serde_json::from_str(&format!(
                r#"{{"value":{value},"n":0,"scriptPubKey":{{"hex":"00"}}}}"#
            ))
            .unwrap();
            assert!(output.read().is_err(), "{value}");
        }
    }

    #[test]
    fn a_block_with_a_hogex_reads_its_peg_out() {
        let block: NodeBlock =
            serde_json::from_str(&fixture("getblock_pegout_regtest.json")).unwrap();
        let (hogex, outputs) = read_transaction(block.tx.last().unwrap()).unwrap();
        assert_eq!(
            hogex.txid,
            "8dcb51c8b6753d488a8f581082a62788eb63e6be7071d085d3c074a336657b39"
        );
        assert_eq!(outputs.len(), 2);
        assert_eq!(
            (outputs[1].n, outputs[1].amount),
            (1, Amount::from_base_units(125_000_000))
        );
    }

    #[test]
    fn an_mweb_only_transaction_in_the_mempool_has_no_ordinary_output() {
        let raw: Box<RawValue> =
            serde_json::from_str(&fixture("getrawtransaction_pegout_mempool_regtest.json"))
                .unwrap();
        let (tx, outputs) = read_transaction(&raw).unwrap();
        assert_eq!(
            tx.txid,
            "1a1fd052123c06290d80ef2f27a546916bf7af425d4af2d9e849a270f78d2a89"
        );
        assert!(outputs.is_empty());
        assert_eq!(tx.vin[0].txid, None, "an MWEB input spends no outpoint");
    }

    #[test]
    fn an_unreadable_transaction_is_judged_by_what_it_touches() {
        let watched = ScriptBuf::from_bytes(
            Vec::from_hex("001451eadb7deb7ee6caeb359ce1ac798ad098cccf78").unwrap(),
        );
        let mut scripts = KeyIndex::default();
        let mut keys = payrecon_chain_core::WatchKeys::default();
        keys.insert("rltc1q284dkl0t0mnv46e4nns6c7v26zvvenmcmgmvpj");
        scripts
            .sync(&keys, crate::script_pubkey)
            .map_err(|(key, e)| format!("{key}: {e}"))
            .unwrap();
        assert!(scripts.contains(&watched));
        let held = HeldOutputs::default();
        let paying: Box<RawValue> = serde_json::from_str(
            r#"{"txid":"aa","vout":[{"value":"x","n":0,"scriptPubKey":{"hex":"001451eadb7deb7ee6caeb359ce1ac798ad098cccf78"}}]}"#,
        )
        .unwrap();
        assert!(read_transaction(&paying).is_err());
        assert_eq!(
            touched_by(&paying, &scripts, &held),
            Some((
                "aa".to_owned(),
                "rltc1q284dkl0t0mnv46e4nns6c7v26zvvenmcmgmvpj".to_owned()
            ))
        );
        let elsewhere: Box<RawValue> = serde_json::from_str(
            r#"{"txid":"bb","vout":[{"value":"x","n":0,"scriptPubKey":{"hex":"0014aabbccddeeff00112233445566778899aabbccdd"}}]}"#,
        )
        .unwrap();
        assert_eq!(touched_by(&elsewhere, &scripts, &held), None);
    }
}
