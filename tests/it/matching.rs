//! Payment instructions and the matcher, on SQLite and PostgreSQL: every state, every
//! exception, reorgs, replays, and what the ledger holds after each.

use crate::common;

use chrono::Duration;
use common::payments::{Tx, config, engine, start_time};
use common::{account, rental, topup};
use payrecon::Error;
use payrecon::IntentStatus;
use payrecon::config::CreditPolicy;
use payrecon::ledger::{Account, Currency, SuspenseReason};
use payrecon::{CsvSection, OrderRef, OrderStatus, ReportFormat, ReportQuery};
use payrecon_chain_core::{ChainEvent, Method, Network, ReceivedAsset};
use serde_json::json;

fn order(r: &str) -> OrderRef {
    OrderRef::new(r).unwrap()
}

async fn suspense(engine: &payrecon::Engine, reason: SuspenseReason, method: Method) -> i128 {
    engine
        .account_balance(&Account::Suspense(reason), Currency::Crypto(method))
        .await
        .unwrap()
}

async fn sound(engine: &payrecon::Engine) {
    let trial = engine.trial_balance().await.unwrap();
    assert!(trial.is_sound(), "{trial:?}");
}

fn kinds(exceptions: &[payrecon::ExceptionRecord]) -> Vec<&str> {
    exceptions.iter().map(|e| e.kind.as_str()).collect()
}

