//! The database: SQLite (embedded default) or PostgreSQL (production), chosen by URL.
//!
//! Every SQL statement payrecon runs lives in this module's children, one place each.
//! One code path serves both databases through sqlx's `Any` driver; amounts are stored as
//! exact integers (cents as BIGINT, base units as decimal text), which `Any` carries
//! losslessly on both. Where the dialects differ (row locks), the statement comes in two
//! spellings side by side.

pub mod cursors;
pub mod leases;
pub mod ledger;
pub mod operations;
pub mod orders;
pub mod payments;
pub mod reports;

use std::sync::Arc;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{Any, AnyConnection, AnyPool, ConnectOptions, Executor, SqlSafeStr, Transaction};
use tokio::sync::{Mutex, OwnedMutexGuard};

/// How long a connection waits for another process's SQLite write lock before giving up.
const SQLITE_BUSY_TIMEOUT_MS: u32 = 10_000;

/// Connections per pool. SQLite has one writer anyway; PostgreSQL serves the API and watchers.
const SQLITE_MAX_CONNECTIONS: u32 = 4;
const POSTGRES_MAX_CONNECTIONS: u32 = 16;

/// How long to wait for a free pooled connection.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// The schema, in order. Each version has one script per database.
const MIGRATIONS: [(i64, &str, &str, &str); 6] = [
    (
        1,
        "foundation",
        include_str!("../../migrations/sqlite/0001_foundation.sql"),
        include_str!("../../migrations/postgres/0001_foundation.sql"),
    ),
    (
        2,
        "payments",
        include_str!("../../migrations/sqlite/0002_payments.sql"),
        include_str!("../../migrations/postgres/0002_payments.sql"),
    ),
    (
        3,
        "watcher cursors",
        include_str!("../../migrations/sqlite/0003_watcher_cursors.sql"),
        include_str!("../../migrations/postgres/0003_watcher_cursors.sql"),
    ),
    (
        4,
        "transfer block height",
        include_str!("../../migrations/sqlite/0004_transfer_block_height.sql"),
        include_str!("../../migrations/postgres/0004_transfer_block_height.sql"),
    ),
    (
        5,
        "operations",
        include_str!("../../migrations/sqlite/0005_operations.sql"),
        include_str!("../../migrations/postgres/0005_operations.sql"),
    ),
    (
        6,
        "watcher leases",
        include_str!("../../migrations/sqlite/0006_watcher_leases.sql"),
        include_str!("../../migrations/postgres/0006_watcher_leases.sql"),
    ),
];

/// Which database a [`Store`] talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// One file, WAL mode, one writer at a time.
    Sqlite,
    /// A server shared by several payrecon processes.
    Postgres,
}

impl Backend {
    /// Picks the statement for this database: SQLite serializes writers with
    /// `BEGIN IMMEDIATE`, so it has no row locks; PostgreSQL locks rows with `FOR UPDATE`.
    pub(crate) fn pick(self, sqlite: &'static str, postgres: &'static str) -> &'static str {
        match self {
            Backend::Sqlite => sqlite,
            Backend::Postgres => postgres,
        }
    }
}

/// A connection pool to payrecon's database.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// SQLite admits one writer; queueing them here is cheaper than SQLite's busy polling.
    sqlite_writer: Option<Arc<Mutex<()>>>,
}

impl Store {
    /// Connects to `sqlite://path` (created if missing) or `postgres://…`.
    ///
    /// Does not migrate; see [`Store::migrate`].
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = backend_of(url)?;
        let (url, max_connections) = match backend {
            Backend::Sqlite => sqlite_url(url),
            Backend::Postgres => (url.to_owned(), POSTGRES_MAX_CONNECTIONS),
        };
        // Reports stream long reads on purpose: a slow statement is for debugging, not a warning.
        let options: AnyConnectOptions = url
            .parse::<AnyConnectOptions>()
            .map_err(StoreError::Connect)?
            .log_slow_statements(log::LevelFilter::Debug, Duration::from_secs(1));
        let pool = AnyPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        configure_sqlite(conn).await?;
                    }
                    Ok(())
                })
            })
            .connect_with(options)
            .await
            .map_err(StoreError::Connect)?;
        Ok(Store {
            pool,
            backend,
            sqlite_writer: (backend == Backend::Sqlite).then(|| Arc::new(Mutex::new(()))),
        })
    }

    /// Brings the schema up to date; safe to run on every start and from several processes.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let migrations = MIGRATIONS
            .iter()
            .map(|(version, description, sqlite, postgres)| {
                Migration::new(
                    *version,
                    (*description).into(),
                    MigrationType::Simple,
                    self.backend.pick(sqlite, postgres).into_sql_str(),
                    false,
                )
            })
            .collect();
        let migrator = Migrator::with_migrations(migrations);
        match self.backend {
            // PostgreSQL: the migrator serializes concurrent runs with an advisory lock.
            Backend::Postgres => migrator.run(&self.pool).await.map_err(StoreError::Migrate),
            // SQLite has no advisory locks: holding the write lock for the whole run makes a
            // second process wait, then find the schema applied.
            Backend::Sqlite => {
                let mut tx = self.begin_write().await?;
                migrator.run(tx.conn()).await.map_err(StoreError::Migrate)?;
                tx.commit().await
            }
        }
    }

    /// Which database this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The pool, for reads outside a write transaction.
    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Starts a transaction that will write.
    ///
    /// On SQLite it takes the write lock up front (`BEGIN IMMEDIATE`), so a transaction that
    /// reads a balance and then debits it can never act on a stale read.
    pub(crate) async fn begin_write(&self) -> Result<WriteTx, StoreError> {
        let writer = match &self.sqlite_writer {
            Some(lock) => Some(lock.clone().lock_owned().await),
            None => None,
        };
        let tx = match self.backend {
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => self.pool.begin().await?,
        };
        Ok(WriteTx {
            tx,
            backend: self.backend,
            _writer: writer,
        })
    }

    /// Checks that the database answers (readiness).
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Closes every connection; pending writes have already committed or rolled back.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// A write transaction. Dropped without [`WriteTx::commit`], it rolls back: nothing
/// half-written survives an error.
pub(crate) struct WriteTx {
    tx: Transaction<'static, Any>,
    backend: Backend,
    _writer: Option<OwnedMutexGuard<()>>,
}

