//! The webhook outbox's rules: how many events and deliveries one transaction moves, and
//! when a failed delivery is tried again. The engine applies them; the sender follows them.

use chrono::{DateTime, Utc};

/// Events copied into deliveries per transaction.
pub(crate) const DISPATCH_BATCH: i64 = 500;
/// Deliveries a lane reads per query.
pub(crate) const SEND_BATCH: i64 = 100;
/// First retry delay; doubled per failed attempt up to [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: chrono::Duration = chrono::Duration::seconds(1);
/// The longest wait between two attempts.
const MAX_RETRY_DELAY: chrono::Duration = chrono::Duration::hours(1);

/// When to try again after `attempts` failed attempts.
pub(crate) fn retry_at(now: DateTime<Utc>, attempts: i64) -> DateTime<Utc> {
    let doublings = attempts.clamp(0, 20) as i32;
    let delay = FIRST_RETRY_DELAY
        .checked_mul(2i32.saturating_pow(doublings as u32))
        .unwrap_or(MAX_RETRY_DELAY)
        .min(MAX_RETRY_DELAY);
    now + delay
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_double_and_are_capped() {
        let now = DateTime::from_timestamp(0, 0).unwrap();
        let delays: Vec<i64> = (0..4)
            .map(|n| (retry_at(now, n) - now).num_seconds())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8]);
        assert_eq!((retry_at(now, 40) - now).num_seconds(), 3600);
    }
}
