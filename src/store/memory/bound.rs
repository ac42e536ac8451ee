//! The bound on the keys a [`MemoryStore`](super::MemoryStore) holds: past it, a key the
//! store does not hold yet is decided on one state per rule that every such key shares, so
//! that clients sending ever new keys cost a bounded memory and are never admitted more
//! than the rules allow (together they are admitted as one key would be).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;

use hashbrown::{DefaultHashBuilder, HashMap};
use parking_lot::Mutex;

use super::{MemoryStore, Shard, Shared};
use crate::clock::StoreClock;
use crate::log::Event;
use crate::store::check::Check;

/// The key every key past the bound is decided under: one byte `0xFF`, which no key a
/// client sends can be (a key that starts with `0xFF` is stored as its 33-byte digest).
const OVERFLOW: &[u8] = &[0xFF];

/// How many keys a store holds by default.
pub(crate) const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The bound, per shard, and how many shards are at it.
pub(super) struct Bound {
    per_shard: usize,
    /// The shards at their share of the bound (each counts itself in as it fills and out as
    /// a sweep empties it): while none is, no decision pays for the check below.
    full: Arc<AtomicUsize>,
}

impl Bound {
    pub(super) fn new(max_keys: usize, shards: usize) -> Self {
        Self {
            per_shard: max_keys.div_ceil(shards).max(1),
            full: Arc::default(),
        }
    }

    /// The keys one shard holds at most.
    pub(super) fn per_shard(&self) -> usize {
        self.per_shard
    }

    /// The count a shard keeps itself in while it is at its share of the bound.
    pub(super) fn full(&self) -> Arc<AtomicUsize> {
        self.full.clone()
    }
}

impl Shared {
    /// `batch` with the key of every check the store does not hold, in a shard that is full
    /// even after its expired entries are swept, replaced by the overflow key; `None` when
    /// every key is decided as it is.
    #[inline]
    pub(super) fn bounded<'a>(&self, batch: &[Check<'a>]) -> Option<SmallVec<[Check<'a>; 4]>> {
        if self.bound.full.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.redirected(batch)
    }

    /// [`bounded`](Self::bounded) once some shard is full.
    #[inline(never)]
    fn redirected<'a>(&self, batch: &[Check<'a>]) -> Option<SmallVec<[Check<'a>; 4]>> {
        let mut redirected: Option<SmallVec<[Check<'a>; 4]>> = None;
        for (i, check) in batch.iter().enumerate() {
            if check.key == OVERFLOW || !self.is_full_without(check) {
                continue;
            }
            let checks = redirected.get_or_insert_with(|| batch.into());
            checks[i].key = OVERFLOW;
        }
        if redirected.is_some() {
            if let Some(suppressed) = crate::reservation::process_log().admit(Event::StoreFull) {
                tracing::warn!(
                    suppressed,
                    "the in-process store is full: new keys share one state per rule"
                );
            }
            #[cfg(feature = "metrics")]
            metrics::counter!("tollgate_memory_store_full_total").increment(1);
        }
        redirected
    }

    /// Whether `check`'s key is not held and its shard is full, after a sweep.
    fn is_full_without(&self, check: &Check<'_>) -> bool {
        let hash = self.hash(check.rule, check.key);
        let mut shard = self.shards[self.shard_of(hash)].lock();
        if shard.map.len() < self.bound.per_shard || shard.get(hash, check).is_some() {
            return false;
        }
        shard.sweep(self.clock.now_micros());
        shard.map.len() >= self.bound.per_shard
    }
}

impl MemoryStore {
    /// The same store holding at most about `n` keys (default 1,000,000; what a key costs is
    /// under [What a key costs](MemoryStore#what-a-key-costs)): past the bound, a key it does not hold yet is
    /// decided on one state per rule that all such keys share, so together they are admitted
    /// as one key would be, never more than the rules allow, and a warning is logged (and
    /// counted as `tollgate_memory_store_full_total` with the `metrics` feature). Expired
    /// entries are swept before a key is turned away. Call it on a new store: it starts
    /// empty.
    pub fn max_keys(self, n: usize) -> Self {
        Self::build(self.shared.clock.clone(), n)
    }

    pub(super) fn build(clock: StoreClock, max_keys: usize) -> Self {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        let shards = (cores * 16).next_power_of_two().max(16);
        let hasher = DefaultHashBuilder::default();
        let bound = Bound::new(max_keys, shards);
        Self {
            shared: Arc::new(Shared {
                shards: (0..shards)
                    .map(|_| {
                        Mutex::new(Shard {
                            map: HashMap::with_hasher(hasher.clone()),
                            cap: bound.per_shard(),
                            full: bound.full(),
                            at_cap: false,
                            len_after_sweep: 0,
                            latest: 0,
                        })
                    })
                    .collect(),
                bound,
                hasher,
                clamp: !clock.ordered_across_threads(),
                clock,
            }),
        }
    }
}
