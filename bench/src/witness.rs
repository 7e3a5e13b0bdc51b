//! `bench witness`: what a witness costs. The same payments settled by an Ethereum watcher on
//! anvil without a witness and with one (the same node behind a proxy that counts each
//! request), and a watcher round over a new block that carries no payment, both ways: the
//! requests a witness costs per settled payment, and whether rounds without a receipt slow.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use payrecon::Engine;
use payrecon::config::Config;
use payrecon_chain_core::Method;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::{BenchLine, eth_call, line, recorded_config};

/// The options of `witness`.
#[derive(Debug, clap::Args)]
pub(crate) struct WitnessArgs {
    /// A node that mines on request (anvil, `scripts/devnet.sh up`), paid from with
    /// `eth_sendTransaction` from its first account and mined with `anvil_mine`.
    #[arg(long)]
    rpc_url: String,
    /// Payments settled each way, all in one block.
    #[arg(long, default_value_t = 50)]
    payments: usize,
    /// Rounds over an empty block timed each way.
    #[arg(long, default_value_t = 20)]
    quiet_rounds: usize,
}

/// Runs the benchmark; the figures' lines.
pub(crate) async fn witness(args: WitnessArgs) -> anyhow::Result<Vec<BenchLine>> {
    anyhow::ensure!(
        args.payments > 0 && args.quiet_rounds > 0,
        "--payments and --quiet-rounds must be positive"
    );
    let proxy = CountingProxy::start(&args.rpc_url).await?;
    let without = settle(&args, None).await?;
    let with = settle(&args, Some(&proxy)).await?;
    let asked = proxy.requests.load(Ordering::SeqCst);
    let mut lines = Vec::new();
    let mut settled = line(
        "settle payments in one block, no witness",
        args.payments,
        without.settle,
    );
    settled.note = Some(format!("{} watcher rounds", without.rounds));
    lines.push(settled);
    let mut witnessed = line(
        "settle payments in one block, one witness",
        args.payments,
        with.settle,
    );
    witnessed.note = Some(format!(
        "{} watcher rounds; {:.1} witness requests per settled payment; {:.2}x the time without",
        with.rounds,
        with.witness_requests as f64 / args.payments as f64,
        with.settle.as_secs_f64() / without.settle.as_secs_f64().max(1e-9)
    ));
    lines.push(witnessed);
    lines.push(line(
        "watcher round over a block with no payment, no witness",
        args.quiet_rounds,
        without.quiet,
    ));
    let mut quiet = line(
        "watcher round over a block with no payment, one witness",
        args.quiet_rounds,
        with.quiet,
    );
    quiet.note = Some(format!(
        "{} witness requests; {:.2}x the time without",
        with.quiet_requests,
        with.quiet.as_secs_f64() / without.quiet.as_secs_f64().max(1e-9)
    ));
    lines.push(quiet);
    anyhow::ensure!(
        asked == with.witness_requests + with.quiet_requests,
        "the witness was asked outside the measured rounds"
    );
    Ok(lines)
}

/// One way's figures.
struct Run {
    settle: Duration,
    rounds: usize,
    witness_requests: usize,
    quiet: Duration,
    quiet_requests: usize,
}

/// Creates `payments` ETH intents, pays them all in one block, and times the watcher rounds
/// until every one is settled, then rounds over empty blocks; with `witness` as the network's
/// witness when given.
async fn settle(args: &WitnessArgs, witness: Option<&CountingProxy>) -> anyhow::Result<Run> {
    let http = reqwest::Client::new();
    let call = |method: &'static str, params: serde_json::Value| {
        let (http, url) = (http.clone(), args.rpc_url.clone());
        async move { eth_call(&http, &url, method, params).await }
    };
    let funder = call("eth_accounts", serde_json::json!([])).await?[0]
        .as_str()
        .context("a funded account")?
        .to_owned();
    let chain_id = hex_number(&call("eth_chainId", serde_json::json!([])).await?)?;
    let head = hex_number(&call("eth_blockNumber", serde_json::json!([])).await?)?;
    let scratch = tempfile::tempdir()?;
    let url = format!("sqlite://{}", scratch.path().join("bench.db").display());
    let config = ethereum_config(&url, scratch.path(), args, chain_id, witness)?;
    let engine = Engine::from_config(&config).await?;
    let mut intents = Vec::with_capacity(args.payments);
    for i in 0..args.payments {
        let reference = format!("w{}-{i}", uuid::Uuid::new_v4().simple());
        engine
            .create_topup(&payrecon::test_utils::order::TopupRequest {
                reference: reference.clone(),
                account_id: format!("c{i}"),
                amount_usd: payrecon::test_utils::money::Usd::from_dollars(100),
            })
            .await?;
        let reference = payrecon::test_utils::order::OrderRef::new(reference)?;
        intents.push(engine.create_payment(&reference, Method::Eth).await?.intent);
    }
    for intent in &intents {
        let wei = intent.amount.base_units();
        let pay = serde_json::json!({"from": funder, "to": intent.pay_to, "value": format!("0x{wei:x}"), "gas": "0x5208"});
        call("eth_sendTransaction", serde_json::json!([pay])).await?;
    }
    call("anvil_mine", serde_json::json!(["0x1"])).await?;

    let section = config.networks.ethereum.as_ref().context("ethereum")?;
    let mut settings = payrecon::test_utils::networks::ethereum_sources(section)?.remove(0);
    settings.start_block = Some(head + 1);
    let mut watcher = payrecon::test_utils::watcher::Watcher::new(
        engine.clone(),
        payrecon_chain_ethereum::EthereumScanner::new(settings),
        payrecon::test_utils::watcher::WatcherOptions::default(),
    );
    let before = witness.map_or(0, |w| w.requests.load(Ordering::SeqCst));
    let started = Instant::now();
    let mut rounds = 0;
    loop {
        watcher.round().await?;
        rounds += 1;
        let mut open = 0;
        for intent in &intents {
            let status = engine.payment(&intent.id).await?.intent.status;
            open += usize::from(status != payrecon::IntentStatus::Settled);
        }
        if open == 0 {
            break;
        }
        anyhow::ensure!(
            rounds < 100,
            "{open} payments still unsettled after 100 rounds"
        );
    }
    let settle = started.elapsed();
    let witness_requests = witness.map_or(0, |w| w.requests.load(Ordering::SeqCst)) - before;

    let before = witness.map_or(0, |w| w.requests.load(Ordering::SeqCst));
    let mut quiet = Duration::ZERO;
    for _ in 0..args.quiet_rounds {
        call("anvil_mine", serde_json::json!(["0x1"])).await?;
        let started = Instant::now();
        watcher.round().await?;
        quiet += started.elapsed();
    }
    let quiet_requests = witness.map_or(0, |w| w.requests.load(Ordering::SeqCst)) - before;
    Ok(Run {
        settle,
        rounds,
        witness_requests,
        quiet,
        quiet_requests,
    })
}

