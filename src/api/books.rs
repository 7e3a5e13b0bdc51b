//! Finance's books over HTTP: period close, reopen and status, the period's figures, the
//! roll-forward, the unvalued entries, and the journal exports as downloads.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::IntoResponse;
use serde::Deserialize;
use tokio::io::AsyncWrite;

use super::{ApiError, ApiJson, ApiQuery, ApiResult, ApiState, Authorized, Finance, ok};
use crate::books::{JournalFormat, Period};
use crate::error::Error;

fn period_of(text: &str) -> Result<Period, ApiError> {
    Ok(text.parse::<Period>()?)
}

/// `POST /v1/periods/{period}/close`.
pub(super) async fn close(
    State(state): State<ApiState>,
    Authorized(caller): Finance,
    Path(period): Path<String>,
) -> ApiResult {
    let report = state
        .engine
        .close_period(period_of(&period)?, &caller.name)
        .await?;
    ok(&report)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReopenRequest {
    reason: String,
}

/// `POST /v1/periods/{period}/reopen` with `{"reason": …}`.
pub(super) async fn reopen(
    State(state): State<ApiState>,
    Authorized(caller): Finance,
    Path(period): Path<String>,
    ApiJson(request): ApiJson<ReopenRequest>,
) -> ApiResult {
    let status = state
        .engine
        .reopen_period(period_of(&period)?, &caller.name, &request.reason)
        .await?;
    ok(&status)
}

/// `GET /v1/periods/{period}`.
pub(super) async fn status(
    State(state): State<ApiState>,
    _: Finance,
    Path(period): Path<String>,
) -> ApiResult {
    ok(&state.engine.period_status(period_of(&period)?).await?)
}

/// `GET /v1/periods/{period}/report`: a closed period's stored figures, byte for byte.
pub(super) async fn report(
    State(state): State<ApiState>,
    _: Finance,
    Path(period): Path<String>,
) -> ApiResult {
    let text = state.engine.period_report(period_of(&period)?).await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], text).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PeriodQuery {
    pub(super) period: String,
}

/// `GET /v1/reports/rollforward?period=2026-11`.
pub(super) async fn rollforward(
    State(state): State<ApiState>,
    _: Finance,
    ApiQuery(query): ApiQuery<PeriodQuery>,
) -> ApiResult {
    ok(&state.engine.rollforward(period_of(&query.period)?).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UnvaluedQuery {
    limit: Option<usize>,
}

/// `GET /v1/books/unvalued`: entries without a fiat value, which hold back a close.
pub(super) async fn unvalued(
    State(state): State<ApiState>,
    _: Finance,
    ApiQuery(query): ApiQuery<UnvaluedQuery>,
) -> ApiResult {
    let (count, entries) = state
        .engine
        .unvalued_entries(query.limit.unwrap_or(100))
        .await?;
    ok(&serde_json::json!({ "count": count, "entries": entries }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExportQuery {
    period: String,
    format: Option<String>,
    /// Xero only: which file of at most 300 lines (1 first).
    part: Option<u32>,
}

/// `GET /v1/exports/journal?period=&format=&part=`: one export file, streamed as a download.
/// Past a Xero export's last part the body is empty.
pub(super) async fn journal(
    State(state): State<ApiState>,
    _: Finance,
    ApiQuery(query): ApiQuery<ExportQuery>,
) -> ApiResult {
    let period = period_of(&query.period)?;
    let format: JournalFormat = query.format.as_deref().unwrap_or("generic").parse()?;
    let part = query.part.unwrap_or(1);
    if part == 0 || (part > 1 && format != JournalFormat::Xero) {
        return Err(Error::InvalidInput(
            "part counts from 1; only Xero exports have more than one".into(),
        )
        .into());
    }
    let content_type = match format {
        JournalFormat::Datev => "text/csv; charset=windows-1252",
        _ => "text/csv; charset=utf-8",
    };
    let disposition = format!(
        "attachment; filename=\"{}\"",
        format.file_name(period, part)
    );
    // The export streams into the response through a pipe: memory stays flat.
    let (writer, reader) = tokio::io::duplex(64 * 1024);
    let engine = state.engine.clone();
    tokio::spawn(async move {
        let mut writer = Some(writer);
        let exported = engine
            .export_journal(period, format, |n| {
                let out: Box<dyn AsyncWrite + Unpin + Send> = match (n == part, writer.take()) {
                    (true, Some(w)) => Box::new(w),
                    _ => Box::new(tokio::io::sink()),
                };
                Ok(out)
            })
            .await;
        if let Err(error) = exported {
            tracing::warn!(%error, "journal export over HTTP stopped");
        }
    });
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(reader));
    Ok((
        [
            (header::CONTENT_TYPE, content_type.to_owned()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        body,
    )
        .into_response())
}
