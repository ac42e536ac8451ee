//! GCRA: the generic cell rate algorithm, a token bucket kept as one timestamp.

use super::{check_product, check_range, Eval, Model, MAX_SCALED};
use crate::error::ConfigError;
use crate::rate::Rate;

/// Sustains `rate` with bursts of up to `burst` units, storing a single value per key: the
/// theoretical arrival time (TAT) of the next unit.
///
/// GCRA works in whole microseconds: one unit's emission interval is the rate's period
/// divided by its amount, rounded up (3 per second is one every 333,334 µs), so it never
/// admits faster than the rate. Use [`TokenBucket`](super::TokenBucket) for the exact
/// fractional rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    rate: Rate,
    burst: u64,
    interval: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TatState {
    pub(crate) tat: u64,
}

impl Gcra {
    /// `rate` sustained, with up to `burst` units at once.
    pub fn new(rate: Rate, burst: u64) -> Result<Self, ConfigError> {
        check_range("GCRA rate amount", rate.amount(), MAX_SCALED)?;
        check_range("GCRA rate period (µs)", rate.period_micros(), MAX_SCALED)?;
        check_range("GCRA burst", burst, MAX_SCALED)?;
        let interval = rate.period_micros().div_ceil(rate.amount());
        check_product("GCRA burst × emission interval (µs)", burst, interval)?;
        Ok(Self {
            rate,
            burst,
            interval,
        })
    }

    /// The sustained rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The most units admitted at once.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Microseconds between units at the sustained rate.
    pub fn emission_interval_micros(&self) -> u64 {
        self.interval
    }

    pub(crate) fn fill_micros(&self) -> u64 {
        self.burst * self.interval
    }
}

impl Model for Gcra {
    type State = TatState;
    super::stored_as!(Gcra);

    /// The TAT already says when the next unit is due; a future TAT is no reservation
    /// to wait out but the debt the algorithm measures.
    fn settled_at(&self, _s: &TatState) -> u64 {
        0
    }

    fn fresh(&self, now: u64) -> TatState {
        TatState { tat: now }
    }

    fn evaluate(&self, s: &TatState, now: u64, cost: u64) -> Eval {
        let tolerance = self.burst * self.interval;
        let tat = s.tat.max(now);
        let backlog = tat - now;
        let remaining = (tolerance - backlog.min(tolerance)) / self.interval;
        if cost > self.burst {
            return Eval::reject(None, remaining, backlog);
        }
        let after = backlog + cost * self.interval;
        if after <= tolerance {
            Eval::admit(0, (tolerance - after) / self.interval, after)
        } else {
            Eval::reject(Some(after - tolerance), remaining, backlog)
        }
    }

    fn apply(&self, s: &mut TatState, now: u64, cost: u64) {
        s.tat = s.tat.max(now) + cost * self.interval;
    }

    fn mark(&self, s: &TatState, _at: u64, _delay: u64) -> u64 {
        s.tat
    }

    /// Moves the TAT back by the units, but only while it is where this admission left it:
    /// a later admission at an instant the TAT had not reached yet would have been counted
    /// from that instant without this one, so giving these units back then could let more
    /// through than the rate allows.
    fn refund(&self, s: &mut TatState, _now: u64, _at: u64, cost: u64, mark: u64) -> bool {
        if s.tat != mark {
            return false;
        }
        s.tat = s.tat.saturating_sub(cost * self.interval);
        true
    }

    fn expires_at(&self, s: &TatState) -> u64 {
        s.tat
    }
}
