//! Costs settled far above the estimate (`Reservation::settle`), on MemoryStore and
//! RedisStore: every algorithm charges the whole cost, and the key stays refused until the
//! rule's own rate has paid the excess, then admits at the exact instant the retry names.
//! The two download scenarios: a token bucket serves no more than its capacity plus
//! its refill over half an hour, and a fixed window carries a debt into the windows after.

use std::time::Duration;

use crate::support::redis_server::RedisServer;
use tollgate::{
    store::{MemoryStore, RedisStore, Store},
    Check, Decision, Limiter, ManualClock, Rate, Rule,
};

/// A multiple of every window below, so epoch-aligned windows start here.
const T0: u64 = crate::support::EPOCH;
const S: u64 = 1_000_000;

/// Reserves `batch` at the current instant with no wait, confirms it and settles it at
/// `cost`; returns whether it was admitted.
async fn serve<S: Store + Clone>(limiter: &Limiter<S>, batch: &[Check<'_>], cost: u64) -> bool {
    let mut reservation = limiter.reserve(batch, Duration::ZERO).await.unwrap();
    if !reservation.confirm().await.unwrap().is_admitted() {
        return false;
    }
    reservation.settle(&[cost]).await.unwrap();
    true
}

/// Every algorithm, a limit of 10 restored over 10 s: a download reserved at 1 unit and
/// settled at 160 keeps the key refused until its 150-unit excess is paid at the rule's
/// rate; the retry it names is exact, and a request one µs earlier is refused.
async fn a_settled_debt_is_paid_at_the_rules_rate<S: Store + Clone>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let per_s = Rate::per_second(1);
    let window = Duration::from_secs(10);
    // Each rule with the instant (s after T0) its first unit is admitted again.
    let cases = [
        // 160 counted; each window after pays 10: the 16th holds none.
        (Rule::fixed_window("settled-fw", 10, window), 160),
        // The 16th window weighs the 15th's last 10 units, down to 9 a second in.
        (Rule::sliding_window("settled-sw", 10, window), 161),
        // 160 units: logged as the 10 left after 15 windows, a window long.
        (Rule::sliding_log("settled-sl", 10, window), 160),
        // 9 tokens left, 159 owed: 150 s of refill, then 1 s for the token.
        (Rule::token_bucket("settled-tb", 10, per_s), 151),
        // 160 units of water: 151 s until 9 remain.
        (Rule::leaky_bucket("settled-lb", 10, per_s), 151),
        // TAT at 160 s, tolerance 10 s: 151 s until a unit fits.
        (Rule::gcra("settled-gc", 10, per_s), 151),
    ];
    for (rule, paid_s) in &cases {
        clock.set_micros(T0);
        let batch = [Check::new(rule, b"dl").with_cost(1)];
        assert!(serve(limiter, &batch, 160).await, "{}", rule.name());
        let outcome = limiter.check(&batch).await.unwrap();
        let retry = outcome.decision.denial().and_then(|d| d.retry_after);
        assert_eq!(
            retry,
            Some(Duration::from_secs(*paid_s)),
            "{}: refused until the debt is paid",
            rule.name()
        );
        clock.set_micros(T0 + paid_s * S - 1);
        let early = limiter.check(&batch).await.unwrap();
        assert!(
            !early.is_admitted(),
            "{}: one µs early is refused",
            rule.name()
        );
        clock.set_micros(T0 + paid_s * S);
        let paid = limiter.check(&batch).await.unwrap();
        assert!(
            paid.is_admitted(),
            "{}: admitted once paid: {:?}",
            rule.name(),
            paid.decision
        );
    }
}

/// The token bucket: 500 MB, refilled at 100 MB a minute, downloads estimated at
/// 1 MB and settled at their size, one after another every second for 30 minutes: what is
/// served, with the next megabyte, fits in 500 MB plus the refill until that megabyte's
/// retry (the last download's debt is still being paid at the end).
async fn a_token_bucket_serves_no_more_than_its_refill<S: Store + Clone>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let rule = Rule::token_bucket("issue-tb", 500, Rate::per_minute(100));
    let batch = [Check::new(&rule, b"user").with_cost(1)];
    let sizes = [2_000, 700, 64, 4_000];
    let mut served = 0;
    for second in 0..30 * 60 {
        clock.set_micros(T0 + second * S);
        let size = sizes[(second % 4) as usize];
        if serve(limiter, &batch, size).await {
            served += size;
        }
    }
    clock.set_micros(T0 + 30 * 60 * S);
    let outcome = limiter.check(&batch).await.unwrap();
    let retry = outcome.decision.denial().and_then(|d| d.retry_after);
    let until = 30 * 60 * S + retry.map_or(0, |r| r.as_micros() as u64);
    // 100 MB a minute is one MB every 600,000 µs.
    assert!(
        (served + 1) * 600_000 <= 500 * 600_000 + until,
        "served {served} MB, the next MB {retry:?} after 30 minutes"
    );
    assert!(served >= 3_000, "served only {served} MB");
}

