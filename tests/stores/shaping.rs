//! Shaped requests (a leaky bucket's queue) beside rules on other keys: a held request
//! counts where it passes, one client's queue closes no shared state, and what a held
//! request counts under for `max_held_per_key`; on the store and through the layer.

use std::time::Duration;

use crate::support::redis_server::RedisServer;
use crate::support::still::Still;
use tollgate::{
    store::{MemoryStore, Store},
    Check, Decision, Limiter, ManualClock, Rate, Rule,
};

/// A multiple of every window below.
const T0: u64 = crate::support::EPOCH;

fn memory() -> (Limiter<MemoryStore>, ManualClock) {
    let clock = ManualClock::new(T0);
    (Limiter::new(MemoryStore::with_clock(clock.clone())), clock)
}

/// A batch held by one client's leaky-bucket queue leaves the
/// rules on other keys to the request's release instead of recording it there like a
/// wait-mode reservation (which would close their state until then: nothing is admitted
/// before a reservation's instant). So one client's queue never closes a shared bucket
/// with room to spare to the other clients: in check mode they are admitted.
#[tokio::test]
async fn one_clients_queue_does_not_close_a_shared_bucket() {
    let (limiter, clock) = memory();
    let per_user = Rule::leaky_bucket("per-user", 10, Rate::new(1, Duration::from_millis(100)));
    let global = Rule::token_bucket("global", 100, Rate::per_second(100));
    let batch = |user: &'static [u8]| [Check::new(&per_user, user), Check::new(&global, b"all")];

    assert_eq!(
        limiter.check(&batch(b"a")).await.unwrap().decision,
        Decision::Allow
    );
    // a's second request queues behind its first for 100 ms.
    let queued = limiter.check(&batch(b"a")).await.unwrap();
    assert_eq!(queued.decision, Decision::Delay(Duration::from_millis(100)));

    // b has an empty queue and the global bucket 98 tokens.
    clock.set_micros(T0 + 1);
    let b = limiter.check(&batch(b"b")).await.unwrap();
    assert_eq!(b.decision, Decision::Allow, "{b:?}");
}

mod held {
    //! What a held request counts under for `max_held_per_key`.

    use std::convert::Infallible;
    use std::time::Duration;

    use http::{Request, Response, StatusCode};
    use tollgate::layer::{Limit, Mode, RateLimitLayer};
    use tollgate::{key, store::MemoryStore, Limiter, ManualClock, Rate, Rule};
    use tower::{service_fn, ServiceBuilder, ServiceExt};

    const T0: u64 = crate::support::EPOCH;
    const S: Duration = Duration::from_secs(1);

    fn request(user: &str) -> Request<String> {
        Request::get("/")
            .header("user-id", user)
            .header("tenant", "acme")
            .body(String::new())
            .unwrap()
    }

    /// One request per user per 10 s, waited for; beside it a per-tenant window with room
    /// to spare, which never delays anything on its own.
    async fn two_users_of_one_tenant_are_held_each(tenant_limit: Limit) {
        let limiter = Limiter::new(MemoryStore::with_clock(ManualClock::new(T0)));
        let per_user = Rule::gcra("per-user", 1, Rate::new(1, 10 * S));
        let layer = RateLimitLayer::builder()
            .limiter(limiter)
            .limit(Limit::new(per_user, key::header("user-id")))
            .limit(tenant_limit)
            .mode(Mode::Wait { max_wait: 60 * S })
            .max_held_per_key(1)
            .build()
            .unwrap();
        let svc =
            ServiceBuilder::new()
                .layer(layer)
                .service(service_fn(|_req: Request<String>| async {
                    Ok::<_, Infallible>(Response::new(String::new()))
                }));
        for user in ["a", "b"] {
            let first = svc.clone().oneshot(request(user)).await.unwrap();
            assert_eq!(first.status(), StatusCode::OK);
        }
        let held_a = tokio::spawn(svc.clone().oneshot(request("a")));
        tokio::task::yield_now().await;
        assert!(!held_a.is_finished(), "a's second request is held");
        // b's own key holds nothing yet: only the per-user rule delays its request.
        let held_b = tokio::spawn(svc.clone().oneshot(request("b")));
        tokio::task::yield_now().await;
        if held_b.is_finished() {
            let response = held_b.await.unwrap().unwrap();
            panic!(
                "b's request was refused ({}), its place taken by the tenant's key",
                response.status()
            );
        }
        for held in [held_a, held_b] {
            assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
        }
    }

