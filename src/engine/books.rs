//! What finance closes the month with: the valuation pass that gives every entry its fiat
//! value, period close and reopen, the period's report and roll-forward, and the journal
//! exports.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};

use crate::books::{
    BookedEntry, Chart, ExportTotals, JournalFormat, JournalWriter, Period, PeriodFold,
    PeriodLogLine, PeriodReport, PeriodStatus, RollForward, UnvaluedEntry, ValuationPass,
    crypto_of, entry_id, parse_zone,
};
use crate::config::BooksConfig;
use crate::engine::Engine;
use crate::error::Error;
use crate::ledger::{Account, Currency};
use crate::records::{CryptoRate, HeldRate, ReportingRate, Valuation};
use crate::report::OUTPUT_BUFFER_BYTES;
use crate::store::books::{self as book_store, PeriodEntry, PeriodEvent};
use crate::store::{operations, outflows, payments, refunds};

/// Entries read per page by the close, the exports and the valuation pass.
const PAGE_ENTRIES: i64 = 2_000;

/// Reasons a valuation pass reports, at most: the rest are counted.
const MAX_REPORTED_ERRORS: usize = 5;

/// Entries posted this long ago are committed: the valuation pass's low-water mark passes
/// only them.
const VALUED_SETTLE_MARGIN: chrono::Duration = chrono::Duration::minutes(5);

/// Longest reason a reopen takes.
const MAX_REASON_LEN: usize = 500;

/// The books' settings, checked, with what they imply.
#[derive(Debug)]
pub(crate) struct Books {
    config: BooksConfig,
    zone: Tz,
    chart: Chart,
    /// Every entry at or below this journal position is valued: a pass starts above it.
    valued_through: AtomicI64,
}

impl Books {
    pub(crate) fn new(config: BooksConfig) -> Result<Books, Error> {
        if let Some(currency) = &config.reporting_currency
            && currency != "EUR"
        {
            return Err(Error::Config(format!(
                "books.reporting_currency: {currency:?} is not priced by any rate source; use \"EUR\" or leave it out"
            )));
        }
        let datev = &config.datev;
        if !(1001..=9_999_999).contains(&datev.consultant_number)
            || !(1..=99_999).contains(&datev.client_number)
            || !(4..=9).contains(&datev.account_length)
            || !(1..=12).contains(&datev.fiscal_year_start_month)
        {
            return Err(Error::Config(
                "books.datev: consultant_number 1001-9999999, client_number 1-99999, account_length 4-9, fiscal_year_start_month 1-12".into(),
            ));
        }
        Ok(Books {
            zone: parse_zone(&config.timezone)?,
            chart: Chart::new(config.accounts.clone()),
            config,
            valued_through: AtomicI64::new(0),
        })
    }
}

impl Engine {
    /// Replaces the books' settings (reporting currency, time zone, chart of accounts).
    pub fn with_books(mut self, config: BooksConfig) -> Result<Engine, Error> {
        self.books = Arc::new(Books::new(config)?);
        Ok(self)
    }

    /// The books' settings in force.
    pub fn books_config(&self) -> &BooksConfig {
        &self.books.config
    }

    /// The period `at` falls in, in the books' time zone.
    pub fn period_of(&self, at: DateTime<Utc>) -> Period {
        Period::containing(at, self.books.zone)
    }

    /// The first instant of `period` and the first after it, in the books' time zone.
    pub fn period_bounds(&self, period: Period) -> (DateTime<Utc>, DateTime<Utc>) {
        period.bounds(self.books.zone)
    }

