//! `payrecon-bench` (also run as `payrecon bench`): throughput of payrecon's hot paths, on
//! SQLite or PostgreSQL, each beside a line measured in the same run.
//!
//! Benchmarks print figures; they never pass or fail on time. They write only to the scratch
//! database they are given (a fresh temporary SQLite file by default). This binary is the
//! workshop: it reaches the engine's internals through `payrecon::test_utils`, and it is the
//! only binary that carries the Tron and Solana fake nodes.

mod books;
mod edge;
mod utxo_node;
mod witness;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use payrecon_chain_core::{
    Amount, ChainCursor, ChainEvent, ChainScanner, Method, Network, ReceivedAsset, ScanBatch,
    Transfer, TransferId, WatchView,
};
use serde::Serialize;

use payrecon::config::Config;
use payrecon::ledger::{Account, Currency, EntryKind, NewEntry, Posting};
use payrecon::{AccountId, Engine};
use payrecon_chain_bitcoin::UtxoChain;

/// Customers the synthetic entries are spread over.
const BENCH_CUSTOMERS: usize = 1_000;

/// Concurrent tasks in the concurrent-debit workload.
const BENCH_CONCURRENCY: usize = 8;

/// payrecon-bench: throughput of payrecon's hot paths; prints figures, changes nothing but its
/// scratch database.
#[derive(Debug, Parser)]
#[command(name = "payrecon-bench", version, about)]
struct Cli {
    /// Print one JSON document instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Journal posting: single entries, batches, balance-checked debits, concurrent debits.
    Ledger(LedgerArgs),
    /// Payment instructions created, then one confirming transfer per intent matched and
    /// settled (events committed in watcher-sized batches).
    Payments(PaymentsArgs),
    /// The Ethereum scanner over a real node that mines on request (anvil): fills blocks with
    /// ETH and token transfers, then times scanning them while watching many addresses.
    Ethereum(EthereumArgs),
    /// The Tron scanner over the built-in fake full node (blocks in java-tron's format, built
    /// from fixtures/tron): busy blocks of TRX and USDT transfers scanned while watching many
    /// addresses. The node runs in the same process, so its JSON encoding is in the figures.
    Tron(TronArgs),
    /// The Solana scanner over the built-in fake RPC node: one scan that checks every open
    /// reference (`getSignaturesForAddress` each) and verifies the payments found.
    Solana(SolanaArgs),
    /// Litecoin payments on a regtest node whose wallet pays (`scripts/devnet.sh up`): from
    /// broadcast to `seen` and from the confirming block to `settled`, on the full-node source
    /// with its P2P push and, given `--electrum-url`, on Electrum side by side in the same run.
    NodeLatency(NodeLatencyArgs),
    /// The full-node scanner's cost per block against the size of the watch set: blocks of
    /// many outputs mined on a regtest node, scanned with each number of watched addresses.
    NodeScale(NodeScaleArgs),
    /// The reconciliation report over a period of many transfers, each with its ledger entry:
    /// time per format and the process's peak memory while writing it (the report streams).
    Report(ReportArgs),
    /// The books over a month of many transfers: the valuation pass, each journal export
    /// (time and peak memory; they stream) and the close, beside the plain reconciliation
    /// report over the same month.
    Books(books::BooksArgs),
    /// The Litecoin watcher over a real Electrum server: addresses followed from a cold start
    /// (a restart's full resync) and a steady scan, for fresh intents below a random key.
    Electrum(ElectrumArgs),
    /// The edge under load: the shop API's latency with and without many checkout pages
    /// holding their live status open (opened by a child process), the memory per stream, the
    /// database reads the streams cause while nothing changes, and a shutdown with all open.
    Edge(EdgeArgs),
    /// What a witness costs: the same payments settled by an Ethereum watcher on anvil without
    /// a witness and with one (the same node behind a proxy that counts its requests), and a
    /// round over a block with no payment both ways.
    Witness(witness::WitnessArgs),
    /// The stream clients of `bench edge`, in a process of their own (run by it).
    #[command(hide = true)]
    EdgeClients(EdgeClientsArgs),
    /// One of the processes of `bench payments --processes N` creating intents (run by it).
    #[command(hide = true)]
    IntentsWorker(IntentsWorkerArgs),
}

/// The options of `intents-worker`: its share of the intents of `bench payments`.
#[derive(Debug, clap::Args)]
struct IntentsWorkerArgs {
    #[arg(long)]
    url: String,
    #[arg(long)]
    scratch: std::path::PathBuf,
    /// The order references' prefix.
    #[arg(long)]
    prefix: String,
    #[arg(long)]
    first: usize,
    #[arg(long)]
    count: usize,
    #[arg(long)]
    callers: usize,
}

/// The options of `ledger`.
#[derive(Debug, clap::Args)]
struct LedgerArgs {
    /// Entries per workload.
    #[arg(long, default_value_t = 20_000)]
    entries: usize,
    /// Entries per transaction in the batch workload.
    #[arg(long, default_value_t = 500)]
    batch_size: usize,
    /// A database the benchmark may fill. Default: a fresh temporary SQLite file.
    /// For PostgreSQL give an empty scratch database, never production.
    #[arg(long)]
    scratch_database: Option<String>,
}

/// The options of `payments`.
#[derive(Debug, clap::Args)]
struct PaymentsArgs {
    /// Intents (and transfers) created at the last caller count, then settled.
    #[arg(long, default_value_t = 100_000)]
    intents: usize,
    /// Chain events per transaction, as a watcher commits a block's worth.
    #[arg(long, default_value_t = 500)]
    events_per_batch: usize,
    /// Concurrent callers creating top-ups and intents, a measurement each (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 16, 64])]
    concurrency: Vec<usize>,
    /// Top-ups and intents created at each caller count but the last.
    #[arg(long, default_value_t = 2_000)]
    sweep_items: usize,
    /// Events settled through the one-by-one reference path first, for comparison.
    #[arg(long, default_value_t = 2_000)]
    reference_events: usize,
    /// A database the benchmark may fill. Default: a fresh temporary SQLite file.
    #[arg(long)]
    scratch_database: Option<String>,
    /// Processes creating the intents on one PostgreSQL database, each with its share of the
    /// callers and the intents (payrecon's several `serve` processes); the addresses they
    /// hand out are checked unique across them.
    #[arg(long, default_value_t = 1)]
    processes: usize,
}

/// The options of `ethereum`.
#[derive(Debug, clap::Args)]
struct EthereumArgs {
    /// The node, e.g. http://127.0.0.1:8545 (scripts/devnet.sh up). It must accept
    /// `eth_sendTransaction` from its first account and `anvil_mine`.
    #[arg(long)]
    rpc_url: String,
    /// Watched addresses.
    #[arg(long, default_value_t = 100_000)]
    addresses: usize,
    /// Busy blocks to scan.
    #[arg(long, default_value_t = 5)]
    blocks: usize,
    /// ETH transfers and token transfers per block (each).
    #[arg(long, default_value_t = 200)]
    transfers_per_block: usize,
}

/// The options of `tron`.
#[derive(Debug, clap::Args)]
struct TronArgs {
    /// Watched addresses.
    #[arg(long, default_value_t = 100_000)]
    addresses: usize,
    /// Busy blocks to scan.
    #[arg(long, default_value_t = 20)]
    blocks: usize,
    /// TRX transfers and USDT transfers per block (each).
    #[arg(long, default_value_t = 200)]
    transfers_per_block: usize,
}

/// The options of `solana`.
#[derive(Debug, clap::Args)]
struct SolanaArgs {
    /// Open intents (references).
    #[arg(long, default_value_t = 10_000)]
    references: usize,
    /// Of which this many have been paid.
    #[arg(long, default_value_t = 1_000)]
    paid: usize,
}

/// The options of `node-latency`.
#[derive(Debug, clap::Args)]
struct NodeLatencyArgs {
    /// The node's RPC with credentials, e.g. http://user:pass@127.0.0.1:19443.
    #[arg(long)]
    rpc_url: String,
    /// The node's P2P host:port for announcements, e.g. 127.0.0.1:19444.
    #[arg(long)]
    push_peer: Option<String>,
    /// An Electrum server over the same node, measured beside it.
    #[arg(long)]
    electrum_url: Option<String>,
    /// The node's wallet that pays.
    #[arg(long, default_value = "miner")]
    wallet: String,
    /// Payments measured (each waits for the one before).
    #[arg(long, default_value_t = 20)]
    payments: usize,
    /// Each watcher's polling interval, the fallback to push, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    poll_ms: u64,
}

/// The options of `node-scale`.
#[derive(Debug, clap::Args)]
struct NodeScaleArgs {
    /// The node's RPC with credentials, e.g. http://user:pass@127.0.0.1:19443.
    #[arg(long)]
    rpc_url: String,
    /// The node's wallet that pays.
    #[arg(long, default_value = "miner")]
    wallet: String,
    /// Watched addresses per run (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1_000, 1_000_000])]
    addresses: Vec<usize>,
    /// Blocks mined and scanned.
    #[arg(long, default_value_t = 5)]
    blocks: usize,
    /// Outputs per block.
    #[arg(long, default_value_t = 2_000)]
    outputs_per_block: usize,
}

