//! payrecon: a blockchain payment reconciliation engine.
//!
//! The shop embeds [`Engine`]: it records rental orders and balance top-ups, keeps each
//! customer's USD balance in a double-entry [`ledger`], and settles orders from that balance.
//! Payment instructions give each order a fresh address and a locked amount; chain watchers
//! report what arrives and the matcher settles it. Money always flows one way:
//! watcher -> chain event -> matcher -> ledger -> reports.

pub mod api;
pub mod audit;
pub mod bench;
pub mod checkout;
pub mod cli;
pub mod clock;
pub mod config;
pub mod crash;
pub mod engine;
pub mod error;
pub mod history;
pub mod intent;
pub mod leases;
pub mod ledger;
pub mod matcher;
pub mod money;
pub mod networks;
pub mod operator;
pub mod order;
pub mod payments;
pub mod rates;
pub mod report;
pub mod serve;
pub mod store;
pub mod stuck;
pub mod support;
pub mod tokens;
pub mod watcher;
pub mod webhooks;

pub use engine::{BalancePayment, Created, Engine, TrialBalance};
pub use error::Error;
pub use payrecon_chain_core as chain;
