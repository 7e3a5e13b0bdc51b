//! Refunds on a real anvil node with real ERC-20 contracts, on SQLite and PostgreSQL: USDC
//! paid to a USDT intent goes back as USDC, signed with the address's key by a library (never
//! by payrecon), found by the watcher as the refund's transaction, checked on the node and
//! completed at depth.

use crate::common;

use common::anvil::{
    Anvil, SeedKeys, eth_engine, signed_transfer, token_transfer_call, watch_ethereum,
};
use common::checks::{kinds, order, sound};
use common::regtest::eventually;
use common::topup;
use payrecon::RefundState;
use payrecon::ledger::{Account, Currency, SuspenseReason};
use payrecon_chain_core::Method;
use payrecon_chain_ethereum::{ETH_TRANSFER_GAS, TOKEN_TRANSFER_GAS};

/// 100 USDC.
const USDC_UNITS: u128 = 100_000_000;

on_both_databases! {
    async fn usdc_paid_to_a_usdt_intent_goes_back_as_usdc(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let keys = SeedKeys::fresh();
        let (engine, _clock) = eth_engine(&db, &anvil, &tokens, &keys.account_xpub(), 2).await;
        engine.create_topup(&topup("WRONG", "61", "100")).await.unwrap();
        let pay = engine.create_payment(&order("WRONG"), Method::UsdtErc20).await.unwrap();
        let watcher = watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);
        anvil.send_token(&tokens.usdc, &pay.intent.pay_to, USDC_UNITS).await;
        anvil.mine(2).await;
        eventually("a wrong_asset exception", || async { kinds(&engine, "WRONG").await == ["wrong_asset"] }).await;
        let exception = engine.exceptions(None).await.unwrap().remove(0);

        // The refund goes back in what was paid: USDC, to the customer's own address.
        let customer = anvil.other.clone();
        let refund = engine.request_refund(&exception.id, &customer, "all", "ops").await.unwrap();
        assert_eq!((refund.method, refund.amount_decimal.as_str()), (Method::UsdcErc20, "100"));
        let refund = engine.approve_refund(&refund.id, "lead").await.unwrap();

        // The address needs gas first (the ETH that brings it is an exception of its own for
        // the operator); then the address's own key sends the USDC back.
        let gas_price = u128::from_str_radix(
            anvil.call("eth_gasPrice", serde_json::json!([])).await.as_str().unwrap().trim_start_matches("0x"),
            16,
        )
        .unwrap();
        anvil.send_eth(&pay.intent.pay_to, u128::from(TOKEN_TRANSFER_GAS + ETH_TRANSFER_GAS) * gas_price).await;
        anvil.mine(1).await;
        let signer = keys.signer(&format!("m/44h/60h/0h/0/{}", pay.intent.derivation_index));
        let raw = signed_transfer(&signer, 0, gas_price, TOKEN_TRANSFER_GAS, &tokens.usdc, 0, token_transfer_call(&customer, USDC_UNITS));
        let txid = anvil.send_raw(&raw).await;
        anvil.mine(1).await;
        eventually("the refund is sent", || async {
            engine.refunds(None).await.unwrap().iter().any(|r| r.state == RefundState::Sent && r.txid.as_deref() == Some(txid.as_str()))
        }).await;
        anvil.mine(1).await;
        eventually("the refund is completed", || async {
            engine.refunds(None).await.unwrap().iter().any(|r| r.id == refund.id && r.state == RefundState::Completed)
        }).await;
        watcher.stop().await.unwrap();
        let held = engine
            .account_balance(&Account::Suspense(SuspenseReason::WrongAsset), Currency::Crypto(Method::UsdcErc20))
            .await
            .unwrap();
        assert_eq!(held, 0);
        let resolved = engine.exceptions(None).await.unwrap().into_iter().find(|e| e.id == exception.id).unwrap();
        assert!(resolved.resolution.as_deref().is_some_and(|r| r.contains(&txid)), "{resolved:?}");
        sound(&engine).await;
    }
}
