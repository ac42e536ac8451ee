//! GCRA: the generic cell rate algorithm, a token bucket kept as one timestamp.

use super::{
    check_range, check_rate, scaled_mark, scaled_rate, Admitted, Eval, Inner, Model, Refund,
    MAX_PRODUCT, MAX_SCALED,
};
use crate::error::ConfigError;
use crate::rate::{Divisor, Rate};

/// Sustains `rate` with bursts of up to `burst` units, storing the theoretical arrival time
/// (TAT) of the next unit (see [`Rule::gcra`](crate::Rule::gcra)).
///
/// The TAT keeps its fraction of a µs, in units of `1 / amount` µs, so that 600,000 per
/// second admits 600,000, not the 500,000 an interval rounded to 2 µs would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gcra {
    /// The sustained rate as given.
    pub(super) rate: Rate,
    /// The most units admitted at once.
    pub(super) burst: u64,
    /// `amount` units every `period` µs: the rate enforced and the arithmetic uses, `rate`
    /// in lowest terms, or rounded down (by less than 1 µs per unit) to stay exact.
    pub(super) pace: Rate,
    /// Division by `pace`'s amount and by its period, for the one-pass admission.
    by_amount: Divisor,
    by_period: Divisor,
}

/// The TAT is `tat + fraction / pace.amount()` µs, with `fraction < pace.amount()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TatState {
    pub(crate) tat: u64,
    pub(crate) fraction: u64,
}

impl Gcra {
    /// `rate` sustained, with up to `burst` units at once.
    pub(crate) fn new(burst: u64, rate: Rate) -> Result<Self, ConfigError> {
        check_rate("GCRA rate", rate)?;
        check_range("GCRA burst", burst)?;
        let pace = scaled_rate("GCRA burst", burst, rate)?;
        Ok(Self {
            rate,
            burst,
            pace,
            by_amount: Divisor::new(pace.amount()),
            by_period: Divisor::new(pace.period_micros()),
        })
    }

    /// Microseconds a full backlog takes to clear: the burst restored.
    pub(crate) fn fill_micros(&self) -> u64 {
        self.tolerance().div_ceil(self.pace.amount())
    }

    /// The burst in scaled units (`amount` per µs).
    fn tolerance(&self) -> u64 {
        self.burst * self.pace.period_micros()
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
        TatState {
            tat: now,
            fraction: 0,
        }
    }

    fn evaluate(&self, s: &TatState, now: u64, cost: u64) -> Eval {
        let (amount, period) = (self.pace.amount(), self.pace.period_micros());
        let tolerance = self.tolerance();
        // The backlog (TAT − now) in whole µs and scaled units: `whole` may be far beyond
        // the tolerance after a reservation, so it is scaled only once known to be within it.
        let (whole, fraction) = if s.tat >= now {
            (s.tat - now, s.fraction)
        } else {
            (0, 0)
        };
        let reset = whole + u64::from(fraction > 0);
        let backlog = (whole <= tolerance / amount).then(|| whole * amount + fraction);
        let remaining = backlog.map_or(0, |b| tolerance.saturating_sub(b) / period);
        if cost > self.burst {
            return Eval::reject(None, remaining, reset);
        }
        match backlog {
            Some(b) if b + cost * period <= tolerance => {
                let after = b + cost * period;
                Eval::admit(0, (tolerance - after) / period, after.div_ceil(amount))
            }
            // Admitted once the backlog has shrunk to tolerance − cost × period:
            // whole + ⌈(fraction + cost × period − tolerance) / amount⌉ µs from now.
            _ => {
                let over = fraction + cost * period;
                let retry = if over >= tolerance {
                    whole + (over - tolerance).div_ceil(amount)
                } else {
                    whole - (tolerance - over) / amount
                };
                Eval::reject(Some(retry), remaining, reset)
            }
        }
    }

