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
    use payrecon::test_utils::rates::{RateBook, RecordedQuotes};
    let mut settings = payrecon::PaymentSettings::from_config(&config).unwrap();
    settings.rates = Some(Arc::new(RateBook::new(
        vec![Arc::new(RecordedQuotes::new(quotes.to_path_buf()))],
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
