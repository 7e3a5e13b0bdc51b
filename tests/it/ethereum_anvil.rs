//! The Ethereum watcher against a real anvil node with real ERC-20 contracts, on SQLite and
//! PostgreSQL: ETH and token payments of every shape, the wrong token, a reverted transfer,
//! reorgs before and after credit, a watcher killed mid-stream, `finalized` finality, a node
//! that refuses wide log ranges and rate-limits, and new heads pushed over a WebSocket.

use crate::common;

use std::sync::atomic::Ordering;

use chrono::Duration;
use common::anvil::{
    Anvil, RpcProxy, eth_engine, fresh_ethereum_xpub, scanner_settings, watch_ethereum,
    watch_ethereum_with,
};
use common::checks::{cents, kinds, ledger_summary, order, sound, status, wait_status};
use common::regtest::{eventually, fast};
use common::{TestDb, topup};
use payrecon::IntentStatus;
use payrecon::ledger::{Account, Currency, SuspenseReason};
use payrecon::test_utils::clock::Clock;
use payrecon::test_utils::watcher::{WatcherOptions, WatcherState};
use payrecon_chain_core::{Method, Network};
use payrecon_chain_ethereum::Finality;

/// 0.05 ETH, what a 100 USD top-up costs at 2000 USD per ETH.
const TOPUP_WEI: u128 = 50_000_000_000_000_000;

