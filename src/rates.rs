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

/// How a source knows the price at a past moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum History {
    /// Only the present: its quote values a moment only while the moment is within the
    /// staleness limit.
    None,
    /// Prices declared in effect over ranges of time (the recorded file): asked for every
    /// moment and used as they are.
    InEffect,
    /// Prices sampled at points or over candles (a provider's history): asked once the moment
    /// is past the staleness limit; a sample further from the moment than the book's
    /// tolerance is not used.
    Sampled,
}

/// A price provider.
pub trait RateSource: Send + Sync + std::fmt::Debug {
    /// The name quotes carry.
    fn name(&self) -> &str;
    /// Current quotes for as many of [`QUOTED_ASSETS`] as the source prices.
    fn fetch(&self) -> BoxFuture<'_, Result<Vec<Quote>, RateError>>;
    /// How the source knows the past.
    fn history(&self) -> History {
        History::None
    }
    /// The price of `asset` at `at` (asked at `now`) from the source's history, stamped with
    /// the time of the sample it comes from; `None` when the history has none.
    fn fetch_at(
        &self,
        _asset: Asset,
        _at: DateTime<Utc>,
        _now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<Option<Quote>, RateError>> {
        Box::pin(async { Ok(None) })
    }
    /// USD for one unit of `currency` now, or `None` when the source does not price it.
    fn fetch_fiat(&self, _currency: &str) -> BoxFuture<'_, Result<Option<FiatQuote>, RateError>> {
        Box::pin(async { Ok(None) })
    }
    /// USD for one unit of `currency` at `at` from the source's history, as
    /// [`RateSource::fetch_at`].
    fn fetch_fiat_at(
        &self,
        _currency: &str,
        _at: DateTime<Utc>,
        _now: DateTime<Utc>,
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
    /// No source could price the moment: none has a fresh live quote, or a sample of its
    /// history close enough to it.
    #[error("no {priced} price for {at}: {reasons}")]
    NoRateAt {
        /// The asset or currency.
        priced: String,
        /// The moment.
        at: DateTime<Utc>,
        /// Why each source's price was not used.
        reasons: String,
    },
    /// No rate source is configured.
    #[error("no rate source is configured")]
    NoSources,
}

impl RateError {
    fn transient(&self) -> bool {
        matches!(self, RateError::Unavailable { .. })
    }
}

/// A source's last answer and when it was asked.
type CachedAnswer = (DateTime<Utc>, Result<Vec<Quote>, RateError>);

/// The furthest a provider's sampled price may lie from the moment it values, unless the
/// configuration says otherwise: CoinGecko's history has a point per hour, Kraken's candles
/// are a minute to an hour long for the month a valuation can be late by.
pub const DEFAULT_HISTORY_TOLERANCE: chrono::Duration = chrono::Duration::hours(1);

/// Which answer of a source prices a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    /// The current quote: the moment is now, or within the staleness limit of it.
    Live,
    /// The price declared in effect at the moment.
    InEffect,
    /// The history's sample nearest the moment.
    Sampled,
}

/// Quotes from several sources combined under the shop's rules.
#[derive(Debug)]
pub struct RateBook {
    sources: Vec<Arc<dyn RateSource>>,
    max_age: chrono::Duration,
    peg_band: Decimal,
    cache_for: chrono::Duration,
    history_tolerance: chrono::Duration,
    cache: Mutex<BTreeMap<String, CachedAnswer>>,
}

