//! The watcher's look at refunds waiting for the chain: each round that reached the source's
//! head, its own source is asked what each candidate transaction pays the customer's
//! address, and the engine moves the refund on that answer. A source that cannot answer
//! costs only this look: receipts are never held up for a refund.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use payrecon_chain_core::{ChainScanner, Network};

use crate::engine::Engine;
use crate::engine::refund_chain::settles;
use crate::error::Error;

/// How often the refunds are looked at: the chain moves a block at a time.
const LOOK_AGAIN_AFTER: Duration = Duration::from_secs(2);

/// Transactions remembered as not paying their refund, at most: past it, forgotten at once.
const KEPT_REFUSALS: usize = 10_000;

/// When the refunds were last looked at, and the transactions already found paying a refund
/// too little at the depth a payment needs: they are not asked about again every look (an
/// account chain's sweeps from a refund's address, say).
pub(super) struct RefundWatch {
    next_look: Instant,
    refused: HashSet<(String, String)>,
}

impl RefundWatch {
    pub(super) fn new() -> RefundWatch {
        RefundWatch {
            next_look: Instant::now(),
            refused: HashSet::new(),
        }
    }

    /// Looks at `network`'s refunds waiting for the chain, at most every
    /// [`LOOK_AGAIN_AFTER`].
    pub(super) async fn look<S: ChainScanner>(
        &mut self,
        engine: &Engine,
        scanner: &mut S,
        network: Network,
    ) -> Result<(), Error> {
        if Instant::now() < self.next_look {
            return Ok(());
        }
        self.next_look = Instant::now() + LOOK_AGAIN_AFTER;
        'refunds: for lookout in engine.refund_lookouts(network).await? {
            let refund = &lookout.refund;
            let asset = refund.asset();
            let mut seen = None;
            for candidate in &lookout.candidates {
                let key = (refund.id.clone(), candidate.txid.clone());
                if self.refused.contains(&key) {
                    continue;
                }
                match scanner
                    .paid_to(&candidate.txid, &refund.address, &asset, candidate.seen_at)
                    .await
                {
                    Ok(Some(paid)) if settles(refund, candidate, &paid) => {
                        seen = Some((candidate, paid));
                        break;
                    }
                    // As deep as a payment must be, it is as final as payrecon takes
                    // anything: it will not pay this refund in another block.
                    Ok(Some(paid)) if paid.confirmations >= engine.refund_depth(refund) => {
                        if self.refused.len() >= KEPT_REFUSALS {
                            self.refused.clear();
                        }
                        self.refused.insert(key);
                    }
                    Ok(_) => {}
                    Err(error) => {
                        let error = error.scrubbed(scanner.source());
                        tracing::warn!(%network, refund = %refund.id, txid = %candidate.txid, %error, "a refund's transaction could not be looked up");
                        continue 'refunds;
                    }
                }
            }
            if let Some(short) = engine
                .refund_seen(refund, seen.as_ref().map(|(c, p)| (*c, p)), "payrecon")
                .await?
            {
                tracing::info!(%network, refund = %refund.id, %short, "a transaction that pays another refund is not this one's");
            }
        }
        Ok(())
    }
}
