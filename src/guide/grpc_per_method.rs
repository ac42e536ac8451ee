//! # A gRPC service limited per method
//!
//! A gRPC method's route is its path, `/package.Service/Method`, so a route table limits
//! each method on its own. A refused call gets `grpc-status: 8` (`RESOURCE_EXHAUSTED`), with
//! `google.rpc.RetryInfo` (the exact wait) and `QuotaFailure` (the rule) in
//! `grpc-status-details-bin`, which gRPC clients' retry policies read.
//!
//! On a tonic server the layer goes on the `Server` builder, in front of the generated
//! service (`examples/tonic.rs` is the whole server and a client, from a `.proto` file):
//!
//! ```text
//! tonic::transport::Server::builder()
//!     .layer(limits)
//!     .add_service(GreeterServer::new(MyGreeter))
//!     .serve(addr)
//! ```
//!
//! The layer over tonic needs the `tonic` feature, which also lets
//! [`key::peer_ip`](crate::key::peer_ip) read tonic's connection info. What a client sees,
//! shown here without a network:
//!
//! ```
//! use std::net::SocketAddr;
//! use std::time::Duration;
//! use http::{Request, Response};
//! use tollgate::layer::{Limit, RateLimitLayer};
//! use tollgate::{key, Limiter, Rule, store::MemoryStore};
//! use tonic::Code;
//! use tonic_types::StatusExt;
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let minute = Duration::from_secs(60);
//! let limits = RateLimitLayer::builder()
//!     .route("/helloworld.Greeter/SayHello", [Limit::new(
//!         Rule::fixed_window("say-hello", 3, minute),
//!         key::peer_ip(),
//!     )])
//!     .route("/helloworld.Greeter/SayGoodbye", [Limit::new(
//!         Rule::fixed_window("say-goodbye", 10, minute),
//!         key::peer_ip(),
//!     )])
//!     .build()?;
//! let server = limits.layer(service_fn(|_req: Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
//! }));
//! let call = |method: &str| -> Result<Request<()>, Box<dyn std::error::Error>> {
//!     let mut request = Request::post(format!("/helloworld.Greeter/{method}"))
//!         .header("content-type", "application/grpc")
//!         .body(())?;
//!     request.extensions_mut().insert("198.51.100.7:5000".parse::<SocketAddr>()?);
//!     Ok(request)
//! };
//!
//! for _ in 0..3 {
//!     let response = server.clone().oneshot(call("SayHello")?).await?;
//!     assert!(tonic::Status::from_header_map(response.headers()).is_none());
//! }
//! let refused = server.clone().oneshot(call("SayHello")?).await?;
//! // The status a tonic client's call returns.
//! let status = tonic::Status::from_header_map(refused.headers()).expect("a gRPC status");
//! assert_eq!(status.code(), Code::ResourceExhausted);
//! let delay = status.get_details_retry_info().and_then(|r| r.retry_delay).expect("RetryInfo");
//! assert!(delay > Duration::ZERO && delay <= minute);
//! let quota = status.get_details_quota_failure().expect("QuotaFailure");
//! assert_eq!(quota.violations[0].subject, "say-hello");
//!
//! // SayGoodbye has a limit of its own.
//! let goodbye = server.clone().oneshot(call("SayGoodbye")?).await?;
//! assert!(tonic::Status::from_header_map(goodbye.headers()).is_none());
//! # Ok(()) }
//! ```
//!
//! A whole service shares one limit with a prefix route (`"/helloworld.Greeter/*"`); a limit
//! over all methods goes in [`limit`](crate::layer::RateLimitLayerBuilder::limit), decided in
//! the same batch. Metadata is HTTP headers: [`key::header`](crate::key::header)`("x-api-key")`.
//! Requests that are not gRPC get an HTTP 429 instead.
