//! Every algorithm's promise under every verb, on Redis: the random schedules of
//! `support::promise_schedule`, checked by the reference of `support::promises`, on one
//! server with two instances sharing it, each with the deny cache on (a denial one caches
//! must say what Redis says after the other overdraws or resets), and on a 3-node Cluster
//! with batches whose rules count on two keys (two slots). `TOLLGATE_PROMISE_CASES` sets
//! the schedules per configuration. The twin comparison with `MemoryStore` stays in
//! `differential.rs`.

use tollgate::store::RedisStore;
use tollgate::{Limiter, ManualClock};

use crate::support::promise_driver::{run_schedules, runtime, Target};
use crate::support::redis_server::{RedisCluster, RedisServer};
use crate::support::vectors::BASE_MICROS;

/// One server, two instances with the deny cache on, a prefix per schedule.
#[test]
fn redis_keeps_every_promise() {
    let server = RedisServer::start();
    let rt = runtime(false);
    let base = rt
        .block_on(RedisStore::connect(&server.url()))
        .expect("connect");
    run_schedules("redis", &rt, 200, |case| {
        let base = base.clone();
        async move {
            let clock = ManualClock::new(BASE_MICROS);
            let mut limiters = Vec::new();
            for _ in 0..2 {
                let store = base
                    .clone()
                    .with_clock(clock.clone())
                    .with_prefix(format!("promise{case}"))
                    .with_deny_cache(64)
                    .await
                    .expect("subscribe");
                limiters.push(Limiter::new(store));
            }
            Target {
                limiters,
                clock,
                probes: true,
                bound: None,
                switch: None,
                slack: Vec::new(),
            }
        }
    });
}

/// A 3-node Cluster: a batch whose rules count on two keys is decided slot by slot.
#[test]
fn cluster_keeps_every_promise() {
    let cluster = RedisCluster::start();
    let rt = runtime(false);
    let base = rt
        .block_on(RedisStore::connect_cluster(cluster.urls()))
        .expect("connect to the test cluster");
    run_schedules("cluster", &rt, 150, |case| {
        let base = base.clone();
        async move {
            let clock = ManualClock::new(BASE_MICROS);
            let store = base
                .with_clock(clock.clone())
                .with_prefix(format!("promise{case}"));
            Target {
                limiters: vec![Limiter::new(store)],
                clock,
                probes: true,
                bound: None,
                switch: None,
                slack: Vec::new(),
            }
        }
    });
}
