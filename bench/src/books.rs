//! `books`: the valuation pass, the four journal exports and the close over a month of many
//! transfers, each export's time and peak memory, all beside the plain reconciliation report
//! over the same month in the same run.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use payrecon::config::BooksConfig;
use payrecon::test_utils::rates::{RateBook, RecordedQuotes};
use payrecon::test_utils::report::{CsvSection, ReportFormat, ReportQuery};
use payrecon::{Engine, JournalFormat, PaymentSettings};

use super::{
    BenchLine, ITEMS, line, load_held_transfers, report, reset_peak_memory, scratch, with_peak,
};

/// The options of `books`.
#[derive(Debug, clap::Args)]
pub(crate) struct BooksArgs {
    /// Transfers in the month.
    #[arg(long, default_value_t = 100_000)]
    transfers: usize,
    /// A database the benchmark may fill. Default: a fresh temporary SQLite file.
    #[arg(long)]
    scratch_database: Option<String>,
}

/// Prices the month's bitcoin and euro from a recorded file, as the tests pin them.
const QUOTES: &str = r#"{"fetched_at": "2030-01-01T00:00:00Z", "quotes": {"BTC": "80000"},
    "timed": [{"at": "2000-01-01T00:00:00Z", "quotes": {"BTC": "80000"}, "usd_per_eur": "1.16"}]}"#;

pub(crate) async fn workload(
    BooksArgs {
        transfers,
        scratch_database,
    }: BooksArgs,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(transfers > 0, "--transfers must be positive");
    let (scratch_dir, url) = scratch(scratch_database)?;
    let quotes = scratch_dir.path().join("quotes.json");
    std::fs::write(&quotes, QUOTES).context("writing the quotes")?;
    let settings = PaymentSettings {
        rates: Some(Arc::new(RateBook::new(
            vec![Arc::new(RecordedQuotes::new(quotes))],
            chrono::Duration::minutes(5),
            rust_decimal::Decimal::new(2, 2),
            chrono::Duration::minutes(1),
        ))),
        ..PaymentSettings::default()
    };
    let engine = Engine::open(&url)
        .await
        .context("opening the scratch database")?
        .with_payment_settings(settings)
        .with_books(BooksConfig {
            reporting_currency: Some("EUR".into()),
            ..BooksConfig::default()
        })?;
    let lines = month(&engine, transfers).await?;
    let backend = format!("{:?}", engine.store().backend()).to_lowercase();
    report(
        json,
        Some(&backend),
        format!(
            "the books over a month on {backend} ({}); ratios are to the reconciliation report of the same month",
            payrecon_chain_core::SecretUrl::from(url.as_str())
        ),
        &lines,
        ITEMS,
    )
}

/// Last month, filled with `count` held transfers and valued, then reported, exported in every
/// format and closed.
async fn month(engine: &Engine, count: usize) -> anyhow::Result<Vec<BenchLine>> {
    let period = engine.period_of(chrono::Utc::now()).previous();
    let (from, to) = engine.period_bounds(period);
    let spacing_ms = ((to - from).num_milliseconds() / count as i64).max(1);
    let loaded = load_held_transfers(engine, count, from, spacing_ms).await?;
    let mut lines = vec![line("load transfers and entries", count, loaded)];

    let started = Instant::now();
    let pass = engine.value_entries().await?;
    anyhow::ensure!(
        pass.valued as usize == count && pass.failed == 0,
        "valued {pass:?}"
    );
    lines.push(line("valuation pass", count, started.elapsed()));

    reset_peak_memory();
    let started = Instant::now();
    let query = ReportQuery {
        from,
        to,
        method: None,
    };
    engine
        .write_reconciliation(
            &query,
            ReportFormat::Csv,
            CsvSection::Transfers,
            tokio::io::sink(),
        )
        .await?;
    let report_elapsed = started.elapsed();
    lines.push(with_peak(line(
        "reconciliation report csv (the line)",
        count,
        report_elapsed,
    )));
    let of_report = |measured: BenchLine| BenchLine {
        of_line: Some(report_elapsed.as_secs_f64() / (measured.elapsed_ms.max(1) as f64 / 1000.0)),
        ..measured
    };

    for format in [
        JournalFormat::Generic,
        JournalFormat::Datev,
        JournalFormat::Xero,
        JournalFormat::Qbo,
    ] {
        reset_peak_memory();
        let started = Instant::now();
        let totals = engine
            .export_journal(period, format, |_| Ok(tokio::io::sink()))
            .await?;
        anyhow::ensure!(
            totals.entries as usize == count && totals.debits_minor == totals.credits_minor,
            "the {format:?} export: {totals:?}"
        );
        let mut measured = with_peak(line(
            &format!("export {format:?} ({} files)", totals.parts).to_lowercase(),
            count,
            started.elapsed(),
        ));
        measured.note = Some(format!("{} lines", totals.lines));
        lines.push(of_report(measured));
    }

    reset_peak_memory();
    let started = Instant::now();
    let rollforward = engine.holdings_rollforward(period).await?;
    anyhow::ensure!(
        rollforward.closes,
        "the holdings roll-forward: {rollforward:?}"
    );
    lines.push(of_report(with_peak(line(
        "holdings roll-forward",
        count,
        started.elapsed(),
    ))));

    reset_peak_memory();
    let started = Instant::now();
    let closed = engine.close_period(period, "bench").await?;
    anyhow::ensure!(
        closed.entries as usize == count,
        "closed {}",
        closed.entries
    );
    lines.push(of_report(with_peak(line(
        "close the month",
        count,
        started.elapsed(),
    ))));
    Ok(lines)
}
