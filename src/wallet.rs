//! Where the money is after it arrives: what each watched address holds, and the hand-off to
//! the merchant's wallet that collects it.
//!
//! payrecon hands out one receive index per payment intent and most intents are never paid.
//! A wallet restored from the account key stops looking after a run of unused addresses (its
//! gap limit), so a paid address far past the last paid one stays invisible to it. The
//! export says how wide that run is, and the stuck view warns before a wallet misses money.

use std::collections::BTreeMap;

use payrecon_chain_bitcoin::{WalletDescriptors, origin_text};
use payrecon_chain_core::{Amount, Method, Network, ReceivedAsset, SweepFees};
use serde::Serialize;

use crate::keys::{KeyState, NetworkKeys, UtxoWallet, UtxoWallets};
use crate::ledger::{Account, Currency, EntryKind, NewEntry, Posting, SuspenseReason};
use crate::records::{AssetRollForward, FundedIndexes};
use crate::store::StoreError;
use crate::store::wallet::{HoldingRow, HoldingsDifference, MovementRow};

/// Addresses added to the needed gap limit in the recommendation: room for the unpaid
/// intents handed out while the wallet is being set up.
pub const GAP_MARGIN: u32 = 20;

/// What `payrecon wallet export` prints: enough for Bitcoin Core, Litecoin Core, Sparrow or
/// Electrum to find every payment payrecon credited.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WalletExport {
    /// bitcoin or litecoin.
    pub network: Network,
    /// The account key (`<chain>:<fingerprint>`).
    pub key_id: String,
    /// `current`, or `retired` for a key configured before: its addresses stay watched.
    pub state: KeyState,
    /// The receive branch's descriptor, with its checksum.
    pub receive_descriptor: String,
    /// The change branch's descriptor, with its checksum.
    pub change_descriptor: String,
    /// `[fingerprint/path]`, when configured.
    pub key_origin: Option<String>,
    /// The highest receive index payrecon handed out (`None`: none yet).
    pub highest_index: Option<u32>,
    /// Receive addresses handed out.
    pub addresses_handed_out: u64,
    /// Of them, addresses that received anything.
    pub funded_addresses: u64,
    /// The longest run of unpaid indexes before a paid one, counted from index 0.
    pub largest_unfunded_run: u32,
    /// The smallest gap limit with which a wallet finds every paid address.
    pub gap_limit_needed: u32,
    /// [`WalletExport::gap_limit_needed`] plus [`GAP_MARGIN`].
    pub gap_limit_recommended: u32,
    /// The range to import for Bitcoin Core's `importdescriptors`: every handed-out index and
    /// the margin past it.
    pub import_range: [u32; 2],
    /// What to watch out for.
    pub notes: Vec<String>,
}

impl WalletExport {
    /// The export of `wallet` on `network` with its `descriptors`, given what was handed out
    /// and paid.
    pub fn new(
        network: Network,
        (key_id, state): (&str, KeyState),
        wallet: &UtxoWallet,
        descriptors: WalletDescriptors,
        funded: &FundedIndexes,
    ) -> WalletExport {
        let gap_limit_needed = gap_limit_needed(funded.largest_unfunded_run);
        let mut notes = Vec::new();
        if wallet.origin.is_none() {
            notes.push(format!(
                "no key origin: set networks.{network}.key_origin = \"[fingerprint/84h/coin h/0h]\" for a wallet that signs with a hardware key"
            ));
        }
        if gap_limit_needed > wallet.gap_limit_warning {
            notes.push(format!(
                "a wallet with the default gap limit of 20 misses payments: set its gap limit to at least {gap_limit_needed}"
            ));
        }
        let top = funded.highest_index.unwrap_or(0);
        WalletExport {
            network,
            key_id: key_id.to_owned(),
            state,
            receive_descriptor: descriptors.receive,
            change_descriptor: descriptors.change,
            key_origin: wallet.origin.as_ref().map(origin_text),
            highest_index: funded.highest_index,
            addresses_handed_out: funded.handed_out,
            funded_addresses: funded.funded,
            largest_unfunded_run: funded.largest_unfunded_run,
            gap_limit_needed,
            gap_limit_recommended: gap_limit_needed.saturating_add(GAP_MARGIN),
            import_range: [0, top.saturating_add(GAP_MARGIN)],
            notes,
        }
    }

