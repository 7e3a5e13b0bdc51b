//! The engine's error: every refusal names the rule, and nothing was written when one occurs.

use crate::ledger::LedgerError;
use crate::money::Usd;
use crate::order::{OrderRef, OrderRuleError};
use crate::store::StoreError;

/// Why an engine call did not do what was asked. New refusals will be added as variants, so
/// match the ones you act on and keep a fallback arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The order or top-up broke a shop rule.
    #[error(transparent)]
    OrderRule(#[from] OrderRuleError),
    /// The journal entry broke a ledger rule.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The reference exists with other content.
    #[error("order {0} already exists with different content")]
    OrderConflict(OrderRef),
    /// No such order or top-up.
    #[error("unknown order {0}")]
    OrderNotFound(OrderRef),
    /// The order was already paid another way.
    #[error("order {0} is already settled")]
    AlreadySettled(OrderRef),
    /// Only rental orders can be paid from the balance.
    #[error("{0} is a top-up; a top-up cannot be paid from the balance it feeds")]
    NotARental(OrderRef),
    /// The available balance does not cover the whole total.
    #[error("insufficient balance: {available} USD available, order {order} needs {required} USD")]
    InsufficientBalance {
        /// The order.
        order: OrderRef,
        /// What the customer has.
        available: Usd,
        /// What the order costs.
        required: Usd,
    },
    /// The method is not enabled, or its network is not configured.
    #[error("payment method {0} is not enabled")]
    MethodDisabled(payrecon_chain_core::Method),
    /// No usable rate.
    #[error(transparent)]
    Rate(#[from] crate::rates::RateError),
    /// An address could not be derived.
    #[error(transparent)]
    Derive(#[from] payrecon_chain_core::DeriveError),
    /// A watcher reported something no chain produces; nothing of its batch was applied.
    #[error("invalid chain event: {0}")]
    InvalidEvent(String),
    /// No such exception.
    #[error("unknown exception {0}")]
    ExceptionNotFound(String),
    /// No such refund.
    #[error("unknown refund {0}")]
    RefundNotFound(String),
    /// The operator's action does not fit the exception; nothing was written.
    #[error("cannot resolve {exception}: {reason}")]
    ActionRefused {
        /// The exception.
        exception: String,
        /// Why not.
        reason: String,
    },
    /// A report could not be written to its destination.
    #[error("cannot write the report: {0}")]
    Report(String),
    /// A report's destination refused the bytes (a full disk, a closed pipe).
    #[error("cannot write the report: {0}")]
    ReportOutput(#[source] std::io::Error),
    /// The books cannot do what was asked: a period that cannot close or reopen, an entry
    /// that cannot be valued or mapped to a GL account. Nothing was written.
    #[error("books: {0}")]
    Books(String),
    /// A caller's input is malformed; the message says which field and why.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// No such payment intent.
    #[error("unknown payment intent {0}")]
    IntentNotFound(String),
    /// The configuration cannot be used.
    #[error("configuration: {0}")]
    Config(String),
    /// A chain's node could not answer what was asked of it (its credentials never in the
    /// text); asking again later may work.
    #[error("chain: {0}")]
    Chain(String),
    /// Another process holds this network's watcher lease now: this process's write was
    /// refused, with nothing written.
    #[error("the {0} watcher lease is held by another process")]
    LeaseLost(payrecon_chain_core::Network),
    /// The network's watcher has not yet finished its first round since it started: until it
    /// has looked for money at the addresses ahead of each key's counter, no new address is
    /// handed out (one may have been handed out by a database since restored from a backup).
    #[error(
        "the {0} watcher is still looking for payments ahead of its address counter since it started; ask again in a few seconds"
    )]
    CatchingUp(payrecon_chain_core::Network),
    /// The address of the index an intent was about to take was found paid before anyone was
    /// given it (money ahead of the counter, or a restored database's lost intent): it is never
    /// handed out. The engine takes another index; this reaches a caller only when several in
    /// a row were found paid.
    #[error("the {network} address {address} was found paid before it was handed out; ask again")]
    AddressFoundPaid {
        /// The network.
        network: payrecon_chain_core::Network,
        /// The address.
        address: String,
    },
    /// A watcher stopped because its chain data source cannot be trusted.
    #[error("the {network} watcher stopped: {reason}")]
    WatcherStopped {
        /// The network.
        network: payrecon_chain_core::Network,
        /// What the data source did.
        reason: String,
    },
    /// The database failed (unreachable, a failed query, a row payrecon could not have
    /// written); nothing of the call was written.
    #[error(transparent)]
    Database(#[from] StoreError),
}

impl Error {
    /// The output's reader closed the pipe: the CLI ends quietly.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Error::ReportOutput(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Error {
        Error::Database(StoreError::Database(error))
    }
}

impl crate::store::WriteError for Error {
    fn is_retryable_conflict(&self) -> bool {
        matches!(self, Error::Database(e) if e.is_retryable_conflict())
    }
}
