//! The batch store: everything a batch of events can touch is read in a few set reads, the
//! rules run against that working set in memory, and what changed is written in a few
//! multi-row statements when the batch ends ([`BatchStore::flush`]).
//!
//! It must answer every step exactly as [`super::DirectStore`] would at that point of the
//! batch: a row written earlier in the batch is read back as written, an exception opened
//! twice is opened once, an entry posted twice is posted once, a customer's balance includes
//! what the batch credited. What the set reads did not foresee (a rare path, such as a
//! reversal of a credit made earlier in the same batch) is read with a single statement when
//! first asked for; it is never guessed.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use payrecon_chain_core::{ChainEvent, Network, TransferId};

use super::MatchStore;
use crate::error::Error;
use crate::intent::PaymentIntent;
use crate::ledger::{LedgerError, NewEntry};
use crate::order::{AccountId, Order, OrderRef, OrderStatus, SettledVia};
use crate::records::{ExceptionRecord, StoredTransfer};
use crate::store::payments::{self, NewEvent, exception_opened_event, transfer_order};
use crate::store::{StoreError, WriteTx, ledger, operations, orders};

/// An order as read under its lock, and as the batch has left it.
struct OrderSlot {
    read: Order,
    now: Order,
}

/// An event waiting to be written; one announcing an exception is written only if the
/// exception turned out new.
struct PendingEvent {
    event: NewEvent,
    if_new_exception: Option<String>,
}

/// The working set of one batch and what it will write.
pub(crate) struct BatchStore<'t> {
    tx: &'t mut WriteTx,
    now: DateTime<Utc>,
    /// Transfers as they stand in this batch, by id.
    transfers: HashMap<TransferId, StoredTransfer>,
    /// Ids whose transfer is known not to exist (yet).
    absent_transfers: HashSet<TransferId>,
    /// (network, watch key) -> the intent that owns it, or none.
    watch_keys: HashMap<(Network, String), Option<String>>,
    intents: HashMap<String, PaymentIntent>,
    /// Every transfer of an intent, for intents whose transfers were read.
    intent_transfers: HashMap<String, Vec<TransferId>>,
    orders: HashMap<OrderRef, OrderSlot>,
    /// Journal entries read from the store, by key; `None` when the store has none.
    stored_entries: HashMap<String, Option<NewEntry>>,
    /// Operators' entries per transfer, for transfers they were read for.
    action_entries: HashMap<TransferId, Vec<String>>,
    /// Customers locked, with the sum of their stored balance postings.
    customer_sums: HashMap<AccountId, i128>,
    /// Written in this batch, in the order first written.
    dirty_transfers: Vec<TransferId>,
    dirty_transfer_set: HashSet<TransferId>,
    dirty_intents: Vec<String>,
    dirty_intent_set: HashSet<String>,
    exceptions: Vec<ExceptionRecord>,
    exception_ids: HashSet<String>,
    events: Vec<PendingEvent>,
    /// Entries posted in this batch, in order, with their content hashes by key.
    posted: Vec<NewEntry>,
    posted_hashes: HashMap<String, String>,
}

