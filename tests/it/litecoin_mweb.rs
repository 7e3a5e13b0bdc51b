//! Litecoin as mainnet runs it, on the regtest node with MWEB active (scripts/devnet.sh activates
//! it on every chain) through both sources and on both databases: a customer paying from an
//! MWEB balance (a peg-out, an output of the block's HogEx transaction), the MWEB transaction
//! waiting in the mempool while the watcher reads it, a reorg that mines the peg-out again
//! under another HogEx, a sweep into MWEB (a peg-in), and a transaction nobody can read.

use crate::common;

use common::checks::{cents, order, sound, status, wait_status};
use common::faults::RewriteProxy;
use common::regtest::{
    Chain, MerchantKey, Running, eventually, fast, fresh_account_xpub, fresh_merchant_key,
    litecoin_regtest, ltc_engine,
};
use common::topup;
use payrecon::config::UtxoConfig;
use payrecon::test_utils::watcher::WatcherState;
use payrecon::{Engine, HoldingsSort, IntentStatus};
use payrecon_chain_bitcoin::{ElectrumScanner, ElectrumSettings};
use payrecon_chain_core::{Amount, Method, Network};
use serde_json::json;

/// Litecoin Core holds a peg-out immature until it is this deep (its wallet reports it
/// `immature` before): the depth payrecon's Litecoin payments need by default.
const PEGOUT_MATURITY: u32 = 6;

