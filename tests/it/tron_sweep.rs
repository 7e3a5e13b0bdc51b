//! Where the money goes after it arrives on Tron, against the project's fake full node (blocks
//! and transaction infos built from recorded java-tron responses), on SQLite and PostgreSQL:
//! TRX and USDT paid to 10 addresses, the sweep list priced at the node's chain parameters,
//! energy top-ups from the treasury booked as the merchant's own money (and those from elsewhere
//! marked so by an operator), a sweep signed by the addresses a week after
//! every intent closed, the outflows and burned fees booked, a reorg taking the last sweeps
//! back, the holdings at zero and the month's roll-forward closing.

use crate::common;

use chrono::Duration;
use common::checks::{order, sound, wait_status};
use common::outflows::{crypto_balance, fees_booked, held_per_asset};
use common::regtest::eventually;
use common::topup;
use common::tron::{
    USDT, fresh_tron_xpub, tron_config, tron_engine, tron_engine_config, watch_tron,
};
use payrecon::config::TronFinality;
use payrecon::ledger::Account;
use payrecon::test_utils::clock::Clock;
use payrecon::{Action, IntentStatus};
use payrecon_chain_core::{Method, Network};
use payrecon_chain_tron::testkit::{FakeTron, trc20, trc20_from, trx, trx_from};
use payrecon_chain_tron::{
    TRC20_TRANSFER_BYTES, TRC20_TRANSFER_ENERGY, TRX_TRANSFER_BYTES, TronAddress,
};

/// 400 TRX (100 USD at 0.25) and 100 USDT.
const TOPUP_SUN: u64 = 400_000_000;
const TOPUP_USDT: u128 = 100_000_000;

/// The fake node's chain parameters (`fixtures/tron/wallet_getchainparameters.json`).
const ENERGY_SUN: u64 = 210;
const BYTE_SUN: u64 = 1_000;

/// What a USDT sweep really burns here, below the list's estimate.
const USDT_SWEEP_BURNED: u64 = 13_000_000;

