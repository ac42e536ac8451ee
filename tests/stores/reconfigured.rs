//! A rule changed under its name (a rolling deploy): what the new configuration reads of
//! the old one's state, its fingerprint, the units it carries and the locks it keeps.

use std::time::Duration;

use crate::support::redis_server::RedisServer;
use tollgate::{
    store::{MemoryStore, RedisStore, Store},
    Check, Decision, Limiter, ManualClock, Rate, Rule,
};

/// A multiple of every window below.
const T0: u64 = crate::support::EPOCH;
const US: Duration = Duration::from_micros(1);

fn memory() -> (Limiter<MemoryStore>, ManualClock) {
    let clock = ManualClock::new(T0);
    (Limiter::new(MemoryStore::with_clock(clock.clone())), clock)
}

/// GCRA's state keeps a fraction of a µs in units of `1 / amount` (of the
/// rate in lowest terms), so its fingerprint names the rate itself, not only the emission
/// interval rounded to a whole µs: 3 per 5 µs and 1 per 2 µs (600,000/s and 500,000/s),
/// whose intervals round alike, have fingerprints of their own.
#[tokio::test]
async fn gcra_rates_with_the_same_rounded_interval_do_not_share_a_fingerprint() {
    let a = Rule::gcra("g", 10, Rate::new(3, 5 * US));
    let b = Rule::gcra("g", 10, Rate::new(1, 2 * US));
    assert_ne!(
        a.fingerprint(),
        b.fingerprint(),
        "different rates read their fractions differently"
    );
}

/// A GCRA rule reconfigured between two rates whose intervals round alike hands out no
/// more than the larger burst within one microsecond (the bound `Rule` documents): neither
/// configuration reads the other's fraction as its own.
#[tokio::test]
async fn a_gcra_reconfiguration_hands_out_no_second_burst_within_a_microsecond() {
    let (limiter, _clock) = memory();
    let a = Rule::gcra("g", 10, Rate::new(3, 5 * US));
    let b = Rule::gcra("g", 10, Rate::new(1, 2 * US));
    let mut admitted = 0;
    // The old configuration takes its whole burst, then the new one finds the key.
    for rule in std::iter::repeat_n(&a, 20).chain(std::iter::repeat_n(&b, 20)) {
        if limiter.check_one(rule, b"k").await.unwrap().is_admitted() {
            admitted += 1;
        }
    }
    assert!(
        admitted <= 10,
        "{admitted} admitted in one µs under two bursts of 10"
    );
}

/// A sliding log (and its Lua twin) that finds another configuration's log
/// evaluates a fresh log that has just admitted the carried units (`Algorithm::adopt`);
/// the other configuration's entries still in the Redis set take no part in it, so the
/// carried units hold the key closed until the old log would have been empty, on both
/// stores.
async fn a_lowered_window_holds_the_carried_units<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let old = Rule::sliding_log("log", 5, 1000 * US);
    let new = Rule::sliding_log("log", 5, US);
    clock.set_micros(T0);
    let first = [Check::new(&old, b"k")];
    assert!(limiter.check(&first).await.unwrap().is_admitted());
    clock.set_micros(T0 + 1);
    let rest = [Check::new(&old, b"k").with_cost(4)];
    assert!(limiter.check(&rest).await.unwrap().is_admitted());

    // The old log is full until T0 + 1001: the new configuration holds its 5 units so long.
    let outcome = limiter.check_one(&new, b"k").await.unwrap();
    assert_eq!(
        outcome.decision,
        Decision::Deny(tollgate::Denial {
            reason: tollgate::DenyReason::Limited,
            retry_after: Some(1000 * US),
        }),
        "{outcome:?}"
    );
}

/// [`a_lowered_window_holds_the_carried_units`] on MemoryStore.
#[tokio::test]
async fn a_lowered_window_holds_the_carried_units_on_memory() {
    let (limiter, clock) = memory();
    a_lowered_window_holds_the_carried_units(&limiter, &clock).await;
}

/// [`a_lowered_window_holds_the_carried_units`] on a Redis server.
#[tokio::test]
async fn a_lowered_window_holds_the_carried_units_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let limiter = Limiter::new(store.with_clock(clock.clone()));
    a_lowered_window_holds_the_carried_units(&limiter, &clock).await;
}

