//! A network's watch view kept in memory across rounds.
//!
//! Built once from the store (when the watcher starts, or takes a lease over), then brought in
//! step before each round with only what changed since the last one: intents created and
//! transfers written, read by feed position (`store::feed`), and windows that closed, from an
//! in-memory timetable. A round with a million open intents and nothing new reads nothing but
//! the empty changes and the cursor.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use payrecon_chain_core::{KnownTransfer, Network, Transfer, TransferId, WatchView};

use super::ahead::Ahead;
use crate::engine::Engine;
use crate::error::Error;
use crate::store::feed::{self, FeedRead, WatchedTransfer};
use crate::store::keys::{KeyWindow, UnissuedRow};
use crate::store::outflows::{OutflowRow, OutputState};

/// What [`LiveView::refresh`] read and how long the database took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refresh {
    /// Keys that began to be followed.
    pub keys_added: usize,
    /// Keys whose monitoring window closed.
    pub keys_closed: usize,
    /// Transfers read because they changed.
    pub transfers_read: usize,
    /// Time spent in the database.
    pub database_time: Duration,
}

/// The view, and what it needs to stay in step.
pub struct LiveView {
    network: Network,
    view: WatchView,
    /// Where the next read of changes starts.
    next_from: i64,
    /// When each followed key's monitoring window closes (Unix ms).
    key_windows: BTreeMap<i64, Vec<Arc<str>>>,
    /// When each known transfer's intent's window closes.
    known_windows: BTreeMap<i64, Vec<TransferId>>,
    /// When each known outflow leaves the view: its first sight plus the monitoring window
    /// (later if it is not final by then), as a fresh read would leave it out.
    outflow_windows: BTreeMap<i64, Vec<TransferId>>,
    /// The monitoring window, in milliseconds.
    window_ms: i64,
    /// Held outputs per address (UTXO chains; 1 for an account address holding anything): an
    /// address stays followed while it holds anything, so its outflows are seen however old
    /// its intent.
    held_per_key: HashMap<Arc<str>, u32>,
    /// Receipts and outflows not yet at settle depth, per key: a key stays followed until
    /// they are, however old its intent, so their depth keeps moving and a reorg that takes
    /// them is seen.
    unsettled: HashMap<Arc<str>, HashSet<Tracked>>,
    /// Keys whose window closed and that stay followed only because they hold something or
    /// have something unsettled.
    lingering: HashSet<Arc<str>>,
    /// Unissued addresses followed ahead of each key's counter.
    ahead: Ahead,
}

/// What keeps a key followed until it is final.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Tracked {
    Receipt(TransferId),
    Outflow(TransferId),
}

impl LiveView {
    /// Reads everything `network`'s watcher follows now.
    pub async fn load(engine: &Engine, network: Network) -> Result<LiveView, Error> {
        let now = engine.clock().now();
        let store = engine.db();
        let window = engine.payment_settings().monitoring_window;
        let ahead = match engine.payment_settings().keys.get(&network) {
            Some(keys) => Ahead::new(
                keys.all()
                    .map(|key| (key.key_id.clone(), key.deriver.clone()))
                    .collect(),
                keys.lookahead,
            ),
            None => Ahead::new(Vec::new(), 0),
        };
        let windows = key_windows(engine, network, &ahead).await?;
        let read = feed::read_all(
            store.pool(),
            store.backend(),
            network,
            now.timestamp_millis(),
            (now - window).timestamp_millis(),
            settle_depth(engine, network),
        )
        .await?;
        let mut live = LiveView {
            network,
            view: WatchView {
                settle_depth: settle_depth(engine, network),
                ..WatchView::default()
            },
            next_from: 0,
            key_windows: BTreeMap::new(),
            known_windows: BTreeMap::new(),
            outflow_windows: BTreeMap::new(),
            window_ms: window.num_milliseconds(),
            held_per_key: HashMap::new(),
            unsettled: HashMap::new(),
            lingering: HashSet::new(),
            ahead,
        };
        live.apply(read, now);
        live.ahead.place(&windows, &mut live.view.watch_keys);
        Ok(live)
    }

