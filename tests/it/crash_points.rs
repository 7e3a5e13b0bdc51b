//! Crash points: `payrecon serve` against the real Litecoin regtest node is aborted at each
//! named point inside event handling (`PAYRECON_CRASH_AT`), then restarted; the ledger it ends
//! with is the ledger of a run that never crashed, on SQLite and on PostgreSQL.

use crate::common;

use common::regtest::{Chain, eventually};
use common::serve::ServeConfig;
use common::{Db, TestDb};
use payrecon::test_utils::crash::{CRASH_AT_ENV, CRASH_POINTS};
use tokio::sync::OnceCell;

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

/// The ledger of a run that never crashed, one run per database shared by every crash point's
/// test. Taken before a test holds a chain of its own, so waiting for it holds none.
async fn uninterrupted(db: Db) -> &'static str {
    static SQLITE: OnceCell<String> = OnceCell::const_new();
    static POSTGRES: OnceCell<String> = OnceCell::const_new();
    let cell = match db {
        Db::Sqlite => &SQLITE,
        Db::Postgres => &POSTGRES,
    };
    cell.get_or_init(|| async move {
        let ledger = run(&Chain::lock().await, db, None).await;
        assert!(ledger.contains("balance \"300.00\""), "{ledger}");
        ledger
    })
    .await
}

/// Serve aborted at `point`, then restarted, ends with the ledger of a run that never crashed.
async fn crash_at(db: Db, point: &str) {
    let expected = uninterrupted(db).await;
    let chain = Chain::lock().await;
    assert_eq!(
        run(&chain, db, Some(point)).await,
        expected,
        "after a crash at {point}"
    );
}

/// Each point has a test of its own (they run side by side, each on a chain of its own); the
/// last one's is in `handout`.
const TESTED: [&str; 6] = [
    "watcher.after_scan",
    "apply.after_event",
    "ledger.before_postings",
    "apply.before_commit",
    "apply.after_commit",
    "indexes.after_block",
];

#[test]
fn every_crash_point_has_a_test() {
    assert_eq!(CRASH_POINTS, TESTED);
}

on_both_databases! {
    async fn a_crash_after_the_scan_loses_and_doubles_nothing(db) {
        crash_at(db.db, TESTED[0]).await;
    }

    async fn a_crash_after_an_event_loses_and_doubles_nothing(db) {
        crash_at(db.db, TESTED[1]).await;
    }

    async fn a_crash_before_the_postings_loses_and_doubles_nothing(db) {
        crash_at(db.db, TESTED[2]).await;
    }

    async fn a_crash_before_the_commit_loses_and_doubles_nothing(db) {
        crash_at(db.db, TESTED[3]).await;
    }

    async fn a_crash_after_the_commit_loses_and_doubles_nothing(db) {
        crash_at(db.db, TESTED[4]).await;
    }
}
