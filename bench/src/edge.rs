//! The edge under load: one process serving the shop API while many checkout pages hold their
//! live status open. The streams are opened by a child process (`payrecon-bench edge-clients`), so the
//! serving process's memory and file descriptors are its own.
//!
//! Measured in one run: the shop API's p50/p95 latency without streams and with them (and
//! the ratio), the serving process's memory per stream, the database reads the streams cause
//! while nothing changes, what one change costs with every stream open, and how long a
//! shutdown with every stream open takes.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use payrecon::ApiOptions;
use payrecon::Engine;
use payrecon::Role;
use payrecon::test_utils::api::{ServerLimits, StreamLimits};
use payrecon::{OrderRef, TopupRequest};

/// What `bench edge` is asked to do.
pub(super) struct EdgePlan {
    pub streams: usize,
    pub intents: usize,
    pub requests: usize,
    pub quiet: Duration,
}

/// What it found.
#[derive(Debug, Serialize)]
pub(super) struct EdgeFigures {
    pub streams: usize,
    pub intents: usize,
    pub p50_ms_without: f64,
    pub p95_ms_without: f64,
    pub p50_ms_with: f64,
    pub p95_ms_with: f64,
    /// p95 with the streams over p95 without them.
    pub p95_ratio: f64,
    /// The serving process's resident memory grown per open stream, in KiB.
    pub kib_per_stream: f64,
    /// Over the quiet period, with every stream open and nothing changing.
    pub quiet_seconds: f64,
    pub fan_out_reads_per_second: f64,
    pub page_reads_per_second: f64,
    /// One intent marked paid with every stream open: the reads it caused.
    pub change_fan_out_reads: u64,
    pub change_page_reads: u64,
    /// From the shutdown signal to the server's end, every stream open.
    pub shutdown_ms: u128,
}

/// Creates the intents, serves the API, measures, and shuts down.
pub(super) async fn edge(engine: &Engine, plan: &EdgePlan) -> anyhow::Result<EdgeFigures> {
    raise_file_limit();
    let intents = open_intents(engine, plan.intents).await?;
    let token = engine.create_api_token("edge-bench", Role::Shop).await?;

    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let options = ApiOptions {
        streams: StreamLimits {
            max_streams: plan.streams + 1,
            max_per_client: plan.streams + 1,
            lifetime: Duration::from_secs(3600),
        },
        ..ApiOptions::default()
    };
    let routers = payrecon::test_utils::api::routers(engine.clone(), options, shutdown.clone());
    let (app, live) = (routers.api, routers.live);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let limits = ServerLimits {
        header_read_timeout: Duration::from_secs(30),
        max_connections: plan.streams + 256,
        drain: Duration::from_secs(30),
    };
    let server = tokio::spawn(payrecon::test_utils::api::serve(
        listener, app, limits, shutdown,
    ));

    let http = reqwest::Client::new();
    let without = latencies(&http, &base, &token, &intents, plan.requests).await?;

    let before = resident_kib();
    let mut clients = tokio::process::Command::new(std::env::current_exe()?)
        .args(["edge-clients", "--url", &base])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting the stream clients")?;
    let mut to_clients = clients.stdin.take().expect("piped");
    let paths: String = (0..plan.streams)
        .map(|i| format!("{}\n", intents[i % intents.len()].1))
        .collect();
    to_clients.write_all(paths.as_bytes()).await?;
    to_clients.write_all(b"\n").await?;
    let mut from_clients = BufReader::new(clients.stdout.take().expect("piped")).lines();
    let opened = from_clients
        .next_line()
        .await?
        .context("the stream clients ended early")?;
    anyhow::ensure!(
        opened.trim() == plan.streams.to_string(),
        "the clients opened {opened} streams of {}",
        plan.streams
    );
    anyhow::ensure!(
        live.open_streams() == plan.streams,
        "{} streams are open, {} were asked",
        live.open_streams(),
        plan.streams
    );
    // The first pages made the fan-out start afresh: every page looked once. Let it settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let grown = resident_kib().saturating_sub(before);

    let reads = live.reads();
    let (fan_out, pages) = (
        reads.fan_out.load(Ordering::Relaxed),
        reads.pages.load(Ordering::Relaxed),
    );
    let quiet_started = Instant::now();
    tokio::time::sleep(plan.quiet).await;
    let quiet = quiet_started.elapsed().as_secs_f64();
    let quiet_fan_out = reads.fan_out.load(Ordering::Relaxed) - fan_out;
    let quiet_pages = reads.pages.load(Ordering::Relaxed) - pages;

    let with = latencies(&http, &base, &token, &intents, plan.requests).await?;

    let (fan_out, pages) = (
        reads.fan_out.load(Ordering::Relaxed),
        reads.pages.load(Ordering::Relaxed),
    );
    engine.mark_paid(&intents[0].0).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let change_fan_out = reads.fan_out.load(Ordering::Relaxed) - fan_out;
    let change_pages = reads.pages.load(Ordering::Relaxed) - pages;

    let stopping = Instant::now();
    let _ = stop.send(true);
    server.await??;
    let shutdown_ms = stopping.elapsed().as_millis();
    drop(to_clients);
    let _ = clients.wait().await;

    let percentile = |sorted: &[f64], p: f64| sorted[((sorted.len() - 1) as f64 * p) as usize];
    let (p50_without, p95_without) = (percentile(&without, 0.5), percentile(&without, 0.95));
    let (p50_with, p95_with) = (percentile(&with, 0.5), percentile(&with, 0.95));
    Ok(EdgeFigures {
        streams: plan.streams,
        intents: plan.intents,
        p50_ms_without: p50_without,
        p95_ms_without: p95_without,
        p50_ms_with: p50_with,
        p95_ms_with: p95_with,
        p95_ratio: p95_with / p95_without,
        kib_per_stream: grown as f64 / plan.streams as f64,
        quiet_seconds: quiet,
        fan_out_reads_per_second: quiet_fan_out as f64 / quiet,
        page_reads_per_second: quiet_pages as f64 / quiet,
        change_fan_out_reads: change_fan_out,
        change_page_reads: change_pages,
        shutdown_ms,
    })
}