    /// The export as `payrecon wallet export` prints it.
    pub fn text(&self) -> String {
        let mut out = format!(
            "network: {}\nkey: {} ({})\nreceive: {}\nchange: {}\nkey origin: {}\nhighest index handed out: {}\naddresses handed out: {}\npaid addresses: {}\nlongest unpaid run: {}\ngap limit needed: {}\ngap limit recommended: {}\nimportdescriptors range: [{}, {}]\n",
            self.network,
            self.key_id,
            match self.state {
                KeyState::Current => "current",
                KeyState::Retired => "retired: hands out no new address",
            },
            self.receive_descriptor,
            self.change_descriptor,
            self.key_origin.as_deref().unwrap_or("(not configured)"),
            self.highest_index
                .map_or_else(|| "none".to_owned(), |i| i.to_string()),
            self.addresses_handed_out,
            self.funded_addresses,
            self.largest_unfunded_run,
            self.gap_limit_needed,
            self.gap_limit_recommended,
            self.import_range[0],
            self.import_range[1],
        );
        for note in &self.notes {
            out.push_str(&format!("note: {note}\n"));
        }
        out
    }
}

/// A wallet with gap limit `g` stops after `g` unused addresses in a row, so it steps over a
/// run of `run` unpaid ones only when `g > run`.
pub(crate) fn gap_limit_needed(largest_unfunded_run: u32) -> u32 {
    largest_unfunded_run.saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_unpaid_addresses_needs_one_more_than_its_length() {
        assert_eq!(gap_limit_needed(0), 1);
        assert_eq!(gap_limit_needed(19), 20);
        assert_eq!(gap_limit_needed(u32::MAX), u32::MAX);
    }

    fn movement(kind: &str, amount: i128) -> MovementRow {
        MovementRow {
            network: "ethereum".into(),
            asset: "eth".into(),
            kind: kind.into(),
            amount,
        }
    }

    #[test]
    fn what_the_holdings_check_found_and_missed_rolls_forward() {
        // Before: 100 received, 30 found by a check. During: 50 received, 20 sent elsewhere,
        // 5 found, 8 missing. Closing: 130 + 50 + 5 - 20 - 8 = 157.
        let before = [movement("received", 100), movement("found", 30)];
        let during = [
            movement("received", 50),
            movement("external", 20),
            movement("found", 5),
            movement("missing", 8),
        ];
        let held = [HoldingRow {
            network: "ethereum".into(),
            address: "0xabc".into(),
            asset: "eth".into(),
            derivation_index: Some(0),
            amount: 157,
            key_id: None,
        }];
        let [eth] = asset_rollforwards(&before, &during, &held)
            .try_into()
            .unwrap();
        assert_eq!(
            [
                &eth.opening,
                &eth.found_by_check,
                &eth.missing_by_check,
                &eth.closing
            ]
            .map(String::as_str),
            ["130", "5", "8", "157"]
        );
        assert!(eth.closes);
    }

    #[test]
    fn a_found_difference_is_held_in_suspense_and_a_missing_one_sent_elsewhere() {
        let mut difference = HoldingsDifference {
            id: "holdings_difference:ethereum:0xabc:eth:7".into(),
            network: "ethereum".into(),
            address: "0xabc".into(),
            asset: "eth".into(),
            found: true,
            amount_base: 42,
            block_height: 7,
            block_hash: "0x07".into(),
            key_id: None,
            derivation_index: None,
        };
        let found = difference_entry(&difference, Method::Eth);
        found.validate().unwrap();
        assert_eq!(found.idempotency_key, difference.id);
        assert_eq!(
            found
                .postings
                .iter()
                .map(|p| (p.account.to_string(), p.amount_minor))
                .collect::<Vec<_>>(),
            [
                ("custody:ethereum:ETH".to_owned(), 42),
                ("suspense:unreconciled".to_owned(), -42)
            ]
        );
        difference.found = false;
        let missing = difference_entry(&difference, Method::Eth);
        missing.validate().unwrap();
        assert_eq!(
            missing
                .postings
                .iter()
                .map(|p| (p.account.to_string(), p.amount_minor))
                .collect::<Vec<_>>(),
            [
                ("external:ethereum:ETH".to_owned(), 42),
                ("custody:ethereum:ETH".to_owned(), -42)
            ]
        );
    }
}

