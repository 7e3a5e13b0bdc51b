//! The reference store: every step of the rules is a statement, run when the rules take it.
//! Simple to trust, and about fifteen statements per chain event.

use chrono::{DateTime, Utc};
use payrecon_chain_core::{Network, TransferId};

use super::MatchStore;
use crate::error::Error;
use crate::intent::PaymentIntent;
use crate::ledger::NewEntry;
use crate::order::{AccountId, Order, OrderRef, SettledVia};
use crate::records::{ExceptionRecord, StoredTransfer};
use crate::store::payments::{self, NewEvent};
use crate::store::{WriteTx, ledger, operations, orders};

/// Reads and writes straight through the transaction.
pub(crate) struct DirectStore<'t> {
    tx: &'t mut WriteTx,
    now: DateTime<Utc>,
}

impl<'t> DirectStore<'t> {
    pub(crate) fn new(tx: &'t mut WriteTx, now: DateTime<Utc>) -> DirectStore<'t> {
        DirectStore { tx, now }
    }
}

impl MatchStore for DirectStore<'_> {
    async fn transfer(&mut self, id: &TransferId) -> Result<Option<StoredTransfer>, Error> {
        Ok(payments::get_transfer(self.tx.conn(), id).await?)
    }

    async fn intent_for_watch_key(
        &mut self,
        network: Network,
        watch_key: &str,
    ) -> Result<Option<String>, Error> {
        Ok(payments::intent_id_by_watch_key(self.tx.conn(), network, watch_key).await?)
    }

    async fn unissued(
        &mut self,
        network: Network,
        address: &str,
    ) -> Result<Option<(String, u32)>, Error> {
        Ok(crate::store::keys::unissued(self.tx.conn(), network.as_str(), address).await?)
    }

    async fn intent(&mut self, id: &str) -> Result<Option<PaymentIntent>, Error> {
        Ok(payments::get_intent(self.tx.conn(), id).await?)
    }

    async fn lock_order(&mut self, reference: &OrderRef) -> Result<Option<Order>, Error> {
        Ok(orders::lock_order(self.tx, reference)
            .await?
            .map(|stored| stored.order))
    }

    async fn order(&mut self, reference: &OrderRef) -> Result<Option<Order>, Error> {
        Ok(orders::get_order(self.tx.conn(), reference)
            .await?
            .map(|stored| stored.order))
    }

    async fn transfers_of_intent(&mut self, intent_id: &str) -> Result<Vec<StoredTransfer>, Error> {
        Ok(payments::transfers_of_intent(self.tx.conn(), intent_id).await?)
    }

    async fn put_transfer(&mut self, transfer: &StoredTransfer) -> Result<(), Error> {
        Ok(payments::upsert_transfer(self.tx, transfer, self.now).await?)
    }

    async fn put_intent_state(&mut self, intent: &PaymentIntent) -> Result<(), Error> {
        Ok(payments::update_intent_state(self.tx.conn(), intent).await?)
    }

    async fn mark_settled(&mut self, reference: &OrderRef, entry_key: &str) -> Result<(), Error> {
        Ok(orders::mark_settled(
            self.tx.conn(),
            reference,
            SettledVia::Payment,
            entry_key,
            self.now,
        )
        .await?)
    }

    async fn reopen_order(
        &mut self,
        reference: &OrderRef,
        entry_key: &str,
        attention: &str,
    ) -> Result<(), Error> {
        Ok(orders::reopen_order(self.tx.conn(), reference, entry_key, attention).await?)
    }

    async fn open_exception(&mut self, exception: ExceptionRecord) -> Result<(), Error> {
        if payments::open_exception(self.tx.conn(), &exception).await? {
            payments::append_events(
                self.tx.conn(),
                &[payments::exception_opened_event(&exception)],
                self.now,
            )
            .await?;
        }
        Ok(())
    }

    async fn append_event(&mut self, event: NewEvent) -> Result<(), Error> {
        Ok(payments::append_events(self.tx.conn(), &[event], self.now).await?)
    }

    async fn post(&mut self, entries: Vec<NewEntry>) -> Result<(), Error> {
        ledger::post_batch(self.tx, &entries, self.now).await??;
        Ok(())
    }

    async fn entry(&mut self, key: &str) -> Result<Option<NewEntry>, Error> {
        Ok(ledger::get_entry(self.tx.conn(), key)
            .await?
            .map(|posted| posted.entry))
    }

    async fn lock_and_sum_customer(&mut self, customer: &AccountId) -> Result<i128, Error> {
        Ok(ledger::lock_and_sum_customer(self.tx, customer, self.now).await?)
    }

    async fn action_entries(&mut self, transfer: &TransferId) -> Result<Vec<String>, Error> {
        Ok(operations::action_entries_for_transfer(self.tx.conn(), &transfer.to_string()).await?)
    }
}
