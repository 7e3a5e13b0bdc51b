//! Derivation indexes handed out without one row lock per intent.
//!
//! Each intent needs the next unused index of its key. Taking it from the key's counter row
//! inside the intent's own transaction made every caller of every process queue on that row's
//! lock. Instead a process takes a *block* of indexes at once, in a short transaction of its
//! own that moves the counter past the block and records it (`index_blocks`), and hands the
//! block out from memory. So:
//!
//! - **No index twice.** A block is the counter's to give once, committed before any of its
//!   indexes is used; and `payment_intents` is unique on (key, index), so even a process that
//!   kept a block across a restore cannot store an index twice.
//! - **No gap a wallet cannot cross.** Indexes of a block that a process never used (it was
//!   killed, a write failed) stay watched for a monitoring window, like the look-ahead, and the
//!   wallet export measures the run of unpaid indexes they add. A block grows only while its
//!   predecessor was used up within [`GROWTH_WINDOW`], so a quiet shop leaves at most a few
//!   unused indexes behind and a busy one at most [`MAX_BLOCK`].
//! - **Increasing per process.** The smallest free index goes first; only an index a refused
//!   write gave back goes out after a larger one.
//! - **Rarely waiting.** The caller that finds a quarter of the block left takes the next one
//!   while the others go on handing out the rest.
//! - **A restored database waits.** A block is not taken while the key waits for its watcher's
//!   look past the counters of a restored database (`Engine::restored`).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The first block of a key in a process, and the smallest a block shrinks to.
pub(crate) const MIN_BLOCK: u32 = 4;

/// The largest block: at most this many indexes are left unused when a busy process dies.
pub(crate) const MAX_BLOCK: u32 = 256;

/// A block used up faster than this makes the next one twice as large; a slower one halves it.
pub(crate) const GROWTH_WINDOW: Duration = Duration::from_secs(1);

/// The blocks of one key that this process holds.
#[derive(Debug)]
struct KeyPool {
    /// Indexes of its blocks not handed out yet.
    free: BTreeSet<u32>,
    /// Indexes of each block (by first index) not yet stored with an intent.
    open: HashMap<u32, (u32, u32)>,
    /// Blocks whose every index was stored: their records can go.
    spent: Vec<u32>,
    /// Blocks with an index lost to a failed write: their records stay (and keep it watched)
    /// until they leave the monitoring window.
    tainted: BTreeSet<u32>,
    /// The size of the next block.
    size: u32,
    /// When the last block was taken.
    taken_at: Option<Instant>,
}

impl Default for KeyPool {
    fn default() -> KeyPool {
        KeyPool {
            free: BTreeSet::new(),
            open: HashMap::new(),
            spent: Vec::new(),
            tainted: BTreeSet::new(),
            size: MIN_BLOCK,
            taken_at: None,
        }
    }
}

impl KeyPool {
    /// The block `index` belongs to.
    fn block_of(&self, index: u32) -> Option<u32> {
        self.open
            .iter()
            .find(|(first, (_, end))| (**first..*end).contains(&index))
            .map(|(first, _)| *first)
    }

    /// One index of the block starting at `first` is settled (stored, or lost for good).
    fn settle(&mut self, first: u32) {
        let Some((left, _)) = self.open.get_mut(&first) else {
            return;
        };
        *left -= 1;
        if *left == 0 {
            self.open.remove(&first);
            if !self.tainted.remove(&first) {
                self.spent.push(first);
            }
        }
    }
}

/// The index blocks this process holds, per key.
#[derive(Debug, Default)]
pub(crate) struct IndexPools {
    keys: Mutex<HashMap<String, KeyPool>>,
    /// One block is taken at a time per process: callers that find the pool empty wait for it.
    taking: tokio::sync::Mutex<()>,
}

/// What a new block needs from the database: taken by [`IndexPools::take`] through it.
pub(crate) struct NewBlock {
    pub(crate) size: u32,
    /// Blocks of the key whose every index was stored: their records can go.
    pub(crate) spent: Vec<u32>,
}

impl IndexPools {
    /// The next free index of `key_id`, taking a new block through `take_block` (given the
    /// block's size and the spent blocks to forget; returning its first index) when none is
    /// left. When few are left, the caller that finds them so takes the next block ahead,
    /// unless another is taking one, so the others rarely wait for a block.
    pub(crate) async fn take<F, Fut, E>(
        self: &Arc<Self>,
        key_id: &str,
        take_block: F,
    ) -> Result<TakenIndex, E>
    where
        F: FnOnce(NewBlock) -> Fut,
        Fut: std::future::Future<Output = Result<u32, E>>,
    {
        if let Some(taken) = self.pop(key_id) {
            if self.running_low(key_id)
                && let Ok(_taking) = self.taking.try_lock()
                && self.running_low(key_id)
            {
                // Ahead of need: a failure here is met again by the caller that finds none.
                let _ = self.add_block(key_id, take_block).await;
            }
            return Ok(taken);
        }
        let _taking = self.taking.lock().await;
        if let Some(taken) = self.pop(key_id) {
            return Ok(taken);
        }
        self.add_block(key_id, take_block).await?;
        Ok(self.pop(key_id).expect("a block is never empty"))
    }

    /// Whether fewer than a quarter of a block's indexes are left free.
    fn running_low(&self, key_id: &str) -> bool {
        self.keys
            .lock()
            .expect("never poisoned")
            .get(key_id)
            .is_some_and(|pool| pool.free.len() < (pool.size / 4).max(1) as usize)
    }

