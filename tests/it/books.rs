//! The books on SQLite and PostgreSQL: value at receipt and the FX difference to the cent,
//! period close and reopen, a late event booked in the first open month, the roll-forward,
//! and the four journal exports checked against their vendors' layouts.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use common::books::{cents, export};
use common::payments::Tx;
use common::replay::{ReplayServer, Reply};
use common::tour::{Tour, tour_lines};
use common::{TestDb, topup};
use payrecon::config::Config;
use payrecon::test_utils::clock::{Clock, ManualClock};
use payrecon::{Engine, JournalFormat, OrderRef, Period};
use payrecon_chain_core::{Method, Network};
use rust_decimal::Decimal;

/// Locked rates (the file's plain quotes) and the market at receipt (its timed quotes, from
/// 1 November): LTC locks at 100 and was worth 102.50; USDT locks at 1 and was worth 0.9995;
/// one euro cost 1.16 USD.
const QUOTES: &str = r#"{
  "fetched_at": "2030-01-01T00:00:00Z",
  "quotes": {"BTC": "80000", "ETH": "3000", "USDT": "1", "USDC": "1", "TRX": "0.25", "SOL": "150", "LTC": "100"},
  "usd_per_eur": "1.17",
  "timed": [
    {"at": "2026-11-01T00:00:00Z", "quotes": {"LTC": "102.50", "USDT": "0.9995", "ETH": "3100"}, "usd_per_eur": "1.16"}
  ]
}"#;

fn books_config(dir: &Path) -> Config {
    common::payments::config(|c| {
        c.books.reporting_currency = Some("EUR".into());
        c.books.timezone = "Europe/Berlin".into();
        c.rates.recorded_quotes_file = Some(dir.join("quotes.json"));
    })
}

async fn books_engine(db: &TestDb, dir: &Path, now: DateTime<Utc>) -> (Engine, Arc<ManualClock>) {
    std::fs::write(dir.join("quotes.json"), QUOTES).unwrap();
    let config = books_config(dir);
    let clock = Arc::new(ManualClock::new(now));
    let engine = common::books::engine_with_recorded_quotes(
        db,
        config,
        &dir.join("quotes.json"),
        clock.clone(),
    )
    .await;
    (engine, clock)
}

// docs/finance.md's month as finance runs it: a November of LTC top-ups and a rental paid from
// the balance, valued; then the guide's close and export commands, as written, from a folder
// whose payrecon.toml holds the books' settings.
on_both_databases! {
    async fn the_finance_guides_month_runs_as_written(db) {
        let dir = tempfile::tempdir().unwrap();
        let (engine, clock) = books_engine(&db, dir.path(), at("2026-11-03T08:00:00Z")).await;
        for n in 0..3 {
            let reference = format!("T{n}");
            engine.create_topup(&topup(&reference, "c1", "100")).await.unwrap();
            let pay = engine.create_payment(&OrderRef::new(&reference).unwrap(), Method::Ltc).await.unwrap();
            let tx = Tx::new(Network::Litecoin, &format!("tx{n}"), &pay.intent.watch_key, Method::Ltc, 100_000_000, clock.now());
            engine.apply_chain_events(&[tx.observed(6, 100 + n)]).await.unwrap();
        }
        engine.create_rental_order(&common::rental("R1", "c1", "210")).await.unwrap();
        engine.pay_order_from_balance(&OrderRef::new("R1").unwrap()).await.unwrap();
        assert_eq!(engine.value_entries().await.unwrap().failed, 0);
        std::fs::write(
            dir.path().join("payrecon.toml"),
            format!(
                "[books]\nreporting_currency = \"EUR\"\ntimezone = \"Europe/Berlin\"\n[rates]\nsources = [\"recorded\"]\nrecorded_quotes_file = \"{}\"\n",
                dir.path().join("quotes.json").display()
            ),
        )
        .unwrap();
        let mut tour = Tour::start(dir.path(), &[("PAYRECON_DATABASE_URL", &db.url)], &[]);
        for line in tour_lines("docs/finance.md", "finance-month") {
            tour.step(&line);
        }
        drop(tour);
        for written in ["2026-11.json", "exports/EXTF_Buchungsstapel_2026-11.csv", "exports/journal-2026-11-xero-1.csv", "journal-2026-11.csv"] {
            let bytes = std::fs::read(dir.path().join(written)).unwrap_or_default();
            assert!(!bytes.is_empty(), "the guide's {written} was written");
        }
    }
}

