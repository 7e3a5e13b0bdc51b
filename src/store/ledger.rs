//! SQL for the journal: entries, postings and the sums balances are derived from.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use sqlx::{AnyConnection, Row};

use super::orders::millis;
use super::{StoreError, WriteTx, list_placeholders, rows_per_statement, values_placeholders};
use crate::ledger::{Account, Currency, LedgerError, NewEntry, PostOutcome, PostedEntry, Posting};
use crate::order::AccountId;

/// Rows per multi-row insert: keeps every statement under SQLite's and PostgreSQL's limits on
/// bound parameters (32,766 and 65,535) whatever the batch size.
const ROWS_PER_INSERT: usize = 1_000;

/// Posts validated entries inside `tx`, each once per idempotency key, in a fixed number of
/// statements per batch: round-trips, not rows, bound the throughput of an embedded store.
///
/// A replay with the same content is a no-op that says so; a replay with other content is
/// refused, and so is an entry that would take a customer's balance below zero. A refusal
/// leaves the caller's transaction to roll back: a batch posts whole or not at all.
pub async fn post_batch(
    tx: &mut WriteTx,
    entries: &[NewEntry],
    now: DateTime<Utc>,
) -> Result<Result<Vec<PostOutcome>, LedgerError>, StoreError> {
    debug_assert!(
        entries.iter().all(NewEntry::balances),
        "an entry balances before it is inserted"
    );
    let hashes: Vec<String> = entries.iter().map(NewEntry::content_hash).collect();
    let mut first_of_key: HashMap<&str, usize> = HashMap::new();
    let mut outcomes = vec![PostOutcome::AlreadyPosted; entries.len()];
    let mut fresh = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        match first_of_key.entry(&entry.idempotency_key) {
            Entry::Vacant(slot) => {
                slot.insert(index);
                fresh.push(index);
            }
            Entry::Occupied(first) if hashes[*first.get()] == hashes[index] => {}
            Entry::Occupied(_) => {
                return Ok(Err(LedgerError::IdempotencyConflict(
                    entry.idempotency_key.clone(),
                )));
            }
        }
    }

    // An entry posted while its time falls in a closed period counts in the first open one.
    let closed_through = super::books::closed_through(tx).await?;
    let booked_at = (now.timestamp_millis() < closed_through).then_some(closed_through);
    let mut inserted: HashMap<String, i64> = HashMap::new();
    for chunk in fresh.chunks(ROWS_PER_INSERT) {
        let sql = format!(
            "INSERT INTO journal_entries (idempotency_key, kind, reference, memo, content_hash, posted_at_ms, booked_at_ms) \
             VALUES {} ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key, seq",
            values_placeholders(tx.backend(), 7, chunk.len())
        );
        let mut query = sqlx::query_as::<_, (String, i64)>(sqlx::AssertSqlSafe(sql));
        for &index in chunk {
            let entry = &entries[index];
            query = query
                .bind(entry.idempotency_key.as_str())
                .bind(entry.kind.as_str())
                .bind(entry.reference.as_deref())
                .bind(entry.memo.as_str())
                .bind(hashes[index].as_str())
                .bind(now.timestamp_millis())
                .bind(booked_at);
        }
        inserted.extend(query.fetch_all(tx.conn()).await?);
    }

    let replayed: Vec<usize> = fresh
        .iter()
        .copied()
        .filter(|index| !inserted.contains_key(&entries[*index].idempotency_key))
        .collect();
    for chunk in replayed.chunks(ROWS_PER_INSERT) {
        let sql = format!(
            "SELECT idempotency_key, content_hash FROM journal_entries WHERE idempotency_key IN ({})",
            list_placeholders(tx.backend(), chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for &index in chunk {
            query = query.bind(entries[index].idempotency_key.as_str());
        }
        let stored: HashMap<String, String> = query
            .fetch_all(tx.conn())
            .await?
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()?;
        for &index in chunk {
            let key = &entries[index].idempotency_key;
            if stored.get(key) != Some(&hashes[index]) {
                return Ok(Err(LedgerError::IdempotencyConflict(key.clone())));
            }
        }
    }

    let new_entries: Vec<usize> = fresh
        .into_iter()
        .filter(|index| inserted.contains_key(&entries[*index].idempotency_key))
        .collect();
    if let Err(refusal) = check_customer_debits(tx, entries, &new_entries, now).await? {
        return Ok(Err(refusal));
    }
    let rows: Vec<(i64, usize, &Posting)> = new_entries
        .iter()
        .flat_map(|&index| {
            let entry = &entries[index];
            let seq = inserted[&entry.idempotency_key];
            entry
                .postings
                .iter()
                .enumerate()
                .map(move |(leg, posting)| (seq, leg, posting))
        })
        .collect();
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        insert_postings(tx, chunk).await?;
    }
    for index in new_entries {
        outcomes[index] = PostOutcome::Posted;
    }
    Ok(Ok(outcomes))
}

