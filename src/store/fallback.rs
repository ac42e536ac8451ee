//! [`Fallback`]: decide from a local store while the primary (Redis) is unavailable.

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hashbrown::{DefaultHashBuilder, HashMap};
use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::decision::{Outcome, RuleOutcome};
use crate::error::StoreError;
use crate::store::check::{Check, Health, Store};
use crate::store::memory::MemoryStore;
use crate::stored::StoredKey;
use crate::Rule;

/// A primary store (Redis, usually behind a [`Breaker`](super::Breaker)) with a local store
/// that decides while the primary cannot.
///
/// Every call goes to the primary first. When it fails (unreachable, timed out, breaker
/// open; not a malformed batch), the same batch is decided by the local store, by the same
/// rules (optionally with each quota divided by the number of instances, see
/// [`instances`](Self::instances)), and that decision is returned as the answer: the caller
/// sees no error and limits stay enforced, per instance. As soon as the primary answers
/// again, decisions come from it again. Put a [`Breaker`](super::Breaker) in front of the
/// primary, or every request still waits for the primary's timeout before the local store
/// decides.
///
/// **What the local decisions mean for the shared counts.** The primary never learns of
/// the requests admitted locally: when it returns, its counts are those it had when it went
/// away (or empty, after a restart without persistence). In the worst case a client gets,
/// over a window that spans the outage, its quota from each instance during the outage plus
/// its quota from the primary afterwards. With [`instances`](Self::instances) set to the
/// number of instances, the instances together admit about one quota during the outage.
/// A penalty lock set locally holds on that instance only; locks in the primary hold again
/// when it returns.
///
/// **A timeout** of the primary means the request is decided locally. The primary may
/// still have run the call and counted the request (its answer came too late); the call is
/// never sent again, so it is counted at most once there and once here, never twice in
/// the primary.
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
    /// Whether the primary said it was unwell (an open breaker) while falling back: its
    /// saying it is well again afterwards (the breaker's own probe closed it) ends the
    /// fallback even with no request to prove it, so readiness recovers on its own.
    primary_was_unwell: AtomicBool,
    /// The rules with divided quotas, by (name, fingerprint): built once per rule, only
    /// while falling back with `instances` > 1.
    divided: Mutex<HashMap<u64, DividedRules>>,
    hasher: DefaultHashBuilder,
}

/// The shares of one hash slot, with the fingerprint of the rule each came from.
type DividedRules = SmallVec<[(u64, Share); 1]>;

/// A rule's share on this instance: the rule with its quotas divided, or, where the share
/// rounds down to nothing, the rule itself with every request asked more than it can ever
/// admit, so that it denies.
#[derive(Clone)]
struct Share {
    rule: Rule,
    none: bool,
}

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
            shared: Arc::new(Division {
                instances: 1,
                falling_back: AtomicBool::new(false),
                primary_was_unwell: AtomicBool::new(false),
                divided: Mutex::new(HashMap::default()),
                hasher: DefaultHashBuilder::default(),
            }),
        }
    }

    /// Divides every quota by `n` in the local decisions (default 1: the full quota): the
    /// number of instances you run that share the primary, so that together they admit
    /// about one quota while it is away. Counts (window limits, capacities, bursts) are
    /// divided rounding down and rates exactly (or, where the period times `n` is too long
    /// to build, their amounts rounding down), so that the instances never admit more than
    /// one quota in all. An instance whose share of a rule rounds down to nothing denies
    /// that rule's requests while the primary is away (without a `Retry-After`: the wait is
    /// the primary's return).
    pub fn instances(mut self, n: u64) -> Self {
        let n = n.max(1);
        match Arc::get_mut(&mut self.shared) {
            Some(shared) => shared.instances = n,
            None => {
                self.shared = Arc::new(Division {
                    instances: n,
                    falling_back: AtomicBool::new(false),
                    primary_was_unwell: AtomicBool::new(false),
                    divided: Mutex::new(HashMap::default()),
                    hasher: DefaultHashBuilder::default(),
                })
            }
        }
        self
    }

    /// The primary store.
    #[cfg(test)]
    fn primary(&self) -> &P {
        &self.primary
    }

    /// Whether the last decision came from the local store.
    pub(crate) fn is_falling_back(&self) -> bool {
        self.shared.falling_back.load(Ordering::Acquire)
    }
}

