//! Bitcoin and Litecoin: BIP84 native segwit receive addresses (watch-only) and, later, the
//! Electrum watcher.

mod derive;

pub use derive::script_pubkey;
pub use derive::{SegwitDeriver, UtxoChain, UtxoNetwork};
