//! Operators' commands: what is stuck, exceptions and their resolution, support lookup, API
//! tokens and webhook deliveries.

use anyhow::Context;
use clap::Subcommand;
use payrecon::{Action, Config, Engine, Finding, Role, StuckOptions, Usd};

use super::named;
use super::output::{describe_intent, describe_order, describe_order_view, emit};

#[derive(Debug, Subcommand)]
pub(super) enum RefundCommand {
    /// Record where an exception's money goes back: the customer's address on the network it
    /// arrived on, and how much (never more than is held and not yet refunded).
    Request {
        /// The exception whose money goes back (as `exception list` shows it).
        #[arg(required_unless_present = "payment", conflicts_with = "payment")]
        exception: Option<String>,
        /// Or a settled payment (its intent id, `pi_…`) to refund: the credit it bought is
        /// taken back from the customer's balance or the rental revenue first.
        #[arg(long)]
        payment: Option<String>,
        /// The customer's address.
        #[arg(long)]
        address: String,
        /// `all` that is left, the `overpaid` part, or an amount in the asset's units.
        #[arg(long, default_value = "all")]
        amount: String,
        /// Who records it (in the refund's history).
        #[arg(long)]
        actor: String,
    },
    /// Approve a requested refund: the merchant's wallet is to send it.
    Approve {
        /// The refund id (`rf_…`).
        id: String,
        /// Who approves.
        #[arg(long)]
        actor: String,
    },
    /// Prepare an approved Bitcoin or Litecoin refund for the merchant's wallet to sign: a
    /// PSBT (BIP 174) that spends the outputs holding the money, pays the customer and sends
    /// the change to the account's change branch. payrecon never signs.
    Prepare {
        /// The refund id (`rf_…`).
        id: String,
        /// Where to write the PSBT, base64 (Sparrow, Electrum and `walletprocesspsbt` read it).
        #[arg(long)]
        output: std::path::PathBuf,
        /// Who prepares it.
        #[arg(long)]
        actor: String,
    },
    /// Record that an approved refund was paid from another wallet (a treasury, an exchange):
    /// the transaction must be in a block and pay the customer's address the refund's
    /// amount. payrecon completes it at depth.
    Sent {
        /// The refund id (`rf_…`).
        id: String,
        /// The transaction that paid it.
        #[arg(long)]
        txid: String,
        /// Who records it.
        #[arg(long)]
        actor: String,
    },
    /// Withdraw a refund not yet sent: its amount is free for another.
    Cancel {
        /// The refund id (`rf_…`).
        id: String,
        /// Who withdraws it.
        #[arg(long)]
        actor: String,
        /// Why.
        #[arg(long)]
        reason: String,
    },
    /// Refunds, oldest first: of one exception, or all.
    List {
        /// Only this exception's.
        #[arg(long)]
        exception: Option<String>,
    },
}

