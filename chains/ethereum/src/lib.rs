//! Ethereum: ETH, USDT and USDC. BIP44 coin 60 receive addresses (watch-only, EIP-55) and the
//! block scanner that finds payments to them.

mod attest;
mod consistency;
mod derive;
pub mod internal;
mod transport;
mod unsigned;
mod watch;

pub use derive::EthereumDeriver;
pub use unsigned::{AccountTerms, Sending, UnsignedTransaction, unsigned_transfer};
pub use watch::{
    ETH_TRANSFER_GAS, EthereumScanner, EthereumSettings, Finality, TOKEN_TRANSFER_GAS,
    TRANSFER_TOPIC,
};
