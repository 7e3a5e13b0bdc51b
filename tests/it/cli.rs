//! The `payrecon` binary as a person or a script uses it: JSON out, one-line errors, exit codes.

use crate::common;

use std::process::{Command, Output};

use serde_json::Value;

fn payrecon(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_payrecon"))
        .args(["--database-url", url])
        .args(args)
        .env_remove("PAYRECON_DATABASE_URL")
        .env_remove("PAYRECON_CONFIG")
        .current_dir(std::env::temp_dir())
        .output()
        .expect("run payrecon")
}

fn json(url: &str, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let output = payrecon(url, &all);
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON document")
}

/// `payrecon bench …`, which runs the `payrecon-bench` binary beside `payrecon` (the workspace
/// build that `scripts/test.sh` runs builds both): one JSON document.
fn bench(args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_payrecon"))
        .arg("--json")
        .arg("bench")
        .args(args)
        .env_remove("PAYRECON_DATABASE_URL")
        .env_remove("PAYRECON_CONFIG")
        .current_dir(std::env::temp_dir())
        .output()
        .expect("run payrecon bench");
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON document")
}

/// `payrecon topup create` of 100 USD for `account`.
fn topup_of_100(url: &str, account: &str, reference: &str) -> Value {
    json(
        url,
        &[
            "topup",
            "create",
            "--account",
            account,
            "--amount-usd",
            "100",
            "--reference",
            reference,
        ],
    )
}

/// Runs a command that must fail, returning its one-line error.
fn refused(url: &str, args: &[&str]) -> String {
    let output = payrecon(url, args);
    assert!(!output.status.success(), "{args:?} must fail");
    assert!(output.stdout.is_empty(), "nothing on stdout for a failure");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    stderr
}

on_both_databases! {
    async fn the_cli_creates_shows_and_refuses(db) {
        let url = db.url.as_str();
        assert_eq!(json(url, &["init"])["migrated"], true);
        let order = json(url, &["order", "create", "--reference", "R1", "--account", "42", "--gpu", "B200", "--days", "7", "--lots", "2", "--total-usd", "420.00"]);
        assert_eq!(order["gpu_count"], 4);
        assert_eq!(order["total_usd"], "420.00");
        assert_eq!(order["created"], true);
        let topup = json(url, &["topup", "create", "--account", "42", "--amount-usd", "500", "--reference", "T1"]);
        assert_eq!(topup["kind"], "topup");
        assert_eq!(json(url, &["balance", "42"])["available_usd"], "0.00");
        let shown = json(url, &["order", "show", "R1"]);
        assert_eq!(shown["status"]["state"], "open");
        assert_eq!(shown["ledger_entries"].as_array().unwrap().len(), 0);

        assert!(refused(url, &["order", "create", "--reference", "R2", "--account", "42", "--gpu", "H100", "--days", "5", "--lots", "1", "--total-usd", "1"]).contains("3, 7 or 30 days, got 5"));
        assert!(refused(url, &["order", "create", "--reference", "R2", "--account", "42", "--gpu", "H100", "--days", "7", "--lots", "11", "--total-usd", "1"]).contains("lots must be 1 to 10, got 11"));
        assert!(refused(url, &["topup", "create", "--account", "42", "--amount-usd", "250"]).contains("exactly 100, 500, 2000 or 10000 USD"));
        assert!(refused(url, &["order", "create", "--reference", "R2", "--account", "42", "--gpu", "H100", "--days", "7", "--lots", "1", "--total-usd", "1.001"]).contains("at most 2 decimal places"));
        assert!(refused(url, &["order", "pay-from-balance", "R1"]).contains("insufficient balance"));
        assert!(refused(url, &["order", "pay-from-balance", "T1"]).contains("cannot be paid from the balance"));
        assert!(refused(url, &["order", "show", "nope"]).contains("unknown order nope"));
        assert!(refused(url, &["order", "show", "x'; DROP TABLE orders;--"]).contains("invalid order reference"));
        assert!(refused(url, &["balance", "bob@example.com"]).contains("e-mail"));

        let trial = json(url, &["ledger", "trial-balance"]);
        assert_eq!(trial["sound"], true);
    }
}

const OFFLINE_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/payrecon.offline.toml");

