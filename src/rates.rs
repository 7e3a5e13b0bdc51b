//! USD prices of the seven assets: real providers over HTTPS, the median of the fresh quotes,
//! a staleness limit, and a peg band that refuses a depegged stablecoin.
//!
//! Prices are `Decimal` from the wire to the intent: providers that send JSON numbers are read
//! as raw text, never through a float.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use chrono::{DateTime, Utc};
use futures_util::future::{BoxFuture, join_all};
use payrecon_chain_core::{Asset, Secret};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Every asset a method pays in.
pub const QUOTED_ASSETS: [Asset; 7] = [
    Asset::Btc,
    Asset::Eth,
    Asset::Usdt,
    Asset::Usdc,
    Asset::Trx,
    Asset::Sol,
    Asset::Ltc,
];

/// Attempts per provider request before giving up: transient failures are retried with
/// exponential backoff, and a quote that never arrives is an error, not a guess.
const FETCH_ATTEMPTS: usize = 3;

/// Longest a provider may take to answer one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One price from one source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quote {
    /// The asset priced.
    pub asset: Asset,
    /// USD for one whole coin.
    pub usd_per_unit: Decimal,
    /// Who said so.
    pub source: String,
    /// When the source says the price was current.
    pub fetched_at: DateTime<Utc>,
}

/// The rate an intent locks until its deadline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockedRate {
    /// The asset priced.
    pub asset: Asset,
    /// USD for one whole coin: the median of the fresh quotes.
    pub usd_per_unit: Decimal,
    /// The sources whose quotes made the median, comma-separated.
    pub source: String,
    /// The oldest quote's time among those used.
    pub fetched_at: DateTime<Utc>,
}

/// A fiat currency's price in USD, for books that report in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FiatQuote {
    /// The currency priced (`EUR`).
    pub currency: String,
    /// USD for one unit of it.
    pub usd_per_unit: Decimal,
    /// Who said so (the sources of a median, comma-separated).
    pub source: String,
    /// When the price was current.
    pub fetched_at: DateTime<Utc>,
}

/// A price provider.
pub trait RateSource: Send + Sync + std::fmt::Debug {
    /// The name quotes carry.
    fn name(&self) -> &str;
    /// Current quotes for as many of [`QUOTED_ASSETS`] as the source prices.
    fn fetch(&self) -> BoxFuture<'_, Result<Vec<Quote>, RateError>>;
    /// Whether the source keeps a history: it answers [`RateSource::fetch_at`] with the quotes
    /// in effect then, however old. A live source knows only the present.
    fn keeps_history(&self) -> bool {
        false
    }
    /// The quotes in effect at `at`; a source without a history answers with its current ones.
    fn fetch_at(&self, _at: DateTime<Utc>) -> BoxFuture<'_, Result<Vec<Quote>, RateError>> {
        self.fetch()
    }
    /// USD for one unit of `currency` (in effect at `at`, for a source with a history), or
    /// `None` when the source does not price it.
    fn fetch_fiat(
        &self,
        _currency: &str,
        _at: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<Option<FiatQuote>, RateError>> {
        Box::pin(async { Ok(None) })
    }
}

/// Why no usable rate could be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    /// A provider could not be reached or answered with an error status.
    #[error("rate source {source_name}: {message}")]
    Unavailable {
        /// The provider.
        source_name: String,
        /// What went wrong.
        message: String,
    },
    /// A provider answered something that is not its documented format.
    #[error("rate source {source_name} sent a malformed response: {message}")]
    Malformed {
        /// The provider.
        source_name: String,
        /// What is wrong with it.
        message: String,
    },
    /// No source had a quote for the asset recent enough.
    #[error("no fresh {asset} rate (limit {max_age_seconds} s): {reasons}")]
    NoFreshRate {
        /// The asset.
        asset: Asset,
        /// The staleness limit.
        max_age_seconds: i64,
        /// Why each source's quote was not used.
        reasons: String,
    },
    /// A stablecoin's price is outside the configured band around 1 USD.
    #[error("{asset} is quoted at {usd_per_unit} USD, outside the peg band of ±{band_percent}%")]
    Depegged {
        /// The stablecoin.
        asset: Asset,
        /// Its median price.
        usd_per_unit: Decimal,
        /// The allowed deviation.
        band_percent: Decimal,
    },
    /// No rate source is configured.
    #[error("no rate source is configured")]
    NoSources,
    /// No source prices the fiat currency.
    #[error("no rate source prices {currency}: {reasons}")]
    NoFiatRate {
        /// The currency.
        currency: String,
        /// Why each source gave none.
        reasons: String,
    },
}

