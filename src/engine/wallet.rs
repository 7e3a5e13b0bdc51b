//! The hand-off to the merchant's wallet: what it imports to find every payment.

use chrono::{DateTime, Utc};
use payrecon_chain_core::{Method, Network};

use crate::engine::Engine;
use crate::error::Error;
use crate::records::{AssetRollForward, FundedIndexes, HoldingsCheck};
use crate::store;
use std::collections::BTreeMap;

use crate::audit::Rechecker;
use crate::books::Period;
use crate::config::Config;
use crate::wallet::{
    HoldingDifference, HoldingsRollForward, HoldingsSort, HoldingsVerification, HoldingsView,
    MAX_HOLDINGS_PAGE, SweepList, WalletExport, asset_rollforwards, holdings_view, usd_value,
};

impl Engine {
    /// Records each derived-key network's configured key as its current key, and adds the keys
    /// the database knows it had before to `settings`: a key configured before is retired here,
    /// said once in the log, and stays watched and exported.
    pub async fn register_keys(
        &self,
        settings: &mut crate::payments::PaymentSettings,
    ) -> Result<(), Error> {
        let now_ms = self.now().timestamp_millis();
        let networks: Vec<Network> = settings.keys.keys().copied().collect();
        for network in networks {
            let current = &settings.keys[&network].current;
            let row = store::keys::KeyRow {
                key_id: current.key_id.clone(),
                network: network.as_str().to_owned(),
                account_key: current.account_key.clone(),
                key_origin: current.key_origin.clone(),
                state: "current".into(),
                first_seen_ms: now_ms,
                retired_at_ms: None,
            };
            let mut tx = self.db().begin_write().await?;
            let retired = store::keys::make_current(tx.conn(), &row, now_ms).await?;
            let rows = store::keys::keys_of(tx.conn(), network.as_str()).await?;
            tx.commit().await?;
            for old in &retired {
                tracing::warn!(
                    %network,
                    retired = %old.key_id,
                    current = %row.key_id,
                    "the configured key changed: the old key is retired, its addresses stay watched and `wallet export` still gives it"
                );
            }
            settings.add_retired(network, &rows)?;
        }
        Ok(())
    }

    /// The output descriptors of `network`'s current account key (Bitcoin or Litecoin) with
    /// the gap limit a wallet needs to find every address payrecon handed out and was paid on.
    pub async fn wallet_export(&self, network: Network) -> Result<WalletExport, Error> {
        let mut exports = self.wallet_exports(network, None).await?;
        Ok(exports.remove(0))
    }

