//! `payrecon serve`: the library's `serve` until a signal, with a deadline on the way out.

use std::time::Duration;

use payrecon::{Config, Engine};

/// Serves until Ctrl-C or SIGTERM, then gives the process `serve.shutdown_seconds` to drain.
pub(super) async fn serve(engine: Engine, config: &Config) -> anyhow::Result<()> {
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let deadline = Duration::from_secs(u64::from(config.serve.shutdown_seconds));
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::warn!(
            ?deadline,
            "shutting down: finishing requests, live statuses and the watchers' rounds (a second signal exits at once)"
        );
        let _ = stop.send(true);
        // Whatever is still running then is cut off: every commit is atomic, so what
        // was not committed is done again by the next start.
        tokio::select! {
            () = wait_for_signal() => tracing::warn!("second signal: exiting now"),
            () = tokio::time::sleep(deadline + SHUTDOWN_MARGIN) => {
                tracing::error!(?deadline, "shutdown deadline passed: exiting now");
            }
        }
        std::process::exit(1);
    });
    payrecon::serve(engine, config, shutdown).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Past the shutdown deadline, what the process gives its draining server to close its own
/// connections before it exits regardless.
const SHUTDOWN_MARGIN: Duration = Duration::from_secs(1);

/// Ctrl-C, or SIGTERM where there is one.
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
