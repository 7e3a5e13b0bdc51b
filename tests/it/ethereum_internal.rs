//! Every coin that arrives on Ethereum is found, however it came, against a real anvil node on
//! SQLite and PostgreSQL: ETH paid inside a contract's call (a smart-contract wallet, an
//! exchange's batch), calls that send and revert, a reorg of an internal payment, a sweep
//! through a contract, and a node whose log queries answer `[]` for blocks it serves.

use crate::common;

use std::sync::atomic::Ordering;

use common::anvil::{
    Anvil, RpcProxy, SeedKeys, eth_config, eth_engine, eth_engine_of, ethereum,
    fresh_ethereum_xpub, paying_wallet_call, scanner_settings, signed_transfer, watch_ethereum,
    watch_ethereum_with,
};
use common::checks::{cents, kinds, order, sound, status, wait_status};
use common::outflows::held_per_asset;
use common::regtest::{eventually, fast};
use common::topup;
use payrecon::IntentStatus;
use payrecon::test_utils::clock::Clock;
use payrecon::test_utils::watcher::WatcherState;
use payrecon_chain_core::{Method, Network, TransferId};

/// 0.05 ETH, what a 100 USD top-up costs at 2000 USD per ETH.
const TOPUP_WEI: u128 = 50_000_000_000_000_000;

