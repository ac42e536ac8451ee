//! The layer on a store that is down, with `FailurePolicy::Fallback`: the local store's
//! decisions reach clients (429 with headers), and the layer's observers see the
//! degraded health. No sockets, no Redis.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::down::Down;
use crate::support::switch::Switch;
use http::{Request, Response, StatusCode};
use tollgate::layer::{FailurePolicy, Limit, RateLimitLayer};
use tollgate::store::{Breaker, Fallback};
use tollgate::{
    key,
    store::{Health, MemoryStore, Store},
    Check, Limiter, ManualClock, Outcome, Rule, RuleOutcome, StoreError,
};
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};

/// With the primary down, the layer's fallback store still enforces the limits, and the
/// decision hook sees a degraded limiter.
#[tokio::test]
async fn with_redis_down_the_fallback_limits_and_the_hook_sees_it() -> Result<(), BoxError> {
    // A clone of the breaker shares its state: the test reads it there.
    let breaker = Breaker::new(Down).failures(2);
    let store = Fallback::with_local(
        breaker.clone(),
        MemoryStore::with_clock(ManualClock::new(crate::support::EPOCH)),
    );
    let limiter = Limiter::new(store);
    let seen: Arc<Mutex<Vec<Health>>> = Arc::default();
    let hook = seen.clone();
    let layer = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(Limit::new(
            Rule::fixed_window("x", 3, Duration::from_secs(60)),
            key::global(),
        ))
        .on_failure(FailurePolicy::Fallback)
        .observe(crate::support::service::Watch(
            move |event: &tollgate::layer::DecisionEvent<'_>| {
                hook.lock().unwrap().push(event.health)
            },
        ))
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
    assert_eq!(breaker.health(), Health::Failing);
    Ok(())
}

/// A breaker without a fallback reports the limiter failing once it opens, and then fails
/// fast.
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

/// Units go back to the store that took them: a held request whose waiting rule is counted
/// by the fallback's local store (the primary went away during the hold) and whose response
/// does not count gives that unit back to the local store, never to the primary, which
/// took nothing for it. So a global limit of 2 failed logins a minute admits no third one.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_refund_goes_to_the_store_that_took_the_units() -> Result<(), BoxError> {
    let clock = ManualClock::new(crate::support::EPOCH);
    let primary = Switch::new(MemoryStore::with_clock(clock.clone()));
    let store = Fallback::with_local(primary.clone(), MemoryStore::with_clock(clock.clone()));
    let layer = RateLimitLayer::builder()
        .limiter(Limiter::new(store))
        .route(
            "POST /login",
            [
                // Each user's attempts leave one a second: a user's second attempt is held.
                Limit::new(
                    Rule::leaky_bucket("per-user", 5, tollgate::Rate::per_second(1)),
                    key::header("user"),
                ),
                Limit::new(
                    Rule::fixed_window("failed-logins", 2, Duration::from_secs(60)),
                    key::global(),
                )
                .charge(tollgate::layer::Charge::failures()),
            ],
        )
        .on_failure(FailurePolicy::Fallback)
        .build()?;
    // The right password logs in; the handler runs once the primary is back.
    let back = primary.clone();
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(move |req: Request<String>| {
                back.set_down(false);
                let status = if req.body() == "right" {
                    StatusCode::OK
                } else {
                    StatusCode::UNAUTHORIZED
                };
                async move {
                    Ok::<_, Infallible>(
                        Response::builder()
                            .status(status)
                            .body(String::new())
                            .unwrap(),
                    )
                }
            }));
    let login = |user: &str, password: &str| {
        Request::post("/login")
            .header("user", user)
            .body(password.to_owned())
            .unwrap()
    };

    // A first failure, counted by the primary.
    let first = svc.clone().oneshot(login("alice", "wrong")).await?;
    assert_eq!(first.status(), StatusCode::UNAUTHORIZED);
    // Alice's second attempt is held a second; the primary goes away meanwhile, so the
    // global rule counts it at the release in the local store. It succeeds: its unit goes
    // back.
    let held = tokio::spawn(svc.clone().oneshot(login("alice", "right")));
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    primary.set_down(true);
    clock.advance(Duration::from_secs(1));
    assert_eq!(held.await??.status(), StatusCode::OK);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }

    // Two more failures from other users: the second is the third failure of the minute.
    let second = svc.clone().oneshot(login("bob", "wrong")).await?;
    assert_eq!(second.status(), StatusCode::UNAUTHORIZED);
    let third = svc.clone().oneshot(login("carol", "wrong")).await?;
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    Ok(())
}

/// A store that decides from memory but cannot give units back.
#[derive(Clone)]
struct NoRefund(MemoryStore);

impl Store for NoRefund {
    async fn check(&self, batch: &[Check<'_>], wait: Duration) -> Result<Outcome, StoreError> {
        self.0.check(batch, wait).await
    }
    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        self.0.lease(check, term, ending).await
    }
    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        self.0.peek(check).await
    }
    async fn refund(&self, _: &[Check<'_>], _: &Outcome) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn reset(&self, rule: &Rule, key: &tollgate::StoredKey<'_>) -> Result<(), StoreError> {
        self.0.reset(rule, key).await
    }
    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), tollgate::StoreError> {
        self.0.overdraw(batch).await
    }
    async fn count_denials(
        &self,
        batch: &[Check<'_>],
        ago: std::time::Duration,
    ) -> Result<(), tollgate::StoreError> {
        self.0.count_denials(batch, ago).await
    }
    fn health(&self) -> tollgate::store::Health {
        self.0.health()
    }
}

/// Captures what is logged.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Refunds that fail are logged through the layer's log limiter: one line per interval,
/// however many requests fail to give their units back.
#[tokio::test(flavor = "current_thread")]
async fn failed_refunds_log_once_per_interval() -> Result<(), BoxError> {
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let layer = RateLimitLayer::builder()
        .limiter(Limiter::new(NoRefund(MemoryStore::new())))
        .limit(
            Limit::new(
                Rule::fixed_window("failed-logins", 1_000_000, Duration::from_secs(60)),
                key::global(),
            )
            .charge(tollgate::layer::Charge::failures()),
        )
        .log_interval(Duration::from_secs(3600))
        .build()?;
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|_req: Request<String>| async {
                Ok::<_, Infallible>(Response::new(String::from("ok")))
            }));
    for _ in 0..1_000 {
        let response = svc
            .clone()
            .oneshot(Request::get("/").body(String::new())?)
            .await?;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let text = String::from_utf8(sink.0.lock().unwrap().clone())?;
    let lines = text
        .lines()
        .filter(|l| l.contains("could not refund"))
        .count();
    assert_eq!(lines, 1, "{text}");
    Ok(())
}
