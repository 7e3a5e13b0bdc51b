//! The customer's routes: the checkout page, its live status and its "I have paid". Public and
//! without a token: the page's key is the only credential, so every answer is marked never
//! to be cached, framed or leaked in a `Referer`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use fluent_templates::LanguageIdentifier;
use serde::Deserialize;

use super::live::{Refused, Subscription};
use super::{ApiError, ApiState, ClientAddress};
use crate::checkout::page::{self, CONTENT_SECURITY_POLICY};
use crate::checkout::{Checkout, CheckoutStatus};
use crate::engine::Engine;
use crate::error::Error;

/// `?lang=`; anything else in the query is ignored, and a query that does not parse counts as
/// none.
#[derive(Deserialize)]
pub(super) struct PageQuery {
    lang: Option<String>,
}

/// What every customer route reads from its request: the page's key and the customer's
/// language. A path that does not parse reads as an empty key, which no page has.
pub(super) struct PageRequest {
    key: String,
    language: LanguageIdentifier,
}

impl<S: Send + Sync> FromRequestParts<S> for PageRequest {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let key = Path::<String>::from_request_parts(parts, state)
            .await
            .map_or_else(|_| String::new(), |Path(key)| key);
        let query = Query::<PageQuery>::from_request_parts(parts, state).await;
        let language = page::choose_language(
            query.as_ref().ok().and_then(|q| q.lang.as_deref()),
            parts
                .headers
                .get(header::ACCEPT_LANGUAGE)
                .and_then(|value| value.to_str().ok()),
        );
        Ok(PageRequest { key, language })
    }
}

/// An HTML answer with the page's headers.
fn html(status: StatusCode, language: &LanguageIdentifier, body: String) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    if let Ok(language) = HeaderValue::from_str(&language.to_string()) {
        headers.insert(header::CONTENT_LANGUAGE, language);
    }
    protect(headers);
    response
}

/// The headers every customer answer carries.
fn protect(headers: &mut HeaderMap) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// When a refused live status may try again.
const STREAM_RETRY_AFTER_SECONDS: u64 = 30;

/// A refusal that says, in `Retry-After`, when to ask again.
fn retry_later(refusal: ApiError, seconds: u64) -> Response {
    let mut response = refusal.into_response();
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    protect(headers);
    response
}

/// A link that names no payment (or is not a key at all) gets the same page: nothing tells a
/// prober which keys exist.
fn unknown_or_failed(error: Error, language: &LanguageIdentifier) -> Response {
    match error {
        Error::InvalidInput(_) | Error::IntentNotFound(_) => {
            html(StatusCode::NOT_FOUND, language, page::not_found(language))
        }
        other => ApiError::from(other).into_response(),
    }
}

/// `GET /pay/{key}`: the checkout page.
pub(super) async fn checkout_page(
    State(state): State<ApiState>,
    PageRequest { key, language }: PageRequest,
) -> Response {
    match state.engine.checkout(&key).await {
        Ok(checkout) => {
            let now = state.engine.clock().now();
            html(
                StatusCode::OK,
                &language,
                page::render(&checkout, &key, &language, now, None),
            )
        }
        Err(error) => unknown_or_failed(error, &language),
    }
}

/// `POST /pay/{key}/paid`: "I have paid", then back to the page (a plain form post, so it
/// works without JavaScript). Said again within `paid_interval` for the same key, it is
/// refused with 429 before the database is asked.
pub(super) async fn checkout_paid(
    State(state): State<ApiState>,
    PageRequest { key, language }: PageRequest,
) -> Response {
    if !state.paid_limiter.admit(&key) {
        let refusal = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_requests",
            "\"I have paid\" was just sent for this page",
        );
        return retry_later(refusal, state.paid_limiter.interval.as_secs().max(1));
    }
    match state.engine.checkout_mark_paid(&key).await {
        Ok(()) => {
            let mut response = Redirect::to(&format!("/pay/{key}?lang={language}")).into_response();
            protect(response.headers_mut());
            response
        }
        Err(error) => unknown_or_failed(error, &language),
    }
}

/// The refund form's one field.
#[derive(Deserialize)]
pub(super) struct RefundForm {
    address: String,
}

/// `POST /pay/{key}/refund`: the customer's address for the money of this payment waiting to
/// be refunded, then back to the page, which shows the refund asked for; an address that
/// cannot receive it is refused on the page itself (422), saying why, with nothing recorded.
pub(super) async fn checkout_refund(
    State(state): State<ApiState>,
    PageRequest { key, language }: PageRequest,
    axum::Form(form): axum::Form<RefundForm>,
) -> Response {
    match state
        .engine
        .checkout_request_refund(&key, &form.address)
        .await
    {
        Ok(_) => {
            let mut response = Redirect::to(&format!("/pay/{key}?lang={language}")).into_response();
            protect(response.headers_mut());
            response
        }
        Err(Error::InvalidInput(why)) => match state.engine.checkout(&key).await {
            Ok(checkout) => {
                let now = state.engine.clock().now();
                let page = page::render(&checkout, &key, &language, now, Some(&why));
                html(StatusCode::UNPROCESSABLE_ENTITY, &language, page)
            }
            Err(error) => unknown_or_failed(error, &language),
        },
        Err(error) => unknown_or_failed(error, &language),
    }
}

