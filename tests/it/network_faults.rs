//! Every watcher behind a fault-injecting TCP proxy (delays, truncated responses, resets,
//! requests dropped on the way) against its node: the real ElectrumX over regtest, anvil,
//! and the Tron and Solana fake nodes. Beside it, a second engine watches the same chain
//! directly. Both see the same payments; the faulty run must end with the same ledger, with
//! no payment missed and none credited twice. Before each payment the test waits for the
//! proxy to break one more connection, so faults fall among the payments, not around them.

use crate::common;

use common::anvil::{
    Anvil, eth_engine, fresh_ethereum_xpub, scanner_settings, watch_ethereum_with,
};
use common::checks::{ledger_summary, order, wait_status};
use common::faults::{FaultCounts, FaultProxy};
use common::regtest::{Chain, fast, fresh_account_xpub, ltc_engine, watch_litecoin};
use common::solana::{solana_config, solana_engine, watch_solana};
use common::tron::{USDT, fresh_tron_xpub, tron_config, tron_engine, wait_synced, watch_tron};
use common::{TestDb, topup};
use payrecon::Engine;
use payrecon::IntentStatus;
use payrecon::PaymentInstructions;
use payrecon::config::TronFinality;
use payrecon_chain_core::{Method, Network};
use payrecon_chain_solana::testkit::FakeSolana;
use payrecon_chain_tron::testkit::{FakeTron, trc20, trx};

/// The orders every scenario pays: exact, in two parts, over, and exact again after the
/// others confirmed.
const ORDERS: [&str; 4] = ["EXACT", "PARTS", "OVER", "AFTER"];

/// Opens the same top-ups on both engines; the intents derive the same addresses where the
/// chain derives them from the key.
async fn open(steady: &Engine, faulty: &Engine, method: Method) -> Vec<[PaymentInstructions; 2]> {
    let mut pays = Vec::new();
    for (i, reference) in ORDERS.iter().enumerate() {
        let request = topup(reference, &format!("7{i}"), "100");
        steady.create_topup(&request).await.unwrap();
        faulty.create_topup(&request).await.unwrap();
        pays.push([
            steady
                .create_payment(&order(reference), method)
                .await
                .unwrap(),
            faulty
                .create_payment(&order(reference), method)
                .await
                .unwrap(),
        ]);
    }
    pays
}

/// The steps of every scenario, as shares of the intent's amount in tenths: (order, tenths).
const STEPS: [(usize, u128); 5] = [(0, 10), (1, 3), (1, 7), (2, 12), (3, 10)];

/// Waits until every intent settled on both engines; their ledger summaries, clean first.
async fn settle_and_compare(
    steady: &Engine,
    faulty: &Engine,
    pays: &[[PaymentInstructions; 2]],
) -> [String; 2] {
    for pay in pays {
        wait_status(steady, &pay[0].intent.id, IntentStatus::Settled).await;
        wait_status(faulty, &pay[1].intent.id, IntentStatus::Settled).await;
    }
    [
        ledger_summary(steady, &ORDERS).await,
        ledger_summary(faulty, &ORDERS).await,
    ]
}

fn assert_faults_met(counts: &FaultCounts) {
    eprintln!("fault proxy: {}", counts.summary());
    assert!(
        counts.broken() >= STEPS.len(),
        "the proxy broke a connection before every step: {}",
        counts.summary()
    );
}

