//! What a store is asked and answers: the [`Check`]s of a batch, the [`Store`] trait, and
//! [`Health`]. Stores import them from here, not from the re-exporting root.

use std::future::Future;
use std::time::Duration;

use crate::decision::{Outcome, RuleOutcome};
use crate::error::StoreError;
use crate::stored::{KeyBytes, StoredKey};
use crate::Rule;

/// One item of a batch: a rule, the key it applies to, and what the request costs.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// The rule to check.
    pub rule: &'a Rule,
    /// The key, in the form the store keeps it ([`Check::key`]).
    pub(crate) key: KeyBytes<'a>,
    /// Units the request consumes. A cost of 0 is always admitted unless the key is locked.
    pub cost: u64,
    /// What a refusal of this item does ([`Refusal::Enforced`] by default).
    pub refusal: Refusal,
}

/// What a [`Check`]'s refusal does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// It denies the batch and counts towards the rule's penalty.
    #[default]
    Enforced = 0,
    /// It never denies or delays the batch: the item consumes when the batch is admitted
    /// and it admits on its own; when it would deny, it consumes nothing, counts its penalty
    /// denial, and its [`RuleOutcome`] says `Deny` (what enforcing it would do).
    Shadow = 1,
    /// It denies the batch but leaves the penalty uncounted (a lock still refuses), for the
    /// caller to count with [`Store::count_denials`] once the refusal stands: the layer's
    /// charge-by-outcome limits, whose requests in flight may still give units back.
    Deferred = 2,
}

impl<'a> Check<'a> {
    /// `rule` for `key` at the rule's default cost, the key carried in its [`StoredKey`] form.
    // Inline, also across crates: out of line the check returns through memory in narrow
    // writes that the caller's wider reads then stall on.
    #[inline]
    pub fn new(rule: &'a Rule, key: &'a [u8]) -> Self {
        Self::with_key(rule, KeyBytes::of(key))
    }

    /// `rule` for bytes already in a key's stored form ([`StoredKey`]).
    pub(crate) fn stored(rule: &'a Rule, key: &'a [u8]) -> Self {
        Self::with_key(rule, KeyBytes::Kept(key))
    }

    #[inline]
    fn with_key(rule: &'a Rule, key: KeyBytes<'a>) -> Self {
        Self {
            rule,
            key,
            cost: rule.cost(),
            refusal: Refusal::Enforced,
        }
    }

    /// Whether the item is in shadow ([`Refusal::Shadow`]).
    #[inline]
    pub(crate) fn in_shadow(&self) -> bool {
        self.refusal == Refusal::Shadow
    }

    /// The key the rule counts under, in its stored form ([`StoredKey`]).
    #[inline]
    pub fn key(&self) -> &[u8] {
        self.key.as_bytes()
    }

    /// The same check at `cost` units.
    pub fn with_cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }
}

