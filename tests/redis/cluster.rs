//! RedisStore on a 3-node Redis Cluster: one script call per slot, all-or-nothing batches
//! across slots through refunds, and every part of a cross-slot batch counting the request
//! at the instant the batch releases it.

use std::time::Duration;

use crate::support::redis_server::RedisCluster;
use crate::support::vectors::BASE_MICROS;
use redis::cluster_routing::Slot;
use tollgate::{
    store::{RedisStore, Store},
    Check, Decision, DenyReason, Limiter, ManualClock, Penalty, Rule,
};

async fn limiter(cluster: &RedisCluster, clock: &ManualClock) -> Limiter<RedisStore> {
    let store = RedisStore::connect(&cluster.url())
        .await
        .expect("connect to the test cluster");
    Limiter::new(store.with_clock(clock.clone()))
}

fn reset_stats(cluster: &RedisCluster) {
    for node in &cluster.nodes {
        node.must(&["CONFIG", "RESETSTAT"]);
    }
}

/// In a cluster, a batch over several slots is decided as one: a denial in any slot refunds
/// or stops the others, a wait moves them all, and scripts reload on every node.
#[tokio::test]
async fn cluster_suite() {
    let cluster = RedisCluster::start();
    // One cluster for the whole suite: starting one costs seconds.
    same_slot_batches_are_one_call(&cluster).await;
    a_later_slot_that_denies_refunds_the_earlier_ones(&cluster).await;
    a_first_slot_that_denies_stops_consumption_and_counts_penalties(&cluster).await;
    scripts_reload_after_a_flush_on_every_node(&cluster).await;
    a_wait_in_a_later_slot_moves_the_earlier_slots_to_the_release(&cluster).await;
    a_denied_batch_leaves_a_queue_it_held_as_it_was(&cluster).await;
    a_refunded_part_counted_at_a_queues_release_reopens_at_once(&cluster).await;
}

async fn same_slot_batches_are_one_call(cluster: &RedisCluster) {
    let clock = ManualClock::new(BASE_MICROS);
    let limiter = limiter(cluster, &clock).await;
    let m = Rule::fixed_window("m", 100, Duration::from_secs(60));
    let l = Rule::sliding_log("l", 100, Duration::from_secs(60));
    let g = Rule::gcra("g", 100, tollgate::Rate::per_second(100));
    reset_stats(cluster);
    const N: u64 = 30;
    for i in 0..N {
        let key = format!("client-{}", i % 7);
        let batch = [
            Check::new(&m, key.as_bytes()),
            Check::new(&l, key.as_bytes()),
            Check::new(&g, key.as_bytes()),
        ];
        assert!(limiter.check(&batch).await.unwrap().is_admitted());
    }
    assert_eq!(cluster.calls("evalsha"), N);
}

/// Two keys whose hash tags land in different slots.
fn keys_in_two_slots() -> (&'static [u8], &'static [u8]) {
    let (a, b): (&[u8], &[u8]) = (b"alpha", b"beta");
    assert_ne!(Slot::for_key(b"{alpha}"), Slot::for_key(b"{beta}"));
    (a, b)
}

async fn a_later_slot_that_denies_refunds_the_earlier_ones(cluster: &RedisCluster) {
    let clock = ManualClock::new(BASE_MICROS);
    let limiter = limiter(cluster, &clock).await;
    let (a, b) = keys_in_two_slots();
    let rules = [
        Rule::fixed_window("fw", 2, Duration::from_secs(60)),
        Rule::sliding_log("sl", 2, Duration::from_secs(60)),
        Rule::sliding_window("sw", 2, Duration::from_secs(60)),
        Rule::token_bucket("tb", 2, tollgate::Rate::per_minute(1)),
        Rule::token_bucket_stepped("ts", 2, tollgate::Rate::per_minute(1)),
        Rule::leaky_bucket("lb", 2, tollgate::Rate::per_minute(1)),
        Rule::gcra("gc", 2, tollgate::Rate::per_minute(1)),
    ];
    for rule in &rules {
        // Use up b.
        for _ in 0..2 {
            assert!(limiter.check_one(rule, b).await.unwrap().is_admitted());
        }
        let before = limiter.peek(rule, a, 0).await.unwrap().info.remaining;
        reset_stats(cluster);
        let outcome = limiter
            .check(&[Check::new(rule, a), Check::new(rule, b)])
            .await
            .unwrap();
        assert!(!outcome.is_admitted(), "{}: b is used up", rule.name());
        // a's rule is judged where one node judges it: a queue, held until b's full queue
        // releases the request, has too little room for that hold (it denies as b does).
        let judged = if rule.name() == "lb" {
            outcome.rules[1].decision
        } else {
            Decision::Allow
        };
        assert_eq!(outcome.rules[0].decision, judged, "{}", rule.name());
        assert_eq!(outcome.rules[0].info.remaining, before, "{}", rule.name());
        // Queues in two slots are each looked at first, and the one that holds the request
        // longest (b's full queue) is decided first: it denies, a is only told.
        let calls = if rule.name() == "lb" {
            (4, "peek a, peek b, decide b, deny a")
        } else {
            (3, "decide a, decide b, refund a")
        };
        assert_eq!(cluster.calls("evalsha"), calls.0, "{}", calls.1);
        let after = limiter.peek(rule, a, 0).await.unwrap().info.remaining;
        assert_eq!(after, before, "{}: a was refunded", rule.name());
        // a alone still admits twice: nothing of it was consumed.
        for _ in 0..2 {
            assert!(
                limiter.check_one(rule, a).await.unwrap().is_admitted(),
                "{}",
                rule.name()
            );
        }
        assert!(
            !limiter.check_one(rule, a).await.unwrap().is_admitted(),
            "{}",
            rule.name()
        );
    }
}

