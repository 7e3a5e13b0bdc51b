//! Several sources of one network, in the operator's order: a provider's outage, rate limit or
//! lag moves the watcher to the next source instead of stopping the network's payments, and it
//! comes back to the first once that one is healthy again.
//!
//! Each source is a whole scanner of its own, so a switch starts the next one afresh from the
//! watcher's cursor (its checkpoints find a fork the new source disagrees on, as after any
//! reconnect). Which source serves is the scanner's [`ChainScanner::source`].

use std::time::{Duration, Instant};

use crate::{
    Amount, Attestation, BlockId, ChainScanner, KnownTransfer, Method, Network, Probe, ScanBatch,
    ScanError, SecretUrl, SweepFees, WatchView,
};

/// When to leave a source that answers but lags, and when to try the first one again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailoverPolicy {
    /// A source whose newest block is more than this behind another's is left for it.
    pub max_lag_blocks: u64,
    /// How often the other sources' newest blocks are read to compare (a probe each).
    pub lag_check_every: Duration,
    /// How long after a switch away from the first source it is tried again.
    pub retry_first_after: Duration,
}

impl Default for FailoverPolicy {
    fn default() -> FailoverPolicy {
        FailoverPolicy {
            max_lag_blocks: 10,
            lag_check_every: Duration::from_secs(60),
            retry_first_after: Duration::from_secs(300),
        }
    }
}

/// Sources of one network, one of them serving at a time.
pub struct Failover<S> {
    sources: Vec<S>,
    policy: FailoverPolicy,
    active: usize,
    /// Sources found serving another chain: never used again until the configuration changes.
    refused: Vec<bool>,
    /// The newest block the active source reported.
    head: Option<u64>,
    last_lag_check: Instant,
    switched_at: Instant,
}

impl<S: ChainScanner> Failover<S> {
    /// `sources` in order of preference (at least one), all of one network.
    ///
    /// # Panics
    ///
    /// With no source, or sources of several networks: a configuration reader's mistake.
    pub fn new(sources: Vec<S>, policy: FailoverPolicy) -> Failover<S> {
        assert!(!sources.is_empty(), "a failover needs a source");
        let network = sources[0].network();
        assert!(
            sources.iter().all(|s| s.network() == network),
            "one network's sources"
        );
        Failover {
            refused: vec![false; sources.len()],
            sources,
            policy,
            active: 0,
            head: None,
            last_lag_check: Instant::now(),
            switched_at: Instant::now(),
        }
    }

    /// Which source serves now (0 is the first configured).
    pub fn active(&self) -> usize {
        self.active
    }

    /// Every source, in order: `payrecon doctor` checks each.
    pub fn sources_mut(&mut self) -> &mut [S] {
        &mut self.sources
    }

    fn switch(&mut self, to: usize, why: &str) {
        if to == self.active {
            return;
        }
        tracing::warn!(
            network = %self.sources[0].network(),
            from = %self.sources[self.active].source(),
            to = %self.sources[to].source(),
            why,
            "switching the chain source"
        );
        self.sources[self.active].reset();
        self.active = to;
        self.head = None;
        self.switched_at = Instant::now();
    }

    /// The usable source after `from`, in order, if any other.
    fn next_after(&self, from: usize) -> Option<usize> {
        (1..self.sources.len())
            .map(|step| (from + step) % self.sources.len())
            .find(|i| !self.refused[*i])
    }

