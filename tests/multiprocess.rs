//! Several `payrecon serve` processes on one PostgreSQL database against the real Litecoin
//! regtest node behind ElectrumX: each network's watcher runs in one process at a time under a
//! lease, the lease holder is killed with SIGKILL again and again while payments arrive, and
//! in the end every payment is credited exactly once. On SQLite a second server is refused.

mod common;

use common::regtest::{Chain, eventually};
use common::serve::{ServeConfig, Serving};
use common::{Db, TestDb};
use payrecon::Engine;
use payrecon_chain_core::Network;

const PAYMENTS: usize = 12;
const SERVERS: usize = 3;

fn litecoin_config(chain: &Chain) -> ServeConfig {
    ServeConfig::litecoin(&chain.electrum_url, "[serve]\nlease_seconds = 2\n")
}

/// The server holding the Litecoin lease now, once one holds it.
async fn holder_index(engine: &Engine, servers: &[Serving]) -> usize {
    let started = std::time::Instant::now();
    loop {
        let holder = engine.lease_holder(Network::Litecoin).await.unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_lease_holder_again_and_again_loses_and_doubles_nothing() {
    let chain = Chain::lock().await;
    let db = TestDb::new(Db::Postgres).await;
    let config = litecoin_config(&chain).on_database(&db.url);
    let intents = config.ltc_topups(PAYMENTS);
    let engine = Engine::open(&db.url).await.unwrap();
    let mut servers: Vec<Serving> = (0..SERVERS).map(|_| config.serve()).collect();
    let mut tokens = Vec::new();
    for (round, batch) in intents.chunks(PAYMENTS / 4).enumerate() {
        for (_, address) in batch {
            chain.send(address, "1").await;
        }
        chain.mine(1).await;
        // Kill whoever holds the lease, at a different point of its work each time: in the
        // middle of its scan, or once it has credited the batch, and start a fresh server in
        // its place.
        if round % 2 == 1 {
            eventually("the batch to be credited", || async {
                batch
                    .iter()
                    .all(|(id, _)| config.cli(&["pay", "show", id])["status"] == "settled")
            })
            .await;
        }
        let holder = holder_index(&engine, &servers).await;
        tokens.push(
            engine
                .lease_holder(Network::Litecoin)
                .await
                .unwrap()
                .unwrap()
                .1,
        );
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
