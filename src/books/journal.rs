//! The general-ledger journal finance imports: the chart-of-accounts mapping, an entry's GL
//! lines, and the four file formats (generic CSV, DATEV EXTF, Xero, QuickBooks Online).
//!
//! Formats, as their vendors publish them (cited in docs/ARCHITECTURE.md, "For finance"):
//! - DATEV "Buchungsstapel" (EXTF, format version 700, category 21, version 13);
//! - Xero "Import manual journals" CSV template;
//! - QuickBooks Online "Import journal entries" spreadsheet.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::books::period::Period;
use crate::books::valuation::{LegValue, value_legs};
use crate::config::{BooksConfig, GlAccount};
use crate::error::Error;
use crate::ledger::{Account, Currency, EntryKind, NewEntry};
use crate::records::Valuation;

/// Lines of one Xero import file: Xero refuses larger files.
pub const XERO_LINES_PER_FILE: usize = 300;

/// The chart key every `fx:<method>` account maps through: in fiat, the conversion accounts
/// hold exactly the difference between locked and market value.
pub const FX_GAIN_LOSS: &str = "fx:gain_loss";

/// An export's file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JournalFormat {
    /// Every ledger leg with its native amount, USD and reporting values.
    Generic,
    /// DATEV EXTF Buchungsstapel.
    Datev,
    /// Xero manual journals, at most 300 lines per file.
    Xero,
    /// QuickBooks Online journal entries.
    Qbo,
}

impl JournalFormat {
    /// Every format's name, as the CLI and the API take it.
    pub const NAMES: [&'static str; 4] = ["generic", "datev", "xero", "qbo"];

    /// The file name of part `part` of `period`'s export.
    pub fn file_name(self, period: Period, part: u32) -> String {
        match self {
            JournalFormat::Generic => format!("journal-{period}.csv"),
            JournalFormat::Datev => format!("EXTF_Buchungsstapel_{period}.csv"),
            JournalFormat::Xero => format!("journal-{period}-xero-{part}.csv"),
            JournalFormat::Qbo => format!("journal-{period}-qbo.csv"),
        }
    }
}

impl std::str::FromStr for JournalFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<JournalFormat, Error> {
        use JournalFormat::*;
        JournalFormat::NAMES
            .iter()
            .position(|name| *name == s)
            .map(|i| [Generic, Datev, Xero, Qbo][i])
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "format must be one of {}, got {s:?}",
                    JournalFormat::NAMES.join(", ")
                ))
            })
    }
}

/// Ledger accounts to general-ledger accounts: exact names first, then the longest
/// `prefix*` pattern.
#[derive(Debug)]
pub(crate) struct Chart {
    accounts: BTreeMap<String, GlAccount>,
    mapped: Mutex<HashMap<Account, Arc<GlAccount>>>,
}

impl Chart {
    pub(crate) fn new(accounts: BTreeMap<String, GlAccount>) -> Chart {
        Chart {
            accounts,
            mapped: Mutex::new(HashMap::new()),
        }
    }

    /// The GL account a ledger account posts to; each account's is looked up once.
    pub(crate) fn map(&self, account: &Account) -> Result<Arc<GlAccount>, Error> {
        if let Some(gl) = self.mapped.lock().expect("chart lock").get(account) {
            return Ok(gl.clone());
        }
        let name = match account {
            Account::Fx(_) => FX_GAIN_LOSS.to_owned(),
            other => other.to_string(),
        };
        let gl = match self.accounts.get(&name) {
            Some(gl) => gl,
            None => self
                .accounts
                .iter()
                .filter_map(|(pattern, gl)| {
                    let prefix = pattern.strip_suffix('*')?;
                    name.starts_with(prefix).then_some((prefix.len(), gl))
                })
                .max_by_key(|(len, _)| *len)
                .map(|(_, gl)| gl)
                .ok_or_else(|| {
                    Error::Books(format!(
                        "books.accounts maps no GL account for ledger account {name}"
                    ))
                })?,
        };
        let gl = Arc::new(gl.clone());
        let mut mapped = self.mapped.lock().expect("chart lock");
        // Customers' accounts are many; the cache holds the rest and a bounded few of them.
        if mapped.len() < MAX_MAPPED_ACCOUNTS {
            mapped.insert(account.clone(), gl.clone());
        }
        Ok(gl)
    }
}

