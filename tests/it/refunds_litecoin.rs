//! Refunds on the Litecoin regtest node, both sources and both databases: payrecon prepares a
//! PSBT, a wallet of the node holding the merchant's private keys signs it
//! (`walletprocesspsbt`, `finalizepsbt`), and payrecon sees it sent, taken back by a reorg,
//! and completed at depth, booked from suspense and exported as a refund.

use crate::common;

use common::books::export;
use common::checks::{kinds, order, sound, wait_status};
use common::regtest::{Chain, eventually, fresh_merchant_key, ltc_engine};
use common::topup;
use payrecon::config::{Config, UtxoConfig};
use payrecon::ledger::{Account, Currency, SuspenseReason};
use payrecon::{Action, IntentStatus, JournalFormat, Period, RefundState};
use payrecon_chain_core::Method;
use serde_json::json;

on_both_databases_and_sources! {
    async fn an_overpaid_part_goes_back_through_the_merchants_wallet(db, source) {
        let chain = Chain::lock().await;
        let (engine, key) = signing_merchant(&db, &chain, source).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Ltc).await.unwrap();
        let watcher = source.watch(&engine, &chain);
        chain.send(&pay.intent.pay_to, "1.3").await;
        chain.mine(2).await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        eventually("the overpayment exception", || async { kinds(&engine, "T1").await == ["overpaid"] }).await;

        // The excess was worth 120 USD a coin when it came in (valued by hand here; the
        // market's 100 values the rest): the refund books the difference as an exchange gain.
        let hold = format!("overpaid:{}:1", pay.intent.id);
        engine.value_by_hand(&hold, Some("120".parse().unwrap()), None, "finance", "the rate at receipt").await.unwrap();

        // The customer asks on the checkout page; an operator approves.
        let customer = chain.wallet_address().await;
        let asked = engine.checkout_request_refund(&pay.intent.checkout_key, &customer).await.unwrap();
        assert_eq!((asked.len(), asked[0].amount_decimal.as_str()), (1, "0.3"));
        let refund = engine.approve_refund(&asked[0].id, "lead").await.unwrap();
        let more = engine.request_refund(&refund.exception_id, &customer, "0.1", "ops").await.unwrap_err();
        assert!(more.to_string().contains("0 LTC is left to refund"), "{more}");

        // payrecon prepares; the merchant's keys sign; the node broadcasts.
        let prepared = engine.prepare_refund(&refund.id, "ops").await.unwrap();
        assert_eq!(prepared.refund.state, RefundState::Prepared);
        assert!(prepared.payment_request.starts_with(&format!("litecoin:{customer}?amount=0.3&")), "{}", prepared.payment_request);
        assert!(prepared.payment_request_qr.starts_with("<?xml"));
        let prepared = prepared.psbt.unwrap();
        assert_eq!(prepared.pays, "0.3");
        assert!(prepared.change_address.as_deref().is_some_and(|a| a.starts_with("rltc1q")));
        assert_eq!(prepared.change_path.as_deref(), Some("1/0"));
        let again = engine.prepare_refund(&refund.id, "ops").await.unwrap().psbt.unwrap();
        assert_eq!(again.change_address, prepared.change_address, "the same change index");
        let wallet = chain.seed_wallet(&key, [0, 20]).await;
        let signed = chain.call_wallet(&wallet, "walletprocesspsbt", json!([prepared.psbt])).await;
        assert_eq!(signed["complete"], json!(true), "{signed}");
        let final_tx = chain.call(false, "finalizepsbt", json!([signed["psbt"]])).await;
        chain.call(false, "unloadwallet", json!([wallet])).await;
        let txid = chain.call(false, "sendrawtransaction", json!([final_tx["hex"]])).await;
        let txid = txid.as_str().unwrap().to_owned();

        // One block: sent. A reorg takes it back to approved; two blocks complete it.
        let height = chain.mine(1).await;
        let state = |wanted: RefundState| {
            let engine = engine.clone();
            let id = refund.id.clone();
            async move {
                engine.refunds(None).await.unwrap().into_iter().any(|r| r.id == id && r.state == wanted)
            }
        };
        eventually("the refund is sent", || state(RefundState::Sent)).await;
        let sent = engine.refunds(None).await.unwrap().remove(0);
        assert_eq!((sent.txid.as_deref(), sent.block_height), (Some(txid.as_str()), Some(height)));
        assert_eq!(sent.paid.map(|p| p.base_units()), Some(30_000_000));
        // The new branch's blocks leave it out (a fee delta keeps it from them): it waits in
        // the mempool again.
        chain.invalidate(height).await;
        chain.call(false, "prioritisetransaction", json!([txid, 0, -10_000_000])).await;
        chain.mine(2).await;
        eventually("a reorg takes it back", || state(RefundState::Approved)).await;
        assert_eq!(engine.refunds(None).await.unwrap()[0].txid, None);
        chain.call(false, "prioritisetransaction", json!([txid, 0, 10_000_000])).await;
        chain.mine(2).await;
        eventually("the refund is completed", || state(RefundState::Completed)).await;
        watcher.stop().await.unwrap();

        // Booked from suspense at depth; the exception is resolved by the chain.
        let held = engine
            .account_balance(&Account::Suspense(SuspenseReason::Overpaid), Currency::Crypto(Method::Ltc))
            .await
            .unwrap();
        assert_eq!(held, 0, "the held excess left suspense");
        let exception = engine.exceptions(None).await.unwrap().remove(0);
        assert!(exception.resolution.as_deref().is_some_and(|r| r.contains(&txid)), "{exception:?}");
        let events = engine.events_after(0, 10_000).await.unwrap();
        for kind in ["refund_requested", "refund_approved", "refund_prepared", "refund_sent", "refund_completed"] {
            assert!(events.iter().any(|e| e.kind == kind), "{kind} in {events:?}");
        }
        engine.value_entries().await.unwrap();
        let month = Period::containing(chrono::Utc::now(), "UTC".parse().unwrap());
        let generic = String::from_utf8(export(&engine, month, JournalFormat::Generic).await.remove(0)).unwrap();
        // Booked as a refund: the held excess leaves suspense for where the outflow sent it.
        // Suspense leaves at the 36.00 USD it was held at, the coins go at the outflow's
        // 30.00, and fx keeps the 6.00 gain (it passes 0.3 LTC through, in and out).
        let refund_lines: Vec<&str> = generic.lines().filter(|l| l.contains(&refund.id)).collect();
        let legs: Vec<(&str, &str)> = refund_lines
            .iter()
            .map(|l| {
                let cells: Vec<&str> = l.split(',').collect();
                (cells[4], cells[10])
            })
            .collect();
        assert_eq!(
            legs,
            [("suspense:overpaid", "36.00"), ("fx:ltc", "-36.00"), ("fx:ltc", "30.00"), ("external:litecoin:LTC", "-30.00")],
            "{generic}"
        );
        assert!(refund_lines.iter().all(|l| l.contains(",refund,")), "{refund_lines:?}");
        let valuation = engine.valuation(&format!("refund:{}", refund.id)).await.unwrap().unwrap();
        assert!(valuation.basis.starts_with("held since ") && valuation.basis.contains("; sent in "), "{}", valuation.basis);
        assert!(!generic.lines().any(|l| l.contains("revenue")), "never a sale");
        // The month's report: the refund with its gain, and receipts without the outflow.
        let report: serde_json::Value = serde_json::from_str(&engine.period_report(month).await.unwrap()).unwrap();
        let refunded = &report["refunds"][0];
        assert_eq!(
            (&refunded["method"], &refunded["refunds"], &refunded["amount_base_units"], &refunded["held_usd"]["amount"], &refunded["fx_gain_usd"]["amount"]),
            (&json!("ltc"), &json!(1), &json!("30000000"), &json!("36.00"), &json!("6.00")),
            "{report}"
        );
        let received = &report["receipts"][0];
        assert_eq!((&received["entries"], &received["market_usd"]["amount"]), (&json!(2), &json!("136.00")), "{report}");

        // The reconciliation report's refunded line comes from the completed refund.
        let query = payrecon::ReportQuery {
            from: chrono::Utc::now() - chrono::Duration::days(1),
            to: chrono::Utc::now() + chrono::Duration::days(1),
            method: None,
        };
        let mut out = Vec::new();
        engine.write_reconciliation(&query, payrecon::ReportFormat::Json, payrecon::CsvSection::Transfers, &mut out).await.unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let ltc = report["summary"].as_array().unwrap().iter().find(|s| s["method"] == "ltc").unwrap();
        assert_eq!((ltc["refunded"].as_str(), ltc["held"].as_str()), (Some("0.3"), Some("0")), "{ltc}");
        sound(&engine).await;
    }

    async fn a_refund_from_another_wallet_counts_only_on_the_chains_word(db, source) {
        let chain = Chain::lock().await;
        let engine = watching_merchant(&db, &chain, source).await;
        let watcher = source.watch(&engine, &chain);
        let refunds = approved_overpaid_refunds(&engine, &chain, ["T1", "T2"], None).await;
        let mark = |exception: String, txid: String| {
            let engine = engine.clone();
            async move {
                let action = Action::MarkRefunded { refund_txid: txid };
                engine.resolve_exception(&exception, &action, "bob", "sent from the treasury").await
            }
        };

        // A txid that pays the customer nothing is refused, and changes nothing.
        let first = &refunds[0];
        let elsewhere = chain.send(&chain.wallet_address().await, "0.3").await;
        chain.mine(2).await;
        let refused = mark(first.exception_id.clone(), elsewhere.clone()).await.unwrap_err().to_string();
        assert!(refused.contains(&elsewhere), "{refused}");
        assert!(engine.exceptions(None).await.unwrap().iter().all(|e| e.resolution.is_none()));

        // Paid from the treasury: not yet in a block, then not deep enough, then recorded as
        // sent; the watcher completes it at depth and books it against the treasury.
        let paid = chain.send(&first.address, "0.3").await;
        eventually("the source knows it and says it is unmined", || async {
            let unmined = engine.refund_sent(&first.id, &paid, "bob").await.unwrap_err().to_string();
            unmined.contains("not in a block yet")
        })
        .await;
        chain.mine(1).await;
        chain.wait_synced(&engine, payrecon_chain_core::Network::Litecoin).await;
        let shallow = mark(first.exception_id.clone(), paid.clone()).await.unwrap_err().to_string();
        assert!(shallow.contains("1 blocks deep, 2 needed"), "{shallow}");
        let sent = engine.refund_sent(&first.id, &paid, "bob").await.unwrap();
        assert_eq!((sent.state, sent.txid.as_deref()), (RefundState::Sent, Some(paid.as_str())));
        chain.mine(1).await;
        eventually("the watcher completes it", || async {
            engine.refunds(None).await.unwrap().iter().any(|r| r.id == first.id && r.state == RefundState::Completed)
        }).await;
        let treasury = engine.account_balance(&Account::Treasury(Method::Ltc), Currency::Crypto(Method::Ltc)).await.unwrap();
        assert_eq!(treasury, -30_000_000, "the treasury paid it");

        // Deep enough at once: mark-refunded completes it and resolves the exception.
        let second = &refunds[1];
        let paid = chain.send(&second.address, "0.3").await;
        chain.mine(2).await;
        chain.wait_synced(&engine, payrecon_chain_core::Network::Litecoin).await;
        let resolved = mark(second.exception_id.clone(), paid.clone()).await.unwrap();
        assert_eq!(resolved.exception.resolution.as_deref(), Some("mark_refunded by bob: sent from the treasury"));
        assert_eq!(resolved.action.refund_txid.as_deref(), Some(paid.as_str()));
        assert!(resolved.entry.unwrap().idempotency_key.starts_with("refund:"));
        watcher.stop().await.unwrap();
        assert!(engine.exceptions(None).await.unwrap().iter().all(|e| e.resolution.is_some()));
        let held = engine
            .account_balance(&Account::Suspense(SuspenseReason::Overpaid), Currency::Crypto(Method::Ltc))
            .await
            .unwrap();
        assert_eq!(held, 0);
        // Paid from the treasury, no outflow carries them: their coins go at the market's rate.
        engine.value_entries().await.unwrap();
        for refund in &refunds {
            let valuation = engine.valuation(&format!("refund:{}", refund.id)).await.unwrap().unwrap();
            assert!(valuation.basis.ends_with("; market"), "{}", valuation.basis);
        }
        sound(&engine).await;
    }

    async fn part_of_a_settled_top_up_goes_back_from_the_output_it_paid(db, source) {
        let chain = Chain::lock().await;
        let (engine, key) = signing_merchant(&db, &chain, source).await;
        engine.create_topup(&topup("S1", "42", "100")).await.unwrap();
        let pay = engine.create_payment(&order("S1"), Method::Ltc).await.unwrap();
        let watcher = source.watch(&engine, &chain);
        chain.send(&pay.intent.pay_to, "1").await;
        chain.mine(2).await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;

        // 0.4 LTC of it: 40 USD leave the balance, and the merchant's keys sign the PSBT that
        // spends the payment's own output.
        let customer = chain.wallet_address().await;
        let refund = engine.request_payment_refund(&pay.intent.id, &customer, "0.4", "ops").await.unwrap();
        assert_eq!(engine.available_balance(&common::account("42")).await.unwrap().cents(), 6_000);
        engine.approve_refund(&refund.id, "lead").await.unwrap();
        let prepared = engine.prepare_refund(&refund.id, "ops").await.unwrap().psbt.unwrap();
        assert_eq!((prepared.pays.as_str(), prepared.inputs.len()), ("0.4", 1));
        let wallet = chain.seed_wallet(&key, [0, 20]).await;
        let signed = chain.call_wallet(&wallet, "walletprocesspsbt", json!([prepared.psbt])).await;
        assert_eq!(signed["complete"], json!(true), "{signed}");
        let final_tx = chain.call(false, "finalizepsbt", json!([signed["psbt"]])).await;
        chain.call(false, "unloadwallet", json!([wallet])).await;
        chain.call(false, "sendrawtransaction", json!([final_tx["hex"]])).await;
        chain.mine(2).await;
        eventually("the refund is completed", || async {
            engine.refunds(None).await.unwrap().iter().any(|r| r.id == refund.id && r.state == RefundState::Completed)
        })
        .await;
        watcher.stop().await.unwrap();
        let returned = engine.exceptions(Some(&order("S1"))).await.unwrap().remove(0);
        assert_eq!(returned.kind, "returned");
        assert!(returned.resolution.is_some(), "the chain resolved it: {returned:?}");
        let held = engine
            .account_balance(&Account::Suspense(SuspenseReason::Refunding), Currency::Crypto(Method::Ltc))
            .await
            .unwrap();
        assert_eq!(held, 0);
        engine.value_entries().await.unwrap();
        let valuation = engine.valuation(&format!("refund:{}", refund.id)).await.unwrap().unwrap();
        assert!(valuation.basis.starts_with("held since ") && valuation.basis.contains("; sent in "), "{}", valuation.basis);
        sound(&engine).await;
    }

    async fn one_transaction_settles_two_refunds_to_one_address_only_if_it_pays_both(db, source) {
        let chain = Chain::lock().await;
        let engine = watching_merchant(&db, &chain, source).await;
        let watcher = source.watch(&engine, &chain);
        let customer = chain.wallet_address().await;
        let refunds = approved_overpaid_refunds(&engine, &chain, ["D1", "D2"], Some(&customer)).await;
        let once = chain.send(&customer, "0.3").await;
        chain.mine(1).await;
        chain.wait_synced(&engine, payrecon_chain_core::Network::Litecoin).await;
        let first = engine.refund_sent(&refunds[0].id, &once, "bob").await.unwrap();
        assert_eq!(first.state, RefundState::Sent);
        let twice = engine.refund_sent(&refunds[1].id, &once, "bob").await.unwrap_err().to_string();
        assert!(twice.contains(&format!("already pays {}", refunds[0].id)), "{twice}");
        let both = chain.send(&customer, "0.6").await;
        chain.mine(1).await;
        chain.wait_synced(&engine, payrecon_chain_core::Network::Litecoin).await;
        let second = engine.refund_sent(&refunds[1].id, &both, "bob").await.unwrap();
        assert_eq!(second.txid.as_deref(), Some(both.as_str()));
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn two_refunds_prepared_at_once_never_share_a_change_address(db, source) {
        let chain = Chain::lock().await;
        let engine = watching_merchant(&db, &chain, source).await;
        let watcher = source.watch(&engine, &chain);
        let refunds = approved_overpaid_refunds(&engine, &chain, ["C1", "C2"], None).await;
        watcher.stop().await.unwrap();

        // Another process takes change index 0 for the first refund and has not committed when
        // the second is prepared, which reads the same highest index.
        sqlx::any::install_default_drivers();
        let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
        let mut other = pool.begin().await.unwrap();
        sqlx::query("UPDATE refunds SET change_index = 0 WHERE id = $1").bind(&refunds[0].id).execute(&mut *other).await.unwrap();
        let second = tokio::spawn({
            let (engine, id) = (engine.clone(), refunds[1].id.clone());
            async move { engine.prepare_refund(&id, "ops").await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        other.commit().await.unwrap();
        let second = second.await.unwrap().unwrap().psbt.unwrap();
        let first = engine.prepare_refund(&refunds[0].id, "ops").await.unwrap().psbt.unwrap();
        assert_eq!((first.change_path.as_deref(), second.change_path.as_deref()), (Some("1/0"), Some("1/1")));
        assert_ne!(first.change_address, second.change_address);
        sound(&engine).await;
    }
}

/// For each of `references`, a 100 USD top-up paid 1.3 LTC (0.3 too much) and the refund of
/// the excess to `customer` or else a fresh address of the node's, approved. The watcher must
/// be running.
async fn approved_overpaid_refunds(
    engine: &payrecon::Engine,
    chain: &Chain,
    references: [&str; 2],
    customer: Option<&str>,
) -> Vec<payrecon::Refund> {
    let mut refunds = Vec::new();
    for reference in references {
        engine
            .create_topup(&topup(reference, "42", "100"))
            .await
            .unwrap();
        let pay = engine
            .create_payment(&order(reference), Method::Ltc)
            .await
            .unwrap();
        chain.send(&pay.intent.pay_to, "1.3").await;
        chain.mine(2).await;
        wait_status(engine, &pay.intent.id, IntentStatus::Settled).await;
        eventually("the overpayment exception", || async {
            kinds(engine, reference).await == ["overpaid"]
        })
        .await;
        let exception = engine
            .exceptions(Some(&order(reference)))
            .await
            .unwrap()
            .remove(0);
        let customer = match customer {
            Some(address) => address.to_owned(),
            None => chain.wallet_address().await,
        };
        let refund = engine
            .request_refund(&exception.id, &customer, "overpaid", "ops")
            .await
            .unwrap();
        refunds.push(engine.approve_refund(&refund.id, "lead").await.unwrap());
    }
    refunds
}

/// An engine watching Litecoin at 2 confirmations for a fresh merchant key whose origin its
/// PSBTs name, so the key's wallet on the node signs them.
async fn signing_merchant(
    db: &common::TestDb,
    chain: &Chain,
    source: common::regtest::Source,
) -> (payrecon::Engine, common::regtest::MerchantKey) {
    let key = fresh_merchant_key();
    let litecoin = UtxoConfig {
        key_origin: Some(key.origin.clone()),
        ..source.config(&key.account_xpub, chain, 2)
    };
    let (engine, _clock) = ltc_engine(db, chain, 2, &key.account_xpub, |c: &mut Config| {
        c.networks.litecoin = Some(litecoin);
    })
    .await;
    (engine, key)
}

/// An engine watching Litecoin at 2 confirmations for a fresh merchant key.
async fn watching_merchant(
    db: &common::TestDb,
    chain: &Chain,
    source: common::regtest::Source,
) -> payrecon::Engine {
    let key = fresh_merchant_key();
    let (engine, _clock) = ltc_engine(db, chain, 2, &key.account_xpub, |c: &mut Config| {
        c.networks.litecoin = Some(source.config(&key.account_xpub, chain, 2));
    })
    .await;
    engine
}
