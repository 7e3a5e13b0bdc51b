//! The watcher loop: one per network. It keeps the engine's view of the network in memory
//! (`view`), lets the chain's scanner find what changed, and commits the events with the
//! scanner's cursor in one transaction. Failures of the node are retried with backoff and never
//! skip data. An answer that cannot be trusted stops this network's watcher and says why; it
//! tries again after a long, capped pause (a node mended, a proxy fixed), except when the node
//! serves the wrong chain: that stays stopped until the configuration changes. Every scan has a
//! deadline, and every error text is scrubbed of the source's credentials before it is logged
//! or stored.

mod ahead;
mod holdings;
mod refunds;
mod view;
mod witness;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use payrecon_chain_core::{
    Amount, BlockId, ChainEvent, ChainScanner, Network, ScanBatch, ScanError,
};
use serde::Serialize;
use tokio::sync::watch;

use crate::engine::Engine;
use crate::error::Error;
use crate::leases::Lease;
use crate::records::WatcherHealth;

pub use view::LiveView;
#[cfg(feature = "test-utils")]
pub use view::Refresh;

/// How often to scan and how to back off.
#[derive(Clone, Debug)]
pub struct WatcherOptions {
    /// Pause between scans when nothing is pending. New intents wake the watcher earlier.
    pub poll_interval: Duration,
    /// First pause after a failure; doubled per consecutive failure.
    pub min_backoff: Duration,
    /// Longest pause after failures.
    pub max_backoff: Duration,
    /// First pause after the source was refused (an answer that cannot be trusted); doubled
    /// per refusal in a row.
    pub min_restart: Duration,
    /// Longest pause after refusals.
    pub max_restart: Duration,
    /// Longest a scan may take before it counts as failed: a node that accepts and never
    /// answers, or answers slower than its timeouts can see, holds no watcher longer.
    pub scan_deadline: Duration,
    /// After shutdown is asked, how long the round under way may still take to finish.
    pub shutdown_grace: Duration,
}

impl Default for WatcherOptions {
    fn default() -> WatcherOptions {
        WatcherOptions {
            poll_interval: Duration::from_secs(2),
            min_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(60),
            min_restart: Duration::from_secs(60),
            max_restart: Duration::from_secs(30 * 60),
            scan_deadline: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// What a watcher is doing, for logs, health checks and operators.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum WatcherState {
    /// Not scanned yet.
    Starting,
    /// The last scan succeeded.
    Running,
    /// The last scans failed; retrying.
    Retrying {
        /// Failures in a row.
        failures: u32,
        /// The newest failure.
        error: String,
    },
    /// Another process holds this network's lease; this one waits to take over.
    Standby,
    /// Stopped: the data source could not be trusted (until `next_try_at`), serves the wrong
    /// chain (for good), or shutdown was asked.
    Stopped {
        /// Why, or `None` after a requested shutdown.
        error: Option<String>,
        /// When the watcher tries again; `None` when it does not.
        next_try_at: Option<DateTime<Utc>>,
    },
}

/// A watcher's health at one moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WatcherStatus {
    /// The network.
    pub network: Network,
    /// Running, retrying or stopped.
    #[serde(flatten)]
    pub state: WatcherState,
    /// The chain tip of the last committed scan.
    pub tip: Option<BlockId>,
    /// When the last scan succeeded.
    pub last_scan_at: Option<DateTime<Utc>>,
    /// Events committed since start.
    pub events_applied: u64,
    /// The node's newest block at the last scan.
    pub head: Option<u64>,
    /// Failed rounds since start (node errors, timeouts, refused answers).
    pub rpc_errors: u64,
    /// Answers the source gave that left out part of a block (and were read again), since
    /// start.
    pub incomplete_answers: u64,
    /// Zero-value transfers to watched addresses (address poisoning) ignored since start.
    pub zero_value_ignored: u64,
    /// The start (engine clock) of the last round that reached the source's newest block:
    /// every transaction the source held then is read and committed.
    pub chain_read_until: Option<DateTime<Utc>>,
    /// Which of the network's sources serves, its credentials hidden.
    pub source: String,
}

/// Running under a lease: several processes share the database, one watches each network.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    /// This process's unique name.
    pub holder: String,
    /// How long a lease lasts unless renewed: a dead holder is replaced after it.
    pub ttl: Duration,
    /// A holder none of whose rounds completed for this long is stalled: it stops renewing,
    /// and is replaced a lease time later.
    pub stall: Duration,
}

