//! Held requests (wait mode, a leaky bucket's delay) against hostile clients: a held request
//! does not keep the inner service's readiness, the layer holds a bounded number of them, and
//! one whose client goes away gives its reserved units back.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::{Request, Response, StatusCode};
use tokio::io::AsyncWriteExt;
use tollgate::layer::{Limit, Mode, RateLimitLayer, RateLimitLayerBuilder};
use tollgate::{
    key,
    store::{MemoryStore, RedisStore, Store},
    Check, Limiter, ManualClock, Outcome, Rate, Rule, RuleOutcome, StoreError,
};
use tower::limit::ConcurrencyLimitLayer;
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};

use crate::support::redis_server::RedisServer;

const T0: u64 = crate::support::EPOCH;
const S: Duration = Duration::from_secs(1);

/// One request per user per 10 s, no burst.
fn per_user() -> Rule {
    Rule::gcra("per-user", 1, Rate::new(1, 10 * S))
}

fn wait_layer<St: Store>(limiter: Limiter<St>) -> RateLimitLayerBuilder<St> {
    RateLimitLayer::builder()
        .limiter(limiter)
        .limit(Limit::new(per_user(), key::header("user-id")))
        .mode(Mode::Wait { max_wait: 60 * S })
}

fn user(id: &str) -> Request<String> {
    Request::get("/")
        .header("user-id", id)
        .body(String::new())
        .unwrap()
}

/// The layer over an inner service that serves one request at a time.
fn one_at_a_time<St: Store + Clone>(
    layer: RateLimitLayer<St>,
) -> impl Service<
    Request<String>,
    Response = Response<String>,
    Error = BoxError,
    Future = impl Future + Send,
> + Clone
       + Send
       + 'static {
    ServiceBuilder::new()
        .layer(layer)
        .layer(ConcurrencyLimitLayer::new(1))
        .service(service_fn(|_req: Request<String>| async {
            Ok::<_, BoxError>(Response::new(String::from("ok")))
        }))
}

/// An in-process store that answers on its second poll, like a remote one: the layer then
/// holds the request's inner service while it asks.
#[derive(Clone)]
struct Later(MemoryStore);

impl Store for Later {
    async fn check(&self, batch: &[Check<'_>], max_wait: Duration) -> Result<Outcome, StoreError> {
        tokio::task::yield_now().await;
        self.0.check(batch, max_wait).await
    }
    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        tokio::task::yield_now().await;
        self.0.lease(check, term, ending).await
    }
    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        self.0.peek(check).await
    }
    async fn refund(&self, batch: &[Check<'_>], taken: &Outcome) -> Result<(), StoreError> {
        self.0.refund(batch, taken).await
    }
    async fn reset(&self, rule: &Rule, key: &tollgate::StoredKey<'_>) -> Result<(), StoreError> {
        self.0.reset(rule, key).await
    }
    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), tollgate::StoreError> {
        self.0.overdraw(batch).await
    }
    async fn count_denials(
        &self,
        batch: &[Check<'_>],
        ago: std::time::Duration,
    ) -> Result<(), tollgate::StoreError> {
        self.0.count_denials(batch, ago).await
    }
    fn health(&self) -> tollgate::store::Health {
        self.0.health()
    }
}

/// Client a's second request is held for 10 s; client b is served meanwhile, though the
/// inner service takes one request at a time.
async fn a_held_request_leaves_the_inner_service_to_others<St: Store + Clone>(
    layer: RateLimitLayer<St>,
) {
    let svc = one_at_a_time(layer);
    let first = svc.clone().oneshot(user("a")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let held = tokio::spawn(svc.clone().oneshot(user("a")));
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    let other = svc.clone().oneshot(user("b")).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    assert!(
        !held.is_finished(),
        "b was served only after a's held request was released"
    );
    assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
}

/// A request held in wait mode does not keep the inner service's readiness: other clients
/// are served while it waits.
#[tokio::test(start_paused = true)]
async fn held_in_wait_mode_the_inner_service_serves_others() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    a_held_request_leaves_the_inner_service_to_others(
        wait_layer(Limiter::new(store)).build().unwrap(),
    )
    .await;
}

