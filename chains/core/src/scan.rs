//! The contract between a chain's scanner and the engine's watcher loop.
//!
//! A scanner is stateless as far as money goes: each call gets what the engine has committed
//! (the keys to follow, the transfers it already knows, its cursor) and answers with events
//! and the cursor to commit with them. Because every scan is diffed against the database and
//! not against the scanner's memory, a scan whose events were lost (crash, failed commit) is
//! simply repeated, and a restarted scanner finds exactly what is missing.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;

use crate::{
    Amount, BlockId, ChainCursor, ChainEvent, Method, Network, Outflow, OutflowEvent,
    ReceivedAsset, SecretUrl, Transfer, TransferId, WatchKeys,
};

/// A transfer the engine has recorded and not seen removed, with its newest state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownTransfer {
    /// The transfer.
    pub transfer: Transfer,
    /// Confirmations at the newest observation (0 = unconfirmed).
    pub confirmations: u32,
    /// The block it was in at the newest observation; `None` while unconfirmed.
    pub block_height: Option<u64>,
    /// The tip height of that observation.
    pub tip_height: u64,
    /// When it was first seen, Unix milliseconds.
    pub seen_at_ms: i64,
}

/// An outflow the engine has recorded and not seen removed, with its newest state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownOutflow {
    /// The outflow.
    pub outflow: Outflow,
    /// Confirmations at the newest observation.
    pub confirmations: u32,
    /// Its block.
    pub block_height: u64,
    /// The tip height of that observation.
    pub tip_height: u64,
    /// Its block's time, Unix milliseconds.
    pub seen_at_ms: i64,
}

/// The outputs received on watched addresses (UTXO chains) and not yet spent, with their
/// values: what a scanner looks each input up in to find outflows. Compact on purpose, as a
/// shop collects millions: 36 bytes of outpoint and 8 of value each, 49 bytes a slot with
/// the table's control byte; a million outputs take 98 MiB (`payrecon bench node-scale`: the
/// table grows to 2^21 slots past 917,504 entries).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldOutputs {
    outputs: HashMap<([u8; 32], u32), u64>,
}

impl HeldOutputs {
    /// Holds `txid:vout` worth `value`; a txid that is not 64 hex digits is ignored (it cannot
    /// be a UTXO chain's).
    /// Returns whether it was not held before.
    pub fn insert(&mut self, txid: &str, vout: u32, value: u64) -> bool {
        outpoint(txid, vout).is_some_and(|key| self.outputs.insert(key, value).is_none())
    }

    /// Forgets `txid:vout` (spent, or its receipt removed); returns whether it was held.
    pub fn remove(&mut self, txid: &str, vout: u32) -> bool {
        outpoint(txid, vout).is_some_and(|key| self.outputs.remove(&key).is_some())
    }

    /// The value of `txid:vout` when it is held.
    pub fn get(&self, txid: &str, vout: u32) -> Option<u64> {
        outpoint(txid, vout).and_then(|key| self.outputs.get(&key).copied())
    }

    /// How many outputs are held.
    pub fn len(&self) -> usize {
        self.outputs.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }
}

/// The 32 bytes of a transaction id as its explorers print it, and the output index.
fn outpoint(txid: &str, vout: u32) -> Option<([u8; 32], u32)> {
    use bitcoin::hex::FromHex;
    <[u8; 32]>::from_hex(txid).ok().map(|bytes| (bytes, vout))
}

