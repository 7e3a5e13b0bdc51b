//! Test support for the Tron watcher against the fake full node of
//! `payrecon_chain_tron::testkit` (blocks built from the recorded responses in
//! `fixtures/tron/`).

use std::sync::Arc;

use payrecon::Engine;
use payrecon::config::{Config, TronConfig, TronFinality};
use payrecon::test_utils::clock::ManualClock;
use payrecon_chain_core::bitcoin::bip32::{DerivationPath, Xpriv, Xpub};
use payrecon_chain_core::bitcoin::secp256k1::Secp256k1;
use payrecon_chain_core::{Asset, Method, Network};
use payrecon_chain_tron::testkit::FakeTron;
use payrecon_chain_tron::{TronScanner, TronSettings};

use super::TestDb;
use super::regtest::{Running, fast, wait_for_tip};

/// Mainnet USDT-TRC20, the configured USDT.
pub const USDT: &str = "TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6t";

/// Another TRC-20 contract that calls itself USDT.
pub const FAKE_USDT: &str = "TEQrkTwY43gnKH62mH8xQo1DKPorVZvv5r";

/// A fresh random account key on m/44'/195'/0'.
pub fn fresh_tron_xpub() -> String {
    let secp = Secp256k1::new();
    let seed = *uuid::Uuid::new_v4().as_bytes();
    let master = Xpriv::new_master(payrecon_chain_core::bitcoin::NetworkKind::Main, &seed).unwrap();
    let path: DerivationPath = "m/44'/195'/0'".parse().unwrap();
    Xpub::from_priv(&secp, &master.derive_priv(&secp, &path).unwrap()).to_string()
}

/// The `[networks.tron]` section for `node`.
pub fn tron_config(
    node: &FakeTron,
    xpub: &str,
    confirmations: u32,
    finality: TronFinality,
) -> TronConfig {
    TronConfig {
        xpub: xpub.to_owned(),
        confirmations,
        confirmation_tiers: Vec::new(),
        usdt_contract: USDT.to_owned(),
        api_url: Some(node.url.clone().into()),
        api_urls: Vec::new(),
        max_source_lag_blocks: 20,
        witness_urls: Vec::new(),
        witness_policy: Default::default(),
        witness_wait_seconds: 600,
        api_key: Some("test-key".into()),
        finality,
        start_block: None,
        poll_interval_ms: 50,
        timeout_ms: 30_000,
        max_answer_bytes: None,
        lookahead: 20,
        treasury_addresses: Vec::new(),
    }
}

/// An engine for TRX and USDT-TRC20 on `tron`: TRX at 0.25 USD, USDT at 1, the clock at the
/// real now, moved by hand.
pub async fn tron_engine(db: &TestDb, tron: &TronConfig) -> (Engine, Arc<ManualClock>) {
    let (engine, clock) = super::payments::engine_with_prices(
        db,
        tron_engine_config(tron),
        &[(Asset::Trx, "0.25"), (Asset::Usdt, "1")],
    )
    .await;
    clock.advance(chrono::Utc::now() - super::payments::start_time());
    (engine, clock)
}

/// The configuration [`tron_engine`] runs with.
pub fn tron_engine_config(tron: &TronConfig) -> Config {
    super::payments::config(|config: &mut Config| {
        config.payments.enabled_methods = vec![Method::Trx, Method::UsdtTrc20];
        config.networks.tron = Some(tron.clone());
    })
}

/// Starts the Tron watcher of `engine` the way `payrecon serve` builds it from the
/// configuration, scanning from `start_block` without a cursor yet.
pub fn watch_tron(engine: &Engine, config: &TronConfig, start_block: u64) -> Running {
    let mut settings: TronSettings = payrecon::test_utils::networks::tron_settings(config)
        .unwrap()
        .unwrap();
    settings.start_block = Some(start_block);
    Running::spawn(engine, TronScanner::new(settings), fast())
}

/// Waits until the engine's Tron watcher has committed the node's head.
pub async fn wait_synced(engine: &Engine, node: &FakeTron) {
    let head = node.head();
    wait_for_tip(engine, Network::Tron, |tip| tip.height == head).await;
}
