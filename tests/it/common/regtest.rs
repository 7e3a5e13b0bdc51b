//! Test support for the Litecoin regtest node behind ElectrumX (scripts/devnet.sh).
//!
//! Tests that mine, reorg or replace transactions change what every other test would see, so
//! each holds a chain of its own ([`Chain::lock`]) for its whole run. scripts/devnet.sh starts
//! several independent chains (lanes), each a node with its own ElectrumX; a test takes a free
//! one, or waits for one. Every test derives its addresses below a fresh random account key, so
//! no test sees another's payments even on a chain used before.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use payrecon::Engine;
use payrecon::config::{Config, UtxoConfig};
use payrecon::test_utils::clock::ManualClock;
use payrecon::test_utils::watcher::{Watcher, WatcherOptions};
use payrecon_chain_bitcoin::{
    ElectrumScanner, ElectrumSettings, NodeAuth, NodeScanner, NodeSettings, UtxoChain, UtxoNetwork,
    UtxoTarget,
};
use payrecon_chain_core::bitcoin::bip32::{DerivationPath, Xpriv, Xpub};
use payrecon_chain_core::bitcoin::secp256k1::Secp256k1;
use payrecon_chain_core::{Asset, ChainScanner, Method, Network};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, SemaphorePermit, watch};
use tokio::task::JoinHandle;

use super::{TestDb, post_json};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests with scripts/test.sh, which starts the regtest node and ElectrumX (scripts/devnet.sh up)")
    })
}

/// One chain of the devnet: its node's RPC and P2P, and its Electrum server.
#[derive(Clone, Debug)]
struct Lane {
    index: usize,
    rpc_url: String,
    p2p_peer: String,
    electrum_url: String,
}

/// The chains no test holds, and a permit per chain.
struct Lanes {
    free: std::sync::Mutex<Vec<Lane>>,
    permits: Semaphore,
}

/// The devnet's chains, from the comma-separated lists scripts/devnet.sh prints.
fn lanes() -> &'static Lanes {
    static LANES: std::sync::OnceLock<Lanes> = std::sync::OnceLock::new();
    LANES.get_or_init(|| {
        let list = |name| -> Vec<String> { env(name).split(',').map(str::to_owned).collect() };
        let (rpc, p2p, electrum) = (
            list("PAYRECON_TEST_LTC_RPC"),
            list("PAYRECON_TEST_LTC_P2P"),
            list("PAYRECON_TEST_ELECTRUM"),
        );
        assert!(
            rpc.len() == p2p.len() && rpc.len() == electrum.len(),
            "PAYRECON_TEST_LTC_RPC, PAYRECON_TEST_LTC_P2P and PAYRECON_TEST_ELECTRUM list as many chains each"
        );
        let free: Vec<Lane> = (0..rpc.len())
            .rev()
            .map(|index| Lane {
                index,
                rpc_url: rpc[index].clone(),
                p2p_peer: p2p[index].clone(),
                electrum_url: electrum[index].clone(),
            })
            .collect();
        Lanes {
            permits: Semaphore::new(free.len()),
            free: std::sync::Mutex::new(free),
        }
    })
}

/// The regtest node, its miner wallet and the Electrum server in front of it.
pub struct Chain {
    http: reqwest::Client,
    /// The node's JSON-RPC, with its user and password.
    pub rpc_url: String,
    /// The node's P2P `host:port`.
    pub p2p_peer: String,
    pub electrum_url: String,
    /// The devnet lane, for scripts/devnet.sh (`DEVNET_LANE`).
    pub lane: usize,
    _permit: SemaphorePermit<'static>,
}

impl Drop for Chain {
    fn drop(&mut self) {
        let lane = Lane {
            index: self.lane,
            rpc_url: self.rpc_url.clone(),
            p2p_peer: self.p2p_peer.clone(),
            electrum_url: self.electrum_url.clone(),
        };
        // Back on the free list before the permit goes, so the next holder finds it there.
        lanes().free.lock().expect("never poisoned").push(lane);
    }
}

impl Chain {
    /// Exclusive use of one chain for one test: a free one, or the next one freed.
    pub async fn lock() -> Chain {
        init_logs();
        let lanes = lanes();
        let permit = lanes.permits.acquire().await.expect("never closed");
        let lane = lanes
            .free
            .lock()
            .expect("never poisoned")
            .pop()
            .expect("a permit is held for every free chain");
        Chain {
            // The devnet's nodes close idle RPC connections after 5 s (scripts/devnet.sh).
            http: reqwest::Client::builder()
                .pool_idle_timeout(Duration::from_secs(4))
                .build()
                .expect("HTTP client"),
            rpc_url: lane.rpc_url,
            p2p_peer: lane.p2p_peer,
            electrum_url: lane.electrum_url,
            lane: lane.index,
            _permit: permit,
        }
    }

