//! The bound on the keys a [`MemoryStore`] holds; the policy is documented on
//! [`MemoryStore::max_keys`](super::MemoryStore::max_keys).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashTable};
use spinning_top::Spinlock;

use super::{lock, MemoryStats, MemoryStore, Shard, Shared, Slot};
use crate::clock::StoreClock;
use crate::decision::{combine, DenyReason, Outcome, RuleOutcomes, StoreId};
use crate::error::StoreError;
use crate::log::Event;
use crate::store::batch::{deny, rule_says, Entry};
use crate::store::check::Check;

/// How many keys a store holds by default.
pub(crate) const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// A shard that makes room frees 1/16 of its share, paying the pass once per that many keys.
const ROOM_SHIFT: u32 = 4;

/// How many entries a shard samples to find the state below which it forgets.
const SAMPLE: usize = 64;

/// The bound per shard and its counters.
pub(super) struct Bound {
    per_shard: usize,
    /// The shards at their share: while none is, a decision pays one load for the bound.
    full: Arc<AtomicUsize>,
    evicted: AtomicU64,
    refused: AtomicU64,
}

impl Bound {
    pub(super) fn new(max_keys: usize, shards: usize) -> Self {
        Self {
            per_shard: max_keys.div_ceil(shards).max(1),
            full: Arc::default(),
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }
}

/// How much an entry's state says at `now`, lowest forgotten first
/// ([`MemoryStore::max_keys`]); one whose state has ended, less than any live one.
fn worth(entry: &Entry, now: u64) -> Worth {
    (
        entry.penalty().denials > 0,
        entry.carried.until > now,
        entry.carried.used,
        entry.expires_at(),
    )
}

/// See [`worth`].
type Worth = (bool, bool, u64, u64);

/// Locked, or holding units parked in live leases: forgetting it would free them.
fn locked(entry: &Entry, now: u64) -> bool {
    entry.kept_until() > now
}

/// A shard at twice its share is full of locked keys until `retry_micros` from now.
#[derive(Debug, Clone, Copy)]
pub(super) struct NoRoom {
    retry_micros: u64,
}

impl NoRoom {
    /// Every rule denies until the first lock ends: a limit, not a failing store.
    pub(super) fn outcome(self, batch: &[Check<'_>]) -> Outcome {
        let (retry, denied) = (
            self.retry_micros,
            deny(DenyReason::Limited, Some(self.retry_micros)),
        );
        let rules: RuleOutcomes = batch
            .iter()
            .map(|check| rule_says(check.rule, denied, 0, retry))
            .collect();
        combine(rules, |i| batch.get(i).is_some_and(|c| c.in_shadow()))
    }

    /// What an overdraft or counted refusal answers: it has nowhere to write.
    pub(super) fn error(self) -> StoreError {
        StoreError::Unavailable(
            "the in-process store is full of locked keys; new keys wait for a lock to end"
                .to_owned(),
        )
    }
}

impl Shared {
    /// Makes room for `batch`'s new keys in shards at their share; [`NoRoom`] if it can't.
    #[inline]
    pub(super) fn make_room(&self, batch: &[Check<'_>]) -> Result<(), NoRoom> {
        if self.bound.full.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        self.make_room_in_full_shards(batch)
    }

    /// [`make_room`](Self::make_room) once some shard is full.
    #[inline(never)]
    fn make_room_in_full_shards(&self, batch: &[Check<'_>]) -> Result<(), NoRoom> {
        let mut evicted = 0;
        for check in batch {
            let hash = self.hash(check.rule, check.key());
            let mut shard = lock(&self.shards[self.shard_of(hash)]);
            if shard.map.len() < self.bound.per_shard || shard.get(hash, check).is_some() {
                continue;
            }
            let now = self.now(None, &mut [&mut shard]);
            evicted += shard.make_room(now);
            if shard.map.len() >= 2 * self.bound.per_shard {
                let retry_micros = shard.no_room_until.saturating_sub(now).max(1);
                drop(shard);
                self.refused_for_room();
                return Err(NoRoom { retry_micros });
            }
        }
        if evicted > 0 {
            self.bound
                .evicted
                .fetch_add(evicted as u64, Ordering::Relaxed);
            if let Some(suppressed) = crate::log::process_log().admit(Event::StoreFull) {
                tracing::warn!(
                    suppressed,
                    "the in-process store is full: the entries whose state says least are forgotten"
                );
            }
            #[cfg(feature = "metrics")]
            metrics::counter!("tollgate_memory_store_evictions_total").increment(evicted as u64);
        }
        Ok(())
    }

    /// Counts a batch refused for want of room, logs it, and reports it as a metric.
    #[cold]
    fn refused_for_room(&self) {
        self.bound.refused.fetch_add(1, Ordering::Relaxed);
        if let Some(suppressed) = crate::log::process_log().admit(Event::StoreFull) {
            tracing::warn!(
                suppressed,
                "the in-process store is full of locked keys: new keys are refused until a lock ends"
            );
        }
        #[cfg(feature = "metrics")]
        metrics::counter!("tollgate_memory_store_refusals_total").increment(1);
    }
}

impl Shard {
    /// Frees a sixteenth of the shard's share ([`MemoryStore::max_keys`]); returns how many
    /// unexpired entries were forgotten. A shard of locked entries stops looking for room
    /// until its first lock ends or it holds twice its share.
    fn make_room(&mut self, now: u64) -> usize {
        if now < self.no_room_until && self.map.len() < 2 * self.cap {
            return 0;
        }
        self.sweep(now);
        let target = self.cap - (self.cap >> ROOM_SHIFT).max(1).min(self.cap);
        let mut excess = self.map.len().saturating_sub(target);
        let mut evicted = 0;
        // The sample's threshold may free too few: the second pass takes any unlocked entry.
        for pass in 0..2 {
            if excess == 0 {
                break;
            }
            let threshold = match pass {
                0 => self.threshold(now, excess),
                _ => None,
            };
            let mut forgotten = 0;
            self.map.retain(|Slot { entry, .. }| {
                let keep = forgotten >= excess
                    || locked(entry, now)
                    || threshold.is_some_and(|t| worth(entry, now) > t);
                forgotten += usize::from(!keep);
                keep
            });
            evicted += forgotten;
            excess -= forgotten;
        }
        if excess > 0 {
            // Nothing is left but locked entries.
            let first_unlock = self.map.iter().map(|s| s.entry.kept_until()).min();
            self.no_room_until = first_unlock.unwrap_or(0);
        }
        self.counted_at_cap();
        evicted
    }

    /// The [worth] at or below which about `excess` unlocked entries fall, from a sample
    /// spread over the table (eviction forgets in table order: its first entries thin out).
    fn threshold(&self, now: u64, excess: usize) -> Option<Worth> {
        let mut sample = [(false, false, 0, 0); SAMPLE];
        let mut n = 0;
        let spread = (self.map.len() / SAMPLE).max(1);
        let spread_out = self.map.iter().map(|s| &s.entry).step_by(spread);
        for entry in spread_out.filter(|e| !locked(e, now)).take(SAMPLE) {
            sample[n] = worth(entry, now);
            n += 1;
        }
        let sample = &mut sample[..n];
        sample.sort_unstable();
        let at = (excess * n)
            .div_ceil(self.map.len().max(1))
            .clamp(1, n.max(1))
            - 1;
        sample.get(at).copied()
    }

    /// Counts the shard in (or out of) the shards at their share of the bound.
    pub(super) fn counted_at_cap(&mut self) {
        let at_cap = self.map.len() >= self.cap;
        if at_cap != self.at_cap {
            self.at_cap = at_cap;
            if at_cap {
                self.full.fetch_add(1, Ordering::Relaxed);
            } else {
                self.full.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

impl MemoryStore {
    /// The same store, empty, holding about `n` keys (default 1,000,000; see
    /// [What a key costs](MemoryStore#what-a-key-costs)).
    ///
    /// # Past the bound
    ///
    /// Every key is decided on its own state, however many keys clients send. A shard at
    /// its share of the bound that meets a new key frees a sixteenth of its share:
    ///
    /// 1. entries back to empty first (forgetting them changes nothing);
    /// 2. then those whose state says least: entries counting no penalty denial first, of
    ///    them those whose state has ended (kept for a refusal counted late), then the
    ///    fewest units recorded at their last admission, then the soonest back to empty.
    ///    The order is estimated from a sample of 64 entries spread over the shard;
    /// 3. never a locked key, so a flood never lifts a lock.
    ///
    /// A forgotten key starts again empty: at most one full quota of each of its rules
    /// over-admitted per time it is forgotten (and its penalty count restarts). To have a
    /// key that used its quota forgotten, a client must keep a sixteenth of a shard's share
    /// of keys, each recording more, alive at once. Each forgotten entry is counted
    /// ([`evictions`](MemoryStats::evictions); `tollgate_memory_store_evictions_total` with the
    /// `metrics` feature) and logged.
    ///
    /// A shard of locked entries only grows, up to twice its share; beyond that a batch
    /// with a key it does not hold is denied ([`DenyReason::Limited`], every rule,
    /// `retry_after` when its first lock ends), whatever the failure policy. Each refusal
    /// is counted ([`refusals`](MemoryStats::refusals); `tollgate_memory_store_refusals_total`
    /// with the `metrics` feature) and logged.
    pub fn max_keys(self, n: usize) -> Self {
        Self::build(self.shared.clock.clone(), n)
    }

    /// How full the store is now, for an operator's page or a test.
    pub fn stats(&self) -> MemoryStats {
        let shared = &self.shared;
        MemoryStats {
            keys: shared.shards.iter().map(|s| lock(s).map.len()).sum(),
            evictions: shared.bound.evicted.load(Ordering::Relaxed),
            refusals: shared.bound.refused.load(Ordering::Relaxed),
        }
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
                        crossbeam_utils::CachePadded::new(Spinlock::new(Shard {
                            map: HashTable::new(),
                            hasher: hasher.clone(),
                            cap: bound.per_shard,
                            full: bound.full.clone(),
                            at_cap: false,
                            no_room_until: 0,
                            len_after_sweep: 0,
                            latest: 0,
                        }))
                    })
                    .collect(),
                bound,
                hasher,
                clamp: !clock.ordered_across_threads(),
                clock,
                id: StoreId::new(),
            }),
        }
    }
}
