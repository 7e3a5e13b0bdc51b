//! What the shop sells: GPU kinds and their lots, rental durations, lot limits and top-up
//! amounts. A shop sets its own in `[catalog]`; the default is the GPU shop's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::money::Usd;

/// The most days one rental may run: a typo guard (10 years).
const MAX_RENTAL_DAYS: u32 = 3_650;
/// The most lots any catalog may allow in one order.
const MAX_LOTS: u32 = 1_000;
/// The most GPUs one lot may hold.
const MAX_GPUS_PER_LOT: u32 = 64;
/// The largest top-up any catalog may sell, in whole USD.
const MAX_TOPUP_USD: u32 = 1_000_000;

/// `[catalog]`: the shop's products, which every order and top-up is checked against.
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Catalog {
    /// GPU kinds the shop rents. Empty: any well-formed model name.
    pub gpu_kinds: Vec<String>,
    /// GPUs in one lot of a kind, where that is more than one (a B200 lot is two).
    pub gpus_per_lot: BTreeMap<String, u32>,
    /// The rental durations sold, in days.
    pub rental_days: Vec<u32>,
    /// The fewest lots one order may rent.
    pub min_lots: u32,
    /// The most lots one order may rent.
    pub max_lots: u32,
    /// The only top-up amounts sold, in whole USD.
    pub topup_amounts_usd: Vec<u32>,
}

impl Default for Catalog {
    fn default() -> Catalog {
        Catalog {
            gpu_kinds: Vec::new(),
            gpus_per_lot: BTreeMap::from([("B200".to_owned(), 2)]),
            rental_days: vec![3, 7, 30],
            min_lots: 1,
            max_lots: 10,
            topup_amounts_usd: vec![100, 500, 2000, 10000],
        }
    }
}

/// Why an order's GPU model is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum GpuRefusal {
    /// Not a model name at all.
    Malformed,
    /// A model the shop does not rent.
    NotRented(String),
}

/// Upper-cases and checks a GPU model name (`h100` and `H100` are one model).
fn normalize_gpu_model(model: &str) -> Option<String> {
    let model = model.trim().to_ascii_uppercase();
    let well_formed = (1..=32).contains(&model.len())
        && model
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '-' | '_' | '.'));
    well_formed.then_some(model)
}

/// Why a catalog cannot be used; names the key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("catalog.{key}: {problem}")]
pub struct CatalogError {
    /// The `[catalog]` key at fault.
    pub key: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

fn refuse(key: &'static str, problem: impl Into<String>) -> CatalogError {
    CatalogError {
        key,
        problem: problem.into(),
    }
}

impl Catalog {
    /// Checks the catalog once, at start, so that no order meets a rule that cannot hold.
    /// GPU kind names are normalised as orders' are (`h100` is `H100`).
    pub fn validated(mut self) -> Result<Catalog, CatalogError> {
        let model = |key, name: &str| {
            normalize_gpu_model(name).ok_or_else(|| {
                refuse(
                    key,
                    format!(
                        "{name:?} is not a GPU model name (1 to 32 letters, digits, space, - _ .)"
                    ),
                )
            })
        };
        self.gpu_kinds = self
            .gpu_kinds
            .iter()
            .map(|name| model("gpu_kinds", name))
            .collect::<Result<_, _>>()?;
        let mut per_lot = BTreeMap::new();
        for (name, gpus) in &self.gpus_per_lot {
            let name = model("gpus_per_lot", name)?;
            if !(1..=MAX_GPUS_PER_LOT).contains(gpus) {
                return Err(refuse(
                    "gpus_per_lot",
                    format!("{name} = {gpus}: must be 1 to {MAX_GPUS_PER_LOT}"),
                ));
            }
            if !self.gpu_kinds.is_empty() && !self.gpu_kinds.contains(&name) {
                return Err(refuse(
                    "gpus_per_lot",
                    format!("{name} is not among gpu_kinds"),
                ));
            }
            per_lot.insert(name, *gpus);
        }
        self.gpus_per_lot = per_lot;
        if self.rental_days.is_empty() {
            return Err(refuse("rental_days", "sells no duration"));
        }
        if let Some(days) = self
            .rental_days
            .iter()
            .find(|d| !(1..=MAX_RENTAL_DAYS).contains(*d))
        {
            return Err(refuse(
                "rental_days",
                format!("{days}: must be 1 to {MAX_RENTAL_DAYS}"),
            ));
        }
        if self.min_lots == 0 {
            return Err(refuse("min_lots", "must be at least 1"));
        }
        if self.max_lots < self.min_lots || self.max_lots > MAX_LOTS {
            return Err(refuse(
                "max_lots",
                format!(
                    "{}: must be min_lots ({}) to {MAX_LOTS}",
                    self.max_lots, self.min_lots
                ),
            ));
        }
        if self.topup_amounts_usd.is_empty() {
            return Err(refuse("topup_amounts_usd", "sells no top-up"));
        }
        if let Some(usd) = self
            .topup_amounts_usd
            .iter()
            .find(|a| !(1..=MAX_TOPUP_USD).contains(*a))
        {
            return Err(refuse(
                "topup_amounts_usd",
                format!("{usd}: must be 1 to {MAX_TOPUP_USD}"),
            ));
        }
        Ok(self)
    }