/// Keeps rule state and decides batches.
///
/// Implementations are cheap handles: `Clone` shares the state.
///
/// # Implementing a store
///
/// Every method that changes or reports state is required, so a wrapper cannot drop one:
/// it forwards each, passing `refund`'s `outcome` through untouched so units go back to the
/// store that took them; it forwards the defaulted ones (speed, watching) too. A store of
/// your own decides as [`check`](Self::check) documents and answers with
/// [`Outcome::new`](crate::Outcome::new); `Ok(())` from `refund` keeps a cancelled
/// [`Reservation`](crate::Reservation)'s units (never more than the limit), and from
/// `count_denials` is right when `check` already counts every denial.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Check, Limiter, Outcome, Rule, RuleOutcome, StoreError, StoredKey};
/// use tollgate::store::{Health, MemoryStore, Store};
///
/// /// Counts the batches its inner store decides.
/// #[derive(Clone, Default)]
/// struct Counted {
///     inner: MemoryStore,
///     calls: std::sync::Arc<std::sync::atomic::AtomicU64>,
/// }
///
/// impl Store for Counted {
///     async fn check(&self, batch: &[Check<'_>], wait: Duration) -> Result<Outcome, StoreError> {
///         self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         self.inner.check(batch, wait).await
///     }
///     async fn lease(
///         &self,
///         check: Check<'_>,
///         term: Duration,
///         ending: Option<(&Outcome, u64)>,
///     ) -> Result<Outcome, StoreError> {
///         self.inner.lease(check, term, ending).await
///     }
///     async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
///         self.inner.peek(check).await
///     }
///     async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
///         self.inner.refund(batch, outcome).await
///     }
///     async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), StoreError> {
///         self.inner.overdraw(batch).await
///     }
///     async fn count_denials(&self, batch: &[Check<'_>], ago: Duration) -> Result<(), StoreError> {
///         self.inner.count_denials(batch, ago).await
///     }
///     async fn reset(&self, rule: &Rule, key: &StoredKey<'_>) -> Result<(), StoreError> {
///         self.inner.reset(rule, key).await
///     }
///     fn health(&self) -> Health {
///         self.inner.health()
///     }
///     fn outage_health(&self) -> Health {
///         self.inner.outage_health()
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), StoreError> {
/// let store = Counted::default();
/// let limiter = Limiter::new(store.clone());
/// let rule = Rule::fixed_window("api", 1, Duration::from_secs(60));
/// assert!(limiter.check_one(&rule, b"alice").await?.is_admitted());
/// assert_eq!(store.calls.load(std::sync::atomic::Ordering::Relaxed), 1);
/// # Ok(()) }
/// ```
///
/// A wrapper that leaves out what changes state does not compile:
///
/// ```compile_fail,E0046
/// use std::time::Duration;
/// use tollgate::{Check, Outcome, StoreError};
/// use tollgate::store::{Health, MemoryStore, Store};
///
/// struct Forgetful(MemoryStore);
///
/// impl Store for Forgetful {
///     async fn check(&self, batch: &[Check<'_>], wait: Duration) -> Result<Outcome, StoreError> {
///         self.0.check(batch, wait).await
///     }
///     fn health(&self) -> Health {
///         self.0.health()
///     }
///     // No `refund`, `overdraw` or `count_denials` (nor `peek`, `reset`): units given
///     // back, a settled overdraft and a deferred login refusal would be lost.
/// }
/// ```
pub trait Store: Send + Sync + 'static {
    /// Decides `batch` all or nothing: if any item is denied, no item's state changes but
    /// the denied items' penalty bookkeeping. Deny beats Delay beats Allow; the longest
    /// retry-after among the denials is the batch's. [Shadow](Refusal::Shadow) items take no
    /// part in the batch's decision.
    ///
    /// With a non-zero `max_wait`, a batch admissible within `max_wait` is admitted now as a
    /// reservation: its units are taken atomically at the instant it becomes admissible, and
    /// the decision is `Delay` until then. Locked keys and requests costing more than a
    /// rule's capacity are denied without waiting. `max_wait` is capped at 2^50 µs.
    ///
    /// A reservation counts every rule when the last of the batch's leaky-bucket queues
    /// releases the request. Every leaky bucket takes the slot at that release (a sooner
    /// queue reads the time until then as queued water, denying if it has no room), so no
    /// outflow exceeds its rate; the other rules on the releasing key count it then. Rules
    /// on other keys (a global limit) are *pending*: checked now as they will stand at the
    /// release but not counted, so one client's queue never dates shared state into the
    /// future; they say `Delay`, and the [`Reservation`](crate::Reservation) counts them.
    ///
    /// On a Redis Cluster a batch spanning slots is decided slot by slot, with the
    /// differences the Redis store lists.
    fn check(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send;

    /// [`check`](Self::check) of one item taken as a lease (a [`Leased`](super::Leased)'s
    /// share of a token bucket or GCRA, never waiting): admitted, its units stay *parked*
    /// until the lease ends (a [`refund`](Self::refund) of the outcome, its cost the units
    /// unused) or `term` passes, and the key's bucket refills only up to its burst less the
    /// units parked in live leases, so that a unit used late never makes a burst larger
    /// than the rule's. `ending` is the lease this one renews, with its units unused: it
    /// ends first (as its refund would), in the same call where the store can. A store that
    /// cannot park answers as `check` does.
    fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send;

    /// The decision [`check`](Self::check) would give, without a future, when this store
    /// can answer at once (an in-process store always; a Redis store from its deny cache,
    /// a [`Leased`](super::Leased) from a lease); `None` (the default) when the caller must
    /// await `check`.
    fn try_check_now(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> Option<Result<Outcome, StoreError>> {
        let _ = (batch, max_wait);
        None
    }

    /// What `check` would say for one item, consuming nothing and counting no denial.
    fn peek(
        &self,
        check: Check<'_>,
    ) -> impl Future<Output = Result<RuleOutcome, StoreError>> + Send;

    /// Gives back the units an admitted batch took, for a request that will never pass or
    /// does not count: `batch` as checked, `outcome` what [`check`](Self::check) answered.
    /// A [`Reservation`](crate::Reservation) calls it when cancelled or dropped before its
    /// release, or settled below its estimate; callers never need to.
    ///
    /// Best effort, never more than exact: a rule gives units back only where the result
    /// admits no more than the admissions left in it allow:
    /// - fixed window, sliding window, sliding log: while the admission's window (or log
    ///   entry) is still stored; counts add up, so later admissions do not matter.
    /// - token bucket and GCRA: only while no admission has been recorded at a later
    ///   instant (a later refill step, when stepped).
    /// - leaky bucket: what of the admission's water is still queued, only while nothing
    ///   has queued behind it (the requests behind were told when they leave). A queue that
    ///   held the request for another queue's longer release gives that hold back too, under
    ///   the same condition.
    /// - a lease ([`lease`](Self::lease)): the units it did not use, the refund's cost, and
    ///   the lease ends; past its term, nothing (every unit then counts as used).
    /// - a rule left pending to the release, or units another store took (the outcome names
    ///   it): nothing.
    ///
    /// A refund never reopens a key earlier than the admission's instant, and never touches
    /// penalty state. An admission taken before a [`reset`](Self::reset) and refunded after
    /// it gives its units into the state written since, where it finds its window (or an
    /// identical mark at the same microsecond): the key then admits up to those units more,
    /// as if they had been taken before the reset.
    fn refund(
        &self,
        batch: &[Check<'_>],
        outcome: &Outcome,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Takes each item's cost now, without a check: the units a served request owes beyond
    /// its admission ([`Reservation::settle`]), carried as a debt the key's next requests
    /// pay. A store that routes keys takes them where the key is decided now.
    ///
    /// [`Reservation::settle`]: crate::Reservation::settle
    fn overdraw(&self, batch: &[Check<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Counts a penalty denial for each item whose quota refused it `ago` before now, as
    /// [`check`](Self::check) would have then on the state as it stands now (units given
    /// back since never taken; a window turned since leaves the refusal standing: a store
    /// keeps a key a penalty refused 3 s past its state's end); admits and takes nothing.
    /// A caller that [deferred](Refusal::Deferred) passes the batch as checked.
    fn count_denials(
        &self,
        batch: &[Check<'_>],
        ago: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Forgets `rule`'s state for `key` (in stored form) and lifts any lock (an admin
    /// "unblock").
    fn reset(
        &self,
        rule: &Rule,
        key: &StoredKey<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// A health check of its own, for a [`Breaker`](super::Breaker) to learn the store is
    /// back without a client's request as the probe; `None` (the default) lets one request
    /// through instead. The future borrows nothing (it runs on its own task) and is bounded
    /// by the store's timeout. A Redis store sends a `PING`.
    fn probe(&self) -> Option<impl Future<Output = Result<(), StoreError>> + Send + 'static> {
        None::<std::future::Ready<Result<(), StoreError>>>
    }

    /// Whether the store decides as configured now, cheaply, for a readiness endpoint (it
    /// may start a [`probe`](Self::probe), so polling sees recovery). Without a breaker or
    /// fallback, [`Healthy`](Health::Healthy) (failures show only as errors) unless it
    /// knows it cannot decide: a Redis store whose Sentinel primary failed the checks of
    /// `connect` is [`Failing`](Health::Failing).
    fn health(&self) -> Health;

    /// The [`health`](Self::health) this store would report during a network outage, known
    /// in advance: [`Failing`](Health::Failing) (the default) if its calls fail (a Redis
    /// store, a [`Breaker`](super::Breaker) around it); [`Degraded`](Health::Degraded)
    /// if a local store decides instead (a [`Fallback`](super::Fallback));
    /// [`Healthy`](Health::Healthy) if nothing can be away (a
    /// [`MemoryStore`](super::MemoryStore)). [`build`](crate::layer::RateLimitLayerBuilder::build)
    /// refuses [`FailurePolicy::Fallback`](crate::layer::FailurePolicy::Fallback) over a
    /// `Failing` store, whose outage would pass every request unlimited.
    fn outage_health(&self) -> Health {
        Health::Failing
    }
}

/// How well a store is deciding, for a `/ready` endpoint or a Kubernetes probe
/// ([`Store::health`], [`Limiter::health`](crate::Limiter::health)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Health {
    /// Decisions come from the store as configured (Redis, for a Redis store).
    Healthy,
    /// A [`Fallback`](super::Fallback)'s local store decides: limits hold per instance.
    Degraded,
    /// A [`Breaker`](super::Breaker) is open and nothing decides: requests follow the layer's
    /// [`FailurePolicy`](crate::layer::FailurePolicy).
    Failing,
}

/// The lower-case name, for a response body or a metric label.
impl std::fmt::Display for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Health::Healthy => "healthy",
            Health::Degraded => "degraded",
            Health::Failing => "failing",
        })
    }
}
