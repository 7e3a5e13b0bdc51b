//! Ethereum: ETH, USDT and USDC. BIP44 coin 60 receive addresses (watch-only, EIP-55) and,
//! later, the alloy watcher.

mod derive;

pub use derive::EthereumDeriver;
