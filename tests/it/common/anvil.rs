//! Test support for the anvil Ethereum node (scripts/devnet.sh), which mines only when asked.
//!
//! Tests that mine or reorg hold [`Anvil::lock`] for their whole run; each derives its
//! addresses below a fresh random key.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use alloy::signers::local::PrivateKeySigner;
use payrecon::Engine;
use payrecon::config::{Config, EthereumConfig, EthereumFinality};
use payrecon::test_utils::clock::ManualClock;
use payrecon::test_utils::watcher::WatcherOptions;
use payrecon_chain_core::bitcoin::bip32::{DerivationPath, Xpriv, Xpub};
use payrecon_chain_core::bitcoin::secp256k1::Secp256k1;
use payrecon_chain_core::{Asset, Method, Network};
use payrecon_chain_ethereum::{EthereumScanner, EthereumSettings};
use serde_json::{Value, json};
use tokio::sync::{Mutex, MutexGuard};

use super::regtest::{Running, fast, wait_for_tip};
use super::{TestDb, post_json};

static ANVIL: Mutex<()> = Mutex::const_new(());

/// The anvil node and its first (funded, unlocked) account.
pub struct Anvil {
    http: reqwest::Client,
    pub url: String,
    pub funder: String,
    pub other: String,
    _guard: MutexGuard<'static, ()>,
}

/// Three deployed 6-decimal tokens: USDT, USDC and a fake.
pub struct Tokens {
    pub usdt: String,
    pub usdc: String,
    pub fake: String,
}

impl Anvil {
    pub async fn lock() -> Anvil {
        super::regtest::init_logs();
        let guard = ANVIL.lock().await;
        let url = std::env::var("PAYRECON_TEST_ETH_RPC").unwrap_or_else(|_| {
            panic!("PAYRECON_TEST_ETH_RPC is not set: run the tests with scripts/test.sh, which starts anvil (scripts/devnet.sh up)")
        });
        let mut anvil = Anvil {
            http: reqwest::Client::new(),
            url,
            funder: String::new(),
            other: String::new(),
            _guard: guard,
        };
        let accounts = anvil.call("eth_accounts", json!([])).await;
        anvil.funder = accounts[0].as_str().unwrap().to_owned();
        anvil.other = accounts[1].as_str().unwrap().to_owned();
        anvil
    }

    pub async fn call(&self, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let answer = post_json(self.http.post(&self.url), body.to_string()).await;
        let response: Value = serde_json::from_slice(&answer).expect("anvil answers JSON");
        if !response["error"].is_null() {
            panic!("{method} {params}: {}", response["error"]);
        }
        response["result"].clone()
    }

    pub async fn mine(&self, blocks: u64) {
        self.call("anvil_mine", json!([format!("0x{blocks:x}")]))
            .await;
    }

