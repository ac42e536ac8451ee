//! The tower layer: [`RateLimitLayer`], [`RateLimit`], [`ResponseFuture`].
//!
//! A [`RateLimitLayer`] applies [`Limit`]s — a [`Rule`](crate::Rule), the [key](crate::key) it
//! counts under, a cost — to the requests of any `Service<http::Request<B>>` (axum, hyper,
//! tonic, or a plain tower stack). A request's limits are decided as one batch by the
//! [`Limiter`](crate::Limiter): if one denies, none consumes.
//!
//! - **Per route**: [`RateLimitLayerBuilder::route`]; **per plan**: [`Plans`];
//!   **exemptions**: [`RateLimitLayerBuilder::exempt`].
//! - **Changed live**: [`RateLimitLayer::reloadable`], and with the `serde` feature from a
//!   file (`tollgate::layer::rules_file`).
//! - **Responses** in the inner service's body type ([`RejectionBody`]): 429 with `Retry-After`
//!   and the IETF `RateLimit-Policy` / `RateLimit` headers, `RESOURCE_EXHAUSTED` for gRPC, 503
//!   for a store failure under `FailClosed` ([`response`], [`RateLimitLayerBuilder::on_reject`]).
//! - **Modes** ([`Mode`]): enforce, shadow, wait; one rule in shadow: [`Limit::shadow`].
//!   A delayed request is held: see [held requests](crate::guide::waiting_for_a_permit#held-requests).
//! - **By outcome**: [`Limit::charge`] counts only the responses that count (failed logins:
//!   [`Charge::failures`]); [`Limit::cost_from_response`] charges what the response says.
//! - **Observed** through one seam, [`DecisionObserver`], which the `tracing` span and the
//!   `metrics` feature share (see [`observe`]). **Store failures** follow the
//!   [`FailurePolicy`].
//!
//! Every clone of the service shares the limiter, the configuration and the layer's state,
//! so all clones — one per connection in hyper and axum — enforce the same limits. A request
//! decided by a `MemoryStore` and admitted allocates nothing of the layer's own.
//!
//! ```
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use tollgate::layer::{Limit, RateLimitLayer};
//! use tollgate::{key, Limiter, Rate, Rule, store::MemoryStore};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::new(MemoryStore::new());
//! let layer = RateLimitLayer::builder().limiter(limiter)
//!     // Everything: 1000 per second in all.
//!     .limit(Limit::new(Rule::gcra("global", 1000, Rate::per_second(1000)), key::global()))
//!     // SMS: one per minute and five per hour per user, decided together.
//!     .route("POST /sms/send", [
//!         Limit::new(Rule::fixed_window("sms-min", 1, Duration::from_secs(60)), key::header("user-id")),
//!         Limit::new(Rule::fixed_window("sms-hour", 5, Duration::from_secs(3600)), key::header("user-id")),
//!     ])
//!     .build()?;
//! let service = ServiceBuilder::new()
//!     .layer(layer)
//!     .service(service_fn(|_req: Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(String::from("sent")))
//!     }));
//!
//! let sms = || Request::post("/sms/send").header("user-id", "42").body(String::new());
//! let first = service.clone().oneshot(sms()?).await?;
//! assert_eq!(first.status(), StatusCode::OK);
//!
//! let second = service.clone().oneshot(sms()?).await?;
//! assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
//! let retry_after: u64 = second.headers()["retry-after"].to_str()?.parse()?;
//! assert!((1..=60).contains(&retry_after));
//! assert!(second.headers()["ratelimit-policy"].to_str()?.contains("\"sms-min\";q=1;w=60"));
//! assert!(second.headers()["ratelimit"].to_str()?.contains("\"sms-min\";r=0;t="));
//!
//! // Other routes only meet the global limit.
//! let other = service.oneshot(Request::get("/").body(String::new())?).await?;
//! assert_eq!(other.status(), StatusCode::OK);
//! # Ok(()) }
//! ```
//!
//! # One layer or two
//!
//! Nested layers are separate batches: the outer layer has already counted a request when
//! the inner one refuses it (a client refused by the SMS limit still spends its global
//! quota). One layer with a route table decides both as one batch, all or nothing; on axum
//! it goes on the router (`Router::layer`) like any layer, as the README shows.
//!
//! Two layers are the right tool when the limits must not be one batch: different stores
//! (a local `MemoryStore` in front of a shared Redis, to shed a flood before it costs a
//! round trip), different [modes](Mode) or failure policies, or a limit that should count
//! every attempt, refused or not. Then the outer layer counts what the inner refuses.
//!
//! # tower's `RateLimit`
//!
//! tower has a `RateLimitLayer` and a `RateLimit` too (`tower::limit`), whose counter lives
//! inside each service, so its clones do not share it. Where both are imported, name
//! tollgate's by path or rename one (`use tollgate::layer::RateLimitLayer as Tollgate;`).
//! There is no `ServiceBuilder` extension method: `ServiceBuilder::rate_limit` is tower's
//! own and would win.

mod batch;
mod body;
mod charge;
mod check;
mod config;
mod decide;
mod future;
mod headers;
mod held;
#[allow(clippy::module_inception)]
mod layer;
pub mod observe;
mod plans;
mod reload;
pub mod response;
mod routes;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod rules_file;
mod service;
mod state;

pub use body::RejectionBody;
pub use charge::counts::Charge;
pub use config::{FailurePolicy, Limit, MissingKey, Mode};
pub use future::ResponseFuture;
pub use layer::{RateLimitLayer, RateLimitLayerBuilder};
pub use observe::observer::{DecisionEvent, DecisionObserver, RuleDecision};
pub use observe::rules::RuleInfo;
pub use plans::{select::PlanOf, Plans, UnknownPlan};
pub use reload::ReloadHandle;
pub use service::RateLimit;
