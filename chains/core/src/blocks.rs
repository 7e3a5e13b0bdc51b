//! Scanning an account chain block by block (Ethereum, Tron): rejoining the chain after the
//! committed cursor, checking that each block extends the one before it, and turning what a
//! range of blocks carried into events by diffing it against what the engine recorded.
//!
//! The chain crates only fetch and decode; the bookkeeping that decides what is new, what
//! moved deeper and what a reorg took away lives here once.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;

use crate::{
    BlockId, ChainCursor, ChainEvent, Outflow, OutflowEvent, ScanBatch, ScanError, Transfer,
    TransferId, Unexplained, Unreadable, WatchView,
};

/// Recent block ids kept in the cursor for finding a fork point.
pub const KEPT_CHECKPOINTS: usize = 64;

/// For chains whose block times follow a slot clock (Ethereum, Tron), how far the engine's
/// clock may run ahead of the chain's when [`start_height`] looks for a key's first block.
pub const SLOT_CLOCK_SLACK_MS: i64 = 15 * 60 * 1000;

/// Where a block scan continues, and the blocks below it that are still on the chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resume {
    /// The first block to read.
    pub from: u64,
    /// Canonical blocks below `from`, oldest first; the last one is `from - 1`.
    pub checkpoints: Vec<BlockId>,
}

/// Finds where to continue: after the cursor if its block is still on the chain, else after
/// the highest checkpoint that is (a reorg), else — without a cursor — at `start`.
///
/// `hash_at(height)` answers the canonical block hash at a height, `None` if there is none.
pub async fn resume<F, Fut>(
    cursor: Option<&ChainCursor>,
    start: u64,
    mut hash_at: F,
) -> Result<Resume, ScanError>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<Option<String>, ScanError>>,
{
    let Some(cursor) = cursor else {
        // The block below the first one read anchors the parent-hash check.
        let from = start.max(1);
        let anchor = from - 1;
        let hash = hash_at(anchor)
            .await?
            .ok_or_else(|| not_served_yet(anchor))?;
        return Ok(Resume {
            from,
            checkpoints: vec![BlockId {
                height: anchor,
                hash,
            }],
        });
    };
    let mut chain: Vec<BlockId> = cursor.checkpoints.clone();
    chain.push(cursor.tip.clone());
    for kept in (0..chain.len()).rev() {
        if hash_at(chain[kept].height).await?.as_deref() == Some(chain[kept].hash.as_str()) {
            if kept + 1 < chain.len() {
                tracing::warn!(
                    fork = chain[kept].height,
                    old_tip = cursor.tip.height,
                    "chain reorganisation: scanning again from the fork point"
                );
            }
            chain.truncate(kept + 1);
            return Ok(Resume {
                from: chain[kept].height + 1,
                checkpoints: chain,
            });
        }
    }
    Err(ScanError::Fatal(format!(
        "none of the last {} blocks processed is on the chain any more: a reorg deeper than the cursor remembers",
        chain.len()
    )))
}

/// Where a scan with no cursor yet begins: the configured height if there is one; else the
/// first block whose time is at least `slack_ms` before the earliest watch key was handed
/// out; else, with no keys to miss, the head. With a cursor the scan resumes there and this
/// answers the head without asking the chain anything.
///
/// Starting at the head would lose every payment confirmed between handing out an address
/// and the watcher's first successful contact with its node (a node down when the shop
/// started). `slack_ms` covers how far a block's time may trail the moment it was mined on
/// the chain, and the skew between the engine's clock and the chain's. `time_at(height)`
/// answers a canonical block's time in Unix milliseconds, `None` if there is none. Block times
/// are searched by bisection, `log2(head)` requests, once per network.
pub async fn start_height<F, Fut>(
    configured: Option<u64>,
    view: &WatchView,
    head: u64,
    slack_ms: i64,
    time_at: F,
) -> Result<u64, ScanError>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<Option<i64>, ScanError>>,
{
    let since_ms = match (configured, &view.cursor, view.keys_since_ms) {
        (Some(height), _, _) => return Ok(height),
        (None, None, Some(since_ms)) => since_ms.saturating_sub(slack_ms),
        _ => return Ok(head),
    };
    Ok(first_block_at_or_after(head, since_ms, time_at)
        .await?
        .unwrap_or(head))
}

