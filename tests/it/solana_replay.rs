//! The Solana watcher against a local JSON-RPC node whose answers are built from the
//! documented Solana RPC responses (`fixtures/solana/`), through the real Solana RPC client,
//! on SQLite and PostgreSQL: SOL payments of every shape, a failed transaction, a reference
//! paying someone else, money to the recipient without a reference, a confirmed transaction
//! that never finalizes and vanishes, a restart, and a node that rate-limits and times out.

use crate::common;

use chrono::Duration;
use common::checks::{cents, kinds, order, sound, status, wait_status};
use common::regtest::eventually;
use common::solana::{solana_config, solana_engine, watch_solana, watch_solana_with};
use common::topup;
use payrecon::IntentStatus;
use payrecon::test_utils::clock::Clock;
use payrecon::test_utils::watcher::WatcherState;
use payrecon_chain_core::{Method, Network};
use payrecon_chain_solana::testkit::{FakeSolana, Fault, random_pubkey};

/// 1 SOL, what a 100 USD top-up costs at 100 USD per SOL.
const TOPUP_LAMPORTS: u64 = 1_000_000_000;

on_both_databases! {
    async fn a_node_behind_that_ignores_its_until_is_refused_and_loses_nothing(db) {
        // A provider's node behind the others does not know the newest signature the watcher
        // listed, ignores it as `until` and answers its own newest, older ones (solana issue
        // 24620): an incomplete answer, counted, and nothing is lost or doubled.
        let node = FakeSolana::start().await;
        let solana = solana_config(&node);
        let (engine, clock) = solana_engine(&db, &solana).await;
        let mut pays = Vec::new();
        for (i, reference) in ["FIRST", "SECOND", "THIRD"].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("3{i}"), "100")).await.unwrap();
            pays.push(engine.create_payment(&order(reference), Method::Sol).await.unwrap());
        }
        let watcher = watch_solana(&engine, &solana);
        let now = clock.now().timestamp();
        node.pay(&solana.recipient, TOPUP_LAMPORTS, Some(&pays[0].intent.watch_key), now, false);
        let behind = node.listings_behind(None);
        node.pay(&solana.recipient, TOPUP_LAMPORTS, Some(&pays[1].intent.watch_key), now, false);
        wait_status(&engine, &pays[1].intent.id, IntentStatus::Seen).await;
        node.listings_behind(Some(behind));
        node.pay(&solana.recipient, TOPUP_LAMPORTS, Some(&pays[2].intent.watch_key), now, false);
        eventually("the watcher to refuse the listing past its until", || async {
            watcher.status.borrow().incomplete_answers > 0
        }).await;
        node.listings_behind(None);
        node.finalize_all();
        for pay in &pays {
            wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        }
        for (i, reference) in ["FIRST", "SECOND", "THIRD"].iter().enumerate() {
            assert_eq!(engine.transfers_for(&order(reference)).await.unwrap().len(), 1);
            assert_eq!(cents(&engine, &format!("3{i}")).await, 10_000);
        }
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn sol_exact_under_over_and_late(db) {
        let node = FakeSolana::start().await;
        let solana = solana_config(&node);
        let (engine, clock) = solana_engine(&db, &solana).await;
        let mut pays = Vec::new();
        for (i, reference) in ["EXACT", "UNDER", "OVER", "LATE"].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("1{i}"), "100")).await.unwrap();
            pays.push(engine.create_payment(&order(reference), Method::Sol).await.unwrap());
        }
        assert_eq!(pays[0].amount_decimal, "1");
        assert_eq!(pays[0].intent.pay_to, solana.recipient, "every intent pays the one recipient");
        assert!(pays[0].payment_uri.contains(&format!("reference={}", pays[0].intent.watch_key)));
        let watcher = watch_solana(&engine, &solana);
        let now = clock.now().timestamp();
        node.pay(&solana.recipient, TOPUP_LAMPORTS, Some(&pays[0].intent.watch_key), now, false);
        node.pay(&solana.recipient, TOPUP_LAMPORTS * 4 / 5, Some(&pays[1].intent.watch_key), now, false);
        node.pay(&solana.recipient, TOPUP_LAMPORTS * 6 / 5, Some(&pays[2].intent.watch_key), now, false);
        wait_status(&engine, &pays[0].intent.id, IntentStatus::Seen).await;
        assert_eq!(cents(&engine, "10").await, 0, "confirmed is seen, not final");
        node.finalize_all();
        wait_status(&engine, &pays[0].intent.id, IntentStatus::Settled).await;
        wait_status(&engine, &pays[2].intent.id, IntentStatus::Settled).await;
        wait_status(&engine, &pays[1].intent.id, IntentStatus::Confirmed).await;
        assert_eq!(kinds(&engine, "OVER").await, ["overpaid"]);
        assert_eq!([cents(&engine, "10").await, cents(&engine, "11").await, cents(&engine, "12").await], [10_000, 0, 10_000]);

        clock.advance(Duration::minutes(61));
        common::checks::tick_once_read(&engine, Network::Solana, &*clock).await;
        assert_eq!(status(&engine, &pays[1].intent.id).await, IntentStatus::Underpaid);
        assert_eq!(status(&engine, &pays[3].intent.id).await, IntentStatus::Expired);
        watcher.next_round().await;
        node.pay(&solana.recipient, TOPUP_LAMPORTS, Some(&pays[3].intent.watch_key), clock.now().timestamp(), false);
        node.finalize_all();
        wait_status(&engine, &pays[3].intent.id, IntentStatus::PaidLate).await;
        assert_eq!(kinds(&engine, "LATE").await, ["paid_late"]);
        assert_eq!(cents(&engine, "13").await, 0, "late money is held");
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn failed_misdirected_unreferenced_and_vanished_payments_credit_nothing(db) {
        let node = FakeSolana::start().await;
        let solana = solana_config(&node);
        let (engine, clock) = solana_engine(&db, &solana).await;
        let mut pays = Vec::new();
        for (i, reference) in ["FAILED", "ELSEWHERE", "VANISHED"].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("2{i}"), "100")).await.unwrap();
            pays.push(engine.create_payment(&order(reference), Method::Sol).await.unwrap());
        }
        let watcher = watch_solana(&engine, &solana);
        let now = clock.now().timestamp();
        node.pay(&solana.recipient, TOPUP_LAMPORTS, Some(&pays[0].intent.watch_key), now, true);
        node.pay(&random_pubkey(), TOPUP_LAMPORTS, Some(&pays[1].intent.watch_key), now, false);
        node.pay(&solana.recipient, TOPUP_LAMPORTS / 2, None, now, false);
        let vanishing = node.pay(&solana.recipient, TOPUP_LAMPORTS, Some(&pays[2].intent.watch_key), now, false);
        wait_status(&engine, &pays[2].intent.id, IntentStatus::Seen).await;
        node.drop_transaction(&vanishing);
        wait_status(&engine, &pays[2].intent.id, IntentStatus::AwaitingPayment).await;
        node.finalize_all();
        eventually("a wrong_asset exception for the misdirected payment", || async {
            kinds(&engine, "ELSEWHERE").await == ["wrong_asset"]
        })
        .await;
        eventually("an unmatched receipt for the payment without a reference", || async {
            engine.exceptions(None).await.unwrap().iter().any(|e| e.kind == "unmatched")
        })
        .await;
        assert!(engine.transfers_for(&order("FAILED")).await.unwrap().is_empty(), "a failed transaction is nothing");
        assert!(engine.transfers_for(&order("VANISHED")).await.unwrap().iter().all(|t| t.removed && t.credited_entry.is_none()));
        for (i, pay) in pays.iter().enumerate() {
            assert_eq!(status(&engine, &pay.intent.id).await, IntentStatus::AwaitingPayment);
            assert_eq!(cents(&engine, &format!("2{i}")).await, 0);
        }
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn a_restarted_watcher_resumes_from_its_cursor_and_counts_each_payment_once(db) {
        let node = FakeSolana::start().await;
        let solana = solana_config(&node);
        let (engine, clock) = solana_engine(&db, &solana).await;
        let mut pays = Vec::new();
        for (i, reference) in ["S1", "S2", "S3"].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("4{i}"), "100")).await.unwrap();
            pays.push(engine.create_payment(&order(reference), Method::Sol).await.unwrap());
        }
        let now = clock.now().timestamp();
        let watcher = watch_solana(&engine, &solana);
        node.pay(&solana.recipient, TOPUP_LAMPORTS, Some(&pays[0].intent.watch_key), now, false);
        wait_status(&engine, &pays[0].intent.id, IntentStatus::Seen).await;
        watcher.stop().await.unwrap();
        node.pay(&solana.recipient, TOPUP_LAMPORTS, Some(&pays[1].intent.watch_key), now, false);
        node.finalize_all();
        let watcher = watch_solana(&engine, &solana);
        node.pay(&solana.recipient, TOPUP_LAMPORTS, Some(&pays[2].intent.watch_key), now, false);
        node.finalize_all();
        for pay in &pays {
            wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        }
        for (i, reference) in ["S1", "S2", "S3"].iter().enumerate() {
            assert_eq!(cents(&engine, &format!("4{i}")).await, 10_000);
            assert_eq!(engine.transfers_for(&order(reference)).await.unwrap().len(), 1);
        }
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn the_audit_asks_the_node_again_and_a_node_without_the_payments_fails_it(db) {
        let node = FakeSolana::start().await;
        let solana = solana_config(&node);
        let (engine, clock) = solana_engine(&db, &solana).await;
        let mut pays = Vec::new();
        for (i, reference) in ["A1", "A2"].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("8{i}"), "100")).await.unwrap();
            pays.push(engine.create_payment(&order(reference), Method::Sol).await.unwrap());
        }
        let now = clock.now().timestamp();
        let watcher = watch_solana(&engine, &solana);
        for pay in &pays {
            node.pay(&solana.recipient, TOPUP_LAMPORTS, Some(&pay.intent.watch_key), now, false);
        }
        node.finalize_all();
        for pay in &pays {
            wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        }
        watcher.stop().await.unwrap();

        let config = common::payments::config(|c| c.networks.solana = Some(solana.clone()));
        let now = clock.now();
        let query = payrecon::ReportQuery { from: now - Duration::days(1), to: now + Duration::days(1), method: None };
        let clean = engine.audit_credited(&config, &query).await.unwrap();
        assert_eq!((clean.checked, clean.findings.len()), (2, 0), "{clean:?}");
        // A node of another cluster (or one that lost its ledger) backs none of them.
        let other = FakeSolana::start().await;
        let config = common::payments::config(|c| {
            let mut elsewhere = solana.clone();
            elsewhere.rpc_url = Some(other.url.clone().into());
            c.networks.solana = Some(elsewhere);
        });
        let audit = engine.audit_credited(&config, &query).await.unwrap();
        assert_eq!(audit.findings.len(), 2, "{audit:?}");
        assert!(audit.findings.iter().all(|f| f.problem == "no longer on the chain"));
    }

    async fn rate_limits_and_timeouts_are_retried_and_lose_nothing(db) {
        let node = FakeSolana::start().await;
        let solana = solana_config(&node);
        let (engine, clock) = solana_engine(&db, &solana).await;
        let mut pays = Vec::new();
        for (i, reference) in ["R1", "R2", "R3"].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("3{i}"), "100")).await.unwrap();
            pays.push(engine.create_payment(&order(reference), Method::Sol).await.unwrap());
        }
        let now = clock.now().timestamp();
        for pay in &pays {
            node.pay(&solana.recipient, TOPUP_LAMPORTS, Some(&pay.intent.watch_key), now, false);
        }
        node.inject([
            Fault::TooManyRequests,
            Fault::Slow(std::time::Duration::from_secs(2)),
            Fault::TooManyRequests,
            Fault::TooManyRequests,
            Fault::Slow(std::time::Duration::from_secs(2)),
        ]);
        let watcher = watch_solana(&engine, &solana);
        node.finalize_all();
        for pay in &pays {
            wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        }
        assert_eq!(node.pending_faults(), 0, "every fault was met");
        eventually("the watcher running again", || async { watcher.status.borrow().state == WatcherState::Running }).await;
        for (i, reference) in ["R1", "R2", "R3"].iter().enumerate() {
            assert_eq!(cents(&engine, &format!("3{i}")).await, 10_000);
            assert_eq!(engine.transfers_for(&order(reference)).await.unwrap().len(), 1, "one transfer, not one per retry");
        }
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    // A payment lands and finalizes between the round's `getSlot` and its listing (a slow
    // node makes that likely; the fault-proxy test found it): its slot is above the tip the
    // round began with, and the round must raise its tip rather than report a transfer above
    // it, which the engine refuses and which stopped the watcher.
    async fn a_payment_newer_than_the_rounds_first_slot_is_taken(db) {
        let node = FakeSolana::start().await;
        let solana = solana_config(&node);
        let (engine, clock) = solana_engine(&db, &solana).await;
        engine.create_topup(&topup("EARLY", "51", "100")).await.unwrap();
        let early = engine.create_payment(&order("EARLY"), Method::Sol).await.unwrap();
        // Rounds only when woken (a new intent wakes the watcher), so the test knows which
        // requests a round makes: getSlot, then the recipient's listing.
        let options = payrecon::test_utils::watcher::WatcherOptions { poll_interval: std::time::Duration::from_secs(3600), ..common::regtest::fast() };
        let watcher = watch_solana_with(&engine, &solana, options);
        eventually("the first round's commit", || async { engine.watcher_cursor(payrecon_chain_core::Network::Solana).await.unwrap().is_some() }).await;
        node.inject([Fault::Slow(std::time::Duration::ZERO), Fault::Slow(std::time::Duration::from_millis(600))]);
        engine.create_topup(&topup("WAKE", "52", "100")).await.unwrap();
        engine.create_payment(&order("WAKE"), Method::Sol).await.unwrap();
        // Both faults taken: getSlot has answered and the listing is held for 600 ms, its
        // answer read from the node only afterwards.
        eventually("the round's listing", || async { node.pending_faults() == 0 }).await;
        node.pay(&solana.recipient, TOPUP_LAMPORTS, Some(&early.intent.watch_key), clock.now().timestamp(), false);
        node.finalize_all();
        wait_status(&engine, &early.intent.id, IntentStatus::Settled).await;
        assert_eq!(watcher.status.borrow().state, WatcherState::Running);
        assert_eq!(cents(&engine, "51").await, 10_000);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}

/// Like a real node, the test node refuses `processed` commitment on the history methods the
/// watcher uses, so a watcher asking for it could not pass here.
#[tokio::test]
async fn the_test_node_refuses_processed_commitment_like_a_real_node() {
    let node = FakeSolana::start().await;
    let http = reqwest::Client::new();
    for (method, first) in [
        (
            "getSignaturesForAddress",
            serde_json::json!(random_pubkey()),
        ),
        ("getTransaction", serde_json::json!("1".repeat(88))),
    ] {
        let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method,
            "params": [first, {"commitment": "processed", "encoding": "jsonParsed"}]});
        let bytes = common::post_json(http.post(&node.url), body.to_string()).await;
        let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(answer["error"]["code"], -32602, "{method}: {answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("below `confirmed`")
        );
    }
}