impl RateError {
    fn transient(&self) -> bool {
        matches!(self, RateError::Unavailable { .. })
    }
}

/// A source's last answer and when it was asked.
type CachedAnswer = (DateTime<Utc>, Result<Vec<Quote>, RateError>);

/// Quotes from several sources combined under the shop's rules.
#[derive(Debug)]
pub struct RateBook {
    sources: Vec<Arc<dyn RateSource>>,
    max_age: chrono::Duration,
    peg_band: Decimal,
    cache_for: chrono::Duration,
    cache: Mutex<BTreeMap<String, CachedAnswer>>,
}

impl RateBook {
    /// A book over `sources`; quotes older than `max_age` are stale; a stablecoin more than
    /// `peg_band` (a fraction, 0.02 = 2 %) from 1 USD is refused; a source is asked again only
    /// after `cache_for`, which is capped at half of `max_age` so that a cached answer is
    /// always refreshed before its quotes could turn stale.
    pub fn new(
        sources: Vec<Arc<dyn RateSource>>,
        max_age: chrono::Duration,
        peg_band: Decimal,
        cache_for: chrono::Duration,
    ) -> RateBook {
        RateBook {
            sources,
            max_age,
            peg_band,
            cache_for: cache_for.min(max_age / 2),
            cache: Mutex::new(BTreeMap::new()),
        }
    }

    /// The rate to lock for `asset` now: the median of every source's fresh quote.
    pub async fn rate(&self, asset: Asset, now: DateTime<Utc>) -> Result<LockedRate, RateError> {
        if self.sources.is_empty() {
            return Err(RateError::NoSources);
        }
        let answers = join_all(
            self.sources
                .iter()
                .map(|source| self.quotes_of(source, now)),
        )
        .await;
        let answers = self.sources.iter().zip(answers).map(|(s, a)| (s, a, false));
        let (usd_per_unit, source, fetched_at) = self.median_quote(asset, answers, now)?;
        if asset.is_usd_stablecoin() && (usd_per_unit - Decimal::ONE).abs() > self.peg_band {
            return Err(RateError::Depegged {
                asset,
                usd_per_unit,
                band_percent: self.peg_band * Decimal::ONE_HUNDRED,
            });
        }
        Ok(LockedRate {
            asset,
            usd_per_unit,
            source,
            fetched_at,
        })
    }