on_both_databases_and_sources! {
    async fn a_top_up_paid_from_an_mweb_balance_settles_and_so_does_the_next(db, source) {
        // Payments need 2 confirmations here; a peg-out waits for its maturity.
        let chain = Chain::lock().await;
        let (engine, _clock) = ltc_engine(&db, &chain, 2, &fresh_account_xpub(), |_| {}).await;
        engine.create_topup(&topup("MWEB1", "61", "100")).await.unwrap();
        engine.create_topup(&topup("PLAIN1", "62", "100")).await.unwrap();
        let private = engine.create_payment(&order("MWEB1"), Method::Ltc).await.unwrap();
        let plain = engine.create_payment(&order("PLAIN1"), Method::Ltc).await.unwrap();
        let watcher = source.watch(&engine, &chain);
        chain.wait_synced(&engine, Network::Litecoin).await;

        let mweb_txid = chain.send_from_mweb(&private.intent.pay_to, "1").await;
        // Rounds pass while the MWEB transaction waits in the mempool: the full node's P2P push
        // announces it and its JSON lists outputs without a value; no history lists it.
        watcher.next_round().await;
        watcher.next_round().await;
        let mempool = chain.call(false, "getrawmempool", json!([])).await;
        assert!(mempool.as_array().unwrap().contains(&json!(mweb_txid)), "{mempool}");
        assert_eq!(watcher.status.borrow().state, WatcherState::Running);
        assert_eq!(status(&engine, &private.intent.id).await, IntentStatus::AwaitingPayment, "a peg-out shows in its block");

        let height = chain.mine(1).await;
        wait_status(&engine, &private.intent.id, IntentStatus::Seen).await;
        let block = chain.call(false, "getblock", json!([chain.block_hash(height).await, 1])).await;
        let hogex = block["tx"].as_array().unwrap().last().unwrap().as_str().unwrap().to_owned();
        let transfers = engine.transfers_for(&order("MWEB1")).await.unwrap();
        assert_eq!(transfers.len(), 1);
        assert_eq!(transfers[0].id.txid, hogex, "the receipt is the HogEx's output");
        assert_eq!(transfers[0].amount, Amount::from(100_000_000u64));

        chain.mine(u64::from(PEGOUT_MATURITY) - 2).await;
        chain.wait_synced(&engine, Network::Litecoin).await;
        assert_eq!(status(&engine, &private.intent.id).await, IntentStatus::Seen, "immature at 5 blocks");
        assert_eq!(engine.transfers_for(&order("MWEB1")).await.unwrap()[0].confirmations, 0);
        chain.mine(1).await;
        wait_status(&engine, &private.intent.id, IntentStatus::Settled).await;
        chain.send(&plain.intent.pay_to, "1").await;
        chain.mine(2).await;
        wait_status(&engine, &plain.intent.id, IntentStatus::Settled).await;
        assert_eq!((cents(&engine, "61").await, cents(&engine, "62").await), (10_000, 10_000));
        assert_eq!(watcher.status.borrow().state, WatcherState::Running);
        assert!(engine.exceptions(None).await.unwrap().is_empty());
        sound(&engine).await;
        watcher.stop().await.unwrap();
    }

    async fn a_reorg_that_mines_the_peg_out_under_another_hogex_books_it_once(db, source) {
        let chain = Chain::lock().await;
        let (engine, _clock) = ltc_engine(&db, &chain, PEGOUT_MATURITY, &fresh_account_xpub(), |_| {}).await;
        engine.create_topup(&topup("MWEB2", "63", "100")).await.unwrap();
        let pay = engine.create_payment(&order("MWEB2"), Method::Ltc).await.unwrap();
        // A wallet of the node with one ordinary coin, to peg in while the block is gone.
        let pegger = format!("pegger-{}", uuid::Uuid::new_v4().simple());
        chain.call(false, "createwallet", json!([pegger])).await;
        let coin = chain.call_wallet(&pegger, "getnewaddress", json!(["", "bech32"])).await;
        chain.send(coin.as_str().unwrap(), "2").await;
        chain.mine(1).await;
        let watcher = source.watch(&engine, &chain);
        chain.send_from_mweb(&pay.intent.pay_to, "1").await;
        let height = chain.mine(1).await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Seen).await;
        let first = engine.transfers_for(&order("MWEB2")).await.unwrap()[0].id.clone();

        // The block is taken away; the peg-out waits in the mempool again, and a peg-in joins
        // it, so the next miner's HogEx is another transaction (another input, another MWEB
        // header in its first output).
        chain.invalidate(height).await;
        let mweb = chain.mweb_address().await;
        chain.call_wallet(&pegger, "sendtoaddress", json!([mweb, "2", "", "", true])).await;
        chain.call(false, "unloadwallet", json!([pegger])).await;
        // Two blocks: ElectrumX notices a new tip by its height.
        chain.mine(2).await;
        eventually("the peg-out to be seen under its new HogEx", || async {
            let transfers = engine.transfers_for(&order("MWEB2")).await.unwrap();
            transfers.iter().any(|t| t.id.txid != first.txid && !t.removed)
                && transfers.iter().all(|t| t.id.txid != first.txid || t.removed)
        })
        .await;
        chain.mine(u64::from(PEGOUT_MATURITY) - 2).await;
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        chain.wait_synced(&engine, Network::Litecoin).await;
        assert_eq!(cents(&engine, "63").await, 10_000, "credited once");
        let live: Vec<_> = engine.transfers_for(&order("MWEB2")).await.unwrap().into_iter().filter(|t| !t.removed).collect();
        assert_eq!(live.len(), 1, "{live:?}");
        assert_eq!(engine.trial_balance().await.unwrap().entries, 1, "one settlement");
        assert!(engine.exceptions(None).await.unwrap().is_empty());
        sound(&engine).await;
        watcher.stop().await.unwrap();
    }

    async fn a_sweep_into_mweb_is_an_outflow_and_holdings_equal_the_node_wallet(db, source) {
        let chain = Chain::lock().await;
        let key = fresh_merchant_key();
        let (engine, _clock) = ltc_engine(&db, &chain, PEGOUT_MATURITY, &key.account_xpub, |c| {
            c.networks.litecoin = Some(UtxoConfig {
                key_origin: Some(key.origin.clone()),
                ..source.config(&key.account_xpub, &chain, PEGOUT_MATURITY)
            });
        })
        .await;
        let mut paid = Vec::new();
        for (n, reference) in ["SWEPT", "KEPT"].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("6{}", 4 + n), "100")).await.unwrap();
            paid.push(engine.create_payment(&order(reference), Method::Ltc).await.unwrap().intent);
        }
        let watcher = source.watch(&engine, &chain);
        chain.send(&paid[0].pay_to, "1").await;
        chain.send(&paid[1].pay_to, "1").await;
        chain.mine(u64::from(PEGOUT_MATURITY)).await;
        for intent in &paid {
            wait_status(&engine, &intent.id, IntentStatus::Settled).await;
        }

        // The merchant moves one payment into its MWEB balance with the seed's key.
        let sweep = sweep_into_mweb(&chain, &key, paid[0].derivation_index, &chain.mweb_address().await).await;
        chain.mine(u64::from(PEGOUT_MATURITY)).await;
        eventually("the sweep into MWEB to be booked", || async {
            held_litoshi(&engine).await == 100_000_000
        })
        .await;
        let outflows = engine.holdings(Some(Network::Litecoin), HoldingsSort::Index, false, 0, 10).await.unwrap();
        assert_eq!(outflows.address_count, 1, "{outflows:?}");
        assert_eq!(outflows.addresses[0].address, paid[1].pay_to);
        assert_eq!(watcher.status.borrow().state, WatcherState::Running);
        let export = engine.wallet_export(Network::Litecoin).await.unwrap();
        assert_eq!(chain.watch_only_holds(&export).await, 100_000_000, "sweep {sweep}");
        sound(&engine).await;
        watcher.stop().await.unwrap();
    }
}

