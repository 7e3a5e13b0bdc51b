//! Test support: a fresh database per test, on SQLite and on PostgreSQL.
//!
//! PostgreSQL comes from `DATABASE_URL` (scripts/test.sh provides one, starting a throwaway
//! server when none is given). Without it the PostgreSQL half of each test fails loudly:
//! store tests are never skipped.

#![allow(dead_code)]

pub mod anvil;
pub mod books;
pub mod checks;
pub mod faults;
pub mod outflows;
pub mod payments;
pub mod regtest;
pub mod replay;
pub mod seed;
pub mod serve;
pub mod solana;
pub mod tour;
pub mod tron;

use payrecon::Engine;
use payrecon::ledger::{Account, Currency, EntryKind, NewEntry, Posting};
use payrecon::test_utils::api::ServerLimits;
use payrecon::{AccountId, RentalOrderRequest, TopupRequest};
use payrecon_chain_core::Method;

/// Which database a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
}

/// A database of its own for one test: a SQLite file in a temporary directory, or a
/// PostgreSQL schema dropped when the test ends.
pub struct TestDb {
    pub url: String,
    pub db: Db,
    _dir: Option<tempfile::TempDir>,
    pg_schema: Option<(String, String)>,
}

/// The PostgreSQL server the tests use.
/// The repository's root: the guides, scripts and fixtures the tests read.
pub fn repo_root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn postgres_admin_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "PostgreSQL tests need DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/test); \
             run scripts/test.sh, which starts a throwaway PostgreSQL when none is given"
        )
    })
}

impl TestDb {
    pub async fn new(db: Db) -> TestDb {
        match db {
            Db::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}", dir.path().join("payrecon.db").display());
                TestDb {
                    url,
                    db,
                    _dir: Some(dir),
                    pg_schema: None,
                }
            }
            Db::Postgres => {
                let admin = postgres_admin_url();
                let schema = format!("payrecon_test_{}", uuid::Uuid::new_v4().simple());
                run_admin_sql(&admin, &format!("CREATE SCHEMA {schema}")).await;
                let separator = if admin.contains('?') { '&' } else { '?' };
                let url = format!("{admin}{separator}options[search_path]={schema}");
                TestDb {
                    url,
                    db,
                    _dir: None,
                    pg_schema: Some((admin, schema)),
                }
            }
        }
    }

    /// A SQLite database at `path`, owned by someone else (a `payrecon serve` under test).
    pub fn sqlite_at(path: &std::path::Path) -> TestDb {
        TestDb {
            url: format!("sqlite://{}", path.display()),
            db: Db::Sqlite,
            _dir: None,
            pg_schema: None,
        }
    }

    /// An engine over this database, migrated.
    pub async fn engine(&self) -> Engine {
        Engine::open(&self.url).await.expect("open engine")
    }
}

/// A copy of a test database taken as an operator takes one: `payrecon backup` (SQLite's
/// `VACUUM INTO`) while the engine runs, or `pg_dump` of the PostgreSQL schema.
pub enum Backup {
    Sqlite(tempfile::TempDir),
    Postgres { dump: String, schema: String },
}

impl TestDb {
    /// Backs this database up while `engine` uses it.
    pub async fn backup(&self, engine: &Engine) -> Backup {
        match &self.pg_schema {
            None => {
                let dir = tempfile::tempdir().expect("temp dir");
                let report = engine
                    .backup(&dir.path().join("backup.db"))
                    .await
                    .expect("backup");
                assert_eq!(report.integrity, "ok");
                Backup::Sqlite(dir)
            }
            Some((admin, schema)) => {
                let dumped = std::process::Command::new("pg_dump")
                    .args(["--no-owner", "--schema", schema, "--dbname", admin])
                    .output()
                    .expect("pg_dump runs");
                assert!(
                    dumped.status.success(),
                    "pg_dump: {}",
                    String::from_utf8_lossy(&dumped.stderr)
                );
                Backup::Postgres {
                    dump: String::from_utf8(dumped.stdout).expect("a text dump"),
                    schema: schema.clone(),
                }
            }
        }
    }

    /// What the operator does after a restore: on PostgreSQL `payrecon restored` (a `pg_dump`
    /// carries no mark); a SQLite copy `payrecon backup` wrote says so itself.
    pub async fn after_restore(&self, engine: &Engine) {
        if self.pg_schema.is_some() {
            engine.restored().await.expect("payrecon restored");
        }
    }

    /// A new database restored from `backup` (`psql` of the dump, into a schema of its own).
    pub async fn restore(backup: &Backup) -> TestDb {
        match backup {
            Backup::Sqlite(dir) => {
                let restored = tempfile::tempdir().expect("temp dir");
                let path = restored.path().join("payrecon.db");
                std::fs::copy(dir.path().join("backup.db"), &path).expect("copy the backup");
                TestDb {
                    url: format!("sqlite://{}", path.display()),
                    db: Db::Sqlite,
                    _dir: Some(restored),
                    pg_schema: None,
                }
            }
            Backup::Postgres { dump, schema } => {
                let admin = postgres_admin_url();
                let restored = format!("payrecon_test_{}", uuid::Uuid::new_v4().simple());
                let file = tempfile::NamedTempFile::new().expect("temp file");
                std::fs::write(file.path(), dump.replace(schema.as_str(), &restored))
                    .expect("write the dump");
                let loaded = std::process::Command::new("psql")
                    .args([
                        "--quiet",
                        "-v",
                        "ON_ERROR_STOP=1",
                        "--dbname",
                        &admin,
                        "--file",
                    ])
                    .arg(file.path())
                    .output()
                    .expect("psql runs");
                assert!(
                    loaded.status.success(),
                    "psql: {}",
                    String::from_utf8_lossy(&loaded.stderr)
                );
                let separator = if admin.contains('?') { '&' } else { '?' };
                TestDb {
                    url: format!("{admin}{separator}options[search_path]={restored}"),
                    db: Db::Postgres,
                    _dir: None,
                    pg_schema: Some((admin, restored)),
                }
            }
        }
    }
}