    /// The market price of `asset` at `at`, for the books: the median over the sources, each
    /// answering with the quote in effect at `at` if it keeps a history, else with a fresh
    /// current quote. No peg band: a depegged stablecoin is worth what the market says.
    pub async fn market_rate(
        &self,
        asset: Asset,
        at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<LockedRate, RateError> {
        if self.sources.is_empty() {
            return Err(RateError::NoSources);
        }
        let mut answers = Vec::with_capacity(self.sources.len());
        for source in &self.sources {
            let historic = source.keeps_history();
            let answer = if historic {
                source.fetch_at(at).await
            } else {
                self.quotes_of(source, now).await
            };
            answers.push((source, answer, historic));
        }
        let (usd_per_unit, source, fetched_at) = self.median_quote(asset, answers, now)?;
        Ok(LockedRate {
            asset,
            usd_per_unit,
            source,
            fetched_at,
        })
    }

    /// USD per unit of the fiat `currency` at `at`: the median of what the sources say.
    pub async fn fiat_rate(
        &self,
        currency: &str,
        at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<FiatQuote, RateError> {
        let mut fresh = Vec::new();
        let mut reasons = Vec::new();
        for source in &self.sources {
            // A source with a history answers with the price in effect at `at`, however old.
            let historic = source.keeps_history();
            match source.fetch_fiat(currency, at).await {
                Err(error) => reasons.push(error.to_string()),
                Ok(None) => reasons.push(format!("{} has no {currency} quote", source.name())),
                Ok(Some(q)) if q.usd_per_unit <= Decimal::ZERO => {
                    reasons.push(format!("{} quote is not positive", source.name()))
                }
                Ok(Some(q)) if !historic && now - q.fetched_at > self.max_age => {
                    reasons.push(format!("{} quote is stale", source.name()))
                }
                Ok(Some(q)) => fresh.push((q.usd_per_unit, q.source, q.fetched_at)),
            }
        }
        let (usd_per_unit, source, fetched_at) =
            median(fresh).ok_or_else(|| RateError::NoFiatRate {
                currency: currency.to_owned(),
                reasons: reasons.join("; "),
            })?;
        Ok(FiatQuote {
            currency: currency.to_owned(),
            usd_per_unit,
            source,
            fetched_at,
        })
    }

    /// The median of the sources' quotes for `asset`: each answer's quote is used unless it
    /// is missing, not positive, or (from a source without a history) older than `max_age`;
    /// why each was not used is the error when none is.
    fn median_quote<'a>(
        &self,
        asset: Asset,
        answers: impl IntoIterator<
            Item = (&'a Arc<dyn RateSource>, Result<Vec<Quote>, RateError>, bool),
        >,
        now: DateTime<Utc>,
    ) -> Result<(Decimal, String, DateTime<Utc>), RateError> {
        let mut fresh = Vec::new();
        let mut reasons = Vec::new();
        for (source, answer, historic) in answers {
            match answer.map(|quotes| quotes.into_iter().find(|q| q.asset == asset)) {
                Err(error) => reasons.push(error.to_string()),
                Ok(None) => reasons.push(format!("{} has no {asset} quote", source.name())),
                Ok(Some(q)) if !historic && now - q.fetched_at > self.max_age => {
                    reasons.push(format!(
                        "{} quote is from {}",
                        source.name(),
                        q.fetched_at.to_rfc3339()
                    ))
                }
                Ok(Some(q)) if q.usd_per_unit <= Decimal::ZERO => {
                    reasons.push(format!("{} quote is not positive", source.name()))
                }
                Ok(Some(q)) => fresh.push((q.usd_per_unit, q.source, q.fetched_at)),
            }
        }
        median(fresh).ok_or_else(|| RateError::NoFreshRate {
            asset,
            max_age_seconds: self.max_age.num_seconds(),
            reasons: reasons.join("; "),
        })
    }

    async fn quotes_of(
        &self,
        source: &Arc<dyn RateSource>,
        now: DateTime<Utc>,
    ) -> Result<Vec<Quote>, RateError> {
        if let Some((at, answer)) = self.cache.lock().expect("cache lock").get(source.name())
            && now - *at < self.cache_for
        {
            return answer.clone();
        }
        let answer = source.fetch().await;
        self.cache
            .lock()
            .expect("cache lock")
            .insert(source.name().to_owned(), (now, answer.clone()));
        answer
    }
}

/// The median price of `quotes` (price, source, time), naming every source and the oldest
/// time among them; `None` when there is none.
fn median(
    mut quotes: Vec<(Decimal, String, DateTime<Utc>)>,
) -> Option<(Decimal, String, DateTime<Utc>)> {
    if quotes.is_empty() {
        return None;
    }
    quotes.sort_by_key(|(price, _, _)| *price);
    let middle = quotes.len() / 2;
    let price = if quotes.len() % 2 == 1 {
        quotes[middle].0
    } else {
        (quotes[middle - 1].0 + quotes[middle].0) / Decimal::TWO
    };
    let sources: Vec<&str> = quotes
        .iter()
        .map(|(_, source, _)| source.as_str())
        .collect();
    let oldest = quotes.iter().map(|(_, _, at)| *at).min()?;
    Some((price.normalize(), sources.join(","), oldest))
}

/// Retries `request` on transient failures with exponential backoff.
async fn with_retries<T, F, Fut>(request: F) -> Result<T, RateError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, RateError>>,
{
    request
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(100))
                .with_max_times(FETCH_ATTEMPTS - 1),
        )
        .when(RateError::transient)
        .await
}

