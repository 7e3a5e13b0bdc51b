//! Webhooks for shops that are not in Rust. The outbox is the intent event stream itself:
//! every state change and exception is written in the transaction that made it. A dispatcher
//! copies new events into one delivery per endpoint; each endpoint has a delivery lane of its
//! own, so a receiver that hangs or fails delays nobody else. A lane posts its deliveries in
//! order per intent, signed with a timestamped HMAC-SHA256 (Stripe's scheme), retried with
//! backoff until that endpoint's retry window closes. Each event has a stable id
//! (`evt_<seq>`): receivers deduplicate on it, because a delivery whose answer was lost is sent
//! again.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use payrecon_chain_core::http::{client_builder, read_body};
use sha2::Sha256;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::config::WebhookConfig;
use crate::engine::Engine;
use crate::error::Error;
use crate::outbox::DISPATCH_BATCH;
use crate::shutdown::stopped;
use crate::store::operations::DueDelivery;

/// Pause between passes when nothing woke the dispatcher or a lane.
const IDLE_PAUSE: Duration = Duration::from_millis(500);
/// Most of a receiver's answer read (and thrown away, so the connection can be reused): only
/// the status counts.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// The header carrying `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
pub const SIGNATURE_HEADER: &str = "payrecon-signature";
/// The header carrying the event id.
pub const EVENT_ID_HEADER: &str = "payrecon-event-id";
/// How old a signature a receiver should accept by default: deliveries are signed as they
/// are sent, so anything older is a replay of a captured one.
pub const SIGNATURE_TOLERANCE: Duration = Duration::from_secs(300);

/// `t=<timestamp>,v1=<hex>`: the HMAC-SHA256 under `secret` of `"<timestamp>.<body>"`. The
/// timestamp is inside what is signed, so a receiver that refuses old timestamps refuses a
/// captured delivery replayed later.
pub fn signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mac = signed_payload(secret, timestamp, body).finalize();
    format!("t={timestamp},v1={}", hex::encode(mac.into_bytes()))
}

/// The HMAC of `"<timestamp>.<body>"` under `secret`, before it is finished.
fn signed_payload(secret: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC accepts any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// Why a receiver refuses a delivery.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The header is not `t=<unix>,v1=<hex>`.
    #[error("the signature header is not t=<unix>,v1=<hex>")]
    Malformed,
    /// No `v1` in it matches the body under the secret.
    #[error("the signature does not match the body")]
    Mismatch,
    /// Signed longer ago (or further ahead) than the tolerance.
    #[error("the signature is {age_seconds} s from now, outside the tolerance")]
    OutsideTolerance {
        /// Now minus the signed timestamp.
        age_seconds: i64,
    },
}

/// What a receiver written in Rust checks: the header's `v1` matches `"<t>.<body>"` under
/// `secret` (in constant time), and `t` is within `tolerance` of `now_unix`.
pub fn verify_signature(
    secret: &str,
    header: &str,
    body: &[u8],
    now_unix: i64,
    tolerance: Duration,
) -> Result<(), SignatureError> {
    let mut timestamp = None;
    let mut candidates = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => {
                timestamp = Some(
                    value
                        .parse::<i64>()
                        .map_err(|_| SignatureError::Malformed)?,
                )
            }
            Some(("v1", value)) => candidates.push(value),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
    if candidates.is_empty() {
        return Err(SignatureError::Malformed);
    }
    let matches = candidates.iter().any(|candidate| {
        hex::decode(candidate).is_ok_and(|given| {
            signed_payload(secret, timestamp, body)
                .verify_slice(&given)
                .is_ok()
        })
    });
    if !matches {
        return Err(SignatureError::Mismatch);
    }
    let age_seconds = now_unix.saturating_sub(timestamp);
    let tolerance = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    if age_seconds.abs() > tolerance {
        return Err(SignatureError::OutsideTolerance { age_seconds });
    }
    Ok(())
}

/// The body of one event's delivery. Built from the stored event alone, so every attempt
/// sends the same bytes.
pub fn event_body(
    delivery_seq: i64,
    kind: &str,
    at_ms: i64,
    intent: Option<&str>,
    order: Option<&str>,
    detail: &str,
) -> String {
    let detail: serde_json::Value = serde_json::from_str(detail).unwrap_or(serde_json::Value::Null);
    serde_json::json!({
        "id": format!("evt_{delivery_seq}"),
        "type": kind,
        "created_at": DateTime::from_timestamp_millis(at_ms).map(|at| at.to_rfc3339()),
        "intent_id": intent,
        "order_ref": order,
        "data": detail,
    })
    .to_string()
}

