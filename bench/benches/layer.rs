//! The layer's overhead per request on the in-process store: an axum hello-world called with
//! `ServiceExt::oneshot`, bare and behind the layer, and the cost of the route table.
//!
//! `cargo bench -p tollgate-bench --bench layer` (`--features metrics` adds the cost of
//! recording metrics)

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use criterion::{criterion_group, criterion_main, Criterion};
use http::Request;
use tollgate::layer::{Charge, Limit, PlanOf, Plans, RateLimitLayer, UnknownPlan};
use tollgate::{key, store::MemoryStore, Check, Limiter, Rate, Rule};
use tower::{Service, ServiceExt};

fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

/// A rule that admits everything the benchmark sends.
fn roomy(name: &str) -> Rule {
    Rule::token_bucket(name, 1_000_000, Rate::per_second(1_000_000))
}

fn request(path: &str) -> Request<Body> {
    let mut req = Request::get(path)
        .header("user-id", "user-42")
        .header("x-plan", "enterprise")
        .body(Body::empty())
        .unwrap();
    let peer = SocketAddr::from(([203, 0, 113, 7], 40_000));
    req.extensions_mut().insert(peer);
    // What axum's `into_make_service_with_connect_info` adds (tower_governor reads only this).
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    req
}

/// Calls `svc` `iters` times on a current-thread runtime and times it.
fn run<S>(rt: &tokio::runtime::Runtime, svc: &S, path: &'static str, iters: u64) -> Duration
where
    S: Service<Request<Body>, Error = Infallible> + Clone,
{
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            let res = svc.clone().oneshot(request(path)).await.unwrap();
            std::hint::black_box(res);
        }
        start.elapsed()
    })
}

