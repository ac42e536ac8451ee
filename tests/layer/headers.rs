//! What the layer tells a client, through the real layer: `RateLimit`'s `t` agrees with
//! `Retry-After`, a lock is reported as a lock, server-side advice stays on the server, the
//! fail-closed 503 says when to retry, gRPC is told from grpc-web and plain HTTP by its exact
//! content type, and a custom rejection sees the request head.

#[path = "../../examples/quickstart.rs"]
#[allow(dead_code)]
mod quickstart;

use std::convert::Infallible;
use std::time::Duration;

use crate::support::down::Down;
use crate::support::service::{call, header, with, Svc};
use crate::support::{client_from, request, send, serve_axum};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tollgate::layer::{FailurePolicy, Limit, RateLimitLayer};
use tollgate::{key, store::MemoryStore, Limiter, ManualClock, Penalty, Rate, Rule};
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};

fn clock() -> ManualClock {
    // On an hour boundary, so fixed windows start now.
    ManualClock::new(1_699_999_200_000_000)
}

async fn body(res: Response<String>) -> String {
    let bytes = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The `t` of the rule that refused a request equals `Retry-After`: the time until the next
/// request may pass, not until the quota is full.
#[tokio::test]
async fn on_the_quickstart_report_the_deciding_rules_t_is_retry_after() {
    let addr = serve_axum(quickstart::app(Limiter::new(MemoryStore::new())).unwrap()).await;
    let client = client_from("127.0.0.1");
    for _ in 0..3 {
        let reply = send(&client, request(addr, "POST", "/report", &[])).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    }
    let denied = send(&client, request(addr, "POST", "/report", &[])).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS, "{denied:?}");
    assert_eq!(denied.retry_after(), 1);
    // One token comes back per second: the next request may pass in 1 s, not in the 3 s
    // it takes the bucket to fill.
    assert!(
        denied.header("ratelimit").contains("\"report\";r=0;t=1"),
        "{denied:?}"
    );
}

/// The legacy reset header names the wait of the rule that decided the refusal, not of the
/// rule with the fewest units left.
#[tokio::test]
async fn the_legacy_reset_names_the_rule_that_decided_the_retry() -> Result<(), BoxError> {
    // "uploads" denies (a cost of 3 against the 2 units left this hour); "burst" would
    // admit with less left (1), and so looked like the tightest rule.
    let layer = RateLimitLayer::builder()
        .limiter(Limiter::new(MemoryStore::with_clock(clock())))
        .limit(Limit::new(
            Rule::token_bucket("burst", 2, Rate::per_second(1)),
            key::global(),
        ))
        .limit(
            Limit::new(
                Rule::fixed_window("uploads", 5, Duration::from_secs(3600)),
                key::global(),
            )
            .cost(|_| 3),
        )
        .legacy_headers(true)
        .build()?;
    let svc = with(layer);
    let get = || Request::get("/").body(String::new()).unwrap();
    assert_eq!(call(&svc, get()).await.status(), StatusCode::OK);
    let denied = call(&svc, get()).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "retry-after"), "3600");
    assert_eq!(header(&denied, "x-ratelimit-limit"), "5");
    assert_eq!(header(&denied, "x-ratelimit-remaining"), "2");
    assert_eq!(header(&denied, "x-ratelimit-reset"), "3600");
    let state = header(&denied, "ratelimit");
    assert!(state.contains("\"uploads\";r=2;t=3600"), "{state}");
    assert!(state.contains("\"burst\";r=1;t=1"), "{state}");
    Ok(())
}

