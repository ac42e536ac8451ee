//! The in-process store: a sharded map of entries, decided under the shards' locks.

mod bound;
mod key;
mod refund;

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::mem::offset_of;
use std::sync::Arc;
use std::time::Duration;

use hashbrown::DefaultHashBuilder;
use hashbrown::HashTable;
use smallvec::SmallVec;
use spinning_top::{guard::SpinlockGuard, Spinlock};

use crate::algorithm::{Admitted, Carried, State};
use crate::clock::{duration_to_micros, Clock, MonotonicClock, StoreClock};
use crate::decision::{Admission, Outcome, RuleOutcome, RuleOutcomes, StoreId, Taken};
use crate::error::StoreError;
use crate::store::batch::{self, Entry, Evaluated};
use crate::store::check::{Check, Health, Store};
use crate::stored::StoredKey;
use crate::Rule;

pub(crate) use bound::DEFAULT_MAX_KEYS;
use bound::{Bound, NoRoom};
use key::{hash_pair, StoreKey};

/// The size below which a shard is never swept: sweeping tiny shards gains nothing.
const MIN_SWEEP_LEN: usize = 1024;

/// Rule state kept in this process (single nodes, tests, a fallback when Redis is down).
/// `Clone` is cheap and shares the state.
///
/// A sharded map; a batch locks the shards it touches (in index order, so batches never
/// deadlock) and is decided atomically. An entry back to empty (one a penalty refused or a
/// lease held, 3 s after, for a refusal counted late) is removed when its shard has doubled
/// since its last sweep (bounding memory to about twice the live keys), or by
/// [`purge_expired`](Self::purge_expired). A decision allocates nothing once its key's
/// entry exists, but once per key for a rule with a [`Penalty`](crate::Penalty).
///
/// # What a key costs
///
/// One fixed-size table slot per rule and key (name and key inline up to 29 bytes together,
/// else one allocation); a table doubles at seven eighths full, so a key costs one to two
/// slots (figures: BENCHMARKS.md), and [`max_keys`](Self::max_keys) bounds the keys.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Limiter, Rule, store::MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Limiter::new(MemoryStore::new());
/// let rule = Rule::fixed_window("login", 3, Duration::from_secs(60));
/// for _ in 0..3 {
///     assert!(limiter.check_one(&rule, b"alice").await?.is_admitted());
/// }
/// assert!(!limiter.check_one(&rule, b"alice").await?.is_admitted());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

/// How full a [`MemoryStore`] is ([`MemoryStore::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Entries held, expired ones included until swept.
    pub keys: usize,
    /// Entries forgotten past the bound ([`max_keys`](MemoryStore::max_keys)) since the
    /// store was made; entries back to empty are not counted.
    pub evictions: u64,
    /// Decisions denied since the store was made because a shard was full of locked keys.
    pub refusals: u64,
}

struct Shared {
    shards: Box<[crossbeam_utils::CachePadded<Spinlock<Shard>>]>,
    bound: Bound,
    hasher: DefaultHashBuilder,
    clock: StoreClock,
    /// `!clock.ordered_across_threads()`: time is kept from going backwards per shard.
    clamp: bool,
    /// The name its admissions give it (see `Taken::store`).
    id: StoreId,
}

#[repr(C)]
struct Shard {
    /// The latest instant decided at here (see [`Clock::ordered_across_threads`]). First, so
    /// that a decision writes one cache line of its shard (padded to its own), the lock's.
    latest: u64,
    map: HashTable<Slot>,
    /// The map's hasher: [`Shared::hash`]'s, to rehash stored keys as the map grows.
    hasher: DefaultHashBuilder,
    /// The keys this shard holds before it makes room; `full` counts the shards at it.
    cap: usize,
    full: Arc<std::sync::atomic::AtomicUsize>,
    /// Whether this shard is counted in `full`.
    at_cap: bool,
    /// Until when a shard left with locked entries only grows instead of looking for room.
    no_room_until: u64,
    len_after_sweep: usize,
}

/// A key and its entry in one table slot: 96 bytes at a multiple of 32, so two cache
/// lines, the key always in the second and the entry's first 32 bytes (its fingerprint
/// first) always in the first, which is what lets [`Shard::probe`] load both at once.
#[repr(C)]
struct Slot {
    entry: Entry,
    key: StoreKey,
}

const _: () = assert!(size_of::<Slot>() == 96 && align_of::<Slot>() == 32);
const _: () = assert!(offset_of!(Slot, key) == 64 && offset_of!(Entry, fingerprint) < 32);

