//! The hand-off to the merchant's wallet on the Litecoin regtest node, both sources and both
//! databases: 30 payments spread over 500 handed-out addresses, the descriptors payrecon
//! exports imported into a watch-only wallet of the node (`importmulti`, rescanned), and the node wallet's balance equal to payrecon's holdings to the litoshi.

use crate::common;

use common::checks::{order, wait_status};
use common::regtest::{Chain, MerchantKey, Source, fresh_merchant_key, ltc_engine};
use common::topup;
use payrecon::config::UtxoConfig;
use payrecon::ledger::{Account, Currency};
use payrecon::test_utils::clock::Clock;
use payrecon::{HoldingsSort, IntentStatus, PaymentIntent};
use payrecon_chain_core::{Amount, Method, Network};
use serde_json::json;

/// Handed out, and of them paid: every 13th from index 0, then the last, 135 past the one
/// before (a run of 134 unpaid addresses a default wallet never crosses).
const HANDED_OUT: u32 = 500;

fn paid_indexes() -> Vec<u32> {
    (0..29).map(|k| k * 13).chain([HANDED_OUT - 1]).collect()
}

on_both_databases_and_sources! {
    async fn the_node_wallet_imports_the_descriptors_and_holds_what_payrecon_holds(db, source) {
        let chain = Chain::lock().await;
        let key = fresh_merchant_key();
        let (engine, clock) = ltc_engine(&db, &chain, 1, &key.account_xpub, |c| {
            c.networks.litecoin = Some(UtxoConfig {
                key_origin: Some(key.origin.clone()),
                ..source.config(&key.account_xpub, &chain, 1)
            });
        })
        .await;
        let mut intents: Vec<PaymentIntent> = Vec::new();
        for n in 0..HANDED_OUT {
            let reference = format!("T-{n}");
            engine.create_topup(&topup(&reference, "42", "100")).await.unwrap();
            intents.push(engine.create_payment(&order(&reference), Method::Ltc).await.unwrap().intent);
        }
        intents.sort_by_key(|intent| intent.derivation_index);
        let paid: Vec<&PaymentIntent> = paid_indexes().iter().map(|i| &intents[*i as usize]).collect();
        let watcher = source.watch(&engine, &chain);
        let outputs: Vec<(&str, &str)> = paid.iter().map(|intent| (intent.pay_to.as_str(), "1")).collect();
        let funding_txid = chain.send_many(&outputs).await;
        let funding_block = chain.block_hash(chain.mine(1).await).await;
        for intent in &paid {
            wait_status(&engine, &intent.id, IntentStatus::Settled).await;
        }

        let export = engine.wallet_export(Network::Litecoin).await.unwrap();
        assert_eq!(export.highest_index, Some(HANDED_OUT - 1));
        assert_eq!((export.addresses_handed_out, export.funded_addresses), (500, 30));
        assert_eq!((export.largest_unfunded_run, export.gap_limit_needed), (134, 135));
        assert_eq!(export.key_origin.as_deref(), Some(key.origin.as_str()));
        assert!(export.receive_descriptor.starts_with(&format!("wpkh({}", key.origin.replace('h', "'"))), "{}", export.receive_descriptor);
        let stuck = engine.stuck(&Default::default()).await.unwrap();
        assert!(stuck.iter().any(|item| item.category == "wallet" && item.subject == "litecoin"), "{stuck:?}");

        let holdings = engine.holdings(Some(Network::Litecoin), HoldingsSort::Index, false, 0, 100).await.unwrap();
        assert_eq!(holdings.address_count, 30);
        assert_eq!(holdings.totals[0].amount, "3000000000");
        let first = &holdings.addresses[0];
        assert_eq!(first.derivation_path.as_deref(), Some(format!("{}/0/0", key.origin).as_str()));

        // Litecoin Core computes the same checksums and imports both branches.
        for descriptor in [&export.receive_descriptor, &export.change_descriptor] {
            let (body, checksum) = descriptor.split_once('#').unwrap();
            let info = chain.call(false, "getdescriptorinfo", json!([body])).await;
            assert_eq!(info["checksum"], json!(checksum), "{info}");
        }
        let held = chain.watch_only_holds(&export).await;
        assert_eq!(held.to_string(), holdings.totals[0].amount);

        // The merchant sweeps five of the payments with the seed's keys, 10,000 litoshi of fee.
        let to_sweep: Vec<&str> = paid[..5].iter().map(|intent| intent.pay_to.as_str()).collect();
        let swept = outpoints_paying(&chain, &funding_txid, &funding_block, &to_sweep).await;
        let fee = 10_000u64;
        let elsewhere = chain.wallet_address().await;
        let sweep_txid = sweep_with_seed(&chain, &key, &swept, &elsewhere, 5 * 100_000_000 - fee).await;
        let sweep_height = chain.mine(1).await;
        let expected = (30 - 5) * 100_000_000u64;
        common::regtest::eventually("the sweep to be recorded", || async {
            held_litoshi(&engine).await == expected
        }).await;
        let fees = engine.account_balance(&Account::NetworkFees(Method::Ltc), Currency::Crypto(Method::Ltc)).await.unwrap();
        assert_eq!(fees, i128::from(fee), "the fee of {sweep_txid}");
        let sent_out = engine.account_balance(&Account::External(Method::Ltc), Currency::Crypto(Method::Ltc)).await.unwrap();
        assert_eq!(sent_out, i128::from(5 * 100_000_000 - fee));
        assert_eq!(chain.watch_only_holds(&export).await, expected);

        // A reorg takes the sweep's block away: the holdings are restored and the booking
        // reversed.
        // The sweep returns to the mempool; a fee delta keeps it out of the longer branch.
        chain.invalidate(sweep_height).await;
        chain.call(false, "prioritisetransaction", json!([sweep_txid, 0, -100_000_000])).await;
        chain.mine(2).await;
        common::regtest::eventually("the sweep to be taken back", || async {
            held_litoshi(&engine).await == 30 * 100_000_000
        }).await;
        let fees = engine.account_balance(&Account::NetworkFees(Method::Ltc), Currency::Crypto(Method::Ltc)).await.unwrap();
        assert_eq!(fees, 0);
        assert!(engine.trial_balance().await.unwrap().is_sound());
        chain.call(false, "prioritisetransaction", json!([sweep_txid, 0, 100_000_000])).await;
        chain.mine(1).await;
        common::regtest::eventually("the sweep to be mined again", || async {
            held_litoshi(&engine).await == expected
        }).await;

        // The month's roll-forward closes; then a payment arrives while payrecon is not
        // running, and the check against the chain names it.
        let month = engine.period_of(clock.now());
        let rollforward = engine.holdings_rollforward(month).await.unwrap();
        assert!(rollforward.closes, "{rollforward:?}");
        watcher.stop().await.unwrap();
        let planted = &paid[7].pay_to;
        chain.send(planted, "0.5").await;
        chain.mine(1).await;
        let config = common::payments::config(|c| c.networks.litecoin = Some(source.config(&key.account_xpub, &chain, 1)));
        let verification = engine.verify_holdings(&config, month).await.unwrap();
        let litecoin = verification.iter().find(|v| v.network == "litecoin").unwrap();
        match source {
            Source::Electrum => {
                assert_eq!(litecoin.addresses_checked, 30);
                assert_eq!(litecoin.block.as_ref().map(|b| b.height), Some(chain.height().await));
                assert_eq!(litecoin.differences.len(), 1, "{litecoin:?}");
                let difference = &litecoin.differences[0];
                assert_eq!((&difference.address, difference.payrecon.as_str(), difference.chain.as_str()), (planted, "100000000", "150000000"));
            }
            Source::Node => assert!(litecoin.unchecked.is_some(), "{litecoin:?}"),
        }
    }

    async fn a_sweep_that_a_reorg_moves_to_another_block_is_found_there(db, source) {
        let chain = Chain::lock().await;
        let key = fresh_merchant_key();
        let (engine, _clock) = ltc_engine(&db, &chain, 2, &key.account_xpub, |c| {
            c.networks.litecoin = Some(source.config(&key.account_xpub, &chain, 2));
        })
        .await;
        let mut paid = Vec::new();
        for n in 0..3 {
            let reference = format!("M-{n}");
            engine.create_topup(&topup(&reference, "43", "100")).await.unwrap();
            paid.push(engine.create_payment(&order(&reference), Method::Ltc).await.unwrap().intent);
        }
        let watcher = source.watch(&engine, &chain);
        let outputs: Vec<(&str, &str)> = paid.iter().map(|intent| (intent.pay_to.as_str(), "1")).collect();
        let funding_txid = chain.send_many(&outputs).await;
        let funding_block = chain.block_hash(chain.mine(1).await).await;
        chain.mine(1).await;
        for intent in &paid {
            wait_status(&engine, &intent.id, IntentStatus::Settled).await;
        }

        // Two of the payments are swept; the sweep is seen one block deep, short of the two
        // that book it.
        let to_sweep: Vec<&str> = paid[..2].iter().map(|intent| intent.pay_to.as_str()).collect();
        let swept = outpoints_paying(&chain, &funding_txid, &funding_block, &to_sweep).await;
        let fee = 10_000u64;
        let sweep_txid = sweep_with_seed(&chain, &key, &swept, &chain.wallet_address().await, 2 * 100_000_000 - fee).await;
        let sweep_height = chain.mine(1).await;
        chain.wait_synced(&engine, Network::Litecoin).await;
        assert_eq!(held_litoshi(&engine).await, 100_000_000);
        let fees = || async { engine.account_balance(&Account::NetworkFees(Method::Ltc), Currency::Crypto(Method::Ltc)).await.unwrap() };
        assert_eq!(fees().await, 0, "one block deep is not booked");

        // A reorg replaces the sweep's block with an empty one and mines the sweep in the next:
        // the spent outputs are looked up there, and the sweep is found rather than taken for
        // gone, so the two payments never count as held again.
        chain.invalidate(sweep_height).await;
        chain.call(false, "prioritisetransaction", json!([sweep_txid, 0, -100_000_000])).await;
        chain.mine(1).await;
        chain.call(false, "prioritisetransaction", json!([sweep_txid, 0, 100_000_000])).await;
        let moved_to = chain.mine(1).await;
        let moved_block = chain.block_hash(moved_to).await;
        let moved = chain.call(false, "getrawtransaction", json!([sweep_txid, true, moved_block])).await;
        assert_eq!(moved["blockhash"], json!(moved_block), "{moved}");
        chain.wait_synced(&engine, Network::Litecoin).await;
        assert_eq!(held_litoshi(&engine).await, 100_000_000, "the moved sweep is still seen");
        chain.mine(1).await;
        common::regtest::eventually("the moved sweep to be booked", || async { fees().await == i128::from(fee) }).await;
        let sent_out = engine.account_balance(&Account::External(Method::Ltc), Currency::Crypto(Method::Ltc)).await.unwrap();
        assert_eq!(sent_out, i128::from(2 * 100_000_000 - fee));
        assert_eq!(held_litoshi(&engine).await, 100_000_000);
        watcher.stop().await.unwrap();
        assert!(engine.trial_balance().await.unwrap().is_sound());
    }
}