/// The largest answer of a price source read: a quote is a few hundred bytes.
const MAX_QUOTE_BYTES: usize = 1 << 20;

/// GETs `url` and returns the body of a 2xx answer; other statuses and transport errors are
/// `Unavailable` (retried), a body that is not text is `Malformed`.
async fn get_text(
    client: &reqwest::Client,
    source_name: &str,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<String, RateError> {
    let unavailable = |message: String| RateError::Unavailable {
        source_name: source_name.to_owned(),
        message,
    };
    let mut request = client.get(url).timeout(REQUEST_TIMEOUT);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    // The error never names the URL: a provider's key can sit in its path or query.
    let response = request
        .send()
        .await
        .map_err(|e| unavailable(e.without_url().to_string()))?;
    let status = response.status();
    let body = payrecon_chain_core::http::read_text(response, MAX_QUOTE_BYTES)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    if !status.is_success() {
        return Err(unavailable(format!("HTTP {status}")));
    }
    Ok(body)
}

/// A JSON number or string, as exact text, into a `Decimal`.
fn decimal_of(raw: &str) -> Option<Decimal> {
    let text = raw.trim().trim_matches('"');
    Decimal::from_str(text)
        .or_else(|_| Decimal::from_scientific(text))
        .ok()
}

/// CoinGecko's `/api/v3/simple/price` (documented public API).
#[derive(Debug)]
pub struct CoinGecko {
    client: reqwest::Client,
    base_url: String,
    api_key: Option<Secret>,
}

impl CoinGecko {
    /// The provider's public base URL.
    pub const DEFAULT_URL: &'static str = "https://api.coingecko.com";

    /// A client of the API at `base_url`, with an optional demo API key.
    pub fn new(client: reqwest::Client, base_url: &str, api_key: Option<Secret>) -> CoinGecko {
        CoinGecko {
            client,
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
        }
    }

    fn coin_id(asset: Asset) -> &'static str {
        match asset {
            Asset::Btc => "bitcoin",
            Asset::Eth => "ethereum",
            Asset::Usdt => "tether",
            Asset::Usdc => "usd-coin",
            Asset::Trx => "tron",
            Asset::Sol => "solana",
            Asset::Ltc => "litecoin",
        }
    }

    fn malformed(message: String) -> RateError {
        RateError::Malformed {
            source_name: "coingecko".into(),
            message: payrecon_chain_core::excerpt(&message).into_owned(),
        }
    }

    fn parse(body: &str) -> Result<Vec<Quote>, RateError> {
        #[derive(Deserialize)]
        struct Price<'a> {
            #[serde(borrow)]
            usd: &'a RawValue,
            last_updated_at: i64,
        }
        let malformed = Self::malformed;
        let prices: BTreeMap<&str, Price> =
            serde_json::from_str(body).map_err(|e| malformed(e.to_string()))?;
        let mut quotes = Vec::new();
        for asset in QUOTED_ASSETS {
            let Some(price) = prices.get(Self::coin_id(asset)) else {
                continue;
            };
            let usd_per_unit = decimal_of(price.usd.get())
                .ok_or_else(|| malformed(format!("price {} of {asset}", price.usd.get())))?;
            let fetched_at = DateTime::from_timestamp(price.last_updated_at, 0)
                .ok_or_else(|| malformed(format!("timestamp {}", price.last_updated_at)))?;
            quotes.push(Quote {
                asset,
                usd_per_unit,
                source: "coingecko".into(),
                fetched_at,
            });
        }
        Ok(quotes)
    }

    /// `GET /api/v3/simple/price` for coins `ids` in `vs_currencies`, with the API key when
    /// one is configured, retried on transient failures.
    async fn simple_price(&self, ids: &str, vs_currencies: &str) -> Result<String, RateError> {
        let url = format!(
            "{}/api/v3/simple/price?ids={ids}&vs_currencies={vs_currencies}&include_last_updated_at=true",
            self.base_url
        );
        let headers: Vec<(&str, &str)> = self
            .api_key
            .as_ref()
            .map(|key| ("x-cg-demo-api-key", key.expose()))
            .into_iter()
            .collect();
        with_retries(|| get_text(&self.client, "coingecko", &url, &headers)).await
    }

    fn parse_eur(body: &str) -> Result<FiatQuote, RateError> {
        #[derive(Deserialize)]
        struct Prices<'a> {
            #[serde(borrow)]
            usd: &'a RawValue,
            #[serde(borrow)]
            eur: &'a RawValue,
            last_updated_at: i64,
        }
        let malformed = Self::malformed;
        let answer: BTreeMap<&str, Prices> =
            serde_json::from_str(body).map_err(|e| malformed(e.to_string()))?;
        let prices = answer
            .get("bitcoin")
            .ok_or_else(|| malformed("no bitcoin prices".into()))?;
        let usd = decimal_of(prices.usd.get()).ok_or_else(|| malformed("usd price".into()))?;
        let eur = decimal_of(prices.eur.get()).ok_or_else(|| malformed("eur price".into()))?;
        let usd_per_unit = usd
            .checked_div(eur)
            .ok_or_else(|| malformed("eur price is zero".into()))?
            .round_dp(8);
        Ok(FiatQuote {
            currency: "EUR".into(),
            usd_per_unit,
            source: "coingecko".into(),
            fetched_at: DateTime::from_timestamp(prices.last_updated_at, 0)
                .ok_or_else(|| malformed("timestamp".into()))?,
        })
    }
}

