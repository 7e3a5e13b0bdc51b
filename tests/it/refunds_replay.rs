//! Refunds on the replayed Tron and Solana nodes, on SQLite and PostgreSQL: an overpaid part
//! sent back from the address that holds it is found as the refund's transaction by the Tron
//! watcher, checked on the node and completed; a Solana refund from the shop's recipient is
//! recorded by its signature and completed once final; a transaction that pays the customer
//! nothing is refused on both. What `refund prepare` gives is checked on both chains: the
//! node's TRX transfer or USDT `transfer` call, the Solana message.

use crate::common;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::checks::{kinds, order, sound, wait_status};
use common::regtest::eventually;
use common::solana::{solana_config, solana_engine, watch_solana};
use common::topup;
use common::tron::{USDT, fresh_tron_xpub, tron_config, tron_engine, wait_synced, watch_tron};
use payrecon::config::TronFinality;
use payrecon::ledger::{Account, Currency, SuspenseReason};
use payrecon::test_utils::clock::Clock;
use payrecon::{IntentStatus, RefundState, UnsignedRefund};
use payrecon_chain_core::Method;
use payrecon_chain_core::bitcoin::base58;
use payrecon_chain_core::bitcoin::hashes::{Hash as _, sha256};
use payrecon_chain_core::bitcoin::hex::FromHex as _;
use payrecon_chain_solana::testkit::{FakeSolana, random_pubkey};
use payrecon_chain_tron::TronAddress;
use payrecon_chain_tron::testkit::{FakeTron, TxSpec, trc20, trx};

/// 400 TRX, what a 100 USD top-up costs at 0.25 USD per TRX.
const TOPUP_SUN: u64 = 400_000_000;

/// 1 SOL, what a 100 USD top-up costs at 100 USD per SOL.
const LAMPORTS: u64 = 1_000_000_000;

/// A customer's Tron address, none of the shop's.
const CUSTOMER: &str = "TEQrkTwY43gnKH62mH8xQo1DKPorVZvv5r";