/// The outputs of `txid` (mined in `block`) that pay each of `addresses`, in their order.
async fn outpoints_paying(
    chain: &Chain,
    txid: &str,
    block: &str,
    addresses: &[&str],
) -> Vec<(String, u64)> {
    let tx = chain
        .call(false, "getrawtransaction", json!([txid, true, block]))
        .await;
    addresses
        .iter()
        .map(|address| {
            let output = tx["vout"]
                .as_array()
                .unwrap()
                .iter()
                .find(|o| {
                    o["scriptPubKey"]["addresses"][0] == json!(address)
                        || o["scriptPubKey"]["address"] == json!(address)
                })
                .unwrap_or_else(|| panic!("an output of {txid} pays {address}"));
            (txid.to_owned(), output["n"].as_u64().unwrap())
        })
        .collect()
}

async fn held_litoshi(engine: &payrecon::Engine) -> u64 {
    let view = engine
        .holdings(Some(Network::Litecoin), HoldingsSort::Address, false, 0, 1)
        .await
        .unwrap();
    view.totals.first().map_or(0, |t| t.amount.parse().unwrap())
}

/// Signs with the seed's private keys, as the merchant's wallet would: a wallet of the node
/// given the account's private descriptor spends exactly `inputs` to `to`.
async fn sweep_with_seed(
    chain: &Chain,
    key: &MerchantKey,
    inputs: &[(String, u64)],
    to: &str,
    litoshi: u64,
) -> String {
    let wallet = chain.seed_wallet(key, [0, HANDED_OUT]).await;
    let inputs: Vec<_> = inputs
        .iter()
        .map(|(txid, vout)| json!({"txid": txid, "vout": vout}))
        .collect();
    let amount = Amount::from_base_units(u128::from(litoshi)).to_decimal_string(8);
    let raw = chain
        .call(
            false,
            "createrawtransaction",
            json!([inputs, [{to: amount}]]),
        )
        .await;
    let signed = chain
        .call_wallet(&wallet, "signrawtransactionwithwallet", json!([raw]))
        .await;
    assert_eq!(signed["complete"], json!(true), "{signed}");
    let txid = chain
        .call(false, "sendrawtransaction", json!([signed["hex"]]))
        .await;
    chain.call(false, "unloadwallet", json!([wallet])).await;
    txid.as_str().unwrap().to_owned()
}