/// The fixed window: 500 MB an hour, 20 downloads admitted at once at 1 MB each
/// settle at 400 MB: the 8,000 MB are owed into the windows after, 500 an hour, so the key
/// is refused until the 16th hour, and admits then.
async fn a_fixed_window_carries_its_debt<S: Store + Clone>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let hour = 3_600 * S;
    // The first hour-long window from T0 on.
    let t0 = T0.next_multiple_of(hour);
    let rule = Rule::fixed_window("issue-fw", 500, Duration::from_secs(3_600));
    let batch = [Check::new(&rule, b"user").with_cost(1)];
    clock.set_micros(t0);
    let mut held = Vec::new();
    for _ in 0..20 {
        let mut reservation = limiter.reserve(&batch, Duration::ZERO).await.unwrap();
        assert!(reservation.confirm().await.unwrap().is_admitted());
        held.push(reservation);
    }
    for reservation in held {
        reservation.settle(&[400]).await.unwrap();
    }
    clock.set_micros(t0 + hour);
    let turned = limiter.check(&batch).await.unwrap();
    assert_eq!(
        turned.decision.denial().and_then(|d| d.retry_after),
        Some(Duration::from_secs(15 * 3_600)),
        "the next window still owes 7,500 MB"
    );
    clock.set_micros(t0 + 16 * hour - 1);
    assert!(!limiter.check(&batch).await.unwrap().is_admitted());
    clock.set_micros(t0 + 16 * hour);
    let paid = limiter.check(&batch).await.unwrap();
    assert_eq!(paid.decision, Decision::Allow);
}

/// A leaky bucket that held a request for another queue's longer release, settled below
/// its estimate: the request still left at its release, so the hold stays and only the
/// units go back; the next request of the queue leaves the settled units after it.
async fn a_settlement_below_the_estimate_keeps_a_queues_hold<S: Store + Clone>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let per_10s = Rate::new(1, Duration::from_secs(10));
    let slow = Rule::leaky_bucket("settled-slow", 4, per_10s);
    let fast = Rule::leaky_bucket("settled-fast", 40, Rate::per_second(1));
    clock.set_micros(T0);
    let fill = [Check::new(&slow, b"q").with_cost(3)];
    assert_eq!(
        limiter.check(&fill).await.unwrap().decision,
        Decision::Allow
    );
    let batch = [
        Check::new(&slow, b"q"),
        Check::new(&fast, b"q").with_cost(2),
    ];
    let held = limiter
        .reserve(&batch, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        held.outcome().decision,
        Decision::Delay(Duration::from_secs(30)),
        "the slow queue holds it"
    );
    clock.set_micros(T0 + 30 * S);
    held.settle(&[1, 1]).await.unwrap();
    let next = limiter.check(&[Check::new(&fast, b"q")]).await.unwrap();
    assert_eq!(
        next.decision,
        Decision::Delay(Duration::from_secs(1)),
        "one unit of the held request still drains after its release"
    );
}

async fn all<S: Store + Clone>(limiter: &Limiter<S>, clock: &ManualClock) {
    a_settled_debt_is_paid_at_the_rules_rate(limiter, clock).await;
    a_token_bucket_serves_no_more_than_its_refill(limiter, clock).await;
    a_fixed_window_carries_its_debt(limiter, clock).await;
    a_settlement_below_the_estimate_keeps_a_queues_hold(limiter, clock).await;
}

/// Every settled debt holds on the in-process store.
#[tokio::test]
async fn settled_debts_on_memory_store() {
    let clock = ManualClock::new(T0);
    all(
        &Limiter::new(MemoryStore::with_clock(clock.clone())),
        &clock,
    )
    .await;
}

/// Every settled debt holds on a Redis server (the Lua twins).
#[tokio::test]
async fn settled_debts_on_redis_store() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    all(&Limiter::new(store.with_clock(clock.clone())), &clock).await;
}
