//! A quota shared among instances: what one instance of `n` may admit on its own when they
//! cannot agree (a [`Fallback`](crate::store::Fallback)'s local store while Redis is away).

use std::time::Duration;

use super::{Algorithm, FixedWindow, Gcra, LeakyBucket, SlidingLog, SlidingWindow, TokenBucket};
use crate::error::ConfigError;
use crate::rate::Rate;

impl Algorithm {
    /// One instance's share of this algorithm's quota among `n`, rounded down so that `n`
    /// shares never admit more than the quota; `None` when nothing is left for one.
    pub(crate) fn share(&self, n: u64) -> Option<Algorithm> {
        let by_period = |r: Rate| {
            let period = r.period_micros().saturating_mul(n);
            Rate::new(r.amount(), Duration::from_micros(period))
        };
        let by_amount =
            |r: Rate| Rate::new(r.amount() / n, Duration::from_micros(r.period_micros()));
        self.divided(n, by_period)
            .or_else(|_| self.divided(n, by_amount))
            .ok()
    }

    /// This algorithm with its counts divided by `n` rounding down and its rates by `rate`.
    fn divided(&self, n: u64, rate: impl Fn(Rate) -> Rate) -> Result<Algorithm, ConfigError> {
        let count = |c: u64| c / n;
        match self {
            Algorithm::FixedWindow(a) => {
                FixedWindow::new(count(a.limit), Duration::from_micros(a.window), a.anchor)
                    .map(Algorithm::FixedWindow)
            }
            Algorithm::SlidingLog(a) => {
                SlidingLog::new(count(a.limit), Duration::from_micros(a.window))
                    .map(Algorithm::SlidingLog)
            }
            Algorithm::SlidingWindow(a) => {
                SlidingWindow::new(count(a.limit), Duration::from_micros(a.window))
                    .map(Algorithm::SlidingWindow)
            }
            Algorithm::TokenBucket(a) => {
                TokenBucket::new(count(a.capacity), rate(a.refill), a.mode)
                    .map(Algorithm::TokenBucket)
            }
            Algorithm::LeakyBucket(a) => {
                LeakyBucket::new(count(a.capacity), rate(a.drain)).map(Algorithm::LeakyBucket)
            }
            Algorithm::Gcra(a) => Gcra::new(count(a.burst), rate(a.rate)).map(Algorithm::Gcra),
        }
    }
}
