//! [`Limiter`]: checks requests against rules in a store.

use std::sync::Arc;
use std::time::Duration;

use crate::decision::{Outcome, RuleOutcome};
use crate::error::StoreError;
use crate::store::reservation::{Copied, Reservation};
use crate::store::{Check, Health, MemoryStore, Store};
use crate::stored::StoredKey;
use crate::Rule;

/// Checks requests against rules, keeping state in a [`Store`].
///
/// Usable on its own and inside the tower layer; clones share the store, so every clone
/// enforces the same limits. A batch is all or nothing: a message the minute rule refuses
/// uses up nothing of the hour, and passes at the instant its `retry_after` names:
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Check, Limiter, ManualClock, Rule, store::MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = ManualClock::new(1_700_000_000_000_000);
/// let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
/// let minute = Rule::fixed_window("sms-minute", 1, Duration::from_secs(60));
/// let hour = Rule::fixed_window("sms-hour", 5, Duration::from_secs(3600));
/// let sms = [Check::new(&minute, b"+8613800000000"), Check::new(&hour, b"+8613800000000")];
///
/// assert!(limiter.check(&sms).await?.is_admitted());
/// let outcome = limiter.check(&sms).await?;
/// let retry_after = outcome.decision.denial().and_then(|d| d.retry_after).expect("denied");
/// assert_eq!(outcome.rules[1].info.remaining, 4);
/// clock.advance(retry_after);
/// assert!(limiter.check(&sms).await?.is_admitted());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Limiter<S> {
    store: S,
}

