//! Bitcoin and Litecoin: BIP84 native segwit receive addresses (watch-only) and the scanner
//! that follows them through an Electrum server.

mod derive;
mod electrum;

pub use derive::script_pubkey;
pub use derive::{SegwitDeriver, UtxoChain, UtxoNetwork};
pub use electrum::{ElectrumScanner, ElectrumSettings};
