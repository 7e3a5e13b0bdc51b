//! What the background processes do: watchers apply chain events, hold their leases and
//! report their health; the deadline ticker; the webhook sender's outbox.

use crate::crash::crash_point;
use crate::engine::Engine;
use crate::error::Error;
use crate::intent::ChainRead;
use crate::leases::{Lease, millis};
use crate::matcher;
use crate::outbox::{DISPATCH_BATCH, SEND_BATCH, retry_at};
use crate::payments::{TICK_BATCH, check_batch, check_outflows};
use crate::records::WatcherHealth;
use crate::store::keys::UnissuedRow;
use crate::store::operations::DueDelivery;
use crate::store::witness::Verdicts;
use crate::store::{leases, operations, payments};
use chrono::{DateTime, Utc};
use payrecon_chain_core::{
    ChainCursor, ChainEvent, Network, OutflowEvent, ScanBatch, Unexplained, Unreadable,
};
use std::time::Duration;

impl Engine {
    /// Applies chain events, in one transaction: all or none. The batch is matched set-based
    /// (tests can choose the one-by-one reference path): its reads and writes take a
    /// number of statements that does not grow with its length.
    pub async fn apply_chain_events(&self, events: &[ChainEvent]) -> Result<(), Error> {
        self.apply(events, &[], Quarantined::NONE, None, None).await
    }

    /// Applies outflow reports (value leaving watched addresses), in one transaction; each is
    /// booked once as deep as its network's payments must be.
    pub async fn apply_outflows(&self, outflows: &[OutflowEvent]) -> Result<(), Error> {
        self.apply(&[], outflows, Quarantined::NONE, None, None)
            .await
    }

    /// Applies a watcher's events and moves its cursor in the same transaction: after a crash
    /// the watcher resumes from the cursor and finds nothing missing and nothing doubled.
    pub async fn apply_chain_events_at(
        &self,
        network: Network,
        events: &[ChainEvent],
        cursor: &ChainCursor,
    ) -> Result<(), Error> {
        check_batch(network, events, cursor)?;
        self.apply(
            events,
            &[],
            Quarantined::NONE,
            Some((network, cursor, &[])),
            None,
        )
        .await
    }

    /// [`Engine::apply_chain_events_at`] for a watcher running under `lease`: refused with
    /// [`Error::LeaseLost`], and nothing written, once another process holds the lease.
    pub async fn apply_chain_events_fenced(
        &self,
        events: &[ChainEvent],
        cursor: &ChainCursor,
        lease: &crate::leases::Lease,
    ) -> Result<(), Error> {
        check_batch(lease.network, events, cursor)?;
        self.apply(
            events,
            &[],
            Quarantined::NONE,
            Some((lease.network, cursor, &[])),
            Some(lease),
        )
        .await
    }

    /// A scan's receipts and outflows with its cursor, in one transaction (under `lease` when
    /// given): what the watcher loop commits. `unissued` are its receipts at addresses ahead of
    /// their key's counter: each moves the counter past its index before it is matched.
    pub(crate) async fn apply_scan(
        &self,
        network: Network,
        batch: &ScanBatch,
        unissued: &[UnissuedRow],
        witnessed: &Verdicts,
        lease: Option<&crate::leases::Lease>,
    ) -> Result<(), Error> {
        check_batch(network, &batch.events, &batch.cursor)?;
        check_outflows(network, &batch.outflows)?;
        self.apply(
            &batch.events,
            &batch.outflows,
            Quarantined {
                unreadable: &batch.unreadable,
                unexplained: &batch.unexplained,
                witnessed,
            },
            Some((network, &batch.cursor, unissued)),
            lease,
        )
        .await
    }

