//! SQL for the books: the booking date entries get, valuations, the period log, and the
//! period's entries read page by page for the close and the exports.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::{AnyConnection, Row};

use super::ledger::decode_posting_at;
use super::orders::millis;
use super::{StoreError, WriteTx, list_placeholders, values_placeholders};
use crate::ledger::{LedgerError, NewEntry, Posting};
use crate::records::{CryptoRate, HeldRate, ReportingRate, Valuation};

/// An entry's accounting date, as SQL: when it was booked into an open period, else when it
/// was posted. `journal_entries_by_booking` indexes exactly this expression.
pub(crate) const BOOKING: &str = "COALESCE(j.booked_at_ms, j.posted_at_ms)";

/// The end of the last closed period: nothing may be booked before it. On PostgreSQL the row
/// is read `FOR SHARE`, so a close (which updates it) waits for this transaction and this
/// transaction for a close: an entry never lands in a period closed under it.
pub(crate) async fn closed_through(tx: &mut WriteTx) -> Result<i64, StoreError> {
    let sql = tx.backend().pick(
        "SELECT closed_through_ms FROM books_state WHERE id = 1",
        "SELECT closed_through_ms FROM books_state WHERE id = 1 FOR SHARE",
    );
    Ok(sqlx::query_scalar(sql).fetch_one(tx.conn()).await?)
}

/// The books' state: where closing has reached and the time zone it was cut in.
pub(crate) async fn state(conn: &mut AnyConnection) -> Result<(i64, Option<String>), StoreError> {
    let row = sqlx::query("SELECT closed_through_ms, timezone FROM books_state WHERE id = 1")
        .fetch_one(conn)
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// The books' state, locked for a close or reopen (PostgreSQL `FOR UPDATE`; SQLite's write
/// transaction holds the whole database).
pub(crate) async fn lock_state(tx: &mut WriteTx) -> Result<(i64, Option<String>), StoreError> {
    let sql = tx.backend().pick(
        "SELECT closed_through_ms, timezone FROM books_state WHERE id = 1",
        "SELECT closed_through_ms, timezone FROM books_state WHERE id = 1 FOR UPDATE",
    );
    let row = sqlx::query(sql).fetch_one(tx.conn()).await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// Moves the closing line (a close forward, a reopen back), fixing the time zone.
pub(crate) async fn set_closed_through(
    tx: &mut WriteTx,
    closed_through_ms: i64,
    timezone: &str,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE books_state SET closed_through_ms = $1, timezone = $2 WHERE id = 1")
        .bind(closed_through_ms)
        .bind(timezone)
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// One close or reopen, as logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PeriodEvent {
    pub(crate) seq: i64,
    pub(crate) period: String,
    pub(crate) action: String,
    pub(crate) actor: String,
    pub(crate) reason: String,
    pub(crate) at: DateTime<Utc>,
    pub(crate) entries: Option<i64>,
    pub(crate) entries_sha256: Option<String>,
    pub(crate) snapshot: Option<String>,
}

/// Appends a close or reopen to the period log.
pub(crate) async fn log_period_event(
    tx: &mut WriteTx,
    event: &PeriodEvent,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO period_events (period, action, actor, reason, at_ms, entries, entries_sha256, snapshot) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(event.period.as_str())
    .bind(event.action.as_str())
    .bind(event.actor.as_str())
    .bind(event.reason.as_str())
    .bind(event.at.timestamp_millis())
    .bind(event.entries)
    .bind(event.entries_sha256.as_deref())
    .bind(event.snapshot.as_deref())
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// The period log, oldest first; one period's when `period` is given.
pub(crate) async fn period_events(
    conn: &mut AnyConnection,
    period: Option<&str>,
) -> Result<Vec<PeriodEvent>, StoreError> {
    const COLUMNS: &str = "SELECT seq, period, action, actor, reason, at_ms, entries, entries_sha256, snapshot FROM period_events";
    let rows = match period {
        Some(period) => {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "{COLUMNS} WHERE period = $1 ORDER BY seq"
            )))
            .bind(period)
            .fetch_all(conn)
            .await?
        }
        None => {
            sqlx::query(sqlx::AssertSqlSafe(format!("{COLUMNS} ORDER BY seq")))
                .fetch_all(conn)
                .await?
        }
    };
    rows.iter()
        .map(|row| {
            Ok(PeriodEvent {
                seq: row.try_get(0)?,
                period: row.try_get(1)?,
                action: row.try_get(2)?,
                actor: row.try_get(3)?,
                reason: row.try_get(4)?,
                at: millis(row.try_get(5)?)?,
                entries: row.try_get(6)?,
                entries_sha256: row.try_get(7)?,
                snapshot: row.try_get(8)?,
            })
        })
        .collect()
}