    fn per_tenant() -> Rule {
        Rule::fixed_window("per-tenant", 1000, 60 * S)
    }

    /// A trial limit never denies: its key takes no place under `max_held_per_key`, though
    /// every rule of a reserved batch reports `Delay`, a shadow rule too.
    #[tokio::test(start_paused = true)]
    async fn a_shadow_limit_takes_no_place_under_max_held_per_key() {
        let tenant = Limit::new(per_tenant(), key::header("tenant")).shadow();
        two_users_of_one_tenant_are_held_each(tenant).await;
    }
}

/// A multiple of a minute.
const T60: u64 = 1_200_000_000_000;

/// On the `Limiter`, a global fixed window (1 a minute) beside a per-user
/// leaky bucket (5 units, one per 10 s) counts a shaped request in the window it passes in,
/// not the one it queues in: the window is left to the release, where confirming the
/// `Reservation` counts it. A request whose window filled up while it was held is denied at
/// its release, and its queue slot goes back. The store's clock is the test's; tokio's
/// paused clock ends each reservation's wait.
async fn a_shaped_request_counts_where_it_passes<S: Store + Clone>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let s = |secs: u64| T60 + secs * 1_000_000;
    let queue = Rule::leaky_bucket("per-user", 5, Rate::new(1, Duration::from_secs(10)));
    let global = Rule::fixed_window("global", 1, Duration::from_secs(60));
    let request = |user: &'static [u8]| [Check::new(&queue, user), Check::new(&global, b"all")];
    let queue_only = |user: &'static [u8]| [Check::new(&queue, user)];

    clock.set_micros(s(50));
    assert_eq!(
        limiter.check(&request(b"a")).await.unwrap().decision,
        Decision::Allow
    );
    // a's next request queues until 60 s: the window is left to the release.
    clock.set_micros(s(55));
    let mut held = limiter
        .reserve(&request(b"a"), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        held.outcome().decision,
        Decision::Delay(Duration::from_secs(5)),
        "{held:?}"
    );
    // [0, 60 s) is full with a's first request: b is denied.
    clock.set_micros(s(58));
    assert!(!limiter.check(&request(b"b")).await.unwrap().is_admitted());
    clock.set_micros(s(60));
    let passed = held.confirm().await.unwrap();
    assert_eq!(passed.decision, Decision::Allow, "{passed:?}");
    // a's held request counts in [60 s, 120 s), where it passed: b waits for 120 s.
    clock.set_micros(s(61));
    let b = limiter.check(&request(b"b")).await.unwrap();
    assert_eq!(
        b.decision,
        Decision::Deny(tollgate::Denial {
            reason: tollgate::DenyReason::Limited,
            retry_after: Some(Duration::from_secs(59)),
        }),
        "{b:?}"
    );

    // a queues a request on its own until 180 s, then one that needs the window too.
    clock.set_micros(s(170));
    assert!(limiter
        .check(&queue_only(b"a"))
        .await
        .unwrap()
        .is_admitted());
    clock.set_micros(s(175));
    let mut held = limiter
        .reserve(&request(b"a"), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        held.outcome().decision,
        Decision::Delay(Duration::from_secs(5)),
        "{held:?}"
    );
    // b takes [180 s, 240 s) while a's request is held.
    clock.set_micros(s(180));
    assert_eq!(
        limiter.check(&request(b"b")).await.unwrap().decision,
        Decision::Allow
    );
    // Confirmed a little after its release, as a layer's timer does.
    clock.set_micros(s(180) + 1_000);
    let denied = held.confirm().await.unwrap();
    assert_eq!(
        denied.decision,
        Decision::Deny(tollgate::Denial {
            reason: tollgate::DenyReason::Limited,
            retry_after: Some(Duration::from_micros(59_999_000)),
        }),
        "{denied:?}"
    );
    // Its queue slot went back: a's next request (alone) is not queued behind it.
    let next = limiter.check(&queue_only(b"a")).await.unwrap();
    assert_eq!(next.decision, Decision::Allow, "{next:?}");
    // Cancelling the denied reservation gives nothing back twice.
    held.cancel().await.unwrap();
    let after = limiter.check(&queue_only(b"a")).await.unwrap();
    assert_eq!(
        after.decision,
        Decision::Delay(Duration::from_secs(10)),
        "{after:?}"
    );
}

