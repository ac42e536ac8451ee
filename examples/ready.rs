//! Readiness: a `/ready` endpoint for a load balancer or a Kubernetes probe, answered from
//! [`Limiter::health`] (a few atomic loads, no call to Redis).
//!
//! - `200 healthy`: decisions come from Redis (or this process, without `REDIS_URL`);
//! - `200 degraded`: Redis is away, the circuit breaker is open and a local store decides:
//!   limits hold per instance (each with a third of the quota here), so keep serving;
//! - `503 failing`: nothing decides in Redis's place (a breaker without a fallback).
//!
//! Run `REDIS_URL=redis://127.0.0.1/ cargo run --example ready`, poll
//! `curl -s localhost:3000/ready`, and make Redis stop answering for 10 s
//! (`redis-cli CLIENT PAUSE 10000 ALL`; `DEBUG SLEEP` is refused by Redis 7's default
//! `enable-debug-command no`), then send a request (`curl -s localhost:3000/`): `/ready`
//! turns `degraded` within one timeout, `GET /` keeps answering within milliseconds and
//! keeps limiting, and once Redis answers again `/ready` returns to `healthy` within the
//! breaker's probe interval (500 ms) with no request needed: polling `/ready` is enough.
//!
//! A Kubernetes readiness probe that must not take every replica out of service during a
//! Redis outage should treat `degraded` as ready (it is a 200 here); alert on it instead.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tollgate::store::RedisStore;
use tollgate::store::{Breaker, Fallback};
use tollgate::{
    store::{Health, MemoryStore, Store},
    Limiter, Rate, Rule,
};

/// `/ready` and a limited `/`, on any store.
fn app<St: Store + Clone>(limiter: Limiter<St>) -> Result<Router, tollgate::ConfigError> {
    let rule = Rule::gcra("per-ip", 20, Rate::per_second(10)).checked()?;
    Ok(Router::new()
        .route("/ready", get(ready::<St>))
        .route(
            "/",
            get(
                move |State(limiter): State<Limiter<St>>,
                      ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
                    let ip = peer.ip().to_string();
                    match limiter.check_one(&rule, ip).await {
                        Ok(outcome) if !outcome.is_admitted() => {
                            (StatusCode::TOO_MANY_REQUESTS, "slow down\n")
                        }
                        // Admitted, or the store failed with no fallback: fail open.
                        _ => (StatusCode::OK, "hello\n"),
                    }
                },
            ),
        )
        .with_state(limiter))
}

async fn ready<St: Store>(State(limiter): State<Limiter<St>>) -> (StatusCode, &'static str) {
    match limiter.health() {
        Health::Healthy => (StatusCode::OK, "healthy\n"),
        Health::Degraded => (StatusCode::OK, "degraded\n"),
        Health::Failing => (StatusCode::SERVICE_UNAVAILABLE, "failing\n"),
    }
}

async fn serve(listener: tokio::net::TcpListener, app: Router) -> std::io::Result<()> {
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "listening on http://{}; try: curl -s http://{0}/ready",
        listener.local_addr()?
    );
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            let redis = RedisStore::connect(&url)
                .await?
                .with_timeout(Duration::from_millis(100));
            // Three replicas share this Redis: while it is away each admits a third.
            let store = Fallback::new(Breaker::new(redis)).instances(3);
            serve(listener, app(Limiter::new(store))?).await?;
        }
        Err(_) => serve(listener, app(Limiter::new(MemoryStore::new()))?).await?,
    }
    Ok(())
}
