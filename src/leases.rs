//! Watcher leases: on a shared PostgreSQL database each network's watcher runs in one
//! `payrecon serve` process at a time. A lease expires unless renewed, so a dead or stalled
//! holder is replaced within the lease time; the fencing token it carries makes the store
//! refuse a replaced holder's late writes.

use std::time::Duration;

use payrecon_chain_core::Network;

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

pub(crate) fn millis(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}
