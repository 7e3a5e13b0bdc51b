//! Webhooks for shops that are not in Rust. The outbox is the intent event stream itself:
//! every state change and exception is written in the transaction that made it. A dispatcher
//! copies new events into one delivery per endpoint; a sender posts them, in order per
//! intent, signed with HMAC-SHA256 over the body, retried with backoff until the endpoint's
//! retry window closes. Each event has a stable id (`evt_<seq>`): receivers deduplicate on it,
//! because a delivery whose answer was lost is sent again.

use std::time::Duration;

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::sync::watch;

use crate::config::WebhookConfig;
use crate::engine::Engine;
use crate::error::Error;
use crate::store::operations::{self, DueDelivery};

/// Events copied into deliveries per transaction.
const DISPATCH_BATCH: i64 = 500;
/// Deliveries sent per endpoint per pass.
const SEND_BATCH: i64 = 100;
/// First retry delay; doubled per failed attempt up to [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: chrono::Duration = chrono::Duration::seconds(1);
const MAX_RETRY_DELAY: chrono::Duration = chrono::Duration::hours(1);
/// Pause between passes when nothing woke the sender.
const IDLE_PAUSE: Duration = Duration::from_millis(500);

/// The header carrying `sha256=<hex HMAC of the body>`.
pub const SIGNATURE_HEADER: &str = "payrecon-signature";
/// The header carrying the event id.
pub const EVENT_ID_HEADER: &str = "payrecon-event-id";

/// `sha256=<hex>` of `body` under `secret`: what receivers recompute and compare.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC accepts any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
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
    endpoints: Vec<WebhookConfig>,
    client: reqwest::Client,
}

impl WebhookSender {
    /// A sender for `endpoints`; refuses endpoints that could not work.
    pub fn new(engine: Engine, endpoints: Vec<WebhookConfig>) -> Result<WebhookSender, Error> {
        let mut names = std::collections::BTreeSet::new();
        for endpoint in &endpoints {
            if !names.insert(endpoint.name.as_str()) {
                return Err(Error::Config(format!(
                    "webhook {} is configured twice",
                    endpoint.name
                )));
            }
            if endpoint.secret.len() < 16 {
                return Err(Error::Config(format!(
                    "webhook {}: the secret must be at least 16 characters",
                    endpoint.name
                )));
            }
            if !(endpoint.url.starts_with("https://") || endpoint.url.starts_with("http://")) {
                return Err(Error::Config(format!(
                    "webhook {}: url must be http(s)",
                    endpoint.name
                )));
            }
        }
        let client = reqwest::Client::builder()
            .build()
            .map_err(|e| Error::Config(format!("webhook client: {e}")))?;
        Ok(WebhookSender {
            engine,
            endpoints,
            client,
        })
    }

