//! The HTTP server under the API: hyper's HTTP/1 connection with the limits a public server
//! needs, which `axum::serve` does not set (it has no header-read timeout and no connection
//! cap), and a shutdown with a deadline.
//!
//! - A client gets `header_read_timeout` to send each request's headers, and an idle kept-alive
//!   connection is closed after it (hyper's timer); a slow-headers client holds nothing longer.
//! - At most `max_connections` connections are served at once; more wait in the listen backlog.
//! - Every request carries the client's address ([`ConnectInfo`]), for per-client limits.
//! - On shutdown the listener closes, every connection is asked to finish its request in
//!   flight and close, and whatever is still open when `drain` has passed is dropped.

use crate::shutdown::stopped;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tower::ServiceExt as _;

/// What the server admits.
#[derive(Clone, Copy, Debug)]
pub struct ServerLimits {
    /// Time to send a request's headers, and the most a connection idles between requests.
    pub header_read_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// How long open connections get to finish after shutdown is asked.
    pub drain: Duration,
}

/// Serves `app` on `listener` until `shutdown` turns true, then drains within the deadline.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServerLimits,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut connections = JoinSet::new();
    let (closing, closed) = watch::channel(false);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = stopped(&mut shutdown) => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, or a connection reset before it was accepted:
                    // the listener itself is fine; pause so a full fd table can drain.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stopped(&mut shutdown) => break,
        };
        // Reap finished connections as we go, so the set holds only open ones.
        while connections.try_join_next().is_some() {}
        let app = app.clone();
        let mut closed = closed.clone();
        connections.spawn(async move {
            let _permit = permit;
            let service = TowerToHyperService::new(app.map_request(
                move |mut request: axum::http::Request<Incoming>| {
                    request.extensions_mut().insert(ConnectInfo(peer));
                    request.map(Body::new)
                },
            ));
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                served = connection.as_mut() => {
                    if let Err(error) = served {
                        tracing::debug!(%peer, %error, "connection ended with an error");
                    }
                    return;
                }
                () = stopped(&mut closed) => connection.as_mut().graceful_shutdown(),
            }
            if let Err(error) = connection.await {
                tracing::debug!(%peer, %error, "connection ended with an error while draining");
            }
        });
    }
    drop(listener);
    let open = connections.len();
    if open > 0 {
        tracing::info!(open, drain = ?limits.drain, "closing HTTP connections");
    }
    let _ = closing.send(true);
    let drained = tokio::time::timeout(limits.drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            left = connections.len(),
            "HTTP connections still open at the shutdown deadline: dropped"
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// A request's client address, as the server recorded it.
pub(super) fn client_of(request: &axum::http::request::Parts) -> Option<SocketAddr> {
    request
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(address)| *address)
}