/// Sends the outbox to the configured endpoints until `shutdown`.
pub struct WebhookSender {
    engine: Engine,
    lanes: Vec<Arc<Lane>>,
}

/// One endpoint's deliveries, sent by a task of their own.
struct Lane {
    engine: Engine,
    endpoint: WebhookConfig,
    client: reqwest::Client,
}

impl WebhookSender {
    /// A sender for `endpoints`; refuses endpoints that could not work.
    pub fn new(engine: Engine, endpoints: Vec<WebhookConfig>) -> Result<WebhookSender, Error> {
        let mut names = std::collections::BTreeSet::new();
        let mut lanes = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let refuse = |what: &str| Error::Config(format!("webhook {}: {what}", endpoint.name));
            if !names.insert(endpoint.name.clone()) {
                return Err(refuse("is configured twice"));
            }
            if endpoint.secret.expose().len() < 16 {
                return Err(refuse("the secret must be at least 16 characters"));
            }
            if !matches!(endpoint.url.scheme().as_str(), "https" | "http") {
                return Err(refuse("url must be http(s)"));
            }
            if endpoint.timeout_ms == 0 || endpoint.retry_hours == 0 {
                return Err(refuse("timeout_ms and retry_hours must be above zero"));
            }
            let timeout = Duration::from_millis(u64::from(endpoint.timeout_ms));
            // A redirect is a failure, never followed: a 307/308 would have the signed body
            // sent wherever the receiver (or whoever took it over) points.
            let client = client_builder(timeout)
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!("payrecon-webhooks/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(|e| refuse(&format!("HTTP client: {}", e.without_url())))?;
            lanes.push(Arc::new(Lane {
                engine: engine.clone(),
                endpoint,
                client,
            }));
        }
        Ok(WebhookSender { engine, lanes })
    }

    /// Dispatches and sends until `shutdown` turns true: one task copies the outbox into
    /// deliveries, one per endpoint sends them.
    pub async fn run(self, shutdown: watch::Receiver<bool>) -> Result<(), Error> {
        let dispatched = Arc::new(Notify::new());
        let mut tasks = JoinSet::new();
        for lane in &self.lanes {
            tasks.spawn(lane.clone().run(dispatched.clone(), shutdown.clone()));
        }
        let mut wake = self.engine.subscribe();
        let mut shutdown = shutdown;
        loop {
            if *shutdown.borrow() {
                break;
            }
            match self.dispatch().await {
                Ok(0) => {}
                Ok(_) => dispatched.notify_waiters(),
                Err(error) => tracing::warn!(%error, "webhook dispatch failed; retrying"),
            }
            tokio::select! {
                _ = tokio::time::sleep(IDLE_PAUSE) => {}
                _ = wake.recv() => {}
                _ = shutdown.changed() => {}
            }
        }
        while tasks.join_next().await.is_some() {}
        Ok(())
    }

    /// One pass: copy new events into deliveries, then let every lane send what is due, side
    /// by side.
    #[cfg(feature = "test-utils")]
    pub async fn pass(&self) -> Result<(), Error> {
        self.dispatch().await?;
        let mut sends = JoinSet::new();
        for lane in &self.lanes {
            let lane = lane.clone();
            sends.spawn(async move { lane.drain().await });
        }
        let mut outcome = Ok(());
        while let Some(joined) = sends.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(error)) => outcome = Err(error),
                Err(panic) => std::panic::resume_unwind(panic.into_panic()),
            }
        }
        outcome
    }

    /// Copies every undispatched event into deliveries; returns how many events.
    async fn dispatch(&self) -> Result<usize, Error> {
        let windows: Vec<(String, chrono::Duration)> = self
            .lanes
            .iter()
            .map(|lane| {
                let hours = i64::from(lane.endpoint.retry_hours);
                (lane.endpoint.name.clone(), chrono::Duration::hours(hours))
            })
            .collect();
        let mut total = 0;
        loop {
            let dispatched = self.engine.dispatch_outbox(&windows).await?;
            total += dispatched;
            if dispatched < DISPATCH_BATCH as usize {
                return Ok(total);
            }
        }
    }
}