    /// Brings the view in step: what changed since the last read, and windows closed by now.
    pub async fn refresh(&mut self, engine: &Engine) -> Result<Refresh, Error> {
        let now = engine.clock().now();
        let store = engine.db();
        let started = Instant::now();
        // Counters before changes: an intent that moved a counter is then in the changes, and
        // its address passes from the window to it without a round unwatched.
        let windows = key_windows(engine, self.network, &self.ahead).await?;
        let read =
            feed::read_changes(store.pool(), store.backend(), self.network, self.next_from).await?;
        let database_time = started.elapsed();
        let transfers_read = read.transfers.len();
        let (keys_added, keys_closed) = self.apply(read, now);
        let (ahead_added, ahead_dropped) = self.ahead.place(&windows, &mut self.view.watch_keys);
        let (keys_added, keys_closed) = (keys_added + ahead_added, keys_closed + ahead_dropped);
        Ok(Refresh {
            keys_added,
            keys_closed,
            transfers_read,
            database_time,
        })
    }

    /// The view for the next scan.
    pub fn view(&self) -> &WatchView {
        &self.view
    }

    /// Watch keys followed only because they lie ahead of a key's counter (what the benchmark
    /// weighs).
    #[cfg(feature = "test-utils")]
    pub fn lookahead_keys(&self) -> usize {
        self.ahead.len()
    }

    /// The key id and index of `watch_key`, when it is followed only because it lies ahead of
    /// its key's counter.
    pub(crate) fn lookahead_owner(&self, watch_key: &str) -> Option<(String, u32)> {
        self.ahead.owner(watch_key)
    }

    /// Whether a key of the network waits for the look past the counters of a restored
    /// database.
    pub(crate) fn restore_pending(&self) -> bool {
        self.ahead.restore_pending()
    }

    /// The receipts of a scan's `events` paid to addresses ahead of their key's counter.
    pub(crate) fn unissued(&self, events: &[payrecon_chain_core::ChainEvent]) -> Vec<UnissuedRow> {
        self.ahead.unissued(self.network, events)
    }

    /// Applies a read; returns how many keys began to be followed and how many windows closed.
    fn apply(&mut self, read: FeedRead, now: DateTime<Utc>) -> (usize, usize) {
        let now_ms = now.timestamp_millis();
        let mut keys_added = 0;
        for key in read.keys {
            if key.monitor_until_ms <= now_ms {
                continue;
            }
            // An address the look-ahead followed passes to its intent.
            let from_window = self.ahead.disown(&key.watch_key);
            if !from_window && self.view.watch_keys.contains(&key.watch_key) {
                continue;
            }
            self.view.keys_since_ms = Some(
                self.view
                    .keys_since_ms
                    .map_or(key.created_at_ms, |since| since.min(key.created_at_ms)),
            );
            let key_handle: Arc<str> = Arc::from(key.watch_key);
            self.view.watch_keys.insert_shared(key_handle.clone());
            keys_added += 1;
            self.key_windows
                .entry(key.monitor_until_ms)
                .or_default()
                .push(key_handle);
        }
        for watched in read.transfers {
            self.track_receipt(watched, now_ms);
        }
        for output in read.outputs {
            self.hold(output);
        }
        for (address, holds) in read.holders {
            let key: Arc<str> = Arc::from(address);
            if holds {
                if self.held_per_key.insert(key.clone(), 1).is_none() {
                    self.follow(key);
                }
            } else if self.held_per_key.remove(&key).is_some() {
                self.release(&key);
            }
        }
        // Removals first: after a reorg, another outflow may spend the same output.
        let mut outflows = read.outflows;
        outflows.sort_by_key(|row| !row.removed);
        for row in outflows {
            self.track_outflow(row, now_ms);
        }
        let keys_closed = self.close_windows(now_ms);
        self.view.cursor = read.cursor;
        self.view.now_ms = now_ms;
        self.next_from = read.next_from;
        (keys_added, keys_closed)
    }
}

