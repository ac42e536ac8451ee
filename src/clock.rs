//! Time sources.
//!
//! Every decision is taken at an instant in integer µs since the Unix epoch. The [`Clock`] is
//! injected so that tests are deterministic: a [`ManualClock`] moves when the test moves it. A
//! Redis store takes time from the server, so instances whose clocks disagree share one timeline.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time, in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current instant in µs since the Unix epoch, at once (no I/O, no lock that waits):
    /// a [`MemoryStore`](crate::store::MemoryStore) may read it holding a shard's lock.
    fn now_micros(&self) -> u64;

    /// Whether a reading is never earlier than one taken before it on another thread
    /// (`true` by default). On a clock that says `false` (a per-core counter read without a
    /// fence), a [`MemoryStore`](crate::store::MemoryStore) never lets its time go backwards
    /// within a shard; one that says `true` is read as it is, so a [`ManualClock`] set back is
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
/// [`quanta`](https://docs.rs/quanta), calibrated once per process), cheaper than the wall
/// clock; elsewhere the OS's monotonic clock.
///
/// It never jumps: an NTP step or a wall clock set back does not move it, so limits neither
/// freeze nor reopen. In exchange it drifts from the wall clock (by the calibration's error
/// and the wall clock's corrections since the anchor), which does not matter to an
/// in-process store, whose instants are only compared with each other. Clones share the anchor.
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
/// directly (a virtual call would cost about as much as its reading), any other through the
/// trait object.
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
