//! Token bucket: tokens refill over time up to a capacity; a request spends `cost` tokens.

use super::{
    check_product, check_range, check_rate, scaled_rate, Admitted, Eval, Inner, Model, Refund,
    MAX_PRODUCT, MAX_SCALED,
};
use crate::error::ConfigError;
use crate::rate::{Divisor, Rate};

/// How a [`TokenBucket`] refills; the number is its code in the Lua models and the fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Refill {
    /// Continuously: `Rate::per_second(10)` adds a tenth of a token every 100 ms.
    #[default]
    Smooth = 0,
    /// In steps: the rate's whole amount at the end of each period, counted from the request
    /// that found the bucket full (see
    /// [`Rule::token_bucket_stepped`](crate::Rule::token_bucket_stepped)).
    Stepped = 1,
}

/// Bursts up to `capacity` units, sustained at the refill rate, computed from the elapsed
/// time (no timer); see [`Rule::token_bucket`](crate::Rule::token_bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TokenBucket {
    /// The most tokens the bucket holds.
    pub(super) capacity: u64,
    /// The refill rate as given.
    pub(super) refill: Rate,
    pub(super) mode: Refill,
    /// The rate the bucket enforces and the arithmetic uses: smooth, `refill` in lowest
    /// terms, or rounded down (by less than 1 µs per token) to stay exact; stepped, `refill`
    /// as given (6 per minute in steps is not 1 per 10 s).
    pub(super) pace: Rate,
    /// Division by `pace`'s amount and by its period, for the one-pass admission.
    by_amount: Divisor,
    by_period: Divisor,
}

/// Smooth: `level` is in scaled units (one token = `period` units, `amount` units refill per
/// µs, of the `pace` rate) as of `last`. Stepped: `level` is whole tokens as of the step
/// boundary `last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BucketState {
    pub(crate) level: u64,
    pub(crate) last: u64,
}

impl TokenBucket {
    /// A bucket of `capacity` tokens refilled at `refill`, continuously or in steps.
    pub(crate) fn new(capacity: u64, refill: Rate, mode: Refill) -> Result<Self, ConfigError> {
        check_range("token bucket capacity", capacity)?;
        check_rate("token bucket refill", refill)?;
        let pace = match mode {
            Refill::Smooth => scaled_rate("token bucket capacity", capacity, refill)?,
            Refill::Stepped => {
                check_product(
                    "token bucket refill steps to fill × refill period (µs)",
                    capacity.div_ceil(refill.amount()),
                    refill.period_micros(),
                )?;
                refill
            }
        };
        Ok(Self {
            capacity,
            refill,
            mode,
            pace,
            by_amount: Divisor::new(pace.amount()),
            by_period: Divisor::new(pace.period_micros()),
        })
    }

    /// Microseconds an empty bucket takes to fill up.
    pub(crate) fn fill_micros(&self) -> u64 {
        let (amount, period) = (self.pace.amount(), self.pace.period_micros());
        match self.mode {
            Refill::Smooth => (self.capacity * period).div_ceil(amount),
            Refill::Stepped => self.capacity.div_ceil(amount) * period,
        }
    }

    /// Smooth refill: the level (scaled) at `now`.
    fn smooth_level(&self, s: &BucketState, now: u64) -> u64 {
        let full = self.capacity * self.pace.period_micros();
        let elapsed = now.saturating_sub(s.last);
        let to_full = (full - s.level.min(full)).div_ceil(self.pace.amount());
        if elapsed >= to_full {
            full
        } else {
            s.level + elapsed * self.pace.amount()
        }
    }

    /// Stepped refill: the whole tokens and the step boundary at `now`.
    fn stepped_level(&self, s: &BucketState, now: u64) -> BucketState {
        let (amount, period) = (self.pace.amount(), self.pace.period_micros());
        let steps = now.saturating_sub(s.last) / period;
        let steps_to_full = (self.capacity - s.level.min(self.capacity)).div_ceil(amount);
        let level = if steps >= steps_to_full {
            self.capacity
        } else {
            s.level + steps * amount
        };
        BucketState {
            level,
            last: s.last + steps * period,
        }
    }
}

impl Model for TokenBucket {
    type State = BucketState;
    super::stored_as!(TokenBucket);

    fn settled_at(&self, s: &BucketState) -> u64 {
        s.last
    }

    fn fresh(&self, now: u64) -> BucketState {
        let level = match self.mode {
            Refill::Smooth => self.capacity * self.pace.period_micros(),
            Refill::Stepped => self.capacity,
        };
        BucketState { level, last: now }
    }