on_both_databases! {
    async fn eth_paid_inside_calls_settles_and_calls_that_revert_credit_nothing(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let wallet = anvil.paying_wallet().await;
        let (engine, _clock) = eth_engine(&db, &anvil, &tokens, &fresh_ethereum_xpub(), 2).await;
        let mut pays = Vec::new();
        for (i, reference) in ["FORWARDED", "BATCH-A", "BATCH-B", "REVERTED", "UNDONE"].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("8{i}"), "100")).await.unwrap();
            pays.push(engine.create_payment(&order(reference), Method::Eth).await.unwrap().intent);
        }
        let watcher = watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);
        // A contract wallet forwards the exact amount; an exchange's batch pays two intents in
        // one transaction; a call pays and then reverts; a payment's parent call reverts while
        // its transaction succeeds.
        anvil.pay_through(&wallet, &[(&pays[0].pay_to, TOPUP_WEI)]).await;
        anvil.pay_through(&wallet, &[(&pays[1].pay_to, TOPUP_WEI), (&pays[2].pay_to, TOPUP_WEI)]).await;
        let reverted = anvil.pay_and_undo(&wallet, "payThenRevert", &pays[3].pay_to, TOPUP_WEI).await;
        anvil.pay_and_undo(&wallet, "payInRevertedCall", &pays[4].pay_to, TOPUP_WEI).await;
        anvil.mine(2).await;
        assert_eq!(anvil.receipt(&reverted).await["status"], serde_json::json!("0x0"));
        for pay in &pays[..3] {
            wait_status(&engine, &pay.id, IntentStatus::Settled).await;
        }
        anvil.wait_synced(&engine).await;
        assert_eq!((cents(&engine, "80").await, cents(&engine, "81").await, cents(&engine, "82").await), (10_000, 10_000, 10_000));
        for pay in &pays[3..] {
            assert_eq!(status(&engine, &pay.id).await, IntentStatus::AwaitingPayment);
            assert_eq!(anvil.balance(&pay.pay_to).await, 0, "nothing reached {}", pay.pay_to);
        }
        assert!(engine.exceptions(None).await.unwrap().is_empty());
        // Both batch payments are receipts of one transaction, each at its own position.
        let a = &engine.transfers_for(&order("BATCH-A")).await.unwrap()[0];
        let b = &engine.transfers_for(&order("BATCH-B")).await.unwrap()[0];
        assert_eq!(a.id.txid, b.id.txid);
        assert!(a.id.is_internal() && b.id.is_internal() && a.id.position != b.id.position);
        assert_eq!(a.id.position, TransferId::INTERNAL_POSITIONS);
        assert_eq!(a.from_address.as_deref().map(str::to_lowercase), Some(wallet.to_lowercase()));
        // What payrecon holds is what the chain holds at those addresses.
        let mut on_chain = 0;
        for pay in &pays {
            on_chain += anvil.balance(&pay.pay_to).await;
        }
        assert_eq!(held_per_asset(&engine, Network::Ethereum).await, [("eth".into(), on_chain)]);
        assert_eq!(on_chain, 3 * TOPUP_WEI);

        // More rounds find nothing new: each receipt is recorded once.
        anvil.mine(1).await;
        anvil.wait_synced(&engine).await;
        assert_eq!(engine.transfers_for(&order("BATCH-A")).await.unwrap().len(), 1);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn a_reorg_of_an_internal_payment_takes_its_credit_back(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let wallet = anvil.paying_wallet().await;
        let (engine, _clock) = eth_engine(&db, &anvil, &tokens, &fresh_ethereum_xpub(), 2).await;
        engine.create_topup(&topup("INSIDE", "90", "100")).await.unwrap();
        let pay = engine.create_payment(&order("INSIDE"), Method::Eth).await.unwrap().intent;
        let watcher = watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);
        anvil.pay_through(&wallet, &[(&pay.pay_to, TOPUP_WEI)]).await;
        anvil.mine(2).await;
        wait_status(&engine, &pay.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "90").await, 10_000);

        anvil.reorg(3).await;
        anvil.wait_synced(&engine).await;
        anvil.mine(1).await;
        wait_status(&engine, &pay.id, IntentStatus::ReorgedAfterCredit).await;
        anvil.wait_synced(&engine).await;
        assert_eq!(kinds(&engine, "INSIDE").await, ["reorged_after_credit"]);
        assert_eq!(cents(&engine, "90").await, 0);
        assert!(engine.transfers_for(&order("INSIDE")).await.unwrap().iter().all(|t| t.removed));
        assert!(held_per_asset(&engine, Network::Ethereum).await.iter().all(|(_, held)| *held == 0));
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn a_sweep_through_a_contract_is_an_outflow(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let wallet = anvil.paying_wallet().await;
        let keys = SeedKeys::fresh();
        let mut section = ethereum(&anvil, &tokens, &keys.account_xpub(), 1);
        section.treasury_addresses = vec![anvil.other.clone()];
        let (engine, _clock) = eth_engine_of(&db, eth_config(section)).await;
        engine.create_topup(&topup("SWEPT", "91", "100")).await.unwrap();
        let pay = engine.create_payment(&order("SWEPT"), Method::Eth).await.unwrap().intent;
        let watcher = watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);
        anvil.send_eth(&pay.pay_to, TOPUP_WEI).await;
        anvil.mine(1).await;
        wait_status(&engine, &pay.id, IntentStatus::Settled).await;

        // The merchant's wallet sweeps the address through a batching contract, which pays
        // the treasury in an internal call.
        let gas_price = u128::from_str_radix(anvil.call("eth_gasPrice", serde_json::json!([])).await.as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
        let gas = 100_000u64;
        let swept = TOPUP_WEI - gas_price * u128::from(gas);
        let call = paying_wallet_call(&[(&anvil.other, swept)]);
        let signer = keys.signer("m/44h/60h/0h/0/0");
        assert_eq!(signer.address().to_checksum(None), pay.pay_to);
        let sweep = signed_transfer(&signer, 0, gas_price, gas, &wallet, swept, call);
        anvil.send_raw(&sweep).await;
        anvil.mine(1).await;
        anvil.wait_synced(&engine).await;
        let left = anvil.balance(&pay.pay_to).await;
        eventually("the sweep booked", || async {
            held_per_asset(&engine, Network::Ethereum).await == [("eth".to_owned(), left)]
        }).await;
        assert!(engine.exceptions(None).await.unwrap().is_empty(), "the internal payment to the treasury is not ours to receive");
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn logs_answered_empty_for_blocks_the_node_serves_never_move_the_cursor_past_a_payment(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let (engine, _clock) = eth_engine(&db, &anvil, &tokens, &fresh_ethereum_xpub(), 1).await;
        engine.create_topup(&topup("LAGGING", "92", "100")).await.unwrap();
        let pay = engine.create_payment(&order("LAGGING"), Method::UsdtErc20).await.unwrap().intent;
        let proxy = RpcProxy::start(&anvil.url, 10_000, 0).await;
        let start = anvil.head().await;
        let watcher = watch_ethereum_with(&engine, scanner_settings(&proxy.url, &tokens, start), fast());
        anvil.wait_synced(&engine).await;

        // A backend behind the provider's balancer lags: its logs and receipts are empty for
        // the blocks it serves, while the payment is mined and more blocks come.
        proxy.empty_logs.store(true, Ordering::SeqCst);
        anvil.send_token(&tokens.usdt, &pay.pay_to, 100_000_000).await;
        anvil.mine(1).await;
        let paid_in = anvil.head().await;
        anvil.mine(3).await;
        eventually("the watcher to refuse the incomplete answer", || async {
            matches!(&watcher.status.borrow().state, WatcherState::Retrying { error, .. } if error.contains("incompletely"))
        }).await;
        let cursor = engine.watcher_cursor(Network::Ethereum).await.unwrap().unwrap();
        assert!(cursor.tip.height < paid_in, "the cursor waits before block {paid_in}: {}", cursor.tip.height);
        assert_eq!(status(&engine, &pay.id).await, IntentStatus::AwaitingPayment);

        // The provider answers honestly again: the payment is found where it was.
        proxy.empty_logs.store(false, Ordering::SeqCst);
        wait_status(&engine, &pay.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "92").await, 10_000);
        anvil.wait_synced(&engine).await;
        let incomplete = watcher.status.borrow().incomplete_answers;
        assert!(incomplete > 0, "watcher health counts the incomplete answers");
        let metrics = payrecon::test_utils::api::metrics_text(&engine).await.unwrap();
        assert!(metrics.contains("payrecon_source_incomplete_answers_total{network=\"ethereum\"}"), "{metrics}");
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}

