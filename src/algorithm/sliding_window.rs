//! Sliding window counter: the previous window's count, weighted, plus the current one's.

use std::time::Duration;

use super::{check_product, check_range, Eval, Model, MAX_SCALED};
use crate::clock::duration_to_micros;
use crate::error::ConfigError;

/// Admits while `previous × (window − elapsed) / window + current ≤ limit`, with windows
/// aligned to the epoch and `elapsed` the time into the current window.
///
/// O(1) memory (two counters) and no boundary burst of 2 × `limit`; the estimate assumes the
/// previous window's requests were spread evenly. The comparison is done in integers
/// (`previous × (window − elapsed) + current × window ≤ limit × window`), so it is exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    limit: u64,
    window: u64,
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
    pub fn new(limit: u64, window: Duration) -> Result<Self, ConfigError> {
        let limit = check_range("sliding window limit", limit, MAX_SCALED)?;
        let window = check_range(
            "sliding window length (µs)",
            duration_to_micros(window),
            MAX_SCALED,
        )?;
        check_product("sliding window limit × window (µs)", limit, window)?;
        Ok(Self { limit, window })
    }

    /// The most units per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length in microseconds.
    pub fn window_micros(&self) -> u64 {
        self.window
    }

    /// The counters as they stand at `now` (a stored state may belong to the window before).
    fn at(&self, s: &CountersState, now: u64) -> CountersState {
        if now < s.start + self.window {
            *s
        } else {
            CountersState {
                start: s.start + self.window,
                previous: s.current,
                current: 0,
            }
        }
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
        let CountersState {
            start,
            previous,
            current,
        } = self.at(s, now);
        let w = self.window;
        let elapsed = now.saturating_sub(start).min(w);
        // Everything below is scaled by the window: "units × µs".
        let capacity = self.limit * w;
        let used = previous * (w - elapsed) + current * w;
        let remaining = capacity.saturating_sub(used) / w;
        let reset = if current > 0 {
            start + 2 * w - now
        } else if previous > 0 {
            start + w - now
        } else {
            0
        };
        if cost > self.limit {
            return Eval::reject(None, remaining, reset);
        }
        if used + cost * w <= capacity {
            let after = capacity - used - cost * w;
            let reset = start + 2 * w - now;
            return Eval::admit(0, after / w, reset);
        }
        let retry_at = if current + cost <= self.limit {
            // Within this window, once the previous window's weight has shrunk enough:
            // previous × (w − e) ≤ (limit − current − cost) × w.
            let room = (self.limit - current - cost) * w;
            start + w - room / previous
        } else {
            // In the next window `current` becomes the weighted one:
            // current × (w − e) ≤ (limit − cost) × w.
            let room = (self.limit - cost) * w;
            start + 2 * w - room / current
        };
        Eval::reject(Some(retry_at.saturating_sub(now)), remaining, reset)
    }

    fn apply(&self, s: &mut CountersState, now: u64, cost: u64) {
        *s = self.at(s, now);
        s.current += cost;
    }

    /// Counts add up: an admission is taken back from whichever counter holds its window
    /// (windows start at multiples of the length), whatever was admitted since.
    fn refund(&self, s: &mut CountersState, _now: u64, at: u64, cost: u64, _mark: u64) -> bool {
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

    fn expires_at(&self, s: &CountersState) -> u64 {
        s.start.saturating_add(2 * self.window)
    }
}