/// Ledger accounts whose GL account a chart remembers.
const MAX_MAPPED_ACCOUNTS: usize = 10_000;

/// An entry as the exports read it: booked in the period, valued.
#[derive(Clone, Debug)]
pub(crate) struct BookedEntry {
    pub(crate) seq: i64,
    pub(crate) booked_at: DateTime<Utc>,
    pub(crate) entry: NewEntry,
    pub(crate) valuation: Valuation,
}

/// The id every export gives an entry: stable across exports and databases (it hashes the
/// entry's idempotency key), short enough for QuickBooks' 21-character journal number.
pub fn entry_id(idempotency_key: &str) -> String {
    let digest = Sha256::digest(idempotency_key.as_bytes());
    format!("PR-{}", &hex::encode(digest)[..12])
}

/// One general-ledger line of an entry, in the export currency (minor units, debit positive).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GlLine {
    pub(crate) account: Arc<GlAccount>,
    pub(crate) amount: i128,
    pub(crate) usd_cents: i128,
    /// The customer the line belongs to, for QuickBooks' Name column.
    pub(crate) customer: Option<String>,
}

/// The export currency: the reporting currency when configured, USD otherwise.
pub(crate) fn export_currency(books: &BooksConfig) -> String {
    books
        .reporting_currency
        .clone()
        .unwrap_or_else(|| "USD".to_owned())
}

/// An entry's legs grouped by GL account (and customer), zero lines dropped, in order of
/// first appearance. The lines sum to zero in the export currency and in USD.
pub(crate) fn gl_lines(
    booked: &BookedEntry,
    values: &[LegValue],
    chart: &Chart,
    in_reporting: bool,
) -> Result<Vec<GlLine>, Error> {
    let mut lines: Vec<GlLine> = Vec::new();
    for (posting, value) in booked.entry.postings.iter().zip(values) {
        let account = chart.map(&posting.account)?;
        let customer = posting.account.customer().map(ToString::to_string);
        let amount = if in_reporting {
            value.reporting_cents.ok_or_else(|| {
                Error::Books(format!(
                    "entry {} has no reporting-currency rate",
                    booked.entry.idempotency_key
                ))
            })?
        } else {
            value.usd_cents
        };
        match lines
            .iter_mut()
            .find(|l| l.account == account && l.customer == customer)
        {
            Some(line) => {
                line.amount += amount;
                line.usd_cents += value.usd_cents;
            }
            None => lines.push(GlLine {
                account,
                amount,
                usd_cents: value.usd_cents,
                customer,
            }),
        }
    }
    lines.retain(|l| l.amount != 0 || l.usd_cents != 0);
    debug_assert_eq!(lines.iter().map(|l| l.amount).sum::<i128>(), 0);
    Ok(lines)
}

/// What an export wrote, for the caller and the close.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ExportTotals {
    /// Entries written.
    pub entries: u64,
    /// Lines written (not counting headers).
    pub lines: u64,
    /// Files: more than one only for Xero.
    pub parts: u32,
    /// Sum of the debit lines, in the export currency's minor units.
    pub debits_minor: i128,
    /// Sum of the credit lines (positive).
    pub credits_minor: i128,
    /// The export currency.
    pub currency: String,
}

/// How Xero's lines fall into files of at most [`XERO_LINES_PER_FILE`]: an entry's lines
/// stay together, so each journal balances within its file.
#[derive(Clone, Copy, Debug)]
pub(crate) struct XeroFiles {
    files: u32,
    lines_in_file: usize,
}

