//! A store on tokio's paused clock held still while it waits for Redis.

use std::time::Duration;

use tollgate::store::{RedisStore, Store};
use tollgate::{Check, ManualClock, Outcome, Rule, RuleOutcome, StoreError};

/// A Redis store on tokio's paused clock: the clock is held still while the store waits
/// for Redis (a blocking task in flight stops its auto-advance), so a round trip takes no
/// time on it and no timeout fires for want of an answer. Tests that wait on a
/// [`Reservation`](tollgate::Reservation) pause the clock; the store's time is a
/// `ManualClock`.
#[derive(Clone)]
pub struct Still<S>(pub S);

impl Still<RedisStore> {
    pub async fn connect(url: &str) -> Self {
        Self(still(RedisStore::connect(url)).await.expect("connect"))
    }

    pub fn with_clock(self, clock: ManualClock) -> Self {
        Self(self.0.with_clock(clock))
    }
}

/// Runs `call` with tokio's paused clock held still (see [`Still`]).
pub async fn still<F: std::future::Future>(call: F) -> F::Output {
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let holder = tokio::task::spawn_blocking(move || {
        let _ = wait.recv();
    });
    let output = call.await;
    drop(done);
    holder.await.expect("the blocking task ends");
    output
}

impl<S: Store> Store for Still<S> {
    async fn check(&self, batch: &[Check<'_>], wait: Duration) -> Result<Outcome, StoreError> {
        still(self.0.check(batch, wait)).await
    }
    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        still(self.0.lease(check, term, ending)).await
    }
    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        still(self.0.peek(check)).await
    }
    async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        still(self.0.refund(batch, outcome)).await
    }
    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), StoreError> {
        still(self.0.overdraw(batch)).await
    }
    async fn count_denials(&self, batch: &[Check<'_>], ago: Duration) -> Result<(), StoreError> {
        still(self.0.count_denials(batch, ago)).await
    }
    async fn reset(&self, rule: &Rule, key: &tollgate::StoredKey<'_>) -> Result<(), StoreError> {
        still(self.0.reset(rule, key)).await
    }
    fn health(&self) -> tollgate::store::Health {
        tollgate::store::Health::Healthy
    }
}
