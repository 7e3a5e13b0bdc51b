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

use crate::engine::Engine;
use crate::error::Error;
use crate::store::feed::{self, FeedRead, WatchedTransfer};
use crate::store::outflows::OutputState;

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
    /// Held outputs per address (UTXO chains; 1 for an account address holding anything): an
    /// address stays followed while it holds anything, so its outflows are seen however old
    /// its intent.
    held_per_key: HashMap<Arc<str>, u32>,
    /// Keys whose window closed and that stay followed only because they hold outputs.
    lingering: HashSet<Arc<str>>,
}

impl LiveView {
    /// Reads everything `network`'s watcher follows now.
    pub async fn load(engine: &Engine, network: Network) -> Result<LiveView, Error> {
        let now = engine.clock().now();
        let store = engine.db();
        let window = engine.payment_settings().monitoring_window;
        let read = feed::read_all(
            store.pool(),
            store.backend(),
            network,
            now.timestamp_millis(),
            (now - window).timestamp_millis(),
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
            held_per_key: HashMap::new(),
            lingering: HashSet::new(),
        };
        live.apply(read, now);
        Ok(live)
    }

    /// Brings the view in step: what changed since the last read, and windows closed by now.
    pub async fn refresh(&mut self, engine: &Engine) -> Result<Refresh, Error> {
        let now = engine.clock().now();
        let store = engine.db();
        let started = Instant::now();
        let read =
            feed::read_changes(store.pool(), store.backend(), self.network, self.next_from).await?;
        let database_time = started.elapsed();
        let transfers_read = read.transfers.len();
        let (keys_added, keys_closed) = self.apply(read, now);
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

    /// Applies a read; returns how many keys began to be followed and how many windows closed.
    fn apply(&mut self, read: FeedRead, now: DateTime<Utc>) -> (usize, usize) {
        let now_ms = now.timestamp_millis();
        let mut keys_added = 0;
        let mut keys_closed = 0;
        for key in read.keys {
            if key.monitor_until_ms <= now_ms || self.view.watch_keys.contains(&key.watch_key) {
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
        for WatchedTransfer {
            transfer,
            monitor_until_ms,
        } in read.transfers
        {
            let open_until = monitor_until_ms.filter(|until| *until > now_ms);
            match open_until {
                Some(until) if !transfer.removed && transfer.intent_id.is_some() => {
                    if !self.view.known.contains_key(&transfer.id) {
                        self.known_windows
                            .entry(until)
                            .or_default()
                            .push(transfer.id.clone());
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
                _ => {
                    self.view.known.remove(&transfer.id);
                }
            }
        }
        for output in read.outputs {
            self.hold(output);
        }
        for (address, holds) in read.holders {
            let key: Arc<str> = Arc::from(address);
            if holds {
                if self.held_per_key.insert(key.clone(), 1).is_none() {
                    self.start_holding(key);
                }
            } else if self.held_per_key.remove(&key).is_some() {
                self.stop_holding(&key);
            }
        }
        for row in read.outflows {
            if row.removed {
                self.view.known_outflows.remove(&row.outflow.id);
            } else {
                self.view
                    .known_outflows
                    .insert(row.outflow.id.clone(), row.known());
            }
        }
        let still_open = self.key_windows.split_off(&(now_ms + 1));
        for key in std::mem::replace(&mut self.key_windows, still_open)
            .into_values()
            .flatten()
        {
            if self.held_per_key.contains_key(&key) {
                self.lingering.insert(key);
            } else if self.view.watch_keys.remove(&key) {
                keys_closed += 1;
            }
        }
        let still_open = self.known_windows.split_off(&(now_ms + 1));
        for id in std::mem::replace(&mut self.known_windows, still_open)
            .into_values()
            .flatten()
        {
            self.view.known.remove(&id);
        }
        self.view.cursor = read.cursor;
        self.view.now_ms = now_ms;
        self.next_from = read.next_from;
        (keys_added, keys_closed)
    }
}

impl LiveView {
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
                    self.start_holding(key);
                }
            }
        } else if self.view.held.remove(&output.txid, output.vout)
            && let Some(count) = self.held_per_key.get_mut(&key)
        {
            *count -= 1;
            if *count == 0 {
                self.held_per_key.remove(&key);
                self.stop_holding(&key);
            }
        }
    }

    /// `key` began to hold something: it stays followed however old its intent.
    fn start_holding(&mut self, key: Arc<str>) {
        if !self.view.watch_keys.contains(&key) {
            self.view.watch_keys.insert_shared(key.clone());
            self.lingering.insert(key);
        }
    }

    /// `key` holds nothing any more: followed only for that, it is dropped.
    fn stop_holding(&mut self, key: &Arc<str>) {
        if self.lingering.remove(key) {
            self.view.watch_keys.remove(key);
        }
    }
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
