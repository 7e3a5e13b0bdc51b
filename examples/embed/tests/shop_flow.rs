//! The embedding shop's flow on both databases: SQLite in a temporary file, and PostgreSQL at
//! DATABASE_URL (which `scripts/test.sh` always sets, starting a throwaway server if needed).

use payrecon::{Engine, IntentStatus, Usd};
use payrecon_embed_example::{config, shop_flow};

fn quotes_file() -> String {
    format!(
        "{}/../../fixtures/rates/recorded-quotes.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// Unique per test run, so that runs against one PostgreSQL database never meet.
fn run_id(database: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{database}{}{nanos}", std::process::id())
}

async fn check(database_url: &str, database: &str) {
    let engine = Engine::from_config(&config(database_url, &quotes_file()).unwrap())
        .await
        .unwrap();
    assert_eq!(engine.database_backend(), database);
    let run = run_id(database);
    let outcome = shop_flow(&engine, &format!("customer-{run}"), &run)
        .await
        .unwrap();
    assert_eq!(outcome.intent_status, IntentStatus::Settled);
    assert!(outcome.events >= 2, "created and settled: {outcome:?}");
    assert_eq!(outcome.balance_after, Usd::from_dollars(80));
    assert!(
        outcome.report_csv.lines().any(|l| l.starts_with("ltc,")),
        "{}",
        outcome.report_csv
    );
    assert!(outcome.ledger_sound);
}

#[tokio::test]
async fn the_shop_flow_runs_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    check(
        &format!("sqlite://{}/shop.db", dir.path().display()),
        "sqlite",
    )
    .await;
}

#[tokio::test]
async fn the_shop_flow_runs_on_postgres() {
    let url = std::env::var("DATABASE_URL")
        .expect("DATABASE_URL names the PostgreSQL database (scripts/test.sh sets it)");
    check(&url, "postgres").await;
}
