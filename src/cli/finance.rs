//! Finance's commands: the reconciliation report, its audit against the chains, and the
//! trial balance.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use payrecon::chain::Method;
use payrecon::{Config, CsvSection, Engine, Period, ReportFormat, ReportQuery, parse_time};

use super::named;
use super::output::{emit, print_out};

#[derive(Debug, Subcommand)]
pub(super) enum ReportCommand {
    /// Reconciliation of a period: per method expected, received, booked, credited and why
    /// they differ; every transfer; every exception; the trial balance.
    Reconcile {
        /// Start, inclusive: a date (2026-12-01, midnight UTC) or an RFC 3339 time.
        #[arg(long)]
        from: String,
        /// End, exclusive.
        #[arg(long)]
        to: String,
        /// One method only.
        #[arg(long)]
        method: Option<String>,
        /// csv (one table), json or html.
        #[arg(long, default_value = "csv", value_parser = named::<ReportFormat>(&ReportFormat::NAMES))]
        format: ReportFormat,
        /// The table a CSV report holds.
        #[arg(long, default_value = "transfers", value_parser = named::<CsvSection>(&CsvSection::NAMES))]
        section: CsvSection,
        /// Write to this file instead of stdout.
        #[arg(long)]
        output: Option<PathBuf>,
        /// Instead of the report: fetch every credited transfer of the period again from its
        /// chain (the configured nodes) and list those the chain no longer backs. Exits
        /// non-zero when there is any.
        #[arg(long)]
        audit: bool,
    },
    /// The holdings roll-forward of a month per network and asset: opening, received, sent
    /// to the treasury and elsewhere, fees, closing, at fair value at its start and end.
    Holdings {
        /// The month, YYYY-MM, in the books' time zone.
        #[arg(long, value_parser = super::books::parse_period)]
        period: Period,
        /// Also fetch from each chain what every funded address held at the month's last
        /// block, and name every difference. Exits non-zero when there is one.
        #[arg(long)]
        verify: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum LedgerCommand {
    /// Every account's balance re-derived from the journal, and the invariant checks.
    TrialBalance,
}

/// Finance reports, in the format `--format` names (`--json` does not apply).
pub(super) async fn report(
    command: ReportCommand,
    engine: &Engine,
    config: &Config,
) -> anyhow::Result<()> {
    match command {
        ReportCommand::Holdings { period, verify } => {
            let report = engine.holdings_rollforward(period).await?;
            if !verify {
                return emit(true, &report, String::new);
            }
            let verification = engine.verify_holdings(config, period).await?;
            emit(
                true,
                &serde_json::json!({ "rollforward": report, "verification": verification }),
                String::new,
            )?;
            anyhow::ensure!(
                verification.iter().all(|v| v.differences.is_empty()),
                "the chain differs from payrecon's holdings at the end of {period}"
            );
            Ok(())
        }
        ReportCommand::Reconcile {
            from,
            to,
            method,
            format,
            section,
            output,
            audit,
        } => {
            let query = ReportQuery {
                from: parse_time("--from", &from)?,
                to: parse_time("--to", &to)?,
                method: method.map(|m| m.parse::<Method>()).transpose()?,
            };
            if audit {
                let report = engine.audit_credited(config, &query).await?;
                let text = report.render(format)?;
                match &output {
                    Some(path) => std::fs::write(path, text)
                        .with_context(|| format!("writing {}", path.display()))?,
                    None => print_out(&text)?,
                }
                anyhow::ensure!(
                    report.unchecked.is_empty(),
                    "credited transfers of {} could not be checked: no node configured",
                    report
                        .unchecked
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                anyhow::ensure!(
                    report.findings.is_empty(),
                    "{} of {} credited transfers are not backed by their chain",
                    report.findings.len(),
                    report.checked
                );
                return Ok(());
            }
            let totals = match &output {
                Some(path) => {
                    let file = tokio::fs::File::create(path)
                        .await
                        .with_context(|| format!("creating {}", path.display()))?;
                    engine
                        .write_reconciliation(&query, format, section, file)
                        .await?
                }
                None => {
                    engine
                        .write_reconciliation(&query, format, section, tokio::io::stdout())
                        .await?
                }
            };
            if let Some(path) = output {
                eprintln!(
                    "wrote {}: {} transfers, {} exceptions",
                    path.display(),
                    totals.transfers,
                    totals.exceptions
                );
            }
            anyhow::ensure!(
                totals.trial_balance_sound,
                "the ledger's invariants do not hold (see the trial balance)"
            );
            Ok(())
        }
    }
}

/// The journal.
pub(super) async fn ledger(
    command: LedgerCommand,
    engine: &Engine,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        LedgerCommand::TrialBalance => {
            let trial = engine.trial_balance().await?;
            let sound = trial.is_sound();
            emit(
                json,
                &serde_json::json!({ "sound": sound, "trial_balance": trial }),
                || {
                    let mut text = String::new();
                    for line in &trial.accounts {
                        text.push_str(&format!(
                            "{:<32} {:>28} {}\n",
                            line.account, line.balance, line.currency
                        ));
                    }
                    for total in &trial.totals {
                        text.push_str(&format!(
                            "{:<32} {:>28} {}\n",
                            "TOTAL (must be 0)", total.balance, total.currency
                        ));
                    }
                    text.push_str(&format!(
                        "{} entries, {} postings: {}",
                        trial.entries,
                        trial.postings,
                        if sound { "sound" } else { "INVARIANTS BROKEN" }
                    ));
                    text
                },
            )?;
            anyhow::ensure!(sound, "the ledger's invariants do not hold");
            Ok(())
        }
    }
}
