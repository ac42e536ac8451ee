//! # A limit per client address behind a proxy
//!
//! Behind a proxy every request arrives from the proxy's address, so
//! [`key::peer_ip`](crate::key::peer_ip) would put all clients under one key. The client's
//! address is in a header the proxy writes — and clients can write it too.
//! [`key::client_ip`](crate::key::client_ip) reads it only from the proxies you trust, from
//! the right: the right-most address that is not a trusted proxy is the client.
//!
//! ```
//! use std::net::SocketAddr;
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use tollgate::layer::{Limit, RateLimitLayer};
//! use tollgate::{key, Limiter, Rule, store::MemoryStore};
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = RateLimitLayer::builder()
//!     .limit(Limit::new(
//!         Rule::fixed_window("per-client", 1, Duration::from_secs(60)),
//!         // The load balancers live in 10.0.0.0/8.
//!         key::client_ip(["10.0.0.0/8"]),
//!     ))
//!     .build()?;
//! let app = limits.layer(service_fn(|_req: Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
//! }));
//!
//! // What a hyper server does for each connection: the peer's address in the extensions
//! // (axum's `ConnectInfo` and tonic's `TcpConnectInfo` work as well).
//! let from = |peer: &str, forwarded_for: &str| -> Result<Request<()>, Box<dyn std::error::Error>> {
//!     let mut request = Request::get("/").header("x-forwarded-for", forwarded_for).body(())?;
//!     request.extensions_mut().insert(peer.parse::<SocketAddr>()?);
//!     Ok(request)
//! };
//!
//! // 198.51.100.7, through the load balancer 10.0.0.5, once…
//! let first = app.clone().oneshot(from("10.0.0.5:40000", "198.51.100.7")?).await?;
//! assert_eq!(first.status(), StatusCode::OK);
//! // …then again, pretending to be someone else: the client wrote the left-most entry,
//! // the load balancer appended the address it saw. Still 198.51.100.7.
//! let spoofed = app.clone().oneshot(from("10.0.0.5:40001", "1.2.3.4, 198.51.100.7")?).await?;
//! assert_eq!(spoofed.status(), StatusCode::TOO_MANY_REQUESTS);
//! // Another client behind the same load balancer has its own quota.
//! let other = app.clone().oneshot(from("10.0.0.5:40002", "203.0.113.9")?).await?;
//! assert_eq!(other.status(), StatusCode::OK);
//! // A client reaching the service directly is keyed by its own address; its header is
//! // ignored, since anyone can write one.
//! let direct = app.clone().oneshot(from("192.0.2.1:5000", "203.0.113.9")?).await?;
//! assert_eq!(direct.status(), StatusCode::OK);
//! # Ok(()) }
//! ```
//!
//! ## Getting it right
//!
//! - **Trust exactly your proxies**, every hop that appends to the header (a CDN and a load
//!   balancer: both ranges). A forgotten hop becomes "the client" for all behind it; a
//!   trusted range clients can come from lets them choose their key.
//! - **Read the one header your proxy writes**:
//!   [`ClientIp::header`](crate::key::ClientIp::header)`(ForwardedHeader::Forwarded)` for
//!   RFC 7239, `XRealIp` for nginx's `X-Real-IP`.
//! - **IPv6 clients are grouped by /64**; a coarser limit per /48 is in
//!   [`key`](crate::key#holders-of-whole-ipv6-networks).
//! - **The peer's address must reach the layer** (see [`key::peer_ip`](crate::key::peer_ip)).
