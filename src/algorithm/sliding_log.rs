//! Sliding log: one entry per admission, exact.

use std::collections::VecDeque;
use std::time::Duration;

use super::{check_window, Eval, Model, Refund, MAX_SCALED};
use crate::error::ConfigError;

/// Never more than `limit` units in any window-long interval (see
/// [`Rule::sliding_log`](crate::Rule::sliding_log)); running totals count the live units
/// without walking the log.
///
/// A debt (units settled above the limit) is paid `limit` per window: an overdraft of `cost`
/// is logged `k = ⌈cost / limit⌉ − 1` windows later as the `cost − k × limit` units left, and
/// the key admits nothing before then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlidingLog {
    /// The most units in any window.
    pub(super) limit: u64,
    /// The window length in µs.
    pub(super) window: u64,
}

/// Admissions in time order, at most one per microsecond.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct LogState {
    pub(crate) entries: VecDeque<Logged>,
}

/// One instant of a sliding log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Logged {
    /// When the units were admitted (µs).
    pub(crate) at: u64,
    /// Units admitted at that instant.
    pub(crate) cost: u64,
    /// Units the log has taken up to and including this entry, wrapping: a run's units are
    /// the difference of two totals, so nothing walks the log, and no run holds 2^64 units.
    pub(crate) through: u64,
}

impl SlidingLog {
    /// At most `limit` units in any interval of length `window`.
    pub(crate) fn new(limit: u64, window: Duration) -> Result<Self, ConfigError> {
        let (limit, window) = check_window("sliding log", limit, window)?;
        Ok(Self { limit, window })
    }

    /// The index of the first entry still counting at `now` (`entries.len()` if none).
    fn first_live(&self, s: &LogState, now: u64) -> usize {
        let window = self.window;
        s.entries
            .partition_point(|e| e.at.saturating_add(window) <= now)
    }
}

impl Model for SlidingLog {
    type State = LogState;
    super::stored_as!(SlidingLog);

    fn settled_at(&self, s: &LogState) -> u64 {
        s.entries.back().map_or(0, |e| e.at)
    }

    fn fresh(&self, _now: u64) -> LogState {
        LogState::default()
    }

    fn evaluate(&self, s: &LogState, now: u64, cost: u64) -> Eval {
        let first = self.first_live(s, now);
        // `before`: the total just before the first live entry, so live units are the
        // newest total minus it.
        let (used, before, reset) = match (s.entries.get(first), s.entries.back()) {
            (Some(oldest), Some(newest)) => {
                let before = oldest.through.wrapping_sub(oldest.cost);
                (
                    newest.through.wrapping_sub(before),
                    before,
                    (newest.at + self.window).saturating_sub(now),
                )
            }
            // Nothing counts: the log is back to empty already.
            _ => (0, 0, 0),
        };
        let remaining = self.limit.saturating_sub(used);
        if cost > self.limit {
            return Eval::reject(None, remaining, reset);
        }
        if cost <= remaining {
            // An admission logs an entry at `now`, which counts for a whole window.
            let reset = if cost > 0 { self.window } else { reset };
            return Eval::admit(0, remaining - cost, reset);
        }
        // Admitted once enough of the oldest units have aged out: after a limit was
        // lowered more than `limit` units may be live, and all the excess must go too.
        let to_free = used + cost - self.limit;
        let window = self.window;
        let freeing = s.entries.partition_point(|e| {
            e.at.saturating_add(window) <= now || e.through.wrapping_sub(before) < to_free
        });
        // `to_free ≤ used` (cost ≤ limit), so the newest entry at the latest frees enough.
        let retry = s.entries.get(freeing).map(|e| e.at + window - now);
        Eval::reject(retry, remaining, reset)
    }

    fn apply(&self, s: &mut LogState, now: u64, cost: u64) {
        // Each expired entry is dropped once, by the admission after it expired: amortised
        // O(1) per admission, and the log holds at most one entry per live unit after it.
        let first = self.first_live(s, now);
        s.entries.drain(..first);
        match s.entries.back_mut() {
            // Admissions are never earlier than the newest entry (`settled_at`); merging one
            // that were into the newest would only count it longer, never less.
            Some(newest) if newest.at >= now => {
                newest.cost += cost;
                newest.through = newest.through.wrapping_add(cost);
            }
            newest => {
                let through = newest.map_or(0, |e| e.through).wrapping_add(cost);
                s.entries.push_back(Logged {
                    at: now,
                    cost,
                    through,
                });
            }
        }
    }

