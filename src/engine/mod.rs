//! The library API the shop backend embeds: the engine, its builder, and its methods grouped
//! by who calls them (`shop`, `finance`, `operators`, `watchers`). Each call is one database
//! transaction: it either happens whole or not at all. The domain modules it calls take a
//! transaction or plain data and never name the engine.

mod books;
mod finance;
mod handout;
mod operators;
pub(crate) mod payment_refunds;
pub(crate) mod refund_chain;
pub(crate) mod refund_prepare;
pub(crate) mod refunds;
mod shop;
mod wallet;
mod watchers;

pub(crate) use watchers::place_of;

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::catalog::Catalog;
use crate::clock::{Clock, SystemClock};
use crate::config::{Config, Durability};
use crate::error::Error;
use crate::ledger::{Account, Currency, EntryKind, LedgerError, NewEntry, Posting};
use crate::matcher::MatcherPath;
use crate::money::Usd;
use crate::order::{AccountId, Order, OrderKind, OrderRef, OrderStatus, SettledVia, ValidOrder};
use crate::payments::PaymentSettings;
use crate::store::{self, Answers, GroupWrite, Store, StoreError, WriteFuture, WriteTx};

/// Wake-ups buffered per subscriber; the events themselves are in the database.
const EVENT_NOTIFICATIONS: usize = 64;

/// payrecon's engine: orders, top-ups, balances, payment instructions, matching and the
/// ledger over one database.
#[derive(Clone, Debug)]
pub struct Engine {
    store: Store,
    clock: Arc<dyn Clock>,
    payments: Arc<PaymentSettings>,
    events: tokio::sync::broadcast::Sender<()>,
    matcher_path: MatcherPath,
    catalog: Arc<Catalog>,
    books: Arc<books::Books>,
    handout: Arc<crate::keys::HandoutGate>,
    indexes: Arc<crate::indexes::IndexPools>,
}

/// The result of a create call: the order, and whether this call created it or found the
/// same order already there (a retry).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Created<T> {
    /// What is stored now.
    #[serde(flatten)]
    pub value: T,
    /// False when an identical earlier call had created it.
    pub created: bool,
}

/// The outcome of paying an order from the balance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BalancePayment {
    /// The order, now settled.
    pub order: Order,
    /// The customer's balance after the debit.
    pub balance_after: Usd,
    /// False when the order had already been paid from the balance by an earlier call.
    pub debited_now: bool,
}

impl Engine {
    /// Opens the database and builds payment settings from `config`; a configuration that a
    /// network's watcher could not use is refused here, before anything runs on it.
    pub async fn from_config(config: &Config) -> Result<Engine, Error> {
        crate::networks::check(config)?;
        let mut settings = PaymentSettings::from_config(config)?;
        let engine =
            Engine::open_with(config.database_url.expose(), config.database_durability).await?;
        engine.register_keys(&mut settings).await?;
        let engine = engine
            .with_payment_settings(settings)
            .with_catalog(config.catalog.clone())?
            .with_books(config.books.clone())?;
        engine.restore_if_backup_copy().await?;
        Ok(engine)
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock().now()
    }

    /// Opens the database at `url`, bringing its schema up to date. Every commit is durable
    /// before it is acknowledged.
    pub async fn open(url: &str) -> Result<Engine, Error> {
        Engine::open_with(url, Durability::Full).await
    }

    /// [`Engine::open`] with an explicit [`Durability`](crate::Durability).
    pub async fn open_with(url: &str, durability: Durability) -> Result<Engine, Error> {
        let store = Store::connect_with(url, durability).await?;
        store.migrate().await?;
        Ok(Engine::with_store(store))
    }

    /// An engine over an already migrated store, on the system clock.
    fn with_store(store: Store) -> Engine {
        Engine {
            store,
            clock: Arc::new(SystemClock),
            payments: Arc::new(PaymentSettings::default()),
            events: tokio::sync::broadcast::channel(EVENT_NOTIFICATIONS).0,
            matcher_path: MatcherPath::default(),
            handout: Arc::default(),
            indexes: Arc::default(),
            catalog: Arc::new(Catalog::default()),
            books: Arc::new(
                books::Books::new(crate::config::BooksConfig::default())
                    .expect("the default books are valid"),
            ),
        }
    }

    /// Chooses how the matcher reads and writes. The default, [`MatcherPath::Batched`], is
    /// what to run; [`MatcherPath::OneByOne`] is the reference it is tested and measured
    /// against, and decides exactly alike.
    #[cfg(feature = "test-utils")]
    pub fn with_matcher_path(mut self, path: MatcherPath) -> Engine {
        self.matcher_path = path;
        self
    }