impl Division {
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

    /// `batch`'s rules with their quotas divided by `instances`, for the local store; `None`
    /// when there is nothing to divide (one instance).
    fn divided_rules(&self, batch: &[Check<'_>]) -> Option<SmallVec<[Share; 4]>> {
        (self.instances > 1).then(|| batch.iter().map(|c| self.divided(c.rule)).collect())
    }

    /// `rule`'s share with its quotas divided by `instances`.
    fn divided(&self, rule: &Rule) -> Share {
        if self.instances == 1 {
            return Share {
                rule: rule.clone(),
                none: false,
            };
        }
        let mut h = self.hasher.build_hasher();
        rule.name().hash(&mut h);
        rule.fingerprint().hash(&mut h);
        let slot = h.finish();
        let mut cache = self.divided.lock();
        let rules = cache.entry(slot).or_default();
        let origin = rule.fingerprint();
        let same = |(o, share): &&(u64, Share)| {
            let r = &share.rule;
            *o == origin
                && r.name() == rule.name()
                && r.cost() == rule.cost()
                && r.penalty() == rule.penalty()
        };
        if let Some((_, found)) = rules.iter().find(same) {
            return found.clone();
        }
        let divided = match divide(rule, self.instances) {
            Some(rule) => Share { rule, none: false },
            None => Share {
                rule: rule.clone(),
                none: true,
            },
        };
        rules.push((origin, divided.clone()));
        divided
    }
}

/// `rule` with its quota shared among `n` instances ([`Algorithm::share`]); `None` when
/// nothing of the quota is left for one instance.
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

/// `batch` with each check's rule replaced by the one at its index in `rules`.
fn with_rules<'a>(batch: &[Check<'a>], shares: &'a [Share]) -> SmallVec<[Check<'a>; 4]> {
    batch
        .iter()
        .zip(shares)
        .map(|(c, share)| Check {
            rule: &share.rule,
            cost: if share.none { u64::MAX } else { c.cost },
            ..*c
        })
        .collect()
}

impl<P: Store, L: Store> Fallback<P, L> {
    /// The primary's answer, when it is the batch's; `None` when the primary failed and
    /// the local store decides.
    fn primary_answer(
        &self,
        result: Result<Outcome, StoreError>,
    ) -> Option<Result<Outcome, StoreError>> {
        match result {
            Ok(outcome) => {
                self.shared.primary_answered();
                Some(Ok(outcome))
            }
            Err(e @ StoreError::InvalidBatch(_)) => Some(Err(e)),
            Err(e) => {
                self.shared.primary_failed(&e);
                None
            }
        }
    }

    /// An outcome of the local store, marked so that its units go back there.
    fn taken_locally(mut outcome: Outcome) -> Outcome {
        if let Some(admission) = &mut outcome.admission {
            admission.taken.iter_mut().for_each(|t| t.local = true);
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
        let outcome = match self.shared.divided_rules(batch) {
            None => self.local.check(batch, max_wait).await?,
            Some(rules) => {
                self.local
                    .check(&with_rules(batch, &rules), max_wait)
                    .await?
            }
        };
        Ok(Self::taken_locally(outcome))
    }

    /// Asks the primary at once where it can answer at once, and then the local store if
    /// the primary failed.
    fn try_check_now(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> Option<Result<Outcome, StoreError>> {
        let primary = self.primary.try_check_now(batch, max_wait)?;
        if let Some(answer) = self.primary_answer(primary) {
            return Some(answer);
        }
        let local = match self.shared.divided_rules(batch) {
            None => self.local.try_check_now(batch, max_wait),
            Some(rules) => self
                .local
                .try_check_now(&with_rules(batch, &rules), max_wait),
        }?;
        Some(local.map(Self::taken_locally))
    }

    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        match self.primary.peek(check).await {
            Ok(outcome) => Ok(outcome),
            Err(e @ StoreError::InvalidBatch(_)) => Err(e),
            Err(_) => {
                let share = [self.shared.divided(check.rule)];
                let local = with_rules(std::slice::from_ref(&check), &share);
                self.local.peek(local[0]).await
            }
        }
    }

    /// Gives each rule's units back to the store that took them: a held request confirmed
    /// while the primary was away took its waiting rules' units locally, the others in the
    /// primary.
    async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        let Some(admission) = &outcome.admission else {
            return Ok(());
        };
        let (local, primary): (SmallVec<[usize; 4]>, SmallVec<[usize; 4]>) =
            (0..batch.len()).partition(|&i| admission.taken(i).local);
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
        let local = match self.shared.divided_rules(&checks) {
            None => self.local.refund(&checks, &outcome).await,
            Some(rules) => {
                self.local
                    .refund(&with_rules(&checks, &rules), &outcome)
                    .await
            }
        };
        result.and(local)
    }