/// A request held after a store that answers on a later poll does not keep the inner
/// service's readiness: other clients are served while it waits.
#[tokio::test(start_paused = true)]
async fn held_after_a_store_that_answers_later_the_inner_service_serves_others() {
    let store = Later(MemoryStore::with_clock(ManualClock::new(T0)));
    a_held_request_leaves_the_inner_service_to_others(
        wait_layer(Limiter::new(store)).build().unwrap(),
    )
    .await;
}

/// A request held by a leaky bucket's delay does not keep the inner service's readiness:
/// other clients are served while it waits.
#[tokio::test(start_paused = true)]
async fn held_by_a_leaky_bucket_the_inner_service_serves_others() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let shaping = Rule::leaky_bucket("shape", 2, Rate::new(1, 10 * S));
    let layer = RateLimitLayer::builder()
        .limiter(Limiter::new(store))
        .limit(Limit::new(shaping, key::header("user-id")))
        .build()
        .unwrap();
    a_held_request_leaves_the_inner_service_to_others(layer).await;
}

/// How long until `user` could pass again, as the store sees it: 10 s per unit reserved.
async fn backlog<St: Store>(limiter: &Limiter<St>, user: &str) -> Duration {
    let outcome = limiter.peek(&per_user(), user, 0).await.unwrap();
    outcome.info.reset
}

fn ok() -> impl Service<
    Request<String>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Future + Send,
> + Clone
       + Send
       + 'static {
    service_fn(|_req: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::from("ok")))
    })
}

/// Beyond `max_held`, a delayed request from any client is refused with the wait as
/// `Retry-After` and its units are given back; a released hold frees its place.
#[tokio::test(start_paused = true)]
async fn beyond_max_held_a_request_is_refused_and_its_units_given_back() {
    let limiter = Limiter::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let layer = wait_layer(limiter.clone()).max_held(1).build().unwrap();
    let svc = ServiceBuilder::new().layer(layer).service(ok());
    assert_eq!(
        svc.clone().oneshot(user("a")).await.unwrap().status(),
        StatusCode::OK
    );
    let held = tokio::spawn(svc.clone().oneshot(user("a")));
    tokio::task::yield_now().await;
    assert_eq!(backlog(&limiter, "a").await, 20 * S);

    // A third request of a would wait 20 s: there is no room to hold it.
    let refused = svc.clone().oneshot(user("a")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "20");
    assert_eq!(
        backlog(&limiter, "a").await,
        20 * S,
        "its reservation was given back"
    );
    // The bound is the layer's: b's held request finds no room either.
    assert_eq!(
        svc.clone().oneshot(user("b")).await.unwrap().status(),
        StatusCode::OK
    );
    let refused = svc.clone().oneshot(user("b")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "10");

    // Once a's held request passes, its place is free again.
    assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
    let held = tokio::spawn(svc.clone().oneshot(user("b")));
    tokio::task::yield_now().await;
    assert!(!held.is_finished());
    assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
}

/// With `max_held_per_key`, one client's delayed requests beyond its share are refused
/// while another client still gets a place of its own.
#[tokio::test(start_paused = true)]
async fn beyond_max_held_per_key_one_client_cannot_take_every_place() {
    let limiter = Limiter::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let layer = wait_layer(limiter.clone())
        .max_held_per_key(1)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service(ok());
    for id in ["a", "b"] {
        assert_eq!(
            svc.clone().oneshot(user(id)).await.unwrap().status(),
            StatusCode::OK
        );
    }
    let held_a = tokio::spawn(svc.clone().oneshot(user("a")));
    tokio::task::yield_now().await;
    let refused = svc.clone().oneshot(user("a")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "20");
    // b has a place of its own.
    let held_b = tokio::spawn(svc.clone().oneshot(user("b")));
    tokio::task::yield_now().await;
    assert!(!held_b.is_finished());
    assert_eq!(backlog(&limiter, "b").await, 20 * S);
    for held in [held_a, held_b] {
        assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
    }
}

