//! Time sources.
//!
//! Every decision is taken at an instant in integer microseconds since the Unix epoch. The
//! [`Clock`] is injected so that tests are deterministic: a [`ManualClock`] only moves when the
//! test moves it. A Redis store takes time from the server instead, so that instances whose
//! clocks disagree still share one timeline.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time, in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current instant in microseconds since the Unix epoch.
    fn now_micros(&self) -> u64;

    /// Whether a reading is never earlier than one taken before it on another thread
    /// (`true` by default). A clock that reads a per-core counter without a fence (the
    /// default clock of [`MemoryStore::new`](crate::store::MemoryStore::new)) may read a fraction of a microsecond behind another core's
    /// earlier reading; a [`MemoryStore`](crate::store::MemoryStore) on such a clock never lets its
    /// time go backwards within a shard (it takes the latest instant it has decided at
    /// there). Clocks that say `true` are read as they are, so a [`ManualClock`] set back is
    /// seen set back.
    fn ordered_across_threads(&self) -> bool {
        true
    }
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        // A clock set before 1970 reads as the epoch rather than panicking.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, duration_to_micros)
    }
}

/// The monotonic clock, anchored once to the wall clock: microseconds since the Unix epoch
/// as [`SystemClock`] read them when the clock was made, plus the monotonic time elapsed
/// since. The default of [`MemoryStore`](crate::store::MemoryStore::new).
///
/// It reads the CPU's time-stamp counter where that is invariant (through
/// [`quanta`](https://docs.rs/quanta), calibrated against the monotonic clock once per
/// process), several times cheaper than a read of the wall clock, which matters to an
/// in-process decision; elsewhere it reads the OS's monotonic clock.
///
/// Because it follows the monotonic clock, it never jumps: an NTP step or an administrator
/// setting the wall clock back does not move it, so limits neither freeze nor reopen when
/// the wall clock does. In exchange it drifts from the wall clock: by however far the
/// counter's rate, calibrated once per process against the monotonic clock (for up to
/// 200 ms), is off, and by the wall clock's own corrections since the anchor. Neither matters to an in-process store, whose instants
/// are only ever compared with each other (a retry-after or a reset is a duration); a store
/// whose instants other processes read (Redis) takes the server's time instead. Make a new
/// clock to re-anchor it.
///
/// Clones share the anchor.
#[derive(Debug, Clone)]
pub(crate) struct MonotonicClock {
    clock: quanta::Clock,
    /// The counter's reading at the anchor.
    start: u64,
    /// The wall clock at the anchor, in µs since the Unix epoch.
    anchor_micros: u64,
}

impl MonotonicClock {
    /// A clock anchored to the wall clock now.
    pub(crate) fn new() -> Self {
        let clock = quanta::Clock::new();
        let start = clock.raw();
        Self {
            clock,
            start,
            anchor_micros: SystemClock.now_micros(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_micros(&self) -> u64 {
        let elapsed = self.clock.delta_as_nanos(self.start, self.clock.raw()) / 1_000;
        self.anchor_micros.saturating_add(elapsed)
    }

    /// The time-stamp counter is read without a fence, and cores' counters may differ by a
    /// few cycles: two readings on two cores can come out of order.
    fn ordered_across_threads(&self) -> bool {
        false
    }
}

/// A clock as a [`MemoryStore`](crate::store::MemoryStore) holds it: its default clock called
/// directly, any other through the trait object. Every decision reads the clock, and a call
/// through the trait object would cost the default clock about as much as its reading.
#[derive(Debug, Clone)]
pub(crate) enum StoreClock {
    Monotonic(MonotonicClock),
    Any(Arc<dyn Clock>),
}

impl StoreClock {
    #[inline]
    pub(crate) fn now_micros(&self) -> u64 {
        match self {
            Self::Monotonic(clock) => clock.now_micros(),
            Self::Any(clock) => clock.now_micros(),
        }
    }

    pub(crate) fn ordered_across_threads(&self) -> bool {
        match self {
            Self::Monotonic(clock) => clock.ordered_across_threads(),
            Self::Any(clock) => clock.ordered_across_threads(),
        }
    }
}

/// A clock that moves only when told to: for tests and simulations.
///
/// Clones share the same instant.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_000);
/// clock.advance(Duration::from_millis(2));
/// assert_eq!(clock.now_micros(), 3_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock that reads `micros` microseconds since the epoch until it is moved.
    pub fn new(micros: u64) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(micros)),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(duration_to_micros(by), Ordering::SeqCst);
    }

    /// Sets the clock to `micros` microseconds since the epoch (it may go backwards).
    pub fn set_micros(&self, micros: u64) {
        self.now.store(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// Whole microseconds in `d`, saturating at `u64::MAX`.
pub(crate) fn duration_to_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// `d` in whole microseconds, a fraction rounded up: for the durations that set a quota (a
/// rate's period, a window, a lock), so that rounding never admits more than configured.
pub(crate) fn duration_to_micros_ceil(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000)).unwrap_or(u64::MAX)
}
