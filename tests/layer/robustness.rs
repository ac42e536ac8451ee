//! Robustness: arbitrary request heads (header bytes, forwarded chains, paths, methods, peer
//! addresses) and arbitrary rule configurations through the layer on a `MemoryStore`: no
//! panic, an answer from the expected set, and bounded memory (the store holds at most one
//! entry per rule and key it saw, and nothing once every rule has gone idle).
//!
//! 10,000 cases by default. For a long run:
//!
//! ```text
//! TOLLGATE_ROBUSTNESS_CASES=1000000 cargo test --release --all-features --test layer robustness
//! ```

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tollgate::key::{self, ForwardedHeader, KeyExtractor};
use tollgate::layer::{Limit, MissingKey, Mode, RateLimitLayer};
use tollgate::{store::MemoryStore, Limiter, ManualClock, Penalty, Rate, Rule};
use tower::{service_fn, ServiceBuilder, ServiceExt};

const BASE_MICROS: u64 = crate::support::EPOCH;

#[derive(Debug, Clone)]
struct RuleSpec {
    name: u8,
    algorithm: u8,
    quota: u64,
    period_ms: u64,
    penalty: Option<(u64, u64)>,
}

#[derive(Debug, Clone)]
enum KeySpec {
    Global,
    Method,
    Route,
    Header(String),
    ClientIp(Vec<String>, u8, u8),
    PeerIp(u8),
    Constant(Vec<u8>),
    HeaderOrPeer(String),
    Pair(String),
}

#[derive(Debug, Clone)]
struct LimitSpec {
    rule: RuleSpec,
    key: KeySpec,
    cost: Option<u64>,
    min_cost: u64,
    skip_missing: bool,
    shadow: bool,
}

#[derive(Debug, Clone)]
struct LayerSpec {
    global: Vec<LimitSpec>,
    routes: Vec<(String, Vec<LimitSpec>)>,
    mode: u8,
    max_held: usize,
}

#[derive(Debug, Clone)]
struct RequestSpec {
    advance_ms: u64,
    method: Vec<u8>,
    path: String,
    headers: Vec<(String, Vec<u8>)>,
    peer: Option<(bool, u128, u16)>,
}

fn rule_spec() -> impl Strategy<Value = RuleSpec> {
    (
        0u8..4,
        0u8..7,
        prop_oneof![1u64..10, Just(0u64), 0u64..1_000_000_000_000],
        prop_oneof![1u64..5_000, Just(0u64), 0u64..(400 * 86_400_000)],
        proptest::option::weighted(0.3, (0u64..5_000, 0u64..4)),
    )
        .prop_map(|(name, algorithm, quota, period_ms, penalty)| RuleSpec {
            name,
            algorithm,
            quota,
            period_ms,
            penalty,
        })
}

fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("x-forwarded-for".to_owned()),
        Just("forwarded".to_owned()),
        Just("x-real-ip".to_owned()),
        Just("user-id".to_owned()),
        "[a-zA-Z0-9_-]{0,12}",
        ".{0,8}",
    ]
}

fn key_spec() -> impl Strategy<Value = KeySpec> {
    let cidr = prop_oneof![
        Just("10.0.0.0/8".to_owned()),
        Just("fd00::/8".to_owned()),
        Just("127.0.0.1".to_owned()),
        Just("::ffff:10.0.0.0/104".to_owned()),
        "[0-9a-f.:/]{0,20}",
    ];
    prop_oneof![
        Just(KeySpec::Global),
        Just(KeySpec::Method),
        Just(KeySpec::Route),
        header_name().prop_map(KeySpec::Header),
        (proptest::collection::vec(cidr, 0..3), 0u8..3, 0u8..140)
            .prop_map(|(t, h, p)| KeySpec::ClientIp(t, h, p)),
        (0u8..140).prop_map(KeySpec::PeerIp),
        proptest::collection::vec(any::<u8>(), 0..160).prop_map(KeySpec::Constant),
        header_name().prop_map(KeySpec::HeaderOrPeer),
        header_name().prop_map(KeySpec::Pair),
    ]
}

fn limit_spec() -> impl Strategy<Value = LimitSpec> {
    (
        rule_spec(),
        key_spec(),
        proptest::option::of(prop_oneof![0u64..5, any::<u64>()]),
        0u64..3,
        any::<bool>(),
        proptest::bool::weighted(0.2),
    )
        .prop_map(
            |(rule, key, cost, min_cost, skip_missing, shadow)| LimitSpec {
                rule,
                key,
                cost,
                min_cost,
                skip_missing,
                shadow,
            },
        )
}

fn pattern() -> impl Strategy<Value = String> {
    let method = prop_oneof![
        Just(""),
        Just("GET "),
        Just("POST "),
        Just("post "),
        Just("DELETE ")
    ];
    let segment = prop_oneof![
        Just("a".to_owned()),
        Just("sms".to_owned()),
        Just("{id}".to_owned()),
        Just("*".to_owned()),
        Just("{*rest}".to_owned()),
        Just("..".to_owned()),
        "[ -~]{0,6}",
    ];
    (method, proptest::collection::vec(segment, 0..4))
        .prop_map(|(m, segments)| format!("{m}/{}", segments.join("/")))
}

