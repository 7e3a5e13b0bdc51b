//! Group commit: concurrent writes from many callers share one transaction and one durable
//! commit, the way a database groups its own log flushes.
//!
//! A caller hands over its write (a closure over the transaction) and waits. The first caller
//! to find no group running starts one; the group takes every write queued by then (up to
//! [`MAX_GROUP_WRITES`]), runs each in a savepoint of its own, commits once, and only then
//! answers every caller of the group. So:
//! - a refusal (or a failing statement) rolls back that caller's savepoint only;
//! - no answer leaves before the commit that makes it true is on disk, and a failed commit
//!   fails every write of its group (none of them happened).
//!
//! Nothing waits on purpose: while one group commits, the next callers queue, so groups grow
//! with load and a lone caller pays one commit as before.

use std::any::{Any, TypeId};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sqlx::Executor;
use tokio::sync::oneshot;

use super::{Backend, Store, StoreError, WriteTx};

/// Most writes one group commits at once: bounds how long its transaction (and, on
/// PostgreSQL, the row locks it takes) lasts.
pub const MAX_GROUP_WRITES: usize = 256;

/// Times one write is run again, in a later group, after PostgreSQL failed it to break a
/// deadlock or a serialization conflict with another process's transaction.
const MAX_CONFLICT_RETRIES: u32 = 8;

/// Groups in flight at once. SQLite has one writer. On PostgreSQL a group's time is mostly
/// round trips, which several connections overlap, while the server already merges
/// concurrent commits into one log flush.
const SQLITE_PIPELINES: usize = 1;
const POSTGRES_PIPELINES: usize = 4;

/// Writes queued before a second group starts beside one in flight. Below it they wait for
/// the running group's next turn, which takes them all: small parallel groups cost a commit
/// and a round of statements each (measured on PostgreSQL: four pipelines of 64 callers made
/// groups of 12; several processes, each with their own pipelines, groups of 4 to 6).
const PARALLEL_GROUP_MIN: usize = 16;

/// What a caller's write returns: a future borrowing the group's transaction.
pub type WriteFuture<'a, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'a>>;

/// The answers of a run of writes, one per write in order: each its own output or refusal.
pub(crate) type Answers<T, E> = Vec<Result<T, E>>;

/// An error a write may end with: a store failure, or a refusal of the caller's own.
pub(crate) trait WriteError: From<StoreError> + Send + 'static {
    /// The database failed this write only to break a conflict: it may run again.
    fn is_retryable_conflict(&self) -> bool;
}

impl WriteError for StoreError {
    fn is_retryable_conflict(&self) -> bool {
        StoreError::is_retryable_conflict(self)
    }
}

/// A write a caller hands to the group. It runs alone in a savepoint of its own; a kind of
/// write that knows how ([`GroupWrite::BATCHED`]) also runs a run of its kind together, with
/// set-based statements, when several are queued one after the other.
pub(crate) trait GroupWrite: Send + Sync + Sized + 'static {
    /// What the caller gets.
    type Output: Send + 'static;
    /// Why it may be refused.
    type Error: WriteError;
    /// Whether [`GroupWrite::run_many`] may run several of these at once.
    const BATCHED: bool = false;

    /// Runs this write alone.
    fn run<'a>(&'a self, tx: &'a mut WriteTx) -> WriteFuture<'a, Self::Output, Self::Error>;

    /// Runs several of these at once, answering each exactly as running them alone one after
    /// the other would: a refused one (`Err` in its place) has written nothing. An `Err` for
    /// the whole call means the run is rolled back and each write runs alone instead.
    fn run_many<'a>(
        writes: Vec<&'a Self>,
        tx: &'a mut WriteTx,
    ) -> WriteFuture<'a, Answers<Self::Output, Self::Error>, Self::Error> {
        let _ = (writes, tx);
        Box::pin(async {
            Err(StoreError::GroupCommit("this kind of write runs alone".into()).into())
        })
    }
}

/// A write given as a closure over the transaction: it runs alone.
pub(crate) struct Solo<F>(pub F);

impl<T, E, F> GroupWrite for Solo<F>
where
    T: Send + 'static,
    E: WriteError,
    F: for<'a> Fn(&'a mut WriteTx) -> WriteFuture<'a, T, E> + Send + Sync + 'static,
{
    type Output = T;
    type Error = E;

    fn run<'a>(&'a self, tx: &'a mut WriteTx) -> WriteFuture<'a, T, E> {
        (self.0)(tx)
    }
}

/// What became of one write inside its savepoint.
enum Ran {
    /// It succeeded: keep its rows.
    Kept,
    /// It was refused or failed: its rows are rolled back, the answer is its error.
    Refused,
    /// The database failed it to break a conflict: roll back and run it in a later group.
    Conflict,
}

type RunFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs a run of queued writes of one kind together; false if it failed as a whole.
type RunMany = for<'a> fn(&'a mut WriteTx, &'a mut [Box<dyn QueuedWrite>]) -> RunFuture<'a, bool>;

