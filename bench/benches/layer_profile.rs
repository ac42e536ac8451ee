//! A fixed workload for instruction-count profiles of the layer (`valgrind --tool=callgrind`):
//! `ROUNDS` requests to an axum hello-world called in process (`ServiceExt::oneshot`, the
//! request made as `benches/http.rs`'s server would hand it over: peer address in
//! `ConnectInfo`, a `user-id` header), bare or behind one of the HTTP bench's layers. Not a
//! timing benchmark: counts stay steady on a loaded machine where timings do not.
//!
//! `cargo bench -p tollgate-bench --bench layer_profile --no-run`, then
//! `valgrind --tool=callgrind target/release/deps/layer_profile-* <case> [rounds]`, with
//! `<case>` one of `bare`, `peer-ip`, `peer-ip-no-headers`, `header`, `governor`,
//! `governor-headers` (tower_governor with `use_headers()`, as tollgate sends its own),
//! `peer-ip-429`, `governor-429`, `governor-headers-429`. The difference between two runs of
//! different `rounds` divided by the difference in rounds is the cost of one request,
//! without the set-up; add `--toggle-collect='layer_profile::run*'` to count only the
//! requests (steadier). With the `admin` feature every tollgate layer has
//! `tollgate-admin`'s activity recorder as its observer: the request path's cost of the
//! operator's view.
//!
//! `LAYER_PROFILE_EVICT=<bytes>` writes a buffer that size before each request, as a
//! server's kernel work evicts the caches between two requests: with `--cache-sim=yes
//! --LL=<L2 size>,16,64 --toggle-collect='layer_profile::evict*'` added, the data misses per
//! request count the lines a request brings back from beyond L2. The code a request runs
//! through (distinct instructions and their cache lines): `--dump-instr=yes`, then
//! `bench/scripts/footprint.py`.

use std::hint::black_box;
use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use http::Request;
use tollgate::layer::{Limit, RateLimitLayer};
use tollgate::{key, Rule};
use tower::ServiceExt;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

#[path = "support/apps.rs"]
mod apps;
use apps::{hello, roomy, tight};

const ROUNDS: usize = 20_000;

fn tollgate(rule: Rule, key: impl tollgate::key::KeyExtractor, on_allowed: bool) -> Router {
    let builder = RateLimitLayer::builder()
        .limit(Limit::new(rule, key))
        .headers_on_allowed(on_allowed);
    #[cfg(feature = "admin")]
    let builder = builder.observe(tollgate_admin::Activity::new());
    hello().layer(builder.build().expect("a valid layer"))
}

fn request() -> Request<Body> {
    let mut req = Request::get("/")
        .header("host", "127.0.0.1")
        .header("user-id", "user-7")
        .body(Body::empty())
        .expect("a valid request");
    let peer = SocketAddr::from(([127, 0, 0, 1], 40_000));
    req.extensions_mut().insert(ConnectInfo(peer));
    req
}

/// Not inlined, so that `--toggle-collect='layer_profile::run*'` counts the requests only,
/// without the set-up (the clock's calibration varies from run to run). The app is given
/// its state first, as `axum::serve` does (`into_make_service`): without it, axum applies
/// the layers to the handler's route again on every request.
#[inline(never)]
fn run(app: Router, rounds: usize) -> usize {
    let mut evicted = std::env::var("LAYER_PROFILE_EVICT")
        .ok()
        .and_then(|bytes| bytes.parse().ok())
        .map(|bytes: usize| vec![0u8; bytes]);
    let svc = app.with_state::<()>(());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mut ok = 0;
        for _ in 0..rounds {
            if let Some(buffer) = evicted.as_mut() {
                evict(buffer);
            }
            let res = svc.clone().oneshot(black_box(request())).await;
            ok += usize::from(res.is_ok_and(|r| r.status().is_success()));
        }
        ok
    })
}

/// One write per cache line of `buffer`. Not inlined, so that a second `--toggle-collect`
/// leaves it out of the counts.
#[inline(never)]
fn evict(buffer: &mut [u8]) {
    for line in buffer.chunks_mut(64) {
        line[0] = line[0].wrapping_add(1);
    }
    black_box(buffer);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let case = args.first().map_or("peer-ip", String::as_str);
    let rounds = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(ROUNDS);
    let governor = |per_nanos: bool, headers: bool| {
        let mut builder = GovernorConfigBuilder::default();
        if per_nanos {
            builder.per_nanosecond(1).burst_size(u32::MAX);
        } else {
            builder.per_second(3600).burst_size(1);
        }
        if headers {
            let config = builder.use_headers().finish();
            hello().layer(GovernorLayer::new(config.expect("a valid governor config")))
        } else {
            let config = builder.finish();
            hello().layer(GovernorLayer::new(config.expect("a valid governor config")))
        }
    };
    let ok = match case {
        "bare" => run(hello(), rounds),
        "peer-ip" => run(tollgate(roomy(), key::peer_ip(), true), rounds),
        "peer-ip-no-headers" => run(tollgate(roomy(), key::peer_ip(), false), rounds),
        "header" => run(tollgate(roomy(), key::header("user-id"), true), rounds),
        "peer-ip-429" => run(tollgate(tight(), key::peer_ip(), true), rounds),
        "governor" => run(governor(true, false), rounds),
        "governor-429" => run(governor(false, false), rounds),
        "governor-headers" => run(governor(true, true), rounds),
        "governor-headers-429" => run(governor(false, true), rounds),
        other => {
            eprintln!("unknown case {other}");
            std::process::exit(2);
        }
    };
    println!("{case}: {ok} of {rounds} admitted");
}
