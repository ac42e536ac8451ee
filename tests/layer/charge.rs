//! Charging by outcome (`Limit::charge`): only the responses that count use the quota, and
//! never more of them are admitted than the limit, however many requests run at once; on
//! MemoryStore and RedisStore.

use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use tokio::task::JoinSet;
use tollgate::layer::{Charge, Limit, RateLimitLayer};
use tollgate::{
    key,
    store::{MemoryStore, RedisStore, Store},
    DenyReason, Limiter, ManualClock, Penalty, Rule,
};
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};

use crate::support::redis_server::RedisServer;

type Svc = BoxCloneService<Request<String>, Response<String>, BoxError>;

const LIMIT: u64 = 10;

fn failed_logins() -> Rule {
    Rule::fixed_window("failed-logins", LIMIT, Duration::from_secs(600))
}

/// A login endpoint: the password `right` signs in (200), `boom` is a backend failure
/// (500), `error` an error of the service itself, anything else 401. Each answer takes
/// `work`, so that concurrent attempts are in flight together.
fn login<St: Store + Clone>(layer: RateLimitLayer<St>, work: Duration) -> Svc {
    let svc = ServiceBuilder::new().layer(layer).service(service_fn(
        move |req: Request<String>| async move {
            tokio::time::sleep(work).await;
            let status = match req.body().as_str() {
                "right" => StatusCode::OK,
                "boom" => StatusCode::INTERNAL_SERVER_ERROR,
                "error" => return Err(BoxError::from("backend went away")),
                _ => StatusCode::UNAUTHORIZED,
            };
            let mut response = Response::new(String::new());
            *response.status_mut() = status;
            Ok::<_, BoxError>(response)
        },
    ));
    BoxCloneService::new(svc)
}

/// [`login`] behind a layer that limits `rule` per user, charged by failed logins.
fn failures_of<St: Store + Clone>(limiter: Limiter<St>, rule: &Rule, work: Duration) -> Svc {
    let layer = RateLimitLayer::builder()
        .limiter(limiter)
        .route(
            "POST /login",
            [Limit::new(rule.clone(), key::header("user")).charge(Charge::failures())],
        )
        .build()
        .unwrap();
    login(layer, work)
}

/// The user, a name longer than a key kept as itself: the store, the unsettled requests
/// and the late counts of refusals all hold its digest.
const USER: &str = "alice-of-a-tenant-whose-user-ids-are-long-opaque-tokens-0123456789abcdef-0123456789abcdef-0123456789abcdef-0123456789abcdef-0123456789abcdef";

fn attempt(password: &str) -> Request<String> {
    Request::post("/login")
        .header("user", USER)
        .body(password.to_owned())
        .unwrap()
}

async fn status(svc: &Svc, password: &str) -> StatusCode {
    svc.clone()
        .oneshot(attempt(password))
        .await
        .unwrap()
        .status()
}

async fn remaining<St: Store>(limiter: &Limiter<St>, rule: &Rule) -> u64 {
    limiter.peek(rule, USER, 0).await.unwrap().info.remaining
}

