//! Finance reports and operators' actions on a database holding every state and exception,
//! on SQLite and PostgreSQL: totals checked to the unit, every action's ledger effect, every
//! refusal leaving nothing written.

use crate::common;

use chrono::Duration;
use common::account;
use common::checks::sound;
use common::payments::start_time;
use common::seed::{UNMATCHED_TXID, seed};
use payrecon::Action;
use payrecon::Error;
use payrecon::IntentStatus;
use payrecon::StuckOptions;
use payrecon::ledger::{Account, Currency, SuspenseReason};
use payrecon::{CsvSection, ReportFormat, ReportQuery};
use payrecon::{OrderRef, OrderStatus};
use payrecon_chain_core::Method;

fn period() -> ReportQuery {
    ReportQuery {
        from: start_time() - Duration::hours(1),
        to: start_time() + Duration::days(1),
        method: None,
    }
}

async fn report(
    engine: &payrecon::Engine,
    query: &ReportQuery,
    format: ReportFormat,
    section: CsvSection,
) -> String {
    let mut out = Vec::new();
    engine
        .write_reconciliation(query, format, section, &mut out)
        .await
        .unwrap();
    String::from_utf8(out).unwrap()
}

async fn suspense(engine: &payrecon::Engine, reason: SuspenseReason, method: Method) -> i128 {
    engine
        .account_balance(&Account::Suspense(reason), Currency::Crypto(method))
        .await
        .unwrap()
}

async fn balance_cents(engine: &payrecon::Engine) -> i64 {
    engine
        .available_balance(&account("42"))
        .await
        .unwrap()
        .cents()
}

fn exception_id(kind: &str, subject: &str) -> String {
    format!("{kind}:{subject}")
}