    /// Gives every entry not valued yet its fiat value: the market rate of its crypto when it
    /// was posted (a payment's value at receipt), the rate of the entry it reverses, or for
    /// held money an operator releases, the rate it was received at; and the reporting
    /// currency's USD rate. An entry whose rate cannot be had stays unvalued, is reported, and
    /// is tried again next pass. Settlement never waits for this.
    pub async fn value_entries(&self) -> Result<ValuationPass, Error> {
        let mut pass = ValuationPass::default();
        let mut after = self.books.valued_through.load(Ordering::Acquire);
        let mut first_failure: Option<i64> = None;
        // How far every entry is valued for good: only past entries posted a while ago, as an
        // entry still being committed (PostgreSQL hands out positions before commit) may hide
        // below a younger one.
        let settled_before = self.now() - VALUED_SETTLE_MARGIN;
        let mut settled_through = after;
        loop {
            let mut conn = self.store.pool().acquire().await?;
            let page = book_store::unvalued_after(&mut conn, after, PAGE_ENTRIES).await?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            // This page's valuations by key: a reversal may follow its original in one page.
            let mut valued: HashMap<String, Valuation> = HashMap::with_capacity(page.len());
            let keys: Vec<&str> = page
                .iter()
                .map(|e| e.entry.idempotency_key.as_str())
                .collect();
            let txids = book_store::txids_of_entries(&mut conn, &keys).await?;
            for entry in &page {
                let txids = txids.get(&entry.entry.idempotency_key).map(|t| t.join("+"));
                let outcome = match self
                    .value_entry(&mut conn, entry, &valued, txids.unwrap_or_default())
                    .await
                {
                    Ok(Some(valuation)) => Ok(valuation),
                    Ok(None) => Err(Error::Books(
                        "waits for the entry it depends on (the one it reverses, a refund's hold or outflow) to be valued".into(),
                    )),
                    Err(error) => Err(error),
                };
                match outcome {
                    Ok(valuation) => {
                        if first_failure.is_none() && entry.posted_at < settled_before {
                            settled_through = entry.seq;
                        }
                        valued.insert(entry.entry.idempotency_key.clone(), valuation);
                    }
                    Err(error) => {
                        first_failure.get_or_insert(entry.seq);
                        pass.failed += 1;
                        if pass.errors.len() < MAX_REPORTED_ERRORS {
                            pass.errors.push(format!(
                                "{} ({}): {error}",
                                entry_id(&entry.entry.idempotency_key),
                                entry.entry.idempotency_key
                            ));
                        }
                    }
                }
            }
            drop(conn);
            if !valued.is_empty() {
                let mut valued: Vec<Valuation> = valued.into_values().collect();
                valued.sort_by_key(|v| v.entry_seq);
                let mut tx = self.store.begin_write().await?;
                book_store::insert_valuations(&mut tx, &valued).await?;
                tx.commit().await?;
                pass.valued += valued.len() as u64;
            }
        }
        self.books
            .valued_through
            .fetch_max(settled_through, Ordering::AcqRel);
        if pass.failed > 0 {
            tracing::warn!(failed = pass.failed, first = ?pass.errors.first(), "entries left unvalued");
        }
        Ok(pass)
    }

    /// One entry's valuation; `None` when it must wait for the entry it depends on.
    async fn value_entry(
        &self,
        conn: &mut sqlx::AnyConnection,
        pending: &PeriodEntry,
        this_page: &HashMap<String, Valuation>,
        txids: String,
    ) -> Result<Option<Valuation>, Error> {
        let entry = &pending.entry;
        let now = self.now();
        let method = crypto_of(entry)?;
        if let Some(refund_id) = entry.idempotency_key.strip_prefix("refund:")
            && entry
                .postings
                .iter()
                .any(|p| matches!(p.account, Account::Fx(_)))
        {
            return self
                .value_refund(conn, pending, this_page, refund_id, txids)
                .await;
        }
        // A reversal undoes its original at the original's rates, both of them; a release from
        // suspense takes the crypto rate of the hold and today's reporting rate.
        let inherited = if let Some(original) = entry.idempotency_key.strip_prefix("reverse:") {
            match valuation_of(conn, this_page, original).await? {
                Some(v) => Some((v, format!("reverses {}", entry_id(original)), true)),
                None => return Ok(None),
            }
        } else if let Some(hold) = self.held_since(conn, pending).await? {
            valuation_of(conn, this_page, &hold)
                .await?
                .map(|v| (v, format!("held since {}", entry_id(&hold)), false))
        } else {
            None
        };
        if let Some((original, basis, same_reporting)) = inherited {
            let reporting = match original.reporting {
                Some(rate) if same_reporting => Some(rate),
                _ => self.reporting_rate(pending.posted_at, now).await?,
            };
            return Ok(Some(Valuation {
                entry_seq: pending.seq,
                crypto: original.crypto,
                basis,
                txids: original.txids,
                reporting,
                held: None,
                valued_at: now,
            }));
        }
        let crypto = match method {
            None => None,
            Some(method) => Some(self.market_crypto(method, pending.posted_at).await?),
        };
        let reporting = self.reporting_rate(pending.posted_at, now).await?;
        Ok(Some(Valuation {
            entry_seq: pending.seq,
            crypto,
            basis: "market".into(),
            txids,
            reporting,
            held: None,
            valued_at: now,
        }))
    }

