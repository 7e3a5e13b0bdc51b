//! The real rate clients against a local server replaying the providers' recorded responses.

use crate::common;

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use common::replay::{ReplayServer, Reply};
use payrecon::test_utils::rates::{
    CoinGecko, Kraken, RateBook, RateError, RateSource, RecordedQuotes,
};
use payrecon_chain_core::Asset;
use rust_decimal::Decimal;

const COINGECKO: &str = "/api/v3/simple/price";
const KRAKEN: &str = "/0/public/Ticker";
const LITECOIN_CHART: &str = "/api/v3/coins/litecoin/market_chart/range";
const BITCOIN_CHART: &str = "/api/v3/coins/bitcoin/market_chart/range";
const KRAKEN_OHLC: &str = "/0/public/OHLC";

/// The receipt the recorded histories describe, and the valuation pass an hour later (the
/// last point of CoinGecko's chart and Kraken's open candle).
fn receipt_at() -> DateTime<Utc> {
    "2025-12-01T11:37:30Z".parse().unwrap()
}

fn an_hour_later() -> DateTime<Utc> {
    receipt_at() + Duration::hours(1)
}

/// A server answering both providers' present and past for Litecoin.
async fn litecoin_history() -> ReplayServer {
    ReplayServer::start(vec![
        (
            COINGECKO,
            vec![Reply::Fixture("rates/coingecko_simple_price.json")],
        ),
        (KRAKEN, vec![Reply::Fixture("rates/kraken_ticker.json")]),
        (
            LITECOIN_CHART,
            vec![Reply::Fixture(
                "rates/coingecko_market_chart_range_litecoin.json",
            )],
        ),
        (
            KRAKEN_OHLC,
            vec![Reply::Fixture("rates/kraken_ohlc_ltcusd_1m.json")],
        ),
    ])
    .await
}

/// The recorded responses' time (`last_updated_at` in the CoinGecko fixture).
fn recorded_at() -> DateTime<Utc> {
    DateTime::from_timestamp(1_764_590_400, 0).unwrap()
}

fn book(server: &ReplayServer) -> RateBook {
    let client = reqwest::Client::new();
    RateBook::new(
        vec![
            Arc::new(CoinGecko::new(client.clone(), &server.base_url, None)) as Arc<dyn RateSource>,
            Arc::new(Kraken::new(client, &server.base_url)),
        ],
        Duration::minutes(5),
        Decimal::new(2, 2),
        Duration::zero(),
    )
}

fn book_with_tolerance(server: &ReplayServer, tolerance: Duration) -> RateBook {
    book(server).with_history_tolerance(tolerance)
}

fn d(text: &str) -> Decimal {
    text.parse().unwrap()
}

#[tokio::test]
async fn the_median_of_two_providers_is_locked() {
    let server = ReplayServer::start(vec![
        (
            COINGECKO,
            vec![Reply::Fixture("rates/coingecko_simple_price.json")],
        ),
        (KRAKEN, vec![Reply::Fixture("rates/kraken_ticker.json")]),
    ])
    .await;
    let book = book(&server);
    let now = recorded_at() + Duration::seconds(30);
    let btc = book.rate(Asset::Btc, now).await.unwrap();
    assert_eq!(
        btc.usd_per_unit,
        (d("80012.34") + d("79988.5")) / Decimal::TWO
    );
    assert_eq!(btc.source, "kraken,coingecko");
    for asset in payrecon::test_utils::rates::QUOTED_ASSETS {
        assert!(book.rate(asset, now).await.is_ok(), "{asset}");
    }
}

