//! Bitcoin and Litecoin: BIP84 native segwit receive addresses (watch-only) and two scanners
//! that follow them: through an Electrum server, or straight from a full node's RPC with its
//! P2P announcements as the push channel; and the output descriptors that hand the account
//! to the merchant's wallet.

mod chain;
mod derive;
mod electrum;
mod electrum_stream;
mod mweb;
mod node;
mod p2p;
mod psbt;
mod rpc;
mod spends;
mod wallet;

pub use chain::UtxoTarget;
pub use derive::{SegwitDeriver, UtxoChain, UtxoNetwork};
pub use derive::{customer_script, script_pubkey, segwit_address};
pub use electrum::{ElectrumScanner, ElectrumSettings};
pub use node::{NodeScanner, NodeSettings};
pub use psbt::{FeeRate, PreparedRefund, RefundInput, RefundOrder, RefundSource, refund_psbt};
pub use rpc::{NodeAuth, RpcError};
pub use wallet::{KeyOrigin, WalletDescriptors, descriptors, origin_text};