on_both_databases! {
    async fn payment_instructions_from_the_offline_example(db) {
        let url = db.url.as_str();
        let with_config = |args: &[&str]| -> Vec<String> {
            let mut all = vec!["--config".to_owned(), OFFLINE_CONFIG.to_owned()];
            all.extend(args.iter().map(|a| a.to_string()));
            all
        };
        let run = |args: Vec<String>| {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            json(url, &refs)
        };
        run(with_config(&["order", "create", "--reference", "R1", "--account", "42", "--gpu", "H100", "--days", "7", "--lots", "1", "--total-usd", "420"]));
        let pay = run(with_config(&["pay", "create", "--order", "R1", "--method", "btc"]));
        assert_eq!(pay["pay_to"], "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu", "BIP84 receive 0 of the example key");
        assert_eq!(pay["amount_decimal"], "0.00525");
        assert_eq!(pay["status"], "awaiting_payment");
        assert!(pay["rate"]["source"].as_str().unwrap().starts_with("file:"), "says the rate came from the file");
        assert!(pay["payment_uri"].as_str().unwrap().starts_with("bitcoin:bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu?amount=0.00525"));
        assert!(pay["deadline"].as_str().is_some());
        let id = pay["id"].as_str().unwrap().to_owned();

        let marked = run(with_config(&["pay", "mark-paid", &id]));
        assert!(marked["marked_paid_at"].as_str().is_some());
        let qr = run(with_config(&["pay", "qr", &id]));
        assert!(qr["svg"].as_str().unwrap().contains("<svg"));
        let shown = run(with_config(&["order", "show", "R1"]));
        assert_eq!(shown["payment_intents"].as_array().unwrap().len(), 1);

        let refuse = |args: &[&str]| refused(url, &with_config(args).iter().map(String::as_str).collect::<Vec<_>>());
        assert!(refuse(&["pay", "create", "--order", "R1", "--method", "doge"]).contains("unknown payment method \"doge\""));
        assert!(refuse(&["pay", "create", "--order", "nope", "--method", "btc"]).contains("unknown order nope"));
        assert!(refuse(&["pay", "show", "pi_nope"]).contains("unknown payment intent pi_nope"));

        // A second intent in another method supersedes the first, which stays listed.
        let ltc = run(with_config(&["pay", "create", "--order", "R1", "--method", "ltc"]));
        assert!(ltc["pay_to"].as_str().unwrap().starts_with("ltc1"));
        let shown = run(with_config(&["order", "show", "R1"]));
        let intents = shown["payment_intents"].as_array().unwrap();
        assert_eq!(intents.len(), 2);
        assert_eq!(intents[0]["superseded_by"], ltc["id"]);
    }
}

#[test]
fn without_configured_networks_a_method_is_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("x.db").display());
    payrecon(
        &url,
        &[
            "order",
            "create",
            "--reference",
            "R1",
            "--account",
            "42",
            "--gpu",
            "H100",
            "--days",
            "7",
            "--lots",
            "1",
            "--total-usd",
            "420",
        ],
    );
    assert!(
        refused(&url, &["pay", "create", "--order", "R1", "--method", "btc"])
            .contains("payment method btc is not enabled")
    );
}

#[test]
fn backup_copies_the_sqlite_database_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("live.db").display());
    topup_of_100(&url, "42", "T1");
    let copy = dir.path().join("copy.db");
    let copy_arg = copy.to_str().unwrap();
    let report = json(&url, &["backup", "--output", copy_arg]);
    assert_eq!(report["integrity"], "ok");
    assert_eq!(report["schema_version"], payrecon::SCHEMA_VERSION);
    let copied = format!("sqlite://{copy_arg}");
    assert_eq!(json(&copied, &["order", "show", "T1"])["reference"], "T1");
    assert!(refused(&url, &["backup", "--output", copy_arg]).contains("exists already"));
}

#[test]
fn an_unknown_database_scheme_is_one_clear_line() {
    assert!(refused("mysql://localhost/x", &["init"]).contains("unsupported database URL scheme"));
}

