//! Where the money goes after it arrives on Solana, against the project's fake JSON-RPC node
//! (answers built from the documented responses), through the real Solana RPC client, on
//! SQLite and PostgreSQL: SOL paid under 10 references to the merchant's recipient, then the
//! merchant moving it out to its treasury and elsewhere, a failed transfer that still costs the
//! fee, a move that vanishes with its fork before finalizing, the fees booked, the holdings
//! at zero and the month's roll-forward closing.

use crate::common;

use common::checks::{order, sound, wait_status};
use common::outflows::{crypto_balance, fees_booked};
use common::regtest::eventually;
use common::solana::{solana_config, solana_engine, watch_solana};
use common::topup;
use payrecon::ledger::Account;
use payrecon::test_utils::clock::Clock;
use payrecon::{Engine, HoldingsSort, IntentStatus};
use payrecon_chain_core::{Method, Network};
use payrecon_chain_solana::testkit::{FakeSolana, random_pubkey};

/// 1 SOL, what a 100 USD top-up costs at 100 USD per SOL.
const TOPUP_LAMPORTS: u64 = 1_000_000_000;

on_both_databases! {
    async fn sol_moved_out_of_the_recipient_is_booked_with_its_fees_and_nothing_is_left_held(db) {
        let node = FakeSolana::start().await;
        let treasury = random_pubkey();
        let mut solana = solana_config(&node);
        solana.treasury_addresses = vec![treasury.clone()];
        let (engine, clock) = solana_engine(&db, &solana).await;
        let recipient = solana.recipient.clone();
        let mut intents = Vec::new();
        for n in 0..10 {
            let reference = format!("SS-{n}");
            engine.create_topup(&topup(&reference, &format!("5{n}"), "100")).await.unwrap();
            intents.push(engine.create_payment(&order(&reference), Method::Sol).await.unwrap().intent);
        }
        let watcher = watch_solana(&engine, &solana);
        let now = clock.now().timestamp();
        for intent in &intents {
            node.pay(&recipient, TOPUP_LAMPORTS, Some(&intent.watch_key), now, false);
        }
        node.finalize_all();
        for intent in &intents {
            wait_status(&engine, &intent.id, IntentStatus::Settled).await;
        }
        assert_eq!(held(&engine).await, 10 * u128::from(TOPUP_LAMPORTS));

        // The merchant moves 7 SOL to its treasury and 2.9 SOL elsewhere; one transfer fails
        // (its fee is still paid); one is confirmed and then lost with its fork.
        let fee = u128::from(node.fee());
        let elsewhere = random_pubkey();
        node.send_from(&recipient, &treasury, 7 * TOPUP_LAMPORTS, now, false);
        node.send_from(&recipient, &elsewhere, 1, now, true);
        let lost = node.send_from(&recipient, &elsewhere, TOPUP_LAMPORTS, now, false);
        eventually("the confirmed moves to be seen", || async {
            held(&engine).await < 2 * u128::from(TOPUP_LAMPORTS)
        }).await;
        assert_eq!(fees_booked(&engine, Method::Sol).await, 0, "nothing is booked before it is final");
        node.drop_transaction(&lost);
        // What is left once this last move pays its own fee too.
        let rest = 3 * u128::from(TOPUP_LAMPORTS) - 3 * fee;
        node.send_from(&recipient, &elsewhere, u64::try_from(rest).unwrap(), now, false);
        node.finalize_all();
        eventually("the moves to be booked", || async {
            held(&engine).await == 0 && fees_booked(&engine, Method::Sol).await == 3 * fee
        }).await;
        assert_eq!(crypto_balance(&engine, Account::Treasury(Method::Sol), Method::Sol).await, 7 * u128::from(TOPUP_LAMPORTS));
        assert_eq!(crypto_balance(&engine, Account::External(Method::Sol), Method::Sol).await, rest);
        assert_eq!(crypto_balance(&engine, Account::Custody(Method::Sol), Method::Sol).await, 0);

        let month = engine.period_of(clock.now());
        let rollforward = engine.holdings_rollforward(month).await.unwrap();
        assert!(rollforward.closes, "{rollforward:?}");
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}

/// SOL payrecon holds at the recipient, in lamports.
async fn held(engine: &Engine) -> u128 {
    let view = engine
        .holdings(Some(Network::Solana), HoldingsSort::Address, true, 0, 10)
        .await
        .unwrap();
    assert!(view.overdrawn.is_empty(), "{:?}", view.overdrawn);
    view.totals.first().map_or(0, |t| t.amount.parse().unwrap())
}