    /// How the matcher reads and writes.
    pub(crate) fn matcher_path(&self) -> MatcherPath {
        self.matcher_path
    }

    /// Replaces the payment settings (derivers, rates, matching rules).
    pub fn with_payment_settings(mut self, settings: PaymentSettings) -> Engine {
        self.payments = Arc::new(settings);
        self
    }

    /// Replaces what the shop sells (the default is the GPU shop's catalog); checked first.
    pub fn with_catalog(mut self, catalog: Catalog) -> Result<Engine, Error> {
        let catalog = catalog
            .validated()
            .map_err(|e| Error::Config(e.to_string()))?;
        self.catalog = Arc::new(catalog);
        Ok(self)
    }

    /// What the shop sells.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The payment settings in force.
    pub fn payment_settings(&self) -> &PaymentSettings {
        &self.payments
    }

    /// The engine's clock.
    pub(crate) fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    /// A wake-up each time new intent events were committed; read them with
    /// [`Engine::events_after`]. A lagging receiver only loses wake-ups, never events.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<()> {
        self.events.subscribe()
    }

    pub(crate) fn notify_events(&self) {
        let _ = self.events.send(());
    }

    /// Replaces the clock (tests and simulations).
    #[cfg(feature = "test-utils")]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Engine {
        self.clock = clock;
        self
    }

    /// `sqlite` or `postgres`: which database this engine runs on.
    pub fn database_backend(&self) -> &'static str {
        match self.store.backend() {
            store::Backend::Sqlite => "sqlite",
            store::Backend::Postgres => "postgres",
        }
    }

    /// A consistent copy of the SQLite database at `path` while `serve` runs, checked with
    /// SQLite's integrity check before it is reported. PostgreSQL is refused with the advice to
    /// use its own tools.
    pub async fn backup(&self, path: &std::path::Path) -> Result<store::BackupReport, Error> {
        Ok(self.store.backup_to(path).await?)
    }

    /// The store, for the engine's methods in other modules.
    pub(crate) fn db(&self) -> &Store {
        &self.store
    }

    /// Holds back new addresses while a network's watcher first looks ahead of its counters.
    pub(crate) fn handout(&self) -> &crate::keys::HandoutGate {
        &self.handout
    }

    /// The store underneath (tests and the bench).
    #[cfg(feature = "test-utils")]
    pub fn store(&self) -> &Store {
        &self.store
    }
}

/// An order to store, as one caller of a group commit.
struct NewOrder {
    order: ValidOrder,
    now: DateTime<Utc>,
}

impl GroupWrite for NewOrder {
    type Output = Created<Order>;
    type Error = Error;
    const BATCHED: bool = true;

    fn run<'a>(&'a self, tx: &'a mut WriteTx) -> WriteFuture<'a, Created<Order>, Error> {
        Box::pin(store_order(tx, &self.order, self.now))
    }

    fn run_many<'a>(
        writes: Vec<&'a NewOrder>,
        tx: &'a mut WriteTx,
    ) -> WriteFuture<'a, Answers<Created<Order>, Error>, Error> {
        Box::pin(store_orders(tx, writes))
    }
}

/// Stores an order (its customer first) unless its reference exists: the same content again
/// is a retry, other content a conflict.
async fn store_order(
    tx: &mut WriteTx,
    order: &ValidOrder,
    now: DateTime<Utc>,
) -> Result<Created<Order>, Error> {
    let content_hash = order_fingerprint(order);
    store::orders::ensure_customer(tx.conn(), &order.account_id, now).await?;
    let created = store::orders::insert_order(tx.conn(), order, &content_hash, now).await?;
    let stored = store::orders::get_order(tx.conn(), &order.reference)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("order {} vanished", order.reference)))?;
    if !created && stored.content_hash != content_hash {
        return Err(Error::OrderConflict(order.reference.clone()));
    }
    Ok(Created {
        value: stored.order,
        created,
    })
}