/// Addresses on one page of the holdings at most.
pub const MAX_HOLDINGS_PAGE: usize = 10_000;

/// How `payrecon holdings` and `GET /v1/holdings` order the funded addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HoldingsSort {
    /// Largest holding first (per asset's base units), the address breaking ties.
    #[default]
    Amount,
    /// By network, then address.
    Address,
    /// By network, then derivation index: the order a wallet scans in.
    Index,
}

impl HoldingsSort {
    /// The names the CLI and the API accept.
    pub const NAMES: [&'static str; 3] = ["amount", "address", "index"];
}

impl std::str::FromStr for HoldingsSort {
    type Err = crate::error::Error;

    fn from_str(text: &str) -> Result<HoldingsSort, crate::error::Error> {
        match text {
            "amount" => Ok(HoldingsSort::Amount),
            "address" => Ok(HoldingsSort::Address),
            "index" => Ok(HoldingsSort::Index),
            other => Err(crate::error::Error::InvalidInput(format!(
                "sort {other:?}: use amount, address or index"
            ))),
        }
    }
}

/// What one watched address holds of one asset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Holding {
    /// The network.
    pub network: String,
    /// The address (for Solana Pay the merchant recipient).
    pub address: String,
    /// The asset: a method id, or `token:<contract>` for a token payrecon does not accept.
    pub asset: String,
    /// Base units, as text (wei exceed a JSON number).
    pub amount: String,
    /// The same in whole coins, for a method.
    pub amount_decimal: Option<String>,
    /// The key's derivation index, when payrecon derived the address.
    pub derivation_index: Option<u32>,
    /// Its derivation path, where the chain has one.
    pub derivation_path: Option<String>,
    /// The account key that derived it (`<chain>:<fingerprint>`), when payrecon did.
    pub key_id: Option<String>,
}

/// One asset's total over the addresses of one account key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HoldingKeyTotal {
    /// The network.
    pub network: String,
    /// The key (`<chain>:<fingerprint>`).
    pub key_id: String,
    /// `current`, or `retired` for a key configured before.
    pub state: KeyState,
    /// The asset.
    pub asset: String,
    /// Base units, as text.
    pub amount: String,
    /// The same in whole coins, for a method.
    pub amount_decimal: Option<String>,
    /// Addresses holding some.
    pub addresses: u64,
}

/// One asset's total over every address that holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HoldingTotal {
    /// The network.
    pub network: String,
    /// The asset.
    pub asset: String,
    /// Base units, as text.
    pub amount: String,
    /// The same in whole coins, for a method.
    pub amount_decimal: Option<String>,
    /// Addresses holding some.
    pub addresses: u64,
}

/// Totals per asset and one page of the funded addresses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HoldingsView {
    /// Per network and asset.
    pub totals: Vec<HoldingTotal>,
    /// Per account key and asset: what a wallet that imports one key's descriptors holds.
    pub key_totals: Vec<HoldingKeyTotal>,
    /// The page's addresses, in the asked order.
    pub addresses: Vec<Holding>,
    /// Addresses holding something, over every page.
    pub address_count: u64,
    /// Pass as `offset` for the next page; `None` on the last.
    pub next_offset: Option<u64>,
    /// Addresses from which more left than payrecon saw arrive: money it never saw (the
    /// Solana recipient is the merchant's own wallet, funded before payrecon watched it or
    /// from elsewhere). Left out of the totals, never hidden: `report holdings --verify`
    /// says what the chain holds.
    pub overdrawn: Vec<Holding>,
    /// Tokens of contracts payrecon does not accept (fake "USDT", airdrop spam, poisoning),
    /// one row per contract: left out of the totals and the addresses, never beside real
    /// assets.
    pub unknown_tokens: Vec<UnknownToken>,
}

/// One token contract payrecon does not accept, as the shop's addresses received it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnknownToken {
    /// The network.
    pub network: String,
    /// The contract (`token:` taken off).
    pub contract: String,
    /// Addresses that received some.
    pub addresses: u64,
    /// What they received, in the token's base units as it claims them, as text.
    pub amount: String,
}