impl MemoryStore {
    /// An empty store on the monotonic clock, so a wall-clock step neither freezes nor
    /// reopens limits (its drift does not matter in process).
    pub fn new() -> Self {
        Self::build(
            StoreClock::Monotonic(MonotonicClock::new()),
            DEFAULT_MAX_KEYS,
        )
    }

    /// An empty store reading time from `clock` (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::build(StoreClock::Any(Arc::new(clock)), DEFAULT_MAX_KEYS)
    }

    /// Removes every entry whose state is back to empty (one a penalty refused or a lease
    /// held, 3 s after); returns how many were removed.
    pub fn purge_expired(&self) -> usize {
        let shared = &*self.shared;
        let reading = shared.clock.now_micros();
        let sweep = |shard| {
            let mut shard = lock(shard);
            // The shard's decisions never go back before the instant it was swept at.
            let now = shared.now(Some(reading), &mut [&mut shard]);
            shard.sweep(now)
        };
        shared.shards.iter().map(|s| sweep(s)).sum()
    }

    /// Decides `batch` now, reserving up to `max_wait` µs ahead ([`Store::check`]; 0 for
    /// [`Limiter::check_now`](crate::Limiter::check_now)).
    pub(crate) fn decide(&self, batch: &[Check<'_>], max_wait: u64) -> Result<Outcome, StoreError> {
        if let Err(no_room) = self.shared.make_room(batch) {
            return Ok(no_room.outcome(batch));
        }
        match batch {
            [check] => self.decide_one(check, max_wait),
            _ => self.decide_batch(batch, max_wait, None),
        }
    }

    /// [`decide_batch`](Self::decide_batch) for a batch of one: one lookup under one lock
    /// (a property test compares the two paths).
    fn decide_one(&self, check: &Check<'_>, max_wait: u64) -> Result<Outcome, StoreError> {
        // A batch of one holds no rule twice; the rule's validity was checked when built.
        if !check.rule.is_valid() {
            batch::validate(std::slice::from_ref(check))?;
        }
        let shared = &*self.shared;
        let hash = shared.hash(check.rule, check.key());
        let reading = shared.early_reading();
        let mut shard = lock(&shared.shards[shared.shard_of(hash)]);
        let now = shared.now(reading, &mut [&mut shard]);
        let (found, own) = shard.probe(hash, check);
        let found = match admit_at_once(check, found, own, now) {
            Ok((admitted, created)) => {
                if let Some(entry) = created {
                    shard.insert(hash, check, entry);
                    shard.sweep_if_grown(now);
                }
                // Write the outcome after unlocking, so the unlock waits on fewer stores.
                drop(shard);
                return Ok(admitted_outcome(check.rule, admitted, now, shared.id));
            }
            Err(found) => found,
        };
        let (item, admitted) = decide_item(check, found.as_deref(), now, max_wait);
        let item_admitted = batch::admitted(&item, admitted);
        let mut taken = item.taken(shared.id);
        let rule = if batch::writes(check, &item, item_admitted) {
            let created = found.is_none();
            let stored = match found {
                Some(entry) => entry,
                None => shard.insert(hash, check, Entry::default()),
            };
            let rule = write(check, stored, now, &item, item_admitted, &mut taken);
            if created {
                shard.sweep_if_grown(now);
            }
            rule
        } else {
            batch::report(check, found.as_deref(), now, &item, item_admitted)
        };
        drop(shard);
        let mut rules = RuleOutcomes::new();
        rules.push(rule);
        let mut outcome = batch::combine(rules, |_| check.in_shadow());
        if admitted {
            outcome.admission = Some(Admission::new([taken]));
        }
        Ok(outcome)
    }

    /// Decides a batch under its shards' locks; one `refused` µs ago only counts denials.
    fn decide_batch(
        &self,
        batch: &[Check<'_>],
        max_wait: u64,
        refused: Option<u64>,
    ) -> Result<Outcome, StoreError> {
        batch::validate(batch)?;
        let shared = &*self.shared;
        let hashes: SmallVec<[u64; 4]> =
            batch.iter().map(|c| shared.hash(c.rule, c.key())).collect();
        let mut shard_ids: SmallVec<[usize; 4]> =
            hashes.iter().map(|h| shared.shard_of(*h)).collect();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        let reading = shared.early_reading();
        // Lock in index order: two batches sharing shards can never wait on each other in a cycle.
        let mut guards: SmallVec<[(usize, SpinlockGuard<'_, Shard>); 4]> = shard_ids
            .iter()
            .map(|&i| (i, lock(&shared.shards[i])))
            .collect();
        let now = shared.now(
            reading,
            &mut guards
                .iter_mut()
                .map(|(_, g)| &mut **g)
                .collect::<SmallVec<[_; 4]>>(),
        );

        // The rules on each key count the request at that key's release.
        let mut evaluate_at = |arrival: u64| -> SmallVec<[batch::Evaluated; 4]> {
            let releases: SmallVec<[u64; 4]> = batch
                .iter()
                .zip(&hashes)
                .map(|(check, &hash)| {
                    let shard = guard_for(&mut guards, shared.shard_of(hash));
                    batch::release(check, shard.get(hash, check), arrival)
                })
                .collect();
            let last = releases.iter().copied().max().unwrap_or(arrival);
            batch
                .iter()
                .zip(&hashes)
                .enumerate()
                .map(|(i, (check, &hash))| {
                    let shard = guard_for(&mut guards, shared.shard_of(hash));
                    let release = batch::key_release(batch, &releases, i);
                    batch::evaluate(check, shard.get(hash, check), arrival, release, last)
                })
                .collect()
        };
        let mut items = evaluate_at(refused.map_or(now, |ago| now.saturating_sub(ago)));
        let mut admitted = refused.is_none() && batch::admits(&items);
        let decides = refused.is_none() && !admitted;
        if let Some(wait) = batch::reservation(&items, max_wait).filter(|_| decides) {
            let reserved = evaluate_at(now + wait);
            if batch::admits(&reserved) {
                (items, admitted) = (reserved, true);
            }
        }

        let (rules, marks) = shared.commit(&mut guards, batch, &hashes, &items, admitted, now);
        drop(guards);
        let mut outcome = batch::combine(rules, |i| batch.get(i).is_some_and(|c| c.in_shadow()));
        if admitted {
            outcome.admission = Some(Admission::new(marks));
        }
        Ok(outcome)
    }
}

impl Shared {
    /// Commits (or reports) each item of an evaluated batch: the rules' outcomes and, if
    /// admitted, one refund mark per item, as the Redis twin records them.
    fn commit(
        &self,
        guards: &mut [(usize, SpinlockGuard<'_, Shard>)],
        batch: &[Check<'_>],
        hashes: &[u64],
        items: &[batch::Evaluated],
        batch_admitted: bool,
        now: u64,
    ) -> (RuleOutcomes, SmallVec<[Taken; 2]>) {
        let mut marks: SmallVec<[Taken; 2]> = SmallVec::new();
        let rules = batch
            .iter()
            .zip(hashes)
            .zip(items)
            .map(|((check, &hash), item)| {
                let shard = guard_for(guards, self.shard_of(hash));
                let admitted = batch::admitted(item, batch_admitted);
                let mut taken = item.taken(self.id);
                let outcome = if batch::writes(check, item, admitted) {
                    shard.update(hash, check, now, |entry| {
                        write(check, entry, now, item, admitted, &mut taken)
                    })
                } else {
                    batch::report(check, shard.get(hash, check), now, item, admitted)
                };
                if batch_admitted {
                    marks.push(taken);
                }
                outcome
            })
            .collect();
        (rules, marks)
    }

    /// `check`'s shard locked for one item outside a decision, with the key's hash and now.
    fn lock(&self, check: &Check<'_>) -> (SpinlockGuard<'_, Shard>, u64, u64) {
        let hash = self.hash(check.rule, check.key());
        let mut shard = lock(&self.shards[self.shard_of(hash)]);
        let now = self.now(None, &mut [&mut shard]);
        (shard, hash, now)
    }

    /// The clock's reading, raised for an unordered clock to the latest in `shards`.
    #[inline]
    fn now(&self, reading: Option<u64>, shards: &mut [&mut Shard]) -> u64 {
        let now = reading.unwrap_or_else(|| self.clock.now_micros());
        if !self.clamp {
            return now;
        }
        let now = shards.iter().fold(now, |t, s| t.max(s.latest));
        for shard in shards {
            shard.latest = now;
        }
        now
    }

    /// A reading before locking (it overlaps the wait), where [`now`](Self::now) orders it.
    #[inline]
    fn early_reading(&self) -> Option<u64> {
        self.clamp.then(|| self.clock.now_micros())
    }

    fn hash(&self, rule: &Rule, key: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        hash_pair(&mut h, rule.name_digest(), key);
        h.finish()
    }

    fn shard_of(&self, hash: u64) -> usize {
        // The map uses the low bits; the shard takes the high ones.
        (hash >> 48) as usize & (self.shards.len() - 1)
    }
}

/// Locks a shard: 6 tries 64 spin hints apart and doubling (~0.1 ms, while a hot key's holder
/// decides on with its lines in cache), then 64 yields, then sleeps (a holder no yield lets
/// run: real time, CPU quotas). A spin lock: its release is a store, not a compare-and-swap.
#[inline(always)]
fn lock(shard: &Spinlock<Shard>) -> SpinlockGuard<'_, Shard> {
    let mut round = 0u32;
    loop {
        match shard.try_lock() {
            Some(guard) => return guard,
            None if round < 6 => (0..64u32 << round).for_each(|_| std::hint::spin_loop()),
            None if round < 6 + 64 => std::thread::yield_now(),
            None => std::thread::sleep(Duration::from_micros(50)),
        }
        round = round.saturating_add(1);
    }
}

fn guard_for<'a, 'g>(
    guards: &'a mut [(usize, SpinlockGuard<'g, Shard>)],
    shard: usize,
) -> &'a mut Shard {
    let slot = guards.iter_mut().find(|(i, _)| *i == shard);
    // Every shard of the batch was locked above.
    &mut slot.expect("shard of a batch item is locked").1
}

/// Commits an item's decision into its entry, noting its mark in `taken` if admitted.
fn write(
    check: &Check<'_>,
    entry: &mut Entry,
    now: u64,
    item: &Evaluated,
    admitted: bool,
    taken: &mut Taken,
) -> RuleOutcome {
    let outcome = batch::commit(check, entry, now, item, admitted);
    if admitted {
        taken.mark = batch::mark(check, entry, item);
    }
    outcome
}

/// The common case of a batch of one: an enforced item costing something, on an unlocked
/// key holding its own configuration's state (`own`, from [`Shard::probe`]) or none, admitted
/// at once, exactly as [`batch`]'s steps would (a property test holds it to them). Anything
/// else gives `found` back. `Ok` carries the admission ([`admitted_outcome`] after unlocking)
/// and the entry to insert for a new key.
fn admit_at_once<'a>(
    check: &Check<'_>,
    found: Option<&'a mut Entry>,
    own: bool,
    now: u64,
) -> Result<(Admitted, Option<Entry>), Option<&'a mut Entry>> {
    let (rule, cost) = (check.rule, check.cost);
    if check.in_shadow() || cost == 0 {
        return Err(found);
    }
    let algorithm = rule.algorithm();
    let carried = |admitted: &Admitted| Carried {
        used: algorithm.limit().saturating_sub(admitted.eval.remaining),
        until: admitted.expires_at,
    };
    let Some(e) = found else {
        let mut state = State::default();
        let Ok(admitted) = algorithm.admit(&mut state, now, cost) else {
            return Err(None);
        };
        let mut entry = Entry::own(state, rule.fingerprint());
        entry.carried = carried(&admitted);
        return Ok((admitted, Some(entry)));
    };
    let locked = rule.penalty().is_some() && e.penalty().locked_for(now).is_some();
    if !own || locked || e.has_leases() {
        return Err(Some(e));
    }
    let Ok(admitted) = algorithm.admit(&mut e.state, now, cost) else {
        return Err(Some(e));
    };
    e.carried = carried(&admitted);
    Ok((admitted, None))
}