/// A queued write, with its types erased.
trait QueuedWrite: Send {
    fn run<'a>(&'a mut self, tx: &'a mut WriteTx) -> RunFuture<'a, Ran>;
    /// The kind of write and how to run several of it at once, for batched kinds.
    fn batched(&self) -> Option<(TypeId, RunMany)>;
    fn as_any(&mut self) -> &mut dyn Any;
    /// Answers the caller once the group's commit has succeeded (`Ok`) or failed.
    fn answer(self: Box<Self>, commit: Result<(), String>);
}

struct Queued<W: GroupWrite> {
    write: W,
    result: Option<Result<W::Output, W::Error>>,
    conflicts: u32,
    reply: oneshot::Sender<Result<W::Output, W::Error>>,
}

impl<W: GroupWrite> QueuedWrite for Queued<W> {
    fn run<'a>(&'a mut self, tx: &'a mut WriteTx) -> RunFuture<'a, Ran> {
        Box::pin(async move {
            let result = self.write.run(tx).await;
            let ran = match &result {
                Ok(_) => Ran::Kept,
                Err(e) if e.is_retryable_conflict() && self.conflicts < MAX_CONFLICT_RETRIES => {
                    self.conflicts += 1;
                    Ran::Conflict
                }
                Err(_) => Ran::Refused,
            };
            self.result = Some(result);
            ran
        })
    }

    fn batched(&self) -> Option<(TypeId, RunMany)> {
        W::BATCHED.then(|| (TypeId::of::<W>(), run_many::<W> as RunMany))
    }

    fn as_any(&mut self) -> &mut dyn Any {
        self
    }

    fn answer(self: Box<Self>, commit: Result<(), String>) {
        let not_committed = |why: String| Err(W::Error::from(StoreError::GroupCommit(why)));
        let answer = match (self.result, commit) {
            (Some(result), Ok(())) => result,
            (_, Err(why)) => not_committed(why),
            (None, Ok(())) => not_committed("the write never ran".into()),
        };
        // The caller may have gone away (a dropped request): its write stands regardless.
        let _ = self.reply.send(answer);
    }
}

/// [`GroupWrite::run_many`] over queued writes known to be `Queued<W>`.
fn run_many<'a, W: GroupWrite>(
    tx: &'a mut WriteTx,
    queued: &'a mut [Box<dyn QueuedWrite>],
) -> RunFuture<'a, bool> {
    Box::pin(async move {
        let results = {
            let writes: Vec<&W> = queued
                .iter_mut()
                .map(|q| {
                    let queued: &Queued<W> = q
                        .as_any()
                        .downcast_ref()
                        .expect("a run holds one kind of write");
                    &queued.write
                })
                .collect();
            W::run_many(writes, tx).await
        };
        let Ok(results) = results else {
            return false;
        };
        if results.len() != queued.len() {
            return false;
        }
        for (q, result) in queued.iter_mut().zip(results) {
            let queued: &mut Queued<W> = q
                .as_any()
                .downcast_mut()
                .expect("a run holds one kind of write");
            queued.result = Some(result);
        }
        true
    })
}

/// The queue of writes waiting for a group, and how many groups are running.
pub(crate) struct GroupCommit {
    state: Mutex<GroupState>,
    pipelines: usize,
    commits: AtomicU64,
    writes: AtomicU64,
}

/// How many writes shared how many commits, since the store was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GroupCommitStats {
    /// Group transactions committed.
    pub commits: u64,
    /// Writes (kept or refused) answered by them.
    pub writes: u64,
}

#[derive(Default)]
struct GroupState {
    queue: VecDeque<Box<dyn QueuedWrite>>,
    running: usize,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit")
            .field("pipelines", &self.pipelines)
            .finish_non_exhaustive()
    }
}

impl GroupCommit {
    pub(crate) fn new(backend: Backend) -> GroupCommit {
        GroupCommit {
            state: Mutex::new(GroupState::default()),
            pipelines: match backend {
                Backend::Sqlite => SQLITE_PIPELINES,
                Backend::Postgres => POSTGRES_PIPELINES,
            },
            commits: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        }
    }

    pub(crate) fn stats(&self) -> GroupCommitStats {
        GroupCommitStats {
            commits: self.commits.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
        }
    }

    /// Queues `write` and waits for its answer, starting a group runner if none is free.
    pub(crate) async fn submit<W: GroupWrite>(
        &self,
        store: Store,
        write: W,
    ) -> Result<W::Output, W::Error> {
        let (reply, answer) = oneshot::channel();
        let queued = Box::new(Queued {
            write,
            result: None,
            conflicts: 0,
            reply,
        });
        let start_runner = {
            let mut state = self.state.lock().expect("never poisoned");
            state.queue.push_back(queued);
            let free = state.running == 0
                || (state.running < self.pipelines && state.queue.len() >= PARALLEL_GROUP_MIN);
            if free {
                state.running += 1;
            }
            free
        };
        if start_runner {
            tokio::spawn(run_groups(store));
        }
        answer.await.unwrap_or_else(|_| {
            Err(W::Error::from(StoreError::GroupCommit(
                "the group commit stopped before answering".into(),
            )))
        })
    }

