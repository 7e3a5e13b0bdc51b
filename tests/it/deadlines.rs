//! Deadlines are judged by the chain, not by an outage: against a real anvil node behind a
//! proxy that goes down the way a provider does, on SQLite and PostgreSQL. An intent is
//! expired only once its watcher has read the chain past the deadline.

use crate::common;

use std::sync::atomic::Ordering;

use chrono::Duration;
use common::anvil::{
    Anvil, RpcProxy, eth_engine, fresh_ethereum_xpub, scanner_settings, watch_ethereum_with,
};
use common::checks::{cents, order, sound, status, wait_status};
use common::regtest::{eventually, fast};
use common::topup;
use payrecon::test_utils::clock::Clock;
use payrecon::test_utils::intent::CHECKING_MESSAGE;
use payrecon::test_utils::watcher::WatcherState;
use payrecon::{ApiOptions, Engine, IntentStatus, Role};
use payrecon_chain_core::Method;

/// 0.05 ETH, what a 100 USD top-up costs at 2000 USD per ETH.
const TOPUP_WEI: u128 = 50_000_000_000_000_000;

/// The shop's API and the checkout pages on a free local port: the answer to `path`.
struct Served {
    _stop: tokio::sync::watch::Sender<bool>,
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Served {
    async fn start(engine: &Engine) -> Served {
        let limits = payrecon::test_utils::api::ServerLimits {
            header_read_timeout: std::time::Duration::from_secs(5),
            max_connections: 16,
            drain: std::time::Duration::from_secs(1),
        };
        let (stop, address) = common::serve_api(engine, ApiOptions::default(), limits).await;
        let base = format!("http://{address}");
        let token = engine
            .create_api_token("shop-backend", Role::Shop)
            .await
            .unwrap();
        Served {
            _stop: stop,
            base,
            token,
            http: reqwest::Client::new(),
        }
    }

    async fn text(&self, path: &str) -> String {
        let answer = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        assert!(answer.status().is_success(), "{path}: {}", answer.status());
        answer.text().await.unwrap()
    }
}

on_both_databases! {
    async fn a_provider_down_across_the_deadline_never_tells_a_customer_who_paid_it_expired(db) {
        let anvil = Anvil::lock().await;
        let tokens = anvil.tokens().await;
        let (engine, clock) = eth_engine(&db, &anvil, &tokens, &fresh_ethereum_xpub(), 1).await;
        // The shop's clock is the chain's: earlier tests may have stamped anvil's blocks ahead.
        let chain_ahead = anvil.head_time().await - clock.now().timestamp();
        if chain_ahead > 0 {
            clock.advance(Duration::seconds(chain_ahead + 1));
        }
        engine.create_topup(&topup("OUTAGE", "93", "100")).await.unwrap();
        let paid = engine.create_payment(&order("OUTAGE"), Method::Eth).await.unwrap().intent;
        engine.create_topup(&topup("NEVER-PAID", "94", "100")).await.unwrap();
        let unpaid = engine.create_payment(&order("NEVER-PAID"), Method::Eth).await.unwrap().intent;
        let proxy = RpcProxy::start(&anvil.url, 10_000, 0).await;
        let watcher = watch_ethereum_with(&engine, scanner_settings(&proxy.url, &tokens, anvil.head().await), fast());
        anvil.wait_synced(&engine).await;
        let served = Served::start(&engine).await;

        // The provider goes down; the customer pays, mined well before the deadline; the
        // deadline passes while the provider still answers 502.
        proxy.down.store(true, Ordering::SeqCst);
        anvil.send_eth(&paid.pay_to, TOPUP_WEI).await;
        anvil.mine(1).await;
        eventually("the watcher to fail against the provider", || async {
            matches!(watcher.status.borrow().state, WatcherState::Retrying { .. })
        }).await;
        clock.advance(Duration::minutes(61));
        assert!(clock.now() > paid.deadline && clock.now() > unpaid.deadline);
        for _ in 0..3 {
            engine.tick().await.unwrap();
        }
        for intent in [&paid, &unpaid] {
            assert_eq!(status(&engine, &intent.id).await, IntentStatus::AwaitingPayment, "an outage is not an expiry");
            let shown = engine.payment(&intent.id).await.unwrap();
            let read = shown.chain_read_until.expect("the watcher reports how far it read");
            assert!(read < intent.deadline, "{read} is before the deadline {}", intent.deadline);
            assert_eq!(shown.customer_message, CHECKING_MESSAGE);
            let checkout = engine.checkout(&intent.checkout_key).await.unwrap();
            assert!(checkout.status.checking_network && !checkout.status.open, "{:?}", checkout.status);
            assert_eq!(checkout.status.status, IntentStatus::AwaitingPayment);
        }
        // The API gives both facts, and the page says the shop is checking the network.
        let api: serde_json::Value = serde_json::from_str(&served.text(&format!("/v1/payments/{}", paid.id)).await).unwrap();
        assert_eq!(api["status"], "awaiting_payment");
        assert!(api["chain_read_until"].is_string(), "{api}");
        let page = served.text(&format!("/pay/{}", paid.checkout_key)).await;
        assert!(page.contains("id=\"checking\"") && page.contains("data-status=\"checking\""), "{page}");
        assert!(!page.contains("id=\"expired\"") && !page.contains(&paid.pay_to), "the page neither says expired nor asks for money: {page}");

        // The provider answers again: the payment mined in time settles, the other intent
        // expires once its chain is read past its deadline, and nothing ever said the paid one
        // expired.
        proxy.down.store(false, Ordering::SeqCst);
        wait_status(&engine, &paid.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "93").await, 10_000);
        eventually("the unpaid intent to expire once its chain is read past its deadline", || async {
            engine.tick().await.unwrap();
            status(&engine, &unpaid.id).await == IntentStatus::Expired
        }).await;
        let shown = engine.payment(&unpaid.id).await.unwrap();
        assert!(shown.chain_read_until.unwrap() > unpaid.deadline);
        assert_eq!(shown.customer_message, IntentStatus::Expired.customer_message());
        let page = served.text(&format!("/pay/{}", unpaid.checkout_key)).await;
        assert!(page.contains("id=\"expired\""), "{page}");
        let events = engine.events_after(0, 1000).await.unwrap();
        assert!(
            !events.iter().any(|e| e.intent_id.as_deref() == Some(paid.id.as_str()) && e.detail.to_string().contains("expired")),
            "no event said the paid intent expired: {events:?}"
        );
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }
}