    /// scripts/devnet.sh acting on this test's chain.
    pub fn devnet(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(env("PAYRECON_TEST_DEVNET"));
        command.env("DEVNET_LANE", self.lane.to_string());
        command
    }

    /// A JSON-RPC call to the node (`wallet` routes it to the miner wallet).
    pub async fn call(&self, wallet: bool, method: &str, params: Value) -> Value {
        self.call_wallet(if wallet { "miner" } else { "" }, method, params)
            .await
    }

    /// A JSON-RPC call routed to the node's wallet `wallet` (none when empty).
    pub async fn call_wallet(&self, wallet: &str, method: &str, params: Value) -> Value {
        let url = if wallet.is_empty() {
            self.rpc_url.clone()
        } else {
            format!("{}/wallet/{wallet}", self.rpc_url)
        };
        let (user_pass, host) = url
            .strip_prefix("http://")
            .and_then(|rest| rest.split_once('@'))
            .expect("rpc url http://user:pass@host");
        let (user, pass) = user_pass.split_once(':').expect("user:pass");
        let request = self
            .http
            .post(format!("http://{host}"))
            .basic_auth(user, Some(pass));
        let body = json!({"jsonrpc": "1.0", "id": "t", "method": method, "params": params});
        let response: Value = serde_json::from_slice(&post_json(request, body.to_string()).await)
            .expect("node answers JSON");
        if !response["error"].is_null() {
            panic!("{method} {params}: {}", response["error"]);
        }
        response["result"].clone()
    }

    pub async fn height(&self) -> u64 {
        self.call(false, "getblockcount", json!([]))
            .await
            .as_u64()
            .unwrap()
    }

