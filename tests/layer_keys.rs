//! Keys over real TCP: forwarded-address spoofing, IPv6 aggregation, and bad input (non-UTF-8
//! and 64 KB header values, malformed `Forwarded`, missing headers, no connection info).

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use support::{client_from, request, send, serve_axum};
use tollgate::key::{self, ForwardedHeader, KeyExtractor};
use tollgate::layer::{Limit, MissingKey, RateLimitLayer};
use tollgate::{Limiter, MemoryStore, Rule};

/// One request per minute per key.
fn one_per_minute(name: &str, key: impl key::KeyExtractor) -> Router {
    let layer = RateLimitLayer::new(Limiter::new(MemoryStore::new()))
        .limit(Limit::new(
            Rule::fixed_window(name, 1, Duration::from_secs(60)).unwrap(),
            key,
        ))
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

#[tokio::test]
async fn an_untrusted_peer_cannot_choose_its_address() {
    // Only 127.0.0.1 is a trusted proxy; 127.0.0.2 is a client talking to us directly.
    let addr = serve_axum(one_per_minute("ip", key::client_ip(["127.0.0.1"]).unwrap())).await;
    let client = client_from("127.0.0.2");
    let xff = |v: &'static str| request(addr, "GET", "/", &[("x-forwarded-for", v.as_bytes())]);

    assert_eq!(send(&client, xff("1.2.3.4")).await.status, StatusCode::OK);
    // A new made-up address does not make a new client.
    let reply = send(&client, xff("5.6.7.8")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    let reply = send(&client, request(addr, "GET", "/", &[])).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_forwarded_address_is_the_client() {
    let addr = serve_axum(one_per_minute("ip", key::client_ip(["127.0.0.1"]).unwrap())).await;
    let proxy = client_from("127.0.0.1");
    let xff = |v: &'static str| request(addr, "GET", "/", &[("x-forwarded-for", v.as_bytes())]);

    assert_eq!(send(&proxy, xff("1.2.3.4")).await.status, StatusCode::OK);
    assert_eq!(
        send(&proxy, xff("1.2.3.4")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another client behind the same proxy has its own limit.
    assert_eq!(send(&proxy, xff("5.6.7.8")).await.status, StatusCode::OK);
    // A client that prepends a fake address is still itself: the proxy appended the real one.
    assert_eq!(
        send(&proxy, xff("9.9.9.9, 1.2.3.4")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn ipv6_addresses_in_one_slash_64_share_a_limit() {
    let addr = serve_axum(one_per_minute("ip", key::client_ip(["127.0.0.1"]).unwrap())).await;
    let proxy = client_from("127.0.0.1");
    let xff = |v: &'static str| request(addr, "GET", "/", &[("x-forwarded-for", v.as_bytes())]);

    assert_eq!(
        send(&proxy, xff("2001:db8:1:2::1")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&proxy, xff("2001:db8:1:2:ffff:ffff:ffff:ffff"))
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&proxy, xff("2001:db8:1:3::1")).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn malformed_forwarded_headers_get_an_answer_not_a_panic() {
    let extractor = key::client_ip(["127.0.0.1"])
        .unwrap()
        .header(ForwardedHeader::Forwarded);
    let addr = serve_axum(one_per_minute("ip", extractor)).await;
    let proxy = client_from("127.0.0.1");
    let fwd = |v: &'static [u8]| request(addr, "GET", "/", &[("forwarded", v)]);

    // Unreadable entries end the walk at the proxy: all of these count as the proxy.
    assert_eq!(send(&proxy, fwd(b"for=")).await.status, StatusCode::OK);
    for garbage in [
        &b"for=\"[::1"[..],
        b";;;,,,===",
        b"for=\xff\xfe\xfd",
        b"by=1.2.3.4",
        b"for=999.1.1.1",
    ] {
        let reply = send(&proxy, fwd(garbage)).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{garbage:?}");
    }
    // A well-formed one still works.
    assert_eq!(
        send(&proxy, fwd(b"for=\"[2001:db8::1]:4711\";proto=https"))
            .await
            .status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn header_keys_take_any_bytes_and_any_length() {
    let addr = serve_axum(one_per_minute("user", key::header("user-id").unwrap())).await;
    let client = client_from("127.0.0.1");
    let user = |v: &[u8]| request(addr, "GET", "/", &[("user-id", v)]);

    // Not UTF-8: still a key.
    assert_eq!(
        send(&client, user(b"\xff\xfe\x80")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&client, user(b"\xff\xfe\x80")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // 64 KB: digested, but still the same client each time, and distinct from another.
    let big = vec![b'a'; 64 * 1024];
    let mut other = big.clone();
    other[40_000] = b'b';
    assert_eq!(send(&client, user(&big)).await.status, StatusCode::OK);
    assert_eq!(
        send(&client, user(&big)).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&client, user(&other)).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_missing_key_follows_the_rules_policy() {
    let limiter = Limiter::new(MemoryStore::new());
    let rule = || Rule::fixed_window("user", 1, Duration::from_secs(60)).unwrap();
    let reject = RateLimitLayer::new(limiter.clone())
        .limit(Limit::new(rule(), key::header("user-id").unwrap()))
        .unwrap();
    let skip = RateLimitLayer::new(limiter.clone())
        .limit(Limit::new(rule(), key::header("user-id").unwrap()).on_missing_key(MissingKey::Skip))
        .unwrap();
    let fallback = RateLimitLayer::new(limiter)
        .limit(Limit::new(
            rule(),
            key::header("user-id").unwrap().or(key::peer_ip()),
        ))
        .unwrap();
    let app = Router::new()
        .route("/reject", get(|| async { "ok" }).route_layer(reject))
        .route("/skip", get(|| async { "ok" }).route_layer(skip))
        .route("/fallback", get(|| async { "ok" }).route_layer(fallback));
    let addr = serve_axum(app).await;
    let client = client_from("127.0.0.1");

    let reply = send(&client, request(addr, "GET", "/reject", &[])).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.body, "missing rate limit key: header user-id\n");
    // An empty value is missing too.
    let reply = send(
        &client,
        request(addr, "GET", "/reject", &[("user-id", b"")]),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);

    for _ in 0..3 {
        let reply = send(&client, request(addr, "GET", "/skip", &[])).await;
        assert_eq!(reply.status, StatusCode::OK);
    }

    // Without a user id, the address is the key.
    let anonymous = || request(addr, "GET", "/fallback", &[]);
    assert_eq!(send(&client, anonymous()).await.status, StatusCode::OK);
    assert_eq!(
        send(&client, anonymous()).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_peer_ip_key_without_connection_info_is_a_generic_500() {
    let app = one_per_minute("ip", key::peer_ip());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    // Served without `into_make_service_with_connect_info`: a configuration mistake.
    tokio::spawn(async move { axum::serve(listener, app).await });
    let reply = send(&client_from("127.0.0.1"), request(addr, "GET", "/", &[])).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    // The fix is for the operator (it is logged), not for the client.
    assert_eq!(reply.body, "internal server error\n");
}
