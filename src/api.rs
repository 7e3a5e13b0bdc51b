//! The HTTP API (axum): the library API for the shop, reports for finance, stuck payments and
//! exception actions for operators, the pages, `/metrics`, health and readiness, and the
//! OpenAPI description. Stateless: any number of processes can serve it over one database.
//!
//! Every refusal is a 4xx with `{"error": {"code", "message"}}`; bearer tokens carry a role
//! and each route admits one role.

mod books;
mod checkout;
mod live;
mod server;
mod wallet;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use payrecon_chain_core::{Method, Secret};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::engine::Engine;
use crate::error::Error;
use crate::operator::Action;
use crate::order::{AccountId, OrderRef, RentalOrderRequest, TopupRequest};
use crate::report::{CsvSection, ReportFormat, ReportQuery};
use crate::stuck::StuckOptions;
use crate::tokens::{Caller, Role};

/// The OpenAPI 3.1 description of this API, served at `/openapi.json`.
pub const OPENAPI: &str = include_str!("api/openapi.json");
const STUCK_PAGE: &str = include_str!("api/stuck.html");
const RECONCILE_PAGE: &str = include_str!("api/reconcile.html");

pub use live::StreamLimits;
#[cfg(feature = "test-utils")]
pub use live::{LiveReads, StatusHub};
pub use server::{ServerLimits, serve};

/// How the API is configured: limits, the webhook endpoints an operator may replay, and how
/// `/metrics` is guarded.
#[derive(Clone, Debug)]
pub struct ApiOptions {
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Every request but a live status is answered within this (503 after it).
    pub request_timeout: Duration,
    /// The live statuses' caps and lifetime.
    pub streams: StreamLimits,
    /// "I have paid" at most once per this long per checkout key.
    pub paid_interval: Duration,
    /// The configured webhook endpoints and their retry windows, in hours.
    pub webhooks: BTreeMap<String, u32>,
    /// Serve `/metrics` on this router (not when it has a listener of its own).
    pub metrics_here: bool,
    /// `/metrics` asks for this bearer token.
    pub metrics_token: Option<Secret>,
}

impl Default for ApiOptions {
    fn default() -> ApiOptions {
        ApiOptions::from_config(&crate::config::Config::default())
    }
}

