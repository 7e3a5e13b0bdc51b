//! JSON-RPC over HTTP with the limits every payrecon client keeps, as an alloy transport.
//!
//! alloy's own HTTP transport reads an answer whole, has no timeout unless its client has one,
//! and names the URL in its errors and spans (where a provider's key sits in the path or
//! query). This one connects and answers within the configured timeout, reads at most
//! `max_answer_bytes`, caps a server's `Retry-After`, and says where it failed only through
//! [`SecretUrl`].

use std::task;
use std::time::Duration;

use alloy::rpc::json_rpc::{RequestPacket, ResponsePacket};
use alloy::transports::{TransportError, TransportErrorKind, TransportFut, TransportResult};
use payrecon_chain_core::http::{build_client, client_builder, read_body};
use payrecon_chain_core::{ScanError, SecretUrl};

/// The longest pause a server's `Retry-After` can ask of one request: a longer one would hold
/// the watcher's round past its deadline; the watcher's own backoff takes over instead.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// Characters of an error answer kept in the error.
const EXCERPT_CHARS: usize = 200;

/// One node's JSON-RPC over HTTP(S).
#[derive(Clone)]
pub(crate) struct CappedHttp {
    client: reqwest::Client,
    url: SecretUrl,
    max_answer_bytes: usize,
}

impl CappedHttp {
    /// A transport to `url` whose every request connects and is answered within `timeout`.
    pub(crate) fn new(
        url: SecretUrl,
        timeout: Duration,
        max_answer_bytes: usize,
    ) -> Result<CappedHttp, ScanError> {
        let client = build_client(client_builder(timeout))?;
        Ok(CappedHttp {
            client,
            url,
            max_answer_bytes,
        })
    }

    async fn request(self, packet: RequestPacket) -> TransportResult<ResponsePacket> {
        let body = serde_json::to_vec(&packet).map_err(TransportError::ser_err)?;
        let response = self
            .client
            .post(self.url.expose())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .headers(packet.headers())
            .body(body)
            .send()
            .await
            .map_err(|e| self.failure(&e.without_url().to_string()))?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse().ok())
            .map(|seconds| Duration::from_secs(seconds).min(MAX_RETRY_AFTER));
        let body = read_body(response, self.max_answer_bytes)
            .await
            .map_err(|e| self.failure(&e.to_string()))?;
        if !status.is_success() {
            // A JSON-RPC error sent with an HTTP error status is the node's answer.
            if let Ok(answer) = serde_json::from_slice::<ResponsePacket>(&body)
                && answer.is_error()
            {
                return Ok(answer);
            }
            let excerpt: String = String::from_utf8_lossy(&body)
                .chars()
                .take(EXCERPT_CHARS)
                .collect();
            return Err(TransportErrorKind::http_error_with_retry_after(
                status.as_u16(),
                excerpt,
                retry_after,
            ));
        }
        serde_json::from_slice(&body).map_err(|err| {
            let excerpt: String = String::from_utf8_lossy(&body)
                .chars()
                .take(EXCERPT_CHARS)
                .collect();
            TransportError::deser_err(err, excerpt)
        })
    }

    /// A transport failure, its text free of the URL's credentials.
    fn failure(&self, what: &str) -> TransportError {
        TransportErrorKind::custom_str(&format!("{}: {}", self.url, self.url.scrub(what)))
    }
}

impl tower::Service<RequestPacket> for CappedHttp {
    type Response = ResponsePacket;
    type Error = TransportError;
    type Future = TransportFut<'static>;

    fn poll_ready(&mut self, _cx: &mut task::Context<'_>) -> task::Poll<Result<(), Self::Error>> {
        task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, packet: RequestPacket) -> Self::Future {
        Box::pin(self.clone().request(packet))
    }
}