    pub async fn best_hash(&self) -> String {
        self.call(false, "getbestblockhash", json!([]))
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// A fresh address of the miner wallet.
    pub async fn wallet_address(&self) -> String {
        self.call(true, "getnewaddress", json!(["", "bech32"]))
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Mines `n` blocks to a fresh wallet address; returns the new height.
    /// Returns once the lane's ElectrumX has reached the new height too, so that a check which
    /// reads the server at once (an audit, a verification) sees the blocks just mined. (A block
    /// that replaces the tip at the same height reaches ElectrumX only with the next one: it
    /// follows the node's height.)
    pub async fn mine(&self, n: u64) -> u64 {
        let to = self.wallet_address().await;
        self.call(true, "generatetoaddress", json!([n, to])).await;
        let height = self.height().await;
        eventually("the lane's ElectrumX to reach the new height", || async {
            electrum_tip_height(&self.electrum_url).await >= Some(height)
        })
        .await;
        height
    }

    /// Hashes of the blocks mined by the last `mine`-like call, from the tip down.
    pub async fn block_hash(&self, height: u64) -> String {
        self.call(false, "getblockhash", json!([height]))
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Sends `amount` LTC (a decimal string) to `address`, opting into replacement.
    pub async fn send(&self, address: &str, amount: &str) -> String {
        self.call(
            true,
            "sendtoaddress",
            json!([address, amount, "", "", false, true]),
        )
        .await
        .as_str()
        .unwrap()
        .to_owned()
    }

    /// Pays `amount` LTC (a decimal string) to `address` from the devnet's `mweb` wallet, which
    /// holds MWEB coins only (scripts/devnet.sh): a peg-out, which reaches the address as an
    /// output of the next block's HogEx transaction. Returns the MWEB transaction's id, which
    /// no block lists.
    pub async fn send_from_mweb(&self, address: &str, amount: &str) -> String {
        self.call_wallet("mweb", "sendtoaddress", json!([address, amount]))
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// A fresh MWEB address (`tmweb1…`) of the devnet's `mweb` wallet.
    pub async fn mweb_address(&self) -> String {
        self.call_wallet("mweb", "getnewaddress", json!(["", "mweb"]))
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// One transaction paying every `(address, amount)`.
    pub async fn send_many(&self, outputs: &[(&str, &str)]) -> String {
        let map: serde_json::Map<String, Value> = outputs
            .iter()
            .map(|(a, v)| ((*a).to_owned(), json!(v)))
            .collect();
        self.call(true, "sendmany", json!(["", map]))
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Funds, signs and sends a transaction with exactly these outputs (several to one
    /// address allowed, which `sendmany` refuses).
    pub async fn send_outputs(&self, outputs: &[(&str, u64)]) -> String {
        use payrecon_chain_core::bitcoin::{Amount, TxOut, consensus};
        let outputs: Vec<TxOut> = outputs
            .iter()
            .map(|(address, sats)| TxOut {
                value: Amount::from_sat(*sats),
                script_pubkey: payrecon_chain_bitcoin::script_pubkey(address).unwrap(),
            })
            .collect();
        // Version 2, no inputs, the outputs, lock time 0, in the legacy layout: rust-bitcoin
        // writes an input-less transaction with a segwit marker, which the node refuses.
        let unfunded = format!(
            "0200000000{}00000000",
            consensus::encode::serialize_hex(&outputs)
        );
        let funded = self
            .call(true, "fundrawtransaction", json!([unfunded]))
            .await;
        self.sign_and_send(funded["hex"].as_str().unwrap()).await
    }

    async fn sign_and_send(&self, hex: &str) -> String {
        let signed = self
            .call(true, "signrawtransactionwithwallet", json!([hex]))
            .await;
        assert_eq!(signed["complete"], json!(true), "{signed}");
        self.call(false, "sendrawtransaction", json!([signed["hex"]]))
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// A confirmed wallet coin of exactly `amount` LTC, for building conflicting spends.
    pub async fn coin(&self, amount: &str) -> (String, u32) {
        let address = self.wallet_address().await;
        let txid = self.send(&address, amount).await;
        self.mine(1).await;
        let unspent = self
            .call(true, "listunspent", json!([1, 9_999_999, [address]]))
            .await;
        let coin = &unspent[0];
        assert_eq!(coin["txid"], json!(txid));
        (txid, coin["vout"].as_u64().unwrap() as u32)
    }

    /// Spends `coin` entirely to `address` minus `fee` (decimal strings), signalling
    /// replaceability: two calls with the same coin conflict, the higher fee wins.
    pub async fn spend_coin(
        &self,
        coin: &(String, u32),
        address: &str,
        amount: &str,
        change: &str,
    ) -> String {
        let change_address = self.wallet_address().await;
        let raw = self
            .call(
                false,
                "createrawtransaction",
                json!([
                    [{"txid": coin.0, "vout": coin.1}],
                    [{address: amount}, {change_address: change}],
                    0,
                    true
                ]),
            )
            .await;
        self.sign_and_send(raw.as_str().unwrap()).await
    }

    /// A new wallet of the node holding the merchant's private keys for the receive addresses
    /// at `range` (inclusive), their history rescanned: it signs as the merchant's own wallet
    /// would. Unload it when done.
    pub async fn seed_wallet(&self, key: &MerchantKey, range: [u32; 2]) -> String {
        use payrecon_chain_core::bitcoin::bip32::DerivationPath;
        let secp = Secp256k1::new();
        let path: DerivationPath = "m/84'/2'/0'".parse().unwrap();
        let account = key.master.derive_priv(&secp, &path).unwrap();
        let wallet = format!("seed-{}", uuid::Uuid::new_v4().simple());
        self.call(false, "createwallet", json!([wallet])).await;
        let descriptor = format!("wpkh({account}/0/*)");
        let info = self
            .call(false, "getdescriptorinfo", json!([descriptor]))
            .await;
        let imported = self
            .call_wallet(
                &wallet,
                "importmulti",
                json!([[{
                    "desc": format!("{descriptor}#{}", info["checksum"].as_str().unwrap()),
                    "timestamp": 0, "range": range, "internal": false, "keypool": false,
                }], {"rescan": true}]),
            )
            .await;
        assert_eq!(imported[0]["success"], json!(true), "{imported}");
        wallet
    }

    /// What a watch-only wallet of the node holds, confirmed and mature, in litoshi, given the
    /// descriptors of `export`. Debian's litecoind is built without SQLite, so it has no
    /// descriptor wallets and no `importdescriptors`; its legacy wallets import the same
    /// descriptors, checksums and ranges through `importmulti`, watch-only.
    pub async fn watch_only_holds(&self, export: &payrecon::WalletExport) -> u64 {
        let wallet = format!("watch-{}", uuid::Uuid::new_v4().simple());
        self.call(
            false,
            "createwallet",
            json!([wallet, true, true, "", false, false]),
        )
        .await;
        let import = |descriptor: &str, internal: bool| {
            json!({
                "desc": descriptor, "timestamp": 0, "range": export.import_range,
                "watchonly": true, "internal": internal, "keypool": false,
            })
        };
        let imported = self
            .call_wallet(
                &wallet,
                "importmulti",
                json!([[
                    import(&export.receive_descriptor, false),
                    import(&export.change_descriptor, true),
                ], {"rescan": true}]),
            )
            .await;
        assert!(
            imported
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["success"] == json!(true)),
            "{imported}"
        );
        let balances = self.call_wallet(&wallet, "getbalances", json!([])).await;
        self.call(false, "unloadwallet", json!([wallet])).await;
        let trusted = payrecon_chain_core::Amount::from_decimal_str(
            &balances["watchonly"]["trusted"].to_string(),
            8,
        )
        .unwrap();
        u64::try_from(trusted.base_units()).unwrap()
    }

    /// Stops the node and starts it again on the same chain (scripts/devnet.sh node-restart).
    pub async fn restart_node(&self) {
        let status = self
            .devnet()
            .arg("node-restart")
            .status()
            .await
            .expect("scripts/devnet.sh runs");
        assert!(status.success(), "the node restarts");
    }

    /// Takes the block at `height` and everything above it out of the active chain.
    pub async fn invalidate(&self, height: u64) {
        let hash = self.block_hash(height).await;
        self.call(false, "invalidateblock", json!([hash])).await;
    }

    /// Waits until the engine's watcher has committed the node's current tip.
    pub async fn wait_synced(&self, engine: &Engine, network: Network) {
        let best = self.best_hash().await;
        wait_for_tip(engine, network, |tip| tip.hash == best).await;
    }
}

/// Waits until the engine's watcher of `network` has committed a tip that `reached` accepts.
pub async fn wait_for_tip(
    engine: &Engine,
    network: Network,
    reached: impl Fn(&payrecon_chain_core::BlockId) -> bool,
) {
    eventually(
        &format!("the {network} watcher to reach the node's head"),
        || async {
            engine
                .watcher_cursor(network)
                .await
                .unwrap()
                .is_some_and(|cursor| reached(&cursor.tip))
        },
    )
    .await;
}

/// The height of the tip the Electrum server at `url` has indexed, read as `payrecon doctor`
/// reads it, or `None` while it cannot say.
async fn electrum_tip_height(url: &str) -> Option<u64> {
    let mut scanner = ElectrumScanner::new(ElectrumSettings::new(url, litecoin_regtest()));
    scanner.probe().await.ok().map(|probe| probe.tip_height)
}

/// Sends the engine's logs to the test output (shown for failing tests).
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PAYRECON_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .try_init();
}

/// Waits up to a minute for `condition`; a liveness bound, not a performance check.
pub async fn eventually<F, Fut>(what: &str, condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_within(what, Duration::from_secs(60), condition).await;
}

/// Waits up to `bound` for `condition`, for what the code under test may rightly delay longer
/// than a minute; a liveness bound too.
pub async fn eventually_within<F, Fut>(what: &str, bound: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !condition().await {
        assert!(start.elapsed() < bound, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fresh random account key on m/84'/2'/0': no other test or run derives its addresses.
pub fn fresh_account_xpub() -> String {
    fresh_merchant_key().account_xpub
}

/// A merchant's seed for one test: the master key a wallet signs with, and what payrecon is
/// given (the account xpub on m/84'/2'/0' and its key origin).
pub struct MerchantKey {
    pub master: Xpriv,
    pub account_xpub: String,
    /// `[fingerprint/84h/2h/0h]`.
    pub origin: String,
}

/// A fresh random merchant seed.
pub fn fresh_merchant_key() -> MerchantKey {
    let secp = Secp256k1::new();
    let seed: [u8; 32] = *uuid::Uuid::new_v4()
        .as_bytes()
        .repeat(2)
        .first_chunk()
        .unwrap();
    let master = Xpriv::new_master(payrecon_chain_core::bitcoin::NetworkKind::Test, &seed).unwrap();
    let path: DerivationPath = "m/84'/2'/0'".parse().unwrap();
    let account = master.derive_priv(&secp, &path).unwrap();
    MerchantKey {
        account_xpub: Xpub::from_priv(&secp, &account).to_string(),
        origin: format!("[{}/84h/2h/0h]", master.fingerprint(&secp)),
        master,
    }
}

/// The Litecoin regtest network section, with a fresh key and `confirmations`.
pub fn litecoin(xpub: &str, electrum_url: &str, confirmations: u32) -> UtxoConfig {
    UtxoConfig {
        electrum_url: Some(electrum_url.into()),
        poll_interval_ms: 50,
        ..UtxoConfig::new(xpub, "regtest", confirmations)
    }
}

/// An engine for LTC on regtest with a fresh key: LTC at 100 USD, the clock at the real now
/// (block times are real), moved by hand.
pub async fn ltc_engine(
    db: &TestDb,
    chain: &Chain,
    confirmations: u32,
    xpub: &str,
    tweak: impl FnOnce(&mut Config),
) -> (Engine, Arc<ManualClock>) {
    let config = super::payments::config(|config| {
        config.payments.enabled_methods = vec![Method::Ltc];
        config.networks.litecoin = Some(litecoin(xpub, &chain.electrum_url, confirmations));
        tweak(config);
    });
    let (engine, clock) =
        super::payments::engine_with_prices(db, config, &[(Asset::Ltc, "100")]).await;
    clock.advance(chrono::Utc::now() - super::payments::start_time());
    (engine, clock)
}

/// Fast polling for tests.
pub fn fast() -> WatcherOptions {
    WatcherOptions {
        poll_interval: Duration::from_millis(50),
        min_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(500),
        min_restart: Duration::from_millis(500),
        max_restart: Duration::from_secs(2),
        scan_deadline: Duration::from_secs(120),
        shutdown_grace: Duration::from_secs(5),
    }
}

/// A running watcher and the switch that stops it.
pub struct Running {
    pub task: JoinHandle<Result<(), payrecon::Error>>,
    pub stop: watch::Sender<bool>,
    pub status: watch::Receiver<payrecon::test_utils::watcher::WatcherStatus>,
}

impl Running {
    /// Starts a watcher of `engine` over `scanner`.
    pub fn spawn<S: ChainScanner + 'static>(
        engine: &Engine,
        scanner: S,
        options: WatcherOptions,
    ) -> Running {
        let watcher = Watcher::new(engine.clone(), scanner, options);
        let status = watcher.status();
        let (stop, shutdown) = watch::channel(false);
        Running {
            task: tokio::spawn(watcher.run(shutdown)),
            stop,
            status,
        }
    }

    /// Waits until a round that began after this call has committed, so its view carries
    /// what was done before: a scan already under way read the engine's clock before the test
    /// moved it, and would date a payment it finds next by that old clock.
    pub async fn next_round(&self) {
        let mut status = self.status.clone();
        status.borrow_and_update();
        for _ in 0..2 {
            tokio::time::timeout(Duration::from_secs(60), status.changed())
                .await
                .expect("the watcher completes rounds")
                .expect("the watcher runs");
        }
    }

    /// Asks the watcher to stop and waits for it.
    pub async fn stop(self) -> Result<(), payrecon::Error> {
        let _ = self.stop.send(true);
        self.task.await.expect("watcher task")
    }
}

/// The regtest chain as both scanners must find it.
pub fn litecoin_regtest() -> UtxoTarget {
    UtxoTarget::new(UtxoChain::Litecoin, UtxoNetwork::Regtest)
}

/// Starts the Litecoin watcher of `engine` against the Electrum server at `url`.
pub fn watch_litecoin(engine: &Engine, url: &str) -> Running {
    watch(engine, ElectrumSettings::new(url, litecoin_regtest()))
}

/// Where a Litecoin watcher reads the chain: every regtest scenario runs on both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// ElectrumX in front of the node.
    Electrum,
    /// The node's own RPC, with its P2P announcements.
    Node,
}

impl Source {
    /// The full-node scanner's settings for the regtest node at `rpc_url`.
    pub fn node_settings(chain: &Chain, rpc_url: &str) -> NodeSettings {
        let mut settings = NodeSettings::new(rpc_url, NodeAuth::None, litecoin_regtest());
        settings.push_peer = Some(chain.p2p_peer.clone());
        settings
    }

    /// Starts the Litecoin watcher of `engine` on this source.
    pub fn watch(self, engine: &Engine, chain: &Chain) -> Running {
        match self {
            Source::Electrum => watch_litecoin(engine, &chain.electrum_url),
            Source::Node => Running::spawn(
                engine,
                NodeScanner::new(Source::node_settings(chain, &chain.rpc_url)),
                fast(),
            ),
        }
    }

    /// The Litecoin configuration section reading from this source.
    pub fn config(self, xpub: &str, chain: &Chain, confirmations: u32) -> UtxoConfig {
        match self {
            Source::Electrum => litecoin(xpub, &chain.electrum_url, confirmations),
            Source::Node => UtxoConfig {
                rpc_url: Some(chain.rpc_url.clone().into()),
                push_peer: Some(chain.p2p_peer.clone()),
                poll_interval_ms: 50,
                ..UtxoConfig::new(xpub, "regtest", confirmations)
            },
        }
    }
}

/// Starts a watcher with these scanner settings.
pub fn watch(engine: &Engine, settings: ElectrumSettings) -> Running {
    Running::spawn(engine, ElectrumScanner::new(settings), fast())
}
