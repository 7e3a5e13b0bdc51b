//! The hand-off to the merchant's wallet: descriptors and the gap limit it needs.

use clap::Subcommand;
use payrecon::chain::Network;
use payrecon::{Engine, HoldingsSort};

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
}

pub(super) async fn holdings(
    args: HoldingsArgs,
    engine: &Engine,
    json: bool,
) -> anyhow::Result<()> {
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
        out.push_str(&format!("\n{} funded addresses\n", view.address_count));
        for holding in &view.addresses {
            out.push_str(&format!(
                "{:<9} {:<12} {:<26} {} {}\n",
                holding.network,
                holding.asset,
                holding.amount_decimal.as_deref().unwrap_or(&holding.amount),
                holding.address,
                holding.derivation_path.as_deref().unwrap_or("-"),
            ));
        }
        if let Some(next) = view.next_offset {
            out.push_str(&format!("next offset: {next}\n"));
        }
        out.trim_end().to_owned()
    })
}

pub(super) async fn wallet(
    command: WalletCommand,
    engine: &Engine,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        WalletCommand::Export { network } => {
            let export = engine.wallet_export(network).await?;
            emit(json, &export, || export.text().trim_end().to_owned())
        }
    }
}