/// A refund from Redis runs as a task after the response: wait for the quota to settle at
/// `expected`, and fail if it does not within 5 s.
async fn settles_at<St: Store>(limiter: &Limiter<St>, rule: &Rule, expected: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = remaining(limiter, rule).await;
        if now == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "remaining {now}, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// 50 concurrent attempts, half of them failed logins, twice; then one at a time until the
/// limit of failures is used up. Exactly the failures count, never more than `LIMIT` of them
/// pass, and successful logins use no quota.
async fn only_failed_logins_count<St: Store + Clone>(limiter: Limiter<St>) {
    let rule = failed_logins();
    let svc = failures_of(limiter.clone(), &rule, Duration::from_millis(20));

    let mut failures = 0;
    for wave in 0..2 {
        let mut attempts = JoinSet::new();
        for i in 0..50 {
            let svc = svc.clone();
            let password = if i % 2 == 0 { "wrong" } else { "right" };
            attempts.spawn(async move { svc.oneshot(attempt(password)).await.unwrap().status() });
        }
        let mut seen = Vec::new();
        while let Some(status) = attempts.join_next().await {
            seen.push(status.unwrap());
        }
        let count = |s| seen.iter().filter(|&&x| x == s).count() as u64;
        failures += count(StatusCode::UNAUTHORIZED);
        assert!(
            failures <= LIMIT,
            "wave {wave}: {failures} failed logins passed, limit {LIMIT}"
        );
        assert_eq!(
            count(StatusCode::UNAUTHORIZED)
                + count(StatusCode::OK)
                + count(StatusCode::TOO_MANY_REQUESTS),
            50,
            "{seen:?}"
        );
        // Requests in flight held the quota: the burst was refused beyond the limit.
        assert!(count(StatusCode::TOO_MANY_REQUESTS) > 0, "{seen:?}");
        // Once the responses are in, exactly the failures are counted.
        settles_at(&limiter, &rule, LIMIT - failures).await;
    }

    // Successful logins, one at a time, leave the quota as it was.
    let left = LIMIT - failures;
    for _ in 0..20 {
        let expected = if left > 0 {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(status(&svc, "right").await, expected);
        settles_at(&limiter, &rule, left).await;
    }
    // The failures use up exactly what is left, then every attempt is refused.
    for _ in 0..left {
        assert_eq!(status(&svc, "wrong").await, StatusCode::UNAUTHORIZED);
    }
    settles_at(&limiter, &rule, 0).await;
    assert_eq!(status(&svc, "wrong").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status(&svc, "right").await, StatusCode::TOO_MANY_REQUESTS);
}

/// With a memory store, a limit charged by failures counts exactly the failed logins, even
/// under concurrency: successes use no quota and no more than the limit of failures pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_failed_logins_count_in_memory() {
    only_failed_logins_count(Limiter::new(MemoryStore::new())).await;
}

/// With a Redis store, a limit charged by failures counts exactly the failed logins, even
/// under concurrency: successes use no quota and no more than the limit of failures pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_failed_logins_count_in_redis() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    only_failed_logins_count(Limiter::new(store)).await;
}

fn in_memory() -> Limiter<MemoryStore> {
    Limiter::new(MemoryStore::with_clock(ManualClock::new(
        crate::support::EPOCH,
    )))
}