/// "The penalty survives a reconfiguration unchanged" (`Rule` docs): an
/// entry written by a configuration without the penalty (a rolling deploy adding one)
/// keeps the lock another configuration set until the lock ends, whatever the writer's own
/// expiry (`Entry::expires_at` on MemoryStore; the TTL `store` sets in batch.lua).
#[tokio::test]
async fn a_lock_outlives_a_write_by_a_configuration_without_the_penalty() {
    let (limiter, clock) = memory();
    let locking = Rule::fixed_window("login", 1, 1000 * US)
        .with_penalty(tollgate::Penalty::lock_for(Duration::from_secs(1)));
    let plain = Rule::fixed_window("login", 1, 1000 * US);
    assert!(limiter
        .check_one(&locking, b"k")
        .await
        .unwrap()
        .is_admitted());
    // The second attempt is denied and locks the key for a second.
    assert!(!limiter
        .check_one(&locking, b"k")
        .await
        .unwrap()
        .is_admitted());
    // A process without the penalty admits in the next window (it does not know the lock).
    clock.set_micros(T0 + 1000);
    assert!(limiter.check_one(&plain, b"k").await.unwrap().is_admitted());
    clock.set_micros(T0 + 3000);
    let before = limiter.peek(&locking, b"k", 1).await.unwrap();
    assert!(
        matches!(before.decision, Decision::Deny(d) if d.reason == tollgate::DenyReason::Locked),
        "{before:?}"
    );
    limiter.store().purge_expired();
    let outcome = limiter.check_one(&locking, b"k").await.unwrap();
    assert!(
        matches!(
            outcome.decision,
            Decision::Deny(tollgate::Denial {
                reason: tollgate::DenyReason::Locked,
                ..
            })
        ),
        "the lock set at T0 for 1 s still holds at T0 + 3 ms: {outcome:?}"
    );
}

/// The same on Redis, on the server's clock: the record's TTL keeps the lock.
#[tokio::test]
async fn a_lock_outlives_a_write_by_a_configuration_without_the_penalty_on_redis() {
    let server = RedisServer::start();
    let limiter = Limiter::new(RedisStore::connect(&server.url()).await.expect("connect"));
    let window = Duration::from_millis(100);
    let locking = Rule::fixed_window("login", 1, window)
        .with_penalty(tollgate::Penalty::lock_for(Duration::from_secs(30)));
    let plain = Rule::fixed_window("login", 1, window);
    // Denied once (whatever window the calls fall in): locked for 30 s.
    while limiter
        .check_one(&locking, b"k")
        .await
        .unwrap()
        .is_admitted()
    {}
    // A process without the penalty admits in a later window.
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if limiter.check_one(&plain, b"k").await.unwrap().is_admitted() {
            break;
        }
    }
    let ttl: i64 = server
        .must(&["PTTL", "tollgate:{k}:login"])
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 20_000, "the record lives {ttl} ms, the lock 30 s");
}

/// Denials a penalty counted belong to the name, as its lock does: a configuration without
/// the penalty that writes the key (a rolling deploy adding one) keeps them until the
/// counting window ends, whatever the writer's own expiry. Fixed windows of 50 ms; the
/// locking configuration locks after 2 denials within 10 s.
fn count_kept_rules() -> (Rule, Rule) {
    let window = Duration::from_millis(50);
    let penalty = tollgate::Penalty::lock_for(Duration::from_secs(30))
        .after(2)
        .within(Duration::from_secs(10));
    let locking = Rule::fixed_window("login", 1, window).with_penalty(penalty);
    (locking, Rule::fixed_window("login", 1, window))
}

/// The first refusal of `locking` on `k` (after whatever admissions the window has left).
async fn first_refusal<S: Store>(limiter: &Limiter<S>, locking: &Rule) -> tollgate::DenyReason {
    loop {
        match limiter.check_one(locking, b"k").await.unwrap().decision {
            Decision::Deny(d) => return d.reason,
            Decision::Allow | Decision::Delay(_) => {}
        }
    }
}

/// [`count_kept_rules`] on MemoryStore: one denial counted, the plain configuration writes
/// in a later window, its state expires and is swept; the next denial still locks.
#[tokio::test]
async fn a_write_without_the_penalty_keeps_the_denials_counted() {
    let (limiter, clock) = memory();
    let (locking, plain) = count_kept_rules();
    assert_eq!(
        first_refusal(&limiter, &locking).await,
        tollgate::DenyReason::Limited
    );
    clock.set_micros(T0 + 60_000);
    assert!(limiter.check_one(&plain, b"k").await.unwrap().is_admitted());
    clock.set_micros(T0 + 1_000_000);
    limiter.store().purge_expired();
    assert_eq!(
        first_refusal(&limiter, &locking).await,
        tollgate::DenyReason::Locked,
        "the second denial within 10 s locks, though a plain write came between"
    );
}

/// The same on Redis, on the server's clock: the record's TTL keeps the count.
#[tokio::test]
async fn a_write_without_the_penalty_keeps_the_denials_counted_on_redis() {
    let server = RedisServer::start();
    let limiter = Limiter::new(RedisStore::connect(&server.url()).await.expect("connect"));
    let (locking, plain) = count_kept_rules();
    assert_eq!(
        first_refusal(&limiter, &locking).await,
        tollgate::DenyReason::Limited
    );
    // The plain configuration admits in a later window, then its state expires.
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if limiter.check_one(&plain, b"k").await.unwrap().is_admitted() {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        first_refusal(&limiter, &locking).await,
        tollgate::DenyReason::Locked,
        "the second denial within 10 s locks, though a plain write came between"
    );
}
