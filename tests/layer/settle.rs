//! Costs settled by the response (`Limit::cost_from_response`): an axum handler serves files
//! of different sizes and says what it served; a download costs that, whatever its path
//! looked like, against the estimate taken at admission (given back when lower, taken as a
//! debt when higher); on MemoryStore, RedisStore and a Fallback whose units go back to the
//! store that took them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use tollgate::key::RequestHead;
use tollgate::layer::{Charge, Limit, RateLimitLayer};
use tollgate::store::Fallback;
use tollgate::{
    key,
    store::{MemoryStore, RedisStore, Store},
    Limiter, ManualClock, Rate, Rule,
};
use tower::ServiceExt;

use crate::support::redis_server::RedisServer;
use crate::support::switch::Switch;
use crate::support::vectors::BASE_MICROS;

/// What the handler served, in MB: the value the limit settles the cost with.
#[derive(Clone, Copy)]
struct ServedMb(u64);

/// The files on offer, in MB.
const FILES: &[(&str, u64)] = &[("a.iso", 400), ("b.bin", 50), ("notes.txt", 1)];

fn size_mb(name: &str) -> Option<u64> {
    FILES.iter().find(|(n, _)| *n == name).map(|(_, mb)| *mb)
}

/// `GET /files/{name}`: serves the file (or its first `part` MB) and says how much it
/// served; `fail=1` answers 500 having served nothing, and says so; `quiet=1` serves without
/// saying.
async fn download(
    Path(name): Path<String>,
    Query(query): Query<std::collections::HashMap<String, u64>>,
) -> Response {
    let Some(size) = size_mb(&name) else {
        return (Extension(ServedMb(0)), StatusCode::NOT_FOUND).into_response();
    };
    if query.get("fail") == Some(&1) {
        return (Extension(ServedMb(0)), StatusCode::INTERNAL_SERVER_ERROR).into_response();
    }
    let served = query.get("part").map_or(size, |&part| part.min(size));
    let body = format!("{served} MB of {name}\n");
    if query.get("quiet") == Some(&1) {
        return body.into_response();
    }
    (Extension(ServedMb(served)), body).into_response()
}

/// The bucket every test spends: 500 MB, refilled at 100 MB a minute.
fn bucket() -> Rule {
    Rule::token_bucket("download-mb", 500, Rate::per_minute(100))
}

/// The estimate of a careful server: the size of the file the path names, decoded as
/// axum's `Path` decodes it (an upper bound of what a download serves).
fn decoded_size(req: &RequestHead<'_>) -> u64 {
    let raw = req.uri().path().strip_prefix("/files/").unwrap_or_default();
    let name = percent_encoding::percent_decode_str(raw).decode_utf8();
    name.ok().and_then(|name| size_mb(&name)).unwrap_or(0)
}

/// An estimate that reads the path as it comes, undecoded: `%61.iso` is no file it knows.
fn raw_size(req: &RequestHead<'_>) -> u64 {
    let raw = req.uri().path().strip_prefix("/files/").unwrap_or_default();
    size_mb(raw).unwrap_or(0)
}