/// Locks every customer a batch debits and walks the batch in order against their balances,
/// so no entry, alone or after the ones before it, takes a balance below zero.
async fn check_customer_debits(
    tx: &mut WriteTx,
    entries: &[NewEntry],
    new_entries: &[usize],
    now: DateTime<Utc>,
) -> Result<Result<(), LedgerError>, StoreError> {
    let nets: Vec<(usize, BTreeMap<AccountId, i128>)> = new_entries
        .iter()
        .map(|&index| (index, entries[index].customer_nets()))
        .filter(|(_, nets)| !nets.is_empty())
        .collect();
    let debited: BTreeSet<&AccountId> = nets
        .iter()
        .flat_map(|(_, nets)| nets.iter().filter(|(_, net)| **net > 0).map(|(id, _)| id))
        .collect();
    if debited.is_empty() {
        return Ok(Ok(()));
    }
    let debited: Vec<&AccountId> = debited.into_iter().collect();
    lock_customers(tx, &debited, now).await?;
    let mut balances = customer_sums(tx, &debited).await?;
    for (_, entry_nets) in &nets {
        for (customer, net) in entry_nets {
            let Some(balance) = balances.get_mut(customer) else {
                continue;
            };
            debug_assert!(*balance <= 0, "{customer}'s balance is never negative");
            if *net > 0 && *balance + net > 0 {
                return Ok(Err(LedgerError::Overdraft {
                    account: customer.clone(),
                    available: Currency::Usd.format(-*balance),
                    debit: Currency::Usd.format(*net),
                }));
            }
            *balance += net;
        }
    }
    Ok(Ok(()))
}

/// Locks one customer and returns the sum of their balance postings (negated: what they
/// have), for a caller that must decide how much of a debit the balance can cover.
pub(crate) async fn lock_and_sum_customer(
    tx: &mut WriteTx,
    customer: &AccountId,
    now: DateTime<Utc>,
) -> Result<i128, StoreError> {
    lock_customers(tx, &[customer], now).await?;
    Ok(customer_sums(tx, &[customer])
        .await?
        .remove(customer)
        .unwrap_or(0))
}

/// Locks many customers and returns their balance sums, in two statements.
pub(crate) async fn lock_and_sum_customers(
    tx: &mut WriteTx,
    customers: &[&AccountId],
    now: DateTime<Utc>,
) -> Result<HashMap<AccountId, i128>, StoreError> {
    if customers.is_empty() {
        return Ok(HashMap::new());
    }
    lock_customers(tx, customers, now).await?;
    customer_sums(tx, customers).await
}

/// Which of these idempotency keys are in the journal already.
pub(crate) async fn existing_keys(
    conn: &mut AnyConnection,
    keys: &[&str],
) -> Result<HashSet<String>, StoreError> {
    let mut existing = HashSet::new();
    for chunk in keys.chunks(rows_per_statement(1)) {
        let sql = format!(
            "SELECT idempotency_key FROM journal_entries WHERE idempotency_key IN ({})",
            list_placeholders(super::backend_of_conn(conn), chunk.len())
        );
        let mut query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql));
        for key in chunk {
            query = query.bind(*key);
        }
        existing.extend(query.fetch_all(&mut *conn).await?);
    }
    Ok(existing)
}

