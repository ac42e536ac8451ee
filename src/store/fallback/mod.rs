//! [`Fallback`]: decide from a local store while the primary (Redis) is unavailable.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hashbrown::HashMap;
use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;
use tokio::time::Instant;

use crate::clock::duration_to_micros;
use crate::decision::{Outcome, RuleOutcome, StoreId};
use crate::error::StoreError;
use crate::store::breaker::DEFAULT_OPEN_FOR;
use crate::store::check::{Check, Health, Store};
use crate::store::memory::MemoryStore;
use crate::stored::StoredKey;
use crate::Rule;

/// A primary store (Redis) with a local store that decides while the primary cannot.
///
/// Every call goes to the primary first. When it fails (unreachable, timed out, breaker
/// open; not a malformed batch), the local store decides the same batch (quotas optionally
/// divided by [`instances`](Self::instances)) and the caller sees no error; once the primary
/// answers again, it decides. Put a [`Breaker`](super::Breaker) in front of the primary, or
/// every request still waits for its timeout first.
///
/// The primary never learns of the local decisions, and local locks hold on that instance
/// only ([what that means](crate::guide::when_redis_is_away#what-the-local-decisions-mean-for-the-shared-counts)).
///
/// ```
/// use std::time::Duration;
/// use tollgate::store::{Breaker, Fallback};
/// use tollgate::store::{Health, MemoryStore};
/// use tollgate::Limiter;
///
/// # fn primary() -> MemoryStore { MemoryStore::new() }
/// // `primary()` stands for `RedisStore::connect(url).await?`.
/// let store = Fallback::new(Breaker::new(primary()).failures(3).open_for(Duration::from_millis(500)))
///     .instances(4); // four replicas share the Redis: each takes a quarter locally
/// let limiter = Limiter::new(store);
/// assert_eq!(limiter.health(), Health::Healthy);
/// ```
#[derive(Clone)]
pub struct Fallback<P, L = MemoryStore> {
    primary: P,
    local: L,
    shared: Arc<Division>,
}

struct Division {
    instances: u64,
    /// Whether the last answer came from the local store.
    falling_back: AtomicBool,
    /// Whether the primary said it was unwell (an open breaker) while falling back, so its
    /// recovery ends the fallback without a request.
    primary_was_unwell: AtomicBool,
    /// The rules with divided quotas, built once per rule while falling back.
    divided: Mutex<HashMap<u64, DividedRules>>,
    /// Whether a [`Fallback::probe_primary`] probe is on its way.
    probing: AtomicBool,
    /// µs after `epoch` the primary last failed, plus one (0: never).
    failed_at: AtomicU64,
    epoch: Instant,
    /// The stores the local side's admissions named, so refunds find their side.
    local_stores: RwLock<SmallVec<[StoreId; 2]>>,
}

/// The shares of the rules whose name and configuration digests XOR to one slot, with the
/// rule each came from.
type DividedRules = SmallVec<[(Rule, Share); 1]>;

/// A rule's share on this instance: the rule with its quotas divided; `None` when that is
/// nothing, and every request costs more than the rule can admit.
type Share = Option<Rule>;

impl<P> Fallback<P, MemoryStore> {
    /// `primary`, with a fresh [`MemoryStore`] deciding while it fails.
    pub fn new(primary: P) -> Self {
        Self::with_local(primary, MemoryStore::new())
    }
}

impl<P, L> Fallback<P, L> {
    /// `primary`, with `local` deciding while it fails.
    pub fn with_local(primary: P, local: L) -> Self {
        Self {
            primary,
            local,
            shared: Arc::new(Division::new(1)),
        }
    }

    /// Divides every quota by `n` in the local decisions (default 1): the instances sharing
    /// the primary, so together they admit about one quota while it is away, never more
    /// (shares round down). A share that rounds down to nothing denies that rule's requests
    /// (without a `Retry-After`).
    pub fn instances(mut self, n: u64) -> Self {
        let n = n.max(1);
        match Arc::get_mut(&mut self.shared) {
            Some(shared) => shared.instances = n,
            None => self.shared = Arc::new(Division::new(n)),
        }
        self
    }

