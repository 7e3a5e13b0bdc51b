//! What a person sees: headless Chromium (Debian's `chromium`) opens the stuck-payments page
//! and the reconciliation page that `payrecon serve` serves, over a database holding every
//! state and exception, and the rendered pages are checked.
//!
//! Chromium comes from `PAYRECON_TEST_CHROMIUM` or `/usr/bin/chromium`; scripts/test.sh
//! installs it. Without it the test fails: it is never skipped.

mod common;

use std::process::Command;

use common::TestDb;
use common::seed::seed;
use common::serve::ServeConfig;
use payrecon::tokens::Role;

fn chromium() -> String {
    let path =
        std::env::var("PAYRECON_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&path).exists(),
        "the browser test needs Chromium at {path}: run scripts/test.sh, which installs Debian's chromium"
    );
    path
}

/// The page's DOM once its scripts have run.
async fn rendered(url: &str) -> String {
    let (browser, url) = (chromium(), url.to_owned());
    let output = tokio::task::spawn_blocking(move || {
        Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--virtual-time-budget=15000",
                "--dump-dom",
            ])
            .arg(url)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_person_sees_the_stuck_payments_and_the_reconciliation() {
    let port = free_port();
    let config = ServeConfig::new(
        &["btc"],
        r#"{"BTC":"80000"}"#,
        &format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    let seeded = seed(&TestDb::sqlite_at(&config.database())).await;
    let operator = seeded
        .engine
        .create_api_token("otto", Role::Operator)
        .await
        .unwrap();
    let finance = seeded
        .engine
        .create_api_token("fiona", Role::Finance)
        .await
        .unwrap();
    let serving = config.serve();
    let base = format!("http://127.0.0.1:{port}");
    common::regtest::eventually("payrecon serve answers", || async {
        reqwest::get(format!("{base}/ready"))
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;

    let stuck = rendered(&format!("{base}/ui/stuck#token={operator}")).await;
    assert!(stuck.contains(" item(s) need attention."), "{stuck}");
    for seen in [
        "underpaid",
        "paid_late",
        "wrong_asset",
        "unmatched",
        "reorged_after_credit",
        "accept_as_paid; credit_balance; mark_refunded",
        "marked_paid_unseen",
    ] {
        assert!(stuck.contains(seen), "the stuck page shows {seen}");
    }
    let refused = rendered(&format!("{base}/ui/stuck#token={finance}")).await;
    assert!(
        refused.contains("Cannot load: a finance token cannot use this endpoint"),
        "{refused}"
    );

    let report = rendered(&format!(
        "{base}/ui/reconcile#token={finance}&from=2026-12-01&to=2026-12-02"
    ))
    .await;
    assert!(
        report.contains("<h1>Reconciliation 2026-12-01 00:00 to 2026-12-02 00:00</h1>"),
        "{report}"
    );
    assert!(
        report.contains("<td>0.04375</td>"),
        "BTC expected, to the unit"
    );
    assert!(report.contains("<td>1000.00</td>"), "USD credited for BTC");
    assert!(
        report.contains("aria-label=\"btc received per day\""),
        "the chart"
    );
    assert!(report.contains("9 transfers"));
    assert!(report.contains("Every currency sums to zero."));
    serving.stop().await;
}
