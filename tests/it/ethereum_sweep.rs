//! Where the money goes after it arrives on Ethereum, against a real anvil node with real
//! ERC-20 contracts, on SQLite and PostgreSQL: USDT and ETH paid to 20 addresses, the sweep
//! list, a sweep signed with keys derived from the merchant's seed (payrecon never holds them)
//! a week after the intents closed, the outflows and gas booked, the gas top-ups from the
//! treasury booked as the merchant's own money (and those from elsewhere marked so by an
//! operator), a reorg taking a sweep back,
//! the holdings at zero, the month's roll-forward closing, and the check against the chain
//! naming a payment payrecon was not running to see.

use crate::common;

use chrono::Duration;
use common::anvil::{
    Anvil, SeedKeys, eth_config, eth_engine_of, ethereum, scanner_settings, signed_transfer,
    token_transfer_call, watch_ethereum, watch_ethereum_with,
};
use common::checks::{order, sound, wait_status};
use common::outflows::{crypto_balance, fees_booked, held_per_asset};
use common::regtest::{eventually, fast};
use common::topup;
use payrecon::ledger::Account;
use payrecon::test_utils::clock::Clock;
use payrecon::{Action, IntentStatus};
use payrecon_chain_core::{Method, Network};
use payrecon_chain_ethereum::{ETH_TRANSFER_GAS, TOKEN_TRANSFER_GAS};

/// Intents paid, alternately in USDT and ETH.
const PAID: usize = 20;

/// 0.05 ETH and 100 USDT: a 100 USD top-up at 2000 USD per ETH.
const ETH_WEI: u128 = 50_000_000_000_000_000;
const USDT_UNITS: u128 = 100_000_000;

