//! [`Rate`]: an amount per period, the unit of refill and drain speeds.

use std::time::Duration;

use crate::clock::duration_to_micros;

/// An amount of units per period of time: `Rate::per_second(100)` admits 100 units each
/// second, not one unit every 100 seconds.
///
/// Rates are exact integers (an amount and a period in microseconds): `Rate::per_second(3)`
/// is three units per 1,000,000 µs, not one unit every 333,333.33 µs.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Rate;
///
/// assert_eq!(Rate::per_second(100), Rate::new(100, Duration::from_secs(1)));
/// assert_eq!(Rate::per_minute(6).amount(), 6);
/// assert_eq!(Rate::per_minute(6).period(), Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    amount: u64,
    period_micros: u64,
}

impl Rate {
    /// `amount` units every `period`. A zero amount or a period under one microsecond is
    /// rejected when the rule using it is built.
    pub fn new(amount: u64, period: Duration) -> Self {
        Self {
            amount,
            period_micros: duration_to_micros(period),
        }
    }

    /// `amount` units per second: `per_second(10)` admits 10 each second.
    pub fn per_second(amount: u64) -> Self {
        Self::new(amount, Duration::from_secs(1))
    }

    /// `amount` units per minute: `per_minute(30)` admits 30 each minute.
    pub fn per_minute(amount: u64) -> Self {
        Self::new(amount, Duration::from_secs(60))
    }

    /// `amount` units per hour: `per_hour(5)` admits 5 each hour.
    pub fn per_hour(amount: u64) -> Self {
        Self::new(amount, Duration::from_secs(3600))
    }

    /// `amount` units per day: `per_day(10)` admits 10 each day.
    pub fn per_day(amount: u64) -> Self {
        Self::new(amount, Duration::from_secs(86_400))
    }

    /// The number of units per period.
    pub fn amount(&self) -> u64 {
        self.amount
    }

    /// The period.
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.period_micros)
    }

    /// The period in microseconds.
    pub fn period_micros(&self) -> u64 {
        self.period_micros
    }
}
