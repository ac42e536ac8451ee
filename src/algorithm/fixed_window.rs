//! Fixed window: a counter per window.

use std::time::Duration;

use super::{check_window, Eval, Model, Refund, MAX_PRODUCT, MAX_SCALED};
use crate::error::ConfigError;

/// Where a fixed window starts; the number is its code in the Lua models and the fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum WindowAnchor {
    /// Windows are aligned to the Unix epoch: `[k·window, (k+1)·window)`. Every key's windows
    /// turn over at the same instants (a minute window turns at each whole minute).
    #[default]
    Epoch = 0,
    /// A window starts at a key's first request and lasts `window` (Redis's `SET key 1 EX
    /// window` / `INCR` pattern).
    FirstHit = 1,
}

/// At most `limit` units per window (see [`Rule::fixed_window`](crate::Rule::fixed_window)).
///
/// A count above the limit (a settled debt) is paid `limit` per window, the rest carried
/// into the next; the state lives until it is paid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FixedWindow {
    /// The most units admitted per window.
    pub(super) limit: u64,
    /// The window length in µs.
    pub(super) window: u64,
    pub(super) anchor: WindowAnchor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowState {
    pub(crate) start: u64,
    pub(crate) count: u64,
}

impl FixedWindow {
    /// What an invalid [`Rule`](crate::Rule) holds in place of its algorithm; never decided with.
    pub(crate) const UNUSABLE: Self = Self {
        limit: 1,
        window: 1,
        anchor: WindowAnchor::Epoch,
    };

    /// At most `limit` units per `window`, windows placed by `anchor`.
    pub(crate) fn new(
        limit: u64,
        window: Duration,
        anchor: WindowAnchor,
    ) -> Result<Self, ConfigError> {
        let (limit, window) = check_window("fixed window", limit, window)?;
        Ok(Self {
            limit,
            window,
            anchor,
        })
    }
}

impl FixedWindow {
    /// The state at `now`: the window holding `now`, the stored count less `limit` per
    /// window since.
    fn at(&self, s: &WindowState, now: u64) -> WindowState {
        let turns = now.saturating_sub(s.start) / self.window;
        if turns == 0 {
            return *s;
        }
        WindowState {
            start: s.start + turns * self.window,
            count: s.count.saturating_sub(turns.saturating_mul(self.limit)),
        }
    }
}

impl Model for FixedWindow {
    type State = WindowState;
    super::stored_as!(FixedWindow);

    fn settled_at(&self, s: &WindowState) -> u64 {
        s.start
    }

    fn fresh(&self, now: u64) -> WindowState {
        let start = match self.anchor {
            WindowAnchor::Epoch => now - now % self.window,
            WindowAnchor::FirstHit => now,
        };
        WindowState { start, count: 0 }
    }

    fn evaluate(&self, s: &WindowState, now: u64, cost: u64) -> Eval {
        let s = self.at(s, now);
        let reset = self.expires_at(&s).saturating_sub(now);
        let remaining = self.limit.saturating_sub(s.count);
        if cost > self.limit {
            return Eval::reject(None, remaining, reset);
        }
        if cost <= remaining {
            Eval::admit(0, remaining - cost, reset)
        } else {
            // Each window pays `limit` of the count: the first window with room admits.
            let windows = windows_until_room(self.limit, s.count, cost);
            let retry = s.start + windows * self.window - now;
            Eval::reject(Some(retry), remaining, reset)
        }
    }

    fn apply(&self, s: &mut WindowState, now: u64, cost: u64) {
        *s = self.at(s, now);
        s.count += cost;
    }

    /// The count carries the debt, up to what the windows within the exact range pay.
    fn overdraw(&self, s: &mut WindowState, now: u64, cost: u64) {
        *s = self.at(s, now);
        s.count = (s.count + cost).min(most_owed(self.limit, self.window).max(s.count));
    }

    /// Counts add up, so taking an admission back out of its window leaves exactly the
    /// others, whatever was admitted since.
    fn refund(&self, s: &mut WindowState, Refund { at, cost, .. }: Refund) -> bool {
        if s.start <= at && at < s.start.saturating_add(self.window) {
            s.count = s.count.saturating_sub(cost);
            true
        } else {
            false
        }
    }

    /// A started first-hit window that counts nothing had all its admissions given back: the
    /// next admission starts its own. One that starts later was opened by a reservation and
    /// stays, keeping the key closed until then.
    fn is_unused(&self, s: &WindowState, now: u64) -> bool {
        self.anchor == WindowAnchor::FirstHit && s.count == 0 && s.start <= now
    }

    /// The end of the window whose carried count is paid: the first window after the
    /// stored one when the count is within the limit.
    fn expires_at(&self, s: &WindowState) -> u64 {
        let windows = s.count.div_ceil(self.limit).max(1);
        s.start.saturating_add(windows.saturating_mul(self.window))
    }
}

/// The most units a window-counting model owes: what `limit` per `window` pays within
/// [`MAX_SCALED`] µs (one window at least), and at most [`MAX_PRODUCT`]; a count beyond
/// it would be paid off outside the exact range.
pub(super) fn most_owed(limit: u64, window: u64) -> u64 {
    limit
        .saturating_mul((MAX_SCALED / window).max(1))
        .min(MAX_PRODUCT)
}

/// The windows from the one `count` is in until one whose carried count leaves room for
/// `cost` (at most `limit`), each window paying `limit` of it.
pub(super) fn windows_until_room(limit: u64, count: u64, cost: u64) -> u64 {
    (count + cost).saturating_sub(limit).div_ceil(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With an epoch anchor, windows start at multiples of their length, and a denial's
    /// retry and the state's expiry fall at the next multiple.
    #[test]
    fn epoch_windows_turn_over_at_multiples() {
        let m = FixedWindow::new(2, Duration::from_micros(10), WindowAnchor::Epoch).unwrap();
        let mut s = m.fresh(13);
        assert_eq!(s.start, 10);
        m.apply(&mut s, 13, 2);
        assert_eq!(
            m.evaluate(&s, 14, 1).verdict,
            super::super::Verdict::Reject {
                retry_micros: Some(6)
            }
        );
        assert_eq!(m.expires_at(&s), 20);
    }

    /// A fixed window with a zero limit or a zero length is a configuration error.
    #[test]
    fn zero_limit_is_a_config_error() {
        assert!(FixedWindow::new(0, Duration::from_secs(1), WindowAnchor::Epoch).is_err());
        assert!(FixedWindow::new(1, Duration::ZERO, WindowAnchor::Epoch).is_err());
    }
}