/// A holding's amount can never fall below zero: an outflow spends what arrived.
fn checked_amount(row: &HoldingRow) -> Result<u128, crate::error::Error> {
    u128::try_from(row.amount).map_err(|_| {
        crate::error::Error::Database(StoreError::Corrupt(format!(
            "{} {} at {} sums to {}: more left than arrived",
            row.network, row.asset, row.address, row.amount
        )))
    })
}

/// Totals and the page `offset..offset + limit` of `rows` in `sort` order; addresses holding
/// nothing (swept) are left out unless `include_empty`.
pub(crate) fn holdings_view(
    rows: Vec<HoldingRow>,
    keys: &NetworksKeys,
    sort: HoldingsSort,
    include_empty: bool,
    offset: u64,
    limit: usize,
) -> Result<HoldingsView, crate::error::Error> {
    let mut totals: BTreeMap<(String, String), (u128, u64)> = BTreeMap::new();
    let mut key_totals: BTreeMap<(String, String, String), (u128, u64)> = BTreeMap::new();
    let mut held = Vec::new();
    let mut overdrawn = Vec::new();
    let (unknown_tokens, rows) = unknown_tokens(rows);
    for row in rows {
        if row.amount < 0 {
            let mut shown = holding(0, row.clone(), keys);
            shown.amount = row.amount.to_string();
            shown.amount_decimal = None;
            overdrawn.push(shown);
            continue;
        }
        let amount = checked_amount(&row)?;
        let total = totals
            .entry((row.network.clone(), row.asset.clone()))
            .or_default();
        total.0 += amount;
        total.1 += u64::from(amount > 0);
        if let Some(key_id) = &row.key_id {
            let total = key_totals
                .entry((row.network.clone(), key_id.clone(), row.asset.clone()))
                .or_default();
            total.0 += amount;
            total.1 += u64::from(amount > 0);
        }
        if amount > 0 || include_empty {
            held.push((amount, row));
        }
    }
    match sort {
        HoldingsSort::Amount => held.sort_by(|(a, x), (b, y)| {
            b.cmp(a)
                .then_with(|| (&x.network, &x.address).cmp(&(&y.network, &y.address)))
        }),
        HoldingsSort::Address => held.sort_by(|(_, x), (_, y)| {
            (&x.network, &x.address, &x.asset).cmp(&(&y.network, &y.address, &y.asset))
        }),
        HoldingsSort::Index => held.sort_by(|(_, x), (_, y)| {
            (&x.network, x.derivation_index, &x.address, &x.asset).cmp(&(
                &y.network,
                y.derivation_index,
                &y.address,
                &y.asset,
            ))
        }),
    }
    let address_count = held.len() as u64;
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(held.len());
    let end = start.saturating_add(limit).min(held.len());
    let next_offset = (end < held.len()).then_some(end as u64);
    let addresses = held
        .drain(start..end)
        .map(|(amount, row)| holding(amount, row, keys))
        .collect();
    Ok(HoldingsView {
        totals: totals
            .into_iter()
            .map(|((network, asset), (amount, addresses))| HoldingTotal {
                amount_decimal: decimal_of(&asset, amount),
                amount: amount.to_string(),
                network,
                asset,
                addresses,
            })
            .collect(),
        key_totals: key_totals
            .into_iter()
            .map(
                |((network, key_id, asset), (amount, addresses))| HoldingKeyTotal {
                    state: key_state(keys, &network, &key_id),
                    amount_decimal: decimal_of(&asset, amount),
                    amount: amount.to_string(),
                    network,
                    key_id,
                    asset,
                    addresses,
                },
            )
            .collect(),
        addresses,
        address_count,
        next_offset,
        overdrawn,
        unknown_tokens,
    })
}