/// The options of `report`.
#[derive(Debug, clap::Args)]
struct ReportArgs {
    /// Transfers in the period.
    #[arg(long, default_value_t = 100_000)]
    transfers: usize,
    /// A database the benchmark may fill. Default: a fresh temporary SQLite file.
    #[arg(long)]
    scratch_database: Option<String>,
}

/// The options of `electrum`.
#[derive(Debug, clap::Args)]
struct ElectrumArgs {
    /// The Electrum server, e.g. tcp://127.0.0.1:50001 (scripts/devnet.sh up).
    #[arg(long)]
    electrum_url: String,
    /// Litecoin network the server serves: mainnet, testnet or regtest.
    #[arg(long, default_value = "regtest")]
    network: String,
    /// Watched addresses (one open intent each).
    #[arg(long, default_value_t = 10_000)]
    addresses: usize,
    /// A database the benchmark may fill. Default: a fresh temporary SQLite file.
    #[arg(long)]
    scratch_database: Option<String>,
}

/// The options of `edge`.
#[derive(Debug, clap::Args)]
struct EdgeArgs {
    /// Live-status streams held open.
    #[arg(long, default_value_t = 10_000)]
    streams: usize,
    /// Payment intents the streams are spread over.
    #[arg(long, default_value_t = 1_000)]
    intents: usize,
    /// Shop API requests timed with and without the streams.
    #[arg(long, default_value_t = 1_000)]
    requests: usize,
    /// Seconds of nothing changing, every stream open, over which reads are counted.
    #[arg(long, default_value_t = 10)]
    quiet_seconds: u64,
    /// A database the benchmark may fill. Default: a fresh temporary SQLite file.
    #[arg(long)]
    scratch_database: Option<String>,
}

/// The options of `edge-clients`.
#[derive(Debug, clap::Args)]
struct EdgeClientsArgs {
    /// The server the streams are opened against.
    #[arg(long)]
    url: String,
}

/// One measured workload.
#[derive(Debug, Serialize)]
pub struct BenchLine {
    /// What was measured.
    pub workload: String,
    /// Entries posted.
    pub entries: usize,
    /// Wall time in milliseconds.
    pub elapsed_ms: u128,
    /// Entries per second.
    pub entries_per_second: u64,
    /// The process's peak resident memory during the workload, where it was measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_mib: Option<u64>,
    /// This figure as a share of the line's: the same rows written by plain SQL, in the same
    /// database, at the same durability, in the same run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub of_line: Option<f64>,
    /// What else the figure means.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command, cli.json)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            let causes: Vec<String> = error
                .chain()
                .map(|c| c.to_string().replace('\n', " "))
                .collect();
            eprintln!("error: {}", causes.join(": "));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Prints `value` as JSON, or the text `describe` makes.
fn emit<T: Serialize>(
    json: bool,
    value: &T,
    describe: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    let text = if json {
        serde_json::to_string_pretty(value)?
    } else {
        describe()
    };
    println!("{text}");
    Ok(())
}

/// Runs a benchmark and prints its figures.
async fn run(command: BenchCommand, json: bool) -> anyhow::Result<()> {
    match command {
        BenchCommand::Payments(args) => payments_workload(args, json).await,
        BenchCommand::Ethereum(args) => ethereum_workload(args, json).await,
        BenchCommand::Tron(args) => tron_workload(args, json).await,
        BenchCommand::Solana(args) => solana_workload(args, json).await,
        BenchCommand::Electrum(args) => electrum_workload(args, json).await,
        BenchCommand::NodeLatency(args) => node_latency_workload(args, json).await,
        BenchCommand::NodeScale(args) => node_scale_workload(args, json).await,
        BenchCommand::Report(args) => report_workload(args, json).await,
        BenchCommand::Books(args) => books::workload(args, json).await,
        BenchCommand::Edge(args) => edge_workload(args, json).await,
        BenchCommand::EdgeClients(EdgeClientsArgs { url }) => edge::clients(&url).await,
        BenchCommand::IntentsWorker(args) => intents_worker(args).await,
        BenchCommand::Ledger(args) => ledger_workload(args, json).await,
        BenchCommand::Witness(args) => {
            let lines = witness::witness(args).await?;
            report(
                json,
                None,
                "crediting with one witness against none, ethereum on anvil".into(),
                &lines,
                ("payments", "/s"),
            )
        }
    }
}

/// `payments`.
async fn payments_workload(
    PaymentsArgs {
        intents,
        events_per_batch,
        concurrency,
        sweep_items,
        reference_events,
        scratch_database,
        processes,
    }: PaymentsArgs,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        intents > 0
            && events_per_batch > 0
            && processes > 0
            && !concurrency.is_empty()
            && concurrency.iter().all(|c| *c >= processes),
        "counts must be positive, with at least one caller per process"
    );
    anyhow::ensure!(
        processes == 1
            || scratch_database
                .as_deref()
                .is_some_and(|url| url.starts_with("postgres")),
        "--processes needs --scratch-database postgres://…: several processes share one PostgreSQL"
    );
    let (scratch_dir, url) = scratch(scratch_database)?;
    let engine = payments_engine(&url, scratch_dir.path(), payrecon::DEFAULT_LOOKAHEAD).await?;
    let plan = PaymentsPlan {
        intents,
        events_per_batch,
        concurrency,
        sweep_items,
        reference_events,
        processes: (processes > 1).then(|| Processes {
            count: processes,
            url: url.clone(),
            scratch: scratch_dir.path().to_owned(),
        }),
    };
    let without_lookahead = payments_engine(&url, scratch_dir.path(), 0).await?;
    let lines = payments(&engine, &without_lookahead, &plan).await?;
    let backend = format!("{:?}", engine.store().backend()).to_lowercase();
    report(
        json,
        Some(&backend),
        format!(
            "payments on {backend} ({})",
            payrecon_chain_core::SecretUrl::from(url.as_str())
        ),
        &lines,
        ITEMS,
    )
}

/// `ethereum`.
async fn ethereum_workload(
    EthereumArgs {
        rpc_url,
        addresses,
        blocks,
        transfers_per_block,
    }: EthereumArgs,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        addresses > 0 && blocks > 0 && transfers_per_block > 0,
        "counts must be positive"
    );
    let lines = ethereum(&rpc_url, addresses, blocks, transfers_per_block).await?;
    report(
        json,
        None,
        format!("ethereum scanner against {rpc_url}"),
        &lines,
        ITEMS,
    )
}

/// `tron`.
async fn tron_workload(
    TronArgs {
        addresses,
        blocks,
        transfers_per_block,
    }: TronArgs,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        addresses > 0 && blocks > 0 && transfers_per_block > 0,
        "counts must be positive"
    );
    let lines = tron(addresses, blocks, transfers_per_block).await?;
    report(
        json,
        None,
        "tron scanner against the built-in fake full node".into(),
        &lines,
        ITEMS,
    )
}

/// `solana`.
async fn solana_workload(
    SolanaArgs { references, paid }: SolanaArgs,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        references > 0 && paid <= references,
        "--references must be positive and --paid at most --references"
    );
    let lines = solana(references, paid).await?;
    report(
        json,
        None,
        "solana scanner against the built-in fake RPC node".into(),
        &lines,
        ITEMS,
    )
}

/// `electrum`.
async fn electrum_workload(
    ElectrumArgs {
        electrum_url,
        network,
        addresses,
        scratch_database,
    }: ElectrumArgs,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(addresses > 0, "--addresses must be positive");
    let (scratch_dir, url) = scratch(scratch_database)?;
    let config = electrum_config(&url, scratch_dir.path(), &electrum_url, &network)?;
    let engine = Engine::from_config(&config).await?;
    let lines = electrum(&engine, &config, addresses).await?;
    let backend = format!("{:?}", engine.store().backend()).to_lowercase();
    report(
        json,
        Some(&backend),
        format!(
            "electrum watcher on {backend} ({}), server {electrum_url}",
            payrecon_chain_core::SecretUrl::from(url.as_str())
        ),
        &lines,
        ITEMS,
    )
}

/// `node-latency`.
async fn node_latency_workload(
    NodeLatencyArgs {
        rpc_url,
        push_peer,
        electrum_url,
        wallet,
        payments,
        poll_ms,
    }: NodeLatencyArgs,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(payments > 0, "--payments must be positive");
    let node = utxo_node::RegtestNode::connect(&rpc_url, &wallet, UtxoChain::Litecoin).await?;
    let scratch = tempfile::tempdir()?;
    let lines = utxo_node::latency(
        &node,
        push_peer,
        electrum_url,
        payments,
        Duration::from_millis(poll_ms),
        scratch.path(),
    )
    .await?;
    report(
        json,
        None,
        format!("litecoin payment latency, polling every {poll_ms} ms as the fallback"),
        &lines,
        ("payments", "/s"),
    )
}

