//! `payrecon bench`: throughput of the hot paths, on SQLite or PostgreSQL.
//!
//! Benchmarks print figures; they never pass or fail on time. They write only to the scratch
//! database they are given (a fresh temporary SQLite file by default).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};
use payrecon_chain_core::Method;
use serde::Serialize;

use crate::config::Config;
use crate::engine::Engine;
use crate::ledger::{Account, Currency, EntryKind, NewEntry, Posting};
use crate::order::AccountId;

/// Customers the synthetic entries are spread over.
const BENCH_CUSTOMERS: usize = 1_000;

/// Concurrent tasks in the concurrent-debit workload.
const BENCH_CONCURRENCY: usize = 8;

/// What to measure.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Journal posting: single entries, batches, balance-checked debits, concurrent debits.
    Ledger {
        /// Entries per workload.
        #[arg(long, default_value_t = 20_000)]
        entries: usize,
        /// Entries per transaction in the batch workload.
        #[arg(long, default_value_t = 500)]
        batch_size: usize,
        /// A database the benchmark may fill. Default: a fresh temporary SQLite file.
        /// For PostgreSQL give an empty scratch database, never production.
        #[arg(long)]
        scratch_database: Option<String>,
    },
}

/// One measured workload.
#[derive(Debug, Serialize)]
pub struct BenchLine {
    /// What was measured.
    pub workload: String,
    /// Entries posted.
    pub entries: usize,
    /// Wall time in milliseconds.
    pub elapsed_ms: u128,
    /// Entries per second.
    pub entries_per_second: u64,
}

/// Runs a benchmark and prints its figures.
pub async fn run(command: BenchCommand, _config: &Config, json: bool) -> anyhow::Result<()> {
    match command {
        BenchCommand::Ledger {
            entries,
            batch_size,
            scratch_database,
        } => {
            anyhow::ensure!(
                entries > 0 && batch_size > 0,
                "--entries and --batch-size must be positive"
            );
            let scratch_dir = tempfile::tempdir().context("creating a scratch directory")?;
            let url = scratch_database.unwrap_or_else(|| {
                format!("sqlite://{}", scratch_dir.path().join("bench.db").display())
            });
            let engine = Engine::open(&url)
                .await
                .context("opening the scratch database")?;
            let lines = ledger(&engine, entries, batch_size).await?;
            let backend = format!("{:?}", engine.store().backend()).to_lowercase();
            crate::cli::emit(
                json,
                &serde_json::json!({ "backend": backend, "results": lines }),
                || {
                    let mut text = format!(
                        "ledger posting on {backend} ({})\n",
                        crate::cli::redact(&url)
                    );
                    for line in &lines {
                        text.push_str(&format!(
                            "{:<44} {:>8} entries {:>8} ms {:>9} entries/s\n",
                            line.workload, line.entries, line.elapsed_ms, line.entries_per_second
                        ));
                    }
                    text
                },
            )
        }
    }
}

async fn ledger(
    engine: &Engine,
    entries: usize,
    batch_size: usize,
) -> anyhow::Result<Vec<BenchLine>> {
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let customers: Vec<AccountId> = (0..BENCH_CUSTOMERS)
        .map(|i| AccountId::new(format!("bench-{}-{i}", &run_id[..8])))
        .collect::<Result<_, _>>()?;
    let credit = |i: usize, tag: &str| {
        topup_credit(
            &format!("{run_id}:{tag}:{i}"),
            &customers[i % BENCH_CUSTOMERS],
        )
    };
    let mut lines = Vec::new();

    let progress = progress_bar(entries as u64, "single");
    let started = Instant::now();
    for i in 0..entries {
        engine.post_entry(&credit(i, "single")).await?;
        progress.inc(1);
    }
    progress.finish_and_clear();
    lines.push(line(
        "credit, one entry per transaction",
        entries,
        started.elapsed(),
    ));

    let progress = progress_bar(entries as u64, "batch");
    let started = Instant::now();
    let all: Vec<NewEntry> = (0..entries).map(|i| credit(i, "batch")).collect();
    for chunk in all.chunks(batch_size) {
        engine.post_entries(chunk).await?;
        progress.inc(chunk.len() as u64);
    }
    progress.finish_and_clear();
    lines.push(line(
        &format!("credit, {batch_size} entries per transaction"),
        entries,
        started.elapsed(),
    ));

    let progress = progress_bar(entries as u64, "debit");
    let started = Instant::now();
    for i in 0..entries {
        engine
            .post_entry(&debit(
                &format!("{run_id}:debit:{i}"),
                &customers[i % BENCH_CUSTOMERS],
            ))
            .await?;
        progress.inc(1);
    }
    progress.finish_and_clear();
    lines.push(line(
        "balance-checked debit, one per transaction",
        entries,
        started.elapsed(),
    ));

    let progress = progress_bar(entries as u64, "concurrent");
    let started = Instant::now();
    let customers = Arc::new(customers);
    let mut tasks = Vec::new();
    for task in 0..BENCH_CONCURRENCY {
        let (engine, customers, run_id, progress) = (
            engine.clone(),
            customers.clone(),
            run_id.clone(),
            progress.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for i in (task..entries).step_by(BENCH_CONCURRENCY) {
                let entry = debit(
                    &format!("{run_id}:concurrent:{i}"),
                    &customers[i % BENCH_CUSTOMERS],
                );
                engine.post_entry(&entry).await?;
                progress.inc(1);
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    progress.finish_and_clear();
    lines.push(line(
        &format!("balance-checked debit, {BENCH_CONCURRENCY} concurrent tasks"),
        entries,
        started.elapsed(),
    ));

    let trial = engine.trial_balance().await?;
    anyhow::ensure!(trial.is_sound(), "the benchmark left the ledger unsound");
    Ok(lines)
}

/// The brief's example: a 500 USD top-up paid with 0.00625 BTC.
fn topup_credit(key: &str, customer: &AccountId) -> NewEntry {
    let btc = Currency::Crypto(Method::Btc);
    NewEntry {
        idempotency_key: key.to_owned(),
        kind: EntryKind::Payment,
        reference: None,
        memo: String::new(),
        postings: vec![
            Posting::debit(Account::Custody(Method::Btc), btc, 625_000),
            Posting::credit(Account::Fx(Method::Btc), btc, 625_000),
            Posting::debit(Account::Fx(Method::Btc), Currency::Usd, 50_000),
            Posting::credit(
                Account::CustomerBalance(customer.clone()),
                Currency::Usd,
                50_000,
            ),
        ],
    }
}

/// A one-dollar rental paid from the balance: the path that locks and re-sums a balance.
fn debit(key: &str, customer: &AccountId) -> NewEntry {
    NewEntry {
        idempotency_key: key.to_owned(),
        kind: EntryKind::BalancePayment,
        reference: None,
        memo: String::new(),
        postings: vec![
            Posting::debit(
                Account::CustomerBalance(customer.clone()),
                Currency::Usd,
                100,
            ),
            Posting::credit(Account::RevenueRentals, Currency::Usd, 100),
        ],
    }
}

fn line(workload: &str, entries: usize, elapsed: Duration) -> BenchLine {
    BenchLine {
        workload: workload.to_owned(),
        entries,
        elapsed_ms: elapsed.as_millis(),
        entries_per_second: (entries as f64 / elapsed.as_secs_f64().max(1e-9)) as u64,
    }
}

fn progress_bar(length: u64, label: &'static str) -> ProgressBar {
    let bar = ProgressBar::new(length);
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} {per_sec}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(label);
    bar
}
