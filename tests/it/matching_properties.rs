//! Property: each network's watcher log, delivered in any interleaving with the other
//! networks' logs, with duplicates and replays of what was already delivered, ends in the same
//! intent states and the same balances as a clean delivery; credits are never doubled, a
//! removed transfer is never credited, and every credited USD amount is the locked amount.

use crate::common;

use std::collections::BTreeMap;

use common::payments::{Tx, config, engine, start_time};
use common::{Db, TestDb, account, topup};
use payrecon::Engine;
use payrecon::IntentStatus;
use payrecon::OrderRef;
use payrecon::ledger::{Account, Currency};
use payrecon_chain_core::{ChainEvent, Method, Network};
use proptest::prelude::*;

/// The networks under test: each with one top-up intent, the method and its confirmations.
const NETWORKS: [(Network, Method, &str, u32); 3] = [
    (Network::Bitcoin, Method::Btc, "T-btc", 2),
    (Network::Ethereum, Method::UsdtErc20, "T-eth", 12),
    (Network::Tron, Method::Trx, "T-trx", 19),
];

/// One transfer's life on its chain.
#[derive(Clone, Debug)]
enum Life {
    Pending,
    Confirmed,
    ConfirmedThenRemoved,
    RemovedThenReincluded,
}

#[derive(Clone, Debug)]
struct TransferPlan {
    /// Multiple of the intent amount, in quarters.
    quarters: u128,
    life: Life,
    wrong_asset: bool,
}

fn transfer_plan() -> impl Strategy<Value = TransferPlan> {
    (
        1u128..9,
        prop_oneof![
            Just(Life::Pending),
            Just(Life::Confirmed),
            Just(Life::ConfirmedThenRemoved),
            Just(Life::RemovedThenReincluded)
        ],
        prop::bool::weighted(0.15),
    )
        .prop_map(|(quarters, life, wrong_asset)| TransferPlan {
            quarters,
            life,
            wrong_asset,
        })
}

/// What happens on the three chains, and how delivery scrambles it.
#[derive(Clone, Debug)]
struct Scenario {
    plans: [Vec<TransferPlan>; 3],
    /// Which network's log delivers its next event, step by step.
    interleaving: Vec<usize>,
    /// After each delivery, maybe replay an already delivered event (index into the prefix).
    replays: Vec<Option<usize>>,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        [
            prop::collection::vec(transfer_plan(), 0..4),
            prop::collection::vec(transfer_plan(), 0..4),
            prop::collection::vec(transfer_plan(), 0..4),
        ],
        prop::collection::vec(0usize..3, 64),
        prop::collection::vec(prop::option::weighted(0.3, any::<usize>()), 64),
    )
        .prop_map(|(plans, interleaving, replays)| Scenario {
            plans,
            interleaving,
            replays,
        })
}

/// Turns the plans into each network's ordered watcher log, heights increasing.
fn logs(
    plans: &[Vec<TransferPlan>; 3],
    watch_keys: &[String; 3],
    amounts: &[u128; 3],
) -> [Vec<ChainEvent>; 3] {
    std::array::from_fn(|n| {
        let (network, method, _, required) = NETWORKS[n];
        let mut height = 1000u64;
        let mut log = Vec::new();
        for (i, plan) in plans[n].iter().enumerate() {
            let mut tx = Tx::new(
                network,
                &format!("{network}-{i}"),
                &watch_keys[n],
                method,
                amounts[n] * plan.quarters / 4,
                start_time(),
            );
            if plan.wrong_asset {
                let other = if method == Method::UsdtErc20 {
                    Method::UsdcErc20
                } else {
                    method
                };
                tx.asset = payrecon_chain_core::ReceivedAsset::Method { method: other };
            }
            let mut next = || {
                height += 1;
                height
            };
            match plan.life {
                Life::Pending => log.push(tx.observed(0, next())),
                Life::Confirmed => {
                    log.push(tx.observed(0, next()));
                    log.push(tx.observed(required, next()));
                }
                Life::ConfirmedThenRemoved => {
                    log.push(tx.observed(required, next()));
                    log.push(tx.removed(next()));
                }
                Life::RemovedThenReincluded => {
                    log.push(tx.observed(1, next()));
                    log.push(tx.removed(next()));
                    log.push(tx.observed(required + 1, next()));
                }
            }
        }
        log
    })
}

struct Outcome {
    statuses: Vec<IntentStatus>,
    balances: BTreeMap<String, String>,
}