    /// Dispatches and sends until `shutdown` turns true.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) -> Result<(), Error> {
        let mut wake = self.engine.subscribe();
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            if let Err(error) = self.pass().await {
                tracing::warn!(%error, "webhook pass failed; retrying");
            }
            tokio::select! {
                _ = tokio::time::sleep(IDLE_PAUSE) => {}
                _ = wake.recv() => {}
                _ = shutdown.changed() => {}
            }
        }
    }

    /// One pass: copy new events into deliveries, then send what is due.
    pub async fn pass(&self) -> Result<(), Error> {
        while self.engine.dispatch_outbox(&self.endpoints).await? == DISPATCH_BATCH as usize {}
        for endpoint in &self.endpoints {
            loop {
                let due = self.engine.due_deliveries(&endpoint.name).await?;
                if due.is_empty() {
                    break;
                }
                for delivery in due {
                    self.send(endpoint, delivery).await?;
                }
            }
        }
        Ok(())
    }

    async fn send(&self, endpoint: &WebhookConfig, delivery: DueDelivery) -> Result<(), Error> {
        let body = event_body(
            delivery.event_seq,
            &delivery.kind,
            delivery.at_ms,
            delivery.intent_id.as_deref(),
            delivery.order_ref.as_deref(),
            &delivery.detail,
        );
        let outcome = self
            .client
            .post(&endpoint.url)
            .header("content-type", "application/json")
            .header(EVENT_ID_HEADER, format!("evt_{}", delivery.event_seq))
            .header(
                SIGNATURE_HEADER,
                signature(&endpoint.secret, body.as_bytes()),
            )
            .body(body)
            .send()
            .await;
        let error = match outcome {
            Ok(response) if response.status().is_success() => None,
            Ok(response) => Some(format!("answered {}", response.status())),
            Err(error) if error.is_timeout() => Some("timed out".to_owned()),
            Err(error) => Some(format!("unreachable: {error}")),
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

/// When to try again after `attempts` failed attempts.
fn retry_at(now: DateTime<Utc>, attempts: i64) -> DateTime<Utc> {
    let doublings = attempts.clamp(0, 20) as i32;
    let delay = FIRST_RETRY_DELAY
        .checked_mul(2i32.saturating_pow(doublings as u32))
        .unwrap_or(MAX_RETRY_DELAY)
        .min(MAX_RETRY_DELAY);
    now + delay
}

impl Engine {
    /// Copies undispatched outbox events into each endpoint's deliveries. Returns how many
    /// events were dispatched.
    pub(crate) async fn dispatch_outbox(
        &self,
        endpoints: &[WebhookConfig],
    ) -> Result<usize, Error> {
        let names: Vec<String> = endpoints.iter().map(|e| e.name.clone()).collect();
        let retry_window = endpoints.iter().map(|e| e.retry_hours).max().unwrap_or(72);
        let now = self.clock().now();
        let mut tx = self.store().begin_write().await?;
        let dispatched = operations::dispatch_events(
            tx.conn(),
            &names,
            DISPATCH_BATCH,
            now,
            chrono::Duration::hours(i64::from(retry_window)),
        )
        .await?;
        tx.commit().await?;
        Ok(dispatched)
    }

    async fn due_deliveries(&self, endpoint: &str) -> Result<Vec<DueDelivery>, Error> {
        let mut conn = self.store().pool().acquire().await?;
        let now = self.clock().now();
        Ok(operations::due_deliveries(&mut conn, endpoint, now, SEND_BATCH).await?)
    }

    async fn finish_delivery(
        &self,
        endpoint: &str,
        delivery: &DueDelivery,
        error: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<(), Error> {
        let (state, next) = match error {
            None => ("delivered", now),
            Some(_) if now.timestamp_millis() >= delivery.give_up_at_ms => ("abandoned", now),
            Some(_) => ("pending", retry_at(now, delivery.attempts)),
        };
        let mut tx = self.store().begin_write().await?;
        operations::finish_delivery(
            tx.conn(),
            endpoint,
            delivery.event_seq,
            state,
            next.timestamp_millis(),
            error,
            now,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Queues an endpoint's deliveries from event `from_seq` on again, delivered or not (an
    /// operator's replay; receivers deduplicate by event id). Returns how many.
    pub async fn replay_webhooks(
        &self,
        endpoint: &str,
        from_seq: i64,
        retry_hours: u32,
    ) -> Result<u64, Error> {
        let now = self.clock().now();
        let mut tx = self.store().begin_write().await?;
        let queued = operations::replay_deliveries(
            tx.conn(),
            endpoint,
            from_seq,
            now,
            chrono::Duration::hours(i64::from(retry_hours)),
        )
        .await?;
        tx.commit().await?;
        self.notify_events();
        Ok(queued)
    }

    /// Deliveries per endpoint and state.
    pub async fn webhook_counts(&self) -> Result<Vec<(String, String, i64)>, Error> {
        let mut conn = self.store().pool().acquire().await?;
        Ok(operations::delivery_counts(&mut conn).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hmac_sha256_hex() {
        // RFC 4231 test case 2.
        assert_eq!(
            signature("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

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