#[tokio::test]
async fn a_stale_quote_is_not_used_and_none_fresh_is_an_error() {
    let server = ReplayServer::start(vec![
        (
            COINGECKO,
            vec![Reply::Fixture("rates/coingecko_simple_price.json")],
        ),
        (
            KRAKEN,
            vec![Reply::Body(200, r#"{"error":[],"result":{}}"#.into())],
        ),
    ])
    .await;
    let book = book(&server);
    let fresh = book
        .rate(Asset::Eth, recorded_at() + Duration::minutes(4))
        .await
        .unwrap();
    assert_eq!(
        (fresh.usd_per_unit, fresh.source.as_str()),
        (d("3001.5"), "coingecko")
    );
    match book
        .rate(Asset::Eth, recorded_at() + Duration::minutes(6))
        .await
    {
        Err(RateError::NoFreshRate {
            asset: Asset::Eth,
            reasons,
            ..
        }) => {
            assert!(reasons.contains("coingecko quote is from"), "{reasons}");
            assert!(reasons.contains("kraken has no ETH quote"), "{reasons}");
        }
        other => panic!("expected no fresh rate, got {other:?}"),
    }
}

#[tokio::test]
async fn a_depegged_stablecoin_is_refused() {
    let server = ReplayServer::start(vec![
        (
            COINGECKO,
            vec![Reply::Fixture("rates/coingecko_simple_price_depeg.json")],
        ),
        (KRAKEN, vec![Reply::Body(503, "down".into())]),
    ])
    .await;
    let error = book(&server)
        .rate(Asset::Usdt, recorded_at())
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            RateError::Depegged {
                asset: Asset::Usdt,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("outside the peg band"));
}

#[tokio::test]
async fn transient_failures_are_retried() {
    let server = ReplayServer::start(vec![
        (
            COINGECKO,
            vec![
                Reply::Body(503, "busy".into()),
                Reply::Body(429, "slow down".into()),
                Reply::Fixture("rates/coingecko_simple_price.json"),
            ],
        ),
        (
            KRAKEN,
            vec![
                Reply::Body(500, "oops".into()),
                Reply::Fixture("rates/kraken_ticker.json"),
            ],
        ),
    ])
    .await;
    let rate = book(&server).rate(Asset::Sol, recorded_at()).await.unwrap();
    assert_eq!(
        rate.usd_per_unit,
        (d("150.25") + d("150.07")) / Decimal::TWO
    );
    assert_eq!(server.hits(COINGECKO), 3);
    assert_eq!(server.hits(KRAKEN), 2);
}

#[tokio::test]
async fn a_provider_that_keeps_failing_or_sends_garbage_gives_no_rate() {
    let server = ReplayServer::start(vec![
        (
            COINGECKO,
            vec![Reply::Body(200, "<html>maintenance</html>".into())],
        ),
        (KRAKEN, vec![Reply::Body(429, "slow down".into())]),
    ])
    .await;
    match book(&server).rate(Asset::Btc, recorded_at()).await {
        Err(RateError::NoFreshRate { reasons, .. }) => {
            assert!(reasons.contains("malformed"), "{reasons}");
            assert!(reasons.contains("HTTP 429"), "{reasons}");
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert_eq!(server.hits(KRAKEN), 3, "retried, then given up");
    assert_eq!(server.hits(COINGECKO), 1, "a malformed body is not retried");
}

#[tokio::test]
async fn recorded_quotes_name_their_file() {
    let path = std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/rates/recorded-quotes.json"
    ));
    let book = RateBook::new(
        vec![Arc::new(RecordedQuotes::new(path))],
        Duration::minutes(5),
        Decimal::new(2, 2),
        Duration::zero(),
    );
    let rate = book.rate(Asset::Btc, Utc::now()).await.unwrap();
    assert_eq!(rate.usd_per_unit, d("80000"));
    assert!(rate.source.starts_with("file:") && rate.source.ends_with("recorded-quotes.json"));
}

#[tokio::test]
async fn the_books_euro_is_the_median_of_both_providers() {
    let server = ReplayServer::start(vec![
        (
            COINGECKO,
            vec![Reply::Fixture("rates/coingecko_simple_price_eur.json")],
        ),
        (
            KRAKEN,
            vec![Reply::Fixture("rates/kraken_ticker_eurusd.json")],
        ),
    ])
    .await;
    let book = book(&server);
    let now = recorded_at() + Duration::seconds(30);
    let eur = book.fiat_rate("EUR", now, now).await.unwrap();
    // CoinGecko's cross rate 80012.34 / 68855.72 = 1.16202895 and Kraken's last trade 1.16205.
    assert_eq!(
        eur.usd_per_unit,
        (d("1.16202895") + d("1.16205")) / Decimal::TWO
    );
    assert_eq!(eur.source, "coingecko,kraken");
    assert!(matches!(
        book.fiat_rate("JPY", now, now).await,
        Err(RateError::NoRateAt { .. })
    ));
}

#[tokio::test]
async fn timed_recorded_quotes_pin_the_price_at_a_moment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("quotes.json");
    std::fs::write(
        &path,
        r#"{"quotes": {"LTC": "85"}, "usd_per_eur": "1.20",
            "timed": [{"at": "2026-11-01T00:00:00Z", "quotes": {"LTC": "90"}, "usd_per_eur": "1.10"},
                      {"at": "2026-11-15T00:00:00Z", "quotes": {"LTC": "95"}, "usd_per_eur": "1.15"}]}"#,
    )
    .unwrap();
    let book = RateBook::new(
        vec![Arc::new(RecordedQuotes::new(path)) as Arc<dyn RateSource>],
        Duration::minutes(5),
        Decimal::new(2, 2),
        Duration::zero(),
    );
    let now: DateTime<Utc> = "2026-12-01T00:00:00Z".parse().unwrap();
    let at = |text: &str| -> DateTime<Utc> { text.parse().unwrap() };
    let ltc = |when| book.market_rate(Asset::Ltc, when, now);
    assert_eq!(
        ltc(at("2026-11-10T12:00:00Z")).await.unwrap().usd_per_unit,
        d("90")
    );
    assert_eq!(
        ltc(at("2026-11-20T12:00:00Z")).await.unwrap().usd_per_unit,
        d("95")
    );
    assert_eq!(
        ltc(at("2026-10-20T12:00:00Z")).await.unwrap().usd_per_unit,
        d("85"),
        "before the first: the plain quotes"
    );
    let eur = book
        .fiat_rate("EUR", at("2026-11-16T00:00:00Z"), now)
        .await
        .unwrap();
    assert_eq!(
        (eur.usd_per_unit, eur.fetched_at),
        (d("1.15"), at("2026-11-15T00:00:00Z"))
    );
    assert_eq!(
        book.rate(Asset::Ltc, now).await.unwrap().usd_per_unit,
        d("85"),
        "rates lock at the plain quotes"
    );
}