    pub async fn head(&self) -> u64 {
        let head = self.call("eth_blockNumber", json!([])).await;
        u64::from_str_radix(head.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
    }

    pub async fn head_hash(&self) -> String {
        self.call("eth_getBlockByNumber", json!(["latest", false]))
            .await["hash"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The newest block's time, Unix seconds: ahead of the wall clock once a test stamped
    /// blocks later.
    pub async fn head_time(&self) -> i64 {
        let latest = self
            .call("eth_getBlockByNumber", json!(["latest", false]))
            .await;
        i64::from_str_radix(
            latest["timestamp"]
                .as_str()
                .unwrap()
                .trim_start_matches("0x"),
            16,
        )
        .unwrap()
    }

    /// Stamps the next block no earlier than `unix_seconds` (and after its parent).
    pub async fn next_block_at_least(&self, unix_seconds: i64) {
        let parent = self.head_time().await;
        let at = unix_seconds.max(parent + 1);
        self.call("evm_setNextBlockTimestamp", json!([at])).await;
    }

    /// Sends `wei` from the funder; mined with the next block.
    pub async fn send_eth(&self, to: &str, wei: u128) -> String {
        self.send_eth_from(&self.funder, to, wei).await
    }

    /// Sends `wei` from `from`, one of the node's accounts; mined with the next block.
    pub async fn send_eth_from(&self, from: &str, to: &str, wei: u128) -> String {
        let tx = json!({"from": from, "to": to, "value": format!("0x{wei:x}"), "gas": "0x5208"});
        self.call("eth_sendTransaction", json!([tx]))
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Calls `transfer(to, amount)` on `token` from `from`, with a fixed gas limit so a
    /// reverting call is still mined (and fails).
    pub async fn send_token_from(&self, from: &str, token: &str, to: &str, amount: u128) -> String {
        let data = format!(
            "0xa9059cbb{:0>64}{amount:064x}",
            to.trim_start_matches("0x").to_lowercase()
        );
        let tx = json!({"from": from, "to": token, "data": data, "gas": "0x30000"});
        self.call("eth_sendTransaction", json!([tx]))
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    pub async fn send_token(&self, token: &str, to: &str, amount: u128) -> String {
        let funder = self.funder.clone();
        self.send_token_from(&funder, token, to, amount).await
    }

    /// Sends a signed transaction; mined with the next block.
    pub async fn send_raw(&self, raw: &str) -> String {
        self.call("eth_sendRawTransaction", json!([raw]))
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// An address's ETH at the head, in wei.
    pub async fn balance(&self, address: &str) -> u128 {
        let balance = self
            .call("eth_getBalance", json!([address, "latest"]))
            .await;
        u128::from_str_radix(balance.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
    }

    pub async fn receipt(&self, tx: &str) -> Value {
        self.call("eth_getTransactionReceipt", json!([tx])).await
    }

    /// Deploys the fixture token three times (mined).
    pub async fn tokens(&self) -> Tokens {
        let bytecode = include_str!("../../../fixtures/ethereum/TestToken.bin").trim();
        let mut deployed = Vec::new();
        for _ in 0..3 {
            let data = format!("0x{bytecode}{:064x}", 1_000_000_000_000_000u128);
            let tx = json!({"from": self.funder, "data": data, "gas": "0x200000"});
            let hash = self.call("eth_sendTransaction", json!([tx])).await;
            deployed.push(hash.as_str().unwrap().to_owned());
        }
        self.mine(1).await;
        let mut addresses = Vec::new();
        for hash in deployed {
            let receipt = self.receipt(&hash).await;
            assert_eq!(receipt["status"], json!("0x1"), "{receipt}");
            addresses.push(receipt["contractAddress"].as_str().unwrap().to_owned());
        }
        Tokens {
            usdt: addresses[0].clone(),
            usdc: addresses[1].clone(),
            fake: addresses[2].clone(),
        }
    }

    /// Deploys `fixtures/ethereum/PayingWallet.sol` (mined): a contract that pays ETH in
    /// internal calls, as smart-contract wallets and exchanges' batch withdrawals do.
    pub async fn paying_wallet(&self) -> String {
        let bytecode = include_str!("../../../fixtures/ethereum/PayingWallet.bin").trim();
        let tx = json!({"from": self.funder, "data": format!("0x{bytecode}"), "gas": "0x200000"});
        let hash = self.call("eth_sendTransaction", json!([tx])).await;
        self.mine(1).await;
        let receipt = self.receipt(hash.as_str().unwrap()).await;
        assert_eq!(receipt["status"], json!("0x1"), "{receipt}");
        receipt["contractAddress"].as_str().unwrap().to_owned()
    }

    /// Sends `wallet.pay(recipients, amounts)` from the funder with their sum: one transaction
    /// whose internal calls pay each recipient. Mined with the next block.
    pub async fn pay_through(&self, wallet: &str, payments: &[(&str, u128)]) -> String {
        let from = self.funder.clone();
        self.send_call(
            &from,
            wallet,
            &paying_wallet_call(payments),
            payments.iter().map(|(_, wei)| wei).sum(),
        )
        .await
    }

    /// Sends `wallet.<call>(to)` with `wei` from the funder, for `payThenRevert` (the
    /// transaction reverts) and `payInRevertedCall` (the payment's parent call reverts).
    pub async fn pay_and_undo(&self, wallet: &str, call: &str, to: &str, wei: u128) -> String {
        let selector = match call {
            "payThenRevert" => "e0044bcd",
            "payInRevertedCall" => "776caca1",
            other => panic!("PayingWallet has no {other}"),
        };
        let data = format!(
            "{selector}{:0>64}",
            to.trim_start_matches("0x").to_lowercase()
        );
        let from = self.funder.clone();
        self.send_call(
            &from,
            wallet,
            &alloy::primitives::hex::decode(data).unwrap(),
            wei,
        )
        .await
    }

    /// Sends a call with a fixed gas limit, so one that reverts is still mined (and fails).
    async fn send_call(&self, from: &str, to: &str, data: &[u8], wei: u128) -> String {
        let tx = json!({
            "from": from, "to": to, "value": format!("0x{wei:x}"), "gas": "0x100000",
            "data": format!("0x{}", alloy::primitives::hex::encode(data)),
        });
        self.call("eth_sendTransaction", json!([tx]))
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Replaces the last `depth` blocks with empty ones: what they carried is gone.
    pub async fn reorg(&self, depth: u64) {
        self.call("anvil_reorg", json!({"depth": depth, "tx_block_pairs": []}))
            .await;
    }

    /// Replaces the last `depth` blocks with empty ones but for `raw`, mined again in the
    /// first of them: a reorg that moves transactions to another block.
    pub async fn reorg_keeping(&self, depth: u64, raw: &[String]) {
        let pairs: Vec<Value> = raw.iter().map(|tx| json!([tx, 0])).collect();
        self.call(
            "anvil_reorg",
            json!({"depth": depth, "tx_block_pairs": pairs}),
        )
        .await;
    }

    /// Waits until the engine's Ethereum watcher has committed anvil's head.
    pub async fn wait_synced(&self, engine: &Engine) {
        let head = self.head_hash().await;
        wait_for_tip(engine, Network::Ethereum, |tip| tip.hash == head).await;
    }
}

/// A fresh random account key on m/44'/60'/0'.
pub fn fresh_ethereum_xpub() -> String {
    SeedKeys::fresh().account_xpub()
}

/// A merchant's seed, as its own wallet holds it: the account key payrecon watches with and
/// the private keys a sweep signs with. payrecon never sees the latter.
pub struct SeedKeys {
    master: Xpriv,
}

impl SeedKeys {
    pub fn fresh() -> SeedKeys {
        let seed = [
            *uuid::Uuid::new_v4().as_bytes(),
            *uuid::Uuid::new_v4().as_bytes(),
        ]
        .concat();
        SeedKeys {
            master: Xpriv::new_master(payrecon_chain_core::bitcoin::NetworkKind::Main, &seed)
                .unwrap(),
        }
    }

    /// The account xpub of m/44'/60'/0'.
    pub fn account_xpub(&self) -> String {
        let secp = Secp256k1::new();
        let path: DerivationPath = "m/44'/60'/0'".parse().unwrap();
        Xpub::from_priv(&secp, &self.master.derive_priv(&secp, &path).unwrap()).to_string()
    }

    /// The signer of the address at `path` (as the sweep list gives it, `m/44h/60h/0h/0/i`).
    pub fn signer(&self, path: &str) -> PrivateKeySigner {
        let secp = Secp256k1::new();
        let path: DerivationPath = path.replace('h', "'").parse().unwrap();
        let key = self.master.derive_priv(&secp, &path).unwrap();
        PrivateKeySigner::from_slice(&key.private_key.secret_bytes()).unwrap()
    }
}

/// A legacy transaction signed by `signer`, encoded for `eth_sendRawTransaction`.
pub fn signed_transfer(
    signer: &PrivateKeySigner,
    nonce: u64,
    gas_price: u128,
    gas_limit: u64,
    to: &str,
    value: u128,
    input: Vec<u8>,
) -> String {
    use alloy::consensus::{SignableTransaction as _, TxEnvelope, TxLegacy};
    use alloy::eips::eip2718::Encodable2718 as _;
    use alloy::signers::SignerSync as _;
    let tx = TxLegacy {
        chain_id: Some(31337),
        nonce,
        gas_price,
        gas_limit,
        to: alloy::primitives::TxKind::Call(to.parse().unwrap()),
        value: alloy::primitives::U256::from(value),
        input: input.into(),
    };
    let signature = signer.sign_hash_sync(&tx.signature_hash()).unwrap();
    let envelope = TxEnvelope::Legacy(tx.into_signed(signature));
    format!(
        "0x{}",
        alloy::primitives::hex::encode(envelope.encoded_2718())
    )
}

/// The call data of `PayingWallet.pay(recipients, amounts)`.
pub fn paying_wallet_call(payments: &[(&str, u128)]) -> Vec<u8> {
    let word = |value: u128| format!("{value:064x}");
    let count = payments.len() as u128;
    let mut text = format!("084ce708{}{}", word(64), word(64 + 32 * (count + 1)));
    text += &word(count);
    for (to, _) in payments {
        text += &format!("{:0>64}", to.trim_start_matches("0x").to_lowercase());
    }
    text += &word(count);
    for (_, wei) in payments {
        text += &word(*wei);
    }
    alloy::primitives::hex::decode(text).unwrap()
}

/// The call data of ERC-20 `transfer(to, amount)`.
pub fn token_transfer_call(to: &str, amount: u128) -> Vec<u8> {
    let text = format!(
        "a9059cbb{:0>64}{amount:064x}",
        to.trim_start_matches("0x").to_lowercase()
    );
    alloy::primitives::hex::decode(text).unwrap()
}

/// The Ethereum network section for anvil with `tokens`.
pub fn ethereum(anvil: &Anvil, tokens: &Tokens, xpub: &str, confirmations: u32) -> EthereumConfig {
    EthereumConfig {
        xpub: xpub.to_owned(),
        chain_id: 31337,
        confirmations,
        confirmation_tiers: Vec::new(),
        usdt_contract: tokens.usdt.clone(),
        usdc_contract: tokens.usdc.clone(),
        rpc_url: Some(anvil.url.clone().into()),
        rpc_urls: Vec::new(),
        max_source_lag_blocks: 5,
        witness_urls: Vec::new(),
        witness_policy: Default::default(),
        witness_wait_seconds: 600,
        finality: EthereumFinality::Depth,
        start_block: None,
        poll_interval_ms: 50,
        timeout_ms: 30_000,
        max_answer_bytes: None,
        lookahead: 20,
        treasury_addresses: Vec::new(),
    }
}

/// An engine for ETH, USDT and USDC on anvil: ETH at 2000 USD, the stablecoins at 1, the clock
/// at the real now, moved by hand.
pub async fn eth_engine(
    db: &TestDb,
    anvil: &Anvil,
    tokens: &Tokens,
    xpub: &str,
    confirmations: u32,
) -> (Engine, Arc<ManualClock>) {
    eth_engine_of(db, eth_config(ethereum(anvil, tokens, xpub, confirmations))).await
}

/// The configuration [`eth_engine`] runs with, for `section`.
pub fn eth_config(section: EthereumConfig) -> Config {
    super::payments::config(|config: &mut Config| {
        config.payments.enabled_methods = vec![Method::Eth, Method::UsdtErc20, Method::UsdcErc20];
        config.networks.ethereum = Some(section);
    })
}

/// [`eth_engine`] with a configuration of its caller's.
pub async fn eth_engine_of(db: &TestDb, config: Config) -> (Engine, Arc<ManualClock>) {
    let (engine, clock) = super::payments::engine_with_prices(
        db,
        config,
        &[(Asset::Eth, "2000"), (Asset::Usdt, "1"), (Asset::Usdc, "1")],
    )
    .await;
    clock.advance(chrono::Utc::now() - super::payments::start_time());
    (engine, clock)
}

/// Scanner settings for anvil at `url` with `tokens`, starting at `start_block` without a cursor.
pub fn scanner_settings(url: &str, tokens: &Tokens, start_block: u64) -> EthereumSettings {
    let mut settings = EthereumSettings::new(
        url,
        31337,
        tokens.usdt.parse().unwrap(),
        tokens.usdc.parse().unwrap(),
    );
    settings.start_block = Some(start_block);
    settings
}

/// Starts the Ethereum watcher of `engine`; without a cursor yet it scans from `start_block`.
pub fn watch_ethereum(
    engine: &Engine,
    anvil: &Anvil,
    tokens: &Tokens,
    start_block: u64,
) -> Running {
    watch_ethereum_with(
        engine,
        scanner_settings(&anvil.url, tokens, start_block),
        fast(),
    )
}

/// Starts the Ethereum watcher of `engine` with these settings and options.
pub fn watch_ethereum_with(
    engine: &Engine,
    settings: EthereumSettings,
    options: WatcherOptions,
) -> Running {
    Running::spawn(engine, EthereumScanner::new(settings), options)
}

/// What [`RpcProxy`] did.
#[derive(Default)]
pub struct ProxyCounts {
    /// Requests received.
    pub requests: AtomicUsize,
    /// Requests forwarded to anvil.
    pub forwarded: AtomicUsize,
    /// `eth_getLogs` calls refused as spanning too many blocks.
    pub refused_ranges: AtomicUsize,
    /// Requests answered with HTTP 429.
    pub rate_limited: AtomicUsize,
}

/// A JSON-RPC proxy in front of anvil that behaves like a hosted node: it refuses
/// `eth_getLogs` over more than `max_log_blocks` blocks (-32005, as Infura and Alchemy do) and
/// answers every `rate_limit_every`-th request with HTTP 429.
pub struct RpcProxy {
    pub url: String,
    pub counts: Arc<ProxyCounts>,
    /// While set, the proxy answers `eth_getLogs` and `eth_getBlockReceipts` with `[]`, as a
    /// backend behind a provider's load balancer that lags the others does.
    pub empty_logs: Arc<std::sync::atomic::AtomicBool>,
    /// While set, the proxy answers every request with HTTP 502, as a provider in an outage.
    pub down: Arc<std::sync::atomic::AtomicBool>,
    /// The proxy's head is this many blocks behind anvil's, as a provider's lagging backend.
    pub lag_blocks: Arc<std::sync::atomic::AtomicU64>,
    /// Transactions the proxy knows nothing of (receipt and transaction answered `null`), as
    /// an honest node answers about a payment another source invented.
    pub unknown_txs: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// While not 0, the chain id the proxy answers, as a node of another chain would.
    pub chain_id: Arc<std::sync::atomic::AtomicU64>,
}

impl RpcProxy {
    pub async fn start(upstream: &str, max_log_blocks: u64, rate_limit_every: usize) -> RpcProxy {
        let counts = Arc::new(ProxyCounts::default());
        let empty_logs = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let lag_blocks = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let unknown_txs = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
        let chain_id = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let state = (
            upstream.to_owned(),
            reqwest::Client::new(),
            counts.clone(),
            (
                empty_logs.clone(),
                down.clone(),
                lag_blocks.clone(),
                unknown_txs.clone(),
                chain_id.clone(),
            ),
        );
        let app =
            axum::Router::new().fallback(axum::routing::post(move |body: axum::body::Bytes| {
                proxy(state.clone(), body, max_log_blocks, rate_limit_every)
            }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        RpcProxy {
            url,
            counts,
            empty_logs,
            down,
            lag_blocks,
            unknown_txs,
            chain_id,
        }
    }
}

type ProxyState = (
    String,
    reqwest::Client,
    Arc<ProxyCounts>,
    (
        Arc<std::sync::atomic::AtomicBool>,
        Arc<std::sync::atomic::AtomicBool>,
        Arc<std::sync::atomic::AtomicU64>,
        Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
        Arc<std::sync::atomic::AtomicU64>,
    ),
);

async fn proxy(
    (upstream, http, counts, (empty_logs, down, lag_blocks, unknown_txs, chain_id)): ProxyState,
    body: axum::body::Bytes,
    max_log_blocks: u64,
    rate_limit_every: usize,
) -> axum::response::Response<axum::body::Body> {
    use axum::response::IntoResponse;
    let seen = counts.requests.fetch_add(1, Ordering::SeqCst);
    if down.load(Ordering::SeqCst) {
        return (axum::http::StatusCode::BAD_GATEWAY, "Bad Gateway").into_response();
    }
    if rate_limit_every > 0 && seen % rate_limit_every == rate_limit_every - 1 {
        counts.rate_limited.fetch_add(1, Ordering::SeqCst);
        return (
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "0")],
            "Too Many Requests",
        )
            .into_response();
    }
    let request: Value = serde_json::from_slice(&body).unwrap();
    if empty_logs.load(Ordering::SeqCst)
        && (request["method"] == "eth_getLogs" || request["method"] == "eth_getBlockReceipts")
    {
        let empty = json!({"jsonrpc": "2.0", "id": request["id"], "result": []});
        return ([("content-type", "application/json")], empty.to_string()).into_response();
    }
    let other_chain = chain_id.load(Ordering::SeqCst);
    if other_chain > 0 && request["method"] == "eth_chainId" {
        let id =
            json!({"jsonrpc": "2.0", "id": request["id"], "result": format!("0x{other_chain:x}")});
        return ([("content-type", "application/json")], id.to_string()).into_response();
    }
    let asks_about_tx = request["method"] == "eth_getTransactionReceipt"
        || request["method"] == "eth_getTransactionByHash";
    if asks_about_tx
        && let Some(hash) = request["params"][0].as_str()
        && unknown_txs.lock().unwrap().contains(&hash.to_lowercase())
    {
        let unknown = json!({"jsonrpc": "2.0", "id": request["id"], "result": null});
        return ([("content-type", "application/json")], unknown.to_string()).into_response();
    }
    if request["method"] == "eth_getLogs" {
        let filter = &request["params"][0];
        let number = |v: &Value| {
            u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
        };
        let span = number(&filter["toBlock"]) - number(&filter["fromBlock"]) + 1;
        if span > max_log_blocks {
            counts.refused_ranges.fetch_add(1, Ordering::SeqCst);
            let error = json!({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32005, "message": format!("query exceeds max block range {max_log_blocks}")}});
            return ([("content-type", "application/json")], error.to_string()).into_response();
        }
    }
    counts.forwarded.fetch_add(1, Ordering::SeqCst);
    let answer = post_json(http.post(&upstream), body).await;
    let lag = lag_blocks.load(Ordering::SeqCst);
    if lag > 0 && request["method"] == "eth_blockNumber" {
        let mut lagging: Value = serde_json::from_slice(&answer).unwrap();
        let head = u64::from_str_radix(
            lagging["result"].as_str().unwrap().trim_start_matches("0x"),
            16,
        )
        .unwrap();
        lagging["result"] = json!(format!("0x{:x}", head.saturating_sub(lag)));
        return ([("content-type", "application/json")], lagging.to_string()).into_response();
    }
    ([("content-type", "application/json")], answer).into_response()
}