/// The last block before `until_ms` on a chain whose newest block is `head` (the head itself
/// when no block is that late yet): a period's end block. `time_at(height)` answers a
/// canonical block's time in Unix milliseconds. Block times may run a little out of order
/// (Bitcoin's median-time rule); the search finds a block whose time is before `until_ms`
/// with the next one's not (block 0 when even its is not), `log2(head)` requests.
pub async fn last_block_before<F, Fut>(
    head: u64,
    until_ms: i64,
    time_at: F,
) -> Result<u64, ScanError>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<Option<i64>, ScanError>>,
{
    Ok(
        match first_block_at_or_after(head, until_ms, time_at).await? {
            None => head,
            Some(first) => first.saturating_sub(1),
        },
    )
}

/// The first block whose time is at least `ms`, by bisection; `None` when even the head's is
/// earlier.
async fn first_block_at_or_after<F, Fut>(
    head: u64,
    ms: i64,
    mut time_at: F,
) -> Result<Option<u64>, ScanError>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<Option<i64>, ScanError>>,
{
    let mut time_at = |height| {
        let time = time_at(height);
        async move { time.await?.ok_or_else(|| not_served_yet(height)) }
    };
    if time_at(head).await? < ms {
        return Ok(None);
    }
    // The first block at or after `ms` lies in `low..=high`.
    let (mut low, mut high) = (0, head);
    while low < high {
        let middle = low + (high - low) / 2;
        if time_at(middle).await? < ms {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    Ok(Some(low))
}

/// A block at or below the head the node reported that it does not answer for: the scan is
/// repeated later, never skips it.
fn not_served_yet(height: u64) -> ScanError {
    ScanError::Transient(format!("block {height} is not served yet"))
}

/// The confirmations of a block at `height` with the chain at `tip`.
pub fn depth(height: u64, tip: u64) -> u32 {
    u32::try_from(tip.saturating_sub(height) + 1).unwrap_or(u32::MAX)
}

/// The confirmations of a receipt `depth` deep that its chain keeps unspendable until it is
/// `maturity` deep (a Litecoin peg-out): none before, its depth after.
pub fn until_mature(depth: u32, maturity: u32) -> u32 {
    if depth < maturity { 0 } else { depth }
}

/// The confirmations of a block on a chain with its own finality (Ethereum's `finalized`
/// tag, Tron's solidified head): 1 until `final_height` covers it, then at least
/// `settle_depth`. Without a final height it is the depth.
pub fn confirmations(height: u64, tip: u64, final_height: Option<u64>, settle_depth: u32) -> u32 {
    let depth = depth(height, tip);
    match final_height {
        None => depth,
        Some(last_final) if height <= last_final => depth.max(settle_depth),
        Some(_) => depth.min(settle_depth.saturating_sub(1)).max(1),
    }
}

struct ReadBlock {
    hash: String,
    time_ms: i64,
}

/// The blocks one scan read, in order, and the transfers to watched keys they carry.
pub struct BlockRange {
    resume: Resume,
    blocks: BTreeMap<u64, ReadBlock>,
    found: Vec<(Transfer, u64)>,
    outflows: Vec<(Outflow, u64)>,
    unreadable: Vec<Unreadable>,
    unexplained: Vec<Unexplained>,
    /// The receipts the chain's consensus keeps unspendable until [`BlockRange::maturity`]
    /// deep (Litecoin's peg-outs), and that depth.
    maturing: HashSet<TransferId>,
    maturity: u32,
}

impl BlockRange {
    /// An empty range starting where `resume` says.
    pub fn new(resume: Resume) -> BlockRange {
        BlockRange {
            resume,
            blocks: BTreeMap::new(),
            found: Vec::new(),
            outflows: Vec::new(),
            unreadable: Vec::new(),
            unexplained: Vec::new(),
            maturing: HashSet::new(),
            maturity: 0,
        }
    }

    /// Receipts pushed with [`BlockRange::push_maturing_transfer`] count no confirmations
    /// until they are `maturity` deep: the coin cannot be spent before, so it is not paid
    /// before. Reported in a block at zero confirmations meanwhile, which is also how a
    /// later scan, which no longer reads that block, recognises one.
    pub fn with_maturity(mut self, maturity: u32) -> BlockRange {
        self.maturity = maturity;
        self
    }

    /// The first block to read.
    pub fn from(&self) -> u64 {
        self.resume.from
    }

    /// The next block to read.
    pub fn next_height(&self) -> u64 {
        self.blocks
            .last_key_value()
            .map_or(self.resume.from, |(height, _)| height + 1)
    }

    /// Adds the next block, refusing one that does not extend the block before it: the chain
    /// moved during the scan (or the server answered out of order) and the scan is repeated.
    pub fn push_block(
        &mut self,
        height: u64,
        hash: String,
        parent: &str,
        time_ms: i64,
    ) -> Result<(), ScanError> {
        let expected = self.next_height();
        if height != expected {
            return Err(ScanError::Transient(format!(
                "asked for block {expected}, got block {height}"
            )));
        }
        let previous = self
            .blocks
            .last_key_value()
            .map(|(_, block)| block.hash.as_str())
            .or_else(|| self.resume.checkpoints.last().map(|b| b.hash.as_str()));
        if let Some(previous) = previous
            && previous != parent
        {
            return Err(ScanError::Transient(format!(
                "block {height} does not extend the block before it: the chain moved during the scan"
            )));
        }
        self.blocks.insert(height, ReadBlock { hash, time_ms });
        Ok(())
    }

    /// The hash of a block read in this scan.
    pub fn hash_of(&self, height: u64) -> Option<&str> {
        self.blocks.get(&height).map(|b| b.hash.as_str())
    }

    /// Records a transfer to a watched key carried by a block already read.
    pub fn push_transfer(&mut self, transfer: Transfer, height: u64) -> Result<(), ScanError> {
        if !self.blocks.contains_key(&height) {
            return Err(ScanError::Fatal(format!(
                "transfer {} placed in block {height}, which this scan did not read",
                transfer.id
            )));
        }
        self.found.push((transfer, height));
        Ok(())
    }

    /// Records a receipt that matures at the range's maturity ([`BlockRange::with_maturity`]).
    pub fn push_maturing_transfer(
        &mut self,
        transfer: Transfer,
        height: u64,
    ) -> Result<(), ScanError> {
        self.maturing.insert(transfer.id.clone());
        self.push_transfer(transfer, height)
    }

    /// Quarantines a transaction of the range that touches a watched address and cannot be
    /// read: the scan goes on without it.
    pub fn push_unreadable(&mut self, unreadable: Unreadable) {
        self.unreadable.push(unreadable);
    }

    /// Records a balance change of a watched address that no transaction explains.
    pub fn push_unexplained(&mut self, unexplained: Unexplained) {
        self.unexplained.push(unexplained);
    }

    /// The blocks read so far, by height, with their hashes.
    pub fn blocks(&self) -> impl Iterator<Item = (u64, &str)> {
        self.blocks
            .iter()
            .map(|(height, block)| (*height, block.hash.as_str()))
    }

    /// Records value leaving a watched address in a block already read.
    pub fn push_outflow(&mut self, outflow: Outflow, height: u64) -> Result<(), ScanError> {
        if !self.blocks.contains_key(&height) {
            return Err(ScanError::Fatal(format!(
                "outflow {} placed in block {height}, which this scan did not read",
                outflow.id
            )));
        }
        self.outflows.push((outflow, height));
        Ok(())
    }

    /// The scan's events and cursor. `confirmations(height, tip)` states how final a block is
    /// (its depth, or the chain's own finality); `head` is the node's head, to say whether
    /// more is waiting.
    pub fn into_batch(
        self,
        view: &WatchView,
        head: u64,
        confirmations: impl Fn(u64, u64) -> u32,
    ) -> ScanBatch {
        let from = self.resume.from;
        let tip = self.next_height() - 1;
        // The matcher keeps the observation with the highest tip and ignores older ones. Right
        // after a reorg the rescanned range may end below the tip already committed, yet what
        // it finds is newer: report it at least at the committed tip.
        let report_tip = view
            .cursor
            .as_ref()
            .map_or(tip, |cursor| tip.max(cursor.tip.height));
        let diff = Diff {
            blocks: &self.blocks,
            from,
            tip,
            head,
            now_ms: view.now_ms,
            settle_depth: view.settle_depth,
            confirmations: &confirmations,
        };
        let maturing = Maturing {
            ids: Some(&self.maturing),
            depth: self.maturity,
        };
        let events = diff
            .changes(
                self.found,
                &view.known,
                |t| &t.id,
                |k| (&k.transfer, k.block_height, k.confirmations, k.seen_at_ms),
                &maturing,
            )
            .into_iter()
            .map(|change| match change {
                Change::Seen {
                    item,
                    confirmations,
                    height,
                    seen_at_ms,
                } => ChainEvent::Observed {
                    transfer: item,
                    confirmations,
                    block_height: Some(height),
                    seen_at_ms,
                    tip_height: report_tip,
                },
                Change::Gone(id) => ChainEvent::Removed {
                    id,
                    tip_height: report_tip,
                },
            })
            .collect();
        let outflows = diff
            .changes(
                self.outflows,
                &view.known_outflows,
                |o| &o.id,
                |k| {
                    (
                        &k.outflow,
                        Some(k.block_height),
                        k.confirmations,
                        k.seen_at_ms,
                    )
                },
                &Maturing::NONE,
            )
            .into_iter()
            .map(|change| match change {
                Change::Seen {
                    item,
                    confirmations,
                    height,
                    seen_at_ms,
                } => OutflowEvent::Sent {
                    outflow: item,
                    confirmations,
                    block_height: height,
                    seen_at_ms,
                    tip_height: report_tip,
                },
                Change::Gone(id) => OutflowEvent::Removed {
                    id,
                    tip_height: report_tip,
                },
            })
            .collect();

        let mut checkpoints = self.resume.checkpoints;
        checkpoints.extend(self.blocks.into_iter().map(|(height, block)| BlockId {
            height,
            hash: block.hash,
        }));
        let tip_block = checkpoints
            .pop()
            .expect("a resume point always holds the block below the range");
        let keep_from = checkpoints.len().saturating_sub(KEPT_CHECKPOINTS);
        ScanBatch {
            events,
            outflows,
            cursor: ChainCursor {
                tip: tip_block,
                checkpoints: checkpoints.split_off(keep_from),
            },
            more: tip < head,
            head,
            unreadable: self.unreadable,
            unexplained: self.unexplained,
        }
    }
}

/// What changed about one tracked item (a receipt or an outflow) since the engine recorded it.
enum Change<T> {
    /// New, in another block, or deeper than recorded.
    Seen {
        item: T,
        confirmations: u32,
        height: u64,
        seen_at_ms: i64,
    },
    /// A reorg took it out.
    Gone(TransferId),
}

/// Which items count no confirmations until `depth` deep: those in `ids`, found in this range,
/// and known ones recorded in a block at zero confirmations (nothing else is: a block gives
/// what it carries at least one).
struct Maturing<'a> {
    ids: Option<&'a HashSet<TransferId>>,
    depth: u32,
}

impl Maturing<'_> {
    const NONE: Maturing<'static> = Maturing {
        ids: None,
        depth: 0,
    };

    fn contains(&self, id: &TransferId) -> bool {
        self.ids.is_some_and(|ids| ids.contains(id))
    }

    fn confirmations(&self, maturing: bool, depth: u32) -> u32 {
        if maturing {
            until_mature(depth, self.depth)
        } else {
            depth
        }
    }
}

