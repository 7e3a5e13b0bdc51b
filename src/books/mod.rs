//! Finance's books: periods that close, the fiat value of every entry, the customer-balance
//! roll-forward and the general-ledger journal the exports write.
//!
//! The accounting model (docs/ARCHITECTURE.md, "The books"): crypto received is an asset at
//! its market value when it arrived; what a customer paid for is revenue (a rental) or a
//! prepayment the shop owes until it is consumed (a top-up, a balance); the difference between
//! the locked value the customer was credited and the market value is an FX gain or loss.

mod journal;
mod period;
mod valuation;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::ledger::{Account, Currency, EntryKind};
use valuation::LegValue;

pub(crate) use journal::{BookedEntry, Chart, JournalWriter, XeroFiles, export_currency};
pub use journal::{ExportTotals, FX_GAIN_LOSS, JournalFormat, XERO_LINES_PER_FILE, entry_id};
pub use period::Period;
pub(crate) use period::parse_zone;
pub(crate) use valuation::crypto_of;
pub(crate) use valuation::value_legs;

/// Amounts in USD cents, formatted and exact.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Cents {
    /// As a decimal (`1234.56`).
    pub amount: String,
    /// In cents.
    #[serde(with = "crate::ledger::i128_as_string")]
    pub cents: i128,
}

impl From<i128> for Cents {
    fn from(cents: i128) -> Cents {
        Cents {
            amount: Currency::Usd.format(cents),
            cents,
        }
    }
}

/// What the shop owes its customers as balances, over one period, in USD.
///
/// `opening + topups_credited − consumed_by_orders − reversed − refunded +
/// operator_adjustments = closing`, and `closing` is the sum of every customer's balance at the period's end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RollForward {
    /// The period.
    pub period: Period,
    /// Owed at the start: the previous period's closing.
    pub opening: Cents,
    /// Payments credited to balances (top-ups, and money credited by policy).
    pub topups_credited: Cents,
    /// Balances spent on rental orders.
    pub consumed_by_orders: Cents,
    /// Credits taken back because their payment left the chain (a reorg).
    pub reversed: Cents,
    /// Credits taken back to refund the payment that bought them.
    #[serde(default)]
    pub refunded: Cents,
    /// Operators' corrections (accepting held money onto a balance, adjustments).
    pub operator_adjustments: Cents,
    /// Owed at the end.
    pub closing: Cents,
    /// The sum of every customer's balance at the end, counted separately.
    pub customer_balances: Cents,
    /// Customers with a balance at the end.
    pub customers: u64,
    /// Whether `closing` equals `customer_balances` exactly.
    pub closes: bool,
}

impl RollForward {
    /// The roll-forward from the customer legs before the period (`opening_sum`), in it by
    /// entry kind, and each customer's sum at its end (all signed: credits negative).
    pub(crate) fn from_sums(
        period: Period,
        opening_sum: i128,
        by_kind: &[(String, i128)],
        balances_at_end: &[(String, i128)],
    ) -> RollForward {
        let owed = |kind: EntryKind| -> i128 {
            by_kind
                .iter()
                .filter(|(k, _)| k == kind.as_str())
                .map(|(_, sum)| -sum)
                .sum()
        };
        let opening = -opening_sum;
        let topups = owed(EntryKind::Payment);
        let consumed = -owed(EntryKind::BalancePayment);
        let reversed = -owed(EntryKind::Reversal);
        let refunded = -owed(EntryKind::Refund);
        let adjustments = owed(EntryKind::Adjustment);
        let closing = opening + topups - consumed - reversed - refunded + adjustments;
        let customer_balances: i128 = balances_at_end.iter().map(|(_, sum)| -sum).sum();
        RollForward {
            period,
            opening: opening.into(),
            topups_credited: topups.into(),
            consumed_by_orders: consumed.into(),
            reversed: reversed.into(),
            refunded: refunded.into(),
            operator_adjustments: adjustments.into(),
            closing: closing.into(),
            customer_balances: customer_balances.into(),
            customers: balances_at_end.iter().filter(|(_, sum)| *sum != 0).count() as u64,
            closes: closing == customer_balances,
        }
    }
}

