//! [`Rate`]: an amount per period, the unit of refill and drain speeds.

use std::time::Duration;

use crate::clock::duration_to_micros_ceil;

/// An amount of units per period of time, kept as exact integers (the period in
/// microseconds): `Rate::per_second(3)` is three units per 1,000,000 µs, not one unit every
/// 333,333.33 µs.
///
/// # Exactness
///
/// The continuous algorithms (smooth token bucket, leaky bucket, GCRA) compute with the rate
/// in lowest terms and keep fractions of a microsecond (`Rate::per_second(600_000)` is three
/// units every 5 µs). A rate is exact whenever `quota × period / gcd(amount, period)` (the
/// quota being the capacity or burst, the period in µs) is at most 2^52. Otherwise it is
/// rounded down, never faster: each unit comes less than 1 µs later than at the exact rate,
/// about `quota / 2^52` of the rate at most. A bucket that would take more than 2^52 µs
/// (about 142 years) to fill is refused.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Rate;
///
/// assert_eq!(Rate::per_second(100), Rate::new(100, Duration::from_secs(1)));
/// // Kept as given: 6 per minute, in steps, adds 6 once a minute, not 1 every 10 s.
/// assert_ne!(Rate::per_minute(6), Rate::new(1, Duration::from_secs(10)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    amount: u64,
    period_micros: u64,
}

impl Rate {
    /// `amount` units every `period`. A period with a fraction of a microsecond is rounded
    /// up to the next whole microsecond (a slower rate, never a faster one); a zero amount
    /// or a zero period is rejected when the rule using it is built.
    pub fn new(amount: u64, period: Duration) -> Self {
        Self {
            amount,
            period_micros: duration_to_micros_ceil(period),
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
    pub(crate) fn amount(&self) -> u64 {
        self.amount
    }

    /// The period in microseconds.
    pub(crate) fn period_micros(&self) -> u64 {
        self.period_micros
    }

    /// The same rate in lowest terms (600,000 per second is 3 per 5 µs).
    pub(crate) fn reduced(self) -> Rate {
        let g = gcd(self.amount, self.period_micros).max(1);
        Rate {
            amount: self.amount / g,
            period_micros: self.period_micros / g,
        }
    }

    /// This rate in lowest terms if its period is within `max_period` µs, else `n` units per
    /// `p ≤ max_period` µs, `n` the most units it lets through in `max_period` µs and `p` the
    /// fewest whole µs they take: never faster, each unit less than `1 / n` µs later. `None`
    /// when even one unit does not fit, or for a zero amount or period.
    pub(crate) fn within_period(self, max_period: u64) -> Option<Rate> {
        if self.amount == 0 || self.period_micros == 0 {
            return None;
        }
        let exact = self.reduced();
        if exact.period_micros <= max_period {
            return Some(exact);
        }
        // The largest n with n × period / amount ≤ max_period, then the shortest period that
        // n units may take without exceeding the rate: period' = ⌈n × period / amount⌉ ≤
        // max_period, and period' / n − period / amount < 1 / n.
        let (a, p) = (u128::from(exact.amount), u128::from(exact.period_micros));
        let n = u128::from(max_period) * a / p;
        if n == 0 {
            return None;
        }
        let period = (n * p).div_ceil(a);
        let rounded = Rate {
            amount: u64::try_from(n).ok()?,
            period_micros: u64::try_from(period).ok()?,
        };
        Some(rounded.reduced())
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Division by a number fixed when a rule is built, as a multiplication and a shift (a
/// 64-bit division is among the slowest instructions). Exact for every dividend: below 2^53
/// by Granlund and Montgomery's theorem 4.2 (`m = ⌈2^(53+ℓ) / d⌉` with `2^ℓ ≥ d`), above it
/// by a plain division.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Divisor {
    d: u64,
    m: u64,
    shift: u32,
}

impl Divisor {
    /// Division by `d` (at least 1).
    pub(crate) fn new(d: u64) -> Self {
        let d = d.max(1);
        let shift = 53 + (64 - (d - 1).leading_zeros());
        let m = (1u128 << shift).div_ceil(u128::from(d));
        Self {
            d,
            // Below 2^54: d > 2^(ℓ-1).
            m: m as u64,
            shift,
        }
    }

    /// `x / d`.
    #[inline]
    pub(crate) fn quotient(self, x: u64) -> u64 {
        if x >> 53 != 0 {
            return x / self.d;
        }
        ((u128::from(x) * u128::from(self.m)) >> self.shift) as u64
    }

    /// `(x / d, x % d)`.
    #[inline]
    pub(crate) fn div_rem(self, x: u64) -> (u64, u64) {
        let q = self.quotient(x);
        (q, x - q * self.d)
    }

    /// `⌈x / d⌉`.
    #[inline]
    pub(crate) fn div_ceil(self, x: u64) -> u64 {
        let (q, r) = self.div_rem(x);
        q + u64::from(r > 0)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn rate(amount: u64, period_micros: u64) -> Rate {
        Rate {
            amount,
            period_micros,
        }
    }

    /// A rate reduces to lowest terms in microseconds.
    #[test]
    fn rates_reduce_to_lowest_terms() {
        assert_eq!(Rate::per_second(600_000).reduced(), rate(3, 5));
        assert_eq!(Rate::per_day(100_000).reduced(), rate(1, 864_000));
        assert_eq!(Rate::per_second(7).reduced(), rate(7, 1_000_000));
    }

    /// A rate whose reduced period fits the bound is kept exactly.
    #[test]
    fn a_rate_that_fits_is_kept_exactly() {
        assert_eq!(
            Rate::per_day(100_000).within_period(864_000),
            Some(rate(1, 864_000))
        );
        assert_eq!(Rate::per_second(600_000).within_period(5), Some(rate(3, 5)));
    }

    /// A rate that does not fit the bound is rounded down, never faster and under a
    /// microsecond per unit slower, and none is given when a single unit cannot fit.
    #[test]
    fn a_rate_that_does_not_fit_is_rounded_down_by_under_a_microsecond_per_unit() {
        // 7 per second is 142,857.14… µs per unit.
        let r = rate(7, 1_000_000).within_period(500_000).unwrap();
        assert_eq!(r, rate(3, 428_572));
        // Never faster: amount' / period' ≤ 7 / 1,000,000.
        assert!(u128::from(r.amount()) * 1_000_000 <= 7 * u128::from(r.period_micros()));
        // Less than 1 / amount' µs slower per unit.
        let slower = u128::from(r.period_micros()) * 7 - 1_000_000 * u128::from(r.amount());
        assert!(slower < 7, "{r:?}");
        // One unit every ⌈142,857.14⌉ µs at the least.
        assert_eq!(rate(7, 1_000_000).within_period(142_857), None);
        assert_eq!(
            rate(7, 1_000_000).within_period(142_858),
            Some(rate(1, 142_858))
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// A [`Divisor`] divides as `/`, `%` and `div_ceil` do, at the edges of its exact
        /// range and past them.
        #[test]
        fn a_divisor_divides_exactly(
            d in prop_oneof![1u64..=64, 1u64..=1 << 50, Just(1 << 50), Just(1_000_000)],
            x in prop_oneof![0u64..1 << 20, 0u64..1 << 53, (1u64 << 53) - 64..(1 << 53) + 64, any::<u64>()],
        ) {
            let divisor = Divisor::new(d);
            prop_assert_eq!(divisor.div_rem(x), (x / d, x % d));
            prop_assert_eq!(divisor.div_ceil(x), x.div_ceil(d));
        }
    }
}