impl<S: Store> Limiter<S> {
    /// A limiter keeping state in `store`.
    pub fn new(store: S) -> Self {
        Self { store }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// How well the store is deciding ([`Store::health`]), cheaply enough for every probe.
    pub fn health(&self) -> Health {
        self.store.health()
    }

    /// Decides a batch all or nothing ([`Store::check`]), each key in its [`StoredKey`]
    /// form. A batch with a rule that cannot work ([`Rule::checked`]) is refused with
    /// [`StoreError::InvalidBatch`] naming the rule; nothing is decided.
    pub async fn check(&self, batch: &[Check<'_>]) -> Result<Outcome, StoreError> {
        // Boxing the store's future keeps this one small (callers move it); a store that
        // waits on the network can afford the allocation, one that answers at once skips it.
        if let Some(outcome) = self.reserve_now(batch, Duration::ZERO) {
            return outcome;
        }
        Box::pin(self.reserve_outcome(batch, Duration::ZERO)).await
    }

    /// [`Store::try_check_now`]. This and [`reserve_outcome`](Self::reserve_outcome) are
    /// the one pair every decision goes through (`check`, `check_one`, `reserve`, the
    /// layer): calling the store from each caller instead makes the awaited in-process
    /// decision slower than `check_now` (`scripts/guard.sh inproc` shows it).
    #[inline]
    pub(crate) fn reserve_now(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> Option<Result<Outcome, StoreError>> {
        self.store.try_check_now(batch, max_wait)
    }

    /// [`Store::check`], awaited.
    pub(crate) async fn reserve_outcome(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> Result<Outcome, StoreError> {
        self.store.check(batch, max_wait).await
    }

    /// Like [`check`](Self::check), but a batch admissible within `max_wait` reserves its
    /// units now: the [`Reservation`] says [`Decision::Delay`](crate::Decision::Delay) for
    /// the wait and owns the units (nothing, if denied) until it is confirmed or cancelled,
    /// as its example shows.
    pub async fn reserve(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> Result<Reservation<S>, StoreError>
    where
        S: Clone,
    {
        let outcome = self.reserve_outcome(batch, max_wait).await?;
        let (store, batch) = (self.store.clone(), Arc::new(Copied::new(batch)));
        Ok(Reservation::of(store, batch, outcome, max_wait, None))
    }

    /// Decides one rule for `key` at the rule's default cost.
    pub async fn check_one(
        &self,
        rule: &Rule,
        key: impl AsRef<[u8]>,
    ) -> Result<Outcome, StoreError> {
        // As `check` does, not by awaiting it: one future fewer on the hot path.
        let batch = [Check::new(rule, key.as_ref())];
        if let Some(outcome) = self.reserve_now(&batch, Duration::ZERO) {
            return outcome;
        }
        Box::pin(self.reserve_outcome(&batch, Duration::ZERO)).await
    }

    /// What a request of `cost` would get from `rule` for `key`, without consuming anything.
    /// `key` is a key's own bytes or a `&StoredKey` an observer kept. A key the store does
    /// not hold (never seen, expired, or forgotten past a [`MemoryStore`]'s
    /// [bound](crate::store::MemoryStore::max_keys)) is reported fresh.
    pub async fn peek<'k>(
        &self,
        rule: &Rule,
        key: impl Into<StoredKey<'k>>,
        cost: u64,
    ) -> Result<RuleOutcome, StoreError> {
        let key = key.into();
        self.store
            .peek(Check::stored(rule, key.as_bytes()).with_cost(cost))
            .await
    }

    /// [`Store::reset`]: clears `rule`'s state for `key` (as [`peek`](Self::peek) takes it)
    /// and lifts any lock.
    pub async fn reset<'k>(
        &self,
        rule: &Rule,
        key: impl Into<StoredKey<'k>>,
    ) -> Result<(), StoreError> {
        if let Err(e) = rule.validate() {
            return Err(StoreError::InvalidBatch(e.to_string()));
        }
        self.store.reset(rule, &key.into()).await
    }
}

/// Decisions without a future on the in-process store, which never waits: what
/// [`check`](Limiter::check) answers, callable from synchronous code.
///
/// ```
/// use tollgate::{Check, Limiter, Rate, Rule, store::MemoryStore};
///
/// # fn main() -> Result<(), tollgate::StoreError> {
/// let limiter = Limiter::new(MemoryStore::new());
/// let rule = Rule::gcra("api", 2, Rate::per_second(10));
/// let alice = [Check::new(&rule, b"alice")];
/// assert!(limiter.check_now(&alice)?.is_admitted());
/// assert!(limiter.check_now(&alice)?.is_admitted());
/// assert!(!limiter.check_now(&alice)?.is_admitted());
/// # Ok(()) }
/// ```
impl Limiter<MemoryStore> {
    /// [`check`](Self::check) without a future: the same decision, taken now.
    pub fn check_now(&self, batch: &[Check<'_>]) -> Result<Outcome, StoreError> {
        self.store.decide(batch, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys are bytes (a header value may start with 0xFF): a short key spelling a long key's
    /// digest must not share its limit.
    #[tokio::test(flavor = "current_thread")]
    async fn a_short_key_cannot_pose_as_a_digest() {
        let long = vec![b'x'; 200];
        let forged = StoredKey::of(&long).as_bytes().to_vec();
        assert_ne!(StoredKey::of(&forged), StoredKey::of(&long));

        let limiter = Limiter::new(crate::store::MemoryStore::with_clock(
            crate::ManualClock::new(0),
        ));
        let rule = Rule::fixed_window("r", 1, Duration::from_secs(60));
        assert!(limiter.check_one(&rule, &long).await.unwrap().is_admitted());
        assert!(limiter
            .check_one(&rule, &forged)
            .await
            .unwrap()
            .is_admitted());
    }

    /// A store asked directly, without a `Limiter` (a wrapper, a job runner), keeps a long
    /// key as its digest: the same state the limiter reaches, and 33 bytes, not 1 MB.
    #[tokio::test(flavor = "current_thread")]
    async fn a_store_asked_directly_keeps_a_long_key_as_its_digest() {
        let store = crate::store::MemoryStore::with_clock(crate::ManualClock::new(0));
        let limiter = Limiter::new(store.clone());
        let rule = Rule::fixed_window("r", 1, Duration::from_secs(60));
        let long = vec![b'x'; 1 << 20];
        let direct = [Check::new(&rule, &long)];
        assert_eq!(direct[0].key().len(), 33);
        let first = store.check(&direct, Duration::ZERO).await.unwrap();
        assert!(first.is_admitted());
        assert!(!limiter.check_one(&rule, &long).await.unwrap().is_admitted());
        let stored = StoredKey::of(&long);
        let peeked = limiter.peek(&rule, &stored, 1).await.unwrap();
        assert!(!peeked.decision.is_admitted());
        store.reset(&rule, &stored).await.unwrap();
        assert!(limiter.check_one(&rule, &long).await.unwrap().is_admitted());
    }

    /// The synchronous path `check_one` takes on a MemoryStore decides as `check` does:
    /// the same admissions, the same refusal once the limit is spent.
    #[tokio::test(flavor = "current_thread")]
    async fn check_now_decides_as_check_does() {
        let store = crate::store::MemoryStore::with_clock(crate::ManualClock::new(0));
        let rule = Rule::fixed_window("r", 2, Duration::from_secs(60));
        let batch = [Check::new(&rule, b"k")];
        let now = store
            .try_check_now(&batch, Duration::ZERO)
            .unwrap()
            .unwrap();
        assert!(now.is_admitted());
        assert!(store
            .check(&batch, Duration::ZERO)
            .await
            .unwrap()
            .is_admitted());
        let refused = store
            .try_check_now(&batch, Duration::ZERO)
            .unwrap()
            .unwrap();
        assert!(!refused.is_admitted());
        assert_eq!(refused, store.check(&batch, Duration::ZERO).await.unwrap());
    }

    /// The limiter's synchronous decisions match its futures step by step on twin stores:
    /// single rules and batches, costs, a long key (digested by both), the refusal once the
    /// limit is spent, and an invalid rule refused by both.
    #[tokio::test(flavor = "current_thread")]
    async fn decisions_now_match_the_futures() {
        let clock = crate::ManualClock::new(1_000_000);
        let sync = Limiter::new(crate::store::MemoryStore::with_clock(clock.clone()));
        let futures = Limiter::new(crate::store::MemoryStore::with_clock(clock.clone()));
        let minute = Rule::fixed_window("minute", 3, Duration::from_secs(60));
        let bucket = Rule::gcra("bucket", 4, crate::Rate::per_second(1));
        let long = vec![b'x'; crate::stored::MAX_KEY_LEN + 1];
        for step in 0..12 {
            clock.advance(Duration::from_millis(300));
            let key: &[u8] = if step % 3 == 0 { &long } else { b"alice" };
            assert_eq!(
                sync.check_now(&[Check::new(&bucket, key)]),
                futures.check_one(&bucket, key).await,
                "step {step}"
            );
            let batch = [
                Check::new(&minute, key),
                Check::new(&bucket, key).with_cost(step % 2),
            ];
            assert_eq!(
                sync.check_now(&batch),
                futures.check(&batch).await,
                "step {step}"
            );
        }
        assert!(!sync
            .check_now(&[Check::new(&minute, b"alice")])
            .unwrap()
            .is_admitted());
        // On one limiter the synchronous and the awaited paths share a long key's quota:
        // both digest it alike.
        let once = Rule::fixed_window("once", 1, Duration::from_secs(60));
        assert!(sync
            .check_now(&[Check::new(&once, &long)])
            .unwrap()
            .is_admitted());
        assert!(!sync.check_one(&once, &long).await.unwrap().is_admitted());
        assert!(!sync
            .check_now(&[Check::new(&once, &long)])
            .unwrap()
            .is_admitted());
        let bad = Rule::fixed_window("bad", 0, Duration::from_secs(60));
        assert!(sync.check_now(&[Check::new(&bad, b"alice")]).is_err());
        assert!(sync.check_now(&[Check::new(&bad, b"alice")]).is_err());
    }

    /// A hand-built rule that cannot work is refused by every entry point, naming the rule,
    /// and never decided with its placeholder.
    #[tokio::test(flavor = "current_thread")]
    async fn an_invalid_rule_is_refused_not_decided() {
        let limiter = Limiter::new(crate::store::MemoryStore::with_clock(
            crate::ManualClock::new(0),
        ));
        let bad = Rule::fixed_window("sms-minute", 0, Duration::from_secs(60));
        let good = Rule::fixed_window("ok", 1, Duration::from_secs(60));
        let names_rule = |e: StoreError| {
            let StoreError::InvalidBatch(m) = e else {
                panic!("{e:?}")
            };
            assert!(m.contains("rule \"sms-minute\""), "{m}");
        };
        names_rule(limiter.check_one(&bad, b"k").await.unwrap_err());
        let batch = [Check::new(&good, b"k"), Check::new(&bad, b"k")];
        names_rule(limiter.check(&batch).await.unwrap_err());
        names_rule(
            limiter
                .reserve(&batch, Duration::from_secs(1))
                .await
                .unwrap_err(),
        );
        names_rule(limiter.peek(&bad, b"k", 1).await.unwrap_err());
        names_rule(limiter.reset(&bad, b"k").await.unwrap_err());
        // The refused batch consumed nothing of the valid rule.
        assert!(limiter.check_one(&good, b"k").await.unwrap().is_admitted());
    }
}
