//! Durable by default. The stores open with full sync unless told otherwise, and `payrecon
//! serve`, watched from outside with strace, answers no API write before the SQLite WAL holding
//! it has been synced to disk.

use crate::common;

use std::process::{Command, Stdio};

use common::serve::{ServeConfig, free_port};
use payrecon::Durability;
use payrecon::test_utils::store::Store;
use serde_json::json;

on_both_databases! {
    async fn stores_sync_every_commit_unless_told_otherwise(db) {
        let full = Store::connect(&db.url).await.unwrap();
        let relaxed = Store::connect_with(&db.url, Durability::Relaxed).await.unwrap();
        match db.db {
            common::Db::Sqlite => {
                assert_eq!(full.sync_setting().await.unwrap(), "full");
                assert_eq!(relaxed.sync_setting().await.unwrap(), "normal");
            }
            common::Db::Postgres => {
                assert_eq!(full.sync_setting().await.unwrap(), "on");
                assert_eq!(relaxed.sync_setting().await.unwrap(), "off");
            }
        }
        assert_eq!(full.durability(), Durability::Full);
    }
}

/// What strace saw, in order: only what the check needs.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// A request of an API write arrived.
    WriteRequest,
    /// A sync of the WAL returned.
    WalSynced,
    /// An HTTP answer began to leave.
    Answer,
}

/// Reads a `strace -f -y` log. A syscall interrupted by another thread's is logged as
/// `… <unfinished ...>` and later `<... name resumed> …`; a sync counts when it returned, an
/// answer when it began.
fn seen(trace: &str) -> Vec<Seen> {
    let mut pending_wal_sync = std::collections::HashSet::new();
    let mut seen = Vec::new();
    for line in trace.lines() {
        let pid = line.split_whitespace().next().unwrap_or_default();
        let is_sync = line.contains("fdatasync(") || line.contains("fsync(");
        let resumed_sync =
            line.contains("<... fdatasync resumed>") || line.contains("<... fsync resumed>");
        if is_sync && line.contains("-wal>") {
            if line.ends_with("<unfinished ...>") {
                pending_wal_sync.insert(pid.to_owned());
            } else if line.ends_with("= 0") {
                seen.push(Seen::WalSynced);
            }
        } else if resumed_sync && pending_wal_sync.remove(pid) && line.ends_with("= 0") {
            seen.push(Seen::WalSynced);
        } else if line.contains("\"POST /v1/") {
            seen.push(Seen::WriteRequest);
        } else if line.contains("\"HTTP/1.1 2") {
            seen.push(Seen::Answer);
        }
    }
    seen
}

