//! The real rate clients against a local server replaying the providers' recorded responses.

mod common;

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
        Err(RateError::NoFiatRate { .. })
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
