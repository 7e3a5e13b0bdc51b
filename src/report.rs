//! The finance reconciliation report: per method, what was expected, received, booked and
//! credited in a period and why they differ; every transfer with its intent, ledger entry and
//! state; every exception and its resolution; the trial balance.
//!
//! The report streams: a first pass folds the period into per-method and per-day sums, a
//! second writes the transfers one by one. A million transfers never sit in memory.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use payrecon_chain_core::{Amount, Method, ReceivedAsset};
use rust_decimal::{Decimal, RoundingStrategy};
use serde::Serialize;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::error::Error;
use crate::ledger::TrialBalance;
use crate::ledger::{Account, Currency, SuspenseReason};
use crate::records::ExceptionRecord;
use crate::store::Store;
use crate::store::reports::{self, ReportTransfer};

/// Bytes buffered before the report reaches its writer: a file written through tokio makes a
/// trip to the blocking pool per write, so few large ones.
pub(crate) const OUTPUT_BUFFER_BYTES: usize = 256 * 1024;

/// Which period and method a report covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportQuery {
    /// Start, inclusive.
    pub from: DateTime<Utc>,
    /// End, exclusive.
    pub to: DateTime<Utc>,
    /// One method only, if given.
    pub method: Option<Method>,
}

/// How the report is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportFormat {
    /// One table, one header row: opens in a spreadsheet as is.
    Csv,
    /// One JSON document, every section.
    Json,
    /// A printable page with tables, totals and a chart.
    Html,
}

/// The table a CSV report holds (a CSV file has one header row, so one table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CsvSection {
    /// Every transfer of the period.
    #[default]
    Transfers,
    /// The per-method summary.
    Summary,
    /// Every exception opened in the period.
    Exceptions,
    /// Each account's balance and each currency's total.
    Balances,
}

/// Parses one of `names` into the matching value of `values`, naming the choices when it is
/// none of them.
fn named<T: Copy>(text: &str, names: &[&str], values: &[T], what: &str) -> Result<T, Error> {
    names
        .iter()
        .position(|name| *name == text)
        .map(|i| values[i])
        .ok_or_else(|| {
            Error::InvalidInput(format!(
                "{what} must be one of {}, got {text:?}",
                names.join(", ")
            ))
        })
}

impl ReportFormat {
    /// Every format's name, as the CLI and the API take it.
    pub const NAMES: [&'static str; 3] = ["csv", "json", "html"];
}

impl std::str::FromStr for ReportFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<ReportFormat, Error> {
        use ReportFormat::*;
        named(s, &ReportFormat::NAMES, &[Csv, Json, Html], "format")
    }
}

impl CsvSection {
    /// Every section's name, as the CLI and the API take it.
    pub const NAMES: [&'static str; 4] = ["transfers", "summary", "exceptions", "balances"];
}

impl std::str::FromStr for CsvSection {
    type Err = Error;
    fn from_str(s: &str) -> Result<CsvSection, Error> {
        use CsvSection::*;
        named(
            s,
            &CsvSection::NAMES,
            &[Transfers, Summary, Exceptions, Balances],
            "section",
        )
    }
}

/// One method's figures for the period. Crypto amounts are exact decimals of the asset.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MethodSummary {
    /// The method.
    pub method: String,
    /// Its asset.
    pub asset: String,
    /// Payment instructions created in the period (superseded ones not counted).
    pub intents_created: u64,
    /// Of them, settled.
    pub intents_settled: u64,
    /// Of them, expired without payment.
    pub intents_expired: u64,
    /// Of them, underpaid, paid late, reversed or with an open exception.
    pub intents_in_exception: u64,
    /// The amounts those instructions asked for.
    pub expected: String,
    /// Transfers of the asset first seen in the period, reorged ones excluded.
    pub received: String,
    /// Crypto the ledger took into custody in the period, net of reorg reversals.
    pub booked: String,
    /// Crypto converted to USD at locked rates in the period.
    pub credited: String,
    /// Crypto put in (or, negative, released from) suspense in the period.
    pub held: String,
    /// Crypto that left custody (refunds) in the period.
    pub refunded: String,
    /// The merchant's own crypto among what arrived: fee top-ups from its treasury, and money
    /// operators marked as its own.
    pub own_funds: String,
    /// Dust that reached the shop's addresses in the period (below the method's dust limit:
    /// address poisoning and spam), held in `suspense:dust` and part of `held`: one line,
    /// however many transfers, each of which opens no exception.
    pub dust: String,
    /// USD credited to orders and balances in the period.
    pub usd_credited: String,
    /// Received minus credited.
    pub difference: String,
    /// What the difference is made of.
    pub why: String,
    #[serde(skip)]
    sums: Sums,
}

