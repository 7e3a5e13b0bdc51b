//! `payrecon doctor`: the configuration checked against the world before going live. Each
//! check is one line (ok, warn or fail, and what to do), made with the same clients, timeouts
//! and secret handling `payrecon serve` uses, and reading nothing into the database.
//!
//! The mistakes it is for lose payments silently: a testnet key on mainnet, a node that serves
//! another chain or is not synced, a token address copied from another chain, rate sources
//! that disagree, a webhook endpoint that cannot be reached.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use payrecon_chain_core::bitcoin::NetworkKind;
use payrecon_chain_core::{AccountXpub, Asset, Method, Network, Probe};
use rust_decimal::Decimal;
use serde::Serialize;

use crate::audit::Rechecker;
use crate::config::Durability;
use crate::config::{Config, WebhookConfig};
use crate::store::Store;

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// As it should be.
    Ok,
    /// Works, but look at it.
    Warn,
    /// Payments would be lost or refused: fix it before going live.
    Fail,
}

/// One line of `payrecon doctor`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DoctorCheck {
    /// What was checked (`database`, `litecoin node`, `usdt-erc20 contract`, …).
    pub check: String,
    /// How it came out.
    pub verdict: Verdict,
    /// What was found, and for a warning or a failure what to do.
    pub detail: String,
}

/// How long a name lookup of a webhook endpoint may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Every check of `config`, in order: the database, each configured network (its key, its
/// node, the chain it serves, how synced it is, what the configuration names on it), the
/// clock against the nodes, the rate sources, and the webhook endpoints.
pub async fn doctor(config: &Config) -> Vec<DoctorCheck> {
    let mut checks = vec![database(config).await];
    let mut tips = Vec::new();
    for network in configured_networks(config) {
        checks.push(key(config, network));
        let (node, probe) = node(config, network).await;
        checks.extend(node);
        if let Some(probe) = probe {
            checks.extend(findings(config, network, &probe));
            // A local chain's blocks carry whatever time its tests set.
            if let Some(at) = probe.tip_time_ms.and_then(DateTime::from_timestamp_millis)
                && !local_chain(config, network)
            {
                tips.push((network, at));
            }
        }
    }
    checks.push(clock(&tips, Utc::now()));
    checks.extend(rates(config).await);
    for webhook in &config.webhooks {
        checks.push(webhook_endpoint(webhook).await);
    }
    checks
}

fn line(check: impl Into<String>, verdict: Verdict, detail: impl Into<String>) -> DoctorCheck {
    DoctorCheck {
        check: check.into(),
        verdict,
        detail: detail.into(),
    }
}

async fn database(config: &Config) -> DoctorCheck {
    let url = &config.database_url;
    let store = match Store::connect_with(url.expose(), Durability::Full).await {
        Ok(store) => store,
        Err(e) => {
            return line(
                "database",
                Verdict::Fail,
                format!("{url} cannot be opened: {e}"),
            );
        }
    };
    let health = match store.health().await {
        Ok(health) => health,
        Err(e) => return line("database", Verdict::Fail, format!("{url}: {e}")),
    };
    let (verdict, schema) = match health.schema_version {
        None => (
            Verdict::Warn,
            "empty: `payrecon init` creates the schema".to_owned(),
        ),
        Some(v) if v > health.binary_version => (
            Verdict::Fail,
            format!(
                "schema {v}, written by a newer payrecon (this one knows {}): run the newer one",
                health.binary_version
            ),
        ),
        Some(v) if v < health.binary_version => (
            Verdict::Warn,
            format!(
                "schema {v}; `payrecon init` (or the next start) upgrades it to {}",
                health.binary_version
            ),
        ),
        Some(v) => (Verdict::Ok, format!("schema {v}, this payrecon's")),
    };
    let (verdict, durability) = if health.durable {
        (verdict, health.durability)
    } else {
        (
            Verdict::Fail,
            format!(
                "{}: a commit could be lost after it was answered; turn these on",
                health.durability
            ),
        )
    };
    line(
        "database",
        verdict,
        format!("{url} ({:?}): {schema}; {durability}", store.backend()),
    )
}

