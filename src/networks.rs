//! What each network's configuration section means to its watcher: the scanner settings,
//! parsed and checked in full whether or not a node is configured yet, so a mistyped contract,
//! recipient or genesis hash is refused by every command at start-up rather than found by
//! `payrecon serve` later.

use alloy_primitives::Address;
use payrecon_chain_bitcoin::{ElectrumSettings, UtxoChain};
use payrecon_chain_core::{DeriveError, Network};
use payrecon_chain_ethereum::{EthereumSettings, Finality};
use payrecon_chain_solana::SolanaSettings;
use payrecon_chain_tron::{TronAddress, TronSettings};

use crate::config::{
    Config, EthereumConfig, EthereumFinality, SolanaConfig, TronConfig, TronFinality, UtxoConfig,
};
use crate::error::Error;

/// Checks every configured network's watcher settings; the first error names its key.
pub fn check(config: &Config) -> Result<(), Error> {
    let networks = &config.networks;
    for (network, utxo) in [
        (Network::Bitcoin, &networks.bitcoin),
        (Network::Litecoin, &networks.litecoin),
    ] {
        if let Some(utxo) = utxo {
            electrum_settings(network, utxo)?;
        }
    }
    if let Some(ethereum) = &networks.ethereum {
        ethereum_settings(ethereum)?;
    }
    if let Some(tron) = &networks.tron {
        tron_settings(tron)?;
    }
    if let Some(solana) = &networks.solana {
        solana_settings(solana)?;
    }
    Ok(())
}

/// The Electrum scanner settings of a configured UTXO network, if it names a server.
pub fn electrum_settings(
    network: Network,
    config: &UtxoConfig,
) -> Result<Option<ElectrumSettings>, Error> {
    let chain = match network {
        Network::Litecoin => UtxoChain::Litecoin,
        _ => UtxoChain::Bitcoin,
    };
    let utxo_network = config
        .network
        .parse()
        .map_err(|e: DeriveError| Error::Config(format!("networks.{network}.network: {e}")))?;
    let url = config.electrum_url.clone().unwrap_or_default();
    let mut settings = ElectrumSettings::new(url, chain, utxo_network);
    settings.genesis_hash = config.genesis_hash.clone();
    settings
        .expected_genesis()
        .map_err(|e| Error::Config(format!("networks.{network}.genesis_hash: {e}")))?;
    Ok(config.electrum_url.is_some().then_some(settings))
}

/// The Ethereum scanner settings, if a node is configured.
pub fn ethereum_settings(config: &EthereumConfig) -> Result<Option<EthereumSettings>, Error> {
    let contract = |name: &str, text: &str| -> Result<Address, Error> {
        text.parse()
            .map_err(|e| Error::Config(format!("networks.ethereum.{name}: {e}")))
    };
    let mut settings = EthereumSettings::new(
        config.rpc_url.clone().unwrap_or_default(),
        config.chain_id,
        contract("usdt_contract", &config.usdt_contract)?,
        contract("usdc_contract", &config.usdc_contract)?,
    );
    settings.finality = match config.finality {
        EthereumFinality::Depth => Finality::Depth,
        EthereumFinality::Finalized => Finality::Finalized,
    };
    settings.start_block = config.start_block;
    Ok(config.rpc_url.is_some().then_some(settings))
}

/// The Tron scanner settings, if a node is configured.
pub fn tron_settings(config: &TronConfig) -> Result<Option<TronSettings>, Error> {
    let usdt: TronAddress = config
        .usdt_contract
        .parse()
        .map_err(|e| Error::Config(format!("networks.tron.usdt_contract: {e}")))?;
    let mut settings = TronSettings::new(config.api_url.clone().unwrap_or_default(), usdt);
    settings.api_key = config.api_key.clone();
    settings.finality = match config.finality {
        TronFinality::Depth => payrecon_chain_tron::TronFinality::Depth,
        TronFinality::Solidified => payrecon_chain_tron::TronFinality::Solidified,
    };
    settings.start_block = config.start_block;
    Ok(config.api_url.is_some().then_some(settings))
}

/// The Solana scanner settings, if an RPC endpoint is configured.
pub fn solana_settings(config: &SolanaConfig) -> Result<Option<SolanaSettings>, Error> {
    let recipient = config
        .recipient
        .parse()
        .map_err(|e| Error::Config(format!("networks.solana.recipient: {e}")))?;
    let mut settings = SolanaSettings::new(config.rpc_url.clone().unwrap_or_default(), recipient);
    settings.references_per_scan = config.references_per_scan;
    Ok(config.rpc_url.is_some().then_some(settings))
}