/// Exact sums behind a [`MethodSummary`], in base units (signed for ledger nets).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Sums {
    expected: u128,
    received: u128,
    unbooked: u128,
    booked: i128,
    credited: i128,
    held: i128,
    refunded: i128,
    own_funds: i128,
    dust: i128,
    found_by_check: i128,
    usd_cents: i128,
}

impl Sums {
    /// What received minus credited is made of, in words.
    fn why(&self, currency: Currency) -> String {
        format!(
            "{} held in suspense ({} of it dust, {} found by the holdings check with no receipt), {} not booked yet (confirming, underpaid or unmatched), {} refunded, {} the merchant's own (fee top-ups)",
            currency.format(self.held),
            currency.format(self.dust),
            currency.format(self.found_by_check),
            currency.format(self.unbooked as i128),
            currency.format(self.refunded),
            currency.format(self.own_funds)
        )
    }

    /// A posting of `amount` to `suspense:<reason>` (a credit, negative, puts money there).
    fn hold(&mut self, reason: SuspenseReason, amount: i128) {
        self.held -= amount;
        match reason {
            SuspenseReason::Dust => self.dust -= amount,
            SuspenseReason::Unreconciled => self.found_by_check -= amount,
            _ => {}
        }
    }
}

/// The report's totals, returned to the caller once it is written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReportTotals {
    /// Transfers listed.
    pub transfers: u64,
    /// Exceptions listed.
    pub exceptions: u64,
    /// Per method.
    pub methods: Vec<MethodSummary>,
    /// Whether the trial balance is sound (every currency sums to zero).
    pub trial_balance_sound: bool,
}

/// What the first pass learns about the period.
pub(crate) struct Folded {
    pub(crate) methods: BTreeMap<Method, MethodSummary>,
    /// Received base units per day and method, for the chart.
    pub(crate) per_day: BTreeMap<(String, Method), u128>,
}