fn layer_spec() -> impl Strategy<Value = LayerSpec> {
    (
        proptest::collection::vec(limit_spec(), 0..3),
        proptest::collection::vec(
            (pattern(), proptest::collection::vec(limit_spec(), 0..3)),
            0..3,
        ),
        0u8..3,
        0usize..4,
    )
        .prop_map(|(global, routes, mode, max_held)| LayerSpec {
            global,
            routes,
            mode,
            max_held,
        })
}

fn forwarded_chain() -> impl Strategy<Value = Vec<u8>> {
    let hop = prop_oneof![
        Just("203.0.113.7".to_owned()),
        Just("10.1.2.3".to_owned()),
        Just("[2001:db8::1]:4711".to_owned()),
        Just("for=\"[2001:db8::1]\"".to_owned()),
        Just("for=198.51.100.1;proto=https".to_owned()),
        Just("unknown".to_owned()),
        Just("::ffff:10.0.0.1".to_owned()),
        "[ -~]{0,20}",
    ];
    proptest::collection::vec(hop, 0..6).prop_map(|hops| hops.join(", ").into_bytes())
}

fn request_spec() -> impl Strategy<Value = RequestSpec> {
    let method = prop_oneof![
        Just(b"GET".to_vec()),
        Just(b"POST".to_vec()),
        Just(b"HEAD".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..10),
    ];
    let path = prop_oneof![
        Just("/sms/send".to_owned()),
        Just("/a/b".to_owned()),
        "/[ -~]{0,40}",
        ".{0,20}",
    ];
    let header = (
        header_name(),
        prop_oneof![
            forwarded_chain(),
            proptest::collection::vec(any::<u8>(), 0..160),
        ],
    );
    (
        prop_oneof![Just(0u64), 0u64..2_000, 0u64..100_000],
        method,
        path,
        proptest::collection::vec(header, 0..4),
        proptest::option::of((any::<bool>(), any::<u128>(), any::<u16>())),
    )
        .prop_map(|(advance_ms, method, path, headers, peer)| RequestSpec {
            advance_ms,
            method,
            path,
            headers,
            peer,
        })
}

fn rule(spec: &RuleSpec) -> Option<Rule> {
    let name = format!("r{}", spec.name);
    let period = Duration::from_millis(spec.period_ms);
    let q = spec.quota;
    let rule = match spec.algorithm {
        0 => Rule::fixed_window(name, q, period),
        1 => Rule::fixed_window_from_first_hit(name, q, period),
        2 => Rule::sliding_log(name, q.min(10_000), period),
        3 => Rule::sliding_window(name, q, period),
        4 => Rule::token_bucket(name, q, Rate::new(q.max(1), period)),
        5 => Rule::leaky_bucket(name, q, Rate::new(q.max(1), period)),
        _ => Rule::gcra(name, q, Rate::new(q.max(1), period)),
    }
    .checked()
    .ok()?;
    Some(match spec.penalty {
        Some((lock_ms, after)) => rule.with_penalty(
            Penalty::lock_for(Duration::from_millis(lock_ms))
                .after(after)
                .within(period),
        ),
        None => rule,
    })
}

fn ip_header(h: u8) -> ForwardedHeader {
    match h {
        0 => ForwardedHeader::XForwardedFor,
        1 => ForwardedHeader::Forwarded,
        _ => ForwardedHeader::XRealIp,
    }
}

fn limit(spec: &LimitSpec) -> Option<Limit> {
    let rule = rule(&spec.rule)?;
    let with = |key: Box<dyn FnOnce(Rule) -> Limit>| Some(key(rule.clone()));
    let limit = match &spec.key {
        KeySpec::Global => with(Box::new(|r| Limit::new(r, key::global()))),
        KeySpec::Method => with(Box::new(|r| Limit::new(r, key::method()))),
        KeySpec::Route => with(Box::new(|r| Limit::new(r, key::route()))),
        KeySpec::Header(name) => {
            let k = key::header(name);
            k.validate().ok()?;
            with(Box::new(move |r| Limit::new(r, k)))
        }
        KeySpec::ClientIp(trusted, h, prefix) => {
            let k = key::client_ip(trusted)
                .header(ip_header(*h))
                .ipv6_prefix(*prefix);
            k.validate().ok()?;
            with(Box::new(move |r| Limit::new(r, k)))
        }
        KeySpec::PeerIp(prefix) => {
            let k = key::peer_ip().ipv6_prefix(*prefix);
            k.validate().ok()?;
            with(Box::new(move |r| Limit::new(r, k)))
        }
        KeySpec::Constant(bytes) => {
            let k = key::constant(bytes.clone());
            with(Box::new(move |r| Limit::new(r, k)))
        }
        KeySpec::HeaderOrPeer(name) => {
            let k = key::header(name);
            k.validate().ok()?;
            let k = k.or(key::peer_ip());
            with(Box::new(move |r| Limit::new(r, k)))
        }
        KeySpec::Pair(name) => {
            let k = key::header(name);
            k.validate().ok()?;
            let k = (k, key::route());
            with(Box::new(move |r| Limit::new(r, k)))
        }
    }?;
    let mut limit = limit.min_cost(spec.min_cost);
    if let Some(cost) = spec.cost {
        limit = limit.cost(move |_| cost);
    }
    if spec.skip_missing {
        limit = limit.on_missing_key(MissingKey::Skip);
    }
    if spec.shadow {
        limit = limit.shadow();
    }
    Some(limit)
}