    /// A refund's valuation: its suspense legs at the rates of the hold it releases; its other
    /// legs at the rates of the outflow that carried it, so `external` nets to nothing, or at
    /// the market's when another wallet paid. `None` while one of those is not valued yet.
    async fn value_refund(
        &self,
        conn: &mut sqlx::AnyConnection,
        pending: &PeriodEntry,
        this_page: &HashMap<String, Valuation>,
        refund_id: &str,
        txids: String,
    ) -> Result<Option<Valuation>, Error> {
        let gone = |what: &str| Error::Books(format!("refund {refund_id}: its {what} is gone"));
        let refund = refunds::get(conn, refund_id)
            .await?
            .ok_or_else(|| gone("record"))?;
        let hold = hold_of(conn, &refund.exception_id)
            .await?
            .ok_or_else(|| gone("exception or its hold entry"))?;
        let Some(held) = valuation_of(conn, this_page, &hold).await? else {
            return Ok(None);
        };
        let held_rate = held.crypto.as_ref().ok_or_else(|| {
            Error::Books(format!(
                "refund {refund_id}: its hold {} has no crypto rate",
                entry_id(&hold)
            ))
        })?;
        let network = refund.method.network();
        let carried = match &refund.txid {
            Some(txid) => outflows::posted_entries(conn, network, txid).await?,
            None => Vec::new(),
        };
        let (crypto, reporting, sent) = match carried.iter().flatten().next() {
            Some(outflow) => match valuation_of(conn, this_page, outflow).await? {
                Some(v) => (
                    v.crypto,
                    v.reporting,
                    format!("sent in {}", entry_id(outflow)),
                ),
                None => return Ok(None),
            },
            // Seen leaving custody, not booked yet: wait for its entry.
            None if !carried.is_empty() => return Ok(None),
            None => (
                Some(self.market_crypto(refund.method, pending.posted_at).await?),
                self.reporting_rate(pending.posted_at, self.now()).await?,
                "market".to_owned(),
            ),
        };
        Ok(Some(Valuation {
            entry_seq: pending.seq,
            crypto,
            basis: format!("held since {}; {sent}", entry_id(&hold)),
            txids,
            reporting,
            held: Some(HeldRate {
                usd_per_unit: held_rate.usd_per_unit,
                usd_per_reporting: held.reporting.map(|r| r.usd_per_unit),
            }),
            valued_at: self.now(),
        }))
    }

    /// The market rate of `method`'s coin at `at`.
    async fn market_crypto(
        &self,
        method: payrecon_chain_core::Method,
        at: DateTime<Utc>,
    ) -> Result<CryptoRate, Error> {
        let rate = self
            .rate_book()?
            .market_rate(method.asset(), at, self.now())
            .await
            .map_err(|e| Error::Books(e.to_string()))?;
        Ok(CryptoRate {
            method,
            usd_per_unit: rate.usd_per_unit,
            source: rate.source,
            at: rate.fetched_at,
        })
    }

    /// The rate sources the books value with: the payment settings' own.
    fn rate_book(&self) -> Result<&crate::rates::RateBook, Error> {
        self.payment_settings()
            .rates
            .as_deref()
            .ok_or_else(|| Error::Books("no rate source is configured".into()))
    }

