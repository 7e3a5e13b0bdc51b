//! Test support for outflows: a Litecoin engine with a treasury address, outflow reports
//! spending recorded receipts, and what the holdings and the books say afterwards.

use std::sync::Arc;

use payrecon::Engine;
use payrecon::config::UtxoConfig;
use payrecon::ledger::{Account, Currency};
use payrecon::test_utils::clock::ManualClock;
use payrecon_chain_core::{
    Amount, Asset, Method, Network, Outflow, OutflowEvent, ReceivedAsset, TransferId,
};

use super::TestDb;
use super::payments::{Tx, config, engine_with_prices, start_time};
use super::regtest::fresh_merchant_key;

/// The merchant's own address: outflows there book to `treasury:`.
pub const TREASURY: &str = "rltc1qtreasury";

/// An LTC engine (regtest key, 2 confirmations) whose treasury is [`TREASURY`].
pub async fn litecoin_engine(db: &TestDb) -> Engine {
    litecoin_engine_and_clock(db).await.0
}

/// [`litecoin_engine`] with the clock it runs on.
pub async fn litecoin_engine_and_clock(db: &TestDb) -> (Engine, Arc<ManualClock>) {
    let key = fresh_merchant_key();
    let config = config(|c| {
        c.payments.enabled_methods = vec![Method::Ltc];
        c.networks.litecoin = Some(UtxoConfig {
            treasury_addresses: vec![TREASURY.into()],
            ..UtxoConfig::new(key.account_xpub.clone(), "regtest", 2)
        });
    });
    engine_with_prices(db, config, &[(Asset::Ltc, "100")]).await
}

/// Input `input` of `txid` spending `spent`, `fee` of it to the network.
pub fn sweep(txid: &str, input: u32, spent: &Tx, fee: u128, to: Option<&str>) -> Outflow {
    Outflow {
        id: TransferId {
            network: Network::Litecoin,
            txid: txid.into(),
            position: input,
        },
        spends: Some(spent.id.clone()),
        from_address: String::new(),
        asset: ReceivedAsset::Method {
            method: Method::Ltc,
        },
        amount: Amount::from_base_units(spent.amount.base_units() - fee),
        fee: Amount::from_base_units(fee),
        to_address: to.map(str::to_owned),
    }
}

/// `outflow` in a block `confirmations` deep at `tip`, dated at the test's start.
pub fn sent(outflow: &Outflow, confirmations: u32, tip: u64) -> OutflowEvent {
    sent_at(outflow, confirmations, tip, start_time().timestamp_millis())
}

/// [`sent`] in a block of time `at_ms`.
pub fn sent_at(outflow: &Outflow, confirmations: u32, tip: u64, at_ms: i64) -> OutflowEvent {
    OutflowEvent::Sent {
        outflow: outflow.clone(),
        confirmations,
        block_height: tip + 1 - u64::from(confirmations),
        seen_at_ms: at_ms,
        tip_height: tip,
    }
}

/// `count` LTC payment instructions, each for its own 100 USD top-up, in derivation order.
pub async fn hand_out(engine: &Engine, count: u32) -> Vec<payrecon::PaymentIntent> {
    let mut intents = Vec::new();
    for n in 0..count {
        let reference = format!("W-{n}");
        engine
            .create_topup(&super::topup(&reference, "7", "100"))
            .await
            .unwrap();
        let reference = super::checks::order(&reference);
        intents.push(
            engine
                .create_payment(&reference, Method::Ltc)
                .await
                .unwrap()
                .intent,
        );
    }
    intents.sort_by_key(|intent| intent.derivation_index);
    intents
}

/// What payrecon holds on `network` per asset, in base units.
pub async fn held_per_asset(engine: &Engine, network: Network) -> Vec<(String, u128)> {
    engine
        .holdings(Some(network), payrecon::HoldingsSort::Address, false, 0, 1)
        .await
        .unwrap()
        .totals
        .into_iter()
        .map(|total| (total.asset, total.amount.parse().unwrap()))
        .collect()
}

/// An account's balance in `method`'s base units, whichever side it sits on.
pub async fn crypto_balance(engine: &Engine, account: Account, method: Method) -> u128 {
    let balance = engine
        .account_balance(&account, Currency::Crypto(method))
        .await
        .unwrap();
    u128::try_from(balance.abs()).unwrap()
}

/// What `method`'s network fees add up to in the books, in base units.
pub async fn fees_booked(engine: &Engine, method: Method) -> u128 {
    crypto_balance(engine, Account::NetworkFees(method), method).await
}
