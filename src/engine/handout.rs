//! Where new addresses come from: the blocks of derivation indexes this process takes (see
//! [`crate::indexes`]), and the counters of a restored database moved past every address it
//! may have handed out before it was lost.

use std::collections::HashMap;
use std::sync::Arc;

use payrecon_chain_core::{AddressDeriver, Network};

use super::Engine;
use crate::config::DEFAULT_LOOKAHEAD;
use crate::error::Error;
use crate::indexes::TakenIndex;
use crate::keys::{CounterMoved, HANDOUT_WAIT};
use crate::order::{OrderRef, OrderStatus};
use crate::store::keys::{self as key_store, RestoredCounter};

/// How often a new block asks whether the watcher has looked past a restored database's
/// counters (it may run in another process).
const RESTORE_LOOK_POLL: std::time::Duration = std::time::Duration::from_millis(200);

impl Engine {
    /// The next derivation index of `deriver`'s key (a key of `network`) for a new intent of
    /// `order_ref`. A new block is taken only for an order that can take an intent (a refused
    /// request stores nothing), and its addresses are derived on the blocking pool while its
    /// first intent is written.
    pub(crate) async fn take_index(
        &self,
        network: Network,
        deriver: &Arc<dyn AddressDeriver>,
        order_ref: &OrderRef,
    ) -> Result<TakenIndex, Error> {
        let key_id = deriver.key_id();
        let key_id = key_id.as_str();
        let pools = self.indexes.clone();
        pools
            .take(key_id, |block| async move {
                if self.order(order_ref).await?.status != OrderStatus::Open {
                    return Err(Error::AlreadySettled(order_ref.clone()));
                }
                self.restore_if_backup_copy().await?;
                self.wait_for_restore_look(network, key_id).await?;
                let mut tx = self.db().begin_write().await?;
                let now = self.now();
                let forget_before = now - self.payment_settings().monitoring_window;
                let first = key_store::take_block(
                    &mut tx,
                    key_id,
                    block.size,
                    now.timestamp_millis(),
                    (&block.spent, forget_before.timestamp_millis()),
                )
                .await?;
                tx.commit().await?;
                let deriver = deriver.clone();
                tokio::task::spawn_blocking(move || deriver.derive_ahead(first, block.size));
                Ok(first)
            })
            .await
    }

    /// Waits, at most [`HANDOUT_WAIT`], while `key_id` waits for its watcher's look past the
    /// counters of a restored database.
    async fn wait_for_restore_look(&self, network: Network, key_id: &str) -> Result<(), Error> {
        let deadline = tokio::time::Instant::now() + HANDOUT_WAIT;
        loop {
            let mut conn = self.db().pool().acquire().await?;
            if key_store::restore_pending(&mut conn, key_id)
                .await?
                .is_none()
            {
                return Ok(());
            }
            drop(conn);
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::CatchingUp(network));
            }
            tokio::time::sleep(RESTORE_LOOK_POLL).await;
        }
    }

    /// Tells payrecon that its database was restored from a backup (PostgreSQL's `pg_restore`;
    /// a copy `payrecon backup` wrote says so itself at the first start on it). Each key's
    /// counter moves `lookahead` past where the backup left it: the addresses the lost
    /// database handed out after the backup are never handed out again, and stay watched for a
    /// monitoring window. Until each network's watcher has looked past the counters, its new
    /// addresses wait; money it finds there moves the counter past it by the look-ahead again.
    /// Run it before the first new intent; a second run moves the counters again, harmlessly.
    pub async fn restored(&self) -> Result<Vec<CounterMoved>, Error> {
        Ok(self
            .move_restored_counters(false)
            .await?
            .unwrap_or_default())
    }

    /// [`Engine::restored`]; with `only_backup_copy`, only on a copy `payrecon backup` wrote
    /// that nobody started on yet (`None` otherwise). The mark is taken in the same
    /// transaction, so two processes starting at once move the counters once.
    async fn move_restored_counters(
        &self,
        only_backup_copy: bool,
    ) -> Result<Option<Vec<CounterMoved>>, Error> {
        let lookaheads: HashMap<&str, u32> = self
            .payment_settings()
            .keys
            .values()
            .flat_map(|keys| keys.all().map(|key| (key.key_id.as_str(), keys.lookahead)))
            .collect();
        let lookahead_of =
            |key_id: &str| lookaheads.get(key_id).copied().unwrap_or(DEFAULT_LOOKAHEAD);
        let mut tx = self.db().begin_write().await?;
        if !key_store::take_backup_mark(tx.conn()).await? && only_backup_copy {
            return Ok(None);
        }
        let counters = key_store::counters(tx.conn()).await?;
        let moved: Vec<RestoredCounter> = counters
            .iter()
            .map(|(key_id, next, held)| RestoredCounter {
                key_id: key_id.clone(),
                watched_from: *held,
                from_index: *next,
                lookahead: lookahead_of(key_id),
            })
            .collect();
        key_store::record_restore(tx.conn(), &moved, self.now().timestamp_millis()).await?;
        tx.commit().await?;
        for counter in &moved {
            tracing::warn!(
                key = %counter.key_id,
                from = counter.from_index,
                to = counter.until_index(),
                "restored database: the key's counter moved past every address the lost database may have handed out"
            );
        }
        Ok(Some(
            moved
                .into_iter()
                .map(|counter| CounterMoved {
                    counter_after: counter.until_index(),
                    counter_before: counter.from_index,
                    key_id: counter.key_id,
                })
                .collect(),
        ))
    }

    /// Runs [`Engine::restored`] when this database is a copy `payrecon backup` wrote that
    /// nobody started on yet.
    pub(crate) async fn restore_if_backup_copy(&self) -> Result<(), Error> {
        let mut conn = self.db().pool().acquire().await?;
        if key_store::is_backup_copy(&mut conn).await? {
            drop(conn);
            self.move_restored_counters(true).await?;
        }
        Ok(())
    }

    /// The watcher of `network` looked past its keys' counters and found nothing more: after a
    /// restore, its new addresses may go out again.
    pub(crate) async fn settle_restore(&self, network: Network) -> Result<(), Error> {
        let Some(keys) = self.payment_settings().keys.get(&network) else {
            return Ok(());
        };
        let key_ids: Vec<String> = keys.all().map(|key| key.key_id.clone()).collect();
        let mut tx = self.db().begin_write().await?;
        let backend = tx.backend();
        let settled = key_store::settle_restore(tx.conn(), backend, &key_ids).await?;
        tx.commit().await?;
        if settled > 0 {
            tracing::info!(%network, "restored database: the watcher looked past the counters; new addresses go out again");
        }
        Ok(())
    }
}