/// One method's receipts of a period at fiat value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReceiptValue {
    /// The method.
    pub method: String,
    /// Entries that took its crypto into custody.
    pub entries: u64,
    /// Market value at receipt of the crypto taken into custody, net of reversals.
    pub market_usd: Cents,
    /// FX result of its conversions: market value minus the locked value credited (a gain is
    /// positive).
    pub fx_gain_usd: Cents,
    /// The same two in the reporting currency, when there is one.
    pub market_reporting: Option<Cents>,
    /// FX result in the reporting currency.
    pub fx_gain_reporting: Option<Cents>,
}

/// One method's refunds completed in a period, at fiat value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RefundValue {
    /// The method.
    pub method: String,
    /// Refunds completed (booked) in the period, net of reversals.
    pub refunds: u64,
    /// What left suspense, in base units.
    #[serde(with = "crate::ledger::i128_as_string")]
    pub amount_base_units: i128,
    /// Its value at the rates it was held at, in USD.
    pub held_usd: Cents,
    /// The exchange difference: its value held less its value sent (a gain is positive).
    pub fx_gain_usd: Cents,
    /// The same two in the reporting currency, when there is one.
    pub held_reporting: Option<Cents>,
    /// The exchange difference in the reporting currency.
    pub fx_gain_reporting: Option<Cents>,
}

/// One general-ledger account's movement in a period, in the export currency.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GlMovement {
    /// The GL account code.
    pub code: String,
    /// Its name.
    pub name: String,
    /// Debits.
    pub debits: Cents,
    /// Credits (positive).
    pub credits: Cents,
}

/// One method's receipts on one day, for finance's chart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DailyReceipts {
    /// The day, in the books' time zone.
    pub day: String,
    /// The method.
    pub method: String,
    /// Market value at receipt of what came into custody that day, in USD.
    pub market_usd: Cents,
}

/// The figures of a period: stored when it closes, so a closed period's report is the same
/// bytes however often it is asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PeriodReport {
    /// The period.
    pub period: Period,
    /// Its time zone.
    pub timezone: String,
    /// Its first instant.
    pub from: String,
    /// The instant after its last.
    pub to: String,
    /// The export currency (the reporting currency, or USD).
    pub currency: String,
    /// Entries booked in it.
    pub entries: u64,
    /// SHA-256 over every entry booked in it, its booking time and its valuation, in order.
    pub entries_sha256: String,
    /// Receipts at fiat value, per method.
    pub receipts: Vec<ReceiptValue>,
    /// Refunds completed, per method, with their exchange difference. Empty in the reports of
    /// periods closed before it existed.
    #[serde(default)]
    pub refunds: Vec<RefundValue>,
    /// Each GL account's movement, in the export currency; debits equal credits.
    pub accounts: Vec<GlMovement>,
    /// Receipts per day and method.
    pub daily: Vec<DailyReceipts>,
    /// Files the Xero export of the period takes.
    pub xero_files: u32,
    /// The customer-balance roll-forward.
    pub rollforward: RollForward,
    /// The holdings roll-forward per network and asset, in base units (fair values are in
    /// `payrecon report holdings`). Empty in the reports of periods closed before it existed.
    #[serde(default)]
    pub holdings: Vec<crate::records::AssetRollForward>,
    /// The books settings it was cut with: a closed period exports with these.
    pub books: crate::config::BooksConfig,
}

/// Folds a period's valued entries into its report figures and hash.
pub(crate) struct PeriodFold {
    zone: chrono_tz::Tz,
    hasher: sha2::Sha256,
    entries: u64,
    receipts: BTreeMap<String, (u64, i128, i128, i128, i128)>,
    refunds: BTreeMap<String, RefundFold>,
    accounts: BTreeMap<(String, String), (i128, i128)>,
    daily: BTreeMap<(String, String), i128>,
    xero: XeroFiles,
}

