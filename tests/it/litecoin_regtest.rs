//! The Litecoin watcher against a real Litecoin Core regtest node (scripts/devnet.sh), read
//! through a real ElectrumX server and straight from the node's RPC with its P2P
//! announcements, on SQLite and PostgreSQL: payments of every shape, reorgs, replacements.

use crate::common;

use chrono::Duration;
use common::checks::{cents, kinds, order, sound, status, wait_status};
use common::regtest::{Chain, eventually, fresh_account_xpub, ltc_engine};
use common::{rental, topup};
use payrecon::Engine;
use payrecon::IntentStatus;
use payrecon::OrderStatus;
use payrecon::ledger::{Account, Currency};
use payrecon_chain_core::{Method, Network};

async fn custody(engine: &Engine) -> i128 {
    engine
        .account_balance(
            &Account::Custody(Method::Ltc),
            Currency::Crypto(Method::Ltc),
        )
        .await
        .unwrap()
}

on_both_databases_and_sources! {
    async fn an_exact_payment_is_seen_confirmed_and_settled(db, source) {
        let chain = Chain::lock().await;
        let (engine, _clock) = ltc_engine(&db, &chain, 2, &fresh_account_xpub(), |_| {}).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Ltc).await.unwrap();
        assert_eq!(pay.amount_decimal, "1");
        assert!(pay.intent.pay_to.starts_with("rltc1q"));
        let watcher = source.watch(&engine, &chain);

        chain.send(&pay.intent.pay_to, "1").await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Seen).await;
        chain.mine(1).await;
        chain.wait_synced(&engine, Network::Litecoin).await;
        assert_eq!(status(&engine, &pay.intent.id).await, IntentStatus::Seen, "one confirmation of two");
        assert_eq!(cents(&engine, "42").await, 0);

        chain.mine(1).await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "42").await, 10_000);
        assert_eq!(custody(&engine).await, 100_000_000);

        // More blocks change nothing more.
        chain.mine(2).await;
        chain.wait_synced(&engine, Network::Litecoin).await;
        assert_eq!(cents(&engine, "42").await, 10_000);
        assert_eq!(engine.entries_for("T1").await.unwrap().len(), 1);
        assert!(kinds(&engine, "T1").await.is_empty());
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn two_partial_payments_add_up(db, source) {
        let chain = Chain::lock().await;
        let (engine, _clock) = ltc_engine(&db, &chain, 1, &fresh_account_xpub(), |_| {}).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Ltc).await.unwrap();
        let watcher = source.watch(&engine, &chain);
        chain.send(&pay.intent.pay_to, "0.4").await;
        chain.mine(1).await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Confirmed).await;
        assert_eq!(cents(&engine, "42").await, 0, "part of the money is not the top-up");
        chain.send(&pay.intent.pay_to, "0.6").await;
        chain.mine(1).await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "42").await, 10_000);
        assert_eq!(engine.transfers_for(&order("T1")).await.unwrap().len(), 2);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn an_underpayment_is_an_exception_at_the_deadline(db, source) {
        let chain = Chain::lock().await;
        let (engine, clock) = ltc_engine(&db, &chain, 1, &fresh_account_xpub(), |_| {}).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Ltc).await.unwrap();
        let watcher = source.watch(&engine, &chain);
        chain.send(&pay.intent.pay_to, "0.9").await;
        chain.mine(1).await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Confirmed).await;
        clock.advance(Duration::minutes(61));
        common::checks::tick_once_read(&engine, Network::Litecoin, &*clock).await;
        assert_eq!(status(&engine, &pay.intent.id).await, IntentStatus::Underpaid);
        assert_eq!(kinds(&engine, "T1").await, ["underpaid"]);
        assert_eq!(cents(&engine, "42").await, 0);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn an_overpayment_settles_and_holds_the_excess(db, source) {
        let chain = Chain::lock().await;
        let (engine, _clock) = ltc_engine(&db, &chain, 1, &fresh_account_xpub(), |_| {}).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Ltc).await.unwrap();
        let watcher = source.watch(&engine, &chain);
        chain.send(&pay.intent.pay_to, "1.25").await;
        chain.mine(1).await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        eventually("the overpayment exception", || async { kinds(&engine, "T1").await == ["overpaid"] }).await;
        assert_eq!(cents(&engine, "42").await, 10_000, "the excess is held, not credited");
        assert_eq!(custody(&engine).await, 125_000_000);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn every_output_to_a_watched_address_counts(db, source) {
        let chain = Chain::lock().await;
        let (engine, _clock) = ltc_engine(&db, &chain, 1, &fresh_account_xpub(), |_| {}).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        engine.create_rental_order(&rental("R2", "43", "50")).await.unwrap();
        engine.create_topup(&topup("T3", "44", "100")).await.unwrap();
        let one = engine.create_payment(&order("T1"), Method::Ltc).await.unwrap();
        let two = engine.create_payment(&order("R2"), Method::Ltc).await.unwrap();
        let three = engine.create_payment(&order("T3"), Method::Ltc).await.unwrap();
        let watcher = source.watch(&engine, &chain);

        // One transaction pays two intents.
        let both = chain.send_many(&[(&one.intent.pay_to, "1"), (&two.intent.pay_to, "0.5")]).await;
        // One transaction pays one intent with two outputs.
        let halves = chain.send_outputs(&[(&three.intent.pay_to, 50_000_000), (&three.intent.pay_to, 50_000_000)]).await;
        chain.mine(1).await;
        for pay in [&one, &two, &three] {
            wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        }
        assert_eq!((cents(&engine, "42").await, cents(&engine, "44").await), (10_000, 10_000));
        assert!(matches!(engine.order(&order("R2")).await.unwrap().status, OrderStatus::Settled { .. }));
        let three_transfers = engine.transfers_for(&order("T3")).await.unwrap();
        assert_eq!(three_transfers.len(), 2);
        assert!(three_transfers.iter().all(|t| t.id.txid == halves));
        assert_eq!(engine.transfers_for(&order("T1")).await.unwrap()[0].id.txid, both);
        assert_eq!(custody(&engine).await, 250_000_000);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn a_payment_after_the_deadline_is_late_and_held(db, source) {
        let chain = Chain::lock().await;
        let (engine, clock) = ltc_engine(&db, &chain, 1, &fresh_account_xpub(), |_| {}).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Ltc).await.unwrap();
        clock.advance(Duration::minutes(61));
        common::checks::tick_once_read(&engine, Network::Litecoin, &*clock).await;
        assert_eq!(status(&engine, &pay.intent.id).await, IntentStatus::Expired);
        let watcher = source.watch(&engine, &chain);
        chain.send(&pay.intent.pay_to, "1").await;
        wait_status(&engine, &pay.intent.id, IntentStatus::PaidLate).await;
        chain.mine(1).await;
        chain.wait_synced(&engine, Network::Litecoin).await;
        assert_eq!(status(&engine, &pay.intent.id).await, IntentStatus::PaidLate);
        assert_eq!(kinds(&engine, "T1").await, ["paid_late"]);
        assert_eq!(cents(&engine, "42").await, 0, "late money waits for an operator");
        assert_eq!(custody(&engine).await, 100_000_000);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn a_payment_to_a_superseded_address_counts(db, source) {
        let chain = Chain::lock().await;
        let (engine, _clock) = ltc_engine(&db, &chain, 1, &fresh_account_xpub(), |_| {}).await;
        engine.create_rental_order(&rental("R1", "42", "100")).await.unwrap();
        let old = engine.create_payment(&order("R1"), Method::Ltc).await.unwrap();
        let new = engine.create_payment(&order("R1"), Method::Ltc).await.unwrap();
        let watcher = source.watch(&engine, &chain);
        chain.send(&old.intent.pay_to, "1").await;
        chain.mine(1).await;
        wait_status(&engine, &old.intent.id, IntentStatus::Settled).await;
        assert!(matches!(engine.order(&order("R1")).await.unwrap().status, OrderStatus::Settled { .. }));
        assert_eq!(status(&engine, &new.intent.id).await, IntentStatus::AwaitingPayment);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn a_reorg_before_credit_credits_nothing(db, source) {
        let chain = Chain::lock().await;
        let (engine, _clock) = ltc_engine(&db, &chain, 2, &fresh_account_xpub(), |_| {}).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Ltc).await.unwrap();
        let coin = chain.coin("1.5").await;
        let watcher = source.watch(&engine, &chain);
        chain.spend_coin(&coin, &pay.intent.pay_to, "1", "0.4999").await;
        let mined_at = chain.mine(1).await;
        eventually("one confirmation", || async {
            engine.transfers_for(&order("T1")).await.unwrap().first().is_some_and(|t| t.confirmations == 1)
        }).await;

        // The block goes; on the new branch the coin pays someone else.
        chain.invalidate(mined_at).await;
        let elsewhere = chain.wallet_address().await;
        chain.spend_coin(&coin, &elsewhere, "1", "0.499").await;
        chain.mine(3).await;
        eventually("the payment to be removed", || async {
            engine.transfers_for(&order("T1")).await.unwrap().first().is_some_and(|t| t.removed)
        }).await;
        chain.wait_synced(&engine, Network::Litecoin).await;
        assert_eq!(status(&engine, &pay.intent.id).await, IntentStatus::AwaitingPayment);
        assert_eq!(cents(&engine, "42").await, 0);
        assert_eq!(engine.trial_balance().await.unwrap().entries, 0, "nothing was ever posted");
        watcher.stop().await.unwrap();
    }

    async fn a_reorg_after_credit_takes_it_back(db, source) {
        let chain = Chain::lock().await;
        let (engine, _clock) = ltc_engine(&db, &chain, 2, &fresh_account_xpub(), |_| {}).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Ltc).await.unwrap();
        let coin = chain.coin("1.5").await;
        let watcher = source.watch(&engine, &chain);
        chain.spend_coin(&coin, &pay.intent.pay_to, "1", "0.4999").await;
        let mined_at = chain.mine(1).await;
        chain.mine(1).await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "42").await, 10_000);

        chain.invalidate(mined_at).await;
        let elsewhere = chain.wallet_address().await;
        chain.spend_coin(&coin, &elsewhere, "1", "0.499").await;
        chain.mine(4).await;
        wait_status(&engine, &pay.intent.id, IntentStatus::ReorgedAfterCredit).await;
        assert_eq!(kinds(&engine, "T1").await, ["reorged_after_credit"]);
        assert_eq!(cents(&engine, "42").await, 0, "the credit is taken back");
        assert_eq!(custody(&engine).await, 0);
        let topup_order = engine.order(&order("T1")).await.unwrap();
        assert_eq!(topup_order.attention.as_deref(), Some("reorged_after_credit"));
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn the_audit_finds_a_credited_payment_a_reorg_took_while_no_watcher_ran(db, source) {
        let chain = Chain::lock().await;
        let xpub = fresh_account_xpub();
        let (engine, clock) = ltc_engine(&db, &chain, 2, &xpub, |_| {}).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Ltc).await.unwrap();
        let coin = chain.coin("1.5").await;
        let watcher = source.watch(&engine, &chain);
        chain.spend_coin(&coin, &pay.intent.pay_to, "1", "0.4999").await;
        let mined_at = chain.mine(2).await - 1;
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        watcher.stop().await.unwrap();

        let config = common::payments::config(|c| c.networks.litecoin = Some(source.config(&xpub, &chain, 2)));
        let now = payrecon::test_utils::clock::Clock::now(&*clock);
        let query = payrecon::ReportQuery { from: now - Duration::days(1), to: now + Duration::days(1), method: None };
        let clean = engine.audit_credited(&config, &query).await.unwrap();
        assert_eq!((clean.checked, clean.findings.len()), (1, 0), "{clean:?}");

        // The payment's block is replaced and its coin spent elsewhere; the books still credit it.
        chain.invalidate(mined_at).await;
        let elsewhere = chain.wallet_address().await;
        chain.spend_coin(&coin, &elsewhere, "1", "0.499").await;
        chain.mine(4).await;
        // ElectrumX follows the new chain within a poll or two.
        eventually("the audit to see the reorg", || async {
            !engine.audit_credited(&config, &query).await.unwrap().findings.is_empty()
        }).await;
        let audit = engine.audit_credited(&config, &query).await.unwrap();
        assert_eq!(audit.checked, 1);
        assert_eq!(audit.findings.len(), 1, "{audit:?}");
        assert_eq!(audit.findings[0].problem, "no longer on the chain");
        assert_eq!(audit.findings[0].order.as_deref(), Some("T1"));
        assert!(audit.findings[0].ledger_entry.starts_with("settle:"));
    }

    async fn a_replacement_paying_elsewhere_removes_the_payment(db, source) {
        let chain = Chain::lock().await;
        let (engine, _clock) = ltc_engine(&db, &chain, 1, &fresh_account_xpub(), |_| {}).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Ltc).await.unwrap();
        let coin = chain.coin("1.5").await;
        let watcher = source.watch(&engine, &chain);
        let first = chain.spend_coin(&coin, &pay.intent.pay_to, "1", "0.4999").await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Seen).await;

        let elsewhere = chain.wallet_address().await;
        let replacement = chain.spend_coin(&coin, &elsewhere, "1", "0.499").await;
        assert_ne!(first, replacement);
        wait_status(&engine, &pay.intent.id, IntentStatus::AwaitingPayment).await;
        chain.mine(2).await;
        chain.wait_synced(&engine, Network::Litecoin).await;
        let transfers = engine.transfers_for(&order("T1")).await.unwrap();
        assert_eq!(transfers.len(), 1);
        assert!(transfers[0].removed && transfers[0].id.txid == first);
        assert_eq!(cents(&engine, "42").await, 0);
        assert_eq!(engine.trial_balance().await.unwrap().entries, 0);
        watcher.stop().await.unwrap();
    }
}