/// An entry of a period, with its valuation if it has one.
#[derive(Clone, Debug)]
pub(crate) struct PeriodEntry {
    pub(crate) seq: i64,
    pub(crate) booked_at: DateTime<Utc>,
    pub(crate) posted_at: DateTime<Utc>,
    pub(crate) entry: NewEntry,
    pub(crate) valuation: Option<Valuation>,
}

/// Where a page of [`period_page`] starts: after this booking time and journal position.
pub(crate) type PageStart = (i64, i64);

const VALUATION_COLUMNS: &str = "v.crypto_currency, v.usd_per_unit, v.crypto_source, v.crypto_at_ms, v.basis, \
     v.txids, v.reporting_currency, v.usd_per_reporting, v.reporting_source, v.reporting_at_ms, v.valued_at_ms, \
     v.held_usd_per_unit, v.held_usd_per_reporting";

/// Up to `limit` entries booked in `[from_ms, to_ms)` after `start`, in booking order (then
/// journal order), with their legs and valuations: two statements a page, memory flat. The
/// page's first booking time bounds the range it reads on `journal_entries_by_booking`, so a
/// page reads its own rows only: bounded by the month alone, with the position as a filter,
/// every page read the month's earlier rows again (quadratic; on PostgreSQL a 1M-row month
/// took ten times the report). SQLite does not bound an expression index by a row value.
pub(crate) async fn period_page(
    conn: &mut AnyConnection,
    from_ms: i64,
    to_ms: i64,
    start: Option<PageStart>,
    limit: i64,
) -> Result<Vec<PeriodEntry>, StoreError> {
    // The page's first booking time is the index range's lower bound; within that one
    // millisecond, the journal position says where the last page stopped.
    let (lower_ms, after_seq) = start.unwrap_or((from_ms, i64::MIN));
    let sql = format!(
        "SELECT j.seq, {BOOKING}, j.posted_at_ms, j.idempotency_key, j.kind, j.reference, j.memo, {VALUATION_COLUMNS} \
         FROM journal_entries j LEFT JOIN entry_valuations v ON v.entry_seq = j.seq \
         WHERE {BOOKING} >= $1 AND {BOOKING} < $2 AND ({BOOKING} > $1 OR j.seq > $3) \
         ORDER BY {BOOKING}, j.seq LIMIT $4"
    );
    let headers = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(lower_ms.max(from_ms))
        .bind(to_ms)
        .bind(after_seq)
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?;
    if headers.is_empty() {
        return Ok(Vec::new());
    }
    let seqs: Vec<i64> = headers
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    let mut legs = postings_of(conn, &seqs).await?;
    headers
        .iter()
        .map(|row| decode_period_entry(row, &mut legs, true))
        .collect()
}

/// An entry from the columns both period reads start with (position, booking time, posting
/// time, key, kind, reference, memo), its legs, and its valuation when the row carries one.
fn decode_period_entry(
    row: &sqlx::any::AnyRow,
    legs: &mut HashMap<i64, Vec<Posting>>,
    with_valuation: bool,
) -> Result<PeriodEntry, StoreError> {
    let seq: i64 = row.try_get(0)?;
    let entry = NewEntry {
        idempotency_key: row.try_get(3)?,
        kind: row
            .try_get::<String, _>(4)?
            .parse()
            .map_err(|e: LedgerError| StoreError::Corrupt(e.to_string()))?,
        reference: row.try_get(5)?,
        memo: row.try_get(6)?,
        postings: legs.remove(&seq).unwrap_or_default(),
    };
    debug_assert!(entry.balances(), "entry {seq} balances after it is read");
    Ok(PeriodEntry {
        seq,
        booked_at: millis(row.try_get(1)?)?,
        posted_at: millis(row.try_get(2)?)?,
        entry,
        valuation: if with_valuation {
            decode_valuation(row, seq, 7)?
        } else {
            None
        },
    })
}

