//! `payrecon serve`: the long-running process. It starts a watcher for every network whose
//! node is configured and moves intents past their deadlines, until asked to stop.

use std::time::Duration;

use payrecon_chain_bitcoin::{ElectrumScanner, NodeScanner};
use payrecon_chain_core::{ChainScanner, Failover, Network};
use payrecon_chain_ethereum::EthereumScanner;
use payrecon_chain_solana::SolanaScanner;
use payrecon_chain_tron::TronScanner;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::api::{ApiOptions, ServerLimits};
use crate::config::Config;
use crate::engine::Engine;
use crate::error::Error;
use crate::networks::{
    UtxoSource, electrum_sources, ethereum_sources, failover_policy, node_sources, solana_sources,
    tron_sources, utxo_source,
};
use crate::store::Backend;
use crate::watcher::{LeaseOptions, Watcher, WatcherOptions};
use crate::webhooks::WebhookSender;

/// How often intents past their deadline are looked at.
const TICK_INTERVAL: Duration = Duration::from_secs(5);

/// Runs the configured watchers and the deadline ticker until `shutdown` turns true. A watcher
/// that refuses its data source stops alone; the other networks keep running.
pub async fn serve(
    engine: Engine,
    config: &Config,
    shutdown: watch::Receiver<bool>,
) -> Result<(), Error> {
    let mut tasks = JoinSet::new();
    let watchers = Watchers::new(&engine, config)?;
    for (network, utxo) in [
        (Network::Bitcoin, &config.networks.bitcoin),
        (Network::Litecoin, &config.networks.litecoin),
    ] {
        let Some(utxo) = utxo else { continue };
        let method = network.native_method();
        let Some(source) = utxo_source(network, utxo)? else {
            if utxo.watch && config.payments.enabled_methods.contains(&method) {
                return Err(Error::Config(format!(
                    "networks.{network}: {method} is enabled but neither networks.{network}.electrum_url nor networks.{network}.rpc_url is set, so its payments would never be seen (set one, or watch = false if another process watches it)"
                )));
            }
            tracing::info!(%network, "no electrum_url or rpc_url: not watching");
            continue;
        };
        if !utxo.watch {
            tracing::info!(%network, "watch = false: not watching");
            continue;
        }
        match source {
            UtxoSource::Electrum(_) => {
                let sources = electrum_sources(network, utxo)?;
                watchers.spawn_sources(
                    &mut tasks,
                    network,
                    sources.into_iter().map(ElectrumScanner::new).collect(),
                    (utxo.max_source_lag_blocks, utxo.poll_interval_ms),
                    &shutdown,
                );
            }
            UtxoSource::Node(_) => {
                let sources = node_sources(network, utxo)?;
                watchers.spawn_sources(
                    &mut tasks,
                    network,
                    sources.into_iter().map(NodeScanner::new).collect(),
                    (utxo.max_source_lag_blocks, utxo.poll_interval_ms),
                    &shutdown,
                );
            }
        }
    }
    if let Some(ethereum) = &config.networks.ethereum {
        let sources = ethereum_sources(ethereum)?;
        watchers.spawn_sources(
            &mut tasks,
            Network::Ethereum,
            sources.into_iter().map(EthereumScanner::new).collect(),
            (ethereum.max_source_lag_blocks, ethereum.poll_interval_ms),
            &shutdown,
        );
    }
    if let Some(tron) = &config.networks.tron {
        let sources = tron_sources(tron)?;
        watchers.spawn_sources(
            &mut tasks,
            Network::Tron,
            sources.into_iter().map(TronScanner::new).collect(),
            (tron.max_source_lag_blocks, tron.poll_interval_ms),
            &shutdown,
        );
    }
    if let Some(solana) = &config.networks.solana {
        let sources = solana_sources(solana)?;
        watchers.spawn_sources(
            &mut tasks,
            Network::Solana,
            sources.into_iter().map(SolanaScanner::new).collect(),
            (solana.max_source_lag_blocks, solana.poll_interval_ms),
            &shutdown,
        );
    }
    let limits = ServerLimits {
        header_read_timeout: Duration::from_millis(u64::from(
            config.http.header_read_timeout_ms.max(1),
        )),
        max_connections: config.http.max_connections,
        drain: Duration::from_secs(u64::from(config.serve.shutdown_seconds)),
    };
    let http = &config.http;
    if http.listen.is_some() || http.metrics_listen.is_some() {
        let options = ApiOptions::from_config(config);
        let routers = crate::api::routers(engine.clone(), options, shutdown.clone());
        for (listen, app, what) in [
            (&http.listen, routers.api, "the HTTP API"),
            (&http.metrics_listen, routers.metrics, "/metrics"),
        ] {
            let Some(listen) = listen else { continue };
            let listener = bind(listen).await?;
            tracing::info!(address = %listen, "serving {what}");
            tasks.spawn(serve_http(listener, app, limits, shutdown.clone()));
        }
    }
    if !config.webhooks.is_empty() {
        let sender = WebhookSender::new(engine.clone(), config.webhooks.clone())?;
        tasks.spawn(sender.run(shutdown.clone()));
    }
    tasks.spawn(value_until(engine.clone(), shutdown.clone()));
    if config.payments.holdings_check_minutes > 0 {
        let every = Duration::from_secs(60 * u64::from(config.payments.holdings_check_minutes));
        tasks.spawn(check_holdings_every(
            engine.clone(),
            config.clone(),
            every,
            shutdown.clone(),
        ));
    }
    tasks.spawn(tick_until(engine, shutdown));
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::error!(%error, "a task of serve stopped"),
            Err(error) => tracing::error!(%error, "a task of serve panicked"),
        }
    }
    Ok(())
}