    /// The reporting currency's USD rate at `at`, when the books have one.
    async fn reporting_rate(
        &self,
        at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Option<ReportingRate>, Error> {
        let Some(currency) = &self.books.config.reporting_currency else {
            return Ok(None);
        };
        let quote = self
            .rate_book()?
            .fiat_rate(currency, at, now)
            .await
            .map_err(|e| Error::Books(e.to_string()))?;
        Ok(Some(ReportingRate {
            currency: quote.currency,
            usd_per_unit: quote.usd_per_unit,
            source: quote.source,
            at: quote.fetched_at,
        }))
    }

    /// For an operator's resolution that releases held crypto, the key of the entry that took
    /// it into suspense: the release is valued at the rate the money arrived at, so suspense
    /// empties at the value it filled.
    async fn held_since(
        &self,
        conn: &mut sqlx::AnyConnection,
        pending: &PeriodEntry,
    ) -> Result<Option<String>, Error> {
        let Some(exception_id) = pending.entry.idempotency_key.strip_prefix("resolve:") else {
            return Ok(None);
        };
        let releases_held = pending.entry.postings.iter().any(|p| {
            matches!(p.account, Account::Suspense(_))
                && matches!(p.currency, Currency::Crypto(_))
                && p.amount_minor > 0
        });
        if !releases_held {
            return Ok(None);
        }
        hold_of(conn, exception_id).await
    }

    /// The fiat valuation of the entry with idempotency key `key` (a payment's value at
    /// receipt), if it is valued yet.
    pub async fn valuation(&self, key: &str) -> Result<Option<Valuation>, Error> {
        let mut conn = self.store.pool().acquire().await?;
        Ok(book_store::valuation_by_key(&mut conn, key).await?)
    }

    /// Values an entry the market could not (a provider that was down when it was booked, an
    /// asset no source prices) at rates an operator gives: USD per coin of its crypto, and USD
    /// per unit of the reporting currency when the books have one. The valuation names who gave
    /// them and why; a Storno is never valued by hand (it takes its original's rates).
    pub async fn value_by_hand(
        &self,
        entry: &str,
        usd_per_coin: Option<rust_decimal::Decimal>,
        usd_per_reporting_unit: Option<rust_decimal::Decimal>,
        actor: &str,
        reason: &str,
    ) -> Result<Valuation, Error> {
        check_actor(actor)?;
        if reason.trim().is_empty() || reason.len() > MAX_REASON_LEN {
            return Err(Error::InvalidInput(format!(
                "a valuation by hand needs a reason of 1 to {MAX_REASON_LEN} characters"
            )));
        }
        let positive = |rate: Option<rust_decimal::Decimal>| {
            rate.filter(|r| r.is_sign_positive() && !r.is_zero())
        };
        let mut conn = self.store.pool().acquire().await?;
        let mut after = 0;
        let pending = loop {
            let page = book_store::unvalued_after(&mut conn, after, PAGE_ENTRIES).await?;
            let Some(last) = page.last() else {
                return Err(Error::InvalidInput(format!(
                    "{} is not an entry waiting for its value (valued already, or unknown): see `payrecon books unvalued`",
                    entry.chars().take(40).collect::<String>()
                )));
            };
            after = last.seq;
            if let Some(found) = page.into_iter().find(|e| {
                entry_id(&e.entry.idempotency_key) == entry || e.entry.idempotency_key == entry
            }) {
                break found;
            }
        };
        let id = entry_id(&pending.entry.idempotency_key);
        if pending.entry.idempotency_key.starts_with("reverse:") {
            return Err(Error::InvalidInput(format!(
                "{id} is a Storno: it takes the rates of the entry it reverses; value that one"
            )));
        }
        let source = format!("by hand: {actor}: {reason}");
        let crypto = match (crypto_of(&pending.entry)?, positive(usd_per_coin)) {
            (Some(method), Some(usd_per_unit)) => Some(CryptoRate {
                method,
                usd_per_unit,
                source: source.clone(),
                at: pending.posted_at,
            }),
            (Some(method), None) => {
                return Err(Error::InvalidInput(format!(
                    "{id} moves {method}: give its USD per coin, a positive decimal"
                )));
            }
            (None, None) => None,
            (None, Some(_)) => {
                return Err(Error::InvalidInput(format!(
                    "{id} moves no crypto: give no USD per coin"
                )));
            }
        };
        let reporting = match (
            &self.books.config.reporting_currency,
            positive(usd_per_reporting_unit),
        ) {
            (Some(currency), Some(usd_per_unit)) => Some(ReportingRate {
                currency: currency.clone(),
                usd_per_unit,
                source: source.clone(),
                at: pending.posted_at,
            }),
            (Some(currency), None) => {
                return Err(Error::InvalidInput(format!(
                    "the books report in {currency}: give USD per {currency}, a positive decimal"
                )));
            }
            (None, None) => None,
            (None, Some(_)) => {
                return Err(Error::InvalidInput(
                    "the books have no reporting currency: give no reporting rate".into(),
                ));
            }
        };
        let keys = [pending.entry.idempotency_key.as_str()];
        let txids = book_store::txids_of_entries(&mut conn, &keys).await?;
        drop(conn);
        let valuation = Valuation {
            entry_seq: pending.seq,
            crypto,
            basis: source,
            txids: txids
                .get(&pending.entry.idempotency_key)
                .map(|t| t.join("+"))
                .unwrap_or_default(),
            reporting,
            held: None,
            valued_at: self.now(),
        };
        let mut tx = self.store.begin_write().await?;
        book_store::insert_valuations(&mut tx, std::slice::from_ref(&valuation)).await?;
        tx.commit().await?;
        tracing::info!(entry = %id, %actor, "entry valued by hand");
        Ok(valuation)
    }

    /// How many entries have no fiat value, and when the oldest of them was booked, once it is
    /// older than a valuation pass needs: what operators are shown.
    pub(crate) async fn unvalued_overdue(&self) -> Result<(u64, Option<DateTime<Utc>>), Error> {
        let mut conn = self.store.pool().acquire().await?;
        let (count, oldest) = book_store::unvalued_count(&mut conn).await?;
        let overdue = oldest.filter(|at| *at < self.now() - VALUED_SETTLE_MARGIN);
        Ok((if overdue.is_some() { count as u64 } else { 0 }, overdue))
    }

    /// Entries without a fiat value (oldest first, at most `limit`), and how many there are.
    pub async fn unvalued_entries(&self, limit: usize) -> Result<(u64, Vec<UnvaluedEntry>), Error> {
        let mut conn = self.store.pool().acquire().await?;
        let (count, _) = book_store::unvalued_count(&mut conn).await?;
        let page = book_store::unvalued_after(&mut conn, 0, limit.clamp(1, 1_000) as i64).await?;
        Ok((
            count as u64,
            page.into_iter()
                .map(|e| UnvaluedEntry {
                    seq: e.seq,
                    entry_id: entry_id(&e.entry.idempotency_key),
                    key: e.entry.idempotency_key,
                    posted_at: e.posted_at.to_rfc3339(),
                    reference: e.entry.reference,
                    memo: e.entry.memo,
                })
                .collect(),
        ))
    }

    /// Locks `period`: stores its figures and the hash of its entries, and moves the closing
    /// line to its end, so nothing is booked into it again. Periods close in order, only
    /// after they ended, and only when every entry up to their end is valued.
    pub async fn close_period(&self, period: Period, actor: &str) -> Result<PeriodReport, Error> {
        check_actor(actor)?;
        let zone = self.books.zone;
        let (from, to) = period.bounds(zone);
        if to > self.now() {
            return Err(Error::Books(format!(
                "{period} has not ended: it ends {} ({})",
                to.with_timezone(&zone).to_rfc3339(),
                zone.name()
            )));
        }
        // A close looks at every entry, however old: start the pass from the beginning.
        self.books.valued_through.store(0, Ordering::Release);
        self.value_entries().await?;
        let to_ms = to.timestamp_millis();
        // The fold reads the whole month: done before the lock, so posting waits only for a
        // count, unless something was booked up to the month's end meanwhile (a process whose
        // clock lags), when it is done again under the lock.
        let (extent, report) = {
            let mut conn = self.store.pool().acquire().await?;
            let extent = book_store::extent_before(&mut conn, to_ms).await?;
            (extent, self.fold_to_close(&mut conn, period).await?)
        };
        let mut tx = self.store.begin_write().await?;
        let (closed_through, timezone) = book_store::lock_state(&mut tx).await?;
        self.check_zone(timezone.as_deref())?;
        if closed_through >= to_ms {
            return Err(Error::Books(format!("{period} is already closed")));
        }
        if closed_through != 0 && closed_through != from.timestamp_millis() {
            let next = Period::containing(
                DateTime::from_timestamp_millis(closed_through).unwrap_or_default(),
                zone,
            );
            return Err(Error::Books(format!(
                "periods close in order: the next to close is {next}"
            )));
        }
        let report = if book_store::extent_before(tx.conn(), to_ms).await? == extent {
            report
        } else {
            self.fold_to_close(tx.conn(), period).await?
        };
        let snapshot =
            serde_json::to_string_pretty(&report).map_err(|e| Error::Books(e.to_string()))?;
        book_store::log_period_event(
            &mut tx,
            &PeriodEvent {
                seq: 0,
                period: period.to_string(),
                action: "close".into(),
                actor: actor.to_owned(),
                reason: String::new(),
                at: self.now(),
                entries: Some(report.entries as i64),
                entries_sha256: Some(report.entries_sha256.clone()),
                snapshot: Some(snapshot),
            },
        )
        .await?;
        book_store::set_closed_through(&mut tx, to_ms, zone.name()).await?;
        tx.commit().await?;
        tracing::info!(%period, actor, entries = report.entries, "period closed");
        Ok(report)
    }

    /// The figures a close stores, refused while any entry up to the month's end is unvalued.
    async fn fold_to_close(
        &self,
        conn: &mut sqlx::AnyConnection,
        period: Period,
    ) -> Result<PeriodReport, Error> {
        let (_, to) = period.bounds(self.books.zone);
        let unvalued = book_store::unvalued_before(conn, to.timestamp_millis()).await?;
        if unvalued > 0 {
            return Err(Error::Books(format!(
                "{unvalued} entries up to the end of {period} have no fiat value yet; see the unvalued list and run the valuation pass"
            )));
        }
        fold_report(
            conn,
            period,
            self.books.zone,
            &self.books.config,
            &self.books.chart,
        )
        .await
    }

    /// Opens the last closed period again: only with a reason, and logged with who and when.
    pub async fn reopen_period(
        &self,
        period: Period,
        actor: &str,
        reason: &str,
    ) -> Result<PeriodStatus, Error> {
        check_actor(actor)?;
        let reason = reason.trim();
        if reason.is_empty() || reason.len() > MAX_REASON_LEN {
            return Err(Error::InvalidInput(format!(
                "a reopen needs a reason of 1 to {MAX_REASON_LEN} characters"
            )));
        }
        let zone = self.books.zone;
        let (from, to) = period.bounds(zone);
        let mut tx = self.store.begin_write().await?;
        let (closed_through, timezone) = book_store::lock_state(&mut tx).await?;
        self.check_zone(timezone.as_deref())?;
        let events = book_store::period_events(tx.conn(), Some(&period.to_string())).await?;
        if closing_in(&events, closed_through, to).is_none() {
            return Err(Error::Books(format!("{period} is not closed")));
        }
        if closed_through != to.timestamp_millis() {
            return Err(Error::Books(
                "only the last closed period can reopen; reopen the later ones first".into(),
            ));
        }
        book_store::log_period_event(
            &mut tx,
            &PeriodEvent {
                seq: 0,
                period: period.to_string(),
                action: "reopen".into(),
                actor: actor.to_owned(),
                reason: reason.to_owned(),
                at: self.now(),
                entries: None,
                entries_sha256: None,
                snapshot: None,
            },
        )
        .await?;
        book_store::set_closed_through(&mut tx, from.timestamp_millis(), zone.name()).await?;
        tx.commit().await?;
        tracing::warn!(%period, actor, reason, "period reopened");
        self.period_status(period).await
    }

    /// Whether `period` is open or closed, and its log.
    pub async fn period_status(&self, period: Period) -> Result<PeriodStatus, Error> {
        let mut conn = self.store.pool().acquire().await?;
        let (closed_through, timezone) = book_store::state(&mut conn).await?;
        self.check_zone(timezone.as_deref())?;
        let (_, to) = period.bounds(self.books.zone);
        let events = book_store::period_events(&mut conn, Some(&period.to_string())).await?;
        let closed = closing_in(&events, closed_through, to).is_some();
        let log = events
            .into_iter()
            .map(|e| PeriodLogLine {
                action: e.action,
                actor: e.actor,
                reason: e.reason,
                at: e.at.to_rfc3339(),
                entries: e.entries,
                entries_sha256: e.entries_sha256,
            })
            .collect();
        Ok(PeriodStatus {
            period,
            state: if closed { "closed" } else { "open" }.into(),
            log,
        })
    }

    /// The period's figures as JSON: for a closed period the bytes stored when it closed, so
    /// they are the same however often it is asked; for an open one, as they stand.
    pub async fn period_report(&self, period: Period) -> Result<String, Error> {
        let mut conn = self.store.pool().acquire().await?;
        if let Some(close) = self.closing_of(&mut conn, period).await? {
            return close
                .snapshot
                .ok_or_else(|| Error::Books(format!("the close of {period} stored no figures")));
        }
        let report = fold_report(
            &mut conn,
            period,
            self.books.zone,
            &self.books.config,
            &self.books.chart,
        )
        .await?;
        serde_json::to_string_pretty(&report).map_err(|e| Error::Books(e.to_string()))
    }

    /// The customer-balance roll-forward of `period`.
    pub async fn rollforward(&self, period: Period) -> Result<RollForward, Error> {
        let mut conn = self.store.pool().acquire().await?;
        let (_, timezone) = book_store::state(&mut conn).await?;
        self.check_zone(timezone.as_deref())?;
        rollforward_of(&mut conn, period, self.books.zone).await
    }

    /// Writes `period`'s journal in `format`, streaming. Xero's import takes at most 300
    /// lines a file, so its export comes in parts: `open_part(n)` gives the writer of part
    /// `n` (1 for every other format). A closed period exports with the settings it closed
    /// with, stamped with its close time: the same bytes every time.
    pub async fn export_journal<W, F>(
        &self,
        period: Period,
        format: JournalFormat,
        mut open_part: F,
    ) -> Result<ExportTotals, Error>
    where
        W: AsyncWrite + Unpin + Send,
        F: FnMut(u32) -> std::io::Result<W> + Send,
    {
        let mut conn = self.store.pool().acquire().await?;
        let closing = self.closing_of(&mut conn, period).await?;
        let (books, created, closed) = match &closing {
            Some(close) => (books_of_close(close)?, close.at, true),
            None => (self.books.config.clone(), self.now(), false),
        };
        let chart = Chart::new(books.accounts.clone());
        let zone = self.books.zone;
        let mut writer = JournalWriter::new(format, &books, &chart, zone, period, created, closed)?;
        let io = Error::ReportOutput;
        let mut out = BufWriter::with_capacity(OUTPUT_BUFFER_BYTES, open_part(1).map_err(io)?);
        out.write_all(&writer.header()).await.map_err(io)?;
        let mut pages = PeriodPages::new(period, zone);
        loop {
            let page = pages.next(&mut conn).await?;
            if page.is_empty() {
                break;
            }
            for booked in page {
                let (new_part, bytes) = writer.entry(&booked)?;
                if let Some(part) = new_part {
                    out.shutdown().await.map_err(io)?;
                    out =
                        BufWriter::with_capacity(OUTPUT_BUFFER_BYTES, open_part(part).map_err(io)?);
                    out.write_all(&writer.header()).await.map_err(io)?;
                }
                out.write_all(&bytes).await.map_err(io)?;
            }
        }
        out.shutdown().await.map_err(io)?;
        Ok(writer.totals)
    }

    /// The close in force for `period`, if it is closed.
    async fn closing_of(
        &self,
        conn: &mut sqlx::AnyConnection,
        period: Period,
    ) -> Result<Option<PeriodEvent>, Error> {
        let (closed_through, timezone) = book_store::state(conn).await?;
        self.check_zone(timezone.as_deref())?;
        let (_, to) = period.bounds(self.books.zone);
        let events = book_store::period_events(conn, Some(&period.to_string())).await?;
        Ok(closing_in(&events, closed_through, to).cloned())
    }

    /// Periods were cut in one time zone; the configured one must be it.
    fn check_zone(&self, stored: Option<&str>) -> Result<(), Error> {
        match stored {
            Some(zone) if zone != self.books.zone.name() => Err(Error::Books(format!(
                "periods were closed in {zone}, but books.timezone is {}; set it back",
                self.books.zone.name()
            ))),
            _ => Ok(()),
        }
    }
}

/// The valuation of the entry keyed `key`: from this pass's page, or as stored.
async fn valuation_of(
    conn: &mut sqlx::AnyConnection,
    this_page: &HashMap<String, Valuation>,
    key: &str,
) -> Result<Option<Valuation>, Error> {
    match this_page.get(key) {
        Some(valuation) => Ok(Some(valuation.clone())),
        None => Ok(book_store::valuation_by_key(conn, key).await?),
    }
}

fn check_actor(actor: &str) -> Result<(), Error> {
    if actor.trim().is_empty() || actor.len() > 100 {
        return Err(Error::InvalidInput(
            "the actor must be 1 to 100 characters".into(),
        ));
    }
    Ok(())
}

/// The close in force among a period's logged `events`: its last action, if that is a close
/// the closing line still covers.
fn closing_in(
    events: &[PeriodEvent],
    closed_through: i64,
    to: DateTime<Utc>,
) -> Option<&PeriodEvent> {
    events
        .last()
        .filter(|e| e.action == "close" && closed_through >= to.timestamp_millis())
}

/// The books settings a close stored beside its figures.
fn books_of_close(close: &PeriodEvent) -> Result<BooksConfig, Error> {
    let snapshot: serde_json::Value =
        serde_json::from_str(close.snapshot.as_deref().unwrap_or("{}"))
            .map_err(|e| Error::Books(format!("the close of {}: {e}", close.period)))?;
    serde_json::from_value(snapshot["books"].clone())
        .map_err(|e| Error::Books(format!("the close of {}: {e}", close.period)))
}

/// A period's entries, valued, a page at a time in booking order: memory stays flat however
/// long the period.
struct PeriodPages {
    from_ms: i64,
    to_ms: i64,
    start: Option<book_store::PageStart>,
}

impl PeriodPages {
    fn new(period: Period, zone: Tz) -> PeriodPages {
        let (from, to) = period.bounds(zone);
        PeriodPages {
            from_ms: from.timestamp_millis(),
            to_ms: to.timestamp_millis(),
            start: None,
        }
    }

