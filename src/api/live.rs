//! The live statuses of open checkout pages, fanned out from one place.
//!
//! A page's stream does not look at the database on a timer: one task per process reads which
//! intents changed (their events and their transfers, two indexed range reads) each time this
//! process commits and, while any page is open, every [`RECHECK`] for what other processes
//! wrote. It wakes only the pages of intents that changed, and only those read their intent
//! again. The cost grows with changes, not with open tabs.
//!
//! Streams are counted: past [`StreamLimits::max_streams`] in all, or
//! [`StreamLimits::max_per_client`] from one address, a new one is refused at once.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::engine::Engine;
use crate::store::feed::{LATE_EVENTS, LivePosition};

/// How often the fan-out looks for what other processes wrote, while any page is open.
pub(super) const RECHECK: Duration = Duration::from_secs(2);

/// What the live statuses admit.
#[derive(Clone, Copy, Debug)]
pub struct StreamLimits {
    /// Open streams at most, in all.
    pub max_streams: usize,
    /// Open streams at most from one client address.
    pub max_per_client: usize,
    /// A stream ends after this long (the page connects again).
    pub lifetime: Duration,
}

/// Why a stream was not opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// The process holds all the streams it may.
    Full,
    /// This client holds all the streams it may.
    ClientFull,
}

/// The fan-out: which intents have open pages, and a change counter for each.
pub struct StatusHub {
    engine: Engine,
    limits: StreamLimits,
    state: Mutex<HubState>,
    /// Turns true at shutdown: every stream ends.
    shutdown: watch::Receiver<bool>,
    /// Wakes the fan-out when its first page opens.
    first_open: tokio::sync::Notify,
    /// Database reads made for the live statuses: the fan-out's, and the pages' own.
    reads: LiveReads,
}

/// Database reads made for the live statuses, counted: what `payrecon bench edge` reports.
#[derive(Debug, Default)]
pub struct LiveReads {
    /// The fan-out's reads of what changed.
    pub fan_out: AtomicU64,
    /// Pages reading their intent again after a wake-up.
    pub pages: AtomicU64,
}

#[derive(Default)]
struct HubState {
    intents: HashMap<String, Watched>,
    clients: HashMap<IpAddr, usize>,
    open: usize,
    /// Pages opened while nobody watched: the fan-out's position is stale, so it starts
    /// afresh and every open page looks once.
    stale: bool,
}

struct Watched {
    changes: watch::Sender<u64>,
    streams: usize,
}

/// One open stream's place in the fan-out; dropping it closes the place.
pub(super) struct Subscription {
    hub: Arc<StatusHub>,
    intent_id: String,
    client: Option<IpAddr>,
    /// Bumped each time the intent may have changed.
    pub(super) changes: watch::Receiver<u64>,
}

impl StatusHub {
    /// The fan-out of `engine`, its task running until `shutdown`.
    pub(super) fn start(
        engine: Engine,
        limits: StreamLimits,
        shutdown: watch::Receiver<bool>,
    ) -> Arc<StatusHub> {
        let hub = Arc::new(StatusHub {
            engine,
            limits,
            state: Mutex::new(HubState::default()),
            shutdown,
            first_open: tokio::sync::Notify::new(),
            reads: LiveReads::default(),
        });
        tokio::spawn(hub.clone().run());
        hub
    }

    /// The limits streams live by.
    pub(super) fn limits(&self) -> StreamLimits {
        self.limits
    }

    /// Turns true when the process shuts down.
    pub(super) fn shutdown(&self) -> watch::Receiver<bool> {
        self.shutdown.clone()
    }