impl ApiOptions {
    /// The options `payrecon serve` runs the API with.
    pub fn from_config(config: &crate::config::Config) -> ApiOptions {
        let http = &config.http;
        ApiOptions {
            max_body_bytes: http.max_body_bytes,
            request_timeout: Duration::from_millis(u64::from(http.request_timeout_ms.max(1))),
            streams: StreamLimits {
                max_streams: http.max_streams,
                max_per_client: http.max_streams_per_client,
                lifetime: Duration::from_secs(u64::from(http.stream_lifetime_seconds.max(1))),
            },
            paid_interval: Duration::from_secs(u64::from(http.paid_interval_seconds)),
            webhooks: config
                .webhooks
                .iter()
                .map(|w| (w.name.clone(), w.retry_hours))
                .collect(),
            metrics_here: http.metrics_listen.is_none(),
            metrics_token: http.metrics_token.clone(),
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
struct ApiState {
    engine: Engine,
    webhooks: Arc<BTreeMap<String, u32>>,
    live: Arc<live::StatusHub>,
    paid_limiter: Arc<checkout::PaidLimiter>,
    metrics: Arc<MetricsGuard>,
}

/// The router of the whole API. Live statuses end when `shutdown` turns true, so a draining
/// server is not held open by a customer's tab.
pub fn router(engine: Engine, options: ApiOptions, shutdown: watch::Receiver<bool>) -> Router {
    routers(engine, options, shutdown).api
}

/// The routers `payrecon serve` runs, over one shared state.
pub struct Routers {
    /// Every route (`/metrics` too, unless it has a listener of its own).
    pub api: Router,
    /// `/metrics` alone, for `[http] metrics_listen`: the same figures and live statuses.
    pub metrics: Router,
    /// The live statuses' fan-out (the bench reads its counters).
    #[cfg(feature = "test-utils")]
    pub live: Arc<live::StatusHub>,
}

/// [`router`], `/metrics` alone, and the fan-out they share.
pub fn routers(engine: Engine, options: ApiOptions, shutdown: watch::Receiver<bool>) -> Routers {
    let live = live::StatusHub::start(engine.clone(), options.streams, shutdown);
    let state = ApiState {
        live: live.clone(),
        engine,
        webhooks: Arc::new(options.webhooks.clone()),
        paid_limiter: Arc::new(checkout::PaidLimiter::new(options.paid_interval)),
        metrics: Arc::new(MetricsGuard::new(options.metrics_token.clone())),
    };
    // Every answer but a live status has a deadline; the live status has its own lifetime.
    let deadline = tower_http::timeout::TimeoutLayer::with_status_code(
        StatusCode::SERVICE_UNAVAILABLE,
        options.request_timeout,
    );
    let metrics_alone = Router::new()
        .route("/metrics", get(metrics))
        .layer(deadline)
        .with_state(state.clone());
    let mut answered = Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/openapi.json", get(openapi))
        .route("/ui/stuck", get(|| async { Html(STUCK_PAGE) }))
        .route("/ui/reconcile", get(|| async { Html(RECONCILE_PAGE) }))
        .route("/pay/{key}", get(checkout::checkout_page))
        .route("/pay/{key}/paid", post(checkout::checkout_paid))
        .route("/pay/{key}/refund", post(checkout::checkout_refund))
        .route("/assets/checkout.css", get(checkout::stylesheet))
        .route("/assets/checkout.js", get(checkout::script))
        .route("/v1/orders", post(create_order))
        .route("/v1/orders/{reference}", get(show_order))
        .route(
            "/v1/orders/{reference}/pay-from-balance",
            post(pay_from_balance),
        )
        .route("/v1/topups", post(create_topup))
        .route("/v1/payments", post(create_payment))
        .route("/v1/payments/{intent}", get(show_payment))
        .route("/v1/payments/{intent}/qr.svg", get(payment_qr))
        .route("/v1/payments/{intent}/mark-paid", post(mark_paid))
        .route("/v1/balances/{account}", get(balance))
        .route("/v1/accounts/{account}/history", get(account_history))
        .route("/v1/reports/reconcile", get(reconcile))
        .route("/v1/ledger/trial-balance", get(trial_balance))
        .route("/v1/reports/rollforward", get(books::rollforward))
        .route("/v1/periods/{period}", get(books::status))
        .route("/v1/periods/{period}/close", post(books::close))
        .route("/v1/periods/{period}/reopen", post(books::reopen))
        .route("/v1/periods/{period}/report", get(books::report))
        .route("/v1/exports/journal", get(books::journal))
        .route("/v1/books/unvalued", get(books::unvalued))
        .route("/v1/holdings", get(wallet::holdings))
        .route("/v1/reports/holdings", get(wallet::rollforward))
        .route("/v1/wallet/{network}/export", get(wallet::export))
        .route("/v1/stuck", get(stuck))
        .route("/v1/exceptions", get(exceptions))
        .route("/v1/support/find", get(support_find))
        .route("/v1/exceptions/{id}/resolve", post(resolve))
        .route("/v1/exceptions/{id}/refunds", post(request_refund))
        .route(
            "/v1/payments/{intent}/refunds",
            post(request_payment_refund),
        )
        .route("/v1/refunds", get(refunds))
        .route("/v1/refunds/{id}/approve", post(approve_refund))
        .route("/v1/refunds/{id}/cancel", post(cancel_refund))
        .route("/v1/refunds/{id}/prepare", post(prepare_refund))
        .route("/v1/refunds/{id}/sent", post(refund_sent))
        .route("/v1/audit-log", get(audit_log))
        .route("/v1/webhooks/{endpoint}/replay", post(replay_webhooks));
    if options.metrics_here {
        answered = answered.route("/metrics", get(metrics));
    }
    let api = Router::new()
        .route("/pay/{key}/events", get(checkout::checkout_events))
        .merge(answered.layer(deadline))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
        })
        .layer(axum::extract::DefaultBodyLimit::max(options.max_body_bytes))
        .with_state(state);
    Routers {
        api,
        metrics: metrics_alone,
        #[cfg(feature = "test-utils")]
        live,
    }
}

/// The client's address as the server recorded it (`None` when served otherwise, as in
/// tests that call the router directly).
pub(crate) struct ClientAddress(Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for ClientAddress {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(ClientAddress(server::client_of(parts).map(|a| a.ip())))
    }
}

/// A refusal or failure, as JSON.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": { "code": self.code, "message": self.message } });
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<Error> for ApiError {
    fn from(error: Error) -> ApiError {
        use StatusCode as S;
        let (status, code) = match &error {
            Error::OrderRule(_) | Error::InvalidInput(_) | Error::Ledger(_) => {
                (S::UNPROCESSABLE_ENTITY, "invalid")
            }
            Error::OrderNotFound(_)
            | Error::IntentNotFound(_)
            | Error::ExceptionNotFound(_)
            | Error::RefundNotFound(_) => (S::NOT_FOUND, "not_found"),
            Error::OrderConflict(_)
            | Error::AlreadySettled(_)
            | Error::NotARental(_)
            | Error::InsufficientBalance { .. }
            | Error::ActionRefused { .. }
            | Error::Books(_) => (S::CONFLICT, "conflict"),
            Error::MethodDisabled(_) => (S::UNPROCESSABLE_ENTITY, "method_disabled"),
            Error::Rate(_) => (S::SERVICE_UNAVAILABLE, "rate_unavailable"),
            Error::CatchingUp(_) | Error::AddressFoundPaid { .. } => {
                (S::SERVICE_UNAVAILABLE, "catching_up")
            }
            Error::Chain(_) => (S::BAD_GATEWAY, "chain_unavailable"),
            _ => {
                tracing::error!(%error, "request failed");
                return ApiError::new(
                    S::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error; see the server's log",
                );
            }
        };
        ApiError::new(status, code, error.to_string())
    }
}

/// `Json<T>` whose rejections (malformed JSON, wrong content type, oversized body) are JSON
/// errors too.
struct ApiJson<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<ApiJson<T>, ApiError> {
        match Json::<T>::from_request(request, state).await {
            Ok(Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

/// `Query<T>` whose rejection (an unknown or malformed parameter) is a JSON 400 too.
struct ApiQuery<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<ApiQuery<T>, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(query)| ApiQuery(query))
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e.body_text()))
    }
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    let status = rejection.status();
    let code = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        _ => "malformed_json",
    };
    ApiError::new(status, code, rejection.body_text())
}

