//! `payrecon serve` and the CLI as an operator runs them: a config file in a temporary
//! directory, commands answering JSON, and the long-running process stopped by SIGTERM.

use std::path::PathBuf;
use std::process::{Child, Command};

use serde_json::Value;

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

    /// The embedded database `payrecon serve` and the CLI use.
    pub fn database(&self) -> std::path::PathBuf {
        self.dir.path().join("serve.db")
    }

    /// Runs a CLI command that must succeed; its JSON answer.
    pub fn cli(&self, args: &[&str]) -> Value {
        let output = Command::new(env!("CARGO_BIN_EXE_payrecon"))
            .arg("--config")
            .arg(&self.path)
            .arg("--json")
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
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

    /// Starts `payrecon serve`.
    pub fn serve(&self) -> Serving {
        let child = Command::new(env!("CARGO_BIN_EXE_payrecon"))
            .arg("--config")
            .arg(&self.path)
            .arg("serve")
            .current_dir(self.dir.path())
            .spawn()
            .unwrap();
        Serving { child }
    }
}

/// A running `payrecon serve`.
pub struct Serving {
    child: Child,
}

impl Serving {
    /// SIGTERM, and the process must exit cleanly.
    pub async fn stop(self) {
        let stopped = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(stopped.success());
        let mut child = self.child;
        let exit = tokio::task::spawn_blocking(move || child.wait().unwrap())
            .await
            .unwrap();
        assert!(exit.success(), "serve exits cleanly on SIGTERM: {exit:?}");
    }
}
