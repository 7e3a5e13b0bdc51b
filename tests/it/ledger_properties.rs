//! Property: whatever sequence of postings, replays and concurrent debits arrives, every
//! currency sums to zero, no idempotency key is posted twice, and no balance goes negative —
//! on SQLite and on PostgreSQL.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use common::{Db, TestDb, account, btc_topup_credit};
use payrecon::Error;
use payrecon::ledger::{Account, Currency, EntryKind, LedgerError, NewEntry, PostOutcome, Posting};
use proptest::prelude::*;

const CUSTOMERS: [&str; 3] = ["c0", "c1", "c2"];

#[derive(Clone, Debug)]
enum Op {
    /// A confirmed top-up credit.
    Credit { customer: usize, cents: i128 },
    /// A rental paid from the balance.
    Debit { customer: usize, cents: i128 },
    /// The n-th earlier operation's entry, posted again unchanged.
    Replay(usize),
    /// The n-th earlier operation's key with other content.
    ConflictingReplay(usize),
    /// Several debits of one customer at once.
    ConcurrentDebits { customer: usize, cents: Vec<i128> },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize, 1..50_000i128).prop_map(|(customer, cents)| Op::Credit { customer, cents }),
        3 => (0..3usize, 1..30_000i128).prop_map(|(customer, cents)| Op::Debit { customer, cents }),
        2 => any::<usize>().prop_map(Op::Replay),
        1 => any::<usize>().prop_map(Op::ConflictingReplay),
        2 => (0..3usize, prop::collection::vec(1..20_000i128, 2..6))
            .prop_map(|(customer, cents)| Op::ConcurrentDebits { customer, cents }),
    ]
}

fn debit(key: &str, customer: &str, cents: i128) -> NewEntry {
    NewEntry {
        idempotency_key: key.into(),
        kind: EntryKind::BalancePayment,
        reference: None,
        memo: String::new(),
        postings: vec![
            Posting::debit(
                Account::CustomerBalance(account(customer)),
                Currency::Usd,
                cents,
            ),
            Posting::credit(Account::RevenueRentals, Currency::Usd, cents),
        ],
    }
}

async fn check(db: Db, ops: Vec<Op>) {
    let test_db = TestDb::new(db).await;
    let engine = Arc::new(test_db.engine().await);
    let mut model: BTreeMap<usize, i128> = BTreeMap::new();
    let mut posted: Vec<NewEntry> = Vec::new();
    let mut keys = BTreeSet::new();

    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Credit { customer, cents } => {
                let entry =
                    btc_topup_credit(&format!("credit:{step}"), CUSTOMERS[customer], 1_000, cents);
                assert_eq!(
                    engine.post_entry(&entry).await.unwrap(),
                    PostOutcome::Posted
                );
                *model.entry(customer).or_default() += cents;
                posted.push(entry);
            }
            Op::Debit { customer, cents } => {
                let entry = debit(&format!("debit:{step}"), CUSTOMERS[customer], cents);
                let available = model.get(&customer).copied().unwrap_or(0);
                match engine.post_entry(&entry).await {
                    Ok(PostOutcome::Posted) => {
                        assert!(
                            available >= cents,
                            "debit of {cents} with {available} available"
                        );
                        *model.entry(customer).or_default() -= cents;
                        posted.push(entry);
                    }
                    Err(Error::Ledger(LedgerError::Overdraft { .. })) => assert!(available < cents),
                    other => panic!("unexpected {other:?}"),
                }
            }
            Op::Replay(n) if !posted.is_empty() => {
                let entry = &posted[n % posted.len()];
                assert_eq!(
                    engine.post_entry(entry).await.unwrap(),
                    PostOutcome::AlreadyPosted
                );
            }
            Op::ConflictingReplay(n) if !posted.is_empty() => {
                let mut entry = posted[n % posted.len()].clone();
                entry.memo.push_str(" (changed)");
                assert!(matches!(
                    engine.post_entry(&entry).await,
                    Err(Error::Ledger(LedgerError::IdempotencyConflict(_)))
                ));
            }
            Op::Replay(_) | Op::ConflictingReplay(_) => {}
            Op::ConcurrentDebits { customer, cents } => {
                let tasks: Vec<_> = cents
                    .iter()
                    .enumerate()
                    .map(|(i, amount)| {
                        let entry =
                            debit(&format!("burst:{step}:{i}"), CUSTOMERS[customer], *amount);
                        let engine = engine.clone();
                        tokio::spawn(async move { (engine.post_entry(&entry).await, entry) })
                    })
                    .collect();
                for task in tasks {
                    let (result, entry) = task.await.unwrap();
                    match result {
                        Ok(PostOutcome::Posted) => {
                            *model.entry(customer).or_default() -= entry.postings[0].amount_minor;
                            posted.push(entry);
                        }
                        Err(Error::Ledger(LedgerError::Overdraft { .. })) => {}
                        other => panic!("unexpected {other:?}"),
                    }
                }
                let left = model.get(&customer).copied().unwrap_or(0);
                assert!(left >= 0, "concurrent debits overdrew the model");
            }
        }
    }

    for entry in &posted {
        assert!(
            keys.insert(entry.idempotency_key.clone()),
            "key posted twice"
        );
    }
    let trial = engine.trial_balance().await.unwrap();
    assert!(trial.is_sound(), "{trial:?}");
    assert_eq!(
        trial.entries as usize,
        posted.len(),
        "one stored entry per accepted key"
    );
    for (index, name) in CUSTOMERS.iter().enumerate() {
        let balance = engine.available_balance(&account(name)).await.unwrap();
        let expected = model.get(&index).copied().unwrap_or(0);
        assert_eq!(i128::from(balance.cents()), expected, "{name}");
    }
}

