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
