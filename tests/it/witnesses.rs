//! A witness before money is credited, on SQLite and PostgreSQL: a real anvil node read by the
//! watcher and, as its witness, through a proxy that knows nothing of a transaction (what an
//! honest node answers about a payment the source invented) or lags the chain; a Litecoin
//! ElectrumX whose witness is a second path to it that drops the transaction; and, against the
//! replayed nodes, a Tron and a Solana source that invent a payment their witness never saw.
//! Nothing is credited until every witness holds the receipt; a `sources_disagree` exception
//! shows operators what each side said, and closes by itself once the witness agrees.

use crate::common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::anvil::{Anvil, RpcProxy, eth_config, eth_engine_of, ethereum, fresh_ethereum_xpub};
use common::checks::{cents, order, sound, status, wait_status};
use common::regtest::{Chain, Running, eventually, fast, fresh_account_xpub, litecoin, ltc_engine};
use common::topup;
use payrecon::test_utils::clock::Clock;
use payrecon::{Engine, IntentStatus};
use payrecon_chain_bitcoin::ElectrumScanner;
use payrecon_chain_core::Method;

/// 0.05 ETH, what a 100 USD top-up costs at 2000 USD per ETH.
const TOPUP_WEI: u128 = 50_000_000_000_000_000;

/// The `sources_disagree` exception of a transfer, if one was opened.
async fn disagreement(engine: &Engine, txid: &str) -> Option<payrecon::ExceptionRecord> {
    engine
        .exceptions(None)
        .await
        .unwrap()
        .into_iter()
        .find(|e| {
            e.kind == "sources_disagree" && e.transfer.as_deref().is_some_and(|t| t.contains(txid))
        })
}

/// Waits for a round that began after this call, so the watcher follows every intent made
/// before it (Solana's scanner reads a reference only once it follows it).
async fn following(watcher: &Running) {
    for _ in 0..2 {
        let since = chrono::Utc::now();
        eventually("a watcher round", || async {
            watcher
                .status
                .borrow()
                .last_scan_at
                .is_some_and(|at| at > since)
        })
        .await;
    }
}

async fn metrics(engine: &Engine) -> String {
    payrecon::test_utils::api::metrics_text(engine)
        .await
        .unwrap()
}

