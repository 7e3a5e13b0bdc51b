//! Holdings and the wallet hand-off from recorded chain events, on SQLite and PostgreSQL: the
//! gap limit a wallet needs, the stuck view's warning, holdings sorted and paged, a reorg
//! taking a payment back out, and a key origin that cannot be the key's refused.

use crate::common;

use common::outflows::hand_out;
use common::payments::{Tx, config, engine_with_prices, start_time};
use common::regtest::fresh_merchant_key;
use payrecon::config::UtxoConfig;
use payrecon::{Error, HoldingsSort, PaymentIntent, PaymentSettings};
use payrecon_chain_core::{Asset, Method, Network};

async fn litecoin_engine(db: &common::TestDb, origin: &str, xpub: &str) -> payrecon::Engine {
    let config = config(|c| {
        c.payments.enabled_methods = vec![Method::Ltc];
        c.networks.litecoin = Some(UtxoConfig {
            key_origin: Some(origin.to_owned()),
            ..UtxoConfig::new(xpub, "regtest", 1)
        });
    });
    engine_with_prices(db, config, &[(Asset::Ltc, "100")])
        .await
        .0
}

fn payment(intent: &PaymentIntent, litoshi: u128) -> Tx {
    Tx::new(
        Network::Litecoin,
        &format!("{:0>64}", intent.derivation_index),
        &intent.pay_to,
        Method::Ltc,
        litoshi,
        start_time(),
    )
}

on_both_databases! {
    async fn the_export_says_the_gap_a_wallet_needs_and_holdings_follow_the_chain(db) {
        let key = fresh_merchant_key();
        let engine = litecoin_engine(&db, &key.origin, &key.account_xpub).await;
        let empty = engine.wallet_export(Network::Litecoin).await.unwrap();
        assert_eq!((empty.highest_index, empty.funded_addresses, empty.gap_limit_needed), (None, 0, 1));
        let intents = hand_out(&engine, 50).await;
        let paid = [(3, 100_000_000), (10, 250_000_000), (45, 100_000_000)];
        let events: Vec<_> = paid.iter().map(|(i, amount)| payment(&intents[*i], *amount).observed(1, 200)).collect();
        engine.apply_chain_events(&events).await.unwrap();

        let export = engine.wallet_export(Network::Litecoin).await.unwrap();
        assert_eq!(export.highest_index, Some(49));
        assert_eq!((export.addresses_handed_out, export.funded_addresses), (50, 3));
        assert_eq!((export.largest_unfunded_run, export.gap_limit_needed, export.gap_limit_recommended), (34, 35, 55));
        assert_eq!(export.import_range, [0, 69]);
        assert!(export.text().contains("gap limit needed: 35"));
        assert!(export.notes.iter().any(|n| n.contains("at least 35")), "{:?}", export.notes);
        let stuck = engine.stuck(&Default::default()).await.unwrap();
        let warning = stuck.iter().find(|item| item.category == "wallet").expect("the gap warning");
        assert_eq!(warning.subject, "litecoin");

        let by_amount = engine.holdings(None, HoldingsSort::Amount, false, 0, 2).await.unwrap();
        assert_eq!(by_amount.address_count, 3);
        assert_eq!(by_amount.totals.len(), 1);
        assert_eq!((by_amount.totals[0].amount.as_str(), by_amount.totals[0].amount_decimal.as_deref()), ("450000000", Some("4.5")));
        assert_eq!(by_amount.addresses[0].address, intents[10].pay_to);
        assert_eq!(by_amount.next_offset, Some(2));
        let rest = engine.holdings(None, HoldingsSort::Amount, false, 2, 2).await.unwrap();
        assert_eq!((rest.addresses.len(), rest.next_offset), (1, None));
        let by_index = engine.holdings(Some(Network::Litecoin), HoldingsSort::Index, false, 0, 10).await.unwrap();
        let indexes: Vec<_> = by_index.addresses.iter().map(|h| h.derivation_index).collect();
        assert_eq!(indexes, [Some(3), Some(10), Some(45)]);
        assert_eq!(by_index.addresses[2].derivation_path.as_deref(), Some(format!("{}/0/45", key.origin).as_str()));
        assert!(engine.holdings(Some(Network::Ethereum), HoldingsSort::Address, false, 0, 10).await.unwrap().addresses.is_empty());

        // A reorg takes the farthest payment out: the wallet no longer needs to reach it.
        engine.apply_chain_events(&[payment(&intents[45], 100_000_000).removed(201)]).await.unwrap();
        let export = engine.wallet_export(Network::Litecoin).await.unwrap();
        assert_eq!((export.funded_addresses, export.gap_limit_needed), (2, 7));
        assert!(!engine.stuck(&Default::default()).await.unwrap().iter().any(|item| item.category == "wallet"));
        let after = engine.holdings(None, HoldingsSort::Address, false, 0, 10).await.unwrap();
        assert_eq!(after.totals[0].amount, "350000000");
        // Replaying the same events changes nothing.
        engine.apply_chain_events(&events[..2]).await.unwrap();
        assert_eq!(engine.holdings(None, HoldingsSort::Address, false, 0, 10).await.unwrap(), after);
    }

    async fn wallet_export_refuses_what_it_cannot_hand_over(db) {
        let key = fresh_merchant_key();
        let engine = litecoin_engine(&db, &key.origin, &key.account_xpub).await;
        assert!(matches!(engine.wallet_export(Network::Ethereum).await, Err(Error::InvalidInput(_))));
        // The example's Bitcoin account has no origin configured: exported without, and said so.
        let bitcoin = engine.wallet_export(Network::Bitcoin).await.unwrap();
        assert!(bitcoin.receive_descriptor.starts_with("wpkh(xpub"), "{}", bitcoin.receive_descriptor);
        assert!(bitcoin.notes.iter().any(|n| n.contains("no key origin")), "{:?}", bitcoin.notes);
        for origin in ["[00000000/84h/2h]", "[00000000/84h/2h/1h]", "nonsense"] {
            let config = config(|c| {
                c.networks.litecoin = Some(UtxoConfig {
                    key_origin: Some(origin.to_owned()),
                    ..UtxoConfig::new(key.account_xpub.clone(), "regtest", 1)
                });
            });
            let refused = PaymentSettings::from_config(&config).unwrap_err();
            assert!(refused.to_string().contains("networks.litecoin.key_origin"), "{refused}");
        }
    }
}