impl XeroFiles {
    pub(crate) fn new() -> XeroFiles {
        XeroFiles {
            files: 1,
            lines_in_file: 0,
        }
    }

    /// Places an entry of `lines` lines; `Some(file)` when it starts a new file.
    pub(crate) fn place(&mut self, lines: usize) -> Option<u32> {
        let mut new_file = None;
        if self.lines_in_file > 0 && self.lines_in_file + lines > XERO_LINES_PER_FILE {
            self.files += 1;
            self.lines_in_file = 0;
            new_file = Some(self.files);
        }
        self.lines_in_file += lines;
        new_file
    }

    /// Files so far.
    pub(crate) fn files(&self) -> u32 {
        self.files
    }
}

/// Formats amounts and dates for one file format and writes one entry at a time.
pub(crate) struct JournalWriter<'a> {
    pub(crate) format: JournalFormat,
    pub(crate) books: &'a BooksConfig,
    pub(crate) chart: &'a Chart,
    pub(crate) zone: Tz,
    pub(crate) period: Period,
    /// Stamped into DATEV's header: the close's time for a closed period, so its export is
    /// the same bytes every time.
    pub(crate) created: DateTime<Utc>,
    /// Whether the period is closed (DATEV's Festschreibung).
    pub(crate) closed: bool,
    pub(crate) totals: ExportTotals,
    xero_files: XeroFiles,
}

