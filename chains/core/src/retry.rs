//! Retrying one request to a node: what every chain's HTTP client shares.
//!
//! A request that failed on the way (connection refused or reset, a timeout, an answer cut
//! short, "rate limited", a server error) is asked again after a pause that doubles each time,
//! or after what the server's `Retry-After` says. When the retries run out the scan fails as
//! [`ScanError::Transient`] and the watcher backs off as a whole: nothing is ever skipped. An
//! answer that is complete and wrong is [`ScanError::Fatal`] at once.

use std::future::Future;
use std::time::Duration;

use crate::ScanError;

/// How one attempt at a request ended, when it did not succeed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// It may pass if asked again: after `after` when the server said so.
    Retry {
        /// What went wrong, for the log and the final error.
        reason: String,
        /// The server's own `Retry-After`.
        after: Option<Duration>,
    },
    /// Asking again cannot help.
    Fatal(String),
}

impl Attempt {
    /// A failure worth retrying after the usual pause.
    pub fn retry(reason: impl Into<String>) -> Attempt {
        Attempt::Retry {
            reason: reason.into(),
            after: None,
        }
    }
}

/// How often and how patiently a request is asked again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub retries: u32,
    /// The first pause; doubled per retry.
    pub first_pause: Duration,
    /// The longest pause, also for a server's `Retry-After`.
    pub max_pause: Duration,
}

impl Default for RetryPolicy {
    /// Five retries from 200 ms, at most 30 s apart: a node restarting on the same machine
    /// comes back within them, a dead one fails the scan within a minute.
    fn default() -> RetryPolicy {
        RetryPolicy {
            retries: 5,
            first_pause: Duration::from_millis(200),
            max_pause: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Runs `attempt` until it succeeds, fails for good, or the retries run out. `what` names
    /// the request in the log.
    pub async fn run<T, F, Fut>(&self, what: &str, mut attempt: F) -> Result<T, ScanError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Attempt>>,
    {
        let mut pause = self.first_pause;
        let mut tries = 0;
        loop {
            tries += 1;
            let failure = match attempt().await {
                Ok(answer) => return Ok(answer),
                Err(Attempt::Fatal(reason)) => return Err(ScanError::Fatal(reason)),
                Err(Attempt::Retry { reason, after }) => {
                    pause = after.unwrap_or(pause).min(self.max_pause);
                    reason
                }
            };
            if tries > self.retries {
                return Err(ScanError::Transient(failure));
            }
            tracing::debug!(what, tries, %failure, retry_in = ?pause, "request failed");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(self.max_pause);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick() -> RetryPolicy {
        RetryPolicy {
            retries: 2,
            first_pause: Duration::from_millis(1),
            max_pause: Duration::from_millis(2),
        }
    }

    #[tokio::test]
    async fn retries_until_it_passes_then_gives_up_as_transient() {
        let mut calls = 0;
        let answer = quick()
            .run("t", || {
                calls += 1;
                let now = calls;
                async move {
                    if now < 3 {
                        Err(Attempt::retry("reset"))
                    } else {
                        Ok(now)
                    }
                }
            })
            .await;
        assert_eq!(answer, Ok(3));
        let failed: Result<(), _> = quick()
            .run("t", || async { Err(Attempt::retry("down")) })
            .await;
        assert_eq!(failed, Err(ScanError::Transient("down".into())));
    }

    #[tokio::test]
    async fn a_fatal_answer_is_not_asked_again() {
        let mut calls = 0;
        let failed: Result<(), _> = quick()
            .run("t", || {
                calls += 1;
                async { Err(Attempt::Fatal("garbage".into())) }
            })
            .await;
        assert_eq!(failed, Err(ScanError::Fatal("garbage".into())));
        assert_eq!(calls, 1);
    }
}
