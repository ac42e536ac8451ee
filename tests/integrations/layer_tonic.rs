//! A tonic server behind the layer and a tonic client: after the limit, the client sees
//! `Code::ResourceExhausted`; limits are per method.

#[path = "../../examples/tonic.rs"]
#[allow(dead_code)]
mod example;

use example::helloworld::HelloRequest;
use tollgate::{store::MemoryStore, Limiter};
use tonic::Code;

fn hello(name: &str) -> HelloRequest {
    HelloRequest { name: name.into() }
}

/// A tonic client past the limit gets `ResourceExhausted` with `retry-after` and
/// `ratelimit` metadata, and each method has its own limit.
#[tokio::test]
async fn a_tonic_client_sees_resource_exhausted_after_the_limit() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(example::serve(listener, Limiter::new(MemoryStore::new())));
    let mut client = example::connect(addr).await.unwrap();

    for _ in 0..3 {
        let reply = client.say_hello(hello("ann")).await.unwrap();
        assert_eq!(reply.into_inner().message, "hello, ann");
    }
    let status = client.say_hello(hello("ann")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("rate limit exceeded; retry after "),
        "{status:?}"
    );
    let retry_after: u64 = status
        .metadata()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .expect("retry-after in the status metadata");
    assert!((1..=60).contains(&retry_after));
    assert!(status
        .metadata()
        .get("ratelimit")
        .is_some_and(|v| v.to_str().unwrap().starts_with("\"say-hello\";r=0;")));

    // Another method has its own limit.
    let reply = client.say_goodbye(hello("ann")).await.unwrap();
    assert_eq!(reply.into_inner().message, "goodbye, ann");
}

/// A refused gRPC call carries a `RetryInfo` with the exact wait `retry-after` rounds up
/// and a `QuotaFailure` naming the rule that refused it.
#[tokio::test]
async fn a_tonic_client_reads_retry_info_and_the_quota_failure_from_the_status() {
    use tonic_types::StatusExt;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(example::serve(listener, Limiter::new(MemoryStore::new())));
    let mut client = example::connect(addr).await.unwrap();
    for _ in 0..3 {
        client.say_hello(hello("bob")).await.unwrap();
    }
    let status = client.say_hello(hello("bob")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    // What a Go or Python client's retry policy reads: the rich error model.
    let details = status
        .check_error_details()
        .expect("grpc-status-details-bin decodes as a google.rpc.Status");
    let delay = details
        .retry_info()
        .and_then(|r| r.retry_delay)
        .expect("a RetryInfo with a retry delay");
    assert!(delay > std::time::Duration::ZERO && delay <= std::time::Duration::from_secs(60));
    // The exact wait, of which Retry-After is the rounded-up whole seconds.
    let retry_after: u64 = status
        .metadata()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .expect("retry-after in the status metadata");
    assert_eq!(
        delay.as_secs() + u64::from(delay.subsec_nanos() > 0),
        retry_after
    );
    let quota = details.quota_failure().expect("a QuotaFailure");
    assert_eq!(quota.violations.len(), 1, "{quota:?}");
    assert_eq!(quota.violations[0].subject, "say-hello");
    assert!(
        quota.violations[0].description.contains("3 per 60 s"),
        "{quota:?}"
    );
}

/// The example client shows a refusal with its retry hint and quota failure, and a call
/// that is not refused with no details.
#[tokio::test]
async fn the_example_client_shows_the_rejection_with_its_retry_hint() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(example::serve(listener, Limiter::new(MemoryStore::new())));
    let mut client = example::connect(addr).await.unwrap();
    for _ in 0..3 {
        client.say_hello(hello("cy")).await.unwrap();
    }
    let status = client.say_hello(hello("cy")).await.unwrap_err();
    let shown = example::describe(&status);
    assert!(
        shown.starts_with("ResourceExhausted: rate limit exceeded; retry after "),
        "{shown}"
    );
    assert!(shown.contains("; RetryInfo: retry in "), "{shown}");
    assert!(shown.contains("; QuotaFailure: say-hello ("), "{shown}");
    // A call that is not refused carries no details to show.
    assert_eq!(
        example::describe(&tonic::Status::not_found("no such greeting")),
        "NotFound: no such greeting"
    );
}