impl<'a> JournalWriter<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        format: JournalFormat,
        books: &'a BooksConfig,
        chart: &'a Chart,
        zone: Tz,
        period: Period,
        created: DateTime<Utc>,
        closed: bool,
    ) -> Result<JournalWriter<'a>, Error> {
        if format == JournalFormat::Datev && books.reporting_currency.as_deref() != Some("EUR") {
            return Err(Error::Books(
                "the DATEV export books in EUR: set books.reporting_currency = \"EUR\"".into(),
            ));
        }
        Ok(JournalWriter {
            format,
            books,
            chart,
            zone,
            period,
            created,
            closed,
            totals: ExportTotals {
                parts: 1,
                currency: export_currency(books),
                ..ExportTotals::default()
            },
            xero_files: XeroFiles::new(),
        })
    }

    /// The bytes a file of this format starts with.
    pub(crate) fn header(&self) -> Vec<u8> {
        match self.format {
            JournalFormat::Generic => csv_record(
                b',',
                &[
                    "entry_id",
                    "seq",
                    "date",
                    "kind",
                    "account",
                    "gl_account",
                    "debit",
                    "credit",
                    "currency",
                    "amount_base_units",
                    "usd",
                    "reporting_currency",
                    "reporting",
                    "txid",
                    "reference",
                    "memo",
                    "valuation",
                ],
            ),
            JournalFormat::Datev => self.datev_header(),
            JournalFormat::Xero => csv_record(
                b',',
                &[
                    "*Narration",
                    "*Date",
                    "Description",
                    "*AccountCode",
                    "*TaxRate",
                    "*Amount",
                ],
            ),
            JournalFormat::Qbo => csv_record(
                b',',
                &[
                    "Journal No.",
                    "Journal Date",
                    "Account Name",
                    "Description",
                    "Debits",
                    "Credits",
                    "Name",
                ],
            ),
        }
    }

    /// The rows of one entry. For Xero, `Some(part)` when the entry starts a new file.
    pub(crate) fn entry(&mut self, booked: &BookedEntry) -> Result<(Option<u32>, Vec<u8>), Error> {
        let values = value_legs(&booked.entry, &booked.valuation)?;
        let in_reporting = self.books.reporting_currency.is_some();
        let lines = gl_lines(booked, &values, self.chart, in_reporting)?;
        self.totals.entries += 1;
        for line in &lines {
            if line.amount > 0 {
                self.totals.debits_minor += line.amount;
            } else {
                self.totals.credits_minor -= line.amount;
            }
        }
        let said = Said {
            id: entry_id(&booked.entry.idempotency_key),
            date: booked.booked_at.with_timezone(&self.zone).date_naive(),
            memo: memo_of(&booked.entry),
            booked,
        };
        let mut new_part = None;
        let rows = match self.format {
            JournalFormat::Generic => self.generic_rows(&said, &values)?,
            JournalFormat::Datev => self.datev_rows(&said, &lines),
            JournalFormat::Xero => {
                new_part = self.xero_files.place(lines.len());
                self.totals.parts = self.xero_files.files();
                self.xero_rows(&said, &lines)
            }
            JournalFormat::Qbo => self.qbo_rows(&said, &lines),
        };
        self.totals.lines += rows.len() as u64;
        Ok((new_part, rows.concat()))
    }

    /// One row per ledger leg, in its own currency with its values.
    fn generic_rows(&self, said: &Said<'_>, values: &[LegValue]) -> Result<Vec<Vec<u8>>, Error> {
        let booked = said.booked;
        let mut rows = Vec::with_capacity(values.len());
        for (posting, value) in booked.entry.postings.iter().zip(values) {
            let gl = self.chart.map(&posting.account)?;
            let (debit, credit) = split(posting.amount_minor, |m| posting.currency.format(m));
            let reporting = value
                .reporting_cents
                .map(|c| Currency::Usd.format(c))
                .unwrap_or_default();
            rows.push(csv_record(
                b',',
                &[
                    &said.id,
                    &booked.seq.to_string(),
                    &said.date.to_string(),
                    booked.entry.kind.as_str(),
                    &posting.account.to_string(),
                    &gl.code,
                    &debit,
                    &credit,
                    &posting.currency.to_string(),
                    &posting.amount_minor.to_string(),
                    &Currency::Usd.format(value.usd_cents),
                    self.books.reporting_currency.as_deref().unwrap_or(""),
                    &reporting,
                    &booked.valuation.txids,
                    booked.entry.reference.as_deref().unwrap_or(""),
                    &said.memo,
                    &booked.valuation.basis,
                ],
            ));
        }
        Ok(rows)
    }

    /// One row per GL line: Xero groups a journal by narration and date.
    fn xero_rows(&self, said: &Said<'_>, lines: &[GlLine]) -> Vec<Vec<u8>> {
        let narration = format!("{} {}", said.id, said.memo);
        let entry = &said.booked.entry;
        let description = entry
            .reference
            .as_deref()
            .unwrap_or(&said.booked.valuation.txids);
        lines
            .iter()
            .map(|line| {
                csv_record(
                    b',',
                    &[
                        &narration,
                        &said
                            .date
                            .format(self.books.xero_date_order.format())
                            .to_string(),
                        description,
                        &line.account.code,
                        &self.books.xero_tax_rate,
                        &Currency::Usd.format(line.amount),
                    ],
                )
            })
            .collect()
    }

    /// One row per GL line: QuickBooks groups a journal entry by its number.
    fn qbo_rows(&self, said: &Said<'_>, lines: &[GlLine]) -> Vec<Vec<u8>> {
        lines
            .iter()
            .map(|line| {
                let (debit, credit) = split(line.amount, |m| Currency::Usd.format(m));
                csv_record(
                    b',',
                    &[
                        &said.id,
                        &said
                            .date
                            .format(self.books.qbo_date_order.format())
                            .to_string(),
                        &line.account.name,
                        &said.memo,
                        &debit,
                        &credit,
                        line.customer.as_deref().unwrap_or(""),
                    ],
                )
            })
            .collect()
    }

    /// DATEV's header record: 31 fields, text in quotes, numbers bare.
    fn datev_header(&self) -> Vec<u8> {
        let datev = &self.books.datev;
        let created = self.created.with_timezone(&self.zone);
        let fiscal_start = fiscal_year_start(self.period, datev.fiscal_year_start_month);
        let quoted = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
        let fields: Vec<String> = vec![
            quoted("EXTF"),
            "700".into(),
            "21".into(),
            quoted("Buchungsstapel"),
            "13".into(),
            created.format("%Y%m%d%H%M%S%3f").to_string(),
            String::new(),
            quoted("RE"),
            quoted("payrecon"),
            quoted(""),
            datev.consultant_number.to_string(),
            datev.client_number.to_string(),
            fiscal_start.format("%Y%m%d").to_string(),
            datev.account_length.to_string(),
            self.period.first_day().format("%Y%m%d").to_string(),
            self.period.last_day().format("%Y%m%d").to_string(),
            quoted(&format!("payrecon {}", self.period)),
            quoted(""),
            "1".into(),
            "0".into(),
            if self.closed { "1" } else { "0" }.into(),
            quoted("EUR"),
            String::new(),
            quoted(""),
            String::new(),
            String::new(),
            quoted(""),
            String::new(),
            String::new(),
            quoted(""),
            quoted(""),
        ];
        let mut out = windows_1252(&fields.join(";"));
        out.extend_from_slice(b"\r\n");
        out.extend(csv_record(
            b';',
            &[
                "Umsatz (ohne Soll/Haben-Kz)",
                "Soll/Haben-Kennzeichen",
                "WKZ Umsatz",
                "Kurs",
                "Basis-Umsatz",
                "WKZ Basis-Umsatz",
                "Konto",
                "Gegenkonto (ohne BU-Schlüssel)",
                "BU-Schlüssel",
                "Belegdatum",
                "Belegfeld 1",
                "Belegfeld 2",
                "Skonto",
                "Buchungstext",
            ],
        ));
        out
    }

    /// One DATEV record per GL line but the largest, booked against the largest: DATEV
    /// records have one account and one contra account, and this split needs no rounding.
    /// Text fields are quoted, numbers bare, each as DATEV's field expressions say.
    fn datev_rows(&self, said: &Said<'_>, lines: &[GlLine]) -> Vec<Vec<u8>> {
        let Some(hub) = (0..lines.len()).max_by_key(|&i| lines[i].amount.unsigned_abs()) else {
            return Vec::new();
        };
        let rate = said
            .booked
            .valuation
            .reporting
            .as_ref()
            .map(|r| format!("{:.6}", r.usd_per_unit).replace('.', ","))
            .unwrap_or_default();
        let text = datev_text(&said.booked.entry);
        // A Storno names the booking it undoes: Belegfeld 2 holds at most 12 characters, the
        // reversed id without its `PR-`.
        let reversed = reversed_id(&said.booked.entry)
            .map(|id| id.trim_start_matches("PR-").to_owned())
            .unwrap_or_default();
        let day = said.date.format("%d%m").to_string();
        lines
            .iter()
            .enumerate()
            .filter(|(i, line)| *i != hub && line.amount != 0)
            .map(|(_, line)| {
                // The hub account is debited when this line is a credit.
                let side = if line.amount < 0 { "S" } else { "H" };
                let fields = [
                    comma(line.usd_cents.abs()),
                    datev_quoted(side),
                    datev_quoted("USD"),
                    rate.clone(),
                    comma(line.amount.abs()),
                    datev_quoted("EUR"),
                    lines[hub].account.code.clone(),
                    line.account.code.clone(),
                    String::new(),
                    day.clone(),
                    datev_quoted(&said.id),
                    datev_quoted(&reversed),
                    String::new(),
                    datev_quoted(&text),
                ];
                let mut record = windows_1252(&fields.join(";"));
                record.extend_from_slice(b"\r\n");
                record
            })
            .collect()
    }
}

