//! Benchmarks of the Bitcoin-family full-node scanner against a regtest node whose wallet
//! pays: how soon a payment is seen and settled next to the Electrum path (latency), and what
//! a block costs with a thousand or a million watched addresses (scale).

use std::time::{Duration, Instant};

use anyhow::Context;
use payrecon_chain_bitcoin::{
    ElectrumScanner, NodeAuth, NodeScanner, NodeSettings, UtxoChain, UtxoNetwork, UtxoTarget,
};
use payrecon_chain_core::bitcoin::bech32::{self, Hrp};
use payrecon_chain_core::{
    BlockId, ChainCursor, ChainScanner, HeldOutputs, Method, WatchKeys, WatchView,
};
use serde_json::{Value, json};

use super::{BenchLine, line, reset_peak_memory};
use payrecon::Engine;
use payrecon::IntentStatus;
use payrecon::test_utils::watcher::{Watcher, WatcherOptions};
use payrecon::{OrderRef, TopupRequest};

/// Litecoin regtest mines its MWEB activation block only with a peg-in beside it, which
/// scripts/devnet.sh provides when it starts a chain; a benchmark never crosses it itself.
const LITECOIN_MWEB_ACTIVATION: u64 = 432;

/// The node under test and its funded wallet.
pub struct RegtestNode {
    http: reqwest::Client,
    url: reqwest::Url,
    wallet: String,
    /// The chain it serves.
    pub target: UtxoTarget,
}

impl RegtestNode {
    /// The node at `rpc_url` (credentials in the URL), paying from `wallet`.
    pub async fn connect(
        rpc_url: &str,
        wallet: &str,
        chain: UtxoChain,
    ) -> anyhow::Result<RegtestNode> {
        let node = RegtestNode {
            http: reqwest::Client::new(),
            url: rpc_url.parse().context("--rpc-url")?,
            wallet: wallet.to_owned(),
            target: UtxoTarget::new(chain, UtxoNetwork::Regtest),
        };
        let chain_name = node.call(false, "getblockchaininfo", json!([])).await?["chain"].clone();
        anyhow::ensure!(
            chain_name == "regtest",
            "the benchmarks mine blocks: they run on regtest only, the node serves {chain_name}"
        );
        Ok(node)
    }

    /// A JSON-RPC call, to the wallet when `wallet`.
    pub async fn call(&self, wallet: bool, method: &str, params: Value) -> anyhow::Result<Value> {
        let mut url = self.url.clone();
        if wallet {
            url.set_path(&format!("/wallet/{}", self.wallet));
        }
        let (user, password) = (url.username().to_owned(), url.password().map(str::to_owned));
        let _ = url.set_username("");
        let _ = url.set_password(None);
        let body = json!({"jsonrpc": "1.0", "id": 1, "method": method, "params": params});
        let reply: Value = self
            .http
            .post(url)
            .basic_auth(user, password)
            .json(&body)
            .send()
            .await?
            .json()
            .await
            .with_context(|| format!("{method}: the node's answer"))?;
        anyhow::ensure!(reply["error"].is_null(), "{method}: {}", reply["error"]);
        Ok(reply["result"].clone())
    }

    async fn height(&self) -> anyhow::Result<u64> {
        self.call(false, "getblockcount", json!([]))
            .await?
            .as_u64()
            .context("getblockcount")
    }

    /// Mines `blocks` blocks to the wallet, refusing to cross Litecoin's MWEB activation.
    pub async fn mine(&self, blocks: u64) -> anyhow::Result<()> {
        let height = self.height().await?;
        anyhow::ensure!(
            self.target.chain != UtxoChain::Litecoin
                || height >= LITECOIN_MWEB_ACTIVATION
                || height + blocks < LITECOIN_MWEB_ACTIVATION,
            "the regtest chain is at {height}: mining {blocks} more crosses Litecoin's MWEB activation, which needs a peg-in; start the chain with scripts/devnet.sh up, which activates MWEB"
        );
        let to = self
            .call(true, "getnewaddress", json!(["", "bech32"]))
            .await?;
        self.call(true, "generatetoaddress", json!([blocks, to]))
            .await?;
        Ok(())
    }

    /// The human-readable part of the chain's segwit addresses (`rltc`, `bcrt`).
    async fn hrp(&self) -> anyhow::Result<Hrp> {
        let address = self
            .call(true, "getnewaddress", json!(["", "bech32"]))
            .await?;
        let address = address.as_str().context("getnewaddress")?;
        let (hrp, _) = address.rsplit_once('1').context("a bech32 address")?;
        Ok(Hrp::parse(hrp)?)
    }
}

