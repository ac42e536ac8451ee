//! The bound on the keys a [`MemoryStore`] holds. Every key is decided
//! on its own state, also past the bound: a shard at its share of the bound makes room for
//! a key it does not hold by forgetting the entries whose state says least (see
//! [`MemoryStore::max_keys`](super::MemoryStore::max_keys) for the policy and what it can
//! over-admit). A locked key is never forgotten.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hashbrown::{DefaultHashBuilder, HashMap};
use parking_lot::Mutex;

use super::{MemoryStore, Shard, Shared};
use crate::clock::StoreClock;
use crate::decision::{
    combine, Decision, Denial, DenyReason, Outcome, RateLimitInfo, RuleOutcome, RuleOutcomes,
    StoreId,
};
use crate::error::StoreError;
use crate::log::Event;
use crate::store::batch::Entry;
use crate::store::check::Check;

/// How many keys a store holds by default.
pub(crate) const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// A shard that makes room frees this fraction of its share at once (1/16): the pass over
/// the shard that finds what to forget is then paid once per that many new keys.
const ROOM_SHIFT: u32 = 4;

/// How many entries a shard samples to find the state below which it forgets.
const SAMPLE: usize = 64;

/// The bound, per shard, how many shards are at it, how many entries were forgotten, and
/// how many batches were refused for want of room.
pub(super) struct Bound {
    per_shard: usize,
    /// The shards at their share of the bound (each counts itself in as it fills and out as
    /// it makes room): while none is, no decision pays for the check below.
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

/// How much an entry's state says, lowest forgotten first: whether it counts denials
/// towards a lock, then the units it recorded at its last admission (what forgetting it
/// can over-admit), then when it is back to empty anyway (the least recently used first,
/// among entries of one rule).
fn worth(entry: &Entry) -> (bool, u64, u64) {
    (
        entry.penalty().denials > 0,
        entry.carried.used,
        entry.expires_at(),
    )
}

fn locked(entry: &Entry, now: u64) -> bool {
    entry.penalty().locked_for(now).is_some()
}

/// A key of a batch met a shard full of locked keys at twice its share: there is no room
/// for it until the first of those locks ends, `retry_micros` from now.
#[derive(Debug, Clone, Copy)]
pub(super) struct NoRoom {
    retry_micros: u64,
}

impl NoRoom {
    /// What a decision of `batch` answers: every rule denies until the first lock ends. The
    /// bound is a limit of the store on the keys it holds, so it refuses as a limit does,
    /// whatever the caller's policy for a store that fails.
    pub(super) fn outcome(self, batch: &[Check<'_>]) -> Outcome {
        let retry = Duration::from_micros(self.retry_micros);
        let rules: RuleOutcomes = batch
            .iter()
            .map(|check| RuleOutcome {
                decision: Decision::Deny(Denial {
                    reason: DenyReason::Limited,
                    retry_after: Some(retry),
                }),
                info: RateLimitInfo {
                    limit: check.rule.algorithm().limit(),
                    remaining: 0,
                    reset: retry,
                },
            })
            .collect();
        combine(rules, |i| batch.get(i).is_some_and(|c| c.shadow))
    }

    /// What the verbs that take units without deciding (an overdraft, counted refusals)
    /// answer: they have nowhere to write them.
    pub(super) fn error(self) -> StoreError {
        StoreError::Unavailable(
            "the in-process store is full of locked keys; new keys wait for a lock to end"
                .to_owned(),
        )
    }
}

impl Shared {
    /// Makes room for the keys of `batch` that are not held, in shards at their share of
    /// the bound; [`NoRoom`] only when a shard is full of locked keys at twice its share.
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
            let mut shard = self.shards[self.shard_of(hash)].lock();
            if shard.map.len() < self.bound.per_shard || shard.get(hash, check).is_some() {
                continue;
            }
            let now = self.clock.now_micros().max(shard.latest);
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
    /// Makes room in a shard at its share of the bound for a sixteenth of it: the expired
    /// entries go first, then as many as are missing of the unlocked entries whose state
    /// [says least](worth). Returns how many unexpired entries were forgotten. A shard
    /// left with locked entries only grows past its share without looking again (see
    /// [`MemoryStore::max_keys`]) until the first of its locks ends or it holds twice its
    /// share.
    fn make_room(&mut self, now: u64) -> usize {
        if now < self.no_room_until && self.map.len() < 2 * self.cap {
            return 0;
        }
        self.sweep(now);
        let target = self.cap - (self.cap >> ROOM_SHIFT).max(1).min(self.cap);
        let mut excess = self.map.len().saturating_sub(target);
        let mut evicted = 0;
        // The sample's threshold may let fewer through than are missing: the second pass
        // takes any unlocked entry.
        for pass in 0..2 {
            if excess == 0 {
                break;
            }
            let threshold = match pass {
                0 => self.threshold(now, excess),
                _ => None,
            };
            let mut forgotten = 0;
            self.map.retain(|_, entry| {
                let keep = forgotten >= excess
                    || locked(entry, now)
                    || threshold.is_some_and(|t| worth(entry) > t);
                forgotten += usize::from(!keep);
                keep
            });
            evicted += forgotten;
            excess -= forgotten;
        }
        if excess > 0 {
            // Nothing is left but locked entries.
            let first_unlock = self.map.values().map(|e| e.penalty().locked_until).min();
            self.no_room_until = first_unlock.unwrap_or(0);
        }
        self.counted_at_cap();
        evicted
    }

