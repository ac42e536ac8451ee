//! The in-process store: a sharded map of entries, decided under the shards' locks.

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use hashbrown::hash_map::RawEntryMut;
use hashbrown::DefaultHashBuilder;
use hashbrown::HashMap;
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

use crate::algorithm::{Admitted, Carried, State, Verdict};
use crate::clock::{duration_to_micros, Clock, MonotonicClock};
use crate::decision::{Decision, Outcome, RateLimitInfo, RuleOutcome, RuleOutcomes};
use crate::error::StoreError;
use crate::rule::name_digest;
use crate::store::batch::{self, Entry, Evaluated};
use crate::store::{Admission, Check, Store, Taken};
use crate::Rule;

/// Shards are swept of expired entries when they have doubled since the last sweep, but not
/// below this size (sweeping tiny shards often gains nothing).
const MIN_SWEEP_LEN: usize = 1024;

/// Rule state kept in this process: for single-node services, tests, and as the fallback
/// when Redis is down.
///
/// The map is split into shards, each behind its own lock, so requests for different keys
/// rarely wait on each other; a batch locks the shards it touches (in index order, so two
/// batches never deadlock) and is decided atomically. Idle entries are removed once their
/// state is back to empty: a shard sweeps itself when it has doubled in size since its last
/// sweep, which bounds memory to about twice the live keys, and
/// [`purge_expired`](Self::purge_expired) sweeps everything on demand.
///
/// A decision allocates nothing once its key's entry exists (a key whose rule name and key
/// together exceed 29 bytes takes one allocation when its entry is made), except once per
/// key for a rule with a [`Penalty`](crate::Penalty): its bookkeeping goes on the heap at
/// the first denial it counts, so that the entries of every other key stay small.
///
/// `Clone` is cheap and shares the state.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Limiter, MemoryStore, Rule};
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

struct Shared {
    shards: Box<[Mutex<Shard>]>,
    hasher: DefaultHashBuilder,
    clock: Arc<dyn Clock>,
    /// `!clock.ordered_across_threads()`: time is kept from going backwards per shard.
    clamp: bool,
}

struct Shard {
    map: HashMap<StoreKey, Slot, DefaultHashBuilder>,
    len_after_sweep: usize,
    /// The latest instant a decision in this shard was taken at, for clocks whose readings
    /// on different threads may come out of order (see [`Clock::ordered_across_threads`]).
    latest: u64,
}

/// A rule's name and a key, `name ‖ key`: inline when they fit in [`INLINE_KEY`] bytes (a
/// lookup then compares them in the map's own memory, and an entry costs no allocation of
/// its own), else in one allocation.
enum StoreKey {
    /// See [`Inline`].
    Inline(Inline),
    Heap {
        rule_len: usize,
        bytes: Box<[u8]>,
    },
}

/// An inline `name ‖ key`: `[name length, total length, name ‖ key, zeros]`. A lookup
/// compares the name and the key with the stored parts where they are: building a probe of
/// this form first and reading it back whole stalls the load on the copy's narrower stores
/// (a store-forwarding stall: 13 % of the store's samples on a hot key in a profile).
type Inline = [u8; INLINE_KEY + 2];

/// The longest `name ‖ key` a [`StoreKey`] holds inline: as much as fits beside its tag in
/// the 32 bytes its heap form takes anyway.
const INLINE_KEY: usize = 29;

impl StoreKey {
    fn new(rule: &str, key: &[u8]) -> Self {
        if let Some(inline) = Self::inline(rule, key) {
            return Self::Inline(inline);
        }
        let mut bytes = Vec::with_capacity(rule.len() + key.len());
        bytes.extend_from_slice(rule.as_bytes());
        bytes.extend_from_slice(key);
        Self::Heap {
            rule_len: rule.len(),
            bytes: bytes.into_boxed_slice(),
        }
    }

    /// The inline form of `rule ‖ key`, if it fits.
    fn inline(rule: &str, key: &[u8]) -> Option<Inline> {
        let len = rule.len() + key.len();
        if len > INLINE_KEY {
            return None;
        }
        let mut bytes = [0; INLINE_KEY + 2];
        // Both fit in INLINE_KEY bytes, so in a u8.
        bytes[0] = rule.len() as u8;
        bytes[1] = len as u8;
        bytes[2..2 + rule.len()].copy_from_slice(rule.as_bytes());
        bytes[2 + rule.len()..2 + len].copy_from_slice(key);
        Some(bytes)
    }

