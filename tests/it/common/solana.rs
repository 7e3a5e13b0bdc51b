//! Test support for the Solana watcher against the fake JSON-RPC node of
//! `payrecon_chain_solana::testkit` (answers built from the documented responses in
//! `fixtures/solana/`).

use std::sync::Arc;
use std::time::Duration;

use payrecon::Engine;
use payrecon::config::{Config, SolanaConfig};
use payrecon::test_utils::clock::ManualClock;
use payrecon::test_utils::watcher::WatcherOptions;
use payrecon_chain_core::{Asset, Method};
use payrecon_chain_solana::SolanaScanner;
use payrecon_chain_solana::testkit::{FakeSolana, random_pubkey};

use super::TestDb;
use super::regtest::{Running, fast};

/// The `[networks.solana]` section for `node`, paying a fresh recipient.
pub fn solana_config(node: &FakeSolana) -> SolanaConfig {
    SolanaConfig {
        recipient: random_pubkey(),
        confirmations: 1,
        confirmation_tiers: Vec::new(),
        rpc_url: Some(node.url.clone().into()),
        rpc_urls: Vec::new(),
        max_source_lag_blocks: 150,
        witness_urls: Vec::new(),
        witness_policy: Default::default(),
        witness_wait_seconds: 600,
        references_per_scan: 100,
        poll_interval_ms: 50,
        timeout_ms: 30_000,
        max_answer_bytes: None,
        treasury_addresses: Vec::new(),
    }
}

/// An engine for SOL on `solana`: SOL at 100 USD, the clock at the real now, moved by hand.
pub async fn solana_engine(db: &TestDb, solana: &SolanaConfig) -> (Engine, Arc<ManualClock>) {
    let config = super::payments::config(|config: &mut Config| {
        config.payments.enabled_methods = vec![Method::Sol];
        config.networks.solana = Some(solana.clone());
    });
    let (engine, clock) =
        super::payments::engine_with_prices(db, config, &[(Asset::Sol, "100")]).await;
    clock.advance(chrono::Utc::now() - super::payments::start_time());
    (engine, clock)
}

/// Starts the Solana watcher of `engine` the way `payrecon serve` builds it, with requests
/// timing out after a second.
pub fn watch_solana(engine: &Engine, config: &SolanaConfig) -> Running {
    watch_solana_with(engine, config, fast())
}

/// [`watch_solana`] with these watcher options.
pub fn watch_solana_with(
    engine: &Engine,
    config: &SolanaConfig,
    options: WatcherOptions,
) -> Running {
    let mut settings = payrecon::test_utils::networks::solana_settings(config)
        .unwrap()
        .unwrap();
    settings.timeout = Duration::from_secs(1);
    Running::spawn(engine, SolanaScanner::new(settings), options)
}
