//! The layer as a tower service (no sockets): route table, cost, modes (enforce, shadow,
//! wait), leaky-bucket delays, penalties, gRPC answers, failure policy, custom rejections.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::down::Down;
use crate::support::service::Watch;
use crate::support::service::{call, header, limiter, with, Svc};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tollgate::layer::{DecisionEvent, FailurePolicy, Limit, Mode, RateLimitLayer};
use tollgate::{
    key,
    store::{MemoryStore, Store},
    Check, Limiter, ManualClock, Outcome, Penalty, Rate, Rule, RuleOutcome, StoreError,
};
use tower::{BoxError, ServiceExt};

fn get(path: &str) -> Request<String> {
    Request::get(path).body(String::new()).unwrap()
}

/// One layer carries a route table: each route applies its own limits, costs and keys, a
/// refused request uses none of its other rules, and a gRPC route answers with a gRPC
/// status.
#[tokio::test]
async fn one_layer_carries_a_route_table() -> Result<(), BoxError> {
    let user = || key::header("user-id");
    let layer = RateLimitLayer::builder()
        .limiter(limiter())
        .route(
            "POST /sms/send",
            [
                Limit::new(
                    Rule::fixed_window("sms-min", 1, Duration::from_secs(60)),
                    user(),
                ),
                Limit::new(
                    Rule::fixed_window("sms-hour", 5, Duration::from_secs(3600)),
                    user(),
                ),
            ],
        )
        .route(
            "GET /files/{id}",
            [Limit::new(
                Rule::fixed_window("download", 10, Duration::from_secs(60)),
                user(),
            )
            .cost(|req| {
                req.headers()
                    .get("units")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(1)
            })],
        )
        .route(
            "/pkg.Files/*",
            [Limit::new(
                Rule::fixed_window("grpc", 1, Duration::from_secs(60)),
                key::route(),
            )],
        )
        .build()?;
    let svc = with(layer);

    let sms = || {
        Request::post("/sms/send")
            .header("user-id", "u1")
            .body(String::new())
            .unwrap()
    };
    assert_eq!(call(&svc, sms()).await.status(), StatusCode::OK);
    let denied = call(&svc, sms()).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // Both rules are reported; the refused message used none of the hour.
    assert_eq!(
        header(&denied, "ratelimit-policy"),
        "\"sms-min\";q=1;w=60, \"sms-hour\";q=5;w=3600"
    );
    assert!(header(&denied, "ratelimit").contains("\"sms-hour\";r=4;"));
    // GET /sms/send is another route (none).
    assert_eq!(call(&svc, get("/sms/send")).await.status(), StatusCode::OK);

    // Downloads cost their units; all files share the user's quota.
    let download = |id: &str, units: &str| {
        Request::get(format!("/files/{id}"))
            .header("user-id", "u1")
            .header("units", units)
            .body(String::new())
            .unwrap()
    };
    assert_eq!(
        call(&svc, download("a", "6")).await.status(),
        StatusCode::OK
    );
    let denied = call(&svc, download("b", "6")).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(header(&denied, "ratelimit").contains("\"download\";r=4;"));
    assert_eq!(
        call(&svc, download("c", "4")).await.status(),
        StatusCode::OK
    );

    // gRPC: a prefix for the whole service; the answer is a gRPC status.
    let grpc = |method: &str| {
        Request::post(format!("/pkg.Files/{method}"))
            .header("content-type", "application/grpc+proto")
            .body(String::new())
            .unwrap()
    };
    assert_eq!(call(&svc, grpc("Get")).await.status(), StatusCode::OK);
    let denied = call(&svc, grpc("Get")).await;
    assert_eq!(denied.status(), StatusCode::OK);
    assert_eq!(header(&denied, "grpc-status"), "8");
    assert!(header(&denied, "grpc-message").starts_with("rate limit exceeded; retry after"));
    assert_eq!(header(&denied, "content-type"), "application/grpc");
    // The route key is the pattern, so another method of the service shares the limit.
    assert_eq!(header(&call(&svc, grpc("List")).await, "grpc-status"), "8");
    Ok(())
}