/// A DATEV text field: in quotes, a quote inside doubled.
fn datev_quoted(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "\"\""))
}

/// DATEV's Buchungstext, at most 60 characters, the essentials first: a Storno and the booking
/// it undoes, what happened, the order or top-up, and the largest crypto amount at the asset's
/// display precision. A part that does not fit whole is left out, never cut.
fn datev_text(entry: &NewEntry) -> String {
    let what = match entry.kind {
        EntryKind::Payment => "payment",
        EntryKind::BalancePayment => "paid from balance",
        EntryKind::Reversal => "storno",
        EntryKind::Adjustment => "adjustment",
        EntryKind::Outflow => "sent out",
        EntryKind::InternalTransfer => "own transfer",
        EntryKind::Refund => "refund",
    };
    let mut parts = vec![match reversed_id(entry) {
        Some(original) => format!("{what} {original}"),
        None => what.to_owned(),
    }];
    parts.extend(entry.reference.clone());
    parts.extend(largest_crypto(entry));
    let mut text = String::new();
    for part in parts {
        let separator = usize::from(!text.is_empty());
        if text.chars().count() + separator + part.chars().count() > DATEV_TEXT_LEN {
            continue;
        }
        if separator == 1 {
            text.push(' ');
        }
        text.push_str(&part);
    }
    text
}

