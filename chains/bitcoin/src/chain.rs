//! What both UTXO scanners (Electrum and the full node) must agree on about the chain they
//! follow: its genesis block, its network magic, and what its outputs pay in.

use std::str::FromStr;

use payrecon_chain_core::bitcoin::p2p::Magic;
use payrecon_chain_core::bitcoin::{self, BlockHash};
use payrecon_chain_core::{Method, Network, ReceivedAsset, ScanError};

use crate::{UtxoChain, UtxoNetwork};

/// Litecoin's genesis blocks (rust-bitcoin knows only Bitcoin's).
const LITECOIN_GENESIS: [(UtxoNetwork, &str); 3] = [
    (
        UtxoNetwork::Mainnet,
        "12a765e31ffd4059bada1e25190f6e98c99d9714d334efa41a195a7e7e04bfe2",
    ),
    (
        UtxoNetwork::Testnet,
        "4966625a4b2851d9fdee139e56211a0d88575f59ed816ff5e6a63deb4e3e29a0",
    ),
    (
        UtxoNetwork::Regtest,
        "530827f38f93b43ed12af0b3ad25a288dc02ed74d6d7857862df51fc56c416f9",
    ),
];

/// Litecoin's P2P message starts (its regtest shares Bitcoin's).
const LITECOIN_MAGIC: [(UtxoNetwork, [u8; 4]); 3] = [
    (UtxoNetwork::Mainnet, [0xfb, 0xc0, 0xb6, 0xdb]),
    (UtxoNetwork::Testnet, [0xfd, 0xd2, 0xc8, 0xf1]),
    (UtxoNetwork::Regtest, [0xfa, 0xbf, 0xb5, 0xda]),
];

/// One UTXO chain on one network, with the genesis block its data source must serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UtxoTarget {
    /// Bitcoin or Litecoin.
    pub chain: UtxoChain,
    /// Mainnet, testnet or regtest: decides the expected genesis block.
    pub network: UtxoNetwork,
    /// Overrides the expected genesis block hash (for signet or a custom test chain).
    pub genesis_hash: Option<String>,
}

impl UtxoTarget {
    /// `chain` on `network` with its own genesis block.
    pub fn new(chain: UtxoChain, network: UtxoNetwork) -> UtxoTarget {
        UtxoTarget {
            chain,
            network,
            genesis_hash: None,
        }
    }

    /// The engine's name of the network.
    pub fn network_id(&self) -> Network {
        match self.chain {
            UtxoChain::Bitcoin => Network::Bitcoin,
            UtxoChain::Litecoin => Network::Litecoin,
        }
    }

    /// The bech32 human-readable part of its addresses.
    pub(crate) fn hrp(&self) -> &'static str {
        crate::derive::hrp(self.chain, self.network)
    }

    /// The one method an output on this chain pays in.
    pub fn method(&self) -> Method {
        self.network_id().native_method()
    }

    /// The output script of a customer's `address` on this chain, when `asset` is this
    /// chain's coin (`None`: nothing of another asset is paid here): what
    /// [`paid_to`](payrecon_chain_core::ChainScanner::paid_to) looks for in a transaction.
    pub(crate) fn paid_script(
        &self,
        address: &str,
        asset: &ReceivedAsset,
    ) -> Result<Option<bitcoin::ScriptBuf>, ScanError> {
        let own = ReceivedAsset::Method {
            method: self.method(),
        };
        if *asset != own {
            return Ok(None);
        }
        crate::customer_script(address, self.chain, self.network)
            .map(Some)
            .map_err(|e| ScanError::Fatal(e.to_string()))
    }

    fn bitcoin_network(&self) -> bitcoin::Network {
        match self.network {
            UtxoNetwork::Mainnet => bitcoin::Network::Bitcoin,
            UtxoNetwork::Testnet => bitcoin::Network::Testnet,
            UtxoNetwork::Regtest => bitcoin::Network::Regtest,
        }
    }

    /// The genesis block hash the source must serve.
    pub fn expected_genesis(&self) -> Result<BlockHash, ScanError> {
        let text = match (&self.genesis_hash, self.chain) {
            (Some(hash), _) => hash.clone(),
            (None, UtxoChain::Bitcoin) => {
                return Ok(bitcoin::constants::genesis_block(self.bitcoin_network()).block_hash());
            }
            (None, UtxoChain::Litecoin) => LITECOIN_GENESIS
                .iter()
                .find(|(network, _)| *network == self.network)
                .map(|(_, hash)| (*hash).to_owned())
                .unwrap_or_default(),
        };
        BlockHash::from_str(&text)
            .map_err(|e| ScanError::Fatal(format!("genesis hash {text:?}: {e}")))
    }

    /// The start of every P2P message on this network.
    pub fn magic(&self) -> Magic {
        match self.chain {
            UtxoChain::Bitcoin => Magic::from(self.bitcoin_network()),
            UtxoChain::Litecoin => LITECOIN_MAGIC
                .iter()
                .find(|(network, _)| *network == self.network)
                .map(|(_, bytes)| Magic::from_bytes(*bytes))
                .unwrap_or(Magic::REGTEST),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitcoin_genesis_comes_from_rust_bitcoin() {
        let target = UtxoTarget::new(UtxoChain::Bitcoin, UtxoNetwork::Mainnet);
        assert_eq!(
            target.expected_genesis().unwrap().to_string(),
            "000000000019d6689c085ae165831e934ff763ae46a2a6c172b3f1b60a8ce26f"
        );
        assert_eq!(target.magic(), Magic::BITCOIN);
    }

    #[test]
    fn a_configured_genesis_wins_and_must_parse() {
        let mut target = UtxoTarget::new(UtxoChain::Litecoin, UtxoNetwork::Mainnet);
        assert_eq!(
            target.expected_genesis().unwrap().to_string(),
            LITECOIN_GENESIS[0].1
        );
        assert_eq!(target.magic(), Magic::from_bytes([0xfb, 0xc0, 0xb6, 0xdb]));
        target.genesis_hash = Some("zz".into());
        assert!(matches!(
            target.expected_genesis(),
            Err(ScanError::Fatal(_))
        ));
    }
}
