//! # Downloads limited by size
//!
//! Each user may download 500 MB, refilled at 100 MB a minute. A request does not cost 1:
//! it costs the size of what it fetches. Every algorithm takes a cost, and a request that
//! costs more than what is left is refused with the exact wait until it would fit.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Check, Limiter, ManualClock, Rate, Rule, store::MemoryStore};
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
//! In a layer, a download costs what its handler served: only the handler knows how the name
//! was spelt, whether the download resumed (`Range`), whether the file changed.
//! [`Limit::cost_from_response`](crate::layer::Limit::cost_from_response) settles what the
//! response says against the estimate taken at admission.
//!
//! The estimate, [`Limit::cost`](crate::layer::Limit::cost), decides admission. Take it from
//! what the server knows, never from a number the client sends (`size=0` would download
//! without limit), and clamp it with [`min_cost`](crate::layer::Limit::min_cost) so that no
//! request is free. An upper bound (the whole file's size) keeps the downloads in flight
//! within the quota however many run at once; with `min_cost(1)` alone, twenty downloads
//! started at once pass on 20 MB, and the key then waits until the rate has paid for what
//! they served.
//!
//! ```
//! use http::{Request, Response, StatusCode};
//! use tollgate::layer::{Limit, RateLimitLayer};
//! use tollgate::key::{self, RequestHead};
//! use tollgate::{Limiter, Rate, Rule, store::MemoryStore};
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! /// What the handler served, in MB, rounded up: it puts this in the response.
//! #[derive(Clone, Copy)]
//! struct ServedMb(u64);
//!
//! /// The size of a stored file in bytes; `None` for no such file.
//! fn size(name: &str) -> Option<u64> {
//!     match name {
//!         "a.iso" => Some(400_000_000),
//!         "notes.txt" => Some(12_000),
//!         _ => None,
//!     }
//! }
//!
//! /// The file a path names, decoded as the handler's router decodes it (axum's `Path`
//! /// percent-decodes): `/files/%61.iso` is `a.iso`.
//! fn name(path: &str) -> Option<String> {
//!     let raw = path.strip_prefix("/files/")?;
//!     percent_encoding::percent_decode_str(raw).decode_utf8().ok().map(|n| n.into_owned())
//! }
//!
//! /// The estimate: the whole file, in MB.
//! fn estimate(req: &RequestHead<'_>) -> u64 {
//!     name(req.uri().path()).and_then(|n| size(&n)).map_or(0, |bytes| bytes.div_ceil(1_000_000))
//! }
//!
//! /// The handler: serves the file, from the offset a `Range: bytes=N-` asks for.
//! async fn serve(req: Request<()>) -> Result<Response<String>, std::convert::Infallible> {
//!     let from = req.headers().get("range")
//!         .and_then(|r| r.to_str().ok()?.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok())
//!         .unwrap_or(0);
//!     let served = name(req.uri().path()).and_then(|n| size(&n)).map_or(0, |s: u64| s.saturating_sub(from));
//!     let mut response = Response::new(String::new());
//!     response.extensions_mut().insert(ServedMb(served.div_ceil(1_000_000)));
//!     Ok(response)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = RateLimitLayer::builder()
//!     .route("GET /files/*", [Limit::new(
//!         Rule::token_bucket("download-mb", 500, Rate::per_minute(100)),
//!         key::header("user-id"),
//!     )
//!     .cost(estimate)
//!     // An unknown or empty file costs 1 MB: a request that costs nothing can be sent forever.
//!     .min_cost(1)
//!     .cost_from_response(|res| res.extensions.get::<ServedMb>().map(|served| served.0))])
//!     .build()?;
//! let files = limits.layer(service_fn(serve));
//! let get = |path: &str| Request::get(path).header("user-id", "42");
//!
//! // A download resumed at 300 MB is admitted on the whole file, and costs the 100 MB it served.
//! let resumed = get("/files/a.iso").header("range", "bytes=300000000-").body(())?;
//! assert_eq!(files.clone().oneshot(resumed).await?.status(), StatusCode::OK);
//! // 400 MB are left: the whole file fits, and takes them.
//! assert_eq!(files.clone().oneshot(get("/files/a.iso").body(())?).await?.status(), StatusCode::OK);
//! // The quota is spent: refused, however the name is spelt.
//! for path in ["/files/a.iso", "/files/%61.iso", "/files/notes.txt"] {
//!     let refused = files.clone().oneshot(get(path).body(())?).await?;
//!     assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
//! }
//! # Ok(()) }
//! ```
//!
//! A token bucket suits downloads: a user may fetch a large file at once, then waits for the
//! refill; once debts are paid, no stretch of time serves more than the capacity plus the
//! refill (see [`cost_from_response`](crate::layer::Limit::cost_from_response)). A fixed
//! window of "500 MB per hour" works too, but lets 1000 MB through across the turn of an
//! hour; a debt above its 500 MB is carried into the following hours, 500 MB each.
//!
//! On axum, say what was served from the handler, as the `axum_routes` example's returns
//! `(Extension(Served { bytes }), body)`.