/// Buchungstext's length in DATEV's format description.
const DATEV_TEXT_LEN: usize = 60;

/// The id of the entry a reversal undoes.
fn reversed_id(entry: &NewEntry) -> Option<String> {
    entry.idempotency_key.strip_prefix("reverse:").map(entry_id)
}

/// The entry's largest crypto leg as people read it: `0.00625 BTC`, at most 8 decimals.
fn largest_crypto(entry: &NewEntry) -> Option<String> {
    let (method, amount) = entry
        .postings
        .iter()
        .filter_map(|posting| match posting.currency {
            Currency::Crypto(method) => Some((method, posting.amount_minor.unsigned_abs())),
            Currency::Usd => None,
        })
        .max_by_key(|(_, amount)| *amount)?;
    let decimals = u32::from(method.decimals());
    let value =
        rust_decimal::Decimal::try_from_i128_with_scale(i128::try_from(amount).ok()?, decimals)
            .ok()?
            .round_dp_with_strategy(
                method.asset().display_decimals(),
                rust_decimal::RoundingStrategy::MidpointAwayFromZero,
            )
            .normalize();
    Some(format!("{value} {}", method.asset()))
}

/// What every format says about one entry besides its amounts.
struct Said<'a> {
    id: String,
    date: chrono::NaiveDate,
    memo: String,
    booked: &'a BookedEntry,
}

/// Debit and credit columns of a signed amount.
fn split(amount: i128, format: impl Fn(i128) -> String) -> (String, String) {
    if amount >= 0 {
        (format(amount), String::new())
    } else {
        (String::new(), format(-amount))
    }
}

/// Cents as DATEV writes them: a decimal comma, no thousands separator.
fn comma(cents: i128) -> String {
    Currency::Usd.format(cents).replace('.', ",")
}

/// What the exports say about an entry: its memo, and for a reversal the entry it reverses.
fn memo_of(entry: &NewEntry) -> String {
    match entry.idempotency_key.strip_prefix("reverse:") {
        Some(original) => format!("{} (reverses {})", entry.memo, entry_id(original)),
        None => entry.memo.clone(),
    }
}

/// The first day of the fiscal year `period` lies in.
fn fiscal_year_start(period: Period, start_month: u8) -> chrono::NaiveDate {
    let month = u32::from(start_month.clamp(1, 12));
    let first = period.first_day();
    let year = if chrono::Datelike::month(&first) >= month {
        period.year()
    } else {
        period.year() - 1
    };
    chrono::NaiveDate::from_ymd_opt(year, month, 1).expect("a valid month")
}