/// A fresh random P2WPKH address: a program nobody holds a key to, for watching only.
fn random_address(hrp: Hrp) -> anyhow::Result<String> {
    let (a, b) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let program: Vec<u8> = a
        .as_bytes()
        .iter()
        .chain(&b.as_bytes()[..4])
        .copied()
        .collect();
    Ok(bech32::segwit::encode(hrp, bech32::Fe32::Q, &program)?)
}

/// The median and the 95th percentile of `samples`.
fn median_p95(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.95))
}

fn latency_line(workload: &str, samples: Vec<Duration>) -> BenchLine {
    let count = samples.len();
    let (median, p95) = median_p95(samples);
    let mut measured = line(workload, count, median);
    measured.entries_per_second = 0;
    measured.note = Some(format!(
        "median {} ms, p95 {} ms of {count} payments",
        median.as_millis(),
        p95.as_millis()
    ));
    measured
}

/// One engine watching the node through one source.
struct Watched {
    name: &'static str,
    engine: Engine,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), payrecon::Error>>,
}

/// Broadcast to `seen` and confirming block to `settled`, for `payments` payments, on the
/// full node (with its push channel) and on Electrum side by side, each engine on its own
/// scratch SQLite database, one confirmation, polling every `poll` as the fallback.
pub async fn latency(
    node: &RegtestNode,
    push_peer: Option<String>,
    electrum_url: Option<String>,
    payments: usize,
    poll: Duration,
    scratch: &std::path::Path,
) -> anyhow::Result<Vec<BenchLine>> {
    let xpub = super::fresh_litecoin_xpub()?;
    let mut sources: Vec<(&'static str, payrecon::config::UtxoConfig)> = vec![(
        "full node",
        payrecon::config::UtxoConfig {
            rpc_url: Some(node.url.to_string().into()),
            push_peer: push_peer.clone(),
            ..payrecon::config::UtxoConfig::new(xpub.clone(), "regtest", 1)
        },
    )];
    if let Some(url) = &electrum_url {
        sources.push((
            "electrum",
            payrecon::config::UtxoConfig {
                electrum_url: Some(url.clone().into()),
                ..payrecon::config::UtxoConfig::new(xpub.clone(), "regtest", 1)
            },
        ));
    }
    let mut watched = Vec::new();
    for (name, utxo) in sources {
        let dir = scratch.join(name.replace(' ', "-"));
        std::fs::create_dir_all(&dir)?;
        let url = format!("sqlite://{}", dir.join("bench.db").display());
        let config = super::litecoin_config(&url, &dir, utxo.clone())?;
        let engine = Engine::from_config(&config).await?;
        let options = WatcherOptions {
            poll_interval: poll,
            ..WatcherOptions::default()
        };
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let task = match payrecon::test_utils::networks::utxo_source(
            payrecon_chain_core::Network::Litecoin,
            &utxo,
        )? {
            Some(payrecon::test_utils::networks::UtxoSource::Node(settings)) => tokio::spawn(
                Watcher::new(engine.clone(), NodeScanner::new(settings), options).run(shutdown),
            ),
            Some(payrecon::test_utils::networks::UtxoSource::Electrum(settings)) => tokio::spawn(
                Watcher::new(engine.clone(), ElectrumScanner::new(settings), options).run(shutdown),
            ),
            None => anyhow::bail!("no source"),
        };
        watched.push(Watched {
            name,
            engine,
            stop,
            task,
        });
    }

    let mut seen: Vec<Vec<Duration>> = vec![Vec::new(); watched.len()];
    let mut settled: Vec<Vec<Duration>> = vec![Vec::new(); watched.len()];
    let progress = super::progress_bar(payments as u64, "payments");
    let run = uuid::Uuid::new_v4().simple().to_string();
    for i in 0..payments {
        let reference = OrderRef::new(format!("l{}-{i}", &run[..8]))?;
        let mut intents = Vec::new();
        for w in &watched {
            w.engine
                .create_topup(&TopupRequest {
                    reference: reference.to_string(),
                    account_id: "bench".into(),
                    amount_usd: payrecon::test_utils::money::Usd::from_dollars(100),
                })
                .await?;
            intents.push(w.engine.create_payment(&reference, Method::Ltc).await?);
        }
        let address = intents[0].intent.pay_to.clone();
        anyhow::ensure!(
            intents.iter().all(|p| p.intent.pay_to == address),
            "one key, one address"
        );
        let amount = intents[0].amount_decimal.clone();
        let sent = Instant::now();
        node.call(true, "sendtoaddress", json!([address, amount]))
            .await?;
        wait_all(&watched, &intents, sent, &mut seen, |s| {
            s != IntentStatus::AwaitingPayment
        })
        .await?;
        let mined = Instant::now();
        node.mine(1).await?;
        wait_all(&watched, &intents, mined, &mut settled, |s| {
            s == IntentStatus::Settled
        })
        .await?;
        progress.inc(1);
    }
    progress.finish_and_clear();
    for w in watched.iter() {
        let _ = w.stop.send(true);
    }
    let mut lines = Vec::new();
    for (i, w) in watched.into_iter().enumerate() {
        lines.push(latency_line(
            &format!("{}: broadcast to seen", w.name),
            std::mem::take(&mut seen[i]),
        ));
        lines.push(latency_line(
            &format!("{}: block to settled", w.name),
            std::mem::take(&mut settled[i]),
        ));
        w.task.await??;
    }
    Ok(lines)
}

