//! # An API limited per user (`User-Id`)
//!
//! Each user gets 100 requests a minute, with bursts of up to 20, named by a `User-Id`
//! header that the API gateway sets after authenticating the caller.
//!
//! ```
//! use http::{Request, Response, StatusCode};
//! use tollgate::layer::{Limit, RateLimitLayer};
//! use tollgate::{key, Limiter, Rate, Rule, store::MemoryStore};
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = RateLimitLayer::builder()
//!     // GCRA: 100 a minute, evenly, after a burst of up to 20.
//!     .limit(Limit::new(
//!         Rule::gcra("api-user", 20, Rate::per_minute(100)),
//!         key::header("user-id"),
//!     ))
//!     .build()?;
//! let api = limits.layer(service_fn(|_req: Request<String>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(String::from("orders")))
//! }));
//! let as_user = |id: &str| Request::get("/api/orders").header("user-id", id).body(String::new());
//!
//! for _ in 0..20 {
//!     assert_eq!(api.clone().oneshot(as_user("42")?).await?.status(), StatusCode::OK);
//! }
//! let refused = api.clone().oneshot(as_user("42")?).await?;
//! assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert!(refused.headers().contains_key("retry-after"));
//! // Every user has a quota of their own.
//! assert_eq!(api.clone().oneshot(as_user("7")?).await?.status(), StatusCode::OK);
//! // A request without the header has no key: 400, naming the header.
//! let anonymous = api.clone().oneshot(Request::get("/api/orders").body(String::new())?).await?;
//! assert_eq!(anonymous.status(), StatusCode::BAD_REQUEST);
//! # Ok(()) }
//! ```
//!
//! ## The header must come from the gateway
//!
//! A key is only a limit if the client cannot choose it: a client that may write `User-Id`
//! gets a fresh quota per made-up id. So the gateway must *replace* the header, never
//! append to it (see [`Duplicates`](crate::key::Duplicates)); a request carrying it twice is
//! refused by default.
//!
//! ## Anonymous callers
//!
//! Without the header, the request is refused with 400 (the default). Fall back to the
//! peer's address with [`or`](crate::key::KeyExtractor::or), or skip the limit with
//! [`MissingKey::Skip`](crate::layer::MissingKey::Skip) and let another limit cover them.
//!
//! ```
//! use tollgate::key::{self, KeyExtractor};
//! use tollgate::layer::{Limit, MissingKey};
//! use tollgate::{Rate, Rule};
//!
//! let per_user_or_address = Limit::new(
//!     Rule::gcra("api", 20, Rate::per_minute(100)),
//!     key::header("user-id").or(key::peer_ip()),
//! );
//! let only_known_users = Limit::new(
//!     Rule::gcra("api-user", 20, Rate::per_minute(100)),
//!     key::header("user-id"),
//! )
//! .on_missing_key(MissingKey::Skip);
//! # let _ = (per_user_or_address, only_known_users);
//! ```
//!
//! A free tier and a paid one are [`Plans`](crate::layer::Plans); an exemption
//! ([`exempt`](crate::layer::RateLimitLayerBuilder::exempt)) lets an allow-list through
//! before any key is read.
