//! Property, on SQLite and PostgreSQL: over random logs of receipts on watched addresses,
//! sweeps of them (to the treasury or elsewhere, with fees, booked or still shallow), reorgs of
//! either and replays, spread over three months: the holdings equal a plain model of what is
//! on each address and never go negative, every month's holdings roll-forward closes and opens
//! where the last one closed, the treasury, external and fee accounts hold exactly the booked
//! sweeps, and replaying the whole log changes nothing.

use crate::common;

use std::collections::BTreeMap;

use chrono::{Duration, TimeZone, Utc};
use common::outflows::{TREASURY, hand_out, litecoin_engine, sent_at, sweep};
use common::payments::Tx;
use common::{Db, TestDb};
use payrecon::ledger::{Account, Currency};
use payrecon::{Engine, HoldingsSort, PaymentIntent};
use payrecon_chain_core::{ChainEvent, Method, Network, OutflowEvent};
use proptest::prelude::*;

const ADDRESSES: usize = 4;

#[derive(Clone, Debug)]
enum Op {
    /// `litoshi` reach address `to`.
    Receive { to: usize, litoshi: u128 },
    /// The n-th receipt is swept (if still held), `fee` of it to the network, at this depth.
    Sweep {
        receipt: usize,
        fee: u128,
        treasury: bool,
        confirmations: u32,
    },
    /// The n-th sweep deepens to 2 confirmations.
    Deepen(usize),
    /// The n-th sweep leaves the chain.
    Unsweep(usize),
    /// The n-th receipt leaves the chain, with its sweep if any.
    Reorg(usize),
    /// The last batch is reported again.
    Replay,
    /// Ten days pass.
    Advance,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..ADDRESSES, 1_000u128..5_000_000).prop_map(|(to, litoshi)| Op::Receive { to, litoshi }),
        3 => (0..40usize, 0u128..2_000, any::<bool>(), 1..3u32).prop_map(|(receipt, fee, treasury, confirmations)| Op::Sweep { receipt, fee, treasury, confirmations }),
        1 => (0..40usize).prop_map(Op::Deepen),
        1 => (0..40usize).prop_map(Op::Unsweep),
        1 => (0..40usize).prop_map(Op::Reorg),
        1 => Just(Op::Replay),
        2 => Just(Op::Advance),
    ]
}

/// A receipt as the model keeps it.
struct Receipt {
    tx: Tx,
    to: usize,
    removed: bool,
    swept_by: Option<usize>,
}

/// A sweep as the model keeps it.
struct Sweep {
    receipt: usize,
    outflow: payrecon_chain_core::Outflow,
    confirmations: u32,
    removed: bool,
    at_ms: i64,
}

/// One batch of reports, as the engine is given it.
enum Batch {
    Events(Vec<ChainEvent>),
    Outflows(Vec<OutflowEvent>),
}

async fn apply(engine: &Engine, batch: &Batch) {
    match batch {
        Batch::Events(events) => engine.apply_chain_events(events).await.unwrap(),
        Batch::Outflows(outflows) => engine.apply_outflows(outflows).await.unwrap(),
    }
}

async fn run(db: Db, ops: Vec<Op>) {
    let test_db = TestDb::new(db).await;
    let engine = litecoin_engine(&test_db).await;
    let intents = hand_out(&engine, ADDRESSES as u32).await;
    let start = Utc.with_ymd_and_hms(2026, 9, 1, 0, 0, 0).unwrap();
    let mut now = start;
    let mut tip = 1_000u64;
    let (mut receipts, mut sweeps): (Vec<Receipt>, Vec<Sweep>) = (Vec::new(), Vec::new());
    let mut log: Vec<Batch> = Vec::new();
    for op in ops {
        tip += 1;
        now += Duration::hours(1);
        let batch = match op {
            Op::Receive { to, litoshi } => {
                let txid = format!("{:064x}", receipts.len() + 1);
                let tx = Tx::new(
                    Network::Litecoin,
                    &txid,
                    &intents[to].pay_to,
                    Method::Ltc,
                    litoshi,
                    now,
                );
                let event = tx.observed(2, tip);
                receipts.push(Receipt {
                    tx,
                    to,
                    removed: false,
                    swept_by: None,
                });
                Batch::Events(vec![event])
            }
            Op::Sweep {
                receipt,
                fee,
                treasury,
                confirmations,
            } => {
                let Some(r) = receipts
                    .get(receipt)
                    .filter(|r| !r.removed && r.swept_by.is_none())
                else {
                    continue;
                };
                let fee = fee.min(r.tx.amount.base_units());
                let txid = format!("{:064x}", 1_000_000 + sweeps.len());
                let outflow = sweep(
                    &txid,
                    0,
                    &r.tx,
                    fee,
                    Some(if treasury {
                        TREASURY
                    } else {
                        "rltc1qelsewhere"
                    }),
                );
                let at_ms = now.timestamp_millis();
                let event = sent_at(&outflow, confirmations, tip, at_ms);
                receipts[receipt].swept_by = Some(sweeps.len());
                sweeps.push(Sweep {
                    receipt,
                    outflow,
                    confirmations,
                    removed: false,
                    at_ms,
                });
                Batch::Outflows(vec![event])
            }
            Op::Deepen(n) => {
                let Some(s) = sweeps.get_mut(n).filter(|s| !s.removed) else {
                    continue;
                };
                s.confirmations = 2;
                Batch::Outflows(vec![sent_at(&s.outflow, 2, tip, s.at_ms)])
            }
            Op::Unsweep(n) => {
                let Some(s) = sweeps.get_mut(n).filter(|s| !s.removed) else {
                    continue;
                };
                s.removed = true;
                receipts[s.receipt].swept_by = None;
                Batch::Outflows(vec![OutflowEvent::Removed {
                    id: s.outflow.id.clone(),
                    tip_height: tip,
                }])
            }
            Op::Reorg(n) => {
                let Some(r) = receipts.get_mut(n).filter(|r| !r.removed) else {
                    continue;
                };
                r.removed = true;
                if let Some(s) = r.swept_by.take() {
                    sweeps[s].removed = true;
                    let outflow = OutflowEvent::Removed {
                        id: sweeps[s].outflow.id.clone(),
                        tip_height: tip,
                    };
                    apply(&engine, &Batch::Outflows(vec![outflow.clone()])).await;
                    log.push(Batch::Outflows(vec![outflow]));
                }
                Batch::Events(vec![receipts[n].tx.removed(tip)])
            }
            Op::Replay => {
                let Some(last) = log.last() else { continue };
                apply(&engine, last).await;
                continue;
            }
            Op::Advance => {
                now += Duration::days(10);
                continue;
            }
        };
        apply(&engine, &batch).await;
        log.push(batch);
        // Holdings never go negative (the view would list them overdrawn) and equal the
        // model's.
        check_holdings(&engine, &intents, &receipts, &sweeps).await;
    }
    let before = state(&engine).await;
    for batch in &log {
        apply(&engine, batch).await;
    }
    assert_eq!(
        state(&engine).await,
        before,
        "replaying the whole log changes nothing"
    );
    check_books(&engine, &sweeps).await;
    // Each month's roll-forward closes and opens where the last one closed.
    let mut month = engine.period_of(start);
    let mut opening = "0".to_owned();
    while engine.period_bounds(month).0 <= now {
        let rollforward = engine.holdings_rollforward(month).await.unwrap();
        assert!(rollforward.closes, "{rollforward:?}");
        let ltc = rollforward.assets.iter().find(|a| a.asset == "ltc");
        if let Some(ltc) = ltc {
            assert_eq!(ltc.opening, opening, "{month}");
            opening = ltc.closing.clone();
        }
        month = month.next();
    }
}

