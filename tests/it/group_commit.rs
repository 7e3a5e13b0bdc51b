//! Group commit: 64 concurrent callers share commits, each in its own savepoint. Derivation
//! indexes stay unique while some callers are refused after taking one (it goes back to the
//! process's block), and refusals of every kind leave the other callers' writes standing.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::payments::{FixedRates, PRICES, config, start_time};
use common::{rental, topup};
use payrecon::Error;
use payrecon::OrderRef;
use payrecon::PaymentSettings;
use payrecon::test_utils::clock::ManualClock;
use payrecon::test_utils::rates::RateBook;
use payrecon_chain_core::{AddressDeriver, DeriveError, DerivedAddress, Method, Network};

/// Refuses every third derivation: the caller has reserved its index by then, so the refusal
/// must give the index back.
#[derive(Debug)]
struct Flaky {
    inner: Arc<dyn AddressDeriver>,
    calls: AtomicUsize,
}

impl AddressDeriver for Flaky {
    fn network(&self) -> Network {
        self.inner.network()
    }
    fn key_id(&self) -> String {
        self.inner.key_id()
    }
    fn derive(&self, index: u32) -> Result<DerivedAddress, DeriveError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) % 3 == 2 {
            return Err(DeriveError::Derivation("refused by the test".into()));
        }
        self.inner.derive(index)
    }
}

const CALLERS: usize = 64;

on_both_databases! {
    async fn sixty_four_callers_share_commits_and_no_index_goes_out_twice(db) {
        let mut settings = PaymentSettings::from_config(&config(|_| {})).unwrap();
        settings.rates = Some(Arc::new(RateBook::new(
            vec![Arc::new(FixedRates(PRICES))],
            chrono::Duration::minutes(5),
            rust_decimal::Decimal::new(2, 2),
            chrono::Duration::zero(),
        )));
        let real = settings.derivers[&Network::Bitcoin].clone();
        settings.derivers.insert(
            Network::Bitcoin,
            Arc::new(Flaky { inner: real, calls: AtomicUsize::new(0) }),
        );
        let engine = db
            .engine()
            .await
            .with_payment_settings(settings)
            .with_clock(Arc::new(ManualClock::new(start_time())));
        for i in 0..CALLERS {
            engine.create_topup(&topup(&format!("T{i}"), "42", "100")).await.unwrap();
            engine.create_rental_order(&rental(&format!("R{i}"), "42", "420")).await.unwrap();
        }
        let before = engine.store().group_commit_stats();

        // Three kinds of caller at once: intents (a third refused after reserving an index),
        // debits the empty balance cannot cover, and orders that conflict with stored ones.
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..CALLERS {
            let engine = engine.clone();
            tasks.spawn(async move {
                let order = OrderRef::new(format!("T{i}")).unwrap();
                let intent = engine.create_payment(&order, Method::Btc).await;
                let rent = OrderRef::new(format!("R{i}")).unwrap();
                let debit = engine.pay_order_from_balance(&rent).await;
                let conflict = engine.create_topup(&topup(&format!("R{i}"), "42", "100")).await;
                (intent, debit, conflict)
            });
        }
        let mut indexes = Vec::new();
        let mut refused_intents = 0;
        while let Some(done) = tasks.join_next().await {
            let (intent, debit, conflict) = done.unwrap();
            match intent {
                Ok(made) => indexes.push(made.intent.derivation_index),
                Err(Error::Derive(_)) => refused_intents += 1,
                Err(other) => panic!("unexpected refusal: {other}"),
            }
            assert!(matches!(debit, Err(Error::InsufficientBalance { .. })), "{debit:?}");
            assert!(matches!(conflict, Err(Error::OrderConflict(_))), "{conflict:?}");
        }
        assert!(refused_intents > 0, "some intents were refused after reserving an index");
        indexes.sort_unstable();
        let handed_out = indexes.len();
        indexes.dedup();
        assert_eq!(indexes.len(), handed_out, "no index went out twice");
        // A refused intent gives its index back to the process's block, to go out next: the
        // holes below the highest index are at most the refusals.
        let holes = *indexes.last().unwrap() as usize + 1 - indexes.len();
        assert!(holes <= refused_intents, "{holes} holes, {refused_intents} refusals");

        // Nothing of a refused write stayed: no debit, the conflicting orders untouched.
        let trial = engine.trial_balance().await.unwrap();
        assert!(trial.is_sound());
        assert_eq!(trial.entries, 0, "no refused debit posted anything");
        for i in 0..CALLERS {
            let order = engine.order(&OrderRef::new(format!("R{i}")).unwrap()).await.unwrap();
            assert_eq!(order.total_usd.cents(), 42_000, "the rental is still the rental");
        }

        // The next intent takes the lowest index given back: nothing was burnt.
        let retry = loop {
            match engine.create_payment(&OrderRef::new("T0").unwrap(), Method::Btc).await {
                Ok(made) => break made,
                Err(Error::Derive(_)) => continue,
                Err(other) => panic!("{other}"),
            }
        };
        let lowest_free = (0..).find(|i| indexes.binary_search(i).is_err()).unwrap();
        assert_eq!(retry.intent.derivation_index, lowest_free);

        let after = engine.store().group_commit_stats();
        let writes = after.writes - before.writes;
        let commits = after.commits - before.commits;
        assert!(writes >= (3 * CALLERS) as u64, "{after:?}");
        assert!(commits < writes, "callers shared commits: {commits} commits for {writes} writes");
    }
}

