//! Crash points: named places inside event handling where the process can be made to die,
//! to prove that a crash anywhere loses and doubles nothing. `PAYRECON_CRASH_AT=<point>` (or
//! `<point>:<n>`, the n-th time it is reached) aborts the process there, as a SIGKILL would
//! stop it: no unwinding, no destructors, the open transaction never committed. Unset (always,
//! outside tests) a crash point is one relaxed check of a value read once. Only a build with the
//! `test-utils` feature has them; in any other a crash point is nothing at all.

#[cfg(feature = "test-utils")]
use std::sync::OnceLock;
#[cfg(feature = "test-utils")]
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable that arms a crash point.
#[cfg(feature = "test-utils")]
pub const CRASH_AT_ENV: &str = "PAYRECON_CRASH_AT";

/// Every crash point: those an event passes, in order, then the one of a new intent's index.
#[cfg(feature = "test-utils")]
pub const CRASH_POINTS: [&str; 6] = [
    "watcher.after_scan",
    "apply.after_event",
    "ledger.before_postings",
    "apply.before_commit",
    "apply.after_commit",
    "indexes.after_block",
];

#[cfg(feature = "test-utils")]
struct Armed {
    point: String,
    nth: u64,
    hits: AtomicU64,
}

#[cfg(feature = "test-utils")]
fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let value = std::env::var(CRASH_AT_ENV).ok()?;
            let (point, nth) = match value.split_once(':') {
                Some((point, nth)) => (point.to_owned(), nth.parse().ok()?),
                None => (value, 1),
            };
            Some(Armed {
                point,
                nth,
                hits: AtomicU64::new(0),
            })
        })
        .as_ref()
}

/// Aborts the process if `point` is the armed crash point and this is the armed hit.
#[cfg(feature = "test-utils")]
pub(crate) fn crash_point(point: &str) {
    if let Some(armed) = armed()
        && armed.point == point
        && armed.hits.fetch_add(1, Ordering::Relaxed) + 1 == armed.nth
    {
        eprintln!("crash point {point} reached: aborting");
        std::process::abort();
    }
}

/// Without `test-utils` no crash point can be armed.
#[cfg(not(feature = "test-utils"))]
#[inline(always)]
pub(crate) fn crash_point(_point: &str) {}
