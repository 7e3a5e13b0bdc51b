//! The `payrecon` command line: the engine's API for people and scripts.
//!
//! Every command prints a readable summary, or with `--json` one JSON document on stdout.
//! Failures print one line on stderr and exit non-zero; nothing is half-written.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use crate::config::Config;
use crate::engine::Engine;
use crate::money::Usd;
use crate::order::{
    AccountId, Order, OrderKind, OrderRef, OrderStatus, RentalOrderRequest, TopupRequest,
};
use payrecon_chain_core::Method;

/// payrecon: blockchain payment reconciliation for the GPU shop.
#[derive(Debug, Parser)]
#[command(name = "payrecon", version, about)]
pub struct Cli {
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
    /// What operators must look at: payments marked paid but unseen, payments not
    /// confirming, open exceptions, watchers behind or failing, stale rates.
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
    /// Throughput benchmarks of the hot paths; prints figures, changes nothing else.
    #[command(subcommand)]
    Bench(crate::bench::BenchCommand),
}

#[derive(Debug, Subcommand)]
enum OrderCommand {
    /// Record a rental order (idempotent per reference).
    Create(CreateOrderArgs),
    /// An order or top-up with every ledger entry that names it.
    Show {
        /// Order or top-up reference.
        reference: String,
    },
    /// Settle a rental order from the customer's balance, if it covers the whole total.
    PayFromBalance {
        /// Order reference.
        reference: String,
    },
}

#[derive(Debug, Args)]
struct CreateOrderArgs {
    /// The shop's unique order reference.
    #[arg(long)]
    reference: String,
    /// The shop's account id of the customer.
    #[arg(long)]
    account: String,
    /// GPU model, e.g. H100 or B200.
    #[arg(long)]
    gpu: String,
    /// Rental duration: 3, 7 or 30.
    #[arg(long, allow_negative_numbers = true)]
    days: u32,
    /// Lots: 1 to 10 (a B200 lot is two GPUs).
    #[arg(long, allow_negative_numbers = true)]
    lots: u32,
    /// Total in USD, as the shop computed it (e.g. 420.00).
    #[arg(long)]
    total_usd: String,
}

