//! The layer against hostile clients and careless configuration: route patterns that can
//! never match, exemptions, shadow rules in the headers and in the batch, logs that cannot
//! flood.

use std::time::Duration;

use crate::support::down::Down;
use crate::support::log::Captured;
use crate::support::service::{call, header, limiter, with};
use http::{Request, StatusCode};
use tollgate::layer::{Limit, RateLimitLayer};
use tollgate::{
    key,
    store::{MemoryStore, Store},
    Limiter, ManualClock, Rule,
};
use tower::BoxError;

fn one_per_minute(name: &str) -> Result<Limit, BoxError> {
    Ok(Limit::new(
        Rule::fixed_window(name, 1, Duration::from_secs(60)),
        key::global(),
    ))
}

fn route_error(layer: Result<RateLimitLayer, tollgate::ConfigError>) -> String {
    match layer {
        Ok(_) => panic!("the route table was accepted"),
        Err(e) => e.to_string(),
    }
}

// ---- 5: route patterns that can never match ----

/// A route pattern no request can match (a lowercase method, a query or fragment, a space,
/// non-ASCII or a dot segment) is refused when the layer is built.
#[test]
fn a_pattern_that_can_never_match_is_refused_when_built() -> Result<(), BoxError> {
    let route = |pattern: &str| {
        route_error(
            RateLimitLayer::builder()
                .limiter(limiter())
                .route(pattern, [one_per_minute("r").unwrap()])
                .build(),
        )
    };
    // Methods are case-sensitive: "post" is an extension method no client sends for POST.
    let lower = route("post /sms/send");
    assert!(lower.contains("\"POST\""), "{lower}");
    assert!(route("Get /x").contains("\"GET\""));
    // The query and the fragment are never part of the path a request is matched on.
    assert!(route("GET /search?q=1").contains('?'));
    assert!(route("/page#top").contains('#'));
    // A client sends neither spaces, non-ASCII nor dot segments in a path.
    assert!(!route("GET /a b").is_empty());
    assert!(!route("/café").is_empty());
    assert!(!route("/a/../b").is_empty());
    assert!(!route("/a/./b").is_empty());
    Ok(())
}

/// One `build` reports every mistake of a layer, each naming its rule, key or route, so a
/// configuration is fixed in one round, not one error per start.
#[test]
fn build_reports_every_problem_at_once_each_naming_its_rule_or_route() {
    let minute = Duration::from_secs(60);
    let ok = || Rule::fixed_window("ok", 10, minute);
    let err = RateLimitLayer::builder()
        .limiter(limiter())
        // A rule that cannot work, and a key that cannot either.
        .limit(Limit::new(
            Rule::fixed_window("zero", 0, minute),
            key::global(),
        ))
        .limit(Limit::new(
            ok(),
            key::client_ip(["10.0.0.0/8", "not-a-proxy"]),
        ))
        // A least cost no request can pay.
        .limit(Limit::new(Rule::fixed_window("big", 10, minute), key::global()).min_cost(11))
        // A pattern no request can match.
        .route("post /sms/send", [])
        // A route the earlier one shadows.
        .route("/files/{id}", [])
        .route("GET /files/{name}", [])
        // One rule twice in one request's batch.
        .route("/twice", [Limit::new(ok(), key::global())])
        // One name for two rules.
        .route(
            "/a",
            [Limit::new(
                Rule::fixed_window("shared", 1, minute),
                key::global(),
            )],
        )
        .route(
            "/b",
            [Limit::new(
                Rule::fixed_window("shared", 2, minute),
                key::global(),
            )],
        )
        .build()
        .unwrap_err();
    let problems: Vec<&str> = err.problems().collect();
    let expected = [
        "rule \"zero\": fixed window limit must be at least 1",
        "the key of rule \"ok\": trusted proxy \"not-a-proxy\"",
        "rule \"big\": every request costs at least 11, more than the 10",
        "route \"post /sms/send\"",
        "route \"GET /files/{name}\" can never match: the earlier route \"/files/{id}\"",
        "rule \"ok\" is applied twice to /twice",
        "rule name \"shared\" is bound to two different rules",
    ];
    assert_eq!(problems.len(), expected.len(), "{err}");
    for part in expected {
        assert!(
            problems.iter().any(|p| p.starts_with(part)),
            "no problem starts with {part:?}:\n{err}"
        );
    }
    // Display lists them one per line.
    assert_eq!(err.to_string().lines().count(), 1 + expected.len(), "{err}");
}