/// One network's watcher: a scanner driven against the engine.
pub struct Watcher<S> {
    engine: Engine,
    scanner: S,
    options: WatcherOptions,
    status: watch::Sender<WatcherStatus>,
    lease_options: Option<LeaseOptions>,
    /// The lease held.
    lease: Option<Lease>,
    /// When the last round ended (either way): what tells a slow round from a stalled one.
    last_round: Arc<Mutex<Instant>>,
    /// The network's view, once read; rebuilt after the lease changes hands.
    live: Option<LiveView>,
    /// A round since the last caught-up one found money ahead of a key's counter: the window
    /// moved, and new addresses wait for a round that looks at where it lies now.
    found_ahead: bool,
    /// The network's witnesses, when it has some: asked about each receipt before it is
    /// credited.
    witnesses: Option<witness::Witnesses>,
    /// Refunds waiting for the chain, looked at on this watcher's source.
    refunds: refunds::RefundWatch,
    /// The engine's wake-ups (a new intent), while rounds run: drained right after a round's
    /// own commit, so one that comes later starts the next round at once.
    wake: Option<tokio::sync::broadcast::Receiver<()>>,
}

/// Why a run of rounds ended without an error.
enum RunEnd {
    Shutdown,
    LeaseLost,
}

/// What one round did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Round {
    /// Events committed.
    pub events: usize,
    /// The scanner has more to do right away.
    pub more: bool,
}

impl<S: ChainScanner> Watcher<S> {
    /// A watcher for the scanner's network.
    pub fn new(engine: Engine, scanner: S, options: WatcherOptions) -> Watcher<S> {
        let status = watch::Sender::new(WatcherStatus {
            network: scanner.network(),
            state: WatcherState::Starting,
            tip: None,
            last_scan_at: None,
            events_applied: 0,
            head: None,
            rpc_errors: 0,
            incomplete_answers: 0,
            zero_value_ignored: 0,
            chain_read_until: None,
            source: scanner.source().to_string(),
        });
        let witnesses = witness::Witnesses::of(&engine, scanner.network());
        Watcher {
            engine,
            scanner,
            options,
            status,
            lease_options: None,
            lease: None,
            last_round: Arc::new(Mutex::new(Instant::now())),
            live: None,
            found_ahead: false,
            witnesses,
            refunds: refunds::RefundWatch::new(),
            wake: None,
        }
    }

    /// Runs only while holding the network's lease (shared PostgreSQL): waits in standby
    /// while another process holds it, and takes over when it expires.
    pub fn with_lease(mut self, options: LeaseOptions) -> Watcher<S> {
        self.lease_options = Some(options);
        self
    }

    /// Follows this watcher's health.
    #[cfg(feature = "test-utils")]
    pub fn status(&self) -> watch::Receiver<WatcherStatus> {
        self.status.subscribe()
    }

    /// One scan and its commit. A failed round changed nothing: repeating it is safe.
    pub async fn round(&mut self) -> Result<Round, ScanError> {
        let network = self.scanner.network();
        let round = self.round_once(network).await;
        *self.last_round.lock().expect("never poisoned") = Instant::now();
        let incomplete = self.scanner.incomplete_answers();
        let source = self.scanner.source().to_string();
        self.status.send_if_modified(|s| {
            let changed = s.incomplete_answers != incomplete || s.source != source;
            s.incomplete_answers = incomplete;
            s.source = source;
            changed
        });
        round.map_err(|error| error.scrubbed(self.scanner.source()))
    }

