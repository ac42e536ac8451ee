//! Logs that cannot flood: during a store outage or a shadow rollout every request has
//! something to report, and one line per request would bury everything else in the log.
//!
//! Each kind of event is logged at once the first time; the rest of the interval's events
//! are counted (a store failure's latest error kept), and a summary line when the interval
//! ends says how many, so a lasting outage costs one line per interval. A kind whose
//! interval passes quiet logs its next event at once again.
//!
//! The summary comes when the interval ends (from a task, [`summaries`]), so an outage's
//! tail is reported even when no failure follows.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tracing::Level;

use crate::clock::duration_to_micros;
use crate::error::StoreError;

/// How often each kind of event is logged at most, by default.
pub(crate) const DEFAULT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// What the layer logs about; each kind is limited on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// The store failed (unreachable, timed out).
    StoreFailure,
    /// A rule in shadow (shadow mode, or a shadow limit) would have denied a request.
    ShadowDenial,
    /// In shadow, a request had no key and would have been refused for it.
    ShadowMissingKey,
    /// A key the server can never provide (a peer-IP key without connection info).
    KeyUnavailable,
    /// The units of a request that will not pass (or does not count) could not be given
    /// back: the store failed.
    RefundFailure,
    /// The in-process store reached its bound on keys.
    StoreFull,
    /// A decision observer panicked.
    ObserverPanic,
}

const KINDS: usize = 7;

/// Each kind's summary line, in [`Event`]'s order (`event as usize`): its level and sentence.
const SUMMARIES: [(Level, &str); KINDS] = [
    (Level::WARN, "rate limit store failed again"),
    (
        Level::INFO,
        "shadow: more requests would have been rate limited",
    ),
    (
        Level::INFO,
        "shadow: more requests would have been refused for their key",
    ),
    (Level::ERROR, "rate limit key unavailable again"),
    (Level::WARN, "more refunds failed"),
    (Level::WARN, "the in-process store stayed full"),
    (Level::ERROR, "decision observers panicked again"),
];

/// The rate limiter of the layer's own log lines; shared by every clone of a service.
pub(crate) struct EventLog {
    /// Instants are kept as µs since this one, in atomics.
    origin: Instant,
    /// The interval in µs: the running configuration's, which a reload may change.
    interval: AtomicU64,
    kinds: [EventCount; KINDS],
    /// The latest store failure left out of the log, for the summary.
    last_failure: Mutex<Option<StoreError>>,
    /// Whether the summary task runs (at most one per log).
    summarizing: AtomicBool,
}

#[derive(Default)]
struct EventCount {
    /// µs since `origin` from which the next event is logged; 0 = log the next event.
    next: AtomicU64,
    /// Events left out since the last line.
    suppressed: AtomicU64,
}