    fn evaluate(&self, s: &BucketState, now: u64, cost: u64) -> Eval {
        let (amount, period) = (self.pace.amount(), self.pace.period_micros());
        match self.mode {
            Refill::Smooth => {
                let full = self.capacity * period;
                let level = self.smooth_level(s, now);
                if cost > self.capacity {
                    return Eval::reject(None, level / period, (full - level).div_ceil(amount));
                }
                let need = cost * period;
                if level >= need {
                    let after = level - need;
                    Eval::admit(0, after / period, (full - after).div_ceil(amount))
                } else {
                    let retry = (need - level).div_ceil(amount);
                    Eval::reject(Some(retry), level / period, (full - level).div_ceil(amount))
                }
            }
            Refill::Stepped => {
                let at = self.stepped_level(s, now);
                let reset_for = |level: u64| {
                    let steps = (self.capacity - level).div_ceil(amount);
                    if steps == 0 {
                        0
                    } else {
                        (at.last + steps * period).saturating_sub(now)
                    }
                };
                if cost > self.capacity {
                    return Eval::reject(None, at.level, reset_for(at.level));
                }
                if at.level >= cost {
                    let after = at.level - cost;
                    Eval::admit(0, after, reset_for(after))
                } else {
                    let steps = (cost - at.level).div_ceil(amount);
                    let retry = (at.last + steps * period).saturating_sub(now);
                    Eval::reject(Some(retry), at.level, reset_for(at.level))
                }
            }
        }
    }

    fn apply(&self, s: &mut BucketState, now: u64, cost: u64) {
        match self.mode {
            Refill::Smooth => {
                s.level = self.smooth_level(s, now) - cost * self.pace.period_micros();
                s.last = now.max(s.last);
            }
            Refill::Stepped => {
                *s = self.stepped_level(s, now);
                s.level -= cost;
            }
        }
    }

    /// A level cannot go below zero, so the debt is the refill it owes: the state stands as
    /// of the instant the missing tokens have refilled, and reads as held until then like a
    /// reservation (`settled_at`). Within [`MAX_PRODUCT`] scaled tokens and [`MAX_SCALED`] µs.
    fn overdraw(&self, s: &mut BucketState, now: u64, cost: u64) {
        let (amount, period) = (self.pace.amount(), self.pace.period_micros());
        let horizon = now + MAX_SCALED;
        match self.mode {
            Refill::Smooth => {
                let at = now.max(s.last);
                let need = cost.min(MAX_PRODUCT / period) * period;
                let level = self.smooth_level(s, at);
                *s = match need.checked_sub(level) {
                    None | Some(0) => BucketState {
                        level: level - need,
                        last: at,
                    },
                    Some(debt) => {
                        let wait = debt.div_ceil(amount);
                        let most = horizon.saturating_sub(at);
                        if wait > most {
                            BucketState {
                                level: 0,
                                last: at + most,
                            }
                        } else {
                            BucketState {
                                level: wait * amount - debt,
                                last: at + wait,
                            }
                        }
                    }
                };
            }
            Refill::Stepped => {
                let at = self.stepped_level(s, now.max(s.last));
                *s = match cost.checked_sub(at.level) {
                    None | Some(0) => BucketState {
                        level: at.level - cost,
                        last: at.last,
                    },
                    Some(debt) => {
                        let steps = debt.div_ceil(amount);
                        let most = horizon.saturating_sub(at.last) / period;
                        if steps > most {
                            BucketState {
                                level: 0,
                                last: at.last + most * period,
                            }
                        } else {
                            BucketState {
                                level: steps * amount - debt,
                                last: at.last + steps * period,
                            }
                        }
                    }
                };
            }
        }
    }

    fn mark(&self, s: &BucketState, _at: u64) -> u64 {
        s.last
    }

