//! What each journal entry is worth in USD and in the reporting currency.
//!
//! The journal itself stays in exact native units (base units, cents). An entry's fiat value
//! comes from its valuation: the market rate of its crypto at the moment it happened and the
//! reporting currency's USD rate then. Every `fx:<method>` leg absorbs what the other legs do
//! not balance, so in fiat an entry still sums to zero and its `fx:` legs hold the difference
//! between the locked value (what the customer was credited) and the market value.

use payrecon_chain_core::Method;
use rust_decimal::{Decimal, RoundingStrategy};

use crate::error::Error;
use crate::ledger::{Account, Currency, NewEntry};
use crate::records::Valuation;

/// One leg's worth: USD cents and reporting-currency minor units (cents of EUR).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LegValue {
    /// In USD cents.
    pub(crate) usd_cents: i128,
    /// In the reporting currency's cents, when there is one.
    pub(crate) reporting_cents: Option<i128>,
}

/// The one crypto currency an entry moves, if any; an entry with two cannot be valued.
pub(crate) fn crypto_of(entry: &NewEntry) -> Result<Option<Method>, Error> {
    let mut found = None;
    for posting in &entry.postings {
        if let Currency::Crypto(method) = posting.currency {
            match found {
                Some(other) if other != method => {
                    return Err(Error::Books(format!(
                        "entry {} moves both {other} and {method}: value it by hand",
                        entry.idempotency_key
                    )));
                }
                _ => found = Some(method),
            }
        }
    }
    Ok(found)
}

/// Every leg's fiat value, in leg order. Each leg is rounded half away from zero; whatever
/// the rounding or the market leaves unbalanced lands on the entry's first `fx:` leg (the
/// conversion account) or, without one, on its largest leg, so each entry sums to zero in USD
/// and in the reporting currency. A refund's suspense legs leave at the rates the money was
/// held at, so its `fx:` legs take the exchange difference.
pub(crate) fn value_legs(entry: &NewEntry, valuation: &Valuation) -> Result<Vec<LegValue>, Error> {
    let mut values = Vec::with_capacity(entry.postings.len());
    for posting in &entry.postings {
        let held = valuation
            .held
            .as_ref()
            .filter(|_| matches!(posting.account, Account::Suspense(_)));
        let usd_exact = match posting.currency {
            Currency::Usd => Decimal::from_i128_with_scale(posting.amount_minor, 0),
            Currency::Crypto(method) => {
                let rate = valuation
                    .crypto
                    .as_ref()
                    .filter(|r| r.method == method)
                    .ok_or_else(|| {
                        Error::Books(format!(
                            "entry {} has no {method} rate",
                            entry.idempotency_key
                        ))
                    })?;
                let coins = Decimal::try_from_i128_with_scale(
                    posting.amount_minor,
                    u32::from(method.decimals()),
                )
                .map_err(|_| {
                    Error::Books(format!("amount of {} too large", entry.idempotency_key))
                })?;
                coins
                    .checked_mul(held.map_or(rate.usd_per_unit, |h| h.usd_per_unit))
                    .and_then(|usd| usd.checked_mul(Decimal::ONE_HUNDRED))
                    .ok_or_else(|| {
                        Error::Books(format!("value of {} overflows", entry.idempotency_key))
                    })?
            }
        };
        let usd_per_reporting = valuation.reporting.as_ref().map(|rate| {
            held.and_then(|h| h.usd_per_reporting)
                .unwrap_or(rate.usd_per_unit)
        });
        let reporting_cents = match usd_per_reporting {
            None => None,
            Some(rate) => Some(cents(usd_exact.checked_div(rate).ok_or_else(|| {
                Error::Books(format!(
                    "reporting rate of {} is zero",
                    entry.idempotency_key
                ))
            })?)),
        };
        values.push(LegValue {
            usd_cents: cents(usd_exact),
            reporting_cents,
        });
    }
    let absorber = entry
        .postings
        .iter()
        .position(|p| matches!(p.account, Account::Fx(_)))
        .or_else(|| (0..values.len()).max_by_key(|&i| values[i].usd_cents.unsigned_abs()))
        .expect("an entry has legs");
    let usd_off: i128 = values.iter().map(|v| v.usd_cents).sum();
    values[absorber].usd_cents -= usd_off;
    if valuation.reporting.is_some() {
        let off: i128 = values.iter().filter_map(|v| v.reporting_cents).sum();
        if let Some(cents) = values[absorber].reporting_cents.as_mut() {
            *cents -= off;
        }
    }
    Ok(values)
}

