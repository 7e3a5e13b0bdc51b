//! The finance audit: every credited transfer of a period fetched again from its chain,
//! through the same clients the watchers use, and any that the chain no longer holds, or
//! holds with fewer confirmations than the credit required, reported.

use std::collections::BTreeMap;

use payrecon_chain_bitcoin::{ElectrumScanner, NodeScanner};

use crate::networks::UtxoSource;
use payrecon_chain_core::{
    Amount, Attestation, BlockId, ChainScanner, KnownTransfer, Method, Network, Probe, ScanError,
    SecretUrl, SweepFees, Transfer,
};
use payrecon_chain_ethereum::EthereumScanner;
use payrecon_chain_solana::SolanaScanner;
use payrecon_chain_tron::TronScanner;
use serde::Serialize;

use crate::config::NetworksConfig;
use crate::error::Error;
use crate::matcher::MatchPolicy;
use crate::money::Usd;
use crate::report::{ReportFormat, csv_line, html_table};
use crate::store::reports::ReportTransfer;

/// Transfers rechecked per call to a node.
pub(crate) const RECHECK_BATCH: usize = 200;

/// A credited transfer the chain does not back any more.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AuditFinding {
    /// The network.
    pub network: String,
    /// The transaction.
    pub txid: String,
    /// The output, log or instruction index.
    pub position: i64,
    /// The order it was credited to, if any.
    pub order: Option<String>,
    /// The journal entry that credited it.
    pub ledger_entry: String,
    /// Confirmations when it was last recorded.
    pub recorded_confirmations: i64,
    /// Confirmations now; `None` when the chain no longer holds it.
    pub confirmations_now: Option<u32>,
    /// Confirmations the credit required.
    pub required: u32,
    /// What is wrong, for people.
    pub problem: String,
}

/// What the audit did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AuditReport {
    /// Credited transfers fetched again.
    pub checked: u64,
    /// Those the chain does not back.
    pub findings: Vec<AuditFinding>,
    /// Networks whose credited transfers could not be checked, and why.
    pub unchecked: BTreeMap<String, String>,
}

/// A scanner of any chain, as the audit uses it.
pub(crate) enum Rechecker {
    Electrum(Box<ElectrumScanner>),
    Node(Box<NodeScanner>),
    Ethereum(EthereumScanner),
    Tron(TronScanner),
    Solana(SolanaScanner),
}

impl Rechecker {
    /// The configured client of `network` (its first source), or why there is none.
    pub(crate) fn for_network(
        networks: &NetworksConfig,
        network: Network,
    ) -> Result<Rechecker, String> {
        Ok(Rechecker::every_source(networks, network)?.swap_remove(0))
    }

    /// A client per configured source of `network`, in order (at least one), or why there is
    /// none.
    pub(crate) fn every_source(
        networks: &NetworksConfig,
        network: Network,
    ) -> Result<Vec<Rechecker>, String> {
        let missing = || format!("networks.{network} has no node configured");
        let configured = |e: Error| e.to_string();
        let sources: Vec<Rechecker> = match network {
            Network::Bitcoin | Network::Litecoin => {
                let utxo = match network {
                    Network::Bitcoin => networks.bitcoin.as_ref(),
                    _ => networks.litecoin.as_ref(),
                }
                .ok_or_else(missing)?;
                match crate::networks::utxo_source(network, utxo).map_err(configured)? {
                    Some(UtxoSource::Electrum(_)) => {
                        crate::networks::electrum_sources(network, utxo)
                            .map_err(configured)?
                            .into_iter()
                            .map(|s| Rechecker::Electrum(Box::new(ElectrumScanner::new(s))))
                            .collect()
                    }
                    Some(UtxoSource::Node(_)) => crate::networks::node_sources(network, utxo)
                        .map_err(configured)?
                        .into_iter()
                        .map(|s| Rechecker::Node(Box::new(NodeScanner::new(s))))
                        .collect(),
                    None => Vec::new(),
                }
            }
            Network::Ethereum => match &networks.ethereum {
                Some(ethereum) => crate::networks::ethereum_sources(ethereum)
                    .map_err(configured)?
                    .into_iter()
                    .map(|s| Rechecker::Ethereum(EthereumScanner::new(s)))
                    .collect(),
                None => Vec::new(),
            },
            Network::Tron => match &networks.tron {
                Some(tron) => crate::networks::tron_sources(tron)
                    .map_err(configured)?
                    .into_iter()
                    .map(|s| Rechecker::Tron(TronScanner::new(s)))
                    .collect(),
                None => Vec::new(),
            },
            Network::Solana => match &networks.solana {
                Some(solana) => crate::networks::solana_sources(solana)
                    .map_err(configured)?
                    .into_iter()
                    .map(|s| Rechecker::Solana(SolanaScanner::new(s)))
                    .collect(),
                None => Vec::new(),
            },
        };
        if sources.is_empty() {
            return Err(missing());
        }
        Ok(sources)
    }

