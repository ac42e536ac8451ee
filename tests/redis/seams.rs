//! Where features meet: a held queue that takes over another configuration's state, a
//! refund that empties a state another configuration then reads, a hold given back.

use std::time::Duration;

use crate::support::redis_server::RedisServer;
use crate::support::vectors::BASE_MICROS;
use tollgate::{
    store::{MemoryStore, RedisStore},
    Check, Limiter, ManualClock, Rate, Rule,
};

/// A limiter on a store at `url` with a deny cache, on `clock`.
async fn cached(url: &str, clock: &ManualClock) -> Limiter<RedisStore> {
    let store = RedisStore::connect(url)
        .await
        .expect("connect")
        .with_clock(clock.clone())
        .with_deny_cache(100)
        .await
        .expect("subscribe");
    Limiter::new(store)
}

/// Waits (bounded) until `limiter`'s cache is empty: an invalidation travels through Redis.
async fn until_emptied(limiter: &Limiter<RedisStore>) {
    for _ in 0..300 {
        if limiter.store().deny_cache_len() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A leaky bucket held past its own queue's release (another queue of the batch holds the
/// request longer) that writes over another configuration's state says so, as every other
/// path that takes over a state does: the denials other instances cached from that state
/// are dropped.
#[tokio::test]
async fn a_held_queue_taking_over_another_configuration_clears_its_denials() {
    let server = RedisServer::start();
    let clock = ManualClock::new(BASE_MICROS);
    let (x, y) = (
        cached(&server.url(), &clock).await,
        cached(&server.url(), &clock).await,
    );
    let old = Rule::leaky_bucket("q", 1, Rate::per_hour(1));
    let new = Rule::leaky_bucket("q", 10, Rate::new(10, Duration::from_secs(2)));
    assert!(x.check_one(&old, b"alice").await.unwrap().is_admitted());
    assert!(!x.check_one(&old, b"alice").await.unwrap().is_admitted());
    assert_eq!(x.store().deny_cache_len(), 1, "the denial is cached on x");

    // Bob's queue holds the request half a second, longer than alice's new queue would.
    let long = Rule::leaky_bucket("long", 10, Rate::new(1, Duration::from_millis(100)));
    assert!(y
        .check(&[Check::new(&long, b"bob").with_cost(5)])
        .await
        .unwrap()
        .is_admitted());
    let batch = [Check::new(&long, b"bob"), Check::new(&new, b"alice")];
    assert!(y.check(&batch).await.unwrap().is_admitted());
    until_emptied(&x).await;
    clock.advance(Duration::from_secs(3));
    assert!(
        x.check_one(&old, b"alice").await.unwrap().is_admitted(),
        "Redis admits once the adopted state has ended; x's cache must not deny"
    );
}

/// A refund that empties a state leaves the same in both stores: nothing held for another
/// configuration of the rule, which then admits alike.
#[tokio::test]
async fn a_refund_that_empties_a_state_leaves_nothing_for_another_configuration() {
    let server = RedisServer::start();
    let clock = ManualClock::new(BASE_MICROS);
    let redis = RedisStore::connect(&server.url()).await.expect("connect");
    let redis = Limiter::new(redis.with_clock(clock.clone()));
    let memory = Limiter::new(MemoryStore::with_clock(clock.clone()));
    let rules = [
        Rule::gcra("api", 1, Rate::per_hour(1)),
        Rule::token_bucket("api", 1, Rate::per_hour(1)),
        Rule::leaky_bucket("api", 1, Rate::per_hour(1)),
        Rule::sliding_log("api", 1, Duration::from_secs(3600)),
    ];
    let later = Rule::gcra("api", 1, Rate::per_minute(1));
    for (i, old) in rules.iter().enumerate() {
        let key = format!("k{i}");
        let taken = [Check::new(old, key.as_bytes())];
        let m = memory.reserve(&taken, Duration::ZERO).await.unwrap();
        let r = redis.reserve(&taken, Duration::ZERO).await.unwrap();
        assert!(m.outcome().is_admitted() && r.outcome().is_admitted());
        m.cancel().await.unwrap();
        r.cancel().await.unwrap();
        clock.advance(Duration::from_millis(1));
        let now = [Check::new(&later, key.as_bytes())];
        let (m, r) = (
            memory.check(&now).await.unwrap(),
            redis.check(&now).await.unwrap(),
        );
        assert_eq!(m, r, "{old:?}: the stores agree after the refund");
        assert!(m.is_admitted(), "{old:?}: the refund gave the unit back");
    }
}

/// On a Cluster, a first-hit window that only a denied batch started is given back whole:
/// it never started, as on a single node, so three logins a second pass three times in a
/// second, not six within two milliseconds.
#[tokio::test]
async fn a_cross_slot_denial_leaves_no_first_hit_window_started() {
    let cluster = crate::support::redis_server::RedisCluster::start();
    let clock = ManualClock::new(BASE_MICROS);
    let store = RedisStore::connect(&cluster.url())
        .await
        .expect("connect to the test cluster");
    let limiter = Limiter::new(store.with_clock(clock.clone()));
    let login = Rule::fixed_window_from_first_hit("login", 3, Duration::from_secs(1));
    let spent = Rule::fixed_window("spent", 1, Duration::from_secs(3600));
    // Keys on two slots: `login` is decided first, then `spent` denies.
    let (a, b) = (&b"alpha"[..], &b"beta"[..]);
    assert!(limiter.check_one(&spent, b).await.unwrap().is_admitted());
    let batch = [Check::new(&login, a), Check::new(&spent, b)];
    assert!(!limiter.check(&batch).await.unwrap().is_admitted());
    clock.advance(Duration::from_millis(999));
    for _ in 0..3 {
        assert!(limiter.check_one(&login, a).await.unwrap().is_admitted());
    }
    clock.advance(Duration::from_millis(1));
    assert!(
        !limiter.check_one(&login, a).await.unwrap().is_admitted(),
        "the window started at the first login admitted"
    );
}