fn configured_networks(config: &Config) -> Vec<Network> {
    let n = &config.networks;
    [
        (n.bitcoin.is_some(), Network::Bitcoin),
        (n.litecoin.is_some(), Network::Litecoin),
        (n.ethereum.is_some(), Network::Ethereum),
        (n.tron.is_some(), Network::Tron),
        (n.solana.is_some(), Network::Solana),
    ]
    .into_iter()
    .filter_map(|(configured, network)| configured.then_some(network))
    .collect()
}

/// Whether the configuration names a local test chain, which mines only when asked: its tip's
/// age says nothing about being synced.
fn local_chain(config: &Config, network: Network) -> bool {
    let n = &config.networks;
    match network {
        Network::Bitcoin => n.bitcoin.as_ref().is_some_and(|c| c.network == "regtest"),
        Network::Litecoin => n.litecoin.as_ref().is_some_and(|c| c.network == "regtest"),
        Network::Ethereum => n
            .ethereum
            .as_ref()
            .is_some_and(|c| matches!(c.chain_id, 1337 | 31337)),
        Network::Tron | Network::Solana => false,
    }
}

/// The account key's version bytes against the network: a testnet key on mainnet (or the
/// reverse) derives addresses nobody pays to. The first receive address it derives is shown,
/// for the merchant to compare with the wallet's: a key of the wrong account or path derives
/// another.
fn key(config: &Config, network: Network) -> DoctorCheck {
    let n = &config.networks;
    let check = format!("{network} key");
    // The key, and whether the network is mainnet where that is known from the configuration.
    let configured = match network {
        Network::Bitcoin => n.bitcoin.as_ref().map(|c| {
            (
                c.xpub.as_str(),
                Some(c.network == "mainnet"),
                c.network.parse().ok(),
            )
        }),
        Network::Litecoin => n.litecoin.as_ref().map(|c| {
            (
                c.xpub.as_str(),
                Some(c.network == "mainnet"),
                c.network.parse().ok(),
            )
        }),
        Network::Ethereum => n
            .ethereum
            .as_ref()
            .map(|c| (c.xpub.as_str(), (c.chain_id == 1).then_some(true), None)),
        Network::Tron => n.tron.as_ref().map(|c| (c.xpub.as_str(), None, None)),
        Network::Solana => {
            return line(
                check,
                Verdict::Ok,
                "Solana Pay needs no key: payments go to the configured recipient",
            );
        }
    };
    let Some((xpub, mainnet, utxo)) = configured else {
        return line(check, Verdict::Fail, "not configured");
    };
    let account = match AccountXpub::from_str(xpub) {
        Ok(account) => account,
        Err(e) => return line(check, Verdict::Fail, format!("not an account key: {e}")),
    };
    let kind = account.xpub().network;
    let prefix: String = xpub.chars().take(4).collect();
    match (mainnet, kind) {
        (Some(true), NetworkKind::Test) => line(
            check,
            Verdict::Fail,
            format!(
                "a test-network key ({prefix}…) on a mainnet configuration: use the account's mainnet xpub"
            ),
        ),
        (Some(false), NetworkKind::Main) => line(
            check,
            Verdict::Fail,
            format!(
                "a mainnet key ({prefix}…) on a test network: use the account's test-network key"
            ),
        ),
        _ => {
            let fingerprint = account.fingerprint();
            match crate::payments::deriver_of(network, account, utxo).derive(0) {
                Ok(first) => line(
                    check,
                    Verdict::Ok,
                    format!(
                        "{prefix}… account key {fingerprint}; its first receive address is {}: \
                         the wallet's first receive address must be the same",
                        first.address
                    ),
                ),
                Err(e) => line(check, Verdict::Fail, format!("derives no address: {e}")),
            }
        }
    }
}

/// A chain's usual time between blocks, for how old a synced node's tip may be.
fn block_interval(network: Network) -> Option<chrono::Duration> {
    match network {
        Network::Bitcoin => Some(chrono::Duration::minutes(10)),
        Network::Litecoin => Some(chrono::Duration::seconds(150)),
        Network::Ethereum => Some(chrono::Duration::seconds(12)),
        Network::Tron => Some(chrono::Duration::seconds(3)),
        Network::Solana => None,
    }
}

