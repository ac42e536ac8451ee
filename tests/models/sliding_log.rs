//! The sliding log on MemoryStore and RedisStore where the shared vectors cannot reach: a
//! limit lowered under the same rule name, peeks, and the size of a log in Redis.

use std::time::Duration;

use crate::support::redis_server::RedisServer;
use crate::support::vectors::BASE_MICROS;
use tollgate::{
    store::{MemoryStore, RedisStore, Store},
    Decision, Limiter, ManualClock, Rule,
};

const WINDOW: Duration = Duration::from_micros(1000);

fn retry_micros(decision: &Decision) -> u64 {
    match decision {
        Decision::Deny(d) => d
            .retry_after
            .map(|r| r.as_micros() as u64)
            .unwrap_or_else(|| panic!("a denial without retry: {decision:?}")),
        other => panic!("expected a denial, got {other:?}"),
    }
}

/// Five units logged at t = 0..4 under a limit of 5, then the limit is lowered to 3. The
/// lowered rule is another configuration (its fingerprint differs), so it reads the old log
/// as units held until the old log empties (see `Rule`'s "Reconfiguring a rule"): a request
/// waits until then, and its retry-after points at an instant that admits it (the model's own
/// `used + cost − limit` arithmetic is the unit test in `src/algorithm/sliding_log.rs`).
async fn lowered_limit_retry_is_admitted<S: Store>(limiter: Limiter<S>, clock: ManualClock) {
    let before = Rule::sliding_log("log", 5, WINDOW);
    let after = Rule::sliding_log("log", 3, WINDOW);
    for t in 0..5 {
        clock.set_micros(BASE_MICROS + t);
        let outcome = limiter.check_one(&before, "k").await.unwrap();
        assert!(outcome.is_admitted(), "admission {t} under the old limit");
    }
    clock.set_micros(BASE_MICROS + 10);
    // The old log empties when its newest entry (at 4) ages out, at 1004.
    let denied = limiter.check_one(&after, "k").await.unwrap();
    assert_eq!(retry_micros(&denied.decision), 994);
    assert_eq!(denied.rules[0].info.remaining, 0);
    let denied = limiter.peek(&after, "k", 2).await.unwrap();
    assert_eq!(retry_micros(&denied.decision), 994);

    clock.set_micros(BASE_MICROS + 1003);
    let early = limiter.check_one(&after, "k").await.unwrap();
    assert_eq!(retry_micros(&early.decision), 1, "one µs before the retry");
    clock.set_micros(BASE_MICROS + 1004);
    let due = limiter.check_one(&after, "k").await.unwrap();
    assert!(
        due.is_admitted(),
        "at the retry instant: {:?}",
        due.decision
    );
    assert_eq!(due.rules[0].info.remaining, 2);
}

/// A peek that would not log anything (a cost of 0, or a denial) reports the reset of the
/// log as it stands: 0 for a key never used, the time until the newest entry ages out
/// otherwise.
async fn peek_reports_the_log_reset<S: Store>(limiter: Limiter<S>, clock: ManualClock) {
    let rule = Rule::sliding_log("log", 3, Duration::from_secs(1));
    clock.set_micros(BASE_MICROS);
    let unused = limiter.peek(&rule, "k", 0).await.unwrap();
    assert_eq!(unused.decision, Decision::Allow);
    assert_eq!(unused.info.remaining, 3);
    assert_eq!(unused.info.reset, Duration::ZERO);
    for _ in 0..3 {
        assert!(limiter.check_one(&rule, "k").await.unwrap().is_admitted());
    }
    clock.set_micros(BASE_MICROS + 999_000);
    let full = limiter.peek(&rule, "k", 1).await.unwrap();
    assert_eq!(retry_micros(&full.decision), 1000);
    assert_eq!(full.info.remaining, 0);
    assert_eq!(full.info.reset, Duration::from_millis(1));
}

fn memory() -> (Limiter<MemoryStore>, ManualClock) {
    let clock = ManualClock::new(BASE_MICROS);
    (Limiter::new(MemoryStore::with_clock(clock.clone())), clock)
}

async fn redis(server: &RedisServer) -> (Limiter<RedisStore>, ManualClock) {
    let clock = ManualClock::new(BASE_MICROS);
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect to the test redis-server")
        .with_clock(clock.clone());
    (Limiter::new(store), clock)
}

/// In memory, a lowered sliding-log limit gives a retry-after that is admitted when it
/// comes.
#[tokio::test]
async fn memory_lowered_limit_retry_after_is_admitted() {
    let (limiter, clock) = memory();
    lowered_limit_retry_is_admitted(limiter, clock).await;
}