/// Shadow mode never refuses a request nor advertises its rules, but reports each would-be
/// denial to the decision hook as a shadow one.
#[tokio::test]
async fn shadow_mode_never_rejects_but_reports() -> Result<(), BoxError> {
    let shadow_denials = Arc::new(AtomicUsize::new(0));
    let seen = shadow_denials.clone();
    let layer = RateLimitLayer::builder()
        .limiter(limiter())
        .limit(Limit::new(
            Rule::fixed_window("new-rule", 1, Duration::from_secs(60)),
            key::global(),
        ))
        .mode(Mode::Shadow)
        .headers_on_allowed(true)
        .observe(Watch(move |event: &DecisionEvent<'_>| {
            if event.outcome.is_ok_and(|o| !o.is_admitted()) {
                assert!(event.rules.iter().all(|r| r.shadow));
                assert_eq!(event.rules.first().map(|r| r.rule.name()), Some("new-rule"));
                seen.fetch_add(1, Ordering::SeqCst);
            }
        }))
        .build()?;
    let svc = with(layer);
    for _ in 0..5 {
        let res = call(&svc, get("/")).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("retry-after").is_none());
        // A rule on trial is not the client's to plan around: not advertised.
        assert!(res.headers().get("ratelimit").is_none());
        assert!(res.headers().get("ratelimit-policy").is_none());
    }
    assert_eq!(shadow_denials.load(Ordering::SeqCst), 4);
    Ok(())
}

/// Sends `n` requests at once; returns each one's status and when it completed.
async fn burst(svc: &Svc, n: usize) -> Vec<(StatusCode, Duration)> {
    let start = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let res = svc.oneshot(get("/")).await.unwrap();
                (res.status(), start.elapsed())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Wait mode holds each request of a burst until its turn within `max_wait`, and refuses at
/// once the requests that would wait longer.
#[tokio::test(start_paused = true)]
async fn wait_mode_spreads_a_burst_within_max_wait_and_rejects_beyond() -> Result<(), BoxError> {
    let layer = RateLimitLayer::builder()
        .limiter(limiter())
        .limit(Limit::new(
            Rule::gcra("api", 1, Rate::per_second(10)),
            key::global(),
        ))
        .mode(Mode::Wait {
            max_wait: Duration::from_millis(300),
        })
        .build()?;
    let results = burst(&with(layer), 6).await;
    let ms = |d: Duration| d.as_millis();
    let admitted: Vec<u128> = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::OK)
        .map(|(_, d)| ms(*d))
        .collect();
    assert_eq!(admitted, [0, 100, 200, 300], "{results:?}");
    let rejected: Vec<_> = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    assert_eq!(rejected.len(), 2, "{results:?}");
    // Rejected at once, not after waiting.
    assert!(rejected.iter().all(|(_, d)| d.is_zero()));
    Ok(())
}

/// A leaky bucket's delay holds requests in order in enforce mode, refusing beyond its
/// capacity; in shadow mode nothing is held or refused.
#[tokio::test(start_paused = true)]
async fn a_leaky_bucket_delay_holds_the_request_in_enforce_mode_only() -> Result<(), BoxError> {
    let rule = || Rule::leaky_bucket("shape", 3, Rate::per_second(10));
    let enforce = RateLimitLayer::builder()
        .limiter(limiter())
        .limit(Limit::new(rule(), key::global()))
        .build()?;
    let results = burst(&with(enforce), 5).await;
    let admitted: Vec<_> = results
        .iter()
        .filter(|(s, _)| s.is_success())
        .map(|(_, d)| *d)
        .collect();
    assert!(admitted.len() >= 2, "{results:?}");
    assert!(
        admitted.windows(2).all(|w| w[0] < w[1]),
        "held in order: {results:?}"
    );
    assert!(
        results
            .iter()
            .any(|(s, _)| *s == StatusCode::TOO_MANY_REQUESTS),
        "{results:?}"
    );

    let shadow = RateLimitLayer::builder()
        .limiter(limiter())
        .limit(Limit::new(rule(), key::global()))
        .mode(Mode::Shadow)
        .build()?;
    let results = burst(&with(shadow), 5).await;
    assert!(
        results.iter().all(|(s, d)| s.is_success() && d.is_zero()),
        "{results:?}"
    );
    Ok(())
}

/// A key locked by a penalty is refused with the lock's remaining time as `Retry-After`.
#[tokio::test]
async fn a_penalty_lockout_is_reported_with_its_remaining_time() -> Result<(), BoxError> {
    let login = Rule::fixed_window("login", 2, Duration::from_secs(60))
        .with_penalty(Penalty::lock_for(Duration::from_secs(600)));
    let layer = RateLimitLayer::builder()
        .limiter(limiter())
        .limit(Limit::new(login, key::header("user")))
        .legacy_headers(true)
        .build()?;
    let svc = with(layer);
    let attempt = || {
        Request::post("/login")
            .header("user", "mallory")
            .body(String::new())
            .unwrap()
    };
    call(&svc, attempt()).await;
    call(&svc, attempt()).await;
    let denied = call(&svc, attempt()).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "retry-after"), "600");
    assert_eq!(header(&denied, "x-ratelimit-limit"), "2");
    assert_eq!(header(&denied, "x-ratelimit-remaining"), "0");
    let locked = call(&svc, attempt()).await;
    assert_eq!(header(&locked, "retry-after"), "600");
    Ok(())
}

