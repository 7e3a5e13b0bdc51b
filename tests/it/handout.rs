//! Addresses from several processes on one PostgreSQL database, against the Litecoin regtest
//! node behind ElectrumX: two `payrecon serve` processes create 2,000 payment intents at once
//! over HTTP while a third dies (a crash point, as `kill -9` would stop it) right after it took
//! a block of indexes it never used. No address goes out twice; the dead process's unused
//! indexes stay watched, so money paid there is found; and Litecoin Core, importing the
//! descriptors `wallet export` gives, finds a payment to the last address handed out past
//! that gap.

use crate::common;

use std::collections::HashSet;

use common::regtest::{Chain, eventually};
use common::serve::{ServeConfig, free_port};
use common::{Db, TestDb};
use payrecon::{Engine, IntentStatus, PaymentSettings};
use payrecon_chain_core::Network;
use serde_json::{Value, json};

const INTENTS: usize = 2_000;
const CALLERS_PER_SERVER: usize = 16;

/// A handed-out address: (intent id, derivation index, address).
type HandedOut = (String, u32, String);

/// Creates payment instructions for each of `references` on the server at `base`, from
/// `callers` concurrent clients. With `until_gone`, stops at the first refused connection
/// (the server died) instead of failing.
async fn create_intents(
    base: String,
    token: String,
    references: Vec<String>,
    callers: usize,
    until_gone: bool,
) -> Vec<HandedOut> {
    let http = reqwest::Client::new();
    let queue = std::sync::Arc::new(std::sync::Mutex::new(references));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..callers {
        let (http, base, token, queue) = (http.clone(), base.clone(), token.clone(), queue.clone());
        tasks.spawn(async move {
            let mut made = Vec::new();
            loop {
                let Some(reference) = queue.lock().unwrap().pop() else {
                    return made;
                };
                let answer = http
                    .post(format!("{base}/v1/payments"))
                    .bearer_auth(&token)
                    .json(&json!({"order": reference, "method": "ltc"}))
                    .send()
                    .await;
                let answer = match answer {
                    Err(_) if until_gone => return made,
                    other => other.unwrap(),
                };
                assert!(
                    answer.status().is_success(),
                    "{reference}: {:?}",
                    answer.text().await
                );
                let body: Value = answer.json().await.unwrap();
                made.push((
                    body["id"].as_str().unwrap().to_owned(),
                    u32::try_from(body["derivation_index"].as_u64().unwrap()).unwrap(),
                    body["pay_to"].as_str().unwrap().to_owned(),
                ));
            }
        });
    }
    let mut made = Vec::new();
    while let Some(done) = tasks.join_next().await {
        made.extend(done.unwrap());
    }
    made
}