/// A layer whose place for held requests is taken refuses the next delayed request at once
/// (429) and gives back what was reserved for it.
#[tokio::test(start_paused = true)]
async fn a_full_hold_refuses_every_further_delay() {
    let limiter = Limiter::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let svc = ServiceBuilder::new()
        .layer(wait_layer(limiter.clone()).max_held(1).build().unwrap())
        .service(ok());
    assert_eq!(
        svc.clone().oneshot(user("a")).await.unwrap().status(),
        StatusCode::OK
    );
    let held = tokio::spawn(svc.clone().oneshot(user("a")));
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let refused = svc.clone().oneshot(user("a")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(backlog(&limiter, "a").await, 20 * S);
    assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
}

/// A held request dropped before its release (its client went away) gives its units back,
/// once; one released is not given back.
async fn a_dropped_held_request_frees_its_slot<St: Store + Clone>(limiter: Limiter<St>) {
    let svc = ServiceBuilder::new()
        .layer(wait_layer(limiter.clone()).build().unwrap())
        .service(ok());
    assert_eq!(
        svc.clone().oneshot(user("a")).await.unwrap().status(),
        StatusCode::OK
    );
    let held = tokio::spawn(svc.clone().oneshot(user("a")));
    eventually(|| async { backlog(&limiter, "a").await == 20 * S }).await;
    held.abort();
    assert!(held.await.unwrap_err().is_cancelled());
    eventually(|| async { backlog(&limiter, "a").await == 10 * S }).await;

    // The next request gets that slot: held for 10 s, not 20.
    let start = tokio::time::Instant::now();
    let next = svc.clone().oneshot(user("a")).await.unwrap();
    assert_eq!(next.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), 10 * S);
    // Released and answered: its units stay taken.
    assert_eq!(backlog(&limiter, "a").await, 20 * S);
}