async fn check_holdings(
    engine: &Engine,
    intents: &[PaymentIntent],
    receipts: &[Receipt],
    sweeps: &[Sweep],
) {
    let mut expected: BTreeMap<String, u128> = BTreeMap::new();
    for r in receipts.iter().filter(|r| !r.removed) {
        let swept = r.swept_by.is_some_and(|s| !sweeps[s].removed);
        *expected.entry(intents[r.to].pay_to.clone()).or_default() +=
            if swept { 0 } else { r.tx.amount.base_units() };
    }
    let view = engine
        .holdings(Some(Network::Litecoin), HoldingsSort::Address, true, 0, 100)
        .await
        .unwrap();
    assert!(view.overdrawn.is_empty(), "{:?}", view.overdrawn);
    let actual: BTreeMap<String, u128> = view
        .addresses
        .iter()
        .map(|h| (h.address.clone(), h.amount.parse().unwrap()))
        .collect();
    expected.retain(|address, amount| *amount > 0 || actual.contains_key(address));
    let actual: BTreeMap<String, u128> = actual
        .into_iter()
        .filter(|(a, amount)| *amount > 0 || expected.contains_key(a))
        .collect();
    assert_eq!(actual, expected);
}

/// Treasury, external and fees hold exactly the booked sweeps (the custody side is each
/// entry's other legs), and the journal stays sound.
async fn check_books(engine: &Engine, sweeps: &[Sweep]) {
    let ltc = Currency::Crypto(Method::Ltc);
    let balance = |account| async move { engine.account_balance(&account, ltc).await.unwrap() };
    let booked: Vec<&Sweep> = sweeps
        .iter()
        .filter(|s| !s.removed && s.confirmations >= 2)
        .collect();
    let sum = |f: &dyn Fn(&Sweep) -> u128| {
        booked
            .iter()
            .map(|s| i128::try_from(f(s)).unwrap())
            .sum::<i128>()
    };
    let to = |treasury: bool| {
        move |s: &Sweep| {
            if (s.outflow.to_address.as_deref() == Some(TREASURY)) == treasury {
                s.outflow.amount.base_units()
            } else {
                0
            }
        }
    };
    assert_eq!(
        balance(Account::Treasury(Method::Ltc)).await,
        sum(&to(true))
    );
    assert_eq!(
        balance(Account::External(Method::Ltc)).await,
        sum(&to(false))
    );
    assert_eq!(
        balance(Account::NetworkFees(Method::Ltc)).await,
        sum(&|s: &Sweep| s.outflow.fee.base_units())
    );
    assert!(engine.trial_balance().await.unwrap().is_sound());
}

async fn state(engine: &Engine) -> (String, i128, i128) {
    let view = engine
        .holdings(None, HoldingsSort::Address, true, 0, 1000)
        .await
        .unwrap();
    let ltc = Currency::Crypto(Method::Ltc);
    (
        serde_json::to_string(&view).unwrap(),
        engine
            .account_balance(&Account::Custody(Method::Ltc), ltc)
            .await
            .unwrap(),
        engine
            .account_balance(&Account::NetworkFees(Method::Ltc), ltc)
            .await
            .unwrap(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn holdings_follow_receipts_sweeps_and_reorgs_on_sqlite(ops in proptest::collection::vec(op(), 1..40)) {
        common::runtime().block_on(run(Db::Sqlite, ops));
    }

    #[test]
    fn holdings_follow_receipts_sweeps_and_reorgs_on_postgres(ops in proptest::collection::vec(op(), 1..40)) {
        common::runtime().block_on(run(Db::Postgres, ops));
    }
}
