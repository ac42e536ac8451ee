//! Logs that cannot flood: during a store outage or a shadow rollout every request has
//! something to report, and one line per request would bury everything else in the log.
//!
//! Each kind of event is logged at once the first time, then at most once per interval:
//! the event that ends a quiet interval is logged with the number of events of its kind
//! that were left out since the last line (`suppressed`), so the line carries the count
//! and the latest error. Nothing is stored per event and nothing allocates; a kind that
//! goes quiet logs its last count with its next event.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::duration_to_micros;

/// How often each kind of event is logged at most, by default.
pub(crate) const DEFAULT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// What the layer logs about; each kind is limited on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// The store failed (unreachable, timed out).
    StoreFailure,
    /// A rule on trial (shadow mode, or a shadow limit) would have denied a request.
    ShadowDenial,
    /// In shadow, a request had no key and would have been refused for it.
    ShadowMissingKey,
    /// A key the server can never provide (a peer-IP key without connection info).
    KeyUnavailable,
}

const KINDS: usize = 4;

/// The rate limiter of the layer's own log lines; shared by every clone of a service.
pub(crate) struct EventLog {
    /// Instants are kept as µs since this one, in atomics.
    origin: Instant,
    interval: u64,
    kinds: [Kind; KINDS],
}

#[derive(Default)]
struct Kind {
    /// µs since `origin` from which the next event is logged; 0 = log the next event.
    next: AtomicU64,
    /// Events left out since the last line.
    suppressed: AtomicU64,
}

impl EventLog {
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            origin: Instant::now(),
            interval: duration_to_micros(interval),
            kinds: Default::default(),
        }
    }

    /// Whether to log this `event` now: `Some(n)` with the number of events of its kind left
    /// out since its last line, or `None` to leave it out (it is counted).
    pub(crate) fn admit(&self, event: Event) -> Option<u64> {
        let kind = &self.kinds[event as usize];
        // +1 so that an event at the origin itself is never "before" a fresh kind's 0.
        let now = duration_to_micros(Instant::now().saturating_duration_since(self.origin)) + 1;
        let next = kind.next.load(Ordering::Acquire);
        let due = next == 0 || now >= next;
        // One caller wins the line for this interval; the others are counted.
        if due
            && kind
                .next
                .compare_exchange(
                    next,
                    now.saturating_add(self.interval),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
        {
            return Some(kind.suppressed.swap(0, Ordering::AcqRel));
        }
        kind.suppressed.fetch_add(1, Ordering::AcqRel);
        None
    }
}

impl Default for EventLog {
    fn default() -> Self {
        Self::new(DEFAULT_LOG_INTERVAL)
    }
}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLog")
            .field("interval", &Duration::from_micros(self.interval))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn first_event_at_once_then_one_line_per_interval_with_the_count() {
        let log = EventLog::new(Duration::from_secs(10));
        assert_eq!(log.admit(Event::StoreFailure), Some(0));
        for _ in 0..99 {
            assert_eq!(log.admit(Event::StoreFailure), None);
        }
        // Another kind has its own budget.
        assert_eq!(log.admit(Event::ShadowDenial), Some(0));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(log.admit(Event::StoreFailure), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(log.admit(Event::StoreFailure), Some(100));
        assert_eq!(log.admit(Event::StoreFailure), None);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(log.admit(Event::StoreFailure), Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_interval_logs_every_event() {
        let log = EventLog::new(Duration::ZERO);
        for _ in 0..3 {
            assert_eq!(log.admit(Event::KeyUnavailable), Some(0));
        }
    }
}