impl RateSource for CoinGecko {
    fn name(&self) -> &str {
        "coingecko"
    }

    fn fetch(&self) -> BoxFuture<'_, Result<Vec<Quote>, RateError>> {
        Box::pin(async move {
            let ids: Vec<&str> = QUOTED_ASSETS.iter().map(|a| Self::coin_id(*a)).collect();
            let body = self.simple_price(&ids.join(","), "usd").await?;
            Self::parse(&body)
        })
    }

    /// EUR from bitcoin's price in USD and in EUR (`vs_currencies=usd,eur`): CoinGecko's
    /// cross rate of its most liquid coin.
    fn fetch_fiat(
        &self,
        currency: &str,
        _at: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<Option<FiatQuote>, RateError>> {
        let currency = currency.to_owned();
        Box::pin(async move {
            if currency != "EUR" {
                return Ok(None);
            }
            let body = self.simple_price("bitcoin", "usd,eur").await?;
            Self::parse_eur(&body).map(Some)
        })
    }
}

/// Kraken's public `/0/public/Ticker` (documented REST API); prices come as strings.
#[derive(Debug)]
pub struct Kraken {
    client: reqwest::Client,
    base_url: String,
}

impl Kraken {
    /// The provider's public base URL.
    pub const DEFAULT_URL: &'static str = "https://api.kraken.com";

    /// The pairs asked for, and the result keys Kraken answers them under.
    const PAIRS: [(Asset, &'static str, &'static str); 7] = [
        (Asset::Btc, "XBTUSD", "XXBTZUSD"),
        (Asset::Eth, "ETHUSD", "XETHZUSD"),
        (Asset::Usdt, "USDTUSD", "USDTZUSD"),
        (Asset::Usdc, "USDCUSD", "USDCUSD"),
        (Asset::Trx, "TRXUSD", "TRXUSD"),
        (Asset::Sol, "SOLUSD", "SOLUSD"),
        (Asset::Ltc, "LTCUSD", "XLTCZUSD"),
    ];

