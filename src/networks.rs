//! What each network's configuration section means to its watcher: the scanner settings,
//! parsed and checked in full whether or not a node is configured yet, so a mistyped contract,
//! recipient or genesis hash is refused by every command at start-up rather than found by
//! `payrecon serve` later.

use alloy_primitives::Address;
use payrecon_chain_bitcoin::{ElectrumSettings, NodeAuth, NodeSettings, UtxoChain, UtxoTarget};
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
            utxo_source(network, utxo)?;
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

/// Where a UTXO network's watcher reads the chain.
#[derive(Clone, Debug)]
pub enum UtxoSource {
    /// An Electrum server.
    Electrum(ElectrumSettings),
    /// A full node's RPC (with its P2P announcements when `push_peer` is set).
    Node(NodeSettings),
}

impl UtxoSource {
    /// Where it is, with its credentials hidden: for logs.
    pub fn describe(&self) -> String {
        match self {
            UtxoSource::Electrum(settings) => format!("Electrum server {}", settings.url),
            UtxoSource::Node(settings) => format!("full node {}", settings.rpc_url),
        }
    }
}

/// The chain a configured UTXO network's source must serve.
fn utxo_target(network: Network, config: &UtxoConfig) -> Result<UtxoTarget, Error> {
    let chain = match network {
        Network::Litecoin => UtxoChain::Litecoin,
        _ => UtxoChain::Bitcoin,
    };
    let utxo_network = config
        .network
        .parse()
        .map_err(|e: DeriveError| Error::Config(format!("networks.{network}.network: {e}")))?;
    let mut target = UtxoTarget::new(chain, utxo_network);
    target.genesis_hash = config.genesis_hash.clone();
    target
        .expected_genesis()
        .map_err(|e| Error::Config(format!("networks.{network}.genesis_hash: {e}")))?;
    Ok(target)
}

/// The data source of a configured UTXO network: `electrum_url` or `rpc_url`, never both;
/// `None` without either.
pub fn utxo_source(network: Network, config: &UtxoConfig) -> Result<Option<UtxoSource>, Error> {
    let target = utxo_target(network, config)?;
    let key = |name: &str| format!("networks.{network}.{name}");
    let node_only = [
        ("rpc_user", config.rpc_user.is_some()),
        ("rpc_password", config.rpc_password.is_some()),
        ("rpc_cookie_file", config.rpc_cookie_file.is_some()),
        ("push_peer", config.push_peer.is_some()),
        ("start_height", config.start_height.is_some()),
    ];
    match (&config.electrum_url, &config.rpc_url) {
        (Some(_), Some(_)) => Err(Error::Config(format!(
            "{} and {} are both set: a network reads the chain from one source, set one of them",
            key("electrum_url"),
            key("rpc_url")
        ))),
        (Some(url), None) => {
            if let Some((name, _)) = node_only.iter().find(|(_, set)| *set) {
                return Err(Error::Config(format!(
                    "{} applies to a full node (rpc_url), not to {}",
                    key(name),
                    key("electrum_url")
                )));
            }
            let mut settings = ElectrumSettings::new(url.clone(), target);
            settings.timeout = timeout(config.timeout_ms);
            if let Some(cap) = config.max_answer_bytes {
                settings.max_line_bytes = cap;
            }
            Ok(Some(UtxoSource::Electrum(settings)))
        }
        (None, Some(url)) => {
            let auth = match (
                &config.rpc_user,
                &config.rpc_password,
                &config.rpc_cookie_file,
            ) {
                (None, None, None) => NodeAuth::None,
                (Some(user), Some(password), None) => NodeAuth::UserPassword {
                    user: user.clone(),
                    password: password.clone(),
                },
                (None, None, Some(cookie)) => NodeAuth::Cookie(cookie.clone()),
                (_, _, Some(_)) => {
                    return Err(Error::Config(format!(
                        "{} and {}/{} are both set: use the cookie or a user and password",
                        key("rpc_cookie_file"),
                        key("rpc_user"),
                        key("rpc_password")
                    )));
                }
                _ => {
                    return Err(Error::Config(format!(
                        "{} and {} go together",
                        key("rpc_user"),
                        key("rpc_password")
                    )));
                }
            };
            if let Some(peer) = &config.push_peer
                && peer
                    .rsplit_once(':')
                    .is_none_or(|(_, port)| port.parse::<u16>().is_err())
            {
                return Err(Error::Config(format!(
                    "{}: {peer:?} is not host:port (the node's P2P port)",
                    key("push_peer")
                )));
            }
            let mut settings = NodeSettings::new(url.clone(), auth, target);
            settings.timeout = timeout(config.timeout_ms);
            if let Some(cap) = config.max_answer_bytes {
                settings.max_answer_bytes = cap;
            }
            settings.push_peer = config.push_peer.clone();
            settings.start_height = config.start_height;
            // The URL must parse; the client is made on the first scan.
            payrecon_chain_bitcoin::NodeScanner::check_url(url)
                .map_err(|e| Error::Config(format!("{}: {e}", key("rpc_url"))))?;
            Ok(Some(UtxoSource::Node(settings)))
        }
        (None, None) => {
            if let Some((name, _)) = node_only.iter().find(|(_, set)| *set) {
                return Err(Error::Config(format!(
                    "{} is set without {}",
                    key(name),
                    key("rpc_url")
                )));
            }
            Ok(None)
        }
    }
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
    settings.timeout = timeout(config.timeout_ms);
    if let Some(cap) = config.max_answer_bytes {
        settings.max_answer_bytes = cap;
    }
    Ok(config.rpc_url.is_some().then_some(settings))
}

/// The Tron scanner settings, if a node is configured.
pub fn tron_settings(config: &TronConfig) -> Result<Option<TronSettings>, Error> {
    let usdt: TronAddress = config
        .usdt_contract
        .parse()
        .map_err(|e| Error::Config(format!("networks.tron.usdt_contract: {e}")))?;
    let mut settings = TronSettings::new(config.api_url.clone().unwrap_or_default(), usdt);
    settings.api_key = config.api_key.as_ref().map(|key| key.expose().to_owned());
    settings.finality = match config.finality {
        TronFinality::Depth => payrecon_chain_tron::TronFinality::Depth,
        TronFinality::Solidified => payrecon_chain_tron::TronFinality::Solidified,
    };
    settings.start_block = config.start_block;
    settings.timeout = timeout(config.timeout_ms);
    if let Some(cap) = config.max_answer_bytes {
        settings.max_answer_bytes = cap;
    }
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
    settings.timeout = timeout(config.timeout_ms);
    if let Some(cap) = config.max_answer_bytes {
        settings.max_answer_bytes = cap;
    }
    Ok(config.rpc_url.is_some().then_some(settings))
}

/// A network's `timeout_ms`, at least a millisecond.
fn timeout(ms: u32) -> std::time::Duration {
    std::time::Duration::from_millis(u64::from(ms.max(1)))
}
