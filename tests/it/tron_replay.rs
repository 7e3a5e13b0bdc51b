//! The Tron watcher against a local full node serving blocks and transaction infos built from
//! recorded java-tron responses (`fixtures/tron/`), on SQLite and PostgreSQL: TRX and USDT
//! payments of every shape, a reverted transfer, a fake token, a block served twice or out of
//! order, a node that fails, rate-limits and cuts answers short, a malformed answer, a reorg,
//! and solidified finality.

use crate::common;

use chrono::Duration;
use common::checks::{cents, kinds, ledger_summary, order, sound, status, wait_status};
use common::regtest::eventually;
use common::serve::ServeConfig;
use common::tron::{
    FAKE_USDT, USDT, fresh_tron_xpub, tron_config, tron_engine, wait_synced, watch_tron,
};
use common::{TestDb, topup};
use payrecon::IntentStatus;
use payrecon::config::TronFinality;
use payrecon::test_utils::clock::Clock;
use payrecon::test_utils::watcher::WatcherState;
use payrecon_chain_core::{Method, Network};
use payrecon_chain_tron::testkit::{
    FakeTron, Fault, internal_trx, rejected_internal_trx, reverted_trc20, trc20, trx,
    unreadable_trx,
};

/// 400 TRX, what a 100 USD top-up costs at 0.25 USD per TRX.
const TOPUP_SUN: u64 = 400_000_000;

/// 100 USDT.
const TOPUP_USDT: u128 = 100_000_000;

