//! The holdings check: what the chain holds at every address a network's watcher follows,
//! against what payrecon recorded up to the watcher's cursor. It reads the watcher's own view
//! of what it follows, so it lives beside the watcher, not in the engine it drives.

use std::collections::HashMap;

use payrecon_chain_core::{Amount, Method, Network, Unexplained};

use crate::audit::Rechecker;
use crate::config::Config;
use crate::engine::Engine;
use crate::error::Error;
use crate::records::HoldingsCheck;
use crate::store;

impl Engine {
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
        let now = self.clock().now();
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
        crate::engine::open_unexplained(tx.conn(), network, &found, now, false).await?;
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
        let live = super::LiveView::load(self, network)
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
}
