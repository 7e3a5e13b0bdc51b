//! The Ethereum watcher against a real anvil node with real ERC-20 contracts, on SQLite and
//! PostgreSQL: ETH and token payments of every shape, the wrong token, a reverted transfer,
//! reorgs before and after credit, and a watcher killed mid-stream.

mod common;

use chrono::Duration;
use common::anvil::{Anvil, eth_engine, fresh_ethereum_xpub, watch_ethereum};
use common::regtest::eventually;
use common::{TestDb, account, topup};
use payrecon::Engine;
use payrecon::clock::Clock;
use payrecon::intent::IntentStatus;
use payrecon::order::OrderRef;
use payrecon_chain_core::Method;

fn order(r: &str) -> OrderRef {
    OrderRef::new(r).unwrap()
}

async fn status(engine: &Engine, intent: &str) -> IntentStatus {
    engine.payment(intent).await.unwrap().intent.status
}

async fn wait_status(engine: &Engine, intent: &str, want: IntentStatus) {
    eventually(&format!("intent {intent} to become {want:?}"), || async {
        status(engine, intent).await == want
    })
    .await;
}

async fn kinds(engine: &Engine, reference: &str) -> Vec<String> {
    let mut kinds: Vec<String> = engine
        .exceptions(Some(&order(reference)))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    kinds.sort();
    kinds
}

async fn cents(engine: &Engine, customer: &str) -> i64 {
    engine
        .available_balance(&account(customer))
        .await
        .unwrap()
        .cents()
}

async fn sound(engine: &Engine) {
    let trial = engine.trial_balance().await.unwrap();
    assert!(trial.is_sound(), "{trial:?}");
}

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
        engine.tick().await.unwrap();
        assert_eq!(status(&engine, &pays[1].intent.id).await, IntentStatus::Underpaid);
        assert_eq!(status(&engine, &pays[3].intent.id).await, IntentStatus::Expired);
        anvil.send_eth(&pays[3].intent.pay_to, TOPUP_WEI).await;
        anvil.next_block_at_least(clock.now().timestamp()).await;
        anvil.mine(2).await;
        wait_status(&engine, &pays[3].intent.id, IntentStatus::PaidLate).await;
        assert_eq!(kinds(&engine, "LATE").await, ["paid_late"]);
        assert_eq!(cents(&engine, "43").await, 0, "late money is held");
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
        for reference in ["WRONG", "FAKE", "ETHTOTOKEN"] {
            eventually("a wrong_asset exception", || async { kinds(&engine, reference).await == ["wrong_asset"] }).await;
        }
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
        let summary = |engine: Engine| async move {
            let trial = engine.trial_balance().await.unwrap();
            assert!(trial.is_sound());
            let mut transfers = Vec::new();
            for reference in orders {
                for t in engine.transfers_for(&order(reference)).await.unwrap() {
                    transfers.push(format!("{} {} {} {}", t.id, t.amount, t.removed, t.credited_entry.is_some()));
                }
            }
            transfers.sort();
            format!("{:?}\n{}", trial.accounts, transfers.join("\n"))
        };
        assert_eq!(summary(killed).await, summary(steady).await);
    }
}
