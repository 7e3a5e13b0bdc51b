//! Never an address twice, never a coin stranded: a database restored from a backup older than
//! its last intents, and a changed wallet key, on the Litecoin regtest node through ElectrumX
//! and through the full node, and the restore on anvil for ETH and USDT, on SQLite and
//! PostgreSQL.

use crate::common;

use common::checks::{order, wait_status};
use common::regtest::{Chain, fresh_merchant_key, ltc_engine};
use common::{TestDb, topup};
use payrecon::config::UtxoConfig;
use payrecon::{Engine, HoldingsSort, IntentStatus, KeyState, PaymentIntent};
use payrecon_chain_core::{Method, Network};

/// A 100 USD top-up paid in LTC (1 LTC at 100 USD): its intent.
async fn ltc_intent(engine: &Engine, reference: &str) -> PaymentIntent {
    engine
        .create_topup(&topup(reference, "7", "100"))
        .await
        .unwrap();
    engine
        .create_payment(&order(reference), Method::Ltc)
        .await
        .unwrap()
        .intent
}

/// The open exceptions that say money reached an address not yet handed out.
async fn unissued_exceptions(engine: &Engine) -> Vec<String> {
    let exceptions = engine.exceptions(None).await.unwrap();
    exceptions
        .into_iter()
        .filter(|e| e.kind == "unmatched" && e.detail.contains("not yet handed out"))
        .map(|e| e.detail)
        .collect()
}

async fn litecoin_held(engine: &Engine) -> String {
    let holdings = engine
        .holdings(Some(Network::Litecoin), HoldingsSort::Index, false, 0, 100)
        .await
        .unwrap();
    holdings
        .totals
        .first()
        .map_or_else(|| "0".to_owned(), |total| total.amount.clone())
}