    /// The rule's name and the key.
    fn parts(&self) -> (&[u8], &[u8]) {
        match self {
            Self::Inline(bytes) => {
                bytes[2..2 + usize::from(bytes[1])].split_at(usize::from(bytes[0]))
            }
            Self::Heap { rule_len, bytes } => bytes.split_at(*rule_len),
        }
    }

    #[inline]
    fn matches(&self, check: &Check<'_>) -> bool {
        let (rule, key) = self.parts();
        rule == check.rule.name().as_bytes() && key == check.key
    }
}

/// The map rehashes stored keys with this when it grows, so it must agree with
/// [`Shared::hash`]: both go through [`hash_pair`].
impl Hash for StoreKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let (rule, key) = self.parts();
        hash_pair(state, name_digest(rule), key);
    }
}

/// The one way a (rule name, key) pair is hashed, for lookups and stored keys alike: the
/// name's digest ([`name_digest`], cached in the rule) and the key's bytes, read where they
/// are (a copy made just before would be read back before it is written out, a stall).
fn hash_pair<H: Hasher>(state: &mut H, name_digest: u64, key: &[u8]) {
    state.write_u64(name_digest);
    state.write(key);
}

struct Slot {
    entry: Entry,
    expires_at: u64,
}

impl MemoryStore {
    /// An empty store on a [`MonotonicClock`] (see there why not the wall clock).
    pub fn new() -> Self {
        Self::with_clock(MonotonicClock::new())
    }

    /// An empty store reading time from `clock` (a [`ManualClock`](crate::ManualClock) makes
    /// tests deterministic).
    pub fn with_clock(clock: impl Clock) -> Self {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        let shards = (cores * 16).next_power_of_two().max(16);
        let hasher = DefaultHashBuilder::default();
        Self {
            shared: Arc::new(Shared {
                shards: (0..shards)
                    .map(|_| {
                        Mutex::new(Shard {
                            map: HashMap::with_hasher(hasher.clone()),
                            len_after_sweep: 0,
                            latest: 0,
                        })
                    })
                    .collect(),
                hasher,
                clamp: !clock.ordered_across_threads(),
                clock: Arc::new(clock),
            }),
        }
    }

