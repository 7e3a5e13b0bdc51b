//! Orders, top-ups, balances and the ledger against real SQLite and PostgreSQL.

use crate::common;

use std::sync::Arc;

use common::{account, btc_topup_credit, fund, rental, topup};
use payrecon::Usd;
use payrecon::ledger::{Account, Currency, EntryKind, LedgerError, NewEntry, PostOutcome, Posting};
use payrecon::test_utils::order::SettledVia;
use payrecon::{Engine, Error};
use payrecon::{OrderKind, OrderRef, OrderRuleError, OrderStatus};
use payrecon_chain_core::Method;

fn reference(r: &str) -> OrderRef {
    OrderRef::new(r).unwrap()
}

on_both_databases! {
    async fn a_database_written_by_a_newer_payrecon_is_refused_in_plain_words(db) {
        let engine = db.engine().await;
        engine.create_topup(&topup("NEWER", "42", "100")).await.unwrap();
        sqlx::any::install_default_drivers();
        let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&db.url).await.unwrap();
        let insert = match db.db {
            common::Db::Sqlite => "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (?, ?, ?, ?, ?)",
            common::Db::Postgres => "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES ($1, $2, $3, $4, $5)",
        };
        // What a newer payrecon leaves behind: one more schema version.
        sqlx::query(insert)
            .bind(payrecon::SCHEMA_VERSION + 1)
            .bind("from a newer payrecon")
            .bind(true)
            .bind(vec![0u8; 48])
            .bind(1i64)
            .execute(&mut conn)
            .await
            .unwrap();
        let Err(refused) = Engine::open(&db.url).await else {
            panic!("a newer database is refused");
        };
        let refused = refused.to_string();
        let newer = payrecon::SCHEMA_VERSION + 1;
        assert!(refused.contains(&format!("schema version {newer}, written by a newer payrecon")), "{refused}");
        assert!(refused.contains(&format!("knows versions up to {}", payrecon::SCHEMA_VERSION)), "{refused}");
        assert!(matches!(engine.store().migrate().await, Err(payrecon::DatabaseError::NewerSchema { .. })));
        assert_eq!(engine.order(&reference("NEWER")).await.unwrap().reference.as_str(), "NEWER", "nothing was touched");
    }

    async fn a_backup_taken_while_writing_is_a_consistent_copy(db) {
        let engine = db.engine().await;
        engine.create_topup(&topup("BEFORE", "42", "100")).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("copy.db");
        if db.db == common::Db::Postgres {
            let refused = engine.backup(&path).await.unwrap_err().to_string();
            assert!(refused.contains("pg_dump") && refused.contains("pg_basebackup"), "{refused}");
            assert!(!path.exists());
            return;
        }
        let writer = {
            let engine = engine.clone();
            tokio::spawn(async move {
                for n in 0..40 {
                    engine.create_topup(&topup(&format!("DURING-{n}"), "43", "100")).await.unwrap();
                }
            })
        };
        let report = engine.backup(&path).await.unwrap();
        writer.await.unwrap();
        assert_eq!((report.integrity.as_str(), report.schema_version), ("ok", payrecon::SCHEMA_VERSION));
        assert_eq!(report.bytes, std::fs::metadata(&path).unwrap().len());
        let copy = common::TestDb::sqlite_at(&path).engine().await;
        assert!(copy.order(&reference("BEFORE")).await.is_ok());
        // One snapshot: the writes it holds are a prefix of those made, none half-written.
        let held: Vec<bool> = futures_util::future::join_all(
            (0..40).map(|n| {
                let copy = copy.clone();
                async move { copy.order(&reference(&format!("DURING-{n}"))).await.is_ok() }
            }),
        )
        .await;
        assert!(held.windows(2).all(|w| w[0] >= w[1]), "{held:?}");
        assert!(copy.trial_balance().await.unwrap().is_sound());
        let again = engine.backup(&path).await.unwrap_err().to_string();
        assert!(again.contains("exists already"), "{again}");
    }

    async fn migrations_run_twice_and_concurrently(db) {
        let (a, b) = tokio::join!(db.engine(), db.engine());
        a.store().migrate().await.unwrap();
        b.store().migrate().await.unwrap();
        assert!(a.trial_balance().await.unwrap().is_sound());
    }

    async fn amounts_round_trip_exactly(db) {
        let engine = db.engine().await;
        let eth = Currency::Crypto(Method::Eth);
        // All ether there is, to the wei, and a value near the top of what a u128 holds.
        let supply_wei = Method::Eth.parse_amount("120450000.123456789012345678").unwrap().base_units() as i128;
        // 10^38 - 1 wei: beyond any real value, inside what a signed 128-bit sum holds.
        let huge = 10i128.pow(38) - 1;
        for (key, amount) in [("eth-supply", supply_wei), ("huge", huge), ("one-wei", 1)] {
            let entry = NewEntry {
                idempotency_key: key.into(),
                kind: EntryKind::Adjustment,
                reference: None,
                memo: "round trip".into(),
                postings: vec![
                    Posting::debit(Account::Custody(Method::Eth), eth, amount),
                    Posting::credit(Account::Suspense(payrecon::ledger::SuspenseReason::Unmatched), eth, amount),
                ],
            };
            engine.post_entry(&entry).await.unwrap();
            let stored = engine.entry(key).await.unwrap().unwrap();
            assert_eq!(stored.entry, entry, "{key} must come back exactly");
        }
        let custody = engine.account_balance(&Account::Custody(Method::Eth), eth).await.unwrap();
        assert_eq!(custody, supply_wei + huge + 1);
        assert!(custody > i128::from(i64::MAX));
        let trial = engine.trial_balance().await.unwrap();
        assert!(trial.is_sound());
        let line = trial.accounts.iter().find(|l| l.account == "custody:ethereum:ETH").unwrap();
        assert_eq!(line.balance, eth.format(supply_wei + huge + 1));
        assert_eq!(line.balance, "100000000000120450000.123456789012345678");
    }

    async fn rental_orders_are_stored_with_their_gpus(db) {
        let engine = db.engine().await;
        let mut request = rental("R1", "42", "420.00");
        request.gpu_model = "b200".into();
        request.lots = 3;
        let created = engine.create_rental_order(&request).await.unwrap();
        assert!(created.created);
        let order = engine.order(&reference("R1")).await.unwrap();
        assert_eq!(order, created.value);
        let OrderKind::Rental(details) = &order.kind else { panic!("rental") };
        assert_eq!((details.gpu_model.as_str(), details.lots, details.gpu_count), ("B200", 3, 6));
        assert_eq!(order.total_usd, "420".parse::<Usd>().unwrap());
        assert_eq!(order.status, OrderStatus::Open);
    }

    async fn impossible_orders_are_refused_and_nothing_is_stored(db) {
        let engine = db.engine().await;
        let cases = [
            ({ let mut r = rental("X1", "42", "10"); r.lots = 11; r }, OrderRuleError::Lots { got: 11, min: 1, max: 10 }),
            ({ let mut r = rental("X2", "42", "10"); r.lots = 0; r }, OrderRuleError::Lots { got: 0, min: 1, max: 10 }),
            ({ let mut r = rental("X3", "42", "10"); r.duration_days = 5; r }, OrderRuleError::Duration { got: 5, sold: vec![3, 7, 30] }),
            (rental("X4", "42", "0"), OrderRuleError::TotalNotPositive),
            (rental("X5", "someone@example.com", "10"), OrderRuleError::AccountIdIsEmail),
        ];
        for (request, rule) in cases {
            match engine.create_rental_order(&request).await {
                Err(Error::OrderRule(broken)) => assert_eq!(broken, rule),
                other => panic!("{request:?} must be refused, got {other:?}"),
            }
            assert!(matches!(
                engine.order(&reference(&request.reference)).await,
                Err(Error::OrderNotFound(_))
            ));
        }
        match engine.create_topup(&topup("T250", "42", "250")).await {
            Err(Error::OrderRule(OrderRuleError::TopupAmount { got: usd, .. })) => assert_eq!(usd.cents(), 25_000),
            other => panic!("250 USD top-up must be refused, got {other:?}"),
        }
        assert!(matches!(engine.order(&reference("T250")).await, Err(Error::OrderNotFound(_))));
        assert_eq!(engine.trial_balance().await.unwrap().entries, 0);
    }

    async fn creating_an_order_again_is_idempotent_and_a_changed_one_conflicts(db) {
        let engine = db.engine().await;
        let first = engine.create_rental_order(&rental("R1", "42", "420")).await.unwrap();
        let again = engine.create_rental_order(&rental("R1", "42", "420.00")).await.unwrap();
        assert!(first.created && !again.created);
        assert_eq!(first.value, again.value);
        let changed = rental("R1", "42", "421");
        assert!(matches!(engine.create_rental_order(&changed).await, Err(Error::OrderConflict(r)) if r.as_str() == "R1"));
        let other_owner = rental("R1", "43", "420");
        assert!(matches!(engine.create_rental_order(&other_owner).await, Err(Error::OrderConflict(_))));
        // References are unique across rentals and top-ups.
        assert!(matches!(engine.create_topup(&topup("R1", "42", "500")).await, Err(Error::OrderConflict(_))));
        assert_eq!(engine.order(&reference("R1")).await.unwrap(), first.value);
    }

    async fn top_ups_of_the_four_amounts_are_stored(db) {
        let engine = db.engine().await;
        for dollars in ["100", "500", "2000", "10000"] {
            let created = engine.create_topup(&topup(&format!("T{dollars}"), "42", dollars)).await.unwrap();
            assert_eq!(created.value.kind, OrderKind::Topup);
            assert_eq!(created.value.total_usd, dollars.parse::<Usd>().unwrap());
        }
        // An open top-up is not money: nothing is available until its payment confirms.
        assert_eq!(engine.available_balance(&account("42")).await.unwrap(), Usd::ZERO);
    }

    async fn posting_a_key_twice_posts_once(db) {
        let engine = db.engine().await;
        let entry = btc_topup_credit("settle:intent-1", "42", 625_000, 50_000);
        assert_eq!(engine.post_entry(&entry).await.unwrap(), PostOutcome::Posted);
        assert_eq!(engine.post_entry(&entry).await.unwrap(), PostOutcome::AlreadyPosted);
        let mut changed = entry.clone();
        changed.postings[2].amount_minor = 60_000;
        changed.postings[3].amount_minor = -60_000;
        assert!(matches!(
            engine.post_entry(&changed).await,
            Err(Error::Ledger(LedgerError::IdempotencyConflict(key))) if key == "settle:intent-1"
        ));
        let trial = engine.trial_balance().await.unwrap();
        assert_eq!((trial.entries, trial.postings), (1, 4));
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 50_000);
        assert_eq!(engine.entries_for("settle:intent-1").await.unwrap().len(), 1);
    }

    async fn unbalanced_entries_and_overdrafts_write_nothing(db) {
        let engine = db.engine().await;
        let mut unbalanced = btc_topup_credit("bad", "42", 625_000, 50_000);
        unbalanced.postings[3].amount_minor = -49_999;
        assert!(matches!(
            engine.post_entry(&unbalanced).await,
            Err(Error::Ledger(LedgerError::Unbalanced { currency: Currency::Usd, .. }))
        ));
        let overdraft = NewEntry {
            idempotency_key: "overdraft".into(),
            kind: EntryKind::BalancePayment,
            reference: None,
            memo: String::new(),
            postings: vec![
                Posting::debit(Account::CustomerBalance(account("42")), Currency::Usd, 1),
                Posting::credit(Account::RevenueRentals, Currency::Usd, 1),
            ],
        };
        assert!(matches!(
            engine.post_entry(&overdraft).await,
            Err(Error::Ledger(LedgerError::Overdraft { .. }))
        ));
        // A batch with one bad entry writes none of them.
        let good = btc_topup_credit("good", "42", 625_000, 50_000);
        let mut too_much = overdraft.clone();
        too_much.postings[0].amount_minor = 50_001;
        too_much.postings[1].amount_minor = -50_001;
        assert!(engine.post_entries(&[good.clone(), too_much]).await.is_err());
        let trial = engine.trial_balance().await.unwrap();
        assert_eq!(trial.entries, 0, "nothing half-written");
        assert!(engine.entry("good").await.unwrap().is_none());
    }

    async fn paying_from_balance_settles_once(db) {
        let engine = db.engine().await;
        engine.create_topup(&topup("T1", "42", "500")).await.unwrap();
        fund(&engine, "settle:T1", "42", 50_000).await;
        engine.create_rental_order(&rental("R1", "42", "420")).await.unwrap();

        let paid = engine.pay_order_from_balance(&reference("R1")).await.unwrap();
        assert!(paid.debited_now);
        assert_eq!(paid.balance_after.cents(), 8_000);
        let OrderStatus::Settled { via, entry_key, .. } = &paid.order.status else { panic!("settled") };
        assert_eq!((*via, entry_key.as_str()), (SettledVia::Balance, "balance-payment:R1"));

        let retry = engine.pay_order_from_balance(&reference("R1")).await.unwrap();
        assert!(!retry.debited_now);
        assert_eq!(retry.balance_after.cents(), 8_000);
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 8_000);

        let revenue = engine.account_balance(&Account::RevenueRentals, Currency::Usd).await.unwrap();
        assert_eq!(revenue, -42_000);
        let entries = engine.entries_for("R1").await.unwrap();
        assert_eq!(entries.len(), 1);
        assert!(engine.trial_balance().await.unwrap().is_sound());
    }

    async fn an_uncovered_order_is_refused_with_nothing_written(db) {
        let engine = db.engine().await;
        fund(&engine, "settle:T1", "42", 10_000).await;
        engine.create_rental_order(&rental("R1", "42", "100.01")).await.unwrap();
        match engine.pay_order_from_balance(&reference("R1")).await {
            Err(Error::InsufficientBalance { available, required, .. }) => {
                assert_eq!((available.cents(), required.cents()), (10_000, 10_001));
            }
            other => panic!("must be refused, got {other:?}"),
        }
        assert_eq!(engine.order(&reference("R1")).await.unwrap().status, OrderStatus::Open);
        assert!(engine.entries_for("R1").await.unwrap().is_empty());
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 10_000);

        engine.create_topup(&topup("T2", "42", "100")).await.unwrap();
        assert!(matches!(engine.pay_order_from_balance(&reference("T2")).await, Err(Error::NotARental(_))));
        assert!(matches!(engine.pay_order_from_balance(&reference("nope")).await, Err(Error::OrderNotFound(_))));
    }

    async fn balances_belong_to_account_ids_not_people(db) {
        let engine = db.engine().await;
        fund(&engine, "settle:T1", "42", 50_000).await;
        // Account 43 is a new account of the same person (same e-mail at the shop): it sees nothing.
        assert_eq!(engine.available_balance(&account("43")).await.unwrap(), Usd::ZERO);
        engine.create_rental_order(&rental("R43", "43", "10")).await.unwrap();
        assert!(matches!(
            engine.pay_order_from_balance(&reference("R43")).await,
            Err(Error::InsufficientBalance { .. })
        ));
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 50_000);
    }

    async fn concurrent_debits_never_overdraw(db) {
        let engine = db.engine().await;
        fund(&engine, "settle:T1", "42", 100_000).await;
        for i in 0..40 {
            engine.create_rental_order(&rental(&format!("R{i}"), "42", "100")).await.unwrap();
        }
        let engine = Arc::new(engine);
        let mut tasks = Vec::new();
        for i in 0..40 {
            let engine = engine.clone();
            tasks.push(tokio::spawn(async move {
                engine.pay_order_from_balance(&OrderRef::new(format!("R{i}")).unwrap()).await
            }));
        }
        let mut paid = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(payment) => { assert!(payment.debited_now); paid += 1; }
                Err(Error::InsufficientBalance { .. }) => {}
                Err(other) => panic!("unexpected {other}"),
            }
        }
        assert_eq!(paid, 10, "1000 USD pays exactly ten 100 USD orders");
        assert_eq!(engine.available_balance(&account("42")).await.unwrap(), Usd::ZERO);
        let trial = engine.trial_balance().await.unwrap();
        assert!(trial.is_sound(), "{trial:?}");
    }

    async fn the_same_order_paid_concurrently_is_debited_once(db) {
        let engine = Arc::new(db.engine().await);
        fund(&engine, "settle:T1", "42", 100_000).await;
        engine.create_rental_order(&rental("R1", "42", "100")).await.unwrap();
        let tasks: Vec<_> = (0..12).map(|_| {
            let engine = engine.clone();
            tokio::spawn(async move { engine.pay_order_from_balance(&OrderRef::new("R1").unwrap()).await })
        }).collect();
        let mut debited = 0;
        for task in tasks {
            if task.await.unwrap().unwrap().debited_now { debited += 1; }
        }
        assert_eq!(debited, 1);
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 90_000);
    }

    async fn corrections_are_compensating_entries(db) {
        let engine = db.engine().await;
        fund(&engine, "settle:T1", "42", 50_000).await;
        assert_eq!(engine.reverse_entry("settle:T1", "credited by mistake").await.unwrap(), PostOutcome::Posted);
        assert_eq!(engine.reverse_entry("settle:T1", "credited by mistake").await.unwrap(), PostOutcome::AlreadyPosted);
        assert_eq!(engine.available_balance(&account("42")).await.unwrap(), Usd::ZERO);
        let reversal = engine.entry("reverse:settle:T1").await.unwrap().unwrap();
        assert_eq!(reversal.entry.kind, EntryKind::Reversal);
        let trial = engine.trial_balance().await.unwrap();
        assert_eq!(trial.entries, 2, "the original stays; the correction is a new entry");
        assert!(trial.is_sound());
        assert!(matches!(
            engine.reverse_entry("no-such-entry", "x").await,
            Err(Error::Ledger(LedgerError::EntryNotFound(_)))
        ));

        // A credit already spent cannot be reversed into a negative balance.
        fund(&engine, "settle:T2", "42", 50_000).await;
        engine.create_rental_order(&rental("R1", "42", "420")).await.unwrap();
        engine.pay_order_from_balance(&reference("R1")).await.unwrap();
        assert!(matches!(
            engine.reverse_entry("settle:T2", "reorg").await,
            Err(Error::Ledger(LedgerError::Overdraft { .. }))
        ));
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 8_000);
    }

    async fn the_journal_refuses_edits_and_deletes(db) {
        let engine = db.engine().await;
        fund(&engine, "settle:T1", "42", 50_000).await;
        let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
        for statement in [
            "UPDATE postings SET amount = '-1'",
            "DELETE FROM postings",
            "UPDATE journal_entries SET memo = 'x'",
            "DELETE FROM journal_entries",
        ] {
            let error = sqlx::query(statement).execute(&pool).await.unwrap_err();
            assert!(error.to_string().contains("append-only"), "{statement}: {error}");
        }
        assert_eq!(engine.available_balance(&account("42")).await.unwrap().cents(), 50_000);
    }

    async fn a_batch_is_checked_in_order_and_posts_whole(db) {
        let engine = db.engine().await;
        let spend = |key: &str, cents: i128| NewEntry {
            idempotency_key: key.into(),
            kind: EntryKind::BalancePayment,
            reference: None,
            memo: String::new(),
            postings: vec![
                Posting::debit(Account::CustomerBalance(account("42")), Currency::Usd, cents),
                Posting::credit(Account::RevenueRentals, Currency::Usd, cents),
            ],
        };
        // Spending before the credit in the same batch is an overdraft: nothing is written.
        let backwards = [spend("spend-1", 30_000), btc_topup_credit("credit-1", "42", 1, 50_000)];
        assert!(matches!(engine.post_entries(&backwards).await, Err(Error::Ledger(LedgerError::Overdraft { .. }))));
        assert_eq!(engine.trial_balance().await.unwrap().entries, 0);

        // Credit first, then two debits that fit, then a replay of the credit inside the batch.
        let credit = btc_topup_credit("credit-1", "42", 1, 50_000);
        let batch = [credit.clone(), spend("spend-1", 30_000), spend("spend-2", 20_000), credit.clone()];
        let outcomes = engine.post_entries(&batch).await.unwrap();
        assert_eq!(outcomes, [PostOutcome::Posted, PostOutcome::Posted, PostOutcome::Posted, PostOutcome::AlreadyPosted]);
        assert_eq!(engine.available_balance(&account("42")).await.unwrap(), Usd::ZERO);

        // The same key twice in one batch with different content is refused whole.
        let mut twin = spend("spend-3", 1);
        twin.memo = "other".into();
        let refused = engine.post_entries(&[btc_topup_credit("credit-2", "42", 1, 100), spend("spend-3", 1), twin]).await;
        assert!(matches!(refused, Err(Error::Ledger(LedgerError::IdempotencyConflict(k))) if k == "spend-3"));
        assert!(engine.entry("credit-2").await.unwrap().is_none());
        assert!(engine.trial_balance().await.unwrap().is_sound());
    }
}