on_both_databases! {
    async fn eth_exact_under_over_and_late(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let (engine, clock) = eth_engine(&db, &anvil, &tokens, &fresh_ethereum_xpub(), 2).await;
        let mut pays = Vec::new();
        for (i, reference) in ["EXACT", "UNDER", "OVER", "LATE"].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("4{i}"), "100")).await.unwrap();
            pays.push(engine.create_payment(&order(reference), Method::Eth).await.unwrap());
        }
        assert_eq!(pays[0].amount_decimal, "0.05");
        let watcher = watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);
        anvil.send_eth(&pays[0].intent.pay_to, TOPUP_WEI).await;
        anvil.send_eth(&pays[1].intent.pay_to, TOPUP_WEI * 4 / 5).await;
        anvil.send_eth(&pays[2].intent.pay_to, TOPUP_WEI * 6 / 5).await;
        anvil.mine(1).await;
        anvil.wait_synced(&engine).await;
        assert_eq!(status(&engine, &pays[0].intent.id).await, IntentStatus::Seen, "one confirmation of two");
        anvil.mine(1).await;
        wait_status(&engine, &pays[0].intent.id, IntentStatus::Settled).await;
        wait_status(&engine, &pays[2].intent.id, IntentStatus::Settled).await;
        wait_status(&engine, &pays[1].intent.id, IntentStatus::Confirmed).await;
        assert_eq!(kinds(&engine, "OVER").await, ["overpaid"]);
        assert_eq!((cents(&engine, "40").await, cents(&engine, "41").await, cents(&engine, "42").await), (10_000, 0, 10_000));

        // An hour passes for the shop and for the chain.
        clock.advance(Duration::minutes(61));
        common::checks::tick_once_read(&engine, Network::Ethereum, &*clock).await;
        assert_eq!(status(&engine, &pays[1].intent.id).await, IntentStatus::Underpaid);
        assert_eq!(status(&engine, &pays[3].intent.id).await, IntentStatus::Expired);
        watcher.next_round().await;
        anvil.send_eth(&pays[3].intent.pay_to, TOPUP_WEI).await;
        anvil.next_block_at_least(clock.now().timestamp()).await;
        anvil.mine(2).await;
        wait_status(&engine, &pays[3].intent.id, IntentStatus::PaidLate).await;
        assert_eq!(kinds(&engine, "LATE").await, ["paid_late"]);
        assert_eq!(cents(&engine, "43").await, 0, "late money is held");
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn held_money_a_reorg_removed_and_the_chain_mined_again_is_held_again_once(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let (engine, clock) = eth_engine(&db, &anvil, &tokens, &fresh_ethereum_xpub(), 2).await;
        engine.create_topup(&topup("REMINED", "47", "100")).await.unwrap();
        let pay = engine.create_payment(&order("REMINED"), Method::Eth).await.unwrap();
        let watcher = watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);
        clock.advance(Duration::minutes(61));
        common::checks::tick_once_read(&engine, Network::Ethereum, &*clock).await;
        assert_eq!(status(&engine, &pay.intent.id).await, IntentStatus::Expired);
        watcher.next_round().await;

        let late = Account::Suspense(SuspenseReason::Late);
        let eth = Currency::Crypto(Method::Eth);
        let held = || async { -engine.account_balance(&late, eth).await.unwrap() };
        let before = held().await;
        let tx = anvil.send_eth(&pay.intent.pay_to, TOPUP_WEI).await;
        let raw = anvil.call("eth_getRawTransactionByHash", serde_json::json!([tx])).await;
        anvil.next_block_at_least(clock.now().timestamp()).await;
        anvil.mine(2).await;
        wait_status(&engine, &pay.intent.id, IntentStatus::PaidLate).await;
        anvil.wait_synced(&engine).await;
        assert_eq!(held().await - before, TOPUP_WEI as i128, "the late money is held");

        // The block goes, and with it the payment: the hold is reversed.
        anvil.reorg(2).await;
        anvil.mine(1).await;
        anvil.wait_synced(&engine).await;
        eventually("the hold reversed", || async { held().await == before }).await;

        // The customer's wallet broadcasts the very same transaction again, and it is mined.
        anvil.call("eth_sendRawTransaction", serde_json::json!([raw])).await;
        anvil.mine(2).await;
        anvil.wait_synced(&engine).await;
        eventually("the late money held again", || async { held().await - before == TOPUP_WEI as i128 }).await;
        let transfers = engine.transfers_for(&order("REMINED")).await.unwrap();
        assert_eq!(transfers.len(), 1);
        let late_key = format!("late:{}", transfers[0].id);
        assert_eq!(transfers[0].credited_entry.as_deref(), Some(format!("{late_key}#2").as_str()));
        let exceptions = engine.exceptions(Some(&order("REMINED"))).await.unwrap();
        assert!(
            exceptions.iter().any(|e| e.id.ends_with("#2") && e.resolved_at.is_none()),
            "operators get an open exception for the money held again: {exceptions:?}"
        );
        // More rounds change nothing: it is booked exactly once more.
        anvil.mine(1).await;
        anvil.wait_synced(&engine).await;
        assert_eq!(held().await - before, TOPUP_WEI as i128);
        assert_eq!(watcher.status.borrow().state, WatcherState::Running, "the watcher goes on");
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn tokens_settle_and_the_wrong_token_never_does(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let (engine, _clock) = eth_engine(&db, &anvil, &tokens, &fresh_ethereum_xpub(), 1).await;
        let mut pay = Vec::new();
        for (i, (reference, method)) in [("USDT", Method::UsdtErc20), ("USDC", Method::UsdcErc20), ("WRONG", Method::UsdtErc20), ("FAKE", Method::UsdtErc20), ("REVERT", Method::UsdtErc20), ("ETHTOTOKEN", Method::UsdcErc20)].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("5{i}"), "100")).await.unwrap();
            pay.push(engine.create_payment(&order(reference), *method).await.unwrap());
        }
        assert_eq!(pay[0].amount_decimal, "100");
        let watcher = watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);
        anvil.send_token(&tokens.usdt, &pay[0].intent.pay_to, 100_000_000).await;
        anvil.send_token(&tokens.usdc, &pay[1].intent.pay_to, 100_000_000).await;
        anvil.send_token(&tokens.usdc, &pay[2].intent.pay_to, 100_000_000).await;
        anvil.send_token(&tokens.fake, &pay[3].intent.pay_to, 100_000_000).await;
        let other = anvil.other.clone();
        let reverted = anvil.send_token_from(&other, &tokens.usdt, &pay[4].intent.pay_to, 100_000_000).await;
        anvil.send_eth(&pay[5].intent.pay_to, TOPUP_WEI).await;
        anvil.mine(1).await;
        assert_eq!(anvil.receipt(&reverted).await["status"], serde_json::json!("0x0"), "the transfer from an empty account reverts");

        wait_status(&engine, &pay[0].intent.id, IntentStatus::Settled).await;
        wait_status(&engine, &pay[1].intent.id, IntentStatus::Settled).await;
        anvil.wait_synced(&engine).await;
        for reference in ["WRONG", "ETHTOTOKEN"] {
            eventually("a wrong_asset exception", || async { kinds(&engine, reference).await == ["wrong_asset"] }).await;
        }
        // A token payrecon does not accept is one exception per contract, not per order.
        let fake = format!("unknown_token:ethereum:{}", payrecon::chain::ReceivedAsset::OtherToken { contract: tokens.fake.clone() }.to_string().trim_start_matches("token:"));
        let unknown: Vec<_> = engine.exceptions(None).await.unwrap().into_iter().filter(|e| e.kind == "unknown_token").collect();
        assert_eq!(unknown.len(), 1, "{unknown:?}");
        assert_eq!(unknown[0].id.to_lowercase(), fake.to_lowercase());
        assert!(kinds(&engine, "FAKE").await.is_empty());
        assert_eq!(engine.transfers_for(&order("FAKE")).await.unwrap().len(), 1, "support still finds the transfer by the order");
        for (i, pay) in pay.iter().enumerate().skip(2) {
            assert_eq!(status(&engine, &pay.intent.id).await, IntentStatus::AwaitingPayment, "intent {i} is not paid by the wrong asset");
        }
        assert!(engine.transfers_for(&order("REVERT")).await.unwrap().is_empty(), "a reverted transfer is nothing");
        assert_eq!((cents(&engine, "50").await, cents(&engine, "51").await), (10_000, 10_000));
        for customer in ["52", "53", "54", "55"] {
            assert_eq!(cents(&engine, customer).await, 0);
        }
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn a_reorg_before_credit_credits_nothing_and_after_credit_takes_it_back(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let (engine, _clock) = eth_engine(&db, &anvil, &tokens, &fresh_ethereum_xpub(), 2).await;
        engine.create_topup(&topup("EARLY", "60", "100")).await.unwrap();
        engine.create_topup(&topup("CREDITED", "61", "100")).await.unwrap();
        let early = engine.create_payment(&order("EARLY"), Method::Eth).await.unwrap();
        let credited = engine.create_payment(&order("CREDITED"), Method::UsdtErc20).await.unwrap();
        let watcher = watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);

        anvil.send_token(&tokens.usdt, &credited.intent.pay_to, 100_000_000).await;
        anvil.mine(2).await;
        wait_status(&engine, &credited.intent.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "61").await, 10_000);
        anvil.send_eth(&early.intent.pay_to, TOPUP_WEI).await;
        anvil.mine(1).await;
        wait_status(&engine, &early.intent.id, IntentStatus::Seen).await;

        // The last three blocks are replaced by empty ones: both payments are gone.
        anvil.reorg(3).await;
        // The watcher first sees the new branch at the old height: what it finds there is
        // newer than what it committed at that height, and must not be taken for a replay.
        anvil.wait_synced(&engine).await;
        anvil.mine(1).await;
        wait_status(&engine, &credited.intent.id, IntentStatus::ReorgedAfterCredit).await;
        wait_status(&engine, &early.intent.id, IntentStatus::AwaitingPayment).await;
        anvil.wait_synced(&engine).await;
        assert_eq!(kinds(&engine, "CREDITED").await, ["reorged_after_credit"]);
        assert_eq!((cents(&engine, "60").await, cents(&engine, "61").await), (0, 0));
        assert!(engine.transfers_for(&order("EARLY")).await.unwrap().iter().all(|t| t.removed && t.credited_entry.is_none()));
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn the_audit_refetches_credited_transfers_and_finds_those_a_reorg_took(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let xpub = fresh_ethereum_xpub();
        let (engine, clock) = eth_engine(&db, &anvil, &tokens, &xpub, 2).await;
        engine.create_topup(&topup("AUDIT-USDT", "70", "100")).await.unwrap();
        engine.create_topup(&topup("AUDIT-ETH", "71", "100")).await.unwrap();
        let usdt = engine.create_payment(&order("AUDIT-USDT"), Method::UsdtErc20).await.unwrap();
        let eth = engine.create_payment(&order("AUDIT-ETH"), Method::Eth).await.unwrap();
        let watcher = watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);
        anvil.send_token(&tokens.usdt, &usdt.intent.pay_to, 100_000_000).await;
        anvil.send_eth(&eth.intent.pay_to, TOPUP_WEI).await;
        anvil.mine(2).await;
        wait_status(&engine, &usdt.intent.id, IntentStatus::Settled).await;
        wait_status(&engine, &eth.intent.id, IntentStatus::Settled).await;
        watcher.stop().await.unwrap();

        let config = common::payments::config(|c| c.networks.ethereum = Some(common::anvil::ethereum(&anvil, &tokens, &xpub, 2)));
        let now = clock.now();
        let query = payrecon::ReportQuery { from: now - Duration::days(1), to: now + Duration::days(1), method: None };
        let clean = engine.audit_credited(&config, &query).await.unwrap();
        assert_eq!((clean.checked, clean.findings.len()), (2, 0), "{clean:?}");

        // The payments' blocks are replaced while no watcher runs: the books still credit them.
        anvil.reorg(3).await;
        let audit = engine.audit_credited(&config, &query).await.unwrap();
        assert_eq!(audit.checked, 2);
        assert_eq!(audit.findings.len(), 2, "{audit:?}");
        assert!(audit.findings.iter().all(|f| f.problem == "no longer on the chain" && f.confirmations_now.is_none()));
        assert!(audit.findings.iter().all(|f| f.ledger_entry.starts_with("settle:")));
        let csv = audit.render(payrecon::ReportFormat::Csv).unwrap();
        assert_eq!(csv.lines().count(), 3);
        assert!(csv.starts_with("network,txid,position,order,ledger_entry,"));

        // Without a node for the network, the audit says what it could not check.
        let blind = engine.audit_credited(&common::payments::config(|c| c.networks.ethereum.as_mut().unwrap().rpc_url = None), &query).await.unwrap();
        assert_eq!(blind.checked, 0);
        assert!(blind.unchecked["ethereum"].contains("no node configured"), "{blind:?}");
    }

    async fn payments_confirmed_before_the_watcher_first_reaches_its_node_are_found(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let (engine, _clock) = eth_engine(&db, &anvil, &tokens, &fresh_ethereum_xpub(), 2).await;
        engine.create_topup(&topup("E1", "50", "100")).await.unwrap();
        engine.create_topup(&topup("U1", "51", "100")).await.unwrap();
        let eth = engine.create_payment(&order("E1"), Method::Eth).await.unwrap();
        let usdt = engine.create_payment(&order("U1"), Method::UsdtErc20).await.unwrap();
        // Paid and buried while the node is still out of reach of the watcher.
        anvil.send_eth(&eth.intent.pay_to, TOPUP_WEI).await;
        anvil.send_token(&tokens.usdt, &usdt.intent.pay_to, 100_000_000).await;
        anvil.mine(5).await;
        assert_eq!(engine.watcher_cursor(Network::Ethereum).await.unwrap(), None);
        let mut settings = scanner_settings(&anvil.url, &tokens, 0);
        settings.start_block = None;
        let watcher = watch_ethereum_with(&engine, settings, fast());
        for pay in [&eth, &usdt] {
            wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        }
        assert_eq!((cents(&engine, "50").await, cents(&engine, "51").await), (10_000, 10_000));
        watcher.stop().await.unwrap();
    }

    async fn a_watcher_killed_mid_stream_ends_with_the_ledger_of_an_uninterrupted_run(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let xpub = fresh_ethereum_xpub();
        let steady_db = TestDb::new(db.db).await;
        let (steady, _) = eth_engine(&steady_db, &anvil, &tokens, &xpub, 2).await;
        let (killed, _) = eth_engine(&db, &anvil, &tokens, &xpub, 2).await;
        let orders = ["K1", "K2", "K3", "K4"];
        let mut addresses = Vec::new();
        for (i, reference) in orders.iter().enumerate() {
            let method = if i % 2 == 0 { Method::Eth } else { Method::UsdtErc20 };
            let request = topup(reference, &format!("7{i}"), "100");
            steady.create_topup(&request).await.unwrap();
            killed.create_topup(&request).await.unwrap();
            let a = steady.create_payment(&order(reference), method).await.unwrap();
            let b = killed.create_payment(&order(reference), method).await.unwrap();
            assert_eq!(a.intent.pay_to, b.intent.pay_to);
            addresses.push(a.intent.pay_to);
        }
        let start = anvil.head().await;
        let uninterrupted = watch_ethereum(&steady, &anvil, &tokens, start);
        let mut victim = watch_ethereum(&killed, &anvil, &tokens, start);
        for step in 0..8u64 {
            match step % 4 {
                0 => { anvil.send_eth(&addresses[(step / 4 * 2) as usize], TOPUP_WEI).await; }
                1 => { anvil.send_token(&tokens.usdt, &addresses[(step / 4 * 2 + 1) as usize], 60_000_000).await; }
                2 => { anvil.send_token(&tokens.usdt, &addresses[(step / 4 * 2 + 1) as usize], 40_000_000).await; }
                _ => {}
            }
            anvil.mine(1).await;
            tokio::time::sleep(std::time::Duration::from_millis(20 * step)).await;
            victim.task.abort();
            let _ = victim.task.await;
            victim = watch_ethereum(&killed, &anvil, &tokens, start);
        }
        anvil.mine(2).await;
        for engine in [&steady, &killed] {
            anvil.wait_synced(engine).await;
            for reference in orders {
                let id = engine.payments_for(&order(reference)).await.unwrap()[0].intent.id.clone();
                wait_status(engine, &id, IntentStatus::Settled).await;
            }
        }
        uninterrupted.stop().await.unwrap();
        victim.stop().await.unwrap();
        assert_eq!(ledger_summary(&killed, &orders).await, ledger_summary(&steady, &orders).await);
    }
}