/// The node: it answers, serves the configured chain, and is synced.
/// Each source of `network` probed in order (a line each), then, with several, whether they
/// keep within the allowed lag of one another; the first source's probe for the findings.
async fn node(config: &Config, network: Network) -> (Vec<DoctorCheck>, Option<Probe>) {
    let check = format!("{network} node");
    let sources = match Rechecker::every_source(&config.networks, network) {
        Ok(sources) => sources,
        Err(why) => {
            let enabled = config
                .payments
                .enabled_methods
                .iter()
                .any(|m| m.network() == network);
            let verdict = if enabled {
                Verdict::Fail
            } else {
                Verdict::Warn
            };
            return (vec![line(check, verdict, why)], None);
        }
    };
    let count = sources.len();
    let mut lines = Vec::new();
    let mut tips = Vec::new();
    let mut first = None;
    for (i, mut source) in sources.into_iter().enumerate() {
        let check = match i {
            0 => check.clone(),
            _ => format!(
                "{network} source {} of {count} ({})",
                i + 1,
                source.source()
            ),
        };
        let (checked, probe) = probe_source(config, network, check, &mut source).await;
        lines.push(checked);
        if let Some(probe) = probe {
            tips.push((source.source().to_string(), probe.tip_height));
            if i == 0 {
                first = Some(probe);
            }
        }
    }
    if count > 1 {
        lines.push(sources_agree(
            network,
            &tips,
            max_source_lag(config, network),
        ));
    }
    lines.extend(witnesses(config, network).await);
    (lines, first)
}

/// Each witness of `network` probed as a source is (a line each): on another chain, or not
/// answering, it would hold every receipt of the network, so either fails.
async fn witnesses(config: &Config, network: Network) -> Vec<DoctorCheck> {
    let plan = match crate::networks::witnesses(&config.networks, network) {
        Ok(Some(plan)) => plan,
        Ok(None) => return Vec::new(),
        Err(why) => {
            return vec![line(
                format!("{network} witnesses"),
                Verdict::Fail,
                why.to_string(),
            )];
        }
    };
    let count = plan.sources.len();
    let mut lines = Vec::with_capacity(count);
    for (i, witness) in plan.sources.iter().enumerate() {
        let mut witness = Rechecker::witness(witness);
        let check = format!(
            "{network} witness {} of {count} ({})",
            i + 1,
            witness.source()
        );
        let (mut checked, _) = probe_source(config, network, check, &mut witness).await;
        if checked.verdict == Verdict::Ok {
            checked.detail.push_str(
                "; asked about each receipt before it is credited (one request or two per receipt)",
            );
        }
        lines.push(checked);
    }
    lines
}

/// Whether a network's sources that answered are within `max_lag` blocks of the newest.
fn sources_agree(network: Network, tips: &[(String, u64)], max_lag: u64) -> DoctorCheck {
    let check = format!("{network} sources");
    let Some(newest) = tips.iter().map(|(_, tip)| *tip).max() else {
        return line(check, Verdict::Fail, "no source answered");
    };
    match tips.iter().find(|(_, tip)| newest - tip > max_lag) {
        Some((source, tip)) => line(
            check,
            Verdict::Warn,
            format!(
                "{source} is {} blocks behind the newest source (allowed {max_lag}): the watcher leaves it while it lags",
                newest - tip
            ),
        ),
        None => line(
            check,
            Verdict::Ok,
            format!(
                "{} of them answer on the configured chain, within {max_lag} blocks of one another",
                tips.len()
            ),
        ),
    }
}

/// A network's allowed lag between sources.
fn max_source_lag(config: &Config, network: Network) -> u64 {
    let networks = &config.networks;
    match network {
        Network::Bitcoin => networks.bitcoin.as_ref().map(|c| c.max_source_lag_blocks),
        Network::Litecoin => networks.litecoin.as_ref().map(|c| c.max_source_lag_blocks),
        Network::Ethereum => networks.ethereum.as_ref().map(|c| c.max_source_lag_blocks),
        Network::Tron => networks.tron.as_ref().map(|c| c.max_source_lag_blocks),
        Network::Solana => networks.solana.as_ref().map(|c| c.max_source_lag_blocks),
    }
    .unwrap_or(0)
}

