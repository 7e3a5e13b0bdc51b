//! Watcher leases: on a shared PostgreSQL database each network's watcher runs in one
//! `payrecon serve` process at a time. A lease expires unless renewed, so a dead or stalled
//! holder is replaced within the lease time; the fencing token it carries makes the store
//! refuse a replaced holder's late writes.

use std::time::Duration;

use payrecon_chain_core::Network;

use crate::engine::Engine;
use crate::error::Error;
use crate::store::leases;

/// A held lease: what a watcher's writes carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The network whose watcher it allows.
    pub network: Network,
    /// Who holds it (unique per process).
    pub holder: String,
    /// Grows at every change of holder; writes carrying an older one are refused.
    pub token: i64,
}

fn millis(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

impl Engine {
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
}