/// What the engine hands a scanner for one scan. The engine keeps it in memory and brings it
/// in step with what changed before each scan; scanners keep indexes of the keys in step with
/// [`WatchKeys`]' change log ([`crate::KeyIndex`]).
#[derive(Clone, Debug, Default)]
pub struct WatchView {
    /// Watch keys to follow now: open intents, those inside their monitoring window, and older
    /// ones that still hold something or await a receipt's or an outflow's final depth.
    pub watch_keys: WatchKeys,
    /// Transfers already recorded to those keys, not removed: inside their intent's window,
    /// or past it until they are `settle_depth` deep.
    pub known: BTreeMap<TransferId, KnownTransfer>,
    /// Where the last committed scan ended.
    pub cursor: Option<ChainCursor>,
    /// When the earliest key followed since the view was built was handed out, Unix
    /// milliseconds (a key whose window closed since still counts: earlier is safe). A block
    /// scanner with no cursor starts no later than the block of that time, so a payment
    /// confirmed before the watcher first reached its node is still found.
    pub keys_since_ms: Option<i64>,
    /// The engine's clock, Unix milliseconds: the time of a transfer first seen unconfirmed.
    pub now_ms: i64,
    /// Confirmations beyond which the matcher needs no more updates of a transfer's depth.
    /// Removals are still reported at any depth.
    pub settle_depth: u32,
    /// Outputs received on watched addresses and not spent (UTXO chains), however old their
    /// intent: a scanner that follows outflows reports each input spending one.
    pub held: HeldOutputs,
    /// Outputs spent by the known outflows (UTXO chains), with their values: a scan looks
    /// inputs up here too, so a spend that a reorg moved to another block is found there
    /// rather than taken for gone.
    pub spent: HeldOutputs,
    /// Outflows already recorded and not removed, for their depth and a reorg's removals.
    pub known_outflows: BTreeMap<TransferId, KnownOutflow>,
}

/// A transaction that touches a watched address and that the scanner cannot read (a form
/// its decoder does not know, a field out of range): quarantined as an exception for
/// operators, while the watcher goes on with everything else. Only what makes the whole chain
/// view untrustworthy (another chain, a broken header, a cursor that cannot be placed) stops a
/// watcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unreadable {
    /// The transaction, as the chain's explorers print it.
    pub txid: String,
    /// The watched address (or reference key) it touches; empty when the part that would name
    /// it is what cannot be read.
    pub address: String,
    /// Why, in at most a few hundred bytes ([`crate::excerpt`]).
    pub reason: String,
}

impl Unreadable {
    /// `txid` touching `address`, unreadable for `reason` (cut to an excerpt).
    pub fn new(txid: impl Into<String>, address: impl Into<String>, reason: &str) -> Unreadable {
        Unreadable {
            txid: txid.into(),
            address: address.into(),
            reason: crate::excerpt(reason).into_owned(),
        }
    }
}

/// Money that came to or left a watched address in a block, and that no transaction the
/// scanner could read explains (ETH from a block reward or a withdrawal, or moved inside a call
/// on a node that serves no traces): an exception for operators naming address and block,
/// never a credit, as nobody can say whose payment it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unexplained {
    /// The watched address.
    pub address: String,
    /// What it is measured in.
    pub method: Method,
    /// The block whose balances differ.
    pub block: BlockId,
    /// Whether the unexplained amount arrived (else it left).
    pub arrived: bool,
    /// How much, in the method's base units.
    pub amount: Amount,
    /// Why no transaction explains it, in at most a few hundred bytes.
    pub reason: String,
}

/// What one transaction paid one address, as a source reads it: a refund checked before the
/// books say it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paid {
    /// All its outputs (or transfers) to the address, of the asset asked about, in base units.
    pub amount: Amount,
    /// The block that carries it; `None` while it waits in the mempool.
    pub block: Option<BlockId>,
    /// Its depth, as a scan would report it (0 in the mempool).
    pub confirmations: u32,
}

/// What a source says, on its own, about a transfer another source reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attestation {
    /// It holds the same transfer (address, asset, amount), successful, this deep: in `block`
    /// once mined (`None` while in the mempool).
    Holds {
        /// The block that carries it, as this source has it.
        block: Option<BlockId>,
        /// Its confirmations on this source.
        confirmations: u32,
    },
    /// Its newest block is below the one the transfer was reported in: ask again later.
    Behind {
        /// Its newest block's height.
        head: u64,
    },
    /// It knows no such transaction, or holds it failed: why, in a few words.
    Missing(String),
    /// It holds the transaction, but it does not pay what was reported: what it pays instead.
    Differs(String),
}