/// The caller, checked to hold the role `ROLE` (0 shop, 1 finance, 2 operator). An extractor
/// from the request head, so it runs before the body is read: a caller without the right
/// token learns nothing about what a valid body looks like.
struct Authorized<const ROLE: u8>(Caller);

impl<const ROLE: u8> FromRequestParts<ApiState> for Authorized<ROLE> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        let role = match ROLE {
            0 => Role::Shop,
            1 => Role::Finance,
            _ => Role::Operator,
        };
        authorize(state, &parts.headers, role).await.map(Authorized)
    }
}

type Shop = Authorized<0>;
type Finance = Authorized<1>;
type Operator = Authorized<2>;

/// Checks the bearer token and that its role may use the route.
async fn authorize(state: &ApiState, headers: &HeaderMap, role: Role) -> Result<Caller, ApiError> {
    let unauthorized = || {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required",
        )
    };
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .ok_or_else(unauthorized)?;
    let caller = state
        .engine
        .authenticate(token.trim())
        .await?
        .ok_or_else(unauthorized)?;
    if caller.role != role {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "a {} token cannot use this endpoint; it needs a {role} token",
                caller.role
            ),
        ));
    }
    Ok(caller)
}

type ApiResult = Result<Response, ApiError>;

fn ok<T: Serialize>(value: &T) -> ApiResult {
    Ok(Json(value).into_response())
}

fn created<T: Serialize>(value: &T, is_new: bool) -> ApiResult {
    let status = if is_new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(value)).into_response())
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

/// Ready when the database answers. What the driver said stays in the log: this route is
/// public, and a driver's error can name hosts, users and paths.
async fn ready(State(state): State<ApiState>) -> Response {
    match state.engine.db().ping().await {
        Ok(_) => Json(serde_json::json!({ "status": "ready" })).into_response(),
        Err(error) => {
            tracing::warn!(%error, "not ready: the database is unreachable");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_ready",
                "database unreachable",
            )
            .into_response()
        }
    }
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn create_order(
    State(state): State<ApiState>,
    _: Shop,
    ApiJson(request): ApiJson<RentalOrderRequest>,
) -> ApiResult {
    let result = state.engine.create_rental_order(&request).await?;
    created(&result, result.created)
}

async fn create_topup(
    State(state): State<ApiState>,
    _: Shop,
    ApiJson(request): ApiJson<TopupRequest>,
) -> ApiResult {
    let result = state.engine.create_topup(&request).await?;
    created(&result, result.created)
}

