//! Upgrades from every earlier schema, on SQLite and PostgreSQL: a database holding every
//! intent state and exception kind, entries and their reversal, an operator's action and a
//! closed period is written back into the schema of each earlier version (the real migrations
//! of that version, applied by the migrator as that version's payrecon applied them; the rows
//! its tables and columns held), upgraded in place, and must give the same figures.

use crate::common;

use chrono::Duration;
use common::payments::{config, engine};
use common::seed::seed;
use common::{Db, TestDb};
use payrecon::test_utils::clock::Clock;
use payrecon::test_utils::report::{CsvSection, ReportFormat, ReportQuery};
use payrecon::test_utils::store::Store;
use payrecon::{Engine, HoldingsSort};
use sqlx::{Connection, Row};

/// Every figure an upgrade must keep.
#[derive(Debug, PartialEq)]
struct Figures {
    trial_balance: String,
    reconciliation: String,
    holdings: String,
    exceptions: Vec<(String, String, Option<String>)>,
    closed_report: Option<String>,
}

async fn figures(
    engine: &Engine,
    now: chrono::DateTime<chrono::Utc>,
    closed: Option<payrecon::Period>,
) -> Figures {
    let query = ReportQuery {
        from: now - Duration::days(60),
        to: now + Duration::days(1),
        method: None,
    };
    let mut reconciliation = Vec::new();
    engine
        .write_reconciliation(
            &query,
            ReportFormat::Json,
            CsvSection::Transfers,
            &mut reconciliation,
        )
        .await
        .unwrap();
    let holdings = engine
        .holdings(None, HoldingsSort::Address, true, 0, 1000)
        .await
        .unwrap();
    let exceptions = engine.exceptions(None).await.unwrap();
    Figures {
        trial_balance: format!("{:?}", engine.trial_balance().await.unwrap()),
        reconciliation: String::from_utf8(reconciliation).unwrap(),
        holdings: serde_json::to_string(&(holdings.totals, holdings.addresses)).unwrap(),
        exceptions: exceptions
            .into_iter()
            .map(|e| (e.id, e.detail, e.resolution))
            .collect(),
        closed_report: match closed {
            Some(period) => Some(engine.period_report(period).await.unwrap()),
            None => None,
        },
    }
}

/// The tables of the schema `url` holds, each with its columns.
async fn tables(db: &TestDb) -> Vec<(String, Vec<String>)> {
    let mut conn = sqlx::AnyConnection::connect(&db.url).await.unwrap();
    let names: Vec<String> = match db.db {
        Db::Sqlite => sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name <> '_sqlx_migrations' ORDER BY name").fetch_all(&mut conn).await.unwrap(),
        Db::Postgres => sqlx::query_scalar("SELECT CAST(table_name AS TEXT) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name <> '_sqlx_migrations' ORDER BY table_name").fetch_all(&mut conn).await.unwrap(),
    };
    let mut tables = Vec::new();
    for name in names {
        let columns: Vec<String> = match db.db {
            Db::Sqlite => sqlx::query(sqlx::AssertSqlSafe(format!("PRAGMA table_info({name})"))).fetch_all(&mut conn).await.unwrap().iter().map(|row| row.get::<String, _>(1)).collect(),
            Db::Postgres => sqlx::query_scalar("SELECT CAST(column_name AS TEXT) FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position").bind(&name).fetch_all(&mut conn).await.unwrap(),
        };
        tables.push((name, columns));
    }
    tables
}

/// Copies the rows of `from` into `to`, whose schema is older: the tables and columns `to`
/// has, as that version wrote them.
async fn copy_rows(from: &TestDb, to: &TestDb) {
    let tables = tables(to).await;
    match to.db {
        Db::Sqlite => {
            let mut conn = sqlx::AnyConnection::connect(&to.url).await.unwrap();
            let source = from.url.trim_start_matches("sqlite://");
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "PRAGMA foreign_keys = OFF; ATTACH DATABASE '{source}' AS rich"
            )))
            .execute(&mut conn)
            .await
            .unwrap();
            for (table, columns) in &tables {
                let columns = columns.join(", ");
                // A migration's own rows (a singleton's) give way to the rows the database held.
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DELETE FROM main.{table}; INSERT INTO main.{table} ({columns}) SELECT {columns} FROM rich.{table}"))).execute(&mut conn).await.unwrap();
            }
        }
        Db::Postgres => {
            let (rich, old) = (schema_of(from), schema_of(to));
            let mut conn = sqlx::AnyConnection::connect(&common::postgres_admin_url())
                .await
                .unwrap();
            sqlx::raw_sql("SET session_replication_role = replica")
                .execute(&mut conn)
                .await
                .unwrap();
            for (table, columns) in &tables {
                let columns = columns.join(", ");
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DELETE FROM {old}.{table}; INSERT INTO {old}.{table} ({columns}) OVERRIDING SYSTEM VALUE SELECT {columns} FROM {rich}.{table}"))).execute(&mut conn).await.unwrap();
            }
            // Serial columns go on from the copied rows, as they would have.
            let serials: Vec<(String, String)> = sqlx::query_as("SELECT CAST(table_name AS TEXT), CAST(column_name AS TEXT) FROM information_schema.columns WHERE table_schema = $1 AND (column_default LIKE 'nextval%' OR is_identity = 'YES')").bind(&old).fetch_all(&mut conn).await.unwrap();
            for (table, column) in serials {
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SELECT setval(pg_get_serial_sequence('{old}.{table}', '{column}'), COALESCE((SELECT MAX({column}) FROM {old}.{table}), 0) + 1, false)"))).execute(&mut conn).await.unwrap();
            }
        }
    }
}