impl WriteTx {
    /// The connection inside the transaction.
    pub(crate) fn conn(&mut self) -> &mut AnyConnection {
        &mut self.tx
    }

    /// Which database this is.
    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }

    /// Makes everything written durable at once.
    pub(crate) async fn commit(self) -> Result<(), StoreError> {
        self.tx.commit().await.map_err(StoreError::Database)
    }
}

fn backend_of(url: &str) -> Result<Backend, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Backend::Sqlite)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Backend::Postgres)
    } else {
        Err(StoreError::UnsupportedUrl(
            url.split(':').next().unwrap_or_default().to_owned(),
        ))
    }
}

/// Creates the file if missing, and keeps an in-memory database on one connection (each
/// connection would otherwise see its own empty database).
fn sqlite_url(url: &str) -> (String, u32) {
    let in_memory = url.contains(":memory:") || url.contains("mode=memory");
    let url = if url.contains("mode=") || in_memory {
        url.to_owned()
    } else if url.contains('?') {
        format!("{url}&mode=rwc")
    } else {
        format!("{url}?mode=rwc")
    };
    (url, if in_memory { 1 } else { SQLITE_MAX_CONNECTIONS })
}

/// WAL lets readers run beside the writer; NORMAL sync is durable across process crashes
/// in WAL mode; foreign keys are off in SQLite unless asked for.
async fn configure_sqlite(conn: &mut AnyConnection) -> Result<(), sqlx::Error> {
    conn.execute("PRAGMA journal_mode = WAL").await?;
    conn.execute("PRAGMA synchronous = NORMAL").await?;
    conn.execute("PRAGMA foreign_keys = ON").await?;
    let busy = format!("PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}");
    conn.execute(sqlx::AssertSqlSafe(busy)).await?;
    Ok(())
}

/// Builds `(…), (…)` placeholders for a multi-row insert. Only placeholders, never values,
/// go into the SQL text.
///
/// SQLite gets anonymous `?`: it resolves each named `$N` by a linear scan of the statement's
/// parameters, which made binding a large batch quadratic. PostgreSQL requires `$N`.
pub(crate) fn values_placeholders(backend: Backend, columns: usize, rows: usize) -> String {
    let row = |row: usize| -> String {
        let cells: Vec<String> = (0..columns)
            .map(|column| match backend {
                Backend::Sqlite => "?".to_owned(),
                Backend::Postgres => format!("${}", row * columns + column + 1),
            })
            .collect();
        format!("({})", cells.join(", "))
    };
    (0..rows).map(row).collect::<Vec<_>>().join(", ")
}

/// Builds the placeholders of an `IN (…)` list of `count` values.
pub(crate) fn list_placeholders(backend: Backend, count: usize) -> String {
    let row = values_placeholders(backend, count, 1);
    row[1..row.len() - 1].to_owned()
}

/// A database failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL names a database payrecon does not support.
    #[error("unsupported database URL scheme {0:?}: use sqlite://path or postgres://…")]
    UnsupportedUrl(String),
    /// The database could not be reached or opened.
    #[error("cannot open the database: {0}")]
    Connect(sqlx::Error),
    /// The schema could not be brought up to date.
    #[error("cannot migrate the database: {0}")]
    Migrate(sqlx::migrate::MigrateError),
    /// A query failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A stored value that payrecon could not have written.
    #[error("corrupt row in the database: {0}")]
    Corrupt(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_number_rows_in_order() {
        assert_eq!(
            values_placeholders(Backend::Postgres, 2, 2),
            "($1, $2), ($3, $4)"
        );
        assert_eq!(values_placeholders(Backend::Sqlite, 2, 2), "(?, ?), (?, ?)");
        assert_eq!(list_placeholders(Backend::Postgres, 3), "$1, $2, $3");
        assert_eq!(list_placeholders(Backend::Sqlite, 2), "?, ?");
    }

    #[test]
    fn urls_pick_the_backend() {
        assert_eq!(backend_of("sqlite://x.db").unwrap(), Backend::Sqlite);
        assert_eq!(backend_of("postgres://h/db").unwrap(), Backend::Postgres);
        assert!(matches!(
            backend_of("mysql://h/db"),
            Err(StoreError::UnsupportedUrl(s)) if s == "mysql"
        ));
        assert_eq!(sqlite_url("sqlite://x.db").0, "sqlite://x.db?mode=rwc");
        assert_eq!(sqlite_url("sqlite::memory:").1, 1);
    }
}