/// The first pass: intents, transfers and postings of the period summed by the database
/// (a few hundred rows come back, however long the period).
pub(crate) async fn fold_period(store: &Store, query: &ReportQuery) -> Result<Folded, Error> {
    let (from, to) = (query.from.timestamp_millis(), query.to.timestamp_millis());
    let mut methods: BTreeMap<Method, MethodSummary> = Method::ALL
        .into_iter()
        .filter(|m| query.method.is_none_or(|q| q == *m))
        .map(|m| {
            let summary = MethodSummary {
                method: m.id().to_owned(),
                asset: m.asset().to_string(),
                ..MethodSummary::default()
            };
            (m, summary)
        })
        .collect();
    let mut per_day = BTreeMap::new();
    let pool = store.pool();
    let (mut conn, mut postings_conn) = (pool.acquire().await?, pool.acquire().await?);
    let ((intent_sums, open_exceptions, transfer_sums), posting_sums) = tokio::try_join!(
        async {
            let intents = reports::intent_sums(&mut conn, from, to).await?;
            let open = reports::intents_with_open_exceptions(&mut conn, from, to).await?;
            let transfers = reports::transfer_sums(&mut conn, from, to).await?;
            Ok::<_, crate::store::StoreError>((intents, open, transfers))
        },
        reports::posting_sums(&mut postings_conn, from, to),
    )?;
    let known = |text: &str| text.parse::<Method>().ok();
    for intents in intent_sums {
        let Some(summary) = known(&intents.method).and_then(|m| methods.get_mut(&m)) else {
            continue;
        };
        if intents.superseded {
            continue;
        }
        let count = u64::try_from(intents.count).unwrap_or(0);
        summary.intents_created += count;
        match intents.status.as_str() {
            "settled" => summary.intents_settled += count,
            "expired" => summary.intents_expired += count,
            "underpaid" | "paid_late" | "reorged_after_credit" => {
                summary.intents_in_exception += count
            }
            _ => {}
        }
        summary.sums.expected += u128::try_from(intents.expected).unwrap_or(0);
    }
    for (method, count) in open_exceptions {
        if let Some(summary) = known(&method).and_then(|m| methods.get_mut(&m)) {
            summary.intents_in_exception = summary.intents_in_exception.max(count as u64);
        }
    }
    for transfers in transfer_sums {
        let Some(method) = known(&transfers.asset) else {
            continue;
        };
        let Some(summary) = methods.get_mut(&method) else {
            continue;
        };
        let units = u128::try_from(transfers.received).unwrap_or(0);
        summary.sums.received += units;
        if transfers.unbooked {
            summary.sums.unbooked += units;
        }
        *per_day
            .entry((day(transfers.day * DAY_MS), method))
            .or_insert(0) += units;
    }
    for postings in posting_sums {
        let (Ok(account), Ok(currency)) = (
            postings.account.parse::<Account>(),
            postings.currency.parse::<Currency>(),
        ) else {
            continue;
        };
        let method = match (&account, currency) {
            (_, Currency::Crypto(m)) => m,
            (Account::Fx(m), Currency::Usd) => *m,
            _ => continue,
        };
        let Some(summary) = methods.get_mut(&method) else {
            continue;
        };
        let amount = postings.sum;
        let sums = &mut summary.sums;
        // A refund takes crypto out of custody (an operator's entry, before refunds were
        // records) or out of suspense (a completed refund); a reorg's reversal takes back
        // what was booked.
        match (&account, currency) {
            (Account::Custody(_), _) if postings.refund => sums.refunded -= amount,
            (Account::Suspense(reason), _) if postings.refund => {
                sums.refunded += amount;
                sums.hold(*reason, amount);
            }
            (Account::Custody(_), _) => sums.booked += amount,
            (Account::Fx(_), Currency::Crypto(_)) => sums.credited -= amount,
            (Account::Fx(_), Currency::Usd) => sums.usd_cents += amount,
            (Account::Suspense(reason), Currency::Crypto(_)) => sums.hold(*reason, amount),
            (Account::Treasury(_), Currency::Crypto(_)) => sums.own_funds -= amount,
            _ => {}
        }
    }
    for (method, summary) in &mut methods {
        let currency = Currency::Crypto(*method);
        let s = &summary.sums;
        summary.expected = currency.format(s.expected as i128);
        summary.received = currency.format(s.received as i128);
        summary.booked = currency.format(s.booked);
        summary.credited = currency.format(s.credited);
        summary.held = currency.format(s.held);
        summary.refunded = currency.format(s.refunded);
        summary.own_funds = currency.format(s.own_funds);
        summary.dust = currency.format(s.dust);
        summary.usd_credited = Currency::Usd.format(s.usd_cents);
        summary.difference = currency.format(s.received as i128 - s.credited);
        summary.why = s.why(currency);
    }
    Ok(Folded { methods, per_day })
}

/// The period's exceptions.
async fn period_exceptions(
    store: &Store,
    query: &ReportQuery,
) -> Result<Vec<ExceptionRecord>, Error> {
    let mut conn = store.pool().acquire().await?;
    Ok(reports::exceptions_in(
        &mut conn,
        query.from.timestamp_millis(),
        query.to.timestamp_millis(),
    )
    .try_collect()
    .await?)
}