    /// A request that fits: the scaled backlog after it, `after`, gives the new TAT, the
    /// expiry and the mark with one division.
    #[inline]
    fn admit_in_one_pass(&self, inner: &mut Inner, now: u64, cost: u64) -> Option<Admitted> {
        if cost == 0 || cost > self.burst {
            return None;
        }
        let (amount, period) = (self.pace.amount(), self.pace.period_micros());
        let tolerance = self.tolerance();
        // An expired state (or none) reads as a fresh one, a TAT of now: no backlog.
        let (whole, fraction) = match inner {
            Inner::Gcra(s) if s.tat >= now => (s.tat - now, s.fraction),
            _ => (0, 0),
        };
        // Within the tolerance each term is below 2^52, so the sum cannot overflow.
        let after = whole
            .checked_mul(amount)
            .filter(|backlog| *backlog <= tolerance)
            .map(|backlog| backlog + fraction + cost * period)
            .filter(|after| *after <= tolerance)?;
        let (ahead, rest) = self.by_amount.div_rem(after);
        *inner = Inner::Gcra(TatState {
            tat: now + ahead,
            fraction: rest,
        });
        let reset = ahead + u64::from(rest > 0);
        Some(Admitted {
            eval: Eval::admit(0, self.by_period.quotient(tolerance - after), reset),
            expires_at: now + reset,
            mark: after,
        })
    }

    fn apply(&self, s: &mut TatState, now: u64, cost: u64) {
        let amount = self.pace.amount();
        let base = if s.tat >= now { *s } else { self.fresh(now) };
        let fraction = base.fraction + cost * self.pace.period_micros();
        *s = TatState {
            tat: base.tat + fraction / amount,
            fraction: fraction % amount,
        };
    }

    /// The TAT moves past the tolerance by the units taken, within [`MAX_PRODUCT`] scaled
    /// units and [`MAX_SCALED`] µs of `now`.
    fn overdraw(&self, s: &mut TatState, now: u64, cost: u64) {
        self.apply(s, now, cost.min(MAX_PRODUCT / self.pace.period_micros()));
        let horizon = now + MAX_SCALED;
        if s.tat >= horizon {
            *s = self.fresh(horizon);
        }
    }

    /// The scaled backlog the admission at `at` left: every later admission adds to it and
    /// time leaves it alone, so it tells whether the state is still where this one left it.
    fn mark(&self, s: &TatState, at: u64) -> u64 {
        scaled_mark(at, s.tat, self.pace.amount(), s.fraction)
    }

    /// Moves the TAT back by the units, only while it is where this admission left it: a
    /// later admission was counted without this one, so a refund then could let more through.
    fn refund(&self, s: &mut TatState, Refund { at, cost, mark, .. }: Refund) -> bool {
        if s.tat < at || self.mark(s, at) != mark {
            return false;
        }
        let (amount, need) = (self.pace.amount(), cost * self.pace.period_micros());
        if s.fraction >= need {
            s.fraction -= need;
        } else {
            let borrow = (need - s.fraction).div_ceil(amount);
            s.tat = s.tat.saturating_sub(borrow);
            s.fraction = s.fraction + borrow * amount - need;
        }
        true
    }

    fn expires_at(&self, s: &TatState) -> u64 {
        s.tat + u64::from(s.fraction > 0)
    }

    /// A backlog of at least the parked units: the TAT no earlier than `at` plus them.
    fn cap(&self, s: &mut TatState, at: u64, parked: u64) {
        let floor = parked.min(self.burst) * self.pace.period_micros();
        let (ahead, rest) = self.by_amount.div_rem(floor);
        let capped = TatState {
            tat: at + ahead,
            fraction: rest,
        };
        if (s.tat, s.fraction) < (capped.tat, capped.fraction) {
            *s = capped;
        }
    }

    /// The backlog at `now` less the units, never below none.
    fn give_back(&self, s: &mut TatState, now: u64, units: u64) {
        let amount = u128::from(self.pace.amount());
        let backlog = if s.tat >= now {
            u128::from(s.tat - now) * amount + u128::from(s.fraction)
        } else {
            0
        };
        let need = u128::from(units.min(self.burst) * self.pace.period_micros());
        let after = backlog.saturating_sub(need);
        // At most the backlog before, which fit: the parts fit in u64 again.
        *s = TatState {
            tat: now + (after / amount) as u64,
            fraction: (after % amount) as u64,
        };
    }
}