/// A crypto amount of any size: SQLite sums the short ones (up to 18 characters, sign
/// included) as integers and slices the longer ones into limbs, so both sides of that line,
/// and values far beyond it, turn up.
fn crypto_amount() -> impl Strategy<Value = i128> {
    prop_oneof![
        1..1_000i128,
        10i128.pow(16)..10i128.pow(17),
        10i128.pow(17)..10i128.pow(18),
        10i128.pow(18)..10i128.pow(19),
        10i128.pow(19)..10i128.pow(30),
        10i128.pow(30)..10i128.pow(36),
    ]
}

/// Property: the trial balance and the reconciliation report's ledger figures are the exact
/// sums of what was posted, however large and however mixed the amounts.
async fn check_exact_sums(db: Db, amounts: Vec<i128>) {
    use payrecon::ledger::SuspenseReason;
    use payrecon::{CsvSection, ReportFormat, ReportQuery};
    use payrecon_chain_core::Method;

    let test_db = TestDb::new(db).await;
    let engine = test_db.engine().await;
    let eth = Currency::Crypto(Method::Eth);
    for (index, amount) in amounts.iter().enumerate() {
        let entry = NewEntry {
            idempotency_key: format!("unmatched:sum:{index}"),
            kind: EntryKind::Payment,
            reference: None,
            memo: "held: unmatched".into(),
            postings: vec![
                Posting::debit(Account::Custody(Method::Eth), eth, *amount),
                Posting::credit(Account::Suspense(SuspenseReason::Unmatched), eth, *amount),
            ],
        };
        engine.post_entry(&entry).await.unwrap();
    }
    let total: i128 = amounts.iter().sum();
    let trial = engine.trial_balance().await.unwrap();
    assert!(trial.is_sound(), "{trial:?}");
    let balance = |name: &str| {
        trial
            .accounts
            .iter()
            .find(|line| line.account == name)
            .map(|line| line.balance_minor)
    };
    assert_eq!(balance("custody:ethereum:ETH"), Some(total));
    assert_eq!(balance("suspense:unmatched"), Some(-total));

    let now = chrono::Utc::now();
    let query = ReportQuery {
        from: now - chrono::Duration::hours(1),
        to: now + chrono::Duration::hours(1),
        method: Some(Method::Eth),
    };
    let totals = engine
        .write_reconciliation(&query, ReportFormat::Csv, CsvSection::Summary, Vec::new())
        .await
        .unwrap();
    let summary = &totals.methods[0];
    assert_eq!(summary.booked, eth.format(total));
    assert_eq!(summary.held, eth.format(total));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn ledger_invariants_hold_on_sqlite(ops in prop::collection::vec(op(), 1..40)) {
        common::runtime().block_on(check(Db::Sqlite, ops));
    }

    #[test]
    fn ledger_invariants_hold_on_postgres(ops in prop::collection::vec(op(), 1..40)) {
        common::runtime().block_on(check(Db::Postgres, ops));
    }

    #[test]
    fn exact_sums_on_sqlite(amounts in prop::collection::vec(crypto_amount(), 1..12)) {
        common::runtime().block_on(check_exact_sums(Db::Sqlite, amounts));
    }

    #[test]
    fn exact_sums_on_postgres(amounts in prop::collection::vec(crypto_amount(), 1..12)) {
        common::runtime().block_on(check_exact_sums(Db::Postgres, amounts));
    }
}
