//! The local deny cache of a [`RedisStore`](super::RedisStore): denials Redis gave, answered
//! again by this instance until they end, without a script call. What it answers is on
//! [`with_deny_cache`](super::RedisStore::with_deny_cache); here, why that is exact.
//!
//! # What a cached denial may answer
//!
//! Redis denied `cost` units of a rule for a key with retry-after `r`: with no other
//! traffic, the same request is admitted at `now + r` and at no instant before (a denial
//! changes no state, and each model's retry is exact), so until then it gets the same
//! denial. Other requests:
//!
//! - A **cheaper** request may pass earlier: never answered (it goes to Redis).
//! - A **dearer** request is denied too, but its retry is in general later (the other
//!   models free units over time), so only the same cost is answered, and only a cost of
//!   one unit, which reports none remaining until its retry. A fixed window frees
//!   everything at its end: a denial of `c` answers every cost from `c` to the limit, unless
//!   a debt keeps its state past that end.
//! - A denial that leaves **units remaining** is not cached: another instance may take
//!   them meanwhile, unseen here.
//! - A **lock** ([`DenyReason::Locked`]) reports the later of the lock's end and the
//!   algorithm's retry. When the lock's end is later than the rule's reset, it answers every
//!   cost up to the capacity until then; a shorter lock is not cached (the denial turns
//!   into a counted quota denial when it ends).
//!
//! A denial answers only for the configuration that produced it (fingerprint and penalty).
//!
//! # Time
//!
//! The cache keeps local instants. A denial read at local instant `s` (taken before the
//! call is sent) with retry-after `r` is cached until `s + r`: Redis decided after `s`, so
//! the cache never denies longer than Redis would, and at most one round trip shorter.
//!
//! # Memory
//!
//! Entries end at their deadline (dropped when met, swept when a shard is full); a full
//! shard refuses new entries.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use hashbrown::{DefaultHashBuilder, HashTable};
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

use crate::algorithm::Algorithm;
use crate::clock::Clock;
use crate::decision::{Decision, Denial, DenyReason, Outcome, RateLimitInfo};
use crate::penalty::Penalty;
use crate::store::batch::{self, is_queue};
use crate::store::check::Check;
use crate::Rule;

/// Shards of the map, so concurrent requests rarely wait on one another.
const SHARDS: usize = 16;

/// The denials one instance remembers, keyed by rule name and key.
pub(super) struct DenyCache {
    shards: Box<[Mutex<CacheShard>]>,
    /// Entries a shard may hold.
    per_shard: usize,
    hasher: DefaultHashBuilder,
    /// Keys with entries, so requests skip the cache while nothing is denied.
    len: AtomicUsize,
    /// Bumped by every invalidation: a reply to a call sent before one is not recorded.
    epoch: AtomicU64,
    /// Whether the invalidation channel is subscribed: only then are entries kept and used.
    live: AtomicBool,
    /// The task that listens for invalidations, stopped with the cache.
    listener: OnceLock<tokio::task::AbortHandle>,
    /// The store's injected clock (see [`serves`](Self::serves)); else the OS's monotonic
    /// clock from `started`. A cached denial's end is Redis's wait measured here: the
    /// clock NTP keeps at the right rate serves, where the time-stamp counter behind the
    /// in-process default drifts by its calibration's error, which a long lock scales.
    clock: Option<Arc<dyn Clock>>,
    started: Instant,
}

#[derive(Default)]
struct CacheShard {
    table: HashTable<CacheSlot>,
    /// The earliest deadline in the shard, or earlier: a full shard is swept only once it
    /// has passed.
    next_expiry: u64,
}

/// The denials of one rule name and key (one per configuration, usually one).
struct CacheSlot {
    hash: u64,
    /// See [`id`].
    id: Box<[u8]>,
    denials: SmallVec<[Cached; 1]>,
}

impl CacheSlot {
    fn is(&self, rule: &str, key: &[u8]) -> bool {
        let n = rule.len();
        self.id.len() == 1 + n + key.len()
            && usize::from(self.id[0]) == n
            && &self.id[1..1 + n] == rule.as_bytes()
            && &self.id[1 + n..] == key
    }
}

/// One denial, for one configuration of the rule.
#[derive(Debug, Clone, Copy)]
struct Cached {
    fingerprint: u64,
    penalty: Option<Penalty>,
    reason: DenyReason,
    /// The costs it answers, both included.
    costs: (u64, u64),
    /// The local instant (µs) the denial ends at.
    until: u64,
    /// What the rule reported: units left then (a lower bound later) and when its state is
    /// back to empty.
    remaining: u64,
    reset_at: u64,
}

impl Cached {
    fn is_for(&self, rule: &Rule) -> bool {
        self.fingerprint == rule.fingerprint() && self.penalty.as_ref() == rule.penalty()
    }
}

