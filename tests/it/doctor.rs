//! `payrecon doctor` against the devnet: a Litecoin regtest node through ElectrumX and through
//! its RPC, anvil with a deployed 6-decimal USDT, the recorded rates and a webhook endpoint.
//! The right configuration is all ok; a wrong chain id, a token address without a contract, a
//! test-network key on a mainnet configuration and a stopped node each give their own fail
//! line and a non-zero exit.

use std::process::Command;

use crate::common;
use common::anvil::{Anvil, RpcProxy};
use common::regtest::{Chain, fresh_account_xpub};

/// The devnet's configuration for `chain` and `anvil`, USDT at `usdt`, the database in `dir`.
fn config(chain: &Chain, anvil: &Anvil, usdt: &str, dir: &std::path::Path) -> String {
    format!(
        r#"
database_url = "sqlite://{db}"

[payments]
enabled_methods = ["ltc", "eth", "usdt-erc20"]

[rates]
sources = ["recorded"]
recorded_quotes_file = "{fixtures}/rates/recorded-quotes.json"
max_age_seconds = 315360000

[[webhooks]]
name = "shop"
url = "https://localhost:8443/payrecon"
secret = "a webhook secret of the shop"

[networks.litecoin]
xpub = "{ltc_xpub}"
network = "regtest"
confirmations = 2
electrum_url = "{electrum}"

[networks.ethereum]
xpub = "xpub6DCoCpSuQZB2jawqnGMEPS63ePKWkwWPH4TU45Q7LPXWuNd8TMtVxRrgjtEshuqpK3mdhaWHPFsBngh5GFZaM6si3yZdUsT8ddYM3PwnATt"
chain_id = 31337
confirmations = 2
rpc_url = "{eth}"
usdt_contract = "{usdt}"
"#,
        db = dir.join("doctor.db").display(),
        fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures"),
        ltc_xpub = fresh_account_xpub(),
        electrum = chain.electrum_url,
        eth = anvil.url,
    )
}