/// One CSV record (CRLF-terminated, quoted where needed) by the `csv` crate, in UTF-8, or in
/// Windows-1252 for DATEV's `;` files.
fn csv_record(delimiter: u8, cells: &[&str]) -> Vec<u8> {
    let mut writer = csv::WriterBuilder::new()
        .delimiter(delimiter)
        .terminator(csv::Terminator::CRLF)
        // A record is a few hundred bytes: the default 8 KiB buffer, per record, was most of
        // an export's allocations.
        .buffer_capacity(512)
        .from_writer(Vec::with_capacity(256));
    writer.write_record(cells).expect("writing to memory");
    let bytes = writer.into_inner().expect("writing to memory");
    if delimiter == b';' && !bytes.is_ascii() {
        windows_1252(&String::from_utf8(bytes).expect("cells are UTF-8"))
    } else {
        bytes
    }
}

/// Text in Windows-1252, DATEV's classic encoding; a character it lacks becomes `?`.
fn windows_1252(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut buffer = [0u8; 4];
    for c in text.chars() {
        let (bytes, _, unmappable) = encoding_rs::WINDOWS_1252.encode(c.encode_utf8(&mut buffer));
        if unmappable {
            out.push(b'?');
        } else {
            out.extend_from_slice(&bytes);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_map_and_the_most_specific_wins() {
        let chart = Chart::new(BooksConfig::default().accounts);
        let code = |a: Account| chart.map(&a).unwrap().code.clone();
        use crate::ledger::SuspenseReason;
        use payrecon_chain_core::Method;
        assert_eq!(code(Account::Suspense(SuspenseReason::Late)), "1590");
        assert_eq!(code(Account::Suspense(SuspenseReason::Reversed)), "1591");
        assert_eq!(code(Account::Fx(Method::Btc)), "2660");
        assert_eq!(code(Account::Custody(Method::Btc)), "1510");
        let empty = Chart::new(BTreeMap::new());
        assert!(empty.map(&Account::RevenueRentals).is_err());
    }

    #[test]
    fn entry_ids_are_stable_and_short() {
        assert_eq!(entry_id("settle:x:1"), entry_id("settle:x:1"));
        assert_ne!(entry_id("settle:x:1"), entry_id("settle:x:2"));
        assert!(entry_id("settle:x:1").len() <= 21);
    }

    #[test]
    fn datev_text_puts_what_the_order_and_the_amount_first_and_cuts_no_word() {
        use payrecon_chain_core::Method;
        let entry = |key: &str, kind, reference: &str| NewEntry {
            idempotency_key: key.into(),
            kind,
            reference: Some(reference.into()),
            memo: "pi_0123456789abcdef0123456789abcdef 1 BTC at 80000 USD".into(),
            postings: vec![
                crate::ledger::Posting::debit(
                    Account::Custody(Method::Btc),
                    Currency::Crypto(Method::Btc),
                    625_000,
                ),
                crate::ledger::Posting::credit(
                    Account::Fx(Method::Btc),
                    Currency::Crypto(Method::Btc),
                    625_000,
                ),
            ],
        };
        assert_eq!(
            datev_text(&entry("settle:a:1", EntryKind::Payment, "S16")),
            "payment S16 0.00625 BTC"
        );
        let storno = datev_text(&entry("reverse:settle:a:1", EntryKind::Reversal, "S16"));
        assert_eq!(
            storno,
            format!("storno {} S16 0.00625 BTC", entry_id("settle:a:1"))
        );
        let long = "T".repeat(50);
        assert_eq!(
            datev_text(&entry("settle:b:1", EntryKind::Payment, &long)),
            format!("payment {long}")
        );
    }

    #[test]
    fn datev_text_is_windows_1252() {
        assert_eq!(windows_1252("Schlüssel"), b"Schl\xfcssel");
        assert_eq!(windows_1252("€"), [0x80]);
        assert_eq!(windows_1252("→"), b"?");
    }
}