/// A route that an earlier route shadows is refused naming both, while overlapping routes
/// the router's precedence tells apart are accepted in either order.
#[test]
fn a_route_an_earlier_route_shadows_is_refused_naming_both() -> Result<(), BoxError> {
    let table = |patterns: &[&str]| {
        let mut layer = RateLimitLayer::builder().limiter(limiter());
        for (i, p) in patterns.iter().enumerate() {
            layer = layer.route(p, [one_per_minute(&format!("r{i}")).unwrap()]);
        }
        layer.build()
    };
    let shadowed = route_error(table(&["/files/{id}", "GET /files/{name}"]));
    assert!(shadowed.contains("\"GET /files/{name}\""), "{shadowed}");
    assert!(shadowed.contains("\"/files/{id}\""), "{shadowed}");
    assert!(!route_error(table(&["GET /x", "HEAD /x"])).is_empty());
    assert!(!route_error(table(&["/x", "/x/"])).is_empty());
    assert!(!route_error(table(&["/api/*", "/api/{*rest}"])).is_empty());

    // The router's precedence decides between overlapping routes, whatever their order: a
    // more specific route declared after a general one is the one its requests take.
    table(&["/sms/*", "POST /sms/send"])?;
    table(&["/files/{id}", "GET /files/latest"])?;
    table(&["/*", "/anything/{id}"])?;
    table(&["/api/{*rest}", "/api"])?;
    table(&["POST /sms/send", "/sms/*"])?;
    table(&["GET /files/latest", "/files/{id}"])?;
    table(&["HEAD /x", "GET /x"])?;
    table(&["POST /x", "/x"])?;
    table(&["/api/{id}", "/api/*"])?;
    table(&["/a/{id}/b", "/a/c/{id}"])?;
    Ok(())
}