    /// A place for a stream of `intent_id`'s page from `client`, unless a cap is reached.
    pub(super) fn open(
        self: &Arc<Self>,
        intent_id: &str,
        client: Option<IpAddr>,
    ) -> Result<Subscription, Refused> {
        let mut state = self.state.lock().expect("never poisoned");
        if state.open >= self.limits.max_streams {
            return Err(Refused::Full);
        }
        if let Some(client) = client
            && state.clients.get(&client).copied().unwrap_or(0) >= self.limits.max_per_client
        {
            return Err(Refused::ClientFull);
        }
        if state.open == 0 {
            state.stale = true;
            self.first_open.notify_one();
        }
        state.open += 1;
        if let Some(client) = client {
            *state.clients.entry(client).or_default() += 1;
        }
        let watched = state
            .intents
            .entry(intent_id.to_owned())
            .or_insert_with(|| Watched {
                changes: watch::Sender::new(0),
                streams: 0,
            });
        watched.streams += 1;
        let changes = watched.changes.subscribe();
        Ok(Subscription {
            hub: self.clone(),
            intent_id: intent_id.to_owned(),
            client,
            changes,
        })
    }

    /// Open streams now: what the bench and the metrics report.
    pub fn open_streams(&self) -> usize {
        self.state.lock().expect("never poisoned").open
    }

    /// The database reads made so far for the live statuses.
    #[cfg(feature = "test-utils")]
    pub fn reads(&self) -> &LiveReads {
        &self.reads
    }

    fn close(&self, intent_id: &str, client: Option<IpAddr>) {
        let mut state = self.state.lock().expect("never poisoned");
        state.open = state.open.saturating_sub(1);
        if let Some(client) = client
            && let Some(count) = state.clients.get_mut(&client)
        {
            *count -= 1;
            if *count == 0 {
                state.clients.remove(&client);
            }
        }
        if let Some(watched) = state.intents.get_mut(intent_id) {
            watched.streams -= 1;
            if watched.streams == 0 {
                state.intents.remove(intent_id);
            }
        }
    }

    /// Wakes the pages of `intents`, or all of them.
    fn wake(&self, intents: &[String], everything: bool) {
        let state = self.state.lock().expect("never poisoned");
        let bump = |watched: &Watched| watched.changes.send_modify(|n| *n = n.wrapping_add(1));
        if everything {
            state.intents.values().for_each(bump);
        } else {
            intents
                .iter()
                .filter_map(|id| state.intents.get(id))
                .for_each(bump);
        }
    }

    /// The fan-out loop: after each of this process's commits, and every [`RECHECK`] while a
    /// page is open, read what changed and wake those pages.
    async fn run(self: Arc<Self>) {
        let mut commits = self.engine.subscribe();
        let mut shutdown = self.shutdown.clone();
        let mut position: Option<LivePosition> = None;
        // Events already acted on, within the margin the store reads again behind the newest.
        let mut seen = std::collections::BTreeSet::new();
        loop {
            let (open, stale) = {
                let mut state = self.state.lock().expect("never poisoned");
                (state.open, std::mem::take(&mut state.stale))
            };
            if stale {
                position = None;
            }
            if open > 0 {
                self.reads.fan_out.fetch_add(1, Ordering::Relaxed);
                match self.engine.live_changes(position).await {
                    Ok(mut changed) => {
                        // From a fresh position nothing is known: every page looks once.
                        let everything = changed.everything || position.is_none();
                        for (seq, intent) in changed.events {
                            if seen.insert(seq) {
                                changed.intents.push(intent);
                            }
                        }
                        let oldest_kept = changed.next.event_seq - LATE_EVENTS;
                        seen = seen.split_off(&oldest_kept);
                        self.wake(&changed.intents, everything);
                        position = Some(changed.next);
                    }
                    Err(error) => tracing::warn!(%error, "live status: cannot read changes"),
                }
            } else {
                position = None;
            }
            tokio::select! {
                _ = commits.recv() => {}
                _ = tokio::time::sleep(RECHECK), if open > 0 => {}
                _ = self.first_open.notified(), if open == 0 => {}
                () = crate::shutdown::stopped(&mut shutdown) => return,
            }
        }
    }
}

impl Subscription {
    /// Counts a page reading its intent again.
    pub(super) fn count_read(&self) {
        self.hub.reads.pages.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.close(&self.intent_id, self.client);
    }
}
