//! What the per-request path allocates, counted by a global allocator (per thread, so tests
//! running in parallel do not see each other's allocations).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use tollgate::key::{self, KeyBuf, KeyExtractor, RequestHead};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
    static BYTES: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        let _ = BYTES.try_with(|n| n.set(n.get() + layout.size()));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_of(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

fn bytes_of(f: impl FnOnce()) -> usize {
    let before = BYTES.with(Cell::get);
    f();
    BYTES.with(Cell::get) - before
}

/// `header("user-id").or(..)` is the documented way to limit signed-in users by id and
/// everyone else otherwise: an anonymous request must not pay for an error message that is
/// thrown away.
#[test]
fn a_missing_header_falling_back_allocates_nothing() {
    let extractor = key::header("user-id").or(key::global());
    let request = http::Request::get("/").body(()).unwrap();
    let head = RequestHead::from_request(&request);
    let mut buf = KeyBuf::new();
    let n = allocations_of(|| {
        for _ in 0..100 {
            buf = KeyBuf::new();
            extractor.extract(&head, &mut buf).unwrap();
        }
    });
    // Tagged as the fallback's second branch, so no user named `global` shares it.
    assert_eq!(buf.as_bytes(), b"\x02global");
    assert_eq!(n, 0, "{n} allocations for 100 requests");
}

/// A key header sent twice is refused with a shared message, so falling back from it costs
/// no allocation either: a client cannot make the server allocate by duplicating it.
#[test]
fn a_duplicated_header_falling_back_allocates_nothing() {
    let extractor = key::header("user-id").or(key::global());
    let request = http::Request::get("/")
        .header("user-id", "a")
        .header("user-id", "b")
        .body(())
        .unwrap();
    let head = RequestHead::from_request(&request);
    let mut buf = KeyBuf::new();
    let n = allocations_of(|| {
        for _ in 0..100 {
            buf = KeyBuf::new();
            extractor.extract(&head, &mut buf).unwrap();
        }
    });
    assert_eq!(buf.as_bytes(), b"\x02global");
    assert_eq!(n, 0, "{n} allocations for 100 requests");
}

/// What the layer adds to an admitted request on a `MemoryStore`, pinned so that it cannot
/// grow unnoticed: none without headers on admitted responses (the decision is taken in
/// `call`, without a future, and the store's per-rule outcomes are inline), and none with
/// the `RateLimit` headers (on by default) either: the `RateLimit-Policy` value is rendered
/// once, when the layer is built, the `RateLimit` value is written in the thread's spare
/// buffer, which one allocation renews every few dozen responses, and the headers go
/// straight into the response's map. The inner service answers like axum's hello-world,
/// with a `content-type`, so the map has room already.
#[test]
fn an_admitted_request_allocates_what_the_docs_say() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    use tollgate::layer::{Limit, RateLimitLayer};
    use tollgate::{Rate, Rule};
    use tower::{Layer, Service};

    fn call<S>(service: &mut S) -> usize
    where
        S: Service<http::Request<()>>,
        S::Error: std::fmt::Debug,
    {
        let mut cx = Context::from_waker(Waker::noop());
        let _ = service.poll_ready(&mut cx);
        let request = http::Request::get("/").body(()).expect("a request");
        allocations_of(|| {
            let mut future = std::pin::pin!(service.call(request));
            match future.as_mut().poll(&mut cx) {
                Poll::Ready(response) => assert!(response.is_ok()),
                Poll::Pending => panic!("an in-process store answers at once"),
            }
        })
    }
    let hello = tower::service_fn(|_: http::Request<()>| async {
        let mut response = http::Response::new(bytes::Bytes::new());
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        Ok::<_, std::convert::Infallible>(response)
    });
    // `ServiceFn` is `Copy`: each use below is a fresh service.
    let mut bare_service = hello;
    let bare = call(&mut bare_service);

    let mut added = Vec::new();
    for (headers, name) in [
        (false, "global"),
        (true, "global"),
        (true, "a-much-longer-rule-name"),
    ] {
        let layer = RateLimitLayer::builder()
            .limit(Limit::new(
                Rule::token_bucket(name, 1_000_000, Rate::per_second(1)),
                key::global(),
            ))
            .headers_on_allowed(headers)
            .build()
            .expect("a valid layer");
        let mut service = layer.layer(hello);
        // The first request creates the store's entry (and the thread's spare buffer).
        call(&mut service);
        added.push(call(&mut service) - bare);
        let hundred: usize = (0..100).map(|_| call(&mut service) - bare).sum();
        assert!(
            hundred <= 10,
            "{name}: {hundred} allocations for 100 requests"
        );
    }
    assert_eq!(
        added,
        [0, 0, 0],
        "allocations the layer adds (bare: {bare})"
    );
}

