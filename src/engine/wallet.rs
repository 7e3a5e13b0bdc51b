//! The hand-off to the merchant's wallet: what it imports to find every payment.

use chrono::{DateTime, Utc};
use payrecon_chain_core::{Amount, Method, Network, Unexplained};

use crate::engine::Engine;
use crate::error::Error;
use crate::records::{AssetRollForward, FundedIndexes, HoldingsCheck};
use crate::store;
use std::collections::{BTreeMap, HashMap};

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
            let checked = match Rechecker::for_network(config, network) {
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

    /// The holdings check: every address payrecon watches on Ethereum (open and recently
    /// expired intents, funded addresses, each key's look-ahead window) read on the chain at
    /// the block its watcher's cursor reached, in batches, and compared with what payrecon
    /// recorded up to exactly there. A balance that no receipt or outflow explains (ETH that
    /// reached an address while nothing watched it) becomes an `unexplained_balance` exception
    /// naming address, key, index, amount and block. Its result is kept for `payrecon stuck`
    /// and `/metrics`; `payrecon serve` runs it every `payments.holdings_check_minutes`.
    ///
    /// The Bitcoin family's watchers read every watched script's whole history, and Tron and
    /// Solana sources cannot read balances at a past block: Ethereum is the chain it checks.
    pub async fn check_holdings(&self, config: &Config) -> Result<Vec<HoldingsCheck>, Error> {
        let mut checks = Vec::new();
        let network = Network::Ethereum;
        if config
            .networks
            .ethereum
            .as_ref()
            .is_none_or(|ethereum| ethereum.rpc_url.is_none())
        {
            return Ok(checks);
        }
        let now = self.now();
        let mut check = HoldingsCheck {
            network: network.to_string(),
            checked_at: now,
            block_height: None,
            addresses_checked: 0,
            unexplained: 0,
            error: None,
        };
        let found = match self.read_holdings(config, network, &mut check).await {
            Ok(found) => found,
            Err(why) => {
                check.error = Some(payrecon_chain_core::excerpt(&why).into_owned());
                Vec::new()
            }
        };
        check.unexplained = found.len() as u64;
        let mut tx = self.db().begin_write().await?;
        super::watchers::open_unexplained(tx.conn(), network, &found, now, false).await?;
        store::wallet::put_holdings_check(tx.conn(), &check).await?;
        tx.commit().await?;
        checks.push(check);
        Ok(checks)
    }

    /// What the chain holds at `network`'s watched addresses at its watcher's cursor that
    /// payrecon's records do not explain, or why it cannot be read.
    async fn read_holdings(
        &self,
        config: &Config,
        network: Network,
        check: &mut HoldingsCheck,
    ) -> Result<Vec<Unexplained>, String> {
        let live = crate::watcher::LiveView::load(self, network)
            .await
            .map_err(|e| e.to_string())?;
        let addresses: Vec<String> = live
            .view()
            .watch_keys
            .iter()
            .map(|key| key.to_string())
            .collect();
        drop(live);
        let (cursor, rows) = store::wallet::holdings_at_cursor(self.db().pool(), network)
            .await
            .map_err(|e| e.to_string())?;
        let height = cursor.ok_or("its watcher has read no block yet")?;
        let methods: Vec<Method> = Method::ALL
            .into_iter()
            .filter(|method| method.network() == network)
            .collect();
        let asked: Vec<(String, Method)> = addresses
            .iter()
            .flat_map(|address| methods.iter().map(move |m| (address.clone(), *m)))
            .collect();
        let mut checker = Rechecker::for_network(config, network)?;
        let recorded: HashMap<(&str, &str), u128> = rows
            .iter()
            .map(|row| {
                let amount = u128::try_from(row.amount).unwrap_or(0);
                ((row.address.as_str(), row.asset.as_str()), amount)
            })
            .collect();
        let recorded_amount = |address: &str, method: Method| {
            recorded.get(&(address, method.id())).copied().unwrap_or(0)
        };
        let (block, mut balances) = checker
            .balances_at_height(&asked, height)
            .await
            .map_err(|e| e.to_string())?;
        // What differs is read again, and counts only when the chain says the same twice: a
        // node can answer a read at its newest block while the next is being written.
        let differing: Vec<usize> = (0..asked.len())
            .filter(|i| {
                let (address, method) = &asked[*i];
                let ours = recorded_amount(address, *method);
                balances[*i].base_units() != ours
            })
            .collect();
        if !differing.is_empty() {
            let again: Vec<(String, Method)> =
                differing.iter().map(|i| asked[*i].clone()).collect();
            let (_, reread) = checker
                .balances_at_height(&again, height)
                .await
                .map_err(|e| e.to_string())?;
            for (i, balance) in differing.into_iter().zip(reread) {
                if balance != balances[i] {
                    return Err(format!(
                        "the node answered {} and then {} for {} at block {height}: read again at the next check",
                        balances[i], balance, asked[i].0
                    ));
                }
                balances[i] = balance;
            }
        }
        check.block_height = Some(block.height);
        check.addresses_checked = addresses.len() as u64;
        let mut found = Vec::new();
        for ((address, method), chain) in asked.iter().zip(balances) {
            let ours = recorded_amount(address, *method);
            let chain = chain.base_units();
            if chain == ours {
                continue;
            }
            found.push(Unexplained {
                address: address.clone(),
                method: *method,
                block: block.clone(),
                arrived: chain > ours,
                amount: Amount::from_base_units(chain.abs_diff(ours)),
                reason: format!(
                    "the holdings check read {} on the chain where payrecon recorded {}: no \
                     receipt or outflow it recorded explains the difference (money that came \
                     while nothing watched the address)",
                    method.format_amount(Amount::from_base_units(chain)),
                    method.format_amount(Amount::from_base_units(ours))
                ),
            });
        }
        Ok(found)
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
        let mut checker = Rechecker::for_network(config, network).map_err(Error::InvalidInput)?;
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
