//! The keys a watcher follows, kept in step at the cost of what changed.
//!
//! The engine changes a network's [`WatchKeys`] a key at a time (an intent created, a
//! monitoring window closed) and logs each change. A scanner keeps its own [`KeyIndex`] of the
//! keys, parsed into what it matches chain data with (an address, an output script, a public
//! key), and brings it in step from the log each round: a round with a million keys and
//! nothing new parses nothing. A scanner too far behind the log, or facing a rebuilt set,
//! rebuilds its index once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Changes a [`WatchKeys`] remembers; a scanner further behind rebuilds its index.
pub const MAX_LOGGED_KEY_CHANGES: usize = 65_536;

/// Tells one [`WatchKeys`] from another, so an index built from a replaced set is rebuilt.
static NEXT_EPOCH: AtomicU64 = AtomicU64::new(1);

/// One change to a [`WatchKeys`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyChange {
    /// The key is followed from now on.
    Added(Arc<str>),
    /// The key is no longer followed.
    Removed(Arc<str>),
}

/// A set of watch keys with a log of its recent changes.
#[derive(Clone, Debug)]
pub struct WatchKeys {
    keys: HashSet<Arc<str>>,
    log: VecDeque<KeyChange>,
    /// Changes made since the set was built; the log holds the newest of them.
    generation: u64,
    epoch: u64,
}

impl Default for WatchKeys {
    fn default() -> WatchKeys {
        WatchKeys {
            keys: HashSet::new(),
            log: VecDeque::new(),
            generation: 0,
            epoch: NEXT_EPOCH.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl<S: AsRef<str>> FromIterator<S> for WatchKeys {
    /// A set built whole: indexes built from another set rebuild themselves from it.
    fn from_iter<I: IntoIterator<Item = S>>(keys: I) -> WatchKeys {
        WatchKeys {
            keys: keys.into_iter().map(|k| Arc::from(k.as_ref())).collect(),
            ..WatchKeys::default()
        }
    }
}

impl WatchKeys {
    /// How many keys are followed.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// No key is followed.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether `key` is followed.
    pub fn contains(&self, key: &str) -> bool {
        self.keys.contains(key)
    }

    /// Every key, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<str>> {
        self.keys.iter()
    }

    /// Follows `key`; false if it already was.
    pub fn insert(&mut self, key: &str) -> bool {
        self.insert_shared(Arc::from(key))
    }

    /// [`WatchKeys::insert`] for a key the caller keeps a handle on too (no second copy).
    pub fn insert_shared(&mut self, key: Arc<str>) -> bool {
        if self.keys.contains(&key) {
            return false;
        }
        self.keys.insert(key.clone());
        self.log_change(KeyChange::Added(key));
        true
    }

    /// Stops following `key`; false if it was not followed.
    pub fn remove(&mut self, key: &str) -> bool {
        let Some(key) = self.keys.take(key) else {
            return false;
        };
        self.log_change(KeyChange::Removed(key));
        true
    }

    fn log_change(&mut self, change: KeyChange) {
        self.generation += 1;
        self.log.push_back(change);
        if self.log.len() > MAX_LOGGED_KEY_CHANGES {
            self.log.pop_front();
        }
    }

    /// Where this set stands: an index synced here asks for the changes after it.
    pub fn position(&self) -> KeysPosition {
        KeysPosition {
            epoch: self.epoch,
            generation: self.generation,
        }
    }

    /// The changes after `since`, oldest first; `None` when `since` is of another set or older
    /// than the log (read the whole set instead).
    pub fn changes_since(&self, since: KeysPosition) -> Option<impl Iterator<Item = &KeyChange>> {
        let first_logged = self.generation - self.log.len() as u64;
        if since.epoch != self.epoch || since.generation < first_logged {
            return None;
        }
        let skip = usize::try_from(since.generation - first_logged).ok()?;
        (skip <= self.log.len()).then(|| self.log.iter().skip(skip))
    }
}

/// A point in a [`WatchKeys`]' history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeysPosition {
    epoch: u64,
    generation: u64,
}

/// What one [`KeyIndex::sync`] changed.
#[derive(Debug)]
pub struct IndexChanges<T> {
    /// The index was built anew from the whole set (first sync, a replaced set, too far
    /// behind): `added` holds every key.
    pub rebuilt: bool,
    /// Keys followed since the last sync.
    pub added: Vec<(T, Arc<str>)>,
    /// Keys no longer followed.
    pub removed: Vec<(T, Arc<str>)>,
}

/// A scanner's own index of the watch keys, parsed into `T`, kept in step with a [`WatchKeys`].
#[derive(Debug)]
pub struct KeyIndex<T> {
    synced: Option<KeysPosition>,
    by_parsed: HashMap<T, Arc<str>>,
}

impl<T> Default for KeyIndex<T> {
    fn default() -> KeyIndex<T> {
        KeyIndex {
            synced: None,
            by_parsed: HashMap::new(),
        }
    }
}

impl<T: Clone + Eq + Hash> KeyIndex<T> {
    /// Brings the index in step with `keys`, parsing only what changed. A key that does not
    /// parse is returned with its error, and the index is left to rebuild at the next sync.
    pub fn sync<E>(
        &mut self,
        keys: &WatchKeys,
        parse: impl Fn(&str) -> Result<T, E>,
    ) -> Result<IndexChanges<T>, (Arc<str>, E)> {
        let position = keys.position();
        let changes = self.synced.and_then(|since| keys.changes_since(since));
        let result = match changes {
            Some(changes) => {
                let mut added = Vec::new();
                let mut removed = Vec::new();
                for change in changes {
                    match change {
                        KeyChange::Added(key) => {
                            let parsed = parse(key).map_err(|e| (key.clone(), e));
                            let parsed = match parsed {
                                Ok(parsed) => parsed,
                                Err(error) => {
                                    self.synced = None;
                                    return Err(error);
                                }
                            };
                            self.by_parsed.insert(parsed.clone(), key.clone());
                            added.push((parsed, key.clone()));
                        }
                        KeyChange::Removed(key) => {
                            if let Ok(parsed) = parse(key)
                                && self.by_parsed.remove(&parsed).is_some()
                            {
                                removed.push((parsed, key.clone()));
                            }
                        }
                    }
                }
                IndexChanges {
                    rebuilt: false,
                    added,
                    removed,
                }
            }
            None => {
                let mut by_parsed = HashMap::with_capacity(keys.len());
                for key in keys.iter() {
                    let parsed = parse(key).map_err(|e| (key.clone(), e))?;
                    by_parsed.insert(parsed, key.clone());
                }
                let removed = std::mem::take(&mut self.by_parsed)
                    .into_iter()
                    .filter(|(parsed, _)| !by_parsed.contains_key(parsed))
                    .collect();
                let added = by_parsed
                    .iter()
                    .map(|(parsed, key)| (parsed.clone(), key.clone()))
                    .collect();
                self.by_parsed = by_parsed;
                IndexChanges {
                    rebuilt: true,
                    added,
                    removed,
                }
            }
        };
        self.synced = Some(position);
        Ok(result)
    }