#[tokio::test]
async fn a_late_valuation_takes_each_providers_price_at_the_moment() {
    let server = litecoin_history().await;
    let book = book(&server);
    let rate = book
        .market_rate(Asset::Ltc, receipt_at(), an_hour_later())
        .await
        .unwrap();
    // Kraken's 11:37 one-minute candle (vwap 83.94) and CoinGecko's point nearest the moment
    // (12:00:22.667, 84.0812345678); the live quotes had moved to 85.08 and 85.12.
    assert_eq!(
        rate.usd_per_unit,
        (d("83.94") + d("84.0812345678")) / Decimal::TWO
    );
    assert_eq!(rate.source, "kraken,coingecko");
    assert_eq!(
        rate.fetched_at,
        "2025-12-01T11:37:00Z".parse::<DateTime<Utc>>().unwrap(),
        "the older quote's own time"
    );
    assert_eq!(
        (server.hits(COINGECKO), server.hits(KRAKEN)),
        (0, 0),
        "never the live price"
    );
    assert_ne!(
        book.rate(Asset::Ltc, an_hour_later())
            .await
            .unwrap()
            .usd_per_unit,
        rate.usd_per_unit,
        "the market moved in the hour"
    );

    // Another moment of the same closed candles costs Kraken no request.
    let before = server.hits(KRAKEN_OHLC);
    book.market_rate(
        Asset::Ltc,
        receipt_at() + Duration::minutes(5),
        an_hour_later(),
    )
    .await
    .unwrap();
    assert_eq!(server.hits(KRAKEN_OHLC), before);
}

