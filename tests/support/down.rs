//! A store that is down: every call fails as a refused connection does.

use std::time::Duration;

use tollgate::{store::Store, Check, Outcome, Rule, RuleOutcome, StoreError};

/// A store whose every call fails with [`StoreError::Unavailable`].
#[derive(Clone, Debug)]
pub struct Down;

impl Store for Down {
    async fn check(&self, _: &[Check<'_>], _: Duration) -> Result<Outcome, StoreError> {
        Err(refused())
    }
    async fn lease(
        &self,
        _: Check<'_>,
        _: Duration,
        _: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        Err(refused())
    }
    async fn peek(&self, _: Check<'_>) -> Result<RuleOutcome, StoreError> {
        Err(refused())
    }
    async fn reset(&self, _: &Rule, _: &tollgate::StoredKey<'_>) -> Result<(), StoreError> {
        Err(refused())
    }
    async fn refund(
        &self,
        _: &[Check<'_>],
        _: &tollgate::Outcome,
    ) -> Result<(), tollgate::StoreError> {
        Ok(())
    }
    async fn overdraw(&self, _: &[Check<'_>]) -> Result<(), tollgate::StoreError> {
        Ok(())
    }
    async fn count_denials(
        &self,
        _: &[Check<'_>],
        _: std::time::Duration,
    ) -> Result<(), tollgate::StoreError> {
        Ok(())
    }
    fn health(&self) -> tollgate::store::Health {
        tollgate::store::Health::Healthy
    }
}

fn refused() -> StoreError {
    StoreError::Unavailable("connection refused".into())
}