/// An outer layer keeps the legacy headers of an inner layer's rejection and lists both
/// layers' rules in `RateLimit`.
#[tokio::test]
async fn an_outer_layer_keeps_the_legacy_headers_of_an_inner_rejection() -> Result<(), BoxError> {
    let limiter = Limiter::new(MemoryStore::with_clock(clock()));
    let outer = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(Limit::new(
            Rule::token_bucket("global", 100, Rate::per_second(1)),
            key::global(),
        ))
        .headers_on_allowed(true)
        .legacy_headers(true)
        .build()?;
    let inner = RateLimitLayer::builder()
        .limiter(limiter)
        .limit(Limit::new(
            Rule::fixed_window("route", 1, Duration::from_secs(60)),
            key::global(),
        ))
        .legacy_headers(true)
        .build()?;
    let svc = ServiceBuilder::new()
        .layer(outer)
        .layer(inner)
        .service(service_fn(|_req: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::from("ok")))
        }));
    let get = || Request::get("/").body(String::new()).unwrap();
    assert_eq!(svc.clone().oneshot(get()).await?.status(), StatusCode::OK);
    let denied = svc.oneshot(get()).await?;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "retry-after"), "60");
    assert_eq!(header(&denied, "x-ratelimit-limit"), "1");
    assert_eq!(header(&denied, "x-ratelimit-reset"), "60");
    // Both layers' rules are listed.
    let state = header(&denied, "ratelimit");
    assert!(state.contains("\"route\";r=0;t=60"), "{state}");
    assert!(state.contains("\"global\";r=98;"), "{state}");
    Ok(())
}

/// A key locked by a penalty is advertised as having no quota until the lock ends, even
/// once its window has turned.
#[tokio::test]
async fn a_penalty_lock_is_advertised_as_no_quota_until_the_lock_ends() -> Result<(), BoxError> {
    let clock = clock();
    let rule = Rule::fixed_window("login", 5, Duration::from_secs(60))
        .with_penalty(Penalty::lock_for(Duration::from_secs(900)));
    let layer = RateLimitLayer::builder()
        .limiter(Limiter::new(MemoryStore::with_clock(clock.clone())))
        .limit(Limit::new(rule, key::global()))
        .legacy_headers(true)
        .build()?;
    let svc = with(layer);
    let login = || Request::post("/login").body(String::new()).unwrap();
    for _ in 0..5 {
        assert_eq!(call(&svc, login()).await.status(), StatusCode::OK);
    }
    // The sixth is refused and locks the key for 900 s.
    assert_eq!(
        call(&svc, login()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // A minute on, the window has turned and its quota is whole, but the lock holds.
    clock.advance(Duration::from_secs(60));
    let locked = call(&svc, login()).await;
    assert_eq!(locked.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&locked, "retry-after"), "840");
    assert_eq!(header(&locked, "ratelimit"), "\"login\";r=0;t=840");
    assert_eq!(header(&locked, "x-ratelimit-remaining"), "0");
    assert_eq!(header(&locked, "x-ratelimit-reset"), "840");
    assert!(body(locked).await.contains("locked out"));
    Ok(())
}

/// The fail-closed 503 carries a `Retry-After` and keeps the store's error off the
/// response.
#[tokio::test]
async fn the_fail_closed_503_says_when_to_retry() -> Result<(), BoxError> {
    let layer = RateLimitLayer::builder()
        .limiter(Limiter::new(Down))
        .limit(Limit::new(
            Rule::fixed_window("x", 1, Duration::from_secs(60)),
            key::global(),
        ))
        .on_failure(FailurePolicy::FailClosed)
        .build()?;
    let svc = with(layer);
    let res = call(&svc, Request::get("/").body(String::new())?).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&res, "retry-after"), "1");
    // The store's error is the server's business.
    assert_eq!(body(res).await, "rate limiter unavailable\n");
    Ok(())
}

fn one_per_minute() -> Result<Svc, BoxError> {
    Ok(with(
        RateLimitLayer::builder()
            .limiter(Limiter::new(MemoryStore::with_clock(clock())))
            .limit(Limit::new(
                Rule::fixed_window("x", 1, Duration::from_secs(60)),
                key::global(),
            ))
            .build()?,
    ))
}