    /// Whether the last decision came from the local store.
    pub(crate) fn is_falling_back(&self) -> bool {
        self.shared.falling_back.load(Ordering::Acquire)
    }
}

impl Division {
    fn new(instances: u64) -> Self {
        Self {
            instances,
            falling_back: AtomicBool::new(false),
            primary_was_unwell: AtomicBool::new(false),
            divided: Mutex::new(HashMap::default()),
            probing: AtomicBool::new(false),
            failed_at: AtomicU64::new(0),
            epoch: Instant::now(),
            local_stores: RwLock::default(),
        }
    }

    /// Whether the primary has not failed for `quiet`.
    fn quiet_for(&self, quiet: Duration) -> bool {
        match self.failed_at.load(Ordering::Acquire) {
            0 => true,
            failed => {
                let now = duration_to_micros(self.epoch.elapsed());
                now >= (failed - 1).saturating_add(duration_to_micros(quiet))
            }
        }
    }

    fn primary_answered(&self) {
        // A load first: every healthy request passes here, and a write would make the
        // cores contend for the line.
        if self.falling_back.load(Ordering::Acquire)
            && self.falling_back.swap(false, Ordering::AcqRel)
        {
            tracing::info!(target: "tollgate::fallback", "decisions come from the primary store again");
        }
    }

    fn primary_failed(&self, error: &StoreError) {
        let now = duration_to_micros(self.epoch.elapsed());
        self.failed_at
            .store(now.saturating_add(1), Ordering::Release);
        if !self.falling_back.swap(true, Ordering::AcqRel) {
            // A new fallback: only the primary's health from now on ends it.
            self.primary_was_unwell.store(false, Ordering::Release);
            tracing::warn!(
                target: "tollgate::fallback",
                %error,
                instances = self.instances,
                "primary store failed: deciding from the local store"
            );
        }
    }