/// In Redis, a lowered sliding-log limit gives a retry-after that is admitted when it
/// comes.
#[tokio::test]
async fn redis_lowered_limit_retry_after_is_admitted() {
    let server = RedisServer::start();
    let (limiter, clock) = redis(&server).await;
    lowered_limit_retry_is_admitted(limiter, clock).await;
}

/// In memory, a sliding-log peek that logs nothing reports the reset of the log as it
/// stands.
#[tokio::test]
async fn memory_peek_reports_the_log_reset() {
    let (limiter, clock) = memory();
    peek_reports_the_log_reset(limiter, clock).await;
}

/// In Redis, a sliding-log peek that logs nothing reports the reset of the log as it
/// stands.
#[tokio::test]
async fn redis_peek_reports_the_log_reset() {
    let server = RedisServer::start();
    let (limiter, clock) = redis(&server).await;
    peek_reports_the_log_reset(limiter, clock).await;
}

/// A Cluster refund takes back an entry that later admissions of the same key may already
/// sit behind (they came within the refund's round trip): the running totals of those later
/// entries must drop with it, or the log would count units nobody holds. Plain admissions
/// and batches whose other slot always denies (so their log part is refunded) race on one
/// key; afterwards the log counts exactly the plain admissions.
#[tokio::test]
async fn cluster_refunds_under_concurrent_admissions_keep_the_count_exact() {
    let cluster = crate::support::redis_server::RedisCluster::start();
    let store = RedisStore::connect(&cluster.url())
        .await
        .expect("connect to the test cluster");
    let limiter = Limiter::new(store);
    let log = Rule::sliding_log("log", 1_000_000, Duration::from_secs(3600));
    // Cost 2 over a limit of 1: always denied, in another slot than the log.
    let gate = Rule::fixed_window("gate", 1, Duration::from_secs(3600));
    const TASKS: usize = 4;
    const EACH: u64 = 150;
    let mut tasks = Vec::new();
    for t in 0..2 * TASKS {
        let (limiter, log, gate) = (limiter.clone(), log.clone(), gate.clone());
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..EACH {
                let outcome = if t % 2 == 0 {
                    limiter.check_one(&log, "a").await.unwrap()
                } else {
                    let batch = [
                        tollgate::Check::new(&log, b"a"),
                        tollgate::Check::new(&gate, b"b").with_cost(2),
                    ];
                    limiter.check(&batch).await.unwrap()
                };
                admitted += u64::from(outcome.is_admitted());
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    assert_eq!(admitted, TASKS as u64 * EACH, "every plain check, no batch");
    let info = limiter.peek(&log, "a", 0).await.unwrap().info;
    assert_eq!(info.remaining, 1_000_000 - admitted);
}

/// A log of a few hundred entries of uneven costs: for every cost from 1 to the limit, and
/// at instants as entries age out, Redis (which searches the sorted set) finds the same
/// retry, remaining units and reset as the in-process model (which searches its deque).
#[tokio::test]
async fn redis_finds_the_freeing_entry_of_a_long_uneven_log_like_the_model() {
    let server = RedisServer::start();
    let (redis, redis_clock) = redis(&server).await;
    let (memory, memory_clock) = memory();
    let rule = Rule::sliding_log("log", 1000, Duration::from_micros(100_000));
    let at = |t: u64| {
        redis_clock.set_micros(BASE_MICROS + t);
        memory_clock.set_micros(BASE_MICROS + t);
    };
    // A fixed pseudo-random schedule (an LCG): costs 1 to 8, 1 to 200 µs apart.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % n
    };
    let mut t = 0;
    let mut logged = 0;
    while t < 250_000 {
        t += 1 + next(200);
        let cost = 1 + next(8);
        at(t);
        let a = redis
            .check(&[tollgate::Check::new(&rule, b"k").with_cost(cost)])
            .await
            .unwrap();
        let b = memory
            .check(&[tollgate::Check::new(&rule, b"k").with_cost(cost)])
            .await
            .unwrap();
        assert_eq!(a.decision, b.decision, "admission of {cost} at {t}");
        logged += u64::from(a.is_admitted());
    }
    assert!(logged > 500, "only {logged} entries logged");
    for later in [0, 1, 17, 5_000, 40_000, 99_999, 100_000] {
        at(t + later);
        for cost in (1..=1000).step_by(37).chain([999, 1000]) {
            let a = redis.peek(&rule, "k", cost).await.unwrap();
            let b = memory.peek(&rule, "k", cost).await.unwrap();
            assert_eq!(a, b, "peek of {cost}, {later} µs after the last admission");
        }
    }
}