on_both_databases_and_sources! {
    async fn a_restore_from_an_older_backup_hands_out_no_address_twice_and_finds_every_payment(db, source) {
        let chain = Chain::lock().await;
        let key = fresh_merchant_key();
        let section = || UtxoConfig {
            key_origin: Some(key.origin.clone()),
            ..source.config(&key.account_xpub, &chain, 1)
        };
        let (engine, _clock) = ltc_engine(&db, &chain, 1, &key.account_xpub, |c| c.networks.litecoin = Some(section())).await;
        let watcher = source.watch(&engine, &chain);
        let first = ltc_intent(&engine, "R-1").await;
        let unpaid = ltc_intent(&engine, "R-2").await;
        chain.send(&first.pay_to, "1").await;
        chain.mine(1).await;
        wait_status(&engine, &first.id, IntentStatus::Settled).await;

        // The backup, while the watcher runs; then five more intents, two of them paid.
        let backup = db.backup(&engine).await;
        let mut after: Vec<PaymentIntent> = Vec::new();
        for reference in ["R-3", "R-4", "R-5", "R-6", "R-7"] {
            after.push(ltc_intent(&engine, reference).await);
        }
        assert_eq!(after.iter().map(|i| i.derivation_index).collect::<Vec<_>>(), [2, 3, 4, 5, 6]);
        chain.send(&after[0].pay_to, "1").await;
        chain.send(&after[3].pay_to, "0.5").await;
        chain.mine(1).await;
        wait_status(&engine, &after[0].id, IntentStatus::Settled).await;
        wait_status(&engine, &after[3].id, IntentStatus::Confirmed).await;
        watcher.stop().await.unwrap();
        drop(engine);

        // The restore, and a start on it.
        let restored = TestDb::restore(&backup).await;
        let (engine, _clock) = ltc_engine(&restored, &chain, 1, &key.account_xpub, |c| c.networks.litecoin = Some(section())).await;
        restored.after_restore(&engine).await;
        let watcher = source.watch(&engine, &chain);
        // The first intent waits for the watcher's first look past the counter, which then
        // stands the look-ahead (20) past the last paid index: none of the five comes again,
        // paid or not.
        let next = ltc_intent(&engine, "R-8").await;
        assert_eq!(next.derivation_index, 5 + 1 + payrecon::DEFAULT_LOOKAHEAD);
        assert!(after.iter().all(|lost| lost.pay_to != next.pay_to));
        assert!(matches!(engine.payment(&after[0].id).await, Err(payrecon::Error::IntentNotFound(_))));

        let found = unissued_exceptions(&engine).await;
        assert_eq!(found.len(), 2, "{found:?}");
        for (lost, index) in [(&after[0], 2), (&after[3], 5)] {
            assert!(found.iter().any(|detail| detail.contains(&lost.pay_to) && detail.contains(&format!("index {index}"))), "{found:?}");
        }
        assert!(found.iter().all(|detail| detail.contains(&lost_key(&engine))), "{found:?}");

        // An intent the restore lost and nobody paid yet stays watched: its customer pays, and
        // the money is an unmatched exception naming the address, never anyone's credit.
        chain.send(&after[1].pay_to, "1").await;
        chain.mine(1).await;
        common::regtest::eventually("the late payment to a lost intent's address", || async {
            unissued_exceptions(&engine).await.len() == 3
        }).await;
        assert!(unissued_exceptions(&engine).await.iter().any(|detail| detail.contains(&after[1].pay_to) && detail.contains("index 3")));
        assert_eq!(engine.payment(&next.id).await.unwrap().intent.status, IntentStatus::AwaitingPayment);
        common::regtest::eventually("holdings to count every payment", || async {
            litecoin_held(&engine).await == "350000000"
        }).await;
        let export = engine.wallet_export(Network::Litecoin).await.unwrap();
        assert_eq!(export.highest_index, Some(next.derivation_index));
        assert_eq!(chain.watch_only_holds(&export).await.to_string(), litecoin_held(&engine).await);
        assert!(engine.trial_balance().await.unwrap().is_sound());
        assert_eq!(engine.payment(&unpaid.id).await.unwrap().intent.status, IntentStatus::AwaitingPayment);
        watcher.stop().await.unwrap();
    }

    async fn a_changed_key_is_retired_and_its_money_stays_visible(db, source) {
        let chain = Chain::lock().await;
        let old_key = fresh_merchant_key();
        let new_key = fresh_merchant_key();
        let config = |key: &common::regtest::MerchantKey| {
            common::payments::config(|c| {
                c.payments.enabled_methods = vec![Method::Ltc];
                c.networks.litecoin = Some(UtxoConfig {
                    key_origin: Some(key.origin.clone()),
                    ..source.config(&key.account_xpub, &chain, 1)
                });
            })
        };
        let (engine, _clock) = keyed_engine(&db, &chain, &config(&old_key)).await;
        let watcher = source.watch(&engine, &chain);
        let paid_before = ltc_intent(&engine, "K-1").await;
        let paid_after = ltc_intent(&engine, "K-2").await;
        chain.send(&paid_before.pay_to, "1").await;
        chain.mine(1).await;
        wait_status(&engine, &paid_before.id, IntentStatus::Settled).await;
        watcher.stop().await.unwrap();
        drop(engine);

        // The merchant changes wallets.
        let (engine, _clock) = keyed_engine(&db, &chain, &config(&new_key)).await;
        let watcher = source.watch(&engine, &chain);
        let fresh = ltc_intent(&engine, "K-3").await;
        assert_ne!(fresh.key_id, paid_before.key_id);
        assert_eq!(fresh.derivation_index, 0, "the new key counts from 0");
        chain.send(&paid_after.pay_to, "0.25").await;
        chain.send(&fresh.pay_to, "1").await;
        chain.mine(1).await;
        wait_status(&engine, &paid_after.id, IntentStatus::Confirmed).await;
        wait_status(&engine, &fresh.id, IntentStatus::Settled).await;

        let exports = engine.wallet_exports(Network::Litecoin, None).await.unwrap();
        assert_eq!(exports.iter().map(|e| (e.key_id.clone(), e.state)).collect::<Vec<_>>(), [(fresh.key_id.clone(), KeyState::Current), (paid_before.key_id.clone(), KeyState::Retired)]);
        let holdings = engine.holdings(Some(Network::Litecoin), HoldingsSort::Index, false, 0, 100).await.unwrap();
        for export in &exports {
            let per_key = holdings.key_totals.iter().find(|t| t.key_id == export.key_id).unwrap();
            assert_eq!(chain.watch_only_holds(export).await.to_string(), per_key.amount, "{}", export.key_id);
        }
        assert!(holdings.addresses.iter().all(|h| h.key_id.is_some()));
        let month = engine.period_of(chrono::Utc::now());
        let rollforward = engine.holdings_rollforward(month).await.unwrap();
        assert_eq!(rollforward.closing_per_key, holdings.key_totals);
        let stuck = engine.stuck(&Default::default()).await.unwrap();
        let retired = stuck.iter().find(|item| item.kind == "retired_key_holds").expect("a stuck notice for the retired key");
        assert_eq!(retired.subject, paid_before.key_id);
        assert!(retired.what.contains("1.25 LTC") || retired.what.contains("1.25000000 LTC"), "{}", retired.what);
        let one = engine.wallet_exports(Network::Litecoin, Some(&paid_before.key_id)).await.unwrap();
        assert_eq!(one.len(), 1);
        assert!(engine.wallet_exports(Network::Litecoin, Some("ltc:00000000")).await.is_err());
        watcher.stop().await.unwrap();
    }
}