fn november() -> Period {
    "2026-11".parse().unwrap()
}

fn at(text: &str) -> DateTime<Utc> {
    text.parse().unwrap()
}

/// Reads a CSV file with Python's `csv` module: a reader that shares no code with ours.
fn python_csv(bytes: &[u8], delimiter: char, encoding: &str, skip: usize) -> Vec<Vec<String>> {
    let script = format!(
        "import csv,io,json,sys\ntext=sys.stdin.buffer.read().decode('{encoding}')\nrows=list(csv.reader(io.StringIO(text, newline=''), delimiter='{delimiter}'))\nprint(json.dumps(rows[{skip}:]))"
    );
    let mut child = std::process::Command::new("python3")
        .args(["-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "python's csv reader failed");
    serde_json::from_slice(&output.stdout).unwrap()
}

on_both_databases! {
    async fn an_entry_the_market_cannot_value_is_valued_by_hand_and_operators_see_it_wait(db) {
        let seeded = common::seed::seed(&db).await;
        // The same database, with no rate source: nothing can be valued.
        let bare = db.engine().await.with_clock(seeded.clock.clone());
        assert!(bare.value_entries().await.unwrap().failed > 0);
        seeded.clock.advance(chrono::Duration::minutes(10));
        let stuck = bare.stuck(&Default::default()).await.unwrap();
        let waiting = stuck.iter().find(|item| item.kind == "unvalued").expect("operators see the entries waiting");
        let (count, entries) = bare.unvalued_entries(100).await.unwrap();
        assert_eq!(waiting.subject, format!("{count} entries"));
        let metrics = payrecon::test_utils::api::metrics_text(&bare).await.unwrap();
        assert!(metrics.contains(&format!("payrecon_unvalued_entries {count}\n")), "{metrics}");

        let payment = entries.iter().find(|e| e.key.starts_with("settle:")).expect("a settled payment waits");
        for (rate, reason, why) in [(None, "the close", "no rate"), (Some(Decimal::ZERO), "the close", "zero"), (Some(Decimal::new(80_000, 0)), " ", "no reason")] {
            assert!(bare.value_by_hand(&payment.entry_id, rate, None, "anna", reason).await.is_err(), "{why}");
        }
        let valued = bare.value_by_hand(&payment.entry_id, Some(Decimal::new(80_000, 0)), None, "anna", "Kraken's daily close").await.unwrap();
        assert_eq!(valued.basis, "by hand: anna: Kraken's daily close");
        assert_eq!(valued.crypto.as_ref().map(|c| c.usd_per_unit), Some(Decimal::new(80_000, 0)));
        assert_eq!(bare.unvalued_entries(100).await.unwrap().0, count - 1);
        assert!(bare.value_by_hand(&payment.entry_id, Some(Decimal::ONE), None, "anna", "again").await.unwrap_err().to_string().contains("not an entry waiting"));
    }

    async fn a_late_valuation_carries_the_price_of_its_own_moment(db) {
        use payrecon::test_utils::rates::{CoinGecko, Kraken, RateSource};
        // CoinGecko's and Kraken's recorded present and past for Litecoin on 1 December 2025.
        let server = ReplayServer::start(vec![
            ("/api/v3/simple/price", vec![Reply::Fixture("rates/coingecko_simple_price.json")]),
            ("/0/public/Ticker", vec![Reply::Fixture("rates/kraken_ticker.json")]),
            ("/api/v3/coins/litecoin/market_chart/range", vec![Reply::Fixture("rates/coingecko_market_chart_range_litecoin.json")]),
            ("/0/public/OHLC", vec![Reply::Fixture("rates/kraken_ohlc_ltcusd_1m.json")]),
        ]).await;
        let down = ReplayServer::start(vec![]).await;
        let client = reqwest::Client::new();
        let providers = |url: &str| -> Vec<Arc<dyn RateSource>> {
            vec![Arc::new(CoinGecko::new(client.clone(), url, None)), Arc::new(Kraken::new(client.clone(), url))]
        };
        let clock = Arc::new(ManualClock::new(at("2025-12-01T11:37:30Z")));
        let config = common::payments::config(|_| {});
        let engine = common::books::engine_with_rate_sources(&db, config.clone(), providers(&server.base_url), clock.clone()).await;
        let settle = |reference: &'static str, txid: &'static str| {
            let engine = &engine;
            let clock = clock.clone();
            async move {
                engine.create_topup(&topup(reference, "42", "100")).await.unwrap();
                let ltc = engine.create_payment(&OrderRef::new(reference).unwrap(), Method::Ltc).await.unwrap();
                let tx = Tx::new(Network::Litecoin, txid, &ltc.intent.watch_key, Method::Ltc, ltc.intent.amount.base_units(), clock.now());
                engine.apply_chain_events(&[tx.observed(6, 100)]).await.unwrap();
                format!("settle:{}:1", ltc.intent.id)
            }
        };

        // Received at 11:37:30, valued an hour later, when the market had moved to ~85.10.
        let first = settle("T1", "ltc-1").await;
        clock.advance(chrono::Duration::hours(1));
        let pass = engine.value_entries().await.unwrap();
        assert_eq!((pass.valued, pass.failed), (1, 0), "{pass:?}");
        let rate = engine.valuation(&first).await.unwrap().unwrap().crypto.unwrap();
        assert_eq!(rate.usd_per_unit, (Decimal::new(8394, 2) + "84.0812345678".parse::<Decimal>().unwrap()) / Decimal::TWO, "Kraken's 11:37 candle and CoinGecko's nearest point");
        assert_eq!((rate.source.as_str(), rate.at), ("kraken,coingecko", at("2025-12-01T11:37:00Z")));
        assert_eq!(server.hits("/0/public/OHLC"), 1);

        // With both providers' history down, the next receipt stays unvalued, never at a later
        // price, until finance values it by hand; then December closes.
        let second = settle("T2", "ltc-2").await;
        let blind = common::books::engine_with_rate_sources(&db, config, providers(&down.base_url), clock.clone()).await;
        clock.advance(chrono::Duration::hours(1));
        let pass = blind.value_entries().await.unwrap();
        assert_eq!((pass.valued, pass.failed), (0, 1), "{pass:?}");
        let (waiting, entries) = blind.unvalued_entries(10).await.unwrap();
        assert_eq!(waiting, 1);
        assert_eq!(entries[0].key, second);
        blind.value_by_hand(&entries[0].entry_id, Some(Decimal::new(8450, 2)), None, "anna", "Kraken's hourly close, read off its site").await.unwrap();
        clock.set(at("2026-01-02T09:00:00Z"));
        let closed = blind.close_period("2025-12".parse().unwrap(), "anna").await.unwrap();
        assert_eq!(closed.entries, 2);
    }

    async fn value_at_receipt_close_and_a_reorg_after_the_close(db) {
        let dir = tempfile::tempdir().unwrap();
        let (engine, clock) = books_engine(&db, dir.path(), at("2026-11-10T12:00:00Z")).await;

        // An LTC top-up and a rental paid in USDT on Ethereum, confirmed at pinned prices.
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let ltc = engine.create_payment(&OrderRef::new("T1").unwrap(), Method::Ltc).await.unwrap();
        assert_eq!(ltc.amount_decimal, "1");
        let ltc_tx = Tx::new(Network::Litecoin, "ltc-1", &ltc.intent.watch_key, Method::Ltc, 100_000_000, clock.now());
        engine.apply_chain_events(&[ltc_tx.observed(6, 100)]).await.unwrap();
        engine.create_rental_order(&common::rental("R1", "43", "50")).await.unwrap();
        let usdt = engine.create_payment(&OrderRef::new("R1").unwrap(), Method::UsdtErc20).await.unwrap();
        let usdt_tx = Tx::new(Network::Ethereum, "0xeth1", &usdt.intent.watch_key, Method::UsdtErc20, 50_000_000, clock.now());
        engine.apply_chain_events(&[usdt_tx.observed(12, 1000)]).await.unwrap();

        // Settlement did not wait for a value: both entries are unvalued until the pass.
        assert_eq!(engine.unvalued_entries(10).await.unwrap().0, 2);
        let pass = engine.value_entries().await.unwrap();
        assert_eq!((pass.valued, pass.failed), (2, 0), "{pass:?}");
        assert_eq!(engine.unvalued_entries(10).await.unwrap().0, 0);
        let at_receipt = engine.valuation(&format!("settle:{}:1", ltc.intent.id)).await.unwrap().unwrap();
        let rate = at_receipt.crypto.unwrap();
        assert_eq!((rate.method, rate.usd_per_unit.to_string(), rate.at), (Method::Ltc, "102.5".into(), at("2026-11-01T00:00:00Z")));
        assert_eq!((at_receipt.basis.as_str(), at_receipt.txids.as_str()), ("market", "ltc-1"));
        assert_eq!(at_receipt.reporting.unwrap().usd_per_unit.to_string(), "1.16");

        // Value at receipt and the FX difference, to the cent, in USD and EUR.
        let report: serde_json::Value = serde_json::from_str(&engine.period_report(november()).await.unwrap()).unwrap();
        let receipt = |method: &str| report["receipts"].as_array().unwrap().iter().find(|r| r["method"] == method).unwrap().clone();
        let ltc_value = receipt("ltc");
        assert_eq!(ltc_value["market_usd"]["amount"], "102.50");
        assert_eq!(ltc_value["fx_gain_usd"]["amount"], "2.50", "worth 102.50, credited 100.00");
        assert_eq!(ltc_value["market_reporting"]["amount"], "88.36", "102.50 / 1.16");
        assert_eq!(ltc_value["fx_gain_reporting"]["amount"], "2.15", "88.36 - 86.21");
        let usdt_value = receipt("usdt-erc20");
        assert_eq!(usdt_value["market_usd"]["amount"], "49.98", "50 x 0.9995 = 49.975, half away from zero");
        assert_eq!(usdt_value["fx_gain_usd"]["amount"], "-0.02");
        let rollforward = engine.rollforward(november()).await.unwrap();
        assert_eq!((rollforward.opening.cents, rollforward.topups_credited.cents, rollforward.closing.cents), (0, 10_000, 10_000));
        assert!(rollforward.closes);

        // November cannot close before it ends; then it closes, once, in order.
        assert!(engine.close_period(november(), "anna").await.unwrap_err().to_string().contains("has not ended"));
        clock.set(at("2026-12-02T09:00:00Z"));
        assert!(engine.close_period("2026-12".parse().unwrap(), "anna").await.is_err());
        let closed = engine.close_period(november(), "anna").await.unwrap();
        assert_eq!(closed.entries, 2);
        assert!(engine.close_period(november(), "anna").await.unwrap_err().to_string().contains("already closed"));
        assert_eq!(engine.period_status(november()).await.unwrap().state, "closed");
        let report_at_close = engine.period_report(november()).await.unwrap();
        let formats = [JournalFormat::Generic, JournalFormat::Datev, JournalFormat::Xero, JournalFormat::Qbo];
        let mut exports_at_close = Vec::new();
        for format in formats {
            exports_at_close.push(export(&engine, november(), format).await);
        }

        // A reorg after the close, seen by a process whose clock still says 30 November:
        // the reversal is booked on 1 December, with a reference to the entry it reverses.
        clock.set(at("2026-11-30T20:00:00Z"));
        engine.apply_chain_events(&[ltc_tx.removed(101)]).await.unwrap();
        clock.set(at("2026-12-02T10:00:00Z"));
        assert_eq!(engine.value_entries().await.unwrap().failed, 0);
        assert_eq!(engine.period_report(november()).await.unwrap(), report_at_close, "byte-identical");
        for (format, before) in formats.into_iter().zip(&exports_at_close) {
            assert_eq!(&export(&engine, november(), format).await, before, "{format:?} export unchanged");
        }
        let december: Period = "2026-12".parse().unwrap();
        let generic = String::from_utf8(export(&engine, december, JournalFormat::Generic).await.remove(0)).unwrap();
        let original_id = payrecon::entry_id(&format!("settle:{}:1", ltc.intent.id));
        assert!(generic.contains(&format!("reverses {original_id}")), "{generic}");
        assert!(generic.contains(",2026-12-01,reversal,"), "booked on the first day of December: {generic}");
        assert!(generic.contains(&format!("reverses {original_id}")));
        let december_rollforward = engine.rollforward(december).await.unwrap();
        assert_eq!(december_rollforward.opening, rollforward.closing, "December opens where November closed");
        assert_eq!((december_rollforward.reversed.cents, december_rollforward.closing.cents), (10_000, 0));
        assert!(december_rollforward.closes);

        // Reopening takes a reason, is logged, and only the last closed month reopens.
        assert!(engine.reopen_period(november(), "anna", " ").await.is_err());
        let reopened = engine.reopen_period(november(), "anna", "late supplier invoice").await.unwrap();
        assert_eq!(reopened.state, "open");
        let actions: Vec<&str> = reopened.log.iter().map(|l| l.action.as_str()).collect();
        assert_eq!(actions, ["close", "reopen"]);
        assert_eq!(reopened.log[1].reason, "late supplier invoice");
        let again = engine.close_period(november(), "ben").await.unwrap();
        assert_eq!(again.entries_sha256, closed.entries_sha256, "nothing was booked into it");
    }

    async fn the_exports_follow_their_vendors_layouts(db) {
        let dir = tempfile::tempdir().unwrap();
        let (engine, clock) = books_engine(&db, dir.path(), at("2026-11-03T08:00:00Z")).await;
        // 110 LTC top-ups: three GL lines each, so Xero needs two files.
        for n in 0..110 {
            let reference = format!("T{n}");
            engine.create_topup(&topup(&reference, &format!("c{}", n % 7), "100")).await.unwrap();
            let pay = engine.create_payment(&OrderRef::new(&reference).unwrap(), Method::Ltc).await.unwrap();
            let tx = Tx::new(Network::Litecoin, &format!("tx{n}"), &pay.intent.watch_key, Method::Ltc, 100_000_000, clock.now());
            engine.apply_chain_events(&[tx.observed(6, 100 + n)]).await.unwrap();
        }
        engine.create_rental_order(&common::rental("R1", "c1", "420")).await.unwrap();
        engine.pay_order_from_balance(&OrderRef::new("R1").unwrap()).await.unwrap();
        let pass = engine.value_entries().await.unwrap();
        assert_eq!(pass.failed, 0, "{pass:?}");
        let report: serde_json::Value = serde_json::from_str(&engine.period_report(november()).await.unwrap()).unwrap();
        let movement: std::collections::BTreeMap<String, i64> = report["accounts"].as_array().unwrap().iter()
            .map(|a| (a["code"].as_str().unwrap().to_owned(), cents(a["debits"]["amount"].as_str().unwrap()) - cents(a["credits"]["amount"].as_str().unwrap())))
            .collect();
        assert_eq!(movement.values().sum::<i64>(), 0, "the period's GL movement balances");

        // DATEV: header record, column row, ';', CRLF, decimal comma, Windows-1252.
        let datev = export(&engine, november(), JournalFormat::Datev).await.remove(0);
        let lines: Vec<&[u8]> = datev.split(|b| *b == b'\n').collect();
        assert!(lines[..lines.len() - 1].iter().all(|l| l.ends_with(b"\r")), "CRLF");
        assert!(datev.windows(25).any(|w| w == b"Gegenkonto (ohne BU-Schl\xfc"), "Windows-1252");
        let rows = python_csv(&datev, ';', "cp1252", 0);
        let header = &rows[0];
        assert_eq!(header.len(), 31);
        assert_eq!(&header[..5], ["EXTF", "700", "21", "Buchungsstapel", "13"]);
        assert_eq!(&header[10..16], ["1001", "1", "20260101", "4", "20261101", "20261130"]);
        assert_eq!(header[21], "EUR");
        assert_eq!(&rows[1][..10], ["Umsatz (ohne Soll/Haben-Kz)", "Soll/Haben-Kennzeichen", "WKZ Umsatz", "Kurs", "Basis-Umsatz", "WKZ Basis-Umsatz", "Konto", "Gegenkonto (ohne BU-Schlüssel)", "BU-Schlüssel", "Belegdatum"]);
        let mut datev_movement: std::collections::BTreeMap<String, i64> = Default::default();
        for row in &rows[2..] {
            assert!(row[0].contains(',') && !row[0].contains('.'), "decimal comma: {row:?}");
            assert_eq!((row[2].as_str(), row[3].as_str(), row[5].as_str()), ("USD", "1,160000", "EUR"));
            assert_eq!(row[9].len(), 4, "Belegdatum is DDMM");
            let amount = cents(&row[4]);
            let (debited, credited) = if row[1] == "S" { (&row[6], &row[7]) } else { (&row[7], &row[6]) };
            *datev_movement.entry(debited.clone()).or_default() += amount;
            *datev_movement.entry(credited.clone()).or_default() -= amount;
        }
        datev_movement.retain(|_, v| *v != 0);
        common::books::datev_fields_follow_the_format(&datev, false);
        let mut expected = movement.clone();
        expected.retain(|_, v| *v != 0);
        assert_eq!(datev_movement, expected, "DATEV moves each GL account as the ledger does");

        // Xero: its template's columns, at most 300 lines a file, each journal whole in one.
        let xero = export(&engine, november(), JournalFormat::Xero).await;
        assert_eq!(xero.len(), 2, "330 lines make two files");
        let mut xero_movement: std::collections::BTreeMap<String, i64> = Default::default();
        for file in &xero {
            let rows = python_csv(file, ',', "utf-8", 0);
            assert_eq!(rows[0], ["*Narration", "*Date", "Description", "*AccountCode", "*TaxRate", "*Amount"]);
            assert!(rows.len() - 1 <= payrecon::XERO_LINES_PER_FILE);
            let mut per_journal: std::collections::BTreeMap<String, i64> = Default::default();
            for row in &rows[1..] {
                *per_journal.entry(row[0].clone()).or_default() += cents(&row[5]);
                *xero_movement.entry(row[3].clone()).or_default() += cents(&row[5]);
                assert_eq!(row[4], "No VAT");
                assert_eq!(row[1], "03/11/2026", "3 November, day first");
            }
            assert!(per_journal.values().all(|sum| *sum == 0), "every journal balances within its file");
        }
        xero_movement.retain(|_, v| *v != 0);
        assert_eq!(xero_movement, expected);
        let us = engine.clone().with_books(payrecon::config::BooksConfig {
            xero_date_order: payrecon::config::DateOrder::MonthFirst,
            ..engine.books_config().clone()
        }).unwrap();
        let rows = python_csv(&export(&us, november(), JournalFormat::Xero).await[0], ',', "utf-8", 1);
        assert!(rows.iter().all(|row| row[1] == "11/03/2026"), "a US organisation's dates: 3 November as 11/03/2026");

        // QuickBooks Online: its columns, MM/DD/YYYY, debits equal credits per journal.
        let qbo = export(&engine, november(), JournalFormat::Qbo).await.remove(0);
        let rows = python_csv(&qbo, ',', "utf-8", 0);
        assert_eq!(rows[0], ["Journal No.", "Journal Date", "Account Name", "Description", "Debits", "Credits", "Name"]);
        let mut per_journal: std::collections::BTreeMap<String, i64> = Default::default();
        for row in &rows[1..] {
            assert!(chrono::NaiveDate::parse_from_str(&row[1], "%m/%d/%Y").is_ok());
            let debit = if row[4].is_empty() { 0 } else { cents(&row[4]) };
            let credit = if row[5].is_empty() { 0 } else { cents(&row[5]) };
            *per_journal.entry(row[0].clone()).or_default() += debit - credit;
            if row[2] == "Customer prepayments (balances)" {
                assert!(!row[6].is_empty(), "a customer line names the customer");
            }
        }
        assert_eq!(per_journal.len(), 111);
        assert!(per_journal.values().all(|sum| *sum == 0));
        let uk = engine.clone().with_books(payrecon::config::BooksConfig {
            qbo_date_order: payrecon::config::DateOrder::DayFirst,
            ..engine.books_config().clone()
        }).unwrap();
        let us_dates: Vec<String> = rows[1..].iter().map(|row| row[1].clone()).collect();
        let uk_rows = python_csv(&export(&uk, november(), JournalFormat::Qbo).await.remove(0), ',', "utf-8", 1);
        assert_eq!(uk_rows.len(), us_dates.len());
        for (row, us) in uk_rows.iter().zip(&us_dates) {
            let day = chrono::NaiveDate::parse_from_str(us, "%m/%d/%Y").unwrap();
            assert_eq!(row[1], day.format("%d/%m/%Y").to_string(), "a UK company's dates are day first");
        }

        // Generic: every ledger leg, balanced per entry in every currency and value column,
        // its native totals the ledger's movement.
        let generic = export(&engine, november(), JournalFormat::Generic).await.remove(0);
        let rows = python_csv(&generic, ',', "utf-8", 0);
        assert_eq!(&rows[0][..10], ["entry_id", "seq", "date", "kind", "account", "gl_account", "debit", "credit", "currency", "amount_base_units"]);
        let mut per_entry: std::collections::BTreeMap<(String, String), i128> = Default::default();
        let mut values: std::collections::BTreeMap<String, (i64, i64)> = Default::default();
        let mut native: std::collections::BTreeMap<(String, String), i128> = Default::default();
        for row in &rows[1..] {
            let amount: i128 = row[9].parse().unwrap();
            *per_entry.entry((row[0].clone(), row[8].clone())).or_default() += amount;
            *native.entry((row[4].clone(), row[8].clone())).or_default() += amount;
            let v = values.entry(row[0].clone()).or_default();
            v.0 += cents(&row[10]);
            v.1 += cents(&row[12]);
            assert_eq!(row[11], "EUR");
        }
        assert!(per_entry.values().all(|s| *s == 0));
        assert!(values.values().all(|(usd, eur)| *usd == 0 && *eur == 0));
        for line in engine.trial_balance().await.unwrap().accounts {
            let exported = native.get(&(line.account.clone(), line.currency.to_string())).copied().unwrap_or(0);
            assert_eq!(exported, line.balance_minor, "{} {}", line.account, line.currency);
        }

        // The same period exported twice: the same bytes, so the same entry ids.
        assert_eq!(export(&engine, november(), JournalFormat::Generic).await.remove(0), generic);
    }

    async fn an_unvalued_entry_holds_back_the_close_and_is_never_valued_at_zero(db) {
        let dir = tempfile::tempdir().unwrap();
        let (engine, clock) = books_engine(&db, dir.path(), at("2026-11-10T12:00:00Z")).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let ltc = engine.create_payment(&OrderRef::new("T1").unwrap(), Method::Ltc).await.unwrap();
        // The rate source goes away after the rate was locked.
        std::fs::remove_file(dir.path().join("quotes.json")).unwrap();
        let tx = Tx::new(Network::Litecoin, "ltc-1", &ltc.intent.watch_key, Method::Ltc, 100_000_000, clock.now());
        engine.apply_chain_events(&[tx.observed(6, 100)]).await.unwrap();
        assert_eq!(engine.available_balance(&common::account("42")).await.unwrap().cents(), 10_000, "settled without a rate");
        let pass = engine.value_entries().await.unwrap();
        assert_eq!((pass.valued, pass.failed), (0, 1));
        let (count, unvalued) = engine.unvalued_entries(10).await.unwrap();
        assert_eq!(count, 1);
        assert_eq!(unvalued[0].reference.as_deref(), Some("T1"));
        clock.set(at("2026-12-02T09:00:00Z"));
        let refused = engine.close_period(november(), "anna").await.unwrap_err();
        assert!(refused.to_string().contains("no fiat value"), "{refused}");
        assert!(engine.period_report(november()).await.is_err(), "no figures with an entry unvalued");
        // The source is back: the next pass values it, and the month closes.
        std::fs::write(dir.path().join("quotes.json"), QUOTES).unwrap();
        assert_eq!(engine.value_entries().await.unwrap().valued, 1);
        engine.close_period(november(), "anna").await.unwrap();
    }
}

#[test]
fn periods_are_months_in_the_books_time_zone() {
    let berlin = Utc.with_ymd_and_hms(2026, 11, 30, 23, 30, 0).unwrap();
    let config = books_config(Path::new("/nonexistent"));
    assert_eq!(config.books.timezone, "Europe/Berlin");
    assert_eq!(
        Period::containing(berlin, "Europe/Berlin".parse().unwrap()).to_string(),
        "2026-12"
    );
}