pub(crate) async fn write_csv<W: AsyncWrite + Unpin + Send>(
    store: &Store,
    query: &ReportQuery,
    section: CsvSection,
    folded: &Folded,
    trial: &TrialBalance,
    out: &mut W,
    totals: &mut ReportTotals,
) -> Result<(), Error> {
    match section {
        CsvSection::Transfers => {
            put(out, &csv_line(&TRANSFER_COLUMNS)).await?;
            let mut rows = std::pin::pin!(transfers_of(store, query));
            let mut text = String::new();
            while let Some(t) = rows.try_next().await? {
                push_csv_line(&mut text, &transfer_cells(&t));
                put_when_full(out, &mut text).await?;
                totals.transfers += 1;
            }
            put(out, &text).await?;
        }
        CsvSection::Summary => {
            put(out, &csv_line(&SUMMARY_COLUMNS)).await?;
            for s in folded.methods.values() {
                put(out, &csv_line(&summary_cells(s))).await?;
            }
        }
        CsvSection::Exceptions => {
            put(out, &csv_line(&EXCEPTION_COLUMNS)).await?;
            for e in period_exceptions(store, query).await? {
                put(out, &csv_line(&exception_cells(&e))).await?;
                totals.exceptions += 1;
            }
        }
        CsvSection::Balances => {
            put(out, &csv_line(&["account", "currency", "balance"])).await?;
            for line in trial.accounts.iter().chain(&trial.totals) {
                let currency = line.currency.to_string();
                put(out, &csv_line(&[&line.account, &currency, &line.balance])).await?;
            }
        }
    }
    Ok(())
}

pub(crate) async fn write_json<W: AsyncWrite + Unpin + Send>(
    store: &Store,
    query: &ReportQuery,
    folded: &Folded,
    trial: &TrialBalance,
    out: &mut W,
    totals: &mut ReportTotals,
) -> Result<(), Error> {
    let head = serde_json::json!({
        "from": query.from.to_rfc3339(),
        "to": query.to.to_rfc3339(),
        "method": query.method.map(|m| m.id()),
    });
    let summary: Vec<&MethodSummary> = folded.methods.values().collect();
    put(
        out,
        &format!(
            "{{\"period\":{head},\"summary\":{},\"transfers\":[",
            json(&summary)?
        ),
    )
    .await?;
    let mut rows = std::pin::pin!(transfers_of(store, query));
    let mut text = String::new();
    while let Some(t) = rows.try_next().await? {
        if totals.transfers > 0 {
            text.push(',');
        }
        push_json_object(&mut text, &TRANSFER_COLUMNS, &transfer_cells(&t));
        put_when_full(out, &mut text).await?;
        totals.transfers += 1;
    }
    put(out, &text).await?;
    let exceptions = period_exceptions(store, query).await?;
    totals.exceptions = exceptions.len() as u64;
    put(
        out,
        &format!(
            "],\"exceptions\":{},\"trial_balance\":{},\"trial_balance_sound\":{}}}\n",
            json(&exceptions)?,
            json(trial)?,
            trial.is_sound()
        ),
    )
    .await
}

pub(crate) async fn write_html<W: AsyncWrite + Unpin + Send>(
    store: &Store,
    query: &ReportQuery,
    folded: &Folded,
    trial: &TrialBalance,
    out: &mut W,
    totals: &mut ReportTotals,
) -> Result<(), Error> {
    let title = format!(
        "Reconciliation {} to {}{}",
        query.from.format("%Y-%m-%d %H:%M"),
        query.to.format("%Y-%m-%d %H:%M"),
        query.method.map(|m| format!(", {m}")).unwrap_or_default()
    );
    let mut page = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\n<style>{REPORT_CSS}</style></head>\n<body>\n<h1>{t}</h1>\n<p class=\"meta\">Generated {}. Times in UTC; amounts in each method's asset at its display precision, exact on hover and in the CSV and JSON forms; long ids clipped, whole on hover and in a copy.</p>\n",
        Utc::now().to_rfc3339(),
        t = escape(&title)
    );
    page.push_str("<h2>Per method</h2>\n");
    page.push_str(&html_header(&SUMMARY_COLUMNS));
    for summary in folded.methods.values() {
        let places = summary
            .method
            .parse::<Method>()
            .ok()
            .map(|m| m.asset().display_decimals());
        push_shown_row(&mut page, &summary_cells(summary), &SUMMARY_SHOWN, places);
    }
    page.push_str("</tbody></table>\n");
    page.push_str("<h2>Received per day</h2>\n");
    page.push_str(&chart(&folded.per_day));
    put(out, &page).await?;
    put(
        out,
        &format!(
            "<h2>Transfers</h2>\n{}",
            html_header(&TRANSFER_COLUMNS).replacen("<table>", "<table id=\"transfers\">", 1)
        ),
    )
    .await?;
    let mut rows = std::pin::pin!(transfers_of(store, query));
    let mut text = String::new();
    while let Some(t) = rows.try_next().await? {
        let places = match &t.asset {
            ReceivedAsset::Method { method } => Some(method.asset().display_decimals()),
            _ => None,
        };
        push_shown_row(&mut text, &transfer_cells(&t), &TRANSFER_SHOWN, places);
        put_when_full(out, &mut text).await?;
        totals.transfers += 1;
    }
    put(out, &text).await?;
    let mut page = format!(
        "</tbody></table>\n<p class=\"total\">{} transfers</p>\n<h2>Exceptions</h2>\n",
        totals.transfers
    );
    let exceptions = period_exceptions(store, query).await?;
    totals.exceptions = exceptions.len() as u64;
    page.push_str(&html_header(&EXCEPTION_COLUMNS));
    for exception in &exceptions {
        push_shown_row(
            &mut page,
            &exception_cells(exception),
            &EXCEPTION_SHOWN,
            None,
        );
    }
    page.push_str("</tbody></table>\n");
    page.push_str(&format!(
        "<h2>Trial balance</h2>\n<p class=\"{}\">{}</p>\n",
        if trial.is_sound() { "sound" } else { "broken" },
        if trial.is_sound() {
            "Every currency sums to zero."
        } else {
            "INVARIANTS BROKEN: a currency does not sum to zero."
        }
    ));
    page.push_str(&html_table(
        &["account", "currency", "balance"],
        trial.accounts.iter().chain(&trial.totals).map(|line| {
            vec![
                line.account.clone(),
                line.currency.to_string(),
                line.balance.clone(),
            ]
        }),
    ));
    page.push_str("</body></html>\n");
    put(out, &page).await
}