    /// A client of one witness.
    pub(crate) fn witness(source: &crate::networks::WitnessSource) -> Rechecker {
        use crate::networks::WitnessSource;
        match source {
            WitnessSource::Electrum(s) => {
                Rechecker::Electrum(Box::new(ElectrumScanner::new(s.clone())))
            }
            WitnessSource::Ethereum(s) => Rechecker::Ethereum(EthereumScanner::new(s.clone())),
            WitnessSource::Tron(s) => Rechecker::Tron(TronScanner::new(s.clone())),
            WitnessSource::Solana(s) => Rechecker::Solana(SolanaScanner::new(s.clone())),
        }
    }

    /// Where it reads the chain, whose credentials no error text may carry.
    pub(crate) fn source(&self) -> &SecretUrl {
        match self {
            Rechecker::Electrum(s) => s.source(),
            Rechecker::Node(s) => s.source(),
            Rechecker::Ethereum(s) => s.source(),
            Rechecker::Tron(s) => s.source(),
            Rechecker::Solana(s) => s.source(),
        }
    }

    /// The source's chain checked, its tip and what the configuration depends on.
    pub(crate) async fn probe(&mut self) -> Result<Probe, ScanError> {
        match self {
            Rechecker::Electrum(s) => s.probe().await,
            Rechecker::Node(s) => s.probe().await,
            Rechecker::Ethereum(s) => s.probe().await,
            Rechecker::Tron(s) => s.probe().await,
            Rechecker::Solana(s) => s.probe().await,
        }
    }

    /// What this source says, on its own, of each of `transfers` ([`ChainScanner::attest`]).
    pub(crate) async fn attest(
        &mut self,
        transfers: &[KnownTransfer],
        settle_depth: u32,
    ) -> Result<Vec<Attestation>, ScanError> {
        let found = match self {
            Rechecker::Electrum(s) => s.attest(transfers, settle_depth).await,
            Rechecker::Node(s) => s.attest(transfers, settle_depth).await,
            Rechecker::Ethereum(s) => s.attest(transfers, settle_depth).await,
            Rechecker::Tron(s) => s.attest(transfers, settle_depth).await,
            Rechecker::Solana(s) => s.attest(transfers, settle_depth).await,
        };
        found.map_err(|e| e.scrubbed(self.source()))
    }

    /// What `txid` paid `to_address` of `asset` ([`ChainScanner::paid_to`]).
    pub(crate) async fn paid_to(
        &mut self,
        txid: &str,
        to_address: &str,
        asset: &payrecon_chain_core::ReceivedAsset,
        seen_at: Option<u64>,
    ) -> Result<Option<payrecon_chain_core::Paid>, ScanError> {
        let found = match self {
            Rechecker::Electrum(s) => s.paid_to(txid, to_address, asset, seen_at).await,
            Rechecker::Node(s) => s.paid_to(txid, to_address, asset, seen_at).await,
            Rechecker::Ethereum(s) => s.paid_to(txid, to_address, asset, seen_at).await,
            Rechecker::Tron(s) => s.paid_to(txid, to_address, asset, seen_at).await,
            Rechecker::Solana(s) => s.paid_to(txid, to_address, asset, seen_at).await,
        };
        found.map_err(|e| e.scrubbed(self.source()))
    }

    /// What each address held of its method's asset at the last block before `until_ms`.
    pub(crate) async fn balances_at(
        &mut self,
        holdings: &[(String, Method)],
        until_ms: i64,
    ) -> Result<(BlockId, Vec<Amount>), ScanError> {
        let found = match self {
            Rechecker::Electrum(s) => s.balances_at(holdings, until_ms).await,
            Rechecker::Node(s) => s.balances_at(holdings, until_ms).await,
            Rechecker::Ethereum(s) => s.balances_at(holdings, until_ms).await,
            Rechecker::Tron(s) => s.balances_at(holdings, until_ms).await,
            Rechecker::Solana(s) => s.balances_at(holdings, until_ms).await,
        };
        found.map_err(|e| e.scrubbed(self.source()))
    }

    /// What each address held of its method's asset at the block at `height`.
    pub(crate) async fn balances_at_height(
        &mut self,
        holdings: &[(String, Method)],
        height: u64,
    ) -> Result<(BlockId, Vec<Amount>), ScanError> {
        let found = match self {
            Rechecker::Electrum(s) => s.balances_at_height(holdings, height).await,
            Rechecker::Node(s) => s.balances_at_height(holdings, height).await,
            Rechecker::Ethereum(s) => s.balances_at_height(holdings, height).await,
            Rechecker::Tron(s) => s.balances_at_height(holdings, height).await,
            Rechecker::Solana(s) => s.balances_at_height(holdings, height).await,
        };
        found.map_err(|e| e.scrubbed(self.source()))
    }

    /// What sweeping an address costs now, at the node's prices.
    pub(crate) async fn sweep_fees(&mut self) -> Result<SweepFees, ScanError> {
        let found = match self {
            Rechecker::Electrum(s) => s.sweep_fees().await,
            Rechecker::Node(s) => s.sweep_fees().await,
            Rechecker::Ethereum(s) => s.sweep_fees().await,
            Rechecker::Tron(s) => s.sweep_fees().await,
            Rechecker::Solana(s) => s.sweep_fees().await,
        };
        found.map_err(|e| e.scrubbed(self.source()))
    }
}