    /// Takes what a settlement owes where the admission took its units: the rules admitted
    /// by the primary in the primary, those admitted locally in the local store. While the
    /// primary is away, what it is owed is taken locally, where the key is decided then.
    async fn overdraw(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        let local_at = |i: usize| outcome.admission.as_ref().is_some_and(|a| a.taken(i).local);
        let (mut local, primary): (SmallVec<[usize; 4]>, SmallVec<[usize; 4]>) =
            (0..batch.len()).partition(|&i| local_at(i));
        let part = |indices: &[usize]| -> SmallVec<[Check<'_>; 4]> {
            indices.iter().map(|&i| batch[i]).collect()
        };
        if !primary.is_empty() {
            let checks = part(&primary);
            match self
                .primary
                .overdraw(&checks, &outcome.select(&primary))
                .await
            {
                Ok(()) => self.shared.primary_answered(),
                Err(e @ StoreError::InvalidBatch(_)) => return Err(e),
                Err(e) => {
                    self.shared.primary_failed(&e);
                    local.extend(primary);
                }
            }
        }
        if local.is_empty() {
            return Ok(());
        }
        let (checks, taken) = (part(&local), outcome.select(&local));
        match self.shared.divided_rules(&checks) {
            None => self.local.overdraw(&checks, &taken).await,
            Some(rules) => {
                self.local
                    .overdraw(&with_rules(&checks, &rules), &taken)
                    .await
            }
        }
    }

    /// Counts the denials where the batch is decided now: in the primary, or while it is
    /// away in the local store, on the shares of the rules it decides there.
    async fn count_denials(&self, batch: &[Check<'_>]) -> Result<(), StoreError> {
        match self.primary.count_denials(batch).await {
            Err(e @ StoreError::InvalidBatch(_)) => Err(e),
            Err(_) => match self.shared.divided_rules(batch) {
                None => self.local.count_denials(batch).await,
                Some(rules) => self.local.count_denials(&with_rules(batch, &rules)).await,
            },
            Ok(()) => Ok(()),
        }
    }

    /// An unblock lifts the local state too (it may hold a lock set during an outage).
    async fn reset(&self, rule: &Rule, key: &StoredKey<'_>) -> Result<(), StoreError> {
        let local = self.shared.divided(rule);
        self.local.reset(&local.rule, key).await?;
        self.primary.reset(rule, key).await
    }

    /// The primary's probe: the fallback is healthy when its primary is.
    fn probe(&self) -> Option<impl Future<Output = Result<(), StoreError>> + Send + 'static> {
        self.primary.probe()
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
            // Healthy again after being unwell: the breaker's probe got an answer, and the
            // next request goes to the primary. A store without a breaker never says it is
            // unwell, so only a request it answers ends its fallback.
            if !self.shared.primary_was_unwell.swap(false, Ordering::AcqRel) {
                return Health::Degraded;
            }
            self.shared.primary_answered();
        }
        local
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::algorithm::Algorithm;
    use crate::store::breaker::tests::Flaky;
    use crate::store::Breaker;
    use crate::{ManualClock, Rate};

    fn down(flaky: &Flaky, down: bool) {
        flaky.down.store(down, Ordering::SeqCst);
    }

