//! Lockouts of limits charged by outcome (`Charge::failures()` with a `Penalty`): a refusal
//! beside requests in flight counts once they settle, or at a deadline; the registry that
//! keeps them waiting outlives a reload.

use std::time::Duration;

use axum::routing::post;
use axum::Router;
use http::{Request, Response, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio::task::JoinSet;
use tollgate::layer::{Charge, Limit, RateLimitLayer, RateLimitLayerBuilder};
use tollgate::{key, store::MemoryStore, DenyReason, Limiter, Penalty, Rule};
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, Layer, ServiceExt};

use crate::support::{client_from, request, send, serve_axum};

type Svc = BoxCloneService<Request<String>, Response<String>, BoxError>;

/// Three failed logins per 15 minutes, locked for an hour at the first refusal.
fn guarded() -> Rule {
    Rule::fixed_window("guarded-logins", 3, Duration::from_secs(900))
        .with_penalty(Penalty::lock_for(Duration::from_secs(3600)))
}

fn configure(builder: RateLimitLayerBuilder) -> RateLimitLayerBuilder {
    builder.route(
        "POST /login",
        [Limit::new(guarded(), key::header("user")).charge(Charge::failures())],
    )
}

/// A login that takes 300 ms: `right` signs in, anything else is refused (401).
fn login(layer: &RateLimitLayer) -> Svc {
    BoxCloneService::new(layer.layer(service_fn(|req: Request<String>| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut response = Response::new(String::new());
        if req.body() != "right" {
            *response.status_mut() = StatusCode::UNAUTHORIZED;
        }
        Ok::<_, BoxError>(response)
    })))
}

fn attempt(password: &str) -> Request<String> {
    Request::post("/login")
        .header("user", "alice")
        .body(password.to_owned())
        .unwrap()
}

/// Successful logins in flight hold the quota, and a reload comes while they do: the
/// logins refused after it are refused only for units the successes give back, so they
/// count towards no lock, under the new configuration as under the old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_in_a_burst_of_successful_logins_locks_nobody_out() -> Result<(), BoxError> {
    let limiter = Limiter::new(MemoryStore::new());
    let (layer, handle) = configure(RateLimitLayer::builder().limiter(limiter.clone()))
        .build()?
        .reloadable();
    let svc = login(&layer);
    let mut burst = JoinSet::new();
    for _ in 0..3 {
        let svc = svc.clone();
        burst.spawn(async move { svc.oneshot(attempt("right")).await.map(|r| r.status()) });
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    handle.reload(configure(handle.builder()).build()?);
    for _ in 0..5 {
        let svc = svc.clone();
        burst.spawn(async move { svc.oneshot(attempt("right")).await.map(|r| r.status()) });
    }
    let mut seen = Vec::new();
    while let Some(status) = burst.join_next().await {
        seen.push(status??);
    }
    assert_eq!(
        seen.iter().filter(|s| **s == StatusCode::OK).count(),
        3,
        "{seen:?}"
    );
    // The refusals' counts have run once the successes settled.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let peeked = limiter.peek(&guarded(), b"alice", 1).await?;
    assert_ne!(
        peeked.decision.denial().map(|d| d.reason),
        Some(DenyReason::Locked),
        "locked out by successful logins"
    );
    assert_eq!(
        svc.oneshot(attempt("right")).await?.status(),
        StatusCode::OK
    );
    Ok(())
}

/// A client holds one login open (its body never arrives) and guesses beside it: the
/// refusals it gets wait for the held login to settle, which it never does. They count
/// at their deadline all the same, and lock the key as guesses without the held login
/// would: 3 attempts a minute, locked for 15 minutes after 2 refusals in 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_held_open_does_not_keep_refusals_from_counting() -> Result<(), BoxError> {
    let rule = Rule::fixed_window("logins", 3, Duration::from_secs(60)).with_penalty(
        Penalty::lock_for(Duration::from_secs(900))
            .after(2)
            .within(Duration::from_secs(600)),
    );
    let layer = RateLimitLayer::builder()
        .route(
            "POST /login",
            [Limit::new(rule, key::header("user")).charge(Charge::failures())],
        )
        .build()?;
    let app = Router::new()
        .route(
            "/login",
            post(|body: String| async move {
                match body.as_str() {
                    "right" => StatusCode::OK,
                    _ => StatusCode::UNAUTHORIZED,
                }
            }),
        )
        .layer(layer);
    let addr = serve_axum(app).await;

    // The held login: its head is sent, its body never is.
    let mut held = tokio::net::TcpStream::connect(addr).await?;
    held.write_all(b"POST /login HTTP/1.1\r\nhost: x\r\nuser: alice\r\ncontent-length: 64\r\n\r\n")
        .await?;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let client = client_from("127.0.0.1");
    let guess = |password: &'static str| {
        let mut req = request(addr, "POST", "/login", &[("user", b"alice")]);
        *req.body_mut() = http_body_util::Full::new(bytes::Bytes::from(password));
        req
    };
    for _ in 0..2 {
        assert_eq!(
            send(&client, guess("wrong")).await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    for _ in 0..2 {
        assert_eq!(
            send(&client, guess("wrong")).await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let reply = send(&client, guess("right")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        reply.retry_after() > 60,
        "the key is not locked out: {reply:?}"
    );
    drop(held);
    Ok(())
}