async fn bind(listen: &str) -> Result<tokio::net::TcpListener, Error> {
    tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| Error::Config(format!("cannot listen on {listen}: {e}")))
}

async fn serve_http(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: ServerLimits,
    shutdown: watch::Receiver<bool>,
) -> Result<(), Error> {
    crate::api::serve(listener, app, limits, shutdown)
        .await
        .map_err(|e| Error::Config(format!("the HTTP server stopped: {e}")))
}

/// How this process runs its watchers: on PostgreSQL each under a lease (several processes
/// share the database, one watches each network); on SQLite as the only process that does.
struct Watchers {
    engine: Engine,
    /// What every watcher runs with but its polling interval.
    options: WatcherOptions,
    lease: Option<LeaseOptions>,
    /// Held for the life of serve: the SQLite single-process guard.
    _guard: Option<std::fs::File>,
}

impl Watchers {
    fn new(engine: &Engine, config: &Config) -> Result<Watchers, Error> {
        let (lease, guard) = match engine.db().backend() {
            Backend::Postgres => {
                let lease = LeaseOptions {
                    holder: format!("{}-{}", std::process::id(), uuid::Uuid::new_v4().simple()),
                    ttl: Duration::from_secs(u64::from(config.serve.lease_seconds.max(1))),
                    stall: Duration::from_secs(u64::from(config.serve.stall_seconds.max(1))),
                };
                tracing::info!(holder = %lease.holder, "watchers run under leases");
                (Some(lease), None)
            }
            Backend::Sqlite => (None, sqlite_guard(config.database_url.expose())?),
        };
        Ok(Watchers {
            engine: engine.clone(),
            options: WatcherOptions {
                scan_deadline: Duration::from_secs(u64::from(
                    config.serve.scan_deadline_seconds.max(1),
                )),
                // Half the process's deadline: the rest is for the HTTP drain and the last
                // commits.
                shutdown_grace: Duration::from_secs(u64::from(config.serve.shutdown_seconds)) / 2,
                ..WatcherOptions::default()
            },
            lease,
            _guard: guard,
        })
    }