/// One network's credited transfers waiting for a recheck.
pub(crate) struct Pending {
    pub(crate) checker: Result<Rechecker, String>,
    pub(crate) batch: Vec<ReportTransfer>,
}

/// Asks `pending`'s node about its batch of credited transfers and files what the chain no
/// longer backs.
pub(crate) async fn recheck_batch(
    policy: &MatchPolicy,
    network: Network,
    pending: &mut Pending,
    report: &mut AuditReport,
) -> Result<(), Error> {
    let batch = std::mem::take(&mut pending.batch);
    if batch.is_empty() {
        return Ok(());
    }
    let checker = match &mut pending.checker {
        Ok(checker) => checker,
        Err(why) => {
            report.unchecked.insert(network.to_string(), why.clone());
            return Ok(());
        }
    };
    let rule = policy.confirmations.get(&network);
    let settle_depth = rule.map_or(1, |r| {
        r.tiers
            .iter()
            .map(|t| t.confirmations)
            .fold(r.confirmations, u32::max)
    });
    let known: Vec<KnownTransfer> = batch.iter().map(|t| known(network, t)).collect();
    let now = checker
        .attest(&known, settle_depth)
        .await
        .map_err(|e| Error::Report(format!("the {network} node: {e}")))?;
    for (transfer, attestation) in batch.into_iter().zip(now) {
        report.checked += 1;
        let usd = Usd::from_cents(transfer.intent_usd_cents.unwrap_or(0)).unwrap_or(Usd::ZERO);
        let required = rule.map_or(1, |r| r.required(usd));
        let confirmations = attestation.confirmations();
        let problem = match attestation {
            Attestation::Missing(_) => "no longer on the chain".to_owned(),
            Attestation::Behind { head } => {
                format!("the node's newest block {head} is below the transfer's")
            }
            Attestation::Differs(what) => format!("the chain holds it otherwise: {what}"),
            Attestation::Holds { confirmations, .. } if confirmations < required => {
                format!("{confirmations} confirmations, {required} required")
            }
            Attestation::Holds { .. } => continue,
        };
        report.findings.push(AuditFinding {
            network: transfer.network,
            txid: transfer.txid,
            position: transfer.position,
            order: transfer.order_ref,
            ledger_entry: transfer.credited_entry.unwrap_or_default(),
            recorded_confirmations: transfer.confirmations,
            confirmations_now: confirmations,
            required,
            problem,
        });
    }
    Ok(())
}

fn known(network: Network, transfer: &ReportTransfer) -> KnownTransfer {
    KnownTransfer {
        transfer: Transfer {
            id: payrecon_chain_core::TransferId {
                network,
                txid: transfer.txid.clone(),
                position: u32::try_from(transfer.position).unwrap_or(u32::MAX),
            },
            to_address: transfer.to_address.clone(),
            asset: transfer.asset.clone(),
            amount: transfer.amount,
            // The sender is not compared: sources name it alike or not at all.
            from_address: None,
        },
        confirmations: u32::try_from(transfer.confirmations).unwrap_or(0),
        block_height: transfer.block_height.and_then(|h| u64::try_from(h).ok()),
        tip_height: 0,
        seen_at_ms: transfer.seen_at_ms,
    }
}

const FINDING_COLUMNS: [&str; 9] = [
    "network",
    "txid",
    "position",
    "order",
    "ledger_entry",
    "recorded_confirmations",
    "confirmations_now",
    "required",
    "problem",
];

impl AuditReport {
    /// The audit as a CSV table (one row per finding), a JSON document or a printable page.
    pub fn render(&self, format: ReportFormat) -> Result<String, Error> {
        let rows = self.findings.iter().map(|f| {
            vec![
                f.network.clone(),
                f.txid.clone(),
                f.position.to_string(),
                f.order.clone().unwrap_or_default(),
                f.ledger_entry.clone(),
                f.recorded_confirmations.to_string(),
                f.confirmations_now
                    .map(|c| c.to_string())
                    .unwrap_or_default(),
                f.required.to_string(),
                f.problem.clone(),
            ]
        });
        Ok(match format {
            ReportFormat::Json => {
                serde_json::to_string_pretty(self).map_err(|e| Error::Report(e.to_string()))?
            }
            ReportFormat::Csv => std::iter::once(csv_line(&FINDING_COLUMNS))
                .chain(rows.map(|row| csv_line(&row)))
                .collect(),
            ReportFormat::Html => {
                let unchecked: String = self
                    .unchecked
                    .iter()
                    .map(|(network, why)| {
                        format!(
                            "<p class=\"broken\">{network} not checked: {}</p>\n",
                            crate::report::escape(why)
                        )
                    })
                    .collect();
                format!(
                    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Audit</title></head><body>\n<h1>Audit of credited transfers</h1>\n<p>{} checked, {} not backed by their chain.</p>\n{unchecked}{}</body></html>\n",
                    self.checked,
                    self.findings.len(),
                    html_table(&FINDING_COLUMNS, rows)
                )
            }
        })
    }
}
