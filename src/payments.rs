//! Payment instructions on the engine: create them, mark them paid, feed the matcher chain
//! events, expire what is due, and stream what changed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use payrecon_chain_bitcoin::{KeyOrigin, SegwitDeriver, UtxoChain, UtxoNetwork};
use payrecon_chain_core::{
    AccountXpub, AddressDeriver, BlockId, ChainCursor, ChainEvent, DeriveError, Lookahead,
    MAX_CHECKPOINTS, Method, Network, OutflowEvent,
};
use payrecon_chain_ethereum::EthereumDeriver;
use payrecon_chain_solana::SolanaPayDeriver;
use payrecon_chain_tron::TronDeriver;
use serde::Serialize;

use crate::config::{Config, EthereumFinality, NetworksConfig, RatesConfig, TronFinality};
use crate::error::Error;
use crate::intent::{IntentRate, IntentStatus, PaymentIntent, UriParams, crypto_amount_for};
use crate::keys::{AccountKey, NetworkKeys, check_lookahead};
use crate::keys::{UtxoWallet, UtxoWallets};
use crate::matcher::{ConfirmationRule, MatchPolicy};
use crate::order::{OrderRef, OrderStatus};
use crate::rates::{CoinGecko, Kraken, RateBook, RateSource, RecordedQuotes};
use crate::store::payments::{self, NewEvent};
use crate::store::{Answers, GroupWrite, WriteFuture, WriteTx};

/// Intents evaluated per `tick` call at most, so one call stays short.
pub const TICK_BATCH: usize = 500;

/// Everything the engine needs to make and match payment instructions.
#[derive(Debug)]
pub struct PaymentSettings {
    /// Methods customers may pick.
    pub enabled: BTreeSet<Method>,
    /// Address derivation per network.
    pub derivers: BTreeMap<Network, Arc<dyn AddressDeriver>>,
    /// Rates to lock.
    pub rates: Option<Arc<RateBook>>,
    /// Deadline per method.
    pub deadlines: BTreeMap<Method, chrono::Duration>,
    /// Default deadline.
    pub default_deadline: chrono::Duration,
    /// How long after its deadline an intent stays watched.
    pub monitoring_window: chrono::Duration,
    /// The matcher's rules.
    pub policy: MatchPolicy,
    /// Chain parameters for payment URIs.
    pub uri: UriParams,
    /// The Bitcoin-family accounts, as the merchant's wallet must import them.
    pub wallets: UtxoWallets,
    /// Every derived-key network's current and retired keys and look-ahead.
    pub keys: BTreeMap<Network, NetworkKeys>,
    /// The networks whose receipts witnesses confirm before they are credited.
    pub witnesses: BTreeMap<Network, crate::networks::WitnessPlan>,
    /// Per network, a block explorer's page of a transaction (`{txid}` where its id goes).
    pub explorers: BTreeMap<Network, String>,
    /// Per method, who pays a refund's network fee (the shop when not named).
    pub refund_fee_payer: BTreeMap<Method, crate::records::FeePayer>,
    /// The networks' sources, as configured: where a refund's transaction is looked up.
    pub networks: crate::config::NetworksConfig,
}

impl Default for PaymentSettings {
    fn default() -> PaymentSettings {
        PaymentSettings {
            enabled: BTreeSet::new(),
            derivers: BTreeMap::new(),
            rates: None,
            deadlines: BTreeMap::new(),
            default_deadline: chrono::Duration::minutes(60),
            monitoring_window: chrono::Duration::days(7),
            policy: MatchPolicy::defaults(),
            uri: UriParams {
                ethereum_chain_id: 1,
                usdt_erc20_contract: "0xdAC17F958D2ee523a2206206994597C13D831ec7".into(),
                usdc_erc20_contract: "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48".into(),
                usdt_trc20_contract: "TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6t".into(),
                label: "payrecon".into(),
            },
            wallets: UtxoWallets::new(),
            keys: BTreeMap::new(),
            witnesses: BTreeMap::new(),
            explorers: BTreeMap::new(),
            refund_fee_payer: BTreeMap::new(),
            networks: crate::config::NetworksConfig::default(),
        }
    }
}