    /// A client of the API at `base_url`.
    pub fn new(client: reqwest::Client, base_url: &str) -> Kraken {
        Kraken {
            client,
            base_url: base_url.trim_end_matches('/').to_owned(),
        }
    }

    /// Each pair's last trade price, keyed as Kraken answers.
    fn last_trades(body: &str) -> Result<BTreeMap<String, Decimal>, RateError> {
        #[derive(Deserialize)]
        struct Ticker {
            /// Last trade: [price, lot volume].
            c: Vec<String>,
        }
        #[derive(Deserialize)]
        struct Answer {
            error: Vec<String>,
            #[serde(default)]
            result: BTreeMap<String, Ticker>,
        }
        let answer: Answer =
            serde_json::from_str(body).map_err(|e| Self::malformed(e.to_string()))?;
        if !answer.error.is_empty() {
            return Err(RateError::Unavailable {
                source_name: "kraken".into(),
                message: payrecon_chain_core::excerpt(&answer.error.join(", ")).into_owned(),
            });
        }
        answer
            .result
            .into_iter()
            .map(|(key, ticker)| {
                let price = ticker
                    .c
                    .first()
                    .and_then(|p| decimal_of(p))
                    .ok_or_else(|| Self::malformed(format!("last trade of {key}")))?;
                Ok((key, price))
            })
            .collect()
    }

    fn malformed(message: String) -> RateError {
        RateError::Malformed {
            source_name: "kraken".into(),
            message: payrecon_chain_core::excerpt(&message).into_owned(),
        }
    }

    fn last_trade(body: &str, key: &str) -> Result<Decimal, RateError> {
        Self::last_trades(body)?
            .remove(key)
            .ok_or_else(|| Self::malformed(format!("no {key} in the answer")))
    }

    fn parse(body: &str, fetched_at: DateTime<Utc>) -> Result<Vec<Quote>, RateError> {
        let prices = Self::last_trades(body)?;
        let mut quotes = Vec::new();
        for (asset, _, key) in Self::PAIRS {
            let Some(&price) = prices.get(key) else {
                continue;
            };
            quotes.push(Quote {
                asset,
                usd_per_unit: price,
                source: "kraken".into(),
                fetched_at,
            });
        }
        Ok(quotes)
    }
}

impl RateSource for Kraken {
    fn name(&self) -> &str {
        "kraken"
    }

    /// Kraken's ticker carries no timestamp: a last trade price is current when served.
    fn fetch(&self) -> BoxFuture<'_, Result<Vec<Quote>, RateError>> {
        Box::pin(async move {
            let pairs: Vec<&str> = Self::PAIRS.iter().map(|(_, pair, _)| *pair).collect();
            let url = format!("{}/0/public/Ticker?pair={}", self.base_url, pairs.join(","));
            let body = with_retries(|| get_text(&self.client, "kraken", &url, &[])).await?;
            Self::parse(&body, Utc::now())
        })
    }

    /// EUR from Kraken's `EURUSD` pair (answered as `ZEURZUSD`): USD per euro, last trade.
    fn fetch_fiat(
        &self,
        currency: &str,
        _at: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<Option<FiatQuote>, RateError>> {
        let currency = currency.to_owned();
        Box::pin(async move {
            if currency != "EUR" {
                return Ok(None);
            }
            let url = format!("{}/0/public/Ticker?pair=EURUSD", self.base_url);
            let body = with_retries(|| get_text(&self.client, "kraken", &url, &[])).await?;
            let price = Self::last_trade(&body, "ZEURZUSD")?;
            Ok(Some(FiatQuote {
                currency,
                usd_per_unit: price,
                source: "kraken".into(),
                fetched_at: Utc::now(),
            }))
        })
    }
}

