//! The hand-off to the merchant's wallet over HTTP.

use axum::extract::{Path, State};
use payrecon_chain_core::Network;

use serde::Deserialize;

use super::books::PeriodQuery;
use super::{ApiQuery, ApiResult, ApiState, Finance, ok};
use crate::books::Period;
use crate::error::Error;
use crate::wallet::HoldingsSort;

/// `GET /v1/wallet/{network}/export`: the account's descriptors and the gap limit a wallet
/// needs (bitcoin, litecoin).
pub(super) async fn export(
    State(state): State<ApiState>,
    _: Finance,
    Path(network): Path<String>,
) -> ApiResult {
    let network: Network = network
        .parse()
        .map_err(|e| Error::InvalidInput(format!("network: {e}")))?;
    ok(&state.engine.wallet_export(network).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HoldingsQuery {
    network: Option<String>,
    sort: Option<String>,
    all: Option<bool>,
    offset: Option<u64>,
    limit: Option<usize>,
}

/// `GET /v1/holdings?network=&sort=amount|address|index&all=&offset=&limit=`: totals per asset
/// and a page of the funded addresses with their derivation paths.
pub(super) async fn holdings(
    State(state): State<ApiState>,
    _: Finance,
    ApiQuery(query): ApiQuery<HoldingsQuery>,
) -> ApiResult {
    let network = query
        .network
        .as_deref()
        .map(str::parse::<Network>)
        .transpose()
        .map_err(|e| Error::InvalidInput(format!("network: {e}")))?;
    let sort = query
        .sort
        .as_deref()
        .unwrap_or("amount")
        .parse::<HoldingsSort>()?;
    let view = state
        .engine
        .holdings(
            network,
            sort,
            query.all.unwrap_or(false),
            query.offset.unwrap_or(0),
            query.limit.unwrap_or(100),
        )
        .await?;
    ok(&view)
}

/// `GET /v1/reports/holdings?period=2026-11`: the holdings roll-forward of a month.
pub(super) async fn rollforward(
    State(state): State<ApiState>,
    _: Finance,
    ApiQuery(query): ApiQuery<PeriodQuery>,
) -> ApiResult {
    let period: Period = query.period.parse()?;
    ok(&state.engine.holdings_rollforward(period).await?)
}