on_both_databases! {
    async fn zero_value_transfers_and_dust_change_nothing_anyone_reads(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let (engine, clock) = eth_engine(&db, &anvil, &tokens, &fresh_ethereum_xpub(), 1).await;
        let mut pays = Vec::new();
        for (i, (reference, method)) in [("WAITING", Method::UsdtErc20), ("PAID-USDT", Method::UsdtErc20), ("PAID-ETH", Method::Eth)].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("9{i}"), "100")).await.unwrap();
            pays.push(engine.create_payment(&order(reference), *method).await.unwrap().intent);
        }
        let watcher = watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);
        anvil.send_token(&tokens.usdt, &pays[1].pay_to, 100_000_000).await;
        anvil.send_eth(&pays[2].pay_to, TOPUP_WEI).await;
        anvil.mine(1).await;
        wait_status(&engine, &pays[1].id, IntentStatus::Settled).await;
        wait_status(&engine, &pays[2].id, IntentStatus::Settled).await;
        anvil.wait_synced(&engine).await;
        let events_before = engine.events_after(0, 1000).await.unwrap().len();
        let exceptions_before = engine.exceptions(None).await.unwrap();
        let checkouts = || async {
            let mut pages = Vec::new();
            for pay in &pays {
                pages.push(format!("{:?}", engine.checkout(&pay.checkout_key).await.unwrap()));
            }
            pages
        };
        let pages_before = checkouts().await;

        // A poisoner makes the real USDT log zero-value transfers from a lookalike of the
        // customer's address (transferFrom with an allowance of 0), and sends dust: 1 wei of
        // ETH to an ETH and to a USDT address, a millionth of a USDT after settlement.
        let lookalike = format!("{}{}", &pays[1].pay_to[..8], "0".repeat(34));
        for pay in &pays[..2] {
            let call = format!(
                "23b872dd{:0>64}{:0>64}{:064x}",
                lookalike.trim_start_matches("0x").to_lowercase(),
                pay.pay_to.trim_start_matches("0x").to_lowercase(),
                0
            );
            let tx = serde_json::json!({"from": anvil.other, "to": tokens.usdt, "data": format!("0x{call}"), "gas": "0x30000"});
            anvil.call("eth_sendTransaction", serde_json::json!([tx])).await;
        }
        anvil.send_eth(&pays[2].pay_to, 1).await;
        anvil.send_eth(&pays[0].pay_to, 1).await;
        anvil.send_token(&tokens.usdt, &pays[1].pay_to, 1).await;
        anvil.mine(1).await;
        anvil.wait_synced(&engine).await;
        anvil.mine(1).await;
        anvil.wait_synced(&engine).await;

        assert_eq!(
            [status(&engine, &pays[0].id).await, status(&engine, &pays[1].id).await, status(&engine, &pays[2].id).await],
            [IntentStatus::AwaitingPayment, IntentStatus::Settled, IntentStatus::Settled]
        );
        assert_eq!(checkouts().await, pages_before, "the checkout pages read as before");
        assert!(!pages_before.iter().any(|page| page.to_lowercase().contains(&lookalike.to_lowercase())));
        assert_eq!(engine.events_after(0, 1000).await.unwrap().len(), events_before, "no webhook");
        assert_eq!(engine.exceptions(None).await.unwrap(), exceptions_before, "no exception");
        assert_eq!(watcher.status.borrow().zero_value_ignored, 2);
        for pay in &pays[..2] {
            assert!(engine.transfers_for(&order(if pay.id == pays[0].id { "WAITING" } else { "PAID-USDT" })).await.unwrap().iter().all(|t| t.amount.base_units() > 0), "no zero-value transfer is recorded");
        }
        // The dust is held, part of the holdings, and the month's report sums it in one line.
        assert_eq!(
            held_per_asset(&engine, Network::Ethereum).await,
            [("eth".into(), TOPUP_WEI + 2), ("usdt-erc20".into(), 100_000_001)]
        );
        let query = payrecon::ReportQuery { from: clock.now() - chrono::Duration::hours(1), to: clock.now() + chrono::Duration::hours(1), method: None };
        let mut out = Vec::new();
        engine.write_reconciliation(&query, payrecon::ReportFormat::Json, payrecon::CsvSection::Transfers, &mut out).await.unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let dust = |method: &str| report["summary"].as_array().unwrap().iter().find(|s| s["method"] == method).unwrap()["dust"].clone();
        assert_eq!((dust("eth"), dust("usdt-erc20")), (serde_json::json!("0.000000000000000002"), serde_json::json!("0.000001")));
        let metrics = payrecon::test_utils::api::metrics_text(&engine).await.unwrap();
        assert!(metrics.contains("payrecon_zero_value_transfers_total{network=\"ethereum\"} 2"), "{metrics}");

        // A fake token reaching two addresses is one exception for operators, and one row of
        // the holdings apart from the real assets.
        anvil.send_token(&tokens.fake, &pays[0].pay_to, 5).await;
        anvil.send_token(&tokens.fake, &pays[1].pay_to, 5).await;
        anvil.mine(1).await;
        anvil.wait_synced(&engine).await;
        let opened: Vec<_> = engine.exceptions(None).await.unwrap().into_iter().filter(|e| !exceptions_before.contains(e)).collect();
        assert_eq!(opened.len(), 1, "{opened:?}");
        assert_eq!(opened[0].kind, "unknown_token");
        let holdings = engine.holdings(Some(Network::Ethereum), payrecon::HoldingsSort::Address, false, 0, 10).await.unwrap();
        assert_eq!(holdings.totals.len(), 2, "the fake token is no total beside ETH and USDT");
        assert_eq!(holdings.unknown_tokens.len(), 1);
        assert_eq!(holdings.unknown_tokens[0].addresses, 2);
        assert_eq!(status(&engine, &pays[0].id).await, IntentStatus::AwaitingPayment);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}

