//! Readiness: a `/ready` endpoint for a load balancer or a Kubernetes probe, answered from
//! [`Limiter::health`] (a few atomic loads; no request waits on Redis).
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
//! keeps limiting, and once Redis answers again `/ready` returns to `healthy` with no request
//! needed: polling `/ready` is enough. Degraded, `/ready` has Redis probed (one `PING` at a
//! time, in the background): within the breaker's probe interval (500 ms) once the breaker
//! opened, and as long after the last failed request when fewer failed than open it.
//!
//! `/ready` reports what decisions found, and calls Redis only while degraded: with no
//! request during an outage it stays `healthy` throughout (nothing was decided without
//! Redis). The first request decided locally turns it `degraded`.
//!
//! A Kubernetes readiness probe that must not take every replica out of service during a
//! Redis outage should treat `degraded` as ready (it is a 200 here); alert on it instead.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{ConnectInfo, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
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
                        Ok(outcome) => match outcome.decision.denial() {
                            Some(denial) => too_many(denial.retry_after),
                            None => (StatusCode::OK, "hello\n").into_response(),
                        },
                        // The store failed with no fallback: fail open.
                        Err(_) => (StatusCode::OK, "hello\n").into_response(),
                    }
                },
            ),
        )
        .with_state(limiter))
}

/// 429 with `Retry-After`: the wait until a retry passes, in whole seconds rounded up (as
/// the layer's own 429s say it).
fn too_many(wait: Option<Duration>) -> Response {
    let secs = wait.map_or(1, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0));
    let retry_after = [(header::RETRY_AFTER, secs.max(1).to_string())];
    (StatusCode::TOO_MANY_REQUESTS, retry_after, "slow down\n").into_response()
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

#[cfg(test)]
mod tests {
    use super::*;

    use axum::body::Body;
    use tower::ServiceExt;

    /// A refused request is told when to retry: past the burst of 20, one more per tenth of a
    /// second, so `Retry-After: 1`.
    #[tokio::test]
    async fn a_refusal_says_when_to_retry() {
        let app = app(Limiter::new(MemoryStore::new())).unwrap();
        let peer = ConnectInfo(SocketAddr::from(([203, 0, 113, 7], 40_000)));
        let get = || {
            let request = http::Request::get("/").extension(peer);
            request.body(Body::empty()).unwrap()
        };
        let mut refused = None;
        for _ in 0..25 {
            let response = app.clone().oneshot(get()).await.unwrap();
            if response.status() == StatusCode::TOO_MANY_REQUESTS {
                refused = Some(response);
                break;
            }
        }
        let refused = refused.expect("a refusal past the burst of 20");
        assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
    }
}