/// [`store_order`] for many at once, in three statements: customers, orders, and reading them
/// back. Answers each as storing them one after the other would.
async fn store_orders(
    tx: &mut WriteTx,
    writes: Vec<&NewOrder>,
) -> Result<Answers<Created<Order>, Error>, Error> {
    let hashes: Vec<String> = writes.iter().map(|w| order_fingerprint(&w.order)).collect();
    let customers: Vec<(&AccountId, DateTime<Utc>)> = writes
        .iter()
        .map(|w| (&w.order.account_id, w.now))
        .collect();
    store::orders::ensure_customers(tx.conn(), &customers).await?;
    let mut first_of: HashMap<&str, usize> = HashMap::new();
    for (i, write) in writes.iter().enumerate() {
        first_of.entry(write.order.reference.as_str()).or_insert(i);
    }
    let new_rows: Vec<(&ValidOrder, &str, DateTime<Utc>)> = writes
        .iter()
        .enumerate()
        .filter(|(i, w)| first_of[w.order.reference.as_str()] == *i)
        .map(|(i, w)| (&w.order, hashes[i].as_str(), w.now))
        .collect();
    let inserted = store::orders::insert_orders(tx.conn(), &new_rows).await?;
    let references: Vec<&str> = first_of.keys().copied().collect();
    let stored: HashMap<String, store::orders::StoredOrder> =
        store::orders::get_orders(tx.conn(), &references)
            .await?
            .into_iter()
            .map(|s| (s.order.reference.to_string(), s))
            .collect();
    writes
        .iter()
        .enumerate()
        .map(|(i, write)| {
            let reference = write.order.reference.as_str();
            let found = stored
                .get(reference)
                .ok_or_else(|| StoreError::Corrupt(format!("order {reference} vanished")))?;
            let created = first_of[reference] == i && inserted.contains(reference);
            Ok(if !created && found.content_hash != hashes[i] {
                Err(Error::OrderConflict(write.order.reference.clone()))
            } else {
                Ok(Created {
                    value: found.order.clone(),
                    created,
                })
            })
        })
        .collect()
}

/// Settles a rental order from its customer's balance under the order's lock, if the balance
/// covers it; a repeated call returns the earlier payment.
async fn debit_for_order(
    tx: &mut WriteTx,
    reference: &OrderRef,
    now: DateTime<Utc>,
) -> Result<BalancePayment, Error> {
    let order = store::orders::lock_order(tx, reference)
        .await?
        .ok_or_else(|| Error::OrderNotFound(reference.clone()))?
        .order;
    if order.kind == OrderKind::Topup {
        return Err(Error::NotARental(reference.clone()));
    }
    let customer = Account::CustomerBalance(order.account_id.clone());
    if let OrderStatus::Settled { via, .. } = order.status {
        if via != SettledVia::Balance {
            return Err(Error::AlreadySettled(reference.clone()));
        }
        let sum = store::ledger::account_sum(tx.conn(), &customer, Currency::Usd).await?;
        return Ok(BalancePayment {
            balance_after: customer_balance(&order.account_id, sum)?,
            order,
            debited_now: false,
        });
    }
    let cents = i128::from(order.total_usd.cents());
    let entry = NewEntry {
        idempotency_key: format!("balance-payment:{reference}"),
        kind: EntryKind::BalancePayment,
        reference: Some(reference.to_string()),
        memo: format!("order {reference} paid from balance"),
        postings: vec![
            Posting::debit(customer.clone(), Currency::Usd, cents),
            Posting::credit(Account::RevenueRentals, Currency::Usd, cents),
        ],
    };
    entry.validate()?;
    match store::ledger::post_batch(tx, std::slice::from_ref(&entry), now).await? {
        Ok(_) => {}
        Err(LedgerError::Overdraft { .. }) => {
            let sum = store::ledger::account_sum(tx.conn(), &customer, Currency::Usd).await?;
            return Err(Error::InsufficientBalance {
                order: reference.clone(),
                available: customer_balance(&order.account_id, sum)?,
                required: order.total_usd,
            });
        }
        Err(other) => return Err(other.into()),
    }
    store::orders::mark_settled(
        tx.conn(),
        reference,
        SettledVia::Balance,
        &entry.idempotency_key,
        now,
    )
    .await?;
    let sum = store::ledger::account_sum(tx.conn(), &customer, Currency::Usd).await?;
    let balance_after = customer_balance(&order.account_id, sum)?;
    let order = store::orders::get_order(tx.conn(), reference)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("order {reference} vanished")))?
        .order;
    Ok(BalancePayment {
        order,
        balance_after,
        debited_now: true,
    })
}

/// A customer's available balance from the sum of their postings (credits are negative).
fn customer_balance(account_id: &AccountId, sum: i128) -> Result<Usd, Error> {
    let cents = i64::try_from(-sum)
        .ok()
        .and_then(|c| Usd::from_cents(c).ok());
    cents.ok_or_else(|| {
        LedgerError::Corrupt(format!(
            "customer {account_id} balance sums to {}",
            Currency::Usd.format(-sum)
        ))
        .into()
    })
}

/// What makes two create calls the same order: everything the shop sent.
fn order_fingerprint(order: &ValidOrder) -> String {
    let canonical = serde_json::json!({
        "reference": order.reference,
        "account_id": order.account_id,
        "kind": order.kind,
        "total_usd": order.total_usd,
    });
    hex::encode(Sha256::digest(canonical.to_string()))
}
