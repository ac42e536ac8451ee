//! The tower layer: [`RateLimitLayer`], [`RateLimit`], [`ResponseFuture`].
//!
//! A [`RateLimitLayer`] applies [`Limit`]s — a [`Rule`](crate::Rule), the
//! [key](crate::key) it counts under, a cost — to the requests of any
//! `Service<http::Request<B>>` (axum, hyper, tonic, or a plain tower stack), with any body
//! type. All the limits of a request are decided as one batch by the
//! [`Limiter`](crate::Limiter): if one denies, none consumes.
//!
//! A layer is configured like tower-http's: [`RateLimitLayer::builder`], then steps that
//! take and return the builder, then [`build`](RateLimitLayerBuilder::build), which checks
//! the whole configuration once — every rule, key and route pattern, and how they fit
//! together — and reports every problem at once, each naming its rule or route. Rules
//! and keys built from literals need no `?`; a layer needs one.
//!
//! - **Per route.** Give one layer the global limits and a route table
//!   ([`RateLimitLayerBuilder::route`]): `"POST /sms/send"`, `"GET /files/{id}"`,
//!   `"/pkg.Service/Method"`, `"/api/*"`. A request's global and route limits are then one
//!   batch: a request the route refuses consumes nothing of the global limits. A pattern no
//!   request can match (`"post /x"`, `"POTS /x"`, axum 0.7's `/files/:id`, a `?`, a route
//!   an earlier one shadows) is a build error naming the fix, not a route that runs
//!   unlimited. Patterns are full paths as clients send them,
//!   also on a router mounted with axum's `Router::nest` (the layer reads axum's
//!   `OriginalUri`); the path is also matched as the nested router sees it, so a table
//!   written with the nested router's own paths limits too, and of the two the more
//!   specific route applies (a catch-all never hides a strict route). On axum a layer can also go on one route with `route_layer`; see
//!   [one layer or two](#one-layer-or-two).
//! - **Plans.** [`Plans`] chooses a limit's rule per request from the request's plan (free,
//!   pro, enterprise: a header the gateway sets, or an API key's plan looked up by a
//!   closure), with an explicit [`UnknownPlan`] policy; each plan keeps its own state.
//! - **Changed live.** [`RateLimitLayer::reloadable`] gives a [`ReloadHandle`] that replaces
//!   the configuration of the running layer atomically, with no lock on the request path;
//!   requests in flight finish under the rules they started with. With the `serde` feature
//!   the rules can come from a file (`tollgate::layer::rules_file`).
//! - **Exemptions.** [`RateLimitLayerBuilder::exempt`] lets health checks or an allow-list of
//!   addresses or API keys through, asked before any key is read.
//! - **Responses.** A denied request gets `429 Too Many Requests` with `Retry-After` (whole
//!   seconds, rounded up, never 0) and the `RateLimit-Policy` / `RateLimit` headers of
//!   draft-ietf-httpapi-ratelimit-headers-11, whose `t` for the deciding rule equals
//!   `Retry-After` (see [`response`]). A gRPC request (`content-type` exactly
//!   `application/grpc` or `application/grpc+…`) gets HTTP 200 with `grpc-status: 8`
//!   (`RESOURCE_EXHAUSTED`), which a tonic client sees as `Code::ResourceExhausted`, and
//!   the rich error model in `grpc-status-details-bin` (`google.rpc.RetryInfo` and
//!   `google.rpc.QuotaFailure`) for clients' retry policies; grpc-web gets the same in its
//!   own content type. A store failure under `FailClosed` is a 503 with `Retry-After: 1`; a
//!   key the server cannot provide is a 500 whose fix is logged, not sent.
//!   [`RateLimitLayerBuilder::on_reject`] replaces the response, seeing the request's head.
//!   Admitted responses carry `RateLimit-Policy` / `RateLimit` too, so that clients can
//!   slow down before they meet a 429 ([`RateLimitLayerBuilder::headers_on_allowed`] says
//!   why, and turns them off).
//! - **Modes** ([`Mode`]): enforce (the default), shadow (decide and report, never reject),
//!   wait (hold a request until its reserved slot comes due, up to `max_wait`). A leaky
//!   bucket's shaping delay is honoured the same way in enforce and wait modes; see
//!   [held requests](#held-requests).
//! - **Shadow rules.** [`Limit::shadow`] puts one rule in shadow inside the batch of enforced
//!   ones (one round trip): it keeps its state as if enforced and reports its would-be
//!   denials, but never rejects or holds a request. Rules in shadow — shadow limits, and
//!   every rule in shadow mode — are not advertised in the `RateLimit` headers.
//! - **Charging by outcome.** [`Limit::charge`] counts only the requests whose response
//!   status counts: failed logins only ([`Charge::failures`]), or everything but a failing
//!   backend's server errors ([`Charge::except_server_errors`]). Units are taken at
//!   admission and given back when the response does not count, so the requests that
//!   count never exceed the limit, however many run at once.
//! - **Costs settled by the response.** [`Limit::cost_from_response`] charges a request
//!   what its response says it cost (the bytes a handler served), against an estimate
//!   taken at admission: the difference is given back, or taken as a debt that the key's
//!   next requests pay.
//! - **Observability.** Each decision is a `tracing` span with its rule, outcome and store
//!   latency (the key only as a short digest), and, with the `metrics` feature, metrics by
//!   rule and outcome; see [`observe`]. [`RateLimitLayerBuilder::on_decision`] sees every
//!   decision too.
//! - **Store failures** follow the [`FailurePolicy`] (fail open by default), logged with
//!   `tracing`; they never panic. The layer's own log lines (store failures, shadow
//!   denials, key problems) come at most once per [`log_interval`](RateLimitLayerBuilder::log_interval)
//!   per kind (the first at once, then a summary with the count and the last error when
//!   the interval ends), so an outage or a rollout cannot flood the log, and its end is
//!   still reported.
//!
//! # Held requests
//!
//! In wait mode, and for a leaky bucket's shaping delay, the layer holds a request until its
//! reserved units come due, then forwards it. A held request:
//!
//! - **does not hold the inner service.** It waits with an idle clone of the inner service
//!   and drives that clone to readiness only after the wait, so a `ConcurrencyLimit` or
//!   `Buffer` inside the layer keeps serving other clients while one client's requests
//!   sleep (the permit a ready service holds is not taken into the wait).
//! - **is bounded.** At most [`RateLimitLayerBuilder::max_held`] requests are held at once
//!   (10,000 unless changed), and at most a tenth of that per (rule, key) that delays them
//!   ([`RateLimitLayerBuilder::max_held_per_key`]), so one client never takes every
//!   place. A request beyond a bound is
//!   refused as if denied: 429 with `Retry-After` its delay, rounded up; its units are given
//!   back.
//! - **gives its units back** when it is dropped before its release (its client hung up, a
//!   timeout above the layer fired): through [`Store::refund`](crate::store::Store::refund),
//!   once, best effort, never after the request was released, and never more than is
//!   exact (see that method for what each algorithm gives back). The refund of a store
//!   that answers at once runs where the request is dropped; another store's runs as a
//!   task on the tokio runtime. A request dropped while the store is still deciding has no
//!   units to give back yet: whatever that decision reserves stays taken; so does what a
//!   request dropped while it is being confirmed at its release (below) took.
//! - **is counted where it passes.** The rules on other keys than the leaky bucket that
//!   holds a request (a global or per-tenant limit beside a per-client queue) count it
//!   when its hold ends, not when it queues: the store checks them at once as they will
//!   stand at the release (a request they would deny then is refused now), and the layer
//!   confirms them at the release ([`Reservation::confirm`](crate::Reservation::confirm)). If other
//!   requests took their room in between, the held request is refused then (429; what it
//!   took is given back where that is exact: its queue slot when nothing queued behind
//!   it), so a shared window never admits more than its limit among the requests that
//!   pass in it, and one client's queue never closes a shared limit to the others. In wait
//!   mode the request may wait again at the release, for what is left of `max_wait` (its
//!   whole batch reserved anew, so that its leaky buckets let it go when it passes); in
//!   shadow mode, which holds nothing, they count it at once. Confirming costs a second
//!   store call (and a boxed future) for such requests only; metrics and the `rate_limit`
//!   span see the confirmed rules a second time, with their outcome at the release, and
//!   `on_decision` sees the confirmation as a second decision.
//! - **costs memory** until it is released: its response future, the boxed hold (its
//!   [`Reservation`](crate::Reservation) and the batch it owns), the request itself (its
//!   head and whatever of its body has arrived) and the idle clone of the inner service;
//!   `max_held` bounds the total.
//!
//! Every clone of the service shares the limiter, the configuration and the layer's state,
//! so all clones — one per connection in hyper and axum — enforce the same limits (tower's
//! own `RateLimit` keeps its counter inside the service, so its clones do not).
//! `poll_ready` is the inner service's; the store is asked in `call`. A request decided by
//! a `MemoryStore` and admitted allocates nothing of the layer's own.
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
//! Nested layers are separate batches. With a `route_layer` inside a global layer (or two
//! layers stacked in a `ServiceBuilder`), the outer layer has already counted a request
//! when the inner one refuses it: a client refused by the SMS limit still spends its
//! global quota, and the `RateLimit` headers of the refusal show it. One layer with a route
//! table decides both as one batch, all or nothing. On axum it goes on the router like any
//! layer (with the `axum` feature, [`key::peer_ip`](crate::key::peer_ip) reads axum's
//! `ConnectInfo`):
//!
//! ```
//! # use std::time::Duration;
//! # use axum::{routing::{get, post}, Router};
//! # use tollgate::layer::{Limit, RateLimitLayer};
//! # use tollgate::{key, Limiter, Rate, Rule, store::MemoryStore};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = RateLimitLayer::builder()
//!     .limit(Limit::new(Rule::token_bucket("ip", 100, Rate::per_second(10)), key::peer_ip()))
//!     .route("POST /sms/send", [Limit::new(
//!         Rule::fixed_window("sms-min", 1, Duration::from_secs(60)),
//!         key::header("user-id"),
//!     )])
//!     .build()?;
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .route("/sms/send", post(|| async { "sent" }))
//!     .layer(limits);
//! # Ok(()) }
//! ```
//!
//! Two layers are the right tool when the limits must not be one batch: different stores
//! (a local `MemoryStore` in front of a shared Redis, to shed a flood before it costs a
//! round trip), different [modes](Mode) or failure policies, or a limit that should count
//! every attempt, refused or not (a login route's brute-force counter outside the global
//! limit). Then the outer layer counts what the inner refuses, by design.
//!
//! # tower's `RateLimit`
//!
//! tower has a `RateLimitLayer` and a `RateLimit` too (`tower::limit`, a per-service
//! counter, `ServiceBuilder::rate_limit`). tollgate keeps its names, since they say what the
//! types are; where both are imported, name tollgate's by path (`tollgate::layer::RateLimitLayer`)
//! or rename one (`use tollgate::layer::RateLimitLayer as Tollgate;`). For the same reason there is
//! no `ServiceBuilder` extension method: `ServiceBuilder::rate_limit` is tower's own and
//! would win; `.layer(layer)` reads as well.

mod batch;
mod body;
mod charge;
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

pub use body::RateLimitBody;
pub use charge::counts::Charge;
pub use config::{DecisionEvent, FailurePolicy, Limit, MissingKey, Mode};
pub use future::ResponseFuture;
pub use layer::{RateLimitLayer, RateLimitLayerBuilder};
pub use observe::observer::{DecisionObserver, RuleDecision};
pub use observe::rules::RuleInfo;
pub use plans::{select::PlanOf, Plans, UnknownPlan};
pub use reload::ReloadHandle;
pub use service::RateLimit;