on_both_databases! {
    async fn an_unreadable_transaction_is_quarantined_and_the_rest_settles(db) {
        // A transfer to a watched address that the watcher cannot read is quarantined as an
        // exception for operators; payments beside it in the same block and in later blocks
        // settle, and the watcher is never stopped.
        let node = FakeTron::start(100).await;
        let tron = tron_config(&node, &fresh_tron_xpub(), 1, TronFinality::Depth);
        let (engine, _clock) = tron_engine(&db, &tron).await;
        let mut pays = Vec::new();
        for (i, reference) in ["QBROKEN", "QBESIDE", "QLATER"].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("2{i}"), "100")).await.unwrap();
            pays.push(engine.create_payment(&order(reference), Method::Trx).await.unwrap());
        }
        let watcher = watch_tron(&engine, &tron, node.head() + 1);
        node.mine(&[unreadable_trx(&pays[0].intent.pay_to), trx(&pays[1].intent.pay_to, TOPUP_SUN)]);
        wait_status(&engine, &pays[1].intent.id, IntentStatus::Settled).await;
        node.mine(&[trx(&pays[2].intent.pay_to, TOPUP_SUN)]);
        wait_status(&engine, &pays[2].intent.id, IntentStatus::Settled).await;
        assert_eq!(watcher.status.borrow().state, WatcherState::Running);
        assert_eq!(status(&engine, &pays[0].intent.id).await, IntentStatus::AwaitingPayment);

        let quarantined: Vec<_> = engine.exceptions(None).await.unwrap().into_iter().filter(|e| e.kind == "unreadable_transaction").collect();
        assert_eq!(quarantined.len(), 1, "one exception, however many rounds saw it: {quarantined:?}");
        let detail = &quarantined[0].detail;
        assert!(quarantined[0].id.starts_with("unreadable_transaction:tron:"), "{}", quarantined[0].id);
        assert!(detail.contains(&pays[0].intent.pay_to) && detail.contains("TransferContract"), "{detail}");
        let stuck = engine.stuck(&payrecon::StuckOptions::default()).await.unwrap();
        assert!(stuck.iter().any(|item| item.kind == "unreadable_transaction" && item.actions == ["dismiss"]), "{stuck:?}");
        assert!(engine.open_exceptions_by_kind().await.unwrap().contains(&("unreadable_transaction".to_owned(), 1)));
        sound(&engine).await;
        watcher.stop().await.unwrap();
    }

    async fn trx_a_contract_pays_inside_its_call_settles_and_an_undone_call_credits_nothing(db) {
        // A router pays the intent's address in an internal transaction of the recorded
        // mainnet swap; another's internal payment was rejected (undone) while its transaction
        // succeeded. The node first answers the block's transaction infos with `[]`, as a
        // backend that has not executed the block yet does: the watcher waits there.
        let node = FakeTron::start(100).await;
        let tron = tron_config(&node, &fresh_tron_xpub(), 1, TronFinality::Depth);
        let (engine, _clock) = tron_engine(&db, &tron).await;
        let mut pays = Vec::new();
        for (i, reference) in ["INSIDE", "UNDONE"].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("3{i}"), "100")).await.unwrap();
            pays.push(engine.create_payment(&order(reference), Method::Trx).await.unwrap());
        }
        let watcher = watch_tron(&engine, &tron, node.head() + 1);
        wait_synced(&engine, &node).await;
        node.inject("/wallet/gettransactioninfobyblocknum", [Fault::Status(200, "[]".into())]);
        node.mine(&[internal_trx(&pays[0].intent.pay_to, TOPUP_SUN), rejected_internal_trx(&pays[1].intent.pay_to, TOPUP_SUN)]);
        wait_status(&engine, &pays[0].intent.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "30").await, 10_000);
        wait_synced(&engine, &node).await;
        assert_eq!(status(&engine, &pays[1].intent.id).await, IntentStatus::AwaitingPayment);
        let transfers = engine.transfers_for(&order("INSIDE")).await.unwrap();
        assert_eq!(transfers.len(), 1);
        assert!(transfers[0].id.is_internal(), "{}", transfers[0].id);
        assert!(watcher.status.borrow().incomplete_answers >= 1, "the empty infos were counted");
        assert!(engine.exceptions(None).await.unwrap().is_empty());
        sound(&engine).await;
        watcher.stop().await.unwrap();
    }

    async fn trx_exact_and_under_usdt_exact_over_and_late(db) {
        let node = FakeTron::start(100).await;
        let tron = tron_config(&node, &fresh_tron_xpub(), 2, TronFinality::Depth);
        let (engine, clock) = tron_engine(&db, &tron).await;
        let mut pays = Vec::new();
        for (i, (reference, method)) in [("TRXEXACT", Method::Trx), ("TRXUNDER", Method::Trx), ("USDTEXACT", Method::UsdtTrc20), ("USDTOVER", Method::UsdtTrc20), ("USDTLATE", Method::UsdtTrc20)].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("1{i}"), "100")).await.unwrap();
            pays.push(engine.create_payment(&order(reference), *method).await.unwrap());
        }
        assert_eq!((pays[0].amount_decimal.as_str(), pays[2].amount_decimal.as_str()), ("400", "100"));
        assert!(pays[0].intent.pay_to.starts_with('T'));
        let watcher = watch_tron(&engine, &tron, node.head() + 1);
        node.mine(&[
            trx(&pays[0].intent.pay_to, TOPUP_SUN),
            trx(&pays[1].intent.pay_to, TOPUP_SUN * 4 / 5),
            trc20(USDT, &pays[2].intent.pay_to, TOPUP_USDT),
            trc20(USDT, &pays[3].intent.pay_to, TOPUP_USDT * 6 / 5),
        ]);
        wait_synced(&engine, &node).await;
        assert_eq!(status(&engine, &pays[0].intent.id).await, IntentStatus::Seen, "one confirmation of two");
        node.mine_empty(1);
        for settled in [0, 2, 3] {
            wait_status(&engine, &pays[settled].intent.id, IntentStatus::Settled).await;
        }
        wait_status(&engine, &pays[1].intent.id, IntentStatus::Confirmed).await;
        assert_eq!(kinds(&engine, "USDTOVER").await, ["overpaid"]);
        assert_eq!([cents(&engine, "10").await, cents(&engine, "11").await, cents(&engine, "12").await, cents(&engine, "13").await], [10_000, 0, 10_000, 10_000]);

        // An hour passes for the shop and for the chain.
        clock.advance(Duration::minutes(61));
        common::checks::tick_once_read(&engine, Network::Tron, &*clock).await;
        assert_eq!(status(&engine, &pays[1].intent.id).await, IntentStatus::Underpaid);
        assert_eq!(status(&engine, &pays[4].intent.id).await, IntentStatus::Expired);
        watcher.next_round().await;
        node.set_clock_ms(clock.now().timestamp_millis());
        node.mine(&[trc20(USDT, &pays[4].intent.pay_to, TOPUP_USDT)]);
        node.mine_empty(1);
        wait_status(&engine, &pays[4].intent.id, IntentStatus::PaidLate).await;
        assert_eq!(kinds(&engine, "USDTLATE").await, ["paid_late"]);
        assert_eq!(cents(&engine, "14").await, 0, "late money is held");
        assert!(node.api_keys().iter().all(|k| k == "test-key") && !node.api_keys().is_empty(), "the API key goes with every request");
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn a_reverted_transfer_is_nothing_a_fake_token_is_grouped_and_trx_is_the_wrong_asset(db) {
        let node = FakeTron::start(10).await;
        let tron = tron_config(&node, &fresh_tron_xpub(), 1, TronFinality::Depth);
        let (engine, _clock) = tron_engine(&db, &tron).await;
        let mut pays = Vec::new();
        for (i, reference) in ["REVERTED", "FAKE", "TRXTOUSDT"].iter().enumerate() {
            engine.create_topup(&topup(reference, &format!("2{i}"), "100")).await.unwrap();
            pays.push(engine.create_payment(&order(reference), Method::UsdtTrc20).await.unwrap());
        }
        let watcher = watch_tron(&engine, &tron, node.head() + 1);
        node.mine(&[
            reverted_trc20(USDT, &pays[0].intent.pay_to, TOPUP_USDT),
            trc20(FAKE_USDT, &pays[1].intent.pay_to, TOPUP_USDT),
            trx(&pays[2].intent.pay_to, TOPUP_SUN),
        ]);
        node.mine_empty(1);
        wait_synced(&engine, &node).await;
        eventually("a wrong_asset exception", || async { kinds(&engine, "TRXTOUSDT").await == ["wrong_asset"] }).await;
        // A token of another contract is one exception per contract, not one per order.
        let unknown: Vec<_> = engine.exceptions(None).await.unwrap().into_iter().filter(|e| e.kind == "unknown_token").collect();
        assert_eq!(unknown.len(), 1, "{unknown:?}");
        assert_eq!(unknown[0].id, format!("unknown_token:tron:{FAKE_USDT}"));
        assert!(kinds(&engine, "FAKE").await.is_empty());
        assert!(engine.transfers_for(&order("REVERTED")).await.unwrap().is_empty(), "a reverted transfer is nothing");
        for (i, pay) in pays.iter().enumerate() {
            assert_eq!(status(&engine, &pay.intent.id).await, IntentStatus::AwaitingPayment);
            assert_eq!(cents(&engine, &format!("2{i}")).await, 0);
        }
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn a_block_served_twice_or_out_of_order_is_counted_once(db) {
        let node = FakeTron::start(10).await;
        let tron = tron_config(&node, &fresh_tron_xpub(), 1, TronFinality::Depth);
        let (engine, _clock) = tron_engine(&db, &tron).await;
        engine.create_topup(&topup("ONCE", "30", "100")).await.unwrap();
        let pay = engine.create_payment(&order("ONCE"), Method::UsdtTrc20).await.unwrap();
        let start = node.head() + 1;
        node.mine(&[trc20(USDT, &pay.intent.pay_to, TOPUP_USDT / 2)]);
        node.mine(&[trc20(USDT, &pay.intent.pay_to, TOPUP_USDT / 2)]);
        node.mine_empty(2);
        node.inject("/wallet/getblockbynum", [Fault::PreviousBlock, Fault::PreviousBlock, Fault::PreviousBlock]);
        let watcher = watch_tron(&engine, &tron, start);
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        wait_synced(&engine, &node).await;
        assert_eq!(engine.transfers_for(&order("ONCE")).await.unwrap().len(), 2);
        assert_eq!(cents(&engine, "30").await, 10_000, "credited once");
        assert!(kinds(&engine, "ONCE").await.is_empty());
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn a_failing_rate_limiting_and_truncating_node_ends_with_the_same_ledger(db) {
        let xpub = fresh_tron_xpub();
        let clean = FakeTron::start(20).await;
        let faulty = FakeTron::start(20).await;
        let clean_config = tron_config(&clean, &xpub, 2, TronFinality::Depth);
        let faulty_config = tron_config(&faulty, &xpub, 2, TronFinality::Depth);
        let steady_db = TestDb::new(db.db).await;
        let (steady, _) = tron_engine(&steady_db, &clean_config).await;
        let (suffering, _) = tron_engine(&db, &faulty_config).await;
        let orders = ["F1", "F2", "F3"];
        let mut addresses = Vec::new();
        for (i, reference) in orders.iter().enumerate() {
            let method = if i == 1 { Method::Trx } else { Method::UsdtTrc20 };
            for engine in [&steady, &suffering] {
                engine.create_topup(&topup(reference, &format!("4{i}"), "100")).await.unwrap();
            }
            let a = steady.create_payment(&order(reference), method).await.unwrap();
            let b = suffering.create_payment(&order(reference), method).await.unwrap();
            assert_eq!(a.intent.pay_to, b.intent.pay_to);
            addresses.push(a.intent.pay_to);
        }
        let start = clean.head() + 1;
        let rate_limited = serde_json::json!({"Error": "The key exceeds the frequency limit(15), and the query server is suspended for 27 s"}).to_string();
        faulty.inject("/wallet/getnowblock", [Fault::Status(503, "Service Unavailable".into()), Fault::Status(429, rate_limited.clone())]);
        faulty.inject("/wallet/getblockbynum", [Fault::Status(503, String::new()), Fault::Status(429, rate_limited), Fault::Truncated, Fault::Truncated]);
        faulty.inject("/wallet/gettransactioninfobyblocknum", [Fault::Truncated, Fault::Status(502, String::new())]);
        let uninterrupted = watch_tron(&steady, &clean_config, start);
        let suffering_watcher = watch_tron(&suffering, &faulty_config, start);
        for node in [&clean, &faulty] {
            node.mine(&[trc20(USDT, &addresses[0], TOPUP_USDT), trx(&addresses[1], TOPUP_SUN / 2)]);
            node.mine(&[trx(&addresses[1], TOPUP_SUN / 2), trc20(USDT, &addresses[2], TOPUP_USDT * 2)]);
            node.mine_empty(2);
        }
        for (engine, node) in [(&steady, &clean), (&suffering, &faulty)] {
            wait_synced(engine, node).await;
            for reference in orders {
                let id = engine.payments_for(&order(reference)).await.unwrap()[0].intent.id.clone();
                wait_status(engine, &id, IntentStatus::Settled).await;
            }
        }
        assert_eq!(faulty.pending_faults(), 0, "every fault was met, and retried");
        assert_eq!(suffering_watcher.status.borrow().state, WatcherState::Running);
        uninterrupted.stop().await.unwrap();
        suffering_watcher.stop().await.unwrap();
        assert_eq!(ledger_summary(&suffering, &orders).await, ledger_summary(&steady, &orders).await);
    }

    async fn a_malformed_answer_stops_the_watcher_with_a_clear_error_and_skips_nothing(db) {
        let node = FakeTron::start(10).await;
        let tron = tron_config(&node, &fresh_tron_xpub(), 1, TronFinality::Depth);
        let (engine, _clock) = tron_engine(&db, &tron).await;
        engine.create_topup(&topup("MALFORMED", "50", "100")).await.unwrap();
        let pay = engine.create_payment(&order("MALFORMED"), Method::Trx).await.unwrap();
        let start = node.head() + 1;
        node.mine(&[trx(&pay.intent.pay_to, TOPUP_SUN)]);
        node.inject("/wallet/getblockbynum", [Fault::Malformed]);
        let watcher = watch_tron(&engine, &tron, start);
        // It stops on the answer it cannot read, says why, and when it tries again.
        let mut state = watcher.status.clone();
        let (error, next_try_at) = loop {
            state.changed().await.unwrap();
            if let WatcherState::Stopped { error: Some(error), next_try_at: Some(at) } = &state.borrow_and_update().state {
                break (error.clone(), *at);
            }
        };
        assert!(error.contains("/wallet/getblockbynum answered a malformed body"), "{error}");
        assert!(next_try_at > chrono::Utc::now() - chrono::Duration::seconds(5));

        // The node answers properly again: the same watcher picks up where it stopped, and the
        // payment in the block it could not read is credited: nothing was passed over.
        wait_status(&engine, &pay.intent.id, IntentStatus::Settled).await;
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn a_reorg_takes_back_a_credit_and_solidified_finality_waits_for_the_solid_head(db) {
        let node = FakeTron::start(30).await;
        node.set_solid_lag(5);
        let tron = tron_config(&node, &fresh_tron_xpub(), 2, TronFinality::Solidified);
        let (engine, _clock) = tron_engine(&db, &tron).await;
        engine.create_topup(&topup("SOLID", "60", "100")).await.unwrap();
        engine.create_topup(&topup("REORGED", "61", "100")).await.unwrap();
        let solid = engine.create_payment(&order("SOLID"), Method::UsdtTrc20).await.unwrap();
        let reorged = engine.create_payment(&order("REORGED"), Method::Trx).await.unwrap();
        let watcher = watch_tron(&engine, &tron, node.head() + 1);
        node.mine(&[trc20(USDT, &solid.intent.pay_to, TOPUP_USDT)]);
        // Four blocks deep, twice the confirmations asked, yet above the solidified head.
        node.mine_empty(3);
        wait_synced(&engine, &node).await;
        assert_eq!(status(&engine, &solid.intent.id).await, IntentStatus::Seen);
        // The solidified head (five below the head) reaches its block.
        node.mine_empty(2);
        wait_status(&engine, &solid.intent.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "60").await, 10_000);

        node.set_solid_lag(0);
        node.mine(&[trx(&reorged.intent.pay_to, TOPUP_SUN)]);
        node.mine_empty(1);
        wait_status(&engine, &reorged.intent.id, IntentStatus::Settled).await;
        assert_eq!(cents(&engine, "61").await, 10_000);
        // The last two blocks are replaced by empty ones.
        node.reorg(2);
        node.mine_empty(1);
        wait_status(&engine, &reorged.intent.id, IntentStatus::ReorgedAfterCredit).await;
        wait_synced(&engine, &node).await;
        assert_eq!(kinds(&engine, "REORGED").await, ["reorged_after_credit"]);
        assert_eq!((cents(&engine, "60").await, cents(&engine, "61").await), (10_000, 0));
        watcher.stop().await.unwrap();
        sound(&engine).await;
    }

    async fn the_audit_reads_credited_blocks_again_and_finds_what_a_reorg_took(db) {
        let node = FakeTron::start(50).await;
        let tron = tron_config(&node, &fresh_tron_xpub(), 2, TronFinality::Depth);
        let (engine, clock) = tron_engine(&db, &tron).await;
        engine.create_topup(&topup("AUDIT-TRX", "70", "100")).await.unwrap();
        engine.create_topup(&topup("AUDIT-USDT", "71", "100")).await.unwrap();
        let trx_pay = engine.create_payment(&order("AUDIT-TRX"), Method::Trx).await.unwrap();
        let usdt_pay = engine.create_payment(&order("AUDIT-USDT"), Method::UsdtTrc20).await.unwrap();
        let watcher = watch_tron(&engine, &tron, node.head() + 1);
        node.mine(&[trx(&trx_pay.intent.pay_to, TOPUP_SUN), trc20(USDT, &usdt_pay.intent.pay_to, TOPUP_USDT)]);
        node.mine_empty(1);
        wait_status(&engine, &trx_pay.intent.id, IntentStatus::Settled).await;
        wait_status(&engine, &usdt_pay.intent.id, IntentStatus::Settled).await;
        watcher.stop().await.unwrap();

        let config = common::payments::config(|c| c.networks.tron = Some(tron.clone()));
        let now = clock.now();
        let query = payrecon::ReportQuery { from: now - Duration::days(1), to: now + Duration::days(1), method: None };
        let clean = engine.audit_credited(&config, &query).await.unwrap();
        assert_eq!((clean.checked, clean.findings.len()), (2, 0), "{clean:?}");
        // The payments' block is replaced while no watcher runs.
        node.reorg(2);
        let audit = engine.audit_credited(&config, &query).await.unwrap();
        assert_eq!(audit.findings.len(), 2, "{audit:?}");
        assert!(audit.findings.iter().all(|f| f.problem == "no longer on the chain"));
    }
}

/// `payrecon serve` with `[networks.tron] api_url` set watches Tron and credits a top-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payrecon_serve_watches_tron_and_credits_a_top_up() {
    let node = FakeTron::start(50).await;
    let config = ServeConfig::new(
        &["usdt-trc20"],
        r#"{"USDT":"1"}"#,
        &format!(
            "[networks.tron]\nxpub = \"{xpub}\"\nconfirmations = 2\napi_url = \"{url}\"\n\
             api_key = \"serve-key\"\npoll_interval_ms = 100\n",
            xpub = fresh_tron_xpub(),
            url = node.url,
        ),
    );
    let (intent, address) = config.topup_and_pay("usdt-trc20");
    let serving = config.serve();
    // The very first start begins at the head: wait until serve has looked at it.
    eventually("serve to reach the node", || async {
        !node.api_keys().is_empty()
    })
    .await;
    node.mine(&[trc20(USDT, &address, TOPUP_USDT)]);
    node.mine_empty(1);
    eventually("serve to credit the top-up", || async {
        config.cli(&["pay", "show", &intent])["status"] == "settled"
    })
    .await;
    assert_eq!(config.cli(&["balance", "42"])["available_usd"], "100.00");
    assert!(node.api_keys().iter().all(|k| k == "serve-key"));
    serving.stop().await;
}