    /// The number of entries held, expired or not.
    pub fn len(&self) -> usize {
        self.shared.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    /// Whether the store holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every entry whose state is back to empty; returns how many were removed.
    pub fn purge_expired(&self) -> usize {
        let now = self.shared.clock.now_micros();
        self.shared.shards.iter().map(|s| s.lock().sweep(now)).sum()
    }

    /// Decides `batch` now (see [`Limiter::check_now`](crate::Limiter::check_now)).
    pub(crate) fn decide_now(&self, batch: &[Check<'_>]) -> Result<Outcome, StoreError> {
        self.decide(batch, 0)
    }

    fn decide(&self, batch: &[Check<'_>], max_wait: u64) -> Result<Outcome, StoreError> {
        match batch {
            [check] => self.decide_one(check, max_wait),
            _ => self.decide_batch(batch, max_wait),
        }
    }

    /// [`decide_batch`](Self::decide_batch) for a batch of one: one lookup of the entry
    /// under one lock, and the same steps of [`batch`] on it (a property test compares the
    /// two paths).
    fn decide_one(&self, check: &Check<'_>, max_wait: u64) -> Result<Outcome, StoreError> {
        // A batch of one holds no rule twice: only the rule's own validity is in question,
        // checked when it was built.
        if !check.rule.is_valid() {
            batch::validate(std::slice::from_ref(check))?;
        }
        let shared = &*self.shared;
        let hash = shared.hash(check.rule, check.key);
        let mut shard = shared.shards[shared.shard_of(hash)].lock();
        let now = shared.now(&mut [&mut shard]);
        let entry = shard
            .map
            .raw_entry_mut()
            .from_hash(hash, |k| k.matches(check));
        let entry = match admit_at_once(check, entry, hash, now) {
            Ok((admitted, created)) => {
                if created {
                    shard.sweep_if_grown(now);
                }
                // The outcome is written out after the lock is released: the unlock's
                // atomic operation then waits on the entry's few stores only.
                drop(shard);
                return Ok(admitted_outcome(check.rule, admitted, now));
            }
            Err(entry) => entry,
        };
        let existing = match &entry {
            RawEntryMut::Occupied(o) => Some(&o.get().entry),
            RawEntryMut::Vacant(_) => None,
        };
        let (item, admitted) = decide_item(check, existing, now, max_wait);
        let item_admitted = batch::admitted(&item, admitted);
        let mut taken = Taken {
            at: item.counted_at(),
            ..Taken::default()
        };
        let rule = if batch::writes(check, &item, item_admitted) {
            let (slot, created) = match entry {
                RawEntryMut::Occupied(o) => (o.into_mut(), false),
                RawEntryMut::Vacant(v) => {
                    let key = StoreKey::new(check.rule.name(), check.key);
                    let slot = Slot {
                        entry: Entry::default(),
                        expires_at: 0,
                    };
                    (v.insert_hashed_nocheck(hash, key, slot).1, true)
                }
            };
            let rule = write(
                check,
                &mut slot.entry,
                now,
                &item,
                item_admitted,
                &mut taken,
            );
            slot.expires_at = slot.entry.expires_at(check.rule);
            if created {
                shard.sweep_if_grown(now);
            }
            rule
        } else {
            batch::report(check, existing, now, &item, item_admitted)
        };
        drop(shard);
        let mut rules = RuleOutcomes::new();
        rules.push(rule);
        let mut outcome = batch::combine(rules, |_| check.shadow);
        if admitted {
            outcome.admission = Some(Admission::new([taken]));
        }
        Ok(outcome)
    }

    /// Decides a batch of any length: every shard it touches locked (in index order), every
    /// item evaluated, then committed or reported.
    fn decide_batch(&self, batch: &[Check<'_>], max_wait: u64) -> Result<Outcome, StoreError> {
        batch::validate(batch)?;
        let shared = &*self.shared;
        let hashes: SmallVec<[u64; 4]> = batch.iter().map(|c| shared.hash(c.rule, c.key)).collect();
        let mut shard_ids: SmallVec<[usize; 4]> =
            hashes.iter().map(|h| shared.shard_of(*h)).collect();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        let mut rules = RuleOutcomes::new();
        // Lock in index order: two batches sharing shards can never wait on each other in a cycle.
        let mut guards: SmallVec<[(usize, MutexGuard<'_, Shard>); 4]> = shard_ids
            .iter()
            .map(|&i| (i, shared.shards[i].lock()))
            .collect();
        let now = shared.now(
            &mut guards
                .iter_mut()
                .map(|(_, g)| &mut **g)
                .collect::<SmallVec<[_; 4]>>(),
        );

        // A request arriving at `arrival` passes on each key once every rule on it lets it:
        // the rules on that key count it then (see `batch::key_release`).
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
        let mut items = evaluate_at(now);
        let mut admitted = batch::admits(&items);
        if let Some(wait) = batch::reservation(&items, max_wait).filter(|_| !admitted) {
            let reserved = evaluate_at(now + wait);
            if batch::admits(&reserved) {
                (items, admitted) = (reserved, true);
            }
        }

        // One mark per item of an admitted batch (a shadow item that denied took nothing; a
        // refund skips shadow items), each at the instant its rule counted the request, as
        // the Redis twin records it.
        let mut marks: SmallVec<[Taken; 2]> = SmallVec::new();
        let batch_admitted = admitted;
        rules.extend(
            batch
                .iter()
                .zip(&hashes)
                .zip(&items)
                .map(|((check, &hash), item)| {
                    let shard = guard_for(&mut guards, shared.shard_of(hash));
                    let admitted = batch::admitted(item, batch_admitted);
                    let mut taken = if item.is_pending() {
                        Taken::pending()
                    } else {
                        Taken {
                            at: item.counted_at(),
                            ..Taken::default()
                        }
                    };
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
                }),
        );
        drop(guards);
        let mut outcome = batch::combine(rules, |i| batch.get(i).is_some_and(|c| c.shadow));
        if admitted {
            outcome.admission = Some(Admission::new(marks));
        }
        Ok(outcome)
    }

    /// [`Store::refund`]: each item under its shard's lock, as exact as the models allow.
    fn give_back(&self, batch: &[Check<'_>], admission: &Admission) -> Result<(), StoreError> {
        batch::validate(batch)?;
        let shared = &*self.shared;
        for (i, check) in batch.iter().enumerate() {
            // A trial rule's units are not given back: it may have taken nothing.
            if check.cost == 0 || check.shadow {
                continue;
            }
            let hash = shared.hash(check.rule, check.key);
            let mut shard = shared.shards[shared.shard_of(hash)].lock();
            let now = shared.now(&mut [&mut shard]);
            if let Some(slot) = shard.get_mut(hash, check) {
                let taken = admission.taken(i);
                if taken.pending {
                    // Never counted: nothing to give back.
                    continue;
                }
                if batch::refund(check, &mut slot.entry, now, taken.at, taken.mark) {
                    slot.expires_at = slot.entry.expires_at(check.rule);
                }
            }
        }
        Ok(())
    }
}

impl Shared {
    /// The instant to decide at in `shards` (all locked): the clock's reading, or for a
    /// clock whose readings on different threads may come out of order, never earlier than
    /// an instant already decided at in one of them (and recorded as the latest in each).
    fn now(&self, shards: &mut [&mut Shard]) -> u64 {
        let now = self.clock.now_micros();
        if !self.clamp {
            return now;
        }
        let now = shards.iter().fold(now, |t, s| t.max(s.latest));
        for shard in shards {
            shard.latest = now;
        }
        now
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

fn guard_for<'a, 'g>(
    guards: &'a mut [(usize, MutexGuard<'g, Shard>)],
    shard: usize,
) -> &'a mut Shard {
    let slot = guards.iter_mut().find(|(i, _)| *i == shard);
    // Every shard of the batch was locked above.
    &mut slot.expect("shard of a batch item is locked").1
}

/// Commits an item's decision into its entry, and notes in `taken` what a refund of an
/// admitted item needs (its mark).
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

/// The map's entry for one item, found or not.
type MapEntry<'a> = RawEntryMut<'a, StoreKey, Slot, DefaultHashBuilder>;

/// The common case of a batch of one, decided without the batch steps: an enforced item
/// that costs something, on a key holding its own configuration's state (or none) that no
/// penalty of its rule locks, admitted at once. It decides exactly as the steps of
/// [`batch`] do on such an item (evaluate at now, commit, report, combine), with the
/// entry's expiry taken from the commit instead of computed again; the property test
/// below holds it to the general path. Anything else (a denial, a wait, another
/// configuration's state, a lock, a shadow item, a cost of 0) goes back as `Err` for the
/// general steps to decide. `Ok` carries the admission, whose outcome is written once the
/// shard's lock is released ([`admitted_outcome`]), and whether the entry was created.
fn admit_at_once<'a>(
    check: &Check<'_>,
    entry: MapEntry<'a>,
    hash: u64,
    now: u64,
) -> Result<(Admitted, bool), MapEntry<'a>> {
    let (rule, cost) = (check.rule, check.cost);
    if check.shadow || cost == 0 {
        return Err(entry);
    }
    let algorithm = rule.algorithm();
    let (slot, admitted, created) = match entry {
        RawEntryMut::Occupied(mut o) => {
            let e = &mut o.get_mut().entry;
            let locked = rule.penalty().is_some() && e.penalty().locked_for(now).is_some();
            if !e.is_own(rule) || locked {
                return Err(RawEntryMut::Occupied(o));
            }
            match algorithm.admit(&mut e.state, now, cost) {
                Ok(admitted) => (o.into_mut(), admitted, false),
                Err(_) => return Err(RawEntryMut::Occupied(o)),
            }
        }
        RawEntryMut::Vacant(v) => {
            let mut state = State::default();
            let Ok(admitted) = algorithm.admit(&mut state, now, cost) else {
                return Err(RawEntryMut::Vacant(v));
            };
            let slot = Slot {
                entry: Entry::own(state, rule.fingerprint()),
                expires_at: 0,
            };
            let key = StoreKey::new(rule.name(), check.key);
            (v.insert_hashed_nocheck(hash, key, slot).1, admitted, true)
        }
    };
    let e = &mut slot.entry;
    e.carried = Carried {
        used: algorithm.limit().saturating_sub(admitted.eval.remaining),
        until: admitted.expires_at,
    };
    slot.expires_at = admitted.expires_at.max(e.penalty_expires_at(rule));
    Ok((admitted, created))
}

/// The outcome of a batch of one that [`admit_at_once`] admitted at `now`: what
/// [`batch::combine`] makes of the one rule's report, with the admission's mark for a refund.
fn admitted_outcome(rule: &Rule, admitted: Admitted, now: u64) -> Outcome {
    let Admitted { eval, mark, .. } = admitted;
    let delay_micros = match eval.verdict {
        Verdict::Admit { delay_micros } => delay_micros,
        Verdict::Reject { .. } => 0,
    };
    let decision = if delay_micros > 0 {
        Decision::Delay(Duration::from_micros(delay_micros))
    } else {
        Decision::Allow
    };
    let mut rules = RuleOutcomes::new();
    rules.push(RuleOutcome {
        decision,
        info: RateLimitInfo {
            limit: rule.algorithm().limit(),
            remaining: eval.remaining,
            reset: Duration::from_micros(eval.reset_micros),
        },
    });
    Outcome {
        decision,
        rules,
        admission: Some(Admission::one(Taken::at(now, mark))),
    }
}

/// Steps 1 and 2 of [`batch`] for a batch of one on `entry`: the item as decided (at now,
/// or at a reserved instant within `max_wait`) and whether the batch is admitted, exactly
/// as [`MemoryStore::decide_batch`] evaluates a batch of one.
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
        self.map
            .raw_entry()
            .from_hash(hash, |k| k.matches(check))
            .map(|(_, slot)| &slot.entry)
    }

    fn get_mut(&mut self, hash: u64, check: &Check<'_>) -> Option<&mut Slot> {
        match self
            .map
            .raw_entry_mut()
            .from_hash(hash, |k| k.matches(check))
        {
            RawEntryMut::Occupied(o) => Some(o.into_mut()),
            RawEntryMut::Vacant(_) => None,
        }
    }

    /// Runs `f` on the entry of `check` (created empty if absent) and refreshes its expiry.
    fn update<R>(
        &mut self,
        hash: u64,
        check: &Check<'_>,
        now: u64,
        f: impl FnOnce(&mut Entry) -> R,
    ) -> R {
        let slot = match self
            .map
            .raw_entry_mut()
            .from_hash(hash, |k| k.matches(check))
        {
            RawEntryMut::Occupied(o) => o.into_mut(),
            RawEntryMut::Vacant(v) => {
                v.insert_hashed_nocheck(
                    hash,
                    StoreKey::new(check.rule.name(), check.key),
                    Slot {
                        entry: Entry::default(),
                        expires_at: 0,
                    },
                )
                .1
            }
        };
        let out = f(&mut slot.entry);
        slot.expires_at = slot.entry.expires_at(check.rule);
        self.sweep_if_grown(now);
        out
    }

    /// Sweeps the shard if it has doubled since its last sweep (see [`MIN_SWEEP_LEN`]).
    fn sweep_if_grown(&mut self, now: u64) {
        if self.map.len() >= (2 * self.len_after_sweep).max(MIN_SWEEP_LEN) {
            self.sweep(now);
        }
    }

    fn sweep(&mut self, now: u64) -> usize {
        let before = self.map.len();
        self.map.retain(|_, slot| slot.expires_at > now);
        self.len_after_sweep = self.map.len();
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
    fn check(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        std::future::ready(self.decide(batch, duration_to_micros(max_wait)))
    }

    fn check_now(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> Option<Result<Outcome, StoreError>> {
        Some(self.decide(batch, duration_to_micros(max_wait)))
    }

    fn peek(
        &self,
        check: Check<'_>,
    ) -> impl Future<Output = Result<RuleOutcome, StoreError>> + Send {
        if let Err(e) = batch::validate(std::slice::from_ref(&check)) {
            return std::future::ready(Err(e));
        }
        let shared = &*self.shared;
        let hash = shared.hash(check.rule, check.key);
        let mut shard = shared.shards[shared.shard_of(hash)].lock();
        let now = shared.now(&mut [&mut shard]);
        let entry = shard.get(hash, &check);
        let item = batch::evaluate_alone(&check, entry, now);
        let admitted = batch::admitted(&item, batch::admits(std::slice::from_ref(&item)));
        std::future::ready(Ok(batch::report(&check, entry, now, &item, admitted)))
    }

    fn refund(
        &self,
        batch: &[Check<'_>],
        outcome: &Outcome,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(match &outcome.admission {
            Some(admission) => self.give_back(batch, admission),
            None => Ok(()),
        })
    }

    fn reset(
        &self,
        rule: &Rule,
        key: &[u8],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let shared = &*self.shared;
        let check = Check::new(rule, key);
        let hash = shared.hash(rule, key);
        let mut shard = shared.shards[shared.shard_of(hash)].lock();
        if let RawEntryMut::Occupied(o) = shard
            .map
            .raw_entry_mut()
            .from_hash(hash, |k| k.matches(&check))
        {
            o.remove();
        }
        std::future::ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::{ManualClock, Penalty, Rate};

    /// A rule of one of the six algorithms (both token-bucket refills) with small numbers,
    /// perhaps with a penalty; `variant` picks another configuration of the same name.
    fn rule(kind: u8, quota: u64, period: u64, penalty: bool) -> Rule {
        let rule = crate::rule::sample(kind, quota, period);
        if penalty {
            rule.with_penalty(Penalty::lock_for(Duration::from_micros(period)).after(2))
        } else {
            rule
        }
    }

    /// (advance µs, which of the two configurations, cost, shadow, max wait µs, refund it)
    type Step = (u64, bool, u64, bool, u64, bool);

    fn step() -> impl Strategy<Value = Step> {
        (
            prop_oneof![Just(0u64), 0..300u64, 0..5_000u64],
            proptest::bool::weighted(0.2),
            prop_oneof![4 => Just(1u64), 1 => 0..5u64],
            proptest::bool::weighted(0.1),
            prop_oneof![Just(0u64), Just(700), Just(10_000)],
            proptest::bool::weighted(0.1),
        )
    }

    fn ready<F: Future>(fut: F) -> F::Output {
        use std::task::{Context, Poll, Waker};
        match std::pin::pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(out) => out,
            Poll::Pending => panic!("MemoryStore futures are ready on first poll"),
        }
    }

    /// Every entry with its expiry, by name ‖ key: what two stores hold, comparable
    /// whatever their hashers.
    fn entries(store: &MemoryStore) -> Vec<(Vec<u8>, Entry, u64)> {
        let mut all: Vec<_> = store
            .shared
            .shards
            .iter()
            .flat_map(|s| {
                s.lock()
                    .map
                    .iter()
                    .map(|(k, slot)| {
                        let (rule, key) = k.parts();
                        ([rule, key].concat(), slot.entry.clone(), slot.expires_at)
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// What a key costs in the map: the boxed form's 32 bytes, inline or not, and its slot
    /// 72 (the penalty on the heap).
    #[test]
    fn a_stored_key_takes_32_bytes() {
        assert_eq!(std::mem::size_of::<StoreKey>(), 32);
        assert_eq!(std::mem::size_of::<Slot>(), 72);
    }

    /// Keys held inline and on the heap (either side of `INLINE_KEY`), and a name ‖ key
    /// that spells another pair's bytes, are each their own key with their own quota.
    #[test]
    fn keys_inline_and_on_the_heap_are_distinct() {
        let store = MemoryStore::with_clock(ManualClock::new(1_000_000));
        let window = Duration::from_secs(60);
        let (a, ab) = (
            Rule::fixed_window("a", 1, window),
            Rule::fixed_window("ab", 1, window),
        );
        let mut checks = vec![Check::new(&ab, b"c"), Check::new(&a, b"bc")];
        let long: Vec<Vec<u8>> = (INLINE_KEY - 3..INLINE_KEY + 3)
            .flat_map(|n| [vec![b'x'; n], vec![b'y'; n]])
            .collect();
        checks.extend(long.iter().map(|k| Check::new(&a, k)));
        for check in &checks {
            let first = ready(store.check(std::slice::from_ref(check), Duration::ZERO));
            assert!(first.unwrap().is_admitted(), "{check:?}");
        }
        assert_eq!(store.len(), checks.len());
        for check in &checks {
            let again = ready(store.check(std::slice::from_ref(check), Duration::ZERO));
            assert!(!again.unwrap().is_admitted(), "{check:?}");
        }
    }

    /// The map rehashes its keys as it grows: a stored key must hash as a lookup of the
    /// same pair does, inline (short) or on the heap (long), or the grown map would lose it.
    #[test]
    fn keys_are_found_after_the_map_has_grown() {
        let store = MemoryStore::with_clock(ManualClock::new(1_000_000));
        let rule = Rule::fixed_window("a", 1, Duration::from_secs(60));
        let keys: Vec<Vec<u8>> = (0..3000)
            .map(|i| format!("{i}{}", "x".repeat(i % 40)).into_bytes())
            .collect();
        for key in &keys {
            let first = ready(store.check(&[Check::new(&rule, key)], Duration::ZERO));
            assert!(first.unwrap().is_admitted());
        }
        for key in &keys {
            let again = ready(store.check(&[Check::new(&rule, key)], Duration::ZERO));
            assert!(!again.unwrap().is_admitted());
        }
        assert_eq!(store.len(), keys.len());
    }

    /// A clock whose readings on different threads may come out of order, as
    /// `MonotonicClock`'s can (one core's counter a fraction of a µs behind another's).
    #[derive(Debug)]
    struct Skewed(ManualClock);

    impl Clock for Skewed {
        fn now_micros(&self) -> u64 {
            self.0.now_micros()
        }
        fn ordered_across_threads(&self) -> bool {
            false
        }
    }

    /// A reading a microsecond behind the last decision in the shard is taken as that
    /// decision's instant: a roomy bucket keeps admitting (read as is, the state would lie
    /// in the future and deny as a reservation), through both paths and a refund.
    #[test]
    fn a_clock_out_of_order_across_threads_never_moves_a_shard_back() {
        let clock = ManualClock::new(1_000_000);
        let store = MemoryStore::with_clock(Skewed(clock.clone()));
        let rule = Rule::token_bucket("r", 1 << 20, Rate::per_second(1));
        let other = Rule::gcra("g", Rate::per_second(1), 1 << 20);
        let one = [Check::new(&rule, b"k")];
        let two = [Check::new(&rule, b"k"), Check::new(&other, b"k")];
        for i in 0..10 {
            clock.set_micros(1_000_000 - i % 2);
            let outcome = ready(store.check(&one, Duration::ZERO)).unwrap();
            assert_eq!(outcome.decision, crate::Decision::Allow, "{i}");
            let both = ready(store.check(&two, Duration::ZERO)).unwrap();
            assert_eq!(both.decision, crate::Decision::Allow, "{i}");
            ready(store.refund(&two, &both)).unwrap();
        }
        // Read as they are, the same readings deny.
        let store = MemoryStore::with_clock(clock.clone());
        clock.set_micros(1_000_000);
        assert!(ready(store.check(&one, Duration::ZERO))
            .unwrap()
            .is_admitted());
        clock.set_micros(999_999);
        assert!(!ready(store.check(&one, Duration::ZERO))
            .unwrap()
            .is_admitted());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The path for a batch of one decides exactly as the general path on every
        /// schedule: the same outcomes (decision, per-rule info, admission) step by step,
        /// under reconfiguration, penalties, shadow items, costs, reservations and refunds.
        #[test]
        fn a_batch_of_one_decides_as_the_general_path(
            kinds in (0u8..7, 0u8..7),
            quotas in (1u64..5, 1u64..5),
            periods in (100u64..3_000, 100u64..3_000),
            penalties in (any::<bool>(), any::<bool>()),
            steps in proptest::collection::vec(step(), 1..80),
        ) {
            let rules = [
                rule(kinds.0, quotas.0, periods.0, penalties.0),
                rule(kinds.1, quotas.1, periods.1, penalties.1),
            ];
            let start = 1_700_000_000_000_000;
            let (fast_clock, general_clock) = (ManualClock::new(start), ManualClock::new(start));
            let fast = MemoryStore::with_clock(fast_clock.clone());
            let general = MemoryStore::with_clock(general_clock.clone());
            for (advance, second, cost, shadow, max_wait, refund) in steps {
                fast_clock.advance_micros(advance);
                general_clock.advance_micros(advance);
                let mut check = Check::new(&rules[usize::from(second)], b"k").with_cost(cost);
                check.shadow = shadow;
                let batch = [check];
                let a = fast.decide_one(&check, max_wait).unwrap();
                let b = general.decide_batch(&batch, max_wait).unwrap();
                prop_assert_eq!(&a, &b);
                // The same entries too, expiry included (which only a sweep would show).
                prop_assert_eq!(entries(&fast), entries(&general));
                if let (true, Some(admission)) = (refund, &a.admission) {
                    fast.give_back(&batch, admission).unwrap();
                    general.give_back(&batch, admission).unwrap();
                }
            }
            prop_assert_eq!(fast.len(), general.len());
        }
    }
}