    /// The normalised GPU kind, if the name is one and the shop rents it.
    pub(crate) fn gpu_kind(&self, model: &str) -> Result<String, GpuRefusal> {
        let model = normalize_gpu_model(model).ok_or(GpuRefusal::Malformed)?;
        if self.gpu_kinds.is_empty() || self.gpu_kinds.contains(&model) {
            Ok(model)
        } else {
            Err(GpuRefusal::NotRented(model))
        }
    }

    /// GPUs in one lot of `kind` (normalised).
    pub(crate) fn gpus_per_lot(&self, kind: &str) -> u32 {
        self.gpus_per_lot.get(kind).copied().unwrap_or(1)
    }

    pub(crate) fn sells_duration(&self, days: u32) -> bool {
        self.rental_days.contains(&days)
    }

    pub(crate) fn allows_lots(&self, lots: u32) -> bool {
        (self.min_lots..=self.max_lots).contains(&lots)
    }

    pub(crate) fn sells_topup(&self, amount: Usd) -> bool {
        self.topup_amounts_usd
            .iter()
            .any(|dollars| Usd::from_dollars(*dollars) == amount)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_the_gpu_shop_and_valid() {
        let catalog = Catalog::default().validated().unwrap();
        assert_eq!(catalog.gpus_per_lot("B200"), 2);
        assert_eq!(catalog.gpus_per_lot("H100"), 1);
        assert!(catalog.sells_duration(7) && !catalog.sells_duration(14));
        assert!(catalog.allows_lots(10) && !catalog.allows_lots(11) && !catalog.allows_lots(0));
        assert!(catalog.sells_topup(Usd::from_dollars(2000)));
        assert!(!catalog.sells_topup(Usd::from_dollars(1000)));
    }

    #[test]
    fn a_broken_catalog_names_its_key() {
        type Break = fn(&mut Catalog);
        let cases: [(Break, &str); 7] = [
            (|c| c.rental_days.clear(), "catalog.rental_days"),
            (|c| c.rental_days.push(0), "catalog.rental_days"),
            (|c| c.min_lots = 0, "catalog.min_lots"),
            (|c| c.max_lots = 0, "catalog.max_lots"),
            (
                |c| c.topup_amounts_usd = vec![0],
                "catalog.topup_amounts_usd",
            ),
            (
                |c| {
                    c.gpus_per_lot.insert("B300".into(), 0);
                },
                "catalog.gpus_per_lot",
            ),
            (
                |c| c.gpu_kinds = vec!["H100".into()],
                "catalog.gpus_per_lot",
            ),
        ];
        for (breaks, key) in cases {
            let mut catalog = Catalog::default();
            breaks(&mut catalog);
            let error = catalog.validated().unwrap_err().to_string();
            assert!(error.starts_with(key), "{error}");
        }
    }

    #[test]
    fn gpu_kinds_restrict_and_normalise() {
        let catalog = Catalog {
            gpu_kinds: vec!["h100".into(), "B200".into()],
            ..Catalog::default()
        }
        .validated()
        .unwrap();
        assert_eq!(catalog.gpu_kind("h100"), Ok("H100".into()));
        assert_eq!(
            catalog.gpu_kind("A100"),
            Err(GpuRefusal::NotRented("A100".into()))
        );
    }
}
