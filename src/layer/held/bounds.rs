//! The bounds on held requests: how many the layer holds at once, in all and per key, and
//! each held request's place under them.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashMap};
use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::layer::observe::record;

/// The bounds on held requests (configuration; the count is the layer's state,
/// [`HeldCounts`]).
#[derive(Clone, Debug)]
pub(crate) struct HeldLimits {
    pub(crate) max: usize,
    pub(crate) max_per_key: Option<usize>,
}

impl Default for HeldLimits {
    /// As [`max_held`](crate::layer::RateLimitLayerBuilder::max_held) says.
    fn default() -> Self {
        Self {
            max: 10_000,
            max_per_key: None,
        }
    }
}

/// Shards of the per-key counts: held requests are few, so a handful of locks is enough.
const HELD_SHARDS: usize = 16;

/// The requests held now: in all, and per (rule, key) that delays them.
#[derive(Default)]
pub(crate) struct HeldCounts {
    total: AtomicUsize,
    /// By the hash of (rule name, key): no allocation per key, and with a per-process random
    /// seed a client cannot aim at another's count.
    per_key: [Mutex<HashMap<u64, usize>>; HELD_SHARDS],
    hasher: DefaultHashBuilder,
}

impl HeldCounts {
    /// What a held request counts under for `rule` and `key`.
    pub(crate) fn key_of(&self, rule: &str, key: &[u8]) -> u64 {
        self.hasher.hash_one((rule, key))
    }

    /// The requests held now.
    pub(crate) fn total(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    fn shard(&self, key: u64) -> &Mutex<HashMap<u64, usize>> {
        &self.per_key[(key >> 60) as usize % HELD_SHARDS]
    }

    /// Counts one more held request under `keys` (distinct), or says `None` when that would
    /// pass a bound of `limits`: `max` in all, [`per_key`](HeldLimits::per_key) for each
    /// key, and the [reach](HeldLimits::reach) of the key among them that holds most.
    pub(crate) fn try_hold(
        self: &Arc<Self>,
        limits: &HeldLimits,
        keys: SmallVec<[u64; 4]>,
    ) -> Option<HeldSlot> {
        let held = keys
            .iter()
            .map(|key| self.shard(*key).lock().get(key).copied().unwrap_or(0))
            .max()
            .unwrap_or(0);
        let max = limits.reach(held);
        self.total
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        record::held(true);
        // The slot gives back what it took when dropped, on the way out too.
        let mut slot = HeldSlot {
            counts: self.clone(),
            keys: SmallVec::new(),
        };
        let max_per_key = limits.per_key();
        for key in keys {
            let mut shard = self.shard(key).lock();
            let n = shard.entry(key).or_insert(0);
            if *n >= max_per_key {
                if *n == 0 {
                    shard.remove(&key);
                }
                return None;
            }
            *n += 1;
            slot.keys.push(key);
        }
        Some(slot)
    }
}

impl HeldLimits {
    /// The most requests one key may have held (see `max_held_per_key`).
    pub(crate) fn per_key(&self) -> usize {
        self.max_per_key.unwrap_or((self.max / 10).max(1))
    }

    /// How many places may be taken already for a request whose keys hold at most `held`
    /// each to take one more: `max` less a share per request held ([`per_key`](Self::per_key)
    /// shares make `max`); all of `max` where one key's share is every place (a global rule).
    fn reach(&self, held: usize) -> usize {
        let share = self.per_key();
        if share >= self.max {
            return self.max;
        }
        let kept = self.max as u128 * held.min(share) as u128 / share as u128;
        self.max - kept as usize
    }
}

/// One held request's place under the bounds; given back when dropped.
pub(crate) struct HeldSlot {
    counts: Arc<HeldCounts>,
    keys: SmallVec<[u64; 4]>,
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        for &key in &self.keys {
            let mut shard = self.counts.shard(key).lock();
            if let Some(n) = shard.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    shard.remove(&key);
                }
            }
        }
        self.counts.total.fetch_sub(1, Ordering::AcqRel);
        record::held(false);
    }
}
