//! The quickstart app over real TCP: statuses, Retry-After, RateLimit headers, and a retry
//! at Retry-After that passes.

#[path = "../../examples/quickstart.rs"]
#[allow(dead_code)]
mod quickstart;

use std::time::Duration;

use crate::support::{client_from, request, send, serve_axum};
use http::StatusCode;
use tollgate::{store::MemoryStore, Limiter};

/// A route's limit answers 429 with `Retry-After` and `RateLimit` headers, a refusal takes
/// nothing from the global limit in the same batch, and a retry at `Retry-After` passes.
#[tokio::test]
async fn a_route_limit_answers_429_with_headers_and_a_retry_at_retry_after_passes() {
    let addr = serve_axum(quickstart::app(Limiter::new(MemoryStore::new())).unwrap()).await;
    let client = client_from("127.0.0.1");
    let report = || request(addr, "POST", "/report", &[]);

    let mut global_left = u64::MAX;
    for remaining in [2, 1, 0] {
        let reply = send(&client, report()).await;
        global_left = left(&reply.header("ratelimit"), "per-ip");
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        assert_eq!(reply.body, "report queued\n");
        assert!(reply
            .header("ratelimit-policy")
            .contains("\"report\";q=3;w=3"));
        assert!(
            reply
                .header("ratelimit")
                .contains(&format!("\"report\";r={remaining};t=")),
            "{reply:?}"
        );
        assert!(reply.headers.get("retry-after").is_none());
    }

    let denied = send(&client, report()).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS, "{denied:?}");
    assert_eq!(denied.retry_after(), 1);
    assert_eq!(denied.body, "rate limit exceeded; retry after 1 s\n");
    assert!(denied.header("ratelimit").contains("\"report\";r=0;t="));
    // The global limit is in the same batch and the same lists, and the refused report
    // consumed none of it (with a route layer inside a global one, it would have).
    assert!(denied
        .header("ratelimit-policy")
        .contains("\"per-ip\";q=20;w=2"));
    let global_after = left(&denied.header("ratelimit"), "per-ip");
    assert!(
        global_after >= global_left,
        "{global_after} < {global_left}: {denied:?}"
    );

    // Other routes are not limited by the route's rule.
    let hello = send(&client, request(addr, "GET", "/", &[])).await;
    assert_eq!(hello.status, StatusCode::OK);

    tokio::time::sleep(Duration::from_secs(denied.retry_after())).await;
    let again = send(&client, report()).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
}

/// A Redis the quickstart cannot use stops it before it listens: the store is connected
/// while the app is built, and the error reads as a sentence.
#[tokio::test]
async fn the_quickstart_connects_to_redis_before_it_listens() {
    let Err(error) = quickstart::app_for(Some("not a redis url")).await else {
        panic!("an app on a Redis that cannot be reached");
    };
    let printed = format!("{error:?}");
    assert!(
        printed.starts_with("rate limit store misconfigured: invalid redis URL"),
        "{printed}"
    );
    assert!(quickstart::app_for(None).await.is_ok());
}

/// The `r` of `rule` in a `RateLimit` header.
fn left(header: &str, rule: &str) -> u64 {
    let item = header
        .split(", ")
        .find(|item| item.starts_with(&format!("\"{rule}\";")))
        .unwrap_or_else(|| panic!("no {rule} in {header:?}"));
    let r = item.split(';').find_map(|p| p.strip_prefix("r="));
    r.and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no r in {item:?}"))
}

/// The global limit counts per peer address: one address exhausting its burst does not
/// refuse another.
#[tokio::test]
async fn the_global_limit_is_per_peer_address() {
    let addr = serve_axum(quickstart::app(Limiter::new(MemoryStore::new())).unwrap()).await;
    let noisy = client_from("127.0.0.1");
    let mut first_denial = None;
    for i in 0..60 {
        let reply = send(&noisy, request(addr, "GET", "/", &[])).await;
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            first_denial = Some((i, reply));
            break;
        }
    }
    let (i, reply) = first_denial.expect("the burst of 20 was never exhausted");
    assert!(i >= 20, "denied after {i} requests, before the burst of 20");
    assert!(reply.retry_after() >= 1);
    assert!(reply.header("ratelimit").contains("\"per-ip\";r=0"));

    // Another address is a different client.
    let quiet = client_from("127.0.0.2");
    let reply = send(&quiet, request(addr, "GET", "/", &[])).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
}

#[path = "../../examples/axum_routes.rs"]
#[allow(dead_code)]
mod axum_routes;