/// A store failure follows the failure policy: requests pass when failing open, and get a
/// 503, or gRPC status `UNAVAILABLE`, when failing closed.
#[tokio::test]
async fn store_failures_follow_the_failure_policy() -> Result<(), BoxError> {
    let rule = || Rule::fixed_window("x", 1, Duration::from_secs(60));
    let open = RateLimitLayer::builder()
        .limiter(Limiter::new(Down))
        .limit(Limit::new(rule(), key::global()))
        .build()?;
    let svc = with(open);
    for _ in 0..3 {
        assert_eq!(call(&svc, get("/")).await.status(), StatusCode::OK);
    }
    let closed = RateLimitLayer::builder()
        .limiter(Limiter::new(Down))
        .limit(Limit::new(rule(), key::global()))
        .on_failure(FailurePolicy::FailClosed)
        .build()?;
    let svc = with(closed);
    assert_eq!(
        call(&svc, get("/")).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let grpc = Request::post("/a.B/C")
        .header("content-type", "application/grpc")
        .body(String::new())?;
    assert_eq!(header(&call(&svc, grpc).await, "grpc-status"), "14");
    Ok(())
}

/// A custom rejection replaces the response to a refused request, keeps `Retry-After` from
/// the default one, and runs once per refusal.
#[tokio::test]
async fn rejections_can_be_replaced() -> Result<(), BoxError> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let layer = RateLimitLayer::builder()
        .limiter(limiter())
        .limit(Limit::new(
            Rule::fixed_window("x", 1, Duration::from_secs(60)),
            key::global(),
        ))
        .on_reject(move |rejection| {
            log.lock().unwrap().push(rejection.retry_after());
            let mut res = rejection.default_response();
            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            *res.body_mut() = Bytes::from_static(b"{\"error\":\"slow down\"}");
            res
        })
        .build()?;
    let svc = with(layer);
    call(&svc, get("/")).await;
    let res = call(&svc, get("/")).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await?
        .to_bytes();
    assert_eq!(&body[..], b"{\"error\":\"slow down\"}");
    assert_eq!(seen.lock().unwrap().len(), 1);
    Ok(())
}

/// Every clone of a layer and of its service enforces one shared limit, and configuration
/// mistakes are refused when the layer is built, as typed errors.
#[tokio::test]
async fn every_clone_enforces_the_same_limit_and_config_errors_are_typed() -> Result<(), BoxError> {
    let builder = RateLimitLayer::builder()
        .limiter(limiter())
        .limit(Limit::new(
            Rule::fixed_window("x", 2, Duration::from_secs(60)),
            key::global(),
        ));
    let layer = builder.clone().build()?;
    let a = with(layer.clone());
    let b = with(layer.clone());
    assert_eq!(call(&a, get("/")).await.status(), StatusCode::OK);
    assert_eq!(call(&b, get("/")).await.status(), StatusCode::OK);
    assert_eq!(
        call(&a.clone(), get("/")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // The same rule twice in one request's batch is refused when built (and a name bound
    // to another rule is refused as such: tests/models/reconfiguration.rs).
    let twice = builder.route(
        "/x",
        [Limit::new(
            Rule::fixed_window("x", 2, Duration::from_secs(60)),
            key::global(),
        )],
    );
    assert!(twice
        .build()
        .unwrap_err()
        .to_string()
        .contains("\"x\" is applied twice"));
    let err = RateLimitLayer::builder()
        .limiter(limiter())
        .route("no-slash", [])
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("route \"no-slash\""), "{err}");
    Ok(())
}

/// A service that is ready only when its gate is open.
#[derive(Clone)]
struct Gate(Arc<std::sync::atomic::AtomicBool>);

impl tower::Service<Request<String>> for Gate {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        if self.0.load(Ordering::SeqCst) {
            std::task::Poll::Ready(Ok(()))
        } else {
            std::task::Poll::Pending
        }
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        std::future::ready(Ok(Response::new(String::from("ok"))))
    }
}