    async fn round_once(&mut self, network: Network) -> Result<Round, ScanError> {
        if self.lease_options.is_some() && self.lease.is_none() {
            return Err(ScanError::Transient(LEASE_LOST.into()));
        }
        let live = match &mut self.live {
            Some(live) => {
                live.refresh(&self.engine).await.map_err(engine_failure)?;
                live
            }
            None => self.live.insert(
                LiveView::load(&self.engine, network)
                    .await
                    .map_err(engine_failure)?,
            ),
        };
        let view = live.view();
        // Whatever the source holds at this moment, a round that reaches its head reads.
        let started = self.engine.clock().now();
        let deadline = self.options.scan_deadline;
        let mut batch = tokio::time::timeout(deadline, self.scanner.scan(view))
            .await
            .map_err(|_| {
                ScanError::Transient(format!(
                    "the scan did not finish within its deadline of {deadline:?}"
                ))
            })??;
        let poisoning = drop_zero_value(&mut batch);
        if !batch.events.is_empty() || !batch.outflows.is_empty() {
            crate::crash::crash_point("watcher.after_scan");
        }
        let events = batch.events.len() + batch.outflows.len();
        if events > 0 || view.cursor.as_ref() != Some(&batch.cursor) {
            let verdicts = match &mut self.witnesses {
                Some(witnesses) => {
                    let source = self.scanner.source().to_string();
                    let now = self.engine.clock().now();
                    witnesses
                        .review(&self.engine, &mut batch, &source, now)
                        .await
                        .map_err(engine_failure)?
                }
                None => crate::store::witness::Verdicts::default(),
            };
            let unissued = live.unissued(&batch.events);
            self.found_ahead |= !unissued.is_empty();
            let applied = self
                .engine
                .apply_scan(network, &batch, &unissued, &verdicts, self.lease.as_ref())
                .await;
            if let Err(Error::LeaseLost(_)) = applied {
                self.lease = None;
                return Err(ScanError::Transient(LEASE_LOST.into()));
            }
            applied.map_err(engine_failure)?;
            // Our own commit notified every subscriber, us included; an intent made after it
            // (during the refund look, the status update) must wake the next round.
            if let Some(wake) = self.wake.as_mut() {
                while wake.try_recv().is_ok() {}
            }
        }
        if events > 0 {
            tracing::info!(%network, events, tip = batch.cursor.tip.height, "chain events committed");
        }
        if !batch.more {
            self.refunds
                .look(&self.engine, &mut self.scanner, network)
                .await
                .map_err(engine_failure)?;
        }
        self.status.send_modify(|status| {
            status.state = WatcherState::Running;
            status.tip = Some(batch.cursor.tip.clone());
            status.last_scan_at = Some(Utc::now());
            status.events_applied += events as u64;
            status.head = Some(batch.head);
            status.zero_value_ignored += poisoning as u64;
            if !batch.more {
                status.chain_read_until = Some(started);
            }
        });
        publish(&self.engine, &self.status).await;
        Ok(Round {
            events,
            more: batch.more,
        })
    }