on_both_databases! {
    async fn trx_and_usdt_swept_from_10_addresses_leave_nothing_held_and_the_books_closed(db) {
        let node = FakeTron::start(20).await;
        let treasury = TronAddress::from_hex("4130ba69b6b9746c2a15d6a7f9b9bea1f97ba3b023").unwrap().to_string();
        let funder = TronAddress::from_hex("41cf2e99409d2a9a9190197ab0bff35ca87818c41e").unwrap().to_string();
        let mut tron = tron_config(&node, &fresh_tron_xpub(), 2, TronFinality::Depth);
        tron.treasury_addresses = vec![treasury.clone()];
        let config = tron_engine_config(&tron);
        let (engine, clock) = tron_engine(&db, &tron).await;
        let mut intents = Vec::new();
        for n in 0..10 {
            let reference = format!("TS-{n}");
            engine.create_topup(&topup(&reference, &format!("6{n}"), "100")).await.unwrap();
            let method = if n % 2 == 0 { Method::UsdtTrc20 } else { Method::Trx };
            intents.push((method, engine.create_payment(&order(&reference), method).await.unwrap().intent));
        }
        let watcher = watch_tron(&engine, &tron, node.head() + 1);
        let payments: Vec<_> = intents
            .iter()
            .map(|(method, intent)| match method {
                Method::Trx => trx(&intent.pay_to, TOPUP_SUN),
                _ => trc20(USDT, &intent.pay_to, TOPUP_USDT),
            })
            .collect();
        node.mine(&payments);
        node.mine_empty(1);
        for (_, intent) in &intents {
            wait_status(&engine, &intent.id, IntentStatus::Settled).await;
        }
        assert_eq!(held_per_asset(&engine, Network::Tron).await, [("trx".into(), 5 * u128::from(TOPUP_SUN)), ("usdt-trc20".into(), 5 * TOPUP_USDT)]);

        // A week and a day later every intent's window has closed.
        clock.advance(Duration::days(8));
        common::checks::tick_once_read(&engine, Network::Tron, &*clock).await;
        watcher.next_round().await;
        node.set_clock_ms(clock.now().timestamp_millis());

        let list = engine.sweep_list(&config, Network::Tron).await.unwrap();
        let per_token = TRC20_TRANSFER_ENERGY * ENERGY_SUN + TRC20_TRANSFER_BYTES * BYTE_SUN;
        let native_fee = TRX_TRANSFER_BYTES * BYTE_SUN;
        assert_eq!((list.per_token_fee.as_str(), list.native_fee.as_str()), (per_token.to_string().as_str(), native_fee.to_string().as_str()), "{}", list.fee_basis);
        assert_eq!(list.addresses.len(), 10);
        assert_eq!(list.top_up_total, (5 * per_token).to_string());
        assert!(list.addresses.iter().all(|a| a.derivation_path.as_deref().is_some_and(|p| p.starts_with("m/44h/195h/0h/0/"))));
        assert_eq!(list.csv().lines().next(), Some("address,derivation_index,derivation_path,trx,usdt-trc20,fee_needed,top_up"));

        // The merchant tops the USDT addresses up, three from the treasury and two from a
        // wallet payrecon was not told about, then each address sends its USDT and its TRX to
        // the treasury.
        let top_ups: Vec<_> = list.addresses.iter()
            .filter(|a| a.top_up != "0")
            .enumerate()
            .map(|(n, a)| trx_from(if n < 2 { &funder } else { &treasury }, &a.address, a.top_up.parse().unwrap(), 0))
            .collect();
        assert_eq!(top_ups.len(), 5);
        node.mine(&top_ups);
        let mut sweeps = Vec::new();
        let mut leftovers = Vec::new();
        for row in &list.addresses {
            match row.balances.get("usdt-trc20") {
                Some(units) if units != "0" => {
                    sweeps.push(trc20_from(&row.address, USDT, &treasury, units.parse().unwrap(), USDT_SWEEP_BURNED, true));
                    leftovers.push(trx_from(&row.address, &treasury, per_token - USDT_SWEEP_BURNED - native_fee, native_fee));
                }
                _ => sweeps.push(trx_from(&row.address, &treasury, TOPUP_SUN - native_fee, native_fee)),
            }
        }
        node.mine(&sweeps);
        node.mine(&leftovers);
        node.mine_empty(1);
        let burned = 5 * u128::from(USDT_SWEEP_BURNED) + 10 * u128::from(native_fee);
        eventually("the sweeps to be booked", || async {
            held_per_asset(&engine, Network::Tron).await.iter().all(|(_, amount)| *amount == 0) && fees_booked(&engine, Method::Trx).await == burned
        }).await;

        let exceptions: Vec<_> = engine.exceptions(None).await.unwrap().into_iter().filter(|e| e.resolution.is_none()).collect();
        assert_eq!(exceptions.len(), 2, "the treasury's top-ups are its own money: {exceptions:?}");
        for exception in &exceptions {
            assert_eq!(exception.kind, "wrong_asset");
            engine.resolve_exception(&exception.id, &Action::MarkOwnFunds, "ops", "energy top-up for the sweep").await.unwrap();
        }
        let treasury_trx = crypto_balance(&engine, Account::Treasury(Method::Trx), Method::Trx).await;
        assert_eq!(treasury_trx + burned, 5 * u128::from(TOPUP_SUN), "what customers paid went to the treasury or was burned");
        assert_eq!(crypto_balance(&engine, Account::Treasury(Method::UsdtTrc20), Method::UsdtTrc20).await, 5 * TOPUP_USDT);
        assert_eq!(crypto_balance(&engine, Account::Custody(Method::Trx), Method::Trx).await, 0);
        assert_eq!(engine.open_exceptions_by_kind().await.unwrap(), []);

        // A reorg takes the leftover collections and the block after them back: the TRX is held
        // again and the fees reversed; mined again, all is booked once more.
        node.reorg(2);
        node.mine_empty(1);
        eventually("the leftover collections to be taken back", || async {
            held_per_asset(&engine, Network::Tron).await.iter().any(|(asset, amount)| asset == "trx" && *amount > 0)
        }).await;
        assert!(engine.trial_balance().await.unwrap().is_sound());
        node.mine(&leftovers);
        node.mine_empty(1);
        eventually("the leftover collections to be booked again", || async {
            held_per_asset(&engine, Network::Tron).await.iter().all(|(_, amount)| *amount == 0) && fees_booked(&engine, Method::Trx).await == burned
        }).await;

        let month = engine.period_of(clock.now());
        let rollforward = engine.holdings_rollforward(month).await.unwrap();
        assert!(rollforward.closes, "{rollforward:?}");
        for asset in rollforward.assets.iter().filter(|a| a.network == "tron") {
            assert_eq!(asset.closing, "0", "{asset:?}");
        }
        // The fake node has no account state to ask: the check says Tron was not checked.
        let verification = engine.verify_holdings(&config, month).await.unwrap();
        let tron_check = verification.iter().find(|v| v.network == "tron").unwrap();
        assert!(tron_check.unchecked.is_some(), "{tron_check:?}");
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}