/// Each route of the axum routes example is limited its own way: stacked SMS windows,
/// downloads charged by the server's size, a login lockout and a shadow rule that never
/// refuses.
#[tokio::test]
async fn the_axum_routes_example_limits_each_route_its_own_way() {
    let addr = serve_axum(axum_routes::app(Limiter::new(MemoryStore::new())).unwrap()).await;
    let client = client_from("127.0.0.3");
    let user = &[("user-id", &b"42"[..])];

    // SMS: one per minute; the refused one reports the hour and day untouched.
    let sms = || request(addr, "POST", "/sms/send", user);
    assert_eq!(send(&client, sms()).await.status, StatusCode::OK);
    let denied = send(&client, sms()).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert!((1..=60).contains(&denied.retry_after()));
    let state = denied.header("ratelimit");
    assert!(state.contains("\"sms-minute\";r=0;"), "{state}");
    assert!(state.contains("\"sms-hour\";r=4;"), "{state}");
    assert!(state.contains("\"sms-day\";r=9;"), "{state}");
    // No user id: a clear 400.
    let reply = send(&client, request(addr, "POST", "/sms/send", &[])).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);

    // Downloads cost their size as the server knows it; what the client writes is ignored.
    let file = |path: &str| request(addr, "GET", path, user);
    let ok = send(&client, file("/files/a.iso?size_mb=0")).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert!(ok.header("ratelimit").contains("\"download-mb\";r=100;"));
    assert_eq!(
        send(&client, file("/files/a.iso?size_mb=0")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The name the handler serves, however it is encoded, costs that file's size.
    assert_eq!(
        send(&client, file("/files/%61.iso")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // An empty file is served (what it costs is clamped to at least 1: see `min_cost`).
    let reply = send(&client, file("/files/empty.txt")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, "0 bytes of empty.txt\n");
    assert_eq!(
        send(&client, file("/files/nothing-here")).await.status,
        StatusCode::NOT_FOUND
    );

    // Login: 5 attempts, then refusals; the third refusal locks for 15 minutes.
    let login = || request(addr, "POST", "/login", &[]);
    for _ in 0..5 {
        assert_eq!(send(&client, login()).await.status, StatusCode::OK);
    }
    let first = send(&client, login()).await;
    assert!(first.retry_after() <= 60);
    send(&client, login()).await;
    let locked = send(&client, login()).await;
    assert_eq!(locked.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(locked.retry_after(), 900);
    assert!(locked.body.contains("locked out"), "{}", locked.body);

    // Search: the shadow rule never refuses.
    for _ in 0..6 {
        let reply = send(&client, request(addr, "GET", "/search", user)).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
}

/// A route key counts by axum's matched path, so every path that reaches one route shares
/// its limit.
#[tokio::test]
async fn a_route_key_reads_axums_matched_path() {
    use axum::routing::get;
    use tollgate::layer::{Limit, RateLimitLayer};
    use tollgate::{key, Rule};

    let per_route = RateLimitLayer::builder()
        .limit(Limit::new(
            Rule::fixed_window("route", 1, Duration::from_secs(60)),
            key::route(),
        ))
        .build()
        .unwrap();
    let app = axum::Router::new()
        .route("/files/{id}", get(|| async { "file" }))
        .route("/other", get(|| async { "other" }))
        .layer(per_route);
    let addr = serve_axum(app).await;
    let client = client_from("127.0.0.1");
    let get = |path: &str| request(addr, "GET", path, &[]);

    assert_eq!(send(&client, get("/files/1")).await.status, StatusCode::OK);
    // Another id is the same route: `/files/{id}`.
    assert_eq!(
        send(&client, get("/files/2")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&client, get("/other")).await.status, StatusCode::OK);
}

/// Concurrent connections, each with its own clone of the service, share one exact limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_connections_share_one_exact_limit() {
    use axum::routing::get;
    use tollgate::layer::{Limit, RateLimitLayer};
    use tollgate::{key, Rule};

    // Each connection gets its own clone of the service; all of them count together.
    let layer = RateLimitLayer::builder()
        .limit(Limit::new(
            Rule::sliding_log("global", 10, Duration::from_secs(60)),
            key::global(),
        ))
        .build()
        .unwrap();
    let addr = serve_axum(
        axum::Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            tokio::spawn(async move {
                // A new client (and connection pool) per request, from four addresses.
                let client = client_from(&format!("127.0.0.{}", 1 + i % 4));
                send(&client, request(addr, "GET", "/", &[])).await.status
            })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        match task.await.unwrap() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(ok, 10);
}

/// Statuses of two SMS sent to `/api/sms/send` on a router nested under `/api`, whose
/// layer's route table limits `pattern` to one a minute.
async fn two_sms_through_a_nested_router(pattern: &str) -> [StatusCode; 2] {
    use axum::body::Body;
    use axum::routing::post;
    use tollgate::layer::{Limit, RateLimitLayer};
    use tollgate::{key, Rule};
    use tower::ServiceExt;

    let table = RateLimitLayer::builder()
        .route(
            pattern,
            [Limit::new(
                Rule::fixed_window("sms", 1, Duration::from_secs(60)),
                key::global(),
            )],
        )
        .build()
        .unwrap();
    let inner = axum::Router::new()
        .route("/sms/send", post(|| async { "sent" }))
        .layer(table);
    let app = axum::Router::new().nest("/api", inner);
    let sms = || {
        http::Request::post("/api/sms/send")
            .body(Body::empty())
            .unwrap()
    };
    let first = app.clone().oneshot(sms()).await.unwrap().status();
    let second = app.oneshot(sms()).await.unwrap().status();
    [first, second]
}

/// A route table on a nested router matches the full path the client sent.
#[tokio::test]
async fn a_route_table_on_a_nested_router_matches_the_full_path() {
    let statuses = two_sms_through_a_nested_router("POST /api/sms/send").await;
    assert_eq!(statuses, [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
}

/// A route table written with the nested router's own paths limits too: a path the full
/// path matches no entry for is matched as the nested router sees it.
#[tokio::test]
async fn a_route_table_in_the_nested_routers_own_paths_limits() {
    let statuses = two_sms_through_a_nested_router("POST /sms/send").await;
    assert_eq!(statuses, [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
}

/// A table holding a strict route in the nested router's own paths and a catch-all applies
/// the strict route: the catch-all matching the full path does not hide it.
#[tokio::test]
async fn a_catch_all_on_a_nested_router_does_not_hide_its_strict_route() {
    use axum::body::Body;
    use axum::routing::post;
    use tollgate::layer::{Limit, RateLimitLayer};
    use tollgate::{key, Rule};
    use tower::ServiceExt;

    for catch_all in ["/{*rest}", "/*"] {
        let minute = Duration::from_secs(60);
        let table = RateLimitLayer::builder()
            .route(
                "POST /sms/send",
                [Limit::new(
                    Rule::fixed_window("sms", 1, minute),
                    key::global(),
                )],
            )
            .route(
                catch_all,
                [Limit::new(
                    Rule::fixed_window("any", 100, minute),
                    key::global(),
                )],
            )
            .build()
            .unwrap();
        let inner = axum::Router::new()
            .route("/sms/send", post(|| async { "sent" }))
            .layer(table);
        let app = axum::Router::new().nest("/api", inner);
        let mut sent = 0;
        for _ in 0..10 {
            let sms = http::Request::post("/api/sms/send").body(Body::empty());
            let status = app.clone().oneshot(sms.unwrap()).await.unwrap().status();
            sent += usize::from(status == StatusCode::OK);
        }
        assert_eq!(sent, 1, "{catch_all}: the strict route applies");
    }
}

/// The route table follows axum's precedence, not the order it is written in: a static
/// segment wins over a parameter, so `/sms/premium/send` is limited as the premium route
/// it reaches, although the route with a parameter is declared first.
#[tokio::test]
async fn the_route_table_takes_the_routers_precedence() {
    use axum::body::Body;
    use axum::routing::post;
    use tollgate::layer::{Limit, RateLimitLayer};
    use tollgate::{key, Rule};
    use tower::ServiceExt;

    let minute = Duration::from_secs(60);
    let table = RateLimitLayer::builder()
        .route(
            "POST /sms/{provider}/send",
            [Limit::new(
                Rule::fixed_window("sms", 100, minute),
                key::global(),
            )],
        )
        .route(
            "POST /sms/premium/{action}",
            [Limit::new(
                Rule::fixed_window("premium", 1, minute),
                key::global(),
            )],
        )
        .build()
        .unwrap();
    let app = axum::Router::new()
        .route("/sms/{provider}/send", post(|| async { "sent" }))
        .route("/sms/premium/{action}", post(|| async { "premium" }))
        .layer(table);
    let premium = || {
        http::Request::post("/sms/premium/send")
            .body(Body::empty())
            .unwrap()
    };
    let first = app.clone().oneshot(premium()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let second = app.clone().oneshot(premium()).await.unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    let other = http::Request::post("/sms/acme/send")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.oneshot(other).await.unwrap().status(), StatusCode::OK);
}