#[test]
fn a_missing_config_file_is_named() {
    let output = Command::new(env!("CARGO_BIN_EXE_payrecon"))
        .args(["--config", "/nonexistent/payrecon.toml", "init"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("/nonexistent/payrecon.toml does not exist")
    );
}

/// The Tron scanner benchmark runs on its built-in node and reports every busy block scanned
/// and one transfer found per watched recipient.
#[test]
fn the_tron_benchmark_scans_its_blocks() {
    let report = bench(&[
        "tron",
        "--addresses",
        "500",
        "--blocks",
        "3",
        "--transfers-per-block",
        "20",
    ]);
    let results = report["results"].as_array().unwrap();
    assert_eq!(results[0]["entries"], 3);
    assert_eq!(
        results[1]["entries"],
        3 * 2 * 2,
        "one in ten of 20 per kind per block"
    );
}

/// The benchmarks write rows of their own: a database given the way every other command takes
/// one is refused, not silently replaced by a scratch file.
#[test]
fn the_benchmarks_refuse_the_global_database_url() {
    let refusal = refused("sqlite::memory:", &["bench", "ledger", "--entries", "10"]);
    assert!(refusal.contains("--scratch-database"), "{refusal}");
}

/// The Solana scanner benchmark runs on its built-in node and finds every paid reference once.
#[test]
fn the_solana_benchmark_checks_its_references() {
    let report = bench(&["solana", "--references", "200", "--paid", "20"]);
    let results = report["results"].as_array().unwrap();
    assert_eq!(
        (
            results[0]["entries"].as_u64(),
            results[1]["entries"].as_u64()
        ),
        (Some(200), Some(20))
    );
}

on_both_databases! {
    async fn finance_and_operators_work_from_the_command_line(db) {
        let seeded = common::seed::seed(&db).await;
        let url = db.url.clone();
        let csv = payrecon(&url, &["report", "reconcile", "--from", "2026-12-01", "--to", "2026-12-02", "--format", "csv", "--section", "summary"]);
        assert!(csv.status.success(), "{}", String::from_utf8_lossy(&csv.stderr));
        let csv = String::from_utf8(csv.stdout).unwrap();
        assert!(csv.lines().any(|l| l.starts_with("btc,BTC,7,2,1,4,0.04375,")), "{csv}");
        let dir = tempfile::tempdir().unwrap();
        let page = dir.path().join("report.html");
        let written = payrecon(&url, &["report", "reconcile", "--from", "2026-12-01T00:00:00Z", "--to", "2026-12-02", "--format", "html", "--output", page.to_str().unwrap()]);
        assert!(written.status.success());
        assert!(std::fs::read_to_string(&page).unwrap().contains("Trial balance"));
        assert!(refused(&url, &["report", "reconcile", "--from", "yesterday", "--to", "2026-12-02"]).contains("--from must be a date"));
        assert!(refused(&url, &["report", "reconcile", "--from", "2026-12-02", "--to", "2026-12-01"]).contains("period is empty"));
        // Without any node configured the audit cannot vouch for anything: it prints what it
        // could not check and fails, like a diff that found differences.
        let audit = payrecon(&url, &["report", "reconcile", "--from", "2026-12-01", "--to", "2026-12-02", "--audit", "--format", "json"]);
        assert!(!audit.status.success());
        assert!(String::from_utf8_lossy(&audit.stderr).contains("could not be checked"));
        let audit: Value = serde_json::from_slice(&audit.stdout).unwrap();
        assert!(audit["unchecked"]["bitcoin"].as_str().unwrap().contains("no node configured"), "{audit}");

        let stuck = json(&url, &["stuck"]);
        assert!(stuck.as_array().unwrap().iter().any(|i| i["category"] == "marked_paid_unseen"));
        let open = json(&url, &["exception", "list", "--open"]);
        assert_eq!(open.as_array().unwrap().len(), 6);
        let late = "paid_late:bitcoin:t4:0";
        assert!(refused(&url, &["exception", "resolve", late, "--action", "dismiss", "--actor", "bob", "--reason", "x"]).contains("holds 0.00625 BTC"));
        assert!(refused(&url, &["exception", "resolve", late, "--action", "mark-refunded", "--actor", "bob", "--reason", "x"]).contains("--refund-txid"));
        let resolved = json(&url, &["exception", "resolve", late, "--action", "credit-balance", "--actor", "bob", "--reason", "customer asked"]);
        assert_eq!(resolved["exception"]["resolution"], "credit_balance by bob: customer asked");
        assert_eq!(json(&url, &["exception", "log"])[0]["actor"], "bob");
        assert_eq!(json(&url, &["balance", "42"])["available_usd"], "1500.00");

        let token = json(&url, &["token", "create", "--name", "shop-1", "--role", "shop"]);
        assert!(token["token"].as_str().unwrap().starts_with("prt_"));
        assert!(refused(&url, &["token", "create", "--name", "shop-1", "--role", "shop"]).contains("exists"));
        assert!(refused(&url, &["token", "create", "--name", "x", "--role", "admin"]).contains("admin"));
        json(&url, &["token", "revoke", "--name", "shop-1"]);
        assert!(refused(&url, &["token", "revoke", "--name", "shop-1"]).contains("no live token"));
        drop(seeded);
    }
}

/// `payrecon … | head` or `| grep -q`: the reader closes the pipe before payrecon writes, and
/// payrecon ends quietly as a Unix tool does (status 141, nothing on stderr), for a plain
/// answer and for a streamed report alike.
#[test]
fn a_closed_pipe_ends_the_cli_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("pipe.db").display());
    json(&url, &["init"]);
    for args in [
        vec!["--json", "balance", "42"],
        vec![
            "report",
            "reconcile",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
        ],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_payrecon"))
            .args(["--database-url", &url])
            .args(&args)
            .env_remove("PAYRECON_DATABASE_URL")
            .env_remove("PAYRECON_CONFIG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The reader is gone before payrecon has opened its database.
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(141), "{args:?}: {output:?}");
        assert!(
            output.stderr.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// `payrecon find`: an order by its reference; nothing known and hostile text are one line
/// and status 1.
#[test]
fn find_looks_up_what_a_customer_gave() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("find.db").display());
    topup_of_100(&url, "42", "T-find");
    let found = json(&url, &["find", "T-find"]);
    assert_eq!(
        (found["found"].as_str(), found["reference"].as_str()),
        (Some("order"), Some("T-find"))
    );
    let text = payrecon(&url, &["find", "T-find"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("T-find"));
    assert!(refused(&url, &["find", "nothing-here"]).contains("nothing matches"));
    assert!(refused(&url, &["find", "x' OR '1'='1"]).contains("letters, digits"));
}

/// `payrecon account history`: the timeline a page at a time, and the cursor it prints.
#[test]
fn account_history_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("history.db").display());
    for reference in ["H1", "H2"] {
        topup_of_100(&url, "77", reference);
    }
    let first = json(&url, &["account", "history", "77", "--limit", "1"]);
    assert_eq!(first["items"][0]["reference"], "H1");
    let next = first["next"].as_str().unwrap().to_owned();
    let second = json(
        &url,
        &["account", "history", "77", "--limit", "1", "--after", &next],
    );
    assert_eq!(second["items"][0]["reference"], "H2");
    assert!(second["next"].is_null());
    let text = payrecon(&url, &["account", "history", "77"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("H2"));
    assert!(
        refused(&url, &["account", "history", "77", "--after", "nonsense"])
            .contains("history cursor")
    );
    assert!(refused(&url, &["account", "history", "a@b.example"]).contains("e-mail"));
}

