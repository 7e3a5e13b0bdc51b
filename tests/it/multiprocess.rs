//! Several `payrecon serve` processes on one PostgreSQL database against the real nodes (three
//! against Litecoin regtest behind ElectrumX, two against anvil): each network's watcher runs
//! in one process at a time under a lease, the lease holder is killed with SIGKILL again and
//! again while payments arrive, and in the end every payment is credited exactly once. On
//! SQLite a second server is refused.

use crate::common;

use common::anvil::Anvil;
use common::regtest::{Chain, eventually};
use common::serve::{ServeConfig, Serving};
use common::{Db, TestDb};
use payrecon::Engine;
use payrecon_chain_core::Network;

const PAYMENTS: usize = 12;

/// A chain the test pays on: one top-up's worth to an address, then a block.
trait Payer {
    async fn pay(&self, address: &str);
    async fn confirm(&self);
}

impl Payer for Chain {
    async fn pay(&self, address: &str) {
        self.send(address, "1").await; // 100 USD at 100 USD per LTC
    }

    async fn confirm(&self) {
        self.mine(1).await;
    }
}

impl Payer for Anvil {
    async fn pay(&self, address: &str) {
        self.send_eth(address, 50_000_000_000_000_000).await; // 0.05 ETH, 100 USD at 2000
    }

    async fn confirm(&self) {
        self.mine(1).await;
    }
}

fn litecoin_config(chain: &Chain) -> ServeConfig {
    ServeConfig::litecoin(&chain.electrum_url, "[serve]\nlease_seconds = 2\n")
}

/// The server holding `network`'s lease now, once one holds it.
async fn holder_index(engine: &Engine, network: Network, servers: &[Serving]) -> usize {
    let started = std::time::Instant::now();
    loop {
        let holder = engine.lease_holder(network).await.unwrap();
        if let Some(index) = holder.and_then(|(name, _)| {
            servers
                .iter()
                .position(|s| name.starts_with(&format!("{}-", s.pid())))
        }) {
            return index;
        }
        assert!(started.elapsed().as_secs() < 60, "no server took the lease");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Runs `servers` processes on `config` (on PostgreSQL), pays `PAYMENTS` top-ups in four
/// batches on `chain`, and kills the lease holder after each batch, at a different point of
/// its work each time: in the middle of its scan, or once it has credited the batch. A fresh
/// server takes each killed one's place.
async fn kill_the_holder_while_paying(
    chain: &impl Payer,
    network: Network,
    method: &str,
    config: ServeConfig,
    servers: usize,
) {
    let db = TestDb::new(Db::Postgres).await;
    let config = config.on_database(&db.url);
    let intents = config.topups(PAYMENTS, method);
    let engine = Engine::open(&db.url).await.unwrap();
    let mut servers: Vec<Serving> = (0..servers).map(|_| config.serve()).collect();
    let mut tokens = Vec::new();
    for (round, batch) in intents.chunks(PAYMENTS / 4).enumerate() {
        for (_, address) in batch {
            chain.pay(address).await;
        }
        chain.confirm().await;
        if round % 2 == 1 {
            eventually("the batch to be credited", || async {
                batch
                    .iter()
                    .all(|(id, _)| config.cli(&["pay", "show", id])["status"] == "settled")
            })
            .await;
        }
        let holder = holder_index(&engine, network, &servers).await;
        tokens.push(engine.lease_holder(network).await.unwrap().unwrap().1);
        servers.remove(holder).kill9();
        servers.push(config.serve());
    }
    eventually("every payment to be credited", || async {
        intents
            .iter()
            .all(|(id, _)| config.cli(&["pay", "show", id])["status"] == "settled")
    })
    .await;
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "every takeover took a new fencing token: {tokens:?}"
    );
    assert_eq!(
        config.cli(&["balance", "42"])["available_usd"],
        "1200.00",
        "each payment credited once"
    );
    let trial = config.cli(&["ledger", "trial-balance"]);
    assert_eq!(trial["sound"], true);
    assert_eq!(
        trial["trial_balance"]["entries"], PAYMENTS,
        "one settlement entry per payment, none doubled"
    );
    for server in servers {
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_litecoin_lease_holder_of_three_loses_and_doubles_nothing() {
    let chain = Chain::lock().await;
    let config = litecoin_config(&chain);
    kill_the_holder_while_paying(&chain, Network::Litecoin, "ltc", config, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_ethereum_lease_holder_of_two_loses_and_doubles_nothing() {
    let anvil = Anvil::lock().await;
    let tokens = anvil.tokens().await;
    let config = ServeConfig::ethereum(
        &anvil.url,
        &tokens,
        anvil.head().await + 1,
        "[serve]\nlease_seconds = 2\n",
    );
    kill_the_holder_while_paying(&anvil, Network::Ethereum, "eth", config, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_server_on_one_sqlite_file_is_refused() {
    let chain = Chain::lock().await;
    let config = litecoin_config(&chain);
    config.cli(&["init"]);
    let first = config.serve();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_payrecon"))
        .arg("--config")
        .arg(&config.path)
        .arg("serve")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("another payrecon serve is running watchers")
            && stderr.contains("SQLite is single-process"),
        "{stderr}"
    );
    first.stop().await;
}
