//! Crash points: `payrecon serve` against the real Litecoin regtest node is aborted at each
//! named point inside event handling (`PAYRECON_CRASH_AT`), then restarted; the ledger it ends
//! with is the ledger of a run that never crashed, on SQLite and on PostgreSQL.

mod common;

use common::regtest::{Chain, eventually};
use common::serve::ServeConfig;
use common::{Db, TestDb};
use payrecon::crash::{CRASH_AT_ENV, CRASH_POINTS};

const PAYMENTS: usize = 3;

/// Pays `PAYMENTS` top-ups in one block, runs serve until `crash` aborts it (if any), then
/// serves to the end: what the ledger holds, without the ids that differ between runs.
async fn run(chain: &Chain, db: Db, crash: Option<&str>) -> String {
    let database = TestDb::new(db).await;
    let config = ServeConfig::litecoin(&chain.electrum_url, "");
    let config = match db {
        Db::Postgres => config.on_database(&database.url),
        Db::Sqlite => config,
    };
    let mut intents = Vec::new();
    for (id, address) in config.topups(PAYMENTS, "ltc") {
        chain.send(&address, "1").await;
        intents.push(id);
    }
    chain.mine(1).await;
    if let Some(point) = crash {
        let status = config.serve_until_exit(&[(CRASH_AT_ENV, point)]).await;
        assert!(!status.success(), "{point}: serve aborted, {status:?}");
    }
    let serving = config.serve();
    eventually("every payment to be credited after the restart", || async {
        intents
            .iter()
            .all(|id| config.cli(&["pay", "show", id])["status"] == "settled")
    })
    .await;
    serving.stop().await;
    let trial = config.cli(&["ledger", "trial-balance"]);
    assert_eq!(trial["sound"], true);
    let accounts: Vec<String> = trial["trial_balance"]["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| format!("{} {} {}", a["account"], a["currency"], a["balance"]))
        .collect();
    format!(
        "entries {} postings {}\n{}\nbalance {}",
        trial["trial_balance"]["entries"],
        trial["trial_balance"]["postings"],
        accounts.join("\n"),
        config.cli(&["balance", "42"])["available_usd"]
    )
}

on_both_databases! {
    async fn a_crash_at_any_point_of_event_handling_loses_and_doubles_nothing(db) {
        let chain = Chain::lock().await;
        let uninterrupted = run(&chain, db.db, None).await;
        assert!(uninterrupted.contains("balance \"300.00\""), "{uninterrupted}");
        for point in CRASH_POINTS {
            assert_eq!(run(&chain, db.db, Some(point)).await, uninterrupted, "after a crash at {point}");
        }
    }
}
