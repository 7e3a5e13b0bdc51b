//! What a person sees: headless Chromium (Debian's `chromium`) opens the pages `payrecon
//! serve` serves and the rendered pages are checked: the stuck-payments and reconciliation
//! pages over a database holding every state and exception, and the customer's checkout page
//! in each language at desktop and phone width while a real regtest payment lands.
//!
//! Chromium comes from `PAYRECON_TEST_CHROMIUM` or `/usr/bin/chromium`; scripts/test.sh
//! installs it. Without it the tests fail: they are never skipped. Screenshots are kept in
//! `target/test-artifacts/`.

use crate::common;
mod headless;

use std::process::Command;

use common::TestDb;
use common::seed::{Seeded, seed};
use common::serve::{ServeConfig, Serving, free_port};
use payrecon::Role;

/// The page's DOM once its scripts have run.
async fn rendered(url: &str) -> String {
    let (browser, url) = (headless::chromium(), url.to_owned());
    let output = tokio::task::spawn_blocking(move || {
        Command::new(browser)
            .args(headless::HEADLESS)
            .args(["--virtual-time-budget=15000", "--dump-dom"])
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

/// `payrecon serve` with HTTP over a database seeded with every state and exception (BTC at
/// 80,000 USD, and a price for every asset the seed pays in, so the books can value it): its
/// configuration (which holds the database), the seeded engine, the server and its base URL,
/// once it answers.
async fn serve_seeded() -> (ServeConfig, Seeded, Serving, String) {
    let port = free_port();
    let config = ServeConfig::new(
        &["btc"],
        r#"{"BTC":"80000","ETH":"3000","USDT":"1","USDC":"1","TRX":"0.25","SOL":"150","LTC":"85"}"#,
        &format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    let seeded = seed(&TestDb::sqlite_at(&config.database())).await;
    let serving = config.serve();
    let base = format!("http://127.0.0.1:{port}");
    ready(&base).await;
    (config, seeded, serving, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_person_sees_the_stuck_payments_and_the_reconciliation() {
    let (_config, seeded, serving, base) = serve_seeded().await;
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
        report.contains("<td class=\"n\">0.04375</td>"),
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

/// Waits until the server's valuation pass has valued every entry.
async fn all_valued(base: &str, token: &str) {
    let client = reqwest::Client::new();
    for _ in 0..600 {
        let answer: serde_json::Value = client
            .get(format!("{base}/v1/books/unvalued"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if answer["count"] == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the valuation pass never valued every entry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn finance_sees_the_books_and_closes_and_reopens_a_month() {
    let (_config, seeded, serving, base) = serve_seeded().await;
    let finance = seeded
        .engine
        .create_api_token("fiona", Role::Finance)
        .await
        .unwrap();
    all_valued(&base, &finance).await;
    let browser = headless::Headless::launch().await;

    // The seeded month on a laptop: its roll-forward, receipts at value, the chart and the
    // exports.
    let page = browser
        .open(
            &format!("{base}/ui/reconcile#token={finance}&month=2026-12"),
            headless::LAPTOP,
            None,
        )
        .await;
    headless::wait_until(
        &page,
        "document.getElementById('books-status').textContent.includes('sha256')",
        "December's figures",
    )
    .await;
    let seen = headless::visible_text(&page).await;
    for expected in [
        "State: open",
        "Top-ups credited",
        "Customers' balances",
        "Holdings on watched addresses",
        "Sent elsewhere",
        "Found by check",
        "0 entries without a fiat value",
        "Market value USD",
        "btc",
    ] {
        assert!(seen.contains(expected), "the books show {expected}: {seen}");
    }
    let bars: u32 =
        headless::evaluate(&page, "document.querySelectorAll('#chart rect').length").await;
    assert!(bars > 0, "the chart has a bar per day and method");
    let chart: String =
        headless::evaluate(&page, "document.getElementById('chart').textContent").await;
    for part in ["USD", "day (MM-DD)", "12-01", "btc "] {
        assert!(
            chart.contains(part),
            "the chart's axes, dates and legend show {part}: {chart}"
        );
    }
    let scrolls: bool = headless::evaluate(
        &page,
        "document.documentElement.scrollWidth > window.innerWidth",
    )
    .await;
    assert!(
        !scrolls,
        "the books fit 1366 pixels without a horizontal scroll"
    );
    // Holdings in each asset's units, the base units on hover.
    let in_base_units: Vec<String> = headless::evaluate(
        &page,
        "[...document.querySelectorAll('#holdings td')].map((td) => td.textContent).filter((text) => /^\\d{10,}/.test(text))",
    )
    .await;
    assert!(
        in_base_units.is_empty(),
        "no amount in base units: {in_base_units:?}"
    );
    let hover: String = headless::evaluate(
        &page,
        "[...document.querySelectorAll('#holdings td[title]')].map((td) => td.textContent + ' = ' + td.title).join('; ')",
    )
    .await;
    assert!(
        hover.contains(" base units)"),
        "the exact amount on hover: {hover}"
    );
    headless::screenshot(&page, headless::LAPTOP, "finance", "books").await;
    let reconciliation = browser
        .open(
            &format!("{base}/ui/reconcile#token={finance}&from=2026-11-01&to=2026-12-31"),
            headless::LAPTOP,
            None,
        )
        .await;
    headless::wait_until(
        &reconciliation,
        "document.getElementById('transfers') !== null",
        "the reconciliation",
    )
    .await;
    let (width, tables, ids): (u32, String, String) = headless::evaluate(
        &reconciliation,
        "[document.documentElement.scrollWidth, [...document.querySelectorAll('table')].map((t) => t.offsetWidth).join(), [...document.querySelectorAll('td.id')].map((td) => td.title === td.textContent).join()]",
    )
    .await;
    assert!(
        width <= 1366,
        "the reconciliation's tables fit 1366 pixels: the page is {width} wide, its tables {tables}"
    );
    assert!(
        ids.contains("true") && !ids.contains("false"),
        "each clipped id whole on hover and in a copy"
    );
    headless::screenshot(
        &reconciliation,
        headless::LAPTOP,
        "finance",
        "reconciliation",
    )
    .await;
    let exports: String =
        headless::evaluate(&page, "document.getElementById('exports').textContent").await;
    assert_eq!(exports, "genericdatevqboxero 1");

    // November has ended: finance closes it, then reopens it with a reason.
    let _: bool = headless::evaluate(
        &page,
        "document.forms.books.month.value = '2026-11'; document.forms.books.requestSubmit(); true",
    )
    .await;
    headless::wait_until(
        &page,
        "document.getElementById('state').textContent === 'open' && !document.getElementById('close').hidden",
        "November open",
    )
    .await;
    let _: bool = headless::evaluate(&page, "document.getElementById('close').click(); true").await;
    headless::wait_until(
        &page,
        "document.getElementById('state').textContent === 'closed'",
        "November closed",
    )
    .await;
    assert!(
        headless::visible_text(&page)
            .await
            .contains("close by fiona")
    );
    let _: bool = headless::evaluate(
        &page,
        "window.prompt = () => 'a supplier invoice arrived late'; document.getElementById('reopen').click(); true",
    )
    .await;
    headless::wait_until(
        &page,
        "document.getElementById('state').textContent === 'open'",
        "November reopened",
    )
    .await;
    assert!(
        headless::visible_text(&page)
            .await
            .contains("reopen by fiona: a supplier invoice arrived late")
    );
    browser.close().await;
    serving.stop().await;
}

/// What each language says about a Litecoin payment, as a person reads it.
struct Said {
    language: &'static str,
    network: &'static str,
    warning: &'static str,
    waiting: &'static str,
}

const SAID: [Said; 3] = [
    Said {
        language: "en",
        network: "Litecoin (LTC) on the Litecoin network",
        warning: "is not this payment and will not be credited",
        waiting: "Waiting for your payment.",
    },
    Said {
        language: "de",
        network: "Litecoin (LTC) im Litecoin-Netzwerk",
        warning: "ist nicht diese Zahlung und wird nicht gutgeschrieben",
        waiting: "Wir warten auf Ihre Zahlung.",
    },
    Said {
        language: "id",
        network: "Litecoin (LTC) di jaringan Litecoin",
        warning: "bukan pembayaran ini dan tidak akan dikreditkan",
        waiting: "Menunggu pembayaran Anda.",
    },
];

/// How each language reaches the page: English by default, German from the browser's
/// `Accept-Language`, Indonesian from `?lang=`.
fn asked(language: &str) -> (&'static str, Option<&'static str>) {
    match language {
        "de" => ("", Some("de-DE,de;q=0.9,en;q=0.5")),
        "id" => ("?lang=id", Some("en-US,en;q=0.9")),
        _ => ("", None),
    }
}

/// `payrecon serve` watching the regtest node for Litecoin at 100 USD, two confirmations.
async fn litecoin_checkout(chain: &common::regtest::Chain) -> (ServeConfig, String) {
    let port = free_port();
    let config = ServeConfig::new(
        &["ltc"],
        r#"{"LTC":"100"}"#,
        &format!(
            "[payments.explorer_urls]\nlitecoin = \"https://explorer.example/ltc/tx/{{txid}}\"\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n[networks.litecoin]\nxpub = \"{xpub}\"\n\
             network = \"regtest\"\nconfirmations = 2\nrpc_url = \"{rpc}\"\npush_peer = \"{peer}\"\n\
             poll_interval_ms = 100\n",
            xpub = common::regtest::fresh_account_xpub(),
            rpc = chain.rpc_url,
            peer = chain.p2p_peer,
        ),
    );
    (config, format!("http://127.0.0.1:{port}"))
}

async fn ready(base: &str) {
    common::regtest::eventually("payrecon serve answers", || async {
        reqwest::get(format!("{base}/ready"))
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
}

/// The checkout page of a fresh Litecoin payment in English, German and Indonesian, on a
/// desktop and on a phone: amount, address and network in words, the QR code in the
/// screenshot decoding to the payment URI, the countdown running; then, on a phone, the
/// status following a real payment live from the mempool to its second confirmation; and
/// "I have paid" pressed on another payment's page.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_customer_pays_on_the_checkout_page_in_three_languages() {
    let chain = common::regtest::Chain::lock().await;
    let (config, base) = litecoin_checkout(&chain).await;
    let (intent, address) = config.topup_and_pay("ltc");
    let shown = config.cli(&["pay", "show", &intent]);
    let link = format!("{base}{}", shown["checkout_path"].as_str().unwrap());
    let uri = shown["payment_uri"].as_str().unwrap().to_owned();
    assert_eq!(shown["amount_decimal"], "1");
    let serving = config.serve();
    ready(&base).await;
    let browser = headless::Headless::launch().await;

    for said in &SAID {
        let (query, accept_language) = asked(said.language);
        for screen in [headless::DESKTOP, headless::PHONE] {
            let page = browser
                .open(&format!("{link}{query}"), screen, accept_language)
                .await;
            let lang: String = headless::evaluate(&page, "document.documentElement.lang").await;
            assert_eq!(lang, said.language);
            let seen = headless::visible_text(&page).await;
            for expected in [&address, "1 LTC", said.network, said.warning, said.waiting] {
                assert!(
                    seen.contains(expected),
                    "{} at {}: {expected:?} in {seen}",
                    said.language,
                    screen.name
                );
            }
            // The script ran under the page's policy: the copy buttons are shown.
            headless::wait_until(
                &page,
                "[...document.querySelectorAll('button.copy')].every(b => !b.hidden)",
                "the copy buttons",
            )
            .await;
            let overflow: bool = headless::evaluate(
                &page,
                "document.documentElement.scrollWidth > window.innerWidth",
            )
            .await;
            assert!(
                !overflow,
                "{} at {}: nothing wider than the screen",
                said.language, screen.name
            );
            let first: String =
                headless::evaluate(&page, "document.getElementById('countdown').textContent").await;
            assert!(
                first.len() >= 4 && first.contains(':') && first.starts_with("5"),
                "a countdown of about an hour: {first}"
            );
            headless::wait_until(
                &page,
                &format!("document.getElementById('countdown').textContent !== '{first}'"),
                "the countdown to run",
            )
            .await;
            let png = headless::screenshot(
                &page,
                screen,
                "checkout",
                &format!("{}-{}", said.language, screen.name),
            )
            .await;
            let codes = browser.decode_qr_codes(&png).await;
            assert_eq!(
                codes,
                std::slice::from_ref(&uri),
                "the QR code in the screenshot is the payment URI"
            );
            page.close().await;
        }
    }

    let page = browser.open(&link, headless::PHONE, None).await;
    let _: bool = headless::evaluate(&page, "window.sameDocument = true").await;
    let txid = chain.send(&address, "1").await;
    headless::wait_until(
        &page,
        "window.sameDocument && document.getElementById('status').textContent \
         === 'Payment seen: 0 of 2 confirmations.'",
        "the page to show the payment seen, pushed without a reload",
    )
    .await;
    let withdrawn: bool =
        headless::evaluate(&page, "document.getElementById('paid-form').hidden").await;
    assert!(
        withdrawn,
        "once a payment is seen, \"I have paid\" is no longer offered"
    );
    headless::screenshot(&page, headless::PHONE, "checkout", "live-seen").await;
    chain.mine(1).await;
    headless::wait_until(
        &page,
        "window.sameDocument && document.getElementById('status').textContent \
         === 'Payment seen: 1 of 2 confirmations.'",
        "the first confirmation",
    )
    .await;
    headless::screenshot(&page, headless::PHONE, "checkout", "live-confirming").await;
    chain.mine(1).await;
    headless::wait_until(
        &page,
        "document.getElementById('status')?.dataset.status === 'settled'",
        "the page to show the payment settled",
    )
    .await;
    let settled = headless::visible_text(&page).await;
    assert!(settled.contains("Paid. Thank you!"), "{settled}");
    assert!(
        !settled.contains(&address),
        "a paid page no longer offers the address"
    );
    // It keeps what arrived and the instructions it was paid on.
    for kept in [
        "What arrived",
        "1 LTC, Litecoin (LTC) on the Litecoin network",
        &txid,
        "2 confirmations",
        "Confirmed and credited",
        "Your payment instructions",
        &format!("Pay 1 LTC to {}…", &address[..8]),
    ] {
        // Headings read in capitals (the style sheet's).
        assert!(
            settled.to_lowercase().contains(&kept.to_lowercase()),
            "{kept:?} in {settled}"
        );
    }
    let link: String = headless::evaluate(
        &page,
        "document.querySelector('#arrived a.txid')?.href ?? ''",
    )
    .await;
    assert_eq!(link, format!("https://explorer.example/ltc/tx/{txid}"));
    headless::screenshot(&page, headless::PHONE, "checkout", "live-settled").await;
    page.close().await;

    config.cli(&[
        "topup",
        "create",
        "--reference",
        "T2",
        "--account",
        "42",
        "--amount-usd",
        "100",
    ]);
    let second = config.cli(&["pay", "create", "--order", "T2", "--method", "ltc"]);
    let second_link = format!(
        "{base}{}?lang=id",
        second["checkout_path"].as_str().unwrap()
    );
    let page = browser.open(&second_link, headless::PHONE, None).await;
    page.click("#paid").await;
    headless::wait_until(
        &page,
        "document.getElementById('paid-noted') !== null",
        "the page to say it noted the payment",
    )
    .await;
    let noted = headless::visible_text(&page).await;
    assert!(
        noted.contains("Terima kasih. Kami mencatat bahwa Anda sudah membayar"),
        "{noted}"
    );
    headless::screenshot(&page, headless::PHONE, "checkout", "id-phone-i-have-paid").await;
    let recorded = config.cli(&["pay", "show", second["id"].as_str().unwrap()]);
    assert!(recorded["marked_paid_at"].is_string(), "{recorded}");
    assert_eq!(recorded["status"], "awaiting_payment", "it credits nothing");
    browser.close().await;
    serving.stop().await;
}

/// An expired intent's page and a late payment's page, on both screens: no address, no QR
/// code, and what to do instead. Unknown and hostile links get the same not-found page and
/// store nothing; every answer carries the strict policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_and_late_payments_pages_say_what_to_do_instead() {
    let (_config, seeded, serving, base) = serve_seeded().await;
    let path = |order: &str| seeded.intents[order].checkout_path.clone();
    let (expired, late) = (path("T6"), path("T4"));
    let browser = headless::Headless::launch().await;

    for screen in [headless::DESKTOP, headless::PHONE] {
        let page = browser
            .open(&format!("{base}{expired}"), screen, Some("de"))
            .await;
        let seen = headless::visible_text(&page).await;
        for expected in [
            "Diese Zahlungsanforderung ist abgelaufen",
            "Bitten Sie den Shop um neue Zahlungsanweisungen. Senden Sie nie wieder Geld an diese Adresse.",
            "Wir haben vermerkt, dass Sie bezahlt haben",
        ] {
            assert!(seen.contains(expected), "{expected:?} in {seen}");
        }
        let offered: bool = headless::evaluate(
            &page,
            "document.getElementById('address') !== null || document.getElementById('qr') !== null",
        )
        .await;
        assert!(!offered, "an expired page offers no address and no QR code");
        let png = headless::screenshot(
            &page,
            screen,
            "checkout",
            &format!("de-{}-expired", screen.name),
        )
        .await;
        assert!(browser.decode_qr_codes(&png).await.is_empty());
        page.close().await;

        let page = browser.open(&format!("{base}{late}"), screen, None).await;
        let seen = headless::visible_text(&page).await;
        assert!(
            seen.contains(
                "Your payment arrived after the deadline. It is safe with us. Do not pay again: \
                 contact support with your order reference T4."
            ),
            "{seen}"
        );
        let offered: bool =
            headless::evaluate(&page, "document.getElementById('address') !== null").await;
        assert!(
            !offered,
            "a late payment's page does not ask for another payment"
        );
        headless::screenshot(
            &page,
            screen,
            "checkout",
            &format!("en-{}-late", screen.name),
        )
        .await;
        page.close().await;
    }

    let http = reqwest::Client::new();
    let answer = http.get(format!("{base}{late}")).send().await.unwrap();
    let policy = answer.headers()["content-security-policy"]
        .to_str()
        .unwrap();
    assert!(
        policy.starts_with("default-src 'none'; script-src 'self'"),
        "{policy}"
    );
    assert_eq!(answer.headers()["referrer-policy"], "no-referrer");
    assert_eq!(answer.headers()["cache-control"], "no-store");
    let body = answer.text().await.unwrap();
    assert!(
        !body.contains("<script>") && !body.contains(" style="),
        "nothing inline"
    );

    let events_before = seeded.engine.events_after(0, 10_000).await.unwrap().len();
    let id = seeded.intent("T6").to_owned();
    for hostile in [
        format!("/pay/{id}"),
        "/pay/00000000000000000000000000000000".into(),
        "/pay/%3Cscript%3E".into(),
        format!("/pay/{}", "a".repeat(5000)),
    ] {
        let answer = http.get(format!("{base}{hostile}")).send().await.unwrap();
        assert_eq!(answer.status(), 404, "{hostile}");
        assert!(
            answer
                .text()
                .await
                .unwrap()
                .contains("This payment page does not exist")
        );
        let paid = http
            .post(format!("{base}{hostile}/paid"))
            .send()
            .await
            .unwrap();
        assert_eq!(paid.status(), 404, "{hostile}/paid");
    }
    assert_eq!(
        seeded.engine.events_after(0, 10_000).await.unwrap().len(),
        events_before,
        "nothing stored"
    );
    browser.close().await;
    serving.stop().await;
}

/// A customer who paid too much asks for the excess back on the checkout page: the form in
/// three languages, an address of another network refused on the page with a clear message
/// and nothing recorded, then the customer's own address recorded, and the operator's
/// approval shown on the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_customer_asks_for_an_overpayment_back_on_the_checkout_page() {
    let chain = common::regtest::Chain::lock().await;
    let (config, base) = litecoin_checkout(&chain).await;
    let (intent, address) = config.topup_and_pay("ltc");
    let shown = config.cli(&["pay", "show", &intent]);
    let link = format!("{base}{}", shown["checkout_path"].as_str().unwrap());
    let serving = config.serve();
    ready(&base).await;
    chain.send(&address, "1.3").await;
    chain.mine(2).await;
    common::regtest::eventually("the overpaid payment to settle", || async {
        config.cli(&["pay", "show", &intent])["status"] == "settled"
    })
    .await;

    for (lang, button) in [
        ("en", "Ask for a refund"),
        ("de", "Erstattung beantragen"),
        ("id", "Minta pengembalian dana"),
    ] {
        let page = reqwest::get(format!("{link}?lang={lang}"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(page.contains(button), "{lang}: {page}");
    }

    let browser = headless::Headless::launch().await;
    let page = browser.open(&link, headless::PHONE, None).await;
    let submit = |address: &str| {
        format!(
            "document.getElementById('refund-address').value = '{address}'; \
             document.getElementById('refund-form').submit(); true"
        )
    };
    let _: bool =
        headless::evaluate(&page, &submit("bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4")).await;
    headless::wait_until(
        &page,
        "document.getElementById('refund-refused') !== null",
        "the page to refuse an address of another network",
    )
    .await;
    let refused = headless::visible_text(&page).await;
    assert!(
        refused.contains("This address cannot receive the refund"),
        "{refused}"
    );
    assert!(
        refused.contains("it is a Bitcoin mainnet address"),
        "{refused}"
    );
    assert!(
        config
            .cli(&["refund", "list"])
            .as_array()
            .unwrap()
            .is_empty(),
        "nothing recorded"
    );
    headless::screenshot(&page, headless::PHONE, "checkout", "refund-refused").await;

    let own = chain.wallet_address().await;
    let _: bool = headless::evaluate(&page, &submit(&own)).await;
    headless::wait_until(
        &page,
        "document.querySelector('li.refund[data-state=requested]') !== null",
        "the page to show the refund asked for",
    )
    .await;
    let asked = headless::visible_text(&page).await;
    assert!(
        asked.contains(&format!("0.3 LTC to {own}: asked for")),
        "{asked}"
    );
    let no_form: bool =
        headless::evaluate(&page, "document.getElementById('refund-form') === null").await;
    assert!(no_form, "the money waiting is asked for: no second form");
    headless::screenshot(&page, headless::PHONE, "checkout", "refund-requested").await;

    let refunds = config.cli(&["refund", "list"]);
    assert_eq!(refunds[0]["amount_kind"], "all");
    let id = refunds[0]["id"].as_str().unwrap();
    config.cli(&["refund", "approve", id, "--actor", "ops"]);
    let approved = reqwest::get(&link).await.unwrap().text().await.unwrap();
    assert!(
        approved.contains("approved. The shop is sending it."),
        "{approved}"
    );

    // Sent from the shop's wallet and recorded by its txid once mined: the page names the
    // transaction, in every language.
    let txid = chain.send(&own, "0.3").await;
    chain.mine(1).await;
    common::regtest::eventually("the refund recorded as sent", || async {
        config
            .attempt(&["refund", "sent", id, "--txid", &txid, "--actor", "ops"])
            .is_ok()
    })
    .await;
    for (lang, words) in [
        ("en", "Transaction"),
        ("de", "Transaktion"),
        ("id", "Transaksi"),
    ] {
        let sent = reqwest::get(format!("{link}?lang={lang}"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            sent.contains(&txid) && sent.contains(words),
            "{lang}: {sent}"
        );
    }
    let _: bool = headless::evaluate(&page, "setTimeout(() => location.reload(), 0); true").await;
    headless::wait_until(
        &page,
        "document.querySelector('li.refund .txid') !== null",
        "the page to show the refund's transaction",
    )
    .await;
    let shown = headless::visible_text(&page).await;
    assert!(shown.contains(&txid), "{shown}");
    headless::screenshot(&page, headless::PHONE, "checkout", "refund-sent").await;
    page.close().await;
    browser.close().await;
    serving.stop().await;
}