    /// Logs the overdraft where its last `limit` units fall (see the type's docs), merged
    /// with an entry at `now` or later, at most [`MAX_SCALED`] µs ahead of it.
    fn overdraw(&self, s: &mut LogState, now: u64, cost: u64) {
        let first = self.first_live(s, now);
        s.entries.drain(..first);
        let ahead = s.entries.back().filter(|e| e.at >= now).copied();
        let (from, units, total) = match ahead {
            Some(e) => {
                s.entries.pop_back();
                (e.at, e.cost + cost, e.through.wrapping_sub(e.cost))
            }
            None => (now, cost, s.entries.back().map_or(0, |e| e.through)),
        };
        let horizon = (now + MAX_SCALED).saturating_sub(from) / self.window;
        let windows = (units.div_ceil(self.limit) - 1).min(horizon);
        // Past the exact range what is left is the limit at most: the rest is forgiven.
        let left = (units - windows * self.limit).min(self.limit);
        s.entries.push_back(Logged {
            at: from + windows * self.window,
            cost: left,
            through: total.wrapping_add(left),
        });
    }

    /// Entries add up: the units logged at `at` lose `cost`. An emptied entry stays until it
    /// expires: a reservation's entry keeps the key closed until `at`.
    fn refund(&self, s: &mut LogState, Refund { at, cost, .. }: Refund) -> bool {
        let Some(i) = s.entries.iter().position(|e| e.at == at) else {
            return false;
        };
        let back = s.entries[i].cost.min(cost);
        s.entries[i].cost -= back;
        // The running totals from this entry on drop by what it gives back.
        for e in s.entries.iter_mut().skip(i) {
            e.through = e.through.wrapping_sub(back);
        }
        true
    }

    fn expires_at(&self, s: &LogState) -> u64 {
        s.entries
            .back()
            .map_or(0, |e| e.at.saturating_add(self.window))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(limit: u64, window: u64) -> SlidingLog {
        SlidingLog::new(limit, Duration::from_micros(window)).unwrap()
    }

    fn retry(eval: Eval) -> Option<u64> {
        match eval.verdict {
            super::super::Verdict::Reject { retry_micros } => retry_micros,
            v => panic!("expected a rejection, got {v:?}"),
        }
    }

    /// Under a lowered limit, a request waits until enough logged units, the excess
    /// included, have aged out for it to fit.
    #[test]
    fn a_lowered_limit_waits_for_the_excess_to_age_out_too() {
        let mut s = LogState::default();
        let old = log(5, 1000);
        for t in 0..5 {
            old.apply(&mut s, t, 1);
        }
        let new = log(3, 1000);
        // 5 live, limit 3: a unit frees room only once three have gone (the third at 2).
        assert_eq!(retry(new.evaluate(&s, 10, 1)), Some(992));
        assert_eq!(retry(new.evaluate(&s, 10, 2)), Some(993));
        assert_eq!(retry(new.evaluate(&s, 1001, 1)), Some(1));
        assert!(new.evaluate(&s, 1002, 1).is_admitted());
    }

    /// The log's running totals may wrap around without changing a decision, a retry or a
    /// count.
    #[test]
    fn running_totals_wrap_without_changing_a_decision() {
        let model = log(10, 1000);
        let mut s = LogState {
            entries: VecDeque::from([Logged {
                at: 0,
                cost: 4,
                through: u64::MAX - 1,
            }]),
        };
        model.apply(&mut s, 5, 3);
        model.apply(&mut s, 7, 3);
        assert_eq!(s.entries[2].through, 4);
        let eval = model.evaluate(&s, 8, 2);
        assert_eq!(eval.remaining, 0);
        // Two units must go: the entry at 0 frees four.
        assert_eq!(retry(eval), Some(992));
        assert_eq!(retry(model.evaluate(&s, 8, 5)), Some(997));
        assert_eq!(model.evaluate(&s, 1000, 0).remaining, 4);
    }

    /// Admissions prune the entries that have aged out, so the log never holds more than
    /// the limit.
    #[test]
    fn admissions_prune_what_has_aged_out() {
        let model = log(3, 100);
        let mut s = LogState::default();
        for t in 0..1000 {
            if model.evaluate(&s, t, 1).is_admitted() {
                model.apply(&mut s, t, 1);
            }
            assert!(s.entries.len() <= 3, "{} entries at {t}", s.entries.len());
        }
    }
}
