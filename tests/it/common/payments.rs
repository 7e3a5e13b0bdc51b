//! Test support for payment instructions: an engine with every network configured from the
//! public "abandon … about" test keys, a fixed rate source and a hand-moved clock.

use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use futures_util::future::BoxFuture;
use payrecon::Engine;
use payrecon::PaymentSettings;
use payrecon::config::Config;
use payrecon::test_utils::clock::ManualClock;
use payrecon::test_utils::rates::{History, Quote, RateBook, RateError, RateSource};
use payrecon_chain_core::{
    Amount, Asset, ChainEvent, Method, Network, ReceivedAsset, Transfer, TransferId,
};
use rust_decimal::Decimal;

use super::TestDb;

/// Prices every asset at a fixed USD value, always fresh, and in effect at every moment.
#[derive(Debug)]
pub struct FixedRates(pub &'static [(Asset, &'static str)]);

impl RateSource for FixedRates {
    fn name(&self) -> &str {
        "fixed"
    }
    fn fetch(&self) -> BoxFuture<'_, Result<Vec<Quote>, RateError>> {
        Box::pin(async move {
            Ok(self
                .0
                .iter()
                .map(|(asset, price)| Quote {
                    asset: *asset,
                    usd_per_unit: price.parse().unwrap(),
                    source: "fixed".into(),
                    fetched_at: Utc::now() + chrono::Duration::days(3650),
                })
                .collect())
        })
    }
    fn history(&self) -> History {
        History::InEffect
    }
    fn fetch_at(
        &self,
        asset: Asset,
        _at: DateTime<Utc>,
        _now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<Option<Quote>, RateError>> {
        Box::pin(async move { Ok(self.fetch().await?.into_iter().find(|q| q.asset == asset)) })
    }
}

pub const PRICES: &[(Asset, &str)] = &[
    (Asset::Btc, "80000"),
    (Asset::Eth, "3000"),
    (Asset::Usdt, "1"),
    (Asset::Usdc, "1"),
    (Asset::Trx, "0.25"),
    (Asset::Sol, "150"),
    (Asset::Ltc, "85"),
];

pub fn start_time() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).unwrap()
}

/// The example configuration's networks and methods, with `tweak` applied.
pub fn config(tweak: impl FnOnce(&mut Config)) -> Config {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/payrecon.example.toml"
    ))
    .unwrap();
    let mut config: Config = toml_config(&text);
    tweak(&mut config);
    config
}

fn toml_config(text: &str) -> Config {
    use figment::providers::{Format, Toml};
    figment::Figment::from(Toml::string(text))
        .extract()
        .expect("example config parses")
}

/// An engine on `db` with the example networks, fixed rates and a manual clock.
pub async fn engine(db: &TestDb, config: Config) -> (Engine, Arc<ManualClock>) {
    engine_with_prices(db, config, PRICES).await
}

/// An engine on `db` pricing assets at `prices`.
pub async fn engine_with_prices(
    db: &TestDb,
    config: Config,
    prices: &'static [(Asset, &'static str)],
) -> (Engine, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(start_time()));
    let mut settings = PaymentSettings::from_config(&config).unwrap();
    settings.rates = Some(Arc::new(RateBook::new(
        vec![Arc::new(FixedRates(prices))],
        chrono::Duration::minutes(5),
        Decimal::new(2, 2),
        chrono::Duration::zero(),
    )));
    let engine = db
        .engine()
        .await
        .with_payment_settings(settings)
        .with_clock(clock.clone());
    (engine, clock)
}

/// Builds chain events for one transfer.
pub struct Tx {
    pub id: TransferId,
    pub to: String,
    pub asset: ReceivedAsset,
    pub amount: Amount,
    pub seen_at: DateTime<Utc>,
    pub from: Option<String>,
}

impl Tx {
    pub fn new(
        network: Network,
        txid: &str,
        to: &str,
        method: Method,
        amount: u128,
        seen_at: DateTime<Utc>,
    ) -> Tx {
        Tx {
            id: TransferId {
                network,
                txid: txid.into(),
                position: 0,
            },
            to: to.into(),
            asset: ReceivedAsset::Method { method },
            amount: Amount::from_base_units(amount),
            seen_at,
            from: None,
        }
    }

    /// Sent by `sender`, as the account chains report.
    pub fn from(mut self, sender: &str) -> Tx {
        self.from = Some(sender.into());
        self
    }

    /// Observed `confirmations` deep (its block derived from the depth) at `tip_height`.
    pub fn observed(&self, confirmations: u32, tip_height: u64) -> ChainEvent {
        ChainEvent::Observed {
            transfer: Transfer {
                id: self.id.clone(),
                to_address: self.to.clone(),
                asset: self.asset.clone(),
                amount: self.amount,
                from_address: self.from.clone(),
            },
            confirmations,
            block_height: (confirmations > 0).then(|| tip_height + 1 - u64::from(confirmations)),
            seen_at_ms: self.seen_at.timestamp_millis(),
            tip_height,
        }
    }

    pub fn removed(&self, tip_height: u64) -> ChainEvent {
        ChainEvent::Removed {
            id: self.id.clone(),
            tip_height,
        }
    }
}