/// A request is answered as gRPC or grpc-web only when its content type is exactly one of
/// theirs; anything else, however close, gets the plain HTTP rejection.
#[tokio::test]
async fn grpc_is_told_by_its_exact_content_type() -> Result<(), BoxError> {
    let post = |content_type: &str| {
        Request::post("/a.B/C")
            .header("content-type", content_type)
            .body(String::new())
            .unwrap()
    };
    let cases = [
        ("application/grpc", StatusCode::OK, Some("application/grpc")),
        (
            "application/grpc+proto",
            StatusCode::OK,
            Some("application/grpc"),
        ),
        (
            "Application/GRPC+json",
            StatusCode::OK,
            Some("application/grpc"),
        ),
        (
            "application/grpc-web",
            StatusCode::OK,
            Some("application/grpc-web+proto"),
        ),
        (
            "application/grpc-web+proto",
            StatusCode::OK,
            Some("application/grpc-web+proto"),
        ),
        (
            "application/grpc-web-text",
            StatusCode::OK,
            Some("application/grpc-web-text+proto"),
        ),
        ("application/grpcx", StatusCode::TOO_MANY_REQUESTS, None),
        (
            "application/grpc-webby",
            StatusCode::TOO_MANY_REQUESTS,
            None,
        ),
        ("application/json", StatusCode::TOO_MANY_REQUESTS, None),
    ];
    for (content_type, status, grpc) in cases {
        let svc = one_per_minute()?;
        call(&svc, post(content_type)).await;
        let res = call(&svc, post(content_type)).await;
        assert_eq!(res.status(), status, "{content_type}");
        match grpc {
            Some(answer) => {
                assert_eq!(header(&res, "content-type"), answer, "{content_type}");
                assert_eq!(header(&res, "grpc-status"), "8", "{content_type}");
                assert!(
                    res.headers().contains_key("grpc-status-details-bin"),
                    "{content_type}"
                );
            }
            None => {
                assert!(!res.headers().contains_key("grpc-status"), "{content_type}");
                assert_eq!(header(&res, "content-type"), "text/plain; charset=utf-8");
            }
        }
    }
    Ok(())
}

/// A custom rejection sees the request head, so it can answer per route and per `Accept`,
/// and fall back to the default response elsewhere.
#[tokio::test]
async fn a_custom_rejection_answers_problem_json_per_route_and_accept() -> Result<(), BoxError> {
    let layer = RateLimitLayer::builder().limiter(Limiter::new(MemoryStore::with_clock(clock())))
        .route(
            "GET /api/*",
            [Limit::new(
                Rule::fixed_window("api", 1, Duration::from_secs(60)),
                key::global(),
            )],
        )
        .route(
            "GET /page",
            [Limit::new(
                Rule::fixed_window("page", 1, Duration::from_secs(60)),
                key::global(),
            )],
        )
        .on_reject(|rejection| {
            let request = rejection.request;
            let wants_problem = request
                .headers()
                .get("accept")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("application/problem+json"));
            if request.route() != Some("GET /api/*") || !wants_problem {
                return rejection.default_response();
            }
            let mut response = rejection.default_response();
            *response.body_mut() = Bytes::from(format!(
                "{{\"type\":\"about:blank\",\"status\":{},\"detail\":\"{}\",\"instance\":\"{} {}\"}}",
                response.status().as_u16(),
                rejection.message(),
                request.method(),
                request.uri().path(),
            ));
            response.headers_mut().insert(
                "content-type",
                http::HeaderValue::from_static("application/problem+json"),
            );
            response
        })
        .build()?;
    let svc = with(layer);
    let get = |path: &str| {
        Request::get(path)
            .header("accept", "application/problem+json")
            .body(String::new())
            .unwrap()
    };
    call(&svc, get("/api/orders")).await;
    let api = call(&svc, get("/api/orders")).await;
    assert_eq!(api.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&api, "content-type"), "application/problem+json");
    assert!(api.headers().contains_key("retry-after"));
    let json: serde_json::Value = serde_json::from_str(&body(api).await)?;
    assert_eq!(json["status"], 429);
    assert_eq!(json["instance"], "GET /api/orders");

    call(&svc, get("/page")).await;
    let page = call(&svc, get("/page")).await;
    assert_eq!(page.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&page, "content-type"), "text/plain; charset=utf-8");
    Ok(())
}