async fn a_first_slot_that_denies_stops_consumption_and_counts_penalties(cluster: &RedisCluster) {
    let clock = ManualClock::new(BASE_MICROS);
    let limiter = limiter(cluster, &clock).await;
    let (a, b) = keys_in_two_slots();
    let strict = Rule::fixed_window("strict", 1, Duration::from_secs(60))
        .with_penalty(Penalty::lock_for(Duration::from_secs(300)).after(2));
    let loose = Rule::fixed_window("loose", 5, Duration::from_secs(60));
    assert!(limiter.check_one(&strict, a).await.unwrap().is_admitted());
    assert!(limiter.check_one(&strict, b).await.unwrap().is_admitted());
    for round in 0..2 {
        reset_stats(cluster);
        let outcome = limiter
            .check(&[
                Check::new(&loose, a),
                Check::new(&strict, b),
                Check::new(&strict, a),
            ])
            .await
            .unwrap();
        let denial = outcome.decision.denial().copied().expect("denied");
        if round == 0 {
            assert_eq!(denial.reason, DenyReason::Limited);
        } else {
            // The second denial of each strict rule locks both keys.
            assert_eq!(denial.reason, DenyReason::Locked);
            assert_eq!(denial.retry_after, Some(Duration::from_secs(300)));
        }
        // a's slot (loose, strict) goes first and denies on strict, so loose consumes
        // nothing and b's slot only counts its penalty denial: two calls, no refund.
        assert_eq!(cluster.calls("evalsha"), 2);
        assert_eq!(limiter.peek(&loose, a, 0).await.unwrap().info.remaining, 5);
    }
    let locked = limiter.check_one(&strict, a).await.unwrap();
    assert_eq!(
        locked.decision.denial().map(|d| d.reason),
        Some(DenyReason::Locked)
    );
}

async fn scripts_reload_after_a_flush_on_every_node(cluster: &RedisCluster) {
    let clock = ManualClock::new(BASE_MICROS);
    let limiter = limiter(cluster, &clock).await;
    let rule = Rule::fixed_window("flush", 10, Duration::from_secs(60));
    for key in [&b"k1"[..], b"k2", b"k3", b"k4"] {
        assert!(limiter.check_one(&rule, key).await.unwrap().is_admitted());
    }
    for node in &cluster.nodes {
        assert_eq!(node.must(&["SCRIPT", "FLUSH"]).trim(), "OK");
    }
    for key in [&b"k1"[..], b"k2", b"k3", b"k4"] {
        let outcome = limiter.check_one(&rule, key).await.expect("reloaded");
        assert_eq!(outcome.rules[0].info.remaining, 8);
    }
}

/// A fixed window of 1 per minute on `a` in a batch with another slot's rule that holds the
/// request from t=50 s until `release`, in the next minute: the window counts it there, not
/// at t=50 s, so a lone request at t=60 s is denied and no second request passes in
/// [60 s, 120 s).
async fn the_window_counts_at_the_release(
    limiter: &Limiter<RedisStore>,
    clock: &ManualClock,
    window: &Rule,
    a: &[u8],
    retry_at_60s: Duration,
) {
    clock.set_micros(BASE_MICROS + 60_000_000);
    let lone = limiter.check_one(window, a).await.unwrap();
    assert_eq!(
        lone.decision.denial().map(|d| (d.reason, d.retry_after)),
        Some((DenyReason::Limited, Some(retry_at_60s))),
        "a second request in the minute the batch passed in"
    );
}