    /// `batch`'s rules with divided quotas.
    fn shares(&self, batch: &[Check<'_>]) -> SmallVec<[Share; 4]> {
        batch.iter().map(|c| self.divided(c.rule)).collect()
    }

    /// `rule`'s share with its quotas divided by `instances`.
    fn divided(&self, rule: &Rule) -> Share {
        if self.instances == 1 {
            return Some(rule.clone());
        }
        let slot = rule.name_digest() ^ rule.fingerprint();
        let mut cache = self.divided.lock();
        let shares = cache.entry(slot).or_default();
        if let Some((_, found)) = shares.iter().find(|(origin, _)| origin == rule) {
            return found.clone();
        }
        let divided = divide(rule, self.instances);
        shares.push((rule.clone(), divided.clone()));
        divided
    }
}

/// `rule` with its quota shared among `n` instances
/// ([`Algorithm::share`](crate::algorithm::Algorithm::share)); `None` when that is nothing.
fn divide(rule: &Rule, n: u64) -> Option<Rule> {
    let divided = Rule::new(rule.name(), rule.algorithm().share(n)?)
        .checked()
        .ok()?;
    let divided = divided.with_cost(rule.cost());
    Some(match rule.penalty() {
        Some(p) => divided.with_penalty(*p),
        None => divided,
    })
}

/// `batch` as the local store decides it: each check's rule replaced by its share
/// ([`Division::shares`]).
fn local_batch<'a>(batch: &[Check<'a>], shares: &'a [Share]) -> SmallVec<[Check<'a>; 4]> {
    let mut local: SmallVec<[Check<'a>; 4]> = SmallVec::from_slice(batch);
    for (check, share) in local.iter_mut().zip(shares) {
        match share {
            Some(rule) => check.rule = rule,
            None => check.cost = u64::MAX,
        }
    }
    local
}

/// A probe of the primary on its way: frees the next one when it ends or is dropped.
struct Probing(Arc<Division>);

impl Drop for Probing {
    fn drop(&mut self) {
        self.0.probing.store(false, Ordering::Release);
    }
}

impl<P: Store, L: Store> Fallback<P, L> {
    /// Starts the primary's [`probe`](Store::probe) on a task, one at a time, so readiness
    /// recovers without a request; only once the primary has not failed for a breaker's
    /// default `open_for`, so one that answers a `PING` but fails requests does not flap.
    fn probe_primary(&self) {
        if !self.shared.quiet_for(DEFAULT_OPEN_FOR) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.shared.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let probing = Probing(Arc::clone(&self.shared));
        let Some(probe) = self.primary.probe() else {
            return;
        };
        // A request the primary failed while the probe was away outweighs its answer.
        let failed = self.shared.failed_at.load(Ordering::Acquire);
        runtime.spawn(async move {
            let answered = probe.await.is_ok();
            let shared = &probing.0;
            if answered && shared.failed_at.load(Ordering::Acquire) == failed {
                shared.primary_answered();
            }
        });
    }

    /// The primary's answer; `None` when it failed and the local store decides.
    fn primary_answer<T>(&self, result: Result<T, StoreError>) -> Option<Result<T, StoreError>> {
        match result {
            Err(e) if e.is_failure() => {
                self.shared.primary_failed(&e);
                None
            }
            Ok(outcome) => {
                self.shared.primary_answered();
                Some(Ok(outcome))
            }
            answer => Some(answer),
        }
    }

    /// An outcome of the local store, its stores remembered for refunds.
    fn taken_locally(&self, outcome: Outcome) -> Outcome {
        let Some(admission) = &outcome.admission else {
            return outcome;
        };
        for store in admission.taken.iter().map(|t| t.store) {
            let known = |stores: &SmallVec<[StoreId; 2]>| stores.contains(&store);
            if store != StoreId::default() && !known(&self.shared.local_stores.read()) {
                let mut stores = self.shared.local_stores.write();
                if !known(&stores) {
                    stores.push(store);
                }
            }
        }
        outcome
    }
}

impl<P: fmt::Debug, L: fmt::Debug> fmt::Debug for Fallback<P, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fallback")
            .field("primary", &self.primary)
            .field("local", &self.local)
            .field("instances", &self.shared.instances)
            .field("falling_back", &self.is_falling_back())
            .finish()
    }
}

impl<P: Store, L: Store> Store for Fallback<P, L> {
    async fn check(&self, batch: &[Check<'_>], max_wait: Duration) -> Result<Outcome, StoreError> {
        if let Some(answer) = self.primary_answer(self.primary.check(batch, max_wait).await) {
            return answer;
        }
        let shares = self.shared.shares(batch);
        let local = local_batch(batch, &shares);
        let outcome = self.local.check(&local, max_wait).await?;
        Ok(self.taken_locally(outcome))
    }

    /// Leases from the primary, or from the local store's share while it is away; a lease
    /// the local store took ends there.
    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        let local_stores = self.shared.local_stores.read().clone();
        let ending = match ending {
            Some((lease, unused))
                if lease
                    .admission
                    .as_ref()
                    .is_some_and(|a| local_stores.contains(&a.taken(0).store)) =>
            {
                self.refund(&[check.with_cost(unused)], lease).await?;
                None
            }
            ending => ending,
        };
        if let Some(answer) = self.primary_answer(self.primary.lease(check, term, ending).await) {
            return answer;
        }
        let share = [self.shared.divided(check.rule)];
        let local = local_batch(&[check], &share);
        let outcome = self.local.lease(local[0], term, None).await?;
        Ok(self.taken_locally(outcome))
    }

