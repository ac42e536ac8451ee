//! What a store is asked and what it answers: the [`Check`]s of a batch, the [`Store`]
//! trait every store implements, and its [`Health`]. The stores import it from here, never
//! from the folder's root, which re-exports them.

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
    /// Units the request consumes (a download of 5 MB could cost 5). A cost of 0 consumes
    /// nothing and is always admitted unless the key is locked.
    pub cost: u64,
    /// A shadow item: decided and recorded in the same batch, but it never denies
    /// or delays the batch. It consumes when the batch is admitted and it admits on its own;
    /// when it would deny, it consumes nothing and counts its penalty denial, and its
    /// [`RuleOutcome`] says `Deny`, which is how a caller learns what enforcing it would do.
    pub shadow: bool,
    /// Leaves a quota denial of this item uncounted by its rule's penalty (a lock still
    /// refuses): the caller counts it later, if it still stands, with
    /// [`Store::count_denials`]. A layer limit charged by outcome with a penalty does this
    /// for a request refused while others of its key are in flight, whose units may yet be
    /// given back.
    pub defers_denial: bool,
}

impl<'a> Check<'a> {
    /// `rule` for `key` at the rule's default cost. A key longer than 128 bytes (or
    /// starting with the byte `0xFF`) is carried as its digest ([`StoredKey`]), so a
    /// client sending a 1 MB header costs the store 33 bytes, whoever asks the store.
    // Inline, also across crates: out of line it returns the check through memory, written
    // in narrow pieces (the key's tag and padding) that the caller's wider reads of the
    // check then wait on; the decision costs far more than the few instructions saved
    // (BENCHMARKS.md, "In process").
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
            shadow: false,
            defers_denial: false,
        }
    }

    /// The key the rule counts under (a client IP, a user id, a route…), in the form the
    /// store keeps it ([`StoredKey`]): a long key is its digest.
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
/// Implementations are cheap handles (`Clone` shares the state), so every clone of a service
/// using one enforces the same limits.
///
/// # Implementing a store
///
/// `Store` is an extension point: a wrapper that adds behaviour around another store
/// (injected faults, a metric, a routing rule between two stores), or a store of your own.
/// A wrapper forwards every method — the required ones and those with a default
/// ([`try_check_now`](Self::try_check_now), [`overdraw`](Self::overdraw),
/// [`count_denials`](Self::count_denials), [`probe`](Self::probe), [`health`](Self::health),
/// [`outage_health`](Self::outage_health)),
/// whose defaults are right for a store of its own but lose what the wrapped store does —
/// and passes [`refund`](Self::refund)'s `outcome` through untouched, so units still go
/// back to the store that took them (the crate's [`Breaker`](super::Breaker) and
/// [`Fallback`](super::Fallback) do, and a test holds them to it). A store of your own
/// decides with the semantics documented on [`check`](Self::check) and answers with
/// [`Outcome::new`](crate::Outcome::new); it records nothing to give back, so the default
/// `refund` keeps the units a cancelled [`Reservation`](crate::Reservation) took (never more
/// than the limit, sometimes less). Exact refunds, penalties, shaping and the shared test
/// vectors come with the stores of this crate.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Check, Limiter, Outcome, Rule, RuleOutcome, StoreError, StoredKey};
/// use tollgate::store::{MemoryStore, Store};
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
///     async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
///         self.inner.peek(check).await
///     }
///     async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
///         self.inner.refund(batch, outcome).await
///     }
///     async fn reset(&self, rule: &Rule, key: &StoredKey<'_>) -> Result<(), StoreError> {
///         self.inner.reset(rule, key).await
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
pub trait Store: Send + Sync + 'static {
    /// Decides `batch` all or nothing: if any item is denied, no item's state changes (except
    /// the penalty bookkeeping of the denied items). Deny beats Delay beats Allow; the
    /// longest retry-after among the denials is the batch's. [Shadow](Check::shadow) items
    /// take no part in the batch's decision.
    ///
    /// With a non-zero `max_wait`, a batch that would be admitted within `max_wait` is
    /// admitted now as a reservation: its units are taken at the instant it becomes
    /// admissible (atomically, so no other request can take them), and the decision is
    /// `Delay` until then. Locked keys and requests costing more than a rule's capacity are
    /// denied without waiting. `max_wait` is capped at 2^50 µs (some 35 years).
    ///
    /// A reservation counts every rule of the batch at the reserved instant. A leaky
    /// bucket's shaping delay is its queue, and the request passes when the last of the
    /// batch's queues releases it: every leaky bucket of the batch takes the request's slot
    /// at that release (a queue that would have let it go sooner reads the time until then
    /// as queued water, and denies when it has no room for it), so no bucket's outflow ever
    /// exceeds its rate. The other rules on the key that releases it last count the request
    /// then (so a fixed window on that key never counts a request in a window it does not
    /// pass in). The rules on other keys (a global or per-tenant limit) are *pending*:
    /// checked now as they will stand at the release (a batch they would deny then is
    /// denied now), but not counted, so that one client's queue never dates a shared state
    /// in the future (which would close it to every other client until then). Their rule
    /// outcomes say `Delay` until the release, when the
    /// [`Reservation`](crate::Reservation) that holds the request counts them.
    ///
    /// On a Redis Cluster a batch whose keys span slots is decided slot by slot. An
    /// admitted batch counts every rule at the instant a single node would. A denied batch
    /// gives back the units its earlier slots took, and with them what else the rule's state
    /// shows of it: a first-hit window it started is as if never started, and a leaky bucket
    /// that held the request for another slot's longer queue drains that hold too, while
    /// nothing has queued behind it (see [`refund`](Self::refund)). What other
    /// configurations of the rule read goes back with the units. A denied batch's rules
    /// are judged where one node judges them (the other slots' rules at a queue's release),
    /// so its `Retry-After` is the exact wait, without other traffic. Two differences from
    /// one node remain, by design: a sliding log in a slot that admitted and was refunded
    /// keeps its refunded entry, without units, until it expires, so the quota it reports
    /// reads that entry's reset, where one node, which never counted the request, reads
    /// none; and a rule in such a slot that found another configuration's state keeps it
    /// taken over (the carried units counted under its own parameters until its state is
    /// back to empty), which admits no more than one node, perhaps later.
    fn check(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send;

    /// Decides `batch` at once, without a future, when this store can (an in-process store
    /// can; a networked one cannot): the same decision [`check`](Self::check) would give,
    /// or `None` when the caller must await `check` instead. [`Limiter::check`] and
    /// [`Limiter::check_one`] take this path first, so a decision on a
    /// [`MemoryStore`](super::MemoryStore) goes through no future of the store's. The
    /// default returns `None`.
    ///
    /// [`Limiter::check`]: crate::Limiter::check
    /// [`Limiter::check_one`]: crate::Limiter::check_one
    fn try_check_now(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> Option<Result<Outcome, StoreError>> {
        let _ = (batch, max_wait);
        None
    }

    /// What `check` would say for one item, without consuming anything or counting a
    /// denial.
    fn peek(
        &self,
        check: Check<'_>,
    ) -> impl Future<Output = Result<RuleOutcome, StoreError>> + Send;

    /// Gives back the units an admitted batch took, for a request that will never pass or
    /// does not count: `batch` as it was checked, `outcome` the answer [`check`](Self::check)
    /// gave for it. A [`Reservation`](crate::Reservation) calls it when it is cancelled or
    /// dropped before its release; callers never need to.
    ///
    /// Best effort, and never more than is exact. Each rule gives its units back only where
    /// the result is a state that admits no more than the admissions left in it allow:
    /// - fixed window, sliding window, sliding log: always, while the window (or log entry)
    ///   of the admission is still stored; counts add up, so other admissions since do not
    ///   matter.
    /// - token bucket and GCRA: only while no other admission has been recorded at a later
    ///   instant (a later refill step, when stepped); otherwise the units stay taken (a
    ///   bucket that filled up meanwhile would have absorbed them).
    /// - leaky bucket: what of the admission's water is still queued, only while nothing
    ///   has queued behind it (the requests behind were told when they leave, and taking
    ///   water from before them would let the next request leave with the last of them).
    ///   A queue that held the request for another queue's longer release gives back that
    ///   hold too, under the same condition: it is left as if the request had never come.
    /// - a rule left pending to the release: nothing, it took nothing.
    /// - units another store took: nothing, they are not this store's to give. The outcome
    ///   names the store that took each rule's units, so that every unit lands where it
    ///   was taken however stores are composed (a [`Fallback`](super::Fallback) inside
    ///   another).
    ///
    /// A refund does not reopen a key earlier than the admission's instant: after a
    /// wait-mode reservation, the units go to the next request that waits for that instant.
    /// Penalty state is never touched. A [`reset`](Self::reset) forgives what the key had
    /// taken, so an admission taken before it and given back after it gives its units back
    /// into the state admissions since the reset wrote, where it finds its window (or its
    /// mark: an admission at the same microsecond leaving the same state): the key then
    /// admits up to those units more after the reset, as if they had been taken before it.
    ///
    /// A [`Reservation::settle`](crate::Reservation::settle) below the estimate comes
    /// through here too. The default implementation gives nothing back: a store outside
    /// this crate keeps what it took, and its reservations keep their units.
    fn refund(
        &self,
        batch: &[Check<'_>],
        outcome: &Outcome,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (batch, outcome);
        std::future::ready(Ok(()))
    }

    /// Takes each item's cost now, without a check, for a request already served whose
    /// cost settled above what its admission took ([`Reservation::settle`]): `batch` holds
    /// the units owed. Every algorithm carries the units as a debt the key's next requests
    /// pay (see [`Reservation::settle`]), so a store that routes keys takes them where the
    /// key is decided now, wherever the admission took its estimate.
    ///
    /// The default takes nothing: a store outside this crate charges the estimate only.
    ///
    /// [`Reservation::settle`]: crate::Reservation::settle
    fn overdraw(&self, batch: &[Check<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = batch;
        std::future::ready(Ok(()))
    }

    /// Counts a denial towards the penalty of each item of `batch` whose quota refused it
    /// `ago` before now, as [`check`](Self::check) would have when deciding it then with
    /// the state as it stands now (units given back since count as never taken); admits
    /// nothing and takes nothing. A caller that [deferred](Check::defers_denial) a denial
    /// counts it here once it knows the denial stands, with the batch as it was checked
    /// (the flag is about the check: every item is counted here). A window that has
    /// turned since the refusal, by a later admission, leaves the refusal standing: it was
    /// made in the window before.
    ///
    /// The default counts nothing: a store that ignores [`Check::defers_denial`] has
    /// counted every denial already.
    fn count_denials(
        &self,
        batch: &[Check<'_>],
        ago: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (batch, ago);
        std::future::ready(Ok(()))
    }

    /// Forgets the state of `rule` for `key` (in its stored form, as a [`Check`] carries
    /// it) and lifts any lock on it (an admin "unblock").
    fn reset(
        &self,
        rule: &Rule,
        key: &StoredKey<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// A health check of the store on its own, for a [`Breaker`](super::Breaker) to learn that the store is
    /// back without making a client's request the probe. `None` (the default) if the store
    /// has none: the breaker then lets one request through as the probe.
    ///
    /// The future borrows nothing (the breaker runs it on a task of its own) and is bounded
    /// like any call to the store (its timeout). [`RedisStore`] sends a `PING`.
    ///
    #[cfg_attr(feature = "redis", doc = "[`RedisStore`]: crate::store::RedisStore")]
    #[cfg_attr(
        not(feature = "redis"),
        doc = "[`RedisStore`]: https://docs.rs/tollgate/latest/tollgate/store/struct.RedisStore.html"
    )]
    fn probe(&self) -> Option<impl Future<Output = Result<(), StoreError>> + Send + 'static> {
        None::<std::future::Ready<Result<(), StoreError>>>
    }

    /// Whether the store decides as configured now: cheap (a few atomic loads; a store
    /// that is not may start its [`probe`](Self::probe) in the background, so that a polled
    /// readiness endpoint sees it recover), for a readiness endpoint. A store without a
    /// circuit breaker or a fallback is [`Healthy`](Health::Healthy) (its failures show
    /// only as errors) unless it knows it cannot decide: a [`RedisStore`] whose Sentinel
    /// primary failed the checks of `connect` is [`Failing`](Health::Failing).
    ///
    #[cfg_attr(feature = "redis", doc = "[`RedisStore`]: crate::store::RedisStore")]
    #[cfg_attr(
        not(feature = "redis"),
        doc = "[`RedisStore`]: https://docs.rs/tollgate/latest/tollgate/store/struct.RedisStore.html"
    )]
    fn health(&self) -> Health {
        Health::Healthy
    }

    /// How this store decides while a store it depends on across the network (Redis) is
    /// away, known before any outage, as [`health`](Self::health) names it:
    /// [`Failing`](Health::Failing) (the default) if its calls then fail
    /// ([`RedisStore`], a [`Breaker`](super::Breaker) around it, a store of your own that
    /// does not override this); [`Degraded`](Health::Degraded) if a local store then
    /// decides in its place (a [`Fallback`](super::Fallback)); [`Healthy`](Health::Healthy)
    /// if it depends on nothing that can be away (a [`MemoryStore`](super::MemoryStore)).
    ///
    /// The layer's [`FailurePolicy::Fallback`](crate::layer::FailurePolicy::Fallback)
    /// cannot work over a `Failing` store (every request of an outage would pass
    /// unlimited), so [`build`](crate::layer::RateLimitLayerBuilder::build) refuses it.
    ///
    #[cfg_attr(feature = "redis", doc = "[`RedisStore`]: crate::store::RedisStore")]
    #[cfg_attr(
        not(feature = "redis"),
        doc = "[`RedisStore`]: https://docs.rs/tollgate/latest/tollgate/store/struct.RedisStore.html"
    )]
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
    /// The primary store is unavailable and a [`Fallback`](super::Fallback)'s local store decides: limits
    /// hold per instance, not across instances.
    Degraded,
    /// A [`Breaker`](super::Breaker) is open and nothing decides in the store's place: requests follow the
    /// failure policy (the layer's [`FailurePolicy`](crate::layer::FailurePolicy)).
    Failing,
}

impl Health {
    /// The lower-case name (`"healthy"`, `"degraded"`, `"failing"`), for a response body or
    /// a metric label.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Degraded => "degraded",
            Health::Failing => "failing",
        }
    }
}

impl std::fmt::Display for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