/// Quotes read from a file the configuration names: for offline runs and demos. Its quotes
/// carry the file's path as their source, so an intent priced from it says so.
#[derive(Debug)]
pub struct RecordedQuotes {
    path: PathBuf,
    name: String,
    /// The file as last read, and its modification time: read again only when it changed.
    parsed: Mutex<Option<(std::time::SystemTime, Arc<RecordedQuotesFile>)>>,
}

/// The recorded-quotes file: `{"quotes": {"BTC": "80000", …}}`, optionally with
/// `"fetched_at"` (without it the quotes count as read now) and `"usd_per_eur"`. `"timed"`
/// pins prices at moments for the books: each `{"at", "quotes", "usd_per_eur"}` is in effect
/// from its `at` until the next.
#[derive(Debug, Deserialize)]
struct RecordedQuotesFile {
    fetched_at: Option<DateTime<Utc>>,
    quotes: BTreeMap<Asset, Decimal>,
    usd_per_eur: Option<Decimal>,
    #[serde(default)]
    timed: Vec<TimedQuotes>,
}

#[derive(Debug, Deserialize)]
struct TimedQuotes {
    at: DateTime<Utc>,
    #[serde(default)]
    quotes: BTreeMap<Asset, Decimal>,
    usd_per_eur: Option<Decimal>,
}

impl RecordedQuotes {
    /// Quotes from the JSON file at `path`.
    pub fn new(path: PathBuf) -> RecordedQuotes {
        let name = format!("file:{}", path.display());
        RecordedQuotes {
            path,
            name,
            parsed: Mutex::new(None),
        }
    }
}

impl RecordedQuotes {
    async fn read(&self) -> Result<Arc<RecordedQuotesFile>, RateError> {
        let unavailable = |e: std::io::Error| RateError::Unavailable {
            source_name: self.name.clone(),
            message: e.to_string(),
        };
        // A stat, not a read, per call: the books' valuation pass asks once per entry. A
        // plain syscall, as tokio's would cost a trip to its blocking pool each time.
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .map_err(unavailable)?;
        if let Some((at, file)) = self.parsed.lock().expect("quotes lock").as_ref()
            && *at == modified
        {
            return Ok(file.clone());
        }
        let text = tokio::fs::read_to_string(&self.path)
            .await
            .map_err(unavailable)?;
        let file: Arc<RecordedQuotesFile> =
            Arc::new(
                serde_json::from_str(&text).map_err(|e| RateError::Malformed {
                    source_name: self.name.clone(),
                    message: e.to_string(),
                })?,
            );
        *self.parsed.lock().expect("quotes lock") = Some((modified, file.clone()));
        Ok(file)
    }

    fn quotes(&self, prices: &BTreeMap<Asset, Decimal>, at: DateTime<Utc>) -> Vec<Quote> {
        prices
            .iter()
            .map(|(asset, usd_per_unit)| Quote {
                asset: *asset,
                usd_per_unit: *usd_per_unit,
                source: self.name.clone(),
                fetched_at: at,
            })
            .collect()
    }
}

/// The last of `timed` in effect at `at`, if any.
fn in_effect(timed: &[TimedQuotes], at: DateTime<Utc>) -> Option<&TimedQuotes> {
    timed.iter().filter(|t| t.at <= at).max_by_key(|t| t.at)
}

impl RateSource for RecordedQuotes {
    fn name(&self) -> &str {
        &self.name
    }