/// The outcome of a batch of one that [`admit_at_once`] admitted at `now`, with its mark.
fn admitted_outcome(rule: &Rule, admitted: Admitted, now: u64, store: StoreId) -> Outcome {
    let rule = batch::admitted_rule(rule, &admitted.eval, 0);
    let mut rules = RuleOutcomes::new();
    rules.push(rule);
    Outcome {
        decision: rule.decision,
        rules,
        admission: Some(Admission::one(Taken::at(store, now, admitted.mark))),
    }
}

/// Steps 1 and 2 of [`batch`] for a batch of one on `entry` (now, or a reserved instant
/// within `max_wait`), exactly as [`MemoryStore::decide_batch`] evaluates it.
fn decide_item(
    check: &Check<'_>,
    entry: Option<&Entry>,
    now: u64,
    max_wait: u64,
) -> (batch::Evaluated, bool) {
    let evaluate_at = |arrival: u64| batch::evaluate_alone(check, entry, arrival);
    let item = evaluate_at(now);
    if batch::admits(std::slice::from_ref(&item)) {
        return (item, true);
    }
    if let Some(wait) = batch::reservation(std::slice::from_ref(&item), max_wait) {
        let reserved = evaluate_at(now + wait);
        if batch::admits(std::slice::from_ref(&reserved)) {
            return (reserved, true);
        }
    }
    (item, false)
}