#[tokio::test]
async fn a_prompt_valuation_takes_the_live_quotes() {
    let server = litecoin_history().await;
    let now = recorded_at() + Duration::seconds(90);
    let rate = book(&server)
        .market_rate(Asset::Ltc, now - Duration::seconds(60), now)
        .await
        .unwrap();
    assert_eq!(rate.usd_per_unit, (d("85.08") + d("85.12")) / Decimal::TWO);
    assert_eq!(
        (server.hits(LITECOIN_CHART), server.hits(KRAKEN_OHLC)),
        (0, 0)
    );
}

#[tokio::test]
async fn a_moment_no_history_reaches_stays_unpriced() {
    let server = litecoin_history().await;
    let strict = book(&server);
    // Two days before the recorded histories: CoinGecko's nearest point is a day off, and
    // Kraken's five-minute candles for it are not in the answer.
    let long_before = receipt_at() - Duration::days(2);
    match strict
        .market_rate(Asset::Ltc, long_before, an_hour_later())
        .await
    {
        Err(RateError::NoRateAt {
            priced,
            at,
            reasons,
        }) => {
            assert_eq!((priced.as_str(), at), ("LTC", long_before));
            assert!(reasons.contains("coingecko's nearest price is from 2025-11-30T23:00:12.894+00:00, more than 3600 s from the moment"), "{reasons}");
            assert!(
                reasons.contains("kraken has no LTC price at that moment"),
                "{reasons}"
            );
        }
        other => panic!("expected no price, got {other:?}"),
    }

    // A tolerance of two days lets CoinGecko's point price it alone.
    let lenient = book_with_tolerance(&server, Duration::days(2));
    let rate = lenient
        .market_rate(Asset::Ltc, long_before, an_hour_later())
        .await
        .unwrap();
    assert_eq!(
        (rate.usd_per_unit, rate.source.as_str()),
        (d("82.9"), "coingecko")
    );

    // Providers whose history is down price nothing, and say why.
    let down = ReplayServer::start(vec![]).await;
    match book(&down)
        .market_rate(Asset::Ltc, receipt_at(), an_hour_later())
        .await
    {
        Err(RateError::NoRateAt { reasons, .. }) => {
            assert!(reasons.contains("HTTP 404"), "{reasons}")
        }
        other => panic!("expected no price, got {other:?}"),
    }
}

#[tokio::test]
async fn a_late_euro_is_each_providers_rate_at_the_moment() {
    let server = ReplayServer::start(vec![
        (
            BITCOIN_CHART,
            vec![
                Reply::Fixture("rates/coingecko_market_chart_range_bitcoin_usd.json"),
                Reply::Fixture("rates/coingecko_market_chart_range_bitcoin_eur.json"),
            ],
        ),
        (
            KRAKEN_OHLC,
            vec![Reply::Fixture("rates/kraken_ohlc_eurusd_1m.json")],
        ),
    ])
    .await;
    let eur = book(&server)
        .fiat_rate("EUR", receipt_at(), an_hour_later())
        .await
        .unwrap();
    // CoinGecko's cross rate at 12:00 (79650.75 / 68575.5 = 1.16150447) and Kraken's 11:37
    // EURUSD candle (vwap 1.16150).
    assert_eq!(
        eur.usd_per_unit,
        (d("1.16150447") + d("1.16150")) / Decimal::TWO
    );
    assert_eq!(eur.source, "kraken,coingecko");
}