/// A single-rule decision on a warm key allocates nothing, whatever the algorithm, through
/// `check_one`, `check`, `reserve` and their synchronous twins, admitted or denied: the
/// outcome of a rule or two is held inline and the entry exists already. (A rule with a
/// penalty puts its bookkeeping on the heap at the first denial it counts: once per key,
/// before the count here; see `a_penalty_allocates_once_per_key`.)
#[test]
fn a_single_rule_decision_on_a_warm_key_allocates_nothing() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;
    use tollgate::{
        store::{MemoryStore, Store},
        Check, Limiter, ManualClock, Penalty, Rate, Rule,
    };

    fn ready<F: Future>(fut: F) -> F::Output {
        match std::pin::pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(out) => out,
            Poll::Pending => panic!("an in-process store answers at once"),
        }
    }

    let second = Duration::from_secs(1);
    let rules = [
        Rule::fixed_window("fw", 2, second),
        Rule::sliding_window("sw", 2, second),
        Rule::token_bucket("tb", 2, Rate::per_second(2)),
        Rule::leaky_bucket("lb", 2, Rate::per_second(2)),
        Rule::gcra("gcra", 2, Rate::per_second(2)),
        Rule::gcra("locks", 2, Rate::per_second(2)).with_penalty(Penalty::lock_for(second)),
    ];
    let clock = ManualClock::new(crate::support::EPOCH);
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
    for rule in &rules {
        // The first request creates the entry; a penalty's first counted denial its
        // bookkeeping.
        assert!(ready(limiter.check_one(rule, b"alice"))
            .unwrap()
            .is_admitted());
        if rule.penalty().is_some() {
            let denied = (0..10).any(|_| {
                !limiter
                    .check_now(&[Check::new(rule, b"alice")])
                    .unwrap()
                    .is_admitted()
            });
            assert!(denied, "{}: a denial before the count", rule.name());
            clock.advance(Duration::from_secs(10));
        }
        let mut admitted = 0;
        let n = allocations_of(|| {
            for _ in 0..4 {
                let one = ready(limiter.check_one(rule, b"alice")).unwrap();
                let batch = ready(limiter.check(&[Check::new(rule, b"alice")])).unwrap();
                let held =
                    ready(limiter.store().check(&[Check::new(rule, b"alice")], second)).unwrap();
                let one_now = limiter.check_now(&[Check::new(rule, b"alice")]).unwrap();
                let batch_now = limiter.check_now(&[Check::new(rule, b"alice")]).unwrap();
                admitted += [one, batch, held, one_now, batch_now]
                    .iter()
                    .filter(|o| o.is_admitted())
                    .count();
            }
        });
        assert!(admitted > 0, "{}: some admitted", rule.name());
        assert!(admitted < 20, "{}: some denied", rule.name());
        assert_eq!(n, 0, "{}: {n} allocations for 20 decisions", rule.name());
        clock.advance(Duration::from_secs(10));
    }
}

