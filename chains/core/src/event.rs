//! What a watcher reports: transfers to watched addresses and their fate on the chain.
//!
//! Events carry state, not deltas: each observation says how the transfer stands at the tip
//! the watcher had reached. The matcher keeps the newest observation of each transfer, so a
//! replayed or duplicated event changes nothing.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Amount, Method, Network};

/// A transfer's place on its chain: the same transfer seen twice has the same id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TransferId {
    /// The chain.
    pub network: Network,
    /// Transaction hash or signature, as the chain's explorers print it.
    pub txid: String,
    /// Output index (UTXO chains); on Ethereum and Tron 0 for the transaction's own value,
    /// log index + 1 for a token transfer, and [`TransferId::internal_position`] for value a
    /// contract moved inside the transaction, so no two of one transaction ever collide.
    pub position: u32,
}

impl TransferId {
    /// Where internal transfers' positions start: far above any log index a block can hold.
    pub const INTERNAL_POSITIONS: u32 = 1 << 31;

    /// The position of the `ordinal`-th value-moving internal call of a transaction (counted
    /// from 0 in execution order, failed calls included, so a rescan or another tracer gives
    /// the same number), or `None` past what a position can hold.
    pub fn internal_position(ordinal: usize) -> Option<u32> {
        u32::try_from(ordinal)
            .ok()
            .and_then(|ordinal| Self::INTERNAL_POSITIONS.checked_add(ordinal))
    }

    /// Whether this is value a contract moved inside its transaction.
    pub fn is_internal(&self) -> bool {
        self.position >= Self::INTERNAL_POSITIONS
    }
}

impl fmt::Display for TransferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.network, self.txid, self.position)
    }
}

/// What arrived.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum ReceivedAsset {
    /// One of the shop's methods (the native coin or a configured token).
    Method {
        /// Which.
        method: Method,
    },
    /// A token contract payrecon does not accept (a fake "USDT" included): never credited.
    OtherToken {
        /// The contract address.
        contract: String,
    },
}

/// How a misdirected payment's description ends (see [`ReceivedAsset::misdirected`]).
const MISDIRECTED: &str = ", not the recipient";

impl ReceivedAsset {
    /// The shop's coin sent under an intent's reference to another recipient than the shop's
    /// (Solana Pay): the customer paid, to the wrong place. Never credited; an exception of
    /// the intent's own. Kept as an [`ReceivedAsset::OtherToken`] whose text says what
    /// happened, as recorded since payrecon first told it apart.
    pub fn misdirected(method: Method, elsewhere: &str) -> ReceivedAsset {
        ReceivedAsset::OtherToken {
            contract: format!("{} paid to {elsewhere}{MISDIRECTED}", method.asset()),
        }
    }

    /// A token of a contract payrecon does not accept (a fake "USDT", airdrop spam, a
    /// poisoning token, a TRC-10 asset), as opposed to a method or a misdirected payment.
    pub fn is_unknown_token(&self) -> bool {
        matches!(self, ReceivedAsset::OtherToken { contract } if !contract.ends_with(MISDIRECTED))
    }
}

/// `eth`, `usdt-erc20`, … for a method; `token:<contract>` for any other token: the text
/// reports, the store and support lookups show.
impl std::fmt::Display for ReceivedAsset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReceivedAsset::Method { method } => f.write_str(method.id()),
            ReceivedAsset::OtherToken { contract } => write!(f, "token:{contract}"),
        }
    }
}

/// Value that reached a watched address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    /// Where it sits on the chain.
    pub id: TransferId,
    /// The watched address it paid (for Solana: the intent's reference key).
    pub to_address: String,
    /// What arrived.
    pub asset: ReceivedAsset,
    /// How much, in the asset's base units.
    pub amount: Amount,
    /// The one address that sent it, on chains whose transfers name one (Ethereum, Tron):
    /// native coin from the merchant's own treasury is a fee top-up, not a payment, and
    /// operators see where a refund could go. `None` on the UTXO chains and Solana.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_address: Option<String>,
}

