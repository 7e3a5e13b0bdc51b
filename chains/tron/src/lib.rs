//! Tron: TRX and USDT-TRC20. BIP44 coin 195 receive addresses (watch-only, base58check `T…`)
//! and the block scanner over the full-node HTTP API.

mod address;
pub mod api;
mod derive;
#[cfg(feature = "testkit")]
pub mod testkit;
mod unsigned;
mod watch;

pub use address::{TronAddress, TronAddressError};
pub use derive::TronDeriver;
pub use unsigned::{TronSending, UnsignedTronTransaction};
pub use watch::{
    TRANSFER_TOPIC, TRC20_TRANSFER_BYTES, TRC20_TRANSFER_ENERGY, TRX_TRANSFER_BYTES, TronFinality,
    TronScanner, TronSettings,
};