    /// Smooth refill, a request that fits: the level at `now` found once (its distance to
    /// full also says whether the state is live).
    #[inline]
    fn admit_in_one_pass(&self, inner: &mut Inner, now: u64, cost: u64) -> Option<Admitted> {
        if self.mode != Refill::Smooth || cost == 0 || cost > self.capacity {
            return None;
        }
        let (amount, period) = (self.pace.amount(), self.pace.period_micros());
        let full = self.capacity * period;
        let level = match inner {
            // A reservation still pending: the general steps wait it out.
            Inner::TokenBucket(s) if s.last > now => return None,
            // Live while it has not refilled to full (`expires_at` > now), else fresh.
            Inner::TokenBucket(s) => {
                let to_full = self.by_amount.div_ceil(full - s.level.min(full));
                let elapsed = now - s.last;
                if elapsed >= to_full {
                    full
                } else {
                    s.level + elapsed * amount
                }
            }
            // No state, or another algorithm's: a fresh bucket.
            _ => full,
        };
        let need = cost * period;
        if level < need {
            return None;
        }
        let after = level - need;
        let reset = self.by_amount.div_ceil(full - after);
        *inner = Inner::TokenBucket(BucketState {
            level: after,
            last: now,
        });
        Some(Admitted {
            eval: Eval::admit(0, self.by_period.quotient(after), reset),
            expires_at: now.saturating_add(reset),
            mark: now,
        })
    }

    /// Puts the tokens back (up to full), only while no admission was recorded at a later
    /// instant (step): without this one the bucket might have filled before it.
    fn refund(&self, s: &mut BucketState, Refund { cost, mark, .. }: Refund) -> bool {
        if s.last != mark {
            return false;
        }
        // The tokens go back as of the state's own instant: the state then reads at every
        // instant as if the admission had never been.
        let period = self.pace.period_micros();
        s.level = match self.mode {
            Refill::Smooth => (s.level + cost * period).min(self.capacity * period),
            Refill::Stepped => (s.level + cost).min(self.capacity),
        };
        true
    }

    /// The tokens at `at` (refilled to then, a step boundary kept), at most the capacity
    /// less the parked units.
    fn cap(&self, s: &mut BucketState, at: u64, parked: u64) {
        let ceiling = self.capacity.saturating_sub(parked);
        match self.mode {
            Refill::Smooth => {
                if at > s.last {
                    s.level = self.smooth_level(s, at);
                    s.last = at;
                }
                s.level = s.level.min(ceiling * self.pace.period_micros());
            }
            Refill::Stepped => {
                if at > s.last {
                    *s = self.stepped_level(s, at);
                }
                s.level = s.level.min(ceiling);
            }
        }
    }

    /// The tokens back, up to full.
    fn give_back(&self, s: &mut BucketState, _now: u64, units: u64) {
        let period = self.pace.period_micros();
        s.level = match self.mode {
            Refill::Smooth => {
                (s.level + units.min(self.capacity) * period).min(self.capacity * period)
            }
            Refill::Stepped => (s.level + units).min(self.capacity),
        };
    }

    fn expires_at(&self, s: &BucketState) -> u64 {
        let (amount, period) = (self.pace.amount(), self.pace.period_micros());
        match self.mode {
            Refill::Smooth => {
                let full = self.capacity * period;
                s.last
                    .saturating_add((full - s.level.min(full)).div_ceil(amount))
            }
            Refill::Stepped => {
                let steps = (self.capacity - s.level.min(self.capacity)).div_ceil(amount);
                s.last.saturating_add(steps * period)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Decides `times` in order as the stores do (a state back to full is dropped); the
    /// instants admitted.
    fn admitted(model: &TokenBucket, times: &[u64]) -> Vec<u64> {
        let mut state: Option<BucketState> = None;
        let mut out = Vec::new();
        for &now in times {
            let mut s = state
                .filter(|s| model.expires_at(s) > now)
                .unwrap_or_else(|| model.fresh(now));
            if model.evaluate(&s, now, 1).is_admitted() {
                model.apply(&mut s, now, 1);
                out.push(now);
            }
            state = Some(s);
        }
        out
    }

    /// Stepped refill counts its steps from the request that found the bucket full.
    #[test]
    fn stepped_refill_counts_from_the_request_that_found_the_bucket_full() {
        // 2 tokens, 1 more at the end of every 10 µs.
        let model =
            TokenBucket::new(2, Rate::new(1, Duration::from_micros(10)), Refill::Stepped).unwrap();
        // The key's first request at 3: steps end at 13, 23, …
        assert_eq!(admitted(&model, &[3, 4, 5, 12, 13, 14]), [3, 4, 13]);
        // Back to full at 33 (steps at 23 and 33); the next request, at 37, starts the steps
        // again: the token it and its neighbour take comes back at 47, not at 43.
        let times = [3, 4, 13, 37, 38, 39, 43, 46, 47];
        assert_eq!(admitted(&model, &times), [3, 4, 13, 37, 38, 47]);
    }
}
