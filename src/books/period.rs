//! Accounting periods: calendar months in the books' time zone.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Datelike, LocalResult, NaiveDate, TimeZone, Utc};
use chrono_tz::Tz;

use crate::error::Error;

/// A calendar month of the books (`2026-11`), cut in the books' time zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Period {
    year: i32,
    month: u32,
}

impl Period {
    /// The period `at` falls in, in `zone`.
    pub fn containing(at: DateTime<Utc>, zone: Tz) -> Period {
        let local = at.with_timezone(&zone);
        Period {
            year: local.year(),
            month: local.month(),
        }
    }

    /// The month after.
    pub fn next(self) -> Period {
        if self.month == 12 {
            Period {
                year: self.year + 1,
                month: 1,
            }
        } else {
            Period {
                year: self.year,
                month: self.month + 1,
            }
        }
    }

    /// The month before.
    pub fn previous(self) -> Period {
        if self.month == 1 {
            Period {
                year: self.year - 1,
                month: 12,
            }
        } else {
            Period {
                year: self.year,
                month: self.month - 1,
            }
        }
    }

    /// The first day of the month.
    pub fn first_day(self) -> NaiveDate {
        NaiveDate::from_ymd_opt(self.year, self.month, 1).expect("a checked month")
    }

    /// The last day of the month.
    pub fn last_day(self) -> NaiveDate {
        self.next()
            .first_day()
            .pred_opt()
            .expect("not the first day ever")
    }

    /// Start (inclusive) and end (exclusive) of the month in `zone`, as instants.
    pub fn bounds(self, zone: Tz) -> (DateTime<Utc>, DateTime<Utc>) {
        (
            start_of(self.first_day(), zone),
            start_of(self.next().first_day(), zone),
        )
    }

    /// The calendar year.
    pub fn year(self) -> i32 {
        self.year
    }
}

/// The first instant of `day` in `zone`: midnight, or the end of a gap that swallowed it.
fn start_of(day: NaiveDate, zone: Tz) -> DateTime<Utc> {
    let mut local = day.and_hms_opt(0, 0, 0).expect("midnight");
    loop {
        match zone.from_local_datetime(&local) {
            LocalResult::Single(t) => return t.with_timezone(&Utc),
            LocalResult::Ambiguous(first, _) => return first.with_timezone(&Utc),
            LocalResult::None => local += chrono::Duration::minutes(15),
        }
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}", self.year, self.month)
    }
}

impl FromStr for Period {
    type Err = Error;

    fn from_str(text: &str) -> Result<Period, Error> {
        let invalid =
            || Error::InvalidInput(format!("a period is a month as YYYY-MM, got {text:?}"));
        let (year, month) = text.split_once('-').ok_or_else(invalid)?;
        if year.len() != 4 || month.len() != 2 {
            return Err(invalid());
        }
        let year: i32 = year.parse().map_err(|_| invalid())?;
        let month: u32 = month.parse().map_err(|_| invalid())?;
        if !(2000..=9998).contains(&year) || !(1..=12).contains(&month) {
            return Err(invalid());
        }
        Ok(Period { year, month })
    }
}

impl serde::Serialize for Period {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The books' time zone from its IANA name.
pub(crate) fn parse_zone(name: &str) -> Result<Tz, Error> {
    name.parse()
        .map_err(|_| Error::Config(format!("books.timezone: {name:?} is not an IANA time zone")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_are_cut_in_the_books_time_zone() {
        let berlin: Tz = "Europe/Berlin".parse().unwrap();
        let november: Period = "2026-11".parse().unwrap();
        let (from, to) = november.bounds(berlin);
        assert_eq!(from.to_rfc3339(), "2026-10-31T23:00:00+00:00");
        assert_eq!(to.to_rfc3339(), "2026-11-30T23:00:00+00:00");
        // 23:30 UTC on 30 November is already December in Berlin.
        let late = "2026-11-30T23:30:00Z".parse().unwrap();
        assert_eq!(Period::containing(late, berlin).to_string(), "2026-12");
        assert_eq!(november.last_day().to_string(), "2026-11-30");
        assert_eq!(
            "2026-12".parse::<Period>().unwrap().next().to_string(),
            "2027-01"
        );
    }

    #[test]
    fn malformed_periods_are_refused() {
        for text in [
            "2026-13", "2026-1", "26-11", "2026/11", "", "2026-00", "abcd-ef",
        ] {
            assert!(text.parse::<Period>().is_err(), "{text}");
        }
    }
}
