//! The books on the devnet, on SQLite and PostgreSQL: an LTC payment (regtest, through
//! ElectrumX) and a USDT payment on Ethereum (anvil, a real ERC-20) confirmed at pinned prices,
//! their value at receipt and FX difference checked to the cent in USD and EUR; the month is
//! closed, and a reorg after the close is booked in the next month.

use crate::common;

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use common::anvil::{Anvil, Tokens, fresh_ethereum_xpub, watch_ethereum};
use common::books::export;
use common::checks::{order, wait_status};
use common::regtest::{Chain, Source, fresh_account_xpub};
use common::{TestDb, topup};
use payrecon::test_utils::clock::{Clock, ManualClock};
use payrecon::{Engine, IntentStatus, JournalFormat, Period};
use payrecon_chain_core::Method;

/// Locks at LTC 100 and USDT 1 (the plain quotes); worth LTC 102.50, USDT 0.9995 and one
/// euro 1.16 USD since `since` (the timed quote).
fn quotes(since: DateTime<Utc>) -> String {
    format!(
        r#"{{"fetched_at": "2030-01-01T00:00:00Z",
            "quotes": {{"LTC": "100", "USDT": "1", "ETH": "2000"}},
            "timed": [{{"at": "{}", "quotes": {{"LTC": "102.50", "USDT": "0.9995", "ETH": "2050"}}, "usd_per_eur": "1.16"}}]}}"#,
        since.to_rfc3339()
    )
}

async fn books_engine(
    db: &TestDb,
    chain: &Chain,
    anvil: &Anvil,
    tokens: &Tokens,
    dir: &std::path::Path,
) -> (Engine, Arc<ManualClock>) {
    let now = Utc::now();
    std::fs::write(dir.join("quotes.json"), quotes(now - Duration::days(1))).unwrap();
    let config = common::payments::config(|c| {
        c.payments.enabled_methods = vec![Method::Ltc, Method::UsdtErc20];
        // Watched long enough that the reorg, a month later by the clock, is still seen.
        c.payments.monitoring_window_hours = 24 * 90;
        c.networks.litecoin = Some(common::regtest::litecoin(
            &fresh_account_xpub(),
            &chain.electrum_url,
            2,
        ));
        c.networks.ethereum = Some(common::anvil::ethereum(
            anvil,
            tokens,
            &fresh_ethereum_xpub(),
            1,
        ));
        c.books.reporting_currency = Some("EUR".into());
        c.books.timezone = "Europe/Berlin".into();
    });
    let clock = Arc::new(ManualClock::new(now));
    let engine = common::books::engine_with_recorded_quotes(
        db,
        config,
        &dir.join("quotes.json"),
        clock.clone(),
    )
    .await;
    (engine, clock)
}

