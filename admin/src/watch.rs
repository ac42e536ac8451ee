//! What the router is given to watch beside the limiter's [`Health`], which says only
//! *that* something is away: a circuit breaker's own health, and how full an in-process
//! store is. The router is generic over the layer's store and cannot reach
//! either inside it, so the application hands them over ([`Admin::breaker`],
//! [`Admin::memory_store`]): both are cheap clones sharing the state they watch.
//!
//! [`Admin::breaker`]: crate::Admin::breaker
//! [`Admin::memory_store`]: crate::Admin::memory_store

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;
use tollgate::store::{Breaker, Health, MemoryStats, MemoryStore, Store};

use super::activity::now_second;

/// A breaker's health, whatever store it wraps: failing while it is open or probing.
#[derive(Clone)]
pub(crate) struct BreakerWatch(Arc<dyn Fn() -> Health + Send + Sync>);

impl BreakerWatch {
    pub(crate) fn of<S: Store + Clone>(breaker: &Breaker<S>) -> Self {
        let breaker = breaker.clone();
        Self(Arc::new(move || breaker.health()))
    }

    pub(crate) fn view(&self) -> BreakerView {
        let (state, meaning) = match (self.0)() {
            Health::Failing => (
                "open",
                "open after repeated failures (calls fail at once, without waiting on the \
                 store, until a probe finds it back), or the store behind it says it is \
                 failing: a fallback decides, or the failure policy",
            ),
            _ => ("closed", "calls go to the store"),
        };
        BreakerView { state, meaning }
    }
}

impl fmt::Debug for BreakerWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BreakerWatch").field(&(self.0)()).finish()
    }
}

/// A circuit breaker's state and what it means.
#[derive(Debug, Serialize)]
pub(crate) struct BreakerView {
    pub(crate) state: &'static str,
    pub(crate) meaning: &'static str,
}

/// How far back "recently" reaches for an in-process store's evictions and refusals, in
/// seconds.
pub(crate) const RECENT_SECONDS: u64 = 300;

/// What the store does when full, as the page says it.
const WHEN_FULL: &str = "A shard of the store at its share of the bound makes room for a \
new key by forgetting the entries whose state says least: a forgotten key starts afresh, so \
it may be admitted up to a quota more. A locked key is never forgotten: a shard full of \
locked keys takes new keys up to twice its share, then denies them until a lock ends \
(refused for want of room).";

/// What a store has counted since it was made, as seen at one second.
#[derive(Debug, Clone, Copy)]
struct Sample {
    second: u64,
    stats: MemoryStats,
}

/// An in-process store and its counts as they were seen, to tell whether it is evicting or
/// refusing now: the store counts both since it was made, not when they happened.
#[derive(Clone)]
pub(crate) struct MemoryWatch {
    store: MemoryStore,
    /// The counts as seen, oldest first: the oldest is the last seen at least
    /// [`RECENT_SECONDS`] ago, if any, or the first ever.
    samples: Arc<Mutex<VecDeque<Sample>>>,
}

impl MemoryWatch {
    pub(crate) fn of(store: &MemoryStore) -> Self {
        let watch = Self {
            store: store.clone(),
            samples: Arc::default(),
        };
        let first = watch.sample();
        watch.samples.lock().push_back(first);
        watch
    }

    fn sample(&self) -> Sample {
        Sample {
            second: now_second(),
            stats: self.store.stats(),
        }
    }

    /// The store now, and its evictions and refusals since the oldest look within about
    /// [`RECENT_SECONDS`] (or since this watch began, if later).
    pub(crate) fn view(&self) -> MemoryView {
        let now = self.sample();
        let before = {
            let mut samples = self.samples.lock();
            if samples.back().is_none_or(|s| s.second < now.second) {
                samples.push_back(now);
            }
            // Keep one sample at least RECENT_SECONDS old: the base of the difference.
            while samples
                .get(1)
                .is_some_and(|s| s.second + RECENT_SECONDS <= now.second)
            {
                samples.pop_front();
            }
            samples.front().copied().unwrap_or(now)
        };
        let recent_seconds = now.second - before.second;
        let (now, before) = (now.stats, before.stats);
        let recent = now.evictions.saturating_sub(before.evictions);
        let refused_recently = now.refusals.saturating_sub(before.refusals);
        MemoryView {
            keys: now.keys,
            evictions: now.evictions,
            evicted_recently: recent,
            refusals: now.refusals,
            refused_recently,
            recent_seconds,
            full: recent > 0 || refused_recently > 0,
            when_full: WHEN_FULL,
        }
    }
}

impl fmt::Debug for MemoryWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWatch")
            .field("evictions", &self.store.stats().evictions)
            .finish_non_exhaustive()
    }
}

/// How full an in-process store is.
#[derive(Debug, Serialize)]
pub(crate) struct MemoryView {
    /// Entries held, expired ones included until swept.
    pub(crate) keys: usize,
    /// Entries forgotten to make room for new keys since the store was made.
    pub(crate) evictions: u64,
    /// Of those, the ones forgotten in the last `recent_seconds`.
    pub(crate) evicted_recently: u64,
    /// Decisions denied for want of room (a shard full of locked keys) since the store was
    /// made.
    pub(crate) refusals: u64,
    /// Of those, the ones in the last `recent_seconds`.
    pub(crate) refused_recently: u64,
    pub(crate) recent_seconds: u64,
    /// Whether the store is at its bound: it evicted, or refused new keys, recently.
    pub(crate) full: bool,
    /// What the store does when full.
    pub(crate) when_full: &'static str,
}