impl PaymentSettings {
    /// Builds derivers, rate sources and rules from the configuration; refuses invalid keys.
    pub fn from_config(config: &Config) -> Result<PaymentSettings, Error> {
        let payments = &config.payments;
        let mut settings = PaymentSettings {
            enabled: payments.enabled_methods.iter().copied().collect(),
            deadlines: payments
                .deadline_minutes
                .iter()
                .map(|(method, minutes)| (*method, chrono::Duration::minutes(i64::from(*minutes))))
                .collect(),
            default_deadline: chrono::Duration::minutes(i64::from(
                payments.default_deadline_minutes,
            )),
            monitoring_window: chrono::Duration::hours(i64::from(payments.monitoring_window_hours)),
            rates: Some(Arc::new(rate_book(&config.rates)?)),
            ..PaymentSettings::default()
        };
        settings.uri.label = payments.label.clone();
        settings.policy.underpayment_tolerance_bps = payments.underpayment_tolerance_bps;
        settings.policy.overpayment = payments.overpayment_policy;
        settings.policy.late_payment = payments.late_payment_policy;
        for (method, limit) in &payments.dust {
            let limit = method.parse_amount(limit).map_err(|e| {
                Error::Config(format!(
                    "payments.dust.{method}: {limit:?} is not an amount: {e}"
                ))
            })?;
            settings.policy.dust.insert(*method, limit);
        }
        add_networks(&mut settings, &config.networks)?;
        for network in Network::ALL {
            if let Some(plan) = crate::networks::witnesses(&config.networks, network)? {
                settings.witnesses.insert(network, plan);
            }
        }
        settings.explorers = explorers(config)?;
        settings.refund_fee_payer = refund_fee_payers(config)?;
        settings.networks = config.networks.clone();
        Ok(settings)
    }

    /// Adds the keys the database knows `network` had before its configured one: they stay
    /// watched and exported. A stored key that no longer parses is refused.
    pub(crate) fn add_retired(
        &mut self,
        network: Network,
        rows: &[crate::store::keys::KeyRow],
    ) -> Result<(), Error> {
        let Some(keys) = self.keys.get_mut(&network) else {
            return Ok(());
        };
        for row in rows {
            if row.key_id == keys.current.key_id || keys.get(&row.key_id).is_some() {
                continue;
            }
            let account: AccountXpub = row.account_key.parse().map_err(|e: DeriveError| {
                Error::Config(format!("retired key {} of {network}: {e}", row.key_id))
            })?;
            let wallet = keys.current.wallet.as_ref().map(|current| UtxoWallet {
                account: account.clone(),
                origin: row
                    .key_origin
                    .as_deref()
                    .and_then(|text| text.parse::<KeyOrigin>().ok()),
                ..current.clone()
            });
            let utxo = wallet.as_ref().map(|w| w.network);
            keys.retired.push(AccountKey {
                key_id: row.key_id.clone(),
                account_key: row.account_key.clone(),
                key_origin: row.key_origin.clone(),
                deriver: deriver_of(network, account, utxo),
                wallet,
            });
        }
        Ok(())
    }
}

/// The deriver of `account` on `network`, for the configured key and a retired one alike;
/// Bitcoin and Litecoin need their wallet's chain. Solana derives from no account key and
/// never comes here.
pub(crate) fn deriver_of(
    network: Network,
    account: AccountXpub,
    utxo: Option<UtxoNetwork>,
) -> Arc<dyn AddressDeriver> {
    let utxo = utxo.unwrap_or(UtxoNetwork::Mainnet);
    match network {
        Network::Bitcoin => Arc::new(SegwitDeriver::new(account, UtxoChain::Bitcoin, utxo)),
        Network::Litecoin => Arc::new(SegwitDeriver::new(account, UtxoChain::Litecoin, utxo)),
        Network::Tron => Arc::new(TronDeriver::new(account)),
        _ => Arc::new(EthereumDeriver::new(account)),
    }
}

