//! Refunds, on SQLite and PostgreSQL: a record of its own per refund of what an exception
//! holds, to an address checked as a payment address on the network the money arrived on,
//! never more in all than is held, approved or withdrawn by an operator.

use crate::common;

use common::checks::order;
use common::checks::sound;
use common::payments::{Tx, config, engine, start_time};
use common::{account, rental, topup};
use payrecon::ledger::{Account, Currency, SuspenseReason};
use payrecon::{Action, Period, RefundState};
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

    async fn a_settled_payment_is_refunded_from_what_it_credited(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        let pay = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        let unpaid = engine.create_payment(&order("T1"), Method::Btc).await.unwrap();
        let paid = Tx::new(Network::Bitcoin, "t1", &pay.intent.watch_key, Method::Btc, 625_000, start_time());
        engine.apply_chain_events(&[paid.observed(2, 10)]).await.unwrap();
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 50_000);
        let not_settled = engine.request_payment_refund(&unpaid.intent.id, CUSTOMER, "all", "ops").await.unwrap_err().to_string();
        assert!(not_settled.contains("not settled"), "{not_settled}");

        // Part of it: its credit leaves the balance at the locked rate, into suspense, under
        // an exception the refund settles.
        let part = engine.request_payment_refund(&pay.intent.id, CUSTOMER, "0.0025", "ops").await.unwrap();
        assert_eq!((part.amount_decimal.as_str(), part.amount_kind.as_str()), ("0.0025", "exact"));
        assert_eq!(part.exception_id, format!("returned:{}:1", pay.intent.id));
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 30_000);
        let held = engine.account_balance(&Account::Suspense(SuspenseReason::Refunding), Currency::Crypto(Method::Btc)).await.unwrap();
        assert_eq!(held, -250_000);
        let exception = engine.exceptions(Some(&order("T1"))).await.unwrap().into_iter().find(|e| e.id == part.exception_id).unwrap();
        assert_eq!(exception.kind, "returned");
        let beyond = engine.request_payment_refund(&pay.intent.id, CUSTOMER, "0.004", "ops").await.unwrap_err().to_string();
        assert!(beyond.contains("0.00375 BTC of the 0.00625 BTC settled is left"), "{beyond}");
        let own = engine.request_payment_refund(&pay.intent.id, &pay.intent.pay_to, "all", "ops").await.unwrap_err().to_string();
        assert!(own.contains("one of the shop's own"), "{own}");

        // The balance was spent meanwhile: the rest cannot be taken back, and nothing moves.
        engine.create_rental_order(&rental("R1", "42", "250")).await.unwrap();
        engine.pay_order_from_balance(&order("R1")).await.unwrap();
        let spent = engine.request_payment_refund(&pay.intent.id, CUSTOMER, "all", "ops").await.unwrap_err().to_string();
        assert!(spent.contains("holds 50.00 USD, less than the 300.00 USD"), "{spent}");
        assert_eq!(engine.refunds(None).await.unwrap().len(), 1);
        // The customer keeps the first part as credit after all: its refund is withdrawn and
        // the held money goes back onto the balance.
        engine.cancel_refund(&part.id, "lead", "the customer keeps it as credit").await.unwrap();
        let keep = Action::CreditBalance { account: None, usd: None };
        engine.resolve_exception(&part.exception_id, &keep, "lead", "kept as credit").await.unwrap();
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 25_000);

        // A rental paid directly: its revenue gives the credit back, all of it at once.
        engine.create_rental_order(&rental("R2", "42", "300")).await.unwrap();
        let rental_pay = engine.create_payment(&order("R2"), Method::Btc).await.unwrap();
        let paid = Tx::new(Network::Bitcoin, "r2", &rental_pay.intent.watch_key, Method::Btc, 375_000, start_time());
        engine.apply_chain_events(&[paid.observed(2, 11)]).await.unwrap();
        let revenue = engine.account_balance(&Account::RevenueRentals, Currency::Usd).await.unwrap();
        let all = engine.request_payment_refund(&rental_pay.intent.id, CUSTOMER, "all", "ops").await.unwrap();
        assert_eq!((all.amount_decimal.as_str(), all.amount_kind.as_str()), ("0.00375", "all"));
        assert_eq!(engine.account_balance(&Account::RevenueRentals, Currency::Usd).await.unwrap(), revenue + 30_000);
        let again = engine.request_payment_refund(&rental_pay.intent.id, CUSTOMER, "all", "ops").await.unwrap_err().to_string();
        assert!(again.contains("0 BTC of the 0.00375 BTC settled is left"), "{again}");

        // The customer-balance roll-forward names what was taken back, and closes.
        let month = Period::containing(start_time(), "UTC".parse().unwrap());
        let rollforward = engine.rollforward(month).await.unwrap();
        assert_eq!(rollforward.refunded.amount, "200.00");
        assert!(rollforward.closes, "{rollforward:?}");
        sound(&engine).await;
    }
}
