//! [`Leased`]: decides a hot key in process from a leased share of its quota.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hashbrown::HashMap;
use tokio::time::Instant;

use crate::clock::duration_to_micros;
use crate::decision::{Decision, Outcome, RuleOutcome};
use crate::error::{ConfigError, StoreError};
use crate::store::batch;
use crate::store::check::{Check, Health, Store};
use crate::stored::StoredKey;
use crate::Rule;
use smallvec::SmallVec;

/// A store that leases `units` of a hot key's quota to this instance in one call and
/// decides from them in process, then takes the next share: one store call per lease, not
/// per decision. Opt-in per rule ([`lease`](Self::lease)); every other rule, and every batch
/// a lease cannot answer, goes to the wrapped store unchanged.
///
/// # What is exact
///
/// A lease is [`Store::lease`]: `units` of the key's bucket *parked* in the store until the
/// lease ends or its `term` passes. Only a **token bucket** or **GCRA** can lease; windows
/// and logs would date a unit when taken, a leaky bucket's units are its queue, and a
/// [`Penalty`](crate::Penalty) would never count a lease's denials.
///
/// - **Never more than the rule admits in one process**, across all instances, counted by
///   when requests pass: a unit used at the last instant of its lease found no refill in
///   its place. A lease admits only until its term (measured from before the store counts
///   it), so never after the store stops parking its units.
/// - **A request a lease cannot answer gets the store's answer**, exactly: a lease the
///   store will not renew, a cost larger than the lease, a wait, a shadow check. Denials
///   and their `Retry-After` always come from the store.
/// - **A batch with other rules** takes the first leased rule's units from the lease and
///   asks the store for the others; if the store refuses, the units go back to the lease
///   (unless it ended meanwhile). If no lease can answer, the store decides the batch.
/// - **Renewals, reloads, resets keep it**: the store keeps a key's parked units through a
///   [`reset`](Store::reset) (the holders may still use them) and under a rule reloaded
///   with other parameters, whose bucket they hold down alike.
///
/// # What a lease costs: under-admission, bounded
///
/// Parked units are unavailable to other instances: at most `units` per instance per leased
/// key. A lease ends when its units run out, a request needs more than it has left, or its
/// `term` passes, and gives its unused units back at once. A dead instance's lease ends in
/// the store at its term: its units stop holding the bucket down and count as used (it may
/// have used each until its last instant), refilling at the rule's rate from then. Take
/// `units` well under the burst divided by the instances, and a `term` of a fraction of a
/// second.
///
/// # What a locally decided request reports
///
/// Its [`RateLimitInfo`](crate::RateLimitInfo) is the store's as the lease found it, the
/// lease's unused units counted as remaining; a refund does not give its units back. A rule
/// reloaded with other parameters is decided by the store until a `Leased` is built for it.
/// [`reset`](Store::reset) ends this instance's lease of the key and clears the store's
/// state of it. `Leased<Fallback<…>>` leases from the
/// [`Fallback`](super::Fallback)'s local store while the primary is away.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Check, Limiter, Rate, Rule, store::{Leased, MemoryStore}};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let global = Rule::gcra("global", 10_000, Rate::per_second(100_000));
/// // `MemoryStore::new()` stands for `RedisStore::connect(url).await?`.
/// let store = Leased::new(MemoryStore::new()).lease(&global, 500, Duration::from_millis(200))?;
/// let limiter = Limiter::new(store);
/// for _ in 0..1_000 {
///     assert!(limiter.check(&[Check::new(&global, b"all")]).await?.is_admitted());
/// }
///
/// // A sliding log cannot lease: its units would be dated when taken.
/// let log = Rule::sliding_log("log", 100, Duration::from_secs(1));
/// let refused = Leased::new(MemoryStore::new()).lease(&log, 10, Duration::from_millis(200));
/// assert!(refused.unwrap_err().to_string().contains("only a token bucket or GCRA"));
/// # Ok(()) }
/// ```
pub struct Leased<S: Store + Clone> {
    shared: Arc<Shared<S>>,
}

/// What every clone of a `Leased` shares.
struct Shared<S: Store + Clone> {
    store: S,
    terms: Vec<Arc<Terms<S>>>,
}

/// One leased rule: its lease's size and term, and its leases by key.
struct Terms<S: Store + Clone> {
    /// The wrapped store, which a lease's timer ends it in.
    store: S,
    /// The instant a slot's deadline counts from.
    epoch: Instant,
    rule: Rule,
    units: u64,
    term: Duration,
    leases: RwLock<Slots>,
}