/// Every route a table accepts still limits the requests it matches through the layer.
#[tokio::test]
async fn every_accepted_route_still_limits_through_the_layer() -> Result<(), BoxError> {
    let svc = with(
        RateLimitLayer::builder()
            .limiter(limiter())
            .route("POST /sms/send", [one_per_minute("sms")?])
            .route("/sms/*", [one_per_minute("sms-other")?])
            .build()?,
    );
    let post = || Request::post("/sms/send").body(String::new()).unwrap();
    assert_eq!(call(&svc, post()).await.status(), StatusCode::OK);
    assert_eq!(
        call(&svc, post()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let other = || Request::get("/sms/send").body(String::new()).unwrap();
    assert_eq!(call(&svc, other()).await.status(), StatusCode::OK);
    assert_eq!(
        call(&svc, other()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    Ok(())
}

// ---- 15: exemptions ----

/// An exempt request skips every limit before any key is read and consumes nothing.
#[tokio::test]
async fn exempt_requests_skip_every_limit_before_any_key_is_read() -> Result<(), BoxError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let keys_read = Arc::new(AtomicUsize::new(0));
    let counted = keys_read.clone();
    let user = key::from_fn(move |head| {
        counted.fetch_add(1, Ordering::SeqCst);
        head.headers().get("user-id").map(|v| v.as_bytes().to_vec())
    });
    let layer = RateLimitLayer::builder()
        .limiter(limiter())
        .limit(Limit::new(
            Rule::fixed_window("per-user", 1, Duration::from_secs(60)),
            user,
        ))
        .exempt(|head| head.uri().path() == "/health")
        .exempt(|head| head.headers().get("x-api-key").is_some_and(|k| k == "ops"))
        .build()?;
    let svc = with(layer);

    // Health checks pass without a user id (the limit's key would be missing: a 400) and
    // without the extractor running at all.
    for _ in 0..3 {
        let health = Request::get("/health").body(String::new())?;
        assert_eq!(call(&svc, health).await.status(), StatusCode::OK);
    }
    let ops = || {
        Request::get("/")
            .header("user-id", "u1")
            .header("x-api-key", "ops")
            .body(String::new())
            .unwrap()
    };
    assert_eq!(call(&svc, ops()).await.status(), StatusCode::OK);
    assert_eq!(call(&svc, ops()).await.status(), StatusCode::OK);
    assert_eq!(keys_read.load(Ordering::SeqCst), 0);

    // Exempt requests consumed nothing: u1's one request a minute is still there.
    let user = || {
        Request::get("/")
            .header("user-id", "u1")
            .body(String::new())
            .unwrap()
    };
    assert_eq!(call(&svc, user()).await.status(), StatusCode::OK);
    assert_eq!(
        call(&svc, user()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let missing = Request::get("/").body(String::new())?;
    assert_eq!(call(&svc, missing).await.status(), StatusCode::BAD_REQUEST);
    Ok(())
}

// ---- 11 + 16: shadow limits in the batch, not in the headers ----

/// A store that counts its round trips.
#[derive(Clone)]
struct Counted {
    inner: MemoryStore,
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Store for Counted {
    async fn check(
        &self,
        batch: &[tollgate::Check<'_>],
        max_wait: Duration,
    ) -> Result<tollgate::Outcome, tollgate::StoreError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.check(batch, max_wait).await
    }
    async fn lease(
        &self,
        check: tollgate::Check<'_>,
        term: Duration,
        ending: Option<(&tollgate::Outcome, u64)>,
    ) -> Result<tollgate::Outcome, tollgate::StoreError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.lease(check, term, ending).await
    }
    async fn peek(
        &self,
        check: tollgate::Check<'_>,
    ) -> Result<tollgate::RuleOutcome, tollgate::StoreError> {
        self.inner.peek(check).await
    }
    async fn reset(
        &self,
        rule: &Rule,
        key: &tollgate::StoredKey<'_>,
    ) -> Result<(), tollgate::StoreError> {
        self.inner.reset(rule, key).await
    }
    async fn refund(
        &self,
        _: &[tollgate::Check<'_>],
        _: &tollgate::Outcome,
    ) -> Result<(), tollgate::StoreError> {
        Ok(())
    }
    async fn overdraw(&self, batch: &[tollgate::Check<'_>]) -> Result<(), tollgate::StoreError> {
        self.inner.overdraw(batch).await
    }
    async fn count_denials(
        &self,
        batch: &[tollgate::Check<'_>],
        ago: std::time::Duration,
    ) -> Result<(), tollgate::StoreError> {
        self.inner.count_denials(batch, ago).await
    }
    fn health(&self) -> tollgate::store::Health {
        self.inner.health()
    }
}

/// A shadow limit is decided in the same store round trip as the enforced ones, reported to
/// the decision hook as a trial, and never refuses a request nor appears in the headers.
#[tokio::test]
async fn a_shadow_limit_is_decided_in_the_same_round_trip_and_never_enforced_or_advertised(
) -> Result<(), BoxError> {
    use crate::support::service::Watch;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use tollgate::layer::DecisionEvent;

    let calls = Arc::new(AtomicUsize::new(0));
    let store = Counted {
        inner: MemoryStore::with_clock(ManualClock::new(crate::support::EPOCH)),
        calls: calls.clone(),
    };
    // Per event: the trial rule's own decision, and whether the hook saw it as a trial.
    let seen: Arc<Mutex<Vec<(bool, bool, bool)>>> = Arc::default();
    let record = seen.clone();
    let layer = RateLimitLayer::builder()
        .limiter(Limiter::new(store))
        .limit(Limit::new(
            Rule::fixed_window("enforced", 3, Duration::from_secs(60)),
            key::global(),
        ))
        .limit(
            Limit::new(
                Rule::fixed_window("trial", 1, Duration::from_secs(60)),
                key::global(),
            )
            .shadow(),
        )
        .headers_on_allowed(true)
        .observe(Watch(move |event: &DecisionEvent<'_>| {
            let rule = |name| event.rules.iter().find(|r| r.rule.name() == name);
            let trial = rule("trial").expect("the trial rule is reported");
            let enforced = rule("enforced").unwrap();
            record.lock().unwrap().push((
                trial.outcome.unwrap().decision.is_admitted(),
                trial.shadow,
                enforced.shadow,
            ));
        }))
        .build()?;
    let svc = with(layer);

    for _ in 0..3 {
        let res = call(&svc, Request::get("/").body(String::new())?).await;
        // The trial rule denies from the second request on, and nobody is refused for it.
        assert_eq!(res.status(), StatusCode::OK);
        assert!(header(&res, "ratelimit-policy").starts_with("\"enforced\";q=3;w=60"));
        assert!(!header(&res, "ratelimit-policy").contains("trial"));
        assert!(!header(&res, "ratelimit").contains("trial"));
    }
    let denied = call(&svc, Request::get("/").body(String::new())?).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "ratelimit-policy"), "\"enforced\";q=3;w=60");
    assert!(header(&denied, "ratelimit").starts_with("\"enforced\";r=0;t="));

    // One round trip per request, the trial rule included.
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            (true, true, false),
            (false, true, false),
            (false, true, false),
            (false, true, false)
        ]
    );
    Ok(())
}

/// A request the enforced limits deny consumes nothing of a shadow limit.
#[tokio::test]
async fn a_request_the_enforced_limits_deny_consumes_nothing_of_a_shadow_limit(
) -> Result<(), BoxError> {
    let limiter = limiter();
    let trial = Rule::fixed_window("trial", 10, Duration::from_secs(60));
    let layer = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(Limit::new(
            Rule::fixed_window("enforced", 1, Duration::from_secs(60)),
            key::global(),
        ))
        .limit(Limit::new(trial.clone(), key::global()).shadow())
        .build()?;
    let svc = with(layer);
    assert_eq!(
        call(&svc, Request::get("/").body(String::new())?)
            .await
            .status(),
        StatusCode::OK
    );
    for _ in 0..3 {
        let res = call(&svc, Request::get("/").body(String::new())?).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    // Only the admitted request counted against the trial rule.
    let left = limiter.peek(&trial, b"global", 0).await?;
    assert_eq!(left.info.remaining, 9);
    Ok(())
}

// ---- 18: logs that cannot flood ----

/// A store outage is logged once per interval, with a summary counting the suppressed
/// failures and the last error, so a failing store cannot flood the logs.
#[tokio::test(start_paused = true)]
async fn a_store_outage_logs_once_per_interval_with_a_count() -> Result<(), BoxError> {
    let captured = Captured::default();
    let _guard = tracing::subscriber::set_default(captured.clone());
    let svc = with(
        RateLimitLayer::builder()
            .limiter(Limiter::new(Down))
            .limit(one_per_minute("x")?)
            .log_interval(Duration::from_secs(10))
            .build()?,
    );
    let get = || Request::get("/").body(String::new()).unwrap();

    for _ in 0..100 {
        assert_eq!(call(&svc, get()).await.status(), StatusCode::OK);
    }
    let lines = captured.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("WARN rate limit store failed"),
        "{lines:?}"
    );
    assert!(lines[0].contains("suppressed=0"), "{lines:?}");
    assert!(lines[0].contains("connection refused"), "{lines:?}");

    tokio::time::advance(Duration::from_secs(5)).await;
    call(&svc, get()).await;
    assert!(captured.lines().is_empty());
    tokio::time::advance(Duration::from_secs(5)).await;
    // The summary task, woken at the interval's end, runs before the next request.
    tokio::task::yield_now().await;
    for _ in 0..10 {
        call(&svc, get()).await;
    }
    // The interval ended with 100 failures left out: its summary, with the last error.
    let lines = captured.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("WARN rate limit store failed again (summary"),
        "{lines:?}"
    );
    assert!(lines[0].contains("suppressed=100"), "{lines:?}");
    assert!(lines[0].contains("connection refused"), "{lines:?}");

    // The outage's tail: the 10 failures after the summary are reported when the next
    // interval ends, though no request comes to carry them.
    tokio::time::advance(Duration::from_secs(10)).await;
    tokio::task::yield_now().await;
    let lines = captured.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("summary"), "{lines:?}");
    assert!(lines[0].contains("suppressed=10"), "{lines:?}");
    assert!(
        lines[0].contains("last_error=rate limit store unavailable: connection refused"),
        "{lines:?}"
    );

    // Then quiet: the next failure is logged at once.
    tokio::time::advance(Duration::from_secs(60)).await;
    tokio::task::yield_now().await;
    assert!(captured.lines().is_empty());
    call(&svc, get()).await;
    let lines = captured.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("suppressed=0"), "{lines:?}");
    Ok(())
}