impl<'t> BatchStore<'t> {
    fn empty(tx: &'t mut WriteTx, now: DateTime<Utc>) -> BatchStore<'t> {
        BatchStore {
            tx,
            now,
            transfers: HashMap::new(),
            absent_transfers: HashSet::new(),
            watch_keys: HashMap::new(),
            intents: HashMap::new(),
            intent_transfers: HashMap::new(),
            orders: HashMap::new(),
            stored_entries: HashMap::new(),
            action_entries: HashMap::new(),
            customer_sums: HashMap::new(),
            dirty_transfers: Vec::new(),
            dirty_transfer_set: HashSet::new(),
            dirty_intents: Vec::new(),
            dirty_intent_set: HashSet::new(),
            exceptions: Vec::new(),
            exception_ids: HashSet::new(),
            events: Vec::new(),
            posted: Vec::new(),
            posted_hashes: HashMap::new(),
        }
    }

    /// Reads what `events` can touch: their transfers, the intents their addresses belong to,
    /// those intents' orders (locked) and transfers, and for removals the entries a reversal
    /// would take back and the balances it would charge.
    pub(crate) async fn load_for_events(
        tx: &'t mut WriteTx,
        events: &[ChainEvent],
        now: DateTime<Utc>,
    ) -> Result<BatchStore<'t>, Error> {
        let mut store = BatchStore::empty(tx, now);
        let mut ids: Vec<&TransferId> = events.iter().map(ChainEvent::transfer_id).collect();
        ids.sort_unstable();
        ids.dedup();
        for transfer in payments::transfers_by_ids(store.tx.conn(), &ids).await? {
            store.transfers.insert(transfer.id.clone(), transfer);
        }
        for id in &ids {
            if !store.transfers.contains_key(*id) {
                store.absent_transfers.insert((*id).clone());
            }
        }

        let mut keys_by_network: HashMap<Network, Vec<&str>> = HashMap::new();
        for event in events {
            if let ChainEvent::Observed { transfer, .. } = event {
                keys_by_network
                    .entry(transfer.id.network)
                    .or_default()
                    .push(&transfer.to_address);
            }
        }
        let mut intent_ids: Vec<String> = Vec::new();
        for (network, mut keys) in keys_by_network {
            keys.sort_unstable();
            keys.dedup();
            for key in &keys {
                store.watch_keys.insert((network, (*key).to_owned()), None);
            }
            for intent in payments::intents_by_watch_keys(store.tx.conn(), network, &keys).await? {
                store
                    .watch_keys
                    .insert((network, intent.watch_key.clone()), Some(intent.id.clone()));
                intent_ids.push(intent.id.clone());
                store.intents.insert(intent.id.clone(), intent);
            }
        }
        let unread: Vec<&str> = store
            .transfers
            .values()
            .filter_map(|t| t.intent_id.as_deref())
            .filter(|id| !store.intents.contains_key(*id))
            .collect();
        let mut unread = unread;
        unread.sort_unstable();
        unread.dedup();
        let more = payments::intents_by_ids(store.tx.conn(), &unread).await?;
        for intent in more {
            intent_ids.push(intent.id.clone());
            store.intents.insert(intent.id.clone(), intent);
        }
        store.load_intent_context(&intent_ids).await?;

        let removed: Vec<&TransferId> = events
            .iter()
            .filter(|e| matches!(e, ChainEvent::Removed { .. }))
            .map(ChainEvent::transfer_id)
            .filter(|id| store.transfers.contains_key(*id))
            .collect();
        if !removed.is_empty() {
            store.load_reversal_context(&removed).await?;
        }
        Ok(store)
    }