/// The leases of one rule, by key.
type Slots = HashMap<Box<[u8]>, Arc<Slot>>;

/// The lease of one key.
#[derive(Default)]
struct Slot {
    /// The key, in stored form.
    key: Box<[u8]>,
    /// Until when (µs after its `Terms::epoch`) the lease may admit (see `renew`).
    deadline: AtomicU64,
    /// Units this instance may still admit; 0 when no lease is held. Taken without a lock.
    left: AtomicU64,
    /// The store's remaining units when the lease was taken (reported with `left`).
    remaining: AtomicU64,
    /// The store's reset when the lease was taken, in µs.
    reset_us: AtomicU64,
    /// `Held::generation` without the lock: set before a new lease's units (see `lend`).
    generation: AtomicU64,
    /// Locked while a lease ends or is taken: one request takes it, the others wait.
    held: tokio::sync::Mutex<Held>,
}

/// Units a request took from a lease, to give back if its batch is refused.
struct Lent {
    slot: Arc<Slot>,
    /// `None` if the lease changed while they were taken: they stay used.
    generation: Option<u64>,
    cost: u64,
}

/// The lease a slot holds, if any.
#[derive(Default)]
struct Held {
    lease: Option<Outcome>,
    /// Counts the leases taken, so that a timer ends only its own.
    generation: u64,
    /// Until when the store denied a lease: the key's requests go to the store until then.
    denied_until: Option<Instant>,
}

impl<S: Store + Clone> Leased<S> {
    /// `store`, with no rule leased yet: every check goes to it.
    pub fn new(store: S) -> Self {
        Self {
            shared: Arc::new(Shared {
                store,
                terms: Vec::new(),
            }),
        }
    }

    /// Leases `rule`'s quota to this instance `units` at a time, each for at most `term`.
    /// Refused, naming the rule: an invalid rule, an algorithm other than a token bucket or
    /// GCRA, a penalty, `units` of 0 or above the burst, a zero `term`, a rule leased twice.
    pub fn lease(self, rule: &Rule, units: u64, term: Duration) -> Result<Self, ConfigError> {
        rule.validate()?;
        let problems = Self::problems(rule, units, term)
            .chain(
                self.shared
                    .terms
                    .iter()
                    .any(|t| t.rule.name() == rule.name())
                    .then(|| ConfigError::new("is leased twice")),
            )
            .map(|p| p.within(format_args!("rule {:?}", rule.name())));
        if let Some(error) = ConfigError::collect(problems) {
            return Err(error);
        }
        let Shared { store, mut terms } = Arc::into_inner(self.shared).ok_or_else(|| {
            ConfigError::new("a Leased is configured before it is cloned".to_owned())
        })?;
        terms.push(Arc::new(Terms {
            store: store.clone(),
            epoch: Instant::now(),
            rule: rule.clone(),
            units,
            term,
            leases: RwLock::default(),
        }));
        Ok(Self {
            shared: Arc::new(Shared { store, terms }),
        })
    }

    /// What makes `rule` unfit to lease `units` for `term`.
    fn problems(rule: &Rule, units: u64, term: Duration) -> impl Iterator<Item = ConfigError> {
        let algorithm = rule.algorithm();
        let kind = algorithm.kind();
        let early = algorithm.can_lease();
        let burst = algorithm.limit();
        [
            (!early).then(|| {
                ConfigError::new(format!(
                    "a {kind} cannot lease: only a token bucket or GCRA can take units early \
                     without admitting more (a window or log dates them when taken)"
                ))
            }),
            rule.penalty().is_some().then(|| {
                ConfigError::new(
                    "a rule with a penalty cannot lease: a lease admits without the store, \
                     which would never count its denials towards the lock",
                )
            }),
            (units == 0 || units > burst).then(|| {
                ConfigError::new(format!(
                    "a lease of {units} units must be 1 to the rule's burst of {burst}"
                ))
            }),
            term.is_zero()
                .then(|| ConfigError::new("a lease's term must be longer than zero")),
        ]
        .into_iter()
        .flatten()
    }

