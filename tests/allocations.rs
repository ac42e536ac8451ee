//! What the per-request path allocates, counted by a global allocator (per thread, so tests
//! running in parallel do not see each other's allocations).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use tollgate::key::{self, KeyBuf, KeyExtractor, RequestHead};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
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
            buf.truncate(0);
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
            buf.truncate(0);
            extractor.extract(&head, &mut buf).unwrap();
        }
    });
    assert_eq!(buf.as_bytes(), b"\x02global");
    assert_eq!(n, 0, "{n} allocations for 100 requests");
}

/// What the layer allocates for an admitted request on a `MemoryStore`, as its docs say:
/// two (the boxed store future, the store's `Vec` of per-rule outcomes) without headers on
/// admitted responses; the `RateLimit` headers, on by default, up to eight more, whatever
/// the length of the rule's name (their lists are written into buffers sized up front).
#[test]
fn an_admitted_request_allocates_what_the_docs_say() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    use tollgate::layer::{Limit, RateLimitLayer};
    use tollgate::{Limiter, MemoryStore, Rate, Rule};
    use tower::{Layer, Service};

    let mut counts = Vec::new();
    for headers in [false, true] {
        let layer = RateLimitLayer::builder(Limiter::new(MemoryStore::new()))
            .limit(Limit::new(
                Rule::token_bucket("global", 1_000_000, Rate::per_second(1)),
                key::global(),
            ))
            .headers_on_allowed(headers)
            .build()
            .expect("a valid layer");
        let mut service = layer.layer(tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(()))
        }));
        let mut cx = Context::from_waker(Waker::noop());
        let mut admit = || {
            let _ = service.poll_ready(&mut cx);
            let request = http::Request::get("/").body(()).expect("a request");
            allocations_of(|| {
                let mut future = std::pin::pin!(service.call(request));
                match future.as_mut().poll(&mut cx) {
                    Poll::Ready(response) => assert!(response.is_ok()),
                    Poll::Pending => panic!("an in-process store answers at once"),
                }
            })
        };
        // The first request creates the store's entry.
        admit();
        let n = admit();
        counts.push(n);
    }
    assert_eq!(counts[0], 2, "without headers on admitted responses");
    assert!(
        counts[1] <= 10,
        "{} allocations with the headers",
        counts[1]
    );
}

/// A limit charged by outcome costs what the layer docs say: one more allocation for the
/// pending charge, and one more when the response does not count and the units are given
/// back (the boxed refund).
#[test]
fn a_charged_request_allocates_what_the_docs_say() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    use tollgate::layer::{Charge, Limit, RateLimitLayer};
    use tollgate::{Limiter, MemoryStore, Rule};
    use tower::{Layer, Service};

    let layer = RateLimitLayer::builder(Limiter::new(MemoryStore::new()))
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
        let mut response = http::Response::new(());
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
    assert_eq!(answer(401), 3, "a failure counts: nothing to give back");
    assert_eq!(answer(200), 4, "a success is given back");
}
