//! Sliding window counter: the previous window's count, weighted, plus the current one's.

use std::time::Duration;

use super::fixed_window::{most_owed, windows_until_room};
use super::{check_window, Eval, Model, Refund, MAX_PRODUCT};
use crate::error::ConfigError;

/// Admits while `⌈previous × (window − elapsed) / window⌉ + current + cost ≤ limit`, in
/// integers, windows aligned to the epoch (see
/// [`Rule::sliding_window`](crate::Rule::sliding_window), including why sustained traffic
/// gets `limit − 1`). Beyond the exact range `elapsed` is rounded down to a whole
/// `step`, so the weight is never lighter.
///
/// A debt (a count above the limit) is paid `limit` per window: when the window turns the
/// previous one weighs `limit` of it and the rest is carried as the new window's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlidingWindow {
    /// The most units per window.
    pub(super) limit: u64,
    /// The window length in µs.
    pub(super) window: u64,
    /// The resolution, in µs, of the previous window's weight: 1 (exact) while `limit ×
    /// window (µs)` ≤ 2^52.
    pub(super) step: u64,
    /// `⌈window / step⌉`: the weight is `(steps − ⌊elapsed / step⌋) / steps`.
    pub(super) steps: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CountersState {
    /// Start of the current window.
    pub(crate) start: u64,
    pub(crate) previous: u64,
    pub(crate) current: u64,
}

impl SlidingWindow {
    /// At most `limit` units per `window`, estimated over the last two windows.
    pub(crate) fn new(limit: u64, window: Duration) -> Result<Self, ConfigError> {
        let (limit, window) = check_window("sliding window", limit, window)?;
        // The fewest µs per step that keep limit × steps within the exact range.
        let max_steps = MAX_PRODUCT / limit;
        let step = window.div_ceil(max_steps);
        let steps = window.div_ceil(step);
        Ok(Self {
            limit,
            window,
            step,
            steps,
        })
    }

    /// The counters at `now`: each window since the stored one paid `limit` and carried the rest.
    fn at(&self, s: &CountersState, now: u64) -> CountersState {
        let turns = now.saturating_sub(s.start) / self.window;
        if turns == 0 {
            return *s;
        }
        let before = s
            .current
            .saturating_sub((turns - 1).saturating_mul(self.limit));
        CountersState {
            start: s.start + turns * self.window,
            previous: before.min(self.limit),
            current: before.saturating_sub(self.limit),
        }
    }

    /// The instant from which `count` units, weighted as the previous window of the window
    /// starting at `start`, weigh at most `room` units: `count × (steps − k) ≤ room × steps`
    /// from step `k = steps − ⌊room × steps / count⌋` on (and by `start + window` the window
    /// has rolled over, whatever the steps say).
    fn weighs_at_most(&self, start: u64, count: u64, room: u64) -> u64 {
        let fitting = room.saturating_mul(self.steps) / count.max(1);
        let k = self.steps.saturating_sub(fitting);
        start + (k * self.step).min(self.window)
    }
}

impl Model for SlidingWindow {
    type State = CountersState;
    super::stored_as!(SlidingWindow);

    fn settled_at(&self, s: &CountersState) -> u64 {
        s.start
    }

    fn fresh(&self, now: u64) -> CountersState {
        CountersState {
            start: now - now % self.window,
            previous: 0,
            current: 0,
        }
    }

    fn evaluate(&self, s: &CountersState, now: u64, cost: u64) -> Eval {
        let s = self.at(s, now);
        let (start, previous, current) = (s.start, s.previous, s.current);
        let w = self.window;
        let elapsed = now.saturating_sub(start).min(w);
        // The previous window's weight, in whole units rounded up: previous × (w − e) / w at
        // the step's resolution. `used + cost ≤ limit` is then the same test as
        // `previous × (w − e) + (current + cost) × w ≤ limit × w`.
        let left = self.steps.saturating_sub(elapsed / self.step);
        let weighted = previous.saturating_mul(left).div_ceil(self.steps);
        let used = weighted.saturating_add(current);
        let remaining = self.limit.saturating_sub(used);
        let reset = if current > 0 {
            (start + (1 + current.div_ceil(self.limit)) * w) - now
        } else if previous > 0 {
            start + w - now
        } else {
            0
        };
        if cost > self.limit {
            return Eval::reject(None, remaining, reset);
        }
        if used.saturating_add(cost) <= self.limit {
            return Eval::admit(0, remaining - cost, start + 2 * w - now);
        }
        // Within the first window whose carried count leaves room, once the window before
        // it weighs little enough (the current one when it has room already).
        let turns = windows_until_room(self.limit, current, cost);
        let then = self.at(&s, start + turns * w);
        let room = self.limit - then.current - cost;
        let retry_at = self.weighs_at_most(then.start, then.previous, room);
        Eval::reject(Some(retry_at.saturating_sub(now)), remaining, reset)
    }