impl LiveView {
    /// Applies the windows that closed by `now_ms`; returns how many keys stopped being
    /// followed. Receipts first: one whose window closes unsettled keeps its key followed.
    fn close_windows(&mut self, now_ms: i64) -> usize {
        let depth = self.view.settle_depth;
        for id in due(&mut self.known_windows, now_ms) {
            if self
                .view
                .known
                .get(&id)
                .is_some_and(|k| k.confirmations >= depth)
            {
                self.view.known.remove(&id);
            }
        }
        for id in due(&mut self.outflow_windows, now_ms) {
            if self
                .view
                .known_outflows
                .get(&id)
                .is_some_and(|k| k.confirmations >= depth)
            {
                self.forget_outflow(&id);
            }
        }
        let mut keys_closed = 0;
        for key in due(&mut self.key_windows, now_ms) {
            if self.held_per_key.contains_key(&key) || self.unsettled.contains_key(&key) {
                self.lingering.insert(key);
            } else if self.view.watch_keys.remove(&key) {
                keys_closed += 1;
            }
        }
        keys_closed
    }

    /// Brings one receipt's state in step. A matched receipt is diffed against while its
    /// intent's window is open and, past it, until it is settle-depth deep: a payment seen in
    /// the window's last minute, or a gas top-up to an address followed because it holds
    /// something, must still reach the depth that books it.
    fn track_receipt(&mut self, watched: WatchedTransfer, now_ms: i64) {
        let WatchedTransfer {
            transfer,
            watch_key,
            monitor_until_ms,
        } = watched;
        let key = watch_key.as_deref();
        let tracked = Tracked::Receipt(transfer.id.clone());
        let open_until = monitor_until_ms.filter(|until| *until > now_ms);
        let settled = transfer.confirmations >= self.view.settle_depth;
        let followed =
            !transfer.removed && transfer.intent_id.is_some() && (open_until.is_some() || !settled);
        if !followed {
            self.view.known.remove(&transfer.id);
            self.settled(key, &tracked);
            return;
        }
        if let Some(until) = open_until
            && !self.view.known.contains_key(&transfer.id)
        {
            self.known_windows
                .entry(until)
                .or_default()
                .push(transfer.id.clone());
        }
        if settled {
            self.settled(key, &tracked);
        } else {
            self.unsettled(key, tracked);
        }
        self.view.known.insert(
            transfer.id.clone(),
            KnownTransfer {
                transfer: Transfer {
                    id: transfer.id,
                    to_address: transfer.to_address,
                    asset: transfer.asset,
                    amount: transfer.amount,
                    from_address: transfer.from_address,
                },
                confirmations: transfer.confirmations,
                block_height: transfer.block_height,
                tip_height: transfer.tip_height,
                seen_at_ms: transfer.seen_at_ms,
            },
        );
    }

    /// Brings one outflow's state in step: known until removed, or until it is final and its
    /// monitoring window has passed; its key followed until it is final; on UTXO chains the
    /// output it spent kept for lookups while it is known.
    fn track_outflow(&mut self, row: OutflowRow, now_ms: i64) {
        // Solana's outflows leave the merchant's one recipient, which its scanner always
        // reads; elsewhere they leave a watched address, followed until they are final.
        let key = (self.network != Network::Solana).then_some(row.outflow.from_address.as_str());
        let tracked = Tracked::Outflow(row.outflow.id.clone());
        let is_final = row.confirmations >= self.view.settle_depth;
        let until = row.seen_at_ms.saturating_add(self.window_ms);
        if row.removed || (is_final && until <= now_ms) {
            self.forget_outflow(&row.outflow.id);
            self.settled(key, &tracked);
            return;
        }
        if is_final {
            self.settled(key, &tracked);
        } else {
            self.unsettled(key, tracked);
        }
        if let Some(spent) = &row.outflow.spends
            && let Ok(value) =
                u64::try_from(row.outflow.amount.base_units() + row.outflow.fee.base_units())
        {
            self.view.spent.insert(&spent.txid, spent.position, value);
        }
        if !self.view.known_outflows.contains_key(&row.outflow.id) {
            self.outflow_windows
                .entry(until)
                .or_default()
                .push(row.outflow.id.clone());
        }
        self.view
            .known_outflows
            .insert(row.outflow.id.clone(), row.known());
    }

