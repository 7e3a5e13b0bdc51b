//! Chain-neutral vocabulary shared by the payrecon engine and every chain crate.
//!
//! Parse at the edge, carry types inside: a [`Method`] is never a loose string and an
//! [`Amount`] is never a float. Chain crates depend on this crate and on nothing of the engine.

mod amount;
pub mod blocks;
mod derive;
mod event;
mod excerpt;
mod failover;
#[cfg(feature = "fuzz")]
pub mod fuzz;
#[cfg(feature = "http")]
pub mod http;
mod keys;
mod method;
mod retry;
mod scan;
mod secret;

pub use amount::{Amount, ParseAmountError, ParseAmountErrorKind};
pub use derive::{
    AccountXpub, AddressDeriver, DeriveError, DerivedAddress, Lookahead, MAX_DERIVED_AHEAD,
    evm_account_bytes,
};
pub use event::{
    BlockId, ChainCursor, ChainEvent, MAX_CHECKPOINTS, Outflow, OutflowEvent, ReceivedAsset,
    Transfer, TransferId,
};
pub use excerpt::{excerpt, malformed};
pub use failover::{Failover, FailoverPolicy};
pub use keys::{
    IndexChanges, KeyChange, KeyIndex, KeysPosition, MAX_LOGGED_KEY_CHANGES, WatchKeys,
    WatchedLookup,
};
pub use method::{Asset, Method, Network, ParseMethodError, ParseNetworkError};
pub use retry::{Attempt, RetryPolicy};
pub use scan::{
    Attestation, ChainScanner, Finding, HeldOutputs, KnownOutflow, KnownTransfer, Paid, Probe,
    ScanBatch, ScanError, SweepFees, Unexplained, Unreadable, WatchView,
};
pub use secret::{Secret, SecretUrl};

/// Re-exported so chain crates share one secp256k1 and one base58check.
pub use bitcoin;

pub mod test_vectors;
