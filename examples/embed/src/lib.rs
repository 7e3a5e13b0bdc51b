//! The shop flow through payrecon's public API: what a shop backend embedding the library
//! does, from a top-up to a rental paid from the balance and finance's report.

use payrecon::chain::{ChainEvent, Method, Network, ReceivedAsset, Transfer, TransferId};
use payrecon::{
    Config, CsvSection, Engine, IntentStatus, OrderRef, RentalOrderRequest, ReportFormat,
    ReportQuery, TopupRequest, Usd,
};

/// What one run of the flow ended with.
#[derive(Debug)]
pub struct Outcome {
    /// The top-up's intent, after the transfer confirmed.
    pub intent_status: IntentStatus,
    /// Intent events the stream delivered.
    pub events: usize,
    /// The customer's balance after the rental was paid from it.
    pub balance_after: Usd,
    /// The summary report's CSV.
    pub report_csv: String,
    /// Whether the ledger's invariants held in the report.
    pub ledger_sound: bool,
}

/// The configuration a shop would keep: LTC on regtest at recorded prices, over `database_url`.
pub fn config(database_url: &str, quotes_file: &str) -> Result<Config, Box<dyn std::error::Error>> {
    Ok(Config::from_toml(&format!(
        r#"
        database_url = "{database_url}"
        [payments]
        enabled_methods = ["ltc"]
        [rates]
        sources = ["recorded"]
        recorded_quotes_file = "{quotes_file}"
        max_age_seconds = 315360000
        [networks.litecoin]
        xpub = "vpub5Y6cjg78GGuNLsaPhmYsiw4gYX3HoQiRBiSwDaBXKUafCt9bNwWQiitDk5VZ5BVxYnQdwoTyXSs2JHRPAgjAvtbBrf8ZhDYe2jWAqvZVnsc"
        network = "regtest"
        confirmations = 2
        "#
    ))?)
}

/// Tops up `customer`'s balance in LTC, settles it from a watcher's report, rents a GPU from
/// the balance and writes the day's summary. `run` makes the references unique per call.
pub async fn shop_flow(
    engine: &Engine,
    customer: &str,
    run: &str,
) -> Result<Outcome, Box<dyn std::error::Error>> {
    let topup = format!("topup-{run}");
    engine
        .create_topup(&TopupRequest {
            reference: topup.clone(),
            account_id: customer.into(),
            amount_usd: Usd::from_dollars(500),
        })
        .await?;
    let pay = engine
        .create_payment(&OrderRef::new(topup)?, Method::Ltc)
        .await?;
    let after = engine
        .events_after(0, 1)
        .await?
        .first()
        .map_or(0, |e| e.seq - 1);

    let transfer = Transfer {
        id: TransferId {
            network: Network::Litecoin,
            txid: format!("{:0>64}", run),
            position: 0,
        },
        to_address: pay.intent.pay_to.clone(),
        asset: ReceivedAsset::Method {
            method: Method::Ltc,
        },
        amount: pay.intent.amount,
        from_address: None,
    };
    engine
        .apply_chain_events(&[ChainEvent::Observed {
            transfer,
            confirmations: 2,
            block_height: Some(100),
            seen_at_ms: pay.intent.created_at.timestamp_millis() + 1_000,
            tip_height: 101,
        }])
        .await?;
    let intent_status = engine.payment(&pay.intent.id).await?.intent.status;
    let events = engine
        .events_after(after, 10_000)
        .await?
        .into_iter()
        .filter(|e| e.intent_id.as_deref() == Some(pay.intent.id.as_str()))
        .count();

    let rental = format!("order-{run}");
    engine
        .create_rental_order(&RentalOrderRequest {
            reference: rental.clone(),
            account_id: customer.into(),
            gpu_model: "B200".into(),
            duration_days: 3,
            lots: 1,
            total_usd: Usd::from_dollars(420),
        })
        .await?;
    let paid = engine
        .pay_order_from_balance(&OrderRef::new(rental)?)
        .await?;

    let now = chrono::Utc::now();
    let mut csv = Vec::new();
    let totals = engine
        .write_reconciliation(
            &ReportQuery {
                from: now - chrono::Duration::days(1),
                to: now + chrono::Duration::days(1),
                method: Some(Method::Ltc),
            },
            ReportFormat::Csv,
            CsvSection::Summary,
            &mut csv,
        )
        .await?;
    Ok(Outcome {
        intent_status,
        events,
        balance_after: paid.balance_after,
        report_csv: String::from_utf8(csv)?,
        ledger_sound: totals.trial_balance_sound,
    })
}
