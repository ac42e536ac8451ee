//! Leaky bucket as a shaper: requests queue and leave at a constant rate.

use super::{
    check_range, check_rate, scaled_mark, scaled_rate, Eval, Model, Refund, MAX_PRODUCT, MAX_SCALED,
};
use crate::error::ConfigError;
use crate::rate::Rate;

/// A queue of up to `capacity` units drained at `drain` (see
/// [`Rule::leaky_bucket`](crate::Rule::leaky_bucket)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeakyBucket {
    /// The most units queued, including the one being served.
    pub(super) capacity: u64,
    /// The drain rate as given.
    pub(super) drain: Rate,
    /// The rate the queue enforces and the arithmetic uses: `drain` in lowest terms, or
    /// rounded down (by less than 1 µs per unit) to stay exact.
    pub(super) pace: Rate,
}

/// `level` is the queued water in scaled units (one unit = `period`; `amount` drain per µs,
/// of the `pace` rate) as of `last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LevelState {
    pub(crate) level: u64,
    pub(crate) last: u64,
}

impl LeakyBucket {
    /// A queue of `capacity` units drained at `drain`.
    pub(crate) fn new(capacity: u64, drain: Rate) -> Result<Self, ConfigError> {
        check_range("leaky bucket capacity", capacity)?;
        check_rate("leaky bucket drain", drain)?;
        let pace = scaled_rate("leaky bucket capacity", capacity, drain)?;
        Ok(Self {
            capacity,
            drain,
            pace,
        })
    }

    /// Microseconds a full queue takes to drain.
    pub(crate) fn drain_micros(&self) -> u64 {
        (self.capacity * self.pace.period_micros()).div_ceil(self.pace.amount())
    }

    /// What a request of `cost` units (at least 1) arriving at `at` gets when another queue
    /// of its batch releases it at `until`: the time before `until` reads as queued water
    /// (whatever the state, its own water has drained by then), as
    /// [`evaluate`](Model::evaluate) on a queue that drains exactly at `until`.
    pub(crate) fn evaluate_held(&self, at: u64, cost: u64, until: u64) -> Eval {
        let (amount, period) = (self.pace.amount(), self.pace.period_micros());
        let full = self.capacity * period;
        let wait = until.saturating_sub(at);
        // Beyond a full queue the water only decides the retry, computed without it.
        let remaining = full.saturating_sub(wait.saturating_mul(amount)) / period;
        if cost > self.capacity {
            return Eval::reject(None, remaining, wait);
        }
        // The longest hold the queue has room for, with the request's units after it.
        let slack = (full - cost * period) / amount;
        if wait > slack {
            return Eval::reject(Some(wait - slack), remaining, wait);
        }
        let after = wait * amount + cost * period;
        Eval::admit(wait, (full - after) / period, after.div_ceil(amount))
    }

    /// The state after admitting what [`evaluate_held`](Self::evaluate_held) admitted: the
    /// queue ends `cost` units after `until`.
    pub(crate) fn held(&self, at: u64, cost: u64, until: u64) -> LevelState {
        let wait = until.saturating_sub(at);
        LevelState {
            level: wait * self.pace.amount() + cost * self.pace.period_micros(),
            last: at,
        }
    }

    /// The water [`held`](Self::held) adds above the queue's own (`s`; `None`: empty): the
    /// state it writes no longer shows it, and a refund needs it.
    pub(crate) fn hold(&self, s: Option<&LevelState>, at: u64, until: u64) -> u64 {
        let own = s.map_or(0, |s| self.level(s, at));
        until
            .saturating_sub(at)
            .saturating_mul(self.pace.amount())
            .saturating_sub(own)
    }

    fn level(&self, s: &LevelState, now: u64) -> u64 {
        let drained = now.saturating_sub(s.last);
        if drained >= s.level.div_ceil(self.pace.amount()) {
            0
        } else {
            s.level - drained * self.pace.amount()
        }
    }
}

impl Model for LeakyBucket {
    type State = LevelState;
    super::stored_as!(LeakyBucket);

    fn settled_at(&self, s: &LevelState) -> u64 {
        s.last
    }

    fn fresh(&self, now: u64) -> LevelState {
        LevelState {
            level: 0,
            last: now,
        }
    }