    fn fetch(&self) -> BoxFuture<'_, Result<Vec<Quote>, RateError>> {
        Box::pin(async move {
            let file = self.read().await?;
            let fetched_at = file.fetched_at.unwrap_or_else(Utc::now);
            Ok(self.quotes(&file.quotes, fetched_at))
        })
    }

    /// The timed quotes in effect at `at`; before the first, the file's plain quotes.
    fn keeps_history(&self) -> bool {
        true
    }

    fn fetch_at(&self, at: DateTime<Utc>) -> BoxFuture<'_, Result<Vec<Quote>, RateError>> {
        Box::pin(async move {
            let file = self.read().await?;
            Ok(match in_effect(&file.timed, at) {
                Some(timed) => self.quotes(&timed.quotes, timed.at),
                None => self.quotes(&file.quotes, file.fetched_at.unwrap_or(at)),
            })
        })
    }

    fn fetch_fiat(
        &self,
        currency: &str,
        at: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<Option<FiatQuote>, RateError>> {
        let currency = currency.to_owned();
        Box::pin(async move {
            if currency != "EUR" {
                return Ok(None);
            }
            let file = self.read().await?;
            let (price, fetched_at) = match in_effect(&file.timed, at) {
                Some(TimedQuotes {
                    usd_per_eur: Some(price),
                    at,
                    ..
                }) => (Some(*price), *at),
                _ => (file.usd_per_eur, file.fetched_at.unwrap_or(at)),
            };
            Ok(price.map(|usd_per_unit| FiatQuote {
                currency,
                usd_per_unit,
                source: self.name.clone(),
                fetched_at,
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coingecko_numbers_are_read_exactly() {
        let body = r#"{"bitcoin":{"usd":80012.123456789012,"last_updated_at":1764670000},"tether":{"usd":1.0001,"last_updated_at":1764670000}}"#;
        let quotes = CoinGecko::parse(body).unwrap();
        assert_eq!(quotes[0].usd_per_unit.to_string(), "80012.123456789012");
        assert_eq!(quotes[1].asset, Asset::Usdt);
        assert!(matches!(
            CoinGecko::parse("<html>"),
            Err(RateError::Malformed { .. })
        ));
    }

    /// Quotes stamped when read, like the recorded file's; counts how often it is asked.
    #[derive(Debug, Default)]
    struct ReadNow(std::sync::atomic::AtomicUsize);

    impl RateSource for ReadNow {
        fn name(&self) -> &str {
            "read-now"
        }
        fn fetch(&self) -> BoxFuture<'_, Result<Vec<Quote>, RateError>> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async {
                Ok(vec![Quote {
                    asset: Asset::Btc,
                    usd_per_unit: Decimal::ONE_HUNDRED,
                    source: "read-now".into(),
                    fetched_at: Utc::now(),
                }])
            })
        }
    }

    #[tokio::test]
    async fn a_long_cache_is_refreshed_before_its_quotes_could_turn_stale() {
        let source = Arc::new(ReadNow::default());
        let book = RateBook::new(
            vec![source.clone()],
            chrono::Duration::seconds(300),
            Decimal::TWO,
            chrono::Duration::hours(1),
        );
        let now = Utc::now();
        book.rate(Asset::Btc, now).await.unwrap();
        book.rate(Asset::Btc, now + chrono::Duration::seconds(100))
            .await
            .unwrap();
        assert_eq!(
            source.0.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "cached"
        );
        book.rate(Asset::Btc, now + chrono::Duration::seconds(200))
            .await
            .unwrap();
        assert_eq!(
            source.0.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "asked again at half the staleness limit, not after an hour"
        );
    }

    #[test]
    fn coingecko_and_kraken_price_the_euro() {
        let body = r#"{"bitcoin":{"usd":86400,"eur":80000,"last_updated_at":1764670000}}"#;
        assert_eq!(
            CoinGecko::parse_eur(body).unwrap().usd_per_unit.to_string(),
            "1.08"
        );
        let body = r#"{"error":[],"result":{"ZEURZUSD":{"c":["1.0842","100"]}}}"#;
        assert_eq!(
            Kraken::last_trade(body, "ZEURZUSD").unwrap().to_string(),
            "1.0842"
        );
        assert!(Kraken::last_trade(body, "XXBTZUSD").is_err());
    }

    #[test]
    fn kraken_errors_are_reported() {
        let body = r#"{"error":["EGeneral:Temporary lockout"]}"#;
        assert!(matches!(
            Kraken::parse(body, Utc::now()),
            Err(RateError::Unavailable { .. })
        ));
    }
}
