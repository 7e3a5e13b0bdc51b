//! Property, on SQLite and PostgreSQL: over random event logs (payments, late payments,
//! overpayments, reorgs, spending, operator actions, clocks that lag, and months closed along
//! the way) every exported journal balances per entry, per period and per currency; the
//! exports move each account exactly as the ledger does in the period; a closed month's
//! report and exports stay byte-identical; what happens after a close is booked in the first
//! open month, with a reference to the original; the roll-forward closes and chains; and
//! nothing is valued at zero.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use common::books::export;
use common::payments::Tx;
use common::{Db, TestDb, rental, topup};
use payrecon::test_utils::clock::{Clock, ManualClock};
use payrecon::{Action, Engine, JournalFormat, OrderRef, Period};
use payrecon_chain_core::{Method, Network};
use proptest::prelude::*;
use rust_decimal::Decimal;
use sqlx::Row;

const QUOTES: &str = r#"{
  "fetched_at": "2030-01-01T00:00:00Z",
  "quotes": {"BTC": "80000", "ETH": "3000", "USDT": "1", "USDC": "1", "TRX": "0.25", "SOL": "150", "LTC": "100"},
  "timed": [
    {"at": "2026-09-01T00:00:00Z", "quotes": {"LTC": "97.13"}, "usd_per_eur": "1.1093"},
    {"at": "2026-10-15T00:00:00Z", "quotes": {"LTC": "104.77"}, "usd_per_eur": "1.0871"},
    {"at": "2026-11-20T00:00:00Z", "quotes": {"LTC": "101.01"}, "usd_per_eur": "1.1500"}
  ]
}"#;

const FORMATS: [JournalFormat; 4] = [
    JournalFormat::Generic,
    JournalFormat::Datev,
    JournalFormat::Xero,
    JournalFormat::Qbo,
];

#[derive(Clone, Debug)]
enum Op {
    /// A 100 USD top-up paid in LTC: exactly, twice the amount, or after its deadline.
    Pay { customer: usize, how: u8 },
    /// A rental of 420 USD from the balance (refused when it does not cover it).
    Spend { customer: usize },
    /// The n-th transfer leaves the chain.
    Reorg(usize),
    /// The n-th transfer leaves the chain, seen by a process whose clock still reads the last
    /// closed month.
    LaggingReorg(usize),
    /// The oldest open exception is resolved.
    Resolve,
    /// Time passes.
    Advance { hours: i64 },
    /// The next month that has ended closes.
    Close,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..3usize, 0..3u8).prop_map(|(customer, how)| Op::Pay { customer, how }),
        2 => (0..3usize).prop_map(|customer| Op::Spend { customer }),
        2 => any::<usize>().prop_map(Op::Reorg),
        1 => any::<usize>().prop_map(Op::LaggingReorg),
        2 => Just(Op::Resolve),
        3 => (1..400i64).prop_map(|hours| Op::Advance { hours }),
        2 => Just(Op::Close),
    ]
}

async fn engine(db: &TestDb, dir: &Path, clock: Arc<ManualClock>) -> Engine {
    std::fs::write(dir.join("quotes.json"), QUOTES).unwrap();
    let config = common::payments::config(|c| {
        c.books.reporting_currency = Some("EUR".into());
        c.books.timezone = "Europe/Berlin".into();
    });
    common::books::engine_with_recorded_quotes(db, config, &dir.join("quotes.json"), clock).await
}

/// A closed month as it was when it closed.
struct Closed {
    period: Period,
    last_seq: i64,
    report: String,
    exports: Vec<Vec<Vec<u8>>>,
}

/// An entry as plain SQL reads it: journal position, key, booking time, legs (account,
/// currency, amount).
type JournalRow = (i64, String, DateTime<Utc>, Vec<(String, String, i128)>);

