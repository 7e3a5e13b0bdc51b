//! The Electrum watcher under faults, against the real regtest node and ElectrumX: killed
//! mid-stream and restarted, its server stopped and restarted, a server that answers garbage
//! or serves another chain, and Bitcoin and Litecoin watched side by side.

use crate::common;

use std::time::Duration;

use common::checks::{ledger_summary, order, status};
use common::regtest::{
    Chain, eventually, fresh_account_xpub, litecoin, ltc_engine, watch, watch_litecoin,
};
use common::serve::ServeConfig;
use common::{TestDb, topup};
use payrecon::IntentStatus;
use payrecon::test_utils::watcher::WatcherState;
use payrecon_chain_bitcoin::{ElectrumSettings, UtxoChain, UtxoNetwork, UtxoTarget};
use payrecon_chain_core::{Asset, Method, Network};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

on_both_databases_and_sources! {
    async fn a_watcher_killed_mid_stream_ends_with_the_ledger_of_an_uninterrupted_run(db, source) {
        let chain = Chain::lock().await;
        let xpub = fresh_account_xpub();
        let steady_db = TestDb::new(db.db).await;
        let (steady, _) = ltc_engine(&steady_db, &chain, 2, &xpub, |_| {}).await;
        let (killed, _) = ltc_engine(&db, &chain, 2, &xpub, |_| {}).await;
        let orders = ["T1", "T2", "T3", "T4"];
        let mut addresses = Vec::new();
        for (i, reference) in orders.iter().enumerate() {
            let request = topup(reference, &format!("4{i}"), "100");
            steady.create_topup(&request).await.unwrap();
            killed.create_topup(&request).await.unwrap();
            let a = steady.create_payment(&order(reference), Method::Ltc).await.unwrap();
            let b = killed.create_payment(&order(reference), Method::Ltc).await.unwrap();
            assert_eq!(a.intent.pay_to, b.intent.pay_to, "one key, one derivation sequence");
            addresses.push(a.intent.pay_to);
        }
        let uninterrupted = source.watch(&steady, &chain);
        let mut victim = source.watch(&killed, &chain);

        // Exact, two parts, over: each step followed by a kill at some point of the watcher's
        // work and a restart.
        let steps: [(&str, &str); 5] = [(&addresses[0], "1"), (&addresses[1], "0.3"), (&addresses[1], "0.7"), (&addresses[2], "1.2"), (&addresses[3], "1")];
        for (n, (address, amount)) in steps.iter().enumerate() {
            chain.send(address, amount).await;
            if n % 2 == 1 {
                chain.mine(1).await;
            }
            tokio::time::sleep(Duration::from_millis(100 * (n as u64 + 1))).await;
            victim.task.abort();
            let _ = victim.task.await;
            victim = source.watch(&killed, &chain);
        }
        chain.mine(2).await;
        for engine in [&steady, &killed] {
            chain.wait_synced(engine, Network::Litecoin).await;
            for reference in orders {
                let id = engine.payments_for(&order(reference)).await.unwrap()[0].intent.id.clone();
                eventually("every top-up settled", || async { status(engine, &id).await == IntentStatus::Settled }).await;
            }
        }
        uninterrupted.stop().await.unwrap();
        victim.stop().await.unwrap();
        assert_eq!(ledger_summary(&killed, &orders).await, ledger_summary(&steady, &orders).await);
    }
}

