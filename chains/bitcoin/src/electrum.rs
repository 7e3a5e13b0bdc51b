//! The Bitcoin and Litecoin scanner, over an Electrum server.
//!
//! Electrum indexes by script: the scanner subscribes to the script hash of every watched
//! address and to the chain tip. A script's status changes whenever its history does (a
//! payment enters the mempool, is mined, is reorged or replaced), so after the first full read
//! only changed scripts are read again; a new tip only moves confirmations. Every scan diffs
//! the histories against what the engine has committed, which makes a scan repeatable and a
//! restart exact: a transfer the engine knows and the server no longer lists is removed.
//!
//! Trust: like any Electrum wallet without header proof-of-work checks, the scanner trusts its
//! server for what is on the chain; run your own server. It checks what it can: the server's
//! genesis block is the configured chain's, and every transaction hashes to its id.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future as _;
use std::time::Duration;

use electrum_client::{ElectrumApi, Error as ElectrumError};
use payrecon_chain_core::bitcoin::block::Header;
use payrecon_chain_core::bitcoin::{BlockHash, ScriptBuf, Transaction, Txid};
use payrecon_chain_core::blocks;
use payrecon_chain_core::{
    Amount, Attestation, BlockId, ChainCursor, ChainEvent, ChainScanner, HeldOutputs, KeyIndex,
    KnownTransfer, Method, Network, OutflowEvent, Paid, Probe, ReceivedAsset, ScanBatch, ScanError,
    SecretUrl, Transfer, TransferId, Unreadable, WatchKeys, WatchView,
};

use crate::derive::output_as_transfer;
use crate::electrum_stream::{self, ElectrumClient};
use crate::mweb::{self, Decoded};
use crate::psbt::{FEE_TARGET_BLOCKS, FeeRate, RefundSource};
use crate::spends::{Lookup, Spending};
use crate::{UtxoTarget, script_pubkey};

/// Recent block hashes kept for the cursor, below the tip.
const KEPT_CHECKPOINTS: u64 = 64;

/// Transactions per batched request: raw transactions are large, and a server caps the size
/// of one answer (ElectrumX: MAX_SEND, 1 MB by default).
const TRANSACTIONS_PER_BATCH: usize = 100;

/// Block times remembered for dating transfers first seen already confirmed.
const KEPT_BLOCK_TIMES: usize = 4096;

/// Where and how to reach one network's Electrum server.
#[derive(Clone, Debug)]
pub struct ElectrumSettings {
    /// `tcp://host:port` or `ssl://host:port`.
    pub url: SecretUrl,
    /// The chain the server must serve.
    pub target: UtxoTarget,
    /// Connecting, and each read and write of a request.
    pub timeout: Duration,
    /// The longest answer line read: one batched answer for [`Self::batch_size`] scripts fits
    /// well within the default; an endless one is refused at it.
    pub max_line_bytes: usize,
    /// Scripts per batched subscribe or history request. Servers answer a session's later
    /// requests more slowly (ElectrumX: about a second each), so fewer, larger batches resync
    /// faster.
    pub batch_size: usize,
}

impl ElectrumSettings {
    /// Settings with a 30 s timeout and batches of 1000 scripts.
    pub fn new(url: impl Into<SecretUrl>, target: UtxoTarget) -> ElectrumSettings {
        ElectrumSettings {
            url: url.into(),
            target,
            timeout: Duration::from_secs(30),
            max_line_bytes: 32 << 20,
            batch_size: 1000,
        }
    }

    fn network_id(&self) -> Network {
        self.target.network_id()
    }
}

/// Scans one UTXO network through one Electrum server.
pub struct ElectrumScanner {
    settings: ElectrumSettings,
    session: Option<Session>,
}

impl ElectrumScanner {
    /// A scanner that connects on its first scan.
    pub fn new(settings: ElectrumSettings) -> ElectrumScanner {
        ElectrumScanner {
            settings,
            session: None,
        }
    }
}

impl ChainScanner for ElectrumScanner {
    fn network(&self) -> Network {
        self.settings.network_id()
    }

    fn source(&self) -> &SecretUrl {
        &self.settings.url
    }

    async fn scan(&mut self, view: &WatchView) -> Result<ScanBatch, ScanError> {
        let settings = self.settings.clone();
        let session = self.session.take();
        // The client blocks. On a multi-threaded runtime the scan runs in place (the worker's
        // other tasks move away) and reads the view where it is; elsewhere it runs on the
        // blocking pool with a copy of the view.
        let multi_threaded = tokio::runtime::Handle::current().runtime_flavor()
            == tokio::runtime::RuntimeFlavor::MultiThread;
        let (session, batch) = if multi_threaded {
            tokio::task::block_in_place(|| scan_session(&settings, session, view))?
        } else {
            let view = view.clone();
            tokio::task::spawn_blocking(move || scan_session(&settings, session, &view))
                .await
                .map_err(|e| ScanError::Transient(format!("scanner task: {e}")))??
        };
        self.session = Some(session);
        Ok(batch)
    }

    fn reset(&mut self) {
        self.session = None;
    }

    async fn probe(&mut self) -> Result<Probe, ScanError> {
        let settings = self.settings.clone();
        tokio::task::spawn_blocking(move || {
            let session = Session::connect(&settings, None)?;
            let tip = session
                .client
                .block_header(session.tip_height as usize)
                .map_err(classify)?;
            Ok(Probe {
                tip_height: session.tip_height,
                tip_time_ms: Some(i64::from(tip.time) * 1000),
                syncing: false,
                findings: Vec::new(),
            })
        })
        .await
        .map_err(|e| ScanError::Transient(format!("scanner task: {e}")))?
    }

