//! Leases on one Redis (`store::Leased`): three instances, each its own `RedisStore`
//! connection, hammer one hot key; together they never admit more than the rule's burst
//! plus its refill over the run (the reference count), and most of their decisions are made
//! in process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::redis_server::RedisServer;
use tollgate::{
    store::{Leased, RedisStore},
    Check, Limiter, Rate, Rule,
};

const BURST: u64 = 500;
const PER_SECOND: u64 = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_never_admit_more_than_the_rule() {
    let server = RedisServer::start();
    let rule = Rule::gcra("hot", BURST, Rate::per_second(PER_SECOND));
    let (admitted, decided) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut instances = Vec::new();
    for _ in 0..3 {
        let store = RedisStore::connect(&server.url()).await.expect("connect");
        let leased = Leased::new(store).lease(&rule, 50, Duration::from_millis(100));
        instances.push(Limiter::new(leased.expect("a GCRA leases")));
    }
    let started = Instant::now();
    let run = Duration::from_millis(1_500);
    let mut tasks = Vec::new();
    for limiter in &instances {
        for _ in 0..8 {
            let (limiter, rule) = (limiter.clone(), rule.clone());
            let (admitted, decided) = (Arc::clone(&admitted), Arc::clone(&decided));
            tasks.push(tokio::spawn(async move {
                let batch = [Check::new(&rule, b"all")];
                while started.elapsed() < run {
                    let outcome = limiter.check(&batch).await.expect("decide");
                    decided.fetch_add(1, Ordering::Relaxed);
                    if outcome.is_admitted() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("task");
    }
    let elapsed = started.elapsed();
    let admitted = admitted.load(Ordering::Relaxed);
    let decided = decided.load(Ordering::Relaxed);
    // Every unit Redis counted was counted within the run: its burst plus its refill.
    let reference = BURST + (PER_SECOND as f64 * elapsed.as_secs_f64()).ceil() as u64;
    assert!(
        admitted <= reference,
        "{admitted} admitted, the rule allows {reference}"
    );
    // The under-admission is bounded: units parked or not given back, not the quota.
    assert!(
        admitted * 2 >= reference,
        "{admitted} of {reference} ({decided} decided)"
    );
}

/// A batch with a leased global rule and a per-user rule on Redis: the global rule is
/// decided from leases, each user's fourth request is refused by the store, and a refused
/// request gives its lease units back (Redis counts one lease, not each request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_a_leased_rule_on_redis() {
    let server = RedisServer::start();
    let global = Rule::gcra("global", 1_000, Rate::per_minute(1));
    let user = Rule::fixed_window("user", 3, Duration::from_secs(60));
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let limiter = Limiter::new(
        Leased::new(store.clone())
            .lease(&global, 100, Duration::from_secs(10))
            .expect("a GCRA leases"),
    );
    for who in [&b"ann"[..], b"bob", b"cy"] {
        let mut admitted = Vec::new();
        for _ in 0..5 {
            let batch = [Check::new(&global, b"all"), Check::new(&user, who)];
            admitted.push(limiter.check(&batch).await.expect("decide").is_admitted());
        }
        assert_eq!(admitted, [true, true, true, false, false]);
    }
    let plain = Limiter::new(store);
    let peeked = plain.peek(&global, b"all", 1).await.expect("peek");
    assert_eq!(peeked.info.remaining, 1_000 - 100 - 1, "one lease counted");
    let next = limiter
        .check(&[Check::new(&global, b"all"), Check::new(&user, b"dee")])
        .await
        .expect("decide");
    // 9 used from the lease and this one, the 6 refusals given back: 90 left.
    assert_eq!(next.rules[0].info.remaining, 900 + 90, "{next:?}");
}

/// A renewal costs one script call: the lease that ran out ends in the call that takes the
/// next, before it, and a lease that ends with nothing unused tells no deny cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_is_one_script_call() {
    let server = RedisServer::start();
    let rule = Rule::gcra("hot", 1_000_000, Rate::per_second(10_000_000));
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let leased = Leased::new(store).lease(&rule, 10, Duration::from_secs(10));
    let limiter = Limiter::new(leased.expect("a GCRA leases"));
    let (before, published) = (server.calls("FCALL"), server.calls("PUBLISH"));
    for _ in 0..100 {
        let batch = [Check::new(&rule, b"all")];
        assert!(limiter.check(&batch).await.unwrap().is_admitted());
    }
    assert_eq!(
        server.calls("FCALL") - before,
        10,
        "one call per lease of 10"
    );
    assert_eq!(server.calls("PUBLISH"), published);
}