on_both_databases! {
    async fn an_unreadable_transaction_is_quarantined_and_the_watcher_goes_on(db) {
        // ElectrumX answers a transaction to a watched address in a form no decoder reads: it is
        // quarantined as an exception naming the network, the transaction and the address; the
        // payment beside it in the same block and one in a later block settle; the watcher is
        // never stopped.
        let chain = Chain::lock().await;
        let (engine, _clock) = ltc_engine(&db, &chain, 1, &fresh_account_xpub(), |_| {}).await;
        let mut pays = Vec::new();
        for (n, reference) in ["BROKEN", "BESIDE", "LATER"].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("7{n}"), "100")).await.unwrap();
            pays.push(engine.create_payment(&order(reference), Method::Ltc).await.unwrap().intent);
        }
        let proxy = RewriteProxy::start(chain.electrum_url.trim_start_matches("tcp://")).await;
        let broken = chain.send(&pays[0].pay_to, "1").await;
        let raw = chain.call(false, "getrawtransaction", json!([broken, false])).await;
        let raw = raw.as_str().unwrap();
        // Flags 0x0a: neither segwit's nor MWEB's.
        proxy.replace(raw, &format!("{}000a{}", &raw[..8], &raw[12..]));
        let watcher = Running::spawn(&engine, ElectrumScanner::new(ElectrumSettings::new(proxy.url(), litecoin_regtest())), fast());
        chain.send(&pays[1].pay_to, "1").await;
        chain.mine(1).await;
        wait_status(&engine, &pays[1].id, IntentStatus::Settled).await;
        chain.send(&pays[2].pay_to, "1").await;
        chain.mine(1).await;
        wait_status(&engine, &pays[2].id, IntentStatus::Settled).await;
        assert_eq!(watcher.status.borrow().state, WatcherState::Running);
        assert_eq!(status(&engine, &pays[0].id).await, IntentStatus::AwaitingPayment);

        let exceptions = engine.exceptions(None).await.unwrap();
        assert_eq!(exceptions.len(), 1, "{exceptions:?}");
        assert_eq!(exceptions[0].id, format!("unreadable_transaction:litecoin:{broken}"));
        let detail = &exceptions[0].detail;
        assert!(detail.contains(&pays[0].pay_to) && detail.contains("unknown transaction flags 0x0a"), "{detail}");
        let stuck = engine.stuck(&Default::default()).await.unwrap();
        assert!(stuck.iter().any(|item| item.kind == "unreadable_transaction"), "{stuck:?}");
        sound(&engine).await;
        watcher.stop().await.unwrap();
    }
}

/// Moves the payment at `index` of the merchant's key into the MWEB address `to` with the
/// seed's key, as the merchant's wallet would: its whole balance, a peg-in.
async fn sweep_into_mweb(chain: &Chain, key: &MerchantKey, index: u32, to: &str) -> String {
    let wallet = chain.seed_wallet(key, [index, index]).await;
    let balance = chain.call_wallet(&wallet, "getbalance", json!([])).await;
    let txid = chain
        .call_wallet(&wallet, "sendtoaddress", json!([to, balance, "", "", true]))
        .await;
    chain.call(false, "unloadwallet", json!([wallet])).await;
    txid.as_str().unwrap().to_owned()
}

async fn held_litoshi(engine: &Engine) -> u64 {
    let view = engine
        .holdings(Some(Network::Litecoin), HoldingsSort::Address, false, 0, 1)
        .await
        .unwrap();
    view.totals.first().map_or(0, |t| t.amount.parse().unwrap())
}