    /// Runs a watcher over `scanner` among the tasks of serve.
    /// Starts a network's watcher over its sources in order (`max_lag_blocks` apart at most,
    /// polled every `poll_interval_ms`), or says that none is configured.
    fn spawn_sources<S: ChainScanner + 'static>(
        &self,
        tasks: &mut JoinSet<Result<(), Error>>,
        network: Network,
        sources: Vec<S>,
        (max_lag_blocks, poll_interval_ms): (u64, u32),
        shutdown: &watch::Receiver<bool>,
    ) {
        let Some(first) = sources.first() else {
            tracing::info!(%network, "no source configured (rpc_url, api_url): not watching");
            return;
        };
        tracing::info!(%network, url = %first.source(), sources = sources.len(), "starting the watcher");
        let scanner = Failover::new(sources, failover_policy(max_lag_blocks));
        self.spawn(tasks, scanner, poll_interval_ms, shutdown);
    }

    fn spawn<S: ChainScanner + 'static>(
        &self,
        tasks: &mut JoinSet<Result<(), Error>>,
        scanner: S,
        poll_interval_ms: u32,
        shutdown: &watch::Receiver<bool>,
    ) {
        let options = WatcherOptions {
            poll_interval: Duration::from_millis(u64::from(poll_interval_ms.max(50))),
            ..self.options.clone()
        };
        let mut watcher = Watcher::new(self.engine.clone(), scanner, options);
        if let Some(lease) = &self.lease {
            watcher = watcher.with_lease(lease.clone());
        }
        tasks.spawn(watcher.run(shutdown.clone()));
    }
}

/// SQLite is single-process: a second `payrecon serve` on the same file would run a second
/// set of watchers. An exclusive lock on `<database>.watchers.lock` says so at start.
fn sqlite_guard(database_url: &str) -> Result<Option<std::fs::File>, Error> {
    let path = database_url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let path = path.split('?').next().unwrap_or_default();
    if path.is_empty() || path.contains(":memory:") {
        return Ok(None);
    }
    let lock_path = format!("{path}.watchers.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| Error::Config(format!("cannot open {lock_path}: {e}")))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Config(format!(
            "another payrecon serve is running watchers on {path} (it holds {lock_path}); SQLite is single-process: use PostgreSQL to run several"
        ))),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(Error::Config(format!("cannot lock {lock_path}: {e}")))
        }
    }
}

/// How often the books' valuation pass runs: a payment's value at receipt is taken within
/// about this long of its settlement, which itself never waits for a rate.
const VALUATION_INTERVAL: Duration = Duration::from_secs(15);

/// Gives new journal entries their fiat value every [`VALUATION_INTERVAL`]; entries whose
/// rate cannot be had now stay unvalued (finance sees them) and are tried again.
async fn value_until(engine: Engine, mut shutdown: watch::Receiver<bool>) -> Result<(), Error> {
    loop {
        if *shutdown.borrow() {
            return Ok(());
        }
        if let Err(error) = engine.value_entries().await {
            tracing::warn!(%error, "valuation pass failed; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(VALUATION_INTERVAL) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Runs the holdings check every `every`, the first a minute after start (the watchers have
/// read their first rounds by then).
async fn check_holdings_every(
    engine: Engine,
    config: Config,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), Error> {
    let mut wait = every.min(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return Ok(());
        }
        match engine.check_holdings(&config).await {
            Ok(checks) => {
                for check in checks
                    .iter()
                    .filter(|c| c.unexplained > 0 || c.error.is_some())
                {
                    tracing::warn!(network = %check.network, unexplained = check.unexplained, error = ?check.error, "the holdings check found money no receipt explains, or could not run");
                }
            }
            Err(error) => tracing::warn!(%error, "holdings check failed; retrying at the next"),
        }
        wait = every;
    }
}

/// Moves intents past their deadline every few seconds.
async fn tick_until(engine: Engine, mut shutdown: watch::Receiver<bool>) -> Result<(), Error> {
    loop {
        if *shutdown.borrow() {
            return Ok(());
        }
        match engine.tick().await {
            Ok(looked_at) if looked_at == crate::payments::TICK_BATCH => continue,
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "deadline tick failed; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(TICK_INTERVAL) => {}
            _ = shutdown.changed() => {}
        }
    }
}