on_both_databases! {
    async fn electrum_through_a_faulty_link_ends_with_the_ledger_of_a_clean_one(db) {
        let chain = Chain::lock().await;
        let xpub = fresh_account_xpub();
        let steady_db = TestDb::new(db.db).await;
        let (steady, _) = ltc_engine(&steady_db, &chain, 2, &xpub, |_| {}).await;
        let (faulty, _) = ltc_engine(&db, &chain, 2, &xpub, |_| {}).await;
        let pays = open(&steady, &faulty, Method::Ltc).await;
        let proxy = FaultProxy::in_front_of(&chain.electrum_url).await;
        let clean = watch_litecoin(&steady, &chain.electrum_url);
        let hostile = watch_litecoin(&faulty, &proxy.url_for(&chain.electrum_url));
        for (n, (index, tenths)) in STEPS.iter().enumerate() {
            proxy.breaks_once_more().await;
            let [pay, twin] = &pays[*index];
            assert_eq!(pay.intent.pay_to, twin.intent.pay_to, "one key, one derivation sequence");
            let litoshis = pay.intent.amount.base_units() * tenths / 10;
            chain.send(&pay.intent.pay_to, &ltc(litoshis)).await;
            if n % 2 == 1 {
                chain.mine(1).await;
            }
        }
        chain.mine(2).await;
        let [clean_ledger, faulty_ledger] = settle_and_compare(&steady, &faulty, &pays).await;
        chain.wait_synced(&faulty, Network::Litecoin).await;
        clean.stop().await.unwrap();
        hostile.stop().await.unwrap();
        assert_faults_met(&proxy.counts);
        assert_eq!(faulty_ledger, clean_ledger);
    }

    async fn ethereum_through_a_faulty_link_ends_with_the_ledger_of_a_clean_one(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let xpub = fresh_ethereum_xpub();
        let steady_db = TestDb::new(db.db).await;
        let (steady, _) = eth_engine(&steady_db, &anvil, &tokens, &xpub, 2).await;
        let (faulty, _) = eth_engine(&db, &anvil, &tokens, &xpub, 2).await;
        let pays = open(&steady, &faulty, Method::UsdcErc20).await;
        let start = anvil.head().await;
        let proxy = FaultProxy::in_front_of(&anvil.url).await;
        let clean = watch_ethereum_with(&steady, scanner_settings(&anvil.url, &tokens, start), fast());
        let hostile = watch_ethereum_with(&faulty, scanner_settings(&proxy.url_for(&anvil.url), &tokens, start), fast());
        for (n, (index, tenths)) in STEPS.iter().enumerate() {
            proxy.breaks_once_more().await;
            let [pay, twin] = &pays[*index];
            assert_eq!(pay.intent.pay_to, twin.intent.pay_to, "one key, one derivation sequence");
            anvil.send_token(&tokens.usdc, &pay.intent.pay_to, pay.intent.amount.base_units() * tenths / 10).await;
            anvil.mine(1 + n as u64 % 2).await;
        }
        anvil.mine(2).await;
        let [clean_ledger, faulty_ledger] = settle_and_compare(&steady, &faulty, &pays).await;
        anvil.wait_synced(&faulty).await;
        clean.stop().await.unwrap();
        hostile.stop().await.unwrap();
        assert_faults_met(&proxy.counts);
        assert_eq!(faulty_ledger, clean_ledger);
    }

    async fn tron_through_a_faulty_link_ends_with_the_ledger_of_a_clean_one(db) {
        common::regtest::init_logs();
        let node = FakeTron::start(100).await;
        let xpub = fresh_tron_xpub();
        let clean_config = tron_config(&node, &xpub, 2, TronFinality::Depth);
        let proxy = FaultProxy::in_front_of(&node.url).await;
        let hostile_config = payrecon::config::TronConfig { api_url: Some(proxy.url_for(&node.url).into()), ..clean_config.clone() };
        let steady_db = TestDb::new(db.db).await;
        let (steady, _) = tron_engine(&steady_db, &clean_config).await;
        let (faulty, _) = tron_engine(&db, &hostile_config).await;
        let pays = open(&steady, &faulty, Method::UsdtTrc20).await;
        let start = node.head() + 1;
        let clean = watch_tron(&steady, &clean_config, start);
        let hostile = watch_tron(&faulty, &hostile_config, start);
        for (n, (index, tenths)) in STEPS.iter().enumerate() {
            proxy.breaks_once_more().await;
            let [pay, twin] = &pays[*index];
            assert_eq!(pay.intent.pay_to, twin.intent.pay_to, "one key, one derivation sequence");
            // A TRX dust transfer to the same address rides along: it must be held, not lost.
            let mut block = vec![trc20(USDT, &pay.intent.pay_to, pay.intent.amount.base_units() * tenths / 10)];
            if n == 4 {
                block.push(trx(&pay.intent.pay_to, 1_000_000));
            }
            node.mine(&block);
            node.mine_empty(n as u64 % 2);
        }
        node.mine_empty(2);
        let [clean_ledger, faulty_ledger] = settle_and_compare(&steady, &faulty, &pays).await;
        wait_synced(&faulty, &node).await;
        clean.stop().await.unwrap();
        hostile.stop().await.unwrap();
        assert_faults_met(&proxy.counts);
        assert_eq!(faulty_ledger, clean_ledger);
    }

    async fn solana_through_a_faulty_link_ends_with_the_ledger_of_a_clean_one(db) {
        common::regtest::init_logs();
        let node = FakeSolana::start().await;
        // Solana Pay references are random per intent, so each engine gets its own recipient
        // and is paid separately, the same amounts in the same order.
        let clean_config = solana_config(&node);
        let proxy = FaultProxy::in_front_of(&node.url).await;
        let hostile_config = payrecon::config::SolanaConfig { rpc_url: Some(proxy.url_for(&node.url).into()), ..solana_config(&node) };
        let steady_db = TestDb::new(db.db).await;
        let (steady, _) = solana_engine(&steady_db, &clean_config).await;
        let (faulty, _) = solana_engine(&db, &hostile_config).await;
        let pays = open(&steady, &faulty, Method::Sol).await;
        let clean = watch_solana(&steady, &clean_config);
        let hostile = watch_solana(&faulty, &hostile_config);
        let now = chrono::Utc::now().timestamp();
        for (n, (index, tenths)) in STEPS.iter().enumerate() {
            proxy.breaks_once_more().await;
            for (pay, config) in pays[*index].iter().zip([&clean_config, &hostile_config]) {
                let lamports = u64::try_from(pay.intent.amount.base_units() * tenths / 10).unwrap();
                node.pay(&config.recipient, lamports, Some(&pay.intent.watch_key), now, false);
            }
            if n % 2 == 1 {
                node.finalize_all();
            }
        }
        node.finalize_all();
        let [clean_ledger, faulty_ledger] = settle_and_compare(&steady, &faulty, &pays).await;
        clean.stop().await.unwrap();
        hostile.stop().await.unwrap();
        assert_faults_met(&proxy.counts);
        let anonymous = |ledger: String, config: &payrecon::config::SolanaConfig, engine_pays: Vec<&PaymentInstructions>| {
            let mut ledger = ledger.replace(&config.recipient, "RECIPIENT");
            for pay in engine_pays {
                ledger = ledger.replace(&pay.intent.watch_key, "REFERENCE");
            }
            signatures_hidden(&ledger)
        };
        assert_eq!(
            anonymous(faulty_ledger, &hostile_config, pays.iter().map(|p| &p[1]).collect()),
            anonymous(clean_ledger, &clean_config, pays.iter().map(|p| &p[0]).collect()),
        );
    }
}

/// Litoshis as the decimal LTC that `sendtoaddress` takes.
fn ltc(litoshis: u128) -> String {
    rust_decimal::Decimal::from_i128_with_scale(i128::try_from(litoshis).unwrap(), 8)
        .normalize()
        .to_string()
}

/// A ledger summary with every Solana signature (`solana:<signature>:<index>`) replaced, since
/// the two runs' transactions differ; what each transfer did stays.
fn signatures_hidden(ledger: &str) -> String {
    let mut lines: Vec<String> = ledger
        .lines()
        .map(|line| match line.strip_prefix("solana:") {
            Some(rest) => format!("solana:SIGNATURE{}", &rest[rest.find(':').unwrap()..]),
            None => line.to_owned(),
        })
        .collect();
    lines.sort();
    lines.join("\n")
}