pub(crate) fn rate_book(config: &RatesConfig) -> Result<RateBook, Error> {
    let client = reqwest::Client::builder()
        .user_agent(concat!("payrecon/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
    let mut sources: Vec<Arc<dyn RateSource>> = Vec::new();
    for name in &config.sources {
        sources.push(match name.as_str() {
            "coingecko" => Arc::new(CoinGecko::new(
                client.clone(),
                config.coingecko_url.expose(),
                config.coingecko_api_key.clone(),
            )),
            "kraken" => Arc::new(Kraken::new(client.clone(), config.kraken_url.expose())),
            "recorded" => {
                let path = config.recorded_quotes_file.clone().ok_or_else(|| {
                    Error::Config("rates source `recorded` needs rates.recorded_quotes_file".into())
                })?;
                Arc::new(RecordedQuotes::new(path))
            }
            other => {
                return Err(Error::Config(format!(
                    "unknown rate source {other:?}: use coingecko, kraken or recorded"
                )));
            }
        });
    }
    Ok(RateBook::new(
        sources,
        chrono::Duration::seconds(i64::from(config.max_age_seconds)),
        config.peg_band_percent / rust_decimal::Decimal::ONE_HUNDRED,
        chrono::Duration::seconds(i64::from(config.cache_seconds)),
    )
    .with_history_tolerance(chrono::Duration::seconds(i64::from(
        config.history_tolerance_seconds,
    ))))
}

/// A network's configured treasury addresses in the form its outflows name destinations in;
/// one that does not parse is refused at start.
fn treasury_of(
    network: Network,
    addresses: &[String],
    canonical: impl Fn(&str) -> Result<String, String>,
) -> Result<BTreeSet<String>, Error> {
    addresses
        .iter()
        .map(|address| {
            canonical(address).map_err(|e| {
                Error::Config(format!(
                    "networks.{network}.treasury_addresses: {address:?} is not an address: {e}"
                ))
            })
        })
        .collect()
}

/// A Bitcoin-family key says by its version bytes whether it is a mainnet key (`xpub`,
/// `zpub`, `Ltub`) or a test one (`tpub`, `vpub`, `ttub`): one of the other kind would hand
/// out addresses of a wallet the merchant keeps for the other chain.
fn key_fits_network(
    network: Network,
    account: &AccountXpub,
    utxo_network: UtxoNetwork,
) -> Result<(), Error> {
    let mainnet_key = account.xpub().network == payrecon_chain_core::bitcoin::NetworkKind::Main;
    let mainnet = utxo_network == UtxoNetwork::Mainnet;
    if mainnet_key == mainnet {
        return Ok(());
    }
    let (key, chain) = if mainnet_key {
        ("a mainnet key (xpub, zpub, Ltub)", "a test chain")
    } else {
        ("a test key (tpub, vpub, ttub)", "mainnet")
    };
    Err(Error::Config(format!(
        "networks.{network}.xpub is {key}, and networks.{network}.network says {chain} ({utxo_network:?}): give the account key of the wallet for that chain"
    )))
}

/// Each network's block explorer: the mainnet ones by default (a test network has none), as
/// `payments.explorer_urls` overrides them (`""` for none).
fn explorers(config: &Config) -> Result<BTreeMap<Network, String>, Error> {
    let networks = &config.networks;
    let utxo_mainnet = |utxo: &Option<crate::config::UtxoConfig>| {
        utxo.as_ref().is_some_and(|c| c.network == "mainnet")
    };
    let mut explorers = BTreeMap::new();
    for (network, mainnet, url) in [
        (
            Network::Bitcoin,
            utxo_mainnet(&networks.bitcoin),
            "https://mempool.space/tx/{txid}",
        ),
        (
            Network::Litecoin,
            utxo_mainnet(&networks.litecoin),
            "https://litecoinspace.org/tx/{txid}",
        ),
        (
            Network::Ethereum,
            networks.ethereum.as_ref().is_some_and(|c| c.chain_id == 1),
            "https://etherscan.io/tx/{txid}",
        ),
        (
            Network::Tron,
            networks.tron.is_some(),
            "https://tronscan.org/#/transaction/{txid}",
        ),
        (
            Network::Solana,
            networks.solana.is_some(),
            "https://explorer.solana.com/tx/{txid}",
        ),
    ] {
        if mainnet {
            explorers.insert(network, url.to_owned());
        }
    }
    for (network, url) in &config.payments.explorer_urls {
        if url.is_empty() {
            explorers.remove(network);
            continue;
        }
        let web = url.starts_with("https://") || url.starts_with("http://");
        if !web || !url.contains("{txid}") || url.len() > 300 {
            return Err(Error::Config(format!(
                "payments.explorer_urls.{network}: {:?} is not an http(s) address with {{txid}} where the transaction id goes",
                payrecon_chain_core::excerpt(url)
            )));
        }
        explorers.insert(*network, url.clone());
    }
    Ok(explorers)
}

/// Who pays each method's refund fee; the customer only on Bitcoin and Litecoin, where the
/// PSBT payrecon prepares fixes the fee, so the amount less it is what the customer is due.
fn refund_fee_payers(config: &Config) -> Result<BTreeMap<Method, crate::records::FeePayer>, Error> {
    for (method, payer) in &config.payments.refund_fee_payer {
        if *payer == crate::records::FeePayer::Customer
            && !matches!(method, Method::Btc | Method::Ltc)
        {
            return Err(Error::Config(format!(
                "payments.refund_fee_payer.{method}: the customer pays the fee only of a Bitcoin or Litecoin refund, whose fee payrecon's PSBT fixes exactly"
            )));
        }
    }
    Ok(config.payments.refund_fee_payer.clone())
}

fn add_networks(settings: &mut PaymentSettings, networks: &NetworksConfig) -> Result<(), Error> {
    let xpub = |network: Network, text: &str| -> Result<AccountXpub, Error> {
        text.parse()
            .map_err(|e: DeriveError| Error::Config(format!("networks.{network}.xpub: {e}")))
    };
    let mut wallets = UtxoWallets::new();
    let mut treasury = BTreeMap::new();
    let mut keys = Vec::new();
    let mut add = |network: Network, deriver: Arc<dyn AddressDeriver>, confirmations, tiers| {
        settings
            .derivers
            .insert(network, Arc::new(Lookahead::new(deriver)));
        settings.policy.confirmations.insert(
            network,
            ConfirmationRule {
                confirmations,
                tiers,
            },
        );
    };
    for (network, config) in [
        (Network::Bitcoin, &networks.bitcoin),
        (Network::Litecoin, &networks.litecoin),
    ] {
        if let Some(config) = config {
            let utxo_network = config.network.parse().map_err(|e: DeriveError| {
                Error::Config(format!("networks.{network}.network: {e}"))
            })?;
            let account = xpub(network, &config.xpub)?;
            key_fits_network(network, &account, utxo_network)?;
            let origin = config
                .key_origin
                .as_deref()
                .map(|text| text.parse::<KeyOrigin>())
                .transpose()
                .map_err(|e| Error::Config(format!("networks.{network}.key_origin: {e}")))?;
            let wallet = UtxoWallet {
                account: account.clone(),
                network: utxo_network,
                origin,
                gap_limit_warning: config.gap_limit_warning,
            };
            wallet
                .descriptors()
                .map_err(|e| Error::Config(format!("networks.{network}.key_origin: {e}")))?;
            treasury.insert(network, config.treasury_addresses.iter().cloned().collect());
            let deriver = deriver_of(network, account, Some(utxo_network));
            keys.push((
                network,
                config.lookahead,
                current_key(
                    &deriver,
                    &config.xpub,
                    config.key_origin.clone(),
                    Some(wallet.clone()),
                ),
            ));
            wallets.insert(network, wallet);
            add(
                network,
                deriver,
                config.confirmations,
                config.confirmation_tiers.clone(),
            );
        }
    }
    if let Some(config) = &networks.ethereum {
        if config.finality == EthereumFinality::Finalized {
            explicit_finality_depth(Network::Ethereum, config.confirmations)?;
        }
        let deriver = deriver_of(
            Network::Ethereum,
            xpub(Network::Ethereum, &config.xpub)?,
            None,
        );
        keys.push((
            Network::Ethereum,
            config.lookahead,
            current_key(&deriver, &config.xpub, None, None),
        ));
        add(
            Network::Ethereum,
            deriver,
            config.confirmations,
            config.confirmation_tiers.clone(),
        );
        let own = treasury_of(Network::Ethereum, &config.treasury_addresses, |a| {
            // Senders and destinations are named checksummed.
            a.parse::<alloy_primitives::Address>()
                .map(|a| a.to_checksum(None))
                .map_err(|e| e.to_string())
        })?;
        treasury.insert(Network::Ethereum, own);
        settings.uri.ethereum_chain_id = config.chain_id;
        settings.uri.usdt_erc20_contract = config.usdt_contract.clone();
        settings.uri.usdc_erc20_contract = config.usdc_contract.clone();
    }
    if let Some(config) = &networks.tron {
        if config.finality == TronFinality::Solidified {
            explicit_finality_depth(Network::Tron, config.confirmations)?;
        }
        let own = treasury_of(Network::Tron, &config.treasury_addresses, |a| {
            a.parse::<payrecon_chain_tron::TronAddress>()
                .map(|a| a.to_string())
                .map_err(|e| e.to_string())
        })?;
        treasury.insert(Network::Tron, own);
        let deriver = deriver_of(Network::Tron, xpub(Network::Tron, &config.xpub)?, None);
        keys.push((
            Network::Tron,
            config.lookahead,
            current_key(&deriver, &config.xpub, None, None),
        ));
        add(
            Network::Tron,
            deriver,
            config.confirmations,
            config.confirmation_tiers.clone(),
        );
        settings.uri.usdt_trc20_contract = config.usdt_contract.clone();
    }
    if let Some(config) = &networks.solana {
        let own = treasury_of(Network::Solana, &config.treasury_addresses, |a| {
            payrecon_chain_solana::solana_address(a).map_err(|e| e.to_string())
        })?;
        treasury.insert(Network::Solana, own);
        let deriver = SolanaPayDeriver::new(&config.recipient)
            .map_err(|e| Error::Config(format!("networks.solana.recipient: {e}")))?;
        add(
            Network::Solana,
            Arc::new(deriver),
            config.confirmations,
            config.confirmation_tiers.clone(),
        );
    }
    settings.wallets = wallets;
    settings.policy.treasury = treasury;
    for (network, lookahead, current) in keys {
        check_lookahead(network, lookahead)?;
        settings.keys.insert(
            network,
            NetworkKeys {
                lookahead,
                current,
                retired: Vec::new(),
            },
        );
    }
    Ok(())
}

/// The configured key of a derived-key network.
fn current_key(
    deriver: &Arc<dyn AddressDeriver>,
    account_key: &str,
    key_origin: Option<String>,
    wallet: Option<UtxoWallet>,
) -> AccountKey {
    AccountKey {
        key_id: deriver.key_id(),
        account_key: account_key.trim().to_owned(),
        key_origin,
        deriver: deriver.clone(),
        wallet,
    }
}

/// With explicit finality (Ethereum's `finalized` tag, Tron's solidified blocks) a payment in a
/// block not yet final is reported with 1 confirmation and a final one with at least
/// `confirmations`: the two must differ, or 1 would already count as final.
fn explicit_finality_depth(network: Network, confirmations: u32) -> Result<(), Error> {
    if confirmations < 2 {
        return Err(Error::Config(format!(
            "networks.{network}.confirmations must be at least 2 when the chain's own finality decides: \
             a payment is reported with 1 confirmation until its block is final"
        )));
    }
    Ok(())
}

/// An intent with its rate, dates and derivation index, waiting for its order's total (read
/// under the order's lock): what a group-committed write turns into a stored intent.
pub(crate) struct IntentDraft {
    pub(crate) order_ref: OrderRef,
    pub(crate) method: Method,
    pub(crate) deriver: Arc<dyn AddressDeriver>,
    /// Taken from this process's block of the key (see [`crate::indexes`]).
    pub(crate) index: u32,
    pub(crate) rate: IntentRate,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) deadline: DateTime<Utc>,
    pub(crate) monitor_until: DateTime<Utc>,
}

impl GroupWrite for IntentDraft {
    type Output = PaymentIntent;
    type Error = Error;
    const BATCHED: bool = true;

    fn run<'a>(&'a self, tx: &'a mut WriteTx) -> WriteFuture<'a, PaymentIntent, Error> {
        Box::pin(store_intent(tx, self))
    }

    fn run_many<'a>(
        drafts: Vec<&'a IntentDraft>,
        tx: &'a mut WriteTx,
    ) -> WriteFuture<'a, Answers<PaymentIntent, Error>, Error> {
        Box::pin(store_intents(tx, drafts))
    }
}