on_both_databases! {
    async fn a_tron_refund_sent_from_the_held_address_completes(db) {
        let node = FakeTron::start(100).await;
        let tron = tron_config(&node, &fresh_tron_xpub(), 1, TronFinality::Depth);
        let (engine, _clock) = tron_engine(&db, &tron).await;
        engine.create_topup(&topup("TRXOVER", "10", "100")).await.unwrap();
        let pay = engine.create_payment(&order("TRXOVER"), Method::Trx).await.unwrap();
        let watcher = watch_tron(&engine, &tron, node.head() + 1);
        node.mine(&[trx(&pay.intent.pay_to, TOPUP_SUN + 100_000_000)]);
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        eventually("the overpayment exception", || async { kinds(&engine, "TRXOVER").await == ["overpaid"] }).await;
        let exception = engine.exceptions(None).await.unwrap().remove(0);
        let refund = engine.request_refund(&exception.id, CUSTOMER, "overpaid", "ops").await.unwrap();
        assert_eq!(refund.amount_decimal, "100");
        let refund = engine.approve_refund(&refund.id, "lead").await.unwrap();
        let prepared = engine.prepare_refund(&refund.id, "ops").await.unwrap();
        assert_eq!(prepared.payment_request, format!("tron:{CUSTOMER}?amount=100"));
        assert_eq!(prepared.refund.state, RefundState::Prepared);
        // The node's transaction, as TronWeb signs it: from the held address, 100 TRX to the
        // customer, its id the hash of the bytes signed; the address holds enough for its fee.
        let Some(UnsignedRefund::Tron(unsigned)) = prepared.unsigned_transaction else {
            panic!("a Tron refund's unsigned transaction: {:?}", prepared.unsigned_transaction);
        };
        assert_eq!((unsigned.from.as_str(), unsigned.top_up_first.as_str(), unsigned.fee_limit.as_str()), (pay.intent.pay_to.as_str(), "0", "0"));
        let transfer = &unsigned.transaction["raw_data"]["contract"][0];
        assert_eq!(transfer["type"], "TransferContract");
        let value = &transfer["parameter"]["value"];
        assert_eq!(value["owner_address"].as_str(), Some(pay.intent.pay_to.parse::<TronAddress>().unwrap().to_hex().as_str()));
        assert_eq!(value["to_address"].as_str(), Some(CUSTOMER.parse::<TronAddress>().unwrap().to_hex().as_str()));
        assert_eq!(value["amount"], 100_000_000);
        let raw = Vec::<u8>::from_hex(unsigned.transaction["raw_data_hex"].as_str().unwrap()).unwrap();
        assert_eq!(unsigned.transaction["txID"].as_str(), Some(sha256::Hash::hash(&raw).to_string().as_str()));
        assert_eq!(unsigned.txid, unsigned.transaction["txID"].as_str().unwrap());
        assert!(unsigned.expires_at_ms > 0);

        // An operator's txid that pays the customer nothing: the payment itself.
        let payment_txid = engine.transfers_for(&order("TRXOVER")).await.unwrap()[0].id.txid.clone();
        let refused = engine.refund_sent(&refund.id, &payment_txid, "bob").await.unwrap_err().to_string();
        assert!(refused.contains("the refund is 100 TRX"), "{refused}");

        // The merchant's wallet sends it from the address that holds it.
        node.mine(&[TxSpec::Trx { from: Some(pay.intent.pay_to.clone()), to: CUSTOMER.into(), sun: 100_000_000, fee: None }]);
        wait_synced(&engine, &node).await;
        eventually("the refund is completed", || async {
            engine.refunds(None).await.unwrap().iter().any(|r| r.id == refund.id && r.state == RefundState::Completed)
        }).await;
        watcher.stop().await.unwrap();
        let done = engine.refunds(None).await.unwrap().remove(0);
        assert!(done.txid.is_some_and(|txid| txid != payment_txid));
        let held = engine
            .account_balance(&Account::Suspense(SuspenseReason::Overpaid), Currency::Crypto(Method::Trx))
            .await
            .unwrap();
        assert_eq!(held, 0);
        let external = engine.account_balance(&Account::External(Method::Trx), Currency::Crypto(Method::Trx)).await.unwrap();
        assert_eq!(external, 0, "the outflow's external leg is the refund");
        assert!(engine.exceptions(None).await.unwrap()[0].resolution.is_some());
        sound(&engine).await;
    }

    async fn a_tron_usdt_refund_is_the_tokens_transfer_call_with_trx_for_its_energy_first(db) {
        let node = FakeTron::start(100).await;
        let tron = tron_config(&node, &fresh_tron_xpub(), 1, TronFinality::Depth);
        let (engine, _clock) = tron_engine(&db, &tron).await;
        engine.create_topup(&topup("USDTOVER", "11", "100")).await.unwrap();
        let pay = engine.create_payment(&order("USDTOVER"), Method::UsdtTrc20).await.unwrap();
        let watcher = watch_tron(&engine, &tron, node.head() + 1);
        let paid = pay.intent.amount.base_units() + 10_000_000;
        node.mine(&[trc20(USDT, &pay.intent.pay_to, paid)]);
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        eventually("the overpayment exception", || async { kinds(&engine, "USDTOVER").await == ["overpaid"] }).await;
        watcher.stop().await.unwrap();
        let exception = engine.exceptions(None).await.unwrap().remove(0);
        let refund = engine.request_refund(&exception.id, CUSTOMER, "overpaid", "ops").await.unwrap();
        let refund = engine.approve_refund(&refund.id, "lead").await.unwrap();
        let prepared = engine.prepare_refund(&refund.id, "ops").await.unwrap();
        let Some(UnsignedRefund::Tron(unsigned)) = prepared.unsigned_transaction else {
            panic!("a Tron refund's unsigned transaction: {:?}", prepared.unsigned_transaction);
        };
        let call = &unsigned.transaction["raw_data"]["contract"][0];
        assert_eq!(call["type"], "TriggerSmartContract");
        let value = &call["parameter"]["value"];
        assert_eq!(value["contract_address"].as_str(), Some(USDT.parse::<TronAddress>().unwrap().to_hex().as_str()));
        let customer = CUSTOMER.parse::<TronAddress>().unwrap().to_hex();
        assert_eq!(value["data"].as_str(), Some(format!("a9059cbb{:0>64}{:064x}", &customer[2..], 10_000_000).as_str()));
        // The recorded committee prices: 210 sun per energy, 1,000 per byte. The fee limit is
        // twice a transfer's energy; the address holds no TRX, so it needs the whole burn.
        assert_eq!(unsigned.fee_limit, (210 * 130_000).to_string());
        assert_eq!(unsigned.transaction["raw_data"]["fee_limit"], 210 * 130_000);
        assert_eq!(unsigned.top_up_first, (210 * 130_000 + 1_000 * 345).to_string());
        sound(&engine).await;
    }

    async fn a_solana_refund_from_the_recipient_completes_once_final(db) {
        let node = FakeSolana::start().await;
        let solana = solana_config(&node);
        let (engine, clock) = solana_engine(&db, &solana).await;
        engine.create_topup(&topup("SOLOVER", "20", "100")).await.unwrap();
        let pay = engine.create_payment(&order("SOLOVER"), Method::Sol).await.unwrap();
        let watcher = watch_solana(&engine, &solana);
        let now = clock.now().timestamp();
        node.pay(&solana.recipient, LAMPORTS * 6 / 5, Some(&pay.intent.watch_key), now, false);
        node.finalize_all();
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        eventually("the overpayment exception", || async { kinds(&engine, "SOLOVER").await == ["overpaid"] }).await;
        let exception = engine.exceptions(None).await.unwrap().remove(0);
        let customer = random_pubkey();
        let refund = engine.request_refund(&exception.id, &customer, "overpaid", "ops").await.unwrap();
        let refund = engine.approve_refund(&refund.id, "lead").await.unwrap();
        let prepared = engine.prepare_refund(&refund.id, "ops").await.unwrap();
        assert!(prepared.payment_request.starts_with(&format!("solana:{customer}?amount=0.2&")), "{}", prepared.payment_request);
        // A legacy message from the recipient: the System Program's transfer of 0.2 SOL at the
        // node's blockhash, its fee priced by the node; the recipient holds enough.
        let Some(UnsignedRefund::Solana(unsigned)) = prepared.unsigned_transaction else {
            panic!("a Solana refund's unsigned transfer: {:?}", prepared.unsigned_transaction);
        };
        assert_eq!((unsigned.from.as_str(), unsigned.to.as_str()), (solana.recipient.as_str(), customer.as_str()));
        assert_eq!((unsigned.fee.as_str(), unsigned.top_up_first.as_str()), ("5000", "0"));
        let message = BASE64.decode(&unsigned.message).unwrap();
        assert_eq!(message[..4], [1, 0, 1, 3], "one signer, the program read-only, three keys");
        assert_eq!(base58::encode(&message[4..36]), solana.recipient);
        assert_eq!(base58::encode(&message[36..68]), customer);
        assert_eq!(base58::encode(&message[100..132]), unsigned.recent_blockhash);
        assert_eq!(message[message.len() - 8..], (LAMPORTS / 5).to_le_bytes());
        let transaction = BASE64.decode(&unsigned.transaction).unwrap();
        assert_eq!((transaction[0], &transaction[65..]), (1, message.as_slice()), "one empty signature, then the message");

        // Sent from the shop's recipient: recorded by its signature, sent while confirmed,
        // completed once final.
        let wrong = node.send_from(&solana.recipient, &random_pubkey(), LAMPORTS / 5, now, false);
        let refused = engine.refund_sent(&refund.id, &wrong, "bob").await.unwrap_err().to_string();
        assert!(refused.contains("the refund is 0.2 SOL"), "{refused}");
        let signature = node.send_from(&solana.recipient, &customer, LAMPORTS / 5, now, false);
        let sent = engine.refund_sent(&refund.id, &signature, "bob").await.unwrap();
        assert_eq!((sent.state, sent.txid.as_deref()), (RefundState::Sent, Some(signature.as_str())));
        node.finalize_all();
        eventually("the refund is completed", || async {
            engine.refunds(None).await.unwrap().iter().any(|r| r.id == refund.id && r.state == RefundState::Completed)
        }).await;
        watcher.stop().await.unwrap();
        let held = engine
            .account_balance(&Account::Suspense(SuspenseReason::Overpaid), Currency::Crypto(Method::Sol))
            .await
            .unwrap();
        assert_eq!(held, 0);
        sound(&engine).await;
    }
}