/// `node-scale`.
async fn node_scale_workload(
    NodeScaleArgs {
        rpc_url,
        wallet,
        addresses,
        blocks,
        outputs_per_block,
    }: NodeScaleArgs,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        blocks > 0 && outputs_per_block > 0 && !addresses.is_empty(),
        "counts must be positive"
    );
    let node = utxo_node::RegtestNode::connect(&rpc_url, &wallet, UtxoChain::Litecoin).await?;
    let lines = utxo_node::scale(&node, &addresses, blocks, outputs_per_block).await?;
    report(
        json,
        None,
        "litecoin full-node scanner against the watch set's size".into(),
        &lines,
        ("blocks", "blocks/s"),
    )
}

/// `report`.
async fn report_workload(
    ReportArgs {
        transfers,
        scratch_database,
    }: ReportArgs,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(transfers > 0, "--transfers must be positive");
    let (_scratch_dir, url) = scratch(scratch_database)?;
    let engine = Engine::open(&url)
        .await
        .context("opening the scratch database")?;
    let lines = reconciliation(&engine, transfers).await?;
    let backend = format!("{:?}", engine.store().backend()).to_lowercase();
    report(
        json,
        Some(&backend),
        format!(
            "reconciliation report on {backend} ({})",
            payrecon_chain_core::SecretUrl::from(url.as_str())
        ),
        &lines,
        ITEMS,
    )
}

/// `edge`.
async fn edge_workload(
    EdgeArgs {
        streams,
        intents,
        requests,
        quiet_seconds,
        scratch_database,
    }: EdgeArgs,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        streams > 0 && intents > 0 && requests > 0,
        "--streams, --intents and --requests must be positive"
    );
    let (scratch_dir, url) = scratch(scratch_database)?;
    let engine = payments_engine(&url, scratch_dir.path(), payrecon::DEFAULT_LOOKAHEAD).await?;
    let plan = edge::EdgePlan {
        streams,
        intents,
        requests,
        quiet: Duration::from_secs(quiet_seconds.max(1)),
    };
    let figures = edge::edge(&engine, &plan).await?;
    let backend = format!("{:?}", engine.store().backend()).to_lowercase();
    emit(
        json,
        &serde_json::json!({ "backend": backend, "results": figures }),
        || {
            let f = &figures;
            format!(
                "the edge on {backend}: {} live statuses over {} intents, one process\n\
                         shop API (GET /v1/payments/{{id}})  without streams  p50 {:.2} ms  p95 {:.2} ms\n\
                         shop API (GET /v1/payments/{{id}})  with streams     p50 {:.2} ms  p95 {:.2} ms  ({:.2}x the p95 without)\n\
                         memory per open stream            {:.1} KiB\n\
                         database reads, nothing changing  {:.2}/s by the fan-out, {:.2}/s by the pages (over {:.0} s)\n\
                         one intent marked paid            {} fan-out reads, {} page reads\n\
                         shutdown with every stream open   {} ms",
                f.streams,
                f.intents,
                f.p50_ms_without,
                f.p95_ms_without,
                f.p50_ms_with,
                f.p95_ms_with,
                f.p95_ratio,
                f.kib_per_stream,
                f.fan_out_reads_per_second,
                f.page_reads_per_second,
                f.quiet_seconds,
                f.change_fan_out_reads,
                f.change_page_reads,
                f.shutdown_ms
            )
        },
    )
}

/// `ledger`.
async fn ledger_workload(
    LedgerArgs {
        entries,
        batch_size,
        scratch_database,
    }: LedgerArgs,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        entries > 0 && batch_size > 0,
        "--entries and --batch-size must be positive"
    );
    let (_scratch_dir, url) = scratch(scratch_database)?;
    let engine = Engine::open(&url)
        .await
        .context("opening the scratch database")?;
    let lines = ledger(&engine, entries, batch_size).await?;
    let backend = format!("{:?}", engine.store().backend()).to_lowercase();
    report(
        json,
        Some(&backend),
        format!(
            "ledger posting on {backend} ({})",
            payrecon_chain_core::SecretUrl::from(url.as_str())
        ),
        &lines,
        ("entries", "entries/s"),
    )
}