    /// The [worth] at or below which about `excess` of the shard's unlocked entries
    /// fall, from a sample of them (the map's order is its hashes', unrelated to worth).
    fn threshold(&self, now: u64, excess: usize) -> Option<(bool, u64, u64)> {
        let mut sample = [(false, 0, 0); SAMPLE];
        let mut n = 0;
        for entry in self.map.values().filter(|e| !locked(e, now)).take(SAMPLE) {
            sample[n] = worth(entry);
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
    /// The same store holding about `n` keys (default 1,000,000; what a key costs is under
    /// [What a key costs](MemoryStore#what-a-key-costs)). Call it on a new store: it
    /// starts empty.
    ///
    /// # Past the bound
    ///
    /// Every key is decided on its own state, however many keys clients send: a flood of
    /// new keys never makes one client's decision depend on another's. The bound is kept
    /// per shard; a shard at its share that meets a key it does not hold makes room for a
    /// sixteenth of its share at once:
    ///
    /// 1. entries whose state is back to empty go first (forgetting them changes nothing);
    /// 2. then, of the others, those whose state says least: first entries that count no
    ///    denial towards a penalty, among them the fewest units recorded at their last
    ///    admission, then the soonest back to empty (for one rule, the least recently
    ///    used). The order is estimated from a sample of 64 entries;
    /// 3. a locked key is never forgotten, so a flood never lifts a lock.
    ///
    /// What it can over-admit: a forgotten key starts again from an empty state, so it may
    /// be admitted once more what its state recorded — at most one full quota of each of
    /// its rules per time it is forgotten (and a penalty's count of denials starts again).
    /// Only keys whose state says least are forgotten, and a flooder's keys each record a
    /// request or two: to have a key that has used its quota forgotten, a client must keep
    /// a sixteenth of a shard's share of keys, each recording more, alive at once. With the
    /// default bound and 32 shards (two cores), a shard holds 31,250 keys and forgets 1,953
    /// at a time. Each forgotten entry is counted: [`evictions`](Self::evictions), and with
    /// the `metrics` feature `tollgate_memory_store_evictions_total`; a warning is logged.
    ///
    /// A shard whose entries are all locked cannot make room without lifting a lock: it
    /// grows past its share with new keys, each decided on its own state, up to twice its
    /// share; beyond that a batch with a key it does not hold is denied
    /// ([`DenyReason::Limited`], every rule, `retry_after` when
    /// the first of its locks ends), whatever the caller's policy for a failing store: the
    /// bound limits as a rule does. Each such refusal is counted:
    /// [`refusals`](Self::refusals), and with the `metrics` feature
    /// `tollgate_memory_store_refusals_total`; a warning is logged. Locking that many keys
    /// costs a client more than a quota of requests for each.
    pub fn max_keys(self, n: usize) -> Self {
        Self::build(self.shared.clock.clone(), n)
    }

    /// How many entries past the bound the store has forgotten so far (entries back to
    /// empty are not counted: forgetting them changes no decision).
    pub fn evictions(&self) -> u64 {
        self.shared.bound.evicted.load(Ordering::Relaxed)
    }

    /// How many decisions the store has denied so far because a shard was full of locked
    /// keys (see [`max_keys`](Self::max_keys)).
    pub fn refusals(&self) -> u64 {
        self.shared.bound.refused.load(Ordering::Relaxed)
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
                            cap: bound.per_shard,
                            full: bound.full.clone(),
                            at_cap: false,
                            no_room_until: 0,
                            len_after_sweep: 0,
                            latest: 0,
                        })
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