impl Attestation {
    /// The confirmations it holds the transfer at; `None` when it does not hold it.
    pub fn confirmations(&self) -> Option<u32> {
        match self {
            Attestation::Holds { confirmations, .. } => Some(*confirmations),
            Attestation::Behind { .. } | Attestation::Missing(_) | Attestation::Differs(_) => None,
        }
    }

    /// `Holds` when `found` is the reported transfer (same id, address, asset, amount), else
    /// `Differs` naming what `found` pays; `Missing` when the transaction pays nothing there.
    pub fn of_found(
        reported: &Transfer,
        found: Option<&Transfer>,
        block: Option<BlockId>,
        confirmations: u32,
    ) -> Attestation {
        match found {
            None => Attestation::Missing(format!(
                "transaction {} pays nothing at position {}",
                reported.id.txid, reported.id.position
            )),
            Some(found)
                if found.id == reported.id
                    && found.to_address == reported.to_address
                    && found.asset == reported.asset
                    && found.amount == reported.amount =>
            {
                Attestation::Holds {
                    block,
                    confirmations,
                }
            }
            Some(found) => Attestation::Differs(format!(
                "it pays {} base units of {} to {}",
                found.amount, found.asset, found.to_address
            )),
        }
    }
}

/// What one scan found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanBatch {
    /// New or changed observations and removals, to apply in one transaction.
    pub events: Vec<ChainEvent>,
    /// New or changed outflows and their removals, applied in the same transaction.
    pub outflows: Vec<OutflowEvent>,
    /// The cursor to commit with them.
    pub cursor: ChainCursor,
    /// The scanner is behind and has more to do right away (do not wait before the next scan).
    pub more: bool,
    /// The node's newest block (or slot) at this scan: operators see how far the cursor lags.
    pub head: u64,
    /// Transactions touching watched addresses that could not be read: quarantined, each an
    /// exception for operators, in the same transaction as the events.
    pub unreadable: Vec<Unreadable>,
    /// Balance changes of watched addresses no transaction explains: each an exception.
    pub unexplained: Vec<Unexplained>,
}

/// What moving money out of one address costs on an account chain, in its native coin's base
/// units, at the node's prices when asked: each chain knows its own fee model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweepFees {
    /// Sending one token balance out (an ERC-20 or TRC-20 `transfer`).
    pub per_token: Amount,
    /// Sending the native coin out.
    pub native: Amount,
    /// How they were figured, for people: the prices and the units each sweep takes.
    pub basis: String,
}

/// Why a scan failed, which decides what the watcher loop does next.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    /// The node or server is unreachable, slow or refused for now: reconnect and retry with
    /// backoff. Nothing was skipped.
    #[error("temporary failure: {0}")]
    Transient(String),
    /// The node or server answered something that cannot be trusted (garbage, a transaction
    /// that does not hash to its id): this network's watcher stops, and tries again after a
    /// long pause, for a node that answers garbage today may be mended tomorrow.
    #[error("refusing the chain data source: {0}")]
    Fatal(String),
    /// The node or server serves another chain than the configured one (its genesis block or
    /// chain id): watching it is worse than not watching, so this watcher stays stopped until
    /// an operator changes the configuration.
    #[error("refusing the chain data source: it serves the wrong chain: {0}")]
    WrongChain(String),
}

/// How the errors of [`ScanError::incomplete`] begin.
const INCOMPLETE: &str = "the source answered incompletely";

impl ScanError {
    /// An answer about a block that leaves out part of it (a log query that misses what the
    /// block's bloom holds, fewer receipts than transactions): the scan fails transiently, so
    /// its cursor stays until the source answers whole.
    pub fn incomplete(what: impl std::fmt::Display) -> ScanError {
        ScanError::Transient(format!(
            "{INCOMPLETE}: {what}; the cursor stays until it answers whole"
        ))
    }