/// The download limit with `estimate`, at least 1 MB, settled by what the handler served.
fn downloads(estimate: fn(&RequestHead<'_>) -> u64) -> Limit {
    Limit::new(bucket(), key::header("user-id"))
        .cost(estimate)
        .min_cost(1)
        .cost_from_response(|res| res.extensions.get::<ServedMb>().map(|served| served.0))
}

fn files<St: Store + Clone>(limiter: Limiter<St>, limit: Limit) -> Router {
    let layer = RateLimitLayer::builder()
        .limiter(limiter)
        .limit(limit)
        .build()
        .unwrap();
    Router::new().route("/files/{name}", get(download).route_layer(layer))
}

/// The status and `Retry-After` (0 if none) of `GET path` as user 42.
async fn fetch(app: &Router, path: &str) -> (StatusCode, u64) {
    let request = Request::get(path)
        .header("user-id", "42")
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let retry = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    (response.status(), retry)
}

/// The MB user 42 has left, once a settlement made on a task (Redis) has landed: waits up
/// to 5 s for `expected`, and returns what is left then.
async fn left<St: Store>(limiter: &Limiter<St>, expected: u64) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = limiter
            .peek(&bucket(), b"42", 0)
            .await
            .unwrap()
            .info
            .remaining;
        if now == expected || std::time::Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// After the quota is spent by what was served, every download is refused, however its
/// path is spelt, even by an estimate that cannot read the spelling; the debt a download
/// left is paid by the refill before the next one passes.
async fn served_sizes_spend_the_quota<St: Store + Clone>(limiter: Limiter<St>, clock: ManualClock) {
    let app = files(limiter.clone(), downloads(raw_size));
    assert_eq!(fetch(&app, "/files/a.iso").await.0, StatusCode::OK);
    assert_eq!(left(&limiter, 100).await, 100);
    // The estimate reads `%61.iso` as no file (1 MB) and admits it; the handler serves
    // `a.iso`, and the 300 MB beyond what was left are a debt.
    assert_eq!(fetch(&app, "/files/%61.iso").await.0, StatusCode::OK);
    assert_eq!(left(&limiter, 0).await, 0);
    // 300 MB of debt at 100 MB a minute (180 s), then the refill of the request's own
    // estimate: 400 MB for what the estimate reads as `a.iso`, 1 MB for the rest.
    for (path, wait) in [
        ("/files/a.iso", 420),
        ("/files/%61.iso", 181),
        ("/files/a%2Eiso", 181),
        ("/files/notes.txt", 181),
    ] {
        assert_eq!(
            fetch(&app, path).await,
            (StatusCode::TOO_MANY_REQUESTS, wait),
            "{path}"
        );
    }
    clock.advance(Duration::from_secs(180));
    assert_eq!(
        fetch(&app, "/files/notes.txt").await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(fetch(&app, "/files/notes.txt").await.0, StatusCode::OK);
}

/// On a MemoryStore, downloads spend the quota by what the handler served: a spelling the
/// estimate misses is charged the file it fetched, and the next downloads wait for the debt.
#[tokio::test]
async fn served_sizes_spend_the_quota_in_memory() {
    let clock = ManualClock::new(BASE_MICROS);
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
    served_sizes_spend_the_quota(limiter, clock).await;
}

/// On Redis, downloads spend the quota by what the handler served: a spelling the estimate
/// misses is charged the file it fetched, and the next downloads wait for the debt.
#[tokio::test]
async fn served_sizes_spend_the_quota_in_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(BASE_MICROS);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    served_sizes_spend_the_quota(Limiter::new(store.with_clock(clock.clone())), clock).await;
}

/// A download that serves less than its estimate gives the rest back; one whose handler
/// says nothing keeps the estimate; a 500 the charge does not count gives everything back.
async fn less_served_is_given_back<St: Store + Clone>(limiter: Limiter<St>) {
    let limit = downloads(decoded_size).charge(Charge::except_server_errors());
    let app = files(limiter.clone(), limit);
    // The estimate is the whole file: admitted while 400 MB fit, charged the 50 served.
    assert_eq!(fetch(&app, "/files/a.iso?part=50").await.0, StatusCode::OK);
    assert_eq!(left(&limiter, 450).await, 450);
    assert_eq!(fetch(&app, "/files/b.bin?quiet=1").await.0, StatusCode::OK);
    assert_eq!(left(&limiter, 400).await, 400);
    assert_eq!(
        fetch(&app, "/files/a.iso?fail=1").await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(left(&limiter, 400).await, 400);
    // Served to the last MB: nothing left, nothing owed.
    assert_eq!(fetch(&app, "/files/a.iso").await.0, StatusCode::OK);
    assert_eq!(left(&limiter, 0).await, 0);
    assert_eq!(
        fetch(&app, "/files/notes.txt").await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// On a MemoryStore, a settled cost below the estimate gives the difference back, no
/// settled cost keeps the estimate, and a response the charge does not count costs nothing.
#[tokio::test]
async fn less_served_is_given_back_in_memory() {
    let limiter = Limiter::new(MemoryStore::with_clock(ManualClock::new(BASE_MICROS)));
    less_served_is_given_back(limiter).await;
}

/// On Redis, a settled cost below the estimate gives the difference back, no settled cost
/// keeps the estimate, and a response the charge does not count costs nothing.
#[tokio::test]
async fn less_served_is_given_back_in_redis() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let limiter = Limiter::new(store.with_clock(ManualClock::new(BASE_MICROS)));
    less_served_is_given_back(limiter).await;
}

/// An error of the inner service settles nothing: the estimate stays taken.
#[tokio::test]
async fn a_service_error_keeps_the_estimate() {
    let limiter = Limiter::new(MemoryStore::with_clock(ManualClock::new(BASE_MICROS)));
    let layer = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(downloads(decoded_size))
        .build()
        .unwrap();
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_req: Request<Body>| async {
            Err::<Response, _>(tower::BoxError::from("disk gone"))
        });
    let request = Request::get("/files/b.bin")
        .header("user-id", "42")
        .body(Body::empty())
        .unwrap();
    assert!(svc.oneshot(request).await.is_err());
    assert_eq!(left(&limiter, 450).await, 450);
}

/// Behind a Fallback, what a settlement gives back goes to the store that took it, and
/// what it owes to the store that decides the key now: the primary for a download it
/// admitted; for one admitted locally while the primary was away and served once it is
/// back, the estimate stays in the local store and the debt is the primary's, where the
/// key's next downloads pay it.
#[tokio::test]
async fn a_fallback_gives_back_where_taken_and_takes_where_decided() {
    let clock = ManualClock::new(BASE_MICROS);
    let primary = Switch::new(MemoryStore::with_clock(clock.clone()));
    let local = MemoryStore::with_clock(clock.clone());
    let store = Fallback::with_local(primary.clone(), local.clone());
    let layer = RateLimitLayer::builder()
        .limiter(Limiter::new(store))
        .limit(downloads(decoded_size))
        .build()
        .unwrap();
    let back_up = primary.switch();
    let handler = move |path: Path<String>,
                        query: Query<std::collections::HashMap<String, u64>>| {
        // The primary comes back while this download is served.
        back_up.store(false, Ordering::SeqCst);
        download(path, query)
    };
    let app = Router::new()
        .route("/files/{name}", get(download).route_layer(layer.clone()))
        .route("/back/{name}", get(handler).route_layer(layer));
    let primary_left = Limiter::new(primary.inner.clone());
    let local_left = Limiter::new(local);

    assert_eq!(fetch(&app, "/files/a.iso?part=50").await.0, StatusCode::OK);
    assert_eq!(left(&primary_left, 450).await, 450);
    assert_eq!(left(&local_left, 500).await, 500);
    assert_eq!(primary.refunds.load(Ordering::SeqCst), 1);

    primary.set_down(true);
    // `/back/…` costs no estimate of its own (1 MB): the local store admits it, the primary
    // is back when the handler has served 400 MB, and the primary takes the 399 beyond.
    assert_eq!(fetch(&app, "/back/a.iso").await.0, StatusCode::OK);
    assert_eq!(left(&local_left, 499).await, 499);
    assert_eq!(left(&primary_left, 51).await, 51);
    assert_eq!(primary.refunds.load(Ordering::SeqCst), 1);
}

/// A debt owed to a primary that went away while the download was served is taken in the
/// local store, which decides the key while the primary is away: its next download there
/// pays the debt instead of finding the estimate alone taken.
#[tokio::test]
async fn a_debt_owed_to_a_primary_that_is_away_is_taken_locally() {
    let clock = ManualClock::new(BASE_MICROS);
    let primary = Switch::new(MemoryStore::with_clock(clock.clone()));
    let local = MemoryStore::with_clock(clock.clone());
    let store = Fallback::with_local(primary.clone(), local.clone());
    let layer = RateLimitLayer::builder()
        .limiter(Limiter::new(store))
        .limit(downloads(|_| 1))
        .build()
        .unwrap();
    let away = primary.switch();
    // The primary goes away while this download is served.
    let handler = move |path: Path<String>,
                        query: Query<std::collections::HashMap<String, u64>>| {
        away.store(true, Ordering::SeqCst);
        download(path, query)
    };
    let app = Router::new().route("/away/{name}", get(handler).route_layer(layer));
    let local_left = Limiter::new(local);

    assert_eq!(fetch(&app, "/away/a.iso").await.0, StatusCode::OK);
    assert_eq!(left(&local_left, 101).await, 101);
}
