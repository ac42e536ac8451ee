//! [`Limiter`]: checks requests against rules in a store, with or without HTTP.

use crate::decision::{Outcome, RuleOutcome};
use crate::error::StoreError;
use crate::store::{Check, Store};
use crate::Rule;

/// Checks requests against rules, keeping state in a [`Store`].
///
/// Usable on its own (a job queue, a CLI, an SMS gateway) and inside the tower layer. It is
/// a cheap handle: clones share the store, so every clone enforces the same limits.
///
/// The seeds' SMS case: per phone number 1 per minute, 5 per hour and 10 per day, checked as
/// one batch, so a message refused by the minute rule does not use up the hour or the day.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Check, Decision, DenyReason, Limiter, ManualClock, MemoryStore, Rule};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = ManualClock::new(1_700_000_000_000_000);
/// let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
/// let minute = Rule::fixed_window("sms-minute", 1, Duration::from_secs(60))?;
/// let hour = Rule::fixed_window("sms-hour", 5, Duration::from_secs(3600))?;
/// let day = Rule::fixed_window("sms-day", 10, Duration::from_secs(86_400))?;
/// let phone = b"+8613800000000";
/// let sms = [Check::new(&minute, phone), Check::new(&hour, phone), Check::new(&day, phone)];
///
/// assert!(limiter.check(&sms).await?.is_admitted());
///
/// // A second message in the same minute is denied, and consumes nothing.
/// let outcome = limiter.check(&sms).await?;
/// let Decision::Deny(denial) = outcome.decision else { panic!("expected a denial") };
/// assert_eq!(denial.reason, DenyReason::Limited);
/// assert!(denial.retry_after.unwrap() <= Duration::from_secs(60));
/// assert_eq!(outcome.rules[1].info.remaining, 4); // the hour still has 4 left
///
/// // At the retry-after instant it passes.
/// clock.advance(denial.retry_after.unwrap());
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

    /// Decides a batch all or nothing; see [`Store::check`].
    pub async fn check(&self, batch: &[Check<'_>]) -> Result<Outcome, StoreError> {
        self.store.check(batch).await
    }

    /// Decides one rule for `key` at the rule's default cost.
    pub async fn check_one(
        &self,
        rule: &Rule,
        key: impl AsRef<[u8]>,
    ) -> Result<Outcome, StoreError> {
        self.store.check(&[Check::new(rule, key.as_ref())]).await
    }

    /// What a request of `cost` would get from `rule` for `key`, without consuming anything.
    pub async fn peek(
        &self,
        rule: &Rule,
        key: impl AsRef<[u8]>,
        cost: u64,
    ) -> Result<RuleOutcome, StoreError> {
        self.store
            .peek(Check::new(rule, key.as_ref()).with_cost(cost))
            .await
    }

    /// Clears the state of `rule` for `key` and lifts any lock (an admin "unblock").
    pub async fn reset(&self, rule: &Rule, key: impl AsRef<[u8]>) -> Result<(), StoreError> {
        self.store.reset(rule, key.as_ref()).await
    }
}