/// Waits (a bounded number of turns) until `done` holds, for effects that land on another
/// task: the refund of a remote store runs as one.
async fn eventually<F: Future<Output = bool>>(mut done: impl FnMut() -> F) {
    for _ in 0..500 {
        if done().await {
            return;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the store never got there");
}

/// On a memory store, a held request dropped before its release gives its units back, once,
/// and the next request takes its slot.
#[tokio::test(start_paused = true)]
async fn a_dropped_held_request_frees_its_slot_on_memory_store() {
    let limiter = Limiter::new(MemoryStore::with_clock(ManualClock::new(T0)));
    a_dropped_held_request_frees_its_slot(limiter).await;
}

/// On a Redis store, a held request dropped before its release gives its units back.
#[tokio::test]
async fn a_dropped_held_request_frees_its_slot_on_redis_store() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let limiter = Limiter::new(store.with_clock(ManualClock::new(T0)));
    a_dropped_held_request_frees_its_slot_redis(limiter).await;
}

/// [`a_dropped_held_request_frees_its_slot`] on a real clock: the Redis connection needs one.
async fn a_dropped_held_request_frees_its_slot_redis(limiter: Limiter<RedisStore>) {
    let svc = ServiceBuilder::new()
        .layer(wait_layer(limiter.clone()).build().unwrap())
        .service(ok());
    assert_eq!(
        svc.clone().oneshot(user("a")).await.unwrap().status(),
        StatusCode::OK
    );
    let held = tokio::spawn(svc.clone().oneshot(user("a")));
    eventually(|| async { backlog(&limiter, "a").await == 20 * S }).await;
    held.abort();
    assert!(held.await.unwrap_err().is_cancelled());
    eventually(|| async { backlog(&limiter, "a").await == 10 * S }).await;
}

/// Over TCP: the client of a held request hangs up; the server drops the request, and its
/// reserved units go back to the store.
#[tokio::test]
async fn a_client_that_hangs_up_gives_its_held_units_back() {
    let limiter = Limiter::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(wait_layer(limiter.clone()).build().unwrap());
    let addr = crate::support::serve_axum(app).await;
    let client = crate::support::client_from("127.0.0.1");
    let reply = crate::support::send(
        &client,
        crate::support::request(addr, "GET", "/", &[("user-id", b"a")]),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);

    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nuser-id: a\r\n\r\n")
        .await
        .unwrap();
    eventually(|| async { backlog(&limiter, "a").await == 20 * S }).await;
    drop(conn);
    eventually(|| async { backlog(&limiter, "a").await == 10 * S }).await;
}

/// A leaky bucket per user that holds up to 100 requests, behind a layer holding at most
/// `max_held` of them at once.
fn queued(max_held: usize) -> RateLimitLayer {
    let limiter = Limiter::new(MemoryStore::with_clock(ManualClock::new(T0)));
    let queue = Rule::leaky_bucket("queue", 100, tollgate::Rate::per_second(10));
    RateLimitLayer::builder()
        .limiter(limiter)
        .limit(Limit::new(queue, key::header("user-id")))
        .max_held(max_held)
        .build()
        .unwrap()
}

/// One client cannot take every place for held requests: by default each key that delays
/// requests holds at most a tenth of `max_held`, so another client's delayed request is
/// still held, not refused.
#[tokio::test(start_paused = true)]
async fn one_client_cannot_take_every_place_by_default() {
    let svc = ServiceBuilder::new().layer(queued(20)).service(ok());
    let mut a = Vec::new();
    for _ in 0..30 {
        a.push(tokio::spawn(svc.clone().oneshot(user("a"))));
        tokio::task::yield_now().await;
    }
    let b_first = svc.clone().oneshot(user("b")).await.unwrap();
    assert_eq!(b_first.status(), StatusCode::OK);
    let b_second = svc.clone().oneshot(user("b")).await.unwrap();
    assert_eq!(b_second.status(), StatusCode::OK);
    let mut served = 0;
    for response in a {
        served += usize::from(response.await.unwrap().unwrap().status() == StatusCode::OK);
    }
    // The first passes at once; a tenth of 20 places are a's to hold.
    assert_eq!(served, 3);
}

/// Many keys together cannot take every place either: ten keys holding their share of
/// `max_held(100)` each leave room for a key that holds nothing yet, whose request needing
/// a short wait is held, not refused.
#[tokio::test(start_paused = true)]
async fn many_keys_leave_room_for_a_key_that_holds_nothing_yet() {
    let svc = ServiceBuilder::new().layer(queued(100)).service(ok());
    let mut held = Vec::new();
    for attacker in 0..10 {
        for _ in 0..15 {
            let request = user(&format!("attacker-{attacker}"));
            held.push(tokio::spawn(svc.clone().oneshot(request)));
            tokio::task::yield_now().await;
        }
    }
    // The newcomer's first request passes at once, its second waits behind it: held.
    for _ in 0..2 {
        let newcomer = svc.clone().oneshot(user("newcomer")).await.unwrap();
        assert_eq!(newcomer.status(), StatusCode::OK);
    }
    let mut served = 0;
    for response in held {
        served += usize::from(response.await.unwrap().unwrap().status() == StatusCode::OK);
    }
    // Each key passes its first at once and holds at most its share; together they never
    // hold every place (the more a key holds, the less of the room it reaches).
    assert!((10 + 50..10 + 100).contains(&served), "{served}");
}

/// Keys that hold nothing yet cannot fill the room either: after ten keys holding what they
/// reach of `max_held(100)` and ten fresh keys each holding one, a third client's request
/// needing a short wait is held, not refused.
#[tokio::test(start_paused = true)]
async fn fresh_keys_leave_room_for_another_client() {
    let svc = ServiceBuilder::new().layer(queued(100)).service(ok());
    let mut held = Vec::new();
    let mut flood = |name: String, requests: usize| {
        for _ in 0..requests {
            held.push(tokio::spawn(svc.clone().oneshot(user(&name))));
        }
    };
    for attacker in 0..10 {
        flood(format!("attacker-{attacker}"), 11);
        tokio::task::yield_now().await;
    }
    for fresh in 0..10 {
        flood(format!("fresh-{fresh}"), 2);
        tokio::task::yield_now().await;
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    for _ in 0..2 {
        let client = svc.clone().oneshot(user("client")).await.unwrap();
        assert_eq!(client.status(), StatusCode::OK);
    }
    for response in held {
        drop(response.await);
    }
}