    /// Runs rounds until `shutdown` turns true or the data source is refused. Under a lease,
    /// waits for it in standby first, and goes back to standby when it is lost.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), Error> {
        let Some(options) = self.lease_options.clone() else {
            self.run_rounds(&mut shutdown).await?;
            return Ok(());
        };
        let network = self.scanner.network();
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            match self
                .engine
                .acquire_lease(network, &options.holder, options.ttl)
                .await
            {
                Ok(Some(lease)) => {
                    tracing::info!(%network, holder = %options.holder, token = lease.token, "watcher lease taken");
                    self.lease = Some(lease.clone());
                    // Another holder wrote in between: read the view whole once.
                    self.live = None;
                    *self.last_round.lock().expect("never poisoned") = Instant::now();
                    // Renewals run as a task of their own: a round that keeps its thread busy (a
                    // long first scan of a blocking client) never starves them.
                    let mut keep = RenewalTask(tokio::spawn(keep_lease(
                        self.engine.clone(),
                        lease,
                        options.clone(),
                        self.last_round.clone(),
                    )));
                    let end = tokio::select! {
                        end = self.run_rounds(&mut shutdown) => end?,
                        // Lost (or given up as stalled): the round under way is dropped; it
                        // changed nothing that counts, and its write would be fenced off.
                        _ = &mut keep.0 => {
                            self.lease = None;
                            RunEnd::LeaseLost
                        }
                    };
                    match end {
                        RunEnd::Shutdown => {
                            if let Some(lease) = self.lease.take()
                                && let Err(error) = self.engine.release_lease(&lease).await
                            {
                                tracing::warn!(%network, %error, "cannot release the watcher lease");
                            }
                            return Ok(());
                        }
                        RunEnd::LeaseLost => {
                            tracing::warn!(%network, "watcher lease lost to another process: standing by");
                            self.scanner.reset();
                        }
                    }
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(%network, %error, "cannot read the watcher lease"),
            }
            self.status.send_modify(|s| s.state = WatcherState::Standby);
            tokio::select! {
                _ = tokio::time::sleep(options.ttl / 3) => {}
                _ = shutdown.changed() => {}
            }
        }
    }

    /// The rounds of a watcher that may write: until shutdown, a refused data source (an
    /// error), or a lost lease.
    async fn run_rounds(&mut self, shutdown: &mut watch::Receiver<bool>) -> Result<RunEnd, Error> {
        let network = self.scanner.network();
        let mut gate = HandoutGuard::close(&self.engine, network);
        self.engine.restore_if_backup_copy().await?;
        self.wake = Some(self.engine.subscribe());
        let mut failures: u32 = 0;
        let mut refusals: u32 = 0;
        loop {
            if *shutdown.borrow() {
                self.status.send_modify(|s| {
                    s.state = WatcherState::Stopped {
                        error: None,
                        next_try_at: None,
                    }
                });
                publish(&self.engine, &self.status).await;
                return Ok(RunEnd::Shutdown);
            }
            // At shutdown the round under way gets a grace to finish and commit; one that hangs
            // on its node is dropped (it committed nothing, and the next start does it again).
            let grace = self.options.shutdown_grace;
            let mut stopping = shutdown.clone();
            let round = tokio::select! {
                round = self.round() => round,
                () = async {
                    crate::shutdown::stopped(&mut stopping).await;
                    tokio::time::sleep(grace).await;
                } => continue,
            };
            if self.lease_options.is_some() && self.lease.is_none() {
                return Ok(RunEnd::LeaseLost);
            }
            let pause = match round {
                Ok(round) => {
                    failures = 0;
                    refusals = 0;
                    if round.more {
                        continue;
                    }
                    if !std::mem::take(&mut self.found_ahead) {
                        if self.live.as_ref().is_some_and(LiveView::restore_pending)
                            && let Err(e) = self.engine.settle_restore(network).await
                        {
                            tracing::warn!(%network, error = %e, "could not record the look past the counters of a restored database; trying again next round");
                        }
                        gate.open();
                    }
                    self.options.poll_interval
                }
                Err(ScanError::WrongChain(reason)) => {
                    tracing::error!(%network, %reason, "WATCHER STOPPED FOR GOOD: the node serves the wrong chain; fix its configuration and restart payrecon");
                    self.status.send_modify(|s| {
                        s.state = WatcherState::Stopped {
                            error: Some(format!("wrong chain: {reason}")),
                            next_try_at: None,
                        };
                        s.rpc_errors += 1;
                    });
                    publish(&self.engine, &self.status).await;
                    return Err(Error::WatcherStopped { network, reason });
                }
                Err(ScanError::Fatal(reason)) => {
                    refusals = refusals.saturating_add(1);
                    self.scanner.reset();
                    // What was read may be what could not be trusted: read it all again.
                    self.live = None;
                    let pause = restart_pause(&self.options, refusals);
                    let next_try_at = Utc::now()
                        + chrono::Duration::from_std(pause).unwrap_or(chrono::Duration::MAX);
                    tracing::error!(%network, %reason, next_try_at = %next_try_at.to_rfc3339(), "watcher stopped: it tries again later");
                    self.status.send_modify(|s| {
                        s.state = WatcherState::Stopped {
                            error: Some(reason.clone()),
                            next_try_at: Some(next_try_at),
                        };
                        s.rpc_errors += 1;
                    });
                    publish(&self.engine, &self.status).await;
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = shutdown.changed() => {}
                    }
                    continue;
                }
                Err(ScanError::Transient(reason)) => {
                    failures = failures.saturating_add(1);
                    self.scanner.reset();
                    let pause = backoff(&self.options, failures);
                    tracing::warn!(%network, %reason, failures, retry_in = ?pause, "watcher round failed");
                    self.status.send_modify(|s| {
                        s.state = WatcherState::Retrying {
                            failures,
                            error: reason.clone(),
                        };
                        s.rpc_errors += 1;
                    });
                    publish(&self.engine, &self.status).await;
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = shutdown.changed() => {}
                    }
                    continue;
                }
            };
            let woken = async {
                match self.wake.as_mut() {
                    Some(wake) => drop(wake.recv().await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                () = woken => {}
                _ = self.scanner.news() => {}
                _ = shutdown.changed() => {}
            }
        }
    }
}

/// The lease renewal task, stopped with the rounds it serves however they end.
struct RenewalTask(tokio::task::JoinHandle<()>);

impl Drop for RenewalTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Renews the lease every third of its time while rounds keep completing; returns when it
/// was lost to another process, or when no round completed for the stall time (it then stops
/// renewing, so another process takes over).
async fn keep_lease(
    engine: Engine,
    lease: Lease,
    options: LeaseOptions,
    last_round: Arc<Mutex<Instant>>,
) {
    loop {
        tokio::time::sleep(options.ttl / 3).await;
        let since = last_round.lock().expect("never poisoned").elapsed();
        if since > options.stall {
            tracing::error!(network = %lease.network, ?since, "watcher stalled: giving its lease up");
            return;
        }
        match engine.renew_lease(&lease, options.ttl).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(error) => {
                tracing::warn!(network = %lease.network, %error, "cannot renew the watcher lease")
            }
        }
    }
}