    /// Whether this is [`ScanError::incomplete`].
    pub fn is_incomplete(&self) -> bool {
        matches!(self, ScanError::Transient(reason) if reason.starts_with(INCOMPLETE))
    }

    /// The same error with `source`'s credentials taken out of its text (an HTTP client's
    /// error names the URL it failed to reach, key and all): what every caller does before an
    /// error is logged, stored or answered.
    ///
    /// Its text is also cut to 1 KiB (`MAX_ERROR_BYTES`), so no answer a scanner quoted whole
    /// floods the log, the watcher health or the operators' view.
    pub fn scrubbed(self, source: &SecretUrl) -> ScanError {
        let clean = |reason: String| {
            crate::excerpt::excerpt_within(&source.scrub(&reason), crate::excerpt::MAX_ERROR_BYTES)
                .into_owned()
        };
        match self {
            ScanError::Transient(reason) => ScanError::Transient(clean(reason)),
            ScanError::Fatal(reason) => ScanError::Fatal(clean(reason)),
            ScanError::WrongChain(reason) => ScanError::WrongChain(clean(reason)),
        }
    }
}

/// What a source says about itself, for `payrecon doctor`: that it serves the configured chain
/// (checked as a scan checks it), its newest block, and what the chain's configuration depends
/// on (token contracts, a recipient account).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// The newest block's height (Solana: slot).
    pub tip_height: u64,
    /// The newest block's time, Unix milliseconds, where the source tells it.
    pub tip_time_ms: Option<i64>,
    /// The node says it is still catching up with its network.
    pub syncing: bool,
    /// Each thing the configuration names, checked against the chain.
    pub findings: Vec<Finding>,
}

/// One configured thing checked against the chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The method it matters to.
    pub method: Method,
    /// What was checked (`USDT contract 0x…`).
    pub what: String,
    /// What the chain holds there, or what is wrong with it.
    pub outcome: Result<String, String>,
    /// Whether payments are lost or stall without it (a failure of `payrecon doctor`), rather
    /// than only handled less well (a warning).
    pub essential: bool,
}

/// A chain's scanner, driven by the engine's watcher loop.
pub trait ChainScanner: Send {
    /// The network it scans.
    fn network(&self) -> Network;

    /// Where it reads the chain: the watcher takes its credentials out of every error text
    /// before that text is logged or stored.
    fn source(&self) -> &SecretUrl;

    /// One scan: find what changed since the view's known state.
    fn scan(
        &mut self,
        view: &WatchView,
    ) -> impl Future<Output = Result<ScanBatch, ScanError>> + Send;

    /// Drops connections and session state after a failure; the next scan starts afresh.
    fn reset(&mut self);

    /// Looks recorded transfers up again on this source, on its own: per transfer, whether it
    /// holds the same transaction paying the same address the same amount of the same asset,
    /// in which block and how deep (as a scan with `settle_depth` would report it). What a
    /// witness answers before a receipt is credited, and the finance audit's recheck.
    /// Watchers never call it on their own source.
    fn attest(
        &mut self,
        transfers: &[KnownTransfer],
        settle_depth: u32,
    ) -> impl Future<Output = Result<Vec<Attestation>, ScanError>> + Send;

    /// What transaction `txid` paid `to_address` of `asset`, where and how deep; `None` when
    /// the source knows no such transaction (never sent, or taken out by a reorg). A refund is
    /// sent and completed on this answer, and an operator's refund txid is checked with it.
    /// `seen_at` is a block the caller saw it in, for a source without a transaction index.
    fn paid_to(
        &mut self,
        txid: &str,
        to_address: &str,
        asset: &ReceivedAsset,
        seen_at: Option<u64>,
    ) -> impl Future<Output = Result<Option<Paid>, ScanError>> + Send {
        let _ = (txid, to_address, asset, seen_at);
        async {
            Err(ScanError::Fatal(
                "this source cannot look a transaction up by its id".into(),
            ))
        }
    }