/// The period's transfers of the query's method (paid in it, or to an intent of it).
pub(crate) fn transfers_of(
    store: &Store,
    query: &ReportQuery,
) -> impl futures_util::Stream<Item = Result<ReportTransfer, crate::store::StoreError>> + Send + 'static
{
    let method = query.method;
    reports::transfers_in(
        store.pool().clone(),
        query.from.timestamp_millis(),
        query.to.timestamp_millis(),
    )
    .try_filter(move |t| {
        let keep = method.is_none_or(|method| {
            matches!(t.asset, ReceivedAsset::Method { method: m } if m == method)
                || t.intent_method.as_deref() == Some(method.id())
        });
        std::future::ready(keep)
    })
}

const TRANSFER_COLUMNS: [&str; 15] = [
    "seen_at",
    "network",
    "txid",
    "position",
    "to_address",
    "asset",
    "amount",
    "intent",
    "order",
    "intent_status",
    "confirmations",
    "block",
    "state",
    "ledger_entry",
    "reorged",
];

/// How the HTML report shows each transfer column.
const TRANSFER_SHOWN: [Shown; 15] = {
    use Shown::{Amount, Id, Text};
    [
        Text, Text, Id, Text, Id, Text, Amount, Id, Text, Text, Text, Text, Text, Id, Text,
    ]
};

const SUMMARY_COLUMNS: [&str; 17] = [
    "method",
    "asset",
    "intents_created",
    "intents_settled",
    "intents_expired",
    "intents_in_exception",
    "expected",
    "received",
    "booked",
    "credited",
    "held",
    "refunded",
    "own_funds",
    "dust",
    "usd_credited",
    "difference",
    "why",
];

/// How the HTML report shows each summary column.
const SUMMARY_SHOWN: [Shown; 17] = {
    use Shown::{Amount, Text};
    [
        Text, Text, Text, Text, Text, Text, Amount, Amount, Amount, Amount, Amount, Amount, Amount,
        Amount, Text, Amount, Text,
    ]
};

/// How the HTML report shows each exception column.
const EXCEPTION_SHOWN: [Shown; 8] = {
    use Shown::{Id, Text};
    [Text, Text, Id, Text, Id, Text, Text, Text]
};

const EXCEPTION_COLUMNS: [&str; 8] = [
    "opened_at",
    "kind",
    "exception",
    "order",
    "intent",
    "detail",
    "resolved_at",
    "resolution",
];