async fn ledger(
    engine: &Engine,
    entries: usize,
    batch_size: usize,
) -> anyhow::Result<Vec<BenchLine>> {
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let customers: Vec<AccountId> = (0..BENCH_CUSTOMERS)
        .map(|i| AccountId::new(format!("bench-{}-{i}", &run_id[..8])))
        .collect::<Result<_, _>>()?;
    let credit = |i: usize, tag: &str| {
        topup_credit(
            &format!("{run_id}:{tag}:{i}"),
            &customers[i % BENCH_CUSTOMERS],
        )
    };
    let mut lines = Vec::new();

    let progress = progress_bar(entries as u64, "single");
    let started = Instant::now();
    for i in 0..entries {
        engine.post_entry(&credit(i, "single")).await?;
        progress.inc(1);
    }
    progress.finish_and_clear();
    let single = line(
        "credit, one entry per transaction",
        entries,
        started.elapsed(),
    );
    let started = Instant::now();
    let now = chrono::Utc::now();
    for i in 0..entries {
        let mut tx = engine.store().begin_write().await?;
        let customer = Account::CustomerBalance(customers[i % BENCH_CUSTOMERS].clone());
        payrecon::test_utils::store::baseline::credit(
            &mut tx,
            &format!("line-{run_id}:{i}"),
            &customer.to_string(),
            now,
        )
        .await?;
        tx.commit().await?;
    }
    let single_line = line("line", entries, started.elapsed());
    lines.push(beside(single, &single_line));
    lines.push(with_line_figure(single_line, 1));

    let progress = progress_bar(entries as u64, "batch");
    let started = Instant::now();
    let all: Vec<NewEntry> = (0..entries).map(|i| credit(i, "batch")).collect();
    for chunk in all.chunks(batch_size) {
        engine.post_entries(chunk).await?;
        progress.inc(chunk.len() as u64);
    }
    progress.finish_and_clear();
    lines.push(line(
        &format!("credit, {batch_size} entries per transaction"),
        entries,
        started.elapsed(),
    ));

    let progress = progress_bar(entries as u64, "debit");
    let started = Instant::now();
    for i in 0..entries {
        engine
            .post_entry(&debit(
                &format!("{run_id}:debit:{i}"),
                &customers[i % BENCH_CUSTOMERS],
            ))
            .await?;
        progress.inc(1);
    }
    progress.finish_and_clear();
    lines.push(line(
        "balance-checked debit, one per transaction",
        entries,
        started.elapsed(),
    ));

    let progress = progress_bar(entries as u64, "concurrent");
    let started = Instant::now();
    let customers = Arc::new(customers);
    let mut tasks = Vec::new();
    for task in 0..BENCH_CONCURRENCY {
        let (engine, customers, run_id, progress) = (
            engine.clone(),
            customers.clone(),
            run_id.clone(),
            progress.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for i in (task..entries).step_by(BENCH_CONCURRENCY) {
                let entry = debit(
                    &format!("{run_id}:concurrent:{i}"),
                    &customers[i % BENCH_CUSTOMERS],
                );
                engine.post_entry(&entry).await?;
                progress.inc(1);
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    progress.finish_and_clear();
    lines.push(line(
        &format!("balance-checked debit, {BENCH_CONCURRENCY} concurrent tasks"),
        entries,
        started.elapsed(),
    ));

    let trial = engine.trial_balance().await?;
    anyhow::ensure!(trial.is_sound(), "the benchmark left the ledger unsound");
    Ok(lines)
}

/// An engine on `url` with BIP84's public test key for bitcoin, watched `lookahead` addresses
/// past its counter, and recorded quotes, so the benchmark needs no network and no real key.
async fn payments_engine(
    url: &str,
    scratch: &std::path::Path,
    lookahead: u32,
) -> anyhow::Result<Engine> {
    let quotes = r#"{"quotes":{"BTC":"80000","ETH":"3000","USDT":"1","USDC":"1","TRX":"0.25","SOL":"150","LTC":"85"}}"#;
    let mut config = recorded_config(url, scratch, quotes, Method::Btc)?;
    config.networks.bitcoin = Some(payrecon::config::UtxoConfig {
        lookahead,
        ..payrecon::config::UtxoConfig::new(
            payrecon_chain_core::test_vectors::BIP84_ZPUB,
            "mainnet",
            2,
        )
    });
    Ok(Engine::from_config(&config).await?)
}

/// The end-to-end benchmark's shape.
struct PaymentsPlan {
    intents: usize,
    events_per_batch: usize,
    /// Concurrent callers for each API-write measurement; the last also creates the `intents`.
    concurrency: Vec<usize>,
    /// Top-ups and intents per caller count of the sweep.
    sweep_items: usize,
    /// Events settled through the one-by-one reference path first, for comparison.
    reference_events: usize,
    /// Intents created by several processes.
    processes: Option<Processes>,
}

/// Where the processes of `--processes` find the database.
struct Processes {
    count: usize,
    url: String,
    scratch: std::path::PathBuf,
}

/// API writes at each caller count, each beside the line: the same rows in batches of as many
/// per commit. Returns the lines and every intent's instructions.
async fn api_write_sweep(
    engine: &Engine,
    plan: &PaymentsPlan,
    run: &str,
) -> anyhow::Result<(Vec<BenchLine>, Vec<PaidIntent>)> {
    let mut lines = Vec::new();
    let mut next_item = 0;
    let mut instructions = Vec::new();
    for (level, &callers) in plan.concurrency.iter().enumerate() {
        let count = if level + 1 == plan.concurrency.len() {
            plan.intents
        } else {
            plan.sweep_items.min(plan.intents)
        };
        let items = next_item..next_item + count;
        next_item += count;
        let (topups, made) =
            api_writes(engine, run, items.clone(), callers, plan.processes.as_ref()).await?;
        instructions.extend(made.1);
        let line_run = format!("{run}-{callers}");
        let topup_line = timed_line(engine, count, callers, |tx, rows, now| {
            let line_run = line_run.clone();
            Box::pin(async move {
                payrecon::test_utils::store::baseline::topups(
                    tx,
                    &line_run,
                    rows,
                    BENCH_CUSTOMERS,
                    now,
                )
                .await
            })
        })
        .await?;
        let intent_line = timed_line(engine, count, callers, |tx, rows, now| {
            let line_run = line_run.clone();
            Box::pin(async move {
                payrecon::test_utils::store::baseline::intents(tx, &line_run, rows, now).await
            })
        })
        .await?;
        lines.push(beside(topups, &topup_line));
        lines.push(with_line_figure(topup_line, callers));
        lines.push(beside(made.0, &intent_line));
        lines.push(with_line_figure(intent_line, callers));
    }
    Ok((lines, instructions))
}

/// The watcher's view over every open intent: read whole once, then rounds with nothing new;
/// with the look-ahead past the key's counter, as a ratio to the same without it (`plain`).
async fn watcher_view(
    engine: &Engine,
    plain: &Engine,
    total: usize,
) -> anyhow::Result<Vec<BenchLine>> {
    let without = view_rounds(plain).await?;
    let with = view_rounds(engine).await?;
    let ratio = |with: f64, without: f64| with / without.max(f64::MIN_POSITIVE);
    let peak = |line: &BenchLine| line.peak_rss_mib.unwrap_or(0) as f64;
    Ok(vec![
        BenchLine {
            note: Some(format!(
                "{} keys ahead of the counter; {:.2} the time and {:.2} the peak memory of the read without them",
                with.ahead,
                ratio(with.read.elapsed_ms as f64, without.read.elapsed_ms as f64),
                ratio(peak(&with.read), peak(&without.read)),
            )),
            ..with.read
        },
        BenchLine {
            note: Some(format!(
                "{:.2} ms of database time per round, {:.2} that without the look-ahead",
                with.round_ms,
                ratio(with.round_ms, without.round_ms)
            )),
            ..line(
                &format!("watcher round, nothing new, {total} open intents"),
                QUIET_ROUNDS,
                Duration::from_secs_f64(with.round_ms * QUIET_ROUNDS as f64 / 1000.0),
            )
        },
    ])
}

/// Quiet watcher rounds measured per view.
const QUIET_ROUNDS: usize = 20;

/// One engine's watch view: its whole read, the keys it follows ahead of the counter, and a
/// quiet round's database time in milliseconds.
struct ViewFigures {
    read: BenchLine,
    ahead: usize,
    round_ms: f64,
}

/// Reads `engine`'s Bitcoin watch view whole, then runs quiet rounds.
async fn view_rounds(engine: &Engine) -> anyhow::Result<ViewFigures> {
    reset_peak_memory();
    let started = Instant::now();
    let mut live = payrecon::test_utils::watcher::LiveView::load(engine, Network::Bitcoin).await?;
    let keys = live.view().watch_keys.len();
    let read = with_peak(line(
        &format!("watcher view read whole ({keys} keys)"),
        keys,
        started.elapsed(),
    ));
    let mut database_time = Duration::ZERO;
    for _ in 0..QUIET_ROUNDS {
        database_time += live.refresh(engine).await?.database_time;
    }
    Ok(ViewFigures {
        read,
        ahead: live.lookahead_keys(),
        round_ms: database_time.as_secs_f64() * 1000.0 / QUIET_ROUNDS as f64,
    })
}

async fn payments(
    engine: &Engine,
    without_lookahead: &Engine,
    plan: &PaymentsPlan,
) -> anyhow::Result<Vec<BenchLine>> {
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let run = run_id[..8].to_owned();
    let (mut lines, instructions) = api_write_sweep(engine, plan, &run).await?;
    let total = instructions.len();
    lines.extend(watcher_view(engine, without_lookahead, total).await?);

    // Settling: the reference path on the first events, the batched path on the rest.
    let reference = engine
        .clone()
        .with_matcher_path(payrecon::test_utils::matcher::MatcherPath::OneByOne);
    let split = plan.reference_events.min(total);
    let batches = |range: std::ops::Range<usize>| {
        let instructions = &instructions;
        let run_id = &run_id;
        range.step_by(plan.events_per_batch).map(move |first| {
            let last = (first + plan.events_per_batch).min(instructions.len());
            (first..last)
                .map(|i| instructions[i].confirming_transfer(format!("{run_id}{i:016x}")))
                .collect::<Vec<ChainEvent>>()
        })
    };
    if split > 0 {
        let started = Instant::now();
        for events in batches(0..split) {
            reference.apply_chain_events(&events).await?;
        }
        lines.push(line(
            &format!(
                "events settled one by one (reference), {} per transaction",
                plan.events_per_batch
            ),
            split,
            started.elapsed(),
        ));
    }
    let progress = progress_bar((total - split) as u64, "events");
    reset_peak_memory();
    let started = Instant::now();
    for events in batches(split..total) {
        engine.apply_chain_events(&events).await?;
        progress.inc(events.len() as u64);
    }
    progress.finish_and_clear();
    let settled = with_peak(line(
        &format!(
            "events matched and settled, {} per transaction",
            plan.events_per_batch
        ),
        total - split,
        started.elapsed(),
    ));

    let trial = engine.trial_balance().await?;
    anyhow::ensure!(trial.is_sound(), "the benchmark left the ledger unsound");
    anyhow::ensure!(
        trial.entries as usize == total,
        "every intent settled exactly once"
    );
    let query = payrecon::test_utils::report::ReportQuery {
        from: chrono::Utc::now() - chrono::Duration::days(1),
        to: chrono::Utc::now() + chrono::Duration::days(1),
        method: None,
    };
    reset_peak_memory();
    let started = Instant::now();
    let totals = engine
        .write_reconciliation(
            &query,
            payrecon::test_utils::report::ReportFormat::Json,
            payrecon::test_utils::report::CsvSection::Transfers,
            tokio::io::sink(),
        )
        .await?;
    anyhow::ensure!(
        totals.transfers as usize == total,
        "the report lists every transfer"
    );
    let report = with_peak(line(
        "reconciliation report (json)",
        total,
        started.elapsed(),
    ));

    // The settlement line, after the checks: top-ups and intents of its own to settle (not
    // timed), then the settlement rows in the same batches.
    let settle_run = format!("{run}-settle");
    let events_per_batch = plan.events_per_batch;
    payrecon::test_utils::store::baseline::prepare_settlements(
        engine.store(),
        &settle_run,
        total,
        BENCH_CUSTOMERS,
    )
    .await?;
    let settle_line = timed_line(engine, total - split, events_per_batch, |tx, rows, now| {
        let settle_run = settle_run.clone();
        Box::pin(async move {
            payrecon::test_utils::store::baseline::settlements(
                tx,
                &settle_run,
                rows,
                BENCH_CUSTOMERS,
                now,
            )
            .await
        })
    })
    .await?;
    lines.push(beside(settled, &settle_line));
    lines.push(with_line_figure(settle_line, events_per_batch));
    lines.push(report);
    Ok(lines)
}

/// Top-ups then intents for `items`, from `callers` concurrent callers (the intents from
/// `processes` when given, each with its share of them).
async fn api_writes(
    engine: &Engine,
    run: &str,
    items: std::ops::Range<usize>,
    callers: usize,
    processes: Option<&Processes>,
) -> anyhow::Result<(BenchLine, (BenchLine, Vec<PaidIntent>))> {
    let prefix = format!("b{run}");
    let count = items.len();
    let first = items.start;
    let grouped = engine.store().group_commit_stats();
    let progress = progress_bar(count as u64, "top-ups");
    reset_peak_memory();
    let started = Instant::now();
    let (caller_engine, caller_progress, caller_prefix) =
        (engine.clone(), progress.clone(), prefix.clone());
    spread(count, callers, move |i| {
        let (engine, reference, progress) = (
            caller_engine.clone(),
            format!("{caller_prefix}-{}", first + i),
            caller_progress.clone(),
        );
        async move {
            let request = payrecon::test_utils::order::TopupRequest {
                reference,
                account_id: format!("c{}", (first + i) % BENCH_CUSTOMERS),
                amount_usd: payrecon::test_utils::money::Usd::from_dollars(500),
            };
            engine.create_topup(&request).await?;
            progress.inc(1);
            anyhow::Ok(())
        }
    })
    .await?;
    progress.finish_and_clear();
    let topups = with_group_size(
        with_peak(line(
            &format!("top-ups created, {callers} callers"),
            count,
            started.elapsed(),
        )),
        engine,
        grouped,
    );

    if let Some(processes) = processes {
        let (intents, made) = intents_in_processes(processes, &prefix, items, callers).await?;
        return Ok((topups, (intents, made)));
    }
    let grouped = engine.store().group_commit_stats();
    reset_peak_memory();
    let started = Instant::now();
    let made = create_intents(engine, &prefix, items, callers).await?;
    let intents = with_group_size(
        with_peak(line(
            &format!("intents created, {callers} callers"),
            count,
            started.elapsed(),
        )),
        engine,
        grouped,
    );
    Ok((topups, (intents, made)))
}

/// Intents for the top-ups `{prefix}-{i}` of `items`, from `callers` concurrent callers.
async fn create_intents(
    engine: &Engine,
    prefix: &str,
    items: std::ops::Range<usize>,
    callers: usize,
) -> anyhow::Result<Vec<PaidIntent>> {
    let prefix = prefix.to_owned();
    let reference =
        move |i: usize| payrecon::test_utils::order::OrderRef::new(format!("{prefix}-{i}"));
    let first = items.start;
    let progress = progress_bar(items.len() as u64, "intents");
    let (caller_engine, caller_progress) = (engine.clone(), progress.clone());
    let made = spread(items.len(), callers, move |i| {
        let (engine, reference, progress) = (
            caller_engine.clone(),
            reference(first + i),
            caller_progress.clone(),
        );
        async move {
            let made = engine.create_payment(&reference?, Method::Btc).await?;
            progress.inc(1);
            anyhow::Ok(PaidIntent {
                address: made.intent.watch_key,
                amount: made.intent.amount,
                created_at_ms: made.intent.created_at.timestamp_millis(),
            })
        }
    })
    .await?;
    progress.finish_and_clear();
    Ok(made)
}

/// What one process of `--processes` reports: its intents and its group commits.
#[derive(Serialize, serde::Deserialize)]
struct WorkerReport {
    intents: Vec<PaidIntent>,
    writes: u64,
    commits: u64,
}

/// `intents-worker`: opens its engine, says `ready`, waits for `go` on stdin, creates its
/// intents and prints its [`WorkerReport`].
async fn intents_worker(args: IntentsWorkerArgs) -> anyhow::Result<()> {
    use tokio::io::AsyncBufReadExt;
    let engine = payments_engine(&args.url, &args.scratch, payrecon::DEFAULT_LOOKAHEAD).await?;
    println!("ready");
    let mut go = String::new();
    tokio::io::BufReader::new(tokio::io::stdin())
        .read_line(&mut go)
        .await?;
    anyhow::ensure!(go.trim() == "go", "expected `go`, read {go:?}");
    let before = engine.store().group_commit_stats();
    let items = args.first..args.first + args.count;
    let intents = create_intents(&engine, &args.prefix, items, args.callers).await?;
    let after = engine.store().group_commit_stats();
    println!(
        "{}",
        serde_json::to_string(&WorkerReport {
            intents,
            writes: after.writes - before.writes,
            commits: after.commits - before.commits,
        })?
    );
    Ok(())
}

/// The intents of `items` created by `processes` processes at once, each with its share of
/// the items and of the `callers`: timed from the moment all are ready, checked for an
/// address handed out twice.
async fn intents_in_processes(
    processes: &Processes,
    prefix: &str,
    items: std::ops::Range<usize>,
    callers: usize,
) -> anyhow::Result<(BenchLine, Vec<PaidIntent>)> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let count = items.len();
    let share = count.div_ceil(processes.count);
    let mut workers = Vec::new();
    for n in 0..processes.count {
        let first = items.start + n * share;
        let mine = share.min(items.end.saturating_sub(first));
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .args([
                "intents-worker",
                "--url",
                &processes.url,
                "--prefix",
                prefix,
            ])
            .arg("--scratch")
            .arg(&processes.scratch)
            .args(["--first", &first.to_string(), "--count", &mine.to_string()])
            .args(["--callers", &(callers / processes.count).max(1).to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting an intents worker")?;
        let mut out = tokio::io::BufReader::new(child.stdout.take().expect("piped"));
        let mut ready = String::new();
        out.read_line(&mut ready).await?;
        anyhow::ensure!(ready.trim() == "ready", "an intents worker failed to start");
        workers.push((child, out));
    }
    reset_peak_memory();
    let started = Instant::now();
    for (child, _) in &mut workers {
        child
            .stdin
            .as_mut()
            .expect("piped")
            .write_all(b"go\n")
            .await?;
    }
    let mut reports = Vec::new();
    for (mut child, mut out) in workers {
        let mut text = String::new();
        out.read_to_string(&mut text).await?;
        anyhow::ensure!(child.wait().await?.success(), "an intents worker failed");
        reports.push(serde_json::from_str::<WorkerReport>(&text)?);
    }
    let elapsed = started.elapsed();
    let (writes, commits) = reports
        .iter()
        .fold((0, 0), |(w, c), r| (w + r.writes, c + r.commits));
    let made: Vec<PaidIntent> = reports.into_iter().flat_map(|r| r.intents).collect();
    let unique: std::collections::HashSet<&str> = made.iter().map(|i| i.address.as_str()).collect();
    anyhow::ensure!(
        made.len() == count && unique.len() == count,
        "{} intents and {} distinct addresses from {} processes: an address went out twice",
        made.len(),
        unique.len(),
        processes.count
    );
    let mut measured = line(
        &format!(
            "intents created, {callers} callers in {} processes",
            processes.count
        ),
        count,
        elapsed,
    );
    measured.note = Some(format!(
        "{:.1} writes per commit; all {count} addresses unique across the processes",
        writes as f64 / commits.max(1) as f64
    ));
    Ok((measured, made))
}

/// Times the line: `count` rows written by `write`, `per_commit` rows per transaction, one
/// durable commit each.
async fn timed_line<W>(
    engine: &Engine,
    count: usize,
    per_commit: usize,
    write: W,
) -> anyhow::Result<BenchLine>
where
    W: for<'a> Fn(
        &'a mut payrecon::test_utils::store::WriteTx,
        std::ops::Range<usize>,
        chrono::DateTime<chrono::Utc>,
    ) -> payrecon::test_utils::store::WriteFuture<
        'a,
        (),
        payrecon::test_utils::store::StoreError,
    >,
{
    let started = Instant::now();
    let now = chrono::Utc::now();
    for first in (0..count).step_by(per_commit.max(1)) {
        let mut tx = engine.store().begin_write().await?;
        write(&mut tx, first..(first + per_commit).min(count), now).await?;
        tx.commit().await?;
    }
    Ok(line("line", count, started.elapsed()))
}

/// Notes how many writes shared a commit since `before`.
fn with_group_size(
    mut measured: BenchLine,
    engine: &Engine,
    before: payrecon::test_utils::store::GroupCommitStats,
) -> BenchLine {
    let after = engine.store().group_commit_stats();
    let commits = after.commits - before.commits;
    if commits > 0 {
        let per_commit = (after.writes - before.writes) as f64 / commits as f64;
        measured.note = Some(format!("{per_commit:.1} writes per commit"));
    }
    measured
}

/// Names a line measurement after what it writes.
fn with_line_figure(mut measured: BenchLine, per_commit: usize) -> BenchLine {
    measured.workload = format!("  line: same rows by plain SQL, {per_commit} per commit");
    measured
}

/// Notes payrecon's figure as a share of the line's.
fn beside(mut measured: BenchLine, line: &BenchLine) -> BenchLine {
    let ratio = measured.entries_per_second as f64 / line.entries_per_second.max(1) as f64;
    measured.of_line = Some((ratio * 100.0).round() / 100.0);
    measured
}

/// What the settling stage needs of one created intent: the harness keeps only this, so peak
/// memory measures the engine rather than a million kept payment instructions.
#[derive(Serialize, serde::Deserialize)]
struct PaidIntent {
    address: String,
    amount: Amount,
    created_at_ms: i64,
}

impl PaidIntent {
    /// A transfer paying the intent exactly, already past the settling depth.
    fn confirming_transfer(&self, txid: String) -> ChainEvent {
        ChainEvent::Observed {
            transfer: Transfer {
                id: TransferId {
                    network: Network::Bitcoin,
                    txid,
                    position: 0,
                },
                to_address: self.address.clone(),
                asset: ReceivedAsset::Method {
                    method: Method::Btc,
                },
                amount: self.amount,
                from_address: None,
            },
            confirmations: 2,
            block_height: Some(1),
            seen_at_ms: self.created_at_ms,
            tip_height: 2,
        }
    }
}

/// A fresh random Litecoin regtest account key, so a benchmark's addresses have no history
/// but its own.
fn fresh_litecoin_xpub() -> anyhow::Result<String> {
    use payrecon_chain_core::bitcoin::bip32::{DerivationPath, Xpriv, Xpub};
    let secp = payrecon_chain_core::bitcoin::secp256k1::Secp256k1::new();
    let seed = [
        *uuid::Uuid::new_v4().as_bytes(),
        *uuid::Uuid::new_v4().as_bytes(),
    ]
    .concat();
    let master = Xpriv::new_master(payrecon_chain_core::bitcoin::NetworkKind::Test, &seed)?;
    let path: DerivationPath = "m/84'/2'/0'".parse()?;
    Ok(Xpub::from_priv(&secp, &master.derive_priv(&secp, &path)?).to_string())
}

/// An engine configuration for LTC at 100 USD on `url`, watching Litecoin as `utxo` says.
fn litecoin_config(
    url: &str,
    scratch: &std::path::Path,
    utxo: payrecon::config::UtxoConfig,
) -> anyhow::Result<Config> {
    let mut config = recorded_config(url, scratch, r#"{"quotes":{"LTC":"100"}}"#, Method::Ltc)?;
    config.networks.litecoin = Some(utxo);
    Ok(config)
}

/// A configuration on `url` that takes `method` at the recorded `quotes` (written to
/// `scratch`), so that a benchmark needs no rate provider.
fn recorded_config(
    url: &str,
    scratch: &std::path::Path,
    quotes: &str,
    method: Method,
) -> anyhow::Result<Config> {
    let file = scratch.join("quotes.json");
    std::fs::write(&file, quotes)?;
    let mut config = Config {
        database_url: url.into(),
        ..Config::default()
    };
    config.payments.enabled_methods = vec![method];
    config.rates.sources = vec!["recorded".into()];
    config.rates.recorded_quotes_file = Some(file);
    config.rates.cache_seconds = 3600;
    Ok(config)
}

/// The Electrum benchmark's configuration: a fresh key on `network` behind `electrum_url`.
fn electrum_config(
    url: &str,
    scratch: &std::path::Path,
    electrum_url: &str,
    network: &str,
) -> anyhow::Result<Config> {
    let utxo = payrecon::config::UtxoConfig {
        electrum_url: Some(electrum_url.into()),
        ..payrecon::config::UtxoConfig::new(fresh_litecoin_xpub()?, network, 2)
    };
    litecoin_config(url, scratch, utxo)
}

async fn electrum(
    engine: &Engine,
    config: &Config,
    addresses: usize,
) -> anyhow::Result<Vec<BenchLine>> {
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let progress = progress_bar(addresses as u64, "intents");
    let (caller_engine, caller_progress) = (engine.clone(), progress.clone());
    spread(addresses, 4, move |i| {
        let (engine, progress) = (caller_engine.clone(), caller_progress.clone());
        let reference =
            payrecon::test_utils::order::OrderRef::new(format!("e{}-{i}", &run_id[..8]));
        async move {
            let reference = reference?;
            let request = payrecon::test_utils::order::TopupRequest {
                reference: reference.to_string(),
                account_id: format!("c{}", i % BENCH_CUSTOMERS),
                amount_usd: payrecon::test_utils::money::Usd::from_dollars(100),
            };
            engine.create_topup(&request).await?;
            engine.create_payment(&reference, Method::Ltc).await?;
            progress.inc(1);
            anyhow::Ok(())
        }
    })
    .await?;
    progress.finish_and_clear();

    let utxo = config
        .networks
        .litecoin
        .as_ref()
        .context("litecoin configured")?;
    let Some(payrecon::test_utils::networks::UtxoSource::Electrum(settings)) =
        payrecon::test_utils::networks::utxo_source(Network::Litecoin, utxo)?
    else {
        anyhow::bail!("the Electrum bench needs electrum_url");
    };
    let new_watcher = || {
        payrecon::test_utils::watcher::Watcher::new(
            engine.clone(),
            payrecon_chain_bitcoin::ElectrumScanner::new(settings.clone()),
            payrecon::test_utils::watcher::WatcherOptions::default(),
        )
    };
    let mut lines = Vec::new();
    let mut watcher = new_watcher();
    let started = Instant::now();
    watcher.round().await?;
    lines.push(line(
        "first scan: connect, subscribe, read all",
        addresses,
        started.elapsed(),
    ));
    let started = Instant::now();
    watcher.round().await?;
    lines.push(line(
        "steady scan, nothing new",
        addresses,
        started.elapsed(),
    ));
    drop(watcher);
    let started = Instant::now();
    new_watcher().round().await?;
    lines.push(line(
        "restart: full resync of every address",
        addresses,
        started.elapsed(),
    ));
    Ok(lines)
}

/// One JSON-RPC call to an Ethereum node.
async fn eth_call(
    client: &reqwest::Client,
    url: &str,
    method: &str,
    params: serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let bytes = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?
        .bytes()
        .await?;
    let mut answer: serde_json::Value = serde_json::from_slice(&bytes)?;
    anyhow::ensure!(answer["error"].is_null(), "{method}: {}", answer["error"]);
    Ok(answer["result"].take())
}

async fn ethereum(
    url: &str,
    addresses: usize,
    blocks: usize,
    transfers_per_block: usize,
) -> anyhow::Result<Vec<BenchLine>> {
    use payrecon_chain_core::BlockId;
    use payrecon_chain_ethereum::EthereumSettings;
    let client = reqwest::Client::new();
    let call = |method: &'static str, params: serde_json::Value| {
        let client = client.clone();
        async move { eth_call(&client, url, method, params).await }
    };
    let funder = call("eth_accounts", serde_json::json!([])).await?[0]
        .as_str()
        .context("the node has an account")?
        .to_owned();
    let chain_id = u64::from_str_radix(
        call("eth_chainId", serde_json::json!([]))
            .await?
            .as_str()
            .context("chain id")?
            .trim_start_matches("0x"),
        16,
    )?;
    let bytecode = include_str!("../../fixtures/ethereum/TestToken.bin").trim();
    let deploy = serde_json::json!({"from": funder, "gas": "0x200000",
        "data": format!("0x{bytecode}{:064x}", u128::MAX >> 8)});
    let deployed = call("eth_sendTransaction", serde_json::json!([deploy])).await?;
    call("anvil_mine", serde_json::json!(["0x1"])).await?;
    let token =
        call("eth_getTransactionReceipt", serde_json::json!([deployed])).await?["contractAddress"]
            .as_str()
            .context("token deployed")?
            .to_owned();
    let start = call("eth_blockNumber", serde_json::json!([])).await?;
    let start = u64::from_str_radix(
        start.as_str().context("height")?.trim_start_matches("0x"),
        16,
    )?;
    let start_hash = call(
        "eth_getBlockByNumber",
        serde_json::json!([format!("0x{start:x}"), false]),
    )
    .await?["hash"]
        .as_str()
        .context("hash")?
        .to_owned();

    // Busy blocks: every transfer pays a fresh address; one in ten of them is watched.
    let random_address = || {
        format!(
            "0x{}",
            &uuid::Uuid::new_v4().simple().to_string()[..32].repeat(2)[..40]
        )
    };
    let mut watched: Vec<String> = Vec::with_capacity(addresses);
    let progress = progress_bar((blocks * transfers_per_block * 2) as u64, "transfers");
    for _ in 0..blocks {
        for i in 0..transfers_per_block {
            let (to_eth, to_token) = (random_address(), random_address());
            if i % 10 == 0 {
                watched.push(to_eth.clone());
                watched.push(to_token.clone());
            }
            let eth =
                serde_json::json!({"from": funder, "to": to_eth, "value": "0x1", "gas": "0x5208"});
            call("eth_sendTransaction", serde_json::json!([eth])).await?;
            let data = format!("0xa9059cbb{:0>64}{:064x}", &to_token[2..], 1_000_000u128);
            let transfer =
                serde_json::json!({"from": funder, "to": token, "data": data, "gas": "0x20000"});
            call("eth_sendTransaction", serde_json::json!([transfer])).await?;
            progress.inc(2);
        }
        call("anvil_mine", serde_json::json!(["0x1"])).await?;
    }
    progress.finish_and_clear();
    while watched.len() < addresses {
        watched.push(random_address());
    }
    watched.truncate(addresses.max(1));

    let cursor = ChainCursor {
        tip: BlockId {
            height: start,
            hash: start_hash,
        },
        checkpoints: Vec::new(),
    };
    let settings = EthereumSettings::new(url, chain_id, token.parse()?, token.parse()?);
    ethereum_costs(
        &settings,
        &watched,
        &cursor,
        (blocks, transfers_per_block * 2),
    )
    .await
}

/// The Ethereum scanner over the same blocks and watch set with each part on and off: the
/// scan's own figures, then what outflow tracking and the internal-transfer check cost.
async fn ethereum_costs(
    settings: &payrecon_chain_ethereum::EthereumSettings,
    watched: &[String],
    cursor: &ChainCursor,
    (blocks, per_block): (usize, usize),
) -> anyhow::Result<Vec<BenchLine>> {
    let addresses = watched.len();
    // What each part of a scan costs: the same blocks and watch set scanned without outflow
    // tracking or the internal-transfer check, with outflows, and with both; once as one
    // catch-up scan of every block, once as rounds of one block each (a watcher at the head).
    let variants = [(false, false), (true, false), (true, true)];
    let mut catch_up = [Duration::ZERO; 3];
    let mut last = None;
    for (median, (outflows, internal)) in catch_up.iter_mut().zip(variants) {
        let (batch, elapsed) = ethereum_median(
            settings,
            (outflows, internal),
            watched,
            cursor,
            blocks,
            blocks,
        )
        .await?;
        *median = elapsed;
        last = Some(batch);
    }
    let batch = last.context("a scan ran")?;
    let mut rounds = [Duration::ZERO; 2];
    for (median, internal) in rounds.iter_mut().zip([false, true]) {
        *median = ethereum_median(settings, (true, internal), watched, cursor, blocks, 1)
            .await?
            .1;
    }
    let mut lines = scan_lines(addresses, blocks, per_block, &batch, catch_up[2]);
    let median_of = |workload: String, elapsed: Duration| {
        let mut shown = line(&workload, blocks, elapsed);
        shown.note = Some("median of 3".into());
        shown
    };
    lines.extend([
        median_of(
            format!("blocks scanned, {addresses} watched, outflows and internal transfers off"),
            catch_up[0],
        ),
        median_of(
            format!("blocks scanned, {addresses} watched, internal transfers off"),
            catch_up[1],
        ),
        cost_line(
            "cost per block, outflow tracking on / off",
            blocks,
            catch_up[1],
            catch_up[0],
        ),
        cost_line(
            "cost per block, internal-transfer check on / off, one catch-up scan",
            blocks,
            catch_up[2],
            catch_up[1],
        ),
        median_of(
            format!("one-block rounds, {addresses} watched, internal transfers off"),
            rounds[0],
        ),
        median_of(
            format!("one-block rounds, {addresses} watched, internal-transfer check on"),
            rounds[1],
        ),
        cost_line(
            "cost per block, internal-transfer check on / off, one-block rounds",
            blocks,
            rounds[1],
            rounds[0],
        ),
    ]);
    Ok(lines)
}

/// The median of 3 passes over the blocks after `cursor` with outflow tracking and the
/// internal-transfer check as `(outflows, internal)`, `blocks_per_scan` blocks per scan (each
/// scan resuming at the one before it); with the last pass's last batch.
async fn ethereum_median(
    settings: &payrecon_chain_ethereum::EthereumSettings,
    (outflows, internal): (bool, bool),
    watched: &[String],
    cursor: &ChainCursor,
    blocks: usize,
    blocks_per_scan: usize,
) -> anyhow::Result<(ScanBatch, Duration)> {
    let mut settings = settings.clone();
    settings.outflows = outflows;
    settings.internal_transfers = internal;
    settings.max_blocks_per_scan = blocks_per_scan as u64;
    let end = cursor.tip.height + blocks as u64;
    let mut timings = Vec::new();
    let mut last = None;
    for _ in 0..3 {
        let mut scanner = payrecon_chain_ethereum::EthereumScanner::new(settings.clone());
        let mut at = cursor.clone();
        let mut pass = Duration::ZERO;
        while at.tip.height < end {
            let (batch, elapsed) =
                timed_scan(&mut scanner, watched.to_vec(), Some(at.clone()), 12).await?;
            pass += elapsed;
            at = batch.cursor.clone();
            last = Some(batch);
        }
        anyhow::ensure!(at.tip.height == end, "the scans covered every busy block");
        timings.push(pass);
    }
    timings.sort();
    Ok((last.context("a scan ran")?, timings[1]))
}

async fn tron(
    addresses: usize,
    blocks: usize,
    transfers_per_block: usize,
) -> anyhow::Result<Vec<BenchLine>> {
    use payrecon_chain_tron::testkit::{FakeTron, trc20, trx};
    use payrecon_chain_tron::{TronAddress, TronScanner, TronSettings};
    const USDT: &str = "TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6t";
    let node = FakeTron::start(10).await;
    let start = node.head() + 1;
    let random_address = || {
        let bytes = uuid::Uuid::new_v4().into_bytes();
        let mut account = [0u8; 20];
        account[..16].copy_from_slice(&bytes);
        TronAddress::from_account_bytes(account).to_string()
    };
    // Busy blocks: every transfer pays a fresh address; one in ten of them is watched.
    let mut watched: Vec<String> = Vec::with_capacity(addresses);
    for _ in 0..blocks {
        let mut txs = Vec::with_capacity(transfers_per_block * 2);
        for i in 0..transfers_per_block {
            let (to_trx, to_usdt) = (random_address(), random_address());
            if i % 10 == 0 {
                watched.push(to_trx.clone());
                watched.push(to_usdt.clone());
            }
            txs.push(trx(&to_trx, 1_000_000));
            txs.push(trc20(USDT, &to_usdt, 1_000_000));
        }
        node.mine(&txs);
    }
    while watched.len() < addresses {
        watched.push(random_address());
    }
    watched.truncate(addresses);

    let mut settings = TronSettings::new(node.url.clone(), USDT.parse()?);
    settings.start_block = Some(start);
    settings.max_blocks_per_scan = blocks as u64;
    let mut scanner = TronScanner::new(settings);
    let (batch, elapsed) = timed_scan(&mut scanner, watched, None, 19).await?;
    anyhow::ensure!(
        batch.cursor.tip.height == node.head(),
        "the scan covered every busy block"
    );
    Ok(scan_lines(
        addresses,
        blocks,
        transfers_per_block * 2,
        &batch,
        elapsed,
    ))
}

async fn solana(references: usize, paid: usize) -> anyhow::Result<Vec<BenchLine>> {
    use payrecon_chain_solana::testkit::{FakeSolana, random_pubkey};
    use payrecon_chain_solana::{SolanaScanner, SolanaSettings};
    let node = FakeSolana::start().await;
    let recipient = random_pubkey();
    let now = chrono::Utc::now().timestamp();
    let watched: Vec<String> = (0..references).map(|_| random_pubkey()).collect();
    for reference in watched.iter().take(paid) {
        node.pay(&recipient, 1_000_000, Some(reference), now, false);
    }
    node.finalize_all();
    let mut settings = SolanaSettings::new(node.url.clone(), recipient.parse()?);
    settings.references_per_scan = references;
    let mut scanner = SolanaScanner::new(settings);
    let (batch, elapsed) = timed_scan(&mut scanner, watched, None, 1).await?;
    anyhow::ensure!(batch.events.len() == paid, "every payment found once");
    Ok(vec![
        line("references checked", references, elapsed),
        line("payments verified", batch.events.len(), elapsed),
    ])
}

/// One scan over `watch_keys`, continuing after `cursor`, with no transfer known yet: what a
/// scanner benchmark times.
async fn timed_scan<S: ChainScanner>(
    scanner: &mut S,
    watch_keys: Vec<String>,
    cursor: Option<ChainCursor>,
    settle_depth: u32,
) -> anyhow::Result<(ScanBatch, Duration)> {
    let view = WatchView {
        watch_keys: watch_keys.into_iter().collect(),
        cursor,
        now_ms: chrono::Utc::now().timestamp_millis(),
        settle_depth,
        ..WatchView::default()
    };
    let started = Instant::now();
    let batch = scanner.scan(&view).await?;
    Ok((batch, started.elapsed()))
}

/// The figures of one timed scan of `blocks` blocks carrying `per_block` transfers each.
fn scan_lines(
    addresses: usize,
    blocks: usize,
    per_block: usize,
    batch: &ScanBatch,
    elapsed: Duration,
) -> Vec<BenchLine> {
    vec![
        line(
            &format!("blocks scanned, {addresses} watched"),
            blocks,
            elapsed,
        ),
        line(
            &format!("transfers found of {} sent", blocks * per_block),
            batch.events.len(),
            elapsed,
        ),
    ]
}

/// Runs `work(i)` for every `i` below `count` on `concurrency` tasks; results in `i` order.
/// Runs `work` for items `0..count` from `concurrency` callers, each taking the next item as
/// soon as its last one is answered (as many independent clients would); the results in item
/// order.
async fn spread<T, F, Fut>(count: usize, concurrency: usize, work: F) -> anyhow::Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<T>> + Send + 'static,
{
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let work = Arc::new(work);
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..concurrency.min(count.max(1)) {
        let (next, work) = (next.clone(), work.clone());
        callers.spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= count {
                    return anyhow::Ok(done);
                }
                done.push((i, work(i).await?));
            }
        });
    }
    let mut results: Vec<Option<T>> = (0..count).map(|_| None).collect();
    while let Some(done) = callers.join_next().await {
        for (i, value) in done?? {
            results[i] = Some(value);
        }
    }
    Ok(results
        .into_iter()
        .map(|r| r.expect("every item was done"))
        .collect())
}