/// A shadow limit's would-be denials are logged once per interval with a count of those
/// suppressed.
#[tokio::test(start_paused = true)]
async fn a_shadow_rollout_logs_its_denials_once_per_interval() -> Result<(), BoxError> {
    let captured = Captured::default();
    let _guard = tracing::subscriber::set_default(captured.clone());
    let svc = with(
        RateLimitLayer::builder()
            .limiter(limiter())
            .limit(Limit::new(
                Rule::fixed_window("wide", 1000, Duration::from_secs(60)),
                key::global(),
            ))
            .limit(one_per_minute("trial")?.shadow())
            .build()?,
    );
    for _ in 0..50 {
        let res = call(&svc, Request::get("/").body(String::new())?).await;
        assert_eq!(res.status(), StatusCode::OK);
    }
    let lines = captured.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("shadow limit: request would be rate limited"),
        "{lines:?}"
    );
    assert!(lines[0].contains("rule=\"trial\""), "{lines:?}");

    tokio::time::advance(Duration::from_secs(10)).await;
    call(&svc, Request::get("/").body(String::new())?).await;
    let lines = captured.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("suppressed=48"), "{lines:?}");
    Ok(())
}

/// A shadow limit whose key is missing never refuses the request.
#[tokio::test]
async fn a_shadow_limit_without_a_key_never_refuses() -> Result<(), BoxError> {
    let svc = with(
        RateLimitLayer::builder()
            .limiter(limiter())
            .limit(one_per_minute("enforced")?.on_missing_key(tollgate::layer::MissingKey::Skip))
            .limit(
                Limit::new(
                    Rule::fixed_window("trial", 1, Duration::from_secs(60)),
                    key::header("user-id"),
                )
                .shadow(),
            )
            .build()?,
    );
    let res = call(&svc, Request::get("/").body(String::new())?).await;
    assert_eq!(res.status(), StatusCode::OK);
    Ok(())
}