/// The rows of tokens payrecon does not accept, one total per contract, and the other rows.
fn unknown_tokens(rows: Vec<HoldingRow>) -> (Vec<UnknownToken>, Vec<HoldingRow>) {
    let mut unknown: BTreeMap<(String, String), (u128, u64)> = BTreeMap::new();
    let mut rest = Vec::with_capacity(rows.len());
    for row in rows {
        let asset = crate::store::payments::parse_asset(&row.asset)
            .ok()
            .filter(ReceivedAsset::is_unknown_token);
        match asset {
            Some(ReceivedAsset::OtherToken { contract }) => {
                let token = unknown.entry((row.network.clone(), contract)).or_default();
                token.0 = token
                    .0
                    .saturating_add(u128::try_from(row.amount).unwrap_or(0));
                token.1 += 1;
            }
            _ => rest.push(row),
        }
    }
    let unknown = unknown
        .into_iter()
        .map(|((network, contract), (amount, addresses))| UnknownToken {
            network,
            contract,
            addresses,
            amount: amount.to_string(),
        })
        .collect();
    (unknown, rest)
}

/// Each derived-key network's keys.
pub(crate) type NetworksKeys = BTreeMap<Network, NetworkKeys>;

/// Whether `key_id` is `network`'s configured key.
pub(crate) fn key_state(keys: &NetworksKeys, network: &str, key_id: &str) -> KeyState {
    let current = network
        .parse::<Network>()
        .ok()
        .and_then(|network| keys.get(&network))
        .is_some_and(|keys| keys.current.key_id == key_id);
    if current {
        KeyState::Current
    } else {
        KeyState::Retired
    }
}

fn holding(amount: u128, row: HoldingRow, keys: &NetworksKeys) -> Holding {
    let index = row.derivation_index.and_then(|i| u32::try_from(i).ok());
    let network: Option<Network> = row.network.parse().ok();
    Holding {
        amount_decimal: decimal_of(&row.asset, amount),
        amount: amount.to_string(),
        derivation_path: network
            .zip(index)
            .and_then(|(n, i)| key_path(n, i, row.key_id.as_deref(), keys)),
        derivation_index: index,
        network: row.network,
        address: row.address,
        asset: row.asset,
        key_id: row.key_id,
    }
}

/// The path of receive index `index` of `key_id` on `network` (see [`derivation_path`]).
fn key_path(
    network: Network,
    index: u32,
    key_id: Option<&str>,
    keys: &NetworksKeys,
) -> Option<String> {
    let wallet = keys
        .get(&network)
        .and_then(|keys| key_id.and_then(|id| keys.get(id)).or(Some(&keys.current)))
        .and_then(|key| key.wallet.as_ref());
    match (network, wallet) {
        (Network::Bitcoin | Network::Litecoin, Some(wallet)) => {
            Some(wallet.receive_path(i64::from(index)))
        }
        _ => derivation_path(network, index, &UtxoWallets::new()),
    }
}

/// `amount` in whole coins when `asset` is one of the shop's methods.
fn decimal_of(asset: &str, amount: u128) -> Option<String> {
    let method: Method = asset.parse().ok()?;
    Some(Amount::from_base_units(amount).to_decimal_string(method.decimals()))
}

/// Base units per method id, as text.
fn per_method(amounts: BTreeMap<Method, u128>) -> BTreeMap<String, String> {
    amounts
        .into_iter()
        .map(|(method, amount)| (method.id().to_owned(), amount.to_string()))
        .collect()
}

/// The path of receive index `index` on `network`: BIP84 below the configured origin on the
/// Bitcoin family, BIP44 `m/44'/60'/0'/0/i` and `m/44'/195'/0'/0/i` on Ethereum and Tron;
/// none on Solana, whose payments all reach the merchant recipient.
pub fn derivation_path(network: Network, index: u32, wallets: &UtxoWallets) -> Option<String> {
    match network {
        Network::Bitcoin | Network::Litecoin => wallets
            .get(&network)
            .map(|w| w.receive_path(i64::from(index))),
        Network::Ethereum => Some(format!("m/44h/60h/0h/0/{index}")),
        Network::Tron => Some(format!("m/44h/195h/0h/0/{index}")),
        Network::Solana => None,
    }
}

