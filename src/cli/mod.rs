//! The `payrecon` command line: the engine's API for people and scripts.
//!
//! Every command prints a readable summary, or with `--json` one JSON document on stdout.
//! Failures print one line on stderr and exit non-zero; nothing is half-written.

mod bench;
mod books;
mod finance;
mod operators;
mod output;
mod serve;
mod shop;
mod wallet;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use payrecon::{Config, Engine, Verdict};

use finance::{LedgerCommand, ReportCommand};
use operators::{ExceptionCommand, RefundCommand, TokenCommand, WebhookCommand};
use output::emit;
use shop::{AccountCommand, OrderCommand, PayCommand, TopupCommand};

/// payrecon: blockchain payment reconciliation for the GPU shop.
#[derive(Debug, Parser)]
#[command(name = "payrecon", version, about)]
struct Cli {
    /// Configuration file (TOML). Default: ./payrecon.toml if present.
    #[arg(long, global = true, env = "PAYRECON_CONFIG")]
    config: Option<PathBuf>,
    /// Database URL, overriding the configuration: sqlite://file.db or postgres://…
    #[arg(long, global = true)]
    database_url: Option<String>,
    /// Print one JSON document instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the database if needed and bring its schema up to date.
    Init,
    /// A consistent copy of the SQLite database while `payrecon serve` runs, checked with
    /// SQLite's integrity check. PostgreSQL: use pg_dump or pg_basebackup.
    Backup {
        /// The copy to write; it must not exist.
        #[arg(long)]
        output: PathBuf,
    },
    /// Tells payrecon its database was just restored from a backup (after `pg_restore`; a copy
    /// `payrecon backup` wrote says so itself): each key's counter moves past every address the
    /// lost database may have handed out.
    Restored,
    /// Rental orders.
    #[command(subcommand)]
    Order(OrderCommand),
    /// Balance top-ups.
    #[command(subcommand)]
    Topup(TopupCommand),
    /// A customer's history.
    #[command(subcommand)]
    Account(AccountCommand),
    /// A customer's available USD balance.
    Balance {
        /// The shop's account id.
        account: String,
    },
    /// Payment instructions.
    #[command(subcommand)]
    Pay(PayCommand),
    /// The journal.
    #[command(subcommand)]
    Ledger(LedgerCommand),
    /// Finance reports.
    #[command(subcommand)]
    Report(ReportCommand),
    /// Accounting periods: close, reopen, status, figures.
    #[command(subcommand)]
    Period(books::PeriodCommand),
    /// Journal exports for DATEV, Xero, QuickBooks Online, or as generic CSV.
    #[command(subcommand)]
    Export(books::ExportCommand),
    /// The books: the valuation pass, entries without a fiat value, the roll-forward.
    #[command(subcommand)]
    Books(books::BooksCommand),
    /// What each watched address holds: totals per asset and the funded addresses with their
    /// derivation paths.
    Holdings(wallet::HoldingsArgs),
    /// The merchant's wallet: descriptors and the gap limit to import them with.
    #[command(subcommand)]
    Wallet(wallet::WalletCommand),
    /// The configuration checked against the world before going live: the database, each
    /// network's key, node, chain, sync and token contracts, the clock, the rate sources and
    /// the webhook endpoints; one line per check (ok, warn, fail). Exits 1 on any failure.
    /// Writes nothing.
    Doctor,
    /// What operators must look at: payments marked paid but unseen, payments not
    /// confirming, open exceptions, watchers behind or failing, stale rates, a wallet gap
    /// limit too small.
    Stuck {
        /// Minutes after "I have paid" with nothing seen before it is stuck.
        #[arg(long, default_value_t = 30)]
        marked_paid_minutes: i64,
        /// Hours a seen payment may stay unconfirmed before it is stuck.
        #[arg(long, default_value_t = 2)]
        seen_hours: i64,
    },
    /// Exceptions and the operators' actions on them.
    #[command(subcommand)]
    Exception(ExceptionCommand),
    /// Refunds of what exceptions hold: the customer's address and amount, approval.
    #[command(subcommand)]
    Refund(RefundCommand),
    /// Bearer tokens of the HTTP API.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Webhook deliveries.
    #[command(subcommand)]
    Webhook(WebhookCommand),
    /// Run the watchers of every network with a node configured, expire intents past their
    /// deadline, serve the HTTP API (`[http] listen`) and send webhooks, until interrupted
    /// (Ctrl-C or SIGTERM).
    Serve,
    /// Support lookup: a transaction id, an address, an order or top-up reference, or a
    /// payment intent id, with everything about what it names. Exits 1 when nothing matches.
    Find {
        /// What the customer gave.
        text: String,
    },
    /// Throughput benchmarks of the hot paths: runs the `payrecon-bench` binary, built on its
    /// own (`cargo build --release -p payrecon-bench`).
    #[command(disable_help_flag = true)]
    Bench {
        /// The workload and its options (`payrecon bench --help` lists them).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

/// Runs the command line and maps failures to a one-line message and exit code 1.
pub(crate) fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(error),
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PAYRECON_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal: a log file or journald gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`payrecon … | head`): end quietly, with the status a Unix
        // tool killed by SIGPIPE has.
        Err(error) if is_broken_pipe(&error) => ExitCode::from(BROKEN_PIPE_STATUS),
        Err(error) => {
            eprintln!("error: {}", one_line(&error));
            ExitCode::FAILURE
        }
    }
}

/// 128 + SIGPIPE: what a shell reports for a tool whose output pipe was closed.
const BROKEN_PIPE_STATUS: u8 = 141;

/// Whether writing the output failed because its reader closed the pipe.
fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            || cause
                .downcast_ref::<payrecon::Error>()
                .is_some_and(payrecon::Error::is_broken_pipe)
    })
}