/// [`a_shaped_request_counts_where_it_passes`] on MemoryStore.
#[tokio::test(start_paused = true)]
async fn a_shaped_request_counts_where_it_passes_on_memory() {
    let clock = ManualClock::new(T60);
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
    a_shaped_request_counts_where_it_passes(&limiter, &clock).await;
}

/// [`a_shaped_request_counts_where_it_passes`] on a Redis server.
#[tokio::test(start_paused = true)]
async fn a_shaped_request_counts_where_it_passes_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T60);
    let store = Still::connect(&server.url()).await;
    let limiter = Limiter::new(store.with_clock(clock.clone()));
    a_shaped_request_counts_where_it_passes(&limiter, &clock).await;
}

/// A clock that follows tokio's (paused) time, from `T60`.
#[derive(Debug, Clone)]
struct TokioClock(tokio::time::Instant);

impl tollgate::Clock for TokioClock {
    fn now_micros(&self) -> u64 {
        T60 + self.0.elapsed().as_micros() as u64
    }
}

/// The instants (since `start`) at which requests reached the inner service.
type Passed = std::sync::Arc<std::sync::Mutex<Vec<Duration>>>;

/// A per-user leaky bucket (5 units, one per 10 s) beside a global fixed window of 2 a
/// minute, in `mode`, over a service that records when each request reaches it.
fn shaping_service<St: Store + Clone>(
    limiter: Limiter<St>,
    mode: tollgate::layer::Mode,
    start: tokio::time::Instant,
) -> (
    impl tower::Service<
            http::Request<String>,
            Response = http::Response<String>,
            Error = std::convert::Infallible,
            Future = impl Send,
        > + Clone
        + Send
        + 'static,
    Passed,
) {
    use tollgate::key;
    use tollgate::layer::{Limit, RateLimitLayer};
    use tower::{service_fn, ServiceBuilder};

    let passed = Passed::default();
    let layer = RateLimitLayer::builder()
        .limiter(limiter)
        .limit(Limit::new(
            Rule::leaky_bucket("per-user", 5, Rate::new(1, Duration::from_secs(10))),
            key::header("user-id"),
        ))
        .limit(Limit::new(
            Rule::fixed_window("global", 2, Duration::from_secs(60)),
            key::global(),
        ))
        .mode(mode)
        .build()
        .expect("valid layer");
    let seen = passed.clone();
    let service = ServiceBuilder::new().layer(layer).service(service_fn(
        move |_req: http::Request<String>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(start.elapsed());
                Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
            }
        },
    ));
    (service, passed)
}

fn from_user(user: &str) -> http::Request<String> {
    http::Request::get("/")
        .header("user-id", user)
        .body(String::new())
        .unwrap()
}