/// A transfer's cells in [`TRANSFER_COLUMNS`] order. Text the row already holds is borrowed,
/// so a million-row report allocates only for the numbers it formats.
fn transfer_cells(t: &ReportTransfer) -> [Cow<'_, str>; 15] {
    let (asset, amount) = match &t.asset {
        ReceivedAsset::Method { method } => {
            (method.asset().to_string(), method.format_amount(t.amount))
        }
        other => (other.to_string(), t.amount.base_units().to_string()),
    };
    [
        Cow::Owned(iso(t.seen_at_ms)),
        Cow::Borrowed(t.network.as_str()),
        Cow::Borrowed(t.txid.as_str()),
        Cow::Owned(t.position.to_string()),
        Cow::Borrowed(t.to_address.as_str()),
        Cow::Owned(asset),
        Cow::Owned(amount),
        optional(&t.intent_id),
        optional(&t.order_ref),
        optional(&t.intent_status),
        Cow::Owned(t.confirmations.to_string()),
        t.block_height
            .map_or(Cow::Borrowed(""), |h| Cow::Owned(h.to_string())),
        Cow::Borrowed(transfer_state(t)),
        optional(&t.credited_entry),
        Cow::Borrowed(if t.removed { "true" } else { "false" }),
    ]
}

/// An optional text cell: empty when absent.
fn optional(value: &Option<String>) -> Cow<'_, str> {
    Cow::Borrowed(value.as_deref().unwrap_or_default())
}

/// What became of a transfer, from the entry that accounted for it.
fn transfer_state(t: &ReportTransfer) -> &'static str {
    let prefix = t
        .credited_entry
        .as_deref()
        .and_then(|key| key.split(':').next());
    match (t.removed, prefix) {
        (true, _) => "reorged",
        (false, Some("settle")) => "settled",
        (false, Some("late")) => "paid_late",
        (false, Some("after-settlement")) => "paid_after_settlement",
        (false, Some("wrong-asset")) => "wrong_asset",
        (false, Some("top-up")) => "fee_top_up",
        (false, Some("unmatched")) => "unmatched",
        (false, Some("dust")) => "dust",
        (false, Some("resolve")) => "resolved_by_operator",
        (false, Some(_)) => "accounted",
        (false, None) if t.confirmations == 0 => "unconfirmed",
        (false, None) if t.intent_id.is_none() => "unmatched_unbooked",
        (false, None) => "not_booked",
    }
}

fn summary_cells(s: &MethodSummary) -> Vec<String> {
    vec![
        s.method.clone(),
        s.asset.clone(),
        s.intents_created.to_string(),
        s.intents_settled.to_string(),
        s.intents_expired.to_string(),
        s.intents_in_exception.to_string(),
        s.expected.clone(),
        s.received.clone(),
        s.booked.clone(),
        s.credited.clone(),
        s.held.clone(),
        s.refunded.clone(),
        s.own_funds.clone(),
        s.dust.clone(),
        s.usd_credited.clone(),
        s.difference.clone(),
        s.why.clone(),
    ]
}

fn exception_cells(e: &ExceptionRecord) -> Vec<String> {
    vec![
        e.opened_at.to_rfc3339(),
        e.kind.clone(),
        e.id.clone(),
        e.order_ref.clone().unwrap_or_default(),
        e.intent_id.clone().unwrap_or_default(),
        e.detail.clone(),
        e.resolved_at.map(|at| at.to_rfc3339()).unwrap_or_default(),
        e.resolution.clone().unwrap_or_default(),
    ]
}

