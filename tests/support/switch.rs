//! A store that can be switched off: an in-process store whose calls fail while it is off,
//! as a Redis that went away does. Every method of `Store` is forwarded, so that a test
//! behind it sees what the store itself would do.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::store::{MemoryStore, Store};
use tollgate::{Check, Outcome, Rule, RuleOutcome, StoreError};

/// An in-process store that fails every call while switched off, and counts the refunds
/// (settlements below the estimate) and overdraws (above it) it is asked for.
#[derive(Clone, Default)]
pub struct Switch {
    pub inner: MemoryStore,
    down: Arc<AtomicBool>,
    pub refunds: Arc<AtomicU64>,
    pub overdraws: Arc<AtomicU64>,
}

impl Switch {
    /// Switched on, deciding from `inner`.
    pub fn new(inner: MemoryStore) -> Self {
        Self {
            inner,
            ..Self::default()
        }
    }

    /// Switches it off (`true`) or back on.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// A handle that switches it, for a closure to own.
    pub fn switch(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.down)
    }

    fn up(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("connection refused".into()));
        }
        Ok(())
    }
}

impl Store for Switch {
    async fn check(&self, batch: &[Check<'_>], wait: Duration) -> Result<Outcome, StoreError> {
        self.up()?;
        self.inner.check(batch, wait).await
    }
    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        self.up()?;
        self.inner.lease(check, term, ending).await
    }
    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        self.up()?;
        self.inner.peek(check).await
    }
    async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        self.up()?;
        self.refunds.fetch_add(1, Ordering::SeqCst);
        self.inner.refund(batch, outcome).await
    }
    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), StoreError> {
        self.up()?;
        self.overdraws.fetch_add(1, Ordering::SeqCst);
        self.inner.overdraw(batch).await
    }
    async fn count_denials(&self, batch: &[Check<'_>], ago: Duration) -> Result<(), StoreError> {
        self.up()?;
        self.inner.count_denials(batch, ago).await
    }
    async fn reset(&self, rule: &Rule, key: &tollgate::StoredKey<'_>) -> Result<(), StoreError> {
        self.up()?;
        self.inner.reset(rule, key).await
    }
    fn health(&self) -> tollgate::store::Health {
        tollgate::store::Health::Healthy
    }
}