/// The brief's example: a 500 USD top-up paid with 0.00625 BTC.
fn topup_credit(key: &str, customer: &AccountId) -> NewEntry {
    let btc = Currency::Crypto(Method::Btc);
    NewEntry {
        idempotency_key: key.to_owned(),
        kind: EntryKind::Payment,
        reference: None,
        memo: String::new(),
        postings: vec![
            Posting::debit(Account::Custody(Method::Btc), btc, 625_000),
            Posting::credit(Account::Fx(Method::Btc), btc, 625_000),
            Posting::debit(Account::Fx(Method::Btc), Currency::Usd, 50_000),
            Posting::credit(
                Account::CustomerBalance(customer.clone()),
                Currency::Usd,
                50_000,
            ),
        ],
    }
}

/// A one-dollar rental paid from the balance: the path that locks and re-sums a balance.
fn debit(key: &str, customer: &AccountId) -> NewEntry {
    NewEntry {
        idempotency_key: key.to_owned(),
        kind: EntryKind::BalancePayment,
        reference: None,
        memo: String::new(),
        postings: vec![
            Posting::debit(
                Account::CustomerBalance(customer.clone()),
                Currency::Usd,
                100,
            ),
            Posting::credit(Account::RevenueRentals, Currency::Usd, 100),
        ],
    }
}