/// The legs of entries `seqs`, in leg order.
async fn postings_of(
    conn: &mut AnyConnection,
    seqs: &[i64],
) -> Result<HashMap<i64, Vec<Posting>>, StoreError> {
    let backend = super::backend_of_conn(conn);
    let mut legs: HashMap<i64, Vec<Posting>> = HashMap::with_capacity(seqs.len());
    for chunk in seqs.chunks(super::rows_per_statement(1)) {
        let sql = format!(
            "SELECT entry_seq, account, currency, amount FROM postings WHERE entry_seq IN ({}) ORDER BY entry_seq, leg",
            list_placeholders(backend, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for seq in chunk {
            query = query.bind(*seq);
        }
        for row in query.fetch_all(&mut *conn).await? {
            legs.entry(row.try_get(0)?)
                .or_default()
                .push(decode_posting_at(&row, 1)?);
        }
    }
    Ok(legs)
}

fn decode_valuation(
    row: &sqlx::any::AnyRow,
    seq: i64,
    first: usize,
) -> Result<Option<Valuation>, StoreError> {
    let column = |i: usize| first + i;
    let Some(basis) = row.try_get::<Option<String>, _>(column(4))? else {
        return Ok(None);
    };
    let corrupt = |what: &str| StoreError::Corrupt(format!("valuation of entry {seq}: {what}"));
    let decimal = |i: usize| -> Result<Option<rust_decimal::Decimal>, StoreError> {
        row.try_get::<Option<String>, _>(column(i))?
            .map(|text| text.parse().map_err(|_| corrupt("a rate is not a decimal")))
            .transpose()
    };
    let crypto = match row.try_get::<Option<String>, _>(column(0))? {
        None => None,
        Some(method) => Some(CryptoRate {
            method: method.parse().map_err(|_| corrupt("unknown method"))?,
            usd_per_unit: decimal(1)?.ok_or_else(|| corrupt("no crypto rate"))?,
            source: row
                .try_get::<Option<String>, _>(column(2))?
                .unwrap_or_default(),
            at: millis(row.try_get::<Option<i64>, _>(column(3))?.unwrap_or(0))?,
        }),
    };
    let reporting = match row.try_get::<Option<String>, _>(column(6))? {
        None => None,
        Some(currency) => Some(ReportingRate {
            currency,
            usd_per_unit: decimal(7)?.ok_or_else(|| corrupt("no reporting rate"))?,
            source: row
                .try_get::<Option<String>, _>(column(8))?
                .unwrap_or_default(),
            at: millis(row.try_get::<Option<i64>, _>(column(9))?.unwrap_or(0))?,
        }),
    };
    let held = match decimal(11)? {
        None => None,
        Some(usd_per_unit) => Some(HeldRate {
            usd_per_unit,
            usd_per_reporting: decimal(12)?,
        }),
    };
    Ok(Some(Valuation {
        entry_seq: seq,
        crypto,
        basis,
        txids: row.try_get(column(5))?,
        reporting,
        held,
        valued_at: millis(row.try_get(column(10))?)?,
    }))
}

/// Up to `limit` entries after journal position `after` that have no valuation, oldest first.
pub(crate) async fn unvalued_after(
    conn: &mut AnyConnection,
    after: i64,
    limit: i64,
) -> Result<Vec<PeriodEntry>, StoreError> {
    let rows = sqlx::query(
        "SELECT j.seq, COALESCE(j.booked_at_ms, j.posted_at_ms), j.posted_at_ms, j.idempotency_key, j.kind, j.reference, j.memo \
         FROM journal_entries j WHERE j.seq > $1 \
         AND NOT EXISTS (SELECT 1 FROM entry_valuations v WHERE v.entry_seq = j.seq) \
         ORDER BY j.seq LIMIT $2",
    )
    .bind(after)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    let seqs: Vec<i64> = rows
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    let mut legs = postings_of(conn, &seqs).await?;
    rows.iter()
        .map(|row| decode_period_entry(row, &mut legs, false))
        .collect()
}

/// The valuation of the entry with key `key`, if it is valued.
pub(crate) async fn valuation_by_key(
    conn: &mut AnyConnection,
    key: &str,
) -> Result<Option<Valuation>, StoreError> {
    let sql = format!(
        "SELECT j.seq, {VALUATION_COLUMNS} FROM journal_entries j \
         JOIN entry_valuations v ON v.entry_seq = j.seq WHERE j.idempotency_key = $1"
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(key)
        .fetch_optional(conn)
        .await?;
    match row {
        None => Ok(None),
        Some(row) => {
            let seq: i64 = row.try_get(0)?;
            decode_valuation(&row, seq, 1)
        }
    }
}

/// The transactions whose transfers each of `keys` booked, in order: one statement a page.
pub(crate) async fn txids_of_entries(
    conn: &mut AnyConnection,
    keys: &[&str],
) -> Result<HashMap<String, Vec<String>>, StoreError> {
    let backend = super::backend_of_conn(conn);
    let mut txids: HashMap<String, Vec<String>> = HashMap::new();
    for chunk in keys.chunks(super::rows_per_statement(1)) {
        let sql = format!(
            "SELECT credited_entry, txid FROM transfers WHERE credited_entry IN ({}) \
             ORDER BY credited_entry, network, txid, position",
            list_placeholders(backend, chunk.len())
        );
        let mut query = sqlx::query_as::<_, (String, String)>(sqlx::AssertSqlSafe(sql));
        for key in chunk {
            query = query.bind(*key);
        }
        for (key, txid) in query.fetch_all(&mut *conn).await? {
            txids.entry(key).or_default().push(txid);
        }
    }
    Ok(txids)
}

/// Writes valuations; one already there for an entry is kept (a valuation is written once).
pub(crate) async fn insert_valuations(
    tx: &mut WriteTx,
    valuations: &[Valuation],
) -> Result<(), StoreError> {
    for chunk in valuations.chunks(super::rows_per_statement(14)) {
        let sql = format!(
            "INSERT INTO entry_valuations (entry_seq, crypto_currency, usd_per_unit, crypto_source, crypto_at_ms, \
             basis, txids, reporting_currency, usd_per_reporting, reporting_source, reporting_at_ms, valued_at_ms, \
             held_usd_per_unit, held_usd_per_reporting) \
             VALUES {} ON CONFLICT (entry_seq) DO NOTHING",
            values_placeholders(tx.backend(), 14, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for v in chunk {
            let crypto = v.crypto.as_ref();
            let reporting = v.reporting.as_ref();
            query = query
                .bind(v.entry_seq)
                .bind(crypto.map(|c| c.method.id()))
                .bind(crypto.map(|c| c.usd_per_unit.to_string()))
                .bind(crypto.map(|c| c.source.clone()))
                .bind(crypto.map(|c| c.at.timestamp_millis()))
                .bind(v.basis.as_str())
                .bind(v.txids.as_str())
                .bind(reporting.map(|r| r.currency.clone()))
                .bind(reporting.map(|r| r.usd_per_unit.to_string()))
                .bind(reporting.map(|r| r.source.clone()))
                .bind(reporting.map(|r| r.at.timestamp_millis()))
                .bind(v.valued_at.timestamp_millis())
                .bind(v.held.as_ref().map(|h| h.usd_per_unit.to_string()))
                .bind(
                    v.held
                        .as_ref()
                        .and_then(|h| h.usd_per_reporting)
                        .map(|r| r.to_string()),
                );
        }
        query.execute(tx.conn()).await?;
    }
    Ok(())
}

/// Entries without a valuation: how many, and the oldest's posting time.
pub(crate) async fn unvalued_count(
    conn: &mut AnyConnection,
) -> Result<(i64, Option<DateTime<Utc>>), StoreError> {
    let row = sqlx::query(
        "SELECT COUNT(*), MIN(j.posted_at_ms) FROM journal_entries j \
         WHERE NOT EXISTS (SELECT 1 FROM entry_valuations v WHERE v.entry_seq = j.seq)",
    )
    .fetch_one(conn)
    .await?;
    let oldest: Option<i64> = row.try_get(1)?;
    Ok((row.try_get(0)?, oldest.map(millis).transpose()?))
}

/// How many entries are booked before `to_ms`, and the last journal position among them: what
/// a close checks did not change between its fold and its lock.
pub(crate) async fn extent_before(
    conn: &mut AnyConnection,
    to_ms: i64,
) -> Result<(i64, i64), StoreError> {
    let sql = format!(
        "SELECT COUNT(*), COALESCE(MAX(j.seq), 0) FROM journal_entries j WHERE {BOOKING} < $1"
    );
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(to_ms)
        .fetch_one(conn)
        .await?)
}

/// Entries booked before `to_ms` without a valuation.
pub(crate) async fn unvalued_before(
    conn: &mut AnyConnection,
    to_ms: i64,
) -> Result<i64, StoreError> {
    let sql = format!(
        "SELECT COUNT(*) FROM journal_entries j WHERE {BOOKING} < $1 \
         AND NOT EXISTS (SELECT 1 FROM entry_valuations v WHERE v.entry_seq = j.seq)"
    );
    Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(to_ms)
        .fetch_one(conn)
        .await?)
}

/// Per entry kind, the sum of every customer-balance leg booked in `[from_ms, to_ms)` (signed,
/// credits negative), and the sum of all booked before `from_ms`.
pub(crate) async fn customer_movements(
    conn: &mut AnyConnection,
    from_ms: i64,
    to_ms: i64,
) -> Result<(i128, Vec<(String, i128)>), StoreError> {
    let backend = super::backend_of_conn(conn);
    let sum = super::exact_sum(backend, "p.amount");
    let opening_sql = format!(
        "SELECT {sum} FROM postings p JOIN journal_entries j ON j.seq = p.entry_seq \
         WHERE p.account LIKE 'customer:%' AND {BOOKING} < $1"
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(opening_sql))
        .bind(from_ms)
        .fetch_one(&mut *conn)
        .await?;
    let opening = super::decode_exact_sum(&row, 0, backend)?;
    let sql = format!(
        "SELECT j.kind, {sum} FROM postings p JOIN journal_entries j ON j.seq = p.entry_seq \
         WHERE p.account LIKE 'customer:%' AND {BOOKING} >= $1 AND {BOOKING} < $2 \
         GROUP BY j.kind ORDER BY j.kind"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *conn)
        .await?;
    let by_kind = rows
        .iter()
        .map(|row| Ok((row.try_get(0)?, super::decode_exact_sum(row, 1, backend)?)))
        .collect::<Result<_, StoreError>>()?;
    Ok((opening, by_kind))
}

/// The sum of every customer's balance legs booked before `to_ms`, customer by customer
/// (signed, credits negative): the balances the roll-forward's closing must equal.
pub(crate) async fn customer_balances_at(
    conn: &mut AnyConnection,
    to_ms: i64,
) -> Result<Vec<(String, i128)>, StoreError> {
    let backend = super::backend_of_conn(conn);
    let sql = format!(
        "SELECT p.account, {} FROM postings p JOIN journal_entries j ON j.seq = p.entry_seq \
         WHERE p.account LIKE 'customer:%' AND {BOOKING} < $1 GROUP BY p.account ORDER BY p.account",
        super::exact_sum(backend, "p.amount")
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(to_ms)
        .fetch_all(conn)
        .await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, super::decode_exact_sum(row, 1, backend)?)))
        .collect()
}
