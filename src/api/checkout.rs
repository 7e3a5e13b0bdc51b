//! The customer's routes: the checkout page, its live status and its "I have paid". Public and
//! without a token: the page's key is the only credential, so every answer is marked never
//! to be cached, framed or leaked in a `Referer`.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use fluent_templates::LanguageIdentifier;
use serde::Deserialize;

use super::{ApiError, ApiState};
use crate::checkout::page::{self, CONTENT_SECURITY_POLICY};
use crate::checkout::{Checkout, CheckoutStatus};
use crate::engine::Engine;
use crate::error::Error;

/// How often an open live status looks again without a wake-up: the deadline passing, or a
/// change written by another payrecon process, wakes nobody here.
const STATUS_RECHECK: Duration = Duration::from_secs(2);

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
                page::render(&checkout, &key, &language, now),
            )
        }
        Err(error) => unknown_or_failed(error, &language),
    }
}

/// `POST /pay/{key}/paid`: "I have paid", then back to the page (a plain form post, so it
/// works without JavaScript).
pub(super) async fn checkout_paid(
    State(state): State<ApiState>,
    PageRequest { key, language }: PageRequest,
) -> Response {
    match state.engine.checkout_mark_paid(&key).await {
        Ok(()) => {
            let mut response = Redirect::to(&format!("/pay/{key}?lang={language}")).into_response();
            protect(response.headers_mut());
            response
        }
        Err(error) => unknown_or_failed(error, &language),
    }
}

/// `GET /pay/{key}/events`: the live status as server-sent events, one `status` event at
/// once and one more each time what the customer reads changes.
pub(super) async fn checkout_events(
    State(state): State<ApiState>,
    PageRequest { key, language }: PageRequest,
) -> Response {
    let first = match state.engine.checkout(&key).await {
        Ok(checkout) => checkout,
        Err(error) => return unknown_or_failed(error, &language),
    };
    let live = LiveStatus {
        wakeups: state.engine.subscribe(),
        engine: state.engine,
        key,
        language,
        pending: Some(first),
        shown: None,
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
    wakeups: tokio::sync::broadcast::Receiver<()>,
    key: String,
    language: LanguageIdentifier,
    /// Read but not yet compared with what was shown.
    pending: Option<Checkout>,
    shown: Option<CheckoutStatus>,
}

impl LiveStatus {
    /// The next status that differs from the one shown; `None` ends the stream (the intent
    /// is gone or the database failed: the browser's `EventSource` connects again).
    async fn next_change(&mut self) -> Option<Event> {
        loop {
            let checkout = match self.pending.take() {
                Some(checkout) => checkout,
                None => {
                    self.wait().await;
                    self.engine.checkout(&self.key).await.ok()?
                }
            };
            if self.shown.as_ref() != Some(&checkout.status) {
                let update = page::status_update(
                    &checkout.status,
                    checkout.instructions.intent.order_ref.as_str(),
                    &self.language,
                );
                self.shown = Some(checkout.status);
                return Event::default().event("status").json_data(&update).ok();
            }
        }
    }

    /// Until new events were committed in this process, or [`STATUS_RECHECK`].
    async fn wait(&mut self) {
        tokio::select! {
            woken = self.wakeups.recv() => {
                if let Err(tokio::sync::broadcast::error::RecvError::Closed) = woken {
                    tokio::time::sleep(STATUS_RECHECK).await;
                }
            }
            () = tokio::time::sleep(STATUS_RECHECK) => {}
        }
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
