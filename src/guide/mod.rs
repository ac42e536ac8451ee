//! Guides: one page per use case, each with code that compiles and runs as a test.
//!
//! Each page starts from a problem, shows the configuration that solves it and what to watch
//! for. The Redis examples only compile (they need a server); the others run.
//!
//! | page | use case |
//! |---|---|
//! | [`api_limit_by_user_id`] | an API limited per user, keyed by a `User-Id` header a gateway sets |
//! | [`ip_behind_proxy`] | a limit per client address when the service sits behind a load balancer |
//! | [`sms_multi_level`] | SMS codes: 1 per minute, 5 per hour, 10 per day per phone, all or nothing |
//! | [`download_by_cost`] | downloads limited by size: a request costs what it fetches |
//! | [`login_lockout`] | brute-force protection: lock an address or account out after repeated failures |
//! | [`grpc_per_method`] | a tonic service limited per gRPC method, with `RetryInfo` for clients |
//! | [`waiting_for_a_permit`] | hold a request (or a job) until it may go, instead of refusing it |
//! | [`redis_instances`] | several instances sharing one limit on Redis or Redis Cluster (feature `redis`) |
//! | [`when_redis_is_away`] | what a Redis outage costs under each failure policy, and a local fallback |
//! | [`shadow_rollout`] | rolling out a new rule: watch what it would refuse before enforcing it |
//! | [`choosing_an_algorithm`] | the six algorithms: what each is for, its memory, exactness and cost |
//!
// A link to an item of a feature that is off goes to docs.rs, which documents them all.
#![cfg_attr(feature = "redis", doc = "[`redis_instances`]: redis_instances")]
#![cfg_attr(
    not(feature = "redis"),
    doc = "[`redis_instances`]: https://docs.rs/tollgate/latest/tollgate/guide/redis_instances/index.html"
)]

pub mod api_limit_by_user_id;
pub mod choosing_an_algorithm;
pub mod download_by_cost;
pub mod grpc_per_method;
pub mod ip_behind_proxy;
pub mod login_lockout;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis_instances;
pub mod shadow_rollout;
pub mod sms_multi_level;
pub mod waiting_for_a_permit;
pub mod when_redis_is_away;