/// The shaped-request schedule, through the layer: a global fixed window
/// of 2 per minute beside a per-user leaky bucket (5 units, one per 10 s). a's request at
/// 55 s queues behind its 50 s one until 60 s; b sends at 60 s and 60.5 s. The layer
/// counts a's held request in the window it passes in ([60 s, 120 s)), so no more than 2
/// pass in any minute: b's second request is refused.
async fn shaped_requests_pass_within_the_global_limit<St: Store + Clone>(limiter: Limiter<St>) {
    use tower::ServiceExt;

    let start = tokio::time::Instant::now();
    let (service, passed) = shaping_service(limiter, tollgate::layer::Mode::Enforce, start);
    let send = |user: &'static str, at: Duration| {
        let service = service.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(start + at).await;
            let response = service.oneshot(from_user(user)).await.unwrap();
            response.status()
        })
    };
    let ms = Duration::from_millis;
    let requests = [
        send("a", ms(50_000)),
        send("a", ms(55_000)),
        send("b", ms(60_000)),
        send("b", ms(60_500)),
    ];
    let mut statuses = Vec::new();
    for request in requests {
        statuses.push(request.await.unwrap().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    let passed = passed.lock().unwrap().clone();
    for window in 0..3u64 {
        let range = Duration::from_secs(60 * window)..Duration::from_secs(60 * (window + 1));
        let n = passed.iter().filter(|t| range.contains(*t)).count();
        assert!(
            n <= 2,
            "{n} passed in {range:?} against a limit of 2: {passed:?}"
        );
    }
    // Not over-strict either: a's first two and b's first pass.
    assert_eq!(passed.len(), 3, "{passed:?}");
}

/// [`shaped_requests_pass_within_the_global_limit`] on MemoryStore, on tokio's clock.
#[tokio::test(start_paused = true)]
async fn shaped_requests_pass_within_the_global_limit_on_memory() {
    let clock = TokioClock(tokio::time::Instant::now());
    shaped_requests_pass_within_the_global_limit(Limiter::new(MemoryStore::with_clock(clock)))
        .await;
}

/// A held request whose client goes away gives its queue slot back, and the global window,
/// left to its release, never counted it: a's next request takes the slot and the
/// window's second unit.
#[tokio::test(start_paused = true)]
async fn a_dropped_shaped_request_is_counted_nowhere() {
    use tower::ServiceExt;

    let start = tokio::time::Instant::now();
    let limiter = Limiter::new(MemoryStore::with_clock(TokioClock(start)));
    let (service, passed) = shaping_service(limiter, tollgate::layer::Mode::Enforce, start);
    let s = Duration::from_secs;
    let ok = |r: http::Response<_>| r.status().as_u16();
    assert_eq!(
        ok(service.clone().oneshot(from_user("a")).await.unwrap()),
        200
    );
    tokio::time::sleep(s(1)).await;
    let dropped = tokio::spawn(service.clone().oneshot(from_user("a")));
    tokio::time::sleep(s(4)).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    tokio::time::sleep(s(1)).await;
    // At 6 s: behind the first request only (it drains at 10 s), not behind the dropped one.
    let next = tokio::spawn(service.clone().oneshot(from_user("a")));
    assert_eq!(ok(next.await.unwrap().unwrap()), 200);
    // b at 11 s: the window has a's two requests that passed.
    tokio::time::sleep_until(start + s(11)).await;
    assert_eq!(
        ok(service.clone().oneshot(from_user("b")).await.unwrap()),
        429
    );
    assert_eq!(*passed.lock().unwrap(), [s(0), s(10)]);
}

/// Wait mode: a held request whose global window filled up while it queued waits again at
/// its release, for the next window, instead of being refused.
#[tokio::test(start_paused = true)]
async fn in_wait_mode_a_shaped_request_waits_again_at_its_release() {
    use tower::ServiceExt;

    let start = tokio::time::Instant::now();
    let limiter = Limiter::new(MemoryStore::with_clock(TokioClock(start)));
    let mode = tollgate::layer::Mode::Wait {
        max_wait: Duration::from_secs(120),
    };
    let (service, passed) = shaping_service(limiter, mode, start);
    let s = Duration::from_secs;
    let send = |user: &'static str, at: Duration| {
        let service = service.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(start + at).await;
            service
                .oneshot(from_user(user))
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    // a queues its second request until 55 s; b and c fill the window at 50 s and 52 s.
    let requests = [
        send("a", s(45)),
        send("a", s(46)),
        send("b", s(50)),
        send("c", s(52)),
    ];
    let mut statuses = Vec::new();
    for request in requests {
        statuses.push(request.await.unwrap());
    }
    assert_eq!(statuses, [200; 4]);
    let passed = passed.lock().unwrap().clone();
    // a's first and b pass in [0, 60 s) (c waits, a's second too, for the next minute).
    assert_eq!(
        passed.iter().filter(|t| **t < s(60)).count(),
        2,
        "{passed:?}"
    );
    assert_eq!(
        passed
            .iter()
            .filter(|t| **t >= s(60) && **t < s(120))
            .count(),
        2,
        "{passed:?}"
    );
}

/// Shadow mode holds nothing, so the rules left to a shaped request's release count it at
/// once: the global window of 2 a minute would refuse a's third to fifth requests.
#[tokio::test(start_paused = true)]
async fn in_shadow_mode_shaped_requests_count_on_every_rule() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tollgate::key;
    use tollgate::layer::{Limit, Mode, RateLimitLayer};
    use tower::{service_fn, ServiceBuilder, ServiceExt};

    let start = tokio::time::Instant::now();
    let limiter = Limiter::new(MemoryStore::with_clock(TokioClock(start)));
    let would_deny = Arc::new(AtomicUsize::new(0));
    let seen = would_deny.clone();
    let layer = RateLimitLayer::builder()
        .limiter(limiter)
        .limit(Limit::new(
            Rule::leaky_bucket("per-user", 5, Rate::new(1, Duration::from_secs(10))),
            key::header("user-id"),
        ))
        .limit(Limit::new(
            Rule::fixed_window("global", 2, Duration::from_secs(60)),
            key::global(),
        ))
        .mode(Mode::Shadow)
        .observe(crate::support::service::Watch(
            move |event: &tollgate::layer::DecisionEvent<'_>| {
                if event.outcome.is_ok_and(|o| !o.is_admitted()) {
                    seen.fetch_add(1, Ordering::Relaxed);
                }
            },
        ))
        .build()
        .expect("valid layer");
    let service = ServiceBuilder::new().layer(layer).service(service_fn(
        |_req: http::Request<String>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        },
    ));
    for _ in 0..5 {
        let response = service.clone().oneshot(from_user("a")).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(would_deny.load(Ordering::Relaxed), 3);
}

