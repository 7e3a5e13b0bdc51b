//! The edge that faces the world, against real `payrecon serve` processes: webhook receivers
//! that hang or redirect, the signature and docs/shop.md's verification of it, SIGTERM with live
//! statuses open, the stream caps, a provider key planted in every URL, and nodes that never
//! answer or answer without end, for a full node, Electrum, Ethereum and Tron.
//!
//! Nothing here waits on wall time to decide: each check is of what happened (which endpoint
//! holds which delivery, how the process exited, what the memory holds), with liveness bounds.

use crate::common;

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::regtest::{eventually, eventually_within};
use common::serve::{ServeConfig, free_port, serving};
use payrecon::{SIGNATURE_HEADER, SIGNATURE_TOLERANCE, verify_signature};
use serde_json::Value;
use tokio::net::TcpListener;

/// A provider key, planted in every URL of one test: it must appear in no output.
const PLANTED: &str = "SECRETKEY4711";

/// One delivery as a receiver saw it.
#[derive(Clone, Debug)]
struct Delivery {
    signature: String,
    body: String,
}

/// A webhook receiver on loopback answering every delivery with `status` (and `location`).
async fn receiver(status: u16, location: Option<String>) -> (String, Arc<Mutex<Vec<Delivery>>>) {
    let received = Arc::new(Mutex::new(Vec::new()));
    let seen = received.clone();
    let app = axum::Router::new().fallback(
        move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let (seen, location) = (seen.clone(), location.clone());
            async move {
                seen.lock().unwrap().push(Delivery {
                    signature: headers
                        .get(SIGNATURE_HEADER)
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default(),
                    body: String::from_utf8(body.to_vec()).unwrap(),
                });
                let mut response = axum::response::Response::new(axum::body::Body::empty());
                *response.status_mut() = axum::http::StatusCode::from_u16(status).unwrap();
                if let Some(location) = location {
                    response
                        .headers_mut()
                        .insert("location", location.parse().unwrap());
                }
                response
            }
        },
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, received)
}

/// A server that accepts every connection and never answers; it counts the connections.
async fn silent_server() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    (address, connections)
}

fn webhook(name: &str, url: &str, timeout_ms: u32) -> String {
    format!(
        "[[webhooks]]\nname = \"{name}\"\nurl = \"{url}\"\nsecret = \"{SECRET}\"\ntimeout_ms = {timeout_ms}\n"
    )
}

const SECRET: &str = "a-very-secret-webhook-key";

/// What `payrecon stuck` lists.
fn stuck(config: &ServeConfig) -> Vec<Value> {
    config.cli(&["stuck"]).as_array().unwrap().clone()
}

fn stuck_webhook<'a>(items: &'a [Value], endpoint: &str) -> Option<&'a Value> {
    items
        .iter()
        .find(|i| i["category"] == "webhook" && i["subject"] == endpoint)
}