fn overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let limiter = Limiter::new(MemoryStore::new());
    let mut group = c.benchmark_group("layer");

    // The store's part, for the breakdown: one rule decided by the limiter alone.
    let rule = roomy("alone");
    group.bench_function("Limiter::check alone, 1 rule", |b| {
        b.iter_custom(|n| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..n {
                    let batch = [Check::new(&rule, b"global")];
                    std::hint::black_box(limiter.check(&batch).await.unwrap());
                }
                start.elapsed()
            })
        })
    });

    let bare = hello();
    group.bench_function("axum hello, bare", |b| {
        b.iter_custom(|n| run(&rt, &bare, "/", n))
    });

    let one = hello().layer(
        RateLimitLayer::builder()
            .limiter(limiter.clone())
            .limit(Limit::new(roomy("global"), key::global()))
            .headers_on_allowed(false)
            .build()
            .unwrap(),
    );
    group.bench_function("axum hello, 1 rule (global key)", |b| {
        b.iter_custom(|n| run(&rt, &one, "/", n))
    });

    // The same layer made reloadable: the configuration read through an `ArcSwap`.
    let (reloadable, _handle) = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(Limit::new(roomy("global-live"), key::global()))
        .headers_on_allowed(false)
        .build()
        .unwrap()
        .reloadable();
    let live = hello().layer(reloadable);
    group.bench_function("axum hello, 1 rule (global key), reloadable", |b| {
        b.iter_custom(|n| run(&rt, &live, "/", n))
    });

    // Three plans chosen by a header: one rule per request, picked among three.
    let plan = |name| Limit::new(roomy(name), key::header("user-id"));
    let plans = Plans::new(PlanOf::header("x-plan"), UnknownPlan::Plan("free".into()))
        .plan("free", plan("plan-free"))
        .plan("pro", plan("plan-pro"))
        .plan("enterprise", plan("plan-enterprise"));
    let planned = hello().layer(
        RateLimitLayer::builder()
            .limiter(limiter.clone())
            .limits(plans)
            .headers_on_allowed(false)
            .build()
            .unwrap(),
    );
    group.bench_function("axum hello, 3 plans by header (1 rule applies)", |b| {
        b.iter_custom(|n| run(&rt, &planned, "/", n))
    });

    let two = hello().layer(
        RateLimitLayer::builder()
            .limiter(limiter.clone())
            .limit(Limit::new(roomy("ip"), key::peer_ip()))
            .limit(Limit::new(roomy("user"), key::header("user-id")))
            .headers_on_allowed(false)
            .build()
            .unwrap(),
    );
    group.bench_function("axum hello, 2 rules (peer ip + header)", |b| {
        b.iter_custom(|n| run(&rt, &two, "/", n))
    });

    let headers = hello().layer(
        RateLimitLayer::builder()
            .limiter(limiter.clone())
            .limit(Limit::new(roomy("ip2"), key::peer_ip()))
            .headers_on_allowed(true)
            .build()
            .unwrap(),
    );
    group.bench_function("axum hello, 1 rule + headers on allowed", |b| {
        b.iter_custom(|n| run(&rt, &headers, "/", n))
    });

    // The defaults a user gets: one rule by peer IP, headers on admitted responses; and
    // tower_governor's README configuration (peer IP) with a quota the bench never reaches.
    let defaults = hello().layer(
        RateLimitLayer::builder()
            .limiter(limiter.clone())
            .limit(Limit::new(roomy("ip3"), key::peer_ip()))
            .build()
            .unwrap(),
    );
    group.bench_function("axum hello, 1 rule (peer ip), defaults", |b| {
        b.iter_custom(|n| run(&rt, &defaults, "/", n))
    });
    let governor = hello().layer(tower_governor::GovernorLayer::new(
        tower_governor::governor::GovernorConfigBuilder::default()
            .per_nanosecond(1)
            .burst_size(u32::MAX)
            .finish()
            .unwrap(),
    ));
    group.bench_function("axum hello, tower_governor (peer ip)", |b| {
        b.iter_custom(|n| run(&rt, &governor, "/", n))
    });
    // Every request refused (a quota of one per hour, spent by the warm-up).
    let refusing = hello().layer(
        RateLimitLayer::builder()
            .limiter(limiter.clone())
            .limit(Limit::new(
                Rule::fixed_window("tight", 1, Duration::from_secs(3600)),
                key::peer_ip(),
            ))
            .build()
            .unwrap(),
    );
    group.bench_function("axum hello, 1 rule (peer ip), 429", |b| {
        b.iter_custom(|n| run(&rt, &refusing, "/", n))
    });
    let governor_refusing = hello().layer(tower_governor::GovernorLayer::new(
        tower_governor::governor::GovernorConfigBuilder::default()
            .per_second(3600)
            .burst_size(1)
            .finish()
            .unwrap(),
    ));
    group.bench_function("axum hello, tower_governor (peer ip), 429", |b| {
        b.iter_custom(|n| run(&rt, &governor_refusing, "/", n))
    });

    // A table of 20 routes: the request matches the last one, or none (no limit applies).
    let table = |last: &str| {
        let mut table = RateLimitLayer::builder()
            .limiter(limiter.clone())
            .headers_on_allowed(false);
        for i in 0..19 {
            table = table.route(
                &format!("POST /api/v1/resource{i}/{{id}}"),
                [Limit::new(roomy(&format!("r{i}")), key::global())],
            );
        }
        table
            .route(last, [Limit::new(roomy("last"), key::global())])
            .build()
            .unwrap()
    };
    let routed = hello().layer(table("GET /"));
    group.bench_function("axum hello, route table (20), last route", |b| {
        b.iter_custom(|n| run(&rt, &routed, "/", n))
    });
    let unrouted = hello().layer(table("GET /elsewhere"));
    group.bench_function("axum hello, route table (20), no route", |b| {
        b.iter_custom(|n| run(&rt, &unrouted, "/", n))
    });

    // Charging by outcome, its worst case: every response (a 200) is given back.
    let charged = hello().layer(
        RateLimitLayer::builder()
            .limiter(limiter.clone())
            .limit(
                Limit::new(roomy("charged"), key::global())
                    .charge(Charge::when(|status| !status.is_success())),
            )
            .headers_on_allowed(false)
            .build()
            .unwrap(),
    );
    group.bench_function("axum hello, 1 rule charged by outcome, given back", |b| {
        b.iter_custom(|n| run(&rt, &charged, "/", n))
    });

    // The 1-rule layer recording into Prometheus (`--features metrics`): the recorder is
    // this thread's, where the current-thread runtime runs the requests.
    #[cfg(feature = "metrics")]
    {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        group.bench_function(
            "axum hello, 1 rule (global key), Prometheus recorder",
            |b| {
                b.iter_custom(|n| {
                    metrics::with_local_recorder(&recorder, || run(&rt, &one, "/", n))
                })
            },
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = overhead
}
criterion_main!(benches);