/// The `intent_created` event of an intent.
fn intent_created(intent: &PaymentIntent, superseded: &[String]) -> NewEvent {
    NewEvent {
        intent_id: Some(intent.id.clone()),
        order_ref: Some(intent.order_ref.to_string()),
        kind: "intent_created",
        detail: serde_json::json!({
            "method": intent.method, "address": intent.pay_to, "amount": intent.amount_decimal(),
            "deadline": intent.deadline, "supersedes": superseded,
        }),
    }
}

/// The intent a draft becomes with the address derived from its index.
fn intent_of(draft: &IntentDraft, order: &crate::order::Order) -> Result<PaymentIntent, Error> {
    let index = draft.index;
    let method = draft.method;
    let amount =
        crypto_amount_for(order.total_usd, draft.rate.usd_per_unit, method).ok_or_else(|| {
            Error::Config(format!(
                "rate {} cannot price {method}",
                draft.rate.usd_per_unit
            ))
        })?;
    let derived = draft.deriver.derive(index)?;
    Ok(PaymentIntent {
        id: format!("pi_{}", uuid::Uuid::now_v7().simple()),
        order_ref: draft.order_ref.clone(),
        method: draft.method,
        pay_to: derived.address,
        watch_key: derived.watch_key,
        amount,
        usd: order.total_usd,
        rate: draft.rate.clone(),
        created_at: draft.created_at,
        deadline: draft.deadline,
        monitor_until: draft.monitor_until,
        status: IntentStatus::AwaitingPayment,
        superseded_by: None,
        marked_paid_at: None,
        first_seen_at: None,
        settled_at: None,
        settlement_count: 0,
        key_id: draft.deriver.key_id(),
        derivation_index: index,
        checkout_key: uuid::Uuid::new_v4().simple().to_string(),
    })
}