on_both_databases! {
    async fn payments_at_pinned_prices_close_their_month_and_a_later_reorg_books_in_the_next(db) {
        let chain = Chain::lock().await;
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let dir = tempfile::tempdir().unwrap();
        let (engine, clock) = books_engine(&db, &chain, &anvil, &tokens, dir.path()).await;
        engine.create_topup(&topup("T-LTC", "42", "100")).await.unwrap();
        engine.create_topup(&topup("T-USDT", "43", "100")).await.unwrap();
        let ltc = engine.create_payment(&order("T-LTC"), Method::Ltc).await.unwrap();
        let usdt = engine.create_payment(&order("T-USDT"), Method::UsdtErc20).await.unwrap();
        assert_eq!((ltc.amount_decimal.as_str(), usdt.amount_decimal.as_str()), ("1", "100"));
        let litecoin = Source::Electrum.watch(&engine, &chain);
        let ethereum = watch_ethereum(&engine, &anvil, &tokens, anvil.head().await);

        let coin = chain.coin("1.5").await;
        chain.spend_coin(&coin, &ltc.intent.pay_to, "1", "0.4999").await;
        let mined_at = chain.mine(1).await;
        chain.mine(1).await;
        anvil.send_token(&tokens.usdt, &usdt.intent.pay_to, 100_000_000).await;
        anvil.mine(1).await;
        wait_status(&engine, &ltc.intent.id, IntentStatus::Settled).await;
        wait_status(&engine, &usdt.intent.id, IntentStatus::Settled).await;

        // Value at receipt and the FX difference, to the cent.
        let pass = engine.value_entries().await.unwrap();
        assert_eq!((pass.valued, pass.failed), (2, 0), "{pass:?}");
        let month = engine.period_of(clock.now());
        let report: serde_json::Value = serde_json::from_str(&engine.period_report(month).await.unwrap()).unwrap();
        let receipt = |method: &str| report["receipts"].as_array().unwrap().iter().find(|r| r["method"] == method).unwrap().clone();
        let figures = |r: serde_json::Value| [&r["market_usd"], &r["fx_gain_usd"], &r["market_reporting"], &r["fx_gain_reporting"]]
            .map(|v| v["amount"].as_str().unwrap().to_owned());
        assert_eq!(figures(receipt("ltc")), ["102.50", "2.50", "88.36", "2.15"]);
        assert_eq!(figures(receipt("usdt-erc20")), ["99.95", "-0.05", "86.16", "-0.05"]);

        // The month ends and closes.
        let (_, end) = engine.period_bounds(month);
        clock.set(end + Duration::hours(1));
        engine.close_period(month, "fiona").await.unwrap();
        let closed_report = engine.period_report(month).await.unwrap();
        let closed_datev = export(&engine, month, JournalFormat::Datev).await;

        // A reorg after the close takes the LTC payment away: the reversal is in the next month.
        chain.invalidate(mined_at).await;
        let elsewhere = chain.wallet_address().await;
        chain.spend_coin(&coin, &elsewhere, "1", "0.499").await;
        chain.mine(4).await;
        wait_status(&engine, &ltc.intent.id, IntentStatus::ReorgedAfterCredit).await;
        assert_eq!(engine.value_entries().await.unwrap().failed, 0);
        assert_eq!(engine.period_report(month).await.unwrap(), closed_report, "the closed month is unchanged");
        assert_eq!(export(&engine, month, JournalFormat::Datev).await, closed_datev);
        let next: Period = month.next();
        let generic = String::from_utf8(export(&engine, next, JournalFormat::Generic).await.remove(0)).unwrap();
        let original = payrecon::entry_id(&format!("settle:{}:1", ltc.intent.id));
        assert!(generic.contains(&format!("(reverses {original})")), "{generic}");
        // DATEV shows the same trail: Buchungstext and Belegfeld 2 name the reversed booking.
        let datev = export(&engine, next, JournalFormat::Datev).await.remove(0);
        common::books::datev_fields_follow_the_format(&datev, true);
        assert!(String::from_utf8_lossy(&datev).contains(&format!("\"storno {original}")), "{}", String::from_utf8_lossy(&datev));
        common::books::datev_fields_follow_the_format(&closed_datev[0], false);
        common::books::vendors_rules_hold(&engine, month, false).await;
        common::books::vendors_rules_hold(&engine, next, true).await;
        // The two months' files, kept for people to read (docs/finance.md quotes them).
        let kept = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("../test-artifacts/books-devnet");
        std::fs::create_dir_all(&kept).unwrap();
        for period in [month, next] {
            for (format, name) in [(JournalFormat::Datev, "datev"), (JournalFormat::Xero, "xero"), (JournalFormat::Qbo, "qbo"), (JournalFormat::Generic, "generic")] {
                for (part, file) in export(&engine, period, format).await.into_iter().enumerate() {
                    std::fs::write(kept.join(format!("{period}-{name}-{}.csv", part + 1)), file).unwrap();
                }
            }
        }
        let rollforward = engine.rollforward(next).await.unwrap();
        assert_eq!((rollforward.opening.cents, rollforward.reversed.cents, rollforward.closing.cents), (20_000, 10_000, 10_000));
        assert!(rollforward.closes);
        litecoin.stop().await.unwrap();
        ethereum.stop().await.unwrap();
    }
}