impl Shard {
    fn get(&self, hash: u64, check: &Check<'_>) -> Option<&Entry> {
        let slot = self.map.find(hash, |s| s.key.matches(check));
        slot.map(|s| &s.entry)
    }

    /// The entry of `check` if the table holds it, and whether it holds the rule's own
    /// state. Reading the fingerprint as the key is compared sends for the slot's two cache
    /// lines together ([`Slot`]), not the entry's after the key's. Out of line: hashbrown's
    /// comparison is inlined here, where inside a decision it stays a call of its own.
    #[inline(never)]
    fn probe(&mut self, hash: u64, check: &Check<'_>) -> (Option<&mut Entry>, bool) {
        let mut own = false;
        let found = self.map.find_mut(hash, |s| {
            own = s.entry.is_own(check.rule);
            s.key.matches(check)
        });
        (found.map(|s| &mut s.entry), own)
    }

    /// Inserts `entry` for `check`, whose key the table does not hold.
    fn insert(&mut self, hash: u64, check: &Check<'_>, entry: Entry) -> &mut Entry {
        let key = StoreKey::new(check.rule.name(), check.key());
        let hasher = &self.hasher;
        let slot = self
            .map
            .insert_unique(hash, Slot { entry, key }, |s| hasher.hash_one(&s.key));
        &mut slot.into_mut().entry
    }