    /// Takes a block for `key_id` through `take_block` and adds its indexes to the free ones.
    async fn add_block<F, Fut, E>(&self, key_id: &str, take_block: F) -> Result<(), E>
    where
        F: FnOnce(NewBlock) -> Fut,
        Fut: std::future::Future<Output = Result<u32, E>>,
    {
        let block = {
            let mut keys = self.keys.lock().expect("never poisoned");
            let pool = keys.entry(key_id.to_owned()).or_default();
            if let Some(taken_at) = pool.taken_at {
                pool.size = if taken_at.elapsed() < GROWTH_WINDOW {
                    (pool.size * 2).min(MAX_BLOCK)
                } else {
                    (pool.size / 2).max(MIN_BLOCK)
                };
            }
            NewBlock {
                size: pool.size,
                spent: std::mem::take(&mut pool.spent),
            }
        };
        let (size, spent) = (block.size, block.spent.clone());
        let first = match take_block(block).await {
            Ok(first) => first,
            Err(e) => {
                let mut keys = self.keys.lock().expect("never poisoned");
                keys.entry(key_id.to_owned())
                    .or_default()
                    .spent
                    .extend(spent);
                return Err(e);
            }
        };
        crate::crash::crash_point("indexes.after_block");
        let mut keys = self.keys.lock().expect("never poisoned");
        let pool = keys.entry(key_id.to_owned()).or_default();
        pool.free.extend(first..first + size);
        pool.open.insert(first, (size, first + size));
        pool.taken_at = Some(Instant::now());
        Ok(())
    }

    fn pop(self: &Arc<Self>, key_id: &str) -> Option<TakenIndex> {
        let index = self
            .keys
            .lock()
            .expect("never poisoned")
            .get_mut(key_id)?
            .free
            .pop_first()?;
        Some(self.taken(key_id, index))
    }

    fn taken(self: &Arc<Self>, key_id: &str, index: u32) -> TakenIndex {
        TakenIndex {
            pools: self.clone(),
            key_id: key_id.to_owned(),
            index,
            settled: false,
        }
    }

    /// The indexes this process holds free for `key_id` now, smallest first.
    #[cfg(test)]
    fn free(&self, key_id: &str) -> Vec<u32> {
        self.keys
            .lock()
            .expect("never poisoned")
            .get(key_id)
            .map(|pool| pool.free.iter().copied().collect())
            .unwrap_or_default()
    }
}

/// An index taken for one intent. Dropped without [`TakenIndex::stored`] or
/// [`TakenIndex::lost`] it goes back to the pool (its write was refused before it stored
/// anything).
#[derive(Debug)]
pub(crate) struct TakenIndex {
    pools: Arc<IndexPools>,
    key_id: String,
    index: u32,
    settled: bool,
}

impl TakenIndex {
    /// The derivation index.
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    /// Its intent is stored.
    pub(crate) fn stored(mut self) {
        self.settle(false);
    }

    /// Its write failed without saying whether it was stored: the index is never handed out
    /// again, and its block stays recorded (so watched) for the monitoring window.
    pub(crate) fn lost(mut self) {
        self.settle(true);
    }

    fn settle(&mut self, lost: bool) {
        self.settled = true;
        let mut keys = self.pools.keys.lock().expect("never poisoned");
        let Some(pool) = keys.get_mut(&self.key_id) else {
            return;
        };
        if let Some(first) = pool.block_of(self.index) {
            if lost {
                pool.tainted.insert(first);
            }
            pool.settle(first);
        }
    }
}

impl Drop for TakenIndex {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if let Some(pool) = self
            .pools
            .keys
            .lock()
            .expect("never poisoned")
            .get_mut(&self.key_id)
        {
            pool.free.insert(self.index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn take(pools: &Arc<IndexPools>, counter: &Mutex<u32>) -> TakenIndex {
        pools
            .take("k", |block| async move {
                let mut next = counter.lock().unwrap();
                let first = *next;
                *next += block.size;
                Ok::<u32, ()>(first)
            })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn indexes_go_out_in_order_and_a_refused_one_comes_back() {
        let pools = Arc::new(IndexPools::default());
        let counter = Mutex::new(0);
        let first = take(&pools, &counter).await;
        let second = take(&pools, &counter).await;
        assert_eq!((first.index(), second.index()), (0, 1));
        drop(first);
        assert_eq!(pools.free("k"), [0, 2, 3]);
        let again = take(&pools, &counter).await;
        assert_eq!(again.index(), 0);
        again.stored();
        second.stored();
    }

    #[tokio::test]
    async fn the_next_block_is_taken_ahead_twice_as_large_and_a_spent_one_is_forgotten() {
        let pools = Arc::new(IndexPools::default());
        let counter = Mutex::new(0);
        for _ in 0..MIN_BLOCK {
            take(&pools, &counter).await.stored();
        }
        assert_eq!(
            *counter.lock().unwrap(),
            MIN_BLOCK * 3,
            "the last index of the first block took the second, twice as large, ahead"
        );
        assert_eq!(pools.keys.lock().unwrap()["k"].spent, [0]);
        let next = take(&pools, &counter).await;
        assert_eq!(next.index(), MIN_BLOCK);
        next.lost();
        assert!(pools.keys.lock().unwrap()["k"].tainted.contains(&MIN_BLOCK));
        for _ in 0..MIN_BLOCK * 2 - 1 {
            take(&pools, &counter).await.stored();
        }
        let pool = &pools.keys.lock().unwrap()["k"];
        assert!(pool.spent.is_empty(), "the third block forgot the first");
        assert!(
            pool.tainted.is_empty() && !pool.open.contains_key(&MIN_BLOCK),
            "the second block is settled but stays recorded"
        );
    }
}
