//! The shop's commands: orders, top-ups, balances and payment instructions.

use clap::{Args, Subcommand};
use payrecon::chain::Method;
use payrecon::{AccountId, Engine, OrderRef, RentalOrderRequest, TopupRequest, Usd};

use super::output::{describe_intent, describe_order, describe_order_view, emit};

/// Items per page of an account's history, unless told.
const DEFAULT_HISTORY_PAGE: usize = 50;

#[derive(Debug, Subcommand)]
pub(super) enum OrderCommand {
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
pub(super) struct CreateOrderArgs {
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
pub(super) enum TopupCommand {
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
pub(super) enum AccountCommand {
    /// Orders and top-ups, every payment intent with its status, and the balance statement
    /// with the running balance: one timeline, oldest first, a page at a time.
    History {
        /// The shop's account id.
        account: String,
        /// Items per page.
        #[arg(long, default_value_t = DEFAULT_HISTORY_PAGE)]
        limit: usize,
        /// Where the previous page ended (its `next`).
        #[arg(long)]
        after: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum PayCommand {
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

/// Rental orders.
pub(super) async fn order(
    command: OrderCommand,
    engine: &Engine,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        OrderCommand::Create(args) => {
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
        OrderCommand::Show { reference } => {
            let reference = OrderRef::new(reference)?;
            let view = engine.order_view(&reference).await?;
            emit(json, &view, || describe_order_view(&view))
        }
        OrderCommand::PayFromBalance { reference } => {
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
    }
}

/// Balance top-ups.
pub(super) async fn topup(
    command: TopupCommand,
    engine: &Engine,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        TopupCommand::Create {
            account,
            amount_usd,
            reference,
        } => {
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
    }
}

/// A customer's history.
pub(super) async fn account(
    command: AccountCommand,
    engine: &Engine,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        AccountCommand::History {
            account,
            limit,
            after,
        } => {
            use payrecon::HistoryItem;
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
    }
}

/// Payment instructions.
pub(super) async fn pay(command: PayCommand, engine: &Engine, json: bool) -> anyhow::Result<()> {
    match command {
        PayCommand::Create {
            order,
            topup,
            method,
        } => {
            let reference = OrderRef::new(order.or(topup).unwrap_or_default())?;
            let method: Method = method.parse()?;
            let instructions = engine.create_payment(&reference, method).await?;
            emit(json, &instructions, || describe_intent(&instructions))
        }
        PayCommand::Show { intent } => {
            let instructions = engine.payment(&intent).await?;
            emit(json, &instructions, || describe_intent(&instructions))
        }
        PayCommand::MarkPaid { intent } => {
            let instructions = engine.mark_paid(&intent).await?;
            emit(json, &instructions, || describe_intent(&instructions))
        }
        PayCommand::Qr { intent } => {
            let svg = engine.payment_qr_svg(&intent).await?;
            emit(
                json,
                &serde_json::json!({ "intent": intent, "svg": svg }),
                || svg.clone(),
            )
        }
    }
}

/// A customer's available USD balance.
pub(super) async fn balance(account: String, engine: &Engine, json: bool) -> anyhow::Result<()> {
    let account = AccountId::new(account)?;
    let available = engine.available_balance(&account).await?;
    emit(
        json,
        &serde_json::json!({ "account_id": account, "available_usd": available }),
        || format!("account {account}: {available} USD available"),
    )
}
