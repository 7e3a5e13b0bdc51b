//! Refunds, on SQLite and PostgreSQL: a record of its own per refund of what an exception
//! holds, to an address checked as a payment address on the network the money arrived on,
//! never more in all than is held, approved or withdrawn by an operator.

use crate::common;

use common::checks::order;
use common::checks::sound;
use common::payments::{Tx, config, engine, start_time};
use common::topup;
use payrecon::RefundState;
use payrecon_chain_core::{Method, Network};

/// A valid Bitcoin mainnet address no intent has (BIP173's example).
const CUSTOMER: &str = "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4";

on_both_databases! {
    async fn a_refund_takes_what_is_held_to_the_customers_address_once(db) {
        let (engine, clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        let a = Tx::new(Network::Bitcoin, "a", &pay.intent.watch_key, Method::Btc, 700_000, start_time());
        engine.apply_chain_events(&[a.observed(2, 10)]).await.unwrap();
        let overpaid = engine.exceptions(None).await.unwrap().remove(0);
        assert_eq!(overpaid.kind, "overpaid");

        // The address must be a customer's on the network the money arrived on.
        let litecoin = engine
            .request_refund(&overpaid.id, "LVg2kJoFNg45Nbpy53h7Fe1wKyeXVRhMH9", "overpaid", "ops")
            .await
            .unwrap_err()
            .to_string();
        assert!(litecoin.contains("not a Bitcoin mainnet address"), "{litecoin}");
        let own = engine
            .request_refund(&overpaid.id, &pay.intent.pay_to, "overpaid", "ops")
            .await
            .unwrap_err()
            .to_string();
        assert!(own.contains("one of the shop's own"), "{own}");

        // The overpaid part, once.
        let refund = engine.request_refund(&overpaid.id, CUSTOMER, "overpaid", "ops").await.unwrap();
        assert_eq!((refund.amount_decimal.as_str(), refund.state), ("0.00075", RefundState::Requested));
        assert_eq!(refund.order_ref.as_deref(), Some("T1"));
        let twice = engine.request_refund(&overpaid.id, CUSTOMER, "all", "ops").await.unwrap_err().to_string();
        assert!(twice.contains("0 BTC is left to refund of the 0.00075 BTC held"), "{twice}");

        // Approved once; withdrawn, its amount is free for another, smaller one.
        let approved = engine.approve_refund(&refund.id, "lead").await.unwrap();
        assert_eq!(approved.state, RefundState::Approved);
        assert!(engine.approve_refund(&refund.id, "lead").await.is_err());
        let cancelled = engine.cancel_refund(&refund.id, "lead", "the customer gave another address").await.unwrap();
        assert_eq!(cancelled.state, RefundState::Cancelled);
        let part = engine.request_refund(&overpaid.id, CUSTOMER, "0.0005", "ops").await.unwrap();
        assert_eq!(part.amount_kind, "exact");
        let beyond = engine.request_refund(&overpaid.id, CUSTOMER, "0.0003", "ops").await.unwrap_err().to_string();
        assert!(beyond.contains("0.00025 BTC is left"), "{beyond}");
        assert!(engine.request_refund("unmatched:nothing", CUSTOMER, "all", "ops").await.is_err());

        // On Solana every payment goes to the shop's one recipient: never a refund address.
        engine.create_topup(&topup("S1", "43", "100")).await.unwrap();
        let sol = engine.create_payment(&order("S1"), Method::Sol).await.unwrap();
        let paid = Tx::new(Network::Solana, "s1", &sol.intent.watch_key, Method::Sol, 2_000_000_000, start_time());
        engine.apply_chain_events(&[paid.observed(1, 10)]).await.unwrap();
        let sol_overpaid = engine.exceptions(Some(&order("S1"))).await.unwrap().remove(0);
        let recipient = engine
            .request_refund(&sol_overpaid.id, &sol.intent.pay_to, "overpaid", "ops")
            .await
            .unwrap_err()
            .to_string();
        assert!(recipient.contains("one of the shop's own"), "{recipient}");

        // Two requests at once for all that is left: one is recorded, the other refused.
        let (first, second) = tokio::join!(
            engine.request_refund(&overpaid.id, CUSTOMER, "all", "ops"),
            engine.request_refund(&overpaid.id, CUSTOMER, "all", "ops"),
        );
        assert_eq!(u8::from(first.is_ok()) + u8::from(second.is_ok()), 1, "{first:?} {second:?}");
        let listed = engine.refunds(Some(&overpaid.id)).await.unwrap();
        assert_eq!(listed.len(), 3);
        let live: u128 = listed
            .iter()
            .filter(|r| r.state != RefundState::Cancelled)
            .map(|r| r.amount.base_units())
            .sum();
        assert_eq!(live, 75_000, "never more than is held");
        // A refund waiting a day is stuck, counted in /metrics.
        clock.advance(chrono::Duration::hours(25));
        let stuck = engine.stuck(&Default::default()).await.unwrap();
        let waiting: Vec<&str> = stuck.iter().filter(|i| i.category == "refund").map(|i| i.kind.as_str()).collect();
        assert_eq!(waiting, ["refund_requested", "refund_requested"], "the two live ones: {stuck:?}");
        let metrics = payrecon::test_utils::api::metrics_text(&engine).await.unwrap();
        assert!(metrics.contains("payrecon_stuck_items{category=\"refund\",kind=\"refund_requested\"} 2"), "{metrics}");
        // Recording a refund moves no money yet.
        sound(&engine).await;
    }
}
