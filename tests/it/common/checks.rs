//! What the chain tests ask of an engine: an intent's state, an order's exceptions, a
//! customer's balance, and a summary two runs of the same story must agree on.

use payrecon::Engine;
use payrecon::IntentStatus;
use payrecon::OrderRef;
use payrecon::test_utils::clock::Clock;
use payrecon_chain_core::Network;

use super::account;
use super::regtest::eventually;

/// Ticks once `network`'s watcher has read its chain up to the clock's now (deadlines are
/// judged by the chain, not the clock alone); at once where no watcher reports for it.
pub async fn tick_once_read(engine: &Engine, network: Network, clock: &dyn Clock) {
    let now = clock.now();
    let start = std::time::Instant::now();
    loop {
        let health = engine.watcher_health().await.unwrap();
        let row = health
            .iter()
            .find(|health| health.network == network.as_str());
        if row.is_none_or(|health| {
            health
                .chain_read_until
                .is_some_and(|read| read.timestamp_millis() >= now.timestamp_millis())
        }) {
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "the {network} watcher did not read its chain up to {now}: {row:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    engine.tick().await.unwrap();
}

pub fn order(reference: &str) -> OrderRef {
    OrderRef::new(reference).unwrap()
}

pub async fn status(engine: &Engine, intent: &str) -> IntentStatus {
    engine.payment(intent).await.unwrap().intent.status
}

pub async fn wait_status(engine: &Engine, intent: &str, want: IntentStatus) {
    let last = std::sync::Mutex::new(None);
    let what = format!("intent {intent} to become {want:?}");
    let waited = std::panic::AssertUnwindSafe(eventually(&what, || async {
        let now = engine.payment(intent).await.unwrap();
        let reached = now.intent.status == want;
        *last.lock().unwrap() = Some(now);
        reached
    }));
    if let Err(panic) = futures_util::FutureExt::catch_unwind(waited).await {
        eprintln!("intent {intent} as last read: {:#?}", last.lock().unwrap());
        std::panic::resume_unwind(panic);
    }
}

/// The kinds of the order's exceptions, sorted.
pub async fn kinds(engine: &Engine, reference: &str) -> Vec<String> {
    let mut kinds: Vec<String> = engine
        .exceptions(Some(&order(reference)))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    kinds.sort();
    kinds
}

/// The customer's available balance in cents.
pub async fn cents(engine: &Engine, customer: &str) -> i64 {
    engine
        .available_balance(&account(customer))
        .await
        .unwrap()
        .cents()
}

/// The trial balance sums to zero in every currency.
pub async fn sound(engine: &Engine) {
    let trial = engine.trial_balance().await.unwrap();
    assert!(trial.is_sound(), "{trial:?}");
}

/// What two runs must agree on: every account's balance, every order's intents' states, and
/// every transfer's fate. Journal keys name intent ids, which differ between databases.
pub async fn ledger_summary(engine: &Engine, orders: &[&str]) -> String {
    sound(engine).await;
    let trial = engine.trial_balance().await.unwrap();
    let mut lines = vec![format!("{:?}", trial.accounts)];
    for reference in orders {
        for pay in engine.payments_for(&order(reference)).await.unwrap() {
            lines.push(format!(
                "{reference} {} {:?}",
                pay.intent.pay_to, pay.intent.status
            ));
        }
        let mut transfers: Vec<String> = engine
            .transfers_for(&order(reference))
            .await
            .unwrap()
            .into_iter()
            .map(|t| {
                format!(
                    "{} {} removed={} credited={}",
                    t.id,
                    t.amount,
                    t.removed,
                    t.credited_entry.is_some()
                )
            })
            .collect();
        transfers.sort();
        lines.extend(transfers);
        lines.push(format!(
            "{reference} exceptions {:?}",
            kinds(engine, reference).await
        ));
    }
    lines.join("\n")
}
