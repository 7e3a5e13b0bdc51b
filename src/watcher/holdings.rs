//! The holdings check: what the chain holds at every address a network's watcher follows,
//! against what payrecon recorded up to the watcher's cursor, and what books the difference.
//! It reads the watcher's own view of what it follows, so it lives beside the watcher, not in
//! the engine it drives.

use std::collections::HashMap;

use payrecon_chain_core::{Amount, Method, Network, Unexplained};

use crate::audit::Rechecker;
use crate::config::Config;
use crate::engine::Engine;
use crate::error::Error;
use crate::records::{ExceptionRecord, HoldingsCheck};
use crate::store::keys::UnissuedRow;
use crate::store::wallet::HoldingsDifference;
use crate::store::{self, WriteTx, payments};

/// What one read of the chain found: each difference, and the key and index of the watched
/// addresses that lie ahead of their key's counter (no intent names them).
#[derive(Default)]
struct Found {
    differences: Vec<Unexplained>,
    lookahead: HashMap<String, (String, u32)>,
}

impl Engine {
    /// The holdings check: every address payrecon watches on Ethereum (open and recently
    /// expired intents, funded addresses, each key's look-ahead window) read on the chain at
    /// the block its watcher's cursor reached, in batches, and compared with what payrecon
    /// recorded up to exactly there. A balance no receipt or outflow explains (ETH that reached
    /// an address while nothing watched it) is booked so that holdings and their roll-forward
    /// equal the chain, and becomes a `holdings_difference` exception naming address, key,
    /// index, amount and block, holding the money for an operator. Its result is kept for
    /// `payrecon stuck` and `/metrics`; `payrecon serve` runs it every
    /// `payments.holdings_check_minutes`.
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
                Found::default()
            }
        };
        check.unexplained = found.differences.len() as u64;
        let mut tx = self.db().begin_write().await?;
        book_differences(&mut tx, network, &found, now).await?;
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
    ) -> Result<Found, String> {
        let live = super::LiveView::load(self, network)
            .await
            .map_err(|e| e.to_string())?;
        let addresses: Vec<String> = live
            .view()
            .watch_keys
            .iter()
            .map(|key| key.to_string())
            .collect();
        let lookahead: HashMap<String, (String, u32)> = addresses
            .iter()
            .filter_map(|address| Some((address.clone(), live.lookahead_owner(address)?)))
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
        let mut checker = Rechecker::for_network(&config.networks, network)?;
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
                     receipt or outflow it recorded explains the difference",
                    method.format_amount(Amount::from_base_units(chain)),
                    method.format_amount(Amount::from_base_units(ours))
                ),
            });
        }
        Ok(Found {
            differences: found,
            lookahead,
        })
    }
}

/// Books each difference the check found, once (a difference is named by its address, asset
/// and block, and a check that finds it booked finds none): the entry that brings custody to
/// the chain, the row that brings holdings there, and the exception that holds the money for
/// an operator. Money found ahead of a key's counter also moves the counter past it, as the
/// watcher does, so its address is never handed out.
async fn book_differences(
    tx: &mut WriteTx,
    network: Network,
    found: &Found,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), Error> {
    let addresses: Vec<&str> = found
        .differences
        .iter()
        .map(|item| item.address.as_str())
        .collect();
    let intents = payments::intents_by_watch_keys(tx.conn(), network, &addresses).await?;
    let backend = tx.backend();
    for item in &found.differences {
        let intent = intents.iter().find(|i| i.watch_key == item.address);
        let ahead = match intent {
            Some(_) => None,
            None => found.lookahead.get(&item.address),
        };
        if let (Some((key_id, index)), true) = (ahead, item.arrived) {
            let row = UnissuedRow {
                network: network.as_str().to_owned(),
                address: item.address.clone(),
                key_id: key_id.clone(),
                derivation_index: *index,
            };
            store::keys::record_unissued(tx.conn(), backend, &row, now.timestamp_millis()).await?;
        }
        let difference = HoldingsDifference {
            id: format!(
                "holdings_difference:{network}:{}:{}:{}",
                item.address, item.method, item.block.height
            ),
            network: network.as_str().to_owned(),
            address: item.address.clone(),
            asset: item.method.id().to_owned(),
            found: item.arrived,
            amount_base: item.amount.base_units(),
            block_height: item.block.height,
            block_hash: item.block.hash.clone(),
            key_id: intent
                .map(|i| i.key_id.clone())
                .or(ahead.map(|a| a.0.clone())),
            derivation_index: intent.map(|i| i.derivation_index).or(ahead.map(|a| a.1)),
        };
        if !store::wallet::put_holdings_difference(tx.conn(), &difference, now.timestamp_millis())
            .await?
        {
            continue;
        }
        let entry = crate::wallet::difference_entry(&difference, item.method);
        entry.validate()?;
        store::ledger::post_batch(tx, &[entry], now).await??;
        let record = difference_exception(item, &difference, intent, ahead, now);
        if payments::open_exception(tx.conn(), &record).await? {
            tracing::warn!(%network, address = %item.address, block = item.block.height, "the holdings check booked a difference from the chain: an exception for operators");
        }
    }
    Ok(())
}

/// The exception that holds a booked difference for an operator, under the difference's id.
fn difference_exception(
    item: &Unexplained,
    difference: &HoldingsDifference,
    intent: Option<&crate::intent::PaymentIntent>,
    ahead: Option<&(String, u32)>,
    now: chrono::DateTime<chrono::Utc>,
) -> ExceptionRecord {
    let booked = if item.arrived {
        "It is booked into custody and held in suspense:unreconciled: say whose it is \
         (accept it as the order's payment, credit a balance, mark it refunded or the \
         merchant's own)"
    } else {
        "It is booked as sent elsewhere: find the transaction that took it"
    };
    ExceptionRecord {
        id: difference.id.clone(),
        kind: "holdings_difference".into(),
        intent_id: intent.map(|i| i.id.clone()),
        order_ref: intent.map(|i| i.order_ref.to_string()),
        transfer: None,
        detail: format!(
            "{} {} {} {} ({}) by block {} ({}): {}. {booked}; see the operators' guide.",
            item.method.format_amount(item.amount),
            item.method.asset(),
            if item.arrived {
                "found at"
            } else {
                "missing from"
            },
            item.address,
            crate::engine::place_of(intent, ahead),
            item.block.height,
            item.block.hash,
            item.reason
        ),
        opened_at: now,
        resolved_at: None,
        resolution: None,
    }
}
