//! The hyper example over real TCP: one layer, a route table, the peer address from a
//! `SocketAddr` extension.

#[path = "../../examples/hyper.rs"]
#[allow(dead_code)]
mod example;

use crate::support::{client_from, request, send};
use http::StatusCode;
use tollgate::{store::MemoryStore, Limiter};

/// One layer with a route table applies each route's own limits on top of the global one,
/// and a refused request consumes nothing from any of them.
#[tokio::test]
async fn a_route_table_in_one_layer_limits_each_route() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let layer = example::limits(Limiter::new(MemoryStore::new())).unwrap();
    tokio::spawn(example::serve(listener, layer));
    let client = client_from("127.0.0.1");
    let user = &[("user-id", &b"7"[..])];

    let sms = || request(addr, "POST", "/sms/send", user);
    let ok = send(&client, sms()).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(ok.body, "POST /sms/send\n");
    let denied = send(&client, sms()).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert!((1..=60).contains(&denied.retry_after()));
    // One batch: the global rule and the route's, and the refused request consumed nothing.
    assert_eq!(
        denied.header("ratelimit-policy"),
        "\"per-ip\";q=100;w=1, \"sms\";q=1;w=60"
    );
    for _ in 0..5 {
        send(&client, sms()).await;
    }
    let denied = send(&client, sms()).await;
    let state = denied.header("ratelimit");
    let per_ip: u64 = state
        .strip_prefix("\"per-ip\";r=")
        .and_then(|rest| rest.split(';').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{state}"));
    // 100 less the one admitted message (plus any refill): the six refusals took nothing.
    assert!(per_ip >= 99, "{state}");

    // Files share one limit per user across ids; other users are separate.
    for id in 0..30 {
        let reply = send(&client, request(addr, "GET", &format!("/files/{id}"), user)).await;
        assert_eq!(reply.status, StatusCode::OK, "file {id}");
    }
    let reply = send(&client, request(addr, "GET", "/files/31", user)).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    let other = send(
        &client,
        request(addr, "GET", "/files/31", &[("user-id", b"8")]),
    )
    .await;
    assert_eq!(other.status, StatusCode::OK);
}

/// A body type the layer does not know passes as the right side of an `Either` (as
/// `RejectionBody`'s docs show): a forwarded response keeps its own body, a refusal is
/// answered on the left with the rejection's text and its length.
#[tokio::test]
async fn a_body_of_another_crate_passes_through_either() {
    use http_body_util::{BodyExt, Either, Empty, Full};
    use hyper::body::{Body, Bytes};
    use tollgate::layer::{Limit, RateLimitLayer};
    use tollgate::{key, Rate, Rule};
    use tower::{ServiceBuilder, ServiceExt};

    let limit = Limit::new(Rule::gcra("all", 1, Rate::per_second(1)), key::global());
    let layer = RateLimitLayer::builder().limit(limit).build().unwrap();
    let service = ServiceBuilder::new()
        .layer(layer)
        .map_response(|r: http::Response<Empty<Bytes>>| r.map(Either::<Full<Bytes>, _>::Right))
        .service(tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Empty::<Bytes>::new()))
        }));
    let call = || service.clone().oneshot(http::Request::new(()));
    let passed = call().await.unwrap();
    assert_eq!(passed.status(), StatusCode::OK);
    assert!(matches!(passed.body(), Either::Right(_)));
    let refused = call().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let length = refused.body().size_hint().exact();
    let text = refused.into_body().collect().await.unwrap().to_bytes();
    assert!(text.starts_with(b"rate limit exceeded"), "{text:?}");
    assert_eq!(length, Some(text.len() as u64));
}