/// The one place the layer is built (its builder is the part of the API most likely to
/// change): every piece of configuration the layer refuses is left out, as a user would
/// fix it.
fn build_layer(spec: &LayerSpec, limiter: Limiter<MemoryStore>) -> RateLimitLayer<MemoryStore> {
    let mode = match spec.mode {
        0 => Mode::Enforce,
        1 => Mode::Shadow,
        _ => Mode::Wait {
            max_wait: Duration::from_millis(500),
        },
    };
    let mut layer = RateLimitLayer::builder()
        .limiter(limiter)
        .mode(mode)
        .max_held(spec.max_held.max(1));
    // One part at a time, each kept only if the whole still builds.
    for l in spec.global.iter().filter_map(limit) {
        let next = layer.clone().limit(l);
        if next.clone().build().is_ok() {
            layer = next;
        }
    }
    for (pattern, limits) in &spec.routes {
        let limits: Vec<Limit> = limits.iter().filter_map(limit).collect();
        let next = layer.clone().route(pattern, limits);
        if next.clone().build().is_ok() {
            layer = next;
        }
    }
    layer
        .build()
        .unwrap_or_else(|e| panic!("every part was accepted: {e}"))
}

fn request(spec: &RequestSpec) -> Request<String> {
    let method = Method::from_bytes(&spec.method).unwrap_or(Method::GET);
    let uri = spec
        .path
        .parse::<Uri>()
        .unwrap_or_else(|_| Uri::from_static("/"));
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .body(String::new())
        .unwrap_or_default();
    for (name, value) in &spec.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            request.headers_mut().append(name, value);
        }
    }
    if let Some((v6, bits, port)) = spec.peer {
        let ip = if v6 {
            IpAddr::V6(Ipv6Addr::from(bits))
        } else {
            IpAddr::V4(Ipv4Addr::from(bits as u32))
        };
        request.extensions_mut().insert(SocketAddr::new(ip, port));
    }
    request
}

/// Any request through any layer that builds gets an answer of 200, 429, 400 or 500, keeps
/// at most one store entry per rule and key, and leaves nothing behind once idle.
#[test]
fn arbitrary_requests_and_rules_through_the_layer() {
    let cases = std::env::var("TOLLGATE_ROBUSTNESS_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    // Held requests (leaky buckets, wait mode) sleep on tokio's clock: paused, it jumps.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(
            &(
                layer_spec(),
                proptest::collection::vec(request_spec(), 1..8),
            ),
            |(layer_spec, requests)| {
                let clock = ManualClock::new(BASE_MICROS);
                let store = MemoryStore::with_clock(clock.clone());
                let layer = build_layer(&layer_spec, Limiter::new(store.clone()));
                let svc = ServiceBuilder::new().layer(layer).service(service_fn(
                    |_req: Request<String>| async {
                        Ok::<_, Infallible>(Response::new(String::from("ok")))
                    },
                ));
                let rules = layer_spec.global.len()
                    + layer_spec.routes.iter().map(|r| r.1.len()).sum::<usize>();
                rt.block_on(async {
                    for (i, r) in requests.iter().enumerate() {
                        clock.advance(Duration::from_millis(r.advance_ms));
                        let response = svc.clone().oneshot(request(r)).await;
                        let Ok(response) = response;
                        let status = response.status();
                        prop_assert!(
                            [
                                StatusCode::OK,
                                StatusCode::TOO_MANY_REQUESTS,
                                StatusCode::BAD_REQUEST,
                                StatusCode::INTERNAL_SERVER_ERROR,
                            ]
                            .contains(&status),
                            "request {}: {}",
                            i,
                            status
                        );
                        // One entry per rule and key at most: each request adds at most
                        // one per rule that applies to it.
                        prop_assert!(store.stats().keys <= (i + 1) * rules.max(1));
                    }
                    Ok(())
                })?;
                // Idle keys cost nothing: past every window, lock and reservation
                // (periods below 400 days, a sliding window keeps two), the store empties.
                clock.advance(Duration::from_secs(802 * 86_400));
                store.purge_expired();
                prop_assert_eq!(store.stats().keys, 0);
                Ok(())
            },
        )
        .unwrap();
}
