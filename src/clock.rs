//! Time as the engine sees it: the system clock in production, a hand-moved one in tests,
//! so that deadlines and timestamps are testable without sleeping.

#[cfg(feature = "test-utils")]
use std::sync::Mutex;

use chrono::{DateTime, Utc};

/// A source of "now".
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;
}

/// The machine's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told; for tests and simulations.
#[cfg(feature = "test-utils")]
#[derive(Debug)]
pub struct ManualClock(Mutex<DateTime<Utc>>);

#[cfg(feature = "test-utils")]
impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: DateTime<Utc>) -> ManualClock {
        ManualClock(Mutex::new(start))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: chrono::Duration) {
        let mut now = self.0.lock().expect("clock lock");
        *now += by;
    }

    /// Sets the clock to `at`, backwards too: a process whose clock lags another's.
    pub fn set(&self, at: DateTime<Utc>) {
        *self.0.lock().expect("clock lock") = at;
    }
}

#[cfg(feature = "test-utils")]
impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().expect("clock lock")
    }
}
