//! The full-node Litecoin watcher under what a node in production goes through, against the
//! real regtest node (scripts/devnet.sh): a faulty link to its RPC, the node restarted
//! mid-stream, `payrecon serve` killed with SIGKILL and started again, a node of another
//! chain, the P2P announcements that wake it, and configuration that names both sources or
//! none.

use crate::common;

use std::time::{Duration, Instant};

use common::checks::{ledger_summary, order, wait_status};
use common::faults::FaultProxy;
use common::regtest::{Chain, Running, Source, eventually, fast, fresh_account_xpub, ltc_engine};
use common::serve::ServeConfig;
use common::{TestDb, topup};
use payrecon::IntentStatus;
use payrecon::test_utils::watcher::WatcherOptions;
use payrecon_chain_bitcoin::{NodeScanner, UtxoChain, UtxoNetwork, UtxoTarget};
use payrecon_chain_core::{Method, Network};

/// Which address gets how many LTC, step by step: exact, two parts, over, exact again.
const STEPS: [(usize, &str); 5] = [(0, "1"), (1, "0.3"), (1, "0.7"), (2, "1.2"), (3, "1")];

on_both_databases! {
    async fn through_a_faulty_link_to_the_node_the_ledger_is_that_of_a_clean_one(db) {
        let chain = Chain::lock().await;
        let xpub = fresh_account_xpub();
        let steady_db = TestDb::new(db.db).await;
        let (steady, _) = ltc_engine(&steady_db, &chain, 2, &xpub, |_| {}).await;
        let (faulty, _) = ltc_engine(&db, &chain, 2, &xpub, |_| {}).await;
        let orders = ["T1", "T2", "T3", "T4"];
        let mut addresses = Vec::new();
        for (i, reference) in orders.iter().enumerate() {
            let request = topup(reference, &format!("4{i}"), "100");
            steady.create_topup(&request).await.unwrap();
            faulty.create_topup(&request).await.unwrap();
            let a = steady.create_payment(&order(reference), Method::Ltc).await.unwrap();
            faulty.create_payment(&order(reference), Method::Ltc).await.unwrap();
            addresses.push(a.intent.pay_to);
        }
        let proxy = FaultProxy::in_front_of(&chain.rpc_url).await;
        let clean = Source::Node.watch(&steady, &chain);
        // The link may fail for the hostile watcher's very first connection while the first
        // payments are mined: its first scan still starts at the block of its first address.
        let hostile = Running::spawn(
            &faulty,
            NodeScanner::new(Source::node_settings(&chain, &proxy.url_for(&chain.rpc_url))),
            fast(),
        );
        for (n, (index, amount)) in STEPS.iter().enumerate() {
            proxy.breaks_once_more().await;
            chain.send(&addresses[*index], amount).await;
            if n % 2 == 1 {
                chain.mine(1).await;
            }
        }
        chain.mine(2).await;
        for engine in [&steady, &faulty] {
            chain.wait_synced(engine, Network::Litecoin).await;
            for reference in orders {
                let id = engine.payments_for(&order(reference)).await.unwrap()[0].intent.id.clone();
                wait_status(engine, &id, IntentStatus::Settled).await;
            }
        }
        clean.stop().await.unwrap();
        hostile.stop().await.unwrap();
        eprintln!("fault proxy: {}", proxy.counts.summary());
        assert!(proxy.counts.broken() >= STEPS.len(), "{}", proxy.counts.summary());
        assert_eq!(ledger_summary(&faulty, &orders).await, ledger_summary(&steady, &orders).await);
    }

    async fn payments_confirmed_before_the_watcher_first_reaches_its_node_are_found(db) {
        let chain = Chain::lock().await;
        let (engine, _clock) = ltc_engine(&db, &chain, 2, &fresh_account_xpub(), |_| {}).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Ltc).await.unwrap();
        // The shop hands out the address while the node is still out of reach: the payment is
        // mined and buried before the watcher ever connects.
        chain.send(&pay.intent.pay_to, "1").await;
        chain.mine(5).await;
        assert_eq!(engine.watcher_cursor(Network::Litecoin).await.unwrap(), None);
        let watcher = Source::Node.watch(&engine, &chain);
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        chain.wait_synced(&engine, Network::Litecoin).await;
        assert_eq!(engine.trial_balance().await.unwrap().entries, 1);
        watcher.stop().await.unwrap();
    }

    async fn the_node_restarted_mid_stream_loses_nothing(db) {
        let chain = Chain::lock().await;
        let (engine, _clock) = ltc_engine(&db, &chain, 1, &fresh_account_xpub(), |_| {}).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        engine.create_topup(&topup("T2", "43", "100")).await.unwrap();
        let one = engine.create_payment(&order("T1"), Method::Ltc).await.unwrap();
        let two = engine.create_payment(&order("T2"), Method::Ltc).await.unwrap();
        let watcher = Source::Node.watch(&engine, &chain);
        chain.send(&one.intent.pay_to, "1").await;
        wait_status(&engine, &one.intent.id, IntentStatus::Seen).await;

        chain.restart_node().await;
        chain.send(&two.intent.pay_to, "1").await;
        chain.mine(1).await;
        for pay in [&one, &two] {
            wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        }
        chain.wait_synced(&engine, Network::Litecoin).await;
        assert_eq!(engine.trial_balance().await.unwrap().entries, 2);
        watcher.stop().await.unwrap();
    }

    async fn announcements_wake_the_watcher_long_before_its_next_poll(db) {
        let chain = Chain::lock().await;
        let (engine, _clock) = ltc_engine(&db, &chain, 1, &fresh_account_xpub(), |_| {}).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Ltc).await.unwrap();
        let slow = WatcherOptions { poll_interval: Duration::from_secs(600), ..fast() };
        let watcher = Running::spawn(
            &engine,
            NodeScanner::new(Source::node_settings(&chain, &chain.rpc_url)),
            slow,
        );
        // The first round runs at once; after it, only an announcement can wake the watcher.
        chain.wait_synced(&engine, Network::Litecoin).await;
        let started = Instant::now();
        chain.send(&pay.intent.pay_to, "1").await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Seen).await;
        chain.mine(1).await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        assert!(started.elapsed() < Duration::from_secs(300), "woken by the node, not by a poll");
        watcher.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_of_another_chain_stops_the_watcher_with_a_clear_error() {
    let chain = Chain::lock().await;
    let db = TestDb::new(common::Db::Sqlite).await;
    let (engine, _clock) = ltc_engine(&db, &chain, 1, &fresh_account_xpub(), |_| {}).await;
    let mut settings = Source::node_settings(&chain, &chain.rpc_url);
    // Bitcoin's regtest genesis where the node runs Litecoin's.
    let bitcoin = UtxoTarget::new(UtxoChain::Bitcoin, UtxoNetwork::Regtest);
    settings.target.genesis_hash = Some(bitcoin.expected_genesis().unwrap().to_string());
    let watcher = Running::spawn(&engine, NodeScanner::new(settings), fast());
    let outcome = tokio::time::timeout(Duration::from_secs(60), watcher.task)
        .await
        .expect("the watcher stops by itself")
        .unwrap();
    let error = outcome
        .expect_err("a node of another chain is refused")
        .to_string();
    assert!(
        error.contains("litecoin watcher stopped")
            && error.contains("0f9188f13cb7b2c71f2a335e3a4fc328bf5beb436012afca590b1a11466e2206"),
        "{error}"
    );
    assert_eq!(
        engine.watcher_cursor(Network::Litecoin).await.unwrap(),
        None
    );
}