/// [`store_intent`] for many drafts at once, in a fixed number of statements: the orders
/// locked, the intents, the superseding and the events. A draft refused (its order unknown or
/// settled, its address not derivable) stores nothing; its caller gives its index back.
async fn store_intents(
    tx: &mut WriteTx,
    drafts: Vec<&IntentDraft>,
) -> Result<Answers<PaymentIntent, Error>, Error> {
    let references: Vec<&str> = drafts.iter().map(|d| d.order_ref.as_str()).collect();
    let orders: HashMap<String, crate::order::Order> =
        crate::store::orders::lock_orders(tx, &references)
            .await?
            .into_iter()
            .map(|stored| (stored.order.reference.to_string(), stored.order))
            .collect();
    let with_live_intents = payments::with_live_intents(tx, &references).await?;
    let mut results: Vec<Result<PaymentIntent, Error>> = Vec::with_capacity(drafts.len());
    for draft in &drafts {
        let outcome = match orders.get(draft.order_ref.as_str()) {
            None => Err(Error::OrderNotFound(draft.order_ref.clone())),
            Some(order) if order.status != OrderStatus::Open => {
                Err(Error::AlreadySettled(draft.order_ref.clone()))
            }
            Some(order) => intent_of(draft, order),
        };
        results.push(outcome);
    }
    refuse_found_paid(tx, &mut results).await?;
    // Per order, the first new intent supersedes the stored live ones, each later one the new
    // one before it.
    let mut supersedes: Vec<Vec<String>> = vec![Vec::new(); results.len()];
    let mut newest_of: HashMap<&str, usize> = HashMap::new();
    let mut chained: Vec<(usize, usize)> = Vec::new();
    let mut first_of: Vec<(String, String, usize)> = Vec::new();
    for (i, result) in results.iter().enumerate() {
        let Ok(intent) = result else {
            continue;
        };
        let order = drafts[i].order_ref.as_str();
        match newest_of.insert(order, i) {
            Some(before) => chained.push((before, i)),
            None => first_of.push((order.to_owned(), intent.id.clone(), i)),
        }
    }
    for &(before, after) in &chained {
        let newer = results[after].as_ref().ok().map(|intent| intent.id.clone());
        if let (Some(newer), Ok(older)) = (newer, &mut results[before]) {
            supersedes[after].push(older.id.clone());
            older.superseded_by = Some(newer);
        }
    }
    // Only orders that have a live intent have one to supersede.
    let pairs: Vec<(&str, &str)> = first_of
        .iter()
        .filter(|(order, _, _)| with_live_intents.contains(order.as_str()))
        .map(|(order, id, _)| (order.as_str(), id.as_str()))
        .collect();
    for (old, order) in payments::supersede_for_orders(tx, &pairs).await? {
        if let Some((_, _, i)) = first_of.iter().find(|(o, _, _)| *o == order) {
            supersedes[*i].push(old);
        }
    }
    let kept: Vec<&PaymentIntent> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    payments::insert_intents(tx, &kept).await?;
    let events: Vec<(NewEvent, DateTime<Utc>)> = results
        .iter()
        .zip(&supersedes)
        .filter_map(|(r, superseded)| {
            r.as_ref()
                .ok()
                .map(|intent| (intent_created(intent, superseded), intent.created_at))
        })
        .collect();
    let timed: Vec<(&NewEvent, DateTime<Utc>)> = events.iter().map(|(e, at)| (e, *at)).collect();
    payments::append_events_at(tx.conn(), &timed).await?;
    // What the caller gets back is the intent as stored when it was made: the newest of its
    // order is not superseded yet.
    for intent in results.iter_mut().flatten() {
        intent.superseded_by = None;
    }
    Ok(results)
}

