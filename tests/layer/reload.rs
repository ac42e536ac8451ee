//! Live reconfiguration through the real layer: rules swapped under load are applied whole
//! (every response is decided by exactly one configuration), no request is lost, requests
//! in flight finish under the rules they started with, a refused reload keeps the running
//! rules, and state is kept by rule name across reloads.

use crate::support::service::policy;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tollgate::layer::{Limit, Mode, RateLimitLayer, RateLimitLayerBuilder};
use tollgate::{key, store::MemoryStore, Limiter, Rate, Rule};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

type Svc = BoxCloneService<Request<String>, Response<String>, Infallible>;

fn service(layer: &RateLimitLayer) -> Svc {
    BoxCloneService::new(layer.layer(service_fn(|_req: Request<String>| async {
        // Let other requests and the reloads run while this one is in flight.
        tokio::task::yield_now().await;
        Ok::<_, Infallible>(Response::new(String::from("ok")))
    })))
}

const A_POLICY: &str = "\"a-shape\";q=1000;w=1, \"a-total\";q=1000000;w=3600";
const B_POLICY: &str = "\"b-total\";q=1000000;w=3600, \"b-once\";q=1;w=3600";

/// Configuration A admits everything, holding some requests briefly (a leaky bucket's
/// shaping); configuration B admits one request in all, then denies. Both rules of each
/// must always be applied together.
fn configure_a(builder: RateLimitLayerBuilder) -> RateLimitLayerBuilder {
    builder
        .limit(Limit::new(
            Rule::leaky_bucket("a-shape", 1000, Rate::per_second(1000)),
            key::global(),
        ))
        .limit(Limit::new(
            Rule::fixed_window("a-total", 1_000_000, Duration::from_secs(3600)),
            key::global(),
        ))
}

fn configure_b(builder: RateLimitLayerBuilder) -> RateLimitLayerBuilder {
    builder
        .limit(Limit::new(
            Rule::fixed_window("b-total", 1_000_000, Duration::from_secs(3600)),
            key::global(),
        ))
        .limit(Limit::new(
            Rule::fixed_window("b-once", 1, Duration::from_secs(3600)),
            key::global(),
        ))
}

/// Rules swapped under load are applied whole: every response is decided by exactly one
/// configuration's rules, and no request is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_swapped_under_load_are_applied_whole() {
    let limiter = Limiter::new(MemoryStore::new());
    let (layer, handle) = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .build()
        .unwrap()
        .reloadable();
    handle.reload(configure_a(handle.builder()).build().unwrap());
    let svc = service(&layer);

    // Both configurations built once; a thread swaps them as fast as it can, so that swaps
    // land between any two steps of a request.
    let (build_a, build_b) = {
        let a = configure_a(RateLimitLayer::builder().limiter(limiter.clone()))
            .build()
            .unwrap();
        let b = configure_b(RateLimitLayer::builder().limiter(limiter))
            .build()
            .unwrap();
        (a, b)
    };
    let done = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicUsize::new(0));
    let swapper = {
        let (done, swaps) = (done.clone(), swaps.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                handle.reload(build_b.clone());
                handle.reload(build_a.clone());
                swaps.fetch_add(2, Ordering::AcqRel);
                std::thread::yield_now();
            }
        })
    };

    const CLIENTS: usize = 8;
    const REQUESTS: usize = 250;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let svc = svc.clone();
        clients.push(tokio::spawn(async move {
            let mut seen = Vec::with_capacity(REQUESTS);
            for _ in 0..REQUESTS {
                let res = svc
                    .clone()
                    .oneshot(Request::get("/").body(String::new()).unwrap())
                    .await
                    .unwrap();
                seen.push((res.status(), policy(&res)));
            }
            seen
        }));
    }
    let mut responses = Vec::new();
    for client in clients {
        responses.extend(client.await.unwrap());
    }
    done.store(true, Ordering::Release);
    swapper.join().unwrap();

    // No request lost: every one answered, by exactly one configuration's rules.
    assert_eq!(responses.len(), CLIENTS * REQUESTS);
    let (mut by_a, mut by_b, mut b_admitted) = (0, 0, 0);
    for (status, policy) in &responses {
        match policy.as_str() {
            A_POLICY => {
                assert_eq!(*status, StatusCode::OK, "configuration A admits everything");
                by_a += 1;
            }
            B_POLICY => {
                by_b += 1;
                if *status == StatusCode::OK {
                    b_admitted += 1;
                } else {
                    assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS);
                }
            }
            other => panic!("a response decided by neither configuration: {status} {other:?}"),
        }
    }
    assert!(
        b_admitted <= 1,
        "B admits one request in all, admitted {b_admitted}"
    );
    assert!(
        swaps.load(Ordering::Acquire) >= 4,
        "the rules were swapped while requests ran"
    );
    assert!(
        by_a > 0 && by_b > 0,
        "both configurations decided requests: A {by_a}, B {by_b}"
    );
}