/// Creates (if new) and locks the customers' rows in one statement, in a stable order so two
/// batches never wait on each other crosswise. On SQLite the write lock already serializes.
async fn lock_customers(
    tx: &mut WriteTx,
    customers: &[&AccountId],
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let sql = format!(
        "INSERT INTO customers (account_id, created_at_ms) VALUES {} \
         ON CONFLICT (account_id) DO UPDATE SET account_id = excluded.account_id",
        values_placeholders(tx.backend(), 2, customers.len())
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for customer in customers {
        query = query.bind(customer.as_str()).bind(now.timestamp_millis());
    }
    query.execute(tx.conn()).await?;
    Ok(())
}

/// The USD sums of the customers' balance accounts, read in one statement.
async fn customer_sums(
    tx: &mut WriteTx,
    customers: &[&AccountId],
) -> Result<HashMap<AccountId, i128>, StoreError> {
    let accounts: Vec<String> = customers
        .iter()
        .map(|id| Account::CustomerBalance((*id).clone()).to_string())
        .collect();
    let sql = format!(
        "SELECT account, amount FROM postings WHERE currency = 'USD' AND account IN ({})",
        list_placeholders(tx.backend(), accounts.len())
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for account in &accounts {
        query = query.bind(account.as_str());
    }
    let mut sums: HashMap<AccountId, i128> =
        customers.iter().map(|id| ((*id).clone(), 0)).collect();
    let mut rows = query.fetch(tx.conn());
    while let Some(row) = rows.try_next().await? {
        let account: Account = row
            .try_get::<String, _>(0)?
            .parse()
            .map_err(|e: LedgerError| StoreError::Corrupt(e.to_string()))?;
        let amount = parse_amount(&row.try_get::<String, _>(1)?)?;
        if let Some(customer) = account.customer()
            && let Some(sum) = sums.get_mut(customer)
        {
            *sum = sum
                .checked_add(amount)
                .ok_or_else(|| StoreError::Corrupt(format!("balance of {account} overflows")))?;
        }
    }
    Ok(sums)
}

async fn insert_postings(
    tx: &mut WriteTx,
    rows: &[(i64, usize, &Posting)],
) -> Result<(), StoreError> {
    // Entries written, their legs not yet: a crash here must leave no entry without legs.
    crate::crash::crash_point("ledger.before_postings");
    let sql = format!(
        "INSERT INTO postings (entry_seq, leg, account, currency, amount) VALUES {}",
        values_placeholders(tx.backend(), 5, rows.len())
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for (entry_seq, leg, posting) in rows {
        query = query
            .bind(*entry_seq)
            .bind(*leg as i64)
            .bind(posting.account.to_string())
            .bind(posting.currency.to_string())
            .bind(posting.amount_minor.to_string());
    }
    query.execute(tx.conn()).await?;
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

/// One posting to an account, with the header of its entry: a line of a statement.
#[derive(Clone, Debug)]
pub(crate) struct Movement {
    pub seq: i64,
    pub key: String,
    pub kind: String,
    pub reference: String,
    pub memo: String,
    pub posted_at_ms: i64,
    pub amount: i128,
}

/// Every posting to `account` in `currency`, in journal order (`postings_by_account`).
pub(crate) async fn movements(
    conn: &mut AnyConnection,
    account: &Account,
    currency: Currency,
) -> Result<Vec<Movement>, StoreError> {
    sqlx::query(
        "SELECT j.seq, j.idempotency_key, j.kind, j.reference, j.memo, j.posted_at_ms, p.amount \
         FROM postings p JOIN journal_entries j ON j.seq = p.entry_seq \
         WHERE p.account = $1 AND p.currency = $2 ORDER BY p.entry_seq, p.leg",
    )
    .bind(account.to_string())
    .bind(currency.to_string())
    .fetch_all(conn)
    .await?
    .iter()
    .map(|row| {
        Ok(Movement {
            seq: row.try_get(0)?,
            key: row.try_get(1)?,
            kind: row.try_get(2)?,
            reference: row.try_get(3)?,
            memo: row.try_get(4)?,
            posted_at_ms: row.try_get(5)?,
            amount: parse_amount(&row.try_get::<String, _>(6)?)?,
        })
    })
    .collect()
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
    let seq: i64 = header.try_get("seq")?;
    let postings = sqlx::query(
        "SELECT account, currency, amount FROM postings WHERE entry_seq = $1 ORDER BY leg",
    )
    .bind(seq)
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(decode_posting)
    .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(decode_entry(&header, postings)?))
}

/// An entry from its header row (seq, key, kind, reference, memo, time) and its legs.
fn decode_entry(
    header: &sqlx::any::AnyRow,
    postings: Vec<Posting>,
) -> Result<PostedEntry, StoreError> {
    let posted = PostedEntry {
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
    };
    debug_assert!(
        posted.entry.balances(),
        "entry {} balances after it is read",
        posted.entry.idempotency_key
    );
    Ok(posted)
}

/// The entries with these keys that exist, with their legs in order: two statements per
/// [`rows_per_statement`] keys.
pub(crate) async fn get_entries(
    conn: &mut AnyConnection,
    keys: &[&str],
) -> Result<Vec<PostedEntry>, StoreError> {
    let backend = super::backend_of_conn(conn);
    let mut entries = Vec::new();
    for chunk in keys.chunks(rows_per_statement(1)) {
        let sql = format!(
            "SELECT seq, idempotency_key, kind, reference, memo, posted_at_ms FROM journal_entries \
             WHERE idempotency_key IN ({}) ORDER BY seq",
            list_placeholders(backend, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for key in chunk {
            query = query.bind(*key);
        }
        let headers = query.fetch_all(&mut *conn).await?;
        if headers.is_empty() {
            continue;
        }
        let seqs: Vec<i64> = headers
            .iter()
            .map(|row| row.try_get("seq"))
            .collect::<Result<_, _>>()?;
        let sql = format!(
            "SELECT entry_seq, account, currency, amount FROM postings WHERE entry_seq IN ({}) ORDER BY entry_seq, leg",
            list_placeholders(backend, seqs.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for seq in &seqs {
            query = query.bind(*seq);
        }
        let mut legs: HashMap<i64, Vec<Posting>> = HashMap::new();
        for row in query.fetch_all(&mut *conn).await? {
            legs.entry(row.try_get(0)?)
                .or_default()
                .push(decode_posting_at(&row, 1)?);
        }
        for header in &headers {
            let seq: i64 = header.try_get("seq")?;
            entries.push(decode_entry(header, legs.remove(&seq).unwrap_or_default())?);
        }
    }
    Ok(entries)
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

/// Every account's balance and the journal's invariants, by aggregates in the database: per
/// account and currency sums, counts, and the entries whose legs do not sum to zero in some
/// currency (candidates found in SQL, each checked exactly).
pub(crate) async fn journal_totals(conn: &mut AnyConnection) -> Result<PostingTotals, StoreError> {
    let backend = super::backend_of_conn(conn);
    let mut totals = PostingTotals::default();
    let sql = format!(
        "SELECT account, currency, {} FROM postings GROUP BY account, currency",
        super::exact_sum(backend, "amount")
    );
    for row in sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(&mut *conn)
        .await?
    {
        let account: String = row.try_get(0)?;
        let currency: Currency = row
            .try_get::<String, _>(1)?
            .parse()
            .map_err(|e: LedgerError| StoreError::Corrupt(e.to_string()))?;
        let sum = super::decode_exact_sum(&row, 2, backend)?;
        let total = totals.by_currency.entry(currency).or_insert(0);
        *total = total
            .checked_add(sum)
            .ok_or_else(|| StoreError::Corrupt(format!("the {currency} total overflows")))?;
        totals.by_account.insert((account, currency), sum);
    }
    let count = |table: &str| format!("SELECT COUNT(*) FROM {table}");
    totals.entries = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(count("journal_entries")))
        .fetch_one(&mut *conn)
        .await?
        .try_into()
        .unwrap_or(0);
    totals.postings = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(count("postings")))
        .fetch_one(&mut *conn)
        .await?
        .try_into()
        .unwrap_or(0);
    let sql = format!(
        "SELECT entry_seq FROM postings GROUP BY entry_seq, currency HAVING {}",
        super::exact_sum_is_not_zero(backend, "amount")
    );
    let mut candidates: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_all(&mut *conn)
        .await?;
    candidates.sort_unstable();
    candidates.dedup();
    for chunk in candidates.chunks(rows_per_statement(1)) {
        let sql = format!(
            "SELECT entry_seq, account, currency, amount FROM postings WHERE entry_seq IN ({})",
            list_placeholders(backend, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for seq in chunk {
            query = query.bind(*seq);
        }
        let mut sums: BTreeMap<(i64, Currency), i128> = BTreeMap::new();
        for row in query.fetch_all(&mut *conn).await? {
            let posting = decode_posting_at(&row, 1)?;
            *sums.entry((row.try_get(0)?, posting.currency)).or_insert(0) += posting.amount_minor;
        }
        let mut unbalanced: Vec<i64> = sums
            .into_iter()
            .filter(|(_, sum)| *sum != 0)
            .map(|((seq, _), _)| seq)
            .collect();
        unbalanced.dedup();
        totals.unbalanced_entries.extend(unbalanced);
    }
    Ok(totals)
}

/// What the journal holds, summed.
#[derive(Debug, Default)]
pub(crate) struct PostingTotals {
    /// Each account's balance per currency.
    pub by_account: BTreeMap<(String, Currency), i128>,
    /// Each currency's sum over the whole journal: zero when every entry balanced.
    pub by_currency: BTreeMap<Currency, i128>,
    /// Entries in the journal.
    pub entries: u64,
    /// Postings in the journal.
    pub postings: u64,
    /// Journal positions of entries whose legs do not sum to zero in some currency.
    pub unbalanced_entries: Vec<i64>,
}

pub(crate) fn decode_posting(row: &sqlx::any::AnyRow) -> Result<Posting, StoreError> {
    decode_posting_at(row, 0)
}

pub(crate) fn decode_posting_at(
    row: &sqlx::any::AnyRow,
    first: usize,
) -> Result<Posting, StoreError> {
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
