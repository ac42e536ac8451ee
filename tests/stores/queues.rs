//! Leaky buckets on two keys of one batch, on MemoryStore and on a Redis server: the queue
//! that would let a request go first holds it until the other one does, so its outflow
//! never exceeds its rate, and a queue with too little room for that hold denies.

use std::time::Duration;

use crate::support::redis_server::RedisServer;
use tollgate::{
    store::{MemoryStore, RedisOptions, RedisStore, Store},
    Check, Decision, Limiter, ManualClock, Rate, Rule,
};

/// A multiple of every period below.
const T0: u64 = crate::support::EPOCH;
const MS: Duration = Duration::from_millis(1);

/// The slow queue (one unit per 10 ms) on the client's key, the fast one (one per 4 ms, room
/// for 5) on a shared key.
fn queues() -> (Rule, Rule) {
    (
        Rule::leaky_bucket("slow", 5, Rate::new(1, 10 * MS)),
        Rule::leaky_bucket("fast", 5, Rate::new(1, 4 * MS)),
    )
}

/// The decision for `batch` at `at` ms after `T0`.
async fn decide<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
    at: u64,
    batch: &[Check<'_>],
) -> Decision {
    clock.set_micros(T0 + at * 1000);
    limiter.check(batch).await.unwrap().decision
}

/// The fast queue lets a request go at 0 ms; the next one, held by the slow queue until
/// 10 ms, leaves at 10 ms; the fast queue's next request, at 5 ms, leaves one fast unit
/// after that (14 ms), not at 8 ms, 2 ms after the held one.
async fn a_queue_keeps_the_slot_its_request_leaves_in<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let (slow, fast) = queues();
    let client = Check::new(&slow, b"client");
    let shared = Check::new(&fast, b"shared");
    assert_eq!(decide(limiter, clock, 0, &[client]).await, Decision::Allow);
    assert_eq!(decide(limiter, clock, 0, &[shared]).await, Decision::Allow);
    let held = decide(limiter, clock, 0, &[client, shared]).await;
    assert_eq!(held, Decision::Delay(10 * MS));
    let next = decide(limiter, clock, 5, &[shared]).await;
    assert_eq!(next, Decision::Delay(9 * MS));
}

/// A request the slow queue holds until 40 ms: the fast queue, with room for 16 ms of
/// queue before a unit of its own, denies it until 24 ms, and at 24 ms admits it, leaving
/// at 40 ms.
async fn a_queue_without_room_for_the_hold_denies<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let (slow, fast) = queues();
    let client = Check::new(&slow, b"client");
    let shared = Check::new(&fast, b"shared");
    assert_eq!(
        decide(limiter, clock, 0, &[client.with_cost(4)]).await,
        Decision::Allow
    );
    let denied = decide(limiter, clock, 0, &[client, shared]).await;
    let retry = denied.denial().and_then(|d| d.retry_after);
    assert_eq!(retry, Some(24 * MS), "{denied:?}");
    assert!(!decide(limiter, clock, 23, &[client, shared])
        .await
        .is_admitted());
    let admitted = decide(limiter, clock, 24, &[client, shared]).await;
    assert_eq!(admitted, Decision::Delay(16 * MS));
}

/// [`a_queue_keeps_the_slot_its_request_leaves_in`] and
/// [`a_queue_without_room_for_the_hold_denies`] on MemoryStore.
#[tokio::test]
async fn queues_on_two_keys_on_memory() {
    let clock = ManualClock::new(T0);
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
    a_queue_keeps_the_slot_its_request_leaves_in(&limiter, &clock).await;
    let clock = ManualClock::new(T0);
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
    a_queue_without_room_for_the_hold_denies(&limiter, &clock).await;
}

/// The same on a Redis server: one script call decides both queues.
#[tokio::test]
async fn queues_on_two_keys_on_redis() {
    let server = RedisServer::start();
    for (prefix, case) in [("keeps", 0), ("denies", 1)] {
        let clock = ManualClock::new(T0);
        let options = RedisOptions::new().prefix(prefix);
        let store = RedisStore::connect_with(&server.url(), options).await;
        let limiter = Limiter::new(store.expect("connect").with_clock(clock.clone()));
        if case == 0 {
            a_queue_keeps_the_slot_its_request_leaves_in(&limiter, &clock).await;
        } else {
            a_queue_without_room_for_the_hold_denies(&limiter, &clock).await;
        }
    }
}
