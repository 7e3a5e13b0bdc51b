//! A database holding every intent state and every exception kind, with known amounts, for
//! the report, operator and API tests.

use std::sync::Arc;

use chrono::Duration;
use payrecon::Engine;
use payrecon::OrderRef;
use payrecon::PaymentInstructions;
use payrecon::test_utils::clock::ManualClock;
use payrecon_chain_core::{Method, Network, ReceivedAsset};

use super::payments::{Tx, config, engine, start_time};
use super::{TestDb, rental, topup};

/// The seeded engine and what the tests look up in it.
pub struct Seeded {
    pub engine: Engine,
    pub clock: Arc<ManualClock>,
    /// Intent id per order reference.
    pub intents: std::collections::BTreeMap<&'static str, PaymentInstructions>,
}

impl Seeded {
    pub fn intent(&self, order: &str) -> &str {
        &self.intents[order].intent.id
    }
}

pub const UNMATCHED_TXID: &str = "c0ffee";

/// Customer 42's top-ups, all 500 USD in BTC (625,000 sat at 80,000 USD):
/// - T1 paid exactly (settled), T2 underpaid 600,000 (underpaid), T3 overpaid 700,000
///   (settled, 75,000 held), T4 paid 625,000 after the deadline (paid late, held), T6 never
///   paid and marked paid (expired), T7 paid but unconfirmed (seen), T8 paid, credited, then
///   reorged out (reorged after credit);
/// - T5 in ETH, paid with 500 USDT-ERC20 instead (wrong asset, held);
/// - R1 a 420 USD rental paid exactly in USDT on Tron (settled to revenue);
/// - 10,000 sat to an address no intent owns (unmatched, held).
pub async fn seed(db: &TestDb) -> Seeded {
    let (engine, clock) = engine(db, config(|_| {})).await;
    let mut intents = std::collections::BTreeMap::new();
    for reference in ["T1", "T2", "T3", "T4", "T6", "T7", "T8"] {
        engine
            .create_topup(&topup(reference, "42", "500"))
            .await
            .unwrap();
        let pay = engine
            .create_payment(&OrderRef::new(reference).unwrap(), Method::Btc)
            .await
            .unwrap();
        intents.insert(reference, pay);
    }
    engine
        .create_topup(&topup("T5", "42", "500"))
        .await
        .unwrap();
    let t5 = engine
        .create_payment(&OrderRef::new("T5").unwrap(), Method::Eth)
        .await
        .unwrap();
    intents.insert("T5", t5);
    engine
        .create_rental_order(&rental("R1", "42", "420"))
        .await
        .unwrap();
    let r1 = engine
        .create_payment(&OrderRef::new("R1").unwrap(), Method::UsdtTrc20)
        .await
        .unwrap();
    intents.insert("R1", r1);

    let btc = |txid: &str, order: &str, sats: u128| {
        Tx::new(
            Network::Bitcoin,
            txid,
            &intents[order].intent.watch_key,
            Method::Btc,
            sats,
            start_time(),
        )
    };
    let events = [
        btc("t1", "T1", 625_000).observed(2, 10),
        btc("t2", "T2", 600_000).observed(2, 10),
        btc("t3", "T3", 700_000).observed(2, 10),
        btc("t7", "T7", 625_000).observed(0, 10),
        btc("t8", "T8", 625_000).observed(2, 10),
        Tx::new(
            Network::Bitcoin,
            UNMATCHED_TXID,
            "bc1qnobodyownsthisaddress",
            Method::Btc,
            10_000,
            start_time(),
        )
        .observed(2, 10),
    ];
    engine.apply_chain_events(&events).await.unwrap();
    engine
        .apply_chain_events(&[btc("t8", "T8", 625_000).removed(11)])
        .await
        .unwrap();
    let mut wrong = Tx::new(
        Network::Ethereum,
        "0xw5",
        &intents["T5"].intent.watch_key,
        Method::UsdtErc20,
        500_000_000,
        start_time(),
    );
    wrong.asset = ReceivedAsset::Method {
        method: Method::UsdtErc20,
    };
    let r1_pay = Tx::new(
        Network::Tron,
        "r1",
        &intents["R1"].intent.watch_key,
        Method::UsdtTrc20,
        420_000_000,
        start_time(),
    );
    engine
        .apply_chain_events(&[wrong.observed(12, 100), r1_pay.observed(19, 500)])
        .await
        .unwrap();
    engine.mark_paid(&intents["T6"].intent.id).await.unwrap();

    clock.advance(Duration::minutes(61));
    engine.tick().await.unwrap();
    let mut late = btc("t4", "T4", 625_000);
    late.seen_at = start_time() + Duration::minutes(61);
    engine
        .apply_chain_events(&[late.observed(2, 12)])
        .await
        .unwrap();
    Seeded {
        engine,
        clock,
        intents,
    }
}