on_both_databases! {
    async fn the_report_sums_every_state_to_the_unit(db) {
        let seeded = seed(&db).await;
        let engine = &seeded.engine;
        let json: serde_json::Value = serde_json::from_str(
            &report(engine, &period(), ReportFormat::Json, CsvSection::Transfers).await,
        ).unwrap();
        let btc = json["summary"].as_array().unwrap().iter().find(|s| s["method"] == "btc").unwrap();
        assert_eq!(btc["intents_created"], 7);
        assert_eq!(btc["intents_settled"], 2, "T1 and T3");
        assert_eq!(btc["intents_expired"], 1, "T6");
        assert_eq!(btc["intents_in_exception"], 4, "T2 underpaid, T3 overpaid, T4 late, T8 reorged");
        assert_eq!(btc["expected"], "0.04375", "7 x 625,000 sat");
        assert_eq!(btc["received"], "0.03185", "T1 T2 T3 T4 T7 and the unmatched 10,000; T8 reorged out");
        assert_eq!(btc["booked"], "0.0196", "T1, T3 (with its excess), T4 held, unmatched held; T8 booked and reversed");
        assert_eq!(btc["credited"], "0.0125", "T1 and T3's 625,000 each");
        assert_eq!(btc["held"], "0.0071", "75,000 overpaid + 625,000 late + 10,000 unmatched");
        assert_eq!(btc["refunded"], "0");
        assert_eq!(btc["usd_credited"], "1000.00");
        assert_eq!(btc["difference"], "0.01935");
        assert!(btc["why"].as_str().unwrap().contains("0.0071 held in suspense"), "{}", btc["why"]);
        let usdt_trc20 = json["summary"].as_array().unwrap().iter().find(|s| s["method"] == "usdt-trc20").unwrap();
        assert_eq!(usdt_trc20["usd_credited"], "420.00");
        assert_eq!(usdt_trc20["difference"], "0");
        let usdt_erc20 = json["summary"].as_array().unwrap().iter().find(|s| s["method"] == "usdt-erc20").unwrap();
        assert_eq!(usdt_erc20["held"], "500", "the wrong-asset payment, held in its own currency");

        let transfers = json["transfers"].as_array().unwrap();
        assert_eq!(transfers.len(), 9);
        let state = |txid: &str| transfers.iter().find(|t| t["txid"] == txid).unwrap()["state"].as_str().unwrap().to_owned();
        assert_eq!(state("t1"), "settled");
        assert_eq!(state("t2"), "not_booked");
        assert_eq!(state("t4"), "paid_late");
        assert_eq!(state("t7"), "unconfirmed");
        assert_eq!(state("t8"), "reorged");
        assert_eq!(state("0xw5"), "wrong_asset");
        assert_eq!(state(UNMATCHED_TXID), "unmatched");
        let t1 = transfers.iter().find(|t| t["txid"] == "t1").unwrap();
        assert_eq!(t1["amount"], "0.00625");
        assert_eq!(t1["asset"], "BTC");
        assert_eq!(t1["order"], "T1");
        assert!(t1["ledger_entry"].as_str().unwrap().starts_with("settle:"));
        assert_eq!(t1["seen_at"], "2026-12-01T12:00:00.000Z");
        let kinds: Vec<&str> = json["exceptions"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
        for kind in ["underpaid", "overpaid", "paid_late", "wrong_asset", "reorged_after_credit", "unmatched"] {
            assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
        }
        assert_eq!(json["trial_balance_sound"], true);

        // CSV: one header row, one line per transfer, exact decimals with their asset.
        let csv = report(engine, &period(), ReportFormat::Csv, CsvSection::Transfers).await;
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 10);
        assert!(lines[0].starts_with("seen_at,network,txid,position,to_address,asset,amount,"));
        assert!(lines.iter().any(|l| l.contains(",BTC,0.006,") && l.contains(",t2,")), "{csv}");
        let summary = report(engine, &period(), ReportFormat::Csv, CsvSection::Summary).await;
        assert!(summary.lines().any(|l| l.starts_with("btc,BTC,7,2,1,4,0.04375,0.03185,0.0196,0.0125,0.0071,0,0,0,1000.00,0.01935,")), "{summary}");
        let balances = report(engine, &period(), ReportFormat::Csv, CsvSection::Balances).await;
        assert!(balances.lines().any(|l| l == "total,USD,0.00"), "{balances}");

        // One method only.
        let query = ReportQuery { method: Some(Method::UsdtTrc20), ..period() };
        let csv = report(engine, &query, ReportFormat::Csv, CsvSection::Transfers).await;
        assert_eq!(csv.lines().count(), 2, "{csv}");

        // HTML: tables, totals, a chart per method; every value escaped.
        let html = report(engine, &period(), ReportFormat::Html, CsvSection::Transfers).await;
        assert!(html.starts_with("<!doctype html>"));
        assert!(html.contains("<svg role=\"img\" aria-label=\"btc received per day\""));
        assert!(html.contains("9 transfers"));
        assert!(html.contains("Every currency sums to zero."));
        assert!(html.contains("@media print"));

        // A period with nothing in it, and an empty period refused.
        let later = ReportQuery { from: start_time() + Duration::days(2), to: start_time() + Duration::days(3), method: None };
        let json: serde_json::Value = serde_json::from_str(&report(engine, &later, ReportFormat::Json, CsvSection::Transfers).await).unwrap();
        assert_eq!(json["transfers"].as_array().unwrap().len(), 0);
        let empty = ReportQuery { from: start_time(), to: start_time(), method: None };
        let refused = engine.write_reconciliation(&empty, ReportFormat::Csv, CsvSection::Transfers, Vec::new()).await;
        assert!(matches!(refused, Err(Error::InvalidInput(_))), "{refused:?}");
    }

    async fn operators_resolve_every_exception_with_compensating_entries(db) {
        let seeded = seed(&db).await;
        let engine = &seeded.engine;
        assert_eq!(balance_cents(engine).await, 100_000, "T1 and T3 credited; T8's credit reversed");
        let t2 = seeded.intent("T2").to_owned();

        // Underpaid: accepted as paid. The 600,000 sat are booked and the top-up's 500 USD credited.
        let resolved = engine
            .resolve_exception(&exception_id("underpaid", &t2), &Action::AcceptAsPaid, "alice", "customer paid the fee from the amount")
            .await
            .unwrap();
        assert_eq!(resolved.exception.resolution.as_deref(), Some("accept_as_paid by alice: customer paid the fee from the amount"));
        assert!(resolved.entry.as_ref().unwrap().idempotency_key.starts_with("settle:"));
        assert_eq!(balance_cents(engine).await, 150_000);
        assert_eq!(engine.payment(&t2).await.unwrap().intent.status, IntentStatus::Settled);
        assert!(matches!(engine.order(&OrderRef::new("T2").unwrap()).await.unwrap().status, OrderStatus::Settled { .. }));
        sound(engine).await;

        // Overpaid: the 75,000 sat excess credited at the locked rate (60 USD).
        engine
            .resolve_exception(&exception_id("overpaid", seeded.intent("T3")), &Action::CreditBalance { account: None, usd: None }, "alice", "credit the excess")
            .await
            .unwrap();
        assert_eq!(balance_cents(engine).await, 156_000);
        assert_eq!(suspense(engine, SuspenseReason::Overpaid, Method::Btc).await, 0);

        // Paid late: marked refunded only on the chain's word, so never without the customer's
        // address recorded (the refunds tests take it through the chain); credited instead.
        let late = exception_id("paid_late", "bitcoin:t4:0");
        let bad_txid = engine.resolve_exception(&late, &Action::MarkRefunded { refund_txid: "not a txid!".into() }, "bob", "sent back").await;
        assert!(matches!(bad_txid, Err(Error::InvalidInput(_))), "{bad_txid:?}");
        let unchecked = engine.resolve_exception(&late, &Action::MarkRefunded { refund_txid: "ab12".repeat(16) }, "bob", "sent back").await;
        assert!(matches!(&unchecked, Err(Error::ActionRefused { reason, .. }) if reason.contains("no refund address is recorded")), "{unchecked:?}");
        engine.resolve_exception(&late, &Action::CreditBalance { account: Some("88".into()), usd: Some("5".parse().unwrap()) }, "bob", "customer 88 keeps it as credit").await.unwrap();
        assert_eq!(suspense(engine, SuspenseReason::Late, Method::Btc).await, 0);

        // Wrong asset: no locked USDT rate on an ETH intent, so the USD must be named.
        let wrong = exception_id("wrong_asset", "ethereum:0xw5:0");
        let refused = engine.resolve_exception(&wrong, &Action::CreditBalance { account: None, usd: None }, "bob", "credit it").await;
        assert!(matches!(&refused, Err(Error::ActionRefused { reason, .. }) if reason.contains("give the USD")), "{refused:?}");
        engine.resolve_exception(&wrong, &Action::CreditBalance { account: None, usd: Some("499.50".parse().unwrap()) }, "bob", "credit at today's rate").await.unwrap();
        assert_eq!(balance_cents(engine).await, 156_000 + 49_950);
        assert_eq!(suspense(engine, SuspenseReason::WrongAsset, Method::UsdtErc20).await, 0);

        // Unmatched: the customer must be named.
        let unmatched = exception_id("unmatched", &format!("bitcoin:{UNMATCHED_TXID}:0"));
        let refused = engine.resolve_exception(&unmatched, &Action::CreditBalance { account: None, usd: Some("8".parse().unwrap()) }, "bob", "x").await;
        assert!(matches!(&refused, Err(Error::ActionRefused { reason, .. }) if reason.contains("customer account")), "{refused:?}");
        // Dismissing money is refused, and writes nothing.
        let log_before = engine.operator_actions().await.unwrap().len();
        let refused = engine.resolve_exception(&unmatched, &Action::Dismiss, "bob", "x").await;
        assert!(matches!(&refused, Err(Error::ActionRefused { reason, .. }) if reason.contains("holds 0.0001 BTC")), "{refused:?}");
        assert_eq!(engine.operator_actions().await.unwrap().len(), log_before);
        engine.resolve_exception(&unmatched, &Action::CreditBalance { account: Some("77".into()), usd: Some("8".parse().unwrap()) }, "bob", "customer 77 proved it").await.unwrap();
        assert_eq!(engine.available_balance(&account("77")).await.unwrap().cents(), 800);

        // Reorged after credit: nothing left to move, so it is dismissed, and the order's flag cleared.
        let reorged = exception_id("reorged_after_credit", "bitcoin:t8:0");
        engine.resolve_exception(&reorged, &Action::Dismiss, "carol", "customer will pay again").await.unwrap();
        assert!(engine.order(&OrderRef::new("T8").unwrap()).await.unwrap().attention.is_none());

        // Refusals: resolved twice, unknown id, a settled order accepted, an empty actor.
        let twice = engine.resolve_exception(&reorged, &Action::Dismiss, "carol", "again").await;
        assert!(matches!(&twice, Err(Error::ActionRefused { reason, .. }) if reason.contains("already resolved")), "{twice:?}");
        assert!(matches!(engine.resolve_exception("nope:1", &Action::Dismiss, "c", "r").await, Err(Error::ExceptionNotFound(_))));
        assert!(matches!(engine.resolve_exception(&reorged, &Action::Dismiss, " ", "r").await, Err(Error::InvalidInput(_))));

        let log = engine.operator_actions().await.unwrap();
        assert_eq!(log.iter().map(|a| a.action.as_str()).collect::<Vec<_>>(),
            ["accept_as_paid", "credit_balance", "credit_balance", "credit_balance", "credit_balance", "dismiss"]);
        assert!(engine.exceptions(None).await.unwrap().iter().all(|e| e.resolved_at.is_some()));
        let events = engine.events_after(0, 1000).await.unwrap();
        assert_eq!(events.iter().filter(|e| e.kind == "exception_resolved").count(), 6);
        sound(engine).await;

        // The report lists each resolution.
        let json: serde_json::Value = serde_json::from_str(&report(engine, &period(), ReportFormat::Json, CsvSection::Transfers).await).unwrap();
        let resolutions: Vec<&str> = json["exceptions"].as_array().unwrap().iter().filter_map(|e| e["resolution"].as_str()).collect();
        assert!(resolutions.iter().any(|r| r.starts_with("credit_balance by bob: customer 88")), "{resolutions:?}");
    }

    async fn a_reorg_after_an_operator_accepted_takes_the_credit_back(db) {
        let seeded = seed(&db).await;
        let engine = &seeded.engine;
        let t2 = seeded.intent("T2").to_owned();
        engine.resolve_exception(&exception_id("underpaid", &t2), &Action::AcceptAsPaid, "alice", "ok").await.unwrap();
        assert_eq!(balance_cents(engine).await, 150_000);
        let tx = common::payments::Tx::new(payrecon_chain_core::Network::Bitcoin, "t2", &seeded.intents["T2"].intent.watch_key, Method::Btc, 600_000, start_time());
        engine.apply_chain_events(&[tx.removed(20)]).await.unwrap();
        assert_eq!(balance_cents(engine).await, 100_000);
        let order = engine.order(&OrderRef::new("T2").unwrap()).await.unwrap();
        assert_eq!(order.status, OrderStatus::Open);
        assert_eq!(order.attention.as_deref(), Some("reorged_after_credit"));
        sound(engine).await;
    }

    async fn the_stuck_view_says_what_happened_and_what_to_do(db) {
        let seeded = seed(&db).await;
        let engine = &seeded.engine;
        seeded.clock.advance(Duration::hours(3));
        let items = engine.stuck(&StuckOptions::default()).await.unwrap();
        let find = |category: &str, subject: &str| items.iter().find(|i| i.category == category && i.subject == subject);
        let marked = find("marked_paid_unseen", seeded.intent("T6")).expect("T6 marked paid, nothing seen");
        assert_eq!(marked.order_ref.as_deref(), Some("T6"));
        assert!(!marked.actions.is_empty());
        assert!(find("seen_unconfirmed", seeded.intent("T7")).is_some(), "{items:#?}");
        let underpaid = find("exception", &exception_id("underpaid", seeded.intent("T2"))).unwrap();
        assert_eq!(underpaid.actions, ["accept_as_paid", "credit_balance", "mark_refunded"]);
        assert_eq!(items.iter().filter(|i| i.category == "exception").count(), 6);

        // A watcher that failed, and one that went silent.
        let now = payrecon::test_utils::clock::Clock::now(&*seeded.clock);
        // One refused its node's answer and tries again later, one found the wrong chain.
        let next_try = now + Duration::minutes(4);
        for (network, state, error, next_try_at, updated) in [
            ("bitcoin", "retrying", "connection refused", None, now),
            ("tron", "running", "connection refused", None, now - Duration::hours(1)),
            ("ethereum", "stopped", "a body that is not JSON", Some(next_try), now),
            ("litecoin", "stopped", "wrong chain: genesis 0f91…", None, now),
        ] {
            engine.record_watcher_health(&payrecon::WatcherHealth {
                network: network.into(), state: state.into(), cursor_height: Some(10), head_height: Some(12),
                failures: 3, rpc_errors: 7, incomplete_answers: 2, zero_value_ignored: 5, last_error: Some(error.into()),
                last_scan_at: Some(now - Duration::minutes(10)), chain_read_until: Some(now - Duration::minutes(10)), active_source: Some("http://node.example/".into()), next_try_at, updated_at: updated,
            }).await.unwrap();
        }
        let health = engine.watcher_health().await.unwrap();
        assert_eq!(health.iter().find(|h| h.network == "ethereum").unwrap().next_try_at.map(|at| at.timestamp_millis()), Some(next_try.timestamp_millis()));
        let items = engine.stuck(&StuckOptions::default()).await.unwrap();
        let bitcoin = items.iter().find(|i| i.category == "watcher" && i.subject == "bitcoin").unwrap();
        assert!(bitcoin.what.contains("connection refused"), "{}", bitcoin.what);
        let tron = items.iter().find(|i| i.category == "watcher" && i.subject == "tron").unwrap();
        assert_eq!(tron.kind, "silent");
        let ethereum = items.iter().find(|i| i.category == "watcher" && i.subject == "ethereum").unwrap();
        assert!(ethereum.what.contains(&format!("next try at {}", next_try.to_rfc3339())), "{}", ethereum.what);
        let litecoin = items.iter().find(|i| i.category == "watcher" && i.subject == "litecoin").unwrap();
        assert_eq!(litecoin.kind, "wrong_chain");
        let metrics = payrecon::test_utils::api::metrics_text(engine).await.unwrap();
        assert!(metrics.contains("payrecon_watcher_lag_blocks{network=\"bitcoin\"} 2"), "{metrics}");
        assert!(metrics.contains("payrecon_source_incomplete_answers_total{network=\"tron\"} 2"), "{metrics}");
        assert!(metrics.contains("payrecon_zero_value_transfers_total{network=\"tron\"} 5"), "{metrics}");
        assert!(metrics.contains("payrecon_watcher_rpc_errors_total{network=\"bitcoin\"} 7"));
        assert!(metrics.contains("payrecon_exceptions_open{kind=\"underpaid\"} 1"));
        assert!(metrics.contains("payrecon_intents{state=\"settled\"} 3"), "{metrics}");
        // The seeded orders went through the group commit: it shares commits among writes.
        let counter = |name: &str| -> u64 {
            let line = metrics.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}: {metrics}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        let (commits, writes) = (counter("payrecon_group_commits_total"), counter("payrecon_group_writes_total"));
        assert!(commits > 0 && writes >= commits, "{commits} commits for {writes} writes");
    }
}
