//! What each network's configuration section means to its watcher: the scanner settings,
//! parsed and checked in full whether or not a node is configured yet, so a mistyped contract,
//! recipient or genesis hash is refused by every command at start-up rather than found by
//! `payrecon serve` later.

use alloy_primitives::Address;
use payrecon_chain_bitcoin::{ElectrumSettings, NodeAuth, NodeSettings, UtxoChain, UtxoTarget};
use payrecon_chain_core::{DeriveError, FailoverPolicy, Network, SecretUrl};
use payrecon_chain_ethereum::{EthereumSettings, Finality};
use payrecon_chain_solana::SolanaSettings;
use payrecon_chain_tron::{TronAddress, TronSettings};

use crate::config::{
    Config, EthereumConfig, EthereumFinality, NetworksConfig, SolanaConfig, TronConfig,
    TronFinality, UtxoConfig, WitnessPolicy,
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
            electrum_sources(network, utxo)?;
            node_sources(network, utxo)?;
        }
    }
    if let Some(ethereum) = &networks.ethereum {
        ethereum_sources(ethereum)?;
    }
    if let Some(tron) = &networks.tron {
        tron_sources(tron)?;
    }
    if let Some(solana) = &networks.solana {
        solana_sources(solana)?;
    }
    for network in Network::ALL {
        witnesses(networks, network)?;
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

/// Every source of a network, in order: `first` (the settings of its single-URL key), then
/// the same settings at each URL of the list under `key`. A list without a first source, or a
/// URL named twice, is refused.
fn in_order<T: Clone>(
    network: Network,
    first: Option<T>,
    more: &[SecretUrl],
    key: (&str, &str),
    at: impl Fn(&T, SecretUrl) -> T,
    url: impl Fn(&T) -> &SecretUrl,
) -> Result<Vec<T>, Error> {
    let Some(first) = first else {
        if more.is_empty() {
            return Ok(Vec::new());
        }
        return Err(Error::Config(format!(
            "networks.{network}.{} lists sources after networks.{network}.{}, which is not set: set it to the first",
            key.1, key.0
        )));
    };
    let mut sources = vec![first];
    for next in more {
        if sources.iter().any(|s| url(s).expose() == next.expose()) {
            return Err(Error::Config(format!(
                "networks.{network}.{}: {next} is named twice: each source once, in order",
                key.1
            )));
        }
        sources.push(at(&sources[0], next.clone()));
    }
    Ok(sources)
}

/// Every Ethereum source in order (none without `rpc_url`).
pub fn ethereum_sources(config: &EthereumConfig) -> Result<Vec<EthereumSettings>, Error> {
    let first = ethereum_settings(config)?;
    in_order(
        Network::Ethereum,
        first,
        &config.rpc_urls,
        ("rpc_url", "rpc_urls"),
        |first, url| EthereumSettings {
            url,
            ..first.clone()
        },
        |s| &s.url,
    )
}

/// Every Tron source in order (none without `api_url`).
pub fn tron_sources(config: &TronConfig) -> Result<Vec<TronSettings>, Error> {
    let first = tron_settings(config)?;
    in_order(
        Network::Tron,
        first,
        &config.api_urls,
        ("api_url", "api_urls"),
        |first, url| TronSettings {
            url,
            ..first.clone()
        },
        |s| &s.url,
    )
}

/// Every Solana source in order (none without `rpc_url`).
pub fn solana_sources(config: &SolanaConfig) -> Result<Vec<SolanaSettings>, Error> {
    let first = solana_settings(config)?;
    in_order(
        Network::Solana,
        first,
        &config.rpc_urls,
        ("rpc_url", "rpc_urls"),
        |first, url| SolanaSettings {
            url,
            ..first.clone()
        },
        |s| &s.url,
    )
}

/// Every Electrum server of a UTXO network in order; none when it reads a full node or
/// nothing (`electrum_urls` beside `rpc_url` is refused).
pub fn electrum_sources(
    network: Network,
    config: &UtxoConfig,
) -> Result<Vec<ElectrumSettings>, Error> {
    let first = match utxo_source(network, config)? {
        Some(UtxoSource::Electrum(settings)) => Some(settings),
        Some(UtxoSource::Node(_)) if !config.electrum_urls.is_empty() => {
            return Err(Error::Config(format!(
                "networks.{network}.electrum_urls lists Electrum servers, but the network reads a full node (rpc_url): one kind of source per network"
            )));
        }
        _ => None,
    };
    in_order(
        network,
        first,
        &config.electrum_urls,
        ("electrum_url", "electrum_urls"),
        |first, url| ElectrumSettings {
            url,
            ..first.clone()
        },
        |s| &s.url,
    )
}

/// A network's witnesses (`witness_urls`): second sources asked about each receipt before it
/// is credited.
#[derive(Clone, Debug)]
pub struct WitnessPlan {
    /// Each witness, as a scanner of its chain reads it.
    pub sources: Vec<WitnessSource>,
    /// What a silent witness means past `wait`.
    pub policy: WitnessPolicy,
    /// How long a receipt waits for its witnesses.
    pub wait: std::time::Duration,
}

/// One witness.
#[derive(Clone, Debug)]
pub enum WitnessSource {
    /// An Electrum server (Bitcoin, Litecoin).
    Electrum(ElectrumSettings),
    /// A JSON-RPC node.
    Ethereum(EthereumSettings),
    /// A full node's HTTP API.
    Tron(TronSettings),
    /// An RPC node.
    Solana(SolanaSettings),
}

/// The witnesses of `network`, `None` when it has none (or no source to witness). A witness
/// that is one of the network's sources, named twice, or of the wrong kind is refused.
pub fn witnesses(
    networks: &NetworksConfig,
    network: Network,
) -> Result<Option<WitnessPlan>, Error> {
    let key = format!("networks.{network}.witness_urls");
    // The network's sources as its watcher reads them, so a witness is never one of them.
    let (urls, policy, wait_seconds, sources, confirmations): (_, _, _, Vec<SecretUrl>, _) =
        match network {
            Network::Bitcoin | Network::Litecoin => {
                let utxo = match network {
                    Network::Bitcoin => networks.bitcoin.as_ref(),
                    _ => networks.litecoin.as_ref(),
                };
                let Some(utxo) = utxo else { return Ok(None) };
                let electrum = electrum_sources(network, utxo)?.into_iter().map(|s| s.url);
                let nodes = node_sources(network, utxo)?.into_iter().map(|s| s.rpc_url);
                (
                    &utxo.witness_urls,
                    utxo.witness_policy,
                    utxo.witness_wait_seconds,
                    electrum.chain(nodes).collect(),
                    utxo.confirmations,
                )
            }
            Network::Ethereum => {
                let Some(eth) = &networks.ethereum else {
                    return Ok(None);
                };
                (
                    &eth.witness_urls,
                    eth.witness_policy,
                    eth.witness_wait_seconds,
                    ethereum_sources(eth)?.into_iter().map(|s| s.url).collect(),
                    eth.confirmations,
                )
            }
            Network::Tron => {
                let Some(tron) = &networks.tron else {
                    return Ok(None);
                };
                (
                    &tron.witness_urls,
                    tron.witness_policy,
                    tron.witness_wait_seconds,
                    tron_sources(tron)?.into_iter().map(|s| s.url).collect(),
                    tron.confirmations,
                )
            }
            Network::Solana => {
                let Some(solana) = &networks.solana else {
                    return Ok(None);
                };
                (
                    &solana.witness_urls,
                    solana.witness_policy,
                    solana.witness_wait_seconds,
                    solana_sources(solana)?.into_iter().map(|s| s.url).collect(),
                    solana.confirmations,
                )
            }
        };
    if urls.is_empty() || sources.is_empty() {
        return Ok(None);
    }
    if confirmations == 0 {
        return Err(Error::Config(format!(
            "{key} is set, but networks.{network}.confirmations is 0: a witness confirms a receipt in a block, so at least 1"
        )));
    }
    let mut witnesses = Vec::with_capacity(urls.len());
    for (index, url) in urls.iter().enumerate() {
        if sources.iter().any(|s| s.expose() == url.expose())
            || urls[..index].iter().any(|u| u.expose() == url.expose())
        {
            return Err(Error::Config(format!(
                "{key}: {url} is named twice or is one of the network's sources: a witness is another, independent source"
            )));
        }
        witnesses.push(witness_source(networks, network, url.clone(), &key)?);
    }
    Ok(Some(WitnessPlan {
        sources: witnesses,
        policy,
        wait: std::time::Duration::from_secs(u64::from(wait_seconds)),
    }))
}

/// One witness at `url`, read with the network's own settings (never its source's API key).
fn witness_source(
    networks: &NetworksConfig,
    network: Network,
    url: SecretUrl,
    key: &str,
) -> Result<WitnessSource, Error> {
    let no_source = || {
        Error::Config(format!(
            "{key}: networks.{network} has no source to witness"
        ))
    };
    Ok(match network {
        Network::Bitcoin | Network::Litecoin => {
            let utxo = match network {
                Network::Bitcoin => networks.bitcoin.as_ref(),
                _ => networks.litecoin.as_ref(),
            }
            .ok_or_else(no_source)?;
            let scheme = url.expose().split("://").next().unwrap_or_default();
            if scheme != "tcp" && scheme != "ssl" {
                return Err(Error::Config(format!(
                    "{key}: {url} is not an Electrum server (tcp:// or ssl://): a Bitcoin-family witness is one"
                )));
            }
            let mut settings = ElectrumSettings::new(url, utxo_target(network, utxo)?);
            settings.timeout = timeout(utxo.timeout_ms);
            if let Some(cap) = utxo.max_answer_bytes {
                settings.max_line_bytes = cap;
            }
            WitnessSource::Electrum(settings)
        }
        Network::Ethereum => {
            let config = networks.ethereum.as_ref().ok_or_else(no_source)?;
            let first = ethereum_settings(config)?.ok_or_else(no_source)?;
            WitnessSource::Ethereum(EthereumSettings { url, ..first })
        }
        Network::Tron => {
            let config = networks.tron.as_ref().ok_or_else(no_source)?;
            let first = tron_settings(config)?.ok_or_else(no_source)?;
            // The source's key is for its provider only.
            WitnessSource::Tron(TronSettings {
                url,
                api_key: None,
                ..first
            })
        }
        Network::Solana => {
            let config = networks.solana.as_ref().ok_or_else(no_source)?;
            let first = solana_settings(config)?.ok_or_else(no_source)?;
            WitnessSource::Solana(SolanaSettings { url, ..first })
        }
    })
}

/// Every full node of a UTXO network in order (`rpc_url`, then `rpc_urls`); none when it reads
/// Electrum or nothing (`rpc_urls` beside `electrum_url` is refused). The nodes after the first
/// take their credentials from their URLs and are polled.
pub fn node_sources(network: Network, config: &UtxoConfig) -> Result<Vec<NodeSettings>, Error> {
    let first = match utxo_source(network, config)? {
        Some(UtxoSource::Node(settings)) => Some(settings),
        Some(UtxoSource::Electrum(_)) if !config.rpc_urls.is_empty() => {
            return Err(Error::Config(format!(
                "networks.{network}.rpc_urls lists full nodes, but the network reads Electrum (electrum_url): one kind of source per network"
            )));
        }
        _ => None,
    };
    for url in &config.rpc_urls {
        payrecon_chain_bitcoin::NodeScanner::check_url(url)
            .map_err(|e| Error::Config(format!("networks.{network}.rpc_urls: {e}")))?;
    }
    in_order(
        network,
        first,
        &config.rpc_urls,
        ("rpc_url", "rpc_urls"),
        |first, url| NodeSettings {
            rpc_url: url,
            auth: NodeAuth::None,
            push_peer: None,
            ..first.clone()
        },
        |s| &s.rpc_url,
    )
}

/// When a network's watcher leaves a source for the next.
pub fn failover_policy(max_lag_blocks: u64) -> FailoverPolicy {
    FailoverPolicy {
        max_lag_blocks,
        ..FailoverPolicy::default()
    }
}

/// A network's `timeout_ms`, at least a millisecond.
fn timeout(ms: u32) -> std::time::Duration {
    std::time::Duration::from_millis(u64::from(ms.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ethereum(first: Option<&str>, more: &[&str]) -> EthereumConfig {
        let mut config = Config::from_toml(
            "[networks.ethereum]\nxpub = \"xpub\"\nchain_id = 1\nconfirmations = 12",
        )
        .unwrap()
        .networks
        .ethereum
        .unwrap();
        config.rpc_url = first.map(SecretUrl::from);
        config.rpc_urls = more.iter().map(|url| SecretUrl::from(*url)).collect();
        config
    }

    #[test]
    fn sources_come_in_order_once_each_after_a_first() {
        let urls = |config| -> Vec<String> {
            ethereum_sources(&config)
                .unwrap()
                .iter()
                .map(|s| s.url.expose().to_owned())
                .collect()
        };
        assert!(urls(ethereum(None, &[])).is_empty());
        assert_eq!(
            urls(ethereum(
                Some("http://a:8545"),
                &["http://b:8545", "http://c:8545"]
            )),
            ["http://a:8545", "http://b:8545", "http://c:8545"]
        );
        let without_first = ethereum_sources(&ethereum(None, &["http://b:8545"])).unwrap_err();
        assert!(
            without_first.to_string().contains("networks.ethereum.rpc_urls lists sources after networks.ethereum.rpc_url, which is not set"),
            "{without_first}"
        );
        let twice =
            ethereum_sources(&ethereum(Some("http://a:8545"), &["http://a:8545"])).unwrap_err();
        assert!(twice.to_string().contains("named twice"), "{twice}");
    }

    #[test]
    fn a_witness_is_another_source_of_the_right_kind() {
        let config = |text: &str| Config::from_toml(text).unwrap().networks;
        let eth = "[networks.ethereum]\nxpub = \"xpub\"\nchain_id = 1\nconfirmations = 12\nrpc_url = \"http://a:8545\"\n";
        let plan = witnesses(
            &config(&format!("{eth}witness_urls = [\"http://b:8545\"]")),
            Network::Ethereum,
        )
        .unwrap()
        .unwrap();
        assert_eq!(plan.sources.len(), 1);
        assert_eq!(plan.policy, WitnessPolicy::Hold);
        assert_eq!(plan.wait, std::time::Duration::from_secs(600));
        assert!(
            witnesses(&config(eth), Network::Ethereum)
                .unwrap()
                .is_none()
        );
        let itself = witnesses(
            &config(&format!("{eth}witness_urls = [\"http://a:8545\"]")),
            Network::Ethereum,
        )
        .unwrap_err();
        assert!(
            itself
                .to_string()
                .contains("is one of the network's sources"),
            "{itself}"
        );
        let ltc = "[networks.litecoin]\nxpub = \"xpub\"\nconfirmations = 6\nelectrum_url = \"tcp://a:50001\"\n";
        let full = "[networks.litecoin]\nxpub = \"xpub\"\nconfirmations = 6\n\
                    rpc_url = \"http://a:9332\"\nrpc_urls = [\"http://b:9332\"]\n";
        let second_node = witnesses(
            &config(&format!("{full}witness_urls = [\"http://b:9332\"]")),
            Network::Litecoin,
        )
        .unwrap_err();
        assert!(
            second_node
                .to_string()
                .contains("is one of the network's sources"),
            "{second_node}"
        );
        let node = witnesses(
            &config(&format!("{ltc}witness_urls = [\"http://b:9332\"]")),
            Network::Litecoin,
        )
        .unwrap_err();
        assert!(
            node.to_string().contains("is not an Electrum server"),
            "{node}"
        );
        let unconfirmed = witnesses(
            &config(&format!(
                "{}witness_urls = [\"http://b:8545\"]",
                eth.replace("confirmations = 12", "confirmations = 0")
            )),
            Network::Ethereum,
        )
        .unwrap_err();
        assert!(
            unconfirmed.to_string().contains("at least 1"),
            "{unconfirmed}"
        );
    }

    #[test]
    fn full_nodes_come_in_order_and_never_beside_electrum() {
        let ltc = |source: &str| {
            Config::from_toml(&format!(
                "[networks.litecoin]\nxpub = \"xpub\"\nconfirmations = 6\n{source}"
            ))
            .unwrap()
            .networks
            .litecoin
            .unwrap()
        };
        let nodes = node_sources(
            Network::Litecoin,
            &ltc("rpc_url = \"http://a:9332\"\nrpc_urls = [\"http://u:p@b:9332\"]\n"),
        )
        .unwrap();
        assert_eq!(nodes.len(), 2);
        assert!(matches!(nodes[1].auth, NodeAuth::None) && nodes[1].push_peer.is_none());
        let mixed = node_sources(
            Network::Litecoin,
            &ltc("electrum_url = \"tcp://a:50001\"\nrpc_urls = [\"http://b:9332\"]\n"),
        )
        .unwrap_err();
        assert!(mixed.to_string().contains("one kind of source"), "{mixed}");
    }
}