    /// Drops a known outflow, and the output it spent from the lookups.
    fn forget_outflow(&mut self, id: &TransferId) {
        if let Some(known) = self.view.known_outflows.remove(id)
            && let Some(spent) = known.outflow.spends
        {
            self.view.spent.remove(&spent.txid, spent.position);
        }
    }

    /// `tracked` is not final yet: its key stays followed until it is.
    fn unsettled(&mut self, key: Option<&str>, tracked: Tracked) {
        let Some(key) = key else { return };
        let key: Arc<str> = Arc::from(key);
        self.unsettled
            .entry(key.clone())
            .or_default()
            .insert(tracked);
        self.follow(key);
    }

    /// `tracked` is final (or gone): its key no longer needs following for it.
    fn settled(&mut self, key: Option<&str>, tracked: &Tracked) {
        let Some(key) = key else { return };
        if let Some(pending) = self.unsettled.get_mut(key)
            && pending.remove(tracked)
            && pending.is_empty()
        {
            self.unsettled.remove(key);
            self.release(key);
        }
    }

    /// Brings one output's held state in step, and with it whether its address is followed.
    fn hold(&mut self, output: OutputState) {
        let key: Arc<str> = Arc::from(output.address.as_str());
        if output.held {
            if self
                .view
                .held
                .insert(&output.txid, output.vout, output.value)
            {
                let count = self.held_per_key.entry(key.clone()).or_default();
                *count += 1;
                if *count == 1 {
                    self.follow(key);
                }
            }
        } else if self.view.held.remove(&output.txid, output.vout)
            && let Some(count) = self.held_per_key.get_mut(&key)
        {
            *count -= 1;
            if *count == 0 {
                self.held_per_key.remove(&key);
                self.release(&key);
            }
        }
    }

    /// `key` holds or awaits something: it stays followed however old its intent.
    fn follow(&mut self, key: Arc<str>) {
        if self.ahead.disown(&key) {
            self.lingering.insert(key);
        } else if !self.view.watch_keys.contains(&key) {
            self.view.watch_keys.insert_shared(key.clone());
            self.lingering.insert(key);
        }
    }

    /// `key` may need following no more: past its window, it is dropped once it holds nothing
    /// and nothing of it is unsettled.
    fn release(&mut self, key: &str) {
        if !self.held_per_key.contains_key(key)
            && !self.unsettled.contains_key(key)
            && self.lingering.remove(key)
        {
            self.view.watch_keys.remove(key);
        }
    }
}

/// Takes the entries of `timetable` due by `now_ms` out of it.
fn due<T>(timetable: &mut BTreeMap<i64, Vec<T>>, now_ms: i64) -> impl Iterator<Item = T> + use<T> {
    let later = timetable.split_off(&(now_ms + 1));
    std::mem::replace(timetable, later).into_values().flatten()
}

/// Where each of `ahead`'s keys' windows lie now; the skipped indexes of money found ahead of
/// a counter stay watched for a monitoring window.
async fn key_windows(
    engine: &Engine,
    network: Network,
    ahead: &Ahead,
) -> Result<HashMap<String, KeyWindow>, Error> {
    let key_ids = ahead.key_ids();
    if key_ids.is_empty() {
        return Ok(HashMap::new());
    }
    let since = engine.clock().now() - engine.payment_settings().monitoring_window;
    let mut conn = engine.db().pool().acquire().await?;
    Ok(crate::store::keys::windows(
        &mut conn,
        network.as_str(),
        &key_ids,
        since.timestamp_millis(),
    )
    .await?)
}

/// Confirmations beyond which the matcher needs no more depth updates on `network`.
fn settle_depth(engine: &Engine, network: Network) -> u32 {
    engine
        .payment_settings()
        .policy
        .confirmations
        .get(&network)
        .map_or(1, |rule| rule.deepest())
}