/// `except_server_errors`: a failing backend's 500s are given back; an error of the inner
/// service counts (there is no status to judge it by), and so does every other response.
#[tokio::test]
async fn server_errors_are_given_back_and_service_errors_count() {
    let limiter = in_memory();
    let rule = Rule::fixed_window("api", 3, Duration::from_secs(60));
    let layer = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(Limit::new(rule.clone(), key::header("user")).charge(Charge::except_server_errors()))
        .build()
        .unwrap();
    let svc = login(layer, Duration::ZERO);
    for _ in 0..5 {
        assert_eq!(
            status(&svc, "boom").await,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
    assert_eq!(remaining(&limiter, &rule).await, 3);
    assert!(svc.clone().oneshot(attempt("error")).await.is_err());
    assert_eq!(remaining(&limiter, &rule).await, 2);
    assert_eq!(status(&svc, "right").await, StatusCode::OK);
    assert_eq!(status(&svc, "wrong").await, StatusCode::UNAUTHORIZED);
    assert_eq!(remaining(&limiter, &rule).await, 0);
    assert_eq!(status(&svc, "boom").await, StatusCode::TOO_MANY_REQUESTS);
}

/// In one batch, only the limits that do not count a response give their units back: a
/// global limit that counts everything keeps them. A trial limit gives back like an
/// enforced one.
#[tokio::test]
async fn only_the_limits_that_do_not_count_give_back() {
    let limiter = in_memory();
    let all = Rule::fixed_window("everything", 100, Duration::from_secs(60));
    let failed = failed_logins();
    let trial = Rule::sliding_log("failed-trial", 5, Duration::from_secs(60));
    let layer = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(Limit::new(all.clone(), key::header("user")))
        .route(
            "POST /login",
            [
                Limit::new(failed.clone(), key::header("user")).charge(Charge::failures()),
                Limit::new(trial.clone(), key::header("user"))
                    .charge(Charge::when(|s: StatusCode| s == StatusCode::UNAUTHORIZED))
                    .shadow(),
            ],
        )
        .build()
        .unwrap();
    let svc = login(layer, Duration::ZERO);
    for _ in 0..4 {
        assert_eq!(status(&svc, "right").await, StatusCode::OK);
    }
    assert_eq!(remaining(&limiter, &all).await, 96);
    assert_eq!(remaining(&limiter, &failed).await, LIMIT);
    assert_eq!(remaining(&limiter, &trial).await, 5);
    assert_eq!(status(&svc, "wrong").await, StatusCode::UNAUTHORIZED);
    assert_eq!(remaining(&limiter, &all).await, 95);
    assert_eq!(remaining(&limiter, &failed).await, LIMIT - 1);
    assert_eq!(remaining(&limiter, &trial).await, 4);
}

/// A request whose response never comes (dropped mid-flight) counts.
#[tokio::test]
async fn a_request_dropped_in_flight_counts() {
    let limiter = in_memory();
    let rule = failed_logins();
    let layer = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(Limit::new(rule.clone(), key::header("user")).charge(Charge::failures()))
        .build()
        .unwrap();
    let svc = login(layer, Duration::from_secs(3600));
    let dropped = tokio::time::timeout(Duration::from_millis(10), status(&svc, "right")).await;
    assert!(dropped.is_err());
    assert_eq!(remaining(&limiter, &rule).await, LIMIT - 1);
}

/// Failed logins charged by outcome (3 per 15 minutes), the key locked for an hour at the
/// first refused attempt; each login takes 400 ms, so a burst is in flight together even
/// on a machine too busy to start ten tasks within 100 ms.
fn guarded_logins<St: Store + Clone>(limiter: Limiter<St>) -> (Svc, Rule) {
    let rule = Rule::fixed_window("guarded-logins", 3, Duration::from_secs(900))
        .with_penalty(Penalty::lock_for(Duration::from_secs(3600)));
    (
        failures_of(limiter, &rule, Duration::from_millis(400)),
        rule,
    )
}

/// Ten attempts with `password` at once; their statuses.
async fn burst(svc: &Svc, password: &'static str) -> Vec<StatusCode> {
    let mut attempts = JoinSet::new();
    for _ in 0..10 {
        let svc = svc.clone();
        attempts.spawn(async move { svc.oneshot(attempt(password)).await.unwrap().status() });
    }
    let mut seen = Vec::new();
    while let Some(status) = attempts.join_next().await {
        seen.push(status.unwrap());
    }
    seen
}

/// Whether the key is locked out: a peek answers `Locked`.
async fn locked<St: Store>(limiter: &Limiter<St>, rule: &Rule) -> bool {
    let peeked = limiter.peek(rule, USER, 1).await.unwrap();
    peeked.decision.denial().map(|d| d.reason) == Some(DenyReason::Locked)
}

/// Ten successful logins at once: three hold the quota while in flight and the rest are
/// refused, only for units that the successes give back. Those refusals do not count
/// towards the lockout: once the burst is over the user is not locked out, and signs in.
async fn a_burst_of_successful_logins_does_not_lock_out<St: Store + Clone>(limiter: Limiter<St>) {
    let (svc, rule) = guarded_logins(limiter.clone());
    let seen = burst(&svc, "right").await;
    assert!(seen.contains(&StatusCode::TOO_MANY_REQUESTS), "{seen:?}");
    settles_at(&limiter, &rule, 3).await;
    // Whatever the refusals were going to count has been counted by now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !locked(&limiter, &rule).await,
        "locked out by successful logins"
    );
    assert_eq!(status(&svc, "right").await, StatusCode::OK);
}

/// Ten failed logins at once: three are tried and count, and the attempts refused beside
/// them were refused by counted failures: they count towards the lockout, and the key is
/// locked once the three have answered.
async fn a_burst_of_failed_logins_locks_out<St: Store + Clone>(limiter: Limiter<St>) {
    let (svc, rule) = guarded_logins(limiter.clone());
    let seen = burst(&svc, "wrong").await;
    assert!(seen.contains(&StatusCode::TOO_MANY_REQUESTS), "{seen:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !locked(&limiter, &rule).await {
        assert!(
            Instant::now() < deadline,
            "not locked after a burst of failures"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(status(&svc, "right").await, StatusCode::TOO_MANY_REQUESTS);
}

/// [`a_burst_of_successful_logins_does_not_lock_out`] on MemoryStore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_successful_logins_does_not_lock_out_in_memory() {
    a_burst_of_successful_logins_does_not_lock_out(Limiter::new(MemoryStore::new())).await;
}

/// [`a_burst_of_successful_logins_does_not_lock_out`] on a Redis server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_successful_logins_does_not_lock_out_in_redis() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    a_burst_of_successful_logins_does_not_lock_out(Limiter::new(store)).await;
}

/// [`a_burst_of_failed_logins_locks_out`] on MemoryStore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_failed_logins_locks_out_in_memory() {
    a_burst_of_failed_logins_locks_out(Limiter::new(MemoryStore::new())).await;
}