    /// While the primary is away the local store enforces the rules, and once it is back
    /// the primary decides again.
    #[tokio::test(start_paused = true)]
    async fn while_the_primary_is_away_the_local_store_enforces_the_rules() {
        let flaky = Flaky::default();
        let store = Fallback::with_local(
            Breaker::new(flaky.clone()).failures(2),
            MemoryStore::with_clock(ManualClock::new(0)),
        );
        let rule = Rule::fixed_window("r", 3, Duration::from_secs(60));
        let batch = [Check::new(&rule, b"k")];
        assert!(store
            .check(&batch, Duration::ZERO)
            .await
            .unwrap()
            .is_admitted());
        assert_eq!(store.health(), Health::Healthy);

        down(&flaky, true);
        let admitted = [
            store
                .check(&batch, Duration::ZERO)
                .await
                .unwrap()
                .is_admitted(),
            store
                .check(&batch, Duration::ZERO)
                .await
                .unwrap()
                .is_admitted(),
            store
                .check(&batch, Duration::ZERO)
                .await
                .unwrap()
                .is_admitted(),
            store
                .check(&batch, Duration::ZERO)
                .await
                .unwrap()
                .is_admitted(),
        ];
        // The local store counts from zero: three pass, the fourth is limited.
        assert_eq!(admitted, [true, true, true, false]);
        assert_eq!(store.health(), Health::Degraded);
        assert!(store.is_falling_back());
        assert_eq!(store.primary().state(), super::super::BreakerState::Open);

        // Back: the primary decides again (it counted one), once the breaker probes.
        down(&flaky, false);
        tokio::time::advance(crate::store::breaker::DEFAULT_OPEN_FOR).await;
        let outcome = store.check(&batch, Duration::ZERO).await.unwrap();
        assert!(outcome.is_admitted());
        assert_eq!(outcome.rules[0].info.remaining, 1);
        assert_eq!(store.health(), Health::Healthy);
    }

    /// Local decisions divide each rule's quota and burst by the number of instances.
    #[tokio::test(start_paused = true)]
    async fn quotas_are_divided_by_the_instances_in_local_decisions() {
        let flaky = Flaky::default();
        down(&flaky, true);
        let store = Fallback::with_local(
            Breaker::new(flaky.clone()),
            MemoryStore::with_clock(ManualClock::new(0)),
        )
        .instances(4);
        let window = Rule::fixed_window("w", 10, Duration::from_secs(60));
        let gcra = Rule::gcra("g", 8, Rate::per_second(40));
        let mut admitted = [0, 0];
        for _ in 0..20 {
            for (n, rule) in admitted.iter_mut().zip([&window, &gcra]) {
                let outcome = store
                    .check(&[Check::new(rule, b"k")], Duration::ZERO)
                    .await
                    .unwrap();
                *n += usize::from(outcome.is_admitted());
            }
        }
        // 10 / 4 → 2 per window; a burst of 8 / 4 → 2 at once.
        assert_eq!(admitted, [2, 2]);
        let divided = divide(&gcra, 4).unwrap();
        let Algorithm::Gcra(g) = divided.algorithm() else {
            unreachable!()
        };
        assert_eq!(
            g.rate().amount() * 4,
            40 * g.rate().period_micros() / 1_000_000
        );
    }

    /// What `n` instances, each on its own local store while the primary is away, admit
    /// together of `rule` for one key, asked `tries` times each.
    async fn admitted_by_instances(rule: &Rule, n: u64, tries: usize) -> usize {
        let mut admitted = 0;
        for _ in 0..n {
            let flaky = Flaky::default();
            down(&flaky, true);
            let store = Fallback::with_local(
                Breaker::new(flaky.clone()),
                MemoryStore::with_clock(ManualClock::new(1_700_000_000_000_000)),
            )
            .instances(n);
            for _ in 0..tries {
                let batch = [Check::new(rule, b"k")];
                let outcome = store.check(&batch, Duration::ZERO).await.unwrap();
                admitted += usize::from(outcome.is_admitted());
            }
        }
        admitted
    }

