//! Money leaving watched addresses, from recorded reports, on SQLite and PostgreSQL: outflows
//! booked from custody to treasury or external with the fee to an expense account once deep
//! enough, holdings going down and back up with a reorg, replays changing nothing, and reports
//! that cannot be true refused whole.

use crate::common;

use chrono::Duration;
use common::checks::order;
use common::outflows::{TREASURY, litecoin_engine, litecoin_engine_and_clock, sent, sweep};
use common::payments::{Tx, start_time};
use common::topup;
use payrecon::ledger::{Account, Currency};
use payrecon::test_utils::watcher::LiveView;
use payrecon::{Engine, Error, HoldingsSort, PaymentIntent};
use payrecon_chain_core::{Amount, Method, Network, OutflowEvent, WatchView};

async fn paid(engine: &Engine, reference: &str, txid: &str) -> (PaymentIntent, Tx) {
    engine
        .create_topup(&topup(reference, "7", "100"))
        .await
        .unwrap();
    let intent = engine
        .create_payment(&order(reference), Method::Ltc)
        .await
        .unwrap()
        .intent;
    let receipt = Tx::new(
        Network::Litecoin,
        txid,
        &intent.pay_to,
        Method::Ltc,
        100_000_000,
        start_time(),
    );
    engine
        .apply_chain_events(&[receipt.observed(2, 100)])
        .await
        .unwrap();
    (intent, receipt)
}

async fn balance(engine: &Engine, account: Account) -> i128 {
    engine
        .account_balance(&account, Currency::Crypto(Method::Ltc))
        .await
        .unwrap()
}

async fn held(engine: &Engine) -> String {
    let view = engine
        .holdings(
            Some(Network::Litecoin),
            HoldingsSort::Address,
            false,
            0,
            100,
        )
        .await
        .unwrap();
    view.totals
        .first()
        .map_or_else(|| "0".into(), |t| t.amount.clone())
}

