//! Sliding log: one entry per admission, exact.

use std::collections::VecDeque;
use std::time::Duration;

use super::{check_range, Eval, Model, MAX_SCALED};
use crate::clock::duration_to_micros;
use crate::error::ConfigError;

/// Never more than `limit` units in any window-long interval: every admission is logged
/// with its time and cost, and an entry counts until `window` after it was made.
///
/// Exact, at the price of memory proportional to the admissions in one window (at most
/// `limit` entries per key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    limit: u64,
    window: u64,
}

/// Admissions in time order: `(instant µs, cost)`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct LogState {
    pub(crate) entries: VecDeque<(u64, u64)>,
}

impl SlidingLog {
    /// At most `limit` units in any interval of length `window`.
    pub fn new(limit: u64, window: Duration) -> Result<Self, ConfigError> {
        let limit = check_range("sliding log limit", limit, MAX_SCALED)?;
        let window = check_range(
            "sliding log window (µs)",
            duration_to_micros(window),
            MAX_SCALED,
        )?;
        Ok(Self { limit, window })
    }

    /// The most units in any window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length in microseconds.
    pub fn window_micros(&self) -> u64 {
        self.window
    }

    /// Entries still counting at `now`, oldest first.
    fn live<'a>(&self, s: &'a LogState, now: u64) -> impl Iterator<Item = &'a (u64, u64)> + 'a {
        let window = self.window;
        s.entries
            .iter()
            .filter(move |(t, _)| t.saturating_add(window) > now)
    }
}

impl Model for SlidingLog {
    type State = LogState;
    super::stored_as!(SlidingLog);

    fn settled_at(&self, s: &LogState) -> u64 {
        s.entries.back().map_or(0, |(t, _)| *t)
    }

    fn fresh(&self, _now: u64) -> LogState {
        LogState::default()
    }

    fn evaluate(&self, s: &LogState, now: u64, cost: u64) -> Eval {
        let used: u64 = self.live(s, now).map(|(_, c)| c).sum();
        let remaining = self.limit.saturating_sub(used);
        let newest = s.entries.back().map_or(now, |(t, _)| *t);
        if cost > self.limit {
            return Eval::reject(None, remaining, (newest + self.window).saturating_sub(now));
        }
        if cost <= remaining {
            return Eval::admit(0, remaining - cost, self.window);
        }
        // Admitted once enough of the oldest entries have aged out.
        let mut to_free = cost - remaining;
        let mut retry = None;
        for (t, c) in self.live(s, now) {
            to_free = to_free.saturating_sub(*c);
            if to_free == 0 {
                retry = Some(t + self.window - now);
                break;
            }
        }
        Eval::reject(retry, remaining, (newest + self.window).saturating_sub(now))
    }

    fn apply(&self, s: &mut LogState, now: u64, cost: u64) {
        while s
            .entries
            .front()
            .is_some_and(|(t, _)| t.saturating_add(self.window) <= now)
        {
            s.entries.pop_front();
        }
        // Entries stay in time order even when a reservation logged one in the future.
        let at = s.entries.iter().rposition(|(t, _)| *t <= now);
        match at {
            Some(i) if s.entries[i].0 == now => s.entries[i].1 += cost,
            Some(i) => s.entries.insert(i + 1, (now, cost)),
            None => s.entries.push_front((now, cost)),
        }
    }

    /// Entries add up: the units logged at `at` lose `cost`, whatever was logged since. An
    /// entry left with no units stays until it expires: a reservation at `at` pruned the
    /// entries that expire by then, and its entry keeps the key closed until `at`, so those
    /// still count for requests before it.
    fn refund(&self, s: &mut LogState, _now: u64, at: u64, cost: u64, _mark: u64) -> bool {
        let Some(entry) = s.entries.iter_mut().find(|(t, _)| *t == at) else {
            return false;
        };
        entry.1 = entry.1.saturating_sub(cost);
        true
    }

    fn expires_at(&self, s: &LogState) -> u64 {
        s.entries
            .back()
            .map_or(0, |(t, _)| t.saturating_add(self.window))
    }
}