async fn show_order(
    State(state): State<ApiState>,
    _: Shop,
    Path(reference): Path<String>,
) -> ApiResult {
    let reference = OrderRef::new(reference).map_err(Error::from)?;
    let order = state.engine.order(&reference).await?;
    let payments = state.engine.payments_for(&reference).await?;
    ok(&serde_json::json!({ "order": order, "payments": payments }))
}

async fn pay_from_balance(
    State(state): State<ApiState>,
    _: Shop,
    Path(reference): Path<String>,
) -> ApiResult {
    let reference = OrderRef::new(reference).map_err(Error::from)?;
    ok(&state.engine.pay_order_from_balance(&reference).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PaymentRequest {
    /// The order or top-up reference.
    order: String,
    /// The method id.
    method: String,
}

async fn create_payment(
    State(state): State<ApiState>,
    _: Shop,
    ApiJson(request): ApiJson<PaymentRequest>,
) -> ApiResult {
    let reference = OrderRef::new(request.order).map_err(Error::from)?;
    let method: Method = request.method.parse().map_err(|_| {
        Error::InvalidInput(format!(
            "unknown method {:?}: use one of {}",
            request.method.chars().take(40).collect::<String>(),
            Method::ALL.map(|m| m.id()).join(", ")
        ))
    })?;
    let instructions = state.engine.create_payment(&reference, method).await?;
    created(&instructions, true)
}

async fn show_payment(
    State(state): State<ApiState>,
    _: Shop,
    Path(intent): Path<String>,
) -> ApiResult {
    ok(&state.engine.payment(&intent).await?)
}

async fn payment_qr(
    State(state): State<ApiState>,
    _: Shop,
    Path(intent): Path<String>,
) -> ApiResult {
    let svg = state.engine.payment_qr_svg(&intent).await?;
    Ok(([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response())
}

async fn mark_paid(
    State(state): State<ApiState>,
    _: Shop,
    Path(intent): Path<String>,
) -> ApiResult {
    ok(&state.engine.mark_paid(&intent).await?)
}

async fn balance(State(state): State<ApiState>, _: Shop, Path(account): Path<String>) -> ApiResult {
    let account = AccountId::new(account).map_err(Error::from)?;
    let available = state.engine.available_balance(&account).await?;
    ok(&serde_json::json!({ "account_id": account, "available_usd": available }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    /// Items per page.
    limit: Option<usize>,
    /// The previous page's `next`.
    after: Option<String>,
}

/// One page of an account's orders, payments and balance statement (shop).
async fn account_history(
    State(state): State<ApiState>,
    _: Shop,
    Path(account): Path<String>,
    ApiQuery(query): ApiQuery<HistoryQuery>,
) -> ApiResult {
    let account = AccountId::new(account).map_err(Error::from)?;
    let limit = query.limit.unwrap_or(crate::history::DEFAULT_HISTORY_PAGE);
    ok(&state
        .engine
        .account_history(&account, query.after.as_deref(), limit)
        .await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReportParams {
    from: String,
    to: String,
    method: Option<String>,
    format: Option<ReportFormat>,
    section: Option<CsvSection>,
}

/// Parses an RFC 3339 time or a `YYYY-MM-DD` date (midnight UTC).
pub fn parse_time(what: &str, text: &str) -> Result<DateTime<Utc>, Error> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|at| at.and_utc())
        .ok_or_else(|| {
            Error::InvalidInput(format!(
                "{what} must be a date (2026-12-01) or an RFC 3339 time"
            ))
        })
}

async fn reconcile(
    State(state): State<ApiState>,
    _: Finance,
    ApiQuery(params): ApiQuery<ReportParams>,
) -> ApiResult {
    let method = match &params.method {
        Some(text) => Some(text.parse::<Method>().map_err(|_| {
            Error::InvalidInput(format!(
                "unknown method {:?}",
                text.chars().take(40).collect::<String>()
            ))
        })?),
        None => None,
    };
    let query = ReportQuery {
        from: parse_time("from", &params.from)?,
        to: parse_time("to", &params.to)?,
        method,
    };
    if query.from >= query.to {
        return Err(Error::InvalidInput("from must be before to".into()).into());
    }
    let format = params.format.unwrap_or(ReportFormat::Json);
    let section = params.section.unwrap_or_default();
    let content_type = match format {
        ReportFormat::Csv => "text/csv; charset=utf-8",
        ReportFormat::Json => "application/json",
        ReportFormat::Html => "text/html; charset=utf-8",
    };
    // The report streams into the response through a pipe: memory stays flat however many
    // transfers the period holds.
    let (writer, reader) = tokio::io::duplex(64 * 1024);
    let engine = state.engine.clone();
    tokio::spawn(async move {
        if let Err(error) = engine
            .write_reconciliation(&query, format, section, writer)
            .await
        {
            tracing::warn!(%error, "reconciliation report over HTTP stopped");
        }
    });
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(reader));
    Ok(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

async fn trial_balance(State(state): State<ApiState>, _: Finance) -> ApiResult {
    let trial = state.engine.trial_balance().await?;
    ok(&serde_json::json!({ "sound": trial.is_sound(), "trial_balance": trial }))
}

/// `?limit=&after=` of the list routes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PageQuery {
    /// Items per page (default 100, at most 1000).
    limit: Option<usize>,
    /// The previous page's cursor, from its `Link: <…>; rel="next"`.
    after: Option<String>,
    /// Exceptions only: the open ones.
    #[serde(default)]
    open: bool,
}

/// Items per page of a list route when the caller names none.
const DEFAULT_PAGE: usize = 100;

impl PageQuery {
    fn limit(&self) -> usize {
        self.limit.unwrap_or(DEFAULT_PAGE)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for PageQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        ApiQuery::<PageQuery>::from_request_parts(parts, state)
            .await
            .map(|ApiQuery(query)| query)
    }
}

/// A page as a JSON array, with the next page's address in a `Link` header (RFC 8288), so
/// the body keeps its shape.
fn paged<T: Serialize>(path: &str, query: &PageQuery, page: crate::stuck::Page<T>) -> ApiResult {
    let mut response = Json(&page.items).into_response();
    if let Some(next) = &page.next
        && let Ok(mut url) = reqwest::Url::parse(&format!("http://host{path}"))
    {
        {
            let mut pairs = url.query_pairs_mut();
            pairs.append_pair("after", next);
            pairs.append_pair("limit", &query.limit().to_string());
            if query.open {
                pairs.append_pair("open", "true");
            }
        }
        let link = format!(
            "<{}?{}>; rel=\"next\"",
            url.path(),
            url.query().unwrap_or_default()
        );
        if let Ok(value) = HeaderValue::from_str(&link) {
            response.headers_mut().insert(header::LINK, value);
        }
    }
    Ok(response)
}

async fn stuck(State(state): State<ApiState>, _: Operator, query: PageQuery) -> ApiResult {
    let options = StuckOptions::default();
    let after = query.after.as_deref();
    let page = state
        .engine
        .stuck_page(&options, after, query.limit())
        .await?;
    paged("/v1/stuck", &query, page)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FindQuery {
    /// A transaction id, an address, an order or top-up reference, or an intent id.
    q: String,
}

/// Support lookup (operators): 404 when the text names nothing payrecon knows.
async fn support_find(
    State(state): State<ApiState>,
    _: Operator,
    ApiQuery(query): ApiQuery<FindQuery>,
) -> ApiResult {
    match state.engine.find(&query.q).await? {
        Some(finding) => ok(&finding),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no transaction, address, order or intent matches",
        )),
    }
}

async fn exceptions(State(state): State<ApiState>, _: Operator, query: PageQuery) -> ApiResult {
    let after = query.after.as_deref();
    let page = state
        .engine
        .exceptions_page(query.open, after, query.limit())
        .await?;
    paged("/v1/exceptions", &query, page)
}

#[derive(Deserialize)]
struct ResolveRequest {
    #[serde(flatten)]
    action: Action,
    reason: String,
}

async fn resolve(
    State(state): State<ApiState>,
    Authorized(caller): Operator,
    Path(id): Path<String>,
    ApiJson(request): ApiJson<ResolveRequest>,
) -> ApiResult {
    let resolved = state
        .engine
        .resolve_exception(&id, &request.action, &caller.name, &request.reason)
        .await?;
    ok(&resolved)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RefundRequest {
    address: String,
    #[serde(default = "all_left")]
    amount: String,
}

fn all_left() -> String {
    "all".to_owned()
}

async fn request_refund(
    State(state): State<ApiState>,
    Authorized(caller): Operator,
    Path(id): Path<String>,
    ApiJson(request): ApiJson<RefundRequest>,
) -> ApiResult {
    let refund = state
        .engine
        .request_refund(&id, &request.address, &request.amount, &caller.name)
        .await?;
    ok(&refund)
}

async fn request_payment_refund(
    State(state): State<ApiState>,
    Authorized(caller): Operator,
    Path(intent): Path<String>,
    ApiJson(request): ApiJson<RefundRequest>,
) -> ApiResult {
    let refund = state
        .engine
        .request_payment_refund(&intent, &request.address, &request.amount, &caller.name)
        .await?;
    ok(&refund)
}

#[derive(Deserialize)]
struct RefundsQuery {
    exception: Option<String>,
}

async fn refunds(
    State(state): State<ApiState>,
    _: Operator,
    Query(query): Query<RefundsQuery>,
) -> ApiResult {
    ok(&state.engine.refunds(query.exception.as_deref()).await?)
}

async fn approve_refund(
    State(state): State<ApiState>,
    Authorized(caller): Operator,
    Path(id): Path<String>,
) -> ApiResult {
    ok(&state.engine.approve_refund(&id, &caller.name).await?)
}

async fn prepare_refund(
    State(state): State<ApiState>,
    Authorized(caller): Operator,
    Path(id): Path<String>,
) -> ApiResult {
    ok(&state.engine.prepare_refund(&id, &caller.name).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RefundSent {
    txid: String,
}

async fn refund_sent(
    State(state): State<ApiState>,
    Authorized(caller): Operator,
    Path(id): Path<String>,
    ApiJson(request): ApiJson<RefundSent>,
) -> ApiResult {
    ok(&state
        .engine
        .refund_sent(&id, &request.txid, &caller.name)
        .await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelRefund {
    reason: String,
}

async fn cancel_refund(
    State(state): State<ApiState>,
    Authorized(caller): Operator,
    Path(id): Path<String>,
    ApiJson(request): ApiJson<CancelRefund>,
) -> ApiResult {
    ok(&state
        .engine
        .cancel_refund(&id, &caller.name, &request.reason)
        .await?)
}

async fn audit_log(State(state): State<ApiState>, _: Operator, query: PageQuery) -> ApiResult {
    let after = query.after.as_deref();
    let page = state
        .engine
        .operator_actions_page(after, query.limit())
        .await?;
    paged("/v1/audit-log", &query, page)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayRequest {
    from_seq: i64,
}

async fn replay_webhooks(
    State(state): State<ApiState>,
    _: Operator,
    Path(endpoint): Path<String>,
    ApiJson(request): ApiJson<ReplayRequest>,
) -> ApiResult {
    let Some(retry_hours) = state.webhooks.get(&endpoint).copied() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "no webhook named {:?} is configured",
                endpoint.chars().take(64).collect::<String>()
            ),
        ));
    };
    let queued = state
        .engine
        .replay_webhooks(&endpoint, request.from_seq, retry_hours)
        .await?;
    ok(&serde_json::json!({ "endpoint": endpoint, "queued": queued }))
}

/// How `/metrics` is guarded, and its last answer: the figures are computed at most once per
/// [`METRICS_TTL`] however often (or by how many) they are scraped.
struct MetricsGuard {
    /// SHA-256 of the token: compared as digests, so the comparison's time says nothing of
    /// the token.
    token_digest: Option<[u8; 32]>,
    last: tokio::sync::Mutex<Option<(std::time::Instant, String)>>,
}

/// How long one computation of the metrics serves.
const METRICS_TTL: Duration = Duration::from_secs(5);

impl MetricsGuard {
    fn new(token: Option<Secret>) -> MetricsGuard {
        MetricsGuard {
            token_digest: token.map(|token| Sha256::digest(token.expose().as_bytes()).into()),
            last: tokio::sync::Mutex::new(None),
        }
    }

    fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(expected) = &self.token_digest else {
            return true;
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .unwrap_or_default()
            .trim();
        let given: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        given == *expected
    }
}

/// Prometheus text format: per network tip, cursor, lag and RPC errors; intents by state;
/// open exceptions; failing webhook endpoints; open live statuses.
async fn metrics(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    if !state.metrics.admits(&headers) {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the metrics token is required",
        )
        .into_response();
    }
    let mut last = state.metrics.last.lock().await;
    let text = match &*last {
        Some((at, text)) if at.elapsed() < METRICS_TTL => text.clone(),
        _ => match metrics_text(&state.engine).await {
            Ok(mut text) => {
                family(
                    &mut text,
                    "payrecon_live_statuses_open",
                    "Open live-status streams of checkout pages in this process.",
                    "gauge",
                    vec![(String::new(), state.live.open_streams() as u64)],
                );
                *last = Some((std::time::Instant::now(), text.clone()));
                text
            }
            Err(error) => return ApiError::from(error).into_response(),
        },
    };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// The metrics page, from what the database holds (so every process serves the same).
pub async fn metrics_text(engine: &Engine) -> Result<String, Error> {
    let mut text = String::new();
    watcher_families(&mut text, &engine.watcher_health().await?);
    let intents = engine.intents_by_status().await?;
    family(
        &mut text,
        "payrecon_intents",
        "Payment intents by state.",
        "gauge",
        intents
            .into_iter()
            .map(|(state, n)| (format!("state=\"{state}\""), n as u64))
            .collect(),
    );
    let open = engine.open_exceptions_by_kind().await?;
    family(
        &mut text,
        "payrecon_exceptions_open",
        "Open exceptions by kind.",
        "gauge",
        open.into_iter()
            .map(|(kind, n)| (format!("kind=\"{kind}\""), n as u64))
            .collect(),
    );
    // What `payrecon stuck` lists, counted (a page of it at most): the alert rules' view of
    // payments marked paid but unseen, the gap limit, stale rates and the rest.
    let mut stuck: BTreeMap<(&str, String), u64> = BTreeMap::new();
    for item in engine.stuck(&Default::default()).await? {
        *stuck.entry((item.category, item.kind)).or_default() += 1;
    }
    family(
        &mut text,
        "payrecon_stuck_items",
        "What needs an operator (payrecon stuck), by category and kind.",
        "gauge",
        stuck
            .into_iter()
            .map(|((category, kind), n)| (format!("category=\"{category}\",kind=\"{kind}\""), n))
            .collect(),
    );
    witness_family(&mut text, engine.witness_counts().await?);
    holdings_check_families(&mut text, &engine.holdings_checks().await?);
    let (unvalued, oldest) = engine.unvalued_overdue().await?;
    family(
        &mut text,
        "payrecon_unvalued_entries",
        "Ledger entries without a fiat value past a valuation pass: their month cannot close.",
        "gauge",
        vec![(String::new(), unvalued)],
    );
    let failing = engine.failing_webhooks().await?;
    let now_ms = engine.clock().now().timestamp_millis();
    family(
        &mut text,
        "payrecon_unvalued_oldest_age_seconds",
        "Age of the oldest entry without a fiat value past a valuation pass (0: none).",
        "gauge",
        vec![(
            String::new(),
            oldest.map_or(0, |at| {
                u64::try_from((now_ms - at.timestamp_millis()) / 1000).unwrap_or(0)
            }),
        )],
    );
    family(
        &mut text,
        "payrecon_webhook_deliveries_failing",
        "Webhook deliveries that failed and wait to be retried, or were given up, by endpoint.",
        "gauge",
        failing
            .iter()
            .flat_map(|f| {
                [
                    (
                        format!("endpoint=\"{}\",state=\"retrying\"", f.endpoint),
                        f.retrying as u64,
                    ),
                    (
                        format!("endpoint=\"{}\",state=\"abandoned\"", f.endpoint),
                        f.abandoned as u64,
                    ),
                ]
            })
            .collect(),
    );
    family(
        &mut text,
        "payrecon_webhook_oldest_undelivered_seconds",
        "Age of the oldest event a failing webhook endpoint has not received.",
        "gauge",
        failing
            .iter()
            .map(|f| {
                let age = (now_ms - f.oldest_event_at_ms).max(0) / 1000;
                (format!("endpoint=\"{}\"", f.endpoint), age as u64)
            })
            .collect(),
    );
    let group = engine.db().group_commit_stats();
    family(
        &mut text,
        "payrecon_group_commits_total",
        "Transactions the group commit has committed in this process.",
        "counter",
        vec![(String::new(), group.commits)],
    );
    family(
        &mut text,
        "payrecon_group_writes_total",
        "API writes those commits answered in this process (writes over commits: how much the group commit shares).",
        "counter",
        vec![(String::new(), group.writes)],
    );
    Ok(text)
}

/// The watchers' figures, one series per network.
fn watcher_families(text: &mut String, health: &[crate::records::WatcherHealth]) {
    let per_network = |value: &dyn Fn(&crate::records::WatcherHealth) -> u64| {
        network_samples(health, |h| &h.network, value)
    };
    family(
        text,
        "payrecon_chain_head",
        "The node's newest block at the last scan.",
        "gauge",
        per_network(&|h| h.head_height.unwrap_or(0)),
    );
    family(
        text,
        "payrecon_watcher_cursor",
        "The newest block the watcher committed.",
        "gauge",
        per_network(&|h| h.cursor_height.unwrap_or(0)),
    );
    family(
        text,
        "payrecon_watcher_lag_blocks",
        "Blocks between the node's head and the cursor.",
        "gauge",
        per_network(&|h| {
            h.head_height
                .unwrap_or(0)
                .saturating_sub(h.cursor_height.unwrap_or(0))
        }),
    );
    family(
        text,
        "payrecon_watcher_rpc_errors_total",
        "Failed watcher rounds since the watcher started.",
        "counter",
        per_network(&|h| h.rpc_errors),
    );
    family(
        text,
        "payrecon_source_incomplete_answers_total",
        "Answers of the chain source that left out part of a block (read again; the cursor waited) since the watcher started.",
        "counter",
        per_network(&|h| h.incomplete_answers),
    );
    family(
        text,
        "payrecon_zero_value_transfers_total",
        "Zero-value transfers to watched addresses (address poisoning) ignored since the watcher started.",
        "counter",
        per_network(&|h| h.zero_value_ignored),
    );
    family(
        text,
        "payrecon_source_active",
        "1 for the source (its credentials hidden) that served the watcher's last round.",
        "gauge",
        health
            .iter()
            .filter_map(|h| {
                let source = h.active_source.as_deref()?;
                let source = source.replace('\\', "\\\\").replace('"', "\\\"");
                Some((format!("network=\"{}\",source=\"{source}\"", h.network), 1))
            })
            .collect(),
    );
    family(
        text,
        "payrecon_watcher_up",
        "1 if the watcher's last round succeeded.",
        "gauge",
        per_network(&|h| u64::from(h.state == "running")),
    );
}

/// Receipts the witnesses were asked about, one series per network and state.
fn witness_family(text: &mut String, counts: Vec<(payrecon_chain_core::Network, &str, i64)>) {
    family(
        text,
        "payrecon_receipts_witnessed",
        "Receipts the witnesses were asked about, by network and state (waiting, disagrees, confirmed, unwitnessed).",
        "gauge",
        counts
            .into_iter()
            .map(|(network, state, n)| {
                (
                    format!("network=\"{network}\",state=\"{state}\""),
                    u64::try_from(n).unwrap_or(0),
                )
            })
            .collect(),
    );
}

/// The last holdings check's figures, one series per network.
fn holdings_check_families(text: &mut String, checks: &[crate::records::HoldingsCheck]) {
    let per_network = |value: &dyn Fn(&crate::records::HoldingsCheck) -> u64| {
        network_samples(checks, |c| &c.network, value)
    };
    family(
        text,
        "payrecon_holdings_check_unexplained",
        "Balances the last holdings check found that no receipt explains, by network.",
        "gauge",
        per_network(&|c| c.unexplained),
    );
    family(
        text,
        "payrecon_holdings_check_timestamp_seconds",
        "When the last holdings check ran, by network (Unix seconds).",
        "gauge",
        per_network(&|c| u64::try_from(c.checked_at.timestamp()).unwrap_or(0)),
    );
}

/// One sample per row, labelled with the row's network.
fn network_samples<T>(
    rows: &[T],
    network: impl Fn(&T) -> &str,
    value: &dyn Fn(&T) -> u64,
) -> Vec<(String, u64)> {
    rows.iter()
        .map(|row| (format!("network=\"{}\"", network(row)), value(row)))
        .collect()
}

/// One metric family: its help, its type, then its samples.
fn family(text: &mut String, name: &str, help: &str, kind: &str, samples: Vec<(String, u64)>) {
    let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, value) in samples {
        if labels.is_empty() {
            let _ = writeln!(text, "{name} {value}");
        } else {
            let _ = writeln!(text, "{name}{{{labels}}} {value}");
        }
    }
}