/// The report with the block of every transfer a reorg removed left out.
fn removed_blocks_unknown(report: &str) -> String {
    let mut out = String::new();
    let mut rest = report;
    while let Some(at) = rest.find("\"block\":\"") {
        let (before, after) = rest.split_at(at);
        out.push_str(before);
        let value_end = after[9..].find('"').map_or(after.len(), |end| 9 + end + 1);
        let removed = after[value_end..].starts_with(",\"state\":\"reorged\"");
        out.push_str(if removed {
            "\"block\":\"?\""
        } else {
            &after[..value_end]
        });
        rest = &after[value_end..];
    }
    out.push_str(rest);
    out
}

/// Where two texts part, with some context of each.
fn difference(got: &str, want: &str) -> String {
    let at = got
        .bytes()
        .zip(want.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    let context = |text: &str| {
        text.get(at.saturating_sub(120)..(at + 120).min(text.len()))
            .unwrap_or_default()
            .to_owned()
    };
    format!(
        "at byte {at}:\n got: {}\nwant: {}",
        context(got),
        context(want)
    )
}

fn schema_of(db: &TestDb) -> String {
    db.url.rsplit("search_path]=").next().unwrap().to_owned()
}

on_both_databases! {
    async fn every_earlier_schema_upgrades_in_place_and_keeps_every_figure(db) {
        let seeded = seed(&db).await;
        let engine = &seeded.engine;
        let unmatched = engine.exceptions(None).await.unwrap().into_iter().find(|e| e.kind == "unmatched").unwrap();
        engine.resolve_exception(&unmatched.id, &payrecon::Action::CreditBalance { account: Some("42".into()), usd: Some("8.00".parse().unwrap()) }, "anna", "the customer wrote in").await.unwrap();
        let month = engine.period_of(seeded.clock.now());
        engine.value_entries().await.unwrap();
        seeded.clock.advance(Duration::days(40));
        engine.close_period(month, "anna").await.unwrap();
        let closed = Some(month);
        let now = seeded.clock.now();
        let want = figures(engine, now, closed).await;
        assert!(engine.trial_balance().await.unwrap().is_sound());
        assert!(want.closed_report.as_deref().is_some_and(|report| !report.is_empty()));
        let handed_out: Vec<String> = seeded.intents.values().map(|i| i.intent.pay_to.clone()).collect();

        for version in 1..payrecon::SCHEMA_VERSION {
            let old = TestDb::new(db.db).await;
            Store::connect(&old.url).await.unwrap().migrate_to(version).await.unwrap();
            copy_rows(&db, &old).await;
            let upgraded = engine_at(&old, now).await;
            let got = figures(&upgraded, now, closed.filter(|_| version >= 12)).await;
            // What each schema held: the ledger from 1, payments and exceptions from 2,
            // operators' actions from 5, the books from 12.
            assert_eq!(got.trial_balance, want.trial_balance, "schema {version}");
            if version >= 2 {
                assert_eq!(got.holdings, want.holdings, "schema {version}");
                // Before schema 4 a transfer had no block: the upgrade derives it from its tip and
                // depth, which for one a reorg removed are those of its removal.
                let (got_report, want_report) = if version < 4 {
                    (removed_blocks_unknown(&got.reconciliation), removed_blocks_unknown(&want.reconciliation))
                } else {
                    (got.reconciliation.clone(), want.reconciliation.clone())
                };
                assert!(got_report == want_report, "schema {version}: the reconciliation report differs {}", difference(&got_report, &want_report));
                let unresolved = |figures: &Figures| -> Vec<(String, String)> {
                    figures.exceptions.iter().map(|(id, detail, _)| (id.clone(), detail.clone())).collect()
                };
                assert_eq!(unresolved(&got), unresolved(&want), "schema {version}");
            }
            if version >= 5 {
                assert_eq!(got.exceptions, want.exceptions, "schema {version}");
            }
            assert_eq!(got.closed_report, want.closed_report.clone().filter(|_| version >= 12), "schema {version}");
            if version >= 2 {
                upgraded.create_topup(&common::topup("U1", "42", "500")).await.unwrap();
                let next = upgraded.create_payment(&payrecon::OrderRef::new("U1").unwrap(), payrecon_chain_core::Method::Btc).await.unwrap();
                assert!(!handed_out.contains(&next.intent.pay_to), "schema {version}: {} was handed out before", next.intent.pay_to);
            }
        }
    }
}

/// An engine over `db` as the seeded one is configured, its clock at `now`.
async fn engine_at(db: &TestDb, now: chrono::DateTime<chrono::Utc>) -> Engine {
    let (engine, clock) = engine(db, config(|_| {})).await;
    clock.advance(now - clock.now());
    engine
}