/// Every entry, read by plain SQL.
async fn journal(pool: &sqlx::AnyPool) -> Vec<JournalRow> {
    let rows = sqlx::query(
        "SELECT j.seq, j.idempotency_key, COALESCE(j.booked_at_ms, j.posted_at_ms), p.account, p.currency, p.amount \
         FROM journal_entries j JOIN postings p ON p.entry_seq = j.seq ORDER BY j.seq, p.leg",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut entries: Vec<JournalRow> = Vec::new();
    for row in rows {
        let seq: i64 = row.get(0);
        let leg = (
            row.get(3),
            row.get(4),
            row.get::<String, _>(5).parse().unwrap(),
        );
        match entries.last_mut() {
            Some(last) if last.0 == seq => last.3.push(leg),
            _ => entries.push((
                seq,
                row.get(1),
                DateTime::from_timestamp_millis(row.get(2)).unwrap(),
                vec![leg],
            )),
        }
    }
    entries
}

fn csv_rows(bytes: &[u8], delimiter: u8, skip: usize) -> Vec<Vec<String>> {
    let text: String = bytes.iter().map(|b| char::from(*b)).collect();
    common::books::records(&text, delimiter)
        .into_iter()
        .skip(skip)
        .collect()
}

fn cents(text: &str) -> i128 {
    let value: Decimal = text.replace(',', ".").parse().unwrap();
    (value * Decimal::ONE_HUNDRED).try_into().unwrap()
}

async fn run(db: Db, ops: Vec<Op>) {
    let test_db = TestDb::new(db).await;
    let dir = tempfile::tempdir().unwrap();
    let zone: chrono_tz::Tz = "Europe/Berlin".parse().unwrap();
    let clock = Arc::new(ManualClock::new("2026-09-20T10:00:00Z".parse().unwrap()));
    let engine = engine(&test_db, dir.path(), clock.clone()).await;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&test_db.url).await.unwrap();
    let mut transfers: Vec<Tx> = Vec::new();
    let mut closed: Vec<Closed> = Vec::new();
    let mut height = 100;

    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Pay { customer, how } => {
                let reference = format!("T{step}");
                engine
                    .create_topup(&topup(&reference, &format!("c{customer}"), "100"))
                    .await
                    .unwrap();
                let pay = engine
                    .create_payment(&OrderRef::new(&reference).unwrap(), Method::Ltc)
                    .await
                    .unwrap();
                if how == 2 {
                    clock.advance(Duration::hours(3));
                }
                let units = if how == 1 { 200_000_000 } else { 100_000_000 };
                let tx = Tx::new(
                    Network::Litecoin,
                    &format!("tx{step}"),
                    &pay.intent.watch_key,
                    Method::Ltc,
                    units,
                    clock.now(),
                );
                height += 1;
                engine
                    .apply_chain_events(&[tx.observed(6, height)])
                    .await
                    .unwrap();
                transfers.push(tx);
            }
            Op::Spend { customer } => {
                let reference = format!("R{step}");
                engine
                    .create_rental_order(&rental(&reference, &format!("c{customer}"), "420"))
                    .await
                    .unwrap();
                let _ = engine
                    .pay_order_from_balance(&OrderRef::new(&reference).unwrap())
                    .await;
            }
            Op::Reorg(n) | Op::LaggingReorg(n) if !transfers.is_empty() => {
                // A lagging process's clock still reads the last hour of the last closed month.
                let now = clock.now();
                let lagging = matches!(op, Op::LaggingReorg(_))
                    .then(|| {
                        closed
                            .last()
                            .map(|c| c.period.bounds(zone).1 - Duration::hours(1))
                    })
                    .flatten();
                if let Some(lagging) = lagging {
                    clock.set(lagging);
                }
                let tx = &transfers[n % transfers.len()];
                height += 1;
                engine
                    .apply_chain_events(&[tx.removed(height)])
                    .await
                    .unwrap();
                clock.set(now);
            }
            Op::Reorg(_) | Op::LaggingReorg(_) => {}
            Op::Resolve => {
                let open = engine.exceptions_page(true, None, 1).await.unwrap();
                if let Some(exception) = open.items.first() {
                    let action = match exception.kind.as_str() {
                        "overpaid" | "paid_late" => Action::CreditBalance {
                            account: None,
                            usd: None,
                        },
                        _ => Action::Dismiss,
                    };
                    let _ = engine
                        .resolve_exception(&exception.id, &action, "olga", "property test")
                        .await;
                }
            }
            Op::Advance { hours } => clock.advance(Duration::hours(hours)),
            Op::Close => {
                let next = match closed.last() {
                    Some(c) => c.period.next(),
                    None => Period::containing("2026-09-20T10:00:00Z".parse().unwrap(), zone),
                };
                if next.bounds(zone).1 > clock.now() {
                    continue;
                }
                let pass = engine.value_entries().await.unwrap();
                assert_eq!(pass.failed, 0, "{pass:?}");
                engine.close_period(next, "fin").await.unwrap();
                let last_seq = journal(&pool).await.last().map_or(0, |e| e.0);
                let mut exports = Vec::new();
                for format in FORMATS {
                    exports.push(export(&engine, next, format).await);
                }
                closed.push(Closed {
                    period: next,
                    last_seq,
                    report: engine.period_report(next).await.unwrap(),
                    exports,
                });
            }
        }
    }

    // Nothing is valued at zero: every entry gets a positive rate, or stays unvalued.
    let pass = engine.value_entries().await.unwrap();
    assert_eq!(pass.failed, 0, "{pass:?}");
    let rates = sqlx::query(
        "SELECT crypto_currency, usd_per_unit, usd_per_reporting FROM entry_valuations",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for row in rates {
        let crypto: Option<String> = row.get(0);
        let usd: Option<String> = row.get(1);
        assert_eq!(crypto.is_some(), usd.is_some());
        if let Some(usd) = usd {
            assert!(usd.parse::<Decimal>().unwrap() > Decimal::ZERO);
        }
        let eur: String = row
            .get::<Option<String>, _>(2)
            .expect("every entry has its EUR rate");
        assert!(eur.parse::<Decimal>().unwrap() > Decimal::ZERO);
    }

    // Closed months did not change, and nothing posted after a close landed in it.
    let entries = journal(&pool).await;
    for month in &closed {
        assert_eq!(
            engine.period_report(month.period).await.unwrap(),
            month.report,
            "{} report",
            month.period
        );
        for (format, before) in FORMATS.into_iter().zip(&month.exports) {
            assert_eq!(
                &export(&engine, month.period, format).await,
                before,
                "{} {format:?}",
                month.period
            );
        }
        let (from, to) = month.period.bounds(zone);
        for (seq, key, booked, _) in &entries {
            if *seq > month.last_seq {
                assert!(
                    !(from..to).contains(booked),
                    "{key} posted after {} closed is booked in it",
                    month.period
                );
            }
        }
    }

    // Every month from the first to now: exports balance and move what the ledger moves; the
    // roll-forward closes and chains.
    let first = Period::containing("2026-09-20T10:00:00Z".parse().unwrap(), zone);
    let last = Period::containing(clock.now(), zone);
    let mut period = first;
    let mut previous_closing = 0;
    loop {
        let (from, to) = period.bounds(zone);
        let mut ledger: BTreeMap<(String, String), i128> = BTreeMap::new();
        for (_, _, booked, legs) in entries.iter().filter(|e| (from..to).contains(&e.2)) {
            let _ = booked;
            for (account, currency, amount) in legs {
                *ledger
                    .entry((account.clone(), currency.clone()))
                    .or_default() += amount;
            }
        }
        ledger.retain(|_, v| *v != 0);

        let generic = export(&engine, period, JournalFormat::Generic)
            .await
            .remove(0);
        let rows = csv_rows(&generic, b',', 1);
        let mut per_entry: BTreeMap<(String, String), i128> = BTreeMap::new();
        let mut values: BTreeMap<String, (i128, i128)> = BTreeMap::new();
        let mut exported: BTreeMap<(String, String), i128> = BTreeMap::new();
        for row in &rows {
            let amount: i128 = row[9].parse().unwrap();
            *per_entry
                .entry((row[0].clone(), row[8].clone()))
                .or_default() += amount;
            *exported
                .entry((row[4].clone(), row[8].clone()))
                .or_default() += amount;
            let value = values.entry(row[0].clone()).or_default();
            value.0 += cents(&row[10]);
            value.1 += cents(&row[12]);
            if row[3] == "reversal" {
                assert!(
                    row[15].contains("(reverses PR-"),
                    "a reversal names its original: {row:?}"
                );
            }
            if row[4].starts_with("custody:") {
                assert_ne!(cents(&row[10]), 0, "custody valued at zero: {row:?}");
            }
        }
        assert!(
            per_entry.values().all(|s| *s == 0),
            "{period}: an entry does not balance in its currency"
        );
        assert!(
            values.values().all(|(usd, eur)| *usd == 0 && *eur == 0),
            "{period}: an entry does not balance in value"
        );
        exported.retain(|_, v| *v != 0);
        assert_eq!(
            exported, ledger,
            "{period}: the export moves what the ledger moves"
        );

        let report: serde_json::Value =
            serde_json::from_str(&engine.period_report(period).await.unwrap()).unwrap();
        let mut movement: BTreeMap<String, i128> = BTreeMap::new();
        for account in report["accounts"].as_array().unwrap() {
            let net = cents(account["debits"]["amount"].as_str().unwrap())
                - cents(account["credits"]["amount"].as_str().unwrap());
            movement.insert(account["code"].as_str().unwrap().to_owned(), net);
        }
        assert_eq!(
            movement.values().sum::<i128>(),
            0,
            "{period}: debits equal credits"
        );
        movement.retain(|_, v| *v != 0);
        for format in [
            JournalFormat::Datev,
            JournalFormat::Xero,
            JournalFormat::Qbo,
        ] {
            let mut net: BTreeMap<String, i128> = BTreeMap::new();
            for file in export(&engine, period, format).await {
                let (delimiter, skip) = if format == JournalFormat::Datev {
                    (b';', 2)
                } else {
                    (b',', 1)
                };
                for row in csv_rows(&file, delimiter, skip) {
                    match format {
                        JournalFormat::Datev => {
                            let amount = cents(&row[4]);
                            let (debited, credited) = if row[1] == "S" {
                                (&row[6], &row[7])
                            } else {
                                (&row[7], &row[6])
                            };
                            *net.entry(debited.clone()).or_default() += amount;
                            *net.entry(credited.clone()).or_default() -= amount;
                        }
                        JournalFormat::Xero => {
                            *net.entry(row[3].clone()).or_default() += cents(&row[5])
                        }
                        _ => {
                            let code = report["accounts"]
                                .as_array()
                                .unwrap()
                                .iter()
                                .find(|a| a["name"] == row[2].as_str())
                                .unwrap()["code"]
                                .as_str()
                                .unwrap()
                                .to_owned();
                            let debit = if row[4].is_empty() { 0 } else { cents(&row[4]) };
                            let credit = if row[5].is_empty() { 0 } else { cents(&row[5]) };
                            *net.entry(code).or_default() += debit - credit;
                        }
                    }
                }
            }
            net.retain(|_, v| *v != 0);
            assert_eq!(
                net, movement,
                "{period} {format:?}: moves each GL account as the report does"
            );
        }

        let rollforward = engine.rollforward(period).await.unwrap();
        assert!(rollforward.closes, "{rollforward:?}");
        assert_eq!(
            rollforward.opening.cents, previous_closing,
            "{period} opens where the month before closed"
        );
        previous_closing = rollforward.closing.cents;
        if period == last {
            break;
        }
        period = period.next();
    }
    assert!(engine.trial_balance().await.unwrap().is_sound());
    pool.close().await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn the_books_hold_on_sqlite(ops in prop::collection::vec(op(), 5..40)) {
        common::runtime().block_on(run(Db::Sqlite, ops));
    }

    #[test]
    fn the_books_hold_on_postgres(ops in prop::collection::vec(op(), 5..40)) {
        common::runtime().block_on(run(Db::Postgres, ops));
    }
}