on_both_databases! {
    async fn usdt_and_eth_swept_from_20_addresses_leave_nothing_held_and_the_books_closed(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let keys = SeedKeys::fresh();
        let mut section = ethereum(&anvil, &tokens, &keys.account_xpub(), 2);
        section.treasury_addresses = vec![anvil.other.clone()];
        let config = eth_config(section);
        let (engine, clock) = eth_engine_of(&db, config.clone()).await;
        let mut intents = Vec::new();
        for n in 0..PAID {
            let reference = format!("S-{n}");
            engine.create_topup(&topup(&reference, &format!("7{n}"), "100")).await.unwrap();
            let method = if n % 2 == 0 { Method::UsdtErc20 } else { Method::Eth };
            intents.push((method, engine.create_payment(&order(&reference), method).await.unwrap().intent));
        }
        // Eight addresses per log query: 20 watched take three, so token outflows are read as
        // every USDT and USDC transfer of the range rather than by sender.
        let mut settings = scanner_settings(&anvil.url, &tokens, anvil.head().await);
        settings.addresses_per_log_query = 8;
        let watcher = watch_ethereum_with(&engine, settings, fast());
        for (method, intent) in &intents {
            match method {
                Method::Eth => anvil.send_eth(&intent.pay_to, ETH_WEI).await,
                _ => anvil.send_token(&tokens.usdt, &intent.pay_to, USDT_UNITS).await,
            };
        }
        anvil.mine(2).await;
        for (_, intent) in &intents {
            wait_status(&engine, &intent.id, IntentStatus::Settled).await;
        }
        assert_eq!(held_per_asset(&engine, Network::Ethereum).await, [("eth".into(), 10 * ETH_WEI), ("usdt-erc20".into(), 10 * USDT_UNITS)]);

        // A week and a day later every intent's window has closed; the addresses holding money
        // stay followed.
        clock.advance(Duration::days(8));
        common::checks::tick_once_read(&engine, Network::Ethereum, &*clock).await;
        watcher.next_round().await;
        anvil.next_block_at_least(clock.now().timestamp()).await;

        let list = engine.sweep_list(&config, Network::Ethereum).await.unwrap();
        let gas_price = u128::from_str_radix(anvil.call("eth_gasPrice", serde_json::json!([])).await.as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
        assert_eq!(list.per_token_fee, (u128::from(TOKEN_TRANSFER_GAS) * gas_price).to_string(), "{}", list.fee_basis);
        assert_eq!(list.native_fee, (u128::from(ETH_TRANSFER_GAS) * gas_price).to_string());
        assert_eq!(list.addresses.len(), PAID);
        assert_eq!(list.totals["usdt-erc20"], (10 * USDT_UNITS).to_string());
        assert_eq!(list.top_up_total, (10 * u128::from(TOKEN_TRANSFER_GAS) * gas_price).to_string());
        let csv = list.csv();
        assert_eq!(csv.lines().next(), Some("address,derivation_index,derivation_path,eth,usdt-erc20,usdc-erc20,fee_needed,top_up"));
        assert_eq!(csv.lines().count(), PAID + 1);

        // The sweep, as the merchant's own tool would run it from the list: top up the token
        // addresses (with room to collect what their gas leaves over), sweep every token and
        // the ETH, then collect the leftovers. The treasury sends most top-ups; two come from
        // a wallet payrecon was not told is the merchant's.
        let native_fee = u128::from(ETH_TRANSFER_GAS) * gas_price;
        for (n, row) in list.addresses.iter().filter(|row| row.top_up != "0").enumerate() {
            let top_up: u128 = row.top_up.parse().unwrap();
            let from = if n < 2 { &anvil.funder } else { &anvil.other };
            anvil.send_eth_from(from, &row.address, top_up + native_fee).await;
        }
        anvil.mine(1).await;
        let mut nonces = Vec::new();
        for row in &list.addresses {
            let signer = keys.signer(row.derivation_path.as_deref().unwrap());
            assert_eq!(signer.address().to_checksum(None), row.address, "the list's path derives the address");
            let raw = match row.balances.get("usdt-erc20").map(|a| a.parse::<u128>().unwrap()) {
                Some(units) if units > 0 => signed_transfer(&signer, 0, gas_price, TOKEN_TRANSFER_GAS, &tokens.usdt, 0, token_transfer_call(&anvil.other, units)),
                _ => signed_transfer(&signer, 0, gas_price, ETH_TRANSFER_GAS, &anvil.other, anvil.balance(&row.address).await - native_fee, Vec::new()),
            };
            anvil.send_raw(&raw).await;
            nonces.push(signer);
        }
        anvil.mine(1).await;
        let mut leftovers = Vec::new();
        for (row, signer) in list.addresses.iter().zip(&nonces) {
            let left = anvil.balance(&row.address).await;
            if left > 0 {
                assert!(left > native_fee, "{} keeps {left} wei", row.address);
                leftovers.push(signed_transfer(signer, 1, gas_price, ETH_TRANSFER_GAS, &anvil.other, left - native_fee, Vec::new()));
            }
        }
        assert_eq!(leftovers.len(), PAID / 2);
        for raw in &leftovers {
            anvil.send_raw(raw).await;
        }
        anvil.mine(1).await;
        for row in &list.addresses {
            assert_eq!(anvil.balance(&row.address).await, 0, "{} is empty on the chain", row.address);
        }
        anvil.mine(1).await;
        // The holdings follow every event as it is seen; the books follow once the last sweep
        // is deep enough, which can be a round later: wait for custody to empty in the books.
        eventually("the sweeps to be booked", || async {
            held_per_asset(&engine, Network::Ethereum).await.iter().all(|(_, amount)| *amount == 0)
                && crypto_balance(&engine, Account::Custody(Method::Eth), Method::Eth).await == 0
                && crypto_balance(&engine, Account::Custody(Method::UsdtErc20), Method::UsdtErc20).await == 0
        }).await;

        // The treasury's gas top-ups were booked as its own money when they arrived; the two
        // from elsewhere reached addresses whose intents wanted USDT: wrong-asset exceptions,
        // which an operator marks as the merchant's own money. Then every wei the customers
        // paid went to the treasury or to gas, and every USDT to the treasury.
        let top_ups: Vec<_> = engine.exceptions(None).await.unwrap().into_iter().filter(|e| e.resolution.is_none()).collect();
        assert_eq!(top_ups.len(), 2, "{top_ups:?}");
        for exception in &top_ups {
            assert_eq!(exception.kind, "wrong_asset");
            engine.resolve_exception(&exception.id, &Action::MarkOwnFunds, "ops", "gas top-up for the sweep").await.unwrap();
        }
        let paid_eth = 10 * ETH_WEI;
        let treasury_eth = crypto_balance(&engine, Account::Treasury(Method::Eth), Method::Eth).await;
        let gas = fees_booked(&engine, Method::Eth).await;
        assert_eq!(treasury_eth + gas, paid_eth);
        assert_eq!(crypto_balance(&engine, Account::Treasury(Method::UsdtErc20), Method::UsdtErc20).await, 10 * USDT_UNITS);
        assert_eq!(crypto_balance(&engine, Account::External(Method::Eth), Method::Eth).await, 0);
        assert_eq!(crypto_balance(&engine, Account::Custody(Method::Eth), Method::Eth).await, 0);
        assert_eq!(engine.open_exceptions_by_kind().await.unwrap(), []);
        // Gas: 10 plain transfers, 10 leftover collections and 10 token transfers.
        assert!(gas > 20 * native_fee && gas < 20 * native_fee + 10 * u128::from(TOKEN_TRANSFER_GAS) * gas_price, "{gas}");

        // A reorg takes the leftover collections back: payrecon holds them again and reverses
        // their booking; mined again, they are booked again.
        anvil.reorg(2).await;
        anvil.mine(1).await;
        eventually("the leftover collections to be taken back", || async {
            held_per_asset(&engine, Network::Ethereum).await.iter().find(|(asset, _)| asset == "eth").is_some_and(|(_, amount)| *amount > 0)
        }).await;
        assert!(engine.trial_balance().await.unwrap().is_sound());
        for raw in &leftovers {
            anvil.send_raw(raw).await;
        }
        anvil.mine(2).await;
        eventually("the leftover collections to be booked again", || async {
            held_per_asset(&engine, Network::Ethereum).await.iter().all(|(_, amount)| *amount == 0)
                && crypto_balance(&engine, Account::Treasury(Method::Eth), Method::Eth).await + fees_booked(&engine, Method::Eth).await == paid_eth
        }).await;

        // The month's roll-forward closes at zero for both assets.
        let month = engine.period_of(clock.now());
        let rollforward = engine.holdings_rollforward(month).await.unwrap();
        assert!(rollforward.closes, "{rollforward:?}");
        for asset in rollforward.assets.iter().filter(|a| a.network == "ethereum") {
            assert_eq!(asset.closing, "0", "{asset:?}");
        }

        // With the watcher stopped, 1 ETH arrives at a swept address: the chain check names it.
        watcher.stop().await.unwrap();
        let planted = &list.addresses[0].address;
        anvil.send_eth(planted, 10u128.pow(18)).await;
        anvil.mine(1).await;
        let verification = engine.verify_holdings(&config, month).await.unwrap();
        let ethereum = verification.iter().find(|v| v.network == "ethereum").unwrap();
        assert_eq!(ethereum.unchecked, None);
        assert_eq!(ethereum.addresses_checked, PAID as u64);
        assert_eq!(ethereum.block.as_ref().map(|b| b.height), Some(anvil.head().await));
        assert_eq!(ethereum.differences.len(), 1, "{ethereum:?}");
        let difference = &ethereum.differences[0];
        assert_eq!((&difference.address, difference.asset.as_str(), difference.payrecon.as_str(), difference.chain.as_str()), (planted, "eth", "0", "1000000000000000000"));
        sound(&engine).await;
    }

    async fn what_reaches_a_closed_address_shallow_is_still_followed_to_its_booking(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let keys = SeedKeys::fresh();
        let mut section = ethereum(&anvil, &tokens, &keys.account_xpub(), 2);
        section.treasury_addresses = vec![anvil.other.clone()];
        let (engine, clock) = eth_engine_of(&db, eth_config(section)).await;
        engine.create_topup(&topup("L-1", "91", "100")).await.unwrap();
        let intent = engine.create_payment(&order("L-1"), Method::UsdtErc20).await.unwrap().intent;
        let watcher = watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);
        anvil.send_token(&tokens.usdt, &intent.pay_to, USDT_UNITS).await;
        anvil.mine(2).await;
        wait_status(&engine, &intent.id, IntentStatus::Settled).await;
        clock.advance(Duration::days(8));
        common::checks::tick_once_read(&engine, Network::Ethereum, &*clock).await;
        watcher.next_round().await;
        anvil.next_block_at_least(clock.now().timestamp()).await;

        // The window closed; the address stays followed because it holds USDT. The treasury's
        // gas top-up is seen one block deep, short of the two that book it; payrecon restarts
        // (the watcher reads its view whole again), and the next block must book it.
        let gas_price = 2_000_000_000u128;
        let top_up = u128::from(TOKEN_TRANSFER_GAS + ETH_TRANSFER_GAS) * gas_price;
        anvil.send_eth_from(&anvil.other, &intent.pay_to, top_up).await;
        anvil.mine(1).await;
        anvil.wait_synced(&engine).await;
        assert_eq!(crypto_balance(&engine, Account::Treasury(Method::Eth), Method::Eth).await, 0, "one block deep is not booked");
        watcher.stop().await.unwrap();
        let watcher = watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);
        anvil.mine(1).await;
        eventually("the top-up to be booked at depth", || async {
            crypto_balance(&engine, Account::Treasury(Method::Eth), Method::Eth).await == top_up
        }).await;

        // The sweep empties the address, and its last transfer is seen one block deep: the
        // address holds nothing now but stays followed until that transfer is final. A reorg
        // moves both transfers into one block below: they are found there, not taken for gone.
        let signer = keys.signer("m/44h/60h/0h/0/0");
        let token_sweep = signed_transfer(&signer, 0, gas_price, TOKEN_TRANSFER_GAS, &tokens.usdt, 0, token_transfer_call(&anvil.other, USDT_UNITS));
        anvil.send_raw(&token_sweep).await;
        anvil.mine(1).await;
        let native_fee = u128::from(ETH_TRANSFER_GAS) * gas_price;
        let rest = anvil.balance(&intent.pay_to).await - native_fee;
        let last = signed_transfer(&signer, 1, gas_price, ETH_TRANSFER_GAS, &anvil.other, rest, Vec::new());
        let last_hash = anvil.send_raw(&last).await;
        anvil.mine(1).await;
        anvil.wait_synced(&engine).await;
        assert_eq!(held_per_asset(&engine, Network::Ethereum).await, [("eth".into(), 0), ("usdt-erc20".into(), 0)]);
        let before = anvil.head().await;
        anvil.reorg_keeping(2, &[token_sweep, last]).await;
        anvil.wait_synced(&engine).await;
        let moved = anvil.call("eth_getTransactionByHash", serde_json::json!([last_hash])).await;
        assert_eq!(moved["blockNumber"], serde_json::json!(format!("0x{:x}", before - 1)), "{moved}");
        assert_eq!(anvil.balance(&intent.pay_to).await, 0);
        assert_eq!(held_per_asset(&engine, Network::Ethereum).await, [("eth".into(), 0), ("usdt-erc20".into(), 0)], "the moved transfer is still seen");
        anvil.mine(1).await;
        eventually("the sweep to be booked", || async {
            crypto_balance(&engine, Account::Custody(Method::Eth), Method::Eth).await == 0
                && crypto_balance(&engine, Account::Custody(Method::UsdtErc20), Method::UsdtErc20).await == 0
        }).await;
        // What the treasury sent less what came back is what the two sweeps burned.
        assert_eq!(crypto_balance(&engine, Account::Treasury(Method::Eth), Method::Eth).await, top_up - rest);
        assert_eq!(fees_booked(&engine, Method::Eth).await, top_up - rest);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn a_reverted_sweep_moves_no_token_but_its_gas_is_booked(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let keys = SeedKeys::fresh();
        let (engine, _clock) = eth_engine_of(&db, eth_config(ethereum(&anvil, &tokens, &keys.account_xpub(), 1))).await;
        engine.create_topup(&topup("R-1", "81", "100")).await.unwrap();
        let intent = engine.create_payment(&order("R-1"), Method::UsdtErc20).await.unwrap().intent;
        let watcher = watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);
        anvil.send_token(&tokens.usdt, &intent.pay_to, USDT_UNITS).await;
        let gas_price = 2_000_000_000u128;
        let top_up = u128::from(TOKEN_TRANSFER_GAS) * gas_price;
        anvil.send_eth(&intent.pay_to, top_up).await;
        anvil.mine(1).await;
        wait_status(&engine, &intent.id, IntentStatus::Settled).await;
        // One unit more than the address holds: the token contract reverts, the gas is spent.
        let signer = keys.signer("m/44h/60h/0h/0/0");
        let raw = signed_transfer(&signer, 0, gas_price, TOKEN_TRANSFER_GAS, &tokens.usdt, 0, token_transfer_call(&anvil.other, USDT_UNITS + 1));
        let txid = anvil.send_raw(&raw).await;
        anvil.mine(1).await;
        let receipt = anvil.receipt(&txid).await;
        assert_eq!(receipt["status"], serde_json::json!("0x0"), "{receipt}");
        let burned = u128::from_str_radix(receipt["gasUsed"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap() * gas_price;
        eventually("the reverted sweep's gas to be booked", || async { fees_booked(&engine, Method::Eth).await == burned }).await;
        assert_eq!(held_per_asset(&engine, Network::Ethereum).await, [("eth".into(), top_up - burned), ("usdt-erc20".into(), USDT_UNITS)]);
        assert_eq!(anvil.balance(&intent.pay_to).await, top_up - burned);
        assert_eq!(crypto_balance(&engine, Account::Treasury(Method::UsdtErc20), Method::UsdtErc20).await, 0);
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}