    /// The next group's writes, or `None` (and one runner fewer) when the queue is empty.
    fn take_group(&self) -> Option<Vec<Box<dyn QueuedWrite>>> {
        let mut state = self.state.lock().expect("never poisoned");
        if state.queue.is_empty() {
            state.running -= 1;
            return None;
        }
        let take = state.queue.len().min(MAX_GROUP_WRITES);
        Some(state.queue.drain(..take).collect())
    }

    fn requeue_front(&self, writes: Vec<Box<dyn QueuedWrite>>) {
        let mut state = self.state.lock().expect("never poisoned");
        for write in writes.into_iter().rev() {
            state.queue.push_front(write);
        }
    }
}

/// Runs groups until the queue is empty.
async fn run_groups(store: Store) {
    let group = store.group.clone();
    let mut guard = RunnerGuard {
        group: group.clone(),
        store: store.clone(),
        done: false,
    };
    while let Some(writes) = group.take_group() {
        let conflicts = run_group(&store, writes).await;
        if !conflicts.is_empty() {
            group.requeue_front(conflicts);
        }
        // The callers just answered are ready to queue their next write: let them, so the
        // next group is as large as the load (this waits for nothing else).
        tokio::task::yield_now().await;
    }
    guard.done = true;
}

/// If a runner ends without draining the queue (it panicked), it gives its slot back and
/// starts a replacement, so no queued write is left without a runner.
struct RunnerGuard {
    group: Arc<GroupCommit>,
    store: Store,
    done: bool,
}

impl Drop for RunnerGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let restart = {
            let mut state = self.group.state.lock().unwrap_or_else(|p| p.into_inner());
            if state.queue.is_empty() {
                state.running -= 1;
                false
            } else {
                true
            }
        };
        if restart && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(run_groups(self.store.clone()));
        }
    }
}

/// One group: a transaction, a savepoint per write, one commit, then the answers. Returns the
/// writes to run again in a later group.
async fn run_group(store: &Store, writes: Vec<Box<dyn QueuedWrite>>) -> Vec<Box<dyn QueuedWrite>> {
    let fail_all = |writes: Vec<Box<dyn QueuedWrite>>, why: String| {
        for write in writes {
            write.answer(Err(why.clone()));
        }
    };
    let mut tx = match store.begin_write().await {
        Ok(tx) => tx,
        Err(e) => {
            fail_all(writes, e.to_string());
            return Vec::new();
        }
    };
    let mut ran: Vec<Box<dyn QueuedWrite>> = Vec::with_capacity(writes.len());
    let mut again = Vec::new();
    let mut pending = writes.into_iter().peekable();
    while let Some(first) = pending.next() {
        // A run of writes of one batched kind goes together, in one savepoint.
        let mut run = vec![first];
        if let Some((kind, run_together)) = run[0].batched() {
            while let Some(next) = pending.next_if(|w| w.batched().map(|(k, _)| k) == Some(kind)) {
                run.push(next);
            }
            if run.len() > 1 {
                let savepoint = tx.conn().execute("SAVEPOINT payrecon_write").await;
                let together = savepoint.is_ok() && run_together(&mut tx, &mut run).await;
                let end = if together {
                    "RELEASE SAVEPOINT payrecon_write"
                } else {
                    "ROLLBACK TO SAVEPOINT payrecon_write; RELEASE SAVEPOINT payrecon_write"
                };
                if let Err(e) = sqlx::raw_sql(end).execute(tx.conn()).await {
                    ran.extend(run);
                    ran.extend(pending);
                    fail_all(ran, e.to_string());
                    return again;
                }
                if together {
                    ran.extend(run);
                    continue;
                }
            }
        }
        // Alone, each in its own savepoint.
        for mut write in run {
            if let Err(e) = tx.conn().execute("SAVEPOINT payrecon_write").await {
                ran.push(write);
                ran.extend(pending);
                fail_all(ran, e.to_string());
                return again;
            }
            let outcome = write.run(&mut tx).await;
            let end = match outcome {
                Ran::Kept => "RELEASE SAVEPOINT payrecon_write",
                Ran::Refused | Ran::Conflict => {
                    "ROLLBACK TO SAVEPOINT payrecon_write; RELEASE SAVEPOINT payrecon_write"
                }
            };
            if let Err(e) = sqlx::raw_sql(end).execute(tx.conn()).await {
                ran.push(write);
                ran.extend(pending);
                fail_all(ran, e.to_string());
                return again;
            }
            match outcome {
                Ran::Conflict => again.push(write),
                Ran::Kept | Ran::Refused => ran.push(write),
            }
        }
    }
    let commit = tx.commit().await.map_err(|e| e.to_string());
    if commit.is_ok() {
        let group = &store.group;
        group.commits.fetch_add(1, Ordering::Relaxed);
        group.writes.fetch_add(ran.len() as u64, Ordering::Relaxed);
    }
    for write in ran {
        write.answer(commit.clone());
    }
    again
}
