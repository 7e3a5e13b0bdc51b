//! What finance staff read and post: the journal, balances, the trial balance, the
//! reconciliation report and its audit against the chains.

use crate::audit::{AuditReport, Pending, RECHECK_BATCH, Rechecker, recheck_batch};
use crate::config::Config;
use crate::engine::Engine;
use crate::error::Error;
use crate::ledger::{
    Account, AccountBalance, Currency, LedgerError, NewEntry, PostOutcome, PostedEntry,
    TrialBalance,
};
use crate::report::{
    CsvSection, OUTPUT_BUFFER_BYTES, ReportFormat, ReportQuery, ReportTotals, fold_period,
    write_csv, write_html, write_json,
};
use crate::store;
use futures_util::TryStreamExt;
use payrecon_chain_core::Network;
use std::collections::BTreeMap;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};

impl Engine {
    /// Fetches every transfer credited in the query's period again from its chain, in
    /// batches, and reports those the chain no longer backs. A node failing is an error, not a
    /// clean audit.
    pub async fn audit_credited(
        &self,
        config: &Config,
        query: &ReportQuery,
    ) -> Result<AuditReport, Error> {
        let mut report = AuditReport::default();
        let mut pending: BTreeMap<Network, Pending> = BTreeMap::new();
        let mut rows = std::pin::pin!(crate::report::transfers_of(self.db(), query));
        while let Some(transfer) = rows.try_next().await? {
            // Accounted for in the books: credited, held in suspense or resolved by an operator.
            if transfer.removed || transfer.credited_entry.is_none() {
                continue;
            }
            let network: Network = transfer
                .network
                .parse()
                .map_err(|_| Error::Report(format!("unknown network {}", transfer.network)))?;
            let entry = pending.entry(network).or_insert_with(|| Pending {
                checker: Rechecker::for_network(&config.networks, network),
                batch: Vec::new(),
            });
            entry.batch.push(transfer);
            if entry.batch.len() >= RECHECK_BATCH {
                recheck_batch(&self.payment_settings().policy, network, entry, &mut report).await?;
            }
        }
        for (network, entry) in &mut pending {
            recheck_batch(
                &self.payment_settings().policy,
                *network,
                entry,
                &mut report,
            )
            .await?;
        }
        Ok(report)
    }

    /// Writes the reconciliation report for `query` to `out`, streaming.
    pub async fn write_reconciliation<W: AsyncWrite + Unpin + Send>(
        &self,
        query: &ReportQuery,
        format: ReportFormat,
        section: CsvSection,
        out: W,
    ) -> Result<ReportTotals, Error> {
        if query.from >= query.to {
            return Err(Error::InvalidInput(
                "the report period is empty: --from must be before --to".into(),
            ));
        }
        let mut out = BufWriter::with_capacity(OUTPUT_BUFFER_BYTES, out);
        // The period's sums and the whole journal's trial balance are independent scans: run
        // side by side, on connections of their own.
        let (folded, trial) =
            tokio::try_join!(fold_period(self.db(), query), self.trial_balance())?;
        let mut totals = ReportTotals {
            transfers: 0,
            exceptions: 0,
            methods: folded.methods.values().cloned().collect(),
            trial_balance_sound: trial.is_sound(),
        };
        let io = Error::ReportOutput;
        match format {
            ReportFormat::Csv => {
                write_csv(
                    self.db(),
                    query,
                    section,
                    &folded,
                    &trial,
                    &mut out,
                    &mut totals,
                )
                .await?
            }
            ReportFormat::Json => {
                write_json(self.db(), query, &folded, &trial, &mut out, &mut totals).await?
            }
            ReportFormat::Html => {
                write_html(self.db(), query, &folded, &trial, &mut out, &mut totals).await?
            }
        }
        out.flush().await.map_err(io)?;
        Ok(totals)
    }

    /// Posts a journal entry once per idempotency key; refuses entries that do not balance or
    /// would take a customer balance below zero.
    pub async fn post_entry(&self, entry: &NewEntry) -> Result<PostOutcome, Error> {
        entry.validate()?;
        Ok(self.post_entries(std::slice::from_ref(entry)).await?[0])
    }

    /// Posts many entries in one transaction: all or none. Each keeps its own idempotency.
    pub async fn post_entries(&self, entries: &[NewEntry]) -> Result<Vec<PostOutcome>, Error> {
        for entry in entries {
            entry.validate()?;
        }
        let now = self.clock.now();
        let mut tx = self.store.begin_write().await?;
        let outcomes = store::ledger::post_batch(&mut tx, entries, now).await??;
        tx.commit().await?;
        Ok(outcomes)
    }

    /// Corrects an entry the only way an append-only journal allows: by posting its exact
    /// opposite under `reverse:<key>`.
    pub async fn reverse_entry(&self, key: &str, memo: &str) -> Result<PostOutcome, Error> {
        let original = self
            .entry(key)
            .await?
            .ok_or_else(|| LedgerError::EntryNotFound(key.to_owned()))?;
        self.post_entry(&NewEntry::reversal_of(&original, memo))
            .await
    }

    /// A journal entry by its idempotency key.
    pub async fn entry(&self, key: &str) -> Result<Option<PostedEntry>, Error> {
        let mut conn = self.store.pool().acquire().await?;
        Ok(store::ledger::get_entry(&mut conn, key).await?)
    }

    /// Every journal entry that names `reference` (an order, top-up or intent), oldest first.
    pub async fn entries_for(&self, reference: &str) -> Result<Vec<PostedEntry>, Error> {
        let mut conn = self.store.pool().acquire().await?;
        let keys = store::ledger::entry_keys_for_reference(&mut conn, reference).await?;
        let mut entries = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(entry) = store::ledger::get_entry(&mut conn, &key).await? {
                entries.push(entry);
            }
        }
        Ok(entries)
    }

    /// The balance of any account in one currency, as a signed sum of its postings.
    pub async fn account_balance(
        &self,
        account: &Account,
        currency: Currency,
    ) -> Result<i128, Error> {
        let mut conn = self.store.pool().acquire().await?;
        Ok(store::ledger::account_sum(&mut conn, account, currency).await?)
    }

    /// Re-derives every balance from the journal by aggregates in the database and checks the
    /// invariants: each entry and each currency sums to zero, no customer balance below zero.
    pub async fn trial_balance(&self) -> Result<TrialBalance, Error> {
        let mut conn = self.store.pool().acquire().await?;
        let totals = store::ledger::journal_totals(&mut conn).await?;
        let negative_balances = totals
            .by_account
            .iter()
            .filter(|((account, _), sum)| account.starts_with("customer:") && **sum > 0)
            .map(|((account, _), _)| account.clone())
            .collect();
        let line = |account: String, currency: Currency, sum: i128| AccountBalance {
            account,
            currency,
            balance: currency.format(sum),
            balance_minor: sum,
        };
        Ok(TrialBalance {
            accounts: totals
                .by_account
                .iter()
                .map(|((account, currency), sum)| line(account.clone(), *currency, *sum))
                .collect(),
            totals: totals
                .by_currency
                .iter()
                .map(|(currency, sum)| line("total".into(), *currency, *sum))
                .collect(),
            entries: totals.entries,
            postings: totals.postings,
            unbalanced_entries: totals.unbalanced_entries,
            negative_balances,
        })
    }
}
