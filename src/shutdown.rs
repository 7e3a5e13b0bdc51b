//! The one shutdown signal every long-running part of `serve` watches.

use tokio::sync::watch;

/// Until `switch` turns true (or its sender is gone).
pub(crate) async fn stopped(switch: &mut watch::Receiver<bool>) {
    let _ = switch.wait_for(|on| *on).await;
}