/// The holdings roll-forward of a period, per network and asset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HoldingsRollForward {
    /// The period.
    pub period: crate::books::Period,
    /// Its first instant.
    pub from: chrono::DateTime<chrono::Utc>,
    /// The instant after it.
    pub to: chrono::DateTime<chrono::Utc>,
    /// Per network and asset.
    pub assets: Vec<AssetRollForward>,
    /// What the addresses of each account key held at the period's end, per asset: what each
    /// key's wallet holds.
    pub closing_per_key: Vec<HoldingKeyTotal>,
    /// Whether every asset closes.
    pub closes: bool,
}

/// Sums per (network, asset) of one movement kind.
type Sums = BTreeMap<(String, String), i128>;

impl HoldingsRollForward {
    /// The roll-forward of `period`, `[from, to)`, from each asset's figures.
    pub(crate) fn new(
        period: crate::books::Period,
        (from, to): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>),
        assets: Vec<AssetRollForward>,
    ) -> HoldingsRollForward {
        HoldingsRollForward {
            period,
            from,
            to,
            closes: assets.iter().all(|a| a.closes),
            assets,
            closing_per_key: Vec::new(),
        }
    }
}

/// Each asset's roll-forward from the movements before the period, in it, and what each
/// address held at its end (a separate count): every figure exact, the fair values left to the
/// caller.
pub(crate) fn asset_rollforwards(
    before: &[MovementRow],
    during: &[MovementRow],
    held_at_end: &[HoldingRow],
) -> Vec<AssetRollForward> {
    let mut kinds: BTreeMap<&str, Sums> = BTreeMap::new();
    let mut opening = Sums::new();
    let mut assets = std::collections::BTreeSet::new();
    for row in before {
        let sign = if matches!(row.kind.as_str(), "received" | "found") {
            1
        } else {
            -1
        };
        *opening
            .entry((row.network.clone(), row.asset.clone()))
            .or_default() += sign * row.amount;
        assets.insert((row.network.clone(), row.asset.clone()));
    }
    for row in during {
        *kinds
            .entry(row.kind.as_str())
            .or_default()
            .entry((row.network.clone(), row.asset.clone()))
            .or_default() += row.amount;
        assets.insert((row.network.clone(), row.asset.clone()));
    }
    let mut held = Sums::new();
    for row in held_at_end {
        *held
            .entry((row.network.clone(), row.asset.clone()))
            .or_default() += row.amount;
        assets.insert((row.network.clone(), row.asset.clone()));
    }
    let of = |kind: &str, key: &(String, String)| {
        kinds
            .get(kind)
            .and_then(|sums| sums.get(key))
            .copied()
            .unwrap_or(0)
    };
    assets
        .into_iter()
        .map(|key| {
            let open = opening.get(&key).copied().unwrap_or(0);
            let (received, treasury, external, fees) = (
                of("received", &key),
                of("treasury", &key),
                of("external", &key),
                of("fee", &key),
            );
            let (found, missing) = (of("found", &key), of("missing", &key));
            let closing = open + received + found - treasury - external - fees - missing;
            let end = held.get(&key).copied().unwrap_or(0);
            let method = key.1.parse::<Method>().ok();
            AssetRollForward {
                network: key.0,
                decimals: method.map(Method::decimals),
                display_decimals: method.map(|m| m.asset().display_decimals()),
                asset: key.1,
                opening: open.to_string(),
                received: received.to_string(),
                sent_to_treasury: treasury.to_string(),
                sent_elsewhere: external.to_string(),
                fees: fees.to_string(),
                found_by_check: found.to_string(),
                missing_by_check: missing.to_string(),
                closing: closing.to_string(),
                held_at_end: end.to_string(),
                closes: closing == end,
                rate_at_start_usd: None,
                opening_value_usd: None,
                rate_at_end_usd: None,
                closing_value_usd: None,
            }
        })
        .collect()
}