    /// Before a round: back to the first source once it is healthy and current again, and away
    /// from the active one when another is ahead of it by more than the allowed lag.
    async fn choose(&mut self) {
        if self.sources.len() == 1 {
            return;
        }
        if self.active != 0
            && !self.refused[0]
            && self.switched_at.elapsed() >= self.policy.retry_first_after
        {
            self.switched_at = Instant::now();
            if let Ok(probe) = self.sources[0].probe().await {
                let current = self
                    .head
                    .is_none_or(|head| probe.tip_height + self.policy.max_lag_blocks >= head);
                if current {
                    self.switch(0, "the first source answers again and is current");
                    return;
                }
            }
        }
        let Some(head) = self.head else { return };
        if self.last_lag_check.elapsed() < self.policy.lag_check_every {
            return;
        }
        self.last_lag_check = Instant::now();
        let mut best: Option<(usize, u64)> = None;
        for i in 0..self.sources.len() {
            if i == self.active || self.refused[i] {
                continue;
            }
            if let Ok(probe) = self.sources[i].probe().await
                && probe.tip_height > head + self.policy.max_lag_blocks
                && best.is_none_or(|(_, tip)| probe.tip_height > tip)
            {
                best = Some((i, probe.tip_height));
            }
        }
        if let Some((i, _)) = best {
            self.switch(i, "the active source lags behind another");
        }
    }
}

impl<S: ChainScanner> ChainScanner for Failover<S> {
    fn network(&self) -> Network {
        self.sources[0].network()
    }

    fn source(&self) -> &SecretUrl {
        self.sources[self.active].source()
    }

    /// One scan by the active source. A source that fails is left for the next one, which
    /// serves the next round; one that serves another chain is never used again. The error
    /// returned names the source that failed, with its credentials taken out.
    async fn scan(&mut self, view: &WatchView) -> Result<ScanBatch, ScanError> {
        self.choose().await;
        let active = self.active;
        match self.sources[active].scan(view).await {
            Ok(batch) => {
                self.head = Some(batch.head);
                Ok(batch)
            }
            Err(error) => {
                let error = error.scrubbed(self.sources[active].source());
                if matches!(error, ScanError::WrongChain(_)) {
                    self.refused[active] = true;
                }
                match self.next_after(active) {
                    Some(next) => {
                        self.switch(next, "the active source failed");
                        // Another source serves the next round: nothing is stopped for good.
                        Err(match error {
                            ScanError::Transient(reason)
                            | ScanError::Fatal(reason)
                            | ScanError::WrongChain(reason) => ScanError::Transient(reason),
                        })
                    }
                    None => Err(error),
                }
            }
        }
    }

    fn reset(&mut self) {
        self.sources[self.active].reset();
    }

    async fn attest(
        &mut self,
        transfers: &[KnownTransfer],
        settle_depth: u32,
    ) -> Result<Vec<Attestation>, ScanError> {
        self.sources[self.active]
            .attest(transfers, settle_depth)
            .await
    }

    async fn balances_at(
        &mut self,
        holdings: &[(String, Method)],
        until_ms: i64,
    ) -> Result<(BlockId, Vec<Amount>), ScanError> {
        self.sources[self.active]
            .balances_at(holdings, until_ms)
            .await
    }

    async fn balances_at_height(
        &mut self,
        holdings: &[(String, Method)],
        height: u64,
    ) -> Result<(BlockId, Vec<Amount>), ScanError> {
        self.sources[self.active]
            .balances_at_height(holdings, height)
            .await
    }

    async fn probe(&mut self) -> Result<Probe, ScanError> {
        self.sources[self.active].probe().await
    }

    async fn sweep_fees(&mut self) -> Result<SweepFees, ScanError> {
        self.sources[self.active].sweep_fees().await
    }

    fn incomplete_answers(&self) -> u64 {
        self.sources
            .iter()
            .map(ChainScanner::incomplete_answers)
            .sum()
    }

