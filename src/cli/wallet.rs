//! The hand-off to the merchant's wallet: descriptors and the gap limit it needs.

use clap::Subcommand;
use payrecon::chain::Network;
use payrecon::config::Config;
use payrecon::{Engine, HoldingsSort, SweepList, WalletExport};

use super::named;
use super::output::emit;

#[derive(Debug, Subcommand)]
pub(super) enum WalletCommand {
    /// Output descriptors of a Bitcoin or Litecoin account (receive and change, key origin,
    /// checksum) with the highest index handed out and the gap limit a wallet needs to find
    /// every paid address: import them into Bitcoin Core, Litecoin Core, Sparrow or Electrum.
    Export {
        /// bitcoin or litecoin.
        #[arg(long, value_parser = named::<Network>(&["bitcoin", "litecoin"]))]
        network: Network,
        /// One key (`ltc:1a2b3c4d`, as printed) instead of every key the network ever used.
        #[arg(long)]
        key: Option<String>,
    },
    /// Every funded Ethereum or Tron address with its derivation path, what it holds of each
    /// asset, the fees its sweeps need at the node's prices now and the native coin to send it
    /// first: the input of the merchant's own sweep tool (payrecon signs nothing).
    SweepList {
        /// ethereum or tron.
        #[arg(long, value_parser = named::<Network>(&["ethereum", "tron"]))]
        network: Network,
        /// Write CSV (one line per address) instead of the table.
        #[arg(long, conflicts_with = "json")]
        csv: bool,
    },
}

/// `payrecon holdings`: totals per asset, then one page of the funded addresses.
#[derive(Debug, clap::Args)]
pub(super) struct HoldingsArgs {
    /// One network only.
    #[arg(long, value_parser = named::<Network>(&["bitcoin", "litecoin", "ethereum", "tron", "solana"]))]
    network: Option<Network>,
    /// amount (largest first), address, or index (the order a wallet scans in).
    #[arg(long, default_value = "amount", value_parser = named::<HoldingsSort>(&HoldingsSort::NAMES))]
    sort: HoldingsSort,
    /// Also list addresses swept empty.
    #[arg(long)]
    all: bool,
    /// Skip this many addresses (a previous page's `next offset`).
    #[arg(long, default_value_t = 0)]
    offset: u64,
    /// Addresses on the page.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// First run the holdings check: every address payrecon watches on Ethereum read on the
    /// chain at the watcher's cursor, money no receipt explains booked and held in an
    /// exception (what `serve` runs every payments.holdings_check_minutes).
    #[arg(long)]
    check: bool,
}

pub(super) async fn holdings(
    args: HoldingsArgs,
    engine: &Engine,
    config: &Config,
    json: bool,
) -> anyhow::Result<()> {
    if args.check {
        for check in engine.check_holdings(config).await? {
            match &check.error {
                Some(error) => eprintln!(
                    "holdings check of {}: could not run: {error}",
                    check.network
                ),
                None => eprintln!(
                    "holdings check of {}: {} addresses at block {}, {} balances no receipt explains (each booked and held in a holdings_difference exception)",
                    check.network,
                    check.addresses_checked,
                    check.block_height.unwrap_or_default(),
                    check.unexplained
                ),
            }
        }
    }
    let view = engine
        .holdings(args.network, args.sort, args.all, args.offset, args.limit)
        .await?;
    emit(json, &view, || {
        let mut out = String::from("network   asset        total                      addresses\n");
        for total in &view.totals {
            out.push_str(&format!(
                "{:<9} {:<12} {:<26} {}\n",
                total.network,
                total.asset,
                total.amount_decimal.as_deref().unwrap_or(&total.amount),
                total.addresses
            ));
        }
        if !view.key_totals.is_empty() {
            out.push_str("\nper key\n");
        }
        for total in &view.key_totals {
            out.push_str(&format!(
                "{:<9} {:<12} {:<26} {} {} ({})\n",
                total.network,
                total.asset,
                total.amount_decimal.as_deref().unwrap_or(&total.amount),
                total.addresses,
                total.key_id,
                total.state.as_str(),
            ));
        }
        out.push_str(&format!("\n{} funded addresses\n", view.address_count));
        for holding in &view.addresses {
            out.push_str(&format!(
                "{:<9} {:<12} {:<26} {} {} {}\n",
                holding.network,
                holding.asset,
                holding.amount_decimal.as_deref().unwrap_or(&holding.amount),
                holding.address,
                holding.derivation_path.as_deref().unwrap_or("-"),
                holding.key_id.as_deref().unwrap_or("-"),
            ));
        }
        if let Some(next) = view.next_offset {
            out.push_str(&format!("next offset: {next}\n"));
        }
        for holding in &view.overdrawn {
            out.push_str(&format!(
                "overdrawn: {} {} at {}: {} base units more left than payrecon saw arrive\n",
                holding.network,
                holding.asset,
                holding.address,
                holding.amount.trim_start_matches('-'),
            ));
        }
        if !view.unknown_tokens.is_empty() {
            out.push_str("\ntokens payrecon does not accept (never credited, not in the totals)\n");
        }
        for token in &view.unknown_tokens {
            out.push_str(&format!(
                "{:<9} {} at {} addresses ({} base units as the token claims them)\n",
                token.network, token.contract, token.addresses, token.amount,
            ));
        }
        out.trim_end().to_owned()
    })
}

pub(super) async fn wallet(
    command: WalletCommand,
    engine: &Engine,
    config: &Config,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        WalletCommand::Export { network, key } => {
            let exports = engine.wallet_exports(network, key.as_deref()).await?;
            emit(json, &exports, || {
                let texts: Vec<String> = exports.iter().map(WalletExport::text).collect();
                texts.join("\n").trim_end().to_owned()
            })
        }
        WalletCommand::SweepList { network, csv } => {
            let list = engine.sweep_list(config, network).await?;
            if csv {
                print!("{}", list.csv());
                return Ok(());
            }
            emit(json, &list, || sweep_table(&list))
        }
    }
}

/// `asset amount, asset amount…`, for one line of the table.
fn per_asset(amounts: &std::collections::BTreeMap<String, String>) -> String {
    let shown: Vec<String> = amounts
        .iter()
        .map(|(asset, amount)| format!("{asset} {amount}"))
        .collect();
    shown.join(", ")
}

fn sweep_table(list: &SweepList) -> String {
    let mut out = format!(
        "{} sweep list: {} per token sweep, {} per native sweep ({})\n\n",
        list.network, list.per_token_fee, list.native_fee, list.fee_basis
    );
    for row in &list.addresses {
        out.push_str(&format!(
            "{} {}  {}  fees {} top-up {}\n",
            row.address,
            row.derivation_path.as_deref().unwrap_or("-"),
            per_asset(&row.balances),
            row.fee_needed,
            row.top_up
        ));
    }
    out.push_str(&format!(
        "\n{} addresses; total {}; top-ups {} (base units throughout)",
        list.addresses.len(),
        per_asset(&list.totals),
        list.top_up_total
    ));
    out
}