/// A request held across a reload finishes under the rules it started with, while new
/// requests are decided by the new ones.
#[tokio::test(start_paused = true)]
async fn a_held_request_finishes_under_the_rules_it_started_with() {
    let (layer, handle) = RateLimitLayer::builder()
        .mode(Mode::Wait {
            max_wait: Duration::from_secs(10),
        })
        .limit(Limit::new(
            Rule::fixed_window("old", 1, Duration::from_secs(1)),
            key::global(),
        ))
        .build()
        .unwrap()
        .reloadable();
    let svc = service(&layer);
    let request = || Request::get("/").body(String::new()).unwrap();
    assert_eq!(
        svc.clone().oneshot(request()).await.unwrap().status(),
        StatusCode::OK
    );
    // The second waits for the next window of "old"…
    let held = tokio::spawn(svc.clone().oneshot(request()));
    tokio::task::yield_now().await;
    // …while the rules change under it.
    handle.reload(
        handle
            .builder()
            .limit(Limit::new(
                Rule::fixed_window("new", 5, Duration::from_secs(60)),
                key::global(),
            ))
            .build()
            .unwrap(),
    );
    let fresh = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(fresh.status(), StatusCode::OK);
    assert_eq!(policy(&fresh), "\"new\";q=5;w=60");

    let held = held.await.unwrap().unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    assert_eq!(policy(&held), "\"old\";q=1;w=1");
}

/// State is kept by rule name across reloads: the same rule's count goes on, a refused
/// reload changes nothing, and a new name starts fresh.
#[tokio::test]
async fn state_is_kept_by_rule_name_across_reloads() {
    let minute = Duration::from_secs(60);
    let per_user = || {
        Limit::new(
            Rule::fixed_window("per-user", 2, minute),
            key::header("user-id"),
        )
    };
    let (layer, handle) = RateLimitLayer::builder()
        .limit(per_user())
        .build()
        .unwrap()
        .reloadable();
    let svc = service(&layer);
    let request = || {
        Request::get("/")
            .header("user-id", "7")
            .body(String::new())
            .unwrap()
    };
    assert_eq!(
        svc.clone().oneshot(request()).await.unwrap().status(),
        StatusCode::OK
    );

    // The same rule, with a route added: its count goes on.
    handle.reload(
        handle
            .builder()
            .limit(per_user())
            .route(
                "POST /sms",
                [Limit::new(
                    Rule::fixed_window("sms", 1, minute),
                    key::global(),
                )],
            )
            .build()
            .unwrap(),
    );
    assert_eq!(
        svc.clone().oneshot(request()).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.clone().oneshot(request()).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // A refused configuration (a rule name bound to two rules) changes nothing.
    let err = handle
        .builder()
        .limit(per_user())
        .route(
            "/x",
            [Limit::new(
                Rule::fixed_window("per-user", 9, minute),
                key::global(),
            )],
        )
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("\"per-user\""), "{err}");
    assert_eq!(
        svc.clone().oneshot(request()).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // Under a new name the key starts fresh.
    handle.reload(
        handle
            .builder()
            .limit(Limit::new(
                Rule::fixed_window("per-user-v2", 2, minute),
                key::header("user-id"),
            ))
            .build()
            .unwrap(),
    );
    assert_eq!(
        svc.oneshot(request()).await.unwrap().status(),
        StatusCode::OK
    );
}

/// Requests held under the old configuration count against the new one's `max_held` after a
/// reload: one bound covers both.
#[tokio::test(start_paused = true)]
async fn held_requests_count_under_one_bound_across_a_reload() {
    let config = |builder: RateLimitLayerBuilder| {
        builder
            .mode(Mode::Wait {
                max_wait: Duration::from_secs(10),
            })
            .max_held(1)
            .limit(Limit::new(
                Rule::fixed_window("one-a-second", 1, Duration::from_secs(1)),
                key::global(),
            ))
    };
    let (layer, handle) = config(RateLimitLayer::builder())
        .build()
        .unwrap()
        .reloadable();
    let svc = service(&layer);
    let request = || Request::get("/").body(String::new()).unwrap();
    assert_eq!(
        svc.clone().oneshot(request()).await.unwrap().status(),
        StatusCode::OK
    );
    // Held under the old configuration, for the next second's slot.
    let held = tokio::spawn(svc.clone().oneshot(request()));
    tokio::task::yield_now().await;

    handle.reload(config(handle.builder()).build().unwrap());
    // The new configuration's bound of one is taken by the request held under the old.
    let refused = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
}

/// The layer's log keeps its intervals across a reload: a store failure logged just before
/// a reload is not logged again just after it, and the interval a reload sets applies.
#[tokio::test(start_paused = true)]
async fn the_log_interval_holds_across_a_reload() -> Result<(), tower::BoxError> {
    use crate::support::down::Down;
    use crate::support::log::Captured;
    use crate::support::service::{call, with};

    let captured = Captured::default();
    let _guard = tracing::subscriber::set_default(captured.clone());
    let configure = |builder: RateLimitLayerBuilder<Down>| {
        builder
            .limit(Limit::new(
                Rule::fixed_window("x", 1, Duration::from_secs(60)),
                key::global(),
            ))
            .log_interval(Duration::from_secs(3600))
    };
    let (layer, handle) = configure(RateLimitLayer::builder().limiter(Limiter::new(Down)))
        .build()?
        .reloadable();
    let svc = with(layer);
    let get = || Request::get("/").body(String::new()).unwrap();
    assert_eq!(call(&svc, get()).await.status(), StatusCode::OK);
    assert_eq!(captured.lines().len(), 1);

    handle.reload(configure(handle.builder()).build()?);
    call(&svc, get()).await;
    let lines = captured.lines();
    assert!(lines.is_empty(), "logged again after a reload: {lines:?}");
    Ok(())
}