/// The layer's `poll_ready` is the inner service's: it is pending until the inner service
/// is ready.
#[tokio::test]
async fn poll_ready_is_the_inner_services() -> Result<(), BoxError> {
    use tower::{Layer, Service};
    let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let layer = RateLimitLayer::builder()
        .limiter(limiter())
        .limit(Limit::new(
            Rule::fixed_window("x", 1, Duration::from_secs(60)),
            key::global(),
        ))
        .build()?;
    let mut svc = layer.layer(Gate(open.clone()));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_pending());
    open.store(true, Ordering::SeqCst);
    assert!(svc.poll_ready(&mut cx).is_ready());
    assert_eq!(svc.call(get("/")).await?.status(), StatusCode::OK);
    assert!(svc.poll_ready(&mut cx).is_ready());
    assert_eq!(
        svc.call(get("/")).await?.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    Ok(())
}

/// An in-process store behind 10 ms of latency, like a remote one.
#[derive(Clone)]
struct Slow(MemoryStore);

impl Store for Slow {
    async fn check(&self, batch: &[Check<'_>], max_wait: Duration) -> Result<Outcome, StoreError> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        self.0.check(batch, max_wait).await
    }
    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        self.0.lease(check, term, ending).await
    }
    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        self.0.peek(check).await
    }
    async fn reset(&self, rule: &Rule, key: &tollgate::StoredKey<'_>) -> Result<(), StoreError> {
        self.0.reset(rule, key).await
    }
    async fn refund(
        &self,
        _: &[Check<'_>],
        _: &tollgate::Outcome,
    ) -> Result<(), tollgate::StoreError> {
        Ok(())
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

/// A store that answers later is awaited, and its decision obeyed, wait included.
#[tokio::test(start_paused = true)]
async fn a_store_that_answers_later_is_awaited_then_obeyed() -> Result<(), BoxError> {
    let store = Slow(MemoryStore::with_clock(ManualClock::new(
        crate::support::EPOCH,
    )));
    let layer = RateLimitLayer::builder()
        .limiter(Limiter::new(store))
        .limit(Limit::new(
            Rule::gcra("api", 1, Rate::per_second(10)),
            key::global(),
        ))
        .mode(Mode::Wait {
            max_wait: Duration::from_millis(100),
        })
        .build()?;
    let results = burst(&with(layer), 3).await;
    let summary: Vec<(u16, u128)> = results
        .iter()
        .map(|(s, d)| (s.as_u16(), d.as_millis()))
        .collect();
    assert_eq!(summary, [(200, 10), (200, 110), (429, 10)]);
    Ok(())
}

/// Shadow mode lets through requests without a key and requests the store failed to decide,
/// even under a fail-closed policy.
#[tokio::test]
async fn shadow_mode_lets_keyless_requests_and_store_failures_through() -> Result<(), BoxError> {
    let rule = || Rule::fixed_window("x", 1, Duration::from_secs(60));
    let keyless = RateLimitLayer::builder()
        .limiter(limiter())
        .limit(Limit::new(rule(), key::header("user-id")))
        .mode(Mode::Shadow)
        .build()?;
    assert_eq!(
        call(&with(keyless), get("/")).await.status(),
        StatusCode::OK
    );
    let no_peer = RateLimitLayer::builder()
        .limiter(limiter())
        .limit(Limit::new(rule(), key::peer_ip()))
        .mode(Mode::Shadow)
        .build()?;
    assert_eq!(
        call(&with(no_peer), get("/")).await.status(),
        StatusCode::OK
    );
    let down = RateLimitLayer::builder()
        .limiter(Limiter::new(Down))
        .limit(Limit::new(rule(), key::global()))
        .on_failure(FailurePolicy::FailClosed)
        .mode(Mode::Shadow)
        .build()?;
    assert_eq!(call(&with(down), get("/")).await.status(), StatusCode::OK);
    Ok(())
}

/// A gRPC request without its key gets `INVALID_ARGUMENT` with the reason; plain HTTP gets
/// a 400 with the same message.
#[tokio::test]
async fn a_grpc_request_without_its_key_gets_invalid_argument() -> Result<(), BoxError> {
    let layer = RateLimitLayer::builder()
        .limiter(limiter())
        .limit(Limit::new(
            Rule::fixed_window("x", 1, Duration::from_secs(60)),
            key::header("user-id"),
        ))
        .build()?;
    let svc = with(layer);
    let grpc = Request::post("/a.B/C")
        .header("content-type", "application/grpc")
        .body(String::new())?;
    let res = call(&svc, grpc).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "grpc-status"), "3");
    assert_eq!(
        header(&res, "grpc-message"),
        "missing rate limit key: header user-id"
    );
    // Plain HTTP: 400 with the same message.
    let res = call(&svc, get("/")).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    Ok(())
}