    /// Reads what re-evaluating these intents touches: the intents, their orders (locked) and
    /// their transfers.
    pub(crate) async fn load_for_intents(
        tx: &'t mut WriteTx,
        intent_ids: &[String],
        now: DateTime<Utc>,
    ) -> Result<BatchStore<'t>, Error> {
        let mut store = BatchStore::empty(tx, now);
        let ids: Vec<&str> = intent_ids.iter().map(String::as_str).collect();
        let mut read = Vec::with_capacity(ids.len());
        for intent in payments::intents_by_ids(store.tx.conn(), &ids).await? {
            read.push(intent.id.clone());
            store.intents.insert(intent.id.clone(), intent);
        }
        store.load_intent_context(&read).await?;
        Ok(store)
    }

    /// Locks the intents' orders and reads every transfer of the intents.
    async fn load_intent_context(&mut self, intent_ids: &[String]) -> Result<(), Error> {
        let references: Vec<&str> = intent_ids
            .iter()
            .filter_map(|id| self.intents.get(id))
            .map(|intent| intent.order_ref.as_str())
            .collect();
        for stored in orders::lock_orders(self.tx, &references).await? {
            let order = stored.order;
            self.orders.insert(
                order.reference.clone(),
                OrderSlot {
                    read: order.clone(),
                    now: order,
                },
            );
        }
        let ids: Vec<&str> = intent_ids.iter().map(String::as_str).collect();
        for id in &ids {
            self.intent_transfers.entry((*id).to_owned()).or_default();
        }
        for transfer in payments::transfers_of_intents(self.tx.conn(), &ids).await? {
            if let Some(intent_id) = &transfer.intent_id
                && let Some(list) = self.intent_transfers.get_mut(intent_id)
            {
                list.push(transfer.id.clone());
            }
            self.absent_transfers.remove(&transfer.id);
            self.transfers
                .entry(transfer.id.clone())
                .or_insert(transfer);
        }
        Ok(())
    }

    /// For transfers a batch removes: the operators' entries about them, every entry a
    /// reversal could take back, and the balances of the customers those entries credited.
    async fn load_reversal_context(&mut self, removed: &[&TransferId]) -> Result<(), Error> {
        let names: Vec<String> = removed.iter().map(|id| id.to_string()).collect();
        let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut actions =
            operations::action_entries_for_transfers(self.tx.conn(), &name_refs).await?;
        let mut keys: Vec<String> = Vec::new();
        for (id, name) in removed.iter().zip(&names) {
            let found = actions.remove(name).unwrap_or_default();
            keys.extend(found.iter().cloned());
            self.action_entries.insert((*id).clone(), found);
            if let Some(key) = self
                .transfers
                .get(*id)
                .and_then(|t| t.credited_entry.clone())
            {
                if let Some(rest) = key.strip_prefix("settle:") {
                    keys.push(format!("overpaid:{rest}"));
                }
                keys.push(key);
            }
        }
        keys.sort_unstable();
        keys.dedup();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        for key in &keys {
            self.stored_entries.insert(key.clone(), None);
        }
        let mut customers: Vec<AccountId> = Vec::new();
        for posted in ledger::get_entries(self.tx.conn(), &key_refs).await? {
            customers.extend(posted.entry.customer_nets().into_keys());
            self.stored_entries
                .insert(posted.entry.idempotency_key.clone(), Some(posted.entry));
        }
        customers.sort_unstable();
        customers.dedup();
        let customer_refs: Vec<&AccountId> = customers.iter().collect();
        self.customer_sums =
            ledger::lock_and_sum_customers(self.tx, &customer_refs, self.now).await?;
        Ok(())
    }

    fn mark_transfer_dirty(&mut self, id: &TransferId) {
        if self.dirty_transfer_set.insert(id.clone()) {
            self.dirty_transfers.push(id.clone());
        }
    }

    /// The order's slot, locking and reading it first if the set reads did not.
    async fn order_slot(&mut self, reference: &OrderRef) -> Result<Option<&mut OrderSlot>, Error> {
        if !self.orders.contains_key(reference) {
            let Some(stored) = orders::lock_order(self.tx, reference).await? else {
                return Ok(None);
            };
            let order = stored.order;
            self.orders.insert(
                reference.clone(),
                OrderSlot {
                    read: order.clone(),
                    now: order,
                },
            );
        }
        Ok(self.orders.get_mut(reference))
    }

    /// Writes everything the batch changed: entries and their postings, transfers, intents,
    /// orders, exceptions, then the events (those announcing an exception only if it is new).
    pub(crate) async fn flush(self) -> Result<(), Error> {
        let BatchStore {
            tx,
            now,
            transfers,
            intents,
            orders,
            dirty_transfers,
            dirty_intents,
            exceptions,
            events,
            posted,
            ..
        } = self;
        if !posted.is_empty() {
            ledger::post_batch(tx, &posted, now).await??;
        }
        let written: Vec<&StoredTransfer> =
            dirty_transfers.iter().map(|id| &transfers[id]).collect();
        payments::upsert_transfers(tx, &written, now).await?;
        let changed: Vec<&PaymentIntent> = dirty_intents.iter().map(|id| &intents[id]).collect();
        payments::update_intent_states(tx, &changed).await?;
        let settled: Vec<&Order> = orders
            .values()
            .filter(|slot| slot.now != slot.read)
            .map(|slot| &slot.now)
            .collect();
        orders::write_settlement_states(tx, &settled).await?;
        let records: Vec<&ExceptionRecord> = exceptions.iter().collect();
        let opened = payments::open_exceptions(tx.conn(), &records).await?;
        let events: Vec<NewEvent> = events
            .into_iter()
            .filter(|pending| {
                pending
                    .if_new_exception
                    .as_ref()
                    .is_none_or(|id| opened.contains(id))
            })
            .map(|pending| pending.event)
            .collect();
        payments::append_events(tx.conn(), &events, now).await?;
        Ok(())
    }
}

