//! Tron: TRX and USDT-TRC20. BIP44 coin 195 receive addresses (watch-only, base58check `T…`)
//! and, later, the HTTP API watcher.

mod address;
mod derive;

pub use address::{TronAddress, TronAddressError};
pub use derive::TronDeriver;
