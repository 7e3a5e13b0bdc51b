//! The HTTP API (axum): the library API for the shop, reports for finance, stuck payments and
//! exception actions for operators, the pages, `/metrics`, health and readiness, and the
//! OpenAPI description. Stateless: any number of processes can serve it over one database.
//!
//! Every refusal is a 4xx with `{"error": {"code", "message"}}`; bearer tokens carry a role
//! and each route admits one role.

mod checkout;

use std::fmt::Write as _;

use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use payrecon_chain_core::Method;
use serde::{Deserialize, Serialize};

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

/// What every handler shares.
#[derive(Clone)]
struct ApiState {
    engine: Engine,
    webhook_retry_hours: u32,
}

/// The router of the whole API; `max_body_bytes` caps every request body.
pub fn router(engine: Engine, max_body_bytes: usize, webhook_retry_hours: u32) -> Router {
    let state = ApiState {
        engine,
        webhook_retry_hours,
    };
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/ui/stuck", get(|| async { Html(STUCK_PAGE) }))
        .route("/ui/reconcile", get(|| async { Html(RECONCILE_PAGE) }))
        .route("/pay/{key}", get(checkout::checkout_page))
        .route("/pay/{key}/events", get(checkout::checkout_events))
        .route("/pay/{key}/paid", post(checkout::checkout_paid))
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
        .route("/v1/stuck", get(stuck))
        .route("/v1/exceptions", get(exceptions))
        .route("/v1/support/find", get(support_find))
        .route("/v1/exceptions/{id}/resolve", post(resolve))
        .route("/v1/audit-log", get(audit_log))
        .route("/v1/webhooks/{endpoint}/replay", post(replay_webhooks))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
        })
        .layer(axum::extract::DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
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
            Error::OrderNotFound(_) | Error::IntentNotFound(_) | Error::ExceptionNotFound(_) => {
                (S::NOT_FOUND, "not_found")
            }
            Error::OrderConflict(_)
            | Error::AlreadySettled(_)
            | Error::NotARental(_)
            | Error::InsufficientBalance { .. }
            | Error::ActionRefused { .. } => (S::CONFLICT, "conflict"),
            Error::MethodDisabled(_) => (S::UNPROCESSABLE_ENTITY, "method_disabled"),
            Error::Rate(_) => (S::SERVICE_UNAVAILABLE, "rate_unavailable"),
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

async fn ready(State(state): State<ApiState>) -> Response {
    match state.engine.store().ping().await {
        Ok(_) => Json(serde_json::json!({ "status": "ready" })).into_response(),
        Err(error) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            format!("the database is unreachable: {error}"),
        )
        .into_response(),
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
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(query) = query
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e.body_text()))?;
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
    params: Result<Query<ReportParams>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(params) = params
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e.body_text()))?;
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

async fn stuck(State(state): State<ApiState>, _: Operator) -> ApiResult {
    ok(&state.engine.stuck(&StuckOptions::default()).await?)
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
    query: Result<Query<FindQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(query) = query
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e.body_text()))?;
    match state.engine.find(&query.q).await? {
        Some(finding) => ok(&finding),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no transaction, address, order or intent matches",
        )),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExceptionFilter {
    #[serde(default)]
    open: bool,
}

async fn exceptions(
    State(state): State<ApiState>,
    _: Operator,
    filter: Result<Query<ExceptionFilter>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(filter) = filter
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e.body_text()))?;
    let mut all = state.engine.exceptions(None).await?;
    if filter.open {
        all.retain(|e| e.resolved_at.is_none());
    }
    ok(&all)
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

async fn audit_log(State(state): State<ApiState>, _: Operator) -> ApiResult {
    ok(&state.engine.operator_actions().await?)
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
    let queued = state
        .engine
        .replay_webhooks(&endpoint, request.from_seq, state.webhook_retry_hours)
        .await?;
    ok(&serde_json::json!({ "endpoint": endpoint, "queued": queued }))
}

/// Prometheus text format: per network tip, cursor, lag and RPC errors; intents by state;
/// open exceptions; webhook deliveries.
async fn metrics(State(state): State<ApiState>) -> Response {
    match state.engine.metrics_text().await {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Err(error) => ApiError::from(error).into_response(),
    }
}

impl Engine {
    /// The metrics page, from what the database holds (so every process serves the same).
    pub async fn metrics_text(&self) -> Result<String, Error> {
        let health = self.watcher_health().await?;
        let per_network = |value: &dyn Fn(&crate::store::operations::WatcherHealth) -> u64| {
            health
                .iter()
                .map(|h| (format!("network=\"{}\"", h.network), value(h)))
                .collect::<Vec<_>>()
        };
        let mut text = String::new();
        family(
            &mut text,
            "payrecon_chain_head",
            "The node's newest block at the last scan.",
            "gauge",
            per_network(&|h| h.head_height.unwrap_or(0)),
        );
        family(
            &mut text,
            "payrecon_watcher_cursor",
            "The newest block the watcher committed.",
            "gauge",
            per_network(&|h| h.cursor_height.unwrap_or(0)),
        );
        family(
            &mut text,
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
            &mut text,
            "payrecon_watcher_rpc_errors_total",
            "Failed watcher rounds since the watcher started.",
            "counter",
            per_network(&|h| h.rpc_errors),
        );
        family(
            &mut text,
            "payrecon_watcher_up",
            "1 if the watcher's last round succeeded.",
            "gauge",
            per_network(&|h| u64::from(h.state == "running")),
        );
        let intents = self.intents_by_status().await?;
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
        let open = self.open_exceptions_by_kind().await?;
        family(
            &mut text,
            "payrecon_exceptions_open",
            "Open exceptions by kind.",
            "gauge",
            open.into_iter()
                .map(|(kind, n)| (format!("kind=\"{kind}\""), n as u64))
                .collect(),
        );
        let deliveries = self.webhook_counts().await?;
        family(
            &mut text,
            "payrecon_webhook_deliveries",
            "Webhook deliveries by endpoint and state.",
            "gauge",
            deliveries
                .into_iter()
                .map(|(endpoint, state, n)| {
                    (
                        format!("endpoint=\"{endpoint}\",state=\"{state}\""),
                        n as u64,
                    )
                })
                .collect(),
        );
        Ok(text)
    }
}

/// One metric family: its help, its type, then its samples.
fn family(text: &mut String, name: &str, help: &str, kind: &str, samples: Vec<(String, u64)>) {
    let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(text, "{name}{{{labels}}} {value}");
    }
}