#[derive(Debug, Subcommand)]
enum TopupCommand {
    /// Record a top-up of 100, 500, 2000 or 10000 USD.
    Create {
        /// The shop's account id of the customer.
        #[arg(long)]
        account: String,
        /// 100, 500, 2000 or 10000.
        #[arg(long)]
        amount_usd: String,
        /// The shop's unique reference; a fresh one is made if omitted.
        #[arg(long)]
        reference: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum PayCommand {
    /// Create payment instructions for an order or a top-up in one method.
    Create {
        /// The rental order's reference.
        #[arg(long, conflicts_with = "topup", required_unless_present = "topup")]
        order: Option<String>,
        /// The top-up's reference.
        #[arg(long)]
        topup: Option<String>,
        /// btc, eth, usdt-erc20, usdc-erc20, trx, usdt-trc20, sol or ltc.
        #[arg(long)]
        method: String,
    },
    /// A payment intent and what to tell the customer.
    Show {
        /// Intent id (pi_…).
        intent: String,
    },
    /// Record the customer's "I have paid" (confirms and credits nothing).
    MarkPaid {
        /// Intent id (pi_…).
        intent: String,
    },
    /// The payment URI as a QR code (SVG) on stdout.
    Qr {
        /// Intent id (pi_…).
        intent: String,
    },
}

#[derive(Debug, Subcommand)]
enum ReportCommand {
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
        #[arg(long, value_enum, default_value = "csv")]
        format: crate::report::ReportFormat,
        /// The table a CSV report holds.
        #[arg(long, value_enum, default_value = "transfers")]
        section: crate::report::CsvSection,
        /// Write to this file instead of stdout.
        #[arg(long)]
        output: Option<PathBuf>,
        /// Instead of the report: fetch every credited transfer of the period again from its
        /// chain (the configured nodes) and list those the chain no longer backs. Exits
        /// non-zero when there is any.
        #[arg(long)]
        audit: bool,
    },
}

#[derive(Debug, Subcommand)]
enum ExceptionCommand {
    /// Exceptions, oldest first.
    List {
        /// Only those not resolved yet.
        #[arg(long)]
        open: bool,
    },
    /// Resolve an exception; money moves by compensating journal entries.
    Resolve {
        /// The exception id (as listed).
        id: String,
        /// accept-as-paid, credit-balance, mark-refunded or dismiss.
        #[arg(long, value_enum)]
        action: ActionArg,
        /// Who is acting (recorded in the audit log).
        #[arg(long)]
        actor: String,
        /// Why (recorded in the audit log).
        #[arg(long)]
        reason: String,
        /// credit-balance: the customer account (default: the intent's).
        #[arg(long)]
        account: Option<String>,
        /// credit-balance: USD to credit (default: the value at the locked rate).
        #[arg(long)]
        usd: Option<String>,
        /// mark-refunded: the refund's transaction id.
        #[arg(long)]
        refund_txid: Option<String>,
    },
    /// The operators' audit log.
    Log,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ActionArg {
    AcceptAsPaid,
    CreditBalance,
    MarkRefunded,
    Dismiss,
}

#[derive(Debug, Subcommand)]
enum AccountCommand {
    /// Orders and top-ups, every payment intent with its status, and the balance statement
    /// with the running balance: one timeline, oldest first, a page at a time.
    History {
        /// The shop's account id.
        account: String,
        /// Items per page.
        #[arg(long, default_value_t = crate::history::DEFAULT_HISTORY_PAGE)]
        limit: usize,
        /// Where the previous page ended (its `next`).
        #[arg(long)]
        after: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Make a token; it is printed once and only its hash is stored.
    Create {
        /// Who it is for (appears in the audit log).
        #[arg(long)]
        name: String,
        /// shop, finance or operator.
        #[arg(long, value_enum)]
        role: crate::tokens::Role,
    },
    /// Revoke a token by name.
    Revoke {
        /// The token's name.
        #[arg(long)]
        name: String,
    },
}

#[derive(Debug, Subcommand)]
enum WebhookCommand {
    /// Send an endpoint's events again from `--from-seq` on (receivers deduplicate by id).
    Replay {
        /// The endpoint's name in the configuration.
        #[arg(long)]
        endpoint: String,
        /// The first event (`evt_<seq>`) to send again.
        #[arg(long)]
        from_seq: i64,
    },
    /// Deliveries per endpoint and state.
    Status,
}

#[derive(Debug, Subcommand)]
enum LedgerCommand {
    /// Every account's balance re-derived from the journal, and the invariant checks.
    TrialBalance,
}

/// Runs the command line and maps failures to a one-line message and exit code 1.
pub fn main() -> ExitCode {
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
                .downcast_ref::<crate::Error>()
                .is_some_and(crate::Error::is_broken_pipe)
    })
}

/// Writes `text` to stdout, failing (rather than panicking as `print!` does) when the reader
/// closed the pipe.
fn print_out(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(())
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

/// Past the shutdown deadline, what the process gives its draining server to close its own
/// connections before it exits regardless.
const SHUTDOWN_MARGIN: Duration = Duration::from_secs(1);

/// Ctrl-C, or SIGTERM where there is one.
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The error and its causes on one line.
fn one_line(error: &anyhow::Error) -> String {
    error
        .chain()
        .map(|cause| cause.to_string().replace('\n', " "))
        .collect::<Vec<_>>()
        .join(": ")
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let mut config = Config::load(cli.config.as_deref())?;
    if let Some(url) = cli.database_url {
        config.database_url = url.into();
    }
    let json = cli.json;
    if let Command::Bench(command) = cli.command {
        return crate::bench::run(command, &config, json).await;
    }
    let engine = Engine::from_config(&config)
        .await
        .with_context(|| format!("opening {}", config.database_url))?;
    match cli.command {
        Command::Init => {
            let backend = format!("{:?}", engine.store().backend()).to_lowercase();
            emit(
                json,
                &serde_json::json!({ "database": config.database_url.to_string(), "backend": backend, "migrated": true }),
                || format!("database ready: {} ({backend})", config.database_url),
            )
        }
        Command::Order(OrderCommand::Create(args)) => {
            let request = RentalOrderRequest {
                reference: args.reference,
                account_id: args.account,
                gpu_model: args.gpu,
                duration_days: args.days,
                lots: args.lots,
                total_usd: args.total_usd.parse::<Usd>()?,
            };
            let created = engine.create_rental_order(&request).await?;
            emit(json, &created, || {
                let verb = if created.created {
                    "created"
                } else {
                    "already exists"
                };
                format!("order {verb}\n{}", describe_order(&created.value))
            })
        }
        Command::Order(OrderCommand::Show { reference }) => {
            let reference = OrderRef::new(reference)?;
            let view = engine.order_view(&reference).await?;
            emit(json, &view, || describe_order_view(&view))
        }
        Command::Order(OrderCommand::PayFromBalance { reference }) => {
            let reference = OrderRef::new(reference)?;
            let payment = engine.pay_order_from_balance(&reference).await?;
            emit(json, &payment, || {
                let verb = if payment.debited_now {
                    "paid from balance"
                } else {
                    "was already paid from balance"
                };
                format!(
                    "order {reference} {verb}; balance now {} USD",
                    payment.balance_after
                )
            })
        }
        Command::Topup(TopupCommand::Create {
            account,
            amount_usd,
            reference,
        }) => {
            let request = TopupRequest {
                reference: reference.unwrap_or_else(|| format!("topup-{}", uuid::Uuid::new_v4())),
                account_id: account,
                amount_usd: amount_usd.parse::<Usd>()?,
            };
            let created = engine.create_topup(&request).await?;
            emit(json, &created, || {
                let verb = if created.created {
                    "created"
                } else {
                    "already exists"
                };
                format!("top-up {verb}\n{}", describe_order(&created.value))
            })
        }
        Command::Account(AccountCommand::History {
            account,
            limit,
            after,
        }) => {
            use crate::history::HistoryItem;
            let account = AccountId::new(account)?;
            let history = engine
                .account_history(&account, after.as_deref(), limit)
                .await?;
            emit(json, &history, || {
                let mut text = format!(
                    "account {}: {} USD available",
                    history.account_id, history.balance_usd
                );
                for item in &history.items {
                    text.push('\n');
                    text.push_str(&match item {
                        HistoryItem::Order { at, order } => {
                            format!("{} {}", at.to_rfc3339(), describe_order(order))
                        }
                        HistoryItem::Payment { at, payment } => {
                            format!("{} intent {}", at.to_rfc3339(), describe_intent(payment))
                        }
                        HistoryItem::Balance {
                            at,
                            entry,
                            change_usd,
                            balance_usd,
                            ..
                        } => format!(
                            "{} balance {change_usd:>12} USD -> {balance_usd} USD ({entry})",
                            at.to_rfc3339()
                        ),
                    });
                }
                if let Some(next) = &history.next {
                    text.push_str(&format!("\nmore: --after {next}"));
                }
                text
            })
        }
        Command::Balance { account } => {
            let account = AccountId::new(account)?;
            let available = engine.available_balance(&account).await?;
            emit(
                json,
                &serde_json::json!({ "account_id": account, "available_usd": available }),
                || format!("account {account}: {available} USD available"),
            )
        }
        Command::Ledger(LedgerCommand::TrialBalance) => {
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
        Command::Pay(PayCommand::Create {
            order,
            topup,
            method,
        }) => {
            let reference = OrderRef::new(order.or(topup).unwrap_or_default())?;
            let method: Method = method.parse()?;
            let instructions = engine.create_payment(&reference, method).await?;
            emit(json, &instructions, || describe_intent(&instructions))
        }
        Command::Pay(PayCommand::Show { intent }) => {
            let instructions = engine.payment(&intent).await?;
            emit(json, &instructions, || describe_intent(&instructions))
        }
        Command::Pay(PayCommand::MarkPaid { intent }) => {
            let instructions = engine.mark_paid(&intent).await?;
            emit(json, &instructions, || describe_intent(&instructions))
        }
        Command::Pay(PayCommand::Qr { intent }) => {
            let svg = engine.payment_qr_svg(&intent).await?;
            emit(
                json,
                &serde_json::json!({ "intent": intent, "svg": svg }),
                || svg.clone(),
            )
        }
        Command::Report(ReportCommand::Reconcile {
            from,
            to,
            method,
            format,
            section,
            output,
            audit,
        }) => {
            let query = crate::report::ReportQuery {
                from: crate::api::parse_time("--from", &from)?,
                to: crate::api::parse_time("--to", &to)?,
                method: method.map(|m| m.parse::<Method>()).transpose()?,
            };
            if audit {
                let report = engine.audit_credited(&config, &query).await?;
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
        Command::Find { text } => {
            use crate::support::Finding;
            let finding = engine.find(&text).await?.with_context(|| {
                format!("nothing matches {text:?}: no transaction, address, order or intent")
            })?;
            emit(json, &finding, || match &finding {
                Finding::Transfers { transfers } => transfers
                    .iter()
                    .map(|view| {
                        let mut text = format!(
                            "transfer {} {} base units of {} to {}, {} confirmations{}",
                            view.transfer.id,
                            view.transfer.amount,
                            crate::store::payments::asset_text(&view.transfer.asset),
                            view.transfer.to_address,
                            view.transfer.confirmations,
                            if view.transfer.removed {
                                ", REMOVED"
                            } else {
                                ""
                            }
                        );
                        match &view.intent {
                            Some(intent) => text.push_str(&format!(
                                "
intent {}",
                                describe_intent(intent)
                            )),
                            None => text.push_str(
                                "
no intent: an unmatched transfer",
                            ),
                        }
                        if let Some(order) = &view.order {
                            text.push_str(&format!(
                                "
{}",
                                describe_order(order)
                            ));
                        }
                        for exception in &view.exceptions {
                            text.push_str(&format!(
                                "
exception {}: {}",
                                exception.kind, exception.detail
                            ));
                        }
                        for posted in &view.ledger_entries {
                            text.push_str(&format!(
                                "
entry {}",
                                posted.entry.idempotency_key
                            ));
                        }
                        text
                    })
                    .collect::<Vec<_>>()
                    .join("\n\n"),
                Finding::Address(view) => {
                    let mut text = format!("address {}", view.address);
                    match &view.intent {
                        Some(intent) => text.push_str(&format!(
                            "
intent {}",
                            describe_intent(intent)
                        )),
                        None => text.push_str(
                            "
no intent of payrecon's",
                        ),
                    }
                    if let Some(order) = &view.order {
                        text.push_str(&format!(
                            "
{}",
                            describe_order(order)
                        ));
                    }
                    for transfer in &view.transfers {
                        text.push_str(&format!(
                            "
transfer {} {} base units, {} confirmations{}{}",
                            transfer.id,
                            transfer.amount,
                            transfer.confirmations,
                            if transfer.removed { ", REMOVED" } else { "" },
                            if transfer.intent_id.is_none() {
                                ", unmatched"
                            } else {
                                ""
                            }
                        ));
                    }
                    text
                }
                Finding::Order(view) => describe_order_view(view),
                Finding::Intent { intent, order } => format!(
                    "intent {}\n{}",
                    describe_intent(intent),
                    describe_order_view(order)
                ),
            })
        }
        Command::Stuck {
            marked_paid_minutes,
            seen_hours,
        } => {
            let options = crate::stuck::StuckOptions {
                marked_paid_unseen: chrono::Duration::minutes(marked_paid_minutes),
                seen_unconfirmed: chrono::Duration::hours(seen_hours),
                ..crate::stuck::StuckOptions::default()
            };
            let items = engine.stuck(&options).await?;
            emit(json, &items, || {
                if items.is_empty() {
                    return "nothing is stuck".to_owned();
                }
                let mut text = format!(
                    "{:<19} {:<22} {:<26} {:<20} WHAT / ACTIONS",
                    "CATEGORY", "KIND", "SINCE", "ORDER"
                );
                for item in &items {
                    text.push_str(&format!(
                        "\n{:<19} {:<22} {:<26} {:<20} {}\n{:>90} {}\n{:>90} -> {}",
                        item.category,
                        item.kind,
                        item.since
                            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                        item.order_ref.as_deref().unwrap_or("-"),
                        item.what,
                        "",
                        item.subject,
                        "",
                        item.actions.join("; ")
                    ));
                }
                text
            })
        }
        Command::Exception(ExceptionCommand::List { open }) => {
            let mut all = engine.exceptions(None).await?;
            if open {
                all.retain(|e| e.resolved_at.is_none());
            }
            emit(json, &all, || {
                all.iter()
                    .map(|e| {
                        format!(
                            "{} [{}] {}: {}",
                            e.id,
                            e.resolution.as_deref().unwrap_or("OPEN"),
                            e.kind,
                            e.detail
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            })
        }
        Command::Exception(ExceptionCommand::Resolve {
            id,
            action,
            actor,
            reason,
            account,
            usd,
            refund_txid,
        }) => {
            let action = match action {
                ActionArg::AcceptAsPaid => crate::operator::Action::AcceptAsPaid,
                ActionArg::CreditBalance => crate::operator::Action::CreditBalance {
                    account,
                    usd: usd.map(|u| u.parse::<Usd>()).transpose()?,
                },
                ActionArg::MarkRefunded => crate::operator::Action::MarkRefunded {
                    refund_txid: refund_txid
                        .context("--action mark-refunded needs --refund-txid")?,
                },
                ActionArg::Dismiss => crate::operator::Action::Dismiss,
            };
            let resolved = engine
                .resolve_exception(&id, &action, &actor, &reason)
                .await?;
            emit(json, &resolved, || {
                format!(
                    "{} resolved: {}{}",
                    resolved.exception.id,
                    resolved.exception.resolution.as_deref().unwrap_or_default(),
                    resolved
                        .entry
                        .as_ref()
                        .map(|e| format!(" (entry {})", e.idempotency_key))
                        .unwrap_or_default()
                )
            })
        }
        Command::Exception(ExceptionCommand::Log) => {
            let log = engine.operator_actions().await?;
            emit(json, &log, || {
                log.iter()
                    .map(|a| {
                        format!(
                            "{} {} {} on {} by {}: {}",
                            a.seq,
                            a.at.to_rfc3339(),
                            a.action,
                            a.exception_id,
                            a.actor,
                            a.reason
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            })
        }
        Command::Token(TokenCommand::Create { name, role }) => {
            let token = engine.create_api_token(&name, role).await?;
            emit(
                json,
                &serde_json::json!({ "name": name, "role": role, "token": token }),
                || format!("{token}\n(a {role} token for {name}; it is shown only now)"),
            )
        }
        Command::Token(TokenCommand::Revoke { name }) => {
            anyhow::ensure!(
                engine.revoke_api_token(&name).await?,
                "no live token is named {name}"
            );
            emit(json, &serde_json::json!({ "revoked": name }), || {
                format!("token {name} revoked")
            })
        }
        Command::Webhook(WebhookCommand::Replay { endpoint, from_seq }) => {
            let configured = config
                .webhooks
                .iter()
                .find(|w| w.name == endpoint)
                .with_context(|| format!("no webhook named {endpoint} is configured"))?;
            let queued = engine
                .replay_webhooks(&endpoint, from_seq, configured.retry_hours)
                .await?;
            emit(
                json,
                &serde_json::json!({ "endpoint": endpoint, "queued": queued }),
                || format!("{queued} deliveries to {endpoint} queued again"),
            )
        }
        Command::Webhook(WebhookCommand::Status) => {
            let counts = engine.webhook_counts().await?;
            emit(json, &counts, || {
                counts
                    .iter()
                    .map(|(endpoint, state, n)| format!("{endpoint} {state} {n}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
        }
        Command::Serve => {
            let (stop, shutdown) = tokio::sync::watch::channel(false);
            let deadline = Duration::from_secs(u64::from(config.serve.shutdown_seconds));
            tokio::spawn(async move {
                wait_for_signal().await;
                tracing::warn!(
                    ?deadline,
                    "shutting down: finishing requests, live statuses and the watchers' rounds (a second signal exits at once)"
                );
                let _ = stop.send(true);
                // Whatever is still running then is cut off: every commit is atomic, so what
                // was not committed is done again by the next start.
                tokio::select! {
                    () = wait_for_signal() => tracing::warn!("second signal: exiting now"),
                    () = tokio::time::sleep(deadline + SHUTDOWN_MARGIN) => {
                        tracing::error!(?deadline, "shutdown deadline passed: exiting now");
                    }
                }
                std::process::exit(1);
            });
            crate::serve::serve(engine, &config, shutdown).await?;
            tracing::info!("stopped");
            Ok(())
        }
        Command::Bench(_) => unreachable!("handled before opening the engine"),
    }
}

fn describe_order(order: &Order) -> String {
    let what = match &order.kind {
        OrderKind::Rental(r) => format!(
            "rental {} x{} lots ({} GPUs) for {} days",
            r.gpu_model, r.lots, r.gpu_count, r.duration_days
        ),
        OrderKind::Topup => "top-up".to_owned(),
    };
    let status = match &order.status {
        OrderStatus::Open => "open".to_owned(),
        OrderStatus::Settled { via, entry_key, at } => {
            format!(
                "settled via {} at {} (entry {entry_key})",
                via.as_str(),
                at.to_rfc3339()
            )
        }
    };
    format!(
        "reference: {}\naccount:   {}\nwhat:      {what}\ntotal:     {} USD\nstatus:    {status}",
        order.reference, order.account_id, order.total_usd
    )
}

fn describe_intent(instructions: &crate::payments::PaymentInstructions) -> String {
    let intent = &instructions.intent;
    let mut text = format!(
        "{} ({}) for order {}\n  status:   {}{}\n  pay:      {} {} to {}\n  uri:      {}\n  rate:     {} USD/{} from {} at {}\n  usd:      {}\n  deadline: {}",
        intent.id,
        intent.method,
        intent.order_ref,
        intent.status,
        intent
            .superseded_by
            .as_ref()
            .map(|s| format!(" (superseded by {s})"))
            .unwrap_or_default(),
        instructions.amount_decimal,
        instructions.asset,
        intent.pay_to,
        instructions.payment_uri,
        intent.rate.usd_per_unit,
        instructions.asset,
        intent.rate.source,
        intent.rate.fetched_at.to_rfc3339(),
        intent.usd,
        intent.deadline.to_rfc3339(),
    );
    if intent.watch_key != intent.pay_to {
        text.push_str(&format!("\n  reference: {}", intent.watch_key));
    }
    if let Some(at) = intent.marked_paid_at {
        text.push_str(&format!("\n  customer marked paid at {}", at.to_rfc3339()));
    }
    text.push_str(&format!("\n  {}", instructions.customer_message));
    text
}

/// The support view of one order, as text.
fn describe_order_view(view: &crate::support::OrderView) -> String {
    let mut text = describe_order(&view.order);
    if let Some(attention) = &view.order.attention {
        text.push_str(&format!("\nATTENTION: {attention}"));
    }
    for intent in &view.payment_intents {
        text.push_str(&format!("\nintent {}", describe_intent(intent)));
    }
    for transfer in &view.transfers {
        text.push_str(&format!(
            "\ntransfer {} {} base units of {}, {} confirmations{}{}",
            transfer.id,
            transfer.amount,
            crate::store::payments::asset_text(&transfer.asset),
            transfer.confirmations,
            if transfer.removed { ", REMOVED" } else { "" },
            transfer
                .credited_entry
                .as_ref()
                .map(|e| format!(", entry {e}"))
                .unwrap_or_default()
        ));
    }
    for exception in &view.exceptions {
        let state = if exception.resolved_at.is_some() {
            "resolved"
        } else {
            "OPEN"
        };
        text.push_str(&format!(
            "\nexception {} [{state}]: {}",
            exception.kind, exception.detail
        ));
    }
    for posted in &view.ledger_entries {
        text.push_str(&format!(
            "\nentry {} ({}) at {}",
            posted.entry.idempotency_key,
            posted.entry.kind.as_str(),
            posted.posted_at.to_rfc3339()
        ));
        for leg in &posted.entry.postings {
            text.push_str(&format!(
                "\n  {:<32} {:>24} {}",
                leg.account.to_string(),
                leg.currency.format(leg.amount_minor),
                leg.currency
            ));
        }
    }
    text
}

/// Prints `value` as JSON, or the text `describe` makes.
pub(crate) fn emit<T: Serialize>(
    json: bool,
    value: &T,
    describe: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    let text = if json {
        serde_json::to_string_pretty(value)?
    } else {
        describe()
    };
    print_out(&format!("{text}\n"))
}