impl DenyCache {
    /// A cache of at most `capacity` rule-and-key entries (at least one per shard).
    pub(super) fn new(capacity: usize, clock: Option<Arc<dyn Clock>>) -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(CacheShard::default()))
                .collect(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            hasher: DefaultHashBuilder::default(),
            len: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            live: AtomicBool::new(false),
            listener: OnceLock::new(),
            clock,
            started: Instant::now(),
        }
    }

    /// Whether a store with `clock` may use this cache: the one it was made with (the same
    /// allocation, so a cheap comparison). A store's prefix is fixed when it connects.
    pub(super) fn serves(&self, clock: &Option<Arc<dyn Clock>>) -> bool {
        match (&self.clock, clock) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// The local instant (µs) its deadlines are kept in.
    pub(super) fn now(&self) -> u64 {
        match &self.clock {
            Some(clock) => clock.now_micros(),
            None => crate::clock::duration_to_micros(self.started.elapsed()),
        }
    }

    /// Entries held (rule-and-key pairs).
    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Whether the invalidation channel is subscribed. Either way the cache forgets what it
    /// held: a reset may have been missed while it was not.
    pub(super) fn set_live(&self, live: bool) {
        self.live.store(live, Ordering::Release);
        self.clear();
    }

    pub(super) fn set_listener(&self, task: tokio::task::AbortHandle) {
        let _ = self.listener.set(task);
    }

    /// The hash of `rule` and `key`, and their shard, locked.
    fn locked(&self, rule: &str, key: &[u8]) -> (u64, MutexGuard<'_, CacheShard>) {
        let hash = self.hasher.hash_one((rule, key));
        // The table uses the low bits; the shard takes high ones.
        (hash, self.shards[(hash >> 57) as usize % SHARDS].lock())
    }

    /// The outcome of `batch` at local instant `now`, if the cache holds it (see the module
    /// docs for when it does).
    pub(super) fn answer(&self, batch: &[Check<'_>], max_wait: u64, now: u64) -> Option<Outcome> {
        if self.len() == 0 || batch.is_empty() || !self.live.load(Ordering::Acquire) {
            return None;
        }
        if !decided_on_arrival(batch) {
            return None;
        }
        let mut rules = Vec::with_capacity(batch.len());
        for check in batch {
            let cached = self.lookup(check, now)?;
            let retry = cached.until - now;
            if cached.reason != DenyReason::Locked && retry <= max_wait {
                // A wait this long would be a reservation.
                return None;
            }
            let decision = batch::deny(cached.reason, Some(retry));
            let reset = cached.reset_at.saturating_sub(now);
            let said = batch::rule_says(check.rule, decision, cached.remaining, reset);
            rules.push(said);
        }
        Some(batch::combine(rules, |_| false))
    }

    /// The live denial that answers `check` at `now`, if any.
    fn lookup(&self, check: &Check<'_>, now: u64) -> Option<Cached> {
        if check.in_shadow() {
            return None;
        }
        let rule = check.rule.name();
        let (hash, mut shard) = self.locked(rule, check.key());
        let entry = shard
            .table
            .find_entry(hash, |s| s.is(rule, check.key()))
            .ok()?;
        if entry.get().denials.iter().all(|d| d.until <= now) {
            entry.remove();
            self.len.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        entry.get().denials.iter().copied().find(|d| {
            d.is_for(check.rule)
                && d.until > now
                && d.costs.0 <= check.cost
                && check.cost <= d.costs.1
        })
    }

    /// Learns from what Redis decided for `batch`, called at local instant `sent_at` (read
    /// before the call) when the cache's epoch was `epoch`.
    pub(super) fn record(
        &self,
        batch: &[Check<'_>],
        max_wait: u64,
        outcome: &Outcome,
        sent_at: u64,
        epoch: u64,
    ) {
        if !self.live.load(Ordering::Acquire) {
            return;
        }
        let may_insert = max_wait == 0 && decided_on_arrival(batch) && self.epoch() == epoch;
        for (check, rule) in batch.iter().zip(&outcome.rules) {
            match rule.decision {
                Decision::Deny(denial) if may_insert && !check.in_shadow() => {
                    if let Some(cached) = cacheable(check, denial, rule.info, sent_at) {
                        self.insert(check, cached, sent_at);
                    }
                }
                Decision::Deny(_) => {}
                // The state may have moved (an admission), and a denial's retry with it.
                _ => {
                    if self.len() > 0 {
                        self.remove(check.rule.name(), check.key());
                    }
                }
            }
        }
    }

    fn insert(&self, check: &Check<'_>, cached: Cached, now: u64) {
        let rule = check.rule.name();
        let (hash, mut guard) = self.locked(rule, check.key());
        let shard = &mut *guard;
        if let Some(slot) = shard.table.find_mut(hash, |s| s.is(rule, check.key())) {
            slot.denials
                .retain(|d| !d.is_for(check.rule) && d.until > now);
            slot.denials.push(cached);
            shard.next_expiry = shard.next_expiry.min(cached.until);
            return;
        }
        if shard.table.len() >= self.per_shard {
            if now < shard.next_expiry {
                return;
            }
            self.sweep(shard, now);
            if shard.table.len() >= self.per_shard {
                return;
            }
        }
        let slot = CacheSlot {
            hash,
            id: id(rule, check.key()).into_boxed_slice(),
            denials: smallvec::smallvec![cached],
        };
        shard.next_expiry = shard.next_expiry.min(cached.until);
        shard.table.insert_unique(hash, slot, |s| s.hash);
        self.len.fetch_add(1, Ordering::AcqRel);
    }

    /// Drops the ended entries of a shard.
    fn sweep(&self, shard: &mut CacheShard, now: u64) {
        let before = shard.table.len();
        let mut next = u64::MAX;
        shard.table.retain(|s| {
            s.denials.retain(|d| d.until > now);
            if let Some(until) = s.denials.iter().map(|d| d.until).min() {
                next = next.min(until);
                true
            } else {
                false
            }
        });
        shard.next_expiry = next;
        self.len
            .fetch_sub(before - shard.table.len(), Ordering::AcqRel);
    }

    fn remove(&self, rule: &str, key: &[u8]) {
        let (hash, mut shard) = self.locked(rule, key);
        if let Ok(entry) = shard.table.find_entry(hash, |s| s.is(rule, key)) {
            entry.remove();
            self.len.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Forgets every denial of `rule` for `key` (a reset or refund somewhere), and keeps
    /// replies to calls already under way from recording one again.
    pub(super) fn invalidate(&self, rule: &str, key: &[u8]) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.remove(rule, key);
    }

    /// Forgets everything (the invalidation channel was lost: a reset may have been missed).
    pub(super) fn clear(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let n = shard.table.len();
            shard.table.clear();
            self.len.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Handles a message of the invalidation channel (see [`invalidation`](super::invalidation)).
    pub(super) fn on_message(&self, payload: &[u8]) {
        let Some((&n, rest)) = payload.split_first() else {
            return;
        };
        let n = usize::from(n);
        if rest.len() < n {
            return;
        }
        let (rule, key) = rest.split_at(n);
        if let Ok(rule) = std::str::from_utf8(rule) {
            self.invalidate(rule, key);
        }
    }
}

impl Drop for DenyCache {
    fn drop(&mut self) {
        if let Some(task) = self.listener.get() {
            task.abort();
        }
    }
}

impl std::fmt::Debug for DenyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenyCache")
            .field("entries", &self.len())
            .field("capacity", &(self.per_shard * SHARDS))
            .field("live", &self.live.load(Ordering::Relaxed))
            .finish()
    }
}

/// A rule name and key as one entry's id, which is also the message that invalidates it:
/// the name's length (one byte: names are at most 64, `Rule::new`), the name, the key.
pub(super) fn id(rule: &str, key: &[u8]) -> Vec<u8> {
    let mut id = Vec::with_capacity(1 + rule.len() + key.len());
    id.push(u8::try_from(rule.len()).unwrap_or(u8::MAX));
    id.extend_from_slice(rule.as_bytes());
    id.extend_from_slice(key);
    id
}

/// Whether every rule of `batch` decides at the request's arrival: not so when a leaky
/// bucket's queue holds the request and the rules on its key count it at its release.
fn decided_on_arrival(batch: &[Check<'_>]) -> bool {
    batch.len() == 1 || !batch.iter().any(is_queue)
}

/// The cache entry for a denial of `check` read at `sent_at`, if one is exact.
fn cacheable(
    check: &Check<'_>,
    denial: Denial,
    info: RateLimitInfo,
    sent_at: u64,
) -> Option<Cached> {
    let denial_wait = denial.retry_after?;
    let retry = crate::clock::duration_to_micros(denial_wait);
    if retry == 0 {
        return None;
    }
    let capacity = check.rule.algorithm().quota().0;
    let costs = match denial.reason {
        // A penalty counts each quota denial in Redis.
        DenyReason::Limited if check.rule.penalty().is_some() => return None,
        // Another instance may take the units left meanwhile, which this one would not see.
        DenyReason::Limited if info.remaining > 0 => return None,
        DenyReason::Limited => match check.rule.algorithm() {
            // Every cost admits at the retry once the state is back to empty by then: not so
            // while a debt spans more windows.
            Algorithm::FixedWindow(_) if check.cost <= capacity && info.reset <= denial_wait => {
                (check.cost, capacity)
            }
            // What a bucket, a log or a sliding window reports as remaining grows while a
            // dearer request waits, which a cached answer cannot follow.
            _ if check.cost > 1 => return None,
            _ => (check.cost, check.cost),
        },
        // The lock's own end only when it comes after the algorithm's (see the module docs).
        DenyReason::Locked if retry > crate::clock::duration_to_micros(info.reset) => (0, capacity),
        DenyReason::Locked | DenyReason::CostExceedsCapacity => return None,
    };
    Some(Cached {
        fingerprint: check.rule.fingerprint(),
        penalty: check.rule.penalty().copied(),
        reason: denial.reason,
        costs,
        until: sent_at.saturating_add(retry),
        remaining: info.remaining,
        reset_at: sent_at.saturating_add(crate::clock::duration_to_micros(info.reset)),
    })
}