/// One source probed: it serves the configured chain, how synced it is.
async fn probe_source(
    config: &Config,
    network: Network,
    check: String,
    source: &mut Rechecker,
) -> (DoctorCheck, Option<Probe>) {
    let probe = match source.probe().await {
        Ok(probe) => probe,
        Err(e) => {
            let e = e.scrubbed(source.source());
            let what = match e {
                payrecon_chain_core::ScanError::WrongChain(why) => {
                    format!("serves another chain: {why}")
                }
                other => format!("does not answer as a node should: {other}"),
            };
            return (line(check, Verdict::Fail, what), None);
        }
    };
    let mut detail = format!("serves the configured chain; tip {}", probe.tip_height);
    let mut verdict = Verdict::Ok;
    let now = Utc::now();
    if probe.syncing {
        verdict = Verdict::Fail;
        detail
            .push_str(", still in its initial download: payments show up only once it catches up");
    } else if let (Some(at), Some(interval)) = (
        probe.tip_time_ms.and_then(DateTime::from_timestamp_millis),
        block_interval(network),
    ) {
        let age = now - at;
        if local_chain(config, network) {
            detail.push_str(" (a local chain, mined when asked: its tip's age says nothing)");
        } else if age > (interval * 12).max(chrono::Duration::minutes(10)) {
            verdict = Verdict::Fail;
            detail.push_str(&format!(
                ", {} min old: the node is not synced or has stalled; payments are not seen",
                age.num_minutes()
            ));
        } else if age > (interval * 4).max(chrono::Duration::minutes(2)) {
            verdict = Verdict::Warn;
            detail.push_str(&format!(
                ", {} s old: slower than the chain's blocks; check the node",
                age.num_seconds()
            ));
        } else {
            detail.push_str(&format!(", {} s old", age.num_seconds().max(0)));
        }
    }
    (line(check, verdict, detail), Some(probe))
}

/// What the configuration names on the chain, for the methods it enables.
fn findings(config: &Config, network: Network, probe: &Probe) -> Vec<DoctorCheck> {
    probe
        .findings
        .iter()
        .filter(|f| config.payments.enabled_methods.contains(&f.method))
        .map(|f| {
            let check = format!("{} {}", f.method, f.what);
            match &f.outcome {
                Ok(found) => line(check, Verdict::Ok, found.clone()),
                Err(wrong) if f.essential => line(
                    check,
                    Verdict::Fail,
                    format!("{wrong}; fix networks.{network} in the configuration"),
                ),
                Err(lacking) => line(
                    check,
                    Verdict::Warn,
                    format!("{lacking}; see the deployment guide's node APIs"),
                ),
            }
        })
        .collect()
}

/// This machine's clock against the nodes' newest blocks: a clock behind the chain expires
/// intents late and misdates the books. A block may be stamped up to two hours ahead on the
/// Bitcoin family, two minutes elsewhere.
fn clock(tips: &[(Network, DateTime<Utc>)], now: DateTime<Utc>) -> DoctorCheck {
    let ahead: Vec<String> = tips
        .iter()
        .filter(|(network, at)| {
            let bound = match network {
                Network::Bitcoin | Network::Litecoin => chrono::Duration::hours(2),
                _ => chrono::Duration::minutes(2),
            };
            *at - now > bound
        })
        .map(|(network, at)| format!("{network}'s tip is {} s ahead", (*at - now).num_seconds()))
        .collect();
    if !ahead.is_empty() {
        return line(
            "clock",
            Verdict::Fail,
            format!(
                "{}: this machine's clock is behind; run NTP",
                ahead.join(", ")
            ),
        );
    }
    let compared = if tips.is_empty() {
        "no public chain's tip to compare with".to_owned()
    } else {
        let names: Vec<String> = tips.iter().map(|(n, _)| n.to_string()).collect();
        format!("not behind the tips of {}", names.join(", "))
    };
    line(
        "clock",
        Verdict::Ok,
        format!("{} UTC, {compared}", now.format("%Y-%m-%d %H:%M:%S")),
    )
}

