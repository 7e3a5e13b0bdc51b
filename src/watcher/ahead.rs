//! The addresses a watcher follows ahead of each key's counter (see [`crate::keys`]).
//!
//! Each key's window is `[from, next + lookahead)`, where `next` is its counter and `from` is
//! `next`, or lower while indexes below it may be unused and were set aside in the last
//! monitoring window: skipped by money found ahead of the counter or by a restore (a restored
//! database's lost intents may still be paid there), or in a block a process took and may not
//! have handed out whole (see [`crate::indexes`]). An
//! address of the window that an intent or a holding comes to claim passes to them; the
//! window owns only the others, and drops those its counter passed.

use std::collections::HashMap;
use std::sync::Arc;

use payrecon_chain_core::{AddressDeriver, ChainEvent, WatchKeys};

use crate::store::keys::{KeyWindow, UnissuedRow};

/// One key's window.
struct KeyAhead {
    key_id: String,
    deriver: Arc<dyn AddressDeriver>,
    /// The indexes derived into the window now.
    from: u32,
    until: u32,
}

/// The look-ahead windows of one network's keys.
pub(super) struct Ahead {
    lookahead: u32,
    keys: Vec<KeyAhead>,
    /// Watch keys followed only for a window: which key and index each is.
    owned: HashMap<Arc<str>, (usize, u32)>,
    /// A key's database was restored and its watcher has not looked past the counter yet.
    restore_pending: bool,
}

impl Ahead {
    /// Windows for `keys` (key id and deriver), `lookahead` wide, none derived yet.
    pub(super) fn new(keys: Vec<(String, Arc<dyn AddressDeriver>)>, lookahead: u32) -> Ahead {
        Ahead {
            lookahead,
            keys: keys
                .into_iter()
                .map(|(key_id, deriver)| KeyAhead {
                    key_id,
                    deriver,
                    from: 0,
                    until: 0,
                })
                .collect(),
            owned: HashMap::new(),
            restore_pending: false,
        }
    }

    /// Whether a key waits for the look past the counters of a restored database.
    pub(super) fn restore_pending(&self) -> bool {
        self.restore_pending
    }

    /// The key ids whose windows [`Ahead::place`] needs.
    pub(super) fn key_ids(&self) -> Vec<String> {
        self.keys.iter().map(|key| key.key_id.clone()).collect()
    }

    /// How many watch keys the windows own now.
    #[cfg(feature = "test-utils")]
    pub(super) fn len(&self) -> usize {
        self.owned.len()
    }

    /// The key id and index of `watch_key`, when it is followed only for a window.
    pub(super) fn owner(&self, watch_key: &str) -> Option<(String, u32)> {
        let (slot, index) = self.owned.get(watch_key)?;
        Some((self.keys[*slot].key_id.clone(), *index))
    }

    /// Whether `key` is followed only for a window; if so it is the caller's from now on.
    pub(super) fn disown(&mut self, key: &str) -> bool {
        self.owned.remove(key).is_some()
    }

    /// Moves each key's window to where its counter and skipped indexes place it: derives the
    /// addresses entering it and follows those nobody follows yet, and stops following the
    /// ones it owned that left it. Returns how many keys it added and dropped.
    pub(super) fn place(
        &mut self,
        windows: &HashMap<String, KeyWindow>,
        watch_keys: &mut WatchKeys,
    ) -> (usize, usize) {
        let (mut added, mut dropped) = (0, 0);
        self.restore_pending = windows.values().any(|window| window.restore_pending);
        for (slot, key) in self.keys.iter_mut().enumerate() {
            let window = windows.get(&key.key_id).copied().unwrap_or_default();
            let from = window
                .watched_from
                .map_or(window.next_index, |low| low.min(window.next_index));
            let until = window.next_index.saturating_add(self.lookahead);
            if (from, until) == (key.from, key.until) {
                continue;
            }
            let (old_from, old_until) = (key.from, key.until);
            (key.from, key.until) = (from, until);
            self.owned.retain(|watch_key, (owner, index)| {
                let keep = *owner != slot || (from..until).contains(index);
                if !keep && watch_keys.remove(watch_key) {
                    dropped += 1;
                }
                keep
            });
            for index in from..until {
                if (old_from..old_until).contains(&index) {
                    continue;
                }
                // An index past BIP32's normal range ends the window.
                let Ok(derived) = key.deriver.derive(index) else {
                    break;
                };
                let watch_key: Arc<str> = Arc::from(derived.watch_key);
                if watch_keys.contains(&watch_key) {
                    continue;
                }
                watch_keys.insert_shared(watch_key.clone());
                self.owned.insert(watch_key, (slot, index));
                added += 1;
            }
        }
        (added, dropped)
    }

    /// The receipts of `events` paid to an address of a window: money ahead of its counter.
    pub(super) fn unissued(
        &self,
        network: payrecon_chain_core::Network,
        events: &[ChainEvent],
    ) -> Vec<UnissuedRow> {
        let mut found: Vec<UnissuedRow> = Vec::new();
        for event in events {
            let ChainEvent::Observed { transfer, .. } = event else {
                continue;
            };
            let Some((slot, index)) = self.owned.get(transfer.to_address.as_str()) else {
                continue;
            };
            if found.iter().any(|row| row.address == transfer.to_address) {
                continue;
            }
            found.push(UnissuedRow {
                network: network.as_str().to_owned(),
                address: transfer.to_address.clone(),
                key_id: self.keys[*slot].key_id.clone(),
                derivation_index: *index,
            });
        }
        found
    }
}