/// A watcher's report about one transfer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "event")]
pub enum ChainEvent {
    /// The transfer is on the chain (or in the mempool) with this many confirmations.
    Observed {
        /// The transfer.
        transfer: Transfer,
        /// How final the watcher judges it: 0 while unconfirmed, else the block depth, or for
        /// a chain with explicit finality at least the settling depth once final and less
        /// before. 0 in a block for a coin the chain keeps unspendable until it matures (a
        /// Litecoin peg-out before 6 blocks).
        confirmations: u32,
        /// The block that carries it; `None` while unconfirmed.
        #[serde(default)]
        block_height: Option<u64>,
        /// When the watcher first saw it (mempool time, else block time), Unix milliseconds.
        seen_at_ms: i64,
        /// The chain height the watcher had reached when it made this observation; newer
        /// observations of the same transfer win, older replays are ignored.
        tip_height: u64,
    },
    /// A reorg or a replacing transaction took the transfer out.
    Removed {
        /// The transfer that is gone.
        id: TransferId,
        /// The chain height the watcher had reached when it noticed.
        tip_height: u64,
    },
}

impl ChainEvent {
    /// The transfer this event is about.
    pub fn transfer_id(&self) -> &TransferId {
        match self {
            ChainEvent::Observed { transfer, .. } => &transfer.id,
            ChainEvent::Removed { id, .. } => id,
        }
    }

    /// The height this observation was made at.
    pub fn tip_height(&self) -> u64 {
        match self {
            ChainEvent::Observed { tip_height, .. } | ChainEvent::Removed { tip_height, .. } => {
                *tip_height
            }
        }
    }
}

/// Most recent blocks a cursor remembers: enough to find where any realistic reorg rejoins.
pub const MAX_CHECKPOINTS: usize = 256;

/// A block by height and hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockId {
    /// Height.
    pub height: u64,
    /// Hash, as the chain's explorers print it.
    pub hash: String,
}

/// How far a watcher has processed its chain: committed in the same transaction as the events
/// it produced (like a reth stage checkpoint), so a restart resumes exactly there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainCursor {
    /// The last block processed.
    pub tip: BlockId,
    /// Recent blocks below it, oldest first: after a reorg the watcher rejoins at the highest
    /// one whose hash the chain still has (BDK's checkpoints), and unwinds what lay above.
    pub checkpoints: Vec<BlockId>,
}

/// Value that left a watched address: the merchant's wallet collecting a payment, or anything
/// else spending from it. Reported like receipts: state, not deltas, the newest tip wins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outflow {
    /// The spending transaction and, on UTXO chains, the input's index; on account chains 0
    /// for the native value and log index + 1 for a token transfer.
    pub id: TransferId,
    /// The output spent (UTXO chains): the engine reads the address and amount it recorded
    /// for it.
    pub spends: Option<TransferId>,
    /// The watched address the value left; empty when `spends` names it.
    pub from_address: String,
    /// What left.
    pub asset: ReceivedAsset,
    /// How much left the address to its destination, in base units, the fee not included.
    pub amount: Amount,
    /// The network fee this row paid from the address, in the native coin's base units (a
    /// row of the native asset carries it).
    pub fee: Amount,
    /// The one address the value went to; `None` when it was split or cannot be named.
    pub to_address: Option<String>,
}

/// A watcher's report about one outflow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "event")]
pub enum OutflowEvent {
    /// The outflow is in a block with this many confirmations.
    Sent {
        /// The outflow.
        outflow: Outflow,
        /// Block depth (or the chain's own finality, as for receipts).
        confirmations: u32,
        /// The block that carries it.
        block_height: u64,
        /// The block's time, Unix milliseconds.
        seen_at_ms: i64,
        /// The chain height the watcher had reached.
        tip_height: u64,
    },
    /// A reorg took the outflow out: the value is back on the address.
    Removed {
        /// The outflow that is gone.
        id: TransferId,
        /// The chain height the watcher had reached when it noticed.
        tip_height: u64,
    },
}

impl OutflowEvent {
    /// The outflow this event is about.
    pub fn id(&self) -> &TransferId {
        match self {
            OutflowEvent::Sent { outflow, .. } => &outflow.id,
            OutflowEvent::Removed { id, .. } => id,
        }
    }
}