on_both_databases! {
    async fn callers_racing_on_the_same_orders_get_what_one_by_one_would_give(db) {
        let (engine, _clock) = common::payments::engine(&db, config(|_| {})).await;
        // Eight references, each created by eight callers at once: one creates it, the
        // others with the same content are retries, one with other content a conflict.
        let mut tasks = tokio::task::JoinSet::new();
        for caller in 0..CALLERS {
            let engine = engine.clone();
            tasks.spawn(async move {
                let reference = format!("S{}", caller % 8);
                let amount = if caller == 8 + caller % 8 { "500" } else { "100" };
                (reference.clone(), amount, engine.create_topup(&topup(&reference, "42", amount)).await)
            });
        }
        let mut answers: std::collections::BTreeMap<String, Vec<(&str, Result<_, Error>)>> =
            Default::default();
        while let Some(done) = tasks.join_next().await {
            let (reference, amount, result) = done.unwrap();
            answers.entry(reference).or_default().push((amount, result));
        }
        for (reference, answers) in answers {
            let stored = engine.order(&OrderRef::new(reference.as_str()).unwrap()).await.unwrap();
            let winner = if stored.total_usd.cents() == 10_000 { "100" } else { "500" };
            let mut created = 0;
            for (amount, result) in answers {
                match result {
                    Ok(order) => {
                        assert_eq!(amount, winner, "{reference}: a retry has the stored content");
                        created += usize::from(order.created);
                    }
                    Err(Error::OrderConflict(_)) => assert_ne!(amount, winner),
                    Err(other) => panic!("{other}"),
                }
            }
            assert_eq!(created, 1, "{reference} created exactly once");
        }
        // Eight intents per order at once: one stays live, the others are superseded in a chain
        // every `intent_created` event accounts for.
        let mut tasks = tokio::task::JoinSet::new();
        for caller in 0..CALLERS {
            let engine = engine.clone();
            tasks.spawn(async move {
                let order = OrderRef::new(format!("S{}", caller % 8)).unwrap();
                engine.create_payment(&order, Method::Btc).await.unwrap()
            });
        }
        while tasks.join_next().await.is_some() {}
        let events = engine.events_after(0, 10_000).await.unwrap();
        for n in 0..8 {
            let order = OrderRef::new(format!("S{n}")).unwrap();
            let intents = engine.payments_for(&order).await.unwrap();
            assert_eq!(intents.len(), 8);
            let live: Vec<_> = intents.iter().filter(|p| p.intent.superseded_by.is_none()).collect();
            assert_eq!(live.len(), 1, "one live intent per order");
            let mut superseded: Vec<String> = events
                .iter()
                .filter(|e| e.kind == "intent_created" && e.order_ref.as_deref() == Some(order.as_str()))
                .flat_map(|e| e.detail["supersedes"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect::<Vec<_>>())
                .collect();
            superseded.sort();
            let mut expected: Vec<String> = intents
                .iter()
                .filter(|p| p.intent.superseded_by.is_some())
                .map(|p| p.intent.id.clone())
                .collect();
            expected.sort();
            assert_eq!(superseded, expected, "each superseded intent announced once");
        }
        let mut indexes: Vec<u32> = Vec::new();
        for n in 0..8 {
            let order = OrderRef::new(format!("S{n}")).unwrap();
            indexes.extend(engine.payments_for(&order).await.unwrap().iter().map(|p| p.intent.derivation_index));
        }
        indexes.sort_unstable();
        assert_eq!(indexes, (0..CALLERS as u32).collect::<Vec<_>>());
    }
}
