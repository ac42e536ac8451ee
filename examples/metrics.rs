//! Metrics on `/metrics` for Prometheus, with the `metrics` feature: decisions by rule and
//! outcome, the store's latency and health, held requests (see `tollgate::layer::observe`).
//!
//! The exporter is `metrics-exporter-prometheus` without its own HTTP listener: its handle
//! renders the text format inside an axum route, next to the application's own routes (put
//! `/metrics` behind your network policy or an auth layer in production).
//!
//! Run `cargo run --example metrics --features metrics`, then
//! `for i in $(seq 15); do curl -s -H 'api-key: k1' localhost:3000/; done` and
//! `curl -s localhost:3000/metrics`. The API key is a rate-limit key, so it appears in no
//! metric: the labels are the rule's name and the outcome only.

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tollgate::layer::{Limit, RateLimitLayer};
use tollgate::{key, Rate, Rule};

/// The application with its limits, and `/metrics` rendered from `handle` (not limited).
fn app(handle: PrometheusHandle) -> Result<Router, tollgate::ConfigError> {
    let limits = RateLimitLayer::builder()
        .limit(Limit::new(
            Rule::gcra("per-key", 10, Rate::per_second(1)),
            key::header("api-key"),
        ))
        .build()?;
    let api = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(limits);
    Ok(api.route("/metrics", get(move || std::future::ready(handle.render()))))
}

/// A Prometheus recorder, with buckets for the store's latency (in seconds: an in-process
/// store answers in microseconds, Redis in a fraction of a millisecond).
fn recorder() -> Result<metrics_exporter_prometheus::PrometheusRecorder, Box<dyn std::error::Error>>
{
    let buckets = [
        0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1,
    ];
    Ok(PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("tollgate_store_duration_seconds".into()),
            &buckets,
        )?
        .build_recorder())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let recorder = recorder()?;
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)?;
    // Histograms are drained into their buckets by an upkeep the application schedules.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "listening on http://{}; try: curl -s -H 'api-key: k1' http://{0}/ then curl -s http://{0}/metrics",
        listener.local_addr()?
    );
    axum::serve(listener, app(handle)?).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use axum::body::Body;
    use http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    /// The metrics endpoint counts admitted and denied decisions per rule and reports store
    /// timings and health, and never exposes the keys it limited.
    #[test]
    fn metrics_are_served_without_the_keys() -> Result<(), Box<dyn std::error::Error>> {
        let recorder = recorder()?;
        let handle = recorder.handle();
        // The recorder of this thread only, so other tests' metrics stay out of it.
        let text = metrics::with_local_recorder(&recorder, || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()?;
            runtime.block_on(async {
                let app = app(handle)?;
                let api = |key: &str| Request::get("/").header("api-key", key).body(Body::empty());
                let mut statuses = Vec::new();
                for _ in 0..12 {
                    statuses.push(app.clone().oneshot(api("secret-key-1")?).await?.status());
                }
                assert_eq!(statuses[..10], [StatusCode::OK; 10]);
                assert_eq!(statuses[10..], [StatusCode::TOO_MANY_REQUESTS; 2]);
                let metrics = app
                    .oneshot(Request::get("/metrics").body(Body::empty())?)
                    .await?;
                assert_eq!(metrics.status(), StatusCode::OK);
                let body = metrics.into_body().collect().await?.to_bytes();
                Ok::<_, Box<dyn std::error::Error>>(String::from_utf8(body.to_vec())?)
            })
        })?;
        assert!(
            text.contains(r#"tollgate_decisions_total{rule="per-key",outcome="admitted"} 10"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tollgate_decisions_total{rule="per-key",outcome="denied"} 2"#),
            "{text}"
        );
        assert!(
            text.contains("tollgate_store_duration_seconds_bucket"),
            "{text}"
        );
        assert!(text.contains("tollgate_store_health 0"), "{text}");
        // Described once by the crate: what the gauge's values mean is on the page.
        assert!(
            text.contains("# HELP tollgate_store_health The store's health after its last decision: 0 healthy"),
            "{text}"
        );
        assert!(!text.contains("secret-key"), "{text}");
        Ok(())
    }
}