    /// The first check of `batch` a lease may answer, with its index and its rule's terms.
    #[inline]
    fn leased(&self, batch: &[Check<'_>], max_wait: Duration) -> Option<(usize, &Arc<Terms<S>>)> {
        if !max_wait.is_zero() {
            return None;
        }
        batch.iter().enumerate().find_map(|(i, check)| {
            if check.in_shadow() || check.cost == 0 {
                return None;
            }
            let terms = self.shared.terms.iter().find(|t| t.rule == *check.rule)?;
            (check.cost <= terms.units).then_some((i, terms))
        })
    }

    /// Decides `check` from its key's lease (taking the next one if needed), else the store.
    async fn decide(&self, terms: &Arc<Terms<S>>, check: Check<'_>) -> Result<Outcome, StoreError> {
        if let Some(outcome) = terms.take(check.key(), check.cost) {
            return Ok(outcome);
        }
        match self.lend(terms, check).await? {
            Some((rule, _)) => Ok(Outcome::new([rule].into_iter().collect())),
            None => self.shared.store.check(&[check], Duration::ZERO).await,
        }
    }

    /// Decides a batch whose `i`-th check is leased (see [`Leased`], "A batch with other
    /// rules").
    async fn decide_with_others(
        &self,
        terms: &Arc<Terms<S>>,
        i: usize,
        batch: &[Check<'_>],
    ) -> Result<Outcome, StoreError> {
        let Some((leased, lent)) = self.lend(terms, batch[i]).await? else {
            return self.shared.store.check(batch, Duration::ZERO).await;
        };
        let rest: SmallVec<[Check<'_>; 4]> = batch
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, c)| *c)
            .collect();
        let decided = self.shared.store.check(&rest, Duration::ZERO).await;
        if !decided.as_ref().is_ok_and(Outcome::is_admitted) {
            lent.give_back().await;
        }
        Ok(decided?.with_rule_at(i, leased))
    }

    /// `cost` units from `check`'s key's lease, taking the next if needed; `None` when the
    /// store refuses a lease, or did lately.
    async fn lend(
        &self,
        terms: &Arc<Terms<S>>,
        check: Check<'_>,
    ) -> Result<Option<(RuleOutcome, Lent)>, StoreError> {
        loop {
            let slot = terms.slot(check.key());
            if let Some(lent) = slot.lend(terms, check.cost) {
                return Ok(Some(lent));
            }
            let held = slot.held.lock().await;
            // The slot may have been forgotten while this request waited: a lease taken on
            // it would be parked where no request finds it. Ask the key's current slot.
            if terms.holds(check.key(), &slot) {
                return self.renew(terms, check, &slot, held).await;
            }
        }
    }

    /// [`lend`](Self::lend) once this request holds `slot`'s lock.
    async fn renew(
        &self,
        terms: &Arc<Terms<S>>,
        check: Check<'_>,
        slot: &Arc<Slot>,
        mut held: tokio::sync::MutexGuard<'_, Held>,
    ) -> Result<Option<(RuleOutcome, Lent)>, StoreError> {
        // Another request may have taken the next lease while this one waited.
        if let Some(lent) = slot.lend(terms, check.cost) {
            return Ok(Some(lent));
        }
        let ending = slot.take_lease(&mut held);
        if held.denied_until.is_some_and(|t| Instant::now() < t) {
            terms.end(slot, ending).await;
            return Ok(None);
        }
        let lease = check.with_cost(terms.units);
        // Measured from before the store counts the term: the lease stops admitting no
        // later than the store stops parking its units.
        let deadline = Instant::now() + terms.term;
        let ending = ending.as_ref().map(|(lease, unused)| (lease, *unused));
        let outcome = self.shared.store.lease(lease, terms.term, ending).await?;
        if let Decision::Deny(denial) = outcome.decision {
            held.denied_until = denial
                .retry_after
                .and_then(|d| Instant::now().checked_add(d));
            // The slot remembers the refusal until it ends (at once if no wait helps).
            let due = held.denied_until.unwrap_or_else(Instant::now);
            terms.forget_at(slot, held.generation, due);
            return Ok(None);
        }
        held.denied_until = None;
        held.generation += 1;
        if let Some(rule) = outcome.rules.first() {
            slot.remaining.store(rule.info.remaining, Ordering::Relaxed);
            let reset_us = duration_to_micros(rule.info.reset);
            slot.reset_us.store(reset_us, Ordering::Relaxed);
        }
        held.lease = Some(outcome);
        slot.generation.store(held.generation, Ordering::Release);
        slot.deadline
            .store(terms.micros(deadline), Ordering::Release);
        let left = terms.units - check.cost;
        slot.left.store(left, Ordering::Release);
        terms.forget_at(slot, held.generation, deadline);
        let lent = Lent {
            slot: Arc::clone(slot),
            generation: Some(held.generation),
            cost: check.cost,
        };
        Ok(Some((slot.rule_outcome(terms, left), lent)))
    }
}

impl<S: Store + Clone> Terms<S> {
    /// At `due`, ends lease `generation` of `slot` if held, and forgets the slot unless a
    /// later lease was taken, so an idle or refused key costs nothing.
    fn forget_at(self: &Arc<Self>, slot: &Arc<Slot>, generation: u64, due: Instant) {
        let (terms, slot) = (Arc::clone(self), Arc::clone(slot));
        tokio::spawn(async move {
            tokio::time::sleep_until(due).await;
            let mut held = slot.held.lock().await;
            if held.generation != generation {
                return;
            }
            let ending = slot.take_lease(&mut held);
            terms.end(&slot, ending).await;
            if let Ok(mut leases) = terms.leases.write() {
                leases.retain(|_, s| !Arc::ptr_eq(s, &slot));
            }
        });
    }