/// One method's refunds as a [`PeriodFold`] adds them up (fiat in cents, signed sums).
#[derive(Default)]
struct RefundFold {
    refunds: i64,
    base_units: i128,
    held_usd: i128,
    fx_usd: i128,
    held_reporting: i128,
    fx_reporting: i128,
}

/// What a [`PeriodFold`] found.
pub(crate) struct Folded {
    pub(crate) entries: u64,
    pub(crate) entries_sha256: String,
    pub(crate) receipts: Vec<ReceiptValue>,
    pub(crate) refunds: Vec<RefundValue>,
    pub(crate) accounts: Vec<GlMovement>,
    pub(crate) daily: Vec<DailyReceipts>,
    pub(crate) xero_files: u32,
}

impl PeriodFold {
    pub(crate) fn new(zone: chrono_tz::Tz) -> PeriodFold {
        PeriodFold {
            zone,
            hasher: <sha2::Sha256 as sha2::Digest>::new(),
            entries: 0,
            receipts: BTreeMap::new(),
            refunds: BTreeMap::new(),
            accounts: BTreeMap::new(),
            daily: BTreeMap::new(),
            xero: XeroFiles::new(),
        }
    }

    /// Adds one entry: its hash input, its receipts and its GL lines.
    pub(crate) fn add(
        &mut self,
        booked: &BookedEntry,
        chart: &Chart,
        in_reporting: bool,
    ) -> Result<(), crate::error::Error> {
        use sha2::Digest;
        let valuation = serde_json::to_string(&booked.valuation)
            .map_err(|e| crate::error::Error::Books(e.to_string()))?;
        self.hasher.update(format!(
            "{}|{}|{}|{}|{}\n",
            booked.seq,
            booked.entry.idempotency_key,
            booked.entry.content_hash(),
            booked.booked_at.timestamp_millis(),
            valuation
        ));
        self.entries += 1;
        let values = value_legs(&booked.entry, &booked.valuation)?;
        // What an entry is, a Storno included, shows in its key (`reverse:<original's>`).
        let key = &booked.entry.idempotency_key;
        let original = key.strip_prefix("reverse:").unwrap_or(key);
        if original.starts_with("refund:") {
            self.add_refund(booked, &values);
        } else if !(original.starts_with("outflow:") || original.starts_with("top-up:")) {
            // Coins leaving custody, or the merchant's own coming in, are no receipts.
            self.add_receipts(booked, &values);
        }
        let lines = journal::gl_lines(booked, &values, chart, in_reporting)?;
        self.xero.place(lines.len());
        for line in lines {
            let sums = self
                .accounts
                .entry((line.account.code.clone(), line.account.name.clone()))
                .or_default();
            if line.amount > 0 {
                sums.0 += line.amount;
            } else {
                sums.1 -= line.amount;
            }
        }
        Ok(())
    }

    /// A refund's (or its Storno's) amount and value out of suspense and its `fx:` result.
    fn add_refund(&mut self, booked: &BookedEntry, values: &[LegValue]) {
        let Some(method) = crate::books::crypto_of(&booked.entry).ok().flatten() else {
            return;
        };
        let row = self.refunds.entry(method.id().to_owned()).or_default();
        for (posting, value) in booked.entry.postings.iter().zip(values) {
            let reporting = value.reporting_cents.unwrap_or(0);
            match posting.account {
                Account::Suspense(_) => {
                    row.base_units += posting.amount_minor;
                    row.held_usd += value.usd_cents;
                    row.held_reporting += reporting;
                }
                Account::Fx(_) => {
                    row.fx_usd -= value.usd_cents;
                    row.fx_reporting -= reporting;
                }
                _ => {}
            }
        }
        row.refunds += if booked.entry.kind == EntryKind::Reversal {
            -1
        } else {
            1
        };
    }