/// Takes the zero-value receipts out of a scan, and says how many there were. Anyone can make
/// a token log a transfer of 0 "from" a lookalike address to any address (`transferFrom` with
/// an allowance of 0), and on Tron this is done to almost every address that receives USDT: it
/// is address poisoning, not a payment, so it never reaches an intent, a page, a webhook or an
/// exception, and is only counted (`/metrics`).
fn drop_zero_value(batch: &mut ScanBatch) -> usize {
    let before = batch.events.len();
    batch.events.retain(|event| match event {
        ChainEvent::Observed { transfer, .. } => transfer.amount != Amount::ZERO,
        ChainEvent::Removed { .. } => true,
    });
    before - batch.events.len()
}

/// The transient error of a round whose lease was lost.
const LEASE_LOST: &str = "the watcher lease was lost to another process";

/// Writes the status where operators and other processes read it (`payrecon stuck`,
/// `/metrics`). Failing to write it is logged: health must never stop a watcher.
async fn publish(engine: &Engine, status: &watch::Sender<WatcherStatus>) {
    let status = status.borrow().clone();
    let (state, failures, last_error, next_try_at) = match &status.state {
        WatcherState::Starting => ("starting", 0, None, None),
        WatcherState::Running => ("running", 0, None, None),
        WatcherState::Retrying { failures, error } => {
            ("retrying", *failures, Some(error.clone()), None)
        }
        WatcherState::Stopped { error, next_try_at } => ("stopped", 0, error.clone(), *next_try_at),
        // The lease holder reports for the network; a process in standby has nothing to say.
        WatcherState::Standby => return,
    };
    let health = WatcherHealth {
        network: status.network.to_string(),
        state: state.to_owned(),
        cursor_height: status.tip.as_ref().map(|tip| tip.height),
        head_height: status.head,
        failures: u64::from(failures),
        rpc_errors: status.rpc_errors,
        incomplete_answers: status.incomplete_answers,
        zero_value_ignored: status.zero_value_ignored,
        last_error,
        last_scan_at: status.last_scan_at,
        chain_read_until: status.chain_read_until,
        active_source: Some(status.source.clone()),
        next_try_at,
        updated_at: Utc::now(),
    };
    if let Err(error) = engine.record_watcher_health(&health).await {
        tracing::warn!(network = %status.network, %error, "cannot record watcher health");
    }
}

/// The pause after `failures` failures in a row: doubling from the minimum, capped.
/// Keeps a network's new addresses held back while its watcher runs its first rounds, and
/// lets them go however the rounds end.
struct HandoutGuard {
    engine: Engine,
    network: Network,
}

impl HandoutGuard {
    /// Holds back `network`'s new addresses when it has keys watched ahead of their counters.
    fn close(engine: &Engine, network: Network) -> HandoutGuard {
        if engine
            .payment_settings()
            .keys
            .get(&network)
            .is_some_and(|keys| keys.lookahead > 0)
        {
            engine.handout().close(network);
        }
        HandoutGuard {
            engine: engine.clone(),
            network,
        }
    }

    fn open(&mut self) {
        self.engine.handout().open(self.network);
    }
}

impl Drop for HandoutGuard {
    fn drop(&mut self) {
        self.open();
    }
}

fn backoff(options: &WatcherOptions, failures: u32) -> Duration {
    doubling(options.min_backoff, options.max_backoff, failures)
}

/// The pause after `refusals` refused sources in a row: doubling from the minimum, capped.
fn restart_pause(options: &WatcherOptions, refusals: u32) -> Duration {
    doubling(options.min_restart, options.max_restart, refusals)
}

/// `first`, doubled per occurrence after the first, at most `most`.
fn doubling(first: Duration, most: Duration, occurrences: u32) -> Duration {
    let factor = 1u32 << occurrences.saturating_sub(1).min(16);
    first.saturating_mul(factor).min(most)
}

/// A batch the engine refuses is a scanner bug: stop. Anything else (the database) is retried.
fn engine_failure(error: Error) -> ScanError {
    match error {
        Error::InvalidEvent(reason) => {
            ScanError::Fatal(format!("the engine refused the batch: {reason}"))
        }
        other => ScanError::Transient(format!("engine: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let options = WatcherOptions {
            poll_interval: Duration::from_secs(1),
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            ..WatcherOptions::default()
        };
        let pauses: Vec<u128> = (1..=6).map(|n| backoff(&options, n).as_millis()).collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff(&options, u32::MAX), Duration::from_secs(1));
    }
}