    /// Takes `cost` units from `key`'s lease without a lock or a wait, if it has them.
    #[inline]
    fn take(&self, key: &[u8], cost: u64) -> Option<Outcome> {
        let leases = self.leases.read().ok()?;
        let slot = leases.get(key)?;
        let left = slot.take_units(cost, self.micros(Instant::now()))?;
        Some(Outcome::new(
            [slot.rule_outcome(self, left)].into_iter().collect(),
        ))
    }

    /// `key`'s slot, made if it has none.
    fn slot(&self, key: &[u8]) -> Arc<Slot> {
        if let Some(slot) = self.leases.read().ok().and_then(|l| l.get(key).cloned()) {
            return slot;
        }
        let made = Arc::new(Slot {
            key: Box::from(key),
            ..Slot::default()
        });
        match self.leases.write() {
            Ok(mut leases) => Arc::clone(leases.entry(Box::from(key)).or_insert(made)),
            // A poisoned map: the slot serves this request only; its timer ends the lease.
            Err(_) => made,
        }
    }

    /// Whether `slot` is still `key`'s slot. A poisoned map holds every slot (see
    /// [`slot`](Self::slot)).
    fn holds(&self, key: &[u8], slot: &Arc<Slot>) -> bool {
        match self.leases.read() {
            Ok(leases) => leases.get(key).is_some_and(|s| Arc::ptr_eq(s, slot)),
            Err(_) => true,
        }
    }

    /// `instant` in µs after the epoch, as a slot's deadline counts.
    #[inline]
    fn micros(&self, instant: Instant) -> u64 {
        duration_to_micros(instant.saturating_duration_since(self.epoch))
    }

    /// Ends `slot`'s lease taken by [`Slot::take_lease`], if any: the store parks its units
    /// no more and takes the unused ones back.
    async fn end(&self, slot: &Slot, ending: Option<(Outcome, u64)>) {
        let Some((lease, unused)) = ending else {
            return;
        };
        let check = Check::stored(&self.rule, &slot.key).with_cost(unused);
        if let Err(error) = self.store.refund(&[check], &lease).await {
            tracing::warn!(%error, "could not end a lease: its units stay parked until its term");
        }
    }
}

impl Slot {
    /// The lease `held` holds, if any, with its unused units; it admits nothing from here on.
    fn take_lease(&self, held: &mut Held) -> Option<(Outcome, u64)> {
        let unused = self.left.swap(0, Ordering::AcqRel);
        held.lease.take().map(|lease| (lease, unused))
    }

    /// Takes `cost` units without a lock, if the lease has them and admits at `now` (µs
    /// after the epoch); the units left. Units taken past the deadline stay taken unused:
    /// the store may already count them as used.
    #[inline]
    fn take_units(&self, cost: u64, now: u64) -> Option<u64> {
        let before = self
            .left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| l.checked_sub(cost))
            .ok()?;
        (now < self.deadline.load(Ordering::Acquire)).then(|| before - cost)
    }

    /// Takes `cost` units for a check of a batch, with what gives them back.
    fn lend<S: Store + Clone>(
        self: &Arc<Self>,
        terms: &Terms<S>,
        cost: u64,
    ) -> Option<(RuleOutcome, Lent)> {
        let generation = self.generation.load(Ordering::Acquire);
        let left = self.take_units(cost, terms.micros(Instant::now()))?;
        // A new lease's generation is set before its units: the same generation after the
        // take is the lease the units came from.
        let same = self.generation.load(Ordering::Acquire) == generation;
        let lent = Lent {
            slot: Arc::clone(self),
            generation: same.then_some(generation),
            cost,
        };
        Some((self.rule_outcome(terms, left), lent))
    }