    /// Asks the primary at once where it can, then the local store if the primary failed.
    fn try_check_now(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> Option<Result<Outcome, StoreError>> {
        let primary = self.primary.try_check_now(batch, max_wait)?;
        if let Some(answer) = self.primary_answer(primary) {
            return Some(answer);
        }
        let shares = self.shared.shares(batch);
        let local = local_batch(batch, &shares);
        let outcome = self.local.try_check_now(&local, max_wait)?;
        Some(outcome.map(|o| self.taken_locally(o)))
    }

    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        if let Some(answer) = self.primary_answer(self.primary.peek(check).await) {
            return answer;
        }
        let share = [self.shared.divided(check.rule)];
        let local = local_batch(&[check], &share);
        self.local.peek(local[0]).await
    }

    /// Gives each rule's units back to the side that took them, asking each only for its own.
    async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        let Some(admission) = &outcome.admission else {
            return Ok(());
        };
        let stores = self.shared.local_stores.read().clone();
        let took = |&i: &usize| {
            let taken = admission.taken(i);
            !taken.pending && taken.store != StoreId::default()
        };
        let (local, primary): (SmallVec<[usize; 4]>, SmallVec<[usize; 4]>) = (0..batch.len())
            .filter(took)
            .partition(|&i| stores.contains(&admission.taken(i).store));
        let part = |indices: &[usize]| {
            let checks: SmallVec<[Check<'_>; 4]> = indices.iter().map(|&i| batch[i]).collect();
            (checks, outcome.select(indices))
        };
        let mut result = Ok(());
        if !primary.is_empty() {
            let (checks, outcome) = part(&primary);
            result = self.primary.refund(&checks, &outcome).await;
        }
        if local.is_empty() {
            return result;
        }
        let (checks, outcome) = part(&local);
        let shares = self.shared.shares(&checks);
        let checks = local_batch(&checks, &shares);
        result.and(self.local.refund(&checks, &outcome).await)
    }

    /// Takes the debt where the key is decided now: the primary, or the local shares.
    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), StoreError> {
        if let Some(answer) = self.primary_answer(self.primary.overdraw(batch).await) {
            return answer;
        }
        let shares = self.shared.shares(batch);
        let local = local_batch(batch, &shares);
        self.local.overdraw(&local).await
    }

    /// Counts the denials where the batch is decided now (as [`overdraw`](Store::overdraw)).
    async fn count_denials(&self, batch: &[Check<'_>], ago: Duration) -> Result<(), StoreError> {
        if let Some(answer) = self.primary_answer(self.primary.count_denials(batch, ago).await) {
            return answer;
        }
        let shares = self.shared.shares(batch);
        let local = local_batch(batch, &shares);
        self.local.count_denials(&local, ago).await
    }

    /// An unblock lifts the local state too (it may hold a lock set during an outage).
    async fn reset(&self, rule: &Rule, key: &StoredKey<'_>) -> Result<(), StoreError> {
        let share = self.shared.divided(rule);
        self.local
            .reset(share.as_ref().unwrap_or(rule), key)
            .await?;
        self.primary.reset(rule, key).await
    }

    /// The primary's probe: the fallback is healthy when its primary is.
    fn probe(&self) -> Option<impl Future<Output = Result<(), StoreError>> + Send + 'static> {
        self.primary.probe()
    }

    fn outage_health(&self) -> Health {
        Health::Degraded
    }

    fn health(&self) -> Health {
        let local = self.local.health();
        if local == Health::Failing {
            return Health::Failing;
        }
        // Asked even while falling back: a breaker's health starts its probe once due.
        let primary = self.primary.health();
        if primary != Health::Healthy {
            if self.is_falling_back() {
                self.shared
                    .primary_was_unwell
                    .store(true, Ordering::Release);
            }
            return Health::Degraded;
        }
        if self.is_falling_back() {
            // Healthy after unwell: the breaker's probe answered. Otherwise probe it here.
            if !self.shared.primary_was_unwell.swap(false, Ordering::AcqRel) {
                self.probe_primary();
                return Health::Degraded;
            }
            self.shared.primary_answered();
        }
        local
    }
}

#[cfg(test)]
mod tests;