/// How the count and the rate of a workload are labelled.
const ITEMS: (&str, &str) = ("items  ", "per second");

/// Where a database benchmark writes: the database named, or a fresh SQLite file in a
/// temporary directory (removed with the returned guard).
fn scratch(database: Option<String>) -> anyhow::Result<(tempfile::TempDir, String)> {
    let dir = tempfile::tempdir().context("creating a scratch directory")?;
    let url =
        database.unwrap_or_else(|| format!("sqlite://{}", dir.path().join("bench.db").display()));
    Ok((dir, url))
}

/// Transfers loaded per transaction when building the report benchmark's period.
const REPORT_LOAD_BATCH: usize = 10_000;

/// Loads `count` confirmed transfers to addresses no intent owns from `start`, one every
/// `spacing_ms`, each held in suspense by its own journal entry (as the matcher books them),
/// posted when its batch's first transfer was seen. Returns the time it took.
async fn load_held_transfers(
    engine: &Engine,
    count: usize,
    start: chrono::DateTime<chrono::Utc>,
    spacing_ms: i64,
) -> anyhow::Result<Duration> {
    use payrecon::StoredTransfer;
    let bar = progress_bar(count as u64, "loading");
    let started = Instant::now();
    for first in (0..count).step_by(REPORT_LOAD_BATCH) {
        let indexes = first..(first + REPORT_LOAD_BATCH).min(count);
        let transfers: Vec<StoredTransfer> = indexes
            .clone()
            .map(|i| {
                let id = TransferId {
                    network: Network::Bitcoin,
                    txid: format!("{i:064x}"),
                    position: 0,
                };
                StoredTransfer {
                    credited_entry: Some(format!("unmatched:{id}")),
                    id,
                    to_address: format!("bc1qbench{:06}", i % 1_000),
                    asset: ReceivedAsset::Method {
                        method: Method::Btc,
                    },
                    amount: Amount::from_base_units(10_000 + (i % 1_000) as u128),
                    from_address: None,
                    intent_id: None,
                    confirmations: 6,
                    block_height: Some(1_000 + (i / 1_000) as u64),
                    removed: false,
                    tip_height: 2_000,
                    seen_at_ms: start.timestamp_millis() + i as i64 * spacing_ms,
                }
            })
            .collect();
        let btc = Currency::Crypto(Method::Btc);
        let entries: Vec<NewEntry> = transfers
            .iter()
            .map(|t| NewEntry {
                idempotency_key: t.credited_entry.clone().expect("set above"),
                kind: EntryKind::Payment,
                reference: None,
                memo: "held: unmatched".into(),
                postings: vec![
                    Posting::debit(
                        Account::Custody(Method::Btc),
                        btc,
                        t.amount.base_units() as i128,
                    ),
                    Posting::credit(
                        Account::Suspense(payrecon::ledger::SuspenseReason::Unmatched),
                        btc,
                        t.amount.base_units() as i128,
                    ),
                ],
            })
            .collect();
        let posted = chrono::DateTime::from_timestamp_millis(transfers[0].seen_at_ms)
            .context("a transfer time")?;
        let mut tx = engine.store().begin_write().await?;
        payrecon::test_utils::store::reports::load_transfers(
            &mut tx,
            &transfers,
            start.timestamp_millis(),
        )
        .await?;
        payrecon::test_utils::store::ledger::post_batch(&mut tx, &entries, posted).await??;
        tx.commit().await?;
        bar.inc(indexes.len() as u64);
    }
    bar.finish_and_clear();
    Ok(started.elapsed())
}

