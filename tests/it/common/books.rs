//! Test support for the books: every file of a journal export, collected in memory.

use std::sync::{Arc, Mutex};

use payrecon::{Engine, JournalFormat, Period};

/// The buffers of an export's files, in order.
type Files = Arc<Mutex<Vec<Arc<Mutex<Vec<u8>>>>>>;

/// Every file `format`'s export of `period` writes (several only for Xero).
pub async fn export(engine: &Engine, period: Period, format: JournalFormat) -> Vec<Vec<u8>> {
    let files: Files = Files::default();
    let opened = files.clone();
    engine
        .export_journal(period, format, move |_| {
            let buffer = Arc::new(Mutex::new(Vec::new()));
            opened.lock().unwrap().push(buffer.clone());
            Ok(Collected(buffer))
        })
        .await
        .unwrap();
    let files = files.lock().unwrap();
    files.iter().map(|b| b.lock().unwrap().clone()).collect()
}

/// An `AsyncWrite` into a buffer the test reads afterwards.
struct Collected(Arc<Mutex<Vec<u8>>>);

impl tokio::io::AsyncWrite for Collected {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.0.lock().unwrap().extend_from_slice(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// An engine on `db` with `config`'s payment settings and books, pricing from the recorded
/// quotes file at `quotes` (locked at its plain quotes, valued at its timed ones), on `clock`.
pub async fn engine_with_recorded_quotes(
    db: &super::TestDb,
    config: payrecon::config::Config,
    quotes: &std::path::Path,
    clock: Arc<payrecon::test_utils::clock::ManualClock>,
) -> Engine {
    use payrecon::test_utils::rates::RecordedQuotes;
    let sources = vec![Arc::new(RecordedQuotes::new(quotes.to_path_buf())) as _];
    engine_with_rate_sources(db, config, sources, clock).await
}

/// An engine on `db` with `config`'s payment settings and books, pricing from `sources`, on
/// `clock`.
pub async fn engine_with_rate_sources(
    db: &super::TestDb,
    config: payrecon::config::Config,
    sources: Vec<Arc<dyn payrecon::test_utils::rates::RateSource>>,
    clock: Arc<payrecon::test_utils::clock::ManualClock>,
) -> Engine {
    use payrecon::test_utils::rates::RateBook;
    let mut settings = payrecon::PaymentSettings::from_config(&config).unwrap();
    settings.rates = Some(Arc::new(RateBook::new(
        sources,
        chrono::Duration::minutes(5),
        rust_decimal::Decimal::new(2, 2),
        chrono::Duration::zero(),
    )));
    db.engine()
        .await
        .with_payment_settings(settings)
        .with_books(config.books)
        .unwrap()
        .with_clock(clock)
}

/// The fields payrecon writes in each Buchungsstapel record, by DATEV's published field
/// expressions (format description "Buchungsstapel", EXTF version 700; the expressions include
/// the quotes of text fields). An optional field may be empty. Amounts and accounts must not be
/// zero, which DATEV writes as a negative look-ahead and is checked apart here.
const DATEV_FIELDS: [(&str, &str, bool); 14] = [
    ("Umsatz", r"^\d{1,10},\d{2}$", false),
    ("Soll/Haben-Kennzeichen", r#"^"(S|H)"$"#, false),
    ("WKZ Umsatz", r#"^"[A-Z]{3}"$"#, false),
    ("Kurs", r"^[1-9]\d{0,3},\d{2,6}$", false),
    ("Basis-Umsatz", r"^\d{1,10},\d{2}$", false),
    ("WKZ Basis-Umsatz", r#"^"[A-Z]{3}"$"#, false),
    ("Konto", r"^\d{1,9}$", false),
    ("Gegenkonto", r"^\d{1,9}$", false),
    ("BU-Schlüssel", r#"^"\d{4}"$"#, true),
    ("Belegdatum", r"^\d{4}$", false),
    ("Belegfeld 1", r#"^"[\w$%\-/]{0,36}"$"#, false),
    ("Belegfeld 2", r#"^"[\w$%\-/]{0,12}"$"#, true),
    ("Skonto", r"^[1-9]\d{0,7},\d{2}$", true),
    ("Buchungstext", r#"^".{0,60}"$"#, false),
];

/// Every record of a DATEV export matches DATEV's expression for each field, and a Storno
/// names the booking it undoes in Belegfeld 2 and its Buchungstext.
pub fn datev_fields_follow_the_format(file: &[u8], has_storno: bool) {
    let (text, _, _) = encoding_rs::WINDOWS_1252.decode(file);
    let expressions: Vec<regex::Regex> = DATEV_FIELDS
        .iter()
        .map(|(_, e, _)| regex::Regex::new(e).unwrap())
        .collect();
    let mut stornos = 0;
    for record in text.split("\r\n").skip(2).filter(|r| !r.is_empty()) {
        let fields: Vec<&str> = record.split(';').collect();
        assert_eq!(fields.len(), DATEV_FIELDS.len(), "{record}");
        for (((name, _, optional), expression), field) in
            DATEV_FIELDS.iter().zip(&expressions).zip(&fields)
        {
            let empty_allowed = *optional && (field.is_empty() || *field == "\"\"");
            assert!(
                empty_allowed || expression.is_match(field),
                "{name} {field:?} does not match DATEV's {expression} in {record}"
            );
        }
        for amount_or_account in [0, 4, 6, 7] {
            assert!(
                fields[amount_or_account]
                    .chars()
                    .any(|c| c.is_ascii_digit() && c != '0'),
                "{} is zero in {record}",
                DATEV_FIELDS[amount_or_account].0
            );
        }
        if fields[13].starts_with("\"storno PR-") {
            stornos += 1;
            let reversed = fields[13].trim_matches('"').split(' ').nth(1).unwrap();
            assert_eq!(
                fields[11].trim_matches('"'),
                reversed.trim_start_matches("PR-"),
                "{record}"
            );
        }
    }
    assert_eq!(stornos > 0, has_storno, "reversals in the month");
}

/// Cents of a vendor's amount (`86,21` or `-86.21`).
pub fn cents(text: &str) -> i64 {
    let value: rust_decimal::Decimal = text.replace(',', ".").parse().unwrap();
    (value * rust_decimal::Decimal::ONE_HUNDRED)
        .try_into()
        .unwrap()
}

/// The records of a CSV text with `delimiter`, header rows included.
pub fn records(text: &str, delimiter: u8) -> Vec<Vec<String>> {
    csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .has_headers(false)
        .flexible(true)
        .from_reader(text.as_bytes())
        .records()
        .map(|r| r.unwrap().iter().map(str::to_owned).collect())
        .collect()
}

/// A month's DATEV, Xero and QuickBooks exports checked by rules written from each vendor's
/// specification: DATEV's CRLF, Windows-1252, field expressions, header against
/// `[books.datev]` and the month, and every Belegdatum inside it; every Xero journal summing to
/// zero; every QuickBooks journal balancing, dated in the configured order inside the month;
/// and the three agreeing per GL account (DATEV and Xero) and per entry (all three).
pub async fn vendors_rules_hold(engine: &Engine, period: Period, has_storno: bool) {
    use chrono::Datelike;
    use std::collections::BTreeMap;
    let first = chrono::NaiveDate::parse_from_str(&format!("{period}-01"), "%Y-%m-%d").unwrap();
    let last = first.checked_add_months(chrono::Months::new(1)).unwrap() - chrono::Days::new(1);
    let books = engine.books_config();

    let datev = export(engine, period, JournalFormat::Datev).await.remove(0);
    let lines = datev
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    assert_eq!(
        datev.windows(2).filter(|w| w == b"\r\n").count(),
        lines,
        "CRLF ends every record"
    );
    let (text, _, malformed) = encoding_rs::WINDOWS_1252.decode(&datev);
    assert!(!malformed, "Windows-1252");
    datev_fields_follow_the_format(&datev, has_storno);
    let rows = records(&text, b';');
    let header = &rows[0];
    assert_eq!(
        header[10],
        books.datev.consultant_number.to_string(),
        "Beraternummer"
    );
    assert_eq!(
        header[11],
        books.datev.client_number.to_string(),
        "Mandantennummer"
    );
    assert_eq!(
        header[13],
        books.datev.account_length.to_string(),
        "Sachkontenlänge"
    );
    assert_eq!(
        (header[14].as_str(), header[15].as_str()),
        (
            first.format("%Y%m%d").to_string().as_str(),
            last.format("%Y%m%d").to_string().as_str()
        ),
        "Datum vom, Datum bis"
    );
    let mut datev_accounts: BTreeMap<String, i64> = BTreeMap::new();
    let mut datev_entries: BTreeMap<String, i64> = BTreeMap::new();
    for row in &rows[2..] {
        let (day, month) = (
            row[9][..2].parse::<u32>().unwrap(),
            row[9][2..].parse::<u32>().unwrap(),
        );
        assert!(
            month == first.month() && (1..=last.day()).contains(&day),
            "Belegdatum {} inside {period}",
            row[9]
        );
        let amount = cents(&row[4]);
        let (debited, credited) = if row[1] == "S" {
            (&row[6], &row[7])
        } else {
            (&row[7], &row[6])
        };
        *datev_accounts.entry(debited.clone()).or_default() += amount;
        *datev_accounts.entry(credited.clone()).or_default() -= amount;
        *datev_entries.entry(row[10].clone()).or_default() += amount;
    }
    datev_accounts.retain(|_, v| *v != 0);

    let mut xero_accounts: BTreeMap<String, i64> = BTreeMap::new();
    let mut xero_entries: BTreeMap<String, i64> = BTreeMap::new();
    for file in export(engine, period, JournalFormat::Xero).await {
        let mut journals: BTreeMap<String, i64> = BTreeMap::new();
        for row in &records(&String::from_utf8(file).unwrap(), b',')[1..] {
            let amount = cents(&row[5]);
            *journals.entry(row[0].clone()).or_default() += amount;
            *xero_accounts.entry(row[3].clone()).or_default() += amount;
            let entry = row[0].split(' ').next().unwrap().to_owned();
            *xero_entries.entry(entry).or_default() += amount.max(0);
        }
        assert!(
            journals.values().all(|sum| *sum == 0),
            "every Xero journal sums to zero: {journals:?}"
        );
    }
    xero_accounts.retain(|_, v| *v != 0);
    assert_eq!(
        datev_accounts, xero_accounts,
        "DATEV and Xero move each GL account alike"
    );

    let date_format = match books.qbo_date_order {
        payrecon::config::DateOrder::MonthFirst => "%m/%d/%Y",
        payrecon::config::DateOrder::DayFirst => "%d/%m/%Y",
    };
    let qbo = export(engine, period, JournalFormat::Qbo).await.remove(0);
    let mut qbo_entries: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for row in &records(&String::from_utf8(qbo).unwrap(), b',')[1..] {
        let date = chrono::NaiveDate::parse_from_str(&row[1], date_format).unwrap();
        assert!(
            (first..=last).contains(&date),
            "{date} inside {period}, read as {date_format}"
        );
        let sums = qbo_entries.entry(row[0].clone()).or_default();
        sums.0 += if row[4].is_empty() { 0 } else { cents(&row[4]) };
        sums.1 += if row[5].is_empty() { 0 } else { cents(&row[5]) };
    }
    assert!(
        qbo_entries
            .values()
            .all(|(debits, credits)| debits == credits),
        "every QuickBooks journal balances"
    );
    let qbo_entries: BTreeMap<String, i64> = qbo_entries
        .into_iter()
        .map(|(id, (debits, _))| (id, debits))
        .collect();
    assert_eq!(
        datev_entries, xero_entries,
        "DATEV and Xero book each entry alike"
    );
    assert_eq!(
        xero_entries, qbo_entries,
        "Xero and QuickBooks book each entry alike"
    );
}