/// Runs `payrecon serve` under strace with `durability`, makes `WRITES` top-ups and intents
/// over HTTP, and returns how many answers were seen and how many left before a WAL sync.
async fn answers_before_sync(durability: &str) -> (usize, usize) {
    let strace = Command::new("strace").arg("-V").output();
    assert!(
        strace.is_ok_and(|o| o.status.success()),
        "this test watches payrecon serve with strace: run scripts/test.sh, which installs it"
    );
    let port = free_port();
    let config = ServeConfig::new(
        &["btc"],
        r#"{"BTC":"80000"}"#,
        &format!(
            "[http]\nlisten = \"127.0.0.1:{port}\"\n[networks.bitcoin]\nxpub = \"{}\"\nnetwork = \"mainnet\"\nconfirmations = 2\nwatch = false\n",
            payrecon_chain_core::test_vectors::BIP84_ZPUB
        ),
    );
    let token = config.cli(&["token", "create", "--name", "shop", "--role", "shop"])["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.strace");
    let mut strace = Command::new("strace")
        .args(["-f", "-y", "-s", "64", "-o"])
        .arg(&log)
        .args([
            "-e",
            "trace=read,readv,recvfrom,recvmsg,write,writev,sendto,sendmsg,fsync,fdatasync",
            "--",
            env!("CARGO_BIN_EXE_payrecon"),
            "--config",
        ])
        .arg(&config.path)
        .arg("serve")
        .env("PAYRECON_DATABASE_DURABILITY", durability)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    common::regtest::eventually("payrecon serve answers under strace", || async {
        reqwest::get(format!("{base}/ready"))
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;

    let http = reqwest::Client::new();
    for i in 0..WRITES {
        let reference = format!("D{i}");
        let answer = http
            .post(format!("{base}/v1/topups"))
            .bearer_auth(&token)
            .json(&json!({"reference": reference, "account_id": "42", "amount_usd": "100"}))
            .send()
            .await
            .unwrap();
        assert!(answer.status().is_success(), "{:?}", answer.text().await);
        let answer = http
            .post(format!("{base}/v1/payments"))
            .bearer_auth(&token)
            .json(&json!({"order": reference, "method": "btc"}))
            .send()
            .await
            .unwrap();
        assert!(answer.status().is_success(), "{:?}", answer.text().await);
    }

    // SIGTERM to payrecon, strace's child; strace ends with it.
    let children = Command::new("pgrep")
        .args(["-P", &strace.id().to_string()])
        .output()
        .unwrap();
    let serve_pid = String::from_utf8(children.stdout).unwrap();
    let serve_pid = serve_pid.trim();
    assert!(!serve_pid.is_empty(), "payrecon serve runs under strace");
    assert!(
        Command::new("kill")
            .args(["-TERM", serve_pid])
            .status()
            .unwrap()
            .success()
    );
    let stopped = tokio::task::spawn_blocking(move || strace.wait().unwrap())
        .await
        .unwrap();
    assert!(stopped.success(), "serve exits cleanly: {stopped:?}");

    let trace = std::fs::read_to_string(&log).unwrap();
    let mut checked = 0;
    let mut unsynced = 0;
    let mut waiting: Option<bool> = None;
    for event in seen(&trace) {
        match event {
            Seen::WriteRequest => waiting = Some(false),
            Seen::WalSynced => {
                if let Some(synced) = waiting.as_mut() {
                    *synced = true;
                }
            }
            Seen::Answer => {
                if let Some(synced) = waiting.take() {
                    checked += 1;
                    if !synced {
                        unsynced += 1;
                    }
                }
            }
        }
    }
    (checked, unsynced)
}

/// Answers to API writes `answers_before_sync` makes and checks.
const WRITES: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_answers_no_write_before_its_commit_is_on_disk() {
    let (checked, unsynced) = answers_before_sync("full").await;
    assert_eq!(
        checked,
        WRITES * 2,
        "every write's answer was seen in the trace"
    );
    assert_eq!(
        unsynced, 0,
        "answers that left before their commit was synced"
    );
}

/// The check above has teeth: with the opt-in relaxed durability, answers do leave before the
/// WAL reaches the disk, and the trace shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relaxed_durability_is_seen_answering_before_the_disk() {
    let (checked, unsynced) = answers_before_sync("relaxed").await;
    assert_eq!(checked, WRITES * 2);
    assert!(
        unsynced > 0,
        "relaxed durability answered every write after a sync?"
    );
}

#[test]
fn the_trace_reader_follows_interrupted_syscalls() {
    let trace = "\
10 recvfrom(12<TCP:[1->2]>, \"POST /v1/topups HTTP/1.1\\r\\n\"..., 8192, 0, NULL, NULL) = 300
11 fdatasync(7</tmp/x/serve.db-wal> <unfinished ...>
10 writev(12<TCP:[1->2]>, [{iov_base=\"HTTP/1.1 201 Created\\r\\n\"...}], 1 <unfinished ...>
11 <... fdatasync resumed>) = 0
12 fdatasync(8</tmp/x/other.db>) = 0
13 fsync(7</tmp/x/serve.db-wal>) = 0
";
    assert_eq!(
        seen(trace),
        [
            Seen::WriteRequest,
            Seen::Answer,
            Seen::WalSynced,
            Seen::WalSynced
        ]
    );
}