    /// A payment's (or hold's, or Storno's) crypto into custody at value, and its conversion.
    fn add_receipts(&mut self, booked: &BookedEntry, values: &[LegValue]) {
        for (posting, value) in booked.entry.postings.iter().zip(values) {
            let (method, is_fx) = match posting.account {
                Account::Custody(method) => (method, false),
                Account::Fx(method) => (method, true),
                _ => continue,
            };
            let row = self.receipts.entry(method.id().to_owned()).or_default();
            let reporting = value.reporting_cents.unwrap_or(0);
            if is_fx {
                row.2 -= value.usd_cents;
                row.4 -= reporting;
            } else {
                row.0 += 1;
                row.1 += value.usd_cents;
                row.3 += reporting;
                let day = booked.booked_at.with_timezone(&self.zone).date_naive();
                *self
                    .daily
                    .entry((day.to_string(), method.id().to_owned()))
                    .or_default() += value.usd_cents;
            }
        }
    }

    /// The figures, and the hash of everything added.
    pub(crate) fn finish(self, in_reporting: bool) -> Folded {
        use sha2::Digest;
        let receipts = self
            .receipts
            .into_iter()
            .map(
                |(method, (entries, market, fx, market_rep, fx_rep))| ReceiptValue {
                    method,
                    entries,
                    market_usd: market.into(),
                    fx_gain_usd: fx.into(),
                    market_reporting: in_reporting.then(|| market_rep.into()),
                    fx_gain_reporting: in_reporting.then(|| fx_rep.into()),
                },
            )
            .collect();
        let refunds = self
            .refunds
            .into_iter()
            .filter(|(_, r)| r.refunds != 0 || r.base_units != 0)
            .map(|(method, r)| RefundValue {
                method,
                refunds: u64::try_from(r.refunds).unwrap_or(0),
                amount_base_units: r.base_units,
                held_usd: r.held_usd.into(),
                fx_gain_usd: r.fx_usd.into(),
                held_reporting: in_reporting.then(|| r.held_reporting.into()),
                fx_gain_reporting: in_reporting.then(|| r.fx_reporting.into()),
            })
            .collect();
        let accounts = self
            .accounts
            .into_iter()
            .map(|((code, name), (debits, credits))| GlMovement {
                code,
                name,
                debits: debits.into(),
                credits: credits.into(),
            })
            .collect();
        Folded {
            entries: self.entries,
            entries_sha256: hex::encode(self.hasher.finalize()),
            receipts,
            refunds,
            accounts,
            daily: self
                .daily
                .into_iter()
                .map(|((day, method), cents)| DailyReceipts {
                    day,
                    method,
                    market_usd: cents.into(),
                })
                .collect(),
            xero_files: self.xero.files(),
        }
    }
}

/// Where a period stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PeriodStatus {
    /// The period.
    pub period: Period,
    /// `open` or `closed`.
    pub state: String,
    /// Its closes and reopens, oldest first.
    pub log: Vec<PeriodLogLine>,
}

/// One close or reopen of a period.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PeriodLogLine {
    /// `close` or `reopen`.
    pub action: String,
    /// Who.
    pub actor: String,
    /// Why (a reopen always says).
    pub reason: String,
    /// When.
    pub at: String,
    /// Entries in the period at a close.
    pub entries: Option<i64>,
    /// Their hash at a close.
    pub entries_sha256: Option<String>,
}

/// An entry that has no fiat value yet: finance sees it, the next valuation pass retries it,
/// and no period holding it can close.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnvaluedEntry {
    /// Journal position.
    pub seq: i64,
    /// The entry's key.
    pub key: String,
    /// The export's id for it.
    pub entry_id: String,
    /// When it was posted.
    pub posted_at: String,
    /// The order or top-up it belongs to.
    pub reference: Option<String>,
    /// Its memo.
    pub memo: String,
}

/// What one valuation pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ValuationPass {
    /// Entries valued now.
    pub valued: u64,
    /// Entries left unvalued, and why (the first few).
    pub failed: u64,
    /// The first reasons.
    pub errors: Vec<String>,
}
