//! Property: the batched matcher decides exactly as the one-by-one reference. Random event logs
//! (several intents per network, a superseded one, addresses no intent owns, the wrong asset,
//! under- and overpayments, late money, reorgs before and after credit, re-inclusions),
//! delivered in random interleavings with duplicates and replays, in random batch sizes, with
//! the clock moving, deadlines ticking and balances spent between batches, leave the same
//! database contents through both paths, row for row, on SQLite and on PostgreSQL.

use crate::common;

use chrono::Duration;
use common::payments::{Tx, config, engine, start_time};
use common::{Db, TestDb, rental, topup};
use payrecon::Engine;
use payrecon::OrderRef;
use payrecon::test_utils::clock::ManualClock;
use payrecon::test_utils::matcher::MatcherPath;
use payrecon_chain_core::{ChainEvent, Method, Network, ReceivedAsset};
use proptest::prelude::*;
use sqlx::Row;

/// The networks under test: each with a method and the confirmations it needs.
const NETWORKS: [(Network, Method, u32); 3] = [
    (Network::Bitcoin, Method::Btc, 2),
    (Network::Ethereum, Method::UsdtErc20, 12),
    (Network::Tron, Method::Trx, 19),
];

/// Where a transfer goes: the top-up's first intent (superseded), its second, the rental's
/// intent, or an address no intent owns.
const TARGETS: usize = 4;

#[derive(Clone, Copy, Debug)]
enum Life {
    Pending,
    Confirmed,
    ConfirmedThenRemoved,
    RemovedThenReincluded,
}

#[derive(Clone, Debug)]
struct TransferPlan {
    target: usize,
    /// Multiple of the target intent's amount, in quarters.
    quarters: u128,
    life: Life,
    wrong_asset: bool,
    /// First seen after the deadline.
    late: bool,
}

/// What happens between two batches, identically on both paths.
#[derive(Clone, Copy, Debug)]
enum Between {
    Nothing,
    /// The clock moves 25 minutes: deadlines (60 minutes) pass during a run.
    Wait,
    /// Deadlines are evaluated.
    Tick,
    /// A rental is paid from the balance (refused when the balance is short).
    PayRental(usize),
}

#[derive(Clone, Debug)]
struct Scenario {
    plans: [Vec<TransferPlan>; 3],
    interleaving: Vec<usize>,
    replays: Vec<Option<usize>>,
    batch_sizes: Vec<usize>,
    between: Vec<Between>,
}

fn transfer_plan() -> impl Strategy<Value = TransferPlan> {
    (
        0..TARGETS,
        1u128..9,
        prop_oneof![
            Just(Life::Pending),
            Just(Life::Confirmed),
            Just(Life::ConfirmedThenRemoved),
            Just(Life::RemovedThenReincluded)
        ],
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(target, quarters, life, wrong_asset, late)| TransferPlan {
            target,
            quarters,
            life,
            wrong_asset,
            late,
        })
}

fn between() -> impl Strategy<Value = Between> {
    prop_oneof![
        4 => Just(Between::Nothing),
        1 => Just(Between::Wait),
        1 => Just(Between::Tick),
        1 => (0usize..3).prop_map(Between::PayRental),
    ]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        [
            prop::collection::vec(transfer_plan(), 0..6),
            prop::collection::vec(transfer_plan(), 0..6),
            prop::collection::vec(transfer_plan(), 0..6),
        ],
        prop::collection::vec(0usize..3, 64),
        prop::collection::vec(prop::option::weighted(0.3, any::<usize>()), 64),
        prop::collection::vec(1usize..9, 1..8),
        prop::collection::vec(between(), 1..8),
    )
        .prop_map(
            |(plans, interleaving, replays, batch_sizes, between)| Scenario {
                plans,
                interleaving,
                replays,
                batch_sizes,
                between,
            },
        )
}

/// Each network's targets: (watch key, amount) per target.
type Targets = [Vec<(String, u128)>; 3];