    fn apply(&self, s: &mut CountersState, now: u64, cost: u64) {
        *s = self.at(s, now);
        s.current += cost;
    }

    /// The current count carries the debt, up to what the windows within the exact range pay.
    fn overdraw(&self, s: &mut CountersState, now: u64, cost: u64) {
        *s = self.at(s, now);
        let most = most_owed(self.limit, self.window).max(s.current);
        s.current = (s.current + cost).min(most);
    }

    /// Counts add up: an admission is taken back from the counter of its window, whatever was
    /// admitted since; a debt's carried rest keeps the state at least as heavy as one that
    /// never took them.
    fn refund(&self, s: &mut CountersState, Refund { at, cost, .. }: Refund) -> bool {
        let window_of_at = at - at % self.window;
        if s.start == window_of_at {
            s.current = s.current.saturating_sub(cost);
        } else if s.start == window_of_at + self.window {
            s.previous = s.previous.saturating_sub(cost);
        } else {
            return false;
        }
        true
    }

    /// The end of the window after the one whose carried count is paid: the second window
    /// after the stored one when the count is within the limit.
    fn expires_at(&self, s: &CountersState) -> u64 {
        let windows = 1 + s.current.div_ceil(self.limit).max(1);
        s.start.saturating_add(windows.saturating_mul(self.window))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tries one unit every µs for `windows` windows; the units admitted in each window.
    fn sustained(limit: u64, window_micros: u64, windows: u64) -> Vec<u64> {
        let model = SlidingWindow::new(limit, Duration::from_micros(window_micros)).unwrap();
        let mut state = model.fresh(0);
        let mut admitted = vec![0; windows as usize];
        for now in 0..windows * window_micros {
            // As the stores do: state back to empty is gone.
            if now >= model.expires_at(&state) {
                state = model.fresh(now);
            }
            if model.evaluate(&state, now, 1).is_admitted() {
                model.apply(&mut state, now, 1);
                admitted[(now / window_micros) as usize] += 1;
            }
        }
        admitted
    }

    /// Under sustained traffic a sliding window admits the full limit in its first window,
    /// then `limit − 1` per window: a limit of 1 admits one request per two windows.
    #[test]
    fn sustained_traffic_gets_limit_minus_one_per_window_as_documented() {
        // The first window has no previous count: the full limit.
        assert_eq!(sustained(5, 1_000, 6), [5, 4, 4, 4, 4, 4]);
        // Limit 1: one request per two windows.
        assert_eq!(sustained(1, 1_000, 6), [1, 0, 1, 0, 1, 0]);
    }

    /// The previous window's weight is exact to the microsecond while limit × steps fits in
    /// 2^52, and stepped beyond, the steps still covering the whole window.
    #[test]
    fn the_weight_is_exact_up_to_2_pow_52_and_stepped_beyond() {
        let day = Duration::from_secs(86_400);
        assert_eq!(SlidingWindow::new(50_000, day).unwrap().step, 1);
        let huge = SlidingWindow::new(1_000_000_000, day).unwrap();
        // 2^52 / 10^9 = 4,503,599 steps at most: ⌈86,400,000,000 / 4,503,599⌉ µs each.
        assert_eq!(huge.step, 19_185);
        assert!(huge.limit * huge.steps <= MAX_PRODUCT);
        assert!(huge.steps * huge.step >= huge.window);
    }
}