impl EventLog {
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            origin: Instant::now(),
            interval: AtomicU64::new(duration_to_micros(interval)),
            kinds: Default::default(),
            last_failure: Mutex::new(None),
            summarizing: AtomicBool::new(false),
        }
    }

    /// Logs each kind at most once per `interval` from now on; what was left out so far is
    /// still summed up when its interval ends.
    pub(crate) fn set_interval(&self, interval: Duration) {
        self.interval
            .store(duration_to_micros(interval), Ordering::Relaxed);
    }

    fn interval(&self) -> u64 {
        self.interval.load(Ordering::Relaxed)
    }

    /// µs since `origin`, +1 so that an event at the origin itself is never "before" a
    /// fresh kind's 0.
    fn now(&self) -> u64 {
        duration_to_micros(Instant::now().saturating_duration_since(self.origin)) + 1
    }

    /// Whether to log this `event` now: `Some(n)` with the number of events of its kind left
    /// out since its last line, or `None` to leave it out (it is counted, and summed up when
    /// the interval ends).
    pub(crate) fn admit(self: &Arc<Self>, event: Event) -> Option<u64> {
        let kind = &self.kinds[event as usize];
        let now = self.now();
        // One caller wins the line for this interval; the others are counted.
        if self.claim(kind, now) {
            return Some(kind.suppressed.swap(0, Ordering::AcqRel));
        }
        kind.suppressed.fetch_add(1, Ordering::AcqRel);
        self.summarize_later();
        None
    }

    /// Whether the caller takes `kind`'s line at `now` (its interval has ended, and no other
    /// caller took it first), starting its next interval.
    fn claim(&self, kind: &EventCount, now: u64) -> bool {
        let next = kind.next.load(Ordering::Acquire);
        now >= next
            && kind
                .next
                .compare_exchange(
                    next,
                    now.saturating_add(self.interval()),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// [`admit`](Self::admit) for a store failure, keeping `error` for the summary when it
    /// is left out.
    pub(crate) fn admit_store_failure(self: &Arc<Self>, error: &StoreError) -> Option<u64> {
        let admitted = self.admit(Event::StoreFailure);
        if admitted.is_none() {
            // Under contention another failure is being kept: either is "the last".
            if let Some(mut last) = self.last_failure.try_lock() {
                if last.as_ref() != Some(error) {
                    *last = Some(error.clone());
                }
            }
        }
        admitted
    }

    /// Makes sure the summary task runs.
    fn summarize_later(self: &Arc<Self>) {
        if self.summarizing.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(summaries(Arc::downgrade(self)));
            }
            // No runtime to wait in: the next line carries the count.
            Err(_) => self.summarizing.store(false, Ordering::Release),
        }
    }

    /// The earliest end of an interval with events left out, in µs since `origin`.
    fn next_summary(&self) -> Option<u64> {
        self.kinds
            .iter()
            .filter(|k| k.suppressed.load(Ordering::Acquire) > 0)
            .map(|k| k.next.load(Ordering::Acquire))
            .min()
    }

    /// Writes the summary of every kind whose interval has ended with events left out, and
    /// starts its next interval.
    fn write_due_summaries(&self) {
        let now = self.now();
        for (i, kind) in self.kinds.iter().enumerate() {
            // An event that takes the line first carries the count itself.
            if kind.suppressed.load(Ordering::Acquire) == 0 || !self.claim(kind, now) {
                continue;
            }
            let suppressed = kind.suppressed.swap(0, Ordering::AcqRel);
            if suppressed > 0 {
                self.write_summary(i, suppressed);
            }
        }
    }

    /// Writes the summary of kind `i` (`event as usize`).
    fn write_summary(&self, i: usize, suppressed: u64) {
        let (level, what) = SUMMARIES[i];
        let interval_s = Duration::from_micros(self.interval()).as_secs_f64();
        // Only store failures keep an error; `None` writes no field.
        let last = (i == Event::StoreFailure as usize)
            .then(|| self.last_failure.lock().take())
            .flatten();
        let last_error = last.as_ref().map(tracing::field::display);
        // A level is part of a callsite's static metadata: one call per level.
        macro_rules! summary {
            ($level:ident) => {
                tracing::$level!(
                    suppressed,
                    last_error,
                    interval_s,
                    "{what} (summary of the last interval)"
                )
            };
        }
        match level {
            Level::ERROR => summary!(error),
            Level::WARN => summary!(warn),
            _ => summary!(info),
        }
    }
}

/// The summary task of a log, spawned by the first event left out: wakes when an interval
/// with events left out ends, writes the summaries, and ends once nothing is left out (or
/// the layer is gone).
async fn summaries(log: Weak<EventLog>) {
    loop {
        let wake = {
            let Some(log) = log.upgrade() else { return };
            match log.next_summary() {
                Some(next) => log.origin + Duration::from_micros(next.saturating_sub(1)),
                None => {
                    log.summarizing.store(false, Ordering::Release);
                    // An event counted just before the flag was cleared saw the task
                    // running: take it back unless another task has started since.
                    if log.next_summary().is_none() || log.summarizing.swap(true, Ordering::AcqRel)
                    {
                        return;
                    }
                    continue;
                }
            }
        };
        tokio::time::sleep_until(wake).await;
        let Some(log) = log.upgrade() else { return };
        log.write_due_summaries();
    }
}