/// The Electrum server goes away mid-test (a real ElectrumX of this test's own, stopped and
/// started again over its kept index): the watcher retries, reconnects and loses nothing. This
/// server keeps ElectrumX's own pacing, a small answer held up to a second, as public servers
/// do; the devnet's lanes answer at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_watcher_survives_its_electrum_server_restarting() {
    let chain = Chain::lock().await;
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let electrumx = |action: &'static str| {
        let mut command = chain.devnet();
        let dir = dir.path().to_path_buf();
        async move {
            command.arg(action).arg(&dir);
            if action == "electrumx-start" {
                command.arg(port.to_string());
            }
            let output = command.output().await.expect("devnet script runs");
            assert!(
                output.status.success(),
                "{action}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    };
    electrumx("electrumx-start").await;
    let url = format!("tcp://127.0.0.1:{port}");

    let db = TestDb::new(common::Db::Sqlite).await;
    let (engine, _) = ltc_engine(&db, &chain, 1, &fresh_account_xpub(), |_| {}).await;
    engine
        .create_topup(&topup("T1", "41", "100"))
        .await
        .unwrap();
    engine
        .create_topup(&topup("T2", "42", "100"))
        .await
        .unwrap();
    let one = engine
        .create_payment(&order("T1"), Method::Ltc)
        .await
        .unwrap();
    let two = engine
        .create_payment(&order("T2"), Method::Ltc)
        .await
        .unwrap();
    let mut watcher = watch_litecoin(&engine, &url);
    chain.send(&one.intent.pay_to, "1").await;
    eventually("the first payment seen", || async {
        status(&engine, &one.intent.id).await == IntentStatus::Seen
    })
    .await;

    electrumx("electrumx-stop").await;
    chain.mine(1).await;
    chain.send(&two.intent.pay_to, "1").await;
    chain.mine(1).await;
    watcher
        .status
        .wait_for(|s| matches!(s.state, WatcherState::Retrying { .. }))
        .await
        .unwrap();
    assert_eq!(
        status(&engine, &two.intent.id).await,
        IntentStatus::AwaitingPayment,
        "nothing is invented while the server is away"
    );

    electrumx("electrumx-start").await;
    for pay in [&one, &two] {
        eventually("settled after the server is back", || async {
            status(&engine, &pay.intent.id).await == IntentStatus::Settled
        })
        .await;
    }
    watcher
        .status
        .wait_for(|s| s.state == WatcherState::Running)
        .await
        .unwrap();
    assert_eq!(
        engine
            .available_balance(&common::account("42"))
            .await
            .unwrap()
            .cents(),
        10_000
    );
    watcher.stop.send(true).unwrap();
    watcher.task.await.unwrap().unwrap();
    electrumx("electrumx-stop").await;
}

/// Bitcoin and Litecoin watchers run side by side. Bitcoin's code path runs against the same
/// server: an Electrum script hash depends only on the script, and the configured genesis is
/// this chain's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bitcoin_and_litecoin_are_watched_side_by_side() {
    let chain = Chain::lock().await;
    let db = TestDb::new(common::Db::Sqlite).await;
    let ltc_regtest_genesis = chain.block_hash(0).await;
    let config = common::payments::config(|config| {
        config.payments.enabled_methods = vec![Method::Btc, Method::Ltc];
        config.networks.litecoin = Some(litecoin(&fresh_account_xpub(), &chain.electrum_url, 1));
        let mut bitcoin = litecoin(&fresh_account_xpub(), &chain.electrum_url, 1);
        bitcoin.genesis_hash = Some(ltc_regtest_genesis.clone());
        config.networks.bitcoin = Some(bitcoin);
    });
    let (engine, clock) = common::payments::engine_with_prices(
        &db,
        config,
        &[(Asset::Ltc, "100"), (Asset::Btc, "100000")],
    )
    .await;
    clock.advance(chrono::Utc::now() - common::payments::start_time());
    engine
        .create_topup(&topup("B1", "42", "100"))
        .await
        .unwrap();
    engine
        .create_topup(&topup("L1", "42", "100"))
        .await
        .unwrap();
    let btc = engine
        .create_payment(&order("B1"), Method::Btc)
        .await
        .unwrap();
    let ltc = engine
        .create_payment(&order("L1"), Method::Ltc)
        .await
        .unwrap();
    assert!(
        btc.intent.pay_to.starts_with("bcrt1q"),
        "{}",
        btc.intent.pay_to
    );
    assert_eq!(btc.amount_decimal, "0.001");

    let mut btc_target = UtxoTarget::new(UtxoChain::Bitcoin, UtxoNetwork::Regtest);
    btc_target.genesis_hash = Some(ltc_regtest_genesis);
    let btc_settings = ElectrumSettings::new(chain.electrum_url.clone(), btc_target);
    let btc_watcher = watch(&engine, btc_settings);
    let ltc_watcher = watch_litecoin(&engine, &chain.electrum_url);
    chain.send_outputs(&[(&btc.intent.pay_to, 100_000)]).await;
    chain.send(&ltc.intent.pay_to, "1").await;
    chain.mine(1).await;
    for pay in [&btc, &ltc] {
        eventually("both settled", || async {
            status(&engine, &pay.intent.id).await == IntentStatus::Settled
        })
        .await;
    }
    assert_eq!(
        engine
            .available_balance(&common::account("42"))
            .await
            .unwrap()
            .cents(),
        20_000
    );
    btc_watcher.stop().await.unwrap();
    ltc_watcher.stop().await.unwrap();
}