async fn run_admin_sql(admin_url: &str, sql: &str) {
    use sqlx::Connection;
    let mut conn = sqlx::postgres::PgConnection::connect(admin_url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at DATABASE_URL: {e}"));
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut conn)
        .await
        .expect("admin SQL");
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some((admin, schema)) = self.pg_schema.take() {
            let cleanup = std::thread::spawn(move || {
                let runtime = tokio::runtime::Runtime::new().expect("runtime");
                runtime.block_on(run_admin_sql(
                    &admin,
                    &format!("DROP SCHEMA {schema} CASCADE"),
                ));
            });
            let _ = cleanup.join();
        }
    }
}

/// POSTs a JSON body and returns the answer's bytes: how the tests talk JSON-RPC to nodes.
pub async fn post_json(
    request: reqwest::RequestBuilder,
    body: impl Into<reqwest::Body>,
) -> axum::body::Bytes {
    request
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("the node is reachable")
        .bytes()
        .await
        .expect("the node answers")
}

/// One multi-threaded runtime for property tests, which drive async code from sync closures.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .expect("runtime")
    })
}

/// Defines each test twice, as `<name>::sqlite` and `<name>::postgres`.
#[macro_export]
macro_rules! on_both_databases {
    ($(async fn $name:ident($db:ident) $body:block)*) => {$(
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                let $db = $crate::common::TestDb::new($crate::common::Db::Sqlite).await;
                $body
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                let $db = $crate::common::TestDb::new($crate::common::Db::Postgres).await;
                $body
            }
        }
    )*};
}

/// Like `on_both_databases!`, and each database with both Litecoin sources (Electrum and
/// the full node): `$source` is a `common::regtest::Source`.
#[macro_export]
macro_rules! on_both_databases_and_sources {
    ($(async fn $name:ident($db:ident, $source:ident) $body:block)*) => {$(
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn run($db: $crate::common::TestDb, $source: $crate::common::regtest::Source) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite_electrum() {
                run($crate::common::TestDb::new($crate::common::Db::Sqlite).await, $crate::common::regtest::Source::Electrum).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite_node() {
                run($crate::common::TestDb::new($crate::common::Db::Sqlite).await, $crate::common::regtest::Source::Node).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres_electrum() {
                run($crate::common::TestDb::new($crate::common::Db::Postgres).await, $crate::common::regtest::Source::Electrum).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres_node() {
                run($crate::common::TestDb::new($crate::common::Db::Postgres).await, $crate::common::regtest::Source::Node).await
            }
        }
    )*};
}

pub fn account(id: &str) -> AccountId {
    AccountId::new(id).expect("valid account id")
}

pub fn rental(reference: &str, account_id: &str, total_usd: &str) -> RentalOrderRequest {
    RentalOrderRequest {
        reference: reference.into(),
        account_id: account_id.into(),
        gpu_model: "H100".into(),
        duration_days: 7,
        lots: 1,
        total_usd: total_usd.parse().expect("usd"),
    }
}

pub fn topup(reference: &str, account_id: &str, dollars: &str) -> TopupRequest {
    TopupRequest {
        reference: reference.into(),
        account_id: account_id.into(),
        amount_usd: dollars.parse().expect("usd"),
    }
}

/// The brief's confirmed top-up: BTC into custody, converted at the locked rate, USD
/// credited to the customer. Issue 3's matcher posts exactly this shape.
pub fn btc_topup_credit(key: &str, customer: &str, sats: i128, usd_cents: i128) -> NewEntry {
    let btc = Currency::Crypto(Method::Btc);
    NewEntry {
        idempotency_key: key.into(),
        kind: EntryKind::Payment,
        reference: Some(key.into()),
        memo: "confirmed top-up".into(),
        postings: vec![
            Posting::debit(Account::Custody(Method::Btc), btc, sats),
            Posting::credit(Account::Fx(Method::Btc), btc, sats),
            Posting::debit(Account::Fx(Method::Btc), Currency::Usd, usd_cents),
            Posting::credit(
                Account::CustomerBalance(account(customer)),
                Currency::Usd,
                usd_cents,
            ),
        ],
    }
}

/// Credits `usd_cents` to `customer` as a confirmed BTC top-up would.
pub async fn fund(engine: &Engine, key: &str, customer: &str, usd_cents: i128) {
    engine
        .post_entry(&btc_topup_credit(key, customer, 625_000, usd_cents))
        .await
        .expect("fund");
}

/// `engine`'s API and pages (`payrecon::router` with `options`) served with `limits` on a free
/// local port: the switch that stops it, to hold for the server's life, and its address.
pub async fn serve_api(
    engine: &Engine,
    options: payrecon::ApiOptions,
    limits: ServerLimits,
) -> (tokio::sync::watch::Sender<bool>, std::net::SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let app = payrecon::router(engine.clone(), options, shutdown.clone());
    tokio::spawn(async move {
        payrecon::test_utils::api::serve(listener, app, limits, shutdown)
            .await
            .unwrap()
    });
    (stop, address)
}
