//! Refunds on a real anvil node with real ERC-20 contracts, on SQLite and PostgreSQL: USDC
//! paid to a USDT intent goes back as USDC. payrecon prepares the unsigned EIP-1559
//! transaction; a library signs it with the address's key (never payrecon); the watcher finds
//! it as the refund's transaction, checks it on the node and completes it at depth.

use crate::common;

use common::anvil::{Anvil, SeedKeys, eth_engine, watch_ethereum};
use common::checks::{kinds, order, sound};
use common::regtest::eventually;
use common::topup;
use payrecon::ledger::{Account, Currency, SuspenseReason};
use payrecon::{RefundState, UnsignedRefund};
use payrecon_chain_core::Method;

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

        // payrecon prepares the unsigned transaction from the address holding the USDC; the
        // address needs ETH for gas first (which arrives as an exception of its own for the
        // operator); a library signs payrecon's signing payload with the address's key.
        let prepared = engine.prepare_refund(&refund.id, "ops").await.unwrap();
        assert!(prepared.psbt.is_none());
        assert_eq!(prepared.payment_request, format!("ethereum:{}@31337/transfer?address={}&uint256={USDC_UNITS}", tokens.usdc, refund.address));
        let Some(UnsignedRefund::Ethereum(unsigned)) = prepared.unsigned_transaction else {
            panic!("an Ethereum refund's unsigned transaction: {:?}", prepared.unsigned_transaction);
        };
        assert_eq!((unsigned.from.as_str(), unsigned.value.as_str()), (pay.intent.pay_to.as_str(), "0"));
        assert!(unsigned.to.eq_ignore_ascii_case(&tokens.usdc), "{} is the USDC contract", unsigned.to);
        let top_up: u128 = unsigned.top_up_first.parse().unwrap();
        assert_eq!(top_up, unsigned.max_fee.parse::<u128>().unwrap(), "the address holds no ETH");
        anvil.send_eth(&pay.intent.pay_to, top_up).await;
        anvil.mine(1).await;
        let signer = keys.signer(&format!("m/44h/60h/0h/0/{}", pay.intent.derivation_index));
        let txid = anvil.send_raw(&sign_prepared(&signer, &unsigned)).await;
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

/// Signs payrecon's unsigned transaction as a wallet would: the Keccak-256 of its signing
/// payload with the key, the signature set on the transaction its fields describe (which must
/// encode to that same payload).
fn sign_prepared(
    signer: &alloy::signers::local::PrivateKeySigner,
    unsigned: &payrecon_chain_ethereum::UnsignedTransaction,
) -> String {
    use alloy::consensus::{SignableTransaction as _, TxEip1559, TxEnvelope};
    use alloy::eips::eip2718::Encodable2718 as _;
    use alloy::primitives::{U256, hex, keccak256};
    use alloy::signers::SignerSync as _;
    let payload = hex::decode(&unsigned.unsigned_rlp).unwrap();
    let tx = TxEip1559 {
        chain_id: unsigned.chain_id,
        nonce: unsigned.nonce,
        gas_limit: unsigned.gas_limit,
        max_fee_per_gas: unsigned.max_fee_per_gas.parse().unwrap(),
        max_priority_fee_per_gas: unsigned.max_priority_fee_per_gas.parse().unwrap(),
        to: alloy::primitives::TxKind::Call(unsigned.to.parse().unwrap()),
        value: U256::from_str_radix(&unsigned.value, 10).unwrap(),
        access_list: Default::default(),
        input: hex::decode(&unsigned.data).unwrap().into(),
    };
    assert_eq!(
        tx.encoded_for_signing(),
        payload,
        "the fields encode to the payload"
    );
    let signature = signer.sign_hash_sync(&keccak256(&payload)).unwrap();
    let envelope = TxEnvelope::Eip1559(tx.into_signed(signature));
    format!("0x{}", hex::encode(envelope.encoded_2718()))
}