// `payrecon bench books`: a month valued, exported in every format and closed, each export
// beside the reconciliation report of the same month, on both databases.
on_both_databases! {
    async fn the_books_benchmark_exports_and_closes_a_month(db) {
        let report = bench(&["books", "--transfers", "400", "--scratch-database", &db.url]);
        let results = report["results"].as_array().unwrap();
        for workload in ["export generic (1 files)", "export datev (1 files)", "export xero (3 files)", "export qbo (1 files)", "close the month"] {
            let measured = results
                .iter()
                .find(|r| r["workload"] == workload)
                .unwrap_or_else(|| panic!("{workload} is measured: {report}"));
            assert!(measured["of_line"].as_f64().is_some_and(|r| r > 0.0), "{measured}");
            assert!(measured["peak_rss_mib"].as_u64().is_some(), "{measured}");
        }
    }
}

// `bench payments` runs its own checks (every intent settled once, the ledger sound, the report
// complete) and measures each write beside its line; the line's rows are of the same shape as
// payrecon's, down to top-ups settling onto the balances of returning customers.
on_both_databases! {
    async fn the_payments_benchmark_measures_each_write_beside_its_line(db) {
        let url = db.url.clone();
        let report = bench(
            &[
                "payments", "--intents", "300", "--sweep-items", "60",
                "--reference-events", "60", "--events-per-batch", "50",
                "--concurrency", "1,16", "--scratch-database", &url,
            ],
        );
        let results = report["results"].as_array().unwrap();
        for workload in [
            "top-ups created, 16 callers",
            "intents created, 16 callers",
            "events matched and settled, 50 per transaction",
        ] {
            let measured = results
                .iter()
                .find(|r| r["workload"] == workload)
                .unwrap_or_else(|| panic!("{workload} is measured: {report}"));
            assert!(measured["of_line"].as_f64().is_some_and(|r| r > 0.0), "{measured}");
        }
        let trial = json(&url, &["ledger", "trial-balance"]);
        assert_eq!(trial["sound"], true, "payrecon's rows and the line's balance");
        let line_customers = trial["trial_balance"]["accounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["account"].as_str().unwrap().starts_with("customer:line-"))
            .count();
        assert_eq!(line_customers, 300, "each line settlement credits its top-up's customer");
    }
}

// `bench edge` holds its streams open from a process of its own; while nothing changes the
// pages read nothing, and one intent's change wakes only that intent's pages.
on_both_databases! {
    async fn the_edge_benchmark_reads_nothing_per_page_while_nothing_changes(db) {
        let url = db.url.clone();
        let report = bench(
            &[
                "edge", "--streams", "60", "--intents", "6", "--requests", "20",
                "--quiet-seconds", "3", "--scratch-database", &url,
            ],
        );
        let figures = &report["results"];
        assert_eq!(figures["streams"], 60, "{report}");
        assert_eq!(figures["page_reads_per_second"], 0.0, "{report}");
        let woken = figures["change_page_reads"].as_u64().unwrap();
        assert!((1..=10).contains(&woken), "only the changed intent's ten pages look again: {report}");
        assert!(figures["p95_ratio"].as_f64().is_some_and(|r| r > 0.0), "{report}");
    }
}

/// The shop's catalog is configuration: another shop's durations, lots and top-ups are the
/// rules its orders meet, and a catalog that cannot hold is refused at start, naming its key.
#[test]
fn the_catalog_comes_from_the_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/catalog.db", dir.path().display());
    let config = dir.path().join("payrecon.toml");
    std::fs::write(
        &config,
        "[catalog]\nrental_days = [1, 14]\nmax_lots = 4\ntopup_amounts_usd = [50]\ngpu_kinds = [\"H100\", \"B300\"]\ngpus_per_lot = { B300 = 8 }\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    fn with<'a>(config: &'a str, args: &[&'a str]) -> Vec<&'a str> {
        [&["--config", config][..], args].concat()
    }
    let order = json(
        &url,
        &with(
            config,
            &[
                "order",
                "create",
                "--reference",
                "R1",
                "--account",
                "42",
                "--gpu",
                "b300",
                "--days",
                "14",
                "--lots",
                "2",
                "--total-usd",
                "900",
            ],
        ),
    );
    assert_eq!(order["gpu_count"], 16, "{order}");
    assert!(
        refused(
            &url,
            &with(
                config,
                &[
                    "order",
                    "create",
                    "--reference",
                    "R2",
                    "--account",
                    "42",
                    "--gpu",
                    "H100",
                    "--days",
                    "7",
                    "--lots",
                    "1",
                    "--total-usd",
                    "1"
                ]
            )
        )
        .contains("must be 1 or 14 days, got 7")
    );
    assert!(
        refused(
            &url,
            &with(
                config,
                &[
                    "order",
                    "create",
                    "--reference",
                    "R3",
                    "--account",
                    "42",
                    "--gpu",
                    "H100",
                    "--days",
                    "1",
                    "--lots",
                    "5",
                    "--total-usd",
                    "1"
                ]
            )
        )
        .contains("lots must be 1 to 4, got 5")
    );
    assert!(
        refused(
            &url,
            &with(
                config,
                &[
                    "order",
                    "create",
                    "--reference",
                    "R4",
                    "--account",
                    "42",
                    "--gpu",
                    "A100",
                    "--days",
                    "1",
                    "--lots",
                    "1",
                    "--total-usd",
                    "1"
                ]
            )
        )
        .contains("does not rent A100")
    );
    assert!(
        refused(
            &url,
            &with(
                config,
                &["topup", "create", "--account", "42", "--amount-usd", "100"]
            )
        )
        .contains("exactly 50 USD, got 100.00")
    );
    json(
        &url,
        &with(
            config,
            &["topup", "create", "--account", "42", "--amount-usd", "50"],
        ),
    );

    let broken = dir.path().join("broken.toml");
    std::fs::write(&broken, "[catalog]\nmin_lots = 3\nmax_lots = 2\n").unwrap();
    let refusal = refused(&url, &["--config", broken.to_str().unwrap(), "init"]);
    assert!(refusal.contains("catalog.max_lots"), "{refusal}");
}