    /// What each address held of its method's asset at the last block before `until_ms` (the
    /// tip when no block is that late yet), and that block: finance's check of the holdings at
    /// a period's end. Watchers never call it. A source that cannot look back says so.
    fn balances_at(
        &mut self,
        holdings: &[(String, Method)],
        until_ms: i64,
    ) -> impl Future<Output = Result<(BlockId, Vec<Amount>), ScanError>> + Send {
        let _ = (holdings, until_ms);
        async {
            Err(ScanError::Fatal(
                "this source cannot tell an address's balance at a past block".into(),
            ))
        }
    }

    /// What each address held of its method's asset at the block at `height` (the height a
    /// watcher's cursor reached), and that block: the holdings check, which compares the
    /// chain with what payrecon read up to exactly there. Batched: one request per few hundred
    /// addresses. A source that cannot read balances at a given block says so.
    fn balances_at_height(
        &mut self,
        holdings: &[(String, Method)],
        height: u64,
    ) -> impl Future<Output = Result<(BlockId, Vec<Amount>), ScanError>> + Send {
        let _ = (holdings, height);
        async {
            Err(ScanError::Fatal(
                "this source cannot tell balances at a given block".into(),
            ))
        }
    }

    /// Connects as a scan does (the chain checked), and reads the tip and what the chain's
    /// configuration depends on: `payrecon doctor`. Watchers never call it.
    fn probe(&mut self) -> impl Future<Output = Result<Probe, ScanError>> + Send;

    /// What sweeping an address costs now, at the node's prices: the sweep list's fees.
    /// Chains whose wallets collect by themselves (the Bitcoin family) say so.
    fn sweep_fees(&mut self) -> impl Future<Output = Result<SweepFees, ScanError>> + Send {
        async {
            Err(ScanError::Fatal(
                "this chain has no per-address sweep to price".into(),
            ))
        }
    }

    /// Answers this scanner found incomplete since it was made (a log query that left out what
    /// the block's bloom holds, receipts missing): watcher health and `/metrics` show how often
    /// a source answers so.
    fn incomplete_answers(&self) -> u64 {
        0
    }

    /// Resolves when the node pushes news worth scanning before the next poll (a new head on a
    /// subscription). Polling stays the safety net: a scanner without a push channel never
    /// resolves, and a lost subscription only costs latency.
    fn news(&mut self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Method, ReceivedAsset};

    fn transfer(amount: u64, to: &str) -> Transfer {
        Transfer {
            id: TransferId {
                network: Network::Ethereum,
                txid: "0xab".into(),
                position: 0,
            },
            to_address: to.into(),
            asset: ReceivedAsset::Method {
                method: Method::Eth,
            },
            amount: Amount::from(amount),
            from_address: Some("0xsender".into()),
        }
    }

    #[test]
    fn an_attestation_holds_only_the_same_transfer() {
        let reported = transfer(5, "0xshop");
        let block = BlockId {
            height: 7,
            hash: "0x07".into(),
        };
        // The sender is not compared: sources name it alike or not at all.
        let mut same = transfer(5, "0xshop");
        same.from_address = None;
        assert_eq!(
            Attestation::of_found(&reported, Some(&same), Some(block.clone()), 3),
            Attestation::Holds {
                block: Some(block.clone()),
                confirmations: 3
            }
        );
        let less = Attestation::of_found(&reported, Some(&transfer(4, "0xshop")), None, 3);
        assert!(
            matches!(&less, Attestation::Differs(what) if what.contains("4 base units")),
            "{less:?}"
        );
        let elsewhere = Attestation::of_found(&reported, Some(&transfer(5, "0xother")), None, 3);
        assert!(
            matches!(&elsewhere, Attestation::Differs(what) if what.contains("0xother")),
            "{elsewhere:?}"
        );
        let nothing = Attestation::of_found(&reported, None, None, 3);
        assert!(matches!(nothing, Attestation::Missing(_)));
        assert_eq!(nothing.confirmations(), None);
    }
}