on_both_databases! {
    async fn the_watch_view_follows_what_moved_until_it_is_final_then_forgets_it(db) {
        let (engine, clock) = litecoin_engine_and_clock(&db).await;
        let (intent, receipt) = paid(&engine, "V-1", &"c1".repeat(32)).await;
        let mut live = LiveView::load(&engine, Network::Litecoin).await.unwrap();
        let spent = |view: &WatchView| view.spent.get(&receipt.id.txid, receipt.id.position);
        assert!(live.view().watch_keys.contains(&intent.pay_to));
        assert!(live.view().known.contains_key(&receipt.id));
        assert_eq!(live.view().held.get(&receipt.id.txid, receipt.id.position), Some(100_000_000));

        // Swept, one block deep: the output is spent, but kept for lookups, and the sweep is
        // followed for its depth.
        let swept = sweep(&"d1".repeat(32), 0, &receipt, 1_000, None);
        engine.apply_outflows(&[sent(&swept, 1, 101)]).await.unwrap();
        live.refresh(&engine).await.unwrap();
        assert_eq!(live.view().held.get(&receipt.id.txid, receipt.id.position), None);
        assert_eq!(spent(live.view()), Some(100_000_000));
        assert!(live.view().known_outflows.contains_key(&swept.id));

        // The intent's window closes with the sweep short of its depth: the address stays
        // followed, and a watcher that restarts reads the same.
        clock.advance(Duration::days(30));
        live.refresh(&engine).await.unwrap();
        let restarted = LiveView::load(&engine, Network::Litecoin).await.unwrap();
        for view in [live.view(), restarted.view()] {
            assert!(view.watch_keys.contains(&intent.pay_to));
            assert!(view.known_outflows.contains_key(&swept.id));
            assert_eq!(spent(view), Some(100_000_000));
        }

        // Final: everything about the address is forgotten, as a fresh read leaves it out.
        engine.apply_outflows(&[sent(&swept, 2, 102)]).await.unwrap();
        live.refresh(&engine).await.unwrap();
        let restarted = LiveView::load(&engine, Network::Litecoin).await.unwrap();
        for view in [live.view(), restarted.view()] {
            assert!(!view.watch_keys.contains(&intent.pay_to));
            assert!(view.known_outflows.is_empty());
            assert!(view.known.is_empty());
            assert_eq!(spent(view), None);
        }

        // A payment seen one block deep when its window closes stays followed until final.
        engine.create_topup(&topup("V-2", "7", "100")).await.unwrap();
        let second = engine.create_payment(&order("V-2"), Method::Ltc).await.unwrap().intent;
        let payment = Tx::new(Network::Litecoin, &"c2".repeat(32), &second.pay_to, Method::Ltc, 100_000_000, start_time());
        engine.apply_chain_events(&[payment.observed(1, 200)]).await.unwrap();
        live.refresh(&engine).await.unwrap();
        clock.advance(Duration::days(30));
        live.refresh(&engine).await.unwrap();
        let restarted = LiveView::load(&engine, Network::Litecoin).await.unwrap();
        for view in [live.view(), restarted.view()] {
            assert!(view.watch_keys.contains(&second.pay_to));
            assert!(view.known.contains_key(&payment.id));
        }
        engine.apply_chain_events(&[payment.observed(2, 201)]).await.unwrap();
        live.refresh(&engine).await.unwrap();
        assert!(!live.view().known.contains_key(&payment.id));
        assert!(live.view().watch_keys.contains(&second.pay_to), "it holds the payment");
    }

    async fn outflows_book_custody_out_and_a_reorg_puts_it_back(db) {
        let engine = litecoin_engine(&db).await;
        let (_, first) = paid(&engine, "O-1", &"a1".repeat(32)).await;
        let (_, second) = paid(&engine, "O-2", &"a2".repeat(32)).await;
        assert_eq!(held(&engine).await, "200000000");
        let custody = balance(&engine, Account::Custody(Method::Ltc)).await;

        // One sweep spends both to the treasury, 1000 litoshi of fee taken from the first.
        let sweep_txid = "b1".repeat(32);
        let rows = [sweep(&sweep_txid, 0, &first, 1_000, Some(TREASURY)), sweep(&sweep_txid, 1, &second, 0, Some(TREASURY))];
        // One confirmation: recorded, the holdings follow the chain, not booked yet.
        engine.apply_outflows(&rows.iter().map(|o| sent(o, 1, 101)).collect::<Vec<_>>()).await.unwrap();
        assert_eq!(held(&engine).await, "0");
        assert_eq!(balance(&engine, Account::Custody(Method::Ltc)).await, custody);
        // Two: booked.
        let deep: Vec<_> = rows.iter().map(|o| sent(o, 2, 102)).collect();
        engine.apply_outflows(&deep).await.unwrap();
        assert_eq!(balance(&engine, Account::Custody(Method::Ltc)).await, custody - 200_000_000);
        assert_eq!(balance(&engine, Account::Treasury(Method::Ltc)).await, 199_999_000);
        assert_eq!(balance(&engine, Account::NetworkFees(Method::Ltc)).await, 1_000);
        let entry = engine.entry(&format!("outflow:litecoin:{sweep_txid}:0:1")).await.unwrap().expect("booked");
        assert!(entry.entry.memo.contains(TREASURY), "{}", entry.entry.memo);
        // A replay, and an older report, change nothing.
        engine.apply_outflows(&deep).await.unwrap();
        engine.apply_outflows(&[sent(&rows[0], 1, 101)]).await.unwrap();
        assert_eq!(balance(&engine, Account::Treasury(Method::Ltc)).await, 199_999_000);
        assert!(engine.trial_balance().await.unwrap().is_sound());

        // A reorg takes the sweep out: reversed, the holdings are back.
        let removed: Vec<_> = rows.iter().map(|o| OutflowEvent::Removed { id: o.id.clone(), tip_height: 103 }).collect();
        engine.apply_outflows(&removed).await.unwrap();
        assert_eq!(held(&engine).await, "200000000");
        assert_eq!(balance(&engine, Account::Custody(Method::Ltc)).await, custody);
        assert_eq!(balance(&engine, Account::NetworkFees(Method::Ltc)).await, 0);
        engine.apply_outflows(&removed).await.unwrap();
        assert_eq!(balance(&engine, Account::Custody(Method::Ltc)).await, custody);

        // Mined again: booked again under the next key. The same transaction cannot come back
        // with other content.
        engine.apply_outflows(&[sent(&rows[0], 2, 105)]).await.unwrap();
        assert_eq!(balance(&engine, Account::Treasury(Method::Ltc)).await, 99_999_000);
        assert!(engine.entry(&format!("outflow:litecoin:{sweep_txid}:0:2")).await.unwrap().is_some());
        assert_eq!(held(&engine).await, "100000000");
        let mut changed = rows[1].clone();
        changed.to_address = Some("rltc1qsomeoneelse".into());
        let refused = engine.apply_outflows(&[sent(&changed, 2, 106)]).await.unwrap_err();
        assert!(refused.to_string().contains("other content"), "{refused}");
        // Spent elsewhere instead: another transaction, sent out.
        let elsewhere = sweep(&"b2".repeat(32), 0, &second, 500, Some("rltc1qsomeoneelse"));
        engine.apply_outflows(&[sent(&elsewhere, 2, 106)]).await.unwrap();
        assert_eq!(balance(&engine, Account::External(Method::Ltc)).await, 99_999_500);
        assert_eq!(held(&engine).await, "0");
        assert!(engine.trial_balance().await.unwrap().is_sound());

        // The books value outflow entries like any other (one crypto, fee included).
        let pass = engine.value_entries().await.unwrap();
        assert_eq!(pass.failed, 0, "{pass:?}");
        assert!(engine.unvalued_entries(10).await.unwrap().1.is_empty());

        // The month's holdings roll forward exactly: 2 LTC in, 0.99999 to the treasury,
        // 0.999995 elsewhere, 1,500 litoshi of fees.
        let month = engine.period_of(start_time());
        let rollforward = engine.holdings_rollforward(month).await.unwrap();
        let ltc = rollforward.assets.iter().find(|a| a.asset == "ltc").unwrap();
        assert_eq!(
            [&ltc.opening, &ltc.received, &ltc.sent_to_treasury, &ltc.sent_elsewhere, &ltc.fees, &ltc.closing, &ltc.held_at_end].map(|s| s.as_str()),
            ["0", "200000000", "99999000", "99999500", "1500", "0", "0"]
        );
        assert!(ltc.closes && rollforward.closes);
        assert_eq!((ltc.rate_at_end_usd.as_deref(), ltc.opening_value_usd.as_deref()), (Some("100"), Some("0.00")));
        let report: serde_json::Value = serde_json::from_str(&engine.period_report(month).await.unwrap()).unwrap();
        assert_eq!(report["holdings"][0]["fees"], "1500", "the month's report carries it");
        assert_eq!(report["holdings"][0]["closes"], true);
        let next = engine.holdings_rollforward(month.next()).await.unwrap();
        let ltc = next.assets.iter().find(|a| a.asset == "ltc").unwrap();
        assert_eq!((ltc.opening.as_str(), ltc.closing.as_str(), ltc.closes), ("0", "0", true));
    }

    async fn an_outflow_that_cannot_be_true_is_refused_whole(db) {
        let engine = litecoin_engine(&db).await;
        let (_, receipt) = paid(&engine, "O-3", &"c1".repeat(32)).await;
        let good = sweep(&"d1".repeat(32), 0, &receipt, 100, None);
        let mut wrong_amount = sweep(&"d1".repeat(32), 1, &receipt, 100, None);
        wrong_amount.amount = Amount::from_base_units(5);
        let refused = engine.apply_outflows(&[sent(&good, 2, 102), sent(&wrong_amount, 2, 102)]).await.unwrap_err();
        assert!(matches!(refused, Error::InvalidEvent(_)), "{refused}");
        assert_eq!(held(&engine).await, "100000000", "the good row was rolled back with the bad one");
        let unknown = Tx::new(Network::Litecoin, &"e1".repeat(32), "rltc1qnobody", Method::Ltc, 7, start_time());
        let refused = engine.apply_outflows(&[sent(&sweep(&"d2".repeat(32), 0, &unknown, 0, None), 2, 102)]).await.unwrap_err();
        assert!(refused.to_string().contains("never recorded"), "{refused}");
    }
}