    /// The next page; empty at the end. An entry without its valuation is an error.
    async fn next(&mut self, conn: &mut sqlx::AnyConnection) -> Result<Vec<BookedEntry>, Error> {
        let page =
            book_store::period_page(conn, self.from_ms, self.to_ms, self.start, PAGE_ENTRIES)
                .await?;
        if let Some(last) = page.last() {
            self.start = Some((last.booked_at.timestamp_millis(), last.seq));
        }
        page.into_iter().map(valued).collect()
    }
}

/// A period entry the exports can use: one with its valuation.
fn valued(entry: PeriodEntry) -> Result<BookedEntry, Error> {
    let valuation = entry.valuation.ok_or_else(|| {
        Error::Books(format!(
            "entry {} ({}) has no fiat value yet; run the valuation pass",
            entry_id(&entry.entry.idempotency_key),
            entry.entry.idempotency_key
        ))
    })?;
    Ok(BookedEntry {
        seq: entry.seq,
        booked_at: entry.booked_at,
        entry: entry.entry,
        valuation,
    })
}

async fn rollforward_of(
    conn: &mut sqlx::AnyConnection,
    period: Period,
    zone: Tz,
) -> Result<RollForward, Error> {
    let (from, to) = period.bounds(zone);
    let (opening, by_kind) =
        book_store::customer_movements(conn, from.timestamp_millis(), to.timestamp_millis())
            .await?;
    let balances = book_store::customer_balances_at(conn, to.timestamp_millis()).await?;
    let rollforward = RollForward::from_sums(period, opening, &by_kind, &balances);
    debug_assert!(rollforward.closes, "the roll-forward of {period} closes");
    Ok(rollforward)
}

/// The key of the entry that put exception `exception_id`'s money in suspense, if there is
/// such an exception and entry.
async fn hold_of(
    conn: &mut sqlx::AnyConnection,
    exception_id: &str,
) -> Result<Option<String>, Error> {
    let Some(exception) = operations::get_exception(conn, exception_id).await? else {
        return Ok(None);
    };
    let intent = match &exception.intent_id {
        Some(id) => payments::get_intent(conn, id).await?,
        None => None,
    };
    Ok(crate::operator::hold_key(&exception, intent.as_ref()))
}

/// Reads every entry booked in `period` and folds its figures.
async fn fold_report(
    conn: &mut sqlx::AnyConnection,
    period: Period,
    zone: Tz,
    books: &BooksConfig,
    chart: &Chart,
) -> Result<PeriodReport, Error> {
    let (from, to) = period.bounds(zone);
    let in_reporting = books.reporting_currency.is_some();
    let mut fold = PeriodFold::new(zone);
    let mut pages = PeriodPages::new(period, zone);
    loop {
        let page = pages.next(conn).await?;
        if page.is_empty() {
            break;
        }
        for booked in &page {
            fold.add(booked, chart, in_reporting)?;
        }
    }
    let folded = fold.finish(in_reporting);
    Ok(PeriodReport {
        period,
        timezone: zone.name().to_owned(),
        from: from.to_rfc3339(),
        to: to.to_rfc3339(),
        currency: crate::books::export_currency(books),
        entries: folded.entries,
        entries_sha256: folded.entries_sha256,
        receipts: folded.receipts,
        refunds: folded.refunds,
        accounts: folded.accounts,
        daily: folded.daily,
        xero_files: folded.xero_files,
        rollforward: rollforward_of(conn, period, zone).await?,
        holdings: super::wallet::asset_rollforwards_of(conn, (from, to))
            .await?
            .0,
        books: books.clone(),
    })
}
