//! How commands print: one JSON document with `--json`, readable text otherwise.

use payrecon::{Order, OrderKind, OrderStatus, OrderView, PaymentInstructions};
use serde::Serialize;

/// Writes `text` to stdout, failing (rather than panicking as `print!` does) when the reader
/// closed the pipe.
pub(super) fn print_out(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

pub(super) fn describe_order(order: &Order) -> String {
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

pub(super) fn describe_intent(instructions: &PaymentInstructions) -> String {
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
pub(super) fn describe_order_view(view: &OrderView) -> String {
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
            transfer.asset,
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
pub(super) fn emit<T: Serialize>(
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
