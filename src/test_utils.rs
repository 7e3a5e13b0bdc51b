//! The workshop's view of the engine: what this crate's tests and `payrecon-bench` reach
//! that a shop never should. Compiled only with the `test-utils` feature, and hidden from the
//! documentation; nothing here is a stable API.

/// The store: the raw pool, transactions, every statement, and the bench's line.
pub mod store {
    pub use crate::store::*;
}
/// Clocks a test can set.
pub mod clock {
    pub use crate::clock::*;
}
/// Crash points, armed by an environment variable.
pub mod crash {
    pub use crate::crash::{CRASH_AT_ENV, CRASH_POINTS};
}
/// The matcher's paths and policies.
pub mod matcher {
    pub use crate::matcher::*;
}
/// Watchers and their options.
pub mod watcher {
    pub use crate::watcher::*;
}
/// The HTTP server's pieces.
pub mod api {
    pub use crate::api::*;
}
/// Network settings from the configuration.
pub mod networks {
    pub use crate::networks::*;
}
/// Payment settings.
pub mod payments {
    pub use crate::payments::*;
}
/// Rate sources.
pub mod rates {
    pub use crate::rates::*;
}
/// Webhook delivery.
pub mod webhooks {
    pub use crate::webhooks::*;
}
/// Intents.
pub mod intent {
    pub use crate::intent::*;
}
/// Orders.
pub mod order {
    pub use crate::order::*;
}
/// The stuck view.
pub mod stuck {
    pub use crate::stuck::*;
}
/// Operator actions.
pub mod operator {
    pub use crate::operator::*;
}
/// Reports.
pub mod report {
    pub use crate::report::*;
}
/// API tokens.
pub mod tokens {
    pub use crate::tokens::*;
}
/// Money.
pub mod money {
    pub use crate::money::*;
}