/// 100 USD top-ups `{prefix}{i}` for customer 42, created through the library.
async fn topups(engine: &Engine, prefix: &str, count: usize) -> Vec<String> {
    let references: Vec<String> = (0..count).map(|i| format!("{prefix}{i}")).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in references.chunks(count.div_ceil(32)) {
        let (engine, chunk) = (engine.clone(), chunk.to_vec());
        tasks.spawn(async move {
            for reference in chunk {
                engine
                    .create_topup(&common::topup(&reference, "42", "100"))
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    references
}

async fn ready(base: &str) {
    eventually("payrecon serve to answer", || async {
        reqwest::get(format!("{base}/ready"))
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_processes_one_killed_holding_a_block_hand_out_no_address_twice_and_lose_no_payment()
{
    let chain = Chain::lock().await;
    let db = TestDb::new(Db::Postgres).await;
    let config = ServeConfig::litecoin(&chain.electrum_url, "[serve]\nlease_seconds = 2\n")
        .on_database(&db.url);
    let loaded = payrecon::Config::load(Some(&config.path)).unwrap();
    let engine = Engine::from_config(&loaded).await.unwrap();
    let token = config.cli(&["token", "create", "--name", "shop", "--role", "shop"])["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let orders = topups(&engine, "H", INTENTS).await;
    let doomed_orders = topups(&engine, "K", 50).await;

    // The third process dies right after committing its second block, taken ahead of need
    // while it still handed out its first.
    let doomed_port = free_port();
    let doomed = config.serve_http(
        doomed_port,
        &[("PAYRECON_CRASH_AT", "indexes.after_block:2")],
    );
    let doomed_base = format!("http://127.0.0.1:{doomed_port}");
    ready(&doomed_base).await;
    let doomed_made = create_intents(doomed_base, token.clone(), doomed_orders, 1, true).await;
    assert!(
        !doomed.exited().await.success(),
        "the crash point ended the process"
    );
    assert!(!doomed_made.is_empty());

    // Two processes at once, each with half of the intents.
    let ports = [free_port(), free_port()];
    let servers: Vec<_> = ports
        .iter()
        .map(|port| config.serve_http(*port, &[]))
        .collect();
    for port in ports {
        ready(&format!("http://127.0.0.1:{port}")).await;
    }
    let (first_half, second_half) = orders.split_at(INTENTS / 2);
    let (a, b) = tokio::join!(
        create_intents(
            format!("http://127.0.0.1:{}", ports[0]),
            token.clone(),
            first_half.to_vec(),
            CALLERS_PER_SERVER,
            false
        ),
        create_intents(
            format!("http://127.0.0.1:{}", ports[1]),
            token.clone(),
            second_half.to_vec(),
            CALLERS_PER_SERVER,
            false
        ),
    );
    let handed_out: Vec<HandedOut> = doomed_made.iter().chain(&a).chain(&b).cloned().collect();
    assert_eq!(a.len() + b.len(), INTENTS);
    let addresses: HashSet<&str> = handed_out
        .iter()
        .map(|(_, _, address)| address.as_str())
        .collect();
    let indexes: HashSet<u32> = handed_out.iter().map(|(_, index, _)| *index).collect();
    assert_eq!(
        addresses.len(),
        handed_out.len(),
        "no address went out twice"
    );
    assert_eq!(indexes.len(), handed_out.len(), "no index went out twice");

    // The dead process's block left indexes nobody was given: a payment to one is found.
    let highest = handed_out
        .iter()
        .max_by_key(|(_, index, _)| *index)
        .unwrap()
        .clone();
    let unused: Vec<u32> = (0..highest.1).filter(|i| !indexes.contains(i)).collect();
    assert!(!unused.is_empty(), "the dead process's block left a gap");
    let settings = PaymentSettings::from_config(&loaded).unwrap();
    let deriver = settings.derivers[&Network::Litecoin].clone();
    let stray = deriver.derive(unused[0]).unwrap().address;
    chain.send(&stray, "0.5").await;
    chain.send(&highest.2, "1").await;
    chain.mine(1).await;
    eventually("the last address's intent to settle", || async {
        engine.payment(&highest.0).await.unwrap().intent.status == IntentStatus::Settled
    })
    .await;
    eventually("the payment to the unused index to be found", || async {
        engine.exceptions(None).await.unwrap().iter().any(|e| {
            e.kind == "unmatched"
                && e.detail.contains(&stray)
                && e.detail.contains(&format!("index {}", unused[0]))
        })
    })
    .await;

    // Litecoin Core, given the exported descriptors, finds both, past the gap.
    let export = engine.wallet_export(Network::Litecoin).await.unwrap();
    assert_eq!(export.highest_index, Some(highest.1));
    assert!(export.import_range[1] >= highest.1);
    assert_eq!(chain.watch_only_holds(&export).await, 150_000_000);
    let holdings = engine
        .holdings(
            Some(Network::Litecoin),
            payrecon::HoldingsSort::Index,
            false,
            0,
            10,
        )
        .await
        .unwrap();
    assert_eq!(holdings.totals[0].amount, "150000000");
    // The servers are killed when dropped: their clean shutdown is the subject of `edge` and
    // `durability`, not of this test.
    drop(servers);
}