/// Builds a period of `count` held transfers over three days, then writes the report in every
/// format to nowhere, timing each and reading the peak memory it took.
async fn reconciliation(engine: &Engine, count: usize) -> anyhow::Result<Vec<BenchLine>> {
    use payrecon::test_utils::report::{CsvSection, ReportFormat, ReportQuery};
    let start = chrono::Utc::now() - chrono::Duration::days(3);
    // Spread over three days, so the chart has bars.
    let spacing_ms = (3 * 24 * 3600 * 1000 / count as i64).max(1);
    let loaded = load_held_transfers(engine, count, start, spacing_ms).await?;
    let mut lines = vec![line("load transfers and entries", count, loaded)];
    let query = ReportQuery {
        from: start - chrono::Duration::hours(1),
        to: chrono::Utc::now() + chrono::Duration::hours(1),
        method: None,
    };
    for (name, format) in [
        ("report csv (transfers)", ReportFormat::Csv),
        ("report json", ReportFormat::Json),
        ("report html", ReportFormat::Html),
    ] {
        reset_peak_memory();
        let started = Instant::now();
        let totals = engine
            .write_reconciliation(&query, format, CsvSection::Transfers, tokio::io::sink())
            .await?;
        anyhow::ensure!(
            totals.transfers as usize == count,
            "the report listed {} transfers",
            totals.transfers
        );
        lines.push(with_peak(line(name, count, started.elapsed())));
    }
    Ok(lines)
}

