//! Every algorithm's promise under every verb, on Redis: the random schedules of
//! `support::promise_schedule`, checked by the reference of `support::promises`, on one
//! server with two instances sharing it, each with the deny cache on (a denial one caches
//! must say what Redis says after the other overdraws or resets), and on a 3-node Cluster
//! with batches whose rules count on two keys (two slots). `TOLLGATE_PROMISE_CASES` sets
//! the schedules per configuration. The twin comparison with `MemoryStore` stays in
//! `differential.rs`.

use tollgate::store::RedisStore;
use tollgate::{Limiter, ManualClock};

use crate::support::promise_driver::{run_one, run_schedules, runtime, Target};
use crate::support::promise_schedule::{fast_queue_refund, Op, LF};
use crate::support::redis_server::{prefixed, RedisCluster, RedisServer};
use crate::support::vectors::BASE_MICROS;

/// Two instances on the Redis at `url` under `prefix`, each with the deny cache on.
async fn cached_pair(url: String, prefix: String) -> Target<RedisStore> {
    let clock = ManualClock::new(BASE_MICROS);
    let mut limiters = Vec::new();
    for _ in 0..2 {
        let store = prefixed(&url, &prefix)
            .await
            .with_clock(clock.clone())
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

/// One server, two instances with the deny cache on, a prefix per schedule.
#[test]
fn redis_keeps_every_promise() {
    let server = RedisServer::start();
    let rt = runtime(false);
    let url = server.url();
    run_schedules("redis", &rt, 200, |case| {
        cached_pair(url.clone(), format!("promise{case}"))
    });
}

/// A fixed window's cached denial answers a dearer request only while the window's end
/// admits it too: with a debt carried into the next window (3 per 20 ms, 4 overdrawn), a
/// cost-1 denial is admitted at the window's end, a cost-3 one a window later, and the
/// cache must not answer the latter with the former's Retry-After.
#[test]
fn a_cached_denial_answers_a_dearer_request_with_its_own_retry() {
    let server = RedisServer::start();
    let rt = runtime(false);
    let check = |cost| Op::check(0, cost, 0).via(1);
    let ops = vec![
        Op::Overdraw {
            spec: 0,
            key: 0,
            units: 4,
        },
        check(1),
        check(3),
    ];
    let target = rt.block_on(cached_pair(server.url(), "dearer".into()));
    if let Err(e) = rt.block_on(run_one(&target, [0, 0, 0], ops)) {
        panic!("{e}");
    }
}

/// A refund behind a request adding less than a µs of water keeps the queue, on Redis too
/// (`promise_findings`).
#[test]
fn a_refund_behind_a_sub_microsecond_request_keeps_the_queue_on_redis() {
    let server = RedisServer::start();
    let rt = runtime(false);
    let target = rt.block_on(cached_pair(server.url(), "fastqueue".into()));
    if let Err(e) = rt.block_on(run_one(&target, [LF; 3], fast_queue_refund())) {
        panic!("{e}");
    }
}

/// A 3-node Cluster: a batch whose rules count on two keys is decided slot by slot.
#[test]
fn cluster_keeps_every_promise() {
    let cluster = RedisCluster::start();
    let rt = runtime(false);
    let url = cluster.url();
    run_schedules("cluster", &rt, 200, |case| {
        let url = url.clone();
        async move {
            let clock = ManualClock::new(BASE_MICROS);
            let store = prefixed(&url, format!("promise{case}"))
                .await
                .with_clock(clock.clone());
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