impl RateBook {
    /// A book over `sources`; quotes older than `max_age` are stale; a stablecoin more than
    /// `peg_band` (a fraction, 0.02 = 2 %) from 1 USD is refused; a source is asked again only
    /// after `cache_for`, which is capped at half of `max_age` so that a cached answer is
    /// always refreshed before its quotes could turn stale. A provider's history may be
    /// [`DEFAULT_HISTORY_TOLERANCE`] from a moment; [`RateBook::with_history_tolerance`] sets
    /// another bound.
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
            history_tolerance: DEFAULT_HISTORY_TOLERANCE,
            cache: Mutex::new(BTreeMap::new()),
        }
    }

    /// The sources, as configured.
    pub fn sources(&self) -> &[Arc<dyn RateSource>] {
        &self.sources
    }

    /// The band a stablecoin's price must stay within around 1 USD, a fraction.
    pub fn peg_band(&self) -> Decimal {
        self.peg_band
    }

    /// The book, using a provider's historic price only when it lies within `tolerance` of the
    /// moment it values.
    pub fn with_history_tolerance(mut self, tolerance: chrono::Duration) -> RateBook {
        self.history_tolerance = tolerance;
        self
    }

    /// The rate to lock for `asset` now: the median of every source's fresh quote.
    pub async fn rate(&self, asset: Asset, now: DateTime<Utc>) -> Result<LockedRate, RateError> {
        if self.sources.is_empty() {
            return Err(RateError::NoSources);
        }
        let answers = join_all(
            self.sources
                .iter()
                .map(|source| self.live_quote(source, asset, now)),
        )
        .await;
        let (fresh, reasons) = self.usable(
            self.sources
                .iter()
                .zip(answers)
                .map(|(s, a)| (s, a, Way::Live)),
            now,
            now,
        );
        let (usd_per_unit, source, fetched_at) =
            median(fresh).ok_or_else(|| RateError::NoFreshRate {
                asset,
                max_age_seconds: self.max_age.num_seconds(),
                reasons,
            })?;
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

    /// The market price of `asset` at the moment `at`, for the books: the median over the
    /// sources of their price at that moment. A moment within the staleness limit of `now`
    /// takes the live quotes; an older one each source's history, never a later price. No peg
    /// band: a depegged stablecoin is worth what the market says.
    pub async fn market_rate(
        &self,
        asset: Asset,
        at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<LockedRate, RateError> {
        if self.sources.is_empty() {
            return Err(RateError::NoSources);
        }
        let answers = join_all(self.sources.iter().map(|source| async move {
            let way = self.way_for(source.as_ref(), at, now);
            let answer = match way {
                Way::Live => self.live_quote(source, asset, now).await,
                Way::InEffect | Way::Sampled => source.fetch_at(asset, at, now).await.map(|q| {
                    q.map(|q| (q.usd_per_unit, q.source, q.fetched_at))
                        .ok_or_else(|| {
                            format!("{} has no {asset} price at that moment", source.name())
                        })
                }),
            };
            (source, answer, way)
        }))
        .await;
        let (fresh, reasons) = self.usable(answers, at, now);
        let (usd_per_unit, source, fetched_at) =
            median(fresh).ok_or_else(|| RateError::NoRateAt {
                priced: asset.to_string(),
                at,
                reasons,
            })?;
        Ok(LockedRate {
            asset,
            usd_per_unit,
            source,
            fetched_at,
        })
    }

    /// USD per unit of the fiat `currency` at the moment `at`: the median of what the sources
    /// say, asked as [`RateBook::market_rate`] asks.
    pub async fn fiat_rate(
        &self,
        currency: &str,
        at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<FiatQuote, RateError> {
        let answers = join_all(self.sources.iter().map(|source| async move {
            let way = self.way_for(source.as_ref(), at, now);
            let answer = match way {
                Way::Live => source.fetch_fiat(currency).await,
                Way::InEffect | Way::Sampled => source.fetch_fiat_at(currency, at, now).await,
            };
            let answer = answer.map(|q| {
                q.map(|q| (q.usd_per_unit, q.source, q.fetched_at))
                    .ok_or_else(|| format!("{} has no {currency} quote", source.name()))
            });
            (source, answer, way)
        }))
        .await;
        let (fresh, reasons) = self.usable(answers, at, now);
        let (usd_per_unit, source, fetched_at) =
            median(fresh).ok_or_else(|| RateError::NoRateAt {
                priced: currency.to_owned(),
                at,
                reasons,
            })?;
        Ok(FiatQuote {
            currency: currency.to_owned(),
            usd_per_unit,
            source,
            fetched_at,
        })
    }

    /// The answer of `source` that prices the moment `at`, seen at `now`.
    fn way_for(&self, source: &dyn RateSource, at: DateTime<Utc>, now: DateTime<Utc>) -> Way {
        match source.history() {
            History::InEffect => Way::InEffect,
            History::Sampled if now - at > self.max_age => Way::Sampled,
            History::Sampled | History::None => Way::Live,
        }
    }

    /// The prices (price, source, time) among the sources' answers that may value the moment
    /// `at` seen at `now`, and why each other was not used. A live quote must be fresh and the
    /// moment recent; a sample must lie within the tolerance of the moment; a price must be
    /// positive.
    fn usable<'a>(
        &self,
        answers: impl IntoIterator<
            Item = (
                &'a Arc<dyn RateSource>,
                Result<Result<Priced, String>, RateError>,
                Way,
            ),
        >,
        at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> (Vec<Priced>, String) {
        let mut fresh = Vec::new();
        let mut reasons = Vec::new();
        for (source, answer, way) in answers {
            let name = source.name();
            let price = match answer {
                Err(error) => {
                    reasons.push(error.to_string());
                    continue;
                }
                Ok(Err(missing)) => {
                    reasons.push(missing);
                    continue;
                }
                Ok(Ok(price)) => price,
            };
            let quoted = price.2;
            let refused = match way {
                Way::Live if now - at > self.max_age => Some(format!(
                    "{name} keeps no history, and the moment is {} s past",
                    (now - at).num_seconds()
                )),
                Way::Live if now - quoted > self.max_age => {
                    Some(format!("{name} quote is from {}", quoted.to_rfc3339()))
                }
                Way::Sampled if (quoted - at).abs() > self.history_tolerance => Some(format!(
                    "{name}'s nearest price is from {}, more than {} s from the moment",
                    quoted.to_rfc3339(),
                    self.history_tolerance.num_seconds()
                )),
                _ if price.0 <= Decimal::ZERO => Some(format!("{name} quote is not positive")),
                _ => None,
            };
            match refused {
                Some(reason) => reasons.push(reason),
                None => fresh.push(price),
            }
        }
        (fresh, reasons.join("; "))
    }

    /// The current quote of `asset` from `source`, through the cache.
    async fn live_quote(
        &self,
        source: &Arc<dyn RateSource>,
        asset: Asset,
        now: DateTime<Utc>,
    ) -> Result<Result<Priced, String>, RateError> {
        Ok(self
            .quotes_of(source, now)
            .await?
            .into_iter()
            .find(|q| q.asset == asset)
            .map(|q| (q.usd_per_unit, q.source, q.fetched_at))
            .ok_or_else(|| format!("{} has no {asset} quote", source.name())))
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

/// A price, the source that gave it and the time it was current.
type Priced = (Decimal, String, DateTime<Utc>);

/// The median price of `quotes`, naming every source and the oldest time among them; `None`
/// when there is none.
fn median(mut quotes: Vec<Priced>) -> Option<Priced> {
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

/// The largest answer of a price source read: a quote is a few hundred bytes, a day of
/// history or Kraken's 720 candles some tens of kilobytes.
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

/// A sample of a provider's history: when the price was current, and the price.
type Sample = (DateTime<Utc>, Decimal);

/// How many answers about the past a provider keeps before it forgets the oldest.
const PAST_ANSWERS_KEPT: usize = 256;

/// A provider's answers about the past that can no longer change (a whole day's points, the
/// closed candles), kept: a valuation pass after an outage asks about many moments of the same
/// days, and each answer costs a request against the provider's rate limit.
#[derive(Debug, Default)]
struct PastAnswers(Mutex<BTreeMap<String, Arc<Vec<Sample>>>>);

impl PastAnswers {
    fn get(&self, key: &str) -> Option<Arc<Vec<Sample>>> {
        self.0.lock().expect("past answers lock").get(key).cloned()
    }

    fn keep(&self, key: String, samples: Arc<Vec<Sample>>) {
        let mut kept = self.0.lock().expect("past answers lock");
        if kept.len() >= PAST_ANSWERS_KEPT && !kept.contains_key(&key) {
            kept.pop_first();
        }
        kept.insert(key, samples);
    }
}

/// CoinGecko's documented public API: `/api/v3/simple/price` for the present,
/// `/api/v3/coins/{id}/market_chart/range` for the past.
#[derive(Debug)]
pub struct CoinGecko {
    client: reqwest::Client,
    base_url: String,
    api_key: Option<Secret>,
    days: PastAnswers,
}

impl CoinGecko {
    /// A client of the API at `base_url`, with an optional demo API key.
    pub fn new(client: reqwest::Client, base_url: &str, api_key: Option<Secret>) -> CoinGecko {
        CoinGecko {
            client,
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            days: PastAnswers::default(),
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

    /// GETs `path_and_query`, with the API key when one is configured, retried on transient
    /// failures.
    async fn get(&self, path_and_query: &str) -> Result<String, RateError> {
        let url = format!("{}{path_and_query}", self.base_url);
        let headers: Vec<(&str, &str)> = self
            .api_key
            .as_ref()
            .map(|key| ("x-cg-demo-api-key", key.expose()))
            .into_iter()
            .collect();
        with_retries(|| get_text(&self.client, "coingecko", &url, &headers)).await
    }

    /// `simple/price` for coins `ids` in `vs_currencies`.
    async fn simple_price(&self, ids: &str, vs_currencies: &str) -> Result<String, RateError> {
        self.get(&format!(
            "/api/v3/simple/price?ids={ids}&vs_currencies={vs_currencies}&include_last_updated_at=true"
        ))
        .await
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
        Ok(FiatQuote {
            currency: "EUR".into(),
            usd_per_unit: Self::usd_per_eur(usd, eur)?,
            source: "coingecko".into(),
            fetched_at: DateTime::from_timestamp(prices.last_updated_at, 0)
                .ok_or_else(|| malformed("timestamp".into()))?,
        })
    }

    /// USD per euro from bitcoin's price in both: CoinGecko's cross rate of its most liquid
    /// coin.
    fn usd_per_eur(bitcoin_usd: Decimal, bitcoin_eur: Decimal) -> Result<Decimal, RateError> {
        Ok(bitcoin_usd
            .checked_div(bitcoin_eur)
            .ok_or_else(|| Self::malformed("eur price is zero".into()))?
            .round_dp(8))
    }

    /// The `prices` of a `market_chart/range` answer: `[[unix milliseconds, price], …]`.
    fn parse_chart(body: &str) -> Result<Vec<Sample>, RateError> {
        #[derive(Deserialize)]
        struct Chart<'a> {
            #[serde(borrow)]
            prices: Vec<(&'a RawValue, &'a RawValue)>,
        }
        let chart: Chart =
            serde_json::from_str(body).map_err(|e| Self::malformed(e.to_string()))?;
        chart
            .prices
            .into_iter()
            .map(|(millis, price)| {
                let at = decimal_of(millis.get())
                    .and_then(|m| i64::try_from(m.trunc().mantissa()).ok())
                    .and_then(DateTime::from_timestamp_millis)
                    .ok_or_else(|| Self::malformed(format!("time {}", millis.get())))?;
                let price = decimal_of(price.get())
                    .ok_or_else(|| Self::malformed(format!("price {}", price.get())))?;
                Ok((at, price))
            })
            .collect()
    }

    /// The price of coin `id` in `vs` nearest `at`: from the points of `at`'s UTC day and an
    /// hour either side, which CoinGecko gives hourly (5-minutely for the last day). A day
    /// answered in full is kept.
    async fn price_near(
        &self,
        id: &str,
        vs: &str,
        at: DateTime<Utc>,
    ) -> Result<Option<Sample>, RateError> {
        let day_start = at.timestamp() - at.timestamp().rem_euclid(86_400);
        let key = format!("{id}/{vs}/{day_start}");
        let points = match self.days.get(&key) {
            Some(points) => points,
            None => {
                let (from, to) = (day_start - 3600, day_start + 86_400 + 3600);
                let body = self
                    .get(&format!(
                        "/api/v3/coins/{id}/market_chart/range?vs_currency={vs}&from={from}&to={to}"
                    ))
                    .await?;
                let points = Arc::new(Self::parse_chart(&body)?);
                if points
                    .iter()
                    .any(|(t, _)| t.timestamp() >= day_start + 86_400)
                {
                    self.days.keep(key, points.clone());
                }
                points
            }
        };
        Ok(points.iter().min_by_key(|(t, _)| (*t - at).abs()).copied())
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

    fn history(&self) -> History {
        History::Sampled
    }

    /// The point of `market_chart/range` nearest the moment.
    fn fetch_at(
        &self,
        asset: Asset,
        at: DateTime<Utc>,
        _now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<Option<Quote>, RateError>> {
        Box::pin(async move {
            let point = self.price_near(Self::coin_id(asset), "usd", at).await?;
            Ok(point.map(|(fetched_at, usd_per_unit)| Quote {
                asset,
                usd_per_unit,
                source: "coingecko".into(),
                fetched_at,
            }))
        })
    }

    /// EUR from bitcoin's price in USD and in EUR (`vs_currencies=usd,eur`).
    fn fetch_fiat(&self, currency: &str) -> BoxFuture<'_, Result<Option<FiatQuote>, RateError>> {
        let wanted = currency == "EUR";
        Box::pin(async move {
            if !wanted {
                return Ok(None);
            }
            let body = self.simple_price("bitcoin", "usd,eur").await?;
            Self::parse_eur(&body).map(Some)
        })
    }

    /// EUR from bitcoin's points in USD and in EUR nearest the moment, stamped with the one
    /// further from it.
    fn fetch_fiat_at(
        &self,
        currency: &str,
        at: DateTime<Utc>,
        _now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<Option<FiatQuote>, RateError>> {
        let currency = currency.to_owned();
        Box::pin(async move {
            if currency != "EUR" {
                return Ok(None);
            }
            let usd = self.price_near("bitcoin", "usd", at).await?;
            let eur = self.price_near("bitcoin", "eur", at).await?;
            let (Some((usd_at, usd)), Some((eur_at, eur))) = (usd, eur) else {
                return Ok(None);
            };
            let fetched_at = [usd_at, eur_at]
                .into_iter()
                .max_by_key(|t| (*t - at).abs())
                .unwrap_or(usd_at);
            Ok(Some(FiatQuote {
                currency,
                usd_per_unit: Self::usd_per_eur(usd, eur)?,
                source: "coingecko".into(),
                fetched_at,
            }))
        })
    }
}

/// Kraken's public REST API: `/0/public/Ticker` for the present, `/0/public/OHLC` for the
/// past; prices come as strings.
#[derive(Debug)]
pub struct Kraken {
    client: reqwest::Client,
    base_url: String,
    closed_candles: PastAnswers,
}

/// Kraken's candle lengths in minutes up to a day; longer ones say little about a moment.
const OHLC_INTERVALS: [i64; 7] = [1, 5, 15, 30, 60, 240, 1440];

/// Kraken answers only the 720 most recent candles of an interval: a moment is looked for in
/// candles of the shortest interval whose last 700 reach back to it.
const OHLC_CANDLES_REACHED: i64 = 700;

impl Kraken {
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
            closed_candles: PastAnswers::default(),
        }
    }

    /// GETs `path_and_query`, retried on transient failures.
    async fn get(&self, path_and_query: &str) -> Result<String, RateError> {
        let url = format!("{}{path_and_query}", self.base_url);
        with_retries(|| get_text(&self.client, "kraken", &url, &[])).await
    }

    /// The `result` of an answer, or Kraken's own error.
    fn result(body: &str) -> Result<BTreeMap<String, Box<RawValue>>, RateError> {
        #[derive(Deserialize)]
        struct Answer {
            error: Vec<String>,
            #[serde(default)]
            result: BTreeMap<String, Box<RawValue>>,
        }
        let answer: Answer =
            serde_json::from_str(body).map_err(|e| Self::malformed(e.to_string()))?;
        if !answer.error.is_empty() {
            return Err(RateError::Unavailable {
                source_name: "kraken".into(),
                message: payrecon_chain_core::excerpt(&answer.error.join(", ")).into_owned(),
            });
        }
        Ok(answer.result)
    }

    /// Each pair's last trade price, keyed as Kraken answers.
    fn last_trades(body: &str) -> Result<BTreeMap<String, Decimal>, RateError> {
        #[derive(Deserialize)]
        struct Ticker {
            /// Last trade: [price, lot volume].
            c: Vec<String>,
        }
        Self::result(body)?
            .into_iter()
            .map(|(key, ticker)| {
                let ticker: Ticker = serde_json::from_str(ticker.get())
                    .map_err(|e| Self::malformed(format!("{key}: {e}")))?;
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

    /// The candles of `key` in an OHLC answer, oldest first, each as its start and its price:
    /// the volume-weighted average of its trades, or its close when it had none.
    fn parse_ohlc(body: &str, key: &str) -> Result<Vec<Sample>, RateError> {
        /// time, open, high, low, close, vwap, volume, count.
        type Candle = (i64, String, String, String, String, String, String, u64);
        let mut result = Self::result(body)?;
        let candles = result
            .remove(key)
            .ok_or_else(|| Self::malformed(format!("no {key} in the answer")))?;
        let candles: Vec<Candle> = serde_json::from_str(candles.get())
            .map_err(|e| Self::malformed(format!("{key}: {e}")))?;
        candles
            .into_iter()
            .map(|(time, _, _, _, close, vwap, volume, _)| {
                let start = DateTime::from_timestamp(time, 0)
                    .ok_or_else(|| Self::malformed(format!("candle time {time}")))?;
                let traded = decimal_of(&volume).is_some_and(|v| v > Decimal::ZERO);
                let price = decimal_of(if traded { &vwap } else { &close })
                    .ok_or_else(|| Self::malformed(format!("candle at {time} of {key}")))?;
                Ok((start, price))
            })
            .collect()
    }

    /// The price of `pair` (answered under `key`) over the candle containing `at`, asked at
    /// `now`, stamped with the candle's start. The closed candles of an answer are kept.
    async fn candle_at(
        &self,
        pair: &str,
        key: &str,
        at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Option<Sample>, RateError> {
        let age_minutes = (now - at).num_minutes().max(0);
        let Some(interval) = OHLC_INTERVALS
            .into_iter()
            .find(|minutes| age_minutes < OHLC_CANDLES_REACHED * minutes)
        else {
            return Ok(None);
        };
        let containing = |candles: &[Sample]| {
            candles
                .iter()
                .rev()
                .find(|(start, _)| {
                    *start <= at && at < *start + chrono::Duration::minutes(interval)
                })
                .copied()
        };
        let kept_key = format!("{pair}/{interval}");
        if let Some(closed) = self.closed_candles.get(&kept_key)
            && let Some(candle) = containing(&closed)
        {
            return Ok(Some(candle));
        }
        let start = at.timestamp() - at.timestamp().rem_euclid(interval * 60);
        let body = self
            .get(&format!(
                "/0/public/OHLC?pair={pair}&interval={interval}&since={}",
                start - 1
            ))
            .await?;
        let candles = Self::parse_ohlc(&body, key)?;
        // The last candle is the one still open: it can change, the others cannot.
        let closed = &candles[..candles.len().saturating_sub(1)];
        self.closed_candles
            .keep(kept_key, Arc::new(closed.to_vec()));
        Ok(containing(&candles))
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
            let body = self
                .get(&format!("/0/public/Ticker?pair={}", pairs.join(",")))
                .await?;
            Self::parse(&body, Utc::now())
        })
    }

    fn history(&self) -> History {
        History::Sampled
    }

    /// The OHLC candle containing the moment.
    fn fetch_at(
        &self,
        asset: Asset,
        at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<Option<Quote>, RateError>> {
        Box::pin(async move {
            let Some((_, pair, key)) = Self::PAIRS.into_iter().find(|(a, _, _)| *a == asset) else {
                return Ok(None);
            };
            let candle = self.candle_at(pair, key, at, now).await?;
            Ok(candle.map(|(fetched_at, usd_per_unit)| Quote {
                asset,
                usd_per_unit,
                source: "kraken".into(),
                fetched_at,
            }))
        })
    }

    /// EUR from Kraken's `EURUSD` pair (answered as `ZEURZUSD`): USD per euro, last trade.
    fn fetch_fiat(&self, currency: &str) -> BoxFuture<'_, Result<Option<FiatQuote>, RateError>> {
        let currency = currency.to_owned();
        Box::pin(async move {
            if currency != "EUR" {
                return Ok(None);
            }
            let body = self.get("/0/public/Ticker?pair=EURUSD").await?;
            let price = Self::last_trade(&body, "ZEURZUSD")?;
            Ok(Some(FiatQuote {
                currency,
                usd_per_unit: price,
                source: "kraken".into(),
                fetched_at: Utc::now(),
            }))
        })
    }

    /// EUR from the `EURUSD` candle containing the moment.
    fn fetch_fiat_at(
        &self,
        currency: &str,
        at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<Option<FiatQuote>, RateError>> {
        let currency = currency.to_owned();
        Box::pin(async move {
            if currency != "EUR" {
                return Ok(None);
            }
            let candle = self.candle_at("EURUSD", "ZEURZUSD", at, now).await?;
            Ok(candle.map(|(fetched_at, usd_per_unit)| FiatQuote {
                currency,
                usd_per_unit,
                source: "kraken".into(),
                fetched_at,
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

    /// The timed quotes are each in effect until the next; before the first, the file's
    /// plain quotes are.
    fn history(&self) -> History {
        History::InEffect
    }

    fn fetch_at(
        &self,
        asset: Asset,
        at: DateTime<Utc>,
        _now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<Option<Quote>, RateError>> {
        Box::pin(async move {
            let file = self.read().await?;
            let quotes = match in_effect(&file.timed, at) {
                Some(timed) => self.quotes(&timed.quotes, timed.at),
                None => self.quotes(&file.quotes, file.fetched_at.unwrap_or(at)),
            };
            Ok(quotes.into_iter().find(|q| q.asset == asset))
        })
    }

    fn fetch_fiat(&self, currency: &str) -> BoxFuture<'_, Result<Option<FiatQuote>, RateError>> {
        let currency = currency.to_owned();
        Box::pin(async move {
            if currency != "EUR" {
                return Ok(None);
            }
            let file = self.read().await?;
            Ok(file.usd_per_eur.map(|usd_per_unit| FiatQuote {
                currency,
                usd_per_unit,
                source: self.name.clone(),
                fetched_at: file.fetched_at.unwrap_or_else(Utc::now),
            }))
        })
    }

    fn fetch_fiat_at(
        &self,
        currency: &str,
        at: DateTime<Utc>,
        _now: DateTime<Utc>,
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