/// The log of what happens outside a layer (reservations, the in-process store): one for
/// the process, so that an outage logs a line per interval, not one per request.
pub(crate) fn process_log() -> Arc<EventLog> {
    static LOG: OnceLock<Arc<EventLog>> = OnceLock::new();
    LOG.get_or_init(|| Arc::new(EventLog::new(DEFAULT_LOG_INTERVAL)))
        .clone()
}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLog")
            .field("interval", &Duration::from_micros(self.interval()))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captures what the current thread logs, one line per event, no colours or times.
    fn capture() -> (Arc<Mutex<Vec<u8>>>, tracing::subscriber::DefaultGuard) {
        #[derive(Clone)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink(out.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .without_time()
            .with_target(false)
            .finish();
        (out, tracing::subscriber::set_default(subscriber))
    }

    /// Lets `d` pass on the paused clock and the summary task that wakes then run.
    async fn elapse(d: Duration) {
        tokio::time::advance(d).await;
        tokio::task::yield_now().await;
    }

    fn lines(out: &Mutex<Vec<u8>>) -> Vec<String> {
        let text = String::from_utf8_lossy(&std::mem::take(&mut *out.lock())).into_owned();
        text.lines().map(str::to_owned).collect()
    }

    /// The first event of a kind is logged at once, and the rest of its interval as one
    /// summary line with the count and the last store error when the interval ends.
    #[tokio::test(start_paused = true)]
    async fn first_event_at_once_then_a_summary_when_the_interval_ends() {
        let (out, _guard) = capture();
        let log = Arc::new(EventLog::new(Duration::from_secs(10)));
        assert_eq!(log.admit(Event::StoreFailure), Some(0));
        for i in 0..99 {
            let error = StoreError::Unavailable(format!("failure {i}"));
            assert_eq!(log.admit_store_failure(&error), None);
        }
        // Another kind has its own budget.
        assert_eq!(log.admit(Event::ShadowDenial), Some(0));
        elapse(Duration::from_secs(9)).await;
        assert_eq!(log.admit(Event::StoreFailure), None);
        assert!(lines(&out).is_empty());

        // The interval ends: the summary comes without another event (the outage's tail),
        // with the count and the last error kept.
        elapse(Duration::from_secs(1)).await;
        let summary = lines(&out);
        assert_eq!(summary.len(), 1, "{summary:?}");
        assert!(
            summary[0].starts_with(" WARN rate limit store failed again"),
            "{summary:?}"
        );
        assert!(summary[0].contains("suppressed=100"), "{summary:?}");
        assert!(
            summary[0].contains("last_error=rate limit store unavailable: failure 98"),
            "{summary:?}"
        );

        // The summary started a new interval: still one line per interval.
        assert_eq!(log.admit(Event::StoreFailure), None);
        elapse(Duration::from_secs(10)).await;
        let summary = lines(&out);
        assert_eq!(summary.len(), 1, "{summary:?}");
        assert!(summary[0].contains("suppressed=1"), "{summary:?}");
        // No error was kept for that one (it was not a store failure with an error).
        assert!(!summary[0].contains("last_error"), "{summary:?}");

        // A quiet interval: nothing to say, and the next event is logged at once.
        elapse(Duration::from_secs(30)).await;
        assert!(lines(&out).is_empty());
        assert!(!log.summarizing.load(Ordering::Acquire));
        assert_eq!(log.admit(Event::StoreFailure), Some(0));
    }

    /// The summary task does not keep the event log alive; it ends with the layer.
    #[tokio::test(start_paused = true)]
    async fn the_summary_task_ends_with_the_layer() {
        let log = Arc::new(EventLog::new(Duration::from_secs(10)));
        assert_eq!(log.admit(Event::ShadowDenial), Some(0));
        assert_eq!(log.admit(Event::ShadowDenial), None);
        // The task is asleep until the interval ends; it must not keep the log alive.
        tokio::task::yield_now().await;
        assert!(log.summarizing.load(Ordering::Acquire));
        let weak = Arc::downgrade(&log);
        drop(log);
        elapse(Duration::from_secs(10)).await;
        assert!(weak.upgrade().is_none());
    }

    /// A zero interval logs every event.
    #[tokio::test(start_paused = true)]
    async fn a_zero_interval_logs_every_event() {
        let log = Arc::new(EventLog::new(Duration::ZERO));
        for _ in 0..3 {
            assert_eq!(log.admit(Event::KeyUnavailable), Some(0));
        }
    }
}
