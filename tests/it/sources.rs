//! Several sources per network, in order, on SQLite and PostgreSQL: a real anvil node behind
//! two proxies that go down and lag the way providers do, and Litecoin (ElectrumX), Tron and
//! Solana (the replayed nodes) whose first configured source is down. The watcher goes on with
//! the next source, and comes back to the first once it is healthy and current.

use crate::common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::anvil::{Anvil, RpcProxy, eth_config, eth_engine_of, ethereum, fresh_ethereum_xpub};
use common::checks::{cents, order, sound, wait_status};
use common::regtest::{Chain, Running, eventually, fast, fresh_account_xpub, litecoin, ltc_engine};
use common::topup;
use payrecon::IntentStatus;
use payrecon::test_utils::clock::Clock;
use payrecon_chain_bitcoin::ElectrumScanner;
use payrecon_chain_core::{Failover, FailoverPolicy, Method, Network};
use payrecon_chain_ethereum::EthereumScanner;

/// 0.05 ETH, what a 100 USD top-up costs at 2000 USD per ETH.
const TOPUP_WEI: u128 = 50_000_000_000_000_000;

on_both_databases! {
    async fn a_source_down_or_lagging_hands_the_watcher_to_the_next(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let first = RpcProxy::start(&anvil.url, 10_000, 0).await;
        let second = RpcProxy::start(&anvil.url, 10_000, 0).await;
        // The configuration names both, in order.
        let mut section = ethereum(&anvil, &tokens, &fresh_ethereum_xpub(), 1);
        section.rpc_url = Some(first.url.clone().into());
        section.rpc_urls = vec![second.url.clone().into()];
        section.start_block = Some(anvil.head().await);
        let sources = payrecon::test_utils::networks::ethereum_sources(&section).unwrap();
        assert_eq!(sources.iter().map(|s| s.url.to_string()).collect::<Vec<_>>(), [first.url.clone(), second.url.clone()]);
        let (engine, _clock) = eth_engine_of(&db, eth_config(section.clone())).await;
        let policy = FailoverPolicy {
            max_lag_blocks: section.max_source_lag_blocks,
            lag_check_every: Duration::ZERO,
            retry_first_after: Duration::from_secs(1),
        };
        let scanner = Failover::new(sources.into_iter().map(EthereumScanner::new).collect(), policy);
        let watcher = Running::spawn(&engine, scanner, fast());
        anvil.wait_synced(&engine).await;
        let serving = |proxy: &RpcProxy| proxy.url.clone();
        assert_eq!(watcher.status.borrow().source, serving(&first));

        // The first provider goes down: the second serves, and a payment settles.
        first.down.store(true, Ordering::SeqCst);
        engine.create_topup(&topup("FAILOVER", "95", "100")).await.unwrap();
        let pay = engine.create_payment(&order("FAILOVER"), Method::Eth).await.unwrap().intent;
        anvil.send_eth(&pay.pay_to, TOPUP_WEI).await;
        anvil.mine(1).await;
        wait_status(&engine, &pay.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "95").await, 10_000);
        assert_eq!(watcher.status.borrow().source, serving(&second));
        let metrics = payrecon::test_utils::api::metrics_text(&engine).await.unwrap();
        assert!(metrics.contains(&format!("payrecon_source_active{{network=\"ethereum\",source=\"{}\"}} 1", serving(&second))), "{metrics}");

        // It answers again: the watcher comes back to it.
        first.down.store(false, Ordering::SeqCst);
        eventually("the watcher to come back to the first source", || async {
            anvil.mine(1).await;
            watcher.status.borrow().source == serving(&first)
        }).await;

        // The first lags 20 blocks behind the second: the watcher leaves it, and stays away
        // while it lags.
        first.lag_blocks.store(20, Ordering::SeqCst);
        anvil.mine(20).await;
        eventually("the watcher to leave the lagging source", || async {
            anvil.mine(1).await;
            watcher.status.borrow().source == serving(&second)
        }).await;
        engine.create_topup(&topup("AHEAD", "96", "100")).await.unwrap();
        let ahead = engine.create_payment(&order("AHEAD"), Method::Eth).await.unwrap().intent;
        anvil.send_eth(&ahead.pay_to, TOPUP_WEI).await;
        anvil.mine(1).await;
        wait_status(&engine, &ahead.id, IntentStatus::Settled).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        anvil.mine(1).await;
        anvil.wait_synced(&engine).await;
        assert_eq!(watcher.status.borrow().source, serving(&second), "a lagging first source is not taken back");
        let health = engine.watcher_health().await.unwrap();
        assert_eq!(health[0].active_source.as_deref(), Some(serving(&second).as_str()));
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}