on_both_databases! {
    async fn with_finalized_finality_nothing_is_credited_before_the_finalized_block_passes_it(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let (engine, _clock) = eth_engine(&db, &anvil, &tokens, &fresh_ethereum_xpub(), 2).await;
        engine.create_topup(&topup("FINAL", "80", "100")).await.unwrap();
        let pay = engine.create_payment(&order("FINAL"), Method::Eth).await.unwrap();
        let mut settings = scanner_settings(&anvil.url, &tokens, anvil.head().await);
        settings.finality = Finality::Finalized;
        let watcher = watch_ethereum_with(&engine, settings, fast());
        anvil.send_eth(&pay.intent.pay_to, TOPUP_WEI).await;
        // Far deeper than the two confirmations a depth rule would ask, yet not finalized:
        // anvil finalizes 64 blocks below its head.
        anvil.mine(20).await;
        anvil.wait_synced(&engine).await;
        assert_eq!(status(&engine, &pay.intent.id).await, IntentStatus::Seen);
        assert_eq!(cents(&engine, "80").await, 0);
        anvil.mine(50).await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "80").await, 10_000);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn a_node_refusing_wide_log_ranges_and_rate_limiting_loses_nothing(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let (engine, _clock) = eth_engine(&db, &anvil, &tokens, &fresh_ethereum_xpub(), 1).await;
        let mut pays = Vec::new();
        for i in 0..4 {
            let reference = format!("RANGE{i}");
            engine.create_topup(&topup(&reference, &format!("9{i}"), "100")).await.unwrap();
            pays.push(engine.create_payment(&order(&reference), Method::UsdcErc20).await.unwrap());
        }
        // The payments land in blocks spread over a range the proxy refuses in one query.
        let start = anvil.head().await;
        for pay in &pays {
            anvil.send_token(&tokens.usdc, &pay.intent.pay_to, 100_000_000).await;
            anvil.mine(3).await;
        }
        let proxy = RpcProxy::start(&anvil.url, 2, 4).await;
        let watcher = watch_ethereum_with(&engine, scanner_settings(&proxy.url, &tokens, start), fast());
        for pay in &pays {
            wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        }
        anvil.wait_synced(&engine).await;
        let refused = proxy.counts.refused_ranges.load(Ordering::SeqCst);
        let limited = proxy.counts.rate_limited.load(Ordering::SeqCst);
        assert!(refused > 0 && limited > 0, "the proxy refused {refused} ranges and rate-limited {limited} requests");
        assert_eq!(watcher.status.borrow().state, WatcherState::Running);
        watcher.stop().await.unwrap();
        for i in 0..4 {
            assert_eq!(cents(&engine, &format!("9{i}")).await, 10_000);
            assert_eq!(engine.transfers_for(&order(&format!("RANGE{i}"))).await.unwrap().len(), 1, "one transfer each, not one per retry");
        }
        sound(&engine).await;
    }

    async fn over_a_websocket_a_new_head_is_scanned_without_waiting_for_the_poll(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let (engine, _clock) = eth_engine(&db, &anvil, &tokens, &fresh_ethereum_xpub(), 1).await;
        engine.create_topup(&topup("PUSHED", "99", "100")).await.unwrap();
        let pay = engine.create_payment(&order("PUSHED"), Method::Eth).await.unwrap();
        let ws_url = anvil.url.replacen("http://", "ws://", 1);
        // An hour between polls: only the subscription can bring the payment in time.
        let options = WatcherOptions { poll_interval: std::time::Duration::from_secs(3600), ..fast() };
        let watcher = watch_ethereum_with(&engine, scanner_settings(&ws_url, &tokens, anvil.head().await), options);
        eventually("the first scan", || async { watcher.status.borrow().state == WatcherState::Running }).await;
        anvil.send_eth(&pay.intent.pay_to, TOPUP_WEI).await;
        anvil.mine(1).await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "99").await, 10_000);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}