/// What books a holdings difference, so custody equals the chain: money found with no
/// receipt enters custody held in `suspense:unreconciled` for an operator to say whose it is;
/// money missing with no outflow leaves custody as sent elsewhere.
pub(crate) fn difference_entry(difference: &HoldingsDifference, method: Method) -> NewEntry {
    let crypto = Currency::Crypto(method);
    let units = difference.amount_base as i128;
    let (postings, what) = if difference.found {
        (
            vec![
                Posting::debit(Account::Custody(method), crypto, units),
                Posting::credit(
                    Account::Suspense(SuspenseReason::Unreconciled),
                    crypto,
                    units,
                ),
            ],
            "found with no receipt",
        )
    } else {
        (
            vec![
                Posting::debit(Account::External(method), crypto, units),
                Posting::credit(Account::Custody(method), crypto, units),
            ],
            "missing with no outflow",
        )
    };
    NewEntry {
        idempotency_key: difference.id.clone(),
        kind: EntryKind::Adjustment,
        reference: None,
        memo: format!(
            "{} {} {what} at {} (block {}), by the holdings check",
            method.format_amount(Amount::from_base_units(difference.amount_base)),
            method.asset(),
            difference.address,
            difference.block_height
        ),
        postings,
    }
}

/// `base_units` of `method` at `usd_per_unit`, to the cent.
pub(crate) fn usd_value(
    method: Method,
    base_units: &str,
    usd_per_unit: rust_decimal::Decimal,
) -> Option<String> {
    let units: i128 = base_units.parse().ok()?;
    let coins =
        rust_decimal::Decimal::try_from_i128_with_scale(units, u32::from(method.decimals()))
            .ok()?;
    let value = coins
        .checked_mul(usd_per_unit)?
        .round_dp_with_strategy(2, rust_decimal::RoundingStrategy::MidpointAwayFromZero);
    Some(format!("{value:.2}"))
}

/// One network's holdings checked against its chain at a period's last block.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HoldingsVerification {
    /// The network.
    pub network: String,
    /// The block the chain was asked at: the last one before the period's end (the tip for a
    /// period still running).
    pub block: Option<payrecon_chain_core::BlockId>,
    /// Funded addresses compared.
    pub addresses_checked: u64,
    /// Every address where the chain and payrecon disagree.
    pub differences: Vec<HoldingDifference>,
    /// Why the network could not be checked, when it could not.
    pub unchecked: Option<String>,
}

/// An address whose balance on the chain is not what payrecon's events add up to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HoldingDifference {
    /// The address.
    pub address: String,
    /// The asset.
    pub asset: String,
    /// What payrecon's receipts and outflows add up to, base units.
    pub payrecon: String,
    /// What the chain says, base units.
    pub chain: String,
}

/// What to collect from every funded address of an account chain, and the native coin each
/// needs for the fees first: the merchant's sweep tool signs from it, payrecon never does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SweepList {
    /// The network.
    pub network: String,
    /// The fee of one token sweep at the node's prices now, in the native coin's base units.
    pub per_token_fee: String,
    /// The fee of a native sweep, likewise.
    pub native_fee: String,
    /// How the chain figured them: its prices and the units each sweep takes.
    pub fee_basis: String,
    /// Every address holding something, in derivation order.
    pub addresses: Vec<SweepAddress>,
    /// What the sweeps would collect per asset, in base units.
    pub totals: BTreeMap<String, String>,
    /// The same per account key: what each key's wallet sweeps.
    pub key_totals: BTreeMap<String, BTreeMap<String, String>>,
    /// The sum of every address's top-up, in base units of the native coin.
    pub top_up_total: String,
}

/// One funded address on a [`SweepList`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SweepAddress {
    /// The address.
    pub address: String,
    /// Its receive index below the account key.
    pub derivation_index: Option<u32>,
    /// The full path a wallet derives its key at.
    pub derivation_path: Option<String>,
    /// The account key that derived it.
    pub key_id: Option<String>,
    /// Base units held per asset (the network's methods, the native coin included).
    pub balances: BTreeMap<String, String>,
    /// The fees its sweeps need at the list's gas price: one token transfer per token held,
    /// and a native transfer when more native coin than that is left to collect.
    pub fee_needed: String,
    /// Native coin to send it before its token sweeps can pay their gas.
    pub top_up: String,
}