/// A route key gives every request no route matched one key, however many paths clients
/// invent: 1,000 distinct unknown paths make one entry in the store, not 1,000.
#[tokio::test]
async fn unmatched_paths_share_one_route_key() -> Result<(), BoxError> {
    let store = MemoryStore::new();
    let layer = RateLimitLayer::builder()
        .limiter(Limiter::new(store.clone()))
        .limit(Limit::new(
            Rule::fixed_window("per-route", 1_000_000, Duration::from_secs(3600)),
            key::route(),
        ))
        .build()?;
    let svc = with(layer);
    for i in 0..1_000 {
        let request = Request::get(format!("/no/such/path/{i}")).body(String::new())?;
        assert_eq!(call(&svc, request).await.status(), StatusCode::OK);
    }
    assert_eq!(store.stats().keys, 1);
    Ok(())
}

/// A flood of requests that lock throw-away names fills a bounded store with locked keys:
/// with the layer's default failure policy, a new user is still held to her limit (the
/// store denies a key it has no room for), and each such refusal is counted.
#[tokio::test]
async fn a_store_full_of_locked_keys_admits_nobody_past_a_limit() -> Result<(), BoxError> {
    let store = MemoryStore::with_clock(ManualClock::new(crate::support::EPOCH)).max_keys(64);
    let login = Rule::fixed_window("login", 2, Duration::from_secs(3600))
        .with_penalty(tollgate::Penalty::lock_for(Duration::from_secs(900)));
    let svc = with(
        RateLimitLayer::builder()
            .limiter(Limiter::new(store.clone()))
            .limit(Limit::new(login, key::header("user")))
            .build()?,
    );
    let as_user = |user: &str| {
        Request::get("/")
            .header("user", user)
            .body(String::new())
            .unwrap()
    };
    for i in 0..3_000 {
        for _ in 0..3 {
            call(&svc, as_user(&format!("throw-away-{i}"))).await;
        }
    }
    let mut admitted = 0;
    for _ in 0..1_000 {
        admitted += usize::from(call(&svc, as_user("alice")).await.status() == StatusCode::OK);
    }
    assert!(admitted <= 2, "{admitted} of 1,000 admitted");
    for i in 0..100 {
        let user = format!("newcomer-{i}");
        let mut ok = 0;
        for _ in 0..3 {
            ok += usize::from(call(&svc, as_user(&user)).await.status() == StatusCode::OK);
        }
        assert!(ok <= 2, "{user}: {ok} of 3 admitted");
    }
    assert!(store.stats().refusals > 0);
    Ok(())
}