on_both_databases! {
    async fn litecoin_goes_on_with_the_next_electrum_server_when_the_first_is_down(db) {
        let chain = Chain::lock().await;
        // The first server configured is down (nothing listens on its port); the second is the
        // lane's ElectrumX.
        let mut section = litecoin(&fresh_account_xpub(), "tcp://127.0.0.1:9", 1);
        section.electrum_urls = vec![chain.electrum_url.clone().into()];
        let configured = section.clone();
        let (engine, _clock) = ltc_engine(&db, &chain, 1, &section.xpub, |config| {
            config.networks.litecoin = Some(configured);
        })
        .await;
        let sources = payrecon::test_utils::networks::electrum_sources(Network::Litecoin, &section).unwrap();
        assert_eq!(sources.len(), 2);
        let scanner = Failover::new(sources.into_iter().map(ElectrumScanner::new).collect(), FailoverPolicy::default());
        let watcher = Running::spawn(&engine, scanner, fast());
        engine.create_topup(&topup("LTC-FAILOVER", "97", "100")).await.unwrap();
        let pay = engine.create_payment(&order("LTC-FAILOVER"), Method::Ltc).await.unwrap().intent;
        chain.send(&pay.pay_to, "1").await;
        chain.mine(1).await;
        wait_status(&engine, &pay.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "97").await, 10_000);
        assert_eq!(watcher.status.borrow().source, chain.electrum_url);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}

on_both_databases! {
    async fn tron_goes_on_with_the_next_api_when_the_first_is_down(db) {
        use common::tron::{fresh_tron_xpub, tron_config, tron_engine};
        use payrecon_chain_tron::testkit::{FakeTron, trx};
        let node = FakeTron::start(10).await;
        // The first API configured is down (nothing listens on its port); the second is the
        // replayed full node.
        let mut tron = tron_config(&node, &fresh_tron_xpub(), 1, payrecon::config::TronFinality::Depth);
        tron.api_url = Some("http://127.0.0.1:9".into());
        tron.api_urls = vec![node.url.clone().into()];
        let (engine, _clock) = tron_engine(&db, &tron).await;
        let mut sources = payrecon::test_utils::networks::tron_sources(&tron).unwrap();
        assert_eq!(sources.len(), 2);
        for settings in &mut sources {
            settings.start_block = Some(node.head() + 1);
        }
        let scanner = Failover::new(sources.into_iter().map(payrecon_chain_tron::TronScanner::new).collect(), FailoverPolicy::default());
        let watcher = Running::spawn(&engine, scanner, fast());
        engine.create_topup(&topup("TRX-FAILOVER", "98", "100")).await.unwrap();
        let pay = engine.create_payment(&order("TRX-FAILOVER"), Method::Trx).await.unwrap().intent;
        // 400 TRX, what a 100 USD top-up costs at 0.25 USD per TRX.
        node.mine(&[trx(&pay.pay_to, 400_000_000)]);
        node.mine(&[]);
        wait_status(&engine, &pay.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "98").await, 10_000);
        assert_eq!(watcher.status.borrow().source, node.url);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}

on_both_databases! {
    async fn solana_goes_on_with_the_next_rpc_when_the_first_is_down(db) {
        use common::solana::{solana_config, solana_engine};
        use payrecon_chain_solana::testkit::FakeSolana;
        let node = FakeSolana::start().await;
        // The first endpoint configured is down (nothing listens on its port); the second is
        // the replayed RPC node.
        let mut solana = solana_config(&node);
        solana.rpc_url = Some("http://127.0.0.1:9".into());
        solana.rpc_urls = vec![node.url.clone().into()];
        let (engine, clock) = solana_engine(&db, &solana).await;
        let sources = payrecon::test_utils::networks::solana_sources(&solana).unwrap();
        assert_eq!(sources.len(), 2);
        let scanner = Failover::new(sources.into_iter().map(payrecon_chain_solana::SolanaScanner::new).collect(), FailoverPolicy::default());
        let watcher = Running::spawn(&engine, scanner, fast());
        engine.create_topup(&topup("SOL-FAILOVER", "99", "100")).await.unwrap();
        let pay = engine.create_payment(&order("SOL-FAILOVER"), Method::Sol).await.unwrap().intent;
        // 1 SOL, what a 100 USD top-up costs at 100 USD per SOL.
        node.pay(&solana.recipient, 1_000_000_000, Some(&pay.watch_key), clock.now().timestamp(), false);
        node.finalize_all();
        wait_status(&engine, &pay.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "99").await, 10_000);
        assert_eq!(watcher.status.borrow().source, node.url);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}
