//! Penalty lockouts: after repeated denials a key is locked out for a while.

use std::time::Duration;

use crate::clock::duration_to_micros_ceil;

/// Locks a key out for `lock_for` after `after` denials of the same rule within `within`.
///
/// While locked, every request of the key is denied with
/// [`DenyReason::Locked`](crate::DenyReason::Locked) and a retry-after of the remaining lock
/// time, without touching the algorithm's state (one costing more than the capacity keeps
/// [`DenyReason::CostExceedsCapacity`](crate::DenyReason::CostExceedsCapacity)). Denials are
/// counted in a window that opens at the first denial and lasts `within`; like a lock, an
/// open window belongs to the rule's name, so a configuration with another `within` (a
/// rolling deploy) counts in it until it ends. On a limit charged
/// by outcome, see [`Charge`](crate::layer::Charge) for which refusals count.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Penalty, Rule};
///
/// // Ten denials within a minute lock the key for ten minutes.
/// let penalty = Penalty::lock_for(Duration::from_secs(600))
///     .after(10)
///     .within(Duration::from_secs(60));
/// let login = Rule::fixed_window("login", 5, Duration::from_secs(60)).with_penalty(penalty);
/// assert_eq!(login.penalty(), Some(&penalty));
/// assert_eq!(penalty.lock_duration(), Duration::from_secs(600));
/// assert_eq!((penalty.denials(), penalty.window()), (10, Duration::from_secs(60)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Penalty {
    lock_for: u64,
    after: u64,
    within: u64,
}

impl Penalty {
    /// Lock for `duration` after the first denial (change with [`after`](Self::after)).
    pub fn lock_for(duration: Duration) -> Self {
        let lock_for = duration_to_micros_ceil(duration);
        Self {
            lock_for,
            after: 1,
            within: lock_for,
        }
    }

    /// Lock only after `denials` denials (0 is read as 1).
    pub fn after(mut self, denials: u64) -> Self {
        self.after = denials.max(1);
        self
    }

    /// Count denials within windows of `window` (default: the lock duration).
    pub fn within(mut self, window: Duration) -> Self {
        self.within = duration_to_micros_ceil(window);
        self
    }

    /// How long a lock lasts ([`lock_for`](Self::lock_for)).
    pub fn lock_duration(&self) -> Duration {
        Duration::from_micros(self.lock_for)
    }

    /// How many denials lock the key ([`after`](Self::after)).
    pub fn denials(&self) -> u64 {
        self.after
    }

    /// The window denials are counted in ([`within`](Self::within)).
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.within)
    }

    /// Records a denial at `now`; returns whether it locked the key.
    pub(crate) fn record_denial(&self, s: &mut PenaltyState, now: u64) -> bool {
        if s.denials == 0 || s.window_end <= now {
            s.window_end = now.saturating_add(self.within);
            s.denials = 0;
        }
        s.denials += 1;
        if s.denials >= self.after {
            s.locked_until = now.saturating_add(self.lock_for);
            s.denials = 0;
            return true;
        }
        false
    }
}

/// How long (µs) past its state's end a store keeps a key of a rule with a penalty: a
/// refusal the layer defers until the requests beside it settle (at most its settle
/// deadline, then the call's own time) is counted on the state it was refused on, not on a
/// fresh one ([`Store::count_denials`](crate::store::Store::count_denials)). The Lua
/// scripts' `REFUSALS_KEPT_US`.
pub(crate) const REFUSALS_KEPT_MICROS: u64 = 3_000_000;

/// Lock and denial bookkeeping of one rule for one key. It belongs to the name, not to a
/// configuration: one without the penalty, or with another, writing the key keeps it, so it
/// says itself until when it counts (the window's end, not its start).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PenaltyState {
    pub(crate) locked_until: u64,
    pub(crate) denials: u64,
    pub(crate) window_end: u64,
}

impl PenaltyState {
    /// Microseconds of lock left at `now`, if the key is locked.
    pub(crate) fn locked_for(&self, now: u64) -> Option<u64> {
        (self.locked_until > now).then(|| self.locked_until - now)
    }

    /// The instant from which this holds nothing worth keeping.
    pub(crate) fn expires_at(&self) -> u64 {
        let counting = if self.denials > 0 { self.window_end } else { 0 };
        counting.max(self.locked_until)
    }
}