on_both_databases! {
    async fn the_holdings_check_finds_eth_no_watcher_saw_and_books_it(db) {
        // ETH reaches an intent's address and an address ahead of the key's counter in a block
        // the watcher never reads (it started after it): the check reads every watched address
        // at the watcher's cursor, books what it found so that holdings equal the chain, and
        // holds it in an exception each for operators.
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let seed = SeedKeys::fresh();
        let section = ethereum(&anvil, &tokens, &seed.account_xpub(), 1);
        let config = eth_config(section);
        let (engine, clock) = eth_engine_of(&db, config.clone()).await;
        engine.create_topup(&topup("UNSEEN", "99", "100")).await.unwrap();
        let pay = engine.create_payment(&order("UNSEEN"), Method::Eth).await.unwrap().intent;
        let ahead_index = pay.derivation_index + 1;
        let ahead = seed.signer(&format!("m/44h/60h/0h/0/{ahead_index}")).address().to_checksum(None);
        anvil.send_eth(&pay.pay_to, TOPUP_WEI).await;
        anvil.send_eth(&ahead, 7).await;
        anvil.mine(1).await;
        let watcher = watch_ethereum(&engine, &anvil, &tokens, anvil.head().await + 1);
        anvil.mine(1).await;
        anvil.wait_synced(&engine).await;
        assert_eq!(status(&engine, &pay.id).await, IntentStatus::AwaitingPayment, "the watcher never read the payment's block");
        assert_eq!(held_per_asset(&engine, Network::Ethereum).await, []);

        let checks = engine.check_holdings(&config).await.unwrap();
        assert_eq!(checks.len(), 1);
        assert_eq!((checks[0].unexplained, checks[0].error.as_deref()), (2, None), "{checks:?}");
        assert!(checks[0].addresses_checked >= 2);
        let found: Vec<_> = engine.exceptions(None).await.unwrap().into_iter().filter(|e| e.kind == "holdings_difference").collect();
        assert_eq!(found.len(), 2, "{found:?}");
        let paid = found.iter().find(|e| e.order_ref.as_deref() == Some("UNSEEN")).unwrap();
        let detail = &paid.detail;
        assert!(detail.contains(&pay.pay_to) && detail.contains("0.05 ETH") && detail.contains(&format!("index {}", pay.derivation_index)) && detail.contains(&pay.key_id), "{detail}");
        let stray = found.iter().find(|e| e.order_ref.is_none()).unwrap();
        assert!(stray.detail.to_lowercase().contains(&ahead.to_lowercase()) && stray.detail.contains(&format!("index {ahead_index} of key {}", pay.key_id)), "{}", stray.detail);
        // Holdings and their roll-forward are the chain's, the books balance.
        assert_eq!(held_per_asset(&engine, Network::Ethereum).await, [("eth".into(), TOPUP_WEI + 7)]);
        let month = engine.period_of(clock.now());
        let rollforward = engine.holdings_rollforward(month).await.unwrap();
        let eth = rollforward.assets.iter().find(|a| a.asset == "eth").unwrap();
        assert_eq!(
            [&eth.received, &eth.found_by_check, &eth.missing_by_check, &eth.closing, &eth.held_at_end].map(|s| s.as_str()),
            ["0", &(TOPUP_WEI + 7).to_string(), "0", &(TOPUP_WEI + 7).to_string(), &(TOPUP_WEI + 7).to_string()]
        );
        assert!(rollforward.closes);
        sound(&engine).await;
        // The next intent's address is past the one found paid ahead of the counter.
        engine.create_topup(&topup("NEXT", "99", "100")).await.unwrap();
        let next = engine.create_payment(&order("NEXT"), Method::Eth).await.unwrap().intent;
        assert!(next.derivation_index > ahead_index, "{} handed out again", next.derivation_index);

        // Run again: what is booked is found no more.
        let again = engine.check_holdings(&config).await.unwrap();
        assert_eq!((again[0].unexplained, again[0].error.as_deref()), (0, None), "{again:?}");
        assert_eq!(engine.exceptions(None).await.unwrap().iter().filter(|e| e.kind == "holdings_difference").count(), 2);
        assert_eq!(held_per_asset(&engine, Network::Ethereum).await, [("eth".into(), TOPUP_WEI + 7)]);
        let stuck = engine.stuck(&payrecon::StuckOptions::default()).await.unwrap();
        assert!(stuck.iter().any(|item| item.subject == paid.id), "{stuck:?}");
        let metrics = payrecon::test_utils::api::metrics_text(&engine).await.unwrap();
        assert!(metrics.contains("payrecon_exceptions_open{kind=\"holdings_difference\"} 2"), "{metrics}");

        // An operator who learns whose it is accepts it as the order's payment; the stray
        // coin cannot be dismissed while it holds money.
        let refused = engine.resolve_exception(&stray.id, &payrecon::Action::Dismiss, "ops", "nobody's").await.unwrap_err();
        assert!(refused.to_string().contains("holds"), "{refused}");
        engine.resolve_exception(&paid.id, &payrecon::Action::AcceptAsPaid, "ops", "the customer's wallet paid through a contract").await.unwrap();
        assert_eq!(cents(&engine, "99").await, 10_000);
        assert_eq!(held_per_asset(&engine, Network::Ethereum).await, [("eth".into(), TOPUP_WEI + 7)]);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}