/// The rate sources: each answers, each enabled asset has a quote, and the sources agree
/// within the peg band (`rates.peg_band_percent`).
async fn rates(config: &Config) -> Vec<DoctorCheck> {
    let book = match crate::payments::rate_book(&config.rates) {
        Ok(book) => book,
        Err(e) => return vec![line("rates", Verdict::Fail, e.to_string())],
    };
    let assets: Vec<Asset> = {
        let mut assets: Vec<Asset> = config
            .payments
            .enabled_methods
            .iter()
            .map(|m: &Method| m.asset())
            .collect();
        assets.sort();
        assets.dedup();
        assets
    };
    let mut checks = Vec::new();
    let mut quotes: BTreeMap<Asset, Vec<(String, Decimal)>> = BTreeMap::new();
    for source in book.sources() {
        match source.fetch().await {
            Ok(answer) => {
                checks.push(line(
                    format!("rates {}", source.name()),
                    Verdict::Ok,
                    format!("answers: {} quotes", answer.len()),
                ));
                for quote in answer {
                    quotes
                        .entry(quote.asset)
                        .or_default()
                        .push((quote.source, quote.usd_per_unit));
                }
            }
            Err(e) => checks.push(line(
                format!("rates {}", source.name()),
                Verdict::Warn,
                format!("does not answer ({e}); the other sources price alone"),
            )),
        }
    }
    let band = book.peg_band();
    for asset in assets {
        let check = format!("rates {asset}");
        let Some(prices) = quotes.get(&asset).filter(|p| !p.is_empty()) else {
            checks.push(line(
                check,
                Verdict::Fail,
                "no source prices it: instructions in it are refused",
            ));
            continue;
        };
        let low = prices.iter().map(|(_, p)| *p).min().unwrap_or_default();
        let high = prices.iter().map(|(_, p)| *p).max().unwrap_or_default();
        let spread = if low > Decimal::ZERO {
            (high - low) / low
        } else {
            Decimal::ONE
        };
        let named: Vec<String> = prices.iter().map(|(s, p)| format!("{s} {p}")).collect();
        if spread > band {
            checks.push(line(
                check,
                Verdict::Warn,
                format!(
                    "the sources disagree by {}% (more than {}%): {}",
                    (spread * Decimal::ONE_HUNDRED).round_dp(2),
                    band * Decimal::ONE_HUNDRED,
                    named.join(", ")
                ),
            ));
        } else {
            checks.push(line(check, Verdict::Ok, named.join(", ")));
        }
    }
    checks
}

/// A webhook endpoint resolves, and is HTTPS unless the configuration allows plain HTTP.
async fn webhook_endpoint(webhook: &WebhookConfig) -> DoctorCheck {
    let check = format!("webhook {}", webhook.name);
    let url = match reqwest::Url::parse(webhook.url.expose()) {
        Ok(url) => url,
        Err(e) => return line(check, Verdict::Fail, format!("{}: {e}", webhook.url)),
    };
    if url.scheme() != "https" && !webhook.allow_plain_http {
        return line(
            check,
            Verdict::Fail,
            format!(
                "{} is not HTTPS: events and their signatures would cross the network readable; use https, or set allow_plain_http = true for a receiver on this host",
                webhook.url
            ),
        );
    }
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        return line(
            check,
            Verdict::Fail,
            format!("{} names no host", webhook.url),
        );
    };
    let lookup = tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host, port))).await;
    match lookup.map(|found| found.map(|mut addresses| addresses.next().is_some())) {
        Ok(Ok(true)) => line(check, Verdict::Ok, format!("{} resolves", webhook.url)),
        Ok(Ok(false)) | Ok(Err(_)) => line(
            check,
            Verdict::Fail,
            format!("{host} does not resolve: deliveries will fail"),
        ),
        Err(_) => line(
            check,
            Verdict::Fail,
            format!("resolving {host} took over {LOOKUP_TIMEOUT:?}"),
        ),
    }
}