    async fn balances_at(
        &mut self,
        holdings: &[(String, Method)],
        until_ms: i64,
    ) -> Result<(BlockId, Vec<Amount>), ScanError> {
        let addresses: Vec<String> = holdings.iter().map(|(a, _)| a.clone()).collect();
        self.balances(&addresses, until_ms).await
    }

    async fn attest(
        &mut self,
        transfers: &[KnownTransfer],
        _settle_depth: u32,
    ) -> Result<Vec<Attestation>, ScanError> {
        let transfers = transfers.to_vec();
        self.at_tip(move |session, settings| session.attest(settings, &transfers))
            .await
    }

    /// The customer's address's history, and the transaction (which must hash to its id).
    async fn paid_to(
        &mut self,
        txid: &str,
        to_address: &str,
        asset: &ReceivedAsset,
        _seen_at: Option<u64>,
    ) -> Result<Option<Paid>, ScanError> {
        let Some(script) = self.settings.target.paid_script(to_address, asset)? else {
            return Ok(None);
        };
        let txid = txid.to_owned();
        self.at_tip(move |session, _| session.paid_to(&txid, &script))
            .await
    }
}

impl ElectrumScanner {
    /// Runs `work` on the blocking client, in this scanner's session (connected and at the
    /// server's tip first), keeping the session for the next call.
    async fn at_tip<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut Session, &ElectrumSettings) -> Result<T, ScanError> + Send + 'static,
    ) -> Result<T, ScanError> {
        let settings = self.settings.clone();
        let session = self.session.take();
        let (session, found) = tokio::task::spawn_blocking(move || {
            let mut session = match session {
                Some(session) => session,
                None => Session::connect(&settings, None)?,
            };
            session.follow_tip()?;
            let found = work(&mut session, &settings)?;
            Ok::<_, ScanError>((session, found))
        })
        .await
        .map_err(|e| ScanError::Transient(format!("scanner task: {e}")))??;
        self.session = Some(session);
        Ok(found)
    }

    /// [`ChainScanner::balances_at`] on the blocking client.
    async fn balances(
        &mut self,
        addresses: &[String],
        until_ms: i64,
    ) -> Result<(BlockId, Vec<Amount>), ScanError> {
        let addresses = addresses.to_vec();
        self.at_tip(move |session, settings| session.balances_at(settings, &addresses, until_ms))
            .await
    }
}

impl RefundSource for ElectrumScanner {
    async fn transactions(
        &mut self,
        wanted: &[(Txid, Option<u64>)],
    ) -> Result<Vec<Transaction>, ScanError> {
        let txids: Vec<Txid> = wanted.iter().map(|(txid, _)| *txid).collect();
        self.at_tip(move |session, _| session.whole_transactions(&txids))
            .await
    }

    /// `blockchain.estimatefee` for the next two blocks, else `blockchain.relayfee`, else the
    /// nodes' default relay floor.
    async fn fee_rate(&mut self) -> Result<FeeRate, ScanError> {
        self.at_tip(|session, _| {
            let estimate = session
                .client
                .estimate_fee(FEE_TARGET_BLOCKS, None)
                .map_err(classify)?;
            if let Some(rate) = FeeRate::per_kvb_coins(estimate, true) {
                return Ok(rate);
            }
            // Protocol 1.6 servers dropped `blockchain.relayfee`: then the nodes' default floor.
            Ok(session
                .client
                .relay_fee()
                .ok()
                .and_then(|floor| FeeRate::per_kvb_coins(floor, false))
                .unwrap_or(FeeRate::DEFAULT_RELAY_FLOOR))
        })
        .await
    }
}

/// One scan in `session`, connecting first if there is none.
fn scan_session(
    settings: &ElectrumSettings,
    session: Option<Session>,
    view: &WatchView,
) -> Result<(Session, ScanBatch), ScanError> {
    let mut session = match session {
        Some(session) => session,
        None => Session::connect(settings, view.cursor.as_ref())?,
    };
    let batch = session.scan(settings, view)?;
    Ok((session, batch))
}

/// A script the scanner follows, and its history once read.
struct Watched {
    key: String,
    history: Option<Vec<(Txid, i32)>>,
}

/// One connection's state: dropped on any failure, rebuilt by a full read.
struct Session {
    client: ElectrumClient,
    tip_height: u64,
    tip_hash: BlockHash,
    /// Recent blocks up to the tip: hash and time by height.
    recent: BTreeMap<u64, (BlockHash, u32)>,
    /// Older block times, for dating transfers first seen already confirmed.
    block_times: BTreeMap<u64, u32>,
    scripts: HashMap<ScriptBuf, Watched>,
    /// The watch keys as output scripts, in step with the view's keys: what is subscribed.
    index: KeyIndex<ScriptBuf>,
    /// Inputs and outputs of every transaction in a followed history (a transaction never
    /// changes), or why one cannot be read.
    transactions: HashMap<Txid, TxRead>,
    /// The tip moved other than by extension since the last scan: read every history again.
    reorged: bool,
}