on_both_databases! {
    async fn on_anvil_eth_and_usdt_paid_after_the_backup_are_found_after_the_restore(db) {
        let anvil = common::anvil::Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let xpub = common::anvil::fresh_ethereum_xpub();
        let (engine, _clock) = common::anvil::eth_engine(&db, &anvil, &tokens, &xpub, 1).await;
        let watcher = common::anvil::watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);
        let pay = |reference: &'static str, method: Method| {
            let engine = engine.clone();
            async move {
                engine.create_topup(&topup(reference, "8", "100")).await.unwrap();
                engine.create_payment(&order(reference), method).await.unwrap().intent
            }
        };
        let first = pay("E-1", Method::Eth).await;
        anvil.send_eth(&first.pay_to, 50_000_000_000_000_000).await;
        anvil.mine(1).await;
        wait_status(&engine, &first.id, IntentStatus::Settled).await;
        let backup = db.backup(&engine).await;
        let eth = pay("E-2", Method::Eth).await;
        let usdt = pay("E-3", Method::UsdtErc20).await;
        anvil.send_eth(&eth.pay_to, 50_000_000_000_000_000).await;
        anvil.send_token(&tokens.usdt, &usdt.pay_to, 100_000_000).await;
        anvil.mine(1).await;
        wait_status(&engine, &eth.id, IntentStatus::Settled).await;
        wait_status(&engine, &usdt.id, IntentStatus::Settled).await;
        watcher.stop().await.unwrap();
        drop(engine);

        let restored = TestDb::restore(&backup).await;
        let (engine, _clock) = common::anvil::eth_engine(&restored, &anvil, &tokens, &xpub, 1).await;
        restored.after_restore(&engine).await;
        let watcher = common::anvil::watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);
        engine.create_topup(&topup("E-4", "8", "100")).await.unwrap();
        let next = engine.create_payment(&order("E-4"), Method::UsdtErc20).await.unwrap().intent;
        // The backup's process held indexes 0 to 3 as one block: the counter stood at 4, and
        // moves the look-ahead past it.
        assert_eq!(next.derivation_index, 4 + payrecon::DEFAULT_LOOKAHEAD);
        let found = unissued_exceptions(&engine).await;
        assert_eq!(found.len(), 2, "{found:?}");
        for (lost, index) in [(&eth, 1), (&usdt, 2)] {
            assert!(found.iter().any(|detail| detail.contains(&lost.pay_to) && detail.contains(&format!("index {index}"))), "{found:?}");
        }
        let holdings = engine.holdings(Some(Network::Ethereum), HoldingsSort::Index, false, 0, 100).await.unwrap();
        let total = |asset: &str| holdings.totals.iter().find(|t| t.asset == asset).map(|t| t.amount.clone());
        let on_chain = anvil.balance(&first.pay_to).await + anvil.balance(&eth.pay_to).await;
        assert_eq!(total("eth"), Some(on_chain.to_string()));
        assert_eq!(total("usdt-erc20"), Some("100000000".to_owned()));
        assert!(engine.trial_balance().await.unwrap().is_sound());
        watcher.stop().await.unwrap();
    }
}

/// The key of the restored test's addresses, as exceptions name it.
fn lost_key(engine: &Engine) -> String {
    engine.payment_settings().keys[&Network::Litecoin]
        .current
        .key_id
        .clone()
}

/// An engine whose configured key is recorded as current, the keys before it retired.
async fn keyed_engine(
    db: &TestDb,
    chain: &Chain,
    config: &payrecon::config::Config,
) -> (
    Engine,
    std::sync::Arc<payrecon::test_utils::clock::ManualClock>,
) {
    let _ = chain;
    let (engine, clock) = common::payments::engine_with_prices(
        db,
        config.clone(),
        &[(payrecon_chain_core::Asset::Ltc, "100")],
    )
    .await;
    let mut settings = payrecon::PaymentSettings::from_config(config).unwrap();
    settings.rates = engine.payment_settings().rates.clone();
    engine.register_keys(&mut settings).await.unwrap();
    clock.advance(chrono::Utc::now() - common::payments::start_time());
    (engine.with_payment_settings(settings), clock)
}