/// `measured` with the peak memory since the last reset.
fn with_peak(mut measured: BenchLine) -> BenchLine {
    measured.peak_rss_mib = peak_memory_mib();
    measured
}

/// Resets the kernel's peak-RSS mark of this process (Linux), so the next reading is the
/// peak of what follows.
fn reset_peak_memory() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The process's peak resident memory since the last reset, in MiB (Linux).
fn peak_memory_mib() -> Option<u64> {
    memory_kib("VmHWM:").map(|kib| kib / 1024)
}

/// One of this process's memory figures in `/proc/self/status` (`VmRSS:`, `VmHWM:`), in KiB
/// (Linux).
fn memory_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Prints the figures: one JSON document, or a title and one aligned row per workload.
fn report(
    json: bool,
    backend: Option<&str>,
    title: String,
    lines: &[BenchLine],
    (count, rate): (&str, &str),
) -> anyhow::Result<()> {
    let document = match backend {
        Some(backend) => serde_json::json!({ "backend": backend, "results": lines }),
        None => serde_json::json!({ "results": lines }),
    };
    emit(json, &document, || {
        let mut text = format!("{title}\n");
        for line in lines {
            text.push_str(&format!(
                "{:<44} {:>8} {count} {:>8} ms {:>9} {rate}",
                line.workload, line.entries, line.elapsed_ms, line.entries_per_second
            ));
            if let Some(ratio) = line.of_line {
                text.push_str(&format!("  {ratio:.2} of the line"));
            }
            if let Some(peak) = line.peak_rss_mib {
                text.push_str(&format!("  peak RSS {peak} MiB"));
            }
            if let Some(note) = &line.note {
                text.push_str(&format!("  ({note})"));
            }
            text.push('\n');
        }
        text
    })
}

fn line(workload: &str, entries: usize, elapsed: Duration) -> BenchLine {
    BenchLine {
        workload: workload.to_owned(),
        entries,
        elapsed_ms: elapsed.as_millis(),
        entries_per_second: (entries as f64 / elapsed.as_secs_f64().max(1e-9)) as u64,
        peak_rss_mib: None,
        of_line: None,
        note: None,
    }
}

/// A line that states what a part of a scan costs: the time with it over without.
fn cost_line(workload: &str, blocks: usize, on: Duration, off: Duration) -> BenchLine {
    let mut ratio = line(workload, blocks, Duration::ZERO);
    ratio.entries_per_second = 0;
    ratio.note = Some(format!(
        "{:.2}x",
        on.as_secs_f64() / off.as_secs_f64().max(1e-9)
    ));
    ratio
}

fn progress_bar(length: u64, label: &'static str) -> ProgressBar {
    let bar = ProgressBar::new(length);
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} {per_sec}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(label);
    bar
}

/// Shared with payrecon's CLI test, so that both read the guides' commands one way.
#[cfg(test)]
#[path = "../../src/cli/doc_commands.rs"]
mod doc_commands;

#[cfg(test)]
mod tests {
    use super::{Cli, doc_commands};

    /// `payrecon bench` hands its arguments to this binary unread: what the guides show after
    /// it is checked here, a command to run parsed, a mention's options looked up.
    #[test]
    fn every_bench_command_the_guides_show_parses() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let commands: Vec<_> = doc_commands::documented_commands(&root)
            .into_iter()
            .filter_map(|command| {
                let at = command.args.iter().position(|arg| arg == "bench")?;
                Some(doc_commands::DocumentedCommand {
                    args: command.args[at + 1..].to_vec(),
                    ..command
                })
            })
            .collect();
        assert!(commands.len() > 20, "{commands:?}");
        let refused = doc_commands::refusals::<Cli>("payrecon bench", &commands);
        assert!(
            refused.is_empty(),
            "commands the bench refuses:\n{}",
            refused.join("\n")
        );
    }
}