/// Help and version print as clap writes them; a usage mistake is one line on stderr (the
/// first of clap's message, which names the argument) and exit status 2.
fn usage_error(error: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = error.print();
        return if error.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        };
    }
    let message = error.to_string();
    let first = message.lines().next().unwrap_or("invalid arguments");
    let hint = message
        .lines()
        .find_map(|l| l.trim().strip_prefix("[possible values: "))
        .map(|values| format!(" (possible values: {})", values.trim_end_matches(']')))
        .unwrap_or_default();
    eprintln!("{first}{hint} (see --help)");
    ExitCode::from(2)
}

/// The error and its causes on one line.
fn one_line(error: &anyhow::Error) -> String {
    error
        .chain()
        .map(|cause| cause.to_string().replace('\n', " "))
        .collect::<Vec<_>>()
        .join(": ")
}

/// `payrecon doctor`: every check's line, then a failure if any check failed.
async fn doctor(config: &Config, json: bool) -> anyhow::Result<()> {
    let checks = payrecon::doctor(config).await;
    emit(json, &checks, || {
        checks
            .iter()
            .map(|c| {
                let verdict = match c.verdict {
                    Verdict::Ok => "ok",
                    Verdict::Warn => "warn",
                    Verdict::Fail => "FAIL",
                };
                format!("{verdict:<5}{}: {}", c.check, c.detail)
            })
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    let failed = checks.iter().filter(|c| c.verdict == Verdict::Fail).count();
    if failed > 0 {
        anyhow::bail!(
            "{failed} of {} checks failed: fix them before going live",
            checks.len()
        );
    }
    Ok(())
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Command::Bench { args } = cli.command {
        return bench::run(args, cli.database_url.as_deref(), cli.json);
    }
    let mut config = Config::load(cli.config.as_deref())?;
    if let Some(url) = cli.database_url {
        config.database_url = url.into();
    }
    let json = cli.json;
    if let Command::Doctor = cli.command {
        return doctor(&config, json).await;
    }
    let engine = Engine::from_config(&config)
        .await
        .with_context(|| format!("opening {}", config.database_url))?;
    match cli.command {
        Command::Init => {
            let backend = engine.database_backend();
            emit(
                json,
                &serde_json::json!({ "database": config.database_url.to_string(), "backend": backend, "migrated": true }),
                || format!("database ready: {} ({backend})", config.database_url),
            )
        }
        Command::Backup { output } => {
            let report = engine.backup(&output).await?;
            emit(json, &report, || {
                format!(
                    "backup written: {} ({} bytes, schema version {}, integrity {})",
                    report.path.display(),
                    report.bytes,
                    report.schema_version,
                    report.integrity
                )
            })
        }
        Command::Restored => {
            let moved = engine.restored().await?;
            emit(json, &moved, || {
                let mut text = String::new();
                for counter in &moved {
                    text.push_str(&format!(
                        "{}: next index {} -> {} (the indexes between stay watched)\n",
                        counter.key_id, counter.counter_before, counter.counter_after
                    ));
                }
                text.push_str(
                    "new addresses wait until each network's watcher has looked past the counters",
                );
                text
            })
        }
        Command::Order(command) => shop::order(command, &engine, json).await,
        Command::Topup(command) => shop::topup(command, &engine, json).await,
        Command::Account(command) => shop::account(command, &engine, json).await,
        Command::Balance { account } => shop::balance(account, &engine, json).await,
        Command::Pay(command) => shop::pay(command, &engine, json).await,
        Command::Ledger(command) => finance::ledger(command, &engine, json).await,
        Command::Report(command) => finance::report(command, &engine, &config).await,
        Command::Period(command) => books::period(command, &engine, json).await,
        Command::Export(command) => books::export(command, &engine).await,
        Command::Books(command) => books::books(command, &engine, json).await,
        Command::Holdings(args) => wallet::holdings(args, &engine, &config, json).await,
        Command::Wallet(command) => wallet::wallet(command, &engine, &config, json).await,
        Command::Stuck {
            marked_paid_minutes,
            seen_hours,
        } => operators::stuck(marked_paid_minutes, seen_hours, &engine, json).await,
        Command::Exception(command) => operators::exception(command, &engine, json).await,
        Command::Refund(command) => operators::refund(command, &engine, json).await,
        Command::Token(command) => operators::token(command, &engine, json).await,
        Command::Webhook(command) => operators::webhook(command, &engine, &config, json).await,
        Command::Find { text } => operators::find(text, &engine, json).await,
        Command::Serve => serve::serve(engine, &config).await,
        Command::Bench { .. } => unreachable!("handled before the configuration is read"),
        Command::Doctor => unreachable!("handled before the database is opened"),
    }
}

/// A clap parser for a domain value named by one of `names`, parsed by its `FromStr`: the
/// domain types know their names, the CLI only lists them.
fn named<T>(names: &'static [&'static str]) -> impl clap::builder::TypedValueParser<Value = T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: std::fmt::Debug,
{
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(names)
        .map(|name| name.parse::<T>().expect("every listed name parses"))
}

#[cfg(test)]
mod doc_commands;

#[cfg(test)]
mod tests {
    use super::{Cli, doc_commands};

    /// Each command a guide runs parses; each one a sentence names exists with the options
    /// it shows (what follows `payrecon bench` is the bench's test).
    #[test]
    fn every_command_the_guides_show_parses() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let commands = doc_commands::documented_commands(root);
        assert!(
            commands.iter().filter(|c| c.runnable).count() > 60,
            "{commands:?}"
        );
        let refused = doc_commands::refusals::<Cli>("payrecon", &commands);
        assert!(
            refused.is_empty(),
            "commands the CLI refuses:\n{}",
            refused.join("\n")
        );
    }
}