/// A fake Electrum server answering each request line with `answer(method)`.
async fn fake_server(answer: fn(&str) -> String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("tcp://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let request: serde_json::Value =
                        serde_json::from_str(&line).unwrap_or_default();
                    let method = request["method"].as_str().unwrap_or_default().to_owned();
                    let body = answer(&method).replace("$ID", &request["id"].to_string());
                    if write
                        .write_all(format!("{body}\n").as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// An engine with one Litecoin payment, watched through the server at `url`.
async fn watched_through(url: &str) -> (TestDb, payrecon::Engine, common::regtest::Running) {
    let db = TestDb::new(common::Db::Sqlite).await;
    let config = common::payments::config(|config| {
        config.payments.enabled_methods = vec![Method::Ltc];
        config.networks.litecoin = Some(litecoin(&fresh_account_xpub(), url, 1));
    });
    let (engine, _) = common::payments::engine(&db, config).await;
    engine
        .create_topup(&topup("T1", "42", "100"))
        .await
        .unwrap();
    engine
        .create_payment(&order("T1"), Method::Ltc)
        .await
        .unwrap();
    let watcher = watch_litecoin(&engine, url);
    (db, engine, watcher)
}

async fn nothing_committed(engine: &payrecon::Engine) {
    assert_eq!(
        engine.watcher_cursor(Network::Litecoin).await.unwrap(),
        None,
        "nothing was committed"
    );
    assert_eq!(engine.trial_balance().await.unwrap().entries, 0);
}

/// The error a watcher over `url` stops with for good.
async fn stopped_watcher_error(url: &str) -> String {
    let (_db, engine, watcher) = watched_through(url).await;
    let outcome = tokio::time::timeout(Duration::from_secs(60), watcher.task)
        .await
        .expect("the watcher stops by itself")
        .unwrap();
    nothing_committed(&engine).await;
    outcome
        .expect_err("a refused data source is an error")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_answering_garbage_stops_the_watcher_which_tries_again_later() {
    let url = fake_server(|_| "<html>502 Bad Gateway</html>".into()).await;
    let (_db, engine, watcher) = watched_through(&url).await;
    let mut status = watcher.status.clone();
    let mut tries = Vec::new();
    while tries.len() < 2 {
        tokio::time::timeout(Duration::from_secs(60), status.changed())
            .await
            .expect("the watcher reports")
            .unwrap();
        if let WatcherState::Stopped {
            error: Some(error),
            next_try_at: Some(next),
        } = &status.borrow_and_update().state
        {
            assert!(error.contains("garbage"), "{error}");
            tries.push(*next);
        }
    }
    assert!(
        tries[1] > tries[0],
        "it tried again, and pauses longer: {tries:?}"
    );
    let health = engine.watcher_health().await.unwrap();
    assert_eq!(health[0].state, "stopped");
    assert!(
        health[0].next_try_at.is_some(),
        "operators see when it tries again"
    );
    nothing_committed(&engine).await;
    watcher
        .stop()
        .await
        .expect("a stopped watcher still shuts down cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_of_another_chain_stops_the_watcher_with_a_clear_error() {
    fn answer(method: &str) -> String {
        use payrecon_chain_core::bitcoin::{Network, consensus, constants};
        match method {
            "server.version" => {
                r#"{"jsonrpc":"2.0","id":$ID,"result":["ElectrumX 1.16","1.4"]}"#.into()
            }
            // Bitcoin mainnet's genesis header where Litecoin regtest's is expected.
            _ => format!(
                r#"{{"jsonrpc":"2.0","id":$ID,"result":"{}"}}"#,
                consensus::encode::serialize_hex(
                    &constants::genesis_block(Network::Bitcoin).header
                )
            ),
        }
    }
    let url = fake_server(answer).await;
    let error = stopped_watcher_error(&url).await;
    assert!(
        error.contains(
            "genesis block 000000000019d6689c085ae165831e934ff763ae46a2a6c172b3f1b60a8ce26f"
        ),
        "{error}"
    );
}

/// `payrecon serve` from the command line: a top-up paid from the regtest wallet is seen,
/// confirmed and credited by the watcher it starts; SIGTERM stops it cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payrecon_serve_watches_and_credits_a_top_up() {
    let chain = Chain::lock().await;
    let config = ServeConfig::litecoin(&chain.electrum_url, "");
    let (intent, address) = config.topup_and_pay("ltc");
    let serving = config.serve();
    chain.send(&address, "1").await;
    chain.mine(1).await;
    eventually("serve to credit the top-up", || async {
        config.cli(&["pay", "show", &intent])["status"] == "settled"
    })
    .await;
    assert_eq!(config.cli(&["balance", "42"])["available_usd"], "100.00");
    serving.stop().await;
}
