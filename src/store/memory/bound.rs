//! The bound on the keys a [`MemoryStore`](super::MemoryStore) holds: past it, a key the
//! store does not hold yet is decided on one state per rule that every such key shares, so
//! that clients sending ever new keys cost a bounded memory and are never admitted more
//! than the rules allow (together they are admitted as one key would be).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;

use super::Shared;
use crate::log::Event;
use crate::store::check::Check;

/// The key every key past the bound is decided under: one byte `0xFF`, which no key a
/// client sends can be (a key that starts with `0xFF` is stored as its 33-byte digest).
const OVERFLOW: &[u8] = &[0xFF];

/// How many keys a store holds by default.
pub(crate) const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The bound, per shard, and whether some shard has reached it.
pub(super) struct Bound {
    per_shard: usize,
    /// Set once a shard is full (by the shard, as it inserts): until then no decision pays
    /// for the check below.
    reached: Arc<AtomicBool>,
}

impl Bound {
    pub(super) fn new(max_keys: usize, shards: usize) -> Self {
        Self {
            per_shard: max_keys.div_ceil(shards).max(1),
            reached: Arc::default(),
        }
    }

    /// The keys one shard holds at most.
    pub(super) fn per_shard(&self) -> usize {
        self.per_shard
    }

    /// The flag a shard sets when it reaches its share of the bound.
    pub(super) fn reached(&self) -> Arc<AtomicBool> {
        self.reached.clone()
    }
}

impl Shared {
    /// `batch` with the key of every check the store does not hold, in a shard that is full
    /// even after its expired entries are swept, replaced by the overflow key; `None` when
    /// every key is decided as it is.
    pub(super) fn bounded<'a>(&self, batch: &[Check<'a>]) -> Option<SmallVec<[Check<'a>; 4]>> {
        if !self.bound.reached.load(Ordering::Relaxed) {
            return None;
        }
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
