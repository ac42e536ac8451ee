//! The layer on a store that is down, with `FailurePolicy::Fallback`: the local store's
//! decisions reach clients (429 with headers), and the `on_decision` hook sees the
//! degraded health. No sockets, no Redis.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tollgate::layer::{FailurePolicy, Limit, RateLimitLayer};
use tollgate::store::{Breaker, Fallback};
use tollgate::{
    key, Check, Health, Limiter, ManualClock, MemoryStore, Outcome, Rule, RuleOutcome, Store,
    StoreError,
};
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};

/// A store that is always away.
#[derive(Clone)]
struct Down;

impl Store for Down {
    async fn check(&self, _: &[Check<'_>], _: Duration) -> Result<Outcome, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn peek(&self, _: Check<'_>) -> Result<RuleOutcome, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn reset(&self, _: &Rule, _: &[u8]) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
}

#[tokio::test]
async fn with_redis_down_the_fallback_limits_and_the_hook_sees_it() -> Result<(), BoxError> {
    let store = Fallback::with_local(
        Breaker::new(Down).failures(2),
        MemoryStore::with_clock(ManualClock::new(1_700_000_000_000_000)),
    );
    let limiter = Limiter::new(store);
    let seen: Arc<Mutex<Vec<Health>>> = Arc::default();
    let hook = seen.clone();
    let layer = RateLimitLayer::builder(limiter.clone())
        .limit(Limit::new(
            Rule::fixed_window("x", 3, Duration::from_secs(60)),
            key::global(),
        ))
        .on_failure(FailurePolicy::Fallback)
        .on_decision(move |event| hook.lock().unwrap().push(event.health()))
        .build()?;
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|_req: Request<String>| async {
                Ok::<_, Infallible>(Response::new(String::from("ok")))
            }));

    let mut statuses = Vec::new();
    for _ in 0..5 {
        let response = svc
            .clone()
            .oneshot(Request::get("/").body(String::new())?)
            .await?;
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            assert!(response.headers().contains_key("retry-after"));
        }
        statuses.push(response.status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(*seen.lock().unwrap(), [Health::Degraded; 5]);
    assert_eq!(limiter.health(), Health::Degraded);
    assert_eq!(
        limiter.store().primary().state(),
        tollgate::store::BreakerState::Open
    );
    Ok(())
}

#[tokio::test]
async fn a_breaker_without_a_fallback_is_failing_and_fails_fast() -> Result<(), BoxError> {
    let limiter = Limiter::new(Breaker::new(Down).failures(1));
    let rule = Rule::fixed_window("x", 3, Duration::from_secs(60));
    assert_eq!(limiter.health(), Health::Healthy);
    assert!(matches!(
        limiter.check_one(&rule, b"k").await,
        Err(StoreError::Unavailable(_))
    ));
    assert_eq!(limiter.health(), Health::Failing);
    assert_eq!(
        limiter.check_one(&rule, b"k").await,
        Err(StoreError::CircuitOpen)
    );
    Ok(())
}