/// `payrecon doctor --json` on `text`: its exit status and each check's (name, verdict, detail).
fn doctor(dir: &std::path::Path, text: &str) -> (bool, Vec<(String, String, String)>) {
    let file = dir.join("payrecon.toml");
    std::fs::write(&file, text).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_payrecon"))
        .arg("--config")
        .arg(&file)
        .args(["--json", "doctor"])
        .output()
        .unwrap();
    let checks: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)));
    let checks = checks
        .iter()
        .map(|c| {
            let text = |key: &str| c[key].as_str().unwrap().to_owned();
            (text("check"), text("verdict"), text("detail"))
        })
        .collect();
    (output.status.success(), checks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_doctor_passes_the_devnet_and_names_each_broken_configuration() {
    let chain = Chain::lock().await;
    let anvil = Anvil::lock().await;
    let tokens = anvil.tokens().await;
    let dir = tempfile::tempdir().unwrap();
    let good = config(&chain, &anvil, &tokens.usdt, dir.path());

    let (passed, checks) = doctor(dir.path(), &good);
    assert!(passed, "{checks:#?}");
    let database = checks
        .iter()
        .find(|(name, _, _)| name == "database")
        .unwrap();
    assert_eq!(
        (database.1.as_str(), database.2.contains("payrecon init")),
        ("warn", true),
        "an empty database: {database:?}"
    );
    let init = Command::new(env!("CARGO_BIN_EXE_payrecon"))
        .arg("--config")
        .arg(dir.path().join("payrecon.toml"))
        .arg("init")
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let (passed, checks) = doctor(dir.path(), &good);
    assert!(passed, "{checks:#?}");
    assert!(
        checks.iter().all(|(_, verdict, _)| verdict == "ok"),
        "{checks:#?}"
    );
    let names: Vec<&str> = checks.iter().map(|(name, _, _)| name.as_str()).collect();
    for expected in [
        "database",
        "litecoin key",
        "litecoin node",
        "ethereum key",
        "ethereum node",
        "clock",
        "rates LTC",
        "rates ETH",
        "rates USDT",
        "webhook shop",
    ] {
        assert!(names.contains(&expected), "{expected} in {names:?}");
    }
    // The node APIs the Ethereum scanner needs beyond the standard calls, all served by anvil.
    for api in [
        "eth_getBlockReceipts",
        "eth_call of creation code",
        "a tracer",
    ] {
        assert!(
            checks
                .iter()
                .any(|(name, verdict, _)| name.contains(api) && verdict == "ok"),
            "{api} in {checks:#?}"
        );
    }
    let usdt_check = format!("usdt-erc20 usdt contract {}", tokens.usdt.to_lowercase());
    assert!(
        checks
            .iter()
            .any(|(name, verdict, detail)| name.to_lowercase() == usdt_check
                && verdict == "ok"
                && detail.contains("6 decimals")),
        "{checks:#?}"
    );

    // Through the node's own RPC as well.
    let through_node = good.replace(
        &format!("electrum_url = \"{}\"", chain.electrum_url),
        &format!("rpc_url = \"{}\"", chain.rpc_url),
    );
    let (passed, checks) = doctor(dir.path(), &through_node);
    assert!(passed, "{checks:#?}");

    // Two sources for Ethereum: each is checked, and whether they keep within the lag.
    let eth_line = format!("rpc_url = \"{}\"", anvil.url);
    let backup = anvil.url.replace("127.0.0.1", "localhost");
    let two = good.replace(&eth_line, &format!("{eth_line}\nrpc_urls = [\"{backup}\"]"));
    let (passed, checks) = doctor(dir.path(), &two);
    assert!(passed, "{checks:#?}");
    for (name, says) in [
        (
            format!("ethereum source 2 of 2 ({backup})"),
            "serves the configured chain",
        ),
        (
            "ethereum sources".to_owned(),
            "2 of them answer on the configured chain",
        ),
    ] {
        assert!(
            checks
                .iter()
                .any(|(n, verdict, detail)| *n == name && verdict == "ok" && detail.contains(says)),
            "{name} in {checks:#?}"
        );
    }

    // A witness: checked as a source is, and said to be asked about each receipt.
    let witness = RpcProxy::start(&anvil.url, 10_000, 0).await;
    let witnessed = good.replace(
        &eth_line,
        &format!("{eth_line}\nwitness_urls = [\"{}\"]", witness.url),
    );
    let (passed, checks) = doctor(dir.path(), &witnessed);
    assert!(passed, "{checks:#?}");
    let name = format!("ethereum witness 1 of 1 ({})", witness.url);
    assert!(
        checks.iter().any(|(n, verdict, detail)| *n == name
            && verdict == "ok"
            && detail.contains("asked about each receipt")),
        "{name} in {checks:#?}"
    );
    let other_chain = RpcProxy::start(&anvil.url, 10_000, 0).await;
    other_chain
        .chain_id
        .store(1, std::sync::atomic::Ordering::SeqCst);

    let broken = [
        (
            "a witness on another chain",
            good.replace(
                &eth_line,
                &format!("{eth_line}\nwitness_urls = [\"{}\"]", other_chain.url),
            ),
            "ethereum witness 1 of 1",
            "serves another chain",
        ),
        (
            "a wrong chain id",
            good.replace("chain_id = 31337", "chain_id = 1"),
            "ethereum node",
            "serves another chain",
        ),
        (
            "a token address from elsewhere",
            good.replace(&tokens.usdt, &anvil.other),
            "usdt-erc20 USDT contract",
            "no contract at",
        ),
        (
            "a test-network key on a mainnet configuration",
            good.replace("network = \"regtest\"", "network = \"mainnet\""),
            "litecoin key",
            "on a mainnet configuration: use the account's mainnet xpub",
        ),
        (
            "a second source that is down",
            good.replace(
                &format!("rpc_url = \"{}\"", anvil.url),
                &format!(
                    "rpc_url = \"{}\"\nrpc_urls = [\"http://127.0.0.1:9\"]",
                    anvil.url
                ),
            ),
            "ethereum source 2 of 2",
            "does not answer",
        ),
        (
            "a stopped node",
            good.replace(&chain.electrum_url, "tcp://127.0.0.1:9"),
            "litecoin node",
            "does not answer",
        ),
    ];
    for (what, text, check, says) in broken {
        let (passed, checks) = doctor(dir.path(), &text);
        assert!(!passed, "{what}: the doctor exits non-zero");
        let (verdict, detail) = checks
            .iter()
            .find(|(name, _, _)| name.to_lowercase().starts_with(&check.to_lowercase()))
            .map(|(_, v, d)| (v.as_str(), d.as_str()))
            .unwrap_or_else(|| panic!("{what}: no {check} line in {checks:#?}"));
        assert_eq!(verdict, "fail", "{what}: {detail}");
        assert!(detail.contains(says), "{what}: {detail}");
    }
}