fn cents(exact: Decimal) -> i128 {
    exact
        .round_dp_with_strategy(0, RoundingStrategy::MidpointAwayFromZero)
        .mantissa()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{EntryKind, Posting};
    use crate::order::AccountId;
    use crate::records::{CryptoRate, ReportingRate};
    use chrono::DateTime;

    fn payment(units: i128, cents: i128) -> NewEntry {
        let ltc = Currency::Crypto(Method::Ltc);
        NewEntry {
            idempotency_key: "settle:i:1".into(),
            kind: EntryKind::Payment,
            reference: Some("T1".into()),
            memo: "m".into(),
            postings: vec![
                Posting::debit(Account::Custody(Method::Ltc), ltc, units),
                Posting::credit(Account::Fx(Method::Ltc), ltc, units),
                Posting::debit(Account::Fx(Method::Ltc), Currency::Usd, cents),
                Posting::credit(
                    Account::CustomerBalance(AccountId::new("42").unwrap()),
                    Currency::Usd,
                    cents,
                ),
            ],
        }
    }

    fn valuation(usd_per_ltc: &str, usd_per_eur: Option<&str>) -> Valuation {
        let at = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        Valuation {
            entry_seq: 1,
            crypto: Some(CryptoRate {
                method: Method::Ltc,
                usd_per_unit: usd_per_ltc.parse().unwrap(),
                source: "test".into(),
                at,
            }),
            basis: "market".into(),
            txids: String::new(),
            reporting: usd_per_eur.map(|r| ReportingRate {
                currency: "EUR".into(),
                usd_per_unit: r.parse().unwrap(),
                source: "test".into(),
                at,
            }),
            held: None,
            valued_at: at,
        }
    }

    #[test]
    fn the_fx_legs_hold_the_difference_between_market_and_locked_value() {
        // 1 LTC credited as 100.00 USD, worth 103.50 USD when it arrived; EUR at 1.15 USD.
        let values = value_legs(
            &payment(100_000_000, 10_000),
            &valuation("103.5", Some("1.15")),
        )
        .unwrap();
        let usd: Vec<i128> = values.iter().map(|v| v.usd_cents).collect();
        assert_eq!(usd, [10_350, -10_350, 10_000, -10_000]);
        let eur: Vec<i128> = values.iter().map(|v| v.reporting_cents.unwrap()).collect();
        assert_eq!(eur, [9_000, -9_000, 8_696, -8_696]);
        // The fx account nets to a gain (a credit) of 3.50 USD.
        assert_eq!(usd[1] + usd[2], -350);
    }

    #[test]
    fn a_refund_leaves_suspense_at_the_held_rates_and_books_the_difference_on_fx() {
        // 0.3 LTC held at 120 USD (EUR at 1.20 USD), sent back when worth 100 USD (EUR 1.10).
        let ltc = Currency::Crypto(Method::Ltc);
        let held = Account::Suspense(crate::ledger::SuspenseReason::Overpaid);
        let refund = NewEntry {
            idempotency_key: "refund:rf_1".into(),
            kind: EntryKind::Refund,
            reference: Some("T1".into()),
            memo: "m".into(),
            postings: vec![
                Posting::debit(held, ltc, 30_000_000),
                Posting::credit(Account::Fx(Method::Ltc), ltc, 30_000_000),
                Posting::debit(Account::Fx(Method::Ltc), ltc, 30_000_000),
                Posting::credit(Account::External(Method::Ltc), ltc, 30_000_000),
            ],
        };
        let mut valuation = valuation("100", Some("1.10"));
        valuation.held = Some(crate::records::HeldRate {
            usd_per_unit: "120".parse().unwrap(),
            usd_per_reporting: Some("1.20".parse().unwrap()),
        });
        let values = value_legs(&refund, &valuation).unwrap();
        let usd: Vec<i128> = values.iter().map(|v| v.usd_cents).collect();
        assert_eq!(usd, [3_600, -3_600, 3_000, -3_000]);
        // The fx account nets to a gain (a credit) of 6.00 USD: the shop owed 36.00 and paid
        // with 30.00.
        assert_eq!(usd[1] + usd[2], -600);
        let eur: Vec<i128> = values.iter().map(|v| v.reporting_cents.unwrap()).collect();
        // 30.00 EUR held, 27.27 EUR sent: 2.73 EUR gained.
        assert_eq!(eur, [3_000, -3_000, 2_727, -2_727]);
        assert_eq!(eur[1] + eur[2], -273);
    }

    #[test]
    fn rounding_never_unbalances_an_entry() {
        for units in [1, 3, 7, 333_333_333, 123_456_789] {
            let values =
                value_legs(&payment(units, 1), &valuation("77.777777", Some("1.0873"))).unwrap();
            assert_eq!(values.iter().map(|v| v.usd_cents).sum::<i128>(), 0);
            assert_eq!(
                values
                    .iter()
                    .map(|v| v.reporting_cents.unwrap())
                    .sum::<i128>(),
                0
            );
        }
    }
}
