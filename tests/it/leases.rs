//! Watcher leases and fencing tokens, on SQLite and PostgreSQL: one holder at a time, a
//! takeover once a lease expires, and a replaced holder's late writes refused with nothing
//! written.

use crate::common;

use std::time::Duration;

use common::payments::{Tx, config, engine, start_time};
use common::topup;
use payrecon::Error;
use payrecon::OrderRef;
use payrecon_chain_core::{BlockId, ChainCursor, Method, Network};

fn cursor(height: u64) -> ChainCursor {
    ChainCursor {
        tip: BlockId {
            height,
            hash: format!("{height:064x}"),
        },
        checkpoints: Vec::new(),
    }
}

on_both_databases! {
    async fn one_holder_at_a_time_and_a_stale_holder_is_fenced_off(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let pay = engine.create_payment(&OrderRef::new("T1").unwrap(), Method::Ltc).await.unwrap();
        let tx = Tx::new(Network::Litecoin, "aa", &pay.intent.watch_key, Method::Ltc, pay.intent.amount.base_units(), start_time());
        let ttl = Duration::from_millis(400);

        let a = engine.acquire_lease(Network::Litecoin, "process-a", ttl).await.unwrap().expect("a free lease");
        assert!(engine.acquire_lease(Network::Litecoin, "process-b", ttl).await.unwrap().is_none(), "a live lease is a's");
        assert!(engine.acquire_lease(Network::Bitcoin, "process-b", ttl).await.unwrap().is_some(), "leases are per network");
        assert!(engine.renew_lease(&a, ttl).await.unwrap());
        engine.apply_chain_events_fenced(&[tx.observed(0, 10)], &cursor(10), &a).await.unwrap();

        // a stalls past its lease; b takes over with the next token.
        tokio::time::sleep(ttl + Duration::from_millis(200)).await;
        let b = engine.acquire_lease(Network::Litecoin, "process-b", ttl).await.unwrap().expect("an expired lease");
        assert_eq!(b.token, a.token + 1);
        assert_eq!(engine.lease_holder(Network::Litecoin).await.unwrap(), Some(("process-b".into(), b.token)));

        // a wakes up and writes: refused, nothing written (not the event, not the cursor).
        let late = engine.apply_chain_events_fenced(&[tx.observed(6, 15)], &cursor(15), &a).await;
        assert!(matches!(late, Err(Error::LeaseLost(Network::Litecoin))), "{late:?}");
        assert_eq!(engine.watcher_cursor(Network::Litecoin).await.unwrap().unwrap().tip.height, 10);
        assert_eq!(engine.transfers_for(&OrderRef::new("T1").unwrap()).await.unwrap()[0].confirmations, 0);
        assert!(!engine.renew_lease(&a, ttl).await.unwrap(), "a's renewal fails too");

        // b writes; then gives the lease up at shutdown and a takes over at once.
        engine.apply_chain_events_fenced(&[tx.observed(6, 15)], &cursor(15), &b).await.unwrap();
        assert_eq!(engine.transfers_for(&OrderRef::new("T1").unwrap()).await.unwrap()[0].confirmations, 6);
        engine.release_lease(&b).await.unwrap();
        let again = engine.acquire_lease(Network::Litecoin, "process-a", ttl).await.unwrap().expect("a released lease");
        assert_eq!(again.token, b.token + 1);
        let stale_b = engine.apply_chain_events_fenced(&[], &cursor(16), &b).await;
        assert!(matches!(stale_b, Err(Error::LeaseLost(_))));
    }
}
