//! A fault-injecting TCP proxy between a watcher and a real (or fake) node. It works below the
//! protocol, so the same proxy sits in front of ElectrumX's line-delimited JSON-RPC, anvil's
//! HTTP JSON-RPC and the Tron and Solana HTTP APIs, and what it does is what a bad network
//! does: it delays bytes, cuts a response short, resets the connection, or closes it before
//! the request reaches the node. Faults are drawn from a seeded generator and stop after a
//! budget, so every test run ends and a failure can be replayed from the seed it prints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::RngExt;
use proptest::test_runner::{RngAlgorithm, TestRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

/// How hostile the proxy is.
#[derive(Clone, Copy, Debug)]
pub struct FaultPlan {
    /// Replays a run exactly (the same faults on the same chunks).
    pub seed: u64,
    /// Chance, in percent, that a chunk of bytes in either direction meets a fault.
    pub percent: u32,
    /// Faults in all; after that the proxy forwards faithfully so the run can finish.
    pub budget: usize,
    /// The longest delay it holds a chunk for.
    pub max_delay: Duration,
}

impl FaultPlan {
    /// A plan seeded from the clock, printed so a failing run can be replayed with
    /// `PAYRECON_FAULT_SEED`.
    pub fn hostile(percent: u32, budget: usize) -> FaultPlan {
        let seed = std::env::var("PAYRECON_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0);
        eprintln!("fault proxy seed {seed} (PAYRECON_FAULT_SEED={seed} replays it)");
        FaultPlan {
            seed,
            percent,
            budget,
            max_delay: Duration::from_millis(400),
        }
    }
}

/// What the proxy did, so a test can show its faults were real.
#[derive(Debug, Default)]
pub struct FaultCounts {
    pub connections: AtomicUsize,
    pub delays: AtomicUsize,
    pub truncations: AtomicUsize,
    pub resets: AtomicUsize,
    pub drops: AtomicUsize,
}

impl FaultCounts {
    /// Faults that broke a connection (a delay only slows one down).
    pub fn broken(&self) -> usize {
        self.truncations.load(Ordering::SeqCst)
            + self.resets.load(Ordering::SeqCst)
            + self.drops.load(Ordering::SeqCst)
    }

    pub fn summary(&self) -> String {
        format!(
            "{} connections, {} delays, {} truncations, {} resets, {} drops",
            self.connections.load(Ordering::SeqCst),
            self.delays.load(Ordering::SeqCst),
            self.truncations.load(Ordering::SeqCst),
            self.resets.load(Ordering::SeqCst),
            self.drops.load(Ordering::SeqCst)
        )
    }
}

/// One fault, drawn per chunk.
#[derive(Clone, Copy, Debug)]
enum Fault {
    Delay(Duration),
    /// Forward half the chunk, then close both sides: a response cut short.
    Truncate,
    /// Close with RST: the peer sees "connection reset".
    Reset,
    /// Close without forwarding the chunk: a request that never arrived, a response that
    /// never came.
    Drop,
}

struct Dice {
    rng: TestRng,
    plan: FaultPlan,
    left: usize,
}

impl Dice {
    fn roll(&mut self) -> Option<Fault> {
        if self.left == 0 || self.rng.random_range(0..100) >= self.plan.percent {
            return None;
        }
        self.left -= 1;
        let max_ms = self.plan.max_delay.as_millis().max(1) as u64;
        Some(match self.rng.random_range(0..4) {
            0 => Fault::Delay(Duration::from_millis(self.rng.random_range(1..=max_ms))),
            1 => Fault::Truncate,
            2 => Fault::Reset,
            _ => Fault::Drop,
        })
    }
}

/// The proxy: listening on loopback, forwarding to `upstream`.
pub struct FaultProxy {
    pub addr: SocketAddr,
    pub counts: Arc<FaultCounts>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` (`host:port`).
    pub async fn start(upstream: &str, plan: FaultPlan) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counts = Arc::new(FaultCounts::default());
        let mut seed = [0u8; 16];
        seed[..8].copy_from_slice(&plan.seed.to_le_bytes());
        seed[8..].copy_from_slice(&plan.seed.rotate_left(32).to_le_bytes());
        let dice = Arc::new(Mutex::new(Dice {
            rng: TestRng::from_seed(RngAlgorithm::XorShift, &seed),
            plan,
            left: plan.budget,
        }));
        let upstream = upstream.to_owned();
        let task_counts = counts.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                task_counts.connections.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                tokio::spawn(relay(client, server, dice.clone(), task_counts.clone()));
            }
        });
        FaultProxy { addr, counts, task }
    }

    /// Waits until the proxy has broken one more connection than when called. Watchers
    /// poll, so one comes soon; a test calls this between its payments so that faults fall
    /// among them rather than all before or after.
    pub async fn breaks_once_more(&self) {
        let seen = self.counts.broken();
        let started = std::time::Instant::now();
        while self.counts.broken() == seen {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the proxy broke nothing for a minute: {}",
                self.counts.summary()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A proxy in front of the node at `node_url` with the plan the network-fault tests
    /// share: 15 % of chunks, 40 faults in all.
    pub async fn in_front_of(node_url: &str) -> FaultProxy {
        FaultProxy::start(&host_port(node_url), FaultPlan::hostile(15, 40)).await
    }

    /// `upstream_url` with its host and port replaced by the proxy's (credentials kept).
    pub fn url_for(&self, upstream_url: &str) -> String {
        let (scheme, rest) = upstream_url.split_once("://").expect("a URL with a scheme");
        let path = rest.find('/').map(|i| &rest[i..]).unwrap_or("");
        let authority = &rest[..rest.len() - path.len()];
        let credentials = authority
            .rsplit_once('@')
            .map_or(String::new(), |(user, _)| format!("{user}@"));
        format!("{scheme}://{credentials}{}{path}", self.addr)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `host:port` of a URL, the proxy's upstream.
/// The `host:port` of a URL, without any `user:password@`.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let authority = rest.split('/').next().unwrap();
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host)
        .to_owned()
}

/// Copies both directions, rolling the dice for every chunk. Any fault that breaks the
/// connection ends both directions at once, as a real broken link does.
async fn relay(
    client: TcpStream,
    server: TcpStream,
    dice: Arc<Mutex<Dice>>,
    counts: Arc<FaultCounts>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let outcome = tokio::select! {
        outcome = pump(&mut client_read, &mut server_write, &dice, &counts) => outcome,
        outcome = pump(&mut server_read, &mut client_write, &dice, &counts) => outcome,
    };
    if let Ok(client) = client_read.reunite(client_write) {
        if outcome == Ending::Reset {
            let _ = client.set_zero_linger();
        }
        drop(client);
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Ending {
    Closed,
    Reset,
}

async fn pump(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    dice: &Mutex<Dice>,
    counts: &FaultCounts,
) -> Ending {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return Ending::Closed,
            Ok(n) => n,
        };
        let chunk = &buffer[..read];
        let fault = dice.lock().await.roll();
        match fault {
            None => {}
            Some(Fault::Delay(pause)) => {
                counts.delays.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(pause).await;
            }
            Some(Fault::Truncate) => {
                counts.truncations.fetch_add(1, Ordering::SeqCst);
                let _ = to.write_all(&chunk[..chunk.len() / 2]).await;
                return Ending::Closed;
            }
            Some(Fault::Reset) => {
                counts.resets.fetch_add(1, Ordering::SeqCst);
                return Ending::Reset;
            }
            Some(Fault::Drop) => {
                counts.drops.fetch_add(1, Ordering::SeqCst);
                return Ending::Closed;
            }
        }
        if to.write_all(chunk).await.is_err() {
            return Ending::Closed;
        }
    }
}

/// A proxy in front of a line-delimited JSON-RPC server (ElectrumX) that rewrites what the
/// server answers: every occurrence of a text set with [`RewriteProxy::replace`] in an answer
/// line is replaced before the client reads it. The way to hand a real watcher a transaction
/// it cannot decode.
pub struct RewriteProxy {
    pub addr: SocketAddr,
    replacements: Arc<std::sync::Mutex<Vec<(String, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RewriteProxy {
    /// Starts a proxy to `upstream` (`host:port`) that rewrites nothing yet.
    pub async fn start(upstream: &str) -> RewriteProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let replacements = Arc::new(std::sync::Mutex::new(Vec::new()));
        let upstream = upstream.to_owned();
        let rules = replacements.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                tokio::spawn(rewrite_lines(client, server, rules.clone()));
            }
        });
        RewriteProxy {
            addr,
            replacements,
            task,
        }
    }

    /// From now on, `from` in an answer reads as `to`.
    pub fn replace(&self, from: &str, to: &str) {
        self.replacements
            .lock()
            .unwrap()
            .push((from.to_owned(), to.to_owned()));
    }

    /// `tcp://` URL of the proxy.
    pub fn url(&self) -> String {
        format!("tcp://{}", self.addr)
    }
}

impl Drop for RewriteProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn rewrite_lines(
    client: TcpStream,
    server: TcpStream,
    rules: Arc<std::sync::Mutex<Vec<(String, String)>>>,
) {
    use tokio::io::AsyncBufReadExt;
    let (client_read, mut client_write) = client.into_split();
    let (server_read, mut server_write) = server.into_split();
    let upstream = tokio::spawn(async move {
        let mut client_read = client_read;
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    });
    let mut lines = tokio::io::BufReader::new(server_read).lines();
    while let Ok(Some(mut line)) = lines.next_line().await {
        for (from, to) in rules.lock().unwrap().iter() {
            line = line.replace(from, to);
        }
        line.push('\n');
        if client_write.write_all(line.as_bytes()).await.is_err() {
            break;
        }
    }
    upstream.abort();
}