/// Refuses each intent whose address money was found at before anyone was given it: a process
/// took its index in a block before a watcher or the holdings check found the payment there
/// (see [`crate::indexes`]).
async fn refuse_found_paid(
    tx: &mut WriteTx,
    results: &mut [Result<PaymentIntent, Error>],
) -> Result<(), Error> {
    let mut by_network: BTreeMap<Network, Vec<&str>> = BTreeMap::new();
    for intent in results.iter().flatten() {
        by_network
            .entry(intent.network())
            .or_default()
            .push(intent.watch_key.as_str());
    }
    let mut found: Vec<(Network, String)> = Vec::new();
    for (network, keys) in by_network {
        for key in payments::found_ahead(tx, network.as_str(), &keys).await? {
            found.push((network, key));
        }
    }
    for result in results.iter_mut() {
        if let Ok(intent) = result
            && found
                .iter()
                .any(|(network, key)| *network == intent.network() && *key == intent.watch_key)
        {
            *result = Err(Error::AddressFoundPaid {
                network: intent.network(),
                address: intent.pay_to.clone(),
            });
        }
    }
    Ok(())
}

/// Stores a drafted intent under its order's lock: the address derived from its index, the
/// intent, the superseding of the order's older intents and the `intent_created` event.
async fn store_intent(tx: &mut WriteTx, draft: &IntentDraft) -> Result<PaymentIntent, Error> {
    let order_ref = &draft.order_ref;
    let order = crate::store::orders::lock_order(tx, order_ref)
        .await?
        .ok_or_else(|| Error::OrderNotFound(order_ref.clone()))?
        .order;
    if order.status != OrderStatus::Open {
        return Err(Error::AlreadySettled(order_ref.clone()));
    }
    let mut made = intent_of(draft, &order);
    refuse_found_paid(tx, std::slice::from_mut(&mut made)).await?;
    let intent = made?;
    payments::insert_intent(tx, &intent).await?;
    let superseded = payments::supersede_others(tx.conn(), order_ref, &intent.id).await?;
    payments::append_events_at(
        tx.conn(),
        &[(&intent_created(&intent, &superseded), draft.created_at)],
    )
    .await?;
    Ok(intent)
}