    async fn apply(
        &self,
        events: &[ChainEvent],
        outflows: &[OutflowEvent],
        quarantined: Quarantined<'_>,
        cursor: Option<(Network, &ChainCursor, &[UnissuedRow])>,
        lease: Option<&crate::leases::Lease>,
    ) -> Result<(), Error> {
        let now = self.now();
        let settings = self.payment_settings();
        let mut tx = self.db().begin_write().await?;
        if let Some(lease) = lease
            && !crate::store::leases::check_fence(
                &mut tx,
                lease.network.as_str(),
                &lease.holder,
                lease.token,
            )
            .await?
        {
            return Err(Error::LeaseLost(lease.network));
        }
        if let Some((_, _, unissued)) = cursor {
            let backend = tx.backend();
            for row in unissued {
                crate::store::keys::record_unissued(
                    tx.conn(),
                    backend,
                    row,
                    now.timestamp_millis(),
                )
                .await?;
            }
        }
        matcher::apply_events(
            self.matcher_path(),
            &mut tx,
            &settings.policy,
            events,
            now,
            || crash_point("apply.after_event"),
        )
        .await?;
        crate::outflows::apply(&mut tx, &settings.policy, outflows, now).await?;
        if let Some((network, cursor, _)) = cursor {
            quarantine(tx.conn(), network, quarantined.unreadable, now).await?;
            open_unexplained(tx.conn(), network, quarantined.unexplained, now).await?;
            record_witnessed(tx.conn(), network, quarantined.witnessed, now).await?;
            crate::store::cursors::put(tx.conn(), network, cursor, now).await?;
        }
        crash_point("apply.before_commit");
        tx.commit().await?;
        crash_point("apply.after_commit");
        self.notify_events();
        Ok(())
    }

    /// Receipts the witnesses were asked about, per network and state, for `/metrics`.
    pub(crate) async fn witness_counts(&self) -> Result<Vec<(Network, &'static str, i64)>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(crate::store::witness::counts(&mut conn).await?)
    }