/// A node that answers a megabyte nobody can read: the watcher stops and says why, and what it
/// says stays small everywhere it goes (each line of serve's log, the stuck view).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_megabyte_answer_that_cannot_be_read_leaves_small_traces() {
    let node = FakeTron::start(50).await;
    // Whole JSON of the wrong shape: the decoder's own complaint quotes the string.
    let garbage = format!("{{\"block_header\": \"{}\"}}", "7".repeat(1 << 20));
    node.inject(
        "/wallet/getnowblock",
        (0..50).map(|_| Fault::Status(200, garbage.clone())),
    );
    let config = ServeConfig::new(
        &["trx"],
        r#"{"TRX":"0.25"}"#,
        &format!(
            "[networks.tron]\nxpub = \"{xpub}\"\nconfirmations = 2\napi_url = \"{url}\"\npoll_interval_ms = 100\n",
            xpub = fresh_tron_xpub(),
            url = node.url,
        ),
    );
    let log = config.dir().join("serve.log");
    let serving = config.serve_logged(&log);
    let stuck = || {
        config
            .cli(&["stuck"])
            .as_array()
            .unwrap()
            .iter()
            .filter(|item| item["category"] == "watcher")
            .cloned()
            .collect::<Vec<_>>()
    };
    let malformed = || {
        stuck()
            .into_iter()
            .filter(|row| row["what"].as_str().unwrap().contains("malformed"))
            .collect::<Vec<_>>()
    };
    eventually("the watcher to report the unreadable answer", || async {
        !malformed().is_empty()
    })
    .await;
    let rows = malformed();
    serving.stop().await;
    for row in &rows {
        let what = row["what"].as_str().unwrap();
        assert!(what.contains("bytes in all"), "{what:.400}");
        assert!(
            row.to_string().len() <= 2048,
            "a stuck row of {} bytes",
            row.to_string().len()
        );
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("bytes in all"),
        "the log names the answer's length"
    );
    let longest = text.lines().map(str::len).max().unwrap_or(0);
    assert!(longest <= 2048, "a log line of {longest} bytes");
}
