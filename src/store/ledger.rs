//! SQL for the journal: entries, postings and the sums balances are derived from.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use sqlx::{AnyConnection, Row};

use super::orders::{ensure_customer, lock_customer, millis};
use super::{StoreError, WriteTx, values_placeholders};
use crate::ledger::{
    Account, Currency, LedgerError, NewEntry, PostOutcome, PostedEntry, Posting,
};

/// Posts a validated entry inside `tx`, once per idempotency key.
///
/// A replay with the same content is a no-op that says so; a replay with other content is
/// refused. A customer's balance may never turn negative: their row is locked and their
/// postings re-summed before a debit lands.
pub(crate) async fn post(
    tx: &mut WriteTx,
    entry: &NewEntry,
    now: DateTime<Utc>,
) -> Result<Result<PostOutcome, LedgerError>, StoreError> {
    let content_hash = entry.content_hash();
    let inserted = sqlx::query(
        "INSERT INTO journal_entries (idempotency_key, kind, reference, memo, content_hash, posted_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (idempotency_key) DO NOTHING RETURNING seq",
    )
    .bind(entry.idempotency_key.as_str())
    .bind(entry.kind.as_str())
    .bind(entry.reference.as_deref())
    .bind(entry.memo.as_str())
    .bind(content_hash.as_str())
    .bind(now.timestamp_millis())
    .fetch_optional(tx.conn())
    .await?;
    if inserted.is_none() {
        let existing: String =
            sqlx::query_scalar("SELECT content_hash FROM journal_entries WHERE idempotency_key = $1")
                .bind(entry.idempotency_key.as_str())
                .fetch_one(tx.conn())
                .await?;
        return Ok(if existing == content_hash {
            Ok(PostOutcome::AlreadyPosted)
        } else {
            Err(LedgerError::IdempotencyConflict(entry.idempotency_key.clone()))
        });
    }
    for (customer, net) in entry.customer_nets() {
        if net > 0 {
            let exists = lock_customer(tx, &customer).await?;
            let account = Account::CustomerBalance(customer.clone());
            let current = if exists {
                account_sum(tx.conn(), &account, Currency::Usd).await?
            } else {
                0
            };
            if current + net > 0 {
                return Ok(Err(LedgerError::Overdraft {
                    account: customer,
                    available: Currency::Usd.format(-current),
                    debit: Currency::Usd.format(net),
                }));
            }
        } else {
            ensure_customer(tx.conn(), &customer, now).await?;
        }
    }
    insert_postings(tx.conn(), &entry.idempotency_key, &entry.postings).await?;
    Ok(Ok(PostOutcome::Posted))
}

async fn insert_postings(
    conn: &mut AnyConnection,
    entry_key: &str,
    postings: &[Posting],
) -> Result<(), StoreError> {
    let sql = format!(
        "INSERT INTO postings (entry_key, leg, account, currency, amount) VALUES {}",
        values_placeholders(5, postings.len())
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for (leg, posting) in postings.iter().enumerate() {
        query = query
            .bind(entry_key)
            .bind(leg as i64)
            .bind(posting.account.to_string())
            .bind(posting.currency.to_string())
            .bind(posting.amount_minor.to_string());
    }
    query.execute(conn).await?;
    Ok(())
}

/// The sum of every posting to `account` in `currency`: its balance, derived, never cached.
pub(crate) async fn account_sum(
    conn: &mut AnyConnection,
    account: &Account,
    currency: Currency,
) -> Result<i128, StoreError> {
    let mut rows = sqlx::query("SELECT amount FROM postings WHERE account = $1 AND currency = $2")
        .bind(account.to_string())
        .bind(currency.to_string())
        .fetch(conn);
    let mut sum: i128 = 0;
    while let Some(row) = rows.try_next().await? {
        let amount = parse_amount(&row.try_get::<String, _>(0)?)?;
        sum = sum
            .checked_add(amount)
            .ok_or_else(|| StoreError::Corrupt(format!("balance of {account} overflows")))?;
    }
    Ok(sum)
}

/// One entry by its key, with its legs in order.
pub(crate) async fn get_entry(
    conn: &mut AnyConnection,
    key: &str,
) -> Result<Option<PostedEntry>, StoreError> {
    let header = sqlx::query(
        "SELECT seq, idempotency_key, kind, reference, memo, posted_at_ms FROM journal_entries WHERE idempotency_key = $1",
    )
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(header) = header else {
        return Ok(None);
    };
    let postings = sqlx::query(
        "SELECT account, currency, amount FROM postings WHERE entry_key = $1 ORDER BY leg",
    )
    .bind(key)
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(decode_posting)
    .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(PostedEntry {
        seq: header.try_get("seq")?,
        posted_at: millis(header.try_get("posted_at_ms")?)?,
        entry: NewEntry {
            idempotency_key: header.try_get("idempotency_key")?,
            kind: header
                .try_get::<String, _>("kind")?
                .parse()
                .map_err(|e: LedgerError| StoreError::Corrupt(e.to_string()))?,
            reference: header.try_get("reference")?,
            memo: header.try_get("memo")?,
            postings,
        },
    }))
}