    /// Runs `f` on the entry of `check` (created empty if absent) and refreshes its expiry.
    fn update<R>(
        &mut self,
        hash: u64,
        check: &Check<'_>,
        now: u64,
        f: impl FnOnce(&mut Entry) -> R,
    ) -> R {
        let out = match self.probe(hash, check).0 {
            Some(entry) => f(entry),
            None => f(self.insert(hash, check, Entry::default())),
        };
        self.sweep_if_grown(now);
        out
    }

    /// Sweeps the shard if it has doubled since its last sweep (see [`MIN_SWEEP_LEN`]).
    fn sweep_if_grown(&mut self, now: u64) {
        if self.map.len() >= (2 * self.len_after_sweep).max(MIN_SWEEP_LEN) {
            self.sweep(now);
        }
        if !self.at_cap && self.map.len() >= self.cap {
            self.counted_at_cap();
        }
    }

    fn sweep(&mut self, now: u64) -> usize {
        let before = self.map.len();
        self.map.retain(|s| s.entry.expires_at() > now);
        self.len_after_sweep = self.map.len();
        self.counted_at_cap();
        before - self.map.len()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shared.shards.len())
            .field("clock", &self.shared.clock)
            .finish_non_exhaustive()
    }
}

impl Store for MemoryStore {
    async fn check(&self, batch: &[Check<'_>], max_wait: Duration) -> Result<Outcome, StoreError> {
        self.decide(batch, duration_to_micros(max_wait))
    }

    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        if let Some((lease, unused)) = ending {
            self.refund(&[check.with_cost(unused)], lease).await?;
        }
        self.lease_one(&check, duration_to_micros(term))
    }

    #[inline]
    fn try_check_now(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> Option<Result<Outcome, StoreError>> {
        Some(self.decide(batch, duration_to_micros(max_wait)))
    }

    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        batch::validate(std::slice::from_ref(&check))?;
        let (shard, hash, now) = self.shared.lock(&check);
        let entry = shard.get(hash, &check);
        let item = batch::evaluate_alone(&check, entry, now);
        let admitted = batch::admitted(&item, batch::admits(std::slice::from_ref(&item)));
        Ok(batch::report(&check, entry, now, &item, admitted))
    }

    async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        match &outcome.admission {
            Some(admission) => self.refund_admission(batch, admission),
            None => Ok(()),
        }
    }

    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), StoreError> {
        self.overdraw_each(batch)
    }

    async fn count_denials(&self, batch: &[Check<'_>], ago: Duration) -> Result<(), StoreError> {
        let batch = batch::undeferred(batch);
        self.shared.make_room(&batch).map_err(NoRoom::error)?;
        self.decide_batch(&batch, 0, Some(duration_to_micros(ago)))
            .map(drop)
    }

    async fn reset(&self, rule: &Rule, key: &StoredKey<'_>) -> Result<(), StoreError> {
        let check = Check::stored(rule, key.as_bytes());
        let (mut shard, hash, now) = self.shared.lock(&check);
        if let Ok(mut o) = shard.map.find_entry(hash, |s| s.key.matches(&check)) {
            if !o.get_mut().entry.reset(now) {
                o.remove();
            }
        }
        Ok(())
    }

    /// Healthy: in this process, nothing it depends on can be away.
    fn outage_health(&self) -> Health {
        Health::Healthy
    }

    fn health(&self) -> Health {
        Health::Healthy
    }
}

#[cfg(test)]
mod tests;
