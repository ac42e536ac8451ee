//! # Downloads limited by size
//!
//! Each user may download 500 MB, refilled at 100 MB a minute. A request does not cost 1:
//! it costs the size of what it fetches. Every algorithm takes a cost, and a request that
//! costs more than what is left is refused with the exact wait until it would fit.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Check, Limiter, ManualClock, MemoryStore, Rate, Rule};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::new(MemoryStore::with_clock(ManualClock::new(0)));
//! // A bucket of 500 MB, refilled at 100 MB a minute.
//! let rule = Rule::token_bucket("download-mb", 500, Rate::per_minute(100));
//! let user = b"user-42";
//!
//! let iso = limiter.check(&[Check::new(&rule, user).with_cost(400)]).await?;
//! assert!(iso.is_admitted());
//! assert_eq!(iso.rules[0].info.remaining, 100);
//! // Another 400 MB does not fit: 300 MB more are needed, which takes 3 minutes.
//! let again = limiter.check(&[Check::new(&rule, user).with_cost(400)]).await?;
//! let denial = again.decision.denial().expect("over the quota");
//! assert_eq!(denial.retry_after, Some(Duration::from_secs(180)));
//! // A small file still fits in what is left.
//! assert!(limiter.check(&[Check::new(&rule, user).with_cost(12)]).await?.is_admitted());
//! // A file larger than the whole bucket can never be downloaded: no retry helps.
//! let huge = limiter.check(&[Check::new(&rule, user).with_cost(501)]).await?;
//! assert_eq!(huge.decision.denial().map(|d| d.retry_after), Some(None));
//! # Ok(()) }
//! ```
//!
//! ## In the layer
//!
//! [`Limit::cost`](crate::layer::Limit::cost) computes a request's cost from its head. Take
//! the size from what the server knows (the stored file), never from a number the client
//! sends: a client that writes `size=0` would download without limit. Clamp with
//! [`min_cost`](crate::layer::Limit::min_cost) so that no request is free.
//!
//! ```
//! use http::{Request, Response, StatusCode};
//! use tollgate::layer::{Limit, RateLimitLayer};
//! use tollgate::key::{self, RequestHead};
//! use tollgate::{Limiter, MemoryStore, Rate, Rule};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! /// The size of a stored file in MB, rounded up; `None` for no such file.
//! fn size_mb(name: &str) -> Option<u64> {
//!     let bytes: u64 = match name {
//!         "a.iso" => 400_000_000,
//!         "notes.txt" => 12_000,
//!         _ => return None,
//!     };
//!     Some(bytes.div_ceil(1_000_000))
//! }
//!
//! /// The name decoded as the handler's router decodes it (axum's `Path` percent-decodes):
//! /// `/files/%61.iso` is `a.iso`, and costs what `a.iso` costs.
//! fn cost(req: &RequestHead<'_>) -> u64 {
//!     let Some(raw) = req.uri().path().strip_prefix("/files/") else { return 0 };
//!     let name = percent_encoding::percent_decode_str(raw).decode_utf8();
//!     name.ok().and_then(|name| size_mb(&name)).unwrap_or(0)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = RateLimitLayer::builder(Limiter::new(MemoryStore::new()))
//!     .route("GET /files/*", [Limit::new(
//!         Rule::token_bucket("download-mb", 500, Rate::per_minute(100)),
//!         key::header("user-id"),
//!     )
//!     .cost(cost)
//!     // An unknown or empty file costs 1 MB: a request that costs nothing can be sent forever.
//!     .min_cost(1)])
//!     .build()?;
//! let files = ServiceBuilder::new()
//!     .layer(limits)
//!     .service(service_fn(|_req: Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(()))
//!     }));
//! let get = |path: &str| Request::get(path).header("user-id", "42").body(());
//!
//! assert_eq!(files.clone().oneshot(get("/files/a.iso")?).await?.status(), StatusCode::OK);
//! assert_eq!(files.clone().oneshot(get("/files/a.iso")?).await?.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(files.clone().oneshot(get("/files/notes.txt")?).await?.status(), StatusCode::OK);
//! # Ok(()) }
//! ```
//!
//! A token bucket suits downloads: a user may fetch a large file at once, then waits for
//! the refill. A fixed window of "500 MB per hour" works too, but lets 1000 MB through
//! across the turn of an hour (the chart in the README shows that boundary burst).
