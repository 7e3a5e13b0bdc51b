//! `payrecon serve` and the CLI as an operator runs them: a config file in a temporary
//! directory, commands answering JSON, and the long-running process stopped by SIGTERM.

use std::path::PathBuf;
use std::process::{Child, Command};

use serde_json::Value;

/// A free port on loopback, for a server a test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Litecoin section that is configured but not watched here: enough for payments.
pub fn unwatched_litecoin() -> String {
    format!(
        "[networks.litecoin]\nxpub = \"{}\"\nnetwork = \"regtest\"\nconfirmations = 1\nwatch = false\n",
        super::regtest::fresh_account_xpub()
    )
}

/// A `payrecon serve` with its HTTP API on a port of its own (and the `http` keys given),
/// then the `rest` of the TOML, LTC payable and not watched; the base URL once it answers.
pub async fn serving(http: &str, rest: &str) -> (ServeConfig, Serving, String) {
    let port = free_port();
    let config = ServeConfig::new(
        &["ltc"],
        r#"{"LTC":"100"}"#,
        &format!(
            "[http]\nlisten = \"127.0.0.1:{port}\"\n{http}{rest}{}",
            unwatched_litecoin()
        ),
    );
    let serving = config.serve();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    super::regtest::eventually("payrecon serve to answer", || async {
        http.get(format!("{base}/health"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    (config, serving, base)
}

/// A configuration written to a temporary directory, with an embedded SQLite database and
/// rates recorded in a file.
pub struct ServeConfig {
    dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl ServeConfig {
    /// `payments.enabled_methods = methods`, the recorded `quotes` (e.g. `{"LTC":"100"}`), and
    /// `networks` (TOML sections) appended.
    pub fn new(methods: &[&str], quotes: &str, networks: &str) -> ServeConfig {
        let dir = tempfile::tempdir().unwrap();
        let quotes_file = dir.path().join("quotes.json");
        std::fs::write(&quotes_file, format!(r#"{{"quotes":{quotes}}}"#)).unwrap();
        let path = dir.path().join("payrecon.toml");
        let methods: Vec<String> = methods.iter().map(|m| format!("\"{m}\"")).collect();
        std::fs::write(
            &path,
            format!(
                "database_url = \"sqlite://{db}\"\n[payments]\nenabled_methods = [{methods}]\n\
                 [rates]\nsources = [\"recorded\"]\nrecorded_quotes_file = \"{quotes}\"\n{networks}",
                db = dir.path().join("serve.db").display(),
                methods = methods.join(", "),
                quotes = quotes_file.display(),
            ),
        )
        .unwrap();
        ServeConfig { dir, path }
    }

    /// Litecoin (`ltc`, 100 USD) on the regtest node behind `electrum_url`, below a fresh key,
    /// one confirmation, fast polling; `extra` TOML sections (e.g. `[serve]`) come first.
    pub fn litecoin(electrum_url: &str, extra: &str) -> ServeConfig {
        ServeConfig::litecoin_from(&format!("electrum_url = \"{electrum_url}\"\n"), extra)
    }

    /// Litecoin as [`ServeConfig::litecoin`], read straight from the regtest node's RPC at
    /// `rpc_url` with its P2P announcements from `push_peer`.
    pub fn litecoin_node(rpc_url: &str, push_peer: &str, extra: &str) -> ServeConfig {
        ServeConfig::litecoin_from(
            &format!("rpc_url = \"{rpc_url}\"\npush_peer = \"{push_peer}\"\n"),
            extra,
        )
    }

    /// Litecoin reading the chain from the `source` keys given.
    fn litecoin_from(source: &str, extra: &str) -> ServeConfig {
        ServeConfig::new(
            &["ltc"],
            r#"{"LTC":"100"}"#,
            &format!(
                "{extra}[networks.litecoin]\nxpub = \"{xpub}\"\nnetwork = \"regtest\"\nconfirmations = 1\n\
                 {source}poll_interval_ms = 100\n",
                xpub = super::regtest::fresh_account_xpub(),
            ),
        )
    }

    /// ETH, USDT and USDC (ETH at 2000 USD, the tokens at 1) on anvil at `rpc_url` with the
    /// test `tokens`, below a fresh key, one confirmation, scanning from `start_block`.
    pub fn ethereum(
        rpc_url: &str,
        tokens: &super::anvil::Tokens,
        start_block: u64,
        extra: &str,
    ) -> ServeConfig {
        ServeConfig::new(
            &["eth", "usdt-erc20", "usdc-erc20"],
            r#"{"ETH":"2000","USDT":"1","USDC":"1"}"#,
            &format!(
                "{extra}[networks.ethereum]\nxpub = \"{xpub}\"\nchain_id = 31337\nconfirmations = 1\n\
                 usdt_contract = \"{usdt}\"\nusdc_contract = \"{usdc}\"\nrpc_url = \"{rpc_url}\"\n\
                 start_block = {start_block}\npoll_interval_ms = 100\n",
                xpub = super::anvil::fresh_ethereum_xpub(),
                usdt = tokens.usdt,
                usdc = tokens.usdc,
            ),
        )
    }

    /// `count` 100 USD top-ups `T0`… for customer 42, each with payment instructions in
    /// `method`: (intent id, pay to).
    pub fn topups(&self, count: usize, method: &str) -> Vec<(String, String)> {
        (0..count)
            .map(|i| {
                let reference = format!("T{i}");
                self.cli(&[
                    "topup",
                    "create",
                    "--reference",
                    &reference,
                    "--account",
                    "42",
                    "--amount-usd",
                    "100",
                ]);
                let pay = self.cli(&["pay", "create", "--order", &reference, "--method", method]);
                (
                    pay["id"].as_str().unwrap().to_owned(),
                    pay["pay_to"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    /// Points the configuration at another database (PostgreSQL, shared by several servers).
    pub fn on_database(self, url: &str) -> ServeConfig {
        let text = std::fs::read_to_string(&self.path).unwrap();
        let rest = text.split_once('\n').unwrap().1;
        std::fs::write(&self.path, format!("database_url = \"{url}\"\n{rest}")).unwrap();
        self
    }

    /// The embedded database `payrecon serve` and the CLI use.
    pub fn database(&self) -> std::path::PathBuf {
        self.dir.path().join("serve.db")
    }

    /// Runs a CLI command that must succeed; its JSON answer.
    pub fn cli(&self, args: &[&str]) -> Value {
        self.attempt(args)
            .unwrap_or_else(|error| panic!("{args:?}: {error}"))
    }

    /// Runs a CLI command: its JSON answer, or its error when it fails.
    pub fn attempt(&self, args: &[&str]) -> Result<Value, String> {
        let output = Command::new(env!("CARGO_BIN_EXE_payrecon"))
            .arg("--config")
            .arg(&self.path)
            .arg("--json")
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap();
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        Ok(serde_json::from_slice(&output.stdout).unwrap())
    }

    /// Runs the CLI with `args`, which must fail: its one-line error.
    pub fn failure(&self, args: &[&str]) -> String {
        let output = Command::new(env!("CARGO_BIN_EXE_payrecon"))
            .arg("--config")
            .arg(&self.path)
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} must fail");
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    /// A 100 USD top-up for customer 42 and its payment intent in `method`: (intent id, pay to).
    pub fn topup_and_pay(&self, method: &str) -> (String, String) {
        self.cli(&[
            "topup",
            "create",
            "--reference",
            "T1",
            "--account",
            "42",
            "--amount-usd",
            "100",
        ]);
        let pay = self.cli(&["pay", "create", "--order", "T1", "--method", method]);
        (
            pay["id"].as_str().unwrap().to_owned(),
            pay["pay_to"].as_str().unwrap().to_owned(),
        )
    }

    /// Runs `payrecon serve` with `env` set until it exits by itself (a crash point); its
    /// exit status. Fails the test if it is still running after a minute.
    pub async fn serve_until_exit(&self, env: &[(&str, &str)]) -> std::process::ExitStatus {
        self.serve_quietly(&self.path, env).exited().await
    }

    /// `payrecon serve` on the configuration at `path`, with `env` set and its log dropped.
    fn serve_quietly(&self, path: &std::path::Path, env: &[(&str, &str)]) -> Serving {
        let child = Command::new(env!("CARGO_BIN_EXE_payrecon"))
            .arg("--config")
            .arg(path)
            .arg("serve")
            .envs(env.iter().copied())
            .current_dir(self.dir.path())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        Serving { child: Some(child) }
    }

    /// Changes the configuration file's text.
    pub fn rewrite(&self, change: impl FnOnce(String) -> String) {
        let text = std::fs::read_to_string(&self.path).unwrap();
        std::fs::write(&self.path, change(text)).unwrap();
    }

    /// Starts `payrecon serve` with everything it prints going to `log`.
    pub fn serve_logged(&self, log: &std::path::Path) -> Serving {
        let file = std::fs::File::create(log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_payrecon"))
            .arg("--config")
            .arg(&self.path)
            .arg("serve")
            .env("PAYRECON_LOG", "info")
            .current_dir(self.dir.path())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Serving { child: Some(child) }
    }

    /// The temporary directory the configuration lives in.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// `payrecon serve` answering HTTP on `port`, with `env` set (a crash point).
    pub fn serve_http(&self, port: u16, env: &[(&str, &str)]) -> Serving {
        let path = self.dir.path().join(format!("payrecon-{port}.toml"));
        let text = std::fs::read_to_string(&self.path).unwrap();
        std::fs::write(
            &path,
            format!("{text}\n[http]\nlisten = \"127.0.0.1:{port}\"\n"),
        )
        .unwrap();
        self.serve_quietly(&path, env)
    }

    /// Starts `payrecon serve`.
    pub fn serve(&self) -> Serving {
        let child = Command::new(env!("CARGO_BIN_EXE_payrecon"))
            .arg("--config")
            .arg(&self.path)
            .arg("serve")
            .current_dir(self.dir.path())
            .spawn()
            .unwrap();
        Serving { child: Some(child) }
    }
}

/// A running `payrecon serve`; killed if dropped (a failed test leaves no server behind).
pub struct Serving {
    child: Option<Child>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Serving {
    /// The process id (lease holders are named after it).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The server's resident memory, in bytes (Linux).
    pub fn resident_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS");
        kib * 1024
    }

    /// SIGTERM; how the process exited.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        tokio::task::spawn_blocking(move || child.wait().unwrap())
            .await
            .unwrap()
    }

    /// SIGKILL: the process dies mid-whatever, without any cleanup.
    /// Waits for the process to end by itself (a crash point); how it ended. Fails the test
    /// after a minute.
    pub async fn exited(mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let started = std::time::Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(started.elapsed().as_secs() < 60, "the server did not end");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    pub fn kill9(mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGTERM, and the process must exit cleanly.
    pub async fn stop(mut self) {
        let mut child = self.child.take().expect("running");
        let stopped = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(stopped.success());
        let exit = tokio::task::spawn_blocking(move || child.wait().unwrap())
            .await
            .unwrap();
        assert!(exit.success(), "serve exits cleanly on SIGTERM: {exit:?}");
    }
}