/// `GET /pay/{key}/events`: the live status as server-sent events, one `status` event at
/// once and one more each time what the customer reads changes. It ends after the final
/// status, after the stream's lifetime, and at shutdown; past the stream caps it is refused
/// at once (503 in all, 429 for one client), and the page keeps its countdown and says to
/// reload.
pub(super) async fn checkout_events(
    State(state): State<ApiState>,
    ClientAddress(client): ClientAddress,
    PageRequest { key, language }: PageRequest,
) -> Response {
    let first = match state.engine.checkout(&key).await {
        Ok(checkout) => checkout,
        Err(error) => return unknown_or_failed(error, &language),
    };
    let hub = &state.live;
    let subscription = match hub.open(&first.instructions.intent.id, client) {
        Ok(subscription) => subscription,
        Err(refused) => {
            let (status, message) = match refused {
                Refused::Full => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too many live statuses are open",
                ),
                Refused::ClientFull => (
                    StatusCode::TOO_MANY_REQUESTS,
                    "too many live statuses are open from this address",
                ),
            };
            let refusal = ApiError::new(status, "streams_exhausted", message);
            return retry_later(refusal, STREAM_RETRY_AFTER_SECONDS);
        }
    };
    let now = tokio::time::Instant::now();
    let deadline = (first.instructions.intent.deadline - state.engine.clock().now())
        .to_std()
        .ok()
        .map(|left| now + left);
    let live = LiveStatus {
        subscription,
        shutdown: hub.shutdown(),
        ends_at: now + hub.limits().lifetime,
        deadline,
        engine: state.engine,
        key,
        language,
        pending: Some(first),
        shown: None,
        finished: false,
    };
    let stream = futures_util::stream::unfold(live, |mut live| async move {
        let event = live.next_change().await?;
        Some((Ok::<_, Infallible>(event), live))
    });
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response();
    protect(response.headers_mut());
    response
}

/// One page's live status.
struct LiveStatus {
    engine: Engine,
    subscription: Subscription,
    shutdown: tokio::sync::watch::Receiver<bool>,
    /// The stream's lifetime ends here.
    ends_at: tokio::time::Instant,
    /// The intent's deadline, while still ahead: the status turns to expired then, and no
    /// write announces it.
    deadline: Option<tokio::time::Instant>,
    key: String,
    language: LanguageIdentifier,
    /// Read but not yet compared with what was shown.
    pending: Option<Checkout>,
    shown: Option<CheckoutStatus>,
    /// The final status was sent: the stream ends.
    finished: bool,
}

impl LiveStatus {
    /// The next status that differs from the one shown; `None` ends the stream (final status
    /// sent, lifetime over, shutdown, the intent gone or the database failing: the browser's
    /// `EventSource` connects again unless the page saw the final status).
    async fn next_change(&mut self) -> Option<Event> {
        loop {
            if self.finished {
                return None;
            }
            let checkout = match self.pending.take() {
                Some(checkout) => checkout,
                None => {
                    if !self.wait().await {
                        return None;
                    }
                    self.subscription.count_read();
                    self.engine.checkout(&self.key).await.ok()?
                }
            };
            if self.shown.as_ref() != Some(&checkout.status) {
                let update = page::status_update(
                    &checkout.status,
                    checkout.instructions.intent.order_ref.as_str(),
                    &self.language,
                );
                self.finished = checkout.status.is_final();
                self.shown = Some(checkout.status);
                return Event::default().event("status").json_data(&update).ok();
            }
        }
    }

    /// Until the intent may have changed (`true`), or the stream must end (`false`).
    async fn wait(&mut self) -> bool {
        let deadline = self.deadline;
        tokio::select! {
            changed = self.subscription.changes.changed() => changed.is_ok(),
            () = tokio::time::sleep_until(deadline.unwrap_or(self.ends_at)), if deadline.is_some() => {
                self.deadline = None;
                true
            }
            () = tokio::time::sleep_until(self.ends_at) => false,
            () = crate::shutdown::stopped(&mut self.shutdown) => false,
        }
    }
}

/// "I have paid" per checkout key at most once per `interval`: a page posted in a loop costs a
/// lookup in memory, not a write and a disk sync each time.
pub(super) struct PaidLimiter {
    interval: Duration,
    last: Mutex<HashMap<String, Instant>>,
}

/// Keys remembered at most; past it, the ones whose interval passed are forgotten.
const MAX_REMEMBERED_KEYS: usize = 100_000;

impl PaidLimiter {
    pub(super) fn new(interval: Duration) -> PaidLimiter {
        PaidLimiter {
            interval,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `key` may post now (and if so, from now on it may not for `interval`).
    fn admit(&self, key: &str) -> bool {
        let now = Instant::now();
        let mut last = self.last.lock().expect("never poisoned");
        if let Some(at) = last.get(key)
            && now.duration_since(*at) < self.interval
        {
            return false;
        }
        if last.len() >= MAX_REMEMBERED_KEYS {
            last.retain(|_, at| now.duration_since(*at) < self.interval);
        }
        if last.len() < MAX_REMEMBERED_KEYS {
            last.insert(key.to_owned(), now);
        }
        true
    }
}

/// `GET /assets/checkout.css`.
pub(super) async fn stylesheet() -> Response {
    asset("text/css; charset=utf-8", page::STYLESHEET)
}

/// `GET /assets/checkout.js`.
pub(super) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", page::SCRIPT)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    response
}