    /// The leased rule's part of the outcome of a request admitted from the lease, `left`
    /// units left in it.
    fn rule_outcome<S: Store + Clone>(&self, terms: &Terms<S>, left: u64) -> RuleOutcome {
        let remaining = self.remaining.load(Ordering::Relaxed).saturating_add(left);
        let reset = self.reset_us.load(Ordering::Relaxed);
        batch::rule_says(&terms.rule, Decision::Allow, remaining, reset)
    }
}

impl Lent {
    /// Gives the units back to their lease, if it still holds (an ended one used them).
    async fn give_back(self) {
        let Some(generation) = self.generation else {
            return;
        };
        let held = self.slot.held.lock().await;
        if held.generation == generation && held.lease.is_some() {
            self.slot.left.fetch_add(self.cost, Ordering::AcqRel);
        }
    }
}

impl<S: Store + Clone> Store for Leased<S> {
    async fn check(&self, batch: &[Check<'_>], max_wait: Duration) -> Result<Outcome, StoreError> {
        match self.leased(batch, max_wait) {
            Some((_, terms)) if batch.len() == 1 => self.decide(terms, batch[0]).await,
            Some((i, terms)) => self.decide_with_others(terms, i, batch).await,
            None => self.shared.store.check(batch, max_wait).await,
        }
    }

    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        self.shared.store.lease(check, term, ending).await
    }

    /// Answers from a lease that has the units, or a store that answers at once.
    fn try_check_now(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> Option<Result<Outcome, StoreError>> {
        match self.leased(batch, max_wait) {
            Some((_, terms)) if batch.len() == 1 => {
                terms.take(batch[0].key(), batch[0].cost).map(Ok)
            }
            // `check` decides a batch's leased rule from the lease.
            Some(_) => None,
            None => self.shared.store.try_check_now(batch, max_wait),
        }
    }

    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        self.shared.store.peek(check).await
    }

    async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        self.shared.store.refund(batch, outcome).await
    }

    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), StoreError> {
        self.shared.store.overdraw(batch).await
    }

    async fn count_denials(&self, batch: &[Check<'_>], ago: Duration) -> Result<(), StoreError> {
        self.shared.store.count_denials(batch, ago).await
    }

    async fn reset(&self, rule: &Rule, key: &StoredKey<'_>) -> Result<(), StoreError> {
        let terms = self.shared.terms.iter().find(|t| t.rule == *rule);
        let forgotten = |t: &Terms<S>| t.leases.write().ok()?.remove(key.as_bytes());
        if let Some((terms, slot)) = terms.and_then(|t| Some((t, forgotten(t)?))) {
            // The store keeps the units parked in live leases through a reset: this
            // instance's own lease ends first.
            let ending = slot.take_lease(&mut *slot.held.lock().await);
            terms.end(&slot, ending).await;
        }
        self.shared.store.reset(rule, key).await
    }

    fn probe(&self) -> Option<impl Future<Output = Result<(), StoreError>> + Send + 'static> {
        self.shared.store.probe()
    }

    fn health(&self) -> Health {
        self.shared.store.health()
    }

    fn outage_health(&self) -> Health {
        self.shared.store.outage_health()
    }
}

impl<S: Store + Clone> Clone for Leased<S> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: Store + Clone + fmt::Debug> fmt::Debug for Leased<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let leases = self.shared.terms.iter();
        let leases = leases.map(|t| (t.rule.name(), t.units, t.term));
        f.debug_struct("Leased")
            .field("store", &self.shared.store)
            .field("leases", &leases.collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use crate::{Limiter, ManualClock, Rate};

    /// A key whose lease the store refuses keeps no slot past the refusal: a flood of such
    /// keys costs nothing once their refusals end.
    #[tokio::test(start_paused = true)]
    async fn a_refused_lease_keeps_no_slot() {
        let rule = Rule::gcra("per-user", 4, Rate::per_second(1));
        let memory = MemoryStore::with_clock(ManualClock::new(0));
        let leased = Leased::new(memory.clone())
            .lease(&rule, 4, Duration::from_secs(1))
            .unwrap();
        let direct = Limiter::new(memory);
        for i in 0..100 {
            let key = format!("user-{i}");
            // One unit used elsewhere: a lease of all four is refused.
            direct.check_one(&rule, &key).await.unwrap();
            let batch = [Check::new(&rule, key.as_bytes())];
            let outcome = leased.check(&batch, Duration::ZERO).await.unwrap();
            assert!(outcome.is_admitted());
        }
        let slots = || leased.shared.terms[0].leases.read().unwrap().len();
        assert_eq!(slots(), 100);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(slots(), 0);
    }
}