async fn a_wait_in_a_later_slot_moves_the_earlier_slots_to_the_release(cluster: &RedisCluster) {
    let clock = ManualClock::new(BASE_MICROS + 50_000_000);
    let limiter = limiter(cluster, &clock).await;
    let (a, b) = keys_in_two_slots();
    let window = Rule::fixed_window("wait-fw", 1, Duration::from_secs(60));
    let paced = Rule::gcra("wait-gcra", 1, tollgate::Rate::per_minute(2));
    assert!(limiter.check_one(&paced, b).await.unwrap().is_admitted());
    reset_stats(cluster);
    // a's slot admits at once, b's reserves 30 s ahead: the request passes at t=80 s.
    let outcome = limiter
        .store()
        .check(
            &[Check::new(&window, a), Check::new(&paced, b)],
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(outcome.decision, Decision::Delay(Duration::from_secs(30)));
    let calls = cluster.calls("evalsha");
    the_window_counts_at_the_release(&limiter, &clock, &window, a, Duration::from_secs(60)).await;
    // In wait mode each part is tried before it is written (a reservation counts later
    // than now, which a refund could not take back as it was).
    assert_eq!(
        calls, 5,
        "try a, try b, try a at b's delay, commit a, commit b"
    );
}

/// A batch held by one client's long queue (first slot), which a shared per-tenant queue
/// (second slot) holds too, denied by a rule in a third slot: the tenant's queue is left as
/// it was, without the hold.
async fn a_denied_batch_leaves_a_queue_it_held_as_it_was(cluster: &RedisCluster) {
    let clock = ManualClock::new(BASE_MICROS);
    let limiter = limiter(cluster, &clock).await;
    let (own_key, tenant_key, other): (&[u8], &[u8], &[u8]) = (b"alpha", b"beta", b"gamma");
    let slots = [own_key, tenant_key, other].map(|k| Slot::for_key([b"{", k, b"}"].concat()));
    assert!(slots[0] != slots[1] && slots[1] != slots[2] && slots[0] != slots[2]);
    let ms = Duration::from_millis;
    let own = Rule::leaky_bucket("own", 10, tollgate::Rate::new(1, ms(100)));
    let tenant = Rule::leaky_bucket("tenant", 20, tollgate::Rate::new(1, ms(10)));
    let once = Rule::fixed_window("once", 1, Duration::from_secs(60));
    // The client's queue: 100 ms of water; the tenant's: 10 ms; `once` used up.
    assert!(limiter
        .check_one(&own, own_key)
        .await
        .unwrap()
        .is_admitted());
    assert!(limiter
        .check_one(&tenant, tenant_key)
        .await
        .unwrap()
        .is_admitted());
    assert!(limiter.check_one(&once, other).await.unwrap().is_admitted());
    let batch = [
        Check::new(&own, own_key),
        Check::new(&tenant, tenant_key),
        Check::new(&once, other),
    ];
    let denied = limiter.check(&batch).await.unwrap();
    assert!(!denied.is_admitted(), "{denied:?}");
    // As if the batch had never come: the tenant's queue holds only its 10 ms.
    let next = limiter.check_one(&tenant, tenant_key).await.unwrap();
    assert_eq!(next.decision, Decision::Delay(ms(10)), "{next:?}");
}

/// A batch held by the client's queue (first slot), whose token bucket on the same key
/// counts the request at the queue's release, 100 ms ahead, denied by a rule in another
/// slot: the token bucket is as if the batch had never come, open at once, as on one node.
async fn a_refunded_part_counted_at_a_queues_release_reopens_at_once(cluster: &RedisCluster) {
    let clock = ManualClock::new(BASE_MICROS);
    let limiter = limiter(cluster, &clock).await;
    let (a, b) = keys_in_two_slots();
    let ms = Duration::from_millis;
    let queue = Rule::leaky_bucket("reopen-q", 4, tollgate::Rate::new(1, ms(100)));
    let tokens = Rule::token_bucket("reopen-tb", 3, tollgate::Rate::new(1, ms(100)));
    let once = Rule::fixed_window("reopen-once", 1, Duration::from_secs(60));
    // The client's queue holds 100 ms of water; `once` on b is used up.
    assert!(limiter.check_one(&queue, a).await.unwrap().is_admitted());
    assert!(limiter.check_one(&once, b).await.unwrap().is_admitted());
    let batch = [
        Check::new(&queue, a),
        Check::new(&tokens, a),
        Check::new(&once, b),
    ];
    let denied = limiter.check(&batch).await.unwrap();
    assert!(!denied.is_admitted(), "{denied:?}");
    assert_eq!(denied.rules[1].info.remaining, 3, "{denied:?}");
    assert_eq!(limiter.peek(&tokens, a, 0).await.unwrap().info.remaining, 3);
    let lone = limiter.check_one(&tokens, a).await.unwrap();
    assert_eq!(lone.decision, Decision::Allow, "{lone:?}");
}
