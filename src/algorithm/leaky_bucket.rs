//! Leaky bucket as a shaper: requests queue and leave at a constant rate.

use super::{check_product, check_range, Eval, Model, MAX_SCALED};
use crate::error::ConfigError;
use crate::rate::Rate;

/// A queue of up to `capacity` units drained at `drain`: an admitted request is held until
/// the units queued before it have drained (`Delay`), so traffic leaves evenly spaced; a
/// request that does not fit in the queue is denied. This is nginx's `limit_req` without
/// `nodelay`, with `capacity` counting the request being served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakyBucket {
    capacity: u64,
    drain: Rate,
}

/// `level` is the queued water in scaled units (one unit = `period`; `amount` drain per µs)
/// as of `last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LevelState {
    pub(crate) level: u64,
    pub(crate) last: u64,
}

impl LeakyBucket {
    /// A queue of `capacity` units drained at `drain`.
    pub fn new(capacity: u64, drain: Rate) -> Result<Self, ConfigError> {
        check_range("leaky bucket capacity", capacity, MAX_SCALED)?;
        check_range("leaky bucket drain amount", drain.amount(), MAX_SCALED)?;
        check_range(
            "leaky bucket drain period (µs)",
            drain.period_micros(),
            MAX_SCALED,
        )?;
        check_product(
            "leaky bucket capacity × drain period (µs)",
            capacity,
            drain.period_micros(),
        )?;
        Ok(Self { capacity, drain })
    }

    /// The most units queued, including the one being served.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The drain rate.
    pub fn drain(&self) -> Rate {
        self.drain
    }

    /// Microseconds a full queue takes to drain.
    pub(crate) fn drain_micros(&self) -> u64 {
        (self.capacity * self.drain.period_micros()).div_ceil(self.drain.amount())
    }

    fn level(&self, s: &LevelState, now: u64) -> u64 {
        let drained = now.saturating_sub(s.last);
        if drained >= s.level.div_ceil(self.drain.amount()) {
            0
        } else {
            s.level - drained * self.drain.amount()
        }
    }
}

impl Model for LeakyBucket {
    type State = LevelState;

    fn fresh(&self, now: u64) -> LevelState {
        LevelState {
            level: 0,
            last: now,
        }
    }

    fn evaluate(&self, s: &LevelState, now: u64, cost: u64) -> Eval {
        let (amount, period) = (self.drain.amount(), self.drain.period_micros());
        let full = self.capacity * period;
        let level = self.level(s, now);
        let remaining = (full - level) / period;
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

    fn apply(&self, s: &mut LevelState, _now: u64, at: u64, cost: u64) {
        *s = LevelState {
            level: self.level(s, at) + cost * self.drain.period_micros(),
            last: at.max(s.last),
        };
    }

    fn expires_at(&self, s: &LevelState) -> u64 {
        s.last.saturating_add(s.level.div_ceil(self.drain.amount()))
    }
}