/// A small bar chart per method of the asset received each day, as inline SVG (prints too).
fn chart(per_day: &BTreeMap<(String, Method), u128>) -> String {
    if per_day.is_empty() {
        return "<p>Nothing received in this period.</p>\n".into();
    }
    let mut by_method: BTreeMap<Method, Vec<(&str, u128)>> = BTreeMap::new();
    for ((day, method), units) in per_day {
        by_method.entry(*method).or_default().push((day, *units));
    }
    let mut html = String::from("<div class=\"charts\">\n");
    for (method, days) in by_method {
        let max = days.iter().map(|(_, u)| *u).max().unwrap_or(1).max(1);
        let bar_width = 24;
        let width = days.len() * (bar_width + 6) + 10;
        html.push_str(&format!(
            "<figure class=\"chart\"><figcaption>{} ({})</figcaption><svg role=\"img\" aria-label=\"{} received per day\" width=\"{width}\" height=\"130\">",
            method,
            method.asset(),
            method
        ));
        for (i, (day, units)) in days.iter().enumerate() {
            let height = ((*units as f64 / max as f64) * 100.0).round().max(1.0);
            let x = 5 + i * (bar_width + 6);
            let amount = method.format_amount(Amount::from_base_units(*units));
            html.push_str(&format!(
                "<rect x=\"{x}\" y=\"{}\" width=\"{bar_width}\" height=\"{height}\"><title>{day}: {amount} {}</title></rect><text x=\"{x}\" y=\"125\">{}</text>",
                105.0 - height,
                method.asset(),
                &day[5..]
            ));
        }
        html.push_str("</svg></figure>\n");
    }
    html.push_str("</div>\n");
    html
}