impl SweepList {
    /// The list of `network` from the holdings, with the chain's `fees`.
    pub(crate) fn new(
        network: Network,
        rows: Vec<HoldingRow>,
        fees: &SweepFees,
    ) -> Result<SweepList, crate::error::Error> {
        let native = network.native_method();
        let (per_token, native_fee) = (fees.per_token.base_units(), fees.native.base_units());
        type Held = (Option<u32>, Option<String>, BTreeMap<Method, u128>);
        let mut by_address: BTreeMap<String, Held> = BTreeMap::new();
        for row in rows {
            let Ok(method) = row.asset.parse::<Method>() else {
                continue;
            };
            let amount = checked_amount(&row)?;
            let entry = by_address.entry(row.address.clone()).or_default();
            if entry.0.is_none() {
                entry.0 = row.derivation_index.and_then(|i| u32::try_from(i).ok());
            }
            if entry.1.is_none() {
                entry.1 = row.key_id.clone();
            }
            *entry.2.entry(method).or_default() += amount;
        }
        let mut totals: BTreeMap<Method, u128> = BTreeMap::new();
        let mut key_totals: BTreeMap<String, BTreeMap<Method, u128>> = BTreeMap::new();
        let mut top_up_total: u128 = 0;
        let mut addresses = Vec::new();
        for (address, (index, key_id, balances)) in by_address {
            if balances.values().all(|amount| *amount == 0) {
                continue;
            }
            let tokens = balances
                .iter()
                .filter(|(method, amount)| **method != native && **amount > 0)
                .count() as u128;
            let held_native = balances.get(&native).copied().unwrap_or(0);
            let token_fees = per_token.saturating_mul(tokens);
            let sweeps_native = held_native > token_fees.saturating_add(native_fee);
            let fee_needed = token_fees + if sweeps_native { native_fee } else { 0 };
            let top_up = token_fees.saturating_sub(held_native);
            top_up_total = top_up_total.saturating_add(top_up);
            for (method, amount) in &balances {
                *totals.entry(*method).or_default() += amount;
                if let Some(key_id) = &key_id {
                    *key_totals
                        .entry(key_id.clone())
                        .or_default()
                        .entry(*method)
                        .or_default() += amount;
                }
            }
            addresses.push(SweepAddress {
                derivation_path: index
                    .and_then(|i| derivation_path(network, i, &UtxoWallets::new())),
                derivation_index: index,
                key_id,
                address,
                balances: balances
                    .into_iter()
                    .map(|(method, amount)| (method.id().to_owned(), amount.to_string()))
                    .collect(),
                fee_needed: fee_needed.to_string(),
                top_up: top_up.to_string(),
            });
        }
        addresses.sort_by(|a, b| {
            (a.derivation_index, &a.address).cmp(&(b.derivation_index, &b.address))
        });
        Ok(SweepList {
            network: network.as_str().to_owned(),
            per_token_fee: per_token.to_string(),
            native_fee: native_fee.to_string(),
            fee_basis: fees.basis.clone(),
            addresses,
            totals: per_method(totals),
            key_totals: key_totals
                .into_iter()
                .map(|(key_id, totals)| (key_id, per_method(totals)))
                .collect(),
            top_up_total: top_up_total.to_string(),
        })
    }

    /// The methods of the list's network, native first: the CSV's balance columns.
    fn columns(&self) -> Vec<Method> {
        let mut methods: Vec<Method> = Method::ALL
            .into_iter()
            .filter(|m| m.network().as_str() == self.network)
            .collect();
        methods.sort_by_key(|m| *m != m.network().native_method());
        methods
    }

    /// One line per address: address, index, path, a balance per method (base units), the
    /// fees needed and the top-up; a spreadsheet or a sweep script reads it as is.
    pub fn csv(&self) -> String {
        let columns = self.columns();
        let mut header = vec!["address", "derivation_index", "derivation_path"];
        header.extend(columns.iter().map(|m| m.id()));
        header.extend(["fee_needed", "top_up"]);
        let mut out = crate::report::csv_line(&header);
        for row in &self.addresses {
            let index = row
                .derivation_index
                .map(|i| i.to_string())
                .unwrap_or_default();
            let mut cells = vec![
                row.address.as_str(),
                index.as_str(),
                row.derivation_path.as_deref().unwrap_or(""),
            ];
            cells.extend(
                columns
                    .iter()
                    .map(|m| row.balances.get(m.id()).map_or("0", String::as_str)),
            );
            cells.extend([row.fee_needed.as_str(), row.top_up.as_str()]);
            out.push_str(&crate::report::csv_line(&cells));
        }
        out
    }
}