impl Session {
    fn connect(
        settings: &ElectrumSettings,
        cursor: Option<&ChainCursor>,
    ) -> Result<Session, ScanError> {
        let client =
            electrum_stream::connect(&settings.url, settings.timeout, settings.max_line_bytes)?;
        // `server.version` first: protocol 1.6 requires it, and it fixes how later answers read.
        client.protocol_version().map_err(classify)?;
        let expected = settings.target.expected_genesis()?;
        let genesis = client.block_header(0).map_err(classify)?.block_hash();
        if genesis != expected {
            return Err(ScanError::WrongChain(format!(
                "{} serves the chain with genesis block {genesis}, not {:?} {:?} ({expected})",
                settings.url, settings.target.chain, settings.target.network
            )));
        }
        let tip = client.block_headers_subscribe().map_err(classify)?;
        let tip_height = tip.height as u64;
        if let Some(cursor) = cursor
            && cursor.tip.height > tip_height
        {
            return Err(ScanError::Transient(format!(
                "{} is at height {tip_height}, behind the {} already processed",
                settings.url, cursor.tip.height
            )));
        }
        let mut session = Session {
            client,
            tip_height,
            tip_hash: tip.header.block_hash(),
            recent: BTreeMap::new(),
            block_times: BTreeMap::new(),
            scripts: HashMap::new(),
            index: KeyIndex::default(),
            transactions: HashMap::new(),
            reorged: false,
        };
        session.reload_recent()?;
        if let Some(cursor) = cursor
            && session
                .recent
                .get(&cursor.tip.height)
                .map(|(h, _)| h.to_string())
                != Some(cursor.tip.hash.clone())
            && cursor.tip.height + KEPT_CHECKPOINTS > tip_height
        {
            tracing::warn!(
                network = %settings.network_id(),
                height = cursor.tip.height,
                "the block last processed is no longer on the chain: a reorg happened while stopped"
            );
        }
        tracing::info!(network = %settings.network_id(), url = %settings.url, tip = tip_height, "connected to Electrum server");
        Ok(session)
    }

    /// Reads the recent headers up to the tip again.
    fn reload_recent(&mut self) -> Result<(), ScanError> {
        let low = self.tip_height.saturating_sub(KEPT_CHECKPOINTS);
        let heights: Vec<u32> = (low..=self.tip_height)
            .map(height_u32)
            .collect::<Result<_, _>>()?;
        let headers = self.client.batch_block_header(heights).map_err(classify)?;
        self.recent = (low..=self.tip_height)
            .zip(headers)
            .map(|(height, header)| (height, (header.block_hash(), header.time)))
            .collect();
        if self.recent.get(&self.tip_height).map(|(h, _)| *h) != Some(self.tip_hash) {
            return Err(ScanError::Transient(
                "the tip moved while reading headers".into(),
            ));
        }
        Ok(())
    }

    /// Follows the newest tip notification: an extension appends, anything else is a reorg.
    fn follow_tip(&mut self) -> Result<(), ScanError> {
        self.client.ping().map_err(classify)?;
        let mut newest = None;
        while let Some(notification) = self.client.block_headers_pop().map_err(classify)? {
            newest = Some(notification);
        }
        let Some(notification) = newest else {
            return Ok(());
        };
        let (height, hash) = (notification.height as u64, notification.header.block_hash());
        if hash == self.tip_hash {
            return Ok(());
        }
        let extends = height > self.tip_height && {
            let heights: Vec<u32> = (self.tip_height + 1..=height)
                .map(height_u32)
                .collect::<Result<_, _>>()?;
            let headers = self.client.batch_block_header(heights).map_err(classify)?;
            let links = headers
                .iter()
                .try_fold(self.tip_hash, |parent, header: &Header| {
                    (header.prev_blockhash == parent).then(|| header.block_hash())
                });
            if links == Some(hash) {
                for (h, header) in (self.tip_height + 1..).zip(&headers) {
                    self.recent.insert(h, (header.block_hash(), header.time));
                }
                true
            } else {
                false
            }
        };
        let old_tip = self.tip_height;
        self.tip_height = height;
        self.tip_hash = hash;
        if extends {
            let keep_from = height.saturating_sub(KEPT_CHECKPOINTS);
            self.recent = self.recent.split_off(&keep_from);
        } else {
            let before = std::mem::take(&mut self.recent);
            self.reload_recent()?;
            let fork = before
                .iter()
                .rev()
                .find(|(h, (hash, _))| self.recent.get(h).map(|(x, _)| x) == Some(hash))
                .map(|(h, _)| *h);
            tracing::warn!(old_tip, new_tip = height, fork = ?fork, "chain reorganisation: reading every history again");
            self.block_times.clear();
            self.reorged = true;
        }
        Ok(())
    }

    /// Subscribes new keys, drops keys no longer watched, and returns the scripts whose
    /// history must be read.
    fn sync_subscriptions(
        &mut self,
        settings: &ElectrumSettings,
        keys: &WatchKeys,
    ) -> Result<Vec<ScriptBuf>, ScanError> {
        let changes = self.index.sync(keys, script_pubkey).map_err(|(key, e)| {
            ScanError::Fatal(format!("watch key {key:?} is not a segwit address: {e}"))
        })?;
        for (script, _) in changes.removed {
            // Servers before protocol 1.4.2 cannot unsubscribe; their notifications are ignored.
            if let Err(e) = self.client.script_unsubscribe(&script) {
                tracing::debug!(error = %e, "unsubscribe refused");
            }
            self.scripts.remove(&script);
        }
        let mut to_read = Vec::new();
        let fresh: Vec<(ScriptBuf, String)> = changes
            .added
            .into_iter()
            .filter(|(s, _)| !self.scripts.contains_key(s))
            .map(|(s, k)| (s, k.to_string()))
            .collect();
        for chunk in fresh.chunks(settings.batch_size.max(1)) {
            let statuses = self
                .client
                .batch_script_subscribe(chunk.iter().map(|(s, _)| s.as_script()))
                .map_err(classify)?;
            for ((script, key), status) in chunk.iter().zip(statuses) {
                let history = match status {
                    Some(_) => {
                        to_read.push(script.clone());
                        None
                    }
                    None => Some(Vec::new()),
                };
                self.scripts.insert(
                    script.clone(),
                    Watched {
                        key: key.clone(),
                        history,
                    },
                );
            }
        }
        let reread_all = std::mem::take(&mut self.reorged);
        for (script, watched) in &self.scripts {
            let mut changed = false;
            while self.client.script_pop(script).map_err(classify)?.is_some() {
                changed = true;
            }
            if (changed || reread_all) && watched.history.is_some() {
                to_read.push(script.clone());
            }
        }
        Ok(to_read)
    }

