//! JSON-RPC over HTTP for the Solana RPC client, with the limits every payrecon client keeps.
//!
//! The client crate's own sender reads an answer whole (`response.json()`), retries a 429 for
//! as long as the server's `Retry-After` says (up to two minutes), and names the URL, key and
//! all, in its errors. This one reads at most `max_answer_bytes`, follows `Retry-After` for at
//! most [`MAX_RETRY_AFTER`], connects and answers within the timeout, and says where it failed
//! only through [`SecretUrl`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use payrecon_chain_core::http::{build_client, client_builder, read_body};
use payrecon_chain_core::{ScanError, SecretUrl};
use solana_rpc_client::rpc_sender::{RpcSender, RpcTransportStats};
use solana_rpc_client_api::client_error::{Error as ClientError, ErrorKind, Result};
use solana_rpc_client_api::error_object::RpcErrorObject;
use solana_rpc_client_api::request::{RpcError, RpcRequest, RpcResponseErrorData};

/// The longest pause a server's `Retry-After` can ask of one request.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// The pause after a 429 that names none.
const RATE_LIMITED_PAUSE: Duration = Duration::from_millis(500);

/// Answers of 429 asked again before the request fails (and the watcher backs off).
const RATE_LIMITED_RETRIES: u32 = 5;

/// One node's JSON-RPC, for `RpcClient::new_sender`.
pub(crate) struct CappedSender {
    client: reqwest::Client,
    url: SecretUrl,
    max_answer_bytes: usize,
    request_id: AtomicU64,
}

impl CappedSender {
    /// A sender to `url` whose every request connects and is answered within `timeout`.
    pub(crate) fn new(
        url: SecretUrl,
        timeout: Duration,
        max_answer_bytes: usize,
    ) -> std::result::Result<CappedSender, ScanError> {
        let client = build_client(client_builder(timeout))?;
        Ok(CappedSender {
            client,
            url,
            max_answer_bytes,
            request_id: AtomicU64::new(1),
        })
    }

    /// A failure of the link or the server (retried by the watcher), its text free of the
    /// URL's credentials.
    fn failure(&self, what: &str) -> ClientError {
        ErrorKind::Custom(format!("{}: {}", self.url, self.url.scrub(what))).into()
    }
}

#[async_trait]
impl RpcSender for CappedSender {
    async fn send(
        &self,
        request: RpcRequest,
        params: serde_json::Value,
    ) -> Result<serde_json::Value> {
        let id = self.request_id.fetch_add(1, Ordering::Relaxed);
        let body = request.build_request_json(id, params).to_string();
        let mut rate_limited = 0;
        let response = loop {
            let response = self
                .client
                .post(self.url.expose())
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone())
                .send()
                .await
                .map_err(|e| self.failure(&e.without_url().to_string()))?;
            let status = response.status();
            if status == reqwest::StatusCode::TOO_MANY_REQUESTS
                && rate_limited < RATE_LIMITED_RETRIES
            {
                rate_limited += 1;
                let pause = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|value| value.to_str().ok())
                    .and_then(|value| value.trim().parse().ok())
                    .map_or(RATE_LIMITED_PAUSE, Duration::from_secs)
                    .min(MAX_RETRY_AFTER);
                tokio::time::sleep(pause).await;
                continue;
            }
            if !status.is_success() {
                return Err(self.failure(&format!("HTTP {status}")));
            }
            break response;
        };
        let body = read_body(response, self.max_answer_bytes)
            .await
            .map_err(|e| self.failure(&e.to_string()))?;
        let mut json: serde_json::Value = match serde_json::from_slice(&body) {
            Ok(json) => json,
            // Ended mid-document: cut short on the way, not a wrong answer.
            Err(error) if error.is_eof() => {
                return Err(self.failure(&format!("the answer was cut short: {error}")));
            }
            Err(error) => return Err(ErrorKind::SerdeJson(error).into()),
        };
        if !json.is_object() {
            return Err(RpcError::RpcRequestError(format!(
                "RPC response is not a JSON object: {}",
                payrecon_chain_core::excerpt(&json.to_string())
            ))
            .into());
        }
        if json["error"].is_object() {
            return Err(
                match serde_json::from_value::<RpcErrorObject>(json["error"].take()) {
                    Ok(error) => RpcError::RpcResponseError {
                        code: error.code,
                        message: error.message,
                        data: RpcResponseErrorData::Empty,
                    }
                    .into(),
                    Err(error) => ErrorKind::SerdeJson(error).into(),
                },
            );
        }
        Ok(json["result"].take())
    }

    fn get_transport_stats(&self) -> RpcTransportStats {
        RpcTransportStats::default()
    }

    fn url(&self) -> String {
        self.url.to_string()
    }
}