/// ETH at 2000 USD, one confirmation, on `rpc_url`, a fresh key; `witness` as the witness.
fn ethereum_config(
    url: &str,
    scratch: &std::path::Path,
    args: &WitnessArgs,
    chain_id: u64,
    witness: Option<&CountingProxy>,
) -> anyhow::Result<Config> {
    let mut config = recorded_config(url, scratch, r#"{"quotes":{"ETH":"2000"}}"#, Method::Eth)?;
    let witnesses = witness.map_or(String::new(), |w| format!("witness_urls = [\"{}\"]", w.url));
    let section = format!(
        "[networks.ethereum]\nxpub = \"{}\"\nchain_id = {chain_id}\nconfirmations = 1\nrpc_url = \"{}\"\n{witnesses}\n",
        fresh_ethereum_xpub()?,
        args.rpc_url
    );
    config.networks.ethereum = Config::from_toml(&section)?.networks.ethereum;
    Ok(config)
}

/// A fresh account key of m/44'/60'/0'.
fn fresh_ethereum_xpub() -> anyhow::Result<String> {
    use payrecon_chain_core::bitcoin::bip32::{DerivationPath, Xpriv, Xpub};
    let secp = payrecon_chain_core::bitcoin::secp256k1::Secp256k1::new();
    let seed = [
        *uuid::Uuid::new_v4().as_bytes(),
        *uuid::Uuid::new_v4().as_bytes(),
    ]
    .concat();
    let master = Xpriv::new_master(payrecon_chain_core::bitcoin::NetworkKind::Main, &seed)?;
    let path: DerivationPath = "m/44'/60'/0'".parse()?;
    Ok(Xpub::from_priv(&secp, &master.derive_priv(&secp, &path)?).to_string())
}

fn hex_number(value: &serde_json::Value) -> anyhow::Result<u64> {
    let text = value.as_str().context("a hex number")?;
    Ok(u64::from_str_radix(text.trim_start_matches("0x"), 16)?)
}

/// An HTTP/1.1 proxy in front of a JSON-RPC node that counts the requests it forwards.
struct CountingProxy {
    url: String,
    requests: Arc<AtomicUsize>,
}

impl CountingProxy {
    async fn start(upstream: &str) -> anyhow::Result<CountingProxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let requests = Arc::new(AtomicUsize::new(0));
        let (counted, upstream) = (requests.clone(), upstream.to_owned());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            while let Ok((stream, _)) = listener.accept().await {
                let (counted, upstream, http) = (counted.clone(), upstream.clone(), http.clone());
                tokio::spawn(async move {
                    let _ = forward(stream, &upstream, &http, &counted).await;
                });
            }
        });
        Ok(CountingProxy { url, requests })
    }
}

/// Forwards each request of one connection to `upstream` and writes its answer back.
async fn forward(
    stream: tokio::net::TcpStream,
    upstream: &str,
    http: &reqwest::Client,
    counted: &AtomicUsize,
) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    loop {
        let mut length = 0;
        loop {
            let mut header = String::new();
            if read.read_line(&mut header).await? == 0 {
                return Ok(());
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse()?;
            }
        }
        let mut body = vec![0; length];
        read.read_exact(&mut body).await?;
        counted.fetch_add(1, Ordering::SeqCst);
        let answer = http
            .post(upstream)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?
            .bytes()
            .await?;
        // Head and body in one write: two would meet the client's delayed acknowledgement.
        let mut response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            answer.len()
        )
        .into_bytes();
        response.extend_from_slice(&answer);
        write.write_all(&response).await?;
    }
}