/// `payrecon serve` on the full node, killed with SIGKILL between a payment being seen and
/// its block, then started again: the payment is credited exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payrecon_serve_on_the_node_killed_and_restarted_credits_once() {
    let chain = Chain::lock().await;
    let config = ServeConfig::litecoin_node(&chain.rpc_url, &chain.p2p_peer, "");
    let (intent, address) = config.topup_and_pay("ltc");
    let serving = config.serve();
    chain.send(&address, "1").await;
    eventually("serve to see the payment", || async {
        config.cli(&["pay", "show", &intent])["status"] == "seen"
    })
    .await;
    serving.kill9();
    chain.mine(1).await;
    let serving = config.serve();
    eventually("serve to credit the top-up", || async {
        config.cli(&["pay", "show", &intent])["status"] == "settled"
    })
    .await;
    assert_eq!(config.cli(&["balance", "42"])["available_usd"], "100.00");
    serving.stop().await;
    assert_eq!(config.cli(&["balance", "42"])["available_usd"], "100.00");
}

/// `payrecon serve` with two full nodes, the first down (nothing listens on its port): the
/// watcher goes on with the second, polled, and a payment settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payrecon_serve_goes_on_with_the_next_full_node_when_the_first_is_down() {
    let chain = Chain::lock().await;
    let config = ServeConfig::litecoin_node("http://user:pass@127.0.0.1:9", &chain.p2p_peer, "");
    config.rewrite(|text| {
        text.replace(
            "push_peer",
            &format!("rpc_urls = [\"{}\"]\npush_peer", chain.rpc_url),
        )
    });
    let (intent, address) = config.topup_and_pay("ltc");
    let serving = config.serve();
    chain.send(&address, "1").await;
    chain.mine(1).await;
    eventually(
        "serve to credit the top-up through the second node",
        || async { config.cli(&["pay", "show", &intent])["status"] == "settled" },
    )
    .await;
    serving.stop().await;
}

/// A network names one source: both, or none while its method is enabled, is refused at
/// start with the keys named.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_network_with_both_sources_or_none_is_refused_at_start() {
    let both = ServeConfig::new(
        &["ltc"],
        r#"{"LTC":"100"}"#,
        &format!(
            "[networks.litecoin]\nxpub = \"{}\"\nnetwork = \"regtest\"\nconfirmations = 1\n\
             electrum_url = \"tcp://127.0.0.1:1\"\nrpc_url = \"http://127.0.0.1:1\"\n",
            fresh_account_xpub()
        ),
    );
    let refused = both.failure(&["init"]);
    assert!(
        refused.contains("networks.litecoin.electrum_url")
            && refused.contains("networks.litecoin.rpc_url"),
        "{refused}"
    );
    let none = ServeConfig::new(
        &["ltc"],
        r#"{"LTC":"100"}"#,
        &format!(
            "[networks.litecoin]\nxpub = \"{}\"\nnetwork = \"regtest\"\nconfirmations = 1\n",
            fresh_account_xpub()
        ),
    );
    none.cli(&["init"]);
    let refused = none.failure(&["serve"]);
    assert!(
        refused.contains("networks.litecoin.electrum_url")
            && refused.contains("networks.litecoin.rpc_url")
            && refused.contains("watch = false"),
        "{refused}"
    );
}