    /// The watch key `parsed` came from, if it is followed.
    pub fn get(&self, parsed: &T) -> Option<&Arc<str>> {
        self.by_parsed.get(parsed)
    }

    /// Whether `parsed` is followed.
    pub fn contains(&self, parsed: &T) -> bool {
        self.by_parsed.contains_key(parsed)
    }

    /// How many keys are indexed.
    pub fn len(&self) -> usize {
        self.by_parsed.len()
    }

    /// No key is indexed.
    pub fn is_empty(&self) -> bool {
        self.by_parsed.is_empty()
    }

    /// Every indexed key, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&T, &Arc<str>)> {
        self.by_parsed.iter()
    }

    /// Forgets everything: the next sync rebuilds.
    pub fn clear(&mut self) {
        self.synced = None;
        self.by_parsed.clear();
    }
}

/// Looks a parsed key up: in a scanner's [`KeyIndex`], or in a small map built for one
/// question (the audit's recheck of one transfer).
pub trait WatchedLookup<T> {
    /// The watch key `parsed` came from, if it is followed.
    fn watch_key(&self, parsed: &T) -> Option<&str>;
}

impl<T: Eq + Hash> WatchedLookup<T> for KeyIndex<T> {
    fn watch_key(&self, parsed: &T) -> Option<&str> {
        self.by_parsed.get(parsed).map(|key| &**key)
    }
}

impl<T: Eq + Hash, S: AsRef<str>> WatchedLookup<T> for HashMap<T, S> {
    fn watch_key(&self, parsed: &T) -> Option<&str> {
        self.get(parsed).map(AsRef::as_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(key: &str) -> Result<u32, String> {
        key.parse().map_err(|_| format!("{key} is no number"))
    }

    #[test]
    fn an_index_follows_changes_without_reparsing_the_set() {
        let mut keys: WatchKeys = ["1", "2"].into_iter().collect();
        let mut index = KeyIndex::default();
        let first = index.sync(&keys, parse).unwrap();
        assert!(first.rebuilt);
        assert_eq!(first.added.len(), 2);

        keys.insert("3");
        keys.remove("1");
        keys.insert("3");
        let next = index.sync(&keys, parse).unwrap();
        assert!(!next.rebuilt);
        assert_eq!(next.added.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [3]);
        assert_eq!(
            next.removed.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            [1]
        );
        assert!(index.contains(&2) && index.contains(&3) && !index.contains(&1));

        let quiet = index.sync(&keys, parse).unwrap();
        assert!(!quiet.rebuilt && quiet.added.is_empty() && quiet.removed.is_empty());
    }

    #[test]
    fn a_replaced_set_or_a_truncated_log_rebuilds_the_index() {
        let mut keys: WatchKeys = ["1"].into_iter().collect();
        let mut index = KeyIndex::default();
        index.sync(&keys, parse).unwrap();
        for n in 0..(MAX_LOGGED_KEY_CHANGES as u32 + 10) {
            keys.insert(&(n + 100).to_string());
        }
        let behind = index.sync(&keys, parse).unwrap();
        assert!(behind.rebuilt);
        assert_eq!(index.len(), keys.len());

        let replaced: WatchKeys = ["7"].into_iter().collect();
        let rebuilt = index.sync(&replaced, parse).unwrap();
        assert!(rebuilt.rebuilt);
        assert_eq!(index.len(), 1);
        assert_eq!(rebuilt.removed.len(), keys.len());
    }

    #[test]
    fn a_key_that_does_not_parse_is_reported_and_retried() {
        let mut keys: WatchKeys = ["1"].into_iter().collect();
        let mut index = KeyIndex::default();
        index.sync(&keys, parse).unwrap();
        keys.insert("x");
        let (key, _) = index.sync(&keys, parse).unwrap_err();
        assert_eq!(&*key, "x");
        keys.remove("x");
        assert!(index.sync(&keys, parse).unwrap().rebuilt);
    }
}