/// Records "I have paid" once, with its event; later calls keep the first time.
pub(crate) async fn record_marked_paid(
    tx: &mut WriteTx,
    intent_id: &str,
    now: DateTime<Utc>,
) -> Result<bool, Error> {
    let intent = payments::get_intent(tx.conn(), intent_id)
        .await?
        .ok_or_else(|| Error::IntentNotFound(intent_id.to_owned()))?;
    let recorded = payments::mark_paid(tx.conn(), intent_id, now).await?;
    if recorded {
        payments::append_event(
            tx.conn(),
            Some(intent_id),
            Some(intent.order_ref.as_str()),
            "marked_paid",
            &serde_json::json!({}),
            now,
        )
        .await?;
    }
    Ok(recorded)
}

/// What the shop shows the customer: the intent, its payment URI and a QR code of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PaymentInstructions {
    /// The intent.
    #[serde(flatten)]
    pub intent: PaymentIntent,
    /// The amount as a decimal of the asset.
    pub amount_decimal: String,
    /// The asset's ticker.
    pub asset: String,
    /// A wallet URI (BIP21, EIP-681, Solana Pay, tron:).
    pub payment_uri: String,
    /// What to tell the customer about its state.
    pub customer_message: String,
    /// The customer's checkout page, below the address `payrecon serve` is reached at: the
    /// shop links the customer there (public; the path's key is the only credential).
    pub checkout_path: String,
    /// How far payrecon has read the intent's chain: everything the chain source held up to
    /// this time is read. An intent past its deadline is `expired` only once this passes the
    /// deadline; until then `status` stays as it was and `customer_message` says the network
    /// is being checked. `None` when no watcher of payrecon reports for the network (and in
    /// the answer that creates the instructions).
    pub chain_read_until: Option<chrono::DateTime<chrono::Utc>>,
}