    /// The instances' local shares never add up to more than one quota: a quota smaller
    /// than the number of instances leaves some instances no share at all.
    #[tokio::test(start_paused = true)]
    async fn the_instances_together_admit_at_most_one_quota() {
        let window = Rule::fixed_window("w", 2, Duration::from_secs(60));
        assert!(admitted_by_instances(&window, 3, 5).await <= 2);
        let bucket = Rule::gcra("g", 2, Rate::per_minute(2));
        assert!(admitted_by_instances(&bucket, 3, 5).await <= 2);
    }

    /// A rule whose divided rate cannot be built (its period times the instances is too
    /// long) is reduced another way or given no share, never used undivided.
    #[tokio::test(start_paused = true)]
    async fn a_rule_that_cannot_be_divided_is_never_used_whole() {
        let year = Rate::new(10, Duration::from_secs(366 * 86_400));
        let bucket = Rule::token_bucket("t", 10, year);
        assert!(admitted_by_instances(&bucket, 40, 20).await <= 10);
        let gcra = Rule::gcra("g", 10, year);
        assert!(admitted_by_instances(&gcra, 40, 20).await <= 10);
    }

    /// Units the local store admitted are refunded to the local store, not the primary.
    #[tokio::test(start_paused = true)]
    async fn a_local_admission_is_refunded_locally() {
        let flaky = Flaky::default();
        down(&flaky, true);
        let store = Fallback::with_local(
            Breaker::new(flaky.clone()).failures(1),
            MemoryStore::with_clock(ManualClock::new(0)),
        );
        let rule = Rule::gcra("g", 1, Rate::per_second(10));
        let batch = [Check::new(&rule, b"k")];
        let wait = Duration::from_secs(1);
        assert_eq!(
            store.check(&batch, wait).await.unwrap().decision,
            crate::Decision::Allow
        );
        let held = store.check(&batch, wait).await.unwrap();
        assert!(held.admission.as_ref().unwrap().taken(0).local);
        let calls = flaky.calls();
        store.refund(&batch, &held).await.unwrap();
        assert_eq!(flaky.calls(), calls, "the primary did not take these units");
        let next = store.check(&batch, wait).await.unwrap();
        assert_eq!(
            next.decision,
            crate::Decision::Delay(Duration::from_millis(100))
        );
    }

    /// A store with a probe of its own, for the wrappers' forwarding.
    #[derive(Clone, Default)]
    struct Probed(MemoryStore);

    impl Store for Probed {
        async fn check(&self, batch: &[Check<'_>], wait: Duration) -> Result<Outcome, StoreError> {
            self.0.check(batch, wait).await
        }
        fn try_check_now(
            &self,
            batch: &[Check<'_>],
            wait: Duration,
        ) -> Option<Result<Outcome, StoreError>> {
            self.0.try_check_now(batch, wait)
        }
        async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
            self.0.peek(check).await
        }
        async fn reset(&self, rule: &Rule, key: &StoredKey<'_>) -> Result<(), StoreError> {
            self.0.reset(rule, key).await
        }
        fn probe(&self) -> Option<impl Future<Output = Result<(), StoreError>> + Send + 'static> {
            Some(std::future::ready(Ok(())))
        }
    }

    /// The crate's wrappers lose none of the store's methods: a store that answers at once
    /// still does behind a breaker and a fallback (closed, primary up), and its probe is
    /// still there to ask.
    #[test]
    fn wrappers_forward_the_answer_at_once_and_the_probe() {
        let rule = Rule::gcra("g", 2, Rate::per_second(10));
        let batch = [Check::new(&rule, b"k")];
        let breaker = Breaker::new(Probed::default());
        assert!(breaker.try_check_now(&batch, Duration::ZERO).is_some());
        assert!(breaker.probe().is_some());
        let fallback = Fallback::with_local(Probed::default(), MemoryStore::new());
        assert!(fallback.try_check_now(&batch, Duration::ZERO).is_some());
        assert!(fallback.probe().is_some());
        let both = Fallback::with_local(Breaker::new(Probed::default()), MemoryStore::new());
        let outcome = both.try_check_now(&batch, Duration::ZERO);
        assert!(outcome.is_some_and(|o| o.is_ok_and(|o| o.is_admitted())));
        assert!(both.probe().is_some());
    }
}
