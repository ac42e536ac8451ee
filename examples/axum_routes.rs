//! Per-route limits on axum, the seeds' cases:
//!
//! - `POST /sms/send`: per user (`User-Id`) 1 per minute, 5 per hour, 10 per day, plus 20 per
//!   minute per address — one batch, so a refused message uses up nothing;
//! - `GET /files/{name}`: 500 MB per user, refilled at 100 MB a minute; a download is
//!   admitted on the size of the file it names, as the server knows it (never a number the
//!   client sends), and costs what the handler says it served, at least 1 MB;
//! - `POST /login`: 5 attempts a minute per address; 3 refusals within 10 minutes lock the
//!   address out for 15 minutes;
//! - `GET /search`: a stricter rule being tried out in shadow mode: it decides and reports
//!   (on stdout here) but never refuses.
//!
//! Each route has a layer of its own (`route_layer`), and no layer wraps them all, so no
//! request is counted by one layer and refused by another. With a global limit as well,
//! use one layer with a route table instead, as the quickstart does: its global and route
//! limits are one batch.
//!
//! Run `cargo run --example axum_routes` and try the printed curl lines.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Router};
use tollgate::key::{self, KeyExtractor, RequestHead};
use tollgate::layer::{DecisionEvent, DecisionObserver, Limit, Mode, RateLimitLayer};
use tollgate::{
    store::{MemoryStore, Store},
    ConfigError, Limiter, Penalty, Rate, Rule,
};

/// Tells of each search the rule on trial would have refused.
struct WouldRefuse;

impl DecisionObserver for WouldRefuse {
    fn on_decision(&self, event: &DecisionEvent<'_>) {
        if event.outcome.is_ok_and(|o| !o.is_admitted()) {
            println!("shadow: search-strict would have refused this search");
        }
    }
}

/// The app, on any store.
pub fn app<St: Store + Clone>(limiter: Limiter<St>) -> Result<Router, ConfigError> {
    let user = || key::header("user-id");
    let sms = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(Limit::new(
            Rule::fixed_window("sms-minute", 1, Duration::from_secs(60)),
            user(),
        ))
        .limit(Limit::new(
            Rule::fixed_window("sms-hour", 5, Duration::from_secs(3600)),
            user(),
        ))
        .limit(Limit::new(
            Rule::fixed_window("sms-day", 10, Duration::from_secs(86_400)),
            user(),
        ))
        .limit(Limit::new(
            Rule::token_bucket("sms-ip", 20, Rate::per_minute(20)),
            key::peer_ip(),
        ))
        .build()?;

    let downloads = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(
            Limit::new(
                Rule::token_bucket("download-mb", 500, Rate::per_minute(100)),
                user(),
            )
            .cost(download_mb)
            // An empty file costs 1 MB too: a request that costs nothing can be sent forever.
            .min_cost(1)
            // What the handler served settles the cost: a name the estimate reads wrong
            // is charged the file that was served all the same.
            .cost_from_response(|res| {
                let served = res.extensions.get::<Served>()?;
                Some(served.bytes.div_ceil(MB))
            }),
        )
        .build()?;

    let login = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(Limit::new(
            Rule::fixed_window("login", 5, Duration::from_secs(60)).with_penalty(
                Penalty::lock_for(Duration::from_secs(15 * 60))
                    .after(3)
                    .within(Duration::from_secs(10 * 60)),
            ),
            key::peer_ip(),
        ))
        .build()?;

    let search_trial = RateLimitLayer::builder()
        .limiter(limiter)
        .limit(Limit::new(
            Rule::sliding_log("search-strict", 3, Duration::from_secs(60)),
            user().or(key::peer_ip()),
        ))
        .mode(Mode::Shadow)
        .observe(WouldRefuse)
        .build()?;

    Ok(Router::new()
        .route(
            "/sms/send",
            post(|| async { "sms sent\n" }).route_layer(sms),
        )
        .route("/files/{name}", get(download).route_layer(downloads))
        .route(
            "/login",
            post(|| async { "wrong password\n" }).route_layer(login),
        )
        .route(
            "/search",
            get(|| async { "results\n" }).route_layer(search_trial),
        ))
}

/// The files on offer and their sizes in bytes: what the server knows, unlike a size the
/// client could write into the request (`?size_mb=0` would download without limit).
const FILES: &[(&str, u64)] = &[("a.iso", 400 * MB), ("notes.txt", 12_000), ("empty.txt", 0)];

const MB: u64 = 1_000_000;

fn file_size(name: &str) -> Option<u64> {
    FILES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, size)| *size)
}

/// What the download handler served: the limit's cost is settled by it.
#[derive(Debug, Clone, Copy)]
struct Served {
    bytes: u64,
}

/// A download is admitted on the requested file's size in MB, rounded up: the most it can
/// serve. An unknown file estimates 0 here and is clamped to the limit's `min_cost`; the
/// handler answers 404. The name is percent-decoded as axum's `Path` decodes it for the
/// handler, so `/files/%61.iso` is admitted on what `a.iso`, the file it serves, costs.
fn download_mb(req: &RequestHead<'_>) -> u64 {
    let Some(raw) = req.uri().path().strip_prefix("/files/") else {
        return 0;
    };
    let name = percent_encoding::percent_decode_str(raw).decode_utf8();
    name.ok()
        .and_then(|name| file_size(&name))
        .map_or(0, |bytes| bytes.div_ceil(MB))
}

/// Serves a file (its description, in this example), and says how much it served.
async fn download(Path(name): Path<String>) -> Result<(Extension<Served>, String), StatusCode> {
    let size = file_size(&name).ok_or(StatusCode::NOT_FOUND)?;
    let served = Extension(Served { bytes: size });
    Ok((served, format!("{size} bytes of {name}\n")))
}

#[allow(dead_code)] // Tests include this file for `app`.
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
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}; try:");
    println!("  curl -i -X POST -H 'User-Id: 42' http://{addr}/sms/send   # twice: 429");
    println!("  curl -i -H 'User-Id: 42' http://{addr}/files/a.iso   # twice: 429");
    println!("  for i in $(seq 9); do curl -s -o /dev/null -w '%{{http_code}} ' -X POST http://{addr}/login; done; echo");
    println!("  for i in $(seq 5); do curl -s -H 'User-Id: 42' http://{addr}/search; done");
    let app = app(Limiter::new(MemoryStore::new()))?;
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