async fn run(db: Db, scenario: &Scenario, scrambled: bool) -> Outcome {
    let test_db = TestDb::new(db).await;
    let (engine, _clock) = engine(&test_db, config(|_| {})).await;
    let mut watch_keys = Vec::new();
    let mut amounts = Vec::new();
    for (_, method, reference, _) in NETWORKS {
        engine
            .create_topup(&topup(reference, "42", "500"))
            .await
            .unwrap();
        let pay = engine
            .create_payment(&OrderRef::new(reference).unwrap(), method)
            .await
            .unwrap();
        watch_keys.push(pay.intent.watch_key.clone());
        amounts.push(pay.intent.amount.base_units());
    }
    let logs = logs(
        &scenario.plans,
        &watch_keys.try_into().unwrap(),
        &amounts.try_into().unwrap(),
    );
    let delivery: Vec<ChainEvent> = if scrambled {
        let mut cursors = [0usize; 3];
        let mut delivered: Vec<ChainEvent> = Vec::new();
        let mut steps = scenario.interleaving.iter().cycle();
        let mut replays = scenario.replays.iter().cycle();
        while cursors.iter().zip(&logs).any(|(c, log)| *c < log.len()) {
            let n = *steps.next().unwrap();
            if cursors[n] < logs[n].len() {
                delivered.push(logs[n][cursors[n]].clone());
                cursors[n] += 1;
            }
            if let Some(Some(pick)) = replays.next()
                && !delivered.is_empty()
            {
                delivered.push(delivered[pick % delivered.len()].clone());
            }
        }
        delivered
    } else {
        logs.iter().flatten().cloned().collect()
    };
    // Scrambled runs also vary the batch sizes a watcher would commit.
    let batch = if scrambled { 3 } else { 1 };
    for chunk in delivery.chunks(batch) {
        engine.apply_chain_events(chunk).await.unwrap();
    }
    check_invariants(&engine).await;
    let mut statuses = Vec::new();
    for (_, _, reference, _) in NETWORKS {
        let order = OrderRef::new(reference).unwrap();
        statuses.push(engine.payments_for(&order).await.unwrap()[0].intent.status);
    }
    let trial = engine.trial_balance().await.unwrap();
    Outcome {
        statuses,
        balances: trial
            .accounts
            .into_iter()
            .map(|line| (format!("{} {}", line.account, line.currency), line.balance))
            .collect(),
    }
}

async fn check_invariants(engine: &Engine) {
    let trial = engine.trial_balance().await.unwrap();
    assert!(trial.is_sound(), "{trial:?}");
    let mut settled_usd = 0i128;
    for (_, method, reference, _) in NETWORKS {
        let order = OrderRef::new(reference).unwrap();
        let intent = engine.payments_for(&order).await.unwrap().remove(0).intent;
        if intent.status == IntentStatus::Settled {
            settled_usd += i128::from(intent.usd.cents());
        }
        let transfers = engine.transfers_for(&order).await.unwrap();
        for transfer in &transfers {
            assert!(
                !(transfer.removed && transfer.credited_entry.is_some()),
                "removed but credited: {transfer:?}"
            );
        }
        let credited: u128 = transfers
            .iter()
            .filter(|t| {
                t.credited_entry.is_some()
                    && t.asset == payrecon_chain_core::ReceivedAsset::Method { method }
            })
            .map(|t| t.amount.base_units())
            .sum();
        let custody = engine
            .account_balance(&Account::Custody(method), Currency::Crypto(method))
            .await
            .unwrap();
        assert_eq!(
            custody, credited as i128,
            "custody of {method} holds exactly the credited transfers"
        );
    }
    let balance = engine.available_balance(&account("42")).await.unwrap();
    assert_eq!(
        i128::from(balance.cents()),
        settled_usd,
        "credited USD is the locked USD of each settled intent"
    );
}

fn same_outcome(db: Db, scenario: Scenario) {
    common::runtime().block_on(async {
        let clean = run(db, &scenario, false).await;
        let scrambled = run(db, &scenario, true).await;
        assert_eq!(clean.statuses, scrambled.statuses);
        assert_eq!(clean.balances, scrambled.balances);
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn delivery_order_duplicates_and_replays_change_nothing_on_sqlite(scenario in scenario()) {
        same_outcome(Db::Sqlite, scenario);
    }

    #[test]
    fn delivery_order_duplicates_and_replays_change_nothing_on_postgres(scenario in scenario()) {
        same_outcome(Db::Postgres, scenario);
    }
}