/// The headers exist so that clients slow down before a 429: admitted responses carry them
/// unless the layer is told otherwise.
#[tokio::test]
async fn admitted_responses_advertise_the_limits_by_default() -> Result<(), BoxError> {
    let layer = |headers_on_allowed: Option<bool>| {
        let builder = RateLimitLayer::builder()
            .limiter(Limiter::new(MemoryStore::with_clock(clock())))
            .limit(Limit::new(
                Rule::fixed_window("per-user", 5, Duration::from_secs(60)),
                key::global(),
            ));
        match headers_on_allowed {
            Some(yes) => builder.headers_on_allowed(yes),
            None => builder,
        }
        .build()
    };
    let get = || Request::get("/").body(String::new());

    let default = call(&with(layer(None)?), get()?).await;
    assert_eq!(default.status(), StatusCode::OK);
    assert_eq!(
        header(&default, "ratelimit-policy"),
        "\"per-user\";q=5;w=60"
    );
    assert_eq!(header(&default, "ratelimit"), "\"per-user\";r=4;t=60");

    let off = call(&with(layer(Some(false))?), get()?).await;
    assert_eq!(off.status(), StatusCode::OK);
    assert!(off.headers().get("ratelimit").is_none());
    assert!(off.headers().get("ratelimit-policy").is_none());
    Ok(())
}

/// The `RateLimit-Policy` of admitted responses is rendered once per route when the layer is
/// built; a request that does not carry every limit of its route (a key skipped) gets the
/// list of the rules it was checked against, and a trial limit is never advertised.
#[tokio::test]
async fn the_cached_policy_lists_exactly_the_rules_a_request_was_checked_against(
) -> Result<(), BoxError> {
    use tollgate::layer::MissingKey;
    let layer = RateLimitLayer::builder()
        .limiter(Limiter::new(MemoryStore::with_clock(clock())))
        .limit(Limit::new(
            Rule::fixed_window("global", 100, Duration::from_secs(60)),
            key::global(),
        ))
        .limit(
            Limit::new(
                Rule::fixed_window("trial", 1, Duration::from_secs(60)),
                key::global(),
            )
            .shadow(),
        )
        .route(
            "GET /sms",
            [Limit::new(
                Rule::fixed_window("per-user", 5, Duration::from_secs(3600)),
                key::header("user-id"),
            )
            .on_missing_key(MissingKey::Skip)],
        )
        .build()?;
    let svc = with(layer);
    let policy_and_state =
        |res: &Response<_>| (header(res, "ratelimit-policy"), header(res, "ratelimit"));

    let signed_in = call(
        &svc,
        Request::get("/sms")
            .header("user-id", "u1")
            .body(String::new())?,
    )
    .await;
    assert_eq!(
        policy_and_state(&signed_in),
        (
            "\"global\";q=100;w=60, \"per-user\";q=5;w=3600".to_owned(),
            "\"global\";r=99;t=60, \"per-user\";r=4;t=3600".to_owned()
        )
    );
    let anonymous = call(&svc, Request::get("/sms").body(String::new())?).await;
    assert_eq!(
        policy_and_state(&anonymous),
        (
            "\"global\";q=100;w=60".to_owned(),
            "\"global\";r=98;t=60".to_owned()
        )
    );
    let elsewhere = call(&svc, Request::get("/other").body(String::new())?).await;
    assert_eq!(
        policy_and_state(&elsewhere),
        (
            "\"global\";q=100;w=60".to_owned(),
            "\"global\";r=97;t=60".to_owned()
        )
    );
    Ok(())
}