    /// What the server says of each transfer: its place in its address's history, and the
    /// output at its position in the transaction the server answers (which must hash to its
    /// id), in the block whose header the server serves at that height.
    fn attest(
        &mut self,
        settings: &ElectrumSettings,
        transfers: &[KnownTransfer],
    ) -> Result<Vec<Attestation>, ScanError> {
        let method = settings.target.method();
        let mut answers = Vec::with_capacity(transfers.len());
        for chunk in transfers.chunks(settings.batch_size.max(1)) {
            let scripts = chunk
                .iter()
                .map(|k| {
                    script_pubkey(&k.transfer.to_address).map_err(|e| {
                        ScanError::Fatal(format!(
                            "{} is not a segwit address: {e}",
                            k.transfer.to_address
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let histories = self.histories(&scripts)?;
            for (known, history) in chunk.iter().zip(histories) {
                let reported = &known.transfer;
                let Some(entry) = history
                    .iter()
                    .find(|h| h.tx_hash.to_string() == reported.id.txid)
                else {
                    answers.push(Attestation::Missing(
                        "the address's history there lacks it".into(),
                    ));
                    continue;
                };
                let height = u64::try_from(entry.height).ok().filter(|h| *h > 0);
                if height.is_some_and(|h| h > self.tip_height) {
                    answers.push(Attestation::Behind {
                        head: self.tip_height,
                    });
                    continue;
                }
                let parts = self.parts(&entry.tx_hash)?;
                let found = usize::try_from(reported.id.position)
                    .ok()
                    .and_then(|vout| parts.outputs.get(vout))
                    .map(|(out_script, value)| {
                        output_as_transfer(reported, method, out_script, Amount::from(*value))
                    });
                let (block, confirmations) = self.placed(height)?;
                answers.push(Attestation::of_found(
                    reported,
                    found.as_ref(),
                    block,
                    confirmations,
                ));
            }
        }
        Ok(answers)
    }

    /// What `txid` paid `script`, from the script's history: `None` when the history lacks it.
    fn paid_to(&mut self, txid: &str, script: &ScriptBuf) -> Result<Option<Paid>, ScanError> {
        let history = self
            .histories(std::slice::from_ref(script))?
            .pop()
            .unwrap_or_default();
        let Some(entry) = history.into_iter().find(|h| h.tx_hash.to_string() == txid) else {
            return Ok(None);
        };
        let parts = self.parts(&entry.tx_hash)?;
        let paid: u64 = parts
            .outputs
            .iter()
            .filter(|(out_script, _)| out_script == script)
            .map(|(_, value)| value)
            .sum();
        // A height past the tip this session knows is a block it has not seen: not yet mined.
        let height = u64::try_from(entry.height)
            .ok()
            .filter(|h| *h > 0 && *h <= self.tip_height);
        let (block, confirmations) = self.placed(height)?;
        Ok(Some(Paid {
            amount: Amount::from(paid),
            block,
            confirmations,
        }))
    }

    /// The inputs and outputs of `txid` as the server answers it (it must hash to its id).
    fn parts(&mut self, txid: &Txid) -> Result<TxParts, ScanError> {
        let raw = self
            .client
            .batch_transaction_get_raw([txid])
            .map_err(classify)?;
        let raw = raw
            .first()
            .ok_or_else(|| ScanError::Fatal(format!("the server answered nothing for {txid}")))?;
        parts_of(txid, raw)?.into_parts()
    }

    /// `txids` whole, each hashing to its id, Litecoin's MWEB parts left out.
    fn whole_transactions(&mut self, txids: &[Txid]) -> Result<Vec<Transaction>, ScanError> {
        let mut found = Vec::with_capacity(txids.len());
        for chunk in txids.chunks(TRANSACTIONS_PER_BATCH) {
            let raws = self
                .client
                .batch_transaction_get_raw(chunk)
                .map_err(classify)?;
            for (txid, raw) in chunk.iter().zip(&raws) {
                found.push(canonical_transaction(txid, raw)?);
            }
        }
        Ok(found)
    }

    /// The block at `height` and its depth below this session's tip; `(None, 0)` unmined.
    fn placed(&mut self, height: Option<u64>) -> Result<(Option<BlockId>, u32), ScanError> {
        let Some(height) = height else {
            return Ok((None, 0));
        };
        let hash = self
            .client
            .block_header(height_u32(height)? as usize)
            .map_err(classify)?
            .block_hash();
        let depth = self.tip_height - height + 1;
        Ok((
            Some(BlockId {
                height,
                hash: hash.to_string(),
            }),
            u32::try_from(depth).unwrap_or(u32::MAX),
        ))
    }

    /// The last block before `until_ms` (the tip when none is that late), found by halving
    /// the heights on block times, and what each address held there: the outputs paying it in
    /// its history up to that block, less those spent in it.
    fn balances_at(
        &mut self,
        settings: &ElectrumSettings,
        addresses: &[String],
        until_ms: i64,
    ) -> Result<(BlockId, Vec<Amount>), ScanError> {
        let time_ms = |session: &mut Session, height: u64| -> Result<i64, ScanError> {
            let header = session
                .client
                .block_header(height_u32(height)? as usize)
                .map_err(classify)?;
            Ok(i64::from(header.time) * 1000)
        };
        // Every answer is ready when asked for: the blocking client has already waited.
        let tip = self.tip_height;
        let end = {
            let search = std::pin::pin!(blocks::last_block_before(tip, until_ms, |height| {
                std::future::ready(time_ms(self, height).map(Some))
            }));
            let waker = std::task::Waker::noop();
            match search.poll(&mut std::task::Context::from_waker(waker)) {
                std::task::Poll::Ready(end) => end?,
                std::task::Poll::Pending => {
                    return Err(ScanError::Fatal("a block search waited on nothing".into()));
                }
            }
        };
        let hash = self
            .client
            .block_header(height_u32(end)? as usize)
            .map_err(classify)?
            .block_hash();
        let mut balances = Vec::with_capacity(addresses.len());
        for chunk in addresses.chunks(settings.batch_size.max(1)) {
            let scripts = chunk
                .iter()
                .map(|a| {
                    script_pubkey(a)
                        .map_err(|e| ScanError::Fatal(format!("{a} is not a segwit address: {e}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            for (script, history) in scripts.iter().zip(self.histories(&scripts)?) {
                let mined: Vec<Txid> = history
                    .iter()
                    .filter(|h| {
                        u64::try_from(h.height).is_ok_and(|height| height > 0 && height <= end)
                    })
                    .map(|h| h.tx_hash)
                    .collect();
                let mut parts = Vec::with_capacity(mined.len());
                for txids in mined.chunks(TRANSACTIONS_PER_BATCH) {
                    let raws = self
                        .client
                        .batch_transaction_get_raw(txids)
                        .map_err(classify)?;
                    for (txid, raw) in txids.iter().zip(raws) {
                        parts.push((txid.to_string(), parts_of(txid, &raw)?.into_parts()?));
                    }
                }
                let spent: HashSet<(&str, u32)> = parts
                    .iter()
                    .flat_map(|(_, p)| p.inputs.iter().flatten())
                    .map(|(txid, vout)| (txid.as_str(), *vout))
                    .collect();
                let mut balance: u64 = 0;
                for (txid, tx) in &parts {
                    for (vout, (out_script, value)) in tx.outputs.iter().enumerate() {
                        let vout = u32::try_from(vout).unwrap_or(u32::MAX);
                        if out_script == script && !spent.contains(&(txid.as_str(), vout)) {
                            balance = balance.saturating_add(*value);
                        }
                    }
                }
                balances.push(Amount::from(balance));
            }
        }
        Ok((
            BlockId {
                height: end,
                hash: hash.to_string(),
            },
            balances,
        ))
    }

    /// The histories of `scripts`, one per script, in one batch.
    fn histories(
        &mut self,
        scripts: &[ScriptBuf],
    ) -> Result<Vec<Vec<electrum_client::GetHistoryRes>>, ScanError> {
        let histories = self
            .client
            .batch_script_get_history(scripts.iter().map(|s| s.as_script()))
            .map_err(classify)?;
        if histories.len() != scripts.len() {
            return Err(ScanError::Fatal(format!(
                "asked for {} histories, the server answered {}",
                scripts.len(),
                histories.len()
            )));
        }
        Ok(histories)
    }

    fn read_histories(
        &mut self,
        settings: &ElectrumSettings,
        scripts: &[ScriptBuf],
    ) -> Result<(), ScanError> {
        for chunk in scripts.chunks(settings.batch_size.max(1)) {
            for (script, history) in chunk.iter().zip(self.histories(chunk)?) {
                if let Some(watched) = self.scripts.get_mut(script) {
                    watched.history =
                        Some(history.into_iter().map(|h| (h.tx_hash, h.height)).collect());
                }
            }
        }
        Ok(())
    }

    /// Fetches the transactions not read yet, checking each hashes to its id.
    fn read_transactions(&mut self) -> Result<(), ScanError> {
        let referenced: HashSet<Txid> = self
            .scripts
            .values()
            .flat_map(|w| w.history.iter().flatten().map(|(txid, _)| *txid))
            .collect();
        self.transactions
            .retain(|txid, _| referenced.contains(txid));
        let missing: Vec<Txid> = referenced
            .into_iter()
            .filter(|txid| !self.transactions.contains_key(txid))
            .collect();
        for chunk in missing.chunks(TRANSACTIONS_PER_BATCH) {
            let raws = self
                .client
                .batch_transaction_get_raw(chunk)
                .map_err(classify)?;
            if raws.len() != chunk.len() {
                return Err(ScanError::Fatal(format!(
                    "asked for {} transactions, the server answered {}",
                    chunk.len(),
                    raws.len()
                )));
            }
            for (txid, raw) in chunk.iter().zip(raws) {
                self.transactions.insert(*txid, parts_of(txid, &raw)?);
            }
        }
        Ok(())
    }

    /// The time of the block at `height`, from memory or the server.
    fn block_times_for(&mut self, heights: &HashSet<u64>) -> Result<(), ScanError> {
        let missing: Vec<u64> = heights
            .iter()
            .copied()
            .filter(|h| !self.recent.contains_key(h) && !self.block_times.contains_key(h))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let asked: Vec<u32> = missing
            .iter()
            .copied()
            .map(height_u32)
            .collect::<Result<_, _>>()?;
        let headers = self.client.batch_block_header(asked).map_err(classify)?;
        for (height, header) in missing.into_iter().zip(headers) {
            self.block_times.insert(height, header.time);
        }
        while self.block_times.len() > KEPT_BLOCK_TIMES {
            self.block_times.pop_first();
        }
        Ok(())
    }

    fn block_time_ms(&self, height: u64) -> Option<i64> {
        self.recent
            .get(&height)
            .map(|(_, time)| *time)
            .or_else(|| self.block_times.get(&height).copied())
            .map(|time| i64::from(time) * 1000)
    }

    fn scan(
        &mut self,
        settings: &ElectrumSettings,
        view: &WatchView,
    ) -> Result<ScanBatch, ScanError> {
        self.follow_tip()?;
        let to_read = self.sync_subscriptions(settings, &view.watch_keys)?;
        self.read_histories(settings, &to_read)?;
        self.read_transactions()?;
        tracing::debug!(
            tip = self.tip_height,
            followed = self.scripts.len(),
            read = to_read.len(),
            "scan"
        );

        let network = settings.network_id();
        let method = settings.target.method();
        let known = &view.known;
        let (found, unreadable) = self.receipts(network)?;
        let new_heights: HashSet<u64> = found
            .iter()
            .filter(|r| !known.contains_key(&r.id))
            .filter_map(|r| r.block_height)
            .collect();
        self.block_times_for(&new_heights)?;

        let tip_height = found
            .iter()
            .filter_map(|r| r.block_height)
            .fold(self.tip_height, u64::max);
        let mut events = Vec::new();
        let mut present = HashSet::new();
        let mut received = HeldOutputs::default();
        for receipt in &found {
            received.insert(&receipt.id.txid, receipt.id.position, receipt.value);
        }
        for receipt in found {
            let confirmations = receipt.confirmations(tip_height);
            let Receipt {
                id,
                key,
                value,
                block_height,
                ..
            } = receipt;
            let previous = known.get(&id);
            let changed = match previous {
                None => true,
                Some(k) => {
                    k.block_height != block_height
                        || (k.confirmations != confirmations && k.confirmations < view.settle_depth)
                }
            };
            if changed {
                let seen_at_ms = match (previous, block_height) {
                    (Some(k), _) => k.seen_at_ms,
                    (None, Some(h)) => self
                        .block_time_ms(h)
                        .map_or(view.now_ms, |t| t.min(view.now_ms)),
                    (None, None) => view.now_ms,
                };
                events.push(ChainEvent::Observed {
                    transfer: Transfer {
                        id: id.clone(),
                        to_address: key,
                        asset: ReceivedAsset::Method { method },
                        amount: value.into(),
                        from_address: None,
                    },
                    confirmations,
                    block_height,
                    seen_at_ms,
                    tip_height,
                });
            }
            present.insert(id);
        }
        let followed = self.followed_keys();
        // A transfer recorded from a transaction that cannot be read now is not gone.
        let quarantined: HashSet<&str> = unreadable.iter().map(|u| u.txid.as_str()).collect();
        for gone in view.known.values().filter(|k| {
            followed.contains(k.transfer.to_address.as_str())
                && !present.contains(&k.transfer.id)
                && !quarantined.contains(k.transfer.id.txid.as_str())
        }) {
            events.push(ChainEvent::Removed {
                id: gone.transfer.id.clone(),
                tip_height,
            });
        }
        let outflows = self.outflow_events(settings, view, &received, tip_height)?;
        Ok(ScanBatch {
            events,
            outflows,
            cursor: self.cursor(),
            more: false,
            head: tip_height,
            unreadable,
            unexplained: Vec::new(),
        })
    }

    /// Every output of a followed history that pays its script, and the transactions of those
    /// histories that cannot be read (quarantined).
    fn receipts(&self, network: Network) -> Result<(Vec<Receipt>, Vec<Unreadable>), ScanError> {
        let mut found = Vec::new();
        let mut unreadable = Vec::new();
        for (script, watched) in &self.scripts {
            for (txid, height) in watched.history.iter().flatten() {
                let parts = match self.transactions.get(txid) {
                    Some(TxRead::Parts(parts)) => parts,
                    Some(TxRead::Unreadable(reason)) => {
                        unreadable.push(Unreadable::new(txid.to_string(), &watched.key, reason));
                        continue;
                    }
                    None => {
                        return Err(ScanError::Transient(format!(
                            "transaction {txid} was not read"
                        )));
                    }
                };
                let pegout = mweb::carries_pegouts(
                    network,
                    parts.outputs.first().map(|(s, _)| s.as_script()),
                );
                for (vout, (out_script, value)) in parts.outputs.iter().enumerate() {
                    if out_script != script {
                        continue;
                    }
                    found.push(Receipt {
                        id: TransferId {
                            network,
                            txid: txid.to_string(),
                            position: u32::try_from(vout).map_err(|_| {
                                ScanError::Fatal(format!("transaction {txid} has too many outputs"))
                            })?,
                        },
                        key: watched.key.clone(),
                        value: *value,
                        block_height: u64::try_from(*height).ok().filter(|h| *h > 0),
                        pegout,
                    });
                }
            }
        }
        Ok((found, unreadable))
    }

    /// Outflows in the followed histories: each mined transaction's inputs that spend a held
    /// output (or one received in this scan), and the removal of a known outflow from a
    /// followed address whose transaction left every history.
    fn outflow_events(
        &self,
        settings: &ElectrumSettings,
        view: &WatchView,
        received: &HeldOutputs,
        tip_height: u64,
    ) -> Result<Vec<OutflowEvent>, ScanError> {
        let lookup = Lookup {
            held: &view.held,
            received,
            spent: &view.spent,
            network: settings.network_id(),
            method: settings.target.method(),
            hrp: settings.target.hrp(),
        };
        let mut read = HashSet::new();
        let mut present = HashSet::new();
        let mut events = Vec::new();
        for watched in self.scripts.values() {
            for (txid, height) in watched.history.iter().flatten() {
                let Some(height) = u64::try_from(*height).ok().filter(|h| *h > 0) else {
                    continue;
                };
                if !read.insert(*txid) {
                    continue;
                }
                let parts = match self.transactions.get(txid) {
                    Some(TxRead::Parts(parts)) => parts,
                    Some(TxRead::Unreadable(_)) => {
                        // Quarantined: what it spent stays as recorded.
                        let txid = txid.to_string();
                        present.extend(
                            view.known_outflows
                                .keys()
                                .filter(|id| id.txid == txid)
                                .cloned(),
                        );
                        continue;
                    }
                    None => {
                        return Err(ScanError::Transient(format!(
                            "transaction {txid} was not read"
                        )));
                    }
                };
                let txid = txid.to_string();
                let spending = Spending {
                    txid: &txid,
                    inputs: parts.inputs.clone(),
                    outputs: parts
                        .outputs
                        .iter()
                        .map(|(s, v)| (s.as_script(), *v))
                        .collect(),
                };
                for outflow in lookup.outflows(&spending) {
                    let confirmations =
                        u32::try_from(tip_height.saturating_sub(height) + 1).unwrap_or(u32::MAX);
                    let previous = view.known_outflows.get(&outflow.id);
                    present.insert(outflow.id.clone());
                    let changed = previous.is_none_or(|k| {
                        k.block_height != height
                            || (k.confirmations != confirmations
                                && k.confirmations < view.settle_depth)
                    });
                    if changed {
                        let seen_at_ms = previous
                            .map(|k| k.seen_at_ms)
                            .or_else(|| self.block_time_ms(height))
                            .map_or(view.now_ms, |t| t.min(view.now_ms));
                        events.push(OutflowEvent::Sent {
                            outflow,
                            confirmations,
                            block_height: height,
                            seen_at_ms,
                            tip_height,
                        });
                    }
                }
            }
        }
        let followed = self.followed_keys();
        for gone in view.known_outflows.values().filter(|k| {
            followed.contains(k.outflow.from_address.as_str()) && !present.contains(&k.outflow.id)
        }) {
            events.push(OutflowEvent::Removed {
                id: gone.outflow.id.clone(),
                tip_height,
            });
        }
        Ok(events)
    }

    /// The keys whose history was read: what a removal may be judged on.
    fn followed_keys(&self) -> HashSet<&str> {
        self.scripts
            .values()
            .filter(|w| w.history.is_some())
            .map(|w| w.key.as_str())
            .collect()
    }

    fn cursor(&self) -> ChainCursor {
        let block = |height: u64, hash: &BlockHash| BlockId {
            height,
            hash: hash.to_string(),
        };
        ChainCursor {
            tip: block(self.tip_height, &self.tip_hash),
            checkpoints: self
                .recent
                .range(..self.tip_height)
                .map(|(height, (hash, _))| block(*height, hash))
                .collect(),
        }
    }
}

/// An output paying a followed script, as a history lists it.
struct Receipt {
    id: TransferId,
    /// The watch key of the script.
    key: String,
    /// Satoshi.
    value: u64,
    /// `None` while in the mempool.
    block_height: Option<u64>,
    /// An output of a Litecoin HogEx: it counts no confirmations until it matures.
    pegout: bool,
}

impl Receipt {
    /// Its depth below `tip_height`; a peg-out's is 0 until it can be spent.
    fn confirmations(&self, tip_height: u64) -> u32 {
        let depth = self
            .block_height
            .map_or(0, |h| blocks::depth(h, tip_height));
        if self.pegout {
            blocks::until_mature(depth, mweb::PEGOUT_MATURITY)
        } else {
            depth
        }
    }
}

/// What a transaction of a followed history is read for: the outpoints its inputs spend and
/// its outputs (script, value in satoshi).
#[derive(Default)]
struct TxParts {
    inputs: Vec<Option<(String, u32)>>,
    outputs: Vec<(ScriptBuf, u64)>,
}

/// A transaction of a followed history as read.
enum TxRead {
    Parts(TxParts),
    /// Bytes no decoder here understands: quarantined, with why.
    Unreadable(String),
}

impl TxRead {
    /// The parts, where a caller cannot go on without them.
    fn into_parts(self) -> Result<TxParts, ScanError> {
        match self {
            TxRead::Parts(parts) => Ok(parts),
            TxRead::Unreadable(reason) => Err(ScanError::Fatal(reason)),
        }
    }
}

/// The transaction the server answered for `txid`, without Litecoin's MWEB parts: what a
/// PSBT's input carries as the transaction it spends.
fn canonical_transaction(txid: &Txid, raw: &[u8]) -> Result<Transaction, ScanError> {
    let tx = match mweb::decode(raw) {
        Ok(Decoded::Canonical(tx)) => tx,
        Ok(Decoded::MwebOnly) => {
            return Err(ScanError::Fatal(format!(
                "transaction {txid} has no output an ordinary address holds"
            )));
        }
        Err(e) => {
            return Err(ScanError::Fatal(format!(
                "transaction {txid} does not decode: {e}"
            )));
        }
    };
    check_id(txid, &tx)?;
    Ok(tx)
}

/// Refuses a transaction that is not the one asked for: a corrupted or substituted answer.
fn check_id(txid: &Txid, tx: &Transaction) -> Result<(), ScanError> {
    if tx.compute_txid() != *txid {
        return Err(ScanError::Fatal(format!(
            "the server answered transaction {} when asked for {txid}",
            tx.compute_txid()
        )));
    }
    Ok(())
}

/// The parts of the raw transaction the server answered for `txid`, Litecoin's MWEB forms
/// included ([`crate::mweb`]); an MWEB-only transaction has none an ordinary address can see.
/// Bytes that decode must hash to `txid`, so a corrupted or substituted answer is refused
/// rather than read as someone's payment; bytes that do not decode are this one transaction's
/// trouble, quarantined, and never stop the scan.
fn parts_of(txid: &Txid, raw: &[u8]) -> Result<TxRead, ScanError> {
    let tx = match mweb::decode(raw) {
        Ok(Decoded::Canonical(tx)) => tx,
        Ok(Decoded::MwebOnly) => return Ok(TxRead::Parts(TxParts::default())),
        Err(e) => {
            return Ok(TxRead::Unreadable(format!(
                "transaction {txid} does not decode: {e}"
            )));
        }
    };
    check_id(txid, &tx)?;
    Ok(TxRead::Parts(TxParts {
        inputs: tx
            .input
            .iter()
            .map(|input| {
                (!input.previous_output.is_null()).then(|| {
                    (
                        input.previous_output.txid.to_string(),
                        input.previous_output.vout,
                    )
                })
            })
            .collect(),
        outputs: tx
            .output
            .into_iter()
            .map(|out| (out.script_pubkey, out.value.to_sat()))
            .collect(),
    }))
}

fn height_u32(height: u64) -> Result<u32, ScanError> {
    u32::try_from(height)
        .map_err(|_| ScanError::Fatal(format!("block height {height} out of range")))
}

/// Connection trouble is temporary; an answer that does not parse is not.
fn classify(error: ElectrumError) -> ScanError {
    match error {
        ElectrumError::AllAttemptsErrored(errors) if !errors.is_empty() => {
            let last = errors.into_iter().next_back().expect("not empty");
            classify(last)
        }
        // A line cut off by a dropped connection ends in the middle of its JSON: the link
        // failed, not the server.
        ElectrumError::JSON(e) if e.is_eof() => {
            ScanError::Transient(format!("Electrum: an answer was cut off: {e}"))
        }
        ElectrumError::JSON(_)
        | ElectrumError::Hex(_)
        | ElectrumError::Bitcoin(_)
        | ElectrumError::InvalidResponse(_) => {
            ScanError::Fatal(format!("the Electrum server answered garbage: {error}"))
        }
        ElectrumError::InvalidDNSNameError(_) | ElectrumError::MissingDomain => {
            ScanError::Fatal(format!("Electrum URL: {error}"))
        }
        other => ScanError::Transient(format!("Electrum: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use bitcoin::hashes::Hash as _;
    use payrecon_chain_core::bitcoin::{self, Transaction};

    /// A segwit transaction of `outputs`, spending one input with a witness.
    fn transaction(outputs: &[(Vec<u8>, u64)], witness: Vec<Vec<u8>>) -> Transaction {
        use bitcoin::{Amount, OutPoint, Sequence, TxIn, TxOut, Witness, absolute, transaction};
        Transaction {
            version: transaction::Version::TWO,
            lock_time: absolute::LockTime::ZERO,
            input: vec![TxIn {
                previous_output: OutPoint::new(Txid::from_byte_array([3; 32]), 1),
                script_sig: ScriptBuf::new(),
                sequence: Sequence::MAX,
                witness: Witness::from_slice(&witness),
            }],
            output: outputs
                .iter()
                .map(|(script, value)| TxOut {
                    value: Amount::from_sat(*value),
                    script_pubkey: ScriptBuf::from_bytes(script.clone()),
                })
                .collect(),
        }
    }

    fn arbitrary_transaction() -> impl proptest::strategy::Strategy<Value = Transaction> {
        use proptest::prelude::*;
        (
            proptest::collection::vec(
                (proptest::collection::vec(any::<u8>(), 0..40), any::<u64>()),
                1..4,
            ),
            proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..72), 1..3),
        )
            .prop_map(|(outputs, witness)| transaction(&outputs, witness))
    }

    proptest::proptest! {
        #[test]
        fn a_served_transaction_reads_as_its_outputs(tx in arbitrary_transaction()) {
            let raw = bitcoin::consensus::serialize(&tx);
            let outputs = parts_of(&tx.compute_txid(), &raw).and_then(TxRead::into_parts).unwrap().outputs;
            let expected: Vec<(ScriptBuf, u64)> = tx.output.iter().map(|o| (o.script_pubkey.clone(), o.value.to_sat())).collect();
            proptest::prop_assert_eq!(outputs, expected);
        }

        /// One corrupted byte, or bytes cut off or appended: the answer is refused, or (a
        /// witness byte, which the txid does not cover) still reads as exactly the original
        /// outputs. Never a different payment, never a panic.
        #[test]
        fn a_corrupted_transaction_is_refused_or_unchanged(
            tx in arbitrary_transaction(),
            at in proptest::prelude::any::<proptest::sample::Index>(),
            byte in proptest::prelude::any::<u8>(),
            how in 0..3u8,
        ) {
            let mut raw = bitcoin::consensus::serialize(&tx);
            let i = at.index(raw.len());
            match how {
                0 => raw[i] = byte,
                1 => raw.truncate(i),
                _ => raw.insert(i, byte),
            }
            if let Ok(TxParts { outputs, .. }) = parts_of(&tx.compute_txid(), &raw).and_then(TxRead::into_parts) {
                let expected: Vec<(ScriptBuf, u64)> = tx.output.iter().map(|o| (o.script_pubkey.clone(), o.value.to_sat())).collect();
                proptest::prop_assert_eq!(outputs, expected);
            }
        }

        #[test]
        fn any_bytes_are_refused_or_a_transaction(raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = parts_of(&Txid::from_byte_array([0; 32]), &raw);
        }
    }

    #[test]
    fn garbage_is_fatal_and_a_dropped_socket_or_cut_off_answer_is_not() {
        let garbage = ElectrumError::InvalidResponse(serde_json::json!({"x": 1}));
        assert!(matches!(classify(garbage), ScanError::Fatal(_)));
        let not_json = serde_json::from_str::<serde_json::Value>("{\"id\": x}").unwrap_err();
        assert!(matches!(
            classify(ElectrumError::JSON(not_json)),
            ScanError::Fatal(_)
        ));
        let cut_off = serde_json::from_str::<serde_json::Value>("{\"id\": 1, \"res").unwrap_err();
        assert!(matches!(
            classify(ElectrumError::JSON(cut_off)),
            ScanError::Transient(_)
        ));
        let dropped =
            ElectrumError::IOError(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(matches!(
            classify(ElectrumError::AllAttemptsErrored(vec![dropped])),
            ScanError::Transient(_)
        ));
    }
}