on_both_databases! {
    async fn an_exact_payment_is_seen_confirmed_and_settled_once(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        assert_eq!(pay.amount_decimal, "0.00625");
        assert!(pay.payment_uri.starts_with(&format!("bitcoin:{}?amount=0.00625", pay.intent.pay_to)));
        let tx = Tx::new(Network::Bitcoin, "aa", &pay.intent.watch_key, Method::Btc, 625_000, start_time());

        engine.apply_chain_events(&[tx.observed(0, 100)]).await.unwrap();
        assert_eq!(engine.payment(&pay.intent.id).await.unwrap().intent.status, IntentStatus::Seen);
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 0, "unconfirmed is not money");

        engine.apply_chain_events(&[tx.observed(1, 101)]).await.unwrap();
        assert_eq!(engine.payment(&pay.intent.id).await.unwrap().intent.status, IntentStatus::Seen, "BTC needs 2");
        engine.apply_chain_events(&[tx.observed(2, 102)]).await.unwrap();
        let settled = engine.payment(&pay.intent.id).await.unwrap().intent;
        assert_eq!(settled.status, IntentStatus::Settled);
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 50_000);
        assert!(matches!(engine.order(&order("T1")).await.unwrap().status, OrderStatus::Settled { .. }));

        // The same events again, and more confirmations: nothing more is credited.
        engine.apply_chain_events(&[tx.observed(0, 100), tx.observed(2, 102), tx.observed(6, 106)]).await.unwrap();
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 50_000);
        let entries = engine.entries_for("T1").await.unwrap();
        assert_eq!(entries.len(), 1);
        let custody = engine.account_balance(&Account::Custody(Method::Btc), Currency::Crypto(Method::Btc)).await.unwrap();
        assert_eq!(custody, 625_000);
        assert!(engine.exceptions(Some(&order("T1"))).await.unwrap().is_empty());
        sound(&engine).await;
    }

    async fn a_rental_paid_in_usdt_on_tron_settles_to_revenue(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        engine.create_rental_order(&rental("R1", "42", "420")).await.unwrap();
        let pay = engine.create_payment(&order("R1"), Method::UsdtTrc20).await.unwrap();
        assert!(pay.intent.pay_to.starts_with('T'));
        assert!(pay.payment_uri.contains("token=TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6t"));
        let tx = Tx::new(Network::Tron, "t1", &pay.intent.watch_key, Method::UsdtTrc20, 420_000_000, start_time());
        engine.apply_chain_events(&[tx.observed(19, 500)]).await.unwrap();
        assert_eq!(engine.payment(&pay.intent.id).await.unwrap().intent.status, IntentStatus::Settled);
        assert_eq!(engine.account_balance(&Account::RevenueRentals, Currency::Usd).await.unwrap(), -42_000);
        assert_eq!(engine.account_balance(&Account::Custody(Method::UsdtTrc20), Currency::Crypto(Method::UsdtTrc20)).await.unwrap(), 420_000_000);
        sound(&engine).await;
    }

    async fn two_partial_payments_add_up(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        let a = Tx::new(Network::Bitcoin, "a", &pay.intent.watch_key, Method::Btc, 300_000, start_time());
        let b = Tx::new(Network::Bitcoin, "b", &pay.intent.watch_key, Method::Btc, 325_000, start_time());
        engine.apply_chain_events(&[a.observed(2, 10)]).await.unwrap();
        assert_eq!(engine.payment(&pay.intent.id).await.unwrap().intent.status, IntentStatus::Confirmed);
        engine.apply_chain_events(&[b.observed(2, 11)]).await.unwrap();
        assert_eq!(engine.payment(&pay.intent.id).await.unwrap().intent.status, IntentStatus::Settled);
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 50_000);
        sound(&engine).await;
    }

    async fn an_underpayment_becomes_an_exception_at_the_deadline(db) {
        let (engine, clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        let a = Tx::new(Network::Bitcoin, "a", &pay.intent.watch_key, Method::Btc, 600_000, start_time());
        engine.apply_chain_events(&[a.observed(3, 10)]).await.unwrap();
        clock.advance(Duration::minutes(61));
        assert_eq!(engine.tick().await.unwrap(), 1);
        let intent = engine.payment(&pay.intent.id).await.unwrap();
        assert_eq!(intent.intent.status, IntentStatus::Underpaid);
        assert!(intent.customer_message.contains("do not pay again") || intent.customer_message.contains("Do not pay again"));
        assert_eq!(kinds(&engine.exceptions(Some(&order("T1"))).await.unwrap()), ["underpaid"]);
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 0);
        sound(&engine).await;
    }

    async fn an_underpayment_within_tolerance_settles(db) {
        let (engine, _clock) = engine(&db, config(|c| c.payments.underpayment_tolerance_bps = 50)).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        let a = Tx::new(Network::Bitcoin, "a", &pay.intent.watch_key, Method::Btc, 622_000, start_time());
        engine.apply_chain_events(&[a.observed(2, 10)]).await.unwrap();
        assert_eq!(engine.payment(&pay.intent.id).await.unwrap().intent.status, IntentStatus::Settled);
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 50_000, "the order's USD, whole");
        sound(&engine).await;
    }

    async fn an_overpayment_is_held_for_an_operator(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        let a = Tx::new(Network::Bitcoin, "a", &pay.intent.watch_key, Method::Btc, 700_000, start_time());
        engine.apply_chain_events(&[a.observed(2, 10)]).await.unwrap();
        assert_eq!(engine.payment(&pay.intent.id).await.unwrap().intent.status, IntentStatus::Settled);
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 50_000);
        assert_eq!(suspense(&engine, SuspenseReason::Overpaid, Method::Btc).await, -75_000);
        assert_eq!(kinds(&engine.exceptions(Some(&order("T1"))).await.unwrap()), ["overpaid"]);
        sound(&engine).await;

        // The event stream tells the shop what happened, in order, resumable by seq.
        let events = engine.events_after(0, 100).await.unwrap();
        let stream: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(stream, ["intent_created", "exception_opened", "status_changed"]);
        assert_eq!(events[2].detail["to"], "settled");
        assert_eq!(events[1].detail["kind"], "overpaid");
        assert!(engine.events_after(events[2].seq, 100).await.unwrap().is_empty());
    }

    async fn late_money_is_credited_at_the_locked_rate_by_policy(db) {
        let (engine, clock) = engine(&db, config(|c| c.payments.late_payment_policy = CreditPolicy::CreditBalance)).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        clock.advance(Duration::hours(3));
        let late = Tx::new(Network::Bitcoin, "late", &pay.intent.watch_key, Method::Btc, 625_000, start_time() + Duration::hours(2));
        engine.apply_chain_events(&[late.observed(2, 10)]).await.unwrap();
        assert_eq!(engine.payment(&pay.intent.id).await.unwrap().intent.status, IntentStatus::PaidLate);
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 50_000, "its value at the locked rate");
        assert_eq!(engine.order(&order("T1")).await.unwrap().status, OrderStatus::Open, "the top-up itself is not settled");
        sound(&engine).await;
    }

    async fn an_overpayment_is_credited_at_the_locked_rate_by_policy(db) {
        let (engine, _clock) = engine(&db, config(|c| c.payments.overpayment_policy = CreditPolicy::CreditBalance)).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        let a = Tx::new(Network::Bitcoin, "a", &pay.intent.watch_key, Method::Btc, 700_000, start_time());
        engine.apply_chain_events(&[a.observed(2, 10)]).await.unwrap();
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 56_000, "500 + 0.00075 BTC at 80000");
        sound(&engine).await;
    }

    async fn money_first_seen_after_the_deadline_is_late_and_held(db) {
        let (engine, clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        clock.advance(Duration::minutes(90));
        engine.tick().await.unwrap();
        assert_eq!(engine.payment(&pay.intent.id).await.unwrap().intent.status, IntentStatus::Expired);
        let late = Tx::new(Network::Bitcoin, "late", &pay.intent.watch_key, Method::Btc, 625_000, start_time() + Duration::minutes(89));
        engine.apply_chain_events(&[late.observed(0, 10)]).await.unwrap();
        let intent = engine.payment(&pay.intent.id).await.unwrap();
        assert_eq!(intent.intent.status, IntentStatus::PaidLate);
        assert!(intent.customer_message.contains("do not pay again"));
        engine.apply_chain_events(&[late.observed(2, 12)]).await.unwrap();
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 0, "held, not credited");
        assert_eq!(suspense(&engine, SuspenseReason::Late, Method::Btc).await, -625_000);
        assert_eq!(engine.order(&order("T1")).await.unwrap().status, OrderStatus::Open);
        assert_eq!(kinds(&engine.exceptions(Some(&order("T1"))).await.unwrap()), ["paid_late"]);
        sound(&engine).await;
    }

    async fn seen_before_the_deadline_and_confirmed_after_is_on_time(db) {
        let (engine, clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        let a = Tx::new(Network::Bitcoin, "a", &pay.intent.watch_key, Method::Btc, 625_000, start_time() + Duration::minutes(59));
        engine.apply_chain_events(&[a.observed(0, 10)]).await.unwrap();
        clock.advance(Duration::minutes(120));
        engine.tick().await.unwrap();
        assert_eq!(engine.payment(&pay.intent.id).await.unwrap().intent.status, IntentStatus::Seen);
        assert_eq!(engine.tick().await.unwrap(), 0, "a seen intent waits for chain events, not the clock");
        engine.apply_chain_events(&[a.observed(2, 12)]).await.unwrap();
        assert_eq!(engine.payment(&pay.intent.id).await.unwrap().intent.status, IntentStatus::Settled);
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 50_000);
    }

    async fn the_wrong_asset_is_never_credited_as_the_asked_one(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::UsdtErc20).await.unwrap();
        let usdc = Tx::new(Network::Ethereum, "0xusdc", &pay.intent.watch_key, Method::UsdcErc20, 500_000_000, start_time());
        let eth = Tx::new(Network::Ethereum, "0xeth", &pay.intent.watch_key, Method::Eth, 10u128.pow(17), start_time());
        let mut fake = Tx::new(Network::Ethereum, "0xfake", &pay.intent.watch_key, Method::UsdtErc20, 500_000_000, start_time());
        fake.asset = ReceivedAsset::OtherToken { contract: "0x000000000000000000000000000000000000dead".into() };
        engine.apply_chain_events(&[usdc.observed(12, 20), eth.observed(12, 20), fake.observed(12, 20)]).await.unwrap();
        let intent = engine.payment(&pay.intent.id).await.unwrap().intent;
        assert_eq!(intent.status, IntentStatus::AwaitingPayment);
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 0);
        assert_eq!(kinds(&engine.exceptions(Some(&order("T1"))).await.unwrap()), ["wrong_asset", "wrong_asset"]);
        let unknown: Vec<String> = engine.exceptions(None).await.unwrap().into_iter().filter(|e| e.kind == "unknown_token").map(|e| e.id).collect();
        assert_eq!(unknown, ["unknown_token:ethereum:0x000000000000000000000000000000000000dead"], "a token of another contract: one exception per contract");
        assert_eq!(suspense(&engine, SuspenseReason::WrongAsset, Method::UsdcErc20).await, -500_000_000);
        assert_eq!(suspense(&engine, SuspenseReason::WrongAsset, Method::Eth).await, -(10i128.pow(17)));
        assert_eq!(engine.account_balance(&Account::Custody(Method::UsdtErc20), Currency::Crypto(Method::UsdtErc20)).await.unwrap(), 0, "a fake token is no USDT");
        sound(&engine).await;
    }

    async fn eth_from_the_treasury_to_a_token_address_is_a_fee_top_up_not_a_payment(db) {
        const TREASURY: &str = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8";
        const STRANGER: &str = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC";
        let (engine, _clock) = engine(&db, config(|c| {
            // Configured lower-case: compared in the checksummed form the watcher reports.
            c.networks.ethereum.as_mut().unwrap().treasury_addresses = vec![TREASURY.to_lowercase()];
        })).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::UsdtErc20).await.unwrap();
        let gas = 2 * 10u128.pow(15);
        let eth = |txid: &str, sender: &str| Tx::new(Network::Ethereum, txid, &pay.intent.watch_key, Method::Eth, gas, start_time()).from(sender);
        let top_up = eth("0xtopup", TREASURY);
        let custody_eth = || async { engine.account_balance(&Account::Custody(Method::Eth), Currency::Crypto(Method::Eth)).await.unwrap() };
        let treasury_eth = || async { engine.account_balance(&Account::Treasury(Method::Eth), Currency::Crypto(Method::Eth)).await.unwrap() };

        // Unconfirmed: nothing to look at, nothing booked; confirmed: treasury to custody.
        engine.apply_chain_events(&[top_up.observed(0, 20)]).await.unwrap();
        assert!(engine.exceptions(Some(&order("T1"))).await.unwrap().is_empty());
        engine.apply_chain_events(&[top_up.observed(12, 31), top_up.observed(12, 31)]).await.unwrap();
        assert!(engine.exceptions(Some(&order("T1"))).await.unwrap().is_empty(), "the merchant's own coin is no exception");
        assert_eq!((custody_eth().await, treasury_eth().await), (gas as i128, -(gas as i128)));
        assert_eq!(suspense(&engine, SuspenseReason::WrongAsset, Method::Eth).await, 0);
        let entries = engine.entries_for("T1").await.unwrap();
        assert_eq!(entries.iter().map(|e| (e.entry.idempotency_key.as_str(), e.entry.kind.as_str())).collect::<Vec<_>>(), [("top-up:ethereum:0xtopup:0", "internal_transfer")]);
        let recorded = engine.transfers_for(&order("T1")).await.unwrap();
        assert_eq!(recorded[0].from_address.as_deref(), Some(TREASURY), "operators see the sender");
        let intent = engine.payment(&pay.intent.id).await.unwrap().intent;
        assert_eq!(intent.status, IntentStatus::AwaitingPayment, "never credited to the order");
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 0);

        // ETH from anyone else, and a token from the treasury, stay wrong-asset payments.
        let stranger = eth("0xstranger", STRANGER);
        let usdc = Tx::new(Network::Ethereum, "0xusdc", &pay.intent.watch_key, Method::UsdcErc20, 5_000_000, start_time()).from(TREASURY);
        engine.apply_chain_events(&[stranger.observed(12, 32), usdc.observed(12, 32)]).await.unwrap();
        let exceptions = engine.exceptions(Some(&order("T1"))).await.unwrap();
        assert_eq!(kinds(&exceptions), ["wrong_asset", "wrong_asset"]);
        assert!(exceptions.iter().any(|e| e.detail.starts_with(&format!("0.002 ETH (ethereum:0xstranger:0) from {STRANGER} sent to"))), "operators see where a refund would go: {exceptions:?}");
        assert_eq!(suspense(&engine, SuspenseReason::WrongAsset, Method::Eth).await, -(gas as i128));

        // The same transfer with another sender is refused; a reorg takes the top-up back and
        // its return books it again, with no exception about money held.
        let forged = eth("0xtopup", STRANGER);
        assert!(matches!(engine.apply_chain_events(&[forged.observed(12, 33)]).await, Err(Error::InvalidEvent(_))));
        engine.apply_chain_events(&[top_up.removed(33)]).await.unwrap();
        assert_eq!((custody_eth().await, treasury_eth().await), (gas as i128, 0), "only the stranger's ETH is held");
        engine.apply_chain_events(&[top_up.observed(12, 45)]).await.unwrap();
        assert_eq!(treasury_eth().await, -(gas as i128));
        let exceptions = engine.exceptions(Some(&order("T1"))).await.unwrap();
        let mut open = kinds(&exceptions);
        open.sort_unstable();
        assert_eq!(open, ["reorged_after_credit", "wrong_asset", "wrong_asset"]);

        // Finance's reconciliation names the top-up as the merchant's own money.
        let query = ReportQuery { from: start_time() - Duration::hours(1), to: start_time() + Duration::days(1), method: None };
        let mut out = Vec::new();
        engine.write_reconciliation(&query, ReportFormat::Json, CsvSection::Transfers, &mut out).await.unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let summary = report["summary"].as_array().unwrap().iter().find(|s| s["method"] == "eth").unwrap();
        assert_eq!((&summary["received"], &summary["held"], &summary["own_funds"], &summary["difference"]), (&json!("0.004"), &json!("0.002"), &json!("0.002"), &json!("0.004")), "{summary}");
        assert!(summary["why"].as_str().unwrap().contains("0.002 the merchant's own (fee top-ups)"), "{summary}");
        let state = report["transfers"].as_array().unwrap().iter().find(|t| t["txid"] == "0xtopup").unwrap()["state"].clone();
        assert_eq!(state, json!("fee_top_up"));
        sound(&engine).await;
    }

    async fn money_marked_as_the_merchants_own_is_named_so_in_the_report_for_every_method(db) {
        // LTC and SOL come last among the methods: the report's own-funds query lists every
        // treasury account, and must bind each of them.
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        let unmatched = [
            Tx::new(Network::Litecoin, "ltc-own", "ltc1qnoonesaddress", Method::Ltc, 1_000_000, start_time()),
            Tx::new(Network::Solana, "sol-own", "SoLnoonesaddress", Method::Sol, 2_000_000, start_time()),
        ];
        engine.apply_chain_events(&[unmatched[0].observed(6, 10), unmatched[1].observed(1, 10)]).await.unwrap();
        for tx in &unmatched {
            let id = format!("unmatched:{}", tx.id);
            engine.resolve_exception(&id, &payrecon::Action::MarkOwnFunds, "ops", "a move between our wallets").await.unwrap();
        }
        let query = ReportQuery { from: start_time() - Duration::hours(1), to: start_time() + Duration::days(1), method: None };
        let mut out = Vec::new();
        engine.write_reconciliation(&query, ReportFormat::Json, CsvSection::Summary, &mut out).await.unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let own = |method: &str| report["summary"].as_array().unwrap().iter().find(|s| s["method"] == method).unwrap()["own_funds"].clone();
        assert_eq!((own("ltc"), own("sol")), (json!("0.01"), json!("0.002")), "{report}");
        sound(&engine).await;
    }

    async fn a_transfer_recorded_without_its_sender_gets_it_when_seen_again(db) {
        const TREASURY: &str = "TEQrkTwY43gnKH62mH8xQo1DKPorVZvv5r";
        let (engine, _clock) = engine(&db, config(|c| {
            c.networks.tron.as_mut().unwrap().treasury_addresses = vec![TREASURY.into()];
        })).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::UsdtTrc20).await.unwrap();
        let before = Tx::new(Network::Tron, "aa", &pay.intent.watch_key, Method::Trx, 30_000_000, start_time());
        engine.apply_chain_events(&[before.observed(1, 10)]).await.unwrap();
        assert_eq!(engine.transfers_for(&order("T1")).await.unwrap()[0].from_address, None);
        engine.apply_chain_events(&[before.from(TREASURY).observed(19, 28)]).await.unwrap();
        assert_eq!(engine.transfers_for(&order("T1")).await.unwrap()[0].from_address.as_deref(), Some(TREASURY));
        assert_eq!(engine.account_balance(&Account::Treasury(Method::Trx), Currency::Crypto(Method::Trx)).await.unwrap(), -30_000_000);
        assert_eq!(suspense(&engine, SuspenseReason::WrongAsset, Method::Trx).await, 0, "booked as a top-up, nothing held");
        // The exception opened while the sender was unknown holds no money: dismissed.
        let exceptions = engine.exceptions(Some(&order("T1"))).await.unwrap();
        assert_eq!(kinds(&exceptions), ["wrong_asset"]);
        engine.resolve_exception(&exceptions[0].id, &payrecon::Action::Dismiss, "ops", "a top-up from the treasury").await.unwrap();
        sound(&engine).await;
    }

    async fn money_after_settlement_is_an_exception_not_absorbed(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        let a = Tx::new(Network::Bitcoin, "a", &pay.intent.watch_key, Method::Btc, 625_000, start_time());
        let again = Tx::new(Network::Bitcoin, "again", &pay.intent.watch_key, Method::Btc, 625_000, start_time());
        engine.apply_chain_events(&[a.observed(2, 10)]).await.unwrap();
        engine.apply_chain_events(&[again.observed(2, 11)]).await.unwrap();
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 50_000);
        assert_eq!(suspense(&engine, SuspenseReason::Overpaid, Method::Btc).await, -625_000);
        assert_eq!(kinds(&engine.exceptions(Some(&order("T1"))).await.unwrap()), ["paid_after_settlement"]);
        sound(&engine).await;
    }

    async fn nothing_arriving_expires_and_says_not_to_pay_twice(db) {
        let (engine, clock) = engine(&db, config(|_| {})).await;
        engine.create_rental_order(&rental("R1", "42", "420")).await.unwrap();
        let pay = engine.create_payment(&order("R1"), Method::Sol).await.unwrap();
        assert!(pay.payment_uri.starts_with(&format!("solana:{}?amount=2.8&reference={}", pay.intent.pay_to, pay.intent.watch_key)));
        clock.advance(Duration::minutes(31));
        engine.tick().await.unwrap();
        let expired = engine.payment(&pay.intent.id).await.unwrap();
        assert_eq!(expired.intent.status, IntentStatus::Expired);
        assert!(expired.customer_message.contains("do not pay again"));
        assert!(engine.watch_keys(Network::Solana).await.unwrap().contains(&pay.intent.watch_key), "still watched");
    }

    async fn a_superseded_intent_stays_watched_and_its_payment_counts(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        engine.create_rental_order(&rental("R1", "42", "420")).await.unwrap();
        let old = engine.create_payment(&order("R1"), Method::Btc).await.unwrap();
        let new = engine.create_payment(&order("R1"), Method::Btc).await.unwrap();
        assert_ne!(old.intent.pay_to, new.intent.pay_to, "never the same address");
        let intents = engine.payments_for(&order("R1")).await.unwrap();
        assert_eq!(intents[0].intent.superseded_by.as_deref(), Some(new.intent.id.as_str()));
        assert!(engine.watch_keys(Network::Bitcoin).await.unwrap().contains(&old.intent.watch_key));

        let paid_old = Tx::new(Network::Bitcoin, "old", &old.intent.watch_key, Method::Btc, old.intent.amount.base_units(), start_time());
        engine.apply_chain_events(&[paid_old.observed(2, 10)]).await.unwrap();
        assert_eq!(engine.payment(&old.intent.id).await.unwrap().intent.status, IntentStatus::Settled);
        assert!(matches!(engine.order(&order("R1")).await.unwrap().status, OrderStatus::Settled { .. }));

        let paid_new = Tx::new(Network::Bitcoin, "new", &new.intent.watch_key, Method::Btc, new.intent.amount.base_units(), start_time());
        engine.apply_chain_events(&[paid_new.observed(2, 11)]).await.unwrap();
        assert_eq!(kinds(&engine.exceptions(Some(&order("R1"))).await.unwrap()), ["paid_after_settlement"]);
        assert_eq!(engine.account_balance(&Account::RevenueRentals, Currency::Usd).await.unwrap(), -42_000, "revenue once");
        assert!(matches!(engine.create_payment(&order("R1"), Method::Btc).await, Err(Error::AlreadySettled(_))));
        sound(&engine).await;
    }

    async fn a_reorg_before_credit_credits_nothing(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        let a = Tx::new(Network::Bitcoin, "a", &pay.intent.watch_key, Method::Btc, 625_000, start_time());
        engine.apply_chain_events(&[a.observed(1, 10), a.removed(11)]).await.unwrap();
        assert_eq!(engine.payment(&pay.intent.id).await.unwrap().intent.status, IntentStatus::AwaitingPayment);
        // A late replay of the old observation changes nothing.
        engine.apply_chain_events(&[a.observed(2, 10)]).await.unwrap();
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 0);
        assert_eq!(engine.trial_balance().await.unwrap().entries, 0);
    }

    async fn a_reorg_after_a_spent_credit_reverses_into_suspense(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        let a = Tx::new(Network::Bitcoin, "a", &pay.intent.watch_key, Method::Btc, 625_000, start_time());
        engine.apply_chain_events(&[a.observed(2, 10)]).await.unwrap();
        engine.create_rental_order(&rental("R1", "42", "420")).await.unwrap();
        engine.pay_order_from_balance(&order("R1")).await.unwrap();

        engine.apply_chain_events(&[a.removed(12)]).await.unwrap();
        let intent = engine.payment(&pay.intent.id).await.unwrap().intent;
        assert_eq!(intent.status, IntentStatus::ReorgedAfterCredit);
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 0, "never negative");
        assert_eq!(engine.account_balance(&Account::Suspense(SuspenseReason::Reversed), Currency::Usd).await.unwrap(), 42_000);
        let topup_order = engine.order(&order("T1")).await.unwrap();
        assert_eq!(topup_order.status, OrderStatus::Open);
        assert_eq!(topup_order.attention.as_deref(), Some("reorged_after_credit"));
        assert_eq!(kinds(&engine.exceptions(Some(&order("T1"))).await.unwrap()), ["reorged_after_credit"]);
        assert_eq!(engine.account_balance(&Account::Custody(Method::Btc), Currency::Crypto(Method::Btc)).await.unwrap(), 0);
        sound(&engine).await;

        // The replacement transaction pays the same address: settled again, under a new key.
        let b = Tx::new(Network::Bitcoin, "b", &pay.intent.watch_key, Method::Btc, 625_000, start_time());
        engine.apply_chain_events(&[b.observed(2, 13)]).await.unwrap();
        let intent = engine.payment(&pay.intent.id).await.unwrap().intent;
        assert_eq!((intent.status, intent.settlement_count), (IntentStatus::Settled, 2));
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 50_000);
        sound(&engine).await;
    }

    async fn malformed_or_contradictory_events_are_refused_whole(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        let good = Tx::new(Network::Bitcoin, "good", &pay.intent.watch_key, Method::Btc, 625_000, start_time());
        let empty_txid = Tx::new(Network::Bitcoin, "", &pay.intent.watch_key, Method::Btc, 1, start_time());
        let injection = Tx::new(Network::Bitcoin, "x'; DROP TABLE transfers;--", &pay.intent.watch_key, Method::Btc, 1, start_time());
        let mut confirmed_nowhere = good.observed(2, 10);
        let mut above_the_tip = good.observed(2, 10);
        let mut in_a_block_unconfirmed = good.observed(0, 10);
        if let (ChainEvent::Observed { block_height: a, .. }, ChainEvent::Observed { block_height: b, .. }, ChainEvent::Observed { block_height: c, .. }) = (&mut confirmed_nowhere, &mut above_the_tip, &mut in_a_block_unconfirmed) {
            (*a, *b, *c) = (None, Some(11), Some(9));
        }
        for bad in [empty_txid.observed(2, 10), injection.observed(2, 10), confirmed_nowhere, above_the_tip] {
            assert!(matches!(engine.apply_chain_events(&[good.observed(2, 10), bad]).await, Err(Error::InvalidEvent(_))));
        }
        assert!(engine.transfers_for(&order("T1")).await.unwrap().is_empty(), "the batch applied nothing");
        engine.apply_chain_events(&[good.observed(0, 10)]).await.unwrap();
        let mut changed = Tx::new(Network::Bitcoin, "good", &pay.intent.watch_key, Method::Btc, 1, start_time());
        changed.seen_at = start_time();
        assert!(matches!(engine.apply_chain_events(&[changed.observed(2, 11)]).await, Err(Error::InvalidEvent(_))));
        assert_eq!(engine.trial_balance().await.unwrap().entries, 0);
        // In a block at zero confirmations: a coin its chain does not let be spent yet (a
        // Litecoin peg-out before it matures). Seen, never confirmed, nothing credited.
        engine.apply_chain_events(&[in_a_block_unconfirmed]).await.unwrap();
        let stored = engine.transfers_for(&order("T1")).await.unwrap();
        assert_eq!((stored[0].block_height, stored[0].confirmations), (Some(9), 0));
        assert_eq!(engine.payments_for(&order("T1")).await.unwrap()[0].intent.status, IntentStatus::Seen);
        assert_eq!(engine.trial_balance().await.unwrap().entries, 0);
    }

    async fn the_watcher_cursor_moves_with_its_events_or_not_at_all(db) {
        use payrecon_chain_core::{BlockId, ChainCursor};
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        let block = |height: u64| BlockId { height, hash: format!("{height:064x}") };
        let cursor = |height: u64| ChainCursor { tip: block(height), checkpoints: (height - 3..height).map(block).collect() };
        assert_eq!(engine.watcher_cursor(Network::Bitcoin).await.unwrap(), None);

        let a = Tx::new(Network::Bitcoin, "a", &pay.intent.watch_key, Method::Btc, 625_000, start_time());
        engine.apply_chain_events_at(Network::Bitcoin, &[a.observed(2, 101)], &cursor(101)).await.unwrap();
        assert_eq!(engine.watcher_cursor(Network::Bitcoin).await.unwrap(), Some(cursor(101)));
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 50_000);

        // A batch that fails moves neither the ledger nor the cursor: the watcher redoes it.
        let bad = Tx::new(Network::Bitcoin, "", &pay.intent.watch_key, Method::Btc, 1, start_time());
        let b = Tx::new(Network::Bitcoin, "b", &pay.intent.watch_key, Method::Btc, 1_000, start_time());
        assert!(engine.apply_chain_events_at(Network::Bitcoin, &[b.observed(2, 102), bad.observed(2, 102)], &cursor(102)).await.is_err());
        assert_eq!(engine.watcher_cursor(Network::Bitcoin).await.unwrap(), Some(cursor(101)));
        assert_eq!(engine.transfers_for(&order("T1")).await.unwrap().len(), 1);

        let eth = Tx::new(Network::Ethereum, "0xe", &pay.intent.watch_key, Method::Eth, 1, start_time());
        assert!(matches!(
            engine.apply_chain_events_at(Network::Bitcoin, &[eth.observed(1, 5)], &cursor(103)).await,
            Err(Error::InvalidEvent(_))
        ));
        let no_hash = ChainCursor { tip: BlockId { height: 104, hash: String::new() }, checkpoints: vec![] };
        assert!(matches!(engine.apply_chain_events_at(Network::Bitcoin, &[], &no_hash).await, Err(Error::InvalidEvent(_))));
        assert_eq!(engine.watcher_cursor(Network::Bitcoin).await.unwrap(), Some(cursor(101)));
        assert_eq!(engine.watcher_cursor(Network::Ethereum).await.unwrap(), None, "one cursor per network");
    }

    async fn an_unmatched_receipt_is_held_for_operators(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        let stray = Tx::new(Network::Solana, "sig", "9Wz2nTsvcEFo6LjvdQ5cY3D5e8jjSj5S8Sy8jqmLAvnR", Method::Sol, 1_000_000_000, start_time());
        engine.apply_chain_events(&[stray.observed(1, 10)]).await.unwrap();
        let exceptions = engine.exceptions(None).await.unwrap();
        assert_eq!(kinds(&exceptions), ["unmatched"]);
        assert_eq!(suspense(&engine, SuspenseReason::Unmatched, Method::Sol).await, -1_000_000_000);
        sound(&engine).await;
    }

    async fn dust_to_no_instructions_is_booked_each_time_but_counted_once_a_day(db) {
        let (engine, _clock) = engine(&db, config(|c| {
            c.payments.dust.insert(Method::Btc, "0.0001".into());
        })).await;
        let recipient = "9Wz2nTsvcEFo6LjvdQ5cY3D5e8jjSj5S8Sy8jqmLAvnR";
        // A thousand one-lamport transfers without a reference, and one real stray payment.
        let spam: Vec<Tx> = (0..1000).map(|i| Tx::new(Network::Solana, &format!("spam{i}"), recipient, Method::Sol, 1, start_time())).collect();
        let events: Vec<_> = spam.iter().map(|tx| tx.observed(1, 10)).collect();
        engine.apply_chain_events(&events).await.unwrap();
        let stray = Tx::new(Network::Solana, "stray", recipient, Method::Sol, 1_000_000_000, start_time());
        engine.apply_chain_events(&[stray.observed(1, 10)]).await.unwrap();
        // Configured per method: 0.00005 BTC is dust when the limit is 0.0001.
        let small = Tx::new(Network::Bitcoin, "small", "bc1qstray", Method::Btc, 5_000, start_time());
        engine.apply_chain_events(&[small.observed(2, 10)]).await.unwrap();
        let exceptions = engine.exceptions(None).await.unwrap();
        assert_eq!(kinds(&exceptions), ["unmatched", "unmatched_dust", "unmatched_dust"], "{exceptions:#?}");
        let day = start_time().format("%Y-%m-%d");
        assert!(exceptions.iter().any(|e| e.id == format!("unmatched_dust:solana:{day}")));
        assert!(exceptions.iter().any(|e| e.id == format!("unmatched_dust:bitcoin:{day}")));
        // Every lamport is still in the books: dust is counted once, booked each time.
        assert_eq!(suspense(&engine, SuspenseReason::Unmatched, Method::Sol).await, -1_000_001_000);
        assert_eq!(suspense(&engine, SuspenseReason::Unmatched, Method::Btc).await, -5_000);
        sound(&engine).await;
    }

    async fn larger_payments_need_more_confirmations(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "10000")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        let a = Tx::new(Network::Bitcoin, "a", &pay.intent.watch_key, Method::Btc, pay.intent.amount.base_units(), start_time());
        engine.apply_chain_events(&[a.observed(2, 10)]).await.unwrap();
        assert_eq!(engine.payment(&pay.intent.id).await.unwrap().intent.status, IntentStatus::Seen, "5000 USD and up need 6");
        engine.apply_chain_events(&[a.observed(6, 14)]).await.unwrap();
        assert_eq!(engine.payment(&pay.intent.id).await.unwrap().intent.status, IntentStatus::Settled);
    }

    async fn refused_creations_store_nothing_and_burn_no_address(db) {
        let (engine, _clock) = engine(&db, config(|c| c.payments.enabled_methods.retain(|m| *m != Method::Ltc))).await;
        engine.create_rental_order(&rental("R1", "42", "420")).await.unwrap();
        assert!(matches!(engine.create_payment(&order("R1"), Method::Ltc).await, Err(Error::MethodDisabled(Method::Ltc))));
        assert!(matches!(engine.create_payment(&order("nope"), Method::Btc).await, Err(Error::OrderNotFound(_))));
        assert!(engine.payments_for(&order("R1")).await.unwrap().is_empty());

        let (stale, _clock) = common::payments::engine(&db, config(|_| {})).await;
        let stale = stale.with_payment_settings({
            let mut settings = payrecon::PaymentSettings::from_config(&config(|_| {})).unwrap();
            settings.rates = Some(std::sync::Arc::new(payrecon::test_utils::rates::RateBook::new(vec![], Duration::minutes(5), rust_decimal::Decimal::ONE, Duration::zero())));
            settings
        });
        assert!(matches!(stale.create_payment(&order("R1"), Method::Btc).await, Err(Error::Rate(_))));
        assert!(engine.payments_for(&order("R1")).await.unwrap().is_empty());

        let first = engine.create_payment(&order("R1"), Method::Btc).await.unwrap();
        assert_eq!(first.intent.derivation_index, 0, "no index was burnt by the refusals");
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        engine.apply_chain_events(&[]).await.unwrap();
        let order_after = engine.order(&order("R1")).await.unwrap();
        assert_eq!(order_after.status, OrderStatus::Open, "the order stays readable and open");
    }

    async fn concurrent_intents_never_share_an_address(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        for i in 0..16 {
            engine.create_rental_order(&rental(&format!("R{i}"), "42", "10")).await.unwrap();
        }
        let engine = std::sync::Arc::new(engine);
        let tasks: Vec<_> = (0..16).map(|i| {
            let engine = engine.clone();
            tokio::spawn(async move { engine.create_payment(&OrderRef::new(format!("R{i}")).unwrap(), Method::Eth).await.unwrap() })
        }).collect();
        let mut addresses = std::collections::BTreeSet::new();
        let mut indexes = std::collections::BTreeSet::new();
        for task in tasks {
            let pay = task.await.unwrap();
            addresses.insert(pay.intent.pay_to.clone());
            indexes.insert(pay.intent.derivation_index);
        }
        assert_eq!(addresses.len(), 16);
        assert_eq!(indexes, (0..16).collect());
    }

    async fn marking_paid_is_recorded_and_moves_no_money(db) {
        let (engine, clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Ltc).await.unwrap();
        assert!(pay.intent.pay_to.starts_with("ltc1"));
        clock.advance(Duration::minutes(5));
        let marked = engine.mark_paid(&pay.intent.id).await.unwrap();
        assert_eq!(marked.intent.marked_paid_at, Some(start_time() + Duration::minutes(5)));
        clock.advance(Duration::minutes(5));
        let again = engine.mark_paid(&pay.intent.id).await.unwrap();
        assert_eq!(again.intent.marked_paid_at, marked.intent.marked_paid_at, "the first time is kept");
        assert_eq!(again.intent.status, IntentStatus::AwaitingPayment);
        assert_eq!(engine.trial_balance().await.unwrap().entries, 0);
        assert!(matches!(engine.mark_paid("pi_nope").await, Err(Error::IntentNotFound(_))));
        let events = engine.events_after(0, 100).await.unwrap();
        let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["intent_created", "marked_paid"]);
    }
}

/// With the chain's own finality deciding, 1 confirmation means "in a block, not final": a
/// configuration that would count 1 as enough is refused with the reason.
#[test]
fn explicit_finality_refuses_a_single_confirmation() {
    let config = config(|config| {
        let ethereum = config.networks.ethereum.as_mut().unwrap();
        ethereum.finality = payrecon::config::EthereumFinality::Finalized;
        ethereum.confirmations = 1;
    });
    let Err(Error::Config(reason)) = payrecon::PaymentSettings::from_config(&config) else {
        panic!("accepted");
    };
    assert!(
        reason.contains("networks.ethereum.confirmations must be at least 2"),
        "{reason}"
    );
}