/// `count` top-ups with BTC instructions each: their intent ids and checkout paths.
async fn open_intents(engine: &Engine, count: usize) -> anyhow::Result<Vec<(String, String)>> {
    let mut intents = Vec::with_capacity(count);
    for i in 0..count {
        let reference = OrderRef::new(format!("edge-{i}"))?;
        engine
            .create_topup(&TopupRequest {
                reference: reference.to_string(),
                account_id: format!("edge-customer-{}", i % 100),
                amount_usd: "100".parse()?,
            })
            .await?;
        let pay = engine
            .create_payment(&reference, payrecon_chain_core::Method::Btc)
            .await?;
        intents.push((pay.intent.id.clone(), pay.checkout_path.clone()));
    }
    Ok(intents)
}

/// The shop API's answer times, sorted, in milliseconds: `requests` reads of payments.
async fn latencies(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    intents: &[(String, String)],
    requests: usize,
) -> anyhow::Result<Vec<f64>> {
    let mut times = Vec::with_capacity(requests);
    for i in 0..requests {
        let (intent, _) = &intents[i % intents.len()];
        let started = Instant::now();
        let response = http
            .get(format!("{base}/v1/payments/{intent}"))
            .bearer_auth(token)
            .send()
            .await?;
        anyhow::ensure!(response.status().is_success(), "{}", response.status());
        response.bytes().await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// The child process of the bench: reads checkout paths from stdin until an empty line, opens
/// each one's live status against `base` and reads its first event, prints how many are open,
/// and holds them until stdin closes.
pub(super) async fn clients(base: &str) -> anyhow::Result<()> {
    raise_file_limit();
    let address = base.trim_start_matches("http://").to_owned();
    let mut paths = Vec::new();
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = stdin.next_line().await? {
        if line.is_empty() {
            break;
        }
        paths.push(line);
    }
    let mut streams = Vec::with_capacity(paths.len());
    for chunk in paths.chunks(256) {
        let mut opening = tokio::task::JoinSet::new();
        for path in chunk {
            let (address, path) = (address.clone(), path.clone());
            opening.spawn(async move { open(&address, &path).await });
        }
        while let Some(opened) = opening.join_next().await {
            streams.push(opened??);
        }
    }
    let mut stdout = tokio::io::stdout();
    stdout
        .write_all(format!("{}\n", streams.len()).as_bytes())
        .await?;
    stdout.flush().await?;
    // Hold every stream until the bench is done with them.
    let _ = stdin.next_line().await;
    drop(streams);
    Ok(())
}

/// One live status, opened and past its first event.
async fn open(address: &str, path: &str) -> anyhow::Result<tokio::net::TcpStream> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let request =
        format!("GET {path}/events HTTP/1.1\r\nhost: bench\r\naccept: text/event-stream\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("event: status") {
        let n = stream.read(&mut buffer).await?;
        anyhow::ensure!(
            n > 0,
            "the server closed a live status before its first event"
        );
        seen.extend_from_slice(&buffer[..n]);
        anyhow::ensure!(
            seen.starts_with(b"HTTP/1.1 200"),
            "a live status was refused: {}",
            String::from_utf8_lossy(&seen)
                .lines()
                .next()
                .unwrap_or_default()
        );
    }
    Ok(stream)
}

/// This process's resident memory, in KiB (Linux).
fn resident_kib() -> u64 {
    super::memory_kib("VmRSS:").unwrap_or(0)
}

/// Raises the open-file limit to its hard limit: a stream is a socket.
fn raise_file_limit() {
    // SAFETY: getrlimit and setrlimit only read and write the struct passed to them.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