    fn evaluate(&self, s: &LevelState, now: u64, cost: u64) -> Eval {
        let (amount, period) = (self.pace.amount(), self.pace.period_micros());
        let full = self.capacity * period;
        let level = self.level(s, now);
        // More water than the queue holds when the rule was reconfigured smaller: full.
        let remaining = full.saturating_sub(level) / period;
        if cost > self.capacity {
            return Eval::reject(None, remaining, level.div_ceil(amount));
        }
        let after = level + cost * period;
        if after <= full {
            // Held until the water queued before it has drained; a request that adds no
            // water does not queue.
            let delay = if cost == 0 { 0 } else { level.div_ceil(amount) };
            Eval::admit(delay, (full - after) / period, after.div_ceil(amount))
        } else {
            let retry = (after - full).div_ceil(amount);
            Eval::reject(Some(retry), remaining, level.div_ceil(amount))
        }
    }

    fn apply(&self, s: &mut LevelState, now: u64, cost: u64) {
        s.level = self.level(s, now) + cost * self.pace.period_micros();
        s.last = now.max(s.last);
    }

    /// The units join the queue as water above its capacity, within [`MAX_PRODUCT`] scaled
    /// units and [`MAX_SCALED`] µs of drain.
    fn overdraw(&self, s: &mut LevelState, now: u64, cost: u64) {
        let (amount, period) = (self.pace.amount(), self.pace.period_micros());
        let level = self.level(s, now);
        let water = cost.min(MAX_PRODUCT / period) * period;
        let most = MAX_SCALED
            .saturating_mul(amount)
            .min(MAX_PRODUCT)
            .max(level);
        s.level = (level + water).min(most);
        s.last = now.max(s.last);
    }

    /// The end of the queue right after the admission at `at`, exactly: its water counted
    /// from `at` ([`scaled_mark`]), which any request that joins raises, where the end
    /// rounded to a µs would not move for less than a µs of water.
    fn mark(&self, s: &LevelState, at: u64) -> u64 {
        scaled_mark(at, s.last, self.pace.amount(), s.level)
    }

    /// Drains the admission's units (and its `hold`) back out while nothing queued behind
    /// them (the mark is unchanged): requests behind keep the release they were told, so
    /// water taken from the middle would let a new request leave with the last of them.
    fn refund(&self, s: &mut LevelState, given: Refund) -> bool {
        if self.mark(s, given.at) != given.mark {
            return false;
        }
        // Drained as of the state's own instant, which the drain since would have emptied
        // alike: the state then reads at every instant as if the water had never come.
        let water = given.cost * self.pace.period_micros() + given.hold;
        s.level = s.level.saturating_sub(water);
        true
    }

    fn expires_at(&self, s: &LevelState) -> u64 {
        s.last.saturating_add(s.level.div_ceil(self.pace.amount()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::Verdict;

    proptest::proptest! {
        /// A queue held until a later release answers as the model does on a queue that
        /// drains exactly then (its water before the request reads `until − at` µs of
        /// drain), and admitting leaves that queue with the request's units after it.
        #[test]
        fn a_held_request_is_decided_as_a_queue_draining_at_the_release(
            capacity in 1u64..8,
            amount in 1u64..5,
            period in 1u64..400,
            wait in 0u64..4_000,
            cost in 1u64..10,
        ) {
            let bucket = LeakyBucket::new(capacity, Rate::new(amount, Duration::from_micros(period))).unwrap();
            let at = 1_000_000;
            let queued = LevelState { level: wait * bucket.pace.amount(), last: at };
            let held = bucket.evaluate_held(at, cost, at + wait);
            proptest::prop_assert_eq!(held, bucket.evaluate(&queued, at, cost));
            if held.is_admitted() {
                let mut applied = queued;
                bucket.apply(&mut applied, at, cost);
                proptest::prop_assert_eq!(bucket.held(at, cost, at + wait), applied);
            }
        }
    }

    /// A rule reconfigured with a smaller capacity (same name, same store) finds more water
    /// than its queue holds: that is a full queue, not an underflow.
    #[test]
    fn water_above_a_shrunk_capacity_reads_as_a_full_queue() {
        let drain = Rate::new(1, Duration::from_micros(10));
        let before = LeakyBucket::new(10, drain).unwrap();
        let mut s = before.fresh(0);
        before.apply(&mut s, 0, 10);
        let after = LeakyBucket::new(2, drain).unwrap();
        let eval = after.evaluate(&s, 0, 1);
        // 100 units of water, room for 20: 90 µs until one more unit fits.
        assert_eq!(
            eval.verdict,
            Verdict::Reject {
                retry_micros: Some(90)
            }
        );
        assert_eq!(eval.remaining, 0);
        assert_eq!(eval.reset_micros, 100);
    }
}