/// The books from the command line: a month closed, reopened with a reason, exported.
#[test]
fn finance_closes_a_month_and_exports_its_journal() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("books.db").display());
    let pass = json(&url, &["books", "value"]);
    assert_eq!(
        (pass["valued"].as_u64(), pass["failed"].as_u64()),
        (Some(0), Some(0))
    );
    let closed = json(&url, &["period", "close", "2026-11", "--actor", "anna"]);
    assert_eq!(closed["entries"], 0);
    assert!(refused(&url, &["period", "close", "2026-11"]).contains("already closed"));
    assert!(refused(&url, &["period", "close", "2099-01"]).contains("has not ended"));
    assert!(refused(&url, &["period", "close", "2026-13"]).contains("YYYY-MM"));
    let status = json(&url, &["period", "status", "2026-11"]);
    assert_eq!(
        (status["state"].as_str(), status["log"][0]["actor"].as_str()),
        (Some("closed"), Some("anna"))
    );
    let report = payrecon(&url, &["period", "report", "2026-11"]);
    assert_eq!(
        report.stdout,
        payrecon(&url, &["period", "report", "2026-11"]).stdout
    );
    let reopened = json(
        &url,
        &["period", "reopen", "2026-11", "--reason", "wrong month"],
    );
    assert_eq!(reopened["state"], "open");

    let generic = payrecon(&url, &["export", "journal", "--period", "2026-11"]);
    assert!(generic.status.success());
    assert!(String::from_utf8_lossy(&generic.stdout).starts_with("entry_id,seq,date,"));
    assert!(
        refused(
            &url,
            &[
                "export", "journal", "--period", "2026-11", "--format", "datev"
            ]
        )
        .contains("EUR")
    );
    let out = dir.path().join("exports");
    let written = payrecon(
        &url,
        &[
            "export",
            "journal",
            "--period",
            "2026-11",
            "--format",
            "xero",
            "--output-dir",
            out.to_str().unwrap(),
        ],
    );
    assert!(written.status.success());
    let file = std::fs::read_to_string(out.join("journal-2026-11-xero-1.csv")).unwrap();
    assert!(file.starts_with("*Narration,*Date,Description,*AccountCode,*TaxRate,*Amount\r\n"));
    let rollforward = json(&url, &["books", "rollforward", "--period", "2026-11"]);
    assert_eq!(rollforward["closes"], true);
}