impl Lane {
    /// Sends this endpoint's due deliveries whenever there are any, until `shutdown`.
    async fn run(
        self: Arc<Lane>,
        dispatched: Arc<Notify>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), Error> {
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            // Registered before the pass, so a dispatch during it is not missed.
            let notified = dispatched.notified();
            // At shutdown a delivery in flight is dropped: it stays pending and goes out again
            // at the next start (receivers deduplicate), rather than hold the process for its
            // endpoint's timeout.
            let drained = tokio::select! {
                drained = self.drain() => drained,
                () = stopped(&mut shutdown) => return Ok(()),
            };
            if let Err(error) = drained {
                tracing::warn!(endpoint = %self.endpoint.name, %error, "webhook lane failed; retrying");
            }
            tokio::select! {
                _ = tokio::time::sleep(IDLE_PAUSE) => {}
                _ = notified => {}
                _ = shutdown.changed() => {}
            }
        }
    }

    /// Sends what is due now, oldest first, until nothing is.
    async fn drain(&self) -> Result<(), Error> {
        loop {
            let due = self.engine.due_deliveries(&self.endpoint.name).await?;
            if due.is_empty() {
                return Ok(());
            }
            for delivery in due {
                self.send(delivery).await?;
            }
        }
    }

    async fn send(&self, delivery: DueDelivery) -> Result<(), Error> {
        let endpoint = &self.endpoint;
        let body = event_body(
            delivery.event_seq,
            &delivery.kind,
            delivery.at_ms,
            delivery.intent_id.as_deref(),
            delivery.order_ref.as_deref(),
            &delivery.detail,
        );
        // Signed when sent, not when the event happened: a retry an hour later carries a
        // fresh timestamp, and the receiver's tolerance still refuses a captured replay.
        let signed_at = Utc::now().timestamp();
        let outcome = self
            .client
            .post(endpoint.url.expose())
            .header("content-type", "application/json")
            .header(EVENT_ID_HEADER, format!("evt_{}", delivery.event_seq))
            .header(
                SIGNATURE_HEADER,
                signature(endpoint.secret.expose(), signed_at, body.as_bytes()),
            )
            .body(body)
            .send()
            .await;
        let error = match outcome {
            Ok(response) if response.status().is_success() => {
                // Read (at most the cap) and thrown away, so the connection can serve the next
                // delivery; a longer answer closes it instead. Only the status counts.
                let _ = read_body(response, MAX_ANSWER_BYTES).await;
                None
            }
            Ok(response) if response.status().is_redirection() => Some(format!(
                "answered {} (a redirect: not followed, the receiver must answer at its configured url)",
                response.status()
            )),
            Ok(response) => Some(format!("answered {}", response.status())),
            Err(error) if error.is_timeout() => Some(format!(
                "no answer within timeout_ms = {}",
                endpoint.timeout_ms
            )),
            Err(error) if error.is_connect() => Some("cannot connect".to_owned()),
            Err(error) => Some(
                payrecon_chain_core::excerpt(&endpoint.url.scrub(&error.without_url().to_string()))
                    .into_owned(),
            ),
        };
        let now = self.engine.clock().now();
        match &error {
            None => {
                tracing::debug!(endpoint = %endpoint.name, seq = delivery.event_seq, "webhook delivered")
            }
            Some(error) => {
                tracing::info!(endpoint = %endpoint.name, seq = delivery.event_seq, %error, "webhook delivery failed; will retry")
            }
        }
        self.engine
            .finish_delivery(&endpoint.name, &delivery, error.as_deref(), now)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hmac_sha256_over_the_timestamp_and_the_body() {
        // RFC 4231 test case 2, with the message written as "<t>.<body>".
        let header = signature("Jefe", 0, b"what do ya want for nothing?");
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"0.what do ya want for nothing?");
        let expected = hex::encode(mac.finalize().into_bytes());
        assert_eq!(header, format!("t=0,v1={expected}"));
    }

    #[test]
    fn verification_refuses_another_body_another_secret_and_old_timestamps() {
        let secret = "a-very-secret-webhook-key";
        let body = br#"{"id":"evt_1"}"#;
        let header = signature(secret, 1_000_000, body);
        let tolerance = SIGNATURE_TOLERANCE;
        assert_eq!(
            verify_signature(secret, &header, body, 1_000_100, tolerance),
            Ok(())
        );
        assert_eq!(
            verify_signature(secret, &header, b"{}", 1_000_100, tolerance),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_signature(
                "another-secret-entirely",
                &header,
                body,
                1_000_100,
                tolerance
            ),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_signature(secret, &header, body, 1_000_301, tolerance),
            Err(SignatureError::OutsideTolerance { age_seconds: 301 })
        );
        for malformed in ["", "v1=00", "t=x,v1=00", "t=1"] {
            assert_eq!(
                verify_signature(secret, malformed, body, 1, tolerance),
                Err(SignatureError::Malformed),
                "{malformed}"
            );
        }
    }
}
