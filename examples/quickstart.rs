//! Quickstart: an axum server with a global limit per client address and a tighter limit
//! on one route, in one layer: the global limit and the route's are decided as one batch,
//! so a report the route refuses costs nothing of the global limit.
//!
//! Run `cargo run --example quickstart`, then try the printed curl line: the first three
//! reports pass, the next ones get `429 Too Many Requests` with `Retry-After` and the
//! `RateLimit-Policy` / `RateLimit` headers, and one second later a report passes again.
//! `PORT` picks the port (default 3000). With `REDIS_URL` set (e.g. `redis://127.0.0.1/`)
//! the limits live in Redis, shared by every instance of the server. For a Redis Cluster,
//! give one node's URL or several, comma-separated (`redis://h1:7000,redis://h2:7001`);
//! for TLS, `rediss://` (the server's certificate verified against the system's roots,
//! or the CA in the file `SSL_CERT_FILE` names); for Sentinel,
//! `redis+sentinel://host:26379,host2:26379/mymaster`.
//! A Redis the limits cannot work on (unreachable, a replica, a user without script
//! permissions) stops the server at start with the reason; while Redis is away later, the
//! limits are decided in this process (`store::Fallback` behind a `store::Breaker`), with no
//! wait on Redis. `RUST_LOG` picks what is logged
//! (default `info`; store failures are warnings).

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use tollgate::layer::{FailurePolicy, Limit, RateLimitLayer};
use tollgate::store::{Breaker, Fallback};
use tollgate::{
    key,
    store::{MemoryStore, RedisStore, Store},
    ConfigError, Limiter, Rate, Rule,
};

/// The application: works on any store.
pub fn app<St: Store + Clone>(limiter: Limiter<St>) -> Result<Router, ConfigError> {
    let limits = RateLimitLayer::builder()
        .limiter(limiter)
        // Everything: 20 requests per client, refilled at 10 per second.
        .limit(Limit::new(
            Rule::gcra("per-ip", 20, Rate::per_second(10)),
            key::peer_ip(),
        ))
        // POST /report is expensive: bursts of 3 per client, then 1 per second.
        .route(
            "POST /report",
            [Limit::new(
                Rule::token_bucket("report", 3, Rate::per_second(1)),
                key::peer_ip(),
            )],
        )
        // While Redis is away, decide locally (see `store::Fallback` in `main`).
        .on_failure(FailurePolicy::Fallback)
        .build()?;
    Ok(Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route(
            "/report",
            post(|| async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                "report queued\n"
            }),
        )
        .layer(limits))
}

/// Serves `app` on `listener` with the peer address in each request (for `key::peer_ip`).
pub async fn serve(listener: tokio::net::TcpListener, app: Router) -> std::io::Result<()> {
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

/// Connects to Redis at `url` (one server, a Sentinel deployment, or a Cluster through one
/// or several of its nodes) and says which it found; any reason the limits could not work there is an error.
#[allow(dead_code)] // Tests include this file for `app` and `serve`.
async fn connect_redis(url: &str) -> Result<RedisStore, tollgate::StoreError> {
    let store = RedisStore::connect(url).await?;
    // The store's `Debug` names what it found: a standalone server, a Sentinel primary or
    // a Cluster.
    println!("limits live in Redis (REDIS_URL), shared by every instance: {store:?}");
    Ok(store)
}

/// The app on the store `redis_url` names: Redis (shared by every instance) when set, this
/// process otherwise. Redis is connected here, before anything is served, so a Redis the
/// limits cannot work on stops the server before it says it listens.
pub async fn app_for(redis_url: Option<&str>) -> Result<Router, Box<dyn std::error::Error>> {
    let Some(url) = redis_url else {
        println!("limits live in this process (set REDIS_URL=redis://127.0.0.1/ to share them)");
        return Ok(app(Limiter::new(MemoryStore::new()))?);
    };
    // A short timeout and a circuit breaker: an outage costs no latency, and the limits hold
    // in this process until Redis answers again (`.instances(n)` divides each quota among n
    // replicas meanwhile).
    let redis = connect_redis(url)
        .await?
        .with_timeout(Duration::from_millis(100));
    Ok(app(Limiter::new(Fallback::new(Breaker::new(redis))))?)
}

#[allow(dead_code)] // Tests include this file for `app`, `app_for` and `serve`.
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `RUST_LOG` picks what is printed (default: info, so store failures and the layer's
    // warnings show); without a subscriber they would go nowhere.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::builder()
                .with_default_directive(tracing_subscriber::filter::LevelFilter::INFO.into())
                .from_env_lossy(),
        )
        .init();
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let app = app_for(std::env::var("REDIS_URL").ok().as_deref()).await?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!(
        "try: for i in 1 2 3 4 5; do curl -si -X POST http://{addr}/report | grep -iE '^(HTTP|retry-after|ratelimit)'; done"
    );
    serve(listener, app).await?;
    Ok(())
}