const REPORT_CSS: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#111}\
table{border-collapse:collapse;margin:0 0 1.5em;font-size:13px;font-variant-numeric:tabular-nums}\
th,td{border:1px solid #bbb;padding:3px 6px;text-align:left;vertical-align:top}\
th{background:#eee}td.n{text-align:right}\
td.id{max-width:7em;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}\
.meta{color:#555}.sound{color:#060}.broken{color:#b00;font-weight:bold}\
.charts{display:flex;flex-wrap:wrap;gap:1em}.chart rect{fill:#3a6ea5}.chart text{font-size:9px}\
@media print{body{margin:0;font-size:10px}h2{page-break-after:avoid}tr{page-break-inside:avoid}}";

pub(crate) fn html_table(columns: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let mut html = html_header(columns);
    for row in rows {
        html.push_str(&html_row(&row));
    }
    html.push_str("</tbody></table>\n");
    html
}

/// A table's opening and its header row; a column's words wrap, so that a narrow column is
/// not widened by its name.
fn html_header(columns: &[&str]) -> String {
    let mut html = String::from("<table><thead><tr>");
    for column in columns {
        html.push_str(&format!("<th>{}</th>", escape(&column.replace('_', " "))));
    }
    html.push_str("</tr></thead><tbody>\n");
    html
}

/// How the HTML report shows a column so that its tables fit a laptop's screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shown {
    /// As it is.
    Text,
    /// A long id clipped to its start; the whole id on hover, and in the page for a copy.
    Id,
    /// An amount of the row's asset at its display precision; the exact amount on hover.
    Amount,
}

/// Appends a row of `cells`, each shown as `shown` says, amounts at `display_decimals`.
fn push_shown_row<S: AsRef<str>>(
    out: &mut String,
    cells: &[S],
    shown: &[Shown],
    display_decimals: Option<u32>,
) {
    out.push_str("<tr>");
    for (cell, shown) in cells.iter().zip(shown) {
        let text = cell.as_ref();
        match (shown, display_decimals, Decimal::from_str(text)) {
            (Shown::Id, _, _) if !text.is_empty() => {
                out.push_str("<td class=\"id\" title=\"");
                push_escaped(out, text);
                out.push_str("\">");
                push_escaped(out, text);
            }
            (Shown::Amount, Some(places), Ok(exact)) if exact.scale() > places => {
                let shown =
                    exact.round_dp_with_strategy(places, RoundingStrategy::MidpointAwayFromZero);
                out.push_str("<td class=\"n\" title=\"");
                push_escaped(out, text);
                out.push_str(&format!("\">{shown:.places$}", places = places as usize));
            }
            (Shown::Amount, _, _) => {
                out.push_str("<td class=\"n\">");
                push_escaped(out, text);
            }
            _ => {
                out.push_str("<td>");
                push_escaped(out, text);
            }
        }
        out.push_str("</td>");
    }
    out.push_str("</tr>\n");
}

fn html_row<S: AsRef<str>>(cells: &[S]) -> String {
    let mut row = String::new();
    push_html_row(&mut row, cells);
    row
}

/// Appends a table row of `cells` to `out`, escaped.
fn push_html_row<S: AsRef<str>>(out: &mut String, cells: &[S]) {
    out.push_str("<tr>");
    for cell in cells {
        out.push_str("<td>");
        push_escaped(out, cell.as_ref());
        out.push_str("</td>");
    }
    out.push_str("</tr>\n");
}

/// Escapes text for HTML element content and attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    push_escaped(&mut escaped, text);
    escaped
}

/// Appends `text` to `out`, escaped for HTML.
fn push_escaped(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

/// One CSV line (RFC 4180 quoting). Text a spreadsheet would run as a formula is prefixed
/// with a quote; amounts (digits, one sign) are left as they are.
pub(crate) fn csv_line<S: AsRef<str>>(cells: &[S]) -> String {
    let mut line = String::new();
    push_csv_line(&mut line, cells);
    line
}

/// Appends [`csv_line`] of `cells` to `out`, without a string per cell.
fn push_csv_line<S: AsRef<str>>(out: &mut String, cells: &[S]) {
    for (index, cell) in cells.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        let cell = cell.as_ref();
        let numeric = cell
            .strip_prefix('-')
            .unwrap_or(cell)
            .chars()
            .all(|c| c.is_ascii_digit() || c == '.');
        let defuse = !numeric && cell.starts_with(['=', '+', '-', '@', '\t', '\r']);
        let quote = cell.contains([',', '"', '\n', '\r']);
        if quote {
            out.push('"');
        }
        if defuse {
            out.push('\'');
        }
        if quote {
            out.push_str(&cell.replace('"', "\"\""));
            out.push('"');
        } else {
            out.push_str(cell);
        }
    }
    out.push_str("\r\n");
}

fn json<T: Serialize + ?Sized>(value: &T) -> Result<String, Error> {
    serde_json::to_string(value).map_err(|e| Error::Report(e.to_string()))
}

async fn put<W: AsyncWrite + Unpin + Send>(out: &mut W, text: &str) -> Result<(), Error> {
    out.write_all(text.as_bytes())
        .await
        .map_err(|e| Error::Report(e.to_string()))
}

/// Rows gathered before a write: one write per row cost more than formatting the row.
const ROWS_TEXT_BYTES: usize = 64 * 1024;

/// Writes `text` once it holds [`ROWS_TEXT_BYTES`], and empties it.
async fn put_when_full<W: AsyncWrite + Unpin + Send>(
    out: &mut W,
    text: &mut String,
) -> Result<(), Error> {
    if text.len() >= ROWS_TEXT_BYTES {
        put(out, text).await?;
        text.clear();
    }
    Ok(())
}

/// Appends a JSON object of `keys` and their text `values`.
fn push_json_object<S: AsRef<str>>(out: &mut String, keys: &[&str], values: &[S]) {
    out.push('{');
    for (index, (key, value)) in keys.iter().zip(values).enumerate() {
        if index > 0 {
            out.push(',');
        }
        push_json_string(out, key);
        out.push(':');
        push_json_string(out, value.as_ref());
    }
    out.push('}');
}

/// Appends `text` as a JSON string (RFC 8259 escaping).
fn push_json_string(out: &mut String, text: &str) {
    use std::fmt::Write;
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn iso(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms)
        .map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// Milliseconds in a day: the database groups transfers by `seen_at_ms / DAY_MS`.
const DAY_MS: i64 = 86_400_000;

fn day(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms)
        .map(|at| at.format("%Y-%m-%d").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_and_defuses_formulas() {
        assert_eq!(
            csv_line(&["a", "b,c", "say \"hi\""]),
            "a,\"b,c\",\"say \"\"hi\"\"\"\r\n"
        );
        assert_eq!(
            csv_line(&["=SUM(A1)", "-0.5", "@x"]),
            "'=SUM(A1),-0.5,'@x\r\n"
        );
    }

    #[test]
    fn json_strings_parse_back() {
        for text in [
            "plain",
            "quote \" back \\ slash",
            "new\nline\ttab\r",
            "\u{1}\u{1f}",
            "ünï ✓",
        ] {
            let mut out = String::new();
            push_json_string(&mut out, text);
            assert_eq!(serde_json::from_str::<String>(&out).unwrap(), text);
        }
    }

    #[test]
    fn html_is_escaped() {
        assert_eq!(escape("<a href='x'>&"), "&lt;a href=&#39;x&#39;&gt;&amp;");
    }
}