/// A rule with a penalty allocates once per key, at the first denial it counts (its
/// bookkeeping leaves the map's entry for the heap), and never again for that key: not for
/// later denials, nor for the lock, nor once the lock is over.
#[test]
fn a_penalty_allocates_once_per_key() {
    use std::time::Duration;
    use tollgate::{store::MemoryStore, Check, Limiter, ManualClock, Penalty, Rule};

    let clock = ManualClock::new(crate::support::EPOCH);
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
    let second = Duration::from_secs(1);
    let rule =
        Rule::fixed_window("login", 1, second).with_penalty(Penalty::lock_for(second).after(2));
    assert!(limiter
        .check_now(&[Check::new(&rule, b"alice")])
        .unwrap()
        .is_admitted());
    let first = allocations_of(|| {
        assert!(!limiter
            .check_now(&[Check::new(&rule, b"alice")])
            .unwrap()
            .is_admitted());
    });
    assert_eq!(first, 1, "the first counted denial");
    let later = allocations_of(|| {
        for _ in 0..3 {
            assert!(!limiter
                .check_now(&[Check::new(&rule, b"alice")])
                .unwrap()
                .is_admitted());
        }
        clock.advance(second * 3);
        assert!(limiter
            .check_now(&[Check::new(&rule, b"alice")])
            .unwrap()
            .is_admitted());
        assert!(!limiter
            .check_now(&[Check::new(&rule, b"alice")])
            .unwrap()
            .is_admitted());
    });
    assert_eq!(later, 0, "later denials, the lock and after it");
}

/// A limit charged by outcome costs what the layer docs say: two more allocations (the
/// reservation and the batch it owns), and one more when the response does not count and
/// the units are given back.
#[test]
fn a_charged_request_allocates_what_the_docs_say() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    use tollgate::layer::{Charge, Limit, RateLimitLayer};
    use tollgate::Rule;
    use tower::{Layer, Service};

    let layer = RateLimitLayer::builder()
        .limit(
            Limit::new(
                Rule::fixed_window(
                    "failed-logins",
                    1_000_000,
                    std::time::Duration::from_secs(60),
                ),
                key::global(),
            )
            .charge(Charge::failures()),
        )
        .headers_on_allowed(false)
        .build()
        .expect("a valid layer");
    let mut service = layer.layer(tower::service_fn(|req: http::Request<u16>| async move {
        let mut response = http::Response::new(bytes::Bytes::new());
        *response.status_mut() = http::StatusCode::from_u16(*req.body()).expect("a status");
        Ok::<_, std::convert::Infallible>(response)
    }));
    let mut cx = Context::from_waker(Waker::noop());
    let mut answer = |status: u16| {
        let _ = service.poll_ready(&mut cx);
        let request = http::Request::get("/").body(status).expect("a request");
        allocations_of(|| {
            let mut future = std::pin::pin!(service.call(request));
            match future.as_mut().poll(&mut cx) {
                Poll::Ready(response) => assert!(response.is_ok()),
                Poll::Pending => panic!("an in-process store answers at once"),
            }
        })
    };
    answer(401);
    assert_eq!(answer(401), 2, "a failure counts: nothing to give back");
    assert_eq!(answer(200), 3, "a success is given back");
}

/// A long key costs a limit charged by outcome with a penalty what it costs any limit (one
/// copy, read from the request, before the store sees its 33-byte digest): the registry of
/// the requests that have not settled keeps the key's stored form, not copies of its bytes.
#[test]
fn a_long_key_charged_by_outcome_is_kept_as_its_digest() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    use tollgate::layer::{Charge, Limit, RateLimitLayer};
    use tollgate::{Penalty, Rule};
    use tower::{Layer, Service};

    let bytes_for = |len: usize| {
        let rule = Rule::fixed_window("logins", 1_000_000, std::time::Duration::from_secs(60))
            .with_penalty(Penalty::lock_for(std::time::Duration::from_secs(60)));
        let layer = RateLimitLayer::builder()
            .limit(Limit::new(rule, key::header("user")).charge(Charge::failures()))
            .headers_on_allowed(false)
            .build()
            .expect("a valid layer");
        let mut service = layer.layer(tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(bytes::Bytes::new()))
        }));
        let user = "u".repeat(len);
        let mut cx = Context::from_waker(Waker::noop());
        let mut request = || {
            let _ = service.poll_ready(&mut cx);
            let request = http::Request::get("/").header("user", &user).body(());
            let request = request.expect("a request");
            bytes_of(|| {
                let mut future = std::pin::pin!(service.call(request));
                match future.as_mut().poll(&mut cx) {
                    Poll::Ready(response) => assert!(response.is_ok()),
                    Poll::Pending => panic!("an in-process store answers at once"),
                }
            })
        };
        request();
        request()
    };
    let (short, long) = (bytes_for(200), bytes_for(100_000));
    assert!(
        long - short < 150_000,
        "a 100 kB key: {long} bytes allocated, against {short} for 200 bytes"
    );
}