    /// How far each network's chain has been read, for its deadlines.
    pub(crate) async fn chain_reads(&self) -> Result<ChainReads, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(ChainReads(operations::chain_reads(&mut conn).await?))
    }

    /// Where `network`'s watcher committed its last batch, if anywhere.
    pub async fn watcher_cursor(&self, network: Network) -> Result<Option<ChainCursor>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(crate::store::cursors::get(&mut conn, network).await?)
    }

    /// Moves intents whose deadline passed to expired or underpaid, once their chain was read
    /// past it (a watcher behind or a source down holds them as they are). Call it
    /// periodically; returns how many intents it looked at.
    pub async fn tick(&self) -> Result<usize, Error> {
        let now = self.now();
        let settings = self.payment_settings();
        let mut tx = self.db().begin_write().await?;
        let reads = ChainReads(operations::chain_reads(tx.conn()).await?);
        let cutoffs: Vec<(Network, DateTime<Utc>)> = Network::ALL
            .into_iter()
            .filter_map(|network| Some((network, reads.of(network).cutoff(now)?)))
            .collect();
        let due = payments::due_intent_ids(tx.conn(), &cutoffs, TICK_BATCH as i64).await?;
        matcher::evaluate_due(self.matcher_path(), &mut tx, &settings.policy, &due, now).await?;
        tx.commit().await?;
        self.notify_events();
        Ok(due.len())
    }

    /// Watch keys a network's watcher must follow now (monitoring windows included).
    pub async fn watch_keys(&self, network: Network) -> Result<Vec<String>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(payments::watch_keys(&mut conn, network, self.now()).await?)
    }

    /// Takes `network`'s lease for `holder` for `ttl`, if no other holder's lease is live.
    pub async fn acquire_lease(
        &self,
        network: Network,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, Error> {
        let mut tx = self.db().begin_write().await?;
        let token = leases::acquire(&mut tx, network.as_str(), holder, millis(ttl)).await?;
        tx.commit().await?;
        Ok(token.map(|token| Lease {
            network,
            holder: holder.to_owned(),
            token,
        }))
    }

    /// Extends a held lease by `ttl` from now; false when it was lost to another holder.
    pub async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<bool, Error> {
        let mut tx = self.db().begin_write().await?;
        let renewed = leases::renew(
            &mut tx,
            lease.network.as_str(),
            &lease.holder,
            lease.token,
            millis(ttl),
        )
        .await?;
        tx.commit().await?;
        Ok(renewed)
    }

    /// Who last took `network`'s lease, and its fencing token (operators, tests).
    pub async fn lease_holder(&self, network: Network) -> Result<Option<(String, i64)>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(leases::holder(&mut conn, network.as_str()).await?)
    }

    /// Gives a lease up now (a clean shutdown), so another process takes over at once.
    pub async fn release_lease(&self, lease: &Lease) -> Result<(), Error> {
        let mut tx = self.db().begin_write().await?;
        leases::release(&mut tx, lease.network.as_str(), &lease.holder, lease.token).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records a watcher's health (the watcher loop calls it after every round).
    pub async fn record_watcher_health(&self, health: &WatcherHealth) -> Result<(), Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(operations::put_watcher_health(&mut conn, health).await?)
    }

    /// Copies undispatched outbox events into a delivery per endpoint, each given up after
    /// that endpoint's own retry window. Returns how many events were dispatched.
    pub(crate) async fn dispatch_outbox(
        &self,
        endpoints: &[(String, chrono::Duration)],
    ) -> Result<usize, Error> {
        let now = self.clock().now();
        let mut tx = self.db().begin_write().await?;
        let dispatched =
            operations::dispatch_events(tx.conn(), endpoints, DISPATCH_BATCH, now).await?;
        tx.commit().await?;
        Ok(dispatched)
    }

    pub(crate) async fn due_deliveries(&self, endpoint: &str) -> Result<Vec<DueDelivery>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        let now = self.clock().now();
        Ok(operations::due_deliveries(&mut conn, endpoint, now, SEND_BATCH).await?)
    }

    pub(crate) async fn finish_delivery(
        &self,
        endpoint: &str,
        delivery: &DueDelivery,
        error: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<(), Error> {
        let (state, next) = match error {
            None => ("delivered", now),
            Some(_) if now.timestamp_millis() >= delivery.give_up_at_ms => ("abandoned", now),
            Some(_) => ("pending", retry_at(now, delivery.attempts)),
        };
        let mut tx = self.db().begin_write().await?;
        operations::finish_delivery(
            tx.conn(),
            endpoint,
            delivery.event_seq,
            state,
            next.timestamp_millis(),
            error,
            now,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

/// How far each network's watcher has read its chain, as the watchers reported it.
pub(crate) struct ChainReads(Vec<(String, Option<i64>)>);

impl ChainReads {
    /// `network`'s.
    pub(crate) fn of(&self, network: Network) -> ChainRead {
        match self.0.iter().find(|(name, _)| name == network.as_str()) {
            None => ChainRead::Unwatched,
            Some((_, read)) => ChainRead::Until(read.and_then(DateTime::from_timestamp_millis)),
        }
    }
}

/// What a scan hands operators instead of booking it, and what its witnesses said.
#[derive(Clone, Copy)]
struct Quarantined<'a> {
    unreadable: &'a [Unreadable],
    unexplained: &'a [Unexplained],
    witnessed: &'a Verdicts,
}

impl Quarantined<'_> {
    const NONE: Quarantined<'static> = Quarantined {
        unreadable: &[],
        unexplained: &[],
        witnessed: Verdicts::NONE,
    };
}

/// Records what the witnesses said: each receipt's check, a `sources_disagree` exception per
/// receipt they do not confirm (`sources_disagree:<transfer>`, naming its intent), and the
/// close of that exception once they do.
async fn record_witnessed(
    conn: &mut sqlx::AnyConnection,
    network: Network,
    witnessed: &Verdicts,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let now_ms = now.timestamp_millis();
    crate::store::witness::put_checks(conn, &witnessed.checks, now_ms).await?;
    for id in &witnessed.confirmed {
        let exception = format!("sources_disagree:{id}");
        if payments::close_exception(conn, &exception, "confirmed by every witness", now_ms).await?
        {
            tracing::info!(%network, transfer = %id, "the witnesses now confirm a held receipt: its exception closed");
        }
    }
    for (id, detail) in &witnessed.disagreements {
        let transfer = payments::get_transfer(conn, id).await?;
        let address = transfer
            .as_ref()
            .map(|t| t.to_address.as_str())
            .unwrap_or_default();
        let intents = payments::intents_by_watch_keys(conn, network, &[address]).await?;
        let intent = intents.first();
        let record = crate::records::ExceptionRecord {
            id: format!("sources_disagree:{id}"),
            kind: "sources_disagree".into(),
            intent_id: intent.map(|i| i.id.clone()),
            order_ref: intent.map(|i| i.order_ref.to_string()),
            transfer: Some(id.to_string()),
            detail: format!(
                "{detail}. Nothing of it is credited while the sources disagree; see the operators' guide."
            ),
            opened_at: now,
            resolved_at: None,
            resolution: None,
        };
        payments::open_exception(conn, &record).await?;
    }
    Ok(())
}