on_both_databases! {
    async fn ethereum_credits_only_what_the_witness_holds(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let witness = RpcProxy::start(&anvil.url, 10_000, 0).await;
        let mut section = ethereum(&anvil, &tokens, &fresh_ethereum_xpub(), 1);
        section.witness_urls = vec![witness.url.clone().into()];
        section.start_block = Some(anvil.head().await);
        let (engine, clock) = eth_engine_of(&db, eth_config(section.clone())).await;
        let sources = payrecon::test_utils::networks::ethereum_sources(&section).unwrap();
        let watcher = Running::spawn(&engine, payrecon_chain_ethereum::EthereumScanner::new(sources[0].clone()), fast());
        anvil.wait_synced(&engine).await;

        // The source reports a payment the witness knows nothing of: nothing is credited
        // while the witness may only be slow, and after the wait it is held for operators.
        engine.create_topup(&topup("INVENTED", "90", "100")).await.unwrap();
        let invented = engine.create_payment(&order("INVENTED"), Method::Eth).await.unwrap().intent;
        let txid = anvil.send_eth(&invented.pay_to, TOPUP_WEI).await;
        witness.unknown_txs.lock().unwrap().insert(txid.to_lowercase());
        anvil.mine(3).await;
        eventually("the witness to be asked", || async {
            metrics(&engine).await.contains("payrecon_receipts_witnessed{network=\"ethereum\",state=\"waiting\"} 1")
        }).await;
        assert_eq!(status(&engine, &invented.id).await, IntentStatus::Seen);
        assert!(disagreement(&engine, &txid).await.is_none(), "no exception while the witness may be slow");
        clock.advance(chrono::Duration::seconds(601));
        eventually("the sources_disagree exception", || async {
            anvil.mine(1).await;
            disagreement(&engine, &txid).await.is_some()
        }).await;
        let held = disagreement(&engine, &txid).await.unwrap();
        assert!(held.detail.contains(&txid) && held.detail.contains(&witness.url), "{}", held.detail);
        assert!(held.detail.contains("does not hold it"), "{}", held.detail);
        assert_eq!(held.intent_id.as_deref(), Some(invented.id.as_str()));
        assert_eq!(status(&engine, &invented.id).await, IntentStatus::Seen);
        assert_eq!(cents(&engine, "90").await, 0);
        let stuck = engine.stuck(&Default::default()).await.unwrap();
        assert!(stuck.iter().any(|item| item.kind == "sources_disagree"), "{stuck:?}");
        let text = metrics(&engine).await;
        assert!(text.contains("payrecon_exceptions_open{kind=\"sources_disagree\"} 1"), "{text}");
        assert!(text.contains("payrecon_receipts_witnessed{network=\"ethereum\",state=\"disagrees\"} 1"), "{text}");

        // The witness comes to hold it (it was a node that had missed it): credited now, and
        // the exception closes by itself.
        witness.unknown_txs.lock().unwrap().clear();
        eventually("the receipt to settle once witnessed", || async {
            anvil.mine(1).await;
            status(&engine, &invented.id).await == IntentStatus::Settled
        }).await;
        assert_eq!(cents(&engine, "90").await, 10_000);
        let closed = disagreement(&engine, &txid).await.unwrap();
        assert!(closed.resolved_at.is_some(), "{closed:?}");

        // A witness 3 blocks behind: the credit waits until it catches up.
        witness.lag_blocks.store(3, Ordering::SeqCst);
        engine.create_topup(&topup("BEHIND", "91", "100")).await.unwrap();
        let behind = engine.create_payment(&order("BEHIND"), Method::Eth).await.unwrap().intent;
        anvil.send_eth(&behind.pay_to, TOPUP_WEI).await;
        anvil.mine(1).await;
        eventually("the lagging witness to be asked", || async {
            metrics(&engine).await.contains("payrecon_receipts_witnessed{network=\"ethereum\",state=\"waiting\"} 1")
        }).await;
        assert_eq!(status(&engine, &behind.id).await, IntentStatus::Seen);
        anvil.mine(3).await;
        eventually("the receipt to settle once the witness caught up", || async {
            anvil.mine(1).await;
            status(&engine, &behind.id).await == IntentStatus::Settled
        }).await;
        assert_eq!(cents(&engine, "91").await, 10_000);
        assert!(witness.counts.requests.load(Ordering::SeqCst) > 0);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}

on_both_databases! {
    async fn litecoin_holds_a_receipt_its_electrum_witness_does_not_list(db) {
        use common::faults::RewriteProxy;
        let chain = Chain::lock().await;
        let upstream = chain.electrum_url.trim_start_matches("tcp://").to_owned();
        let witness = RewriteProxy::start(&upstream).await;
        let mut section = litecoin(&fresh_account_xpub(), &chain.electrum_url, 1);
        section.witness_urls = vec![witness.url().into()];
        section.witness_wait_seconds = 0;
        let configured = section.clone();
        let (engine, _clock) = ltc_engine(&db, &chain, 1, &section.xpub, |config| {
            config.networks.litecoin = Some(configured);
        })
        .await;
        let sources = payrecon::test_utils::networks::electrum_sources(payrecon_chain_core::Network::Litecoin, &section).unwrap();
        let watcher = Running::spawn(&engine, ElectrumScanner::new(sources[0].clone()), fast());

        // The witness's answers leave the transaction out (its id rewritten): held at once,
        // as the wait is 0.
        engine.create_topup(&topup("LTC-DROPPED", "92", "100")).await.unwrap();
        let dropped = engine.create_payment(&order("LTC-DROPPED"), Method::Ltc).await.unwrap().intent;
        let txid = chain.send(&dropped.pay_to, "1").await;
        witness.replace(&txid, &"0".repeat(64));
        chain.mine(1).await;
        eventually("the sources_disagree exception", || async {
            disagreement(&engine, &txid).await.is_some()
        }).await;
        assert_eq!(status(&engine, &dropped.id).await, IntentStatus::Seen);
        assert_eq!(cents(&engine, "92").await, 0);

        // A payment the witness lists settles as usual.
        engine.create_topup(&topup("LTC-WITNESSED", "93", "100")).await.unwrap();
        let witnessed = engine.create_payment(&order("LTC-WITNESSED"), Method::Ltc).await.unwrap().intent;
        chain.send(&witnessed.pay_to, "1").await;
        chain.mine(1).await;
        wait_status(&engine, &witnessed.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "93").await, 10_000);
        assert_eq!(status(&engine, &dropped.id).await, IntentStatus::Seen);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}

on_both_databases! {
    async fn tron_holds_a_payment_its_witness_never_saw(db) {
        use common::tron::{fresh_tron_xpub, tron_config, tron_engine};
        use payrecon_chain_tron::testkit::{FakeTron, trx};
        // Two nodes of one chain, block for block: the source invents a payment in a block
        // the witness holds without it.
        let node = FakeTron::start(10).await;
        let honest = FakeTron::start(10).await;
        let mut tron = tron_config(&node, &fresh_tron_xpub(), 1, payrecon::config::TronFinality::Depth);
        tron.witness_urls = vec![honest.url.clone().into()];
        tron.witness_wait_seconds = 0;
        let (engine, _clock) = tron_engine(&db, &tron).await;
        let mut settings = payrecon::test_utils::networks::tron_sources(&tron).unwrap().remove(0);
        settings.start_block = Some(node.head() + 1);
        let watcher = Running::spawn(&engine, payrecon_chain_tron::TronScanner::new(settings), fast());

        engine.create_topup(&topup("TRX-INVENTED", "94", "100")).await.unwrap();
        let invented = engine.create_payment(&order("TRX-INVENTED"), Method::Trx).await.unwrap().intent;
        // 400 TRX, what a 100 USD top-up costs at 0.25 USD per TRX.
        // The witness's block first, so it is never merely behind.
        honest.mine(&[]);
        node.mine(&[trx(&invented.pay_to, 400_000_000)]);
        honest.mine(&[]);
        node.mine(&[]);
        let held = loop {
            let found = engine.exceptions(None).await.unwrap().into_iter().find(|e| e.kind == "sources_disagree");
            if let Some(found) = found {
                break found;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(held.intent_id.as_deref(), Some(invented.id.as_str()));
        assert_eq!(status(&engine, &invented.id).await, IntentStatus::Seen);
        assert_eq!(cents(&engine, "94").await, 0);

        // A payment both nodes hold settles.
        engine.create_topup(&topup("TRX-WITNESSED", "95", "100")).await.unwrap();
        let witnessed = engine.create_payment(&order("TRX-WITNESSED"), Method::Trx).await.unwrap().intent;
        // In the witness's block, another transaction first takes the number the source gave
        // its invented one, so the two nodes name the next alike.
        honest.mine(&[trx(&invented.pay_to, 1), trx(&witnessed.pay_to, 400_000_000)]);
        node.mine(&[trx(&witnessed.pay_to, 400_000_000)]);
        wait_status(&engine, &witnessed.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "95").await, 10_000);
        assert_eq!(status(&engine, &invented.id).await, IntentStatus::Seen);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}

on_both_databases! {
    async fn solana_holds_a_payment_its_witness_never_saw(db) {
        use common::solana::{solana_config, solana_engine};
        use payrecon_chain_solana::testkit::FakeSolana;
        let node = FakeSolana::start().await;
        let honest = FakeSolana::start().await;
        let mut solana = solana_config(&node);
        solana.witness_urls = vec![honest.url.clone().into()];
        solana.witness_wait_seconds = 0;
        let (engine, clock) = solana_engine(&db, &solana).await;
        let settings = payrecon::test_utils::networks::solana_sources(&solana).unwrap().remove(0);
        let watcher = Running::spawn(&engine, payrecon_chain_solana::SolanaScanner::new(settings), fast());

        engine.create_topup(&topup("SOL-INVENTED", "96", "100")).await.unwrap();
        let invented = engine.create_payment(&order("SOL-INVENTED"), Method::Sol).await.unwrap().intent;
        following(&watcher).await;
        // 1 SOL, what a 100 USD top-up costs at 100 USD per SOL: on the source only.
        let signature = node.pay(&solana.recipient, 1_000_000_000, Some(&invented.watch_key), clock.now().timestamp(), false);
        honest.finalize_all();
        node.finalize_all();
        eventually("the sources_disagree exception", || async {
            disagreement(&engine, &signature).await.is_some()
        }).await;
        assert_eq!(status(&engine, &invented.id).await, IntentStatus::Seen);
        assert_eq!(cents(&engine, "96").await, 0);

        // A payment both nodes hold, final on both, settles.
        engine.create_topup(&topup("SOL-WITNESSED", "97", "100")).await.unwrap();
        let witnessed = engine.create_payment(&order("SOL-WITNESSED"), Method::Sol).await.unwrap().intent;
        following(&watcher).await;
        let shared = node.pay(&solana.recipient, 1_000_000_000, Some(&witnessed.watch_key), clock.now().timestamp(), false);
        node.share_with(&honest, &shared);
        honest.finalize_all();
        node.finalize_all();
        wait_status(&engine, &witnessed.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "97").await, 10_000);
        assert_eq!(status(&engine, &invented.id).await, IntentStatus::Seen);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}