#[test]
fn the_sweep_list_says_why_it_cannot_be_made_and_never_shows_the_node_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("sweep.db").display());
    let xpub = common::anvil::fresh_ethereum_xpub();
    let config = |name: &str, lines: &str| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!("[networks.ethereum]\nxpub = \"{xpub}\"\nconfirmations = 1\n{lines}"),
        )
        .unwrap();
        path.to_str().unwrap().to_owned()
    };
    let treasury = "treasury_addresses = [\"0x70997970c51812dc3a010c7d01b50e0d17dc79c8\"]\n";
    let sweep_list = |config: &str, network: &str| {
        refused(
            &url,
            &[
                "--config",
                config,
                "wallet",
                "sweep-list",
                "--network",
                network,
                "--csv",
            ],
        )
    };
    let says = sweep_list(&config("none.toml", treasury), "ethereum");
    assert!(says.contains("no node configured"), "{says}");
    // A node that is not there: the error names the chain, not the key in its URL.
    let gone = config(
        "gone.toml",
        &format!(
            "rpc_url = \"http://127.0.0.1:1/v3/9aa3d95b3bc440fa88ea12eaa4456161\"\n{treasury}"
        ),
    );
    let says = sweep_list(&gone, "ethereum");
    assert!(says.contains("ethereum fees"), "{says}");
    assert!(!says.contains("9aa3d95b"), "{says}");
    assert!(sweep_list(&gone, "bitcoin").contains("bitcoin"));
    let bad = config("bad.toml", "treasury_addresses = [\"0xnope\"]\n");
    let says = refused(&url, &["--config", &bad, "holdings"]);
    assert!(
        says.contains("treasury_addresses") && says.contains("0xnope"),
        "{says}"
    );
}