    async fn news(&mut self) {
        self.sources[self.active].news().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::ChainCursor;

    /// A source's newest block, and the error it answers with while it fails.
    type Script = Arc<Mutex<(u64, Option<ScanError>)>>;

    /// A source whose newest block and health the test sets.
    struct Scripted {
        url: SecretUrl,
        state: Script,
    }

    impl Scripted {
        fn new(name: &str, head: u64) -> (Scripted, Script) {
            let state = Arc::new(Mutex::new((head, None)));
            let url = SecretUrl::new(format!("http://user:key-{name}@{name}.example/"));
            (
                Scripted {
                    url,
                    state: state.clone(),
                },
                state,
            )
        }
    }

    impl ChainScanner for Scripted {
        fn network(&self) -> Network {
            Network::Ethereum
        }

        fn source(&self) -> &SecretUrl {
            &self.url
        }

        async fn scan(&mut self, _view: &WatchView) -> Result<ScanBatch, ScanError> {
            let (head, failure) = self.state.lock().unwrap().clone();
            if let Some(error) = failure {
                return Err(error);
            }
            let tip = BlockId {
                height: head,
                hash: format!("0x{head:x}"),
            };
            Ok(ScanBatch {
                events: Vec::new(),
                outflows: Vec::new(),
                cursor: ChainCursor {
                    tip,
                    checkpoints: Vec::new(),
                },
                more: false,
                head,
                unreadable: Vec::new(),
                unexplained: Vec::new(),
            })
        }

        fn reset(&mut self) {}

        async fn attest(
            &mut self,
            _: &[KnownTransfer],
            _: u32,
        ) -> Result<Vec<Attestation>, ScanError> {
            Ok(Vec::new())
        }

        async fn probe(&mut self) -> Result<Probe, ScanError> {
            let (head, failure) = self.state.lock().unwrap().clone();
            match failure {
                Some(error) => Err(error),
                None => Ok(Probe {
                    tip_height: head,
                    tip_time_ms: None,
                    syncing: false,
                    findings: Vec::new(),
                }),
            }
        }
    }

    fn at_once() -> FailoverPolicy {
        FailoverPolicy {
            max_lag_blocks: 10,
            lag_check_every: Duration::ZERO,
            retry_first_after: Duration::ZERO,
        }
    }

    #[tokio::test]
    async fn a_failed_source_hands_the_next_round_to_the_next_and_the_first_comes_back() {
        let (first, first_state) = Scripted::new("first", 100);
        let (second, _) = Scripted::new("second", 100);
        let mut sources = Failover::new(vec![first, second], at_once());
        let view = WatchView::default();
        assert_eq!(sources.scan(&view).await.unwrap().head, 100);
        first_state.lock().unwrap().1 = Some(ScanError::Transient(
            "HTTP 502 from http://user:key-first@first.example/".into(),
        ));
        let failed = sources.scan(&view).await.unwrap_err();
        assert!(
            matches!(&failed, ScanError::Transient(why) if !why.contains("key-first")),
            "the error is transient and hides the source's key: {failed}"
        );
        assert_eq!(sources.active(), 1);
        assert_eq!(sources.scan(&view).await.unwrap().head, 100);
        assert_eq!(sources.active(), 1, "the first is still down");
        // Healthy and current again: the first serves once more.
        first_state.lock().unwrap().1 = None;
        sources.scan(&view).await.unwrap();
        assert_eq!(sources.active(), 0);
    }

    #[tokio::test]
    async fn a_source_lagging_past_the_limit_is_left_and_a_wrong_chain_never_used_again() {
        let (first, first_state) = Scripted::new("first", 100);
        let (second, second_state) = Scripted::new("second", 120);
        let (third, _) = Scripted::new("third", 100);
        let policy = FailoverPolicy {
            retry_first_after: Duration::from_secs(3600),
            ..at_once()
        };
        let mut sources = Failover::new(vec![first, second, third], policy);
        let view = WatchView::default();
        sources.scan(&view).await.unwrap();
        // The second is 20 blocks ahead of the first, past the limit of 10.
        assert_eq!(sources.scan(&view).await.unwrap().head, 120);
        assert_eq!(sources.active(), 1);
        // It turns out to serve another chain: it is refused, and the watcher goes on.
        second_state.lock().unwrap().1 = Some(ScanError::WrongChain("chain id 5".into()));
        assert!(matches!(
            sources.scan(&view).await,
            Err(ScanError::Transient(_))
        ));
        assert_eq!(sources.active(), 2);
        first_state.lock().unwrap().1 = Some(ScanError::WrongChain("chain id 5".into()));
        second_state.lock().unwrap().0 = 500;
        sources.scan(&view).await.unwrap();
        assert_eq!(
            sources.active(),
            2,
            "a refused source is never chosen, however far ahead"
        );
    }
}