impl MatchStore for BatchStore<'_> {
    async fn transfer(&mut self, id: &TransferId) -> Result<Option<StoredTransfer>, Error> {
        if let Some(transfer) = self.transfers.get(id) {
            return Ok(Some(transfer.clone()));
        }
        if self.absent_transfers.contains(id) {
            return Ok(None);
        }
        let found = payments::get_transfer(self.tx.conn(), id).await?;
        match &found {
            Some(transfer) => {
                self.transfers.insert(id.clone(), transfer.clone());
            }
            None => {
                self.absent_transfers.insert(id.clone());
            }
        }
        Ok(found)
    }

    async fn intent_for_watch_key(
        &mut self,
        network: Network,
        watch_key: &str,
    ) -> Result<Option<String>, Error> {
        let slot = (network, watch_key.to_owned());
        if let Some(owner) = self.watch_keys.get(&slot) {
            return Ok(owner.clone());
        }
        let owner = payments::intent_id_by_watch_key(self.tx.conn(), network, watch_key).await?;
        self.watch_keys.insert(slot, owner.clone());
        Ok(owner)
    }

    async fn unissued(
        &mut self,
        network: Network,
        address: &str,
    ) -> Result<Option<(String, u32)>, Error> {
        Ok(crate::store::keys::unissued(self.tx.conn(), network.as_str(), address).await?)
    }

    async fn intent(&mut self, id: &str) -> Result<Option<PaymentIntent>, Error> {
        if let Some(intent) = self.intents.get(id) {
            return Ok(Some(intent.clone()));
        }
        let found = payments::get_intent(self.tx.conn(), id).await?;
        if let Some(intent) = &found {
            self.intents.insert(id.to_owned(), intent.clone());
        }
        Ok(found)
    }

    async fn lock_order(&mut self, reference: &OrderRef) -> Result<Option<Order>, Error> {
        Ok(self
            .order_slot(reference)
            .await?
            .map(|slot| slot.now.clone()))
    }

    async fn order(&mut self, reference: &OrderRef) -> Result<Option<Order>, Error> {
        self.lock_order(reference).await
    }

    async fn transfers_of_intent(&mut self, intent_id: &str) -> Result<Vec<StoredTransfer>, Error> {
        if !self.intent_transfers.contains_key(intent_id) {
            let mut ids = Vec::new();
            for stored in payments::transfers_of_intent(self.tx.conn(), intent_id).await? {
                ids.push(stored.id.clone());
                self.absent_transfers.remove(&stored.id);
                self.transfers.entry(stored.id.clone()).or_insert(stored);
            }
            for transfer in self.transfers.values() {
                if transfer.intent_id.as_deref() == Some(intent_id) && !ids.contains(&transfer.id) {
                    ids.push(transfer.id.clone());
                }
            }
            self.intent_transfers.insert(intent_id.to_owned(), ids);
        }
        let mut transfers: Vec<StoredTransfer> = self.intent_transfers[intent_id]
            .iter()
            .map(|id| self.transfers[id].clone())
            .collect();
        transfers.sort_by(transfer_order);
        Ok(transfers)
    }

    async fn put_transfer(&mut self, transfer: &StoredTransfer) -> Result<(), Error> {
        let is_new = !self.transfers.contains_key(&transfer.id);
        if is_new
            && let Some(intent_id) = &transfer.intent_id
            && let Some(list) = self.intent_transfers.get_mut(intent_id)
        {
            list.push(transfer.id.clone());
        }
        self.absent_transfers.remove(&transfer.id);
        self.transfers.insert(transfer.id.clone(), transfer.clone());
        self.mark_transfer_dirty(&transfer.id);
        Ok(())
    }

    async fn put_intent_state(&mut self, intent: &PaymentIntent) -> Result<(), Error> {
        self.intents.insert(intent.id.clone(), intent.clone());
        if self.dirty_intent_set.insert(intent.id.clone()) {
            self.dirty_intents.push(intent.id.clone());
        }
        Ok(())
    }

    async fn mark_settled(&mut self, reference: &OrderRef, entry_key: &str) -> Result<(), Error> {
        let now = self.now;
        let slot = self.order_slot(reference).await?;
        match slot {
            Some(slot) if slot.now.status == OrderStatus::Open => {
                slot.now.status = OrderStatus::Settled {
                    via: SettledVia::Payment,
                    entry_key: entry_key.to_owned(),
                    at: now,
                };
                Ok(())
            }
            _ => Err(StoreError::Corrupt(format!(
                "order {reference} was not open when settling it"
            ))
            .into()),
        }
    }

    async fn reopen_order(
        &mut self,
        reference: &OrderRef,
        entry_key: &str,
        attention: &str,
    ) -> Result<(), Error> {
        if let Some(slot) = self.order_slot(reference).await?
            && matches!(&slot.now.status, OrderStatus::Settled { entry_key: key, .. } if key == entry_key)
        {
            slot.now.status = OrderStatus::Open;
            slot.now.attention = Some(attention.to_owned());
        }
        Ok(())
    }

    async fn open_exception(&mut self, exception: ExceptionRecord) -> Result<(), Error> {
        if !self.exception_ids.insert(exception.id.clone()) {
            return Ok(());
        }
        self.events.push(PendingEvent {
            event: exception_opened_event(&exception),
            if_new_exception: Some(exception.id.clone()),
        });
        self.exceptions.push(exception);
        Ok(())
    }

    async fn append_event(&mut self, event: NewEvent) -> Result<(), Error> {
        self.events.push(PendingEvent {
            event,
            if_new_exception: None,
        });
        Ok(())
    }

    async fn post(&mut self, entries: Vec<NewEntry>) -> Result<(), Error> {
        for entry in entries {
            let hash = entry.content_hash();
            match self.posted_hashes.get(&entry.idempotency_key) {
                Some(earlier) if *earlier == hash => {}
                Some(_) => {
                    return Err(LedgerError::IdempotencyConflict(entry.idempotency_key).into());
                }
                None => {
                    self.posted_hashes
                        .insert(entry.idempotency_key.clone(), hash);
                    self.posted.push(entry);
                }
            }
        }
        Ok(())
    }

    async fn entry(&mut self, key: &str) -> Result<Option<NewEntry>, Error> {
        if !self.stored_entries.contains_key(key) {
            let stored = ledger::get_entry(self.tx.conn(), key).await?;
            self.stored_entries
                .insert(key.to_owned(), stored.map(|posted| posted.entry));
        }
        // What the journal holds wins: an entry posted again in the batch is a replay of it.
        if let Some(Some(stored)) = self.stored_entries.get(key) {
            return Ok(Some(stored.clone()));
        }
        Ok(self
            .posted
            .iter()
            .find(|entry| entry.idempotency_key == key)
            .cloned())
    }

    async fn lock_and_sum_customer(&mut self, customer: &AccountId) -> Result<i128, Error> {
        if !self.customer_sums.contains_key(customer) {
            let sum = ledger::lock_and_sum_customer(self.tx, customer, self.now).await?;
            self.customer_sums.insert(customer.clone(), sum);
        }
        let touching: Vec<&NewEntry> = self
            .posted
            .iter()
            .filter(|entry| entry.customer_nets().contains_key(customer))
            .collect();
        let mut sum = self.customer_sums[customer];
        if touching.is_empty() {
            return Ok(sum);
        }
        // An entry posted in the batch whose key the journal already holds is a replay and
        // moves nothing, exactly as posting it statement by statement would.
        let keys: Vec<&str> = touching
            .iter()
            .map(|entry| entry.idempotency_key.as_str())
            .collect();
        let replays = ledger::existing_keys(self.tx.conn(), &keys).await?;
        for entry in touching {
            if !replays.contains(&entry.idempotency_key) {
                sum += entry.customer_nets()[customer];
            }
        }
        Ok(sum)
    }

    async fn action_entries(&mut self, transfer: &TransferId) -> Result<Vec<String>, Error> {
        if let Some(keys) = self.action_entries.get(transfer) {
            return Ok(keys.clone());
        }
        let keys =
            operations::action_entries_for_transfer(self.tx.conn(), &transfer.to_string()).await?;
        self.action_entries.insert(transfer.clone(), keys.clone());
        Ok(keys)
    }
}
