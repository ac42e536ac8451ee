//! `RedisStore` against real Redis servers and Clusters: the vectors, connection handling,
//! the deny cache, concurrent limiters in one and in several processes.

#[path = "../support/mod.rs"]
mod support;

mod acl;
mod cluster;
mod concurrency;
mod connect;
mod deny_cache;
mod differential;
mod distributed;
mod failover;
mod fold;
mod idle;
mod leases;
mod parked;
mod promises;
mod readiness;
mod seams;
mod sentinel;
mod startup;
mod store;
mod tls;
