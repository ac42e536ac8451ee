//! # When Redis is away
//!
//! A Redis outage should cost no latency and leave a sensible limit in force. Two store
//! wrappers do that, for the layer and for [`Limiter`](crate::Limiter) users alike.
//!
//! ```no_run
//! use std::time::Duration;
//! use tollgate::store::{Breaker, Fallback};
//! use tollgate::store::RedisStore;
//! use tollgate::{Limiter, store::Health};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let redis = RedisStore::connect("redis://127.0.0.1/")
//!     .await?
//!     .with_timeout(Duration::from_millis(100));
//! // Three replicas share this Redis: while it is away each admits a third of each quota.
//! let limiter = Limiter::new(Fallback::new(Breaker::new(redis)).instances(3));
//! // Give `limiter` to the layer with `.on_failure(FailurePolicy::Fallback)`.
//! // For a readiness probe: Healthy, Degraded (the local store decides) or Failing.
//! assert_eq!(limiter.health(), Health::Healthy);
//! # Ok(()) }
//! ```
//!
//! - [`Breaker`](crate::store::Breaker) opens after 3 consecutive failures or timeouts; while
//!   open no call is sent and requests go straight to the failure policy, until a `PING`
//!   of its own finds Redis back.
//! - [`Fallback`](crate::store::Fallback) decides from an in-process `MemoryStore` with the
//!   same rules whenever the primary fails, and from Redis again as soon as it answers (a
//!   polled readiness endpoint recovers with no request).
//!
//! What a client sees during an outage, by [`FailurePolicy`](crate::layer::FailurePolicy):
//!
//! | policy | latency | answer | limits that hold |
//! |---|---|---|---|
//! | `FailOpen` (default), no breaker | every request waits the timeout while Redis hangs; a refused connection fails at once | forwarded | none |
//! | `FailOpen` + `Breaker` | the store timeout for the first few requests (until the breaker opens); then at once | forwarded | none |
//! | `FailClosed` (+ `Breaker`) | as above | `503` (gRPC `UNAVAILABLE`) | everything is refused |
//! | `Fallback` (`Fallback<Breaker<RedisStore>>`) | as above; then microseconds | the local decision: forwarded, or `429` with `Retry-After` and `RateLimit` headers | every rule, per instance (each quota divided by `instances(n)`) |
//!
//! ## What the local decisions mean for the shared counts
//!
//! Redis never learns of them. When it returns, its counts are those it had (or empty after
//! a restart without persistence), so over a window spanning the outage a client can get
//! its quota locally from each instance plus its quota from Redis afterwards; with
//! `instances(n)` set to the number of replicas the outage itself admits about one quota in
//! all. A lock set locally holds on that instance only.
//!
//! A **timed-out** call is decided by the policy, never also by Redis's late answer; Redis
//! may still have counted it, once (no call is ever sent again).
//!
//! In a **Cluster**, a dead master's slots follow the policy and the other slots are
//! decided by Redis as before (refused connections fail at once). The breaker counts
//! failures for the whole store: a master that hangs (rather than refusing) costs its slots
//! the timeout, since the answers from the other masters keep the breaker closed. Once
//! open, its `PING` goes to every master, and it closes only when all of them answer.
//!
//! The fault suite (`tests/faults/faults.rs`) stops, kills, flushes and disconnects Redis under
//! load; its figures are in `BENCHMARKS.md` ("Redis outages").