/// Opens one exception per balance change of a watched address that no transaction explains
/// in a scanned block (`unexplained_balance:<network>:<address>:<block hash>`), naming the
/// address's key and index and its intent when it has one: nothing is booked, as nobody can
/// say whose it is; the holdings check books what stays unexplained.
async fn open_unexplained(
    conn: &mut sqlx::AnyConnection,
    network: Network,
    unexplained: &[Unexplained],
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let addresses: Vec<&str> = unexplained.iter().map(|u| u.address.as_str()).collect();
    let intents = payments::intents_by_watch_keys(conn, network, &addresses).await?;
    for item in unexplained {
        let intent = intents.iter().find(|i| i.watch_key == item.address);
        let direction = if item.arrived { "arrived at" } else { "left" };
        let record = crate::records::ExceptionRecord {
            id: format!(
                "unexplained_balance:{network}:{}:{}",
                item.address, item.block.hash
            ),
            kind: "unexplained_balance".into(),
            intent_id: intent.map(|i| i.id.clone()),
            order_ref: intent.map(|i| i.order_ref.to_string()),
            transfer: None,
            detail: format!(
                "{} {} {direction} {} ({}) in block {} ({}), and {}. \
                 Nothing of it is booked or credited; see the operators' guide.",
                item.amount.to_decimal_string(item.method.decimals()),
                item.method.asset(),
                item.address,
                place_of(intent, None),
                item.block.height,
                item.block.hash,
                item.reason
            ),
            opened_at: now,
            resolved_at: None,
            resolution: None,
        };
        if payments::open_exception(conn, &record).await? {
            tracing::warn!(%network, address = %item.address, block = item.block.height, "a balance change no transaction explains: an exception for operators");
        }
    }
    Ok(())
}

/// Where an address payrecon watches comes from, as exceptions name it: its intent's key and
/// index, else the look-ahead window's.
pub(crate) fn place_of(
    intent: Option<&crate::intent::PaymentIntent>,
    lookahead: Option<&(String, u32)>,
) -> String {
    match (intent, lookahead) {
        (Some(intent), _) => format!(
            "index {} of key {} (intent {} of order {})",
            intent.derivation_index, intent.key_id, intent.id, intent.order_ref
        ),
        (None, Some((key_id, index))) => {
            format!("index {index} of key {key_id}, ahead of the key's counter")
        }
        (None, None) => "an address of a key's look-ahead window".to_owned(),
    }
}

/// Opens one exception per transaction a scan could not read (`unreadable_transaction:
/// <network>:<txid>`, so a transaction reported round after round is one exception): nothing
/// of it is booked, and the watcher goes on with everything else.
async fn quarantine(
    conn: &mut sqlx::AnyConnection,
    network: Network,
    unreadable: &[Unreadable],
    now: DateTime<Utc>,
) -> Result<(), Error> {
    for item in unreadable {
        let address = match item.address.as_str() {
            "" => "an address it does not name readably (it may be a watched one)".to_owned(),
            address => format!("the watched address {address}"),
        };
        let record = crate::records::ExceptionRecord {
            id: format!("unreadable_transaction:{network}:{}", item.txid),
            kind: "unreadable_transaction".into(),
            intent_id: None,
            order_ref: None,
            transfer: None,
            detail: format!(
                "transaction {} on {network} touches {address} and cannot be read: {}. \
                 Nothing of it is booked; the watcher goes on. See the operators' guide.",
                item.txid, item.reason
            ),
            opened_at: now,
            resolved_at: None,
            resolution: None,
        };
        if payments::open_exception(conn, &record).await? {
            tracing::warn!(%network, txid = %item.txid, address = %item.address, reason = %item.reason, "a transaction cannot be read: quarantined for operators");
        }
    }
    Ok(())
}
