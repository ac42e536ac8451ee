//! # Several instances on Redis or Redis Cluster
//!
//! A service running as several instances needs one limit across them, or each instance
//! admits a full quota. [`RedisStore`](crate::store::RedisStore) (feature `redis`) keeps
//! the state in Redis and decides each request with one `EVALSHA`, whatever the number of
//! rules, atomically, on the Redis server's clock (so the instances' clocks may disagree).
//!
//! ```no_run
//! use std::time::Duration;
//! use tollgate::layer::{FailurePolicy, Limit, RateLimitLayer};
//! use tollgate::store::{Breaker, Fallback};
//! use tollgate::store::RedisStore;
//! use tollgate::{key, Limiter, Rate, Rule};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let redis = RedisStore::connect("redis://redis.internal:6379/")
//!     .await?
//!     // Keys `myapp:{<key>}:<rule>`, apart from other users of the same Redis.
//!     .with_prefix("myapp")
//!     // A decision that takes longer is decided by the failure policy.
//!     .with_timeout(Duration::from_millis(50))
//!     // Keys that are denied are answered here until their denial ends, without Redis.
//!     .with_deny_cache(10_000)
//!     .await?;
//! // While Redis is away, decide from a local store, each instance with a third of each
//! // quota (three instances); the breaker stops waiting on Redis after 3 failures.
//! let limiter = Limiter::new(Fallback::new(Breaker::new(redis)).instances(3));
//! let limits = RateLimitLayer::builder().limiter(limiter)
//!     .limit(Limit::new(Rule::gcra("api", 200, Rate::per_second(100)), key::header("user-id")))
//!     .on_failure(FailurePolicy::Fallback)
//!     .build()?;
//! # let _ = limits;
//! # Ok(()) }
//! ```
//!
//! [`connect`](crate::store::RedisStore::connect) checks the deployment before it returns: a
//! wrong URL or password, a user without script permissions, a replica, or a server older
//! than Redis 5.0 is an error at start, naming the fix, rather than a limiter that fails
//! open for every request.
//!
//! ## Redis Cluster
//!
//! Give `connect` any node's URL (it detects a Cluster and discovers the others), or several
//! with [`connect_cluster`](crate::store::RedisStore::connect_cluster):
//!
//! ```no_run
//! use tollgate::store::RedisStore;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let redis = RedisStore::connect_cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]).await?;
//! assert!(redis.is_cluster());
//! # Ok(()) }
//! ```
//!
//! The key is the hash tag (`{prefix}:{<key>}:<rule>`), so all the rules of one key live in
//! one slot and are decided by one call. A batch whose keys land in different slots (a
//! per-user and a per-address rule) is split per slot; if a later slot denies, the earlier
//! slots are refunded, so the batch is still all or nothing.
//!
//! ## When Redis is away
//!
//! Choose what happens, per layer ([`FailurePolicy`](crate::layer::FailurePolicy)):
//!
//! - `FailOpen` (the default) lets requests through unlimited: an outage of the limiter
//!   does not become an outage of the service. Put a [`Breaker`](crate::store::Breaker) in
//!   front of Redis so that requests stop waiting on a Redis that hangs.
//! - `FailClosed` refuses with 503 (gRPC `UNAVAILABLE`).
//! - `Fallback`, with a [`Fallback`](crate::store::Fallback) store: every rule still holds,
//!   per instance, from a local `MemoryStore`; Redis decides again as soon as it answers.
//!   [`Limiter::health`](crate::Limiter::health) says which is deciding, for a readiness
//!   probe (`cargo run --example ready`).
//!
//! A call that timed out is never sent again, so no request is counted twice.
//! [`when_redis_is_away`](super::when_redis_is_away) has a table of what clients see under
//! each policy.
//!
//! ## Several services, one Redis
//!
//! A rule's identity is its name and its parameters: the state of `Rule::fixed_window("api",
//! 100, 60 s)` is not read by `Rule::fixed_window("api", 50, 60 s)`, so a rolling deploy that
//! changes a rule never admits more than the stricter of the two would. Give unrelated
//! services their own prefix ([`with_prefix`](crate::store::RedisStore::with_prefix)) so that
//! their rule names cannot meet.