/// Refuses a watcher's batch that no chain could produce: a transfer of another network, a
/// cursor without a usable tip or with too many or misplaced checkpoints.
/// Refuses a watcher's outflow report about another network, or one spending an output of
/// another network.
pub(crate) fn check_outflows(network: Network, outflows: &[OutflowEvent]) -> Result<(), Error> {
    let stray = outflows.iter().find(|event| {
        event.id().network != network
            || matches!(event, OutflowEvent::Sent { outflow, .. }
                if outflow.spends.as_ref().is_some_and(|s| s.network != network))
    });
    match stray {
        Some(event) => Err(Error::InvalidEvent(format!(
            "the {network} watcher reported outflow {} of another network",
            event.id()
        ))),
        None => Ok(()),
    }
}

pub(crate) fn check_batch(
    network: Network,
    events: &[ChainEvent],
    cursor: &ChainCursor,
) -> Result<(), Error> {
    if let Some(stray) = events.iter().find(|e| e.transfer_id().network != network) {
        return Err(Error::InvalidEvent(format!(
            "the {network} watcher reported a transfer on {}",
            stray.transfer_id().network
        )));
    }
    let hash_ok = |block: &BlockId| {
        !block.hash.is_empty()
            && block.hash.len() <= 128
            && block.hash.chars().all(|c| c.is_ascii_graphic())
    };
    if cursor.checkpoints.len() > MAX_CHECKPOINTS
        || !hash_ok(&cursor.tip)
        || !cursor
            .checkpoints
            .iter()
            .all(|b| hash_ok(b) && b.height < cursor.tip.height)
    {
        return Err(Error::InvalidEvent(format!(
            "the {network} cursor must name its tip and at most {MAX_CHECKPOINTS} lower checkpoints"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explorers_are_the_mainnets_unless_configured() {
        let config = |text: &str| Config::from_toml(text).unwrap();
        let mainnet = config(
            "[networks.litecoin]\nxpub = \"x\"\nconfirmations = 6\n\
             [networks.bitcoin]\nxpub = \"x\"\nnetwork = \"regtest\"\nconfirmations = 2\n",
        );
        let found = explorers(&mainnet).unwrap();
        assert_eq!(
            found.get(&Network::Litecoin).map(String::as_str),
            Some("https://litecoinspace.org/tx/{txid}")
        );
        assert!(
            !found.contains_key(&Network::Bitcoin),
            "a test network has none"
        );
        let configured = config(
            "[payments.explorer_urls]\nlitecoin = \"\"\nbitcoin = \"https://x.example/tx/{txid}\"\n\
             [networks.litecoin]\nxpub = \"x\"\nconfirmations = 6\n",
        );
        let found = explorers(&configured).unwrap();
        assert!(!found.contains_key(&Network::Litecoin));
        assert_eq!(found.len(), 1);
        let wrong = config("[payments.explorer_urls]\nsolana = \"javascript:alert(1)\"\n");
        let refused = explorers(&wrong).unwrap_err().to_string();
        assert!(
            refused.contains("payments.explorer_urls.solana"),
            "{refused}"
        );
    }
}
