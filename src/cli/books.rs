//! Finance's books: closing and reopening periods, the journal exports, the valuation pass
//! and the roll-forward.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use payrecon::{Engine, JournalFormat, Period};

use super::named;
use super::output::{emit, print_out};

#[derive(Debug, Subcommand)]
pub(super) enum PeriodCommand {
    /// Lock a month: store its figures and the hash of its entries. Later events that concern
    /// it are booked in the first open month.
    Close {
        /// The month, YYYY-MM, in the books' time zone.
        #[arg(value_parser = parse_period)]
        period: Period,
        /// Who closes it (logged); defaults to the login name.
        #[arg(long)]
        actor: Option<String>,
    },
    /// Open the last closed month again, with a reason (logged).
    Reopen {
        /// The month, YYYY-MM.
        #[arg(value_parser = parse_period)]
        period: Period,
        /// Why.
        #[arg(long)]
        reason: String,
        /// Who reopens it (logged); defaults to the login name.
        #[arg(long)]
        actor: Option<String>,
    },
    /// Whether a month is open or closed, and its closes and reopens.
    Status {
        /// The month, YYYY-MM.
        #[arg(value_parser = parse_period)]
        period: Period,
    },
    /// A month's figures as JSON: receipts at fiat value, FX result, each GL account's
    /// movement, the roll-forward and the entries' hash. A closed month's are the bytes stored
    /// when it closed.
    Report {
        /// The month, YYYY-MM.
        #[arg(value_parser = parse_period)]
        period: Period,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum ExportCommand {
    /// A month's journal for an accounting system.
    Journal {
        /// The month, YYYY-MM.
        #[arg(long, value_parser = parse_period)]
        period: Period,
        /// generic (every ledger leg), datev (EXTF Buchungsstapel), xero (manual journals)
        /// or qbo (QuickBooks Online journal entries).
        #[arg(long, default_value = "generic", value_parser = named::<JournalFormat>(&JournalFormat::NAMES))]
        format: JournalFormat,
        /// Write the file (Xero: every file of at most 300 lines) into this directory instead
        /// of stdout.
        #[arg(long)]
        output_dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum BooksCommand {
    /// Give every entry without one its fiat value (what `payrecon serve` does in the
    /// background). Exits non-zero when some could not be valued.
    Value,
    /// Entries without a fiat value yet.
    Unvalued {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Give one entry the market could not value its fiat value by hand (see `unvalued`).
    ValueByHand {
        /// The entry, `PR-…` as `unvalued` prints it.
        #[arg(long)]
        entry: String,
        /// USD per coin of the entry's crypto, at the moment it was booked.
        #[arg(long)]
        usd_per_coin: Option<rust_decimal::Decimal>,
        /// USD per unit of the books' reporting currency (EUR) at that moment.
        #[arg(long)]
        usd_per_reporting_unit: Option<rust_decimal::Decimal>,
        /// Why, and where the rates come from.
        #[arg(long)]
        reason: String,
        /// Who (default: cli:$USER).
        #[arg(long)]
        actor: Option<String>,
    },
    /// The customer-balance roll-forward of a month.
    Rollforward {
        /// The month, YYYY-MM.
        #[arg(long, value_parser = parse_period)]
        period: Period,
    },
}

pub(super) fn parse_period(text: &str) -> Result<Period, String> {
    text.parse().map_err(|e: payrecon::Error| e.to_string())
}

fn actor(given: Option<String>) -> String {
    given.unwrap_or_else(|| {
        let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
        format!("cli:{user}")
    })
}

pub(super) async fn period(
    command: PeriodCommand,
    engine: &Engine,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        PeriodCommand::Close { period, actor: who } => {
            let report = engine.close_period(period, &actor(who)).await?;
            emit(json, &report, || {
                format!(
                    "{period} closed: {} entries, sha256 {}; roll-forward closing {} USD",
                    report.entries, report.entries_sha256, report.rollforward.closing.amount
                )
            })
        }
        PeriodCommand::Reopen {
            period,
            reason,
            actor: who,
        } => {
            let status = engine.reopen_period(period, &actor(who), &reason).await?;
            emit(json, &status, || format!("{period} reopened"))
        }
        PeriodCommand::Status { period } => {
            let status = engine.period_status(period).await?;
            emit(json, &status, || {
                let mut text = format!("{period}: {}", status.state);
                for line in &status.log {
                    text.push_str(&format!(
                        "\n  {} {} by {}{}",
                        line.at,
                        line.action,
                        line.actor,
                        if line.reason.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", line.reason)
                        }
                    ));
                }
                text
            })
        }
        PeriodCommand::Report { period } => {
            print_out(&format!("{}\n", engine.period_report(period).await?))
        }
    }
}

pub(super) async fn export(command: ExportCommand, engine: &Engine) -> anyhow::Result<()> {
    let ExportCommand::Journal {
        period,
        format,
        output_dir,
    } = command;
    let totals = match &output_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            engine
                .export_journal(period, format, |part| {
                    let path = dir.join(format.file_name(period, part));
                    std::fs::File::create(&path).map(tokio::fs::File::from_std)
                })
                .await?
        }
        None => {
            engine
                .export_journal(period, format, |part| {
                    if part > 1 {
                        return Err(std::io::Error::other(
                            "a Xero import file holds at most 300 lines: give --output-dir for the files",
                        ));
                    }
                    Ok(tokio::io::stdout())
                })
                .await?
        }
    };
    if let Some(dir) = output_dir {
        eprintln!(
            "wrote {} file(s) to {}: {} entries, {} lines, debits {} = credits {} {}",
            totals.parts,
            dir.display(),
            totals.entries,
            totals.lines,
            payrecon::Cents::from(totals.debits_minor).amount,
            payrecon::Cents::from(totals.credits_minor).amount,
            totals.currency
        );
    }
    Ok(())
}

pub(super) async fn books(
    command: BooksCommand,
    engine: &Engine,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        BooksCommand::Value => {
            let pass = engine.value_entries().await?;
            emit(json, &pass, || {
                let mut text = format!(
                    "{} entries valued, {} left unvalued",
                    pass.valued, pass.failed
                );
                for error in &pass.errors {
                    text.push_str(&format!("\n  {error}"));
                }
                text
            })?;
            anyhow::ensure!(
                pass.failed == 0,
                "{} entries could not be valued",
                pass.failed
            );
            Ok(())
        }
        BooksCommand::Unvalued { limit } => {
            let (count, entries) = engine.unvalued_entries(limit).await?;
            emit(
                json,
                &serde_json::json!({ "count": count, "entries": entries }),
                || {
                    let mut text = format!("{count} entries without a fiat value");
                    for e in &entries {
                        text.push_str(&format!(
                            "\n  {} {} {} {}",
                            e.entry_id, e.posted_at, e.key, e.memo
                        ));
                    }
                    text
                },
            )
        }
        BooksCommand::ValueByHand {
            entry,
            usd_per_coin,
            usd_per_reporting_unit,
            reason,
            actor: who,
        } => {
            let valuation = engine
                .value_by_hand(
                    &entry,
                    usd_per_coin,
                    usd_per_reporting_unit,
                    &actor(who),
                    &reason,
                )
                .await?;
            emit(json, &valuation, || {
                format!("{entry} valued: {}", valuation.basis)
            })
        }
        BooksCommand::Rollforward { period } => {
            let r = engine.rollforward(period).await?;
            emit(json, &r, || {
                format!(
                    "customer balances {period} (USD)\n  opening              {:>14}\n  top-ups credited   + {:>14}\n  consumed by orders - {:>14}\n  reversed           - {:>14}\n  refunded           - {:>14}\n  adjustments        + {:>14}\n  closing              {:>14}\n  customers' balances  {:>14} ({} customers){}",
                    r.opening.amount,
                    r.topups_credited.amount,
                    r.consumed_by_orders.amount,
                    r.reversed.amount,
                    r.refunded.amount,
                    r.operator_adjustments.amount,
                    r.closing.amount,
                    r.customer_balances.amount,
                    r.customers,
                    if r.closes { "" } else { "  DOES NOT CLOSE" }
                )
            })?;
            anyhow::ensure!(r.closes, "the roll-forward of {period} does not close");
            Ok(())
        }
    }
}