/// Orders, intents and a funded balance, identical on every database. Intents are made a
/// second apart, so deadlines (and the order `tick` takes them in) never tie.
async fn set_up(engine: &Engine, clock: &ManualClock) -> Targets {
    let mut targets: Targets = Default::default();
    engine
        .create_topup(&topup("funds", "42", "2000"))
        .await
        .unwrap();
    for (n, (network, method, _)) in NETWORKS.into_iter().enumerate() {
        let top_up = format!("T-{n}");
        let rent = format!("R-{n}");
        engine
            .create_topup(&topup(&top_up, "42", "500"))
            .await
            .unwrap();
        engine
            .create_rental_order(&rental(&rent, "42", "420"))
            .await
            .unwrap();
        for reference in [&top_up, &top_up, &rent] {
            clock.advance(Duration::seconds(1));
            let pay = engine
                .create_payment(&OrderRef::new(reference.as_str()).unwrap(), method)
                .await
                .unwrap();
            targets[n].push((pay.intent.watch_key, pay.intent.amount.base_units()));
        }
        targets[n].push((format!("unwatched-{network}"), targets[n][0].1));
    }
    targets
}

/// Each network's watcher log, heights increasing.
fn logs(plans: &[Vec<TransferPlan>; 3], targets: &Targets) -> [Vec<ChainEvent>; 3] {
    std::array::from_fn(|n| {
        let (network, method, required) = NETWORKS[n];
        let mut height = 1000u64;
        let mut log = Vec::new();
        for (i, plan) in plans[n].iter().enumerate() {
            let (to, amount) = &targets[n][plan.target];
            let seen_at = if plan.late {
                start_time() + Duration::minutes(70)
            } else {
                start_time()
            };
            let mut tx = Tx::new(
                network,
                &format!("{network}-{i}"),
                to,
                method,
                amount * plan.quarters / 4,
                seen_at,
            );
            if plan.wrong_asset {
                tx.asset = match method {
                    Method::UsdtErc20 => ReceivedAsset::Method {
                        method: Method::UsdcErc20,
                    },
                    Method::Trx => ReceivedAsset::Method {
                        method: Method::UsdtTrc20,
                    },
                    _ => ReceivedAsset::OtherToken {
                        contract: "fake-token".into(),
                    },
                };
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

/// The logs interleaved by the scenario, with replays of what was already delivered.
fn delivery(scenario: &Scenario, logs: &[Vec<ChainEvent>; 3]) -> Vec<ChainEvent> {
    let mut cursors = [0usize; 3];
    let mut delivered: Vec<ChainEvent> = Vec::new();
    let mut steps = scenario.interleaving.iter().cycle();
    let mut replays = scenario.replays.iter().cycle();
    while cursors.iter().zip(logs).any(|(c, log)| *c < log.len()) {
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
}

/// Runs the scenario along `path`; returns which calls succeeded and the database's contents.
async fn run(db: Db, scenario: &Scenario, path: MatcherPath) -> (Vec<bool>, Vec<String>) {
    let test_db = TestDb::new(db).await;
    let (engine, clock) = engine(&test_db, config(|_| {})).await;
    let engine = engine.with_matcher_path(path);
    let targets = set_up(&engine, &clock).await;
    let events = delivery(scenario, &logs(&scenario.plans, &targets));
    let mut outcomes = Vec::new();
    let mut rest = events.as_slice();
    let mut step = 0;
    while !rest.is_empty() {
        let size = scenario.batch_sizes[step % scenario.batch_sizes.len()].min(rest.len());
        let (batch, after) = rest.split_at(size);
        rest = after;
        outcomes.push(engine.apply_chain_events(batch).await.is_ok());
        match scenario.between[step % scenario.between.len()] {
            Between::Nothing => {}
            Between::Wait => clock.advance(Duration::minutes(25)),
            Between::Tick => outcomes.push(engine.tick().await.is_ok()),
            Between::PayRental(n) => {
                let order = OrderRef::new(format!("R-{n}")).unwrap();
                outcomes.push(engine.pay_order_from_balance(&order).await.is_ok());
            }
        }
        step += 1;
    }
    clock.advance(Duration::hours(2));
    outcomes.push(engine.tick().await.is_ok());
    let trial = engine.trial_balance().await.unwrap();
    assert!(trial.is_sound(), "{trial:?}");
    (outcomes, contents(&test_db).await)
}

/// Every row the matcher writes, as text, with what differs by construction taken out:
/// intent ids (random) are replaced by their watch keys, sequence numbers by order; feed
/// positions and entries' content hashes (over the random ids) are left out.
async fn contents(db: &TestDb) -> Vec<String> {
    const TABLES: [(&str, &str); 9] = [
        (
            "customers",
            "SELECT account_id, created_at_ms FROM customers ORDER BY account_id",
        ),
        (
            "orders",
            "SELECT reference, kind, account_id, total_usd_cents, status, settled_via, settlement_entry, \
             settled_at_ms, attention FROM orders ORDER BY reference",
        ),
        (
            "derivation_counters",
            "SELECT key_id, next_index FROM derivation_counters ORDER BY key_id",
        ),
        (
            "payment_intents",
            "SELECT id, order_ref, method, watch_key, derivation_index, amount_base, usd_cents, status, \
             superseded_by, marked_paid_at_ms, first_seen_at_ms, settled_at_ms, settlement_count \
             FROM payment_intents ORDER BY watch_key",
        ),
        (
            "transfers",
            "SELECT network, txid, position, to_address, asset, amount_base, intent_id, confirmations, \
             block_height, removed, tip_height, seen_at_ms, updated_at_ms, credited_entry \
             FROM transfers ORDER BY network, txid, position",
        ),
        (
            "exceptions",
            "SELECT id, kind, intent_id, order_ref, transfer, detail, opened_at_ms, resolved_at_ms \
             FROM exceptions ORDER BY id",
        ),
        (
            "intent_events",
            "SELECT intent_id, order_ref, kind, detail, at_ms FROM intent_events ORDER BY seq",
        ),
        (
            "journal_entries",
            "SELECT idempotency_key, kind, reference, memo, posted_at_ms \
             FROM journal_entries ORDER BY seq",
        ),
        (
            "postings",
            "SELECT j.idempotency_key, p.leg, p.account, p.currency, p.amount FROM postings p \
             JOIN journal_entries j ON j.seq = p.entry_seq ORDER BY j.seq, p.leg",
        ),
    ];
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let ids: Vec<(String, String)> = sqlx::query_as("SELECT id, watch_key FROM payment_intents")
        .fetch_all(&pool)
        .await
        .unwrap();
    let mut lines = Vec::new();
    for (table, sql) in TABLES {
        for row in sqlx::query(sql).fetch_all(&pool).await.unwrap() {
            let cells: Vec<String> = (0..row.len())
                .map(|i| match row.try_get::<Option<i64>, _>(i) {
                    Ok(number) => format!("{number:?}"),
                    Err(_) => format!("{:?}", row.try_get::<Option<String>, _>(i).unwrap()),
                })
                .collect();
            let mut line = format!("{table}: {}", cells.join(" | "));
            for (id, watch_key) in &ids {
                line = line.replace(id, &format!("intent<{watch_key}>"));
            }
            lines.push(line);
        }
    }
    pool.close().await;
    lines
}

fn same_contents(db: Db, scenario: Scenario) {
    common::runtime().block_on(async {
        let (reference_outcomes, reference) = run(db, &scenario, MatcherPath::OneByOne).await;
        let (batched_outcomes, batched) = run(db, &scenario, MatcherPath::Batched).await;
        assert_eq!(
            reference_outcomes, batched_outcomes,
            "the same calls succeed"
        );
        let differences: Vec<String> = reference
            .iter()
            .zip(&batched)
            .filter(|(a, b)| a != b)
            .map(|(a, b)| format!("one by one: {a}\nbatched:    {b}"))
            .collect();
        assert!(
            differences.is_empty() && reference.len() == batched.len(),
            "{} rows against {}; first differences:\n{}",
            reference.len(),
            batched.len(),
            differences
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, max_shrink_iters: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_batched_matcher_writes_what_the_reference_writes_on_sqlite(scenario in scenario()) {
        same_contents(Db::Sqlite, scenario);
    }

    #[test]
    fn the_batched_matcher_writes_what_the_reference_writes_on_postgres(scenario in scenario()) {
        same_contents(Db::Postgres, scenario);
    }
}

/// The decision alone, without a database: one intent, its order and its transfers drawn from
/// the same plans as the scenarios above (late, the wrong asset, removed, under and over), in
/// any state the matcher can find them.
mod decisions {
    use super::*;
    use chrono::{DateTime, Utc};
    use payrecon::chain::{Amount, TransferId};
    use payrecon::config::CreditPolicy;
    use payrecon::test_utils::intent::IntentRate;
    use payrecon::test_utils::matcher::{Booking, BookingKey, MatchPolicy, Step, decide};
    use payrecon::{
        AccountId, IntentStatus, Order, OrderKind, OrderStatus, PaymentIntent, StoredTransfer, Usd,
    };

    /// What is asked, in base units: divisible by four, as the plans' quarters need.
    const ASKED: u128 = 4_000_000;

    #[derive(Clone, Debug)]
    struct Case {
        network: usize,
        plans: Vec<TransferPlan>,
        /// Transfers already credited by an earlier evaluation (by index, if present).
        credited_before: Vec<bool>,
        settled_before: bool,
        topup: bool,
        minutes_after_creation: i64,
        tolerance_bps: u32,
        credit_extra: bool,
    }

    fn case() -> impl Strategy<Value = Case> {
        (
            0usize..3,
            prop::collection::vec(transfer_plan(), 0..8),
            prop::collection::vec(prop::bool::weighted(0.2), 8),
            prop::bool::weighted(0.2),
            any::<bool>(),
            0i64..180,
            prop_oneof![Just(0u32), Just(50), Just(2_500)],
            any::<bool>(),
        )
            .prop_map(
                |(
                    network,
                    plans,
                    credited_before,
                    settled_before,
                    topup,
                    minutes_after_creation,
                    tolerance_bps,
                    credit_extra,
                )| Case {
                    network,
                    plans,
                    credited_before,
                    settled_before,
                    topup,
                    minutes_after_creation,
                    tolerance_bps,
                    credit_extra,
                },
            )
    }

    struct World {
        intent: PaymentIntent,
        order: Order,
        transfers: Vec<StoredTransfer>,
        policy: MatchPolicy,
        now: DateTime<Utc>,
    }

    fn world(case: &Case) -> World {
        let (network, method, required) = NETWORKS[case.network];
        let created_at = start_time();
        let deadline = created_at + Duration::minutes(60);
        let reference = payrecon::OrderRef::new("order-1").unwrap();
        let intent = PaymentIntent {
            id: "pi_1".into(),
            order_ref: reference.clone(),
            method,
            pay_to: "addr".into(),
            watch_key: "addr".into(),
            amount: Amount::from_base_units(ASKED),
            usd: Usd::from_dollars(100),
            rate: IntentRate {
                usd_per_unit: rust_decimal::Decimal::new(25, 0),
                source: "recorded".into(),
                fetched_at: created_at,
            },
            created_at,
            deadline,
            monitor_until: created_at + Duration::days(7),
            status: if case.settled_before {
                IntentStatus::Settled
            } else {
                IntentStatus::AwaitingPayment
            },
            superseded_by: None,
            marked_paid_at: None,
            first_seen_at: None,
            settled_at: case.settled_before.then_some(created_at),
            settlement_count: u32::from(case.settled_before),
            key_id: "key".into(),
            derivation_index: 0,
            checkout_key: "checkout".into(),
        };
        let order = Order {
            reference,
            account_id: AccountId::new("42").unwrap(),
            kind: if case.topup {
                OrderKind::Topup
            } else {
                rental_kind()
            },
            total_usd: Usd::from_dollars(100),
            status: if case.settled_before {
                OrderStatus::Settled {
                    via: payrecon::test_utils::order::SettledVia::Payment,
                    entry_key: "settle:pi_1:1".into(),
                    at: created_at,
                }
            } else {
                OrderStatus::Open
            },
            created_at,
            attention: None,
        };
        let transfers = case
            .plans
            .iter()
            .enumerate()
            .map(|(i, plan)| {
                let other = NETWORKS[(case.network + 1) % 3].1;
                let seen = if plan.late {
                    deadline + Duration::minutes(5)
                } else {
                    created_at + Duration::minutes(i as i64)
                };
                let confirmations = match plan.life {
                    Life::Pending => 0,
                    _ => required,
                };
                StoredTransfer {
                    id: TransferId {
                        network,
                        txid: format!("{i:064x}"),
                        position: 0,
                    },
                    to_address: "addr".into(),
                    asset: ReceivedAsset::Method {
                        method: if plan.wrong_asset { other } else { method },
                    },
                    amount: Amount::from_base_units(ASKED / 4 * plan.quarters),
                    from_address: None,
                    intent_id: Some("pi_1".into()),
                    confirmations,
                    block_height: (confirmations > 0).then_some(100),
                    removed: matches!(plan.life, Life::ConfirmedThenRemoved),
                    tip_height: 100 + u64::from(confirmations),
                    seen_at_ms: seen.timestamp_millis(),
                    credited_entry: (case.credited_before[i]
                        && confirmations > 0
                        && !matches!(plan.life, Life::ConfirmedThenRemoved))
                    .then(|| format!("earlier:{i}")),
                }
            })
            .collect();
        let mut policy = MatchPolicy::defaults();
        policy.underpayment_tolerance_bps = case.tolerance_bps;
        if case.credit_extra {
            policy.overpayment = CreditPolicy::CreditBalance;
            policy.late_payment = CreditPolicy::CreditBalance;
        }
        World {
            intent,
            order,
            transfers,
            policy,
            now: created_at + Duration::minutes(case.minutes_after_creation),
        }
    }

    fn rental_kind() -> OrderKind {
        serde_json::from_value(serde_json::json!({
            "kind": "rental", "gpu_model": "H100", "gpu_count": 1, "duration_days": 7, "lots": 1
        }))
        .unwrap()
    }

    /// The key a booking posts under when nothing holds its base yet.
    fn first_key(booking: &Booking) -> String {
        match &booking.key {
            BookingKey::Fixed(key) => key.clone(),
            BookingKey::Next { base, .. } => base.clone(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

        #[test]
        fn every_decision_credits_each_transfer_once_balances_and_settles_only_what_was_paid(case in case()) {
            let World { intent, order, mut transfers, policy, now } = world(&case);
            let decision = decide(&intent, &order, &transfers, &policy, now).unwrap();
            prop_assert_eq!(&decision, &decide(&intent, &order, &transfers, &policy, now).unwrap(), "a decision is a function of its inputs");
            prop_assert!(intent.status.can_become(decision.intent.status));

            let mut credited = std::collections::BTreeSet::new();
            let mut settled_crypto = 0u128;
            for step in &decision.steps {
                if let Step::Booking(booking) = step {
                    let mut entry = booking.entry.clone();
                    entry.idempotency_key = first_key(booking);
                    prop_assert!(entry.validate().is_ok(), "{:?}", entry);
                    for index in &booking.credits {
                        let transfer = &transfers[*index];
                        prop_assert!(!transfer.removed && transfer.credited_entry.is_none(), "only live, uncredited money is booked");
                        prop_assert!(credited.insert(*index), "transfer {} booked twice", index);
                    }
                    if entry.idempotency_key.starts_with("settle:") {
                        settled_crypto += entry.postings[0].amount_minor as u128;
                    }
                }
            }
            let settles = decision.steps.iter().any(|s| matches!(s, Step::SettleOrder { .. }));
            prop_assert!(settled_crypto <= ASKED, "an order is settled for at most its amount");
            prop_assert_eq!(settles, !case.settled_before && decision.intent.status == IntentStatus::Settled);
            if settles {
                prop_assert_eq!(decision.intent.settlement_count, intent.settlement_count + 1);
            }

            // Evaluated again with what was decided written, nothing more is booked: the same
            // transfer seen twice, or the intent re-derived, never credits twice.
            for step in &decision.steps {
                if let Step::Booking(booking) = step {
                    for index in &booking.credits {
                        transfers[*index].credited_entry = Some(first_key(booking));
                    }
                }
            }
            let order = if settles {
                Order { status: OrderStatus::Settled { via: payrecon::test_utils::order::SettledVia::Payment, entry_key: "settle".into(), at: now }, ..order }
            } else {
                order
            };
            let again = decide(&decision.intent, &order, &transfers, &policy, now).unwrap();
            prop_assert!(!again.steps.iter().any(|s| matches!(s, Step::Booking(_) | Step::SettleOrder { .. })), "{:?}", again.steps);
            prop_assert_eq!(again.intent.status, decision.intent.status);
        }
    }
}