/// Runs docs/shop.md's webhook verification (the Python between its markers) on `delivery` at each
/// of `nows`.
fn readme_verifies(delivery: &Delivery, nows: &[i64]) -> Vec<bool> {
    let readme = include_str!("../../docs/shop.md");
    let block = readme
        .split("<!-- webhook-verify:start -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- webhook-verify:end -->").next())
        .expect("docs/shop.md shows the verification between its markers");
    let code = block
        .trim()
        .trim_start_matches("```python")
        .trim_end_matches("```");
    let driver = format!(
        "{code}\nimport json, sys\nargs = json.load(sys.stdin)\n\
         print(json.dumps([verify(args['secret'], args['header'], args['body'].encode(), now=n) for n in args['nows']]))\n"
    );
    let mut python = std::process::Command::new("python3")
        .args(["-c", &driver])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs the guide's snippet");
    let input = serde_json::json!({
        "secret": SECRET, "header": delivery.signature, "body": delivery.body, "nows": nows,
    });
    python
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let output = python.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_webhook_receiver_delays_no_other_and_the_signature_is_timestamped() {
    let (hung, held) = silent_server().await;
    let (healthy, received) = receiver(200, None).await;
    // The hung endpoint's timeout is a minute: had the lanes been one, the healthy endpoint
    // would get nothing before that minute passed.
    let hooks = webhook("hung", &format!("http://{hung}/hook"), 60_000)
        + &webhook("healthy", &healthy, 1000);
    let (config, serving, _) = serving("", &hooks).await;
    let intents = config.topups(3, "ltc");
    eventually(
        "the healthy endpoint to receive every intent's first event",
        || async {
            let got = received.lock().unwrap().clone();
            intents.iter().all(|(intent, _)| {
                got.iter()
                    .any(|d| d.body.contains(intent) && d.body.contains("intent_created"))
            })
        },
    )
    .await;
    // All of it while the hung endpoint still holds its first delivery: no attempt of it has
    // ended (it would show as failing), and it holds exactly the one connection.
    assert!(
        stuck_webhook(&stuck(&config), "hung").is_none(),
        "the hung endpoint's first attempt is still in flight"
    );
    assert_eq!(
        held.load(Ordering::SeqCst),
        1,
        "one delivery at a time per endpoint"
    );

    // Every delivery is signed over its timestamp and body.
    let deliveries = received.lock().unwrap().clone();
    let now = chrono::Utc::now().timestamp();
    for delivery in &deliveries {
        assert_eq!(
            verify_signature(
                SECRET,
                &delivery.signature,
                delivery.body.as_bytes(),
                now,
                SIGNATURE_TOLERANCE
            ),
            Ok(()),
            "{delivery:?}"
        );
    }
    // docs/shop.md's verification accepts a fresh one, and refuses it once outside the tolerance,
    // and a body changed by a byte.
    let delivery = &deliveries[0];
    let signed_at: i64 = delivery
        .signature
        .split(',')
        .next()
        .unwrap()
        .trim_start_matches("t=")
        .parse()
        .unwrap();
    assert_eq!(
        readme_verifies(
            delivery,
            &[signed_at + 10, signed_at + 301, signed_at - 301]
        ),
        [true, false, false]
    );
    let tampered = Delivery {
        body: delivery.body.replacen('1', "2", 1),
        ..delivery.clone()
    };
    assert_eq!(readme_verifies(&tampered, &[signed_at]), [false]);
    serving.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redirect_is_a_failure_and_its_target_receives_nothing() {
    let (target, reached) = receiver(200, None).await;
    let (redirector, asked) = receiver(307, Some(target.clone())).await;
    let (config, serving, _) = serving("", &webhook("shop", &redirector, 1000)).await;
    config.topups(1, "ltc");
    eventually("the redirect to show as a failing endpoint", || async {
        stuck_webhook(&stuck(&config), "shop")
            .is_some_and(|item| item["what"].as_str().unwrap().contains("redirect"))
    })
    .await;
    assert!(!asked.lock().unwrap().is_empty(), "the receiver was asked");
    assert!(
        reached.lock().unwrap().is_empty(),
        "the redirect's target received nothing"
    );
    serving.stop().await;
}

/// Opens the live status of `path` from `local`; the response once its headers came.
async fn open_stream(base: &str, path: &str, local: IpAddr) -> reqwest::Response {
    reqwest::Client::builder()
        .local_address(local)
        .build()
        .unwrap()
        .get(format!("{base}{path}/events"))
        .send()
        .await
        .unwrap()
}

fn checkout_path(config: &ServeConfig, intent: &str) -> String {
    config.cli(&["pay", "show", intent])["checkout_path"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_with_live_statuses_open_exits_cleanly_before_its_deadline() {
    // A deadline far beyond what a clean shutdown takes: exiting at it is a failure (exit 1).
    let (config, serving, base) = serving("", "[serve]\nshutdown_seconds = 60\n").await;
    let (intent, _) = config.topup_and_pay("ltc");
    let path = checkout_path(&config, &intent);
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut stream = open_stream(&base, &path, "127.0.0.1".parse().unwrap()).await;
        assert_eq!(stream.status(), 200);
        let first = stream.chunk().await.unwrap().unwrap();
        assert!(String::from_utf8_lossy(&first).contains("event: status"));
        streams.push(stream);
    }
    let exit = serving.terminate().await;
    assert!(
        exit.success(),
        "serve drained and exited by itself, not at its deadline: {exit:?}"
    );
    for mut stream in streams {
        // The stream ended: what is left is at most a keep-alive, then the end.
        while let Ok(Some(_)) = stream.chunk().await {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_statuses_past_their_caps_are_refused_at_once() {
    let caps = "max_streams = 3\nmax_streams_per_client = 2\n";
    let (config, serving, base) = serving(caps, "").await;
    let (intent, _) = config.topup_and_pay("ltc");
    let path = checkout_path(&config, &intent);
    let one: IpAddr = "127.0.0.1".parse().unwrap();
    let two: IpAddr = "127.0.0.2".parse().unwrap();
    let three: IpAddr = "127.0.0.3".parse().unwrap();
    let a = open_stream(&base, &path, one).await;
    let b = open_stream(&base, &path, one).await;
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    let refused = open_stream(&base, &path, one).await;
    assert_eq!(refused.status(), 429, "a third from one client");
    assert!(refused.headers().contains_key("retry-after"));
    let c = open_stream(&base, &path, two).await;
    assert_eq!(c.status(), 200);
    let full = open_stream(&base, &path, three).await;
    assert_eq!(full.status(), 503, "a fourth in all");
    drop(c);
    eventually("a place to free up", || async {
        open_stream(&base, &path, three).await.status() == 200
    })
    .await;
    // The page carries what its script shows when the live status is refused.
    let page = reqwest::get(format!("{base}{path}"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("id=\"live-paused\""), "{page}");
    drop((a, b));
    serving.stop().await;
}

/// What the misbehaving node in front of a real one does with each new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Accepts and never answers.
    Silent,
    /// Answers with an HTTP head, or nothing for a line protocol, then bytes without end and
    /// without a newline.
    Endless { http: bool },
    /// Passes the bytes through to the real node.
    Forward,
}

/// A node that misbehaves as told, then behaves: a TCP server in front of `upstream`.
struct Misbehaving {
    address: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    /// Bytes of endless answers sent.
    sent: Arc<std::sync::atomic::AtomicU64>,
}

impl Misbehaving {
    async fn start(upstream: SocketAddr, mode: Mode) -> Misbehaving {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mode = Arc::new(Mutex::new(mode));
        let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (now, counted) = (mode.clone(), sent.clone());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                let mode = *now.lock().unwrap();
                match mode {
                    Mode::Silent => held.push(socket),
                    Mode::Endless { http } => {
                        tokio::spawn(endless(socket, http, counted.clone()));
                    }
                    Mode::Forward => {
                        tokio::spawn(async move {
                            let mut socket = socket;
                            let Ok(mut node) = tokio::net::TcpStream::connect(upstream).await
                            else {
                                return;
                            };
                            let _ = tokio::io::copy_bidirectional(&mut socket, &mut node).await;
                        });
                    }
                }
            }
        });
        Misbehaving {
            address,
            mode,
            sent,
        }
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }
}

async fn endless(
    mut socket: tokio::net::TcpStream,
    http: bool,
    sent: Arc<std::sync::atomic::AtomicU64>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut request = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(200), socket.read(&mut request)).await;
    if http {
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n[";
        if socket.write_all(head.as_bytes()).await.is_err() {
            return;
        }
    }
    let chunk = vec![b'7'; 64 * 1024];
    while socket.write_all(&chunk).await.is_ok() {
        sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
}

use std::time::Duration;

/// The first of a comma-separated list of URLs in `variable`, as host and port.
fn upstream_of(variable: &str) -> (String, SocketAddr) {
    let list = std::env::var(variable)
        .unwrap_or_else(|_| panic!("{variable} is not set: run the tests with scripts/test.sh"));
    let url = list.split(',').next().unwrap().to_owned();
    let authority = url.split("://").nth(1).unwrap().split('/').next().unwrap();
    let host_port = authority.rsplit('@').next().unwrap();
    (url.clone(), host_port.parse().unwrap())
}

/// The address of a fake node at `http://host:port`.
fn socket_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

/// The watcher row of `network` in `payrecon stuck`, if any.
fn stuck_watcher(config: &ServeConfig, network: &str) -> Option<Value> {
    stuck(config)
        .into_iter()
        .find(|i| i["category"] == "watcher" && i["subject"] == network)
}

/// A node of `network` that first never answers, then answers without end, then behaves: the
/// watcher retries through the first two with its memory flat, and runs again after.
async fn misbehaving_node(
    network: &str,
    source_key: &str,
    upstream: SocketAddr,
    url_of: impl Fn(SocketAddr) -> String,
    http: bool,
    section: String,
) {
    let node = Misbehaving::start(upstream, Mode::Silent).await;
    let limits = format!(
        "{source_key} = \"{}\"\ntimeout_ms = 1000\nmax_answer_bytes = 1048576\npoll_interval_ms = 100\n",
        url_of(node.address)
    );
    let config = ServeConfig::new(
        &[],
        "{}",
        &format!("[serve]\nscan_deadline_seconds = 8\n{section}{limits}"),
    );
    let serving = config.serve();
    eventually(
        &format!("the {network} watcher to retry a node that never answers"),
        || async { stuck_watcher(&config, network).is_some_and(|item| item["kind"] == "retrying") },
    )
    .await;

    node.set(Mode::Endless { http });
    let before = serving.resident_bytes();
    eventually(
        &format!("the {network} watcher to refuse an endless answer"),
        || async {
            node.sent.load(Ordering::Relaxed) > 4 << 20
                && stuck_watcher(&config, network).is_some_and(|item| {
                    let what = item["what"].as_str().unwrap_or_default();
                    what.contains("larger than") || what.contains("line of more than")
                })
        },
    )
    .await;
    let after = serving.resident_bytes();
    assert!(
        after < before + (64 << 20),
        "{network}: memory stays flat while the node sent {} MiB: {} MiB, then {} MiB",
        node.sent.load(Ordering::Relaxed) >> 20,
        before >> 20,
        after >> 20
    );

    // A watcher that failed often waits out its longest backoff, a minute, before it tries
    // again: how many failures the endless phase took depends on the machine's load.
    node.set(Mode::Forward);
    eventually_within(
        &format!("the {network} watcher to run again once the node behaves"),
        Duration::from_secs(180),
        || async { stuck_watcher(&config, network).is_none() },
    )
    .await;
    serving.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_node_that_hangs_or_answers_without_end_is_retried_with_memory_flat() {
    let (rpc, upstream) = upstream_of("PAYRECON_TEST_LTC_RPC");
    let credentials = rpc
        .split("://")
        .nth(1)
        .unwrap()
        .split('@')
        .next()
        .unwrap()
        .to_owned();
    let section = format!(
        "[networks.litecoin]\nxpub = \"{}\"\nnetwork = \"regtest\"\nconfirmations = 1\n",
        common::regtest::fresh_account_xpub()
    );
    misbehaving_node(
        "litecoin",
        "rpc_url",
        upstream,
        |a| format!("http://{credentials}@{a}"),
        true,
        section,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_electrum_server_that_hangs_or_sends_an_endless_line_is_retried_with_memory_flat() {
    let (_, upstream) = upstream_of("PAYRECON_TEST_ELECTRUM");
    let section = format!(
        "[networks.litecoin]\nxpub = \"{}\"\nnetwork = \"regtest\"\nconfirmations = 1\n",
        common::regtest::fresh_account_xpub()
    );
    misbehaving_node(
        "litecoin",
        "electrum_url",
        upstream,
        |a| format!("tcp://{a}"),
        false,
        section,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ethereum_node_that_hangs_or_answers_without_end_is_retried_with_memory_flat() {
    let (_, upstream) = upstream_of("PAYRECON_TEST_ETH_RPC");
    let section = format!(
        "[networks.ethereum]\nxpub = \"{}\"\nchain_id = 31337\nconfirmations = 1\n",
        common::anvil::fresh_ethereum_xpub()
    );
    misbehaving_node(
        "ethereum",
        "rpc_url",
        upstream,
        |a| format!("http://{a}"),
        true,
        section,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tron_node_that_hangs_or_answers_without_end_is_retried_with_memory_flat() {
    let fake = payrecon_chain_tron::testkit::FakeTron::start(100).await;
    let upstream = socket_of(&fake.url);
    let section = format!(
        "[networks.tron]\nxpub = \"{}\"\nconfirmations = 1\nusdt_contract = \"{}\"\n",
        common::tron::fresh_tron_xpub(),
        common::tron::USDT
    );
    misbehaving_node(
        "tron",
        "api_url",
        upstream,
        |a| format!("http://{a}"),
        true,
        section,
    )
    .await;
    drop(fake);
}

/// A provider key in every URL that can carry one (path, query, userinfo; every network, the
/// webhook, both rate sources) reaches no log line, no stuck view, no metric, no health row and
/// no CLI output, while every one of those clients fails and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_planted_provider_key_appears_in_no_output() {
    let unreachable = "127.0.0.1:1";
    let port = free_port();
    let metrics_token = "metrics-token-for-the-test";
    let networks = format!(
        "[http]\nlisten = \"127.0.0.1:{port}\"\nmetrics_token = \"{metrics_token}\"\n\
         {hook}\
         [networks.bitcoin]\nxpub = \"{btc}\"\nnetwork = \"regtest\"\nconfirmations = 1\n\
         electrum_url = \"tcp://{PLANTED}@{unreachable}\"\ntimeout_ms = 500\n\
         [networks.litecoin]\nxpub = \"{ltc}\"\nnetwork = \"regtest\"\nconfirmations = 1\n\
         rpc_url = \"http://rpc:{PLANTED}@{unreachable}/wallet/{PLANTED}\"\ntimeout_ms = 500\n\
         [networks.ethereum]\nxpub = \"{eth}\"\nchain_id = 31337\nconfirmations = 1\n\
         rpc_url = \"http://{unreachable}/v3/{PLANTED}\"\ntimeout_ms = 500\n\
         [networks.tron]\nxpub = \"{trx}\"\nconfirmations = 1\nusdt_contract = \"{usdt}\"\n\
         api_url = \"http://{unreachable}/{PLANTED}?apikey={PLANTED}\"\napi_key = \"{PLANTED}\"\ntimeout_ms = 500\n\
         [networks.solana]\nrecipient = \"{sol}\"\nconfirmations = 1\n\
         rpc_url = \"http://{unreachable}/?api-key={PLANTED}\"\ntimeout_ms = 500\n",
        hook = webhook(
            "shop",
            &format!("http://{unreachable}/hook/{PLANTED}?token={PLANTED}"),
            500
        ),
        btc = common::regtest::fresh_account_xpub(),
        ltc = common::regtest::fresh_account_xpub(),
        eth = common::anvil::fresh_ethereum_xpub(),
        trx = common::tron::fresh_tron_xpub(),
        usdt = common::tron::USDT,
        sol = "BPFLoaderUpgradeab1e11111111111111111111111",
    );
    let config = ServeConfig::new(&["ltc"], r#"{"LTC":"100"}"#, &networks);
    // Both live rate sources carry the key too; the recorded file keeps payments possible.
    config.rewrite(|text| {
        text.replace(
            "sources = [\"recorded\"]",
            &format!(
                "sources = [\"recorded\", \"coingecko\", \"kraken\"]\n\
                 coingecko_url = \"http://{unreachable}/api/{PLANTED}?x_cg_pro_api_key={PLANTED}\"\n\
                 kraken_url = \"http://{unreachable}/{PLANTED}\""
            ),
        )
    });
    let log = config.dir().join("serve.log");
    let serving = config.serve_logged(&log);
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    eventually("payrecon serve to answer", || async {
        http.get(format!("{base}/health"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    let operator = config.cli(&["token", "create", "--name", "ops", "--role", "operator"])["token"]
        .as_str()
        .unwrap()
        .to_owned();
    config.topups(1, "ltc");
    let networks = ["bitcoin", "litecoin", "ethereum", "tron", "solana"];
    eventually(
        "every watcher to fail and the webhook with them",
        || async {
            let items = stuck(&config);
            networks.iter().all(|n| {
                items.iter().any(|i| {
                    i["category"] == "watcher" && i["subject"] == *n && i["kind"] != "silent"
                })
            }) && stuck_webhook(&items, "shop").is_some()
        },
    )
    .await;

    let mut outputs = vec![
        (
            "GET /v1/stuck",
            http.get(format!("{base}/v1/stuck"))
                .bearer_auth(&operator)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        ),
        (
            "GET /metrics",
            http.get(format!("{base}/metrics"))
                .bearer_auth(metrics_token)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        ),
        ("payrecon stuck --json", config.cli(&["stuck"]).to_string()),
        (
            "payrecon webhook status --json",
            config.cli(&["webhook", "status"]).to_string(),
        ),
    ];
    let run = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_payrecon"))
            .arg("--config")
            .arg(&config.path)
            .args(args)
            .output()
            .unwrap();
        let (out, err) = (output.stdout, output.stderr);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&err)
        )
    };
    outputs.push(("payrecon stuck", run(&["stuck"])));
    outputs.push(("a second payrecon serve, refused", run(&["serve"])));
    assert_eq!(
        http.get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .status(),
        401,
        "the metrics token is asked for"
    );
    serving.stop().await;
    let logged = std::fs::read_to_string(&log).unwrap();
    outputs.push(("the log", logged.clone()));

    for network in networks {
        assert!(
            logged.contains(&format!("network={network}"))
                && logged.contains("watcher round failed"),
            "the {network} watcher's failures are logged: the check is not empty"
        );
    }
    assert!(
        outputs[0].1.contains("***"),
        "the stuck view names the sources, hidden: {}",
        outputs[0].1
    );
    for (what, text) in &outputs {
        assert!(
            !text.contains(PLANTED),
            "the key leaked into {what}:\n{text}"
        );
    }
}

/// The API served with `limits` over a fresh SQLite engine; its address.
async fn api_with(
    limits: payrecon::test_utils::api::ServerLimits,
) -> (common::TestDb, tokio::sync::watch::Sender<bool>, SocketAddr) {
    let db = common::TestDb::new(common::Db::Sqlite).await;
    let engine = db.engine().await;
    let (stop, address) = common::serve_api(&engine, payrecon::ApiOptions::default(), limits).await;
    (db, stop, address)
}

/// Reads until the server closes the connection; what it sent.
async fn until_closed(socket: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut all = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), socket.read_to_end(&mut all)).await;
    read.expect("the server closes the connection").unwrap();
    String::from_utf8_lossy(&all).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_or_silent_client_is_cut_off_and_connections_are_capped() {
    use tokio::io::AsyncWriteExt;
    let limits = payrecon::test_utils::api::ServerLimits {
        // Long beside the 300 ms the capped connection is watched for below.
        header_read_timeout: Duration::from_secs(2),
        max_connections: 1,
        drain: Duration::from_secs(1),
    };
    let (_db, _stop, address) = api_with(limits).await;
    // Silent: connected, says nothing. Slow: half a request head, never finished.
    let mut silent = tokio::net::TcpStream::connect(address).await.unwrap();
    until_closed(&mut silent).await;
    let mut slow = tokio::net::TcpStream::connect(address).await.unwrap();
    slow.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    until_closed(&mut slow).await;
    // Idle after an answer: the kept-alive connection is closed too.
    let mut idle = tokio::net::TcpStream::connect(address).await.unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let answered = until_closed(&mut idle).await;
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");

    // One connection at a time: a second waits, unanswered, until the first is gone.
    let mut first = tokio::net::TcpStream::connect(address).await.unwrap();
    first
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let mut second = tokio::net::TcpStream::connect(address).await.unwrap();
    second
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    let waiting = tokio::time::timeout(
        Duration::from_millis(300),
        tokio::io::AsyncReadExt::read(&mut second, &mut byte),
    )
    .await;
    assert!(
        waiting.is_err(),
        "the second connection is not served while the first holds the only place"
    );
    drop(first);
    let answered = until_closed(&mut second).await;
    assert!(
        answered.starts_with("HTTP/1.1 200"),
        "served once the first is gone: {answered}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_solana_node_that_hangs_or_answers_without_end_is_retried_with_memory_flat() {
    let fake = payrecon_chain_solana::testkit::FakeSolana::start().await;
    let upstream = socket_of(&fake.url);
    let section = format!(
        "[networks.solana]\nrecipient = \"{}\"\nconfirmations = 1\n",
        payrecon_chain_solana::testkit::random_pubkey()
    );
    let url_of = |a| format!("http://{a}");
    misbehaving_node("solana", "rpc_url", upstream, url_of, true, section).await;
    drop(fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_on_a_listener_of_their_own_count_the_api_s_live_statuses() {
    let metrics_port = free_port();
    let http =
        format!("metrics_listen = \"127.0.0.1:{metrics_port}\"\nmetrics_token = \"scrape\"\n");
    let (config, serving, base) = serving(&http, "").await;
    let (intent, _) = config.topup_and_pay("ltc");
    let path = checkout_path(&config, &intent);
    let mut stream = open_stream(&base, &path, "127.0.0.1".parse().unwrap()).await;
    assert_eq!(stream.status(), 200);
    stream.chunk().await.unwrap();
    let client = reqwest::Client::new();
    let scraped = client
        .get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .bearer_auth("scrape")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        scraped.contains("payrecon_live_statuses_open 1"),
        "{scraped}"
    );
    let public = client.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(public.status(), 404, "not on the public address");
    drop(stream);
    serving.stop().await;
}