/// `payrecon refund …`.
pub(super) async fn refund(
    command: RefundCommand,
    engine: &Engine,
    json: bool,
) -> anyhow::Result<()> {
    let refunds = match command {
        RefundCommand::Prepare { id, output, actor } => {
            let prepared = engine.prepare_refund(&id, &actor).await?;
            let (file, summary) = prepared_refund_text(&prepared)?;
            std::fs::write(&output, file)
                .with_context(|| format!("cannot write {}", output.display()))?;
            return emit(json, &prepared, || {
                format!(
                    "{}: written to {}\n{summary}\npayment request: {}",
                    prepared.refund.id,
                    output.display(),
                    prepared.payment_request
                )
            });
        }
        RefundCommand::Request {
            exception,
            payment,
            address,
            amount,
            actor,
        } => vec![match (exception, payment) {
            (_, Some(intent)) => {
                engine
                    .request_payment_refund(&intent, &address, &amount, &actor)
                    .await?
            }
            (Some(exception), None) => {
                engine
                    .request_refund(&exception, &address, &amount, &actor)
                    .await?
            }
            (None, None) => anyhow::bail!("name an exception or --payment"),
        }],
        RefundCommand::Approve { id, actor } => vec![engine.approve_refund(&id, &actor).await?],
        RefundCommand::Sent { id, txid, actor } => {
            vec![engine.refund_sent(&id, &txid, &actor).await?]
        }
        RefundCommand::Cancel { id, actor, reason } => {
            vec![engine.cancel_refund(&id, &actor, &reason).await?]
        }
        RefundCommand::List { exception } => engine.refunds(exception.as_deref()).await?,
    };
    emit(json, &refunds, || {
        refunds
            .iter()
            .map(|r| {
                format!(
                    "{} [{}] {} {} to {} (exception {}){}",
                    r.id,
                    r.state.as_str(),
                    r.amount_decimal,
                    r.method.asset(),
                    r.address,
                    r.exception_id,
                    r.txid
                        .as_ref()
                        .map(|txid| format!(" in {txid}"))
                        .unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// What `refund prepare` writes (the PSBT in base64, Ethereum's unsigned transaction as
/// JSON, else the payment request) and what it says of it.
fn prepared_refund_text(prepared: &payrecon::PreparedRefund) -> anyhow::Result<(String, String)> {
    let refund = &prepared.refund;
    if let Some(psbt) = &prepared.psbt {
        let change = match (&psbt.change_address, &psbt.change_path) {
            (Some(address), Some(path)) => format!("{address} ({path})"),
            _ => "none (what is left over pays the fee)".into(),
        };
        let rate = if psbt.fee_rate_estimated {
            ""
        } else {
            " (the relay floor: the source has no estimate)"
        };
        let summary = format!(
            "PSBT: pays {} {} to {}\nfee {} at {} sat/vB{rate}\nspends {}\nchange {change}",
            psbt.pays,
            refund.method.asset(),
            refund.address,
            psbt.fee,
            psbt.fee_rate,
            psbt.inputs.join(", ")
        );
        return Ok((format!("{}\n", psbt.psbt), summary));
    }
    let paying = format!(
        "{} {} to {}",
        refund.amount_decimal,
        refund.method.asset(),
        refund.address
    );
    match &prepared.unsigned_transaction {
        Some(payrecon::UnsignedRefund::Ethereum(unsigned)) => {
            let summary = format!(
                "unsigned EIP-1559 transaction from {} (nonce {}): {paying}, fee at most {} wei; send {} wei to {} first",
                unsigned.from,
                unsigned.nonce,
                unsigned.max_fee,
                unsigned.top_up_first,
                unsigned.from
            );
            return Ok((serde_json::to_string_pretty(unsigned)? + "\n", summary));
        }
        Some(payrecon::UnsignedRefund::Tron(unsigned)) => {
            let summary = format!(
                "unsigned Tron transaction {} from {}: {paying}, burning at most {} sun of energy; send {} sun to {} first; sign it before {}",
                unsigned.txid,
                unsigned.from,
                unsigned.fee_limit,
                unsigned.top_up_first,
                unsigned.from,
                chrono::DateTime::from_timestamp_millis(unsigned.expires_at_ms).map_or_else(
                    || unsigned.expires_at_ms.to_string(),
                    |at| at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                )
            );
            return Ok((
                serde_json::to_string_pretty(&unsigned.transaction)? + "\n",
                summary,
            ));
        }
        Some(payrecon::UnsignedRefund::Solana(unsigned)) => {
            let summary = format!(
                "unsigned Solana transfer from {}: {paying}, fee {} lamports; send {} lamports to {} first; sign it before block height {}",
                unsigned.from,
                unsigned.fee,
                unsigned.top_up_first,
                unsigned.from,
                unsigned.last_valid_block_height
            );
            return Ok((serde_json::to_string_pretty(unsigned)? + "\n", summary));
        }
        None => {}
    }
    let summary = format!("send {paying} from the merchant's wallet");
    Ok((format!("{}\n", prepared.payment_request), summary))
}

#[derive(Debug, Subcommand)]
pub(super) enum ExceptionCommand {
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
        /// accept-as-paid, credit-balance, mark-refunded, mark-own-funds (a gas top-up from the
        /// merchant's wallet) or dismiss.
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
pub(super) enum ActionArg {
    AcceptAsPaid,
    CreditBalance,
    MarkRefunded,
    MarkOwnFunds,
    Dismiss,
}

#[derive(Debug, Subcommand)]
pub(super) enum TokenCommand {
    /// Make a token; it is printed once and only its hash is stored.
    Create {
        /// Who it is for (appears in the audit log).
        #[arg(long)]
        name: String,
        /// shop, finance or operator.
        #[arg(long, value_parser = named::<Role>(&Role::NAMES))]
        role: Role,
    },
    /// Revoke a token by name.
    Revoke {
        /// The token's name.
        #[arg(long)]
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum WebhookCommand {
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

/// Exceptions and the operators' actions on them.
pub(super) async fn exception(
    command: ExceptionCommand,
    engine: &Engine,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        ExceptionCommand::List { open } => {
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
        ExceptionCommand::Resolve {
            id,
            action,
            actor,
            reason,
            account,
            usd,
            refund_txid,
        } => {
            let action = match action {
                ActionArg::AcceptAsPaid => Action::AcceptAsPaid,
                ActionArg::CreditBalance => Action::CreditBalance {
                    account,
                    usd: usd.map(|u| u.parse::<Usd>()).transpose()?,
                },
                ActionArg::MarkRefunded => Action::MarkRefunded {
                    refund_txid: refund_txid
                        .context("--action mark-refunded needs --refund-txid")?,
                },
                ActionArg::MarkOwnFunds => Action::MarkOwnFunds,
                ActionArg::Dismiss => Action::Dismiss,
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
        ExceptionCommand::Log => {
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
    }
}

/// Bearer tokens of the HTTP API.
pub(super) async fn token(
    command: TokenCommand,
    engine: &Engine,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        TokenCommand::Create { name, role } => {
            let token = engine.create_api_token(&name, role).await?;
            emit(
                json,
                &serde_json::json!({ "name": name, "role": role, "token": token }),
                || format!("{token}\n(a {role} token for {name}; it is shown only now)"),
            )
        }
        TokenCommand::Revoke { name } => {
            anyhow::ensure!(
                engine.revoke_api_token(&name).await?,
                "no live token is named {name}"
            );
            emit(json, &serde_json::json!({ "revoked": name }), || {
                format!("token {name} revoked")
            })
        }
    }
}

/// Webhook deliveries.
pub(super) async fn webhook(
    command: WebhookCommand,
    engine: &Engine,
    config: &Config,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        WebhookCommand::Replay { endpoint, from_seq } => {
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
        WebhookCommand::Status => {
            let counts = engine.webhook_counts().await?;
            emit(json, &counts, || {
                counts
                    .iter()
                    .map(|(endpoint, state, n)| format!("{endpoint} {state} {n}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
        }
    }
}

/// What operators must look at.
pub(super) async fn stuck(
    marked_paid_minutes: i64,
    seen_hours: i64,
    engine: &Engine,
    json: bool,
) -> anyhow::Result<()> {
    let options = StuckOptions {
        marked_paid_unseen: chrono::Duration::minutes(marked_paid_minutes),
        seen_unconfirmed: chrono::Duration::hours(seen_hours),
        ..StuckOptions::default()
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

/// Support lookup.
pub(super) async fn find(text: String, engine: &Engine, json: bool) -> anyhow::Result<()> {
    let finding = engine.find(&text).await?.with_context(|| {
        format!("nothing matches {text:?}: no transaction, address, order or intent")
    })?;
    emit(json, &finding, || match &finding {
        Finding::Transfers { transfers } => transfers
            .iter()
            .map(|view| {
                let sender = view.transfer.from_address.as_deref();
                let mut text = format!(
                    "transfer {} {} base units of {}{} to {}, {} confirmations{}",
                    view.transfer.id,
                    view.transfer.amount,
                    view.transfer.asset,
                    sender
                        .map(|from| format!(" from {from}"))
                        .unwrap_or_default(),
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