/// The range a scan read, against which receipts and outflows are diffed alike.
struct Diff<'a, C> {
    blocks: &'a BTreeMap<u64, ReadBlock>,
    from: u64,
    tip: u64,
    head: u64,
    now_ms: i64,
    settle_depth: u32,
    confirmations: &'a C,
}

impl<C: Fn(u64, u64) -> u32> Diff<'_, C> {
    /// `found` in this range against `known`: what is new or moved, and what a reorg took.
    /// `prior` reads a known item's recorded state: the item, its block, confirmations and
    /// first sight.
    fn changes<T: Clone, K>(
        &self,
        found: Vec<(T, u64)>,
        known: &BTreeMap<TransferId, K>,
        id: impl Fn(&T) -> &TransferId,
        prior: impl Fn(&K) -> (&T, Option<u64>, u32, i64),
        maturing: &Maturing<'_>,
    ) -> Vec<Change<T>> {
        let needs_update =
            |recorded: u32, now: u32| recorded != now && recorded < self.settle_depth;
        let mut changes = Vec::new();
        let mut present = HashSet::new();
        for (item, height) in found {
            let now = maturing.confirmations(
                maturing.contains(id(&item)),
                (self.confirmations)(height, self.tip),
            );
            let previous = known.get(id(&item)).map(&prior);
            let seen_at_ms = match previous {
                Some((_, _, _, seen_at_ms)) => seen_at_ms,
                None => self.blocks[&height].time_ms.min(self.now_ms),
            };
            let changed = previous.is_none_or(|(_, block, recorded, _)| {
                block != Some(height) || needs_update(recorded, now)
            });
            present.insert(id(&item).clone());
            if changed {
                changes.push(Change::Seen {
                    item,
                    confirmations: now,
                    height,
                    seen_at_ms,
                });
            }
        }
        for (key, recorded) in known {
            if present.contains(key) {
                continue;
            }
            let (item, block, confirmations, seen_at_ms) = prior(recorded);
            match block {
                // Read again and not found, or above the tip of a chain read to its end: a
                // reorg took it.
                Some(height)
                    if height >= self.from && (height <= self.tip || self.tip >= self.head) =>
                {
                    changes.push(Change::Gone(key.clone()));
                }
                // Below the range and still canonical: only its depth moved.
                Some(height) if height < self.from => {
                    let now = maturing
                        .confirmations(confirmations == 0, (self.confirmations)(height, self.tip));
                    if needs_update(confirmations, now) {
                        changes.push(Change::Seen {
                            item: item.clone(),
                            confirmations: now,
                            height,
                            seen_at_ms,
                        });
                    }
                }
                _ => {}
            }
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Amount, KnownTransfer, Method, Network, ReceivedAsset, TransferId};

    fn transfer(txid: &str) -> Transfer {
        Transfer {
            id: TransferId {
                network: Network::Tron,
                txid: txid.into(),
                position: 0,
            },
            to_address: "T-watched".into(),
            asset: ReceivedAsset::Method {
                method: Method::Trx,
            },
            amount: Amount::from_base_units(5),
            from_address: None,
        }
    }

    fn block(height: u64) -> String {
        format!("h{height}")
    }

    fn range_from(from: u64) -> BlockRange {
        BlockRange::new(Resume {
            from,
            checkpoints: vec![BlockId {
                height: from - 1,
                hash: block(from - 1),
            }],
        })
    }

    /// Runs `start_height` over blocks with these times (block `n` at `times[n]`), counting
    /// the blocks asked for.
    async fn start_over(
        times: &[i64],
        configured: Option<u64>,
        view: &WatchView,
        slack_ms: i64,
    ) -> (u64, usize) {
        let asked = std::cell::Cell::new(0);
        let head = times.len() as u64 - 1;
        let start = start_height(configured, view, head, slack_ms, |height| {
            asked.set(asked.get() + 1);
            std::future::ready(Ok(Some(times[height as usize])))
        })
        .await
        .unwrap();
        (start, asked.get())
    }

    fn keys_since(ms: i64) -> WatchView {
        WatchView {
            keys_since_ms: Some(ms),
            ..WatchView::default()
        }
    }

    #[tokio::test]
    async fn a_first_scan_starts_at_the_block_of_the_earliest_key_less_the_slack() {
        let times: Vec<i64> = (0..1000).map(|n| n * 600).collect();
        for (since, slack, expected) in [
            (300_000, 0, 500),
            (300_001, 0, 501),
            (300_000, 7_200, 488),
            (0, 7_200, 0),
            (599_400, 0, 999),
            (10_000_000, 0, 999),
        ] {
            let (start, asked) = start_over(&times, None, &keys_since(since), slack).await;
            assert_eq!(start, expected, "since {since}, slack {slack}");
            assert!(asked <= 12, "{asked} blocks asked for");
        }
    }

    #[tokio::test]
    async fn a_configured_start_a_cursor_or_no_keys_ask_the_chain_nothing() {
        let times: Vec<i64> = (0..100).collect();
        assert_eq!(start_over(&times, Some(7), &keys_since(3), 0).await, (7, 0));
        assert_eq!(
            start_over(&times, None, &WatchView::default(), 0).await,
            (99, 0)
        );
        let resumed = WatchView {
            cursor: Some(ChainCursor {
                tip: BlockId {
                    height: 50,
                    hash: block(50),
                },
                checkpoints: Vec::new(),
            }),
            ..keys_since(3)
        };
        assert_eq!(start_over(&times, None, &resumed, 0).await, (99, 0));
    }

    #[tokio::test]
    async fn keys_newer_than_the_head_start_at_the_head_after_one_question() {
        let times: Vec<i64> = (0..100).collect();
        assert_eq!(
            start_over(&times, None, &keys_since(1_000), 0).await,
            (99, 1)
        );
    }

    #[test]
    fn blocks_must_come_in_order_and_extend_each_other() {
        let mut range = range_from(10);
        assert!(range.push_block(11, block(11), &block(10), 0).is_err());
        assert!(range.push_block(10, block(10), "elsewhere", 0).is_err());
        range.push_block(10, block(10), &block(9), 0).unwrap();
        assert!(
            range.push_block(10, block(10), &block(9), 0).is_err(),
            "served twice"
        );
        range.push_block(11, block(11), &block(10), 0).unwrap();
        assert!(range.push_transfer(transfer("a"), 12).is_err());
    }

    #[test]
    fn new_deeper_and_vanished_transfers_become_events() {
        let mut range = range_from(10);
        for height in 10..=12 {
            range
                .push_block(height, block(height), &block(height - 1), 1_000)
                .unwrap();
        }
        range.push_transfer(transfer("new"), 11).unwrap();
        let known = |txid: &str, height: u64, confirmations: u32| KnownTransfer {
            transfer: transfer(txid),
            confirmations,
            block_height: Some(height),
            tip_height: 9,
            seen_at_ms: 7,
        };
        let view = WatchView {
            known: [
                known("deeper", 8, 2),
                known("reorged", 10, 1),
                known("settled", 5, 9),
            ]
            .into_iter()
            .map(|k| (k.transfer.id.clone(), k))
            .collect(),
            now_ms: 500,
            settle_depth: 3,
            ..WatchView::default()
        };
        let batch = range.into_batch(&view, 20, depth);
        assert!(batch.more);
        assert_eq!(
            batch.cursor.tip,
            BlockId {
                height: 12,
                hash: block(12)
            }
        );
        assert_eq!(batch.cursor.checkpoints.len(), 3);
        let summary: Vec<String> = batch
            .events
            .iter()
            .map(|event| match event {
                ChainEvent::Observed {
                    transfer,
                    confirmations,
                    block_height,
                    seen_at_ms,
                    ..
                } => format!(
                    "{} {confirmations} {block_height:?} {seen_at_ms}",
                    transfer.id.txid
                ),
                ChainEvent::Removed { id, .. } => format!("{} removed", id.txid),
            })
            .collect();
        assert_eq!(
            summary,
            [
                "new 2 Some(11) 500",
                "deeper 5 Some(8) 7",
                "reorged removed"
            ]
        );
    }

    #[test]
    fn a_maturing_receipt_counts_no_confirmation_until_it_matures() {
        let mut range = range_from(10).with_maturity(6);
        for height in 10..=12 {
            range
                .push_block(height, block(height), &block(height - 1), 1_000)
                .unwrap();
        }
        range
            .push_maturing_transfer(transfer("pegout"), 11)
            .unwrap();
        range.push_transfer(transfer("plain"), 11).unwrap();
        // Recorded in block 5 at zero confirmations: a maturing receipt that is 8 deep now;
        // one in block 8 is 5 deep and stays at zero.
        let known = |txid: &str, height: u64| {
            let k = KnownTransfer {
                transfer: transfer(txid),
                confirmations: 0,
                block_height: Some(height),
                tip_height: 9,
                seen_at_ms: 7,
            };
            (k.transfer.id.clone(), k)
        };
        let view = WatchView {
            known: [known("matured", 5), known("young", 8)]
                .into_iter()
                .collect(),
            settle_depth: 6,
            ..WatchView::default()
        };
        let batch = range.into_batch(&view, 12, depth);
        let summary: Vec<(String, u32)> = batch
            .events
            .iter()
            .filter_map(|event| match event {
                ChainEvent::Observed {
                    transfer,
                    confirmations,
                    ..
                } => Some((transfer.id.txid.clone(), *confirmations)),
                ChainEvent::Removed { .. } => None,
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("pegout".to_owned(), 0),
                ("plain".to_owned(), 2),
                ("matured".to_owned(), 8)
            ]
        );
    }
}