/// [`a_burst_of_failed_logins_locks_out`] on a Redis server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_failed_logins_locks_out_in_redis() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    a_burst_of_failed_logins_locks_out(Limiter::new(store)).await;
}

/// The store's time as tokio's clock moves it, from `base` µs.
#[derive(Debug)]
struct TokioClock {
    base: u64,
    start: tokio::time::Instant,
}

impl tollgate::Clock for TokioClock {
    fn now_micros(&self) -> u64 {
        self.base + self.start.elapsed().as_micros() as u64
    }
}

/// Two failed logins per 10 s window, the key locked at the first refusal that counts;
/// each login answers after a second. Two attempts in the last 500 ms of a window are tried,
/// a third is refused while they are in flight: they fail, so it was refused by counted
/// failures, in the window it was made in, and it locks the key, though the window has
/// turned when the failures answer.
async fn a_refusal_counts_in_the_window_it_was_made_in<St: Store + Clone>(
    store: impl FnOnce(TokioClock) -> St,
) {
    let window = 10_000_000;
    let clock = TokioClock {
        base: crate::support::EPOCH + window - 500_000,
        start: tokio::time::Instant::now(),
    };
    let limiter = Limiter::new(store(clock));
    let rule = Rule::fixed_window("edge-logins", 2, Duration::from_micros(window))
        .with_penalty(Penalty::lock_for(Duration::from_secs(3600)));
    let svc = failures_of(limiter.clone(), &rule, Duration::from_secs(1));
    let mut attempts = JoinSet::new();
    for _ in 0..3 {
        let svc = svc.clone();
        attempts.spawn(async move { svc.oneshot(attempt("wrong")).await.unwrap().status() });
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut seen = Vec::new();
    while let Some(status) = attempts.join_next().await {
        seen.push(status.unwrap());
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            StatusCode::UNAUTHORIZED,
            StatusCode::UNAUTHORIZED,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // The refusal's count runs once the failures have answered.
    let deadline = Instant::now() + Duration::from_secs(3);
    while !locked(&limiter, &rule).await {
        assert!(
            Instant::now() < deadline,
            "a refusal made before the window turned was forgiven after it"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// [`a_refusal_counts_in_the_window_it_was_made_in`] on MemoryStore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_counts_in_the_window_it_was_made_in_memory() {
    a_refusal_counts_in_the_window_it_was_made_in(MemoryStore::with_clock).await;
}

/// [`a_refusal_counts_in_the_window_it_was_made_in`] on a Redis server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_counts_in_the_window_it_was_made_in_redis() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    a_refusal_counts_in_the_window_it_was_made_in(|clock| store.with_clock(clock)).await;
}