#[test]
fn the_wallet_export_and_holdings_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("wallet.db").display());
    let config = dir.path().join("payrecon.toml");
    let key = common::regtest::fresh_merchant_key();
    std::fs::write(
        &config,
        format!(
            "[networks.litecoin]\nxpub = \"{}\"\nnetwork = \"regtest\"\nconfirmations = 1\nkey_origin = \"{}\"\n",
            key.account_xpub, key.origin
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let with_config =
        |args: &[&'static str]| -> Vec<&str> { [&["--config", config][..], args].concat() };
    let exports = json(
        &url,
        &with_config(&["wallet", "export", "--network", "litecoin"]),
    );
    // One entry per key the network ever used: here the configured one.
    assert_eq!(exports.as_array().unwrap().len(), 1);
    let export = &exports[0];
    assert_eq!(export["state"], "current");
    assert!(
        export["receive_descriptor"]
            .as_str()
            .unwrap()
            .starts_with("wpkh([")
    );
    assert_eq!(export["highest_index"], Value::Null);
    let text = payrecon(
        &url,
        &with_config(&["wallet", "export", "--network", "litecoin"]),
    );
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("gap limit needed: 1\n")
            && text.contains("receive: wpkh(")
            && text.contains("(current)"),
        "{text}"
    );
    for (network, says) in [
        ("bitcoin", "no Bitcoin-family account"),
        ("ethereum", "bitcoin"),
    ] {
        let mut args = with_config(&["wallet", "export", "--network"]);
        args.push(network);
        assert!(refused(&url, &args).contains(says), "{network}");
    }
    let holdings = json(&url, &with_config(&["holdings", "--sort", "index"]));
    assert_eq!(holdings["address_count"], 0);
    let rollforward = json(
        &url,
        &with_config(&["report", "holdings", "--period", "2026-11"]),
    );
    assert_eq!(rollforward["closes"], true);
    assert!(refused(&url, &["report", "holdings", "--period", "2026-13"]).contains("YYYY-MM"));
    assert!(refused(&url, &["holdings", "--sort", "size"]).contains("size"));
}

#[test]
fn restored_moves_each_counter_past_every_address_the_lost_database_may_have_given() {
    let config = common::serve::ServeConfig::new(
        &["btc"],
        r#"{"BTC":"80000"}"#,
        &format!(
            "[networks.bitcoin]\nxpub = \"{}\"\nnetwork = \"mainnet\"\nconfirmations = 2\nwatch = false\n",
            payrecon_chain_core::test_vectors::BIP84_ZPUB
        ),
    );
    let (intent, _) = config.topup_and_pay("btc");
    let moved = config.cli(&["restored"]);
    // The intent's process took a first block of four indexes; the counter stood past it.
    assert_eq!(moved[0]["counter_before"], 4, "{moved}");
    assert_eq!(
        moved[0]["counter_after"],
        4 + payrecon::DEFAULT_LOOKAHEAD,
        "{moved}"
    );
    assert!(
        moved[0]["key_id"].as_str().unwrap().starts_with("bc:"),
        "{moved}"
    );
    assert_eq!(config.cli(&["pay", "show", &intent])["derivation_index"], 0);
}