/// Waits until every engine's intent reached `done`, recording each one's time since `since`.
async fn wait_all(
    watched: &[Watched],
    intents: &[payrecon::test_utils::payments::PaymentInstructions],
    since: Instant,
    samples: &mut [Vec<Duration>],
    done: impl Fn(IntentStatus) -> bool,
) -> anyhow::Result<()> {
    let mut pending: Vec<usize> = (0..watched.len()).collect();
    while !pending.is_empty() {
        anyhow::ensure!(
            since.elapsed() < Duration::from_secs(120),
            "a payment was not seen within two minutes"
        );
        let mut still = Vec::new();
        for i in pending {
            let status = watched[i]
                .engine
                .payment(&intents[i].intent.id)
                .await?
                .intent
                .status;
            if done(status) {
                samples[i].push(since.elapsed());
            } else {
                still.push(i);
            }
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// Mines `blocks` blocks of `outputs_per_block` outputs to fresh random addresses each: the
/// addresses paid, in order.
async fn mine_outputs(
    node: &RegtestNode,
    hrp: Hrp,
    blocks: usize,
    outputs_per_block: usize,
) -> anyhow::Result<Vec<String>> {
    let progress = super::progress_bar(blocks as u64, "blocks");
    let mut paid = Vec::with_capacity(blocks * outputs_per_block);
    for _ in 0..blocks {
        let mut outputs = serde_json::Map::new();
        for _ in 0..outputs_per_block {
            let address = random_address(hrp)?;
            outputs.insert(address.clone(), json!("0.0001"));
            paid.push(address);
        }
        node.call(true, "sendmany", json!(["", outputs])).await?;
        node.mine(1).await?;
        progress.inc(1);
    }
    progress.finish_and_clear();
    Ok(paid)
}

/// Mines `blocks` blocks of `outputs_per_block` outputs each to random addresses, then scans
/// them with each of `watched` addresses watched (a thousandth of the outputs' addresses
/// among them, so every run finds the same payments): the cost of a block against the size
/// of the watch set, and the memory of the set.
pub async fn scale(
    node: &RegtestNode,
    watched: &[usize],
    blocks: usize,
    outputs_per_block: usize,
) -> anyhow::Result<Vec<BenchLine>> {
    let hrp = node.hrp().await?;
    let largest = watched.iter().copied().max().unwrap_or(0);
    let paid_watched =
        (blocks * outputs_per_block / 10).min(watched.iter().copied().min().unwrap_or(0));
    let start = node.height().await? + 1;
    let paid = mine_outputs(node, hrp, blocks, outputs_per_block).await?;
    let anchor = node.call(false, "getblockhash", json!([start - 1])).await?;
    let cursor = ChainCursor {
        tip: BlockId {
            height: start - 1,
            hash: anchor.as_str().context("getblockhash")?.to_owned(),
        },
        checkpoints: Vec::new(),
    };
    let head = node.height().await?;
    let tip_hash = node.call(false, "getblockhash", json!([head])).await?;
    let at_head = ChainCursor {
        tip: BlockId {
            height: head,
            hash: tip_hash.as_str().context("getblockhash")?.to_owned(),
        },
        checkpoints: Vec::new(),
    };
    // The same unpaid addresses for every size: the largest set's, cut down.
    let mut unpaid = Vec::with_capacity(largest);
    for _ in 0..largest.saturating_sub(paid_watched) {
        unpaid.push(random_address(hrp)?);
    }
    let mut lines = Vec::new();
    let mut per_block = Vec::new();
    for &count in watched {
        let before = resident_mib();
        reset_peak_memory();
        let keys: WatchKeys = paid[..paid_watched.min(count)]
            .iter()
            .chain(&unpaid[..count - paid_watched.min(count)])
            .collect();
        let mut view = WatchView {
            watch_keys: keys,
            cursor: Some(at_head.clone()),
            now_ms: chrono::Utc::now().timestamp_millis(),
            settle_depth: 1,
            ..WatchView::default()
        };
        let mut settings =
            NodeSettings::new(node.url.to_string(), NodeAuth::None, node.target.clone());
        settings.blocks_per_scan = blocks as u64;
        let mut scanner = NodeScanner::new(settings);
        let started = Instant::now();
        scanner.scan(&view).await?;
        let indexed = started.elapsed();
        let grown = resident_mib().saturating_sub(before);
        let mut measured = line(
            &format!("{count} addresses watched: index built"),
            count,
            indexed,
        );
        measured.note = Some(format!(
            "resident memory +{grown} MiB for the watch set and its index"
        ));
        lines.push(measured);

        view.cursor = Some(cursor.clone());
        let mut timings = Vec::new();
        let mut found = 0;
        for _ in 0..3 {
            let started = Instant::now();
            let batch = scanner.scan(&view).await?;
            timings.push(started.elapsed());
            found = batch.events.len();
        }
        timings.sort();
        let elapsed = timings[1];
        let mut measured = super::with_peak(line(
            &format!("{count} watched: blocks of {outputs_per_block} outputs scanned"),
            blocks,
            elapsed,
        ));
        let block_ms = elapsed.as_secs_f64() * 1000.0 / blocks as f64;
        per_block.push(block_ms);
        let outputs_per_second =
            ((blocks * outputs_per_block) as f64 / elapsed.as_secs_f64().max(1e-9)) as u64;
        measured.note = Some(format!(
            "{block_ms:.1} ms per block, {outputs_per_second} outputs/s, {found} payments found; median of 3"
        ));
        lines.push(measured);
        if count == largest {
            lines.extend(with_outflows(&mut scanner, &mut view, count, blocks, elapsed).await?);
        }
        drop(view);
        drop(scanner);
    }
    if let (Some(first), Some(last)) = (per_block.first(), per_block.last())
        && let Some(ratio) = (first > &0.0).then(|| last / first)
    {
        let mut measured = line(
            "cost per block, largest set / smallest set",
            blocks,
            Duration::ZERO,
        );
        measured.entries_per_second = 0;
        measured.note = Some(format!("{ratio:.2}x"));
        lines.push(measured);
    }
    Ok(lines)
}

/// The same blocks scanned again with outflow tracking on: `count` held outputs (random
/// outpoints: each input of each block is looked up among them), against the scan without
/// (`off`), and the memory the held set takes.
async fn with_outflows(
    scanner: &mut NodeScanner,
    view: &mut WatchView,
    count: usize,
    blocks: usize,
    off: Duration,
) -> anyhow::Result<Vec<BenchLine>> {
    let before = resident_mib();
    let mut held = HeldOutputs::default();
    for n in 0..count {
        let (a, b) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        let txid = format!("{}{}", a.simple(), b.simple());
        held.insert(&txid, u32::try_from(n % 4).unwrap_or(0), 100_000);
    }
    let grown = resident_mib().saturating_sub(before);
    view.held = held;
    let mut timings = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        scanner.scan(view).await?;
        timings.push(started.elapsed());
    }
    timings.sort();
    let on = timings[1];
    let mut measured = super::with_peak(line(
        &format!("{count} watched, {count} held outputs: blocks scanned with outflow tracking"),
        blocks,
        on,
    ));
    measured.note = Some(format!(
        "{:.1} ms per block; the held set took +{grown} MiB resident; median of 3",
        on.as_secs_f64() * 1000.0 / blocks as f64
    ));
    Ok(vec![
        measured,
        super::cost_line("cost per block, outflow tracking on / off", blocks, on, off),
    ])
}

/// The process's resident memory now, in MiB (Linux).
fn resident_mib() -> u64 {
    super::memory_kib("VmRSS:").map_or(0, |kib| kib / 1024)
}