/// One client's long queue and a shared per-tenant queue with a shorter one: the client's
/// request is held until its own release, and the tenant's queue holds it too. Cancelled
/// before its release, it leaves the tenant's queue as if it had never come: another
/// client's request right after waits only for the water queued before it.
async fn a_cancelled_hold_frees_the_queue_it_held<S: Store + Clone>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let own = Rule::leaky_bucket("own", 10, Rate::new(1, Duration::from_millis(100)));
    let tenant = Rule::leaky_bucket("tenant", 20, Rate::new(1, Duration::from_millis(10)));
    let batch = [Check::new(&own, b"a"), Check::new(&tenant, b"acme")];
    let alone = |user: &'static [u8]| [Check::new(&tenant, user)];
    // a's queue: 100 ms of water; the tenant's: 10 ms (b's request).
    assert!(limiter
        .check(&[Check::new(&own, b"a")])
        .await
        .unwrap()
        .is_admitted());
    assert!(limiter.check(&alone(b"acme")).await.unwrap().is_admitted());
    let held = limiter.reserve(&batch, Duration::ZERO).await.unwrap();
    assert_eq!(
        held.outcome().decision,
        Decision::Delay(Duration::from_millis(100)),
        "{held:?}"
    );
    clock.set_micros(T0 + 4_000);
    held.cancel().await.unwrap();
    // As if a's request had never come: b's water has 6 ms left to drain.
    let next = limiter.check(&alone(b"acme")).await.unwrap();
    assert_eq!(
        next.decision,
        Decision::Delay(Duration::from_millis(6)),
        "{next:?}"
    );
}

/// [`a_cancelled_hold_frees_the_queue_it_held`] on MemoryStore.
#[tokio::test(start_paused = true)]
async fn a_cancelled_hold_frees_the_queue_it_held_on_memory() {
    let (limiter, clock) = memory();
    a_cancelled_hold_frees_the_queue_it_held(&limiter, &clock).await;
}

/// [`a_cancelled_hold_frees_the_queue_it_held`] on a Redis server.
#[tokio::test(start_paused = true)]
async fn a_cancelled_hold_frees_the_queue_it_held_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = Still::connect(&server.url()).await;
    let limiter = Limiter::new(store.with_clock(clock.clone()));
    a_cancelled_hold_frees_the_queue_it_held(&limiter, &clock).await;
}
