//! # Several instances on Redis: standalone, Sentinel, Cluster, TLS, managed services
//!
//! A service running as several instances needs one limit across them, or each instance
//! admits a full quota. [`RedisStore`](crate::store::RedisStore) (feature `redis`) keeps
//! the state in Redis and decides each request with one call, whatever the number of
//! rules, atomically, on the Redis server's clock (so the instances' clocks may disagree).
//!
//! ```no_run
//! use std::time::Duration;
//! use tollgate::layer::{FailurePolicy, Limit, RateLimitLayer};
//! use tollgate::store::{Breaker, Fallback};
//! use tollgate::store::{RedisOptions, RedisStore};
//! use tollgate::{key, Limiter, Rate, Rule};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Keys `myapp:{<key>}:<rule>`, apart from other users of the same Redis.
//! let options = RedisOptions::new().prefix("myapp");
//! let redis = RedisStore::connect_with("redis://redis.internal:6379/", options)
//!     .await?
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
//! [`connect`](crate::store::RedisStore::connect) lists the URL forms (one server, Cluster,
//! Sentinel, each with TLS) and checks the deployment before it returns: a wrong URL or
//! password, a certificate that does not verify, a user without one of the permissions
//! below, or a replica is an error at start, naming the fix
//! ([`StoreError::Misconfigured`](crate::StoreError::Misconfigured)), rather than a limiter
//! that fails open for every request.
//!
//! ## TLS
//!
//! `rediss://` connects over TLS (rustls, with the `ring` provider), verifying the server's
//! certificate against the system's roots, which is what managed services' certificates
//! chain to. A private CA, and a client certificate for servers started with
//! `tls-auth-clients yes`, go in [`RedisOptions`](crate::store::RedisOptions) (its example
//! shows both); they apply to every node of a Cluster and to a Sentinel deployment's
//! sentinels and primary alike.
//!
//! A process whose dependencies enable several rustls providers (ring and aws-lc-rs) gets
//! ring installed as the process default at the first `rediss://` connect, unless it
//! installed one itself first.
//!
//! ## Sentinel
//!
//! `redis+sentinel://` asks the sentinels for the primary of `service_name`, checks with
//! `ROLE` that it is one, and follows it: a call that finds the connection lost, or the
//! server demoted (`READONLY`), has the sentinels asked again in the background every 100 ms
//! until a primary answers, so the store never writes to a replica and never waits on the
//! sentinels on a request's path. The URL's credentials and database are the primary's;
//! sentinels that require a password of their own get it from
//! [`RedisOptions::sentinel_auth`](crate::store::RedisOptions::sentinel_auth).
//!
//! A primary the sentinels name later gets the checks the first got at `connect` (again
//! every second while it fails them), and a warning says that what the old primary held
//! (counters, penalty locks, held units) may be lost.
//!
//! ## Failover
//!
//! What a primary killed under load costs, on Sentinel and on a Cluster, is measured in
//! `BENCHMARKS.md` ("Failover with replicas", with its command). What holds:
//!
//! - No request waits longer than the store's timeout: calls to a dead primary fail at
//!   once, and the failure policy decides them (see [`when_redis_is_away`](super::when_redis_is_away)).
//! - The time to the new primary is the deployment's detection (`down-after-milliseconds`,
//!   `cluster-node-timeout`) plus its election; the store adds at most 100 ms. The code is
//!   on the promoted replica: the function library is replicated, and a script is loaded
//!   again on its first `NOSCRIPT`.
//! - What a failover can cost the limit: replication is asynchronous, so decisions the old
//!   primary acknowledged but had not yet sent to its replica are lost with it, and the
//!   new primary admits that many requests more in the windows current at the failover
//!   (at most one window of each rule; a penalty lock written then can be lost too). On
//!   a healthy replica that is the last few milliseconds of decisions. `WAIT` is not used:
//!   it would cost every decision a round trip to a replica.
//!
//! ## The ACL a deployment needs
//!
//! The least a Redis user needs, with the default prefix `tollgate` (for another prefix,
//! write it in place of `tollgate`, and pass it to `connect` with
//! [`RedisOptions::prefix`](crate::store::RedisOptions::prefix) so that `connect` checks
//! it):
//!
//! ```text
//! ACL SETUSER tollgate on >CHANGE-ME resetkeys ~tollgate:* resetchannels &tollgate:deny-cache -@all +ping +evalsha +script|load +time +get +psetex +pexpire +del +unlink +zadd +zcard +zcount +zrange +zrangebyscore +zrevrangebyscore +zrem +zremrangebyrank +publish
//! ```
//!
//! - the keys `~tollgate:*`: each rule's state and a sliding log's entries;
//! - `EVALSHA` and `SCRIPT LOAD`: the decisions (reloaded after a failover or `SCRIPT
//!   FLUSH`), and the commands they run: `TIME`, `GET`, `PSETEX`, `PEXPIRE`, `DEL`,
//!   `UNLINK` and the sorted-set commands of the sliding log; `DEL` also for
//!   [`Limiter::reset`](crate::Limiter::reset);
//! - `PUBLISH` on the channel `&tollgate:deny-cache`: a reset or refund tells the deny
//!   caches of every instance; `PING`: the breaker's probe, and the keepalive below.
//!
//! Add as the deployment needs: `+subscribe` for
//! [`with_deny_cache`](crate::store::RedisStore::with_deny_cache); `+fcall +function|load`
//! to run the decisions as a function library on Redis 7 (a little faster; without them the
//! script runs); `+info`, so that `connect` can tell a replica and the Redis version (without
//! it, the first write is what finds a replica); `+role` for Sentinel (the primary's role is
//! checked); `+cluster|slots` for a Cluster (the client learns the slots). Every command
//! and pattern of the line above is checked by `connect`, on a key and the channel of its
//! own, and a user missing one is refused with its name in the message
//! (`grant it +zadd`, `~tollgate:*`, `&tollgate:deny-cache`).
//!
//! ## Managed services
//!
//! Services that run Redis for you commonly require TLS (see above), rename or refuse
//! administrative commands, and some refuse `FUNCTION LOAD` or pub/sub. The store asks
//! little of them:
//! - without `FUNCTION LOAD` (or `FCALL`) it runs the script, which every service that
//!   allows Lua allows;
//! - without `SUBSCRIBE`, leave the deny cache off; `PUBLISH` is still needed (a reset tells
//!   the other instances' caches through it), so a service that refuses pub/sub entirely is
//!   refused at `connect`, naming `+publish`;
//! - `DEBUG`, `CONFIG` and `CLIENT PAUSE` are not needed; `INFO` is optional, denied by the
//!   user or renamed away (`rename-command INFO ""`) alike;
//! - an idle `timeout` costs nothing: the store pings its connection every 500 ms. Without
//!   `+ping` the connection may go idle, and the first request after each quiet period then
//!   fails (the failure policy decides it).
//!
//! ## Redis Cluster
//!
//! Give `connect` any node's URL (it detects a Cluster and discovers the others), or several
//! separated by commas (`redis://10.0.0.1:7000,redis://10.0.0.2:7000`).
//! The key is the hash tag, so all the rules of one key live in one slot and are decided by
//! one call; a batch spanning slots is split per slot and stays all or nothing (see
//! [`RedisStore`](crate::store::RedisStore)). What clients see while Redis is away:
//! [`when_redis_is_away`](super::when_redis_is_away).
//!
//! ## Several services, one Redis
//!
//! A rolling deploy that changes a rule under the same name carries its state over as
//! [Reconfiguring a rule](crate::Rule#reconfiguring-a-rule) says. Give unrelated services
//! their own prefix ([`RedisOptions::prefix`](crate::store::RedisOptions::prefix)) so that
//! their rule names cannot meet.