    /// [`Engine::wallet_export`] for every key `network` ever handed out from, the current one
    /// first, or for `key_id` alone: a merchant who changed wallets imports each.
    pub async fn wallet_exports(
        &self,
        network: Network,
        key_id: Option<&str>,
    ) -> Result<Vec<WalletExport>, Error> {
        let settings = self.payment_settings();
        let keys = settings
            .keys
            .get(&network)
            .filter(|keys| keys.current.wallet.is_some())
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "network {network}: no Bitcoin-family account is configured for it (wallet export covers bitcoin and litecoin)"
                ))
            })?;
        let chosen: Vec<_> = keys
            .all()
            .filter(|key| key_id.is_none_or(|id| key.key_id == id))
            .collect();
        if chosen.is_empty() {
            let known: Vec<&str> = keys.all().map(|key| key.key_id.as_str()).collect();
            return Err(Error::InvalidInput(format!(
                "key {:?} is not a key of {network}: its keys are {}",
                key_id.unwrap_or_default(),
                known.join(", ")
            )));
        }
        let mut exports = Vec::new();
        for key in chosen {
            let Some(wallet) = &key.wallet else { continue };
            let descriptors = wallet
                .descriptors()
                .map_err(|e| Error::Config(format!("networks.{network}: {e}")))?;
            let funded = self.funded_indexes(network, &key.key_id).await?;
            let state = if key.key_id == keys.current.key_id {
                crate::keys::KeyState::Current
            } else {
                crate::keys::KeyState::Retired
            };
            exports.push(WalletExport::new(
                network,
                (&key.key_id, state),
                wallet,
                descriptors,
                &funded,
            ));
        }
        Ok(exports)
    }

    /// What each address holds, totals per asset and one page of the funded addresses
    /// (`network` alone, or every network): confirmed receipts less confirmed outflows.
    pub async fn holdings(
        &self,
        network: Option<Network>,
        sort: HoldingsSort,
        include_empty: bool,
        offset: u64,
        limit: usize,
    ) -> Result<HoldingsView, Error> {
        let limit = limit.clamp(1, MAX_HOLDINGS_PAGE);
        let mut conn = self.db().pool().acquire().await?;
        let rows =
            store::wallet::holdings(&mut conn, network.map(|n| n.as_str()), i64::MAX).await?;
        drop(conn);
        holdings_view(
            rows,
            &self.payment_settings().keys,
            sort,
            include_empty,
            offset,
            limit,
        )
    }

    /// The holdings roll-forward of `period` per network and asset: opening, received, sent
    /// to the treasury and elsewhere, fees and closing, checked against what the addresses held
    /// at its end (summed address by address), with fair values at its start and end.
    pub async fn holdings_rollforward(&self, period: Period) -> Result<HoldingsRollForward, Error> {
        let (from, to) = self.period_bounds(period);
        let mut conn = self.db().pool().acquire().await?;
        let (assets, held) = asset_rollforwards_of(&mut conn, (from, to)).await?;
        drop(conn);
        let mut report = HoldingsRollForward::new(period, (from, to), assets);
        report.closing_per_key = holdings_view(
            held,
            &self.payment_settings().keys,
            HoldingsSort::Address,
            false,
            0,
            1,
        )?
        .key_totals;
        let Some(rates) = self.payment_settings().rates.as_deref() else {
            return Ok(report);
        };
        let now = self.now();
        for asset in &mut report.assets {
            let Ok(method) = asset.asset.parse::<Method>() else {
                continue;
            };
            if let Ok(rate) = rates.market_rate(method.asset(), from.min(now), now).await {
                asset.rate_at_start_usd = Some(rate.usd_per_unit.to_string());
                asset.opening_value_usd = usd_value(method, &asset.opening, rate.usd_per_unit);
            }
            if let Ok(rate) = rates.market_rate(method.asset(), to.min(now), now).await {
                asset.rate_at_end_usd = Some(rate.usd_per_unit.to_string());
                asset.closing_value_usd = usd_value(method, &asset.closing, rate.usd_per_unit);
            }
        }
        Ok(report)
    }

    /// Every funded address's holding at the end of `period`, checked against its chain at
    /// the period's last block through the configured source (the Bitcoin family, through an
    /// Electrum server, so far): every difference named. A network that cannot be checked
    /// says why.
    pub async fn verify_holdings(
        &self,
        config: &Config,
        period: Period,
    ) -> Result<Vec<HoldingsVerification>, Error> {
        let (_, to) = self.period_bounds(period);
        let mut conn = self.db().pool().acquire().await?;
        let rows = store::wallet::holdings(&mut conn, None, to.timestamp_millis()).await?;
        drop(conn);
        let mut by_network: BTreeMap<String, Vec<(String, String, i128)>> = BTreeMap::new();
        for row in rows {
            by_network
                .entry(row.network)
                .or_default()
                .push((row.address, row.asset, row.amount));
        }
        let mut verifications = Vec::new();
        for (network_name, rows) in by_network {
            let mut verification = HoldingsVerification {
                network: network_name.clone(),
                block: None,
                addresses_checked: 0,
                differences: Vec::new(),
                unchecked: None,
            };
            let network: Network = network_name
                .parse()
                .map_err(|_| Error::Report(format!("unknown network {network_name}")))?;
            // What payrecon holds in custody: the network's methods (a fake token is no asset).
            let held: Vec<(&(String, String, i128), Method)> = rows
                .iter()
                .filter_map(|row| {
                    let method = row.1.parse::<Method>().ok()?;
                    (method.network() == network).then_some((row, method))
                })
                .collect();
            let asked: Vec<(String, Method)> = held
                .iter()
                .map(|((address, ..), method)| (address.clone(), *method))
                .collect();
            let checked = match Rechecker::for_network(&config.networks, network) {
                Ok(mut checker) => checker
                    .balances_at(&asked, to.timestamp_millis())
                    .await
                    .map_err(|e| e.to_string()),
                Err(why) => Err(why),
            };
            match checked {
                Ok((block, balances)) => {
                    verification.block = Some(block);
                    verification.addresses_checked = held
                        .iter()
                        .map(|((address, ..), _)| address)
                        .collect::<std::collections::BTreeSet<_>>()
                        .len() as u64;
                    for (((address, asset, ours), _), chain) in held.into_iter().zip(balances) {
                        if u128::try_from(*ours).ok() != Some(chain.base_units()) {
                            verification.differences.push(HoldingDifference {
                                address: address.clone(),
                                asset: asset.clone(),
                                payrecon: ours.to_string(),
                                chain: chain.to_string(),
                            });
                        }
                    }
                }
                Err(why) => verification.unchecked = Some(why),
            }
            verifications.push(verification);
        }
        Ok(verifications)
    }

    /// Every network's last holdings check.
    pub async fn holdings_checks(&self) -> Result<Vec<HoldingsCheck>, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(store::wallet::holdings_checks(&mut conn).await?)
    }

    /// What to sweep from every funded address of `network` (Ethereum, Tron), with the fees
    /// each sweep needs at the node's prices now and the native coin to send first.
    pub async fn sweep_list(&self, config: &Config, network: Network) -> Result<SweepList, Error> {
        if !matches!(network, Network::Ethereum | Network::Tron) {
            return Err(Error::InvalidInput(format!(
                "network {network}: the sweep list covers ethereum and tron; Bitcoin-family wallets import the descriptors of `wallet export`"
            )));
        }
        let mut checker =
            Rechecker::for_network(&config.networks, network).map_err(Error::InvalidInput)?;
        let fees = checker
            .sweep_fees()
            .await
            .map_err(|e| Error::Chain(format!("{network} fees: {e}")))?;
        let mut conn = self.db().pool().acquire().await?;
        let rows = store::wallet::holdings(&mut conn, Some(network.as_str()), i64::MAX).await?;
        drop(conn);
        SweepList::new(network, rows, &fees)
    }

    /// How `network`'s current account key handed out receive indexes and which were paid.
    async fn funded_indexes(&self, network: Network, key_id: &str) -> Result<FundedIndexes, Error> {
        let mut conn = self.db().pool().acquire().await?;
        Ok(store::wallet::funded_indexes(&mut conn, network.as_str(), key_id).await?)
    }
}

/// Each asset's holdings roll-forward over `[from, to)`, in base units: what the period
/// report stores and `Engine::holdings_rollforward` values; with the addresses' holdings at
/// `to` it was checked against, which the latter also totals per key.
pub(super) async fn asset_rollforwards_of(
    conn: &mut sqlx::AnyConnection,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
) -> Result<(Vec<AssetRollForward>, Vec<store::wallet::HoldingRow>), Error> {
    let (from_ms, to_ms) = (from.timestamp_millis(), to.timestamp_millis());
    let before = store::wallet::holding_movements(conn, i64::MIN, from_ms).await?;
    let during = store::wallet::holding_movements(conn, from_ms, to_ms).await?;
    let held = store::wallet::holdings(conn, None, to_ms).await?;
    Ok((asset_rollforwards(&before, &during, &held), held))
}