/// The keys of every entry that names `reference`, oldest first.
pub(crate) async fn entry_keys_for_reference(
    conn: &mut AnyConnection,
    reference: &str,
) -> Result<Vec<String>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT idempotency_key FROM journal_entries WHERE reference = $1 ORDER BY seq",
    )
    .bind(reference)
    .fetch_all(conn)
    .await?)
}

/// Streams every posting once and folds them into per-entry and per-account sums, without
/// holding the journal in memory: one pass serves the trial balance and the invariant check.
pub(crate) async fn fold_postings(
    conn: &mut AnyConnection,
) -> Result<PostingTotals, StoreError> {
    let mut rows = sqlx::query(
        "SELECT entry_key, account, currency, amount FROM postings ORDER BY entry_key, leg",
    )
    .fetch(conn);
    let mut totals = PostingTotals::default();
    let mut current_entry: Option<(String, BTreeMap<Currency, i128>)> = None;
    while let Some(row) = rows.try_next().await? {
        let entry_key: String = row.try_get(0)?;
        let posting = decode_posting_at(&row, 1)?;
        if current_entry.as_ref().is_none_or(|(key, _)| *key != entry_key) {
            if let Some(done) = current_entry.take() {
                totals.close_entry(done);
            }
            current_entry = Some((entry_key, BTreeMap::new()));
        }
        let (_, sums) = current_entry.as_mut().expect("set above");
        *sums.entry(posting.currency).or_insert(0) += posting.amount_minor;
        *totals
            .by_account
            .entry((posting.account.to_string(), posting.currency))
            .or_insert(0) += posting.amount_minor;
        *totals.by_currency.entry(posting.currency).or_insert(0) += posting.amount_minor;
        totals.postings += 1;
    }
    if let Some(done) = current_entry.take() {
        totals.close_entry(done);
    }
    Ok(totals)
}

/// What one pass over the journal found.
#[derive(Debug, Default)]
pub(crate) struct PostingTotals {
    /// Each account's balance per currency.
    pub by_account: BTreeMap<(String, Currency), i128>,
    /// Each currency's sum over the whole journal: zero when every entry balanced.
    pub by_currency: BTreeMap<Currency, i128>,
    /// Entries read.
    pub entries: u64,
    /// Postings read.
    pub postings: u64,
    /// Keys of entries whose legs do not sum to zero in some currency.
    pub unbalanced_entries: Vec<String>,
}

impl PostingTotals {
    fn close_entry(&mut self, (key, sums): (String, BTreeMap<Currency, i128>)) {
        self.entries += 1;
        if sums.values().any(|sum| *sum != 0) {
            self.unbalanced_entries.push(key);
        }
    }
}

fn decode_posting(row: &sqlx::any::AnyRow) -> Result<Posting, StoreError> {
    decode_posting_at(row, 0)
}

fn decode_posting_at(row: &sqlx::any::AnyRow, first: usize) -> Result<Posting, StoreError> {
    let corrupt = |e: LedgerError| StoreError::Corrupt(e.to_string());
    Ok(Posting {
        account: row.try_get::<String, _>(first)?.parse().map_err(corrupt)?,
        currency: row
            .try_get::<String, _>(first + 1)?
            .parse()
            .map_err(corrupt)?,
        amount_minor: parse_amount(&row.try_get::<String, _>(first + 2)?)?,
    })
}

fn parse_amount(text: &str) -> Result<i128, StoreError> {
    text.parse()
        .map_err(|_| StoreError::Corrupt(format!("posting amount {text:?}")))
}
