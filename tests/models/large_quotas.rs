//! Large quotas build and stay exact: every amount from 1 to 10^9 over
//! every period from 1 ms to 366 days builds for all six algorithms; rates that reduce to
//! small terms are exact however large they look; a rate that cannot be represented exactly
//! is rounded so that it never admits more.
//!
//! These drive a `MemoryStore` on a `ManualClock` (which decides exactly as the bare models:
//! `src/algorithm/proptests.rs`) one key at a time; the same configurations run on every
//! store through the vector scenarios (`tests/vectors/*.json`). The Lua twins' refunds of
//! fractional state (a Redis Cluster batch across slots) are checked here too.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::support::redis_server::RedisCluster;
use redis::cluster_routing::Slot;
use tollgate::{
    store::{MemoryStore, RedisStore},
    Check, Decision, Limiter, ManualClock, Rate, Rule, RuleOutcome,
};

/// 20,000 days after the epoch: a realistic instant, a multiple of every day.
const BASE: u64 = 20_000 * 86_400 * 1_000_000;

const DAY_US: u64 = 86_400 * 1_000_000;

/// Amounts over 1 ..= 10^9: small, round, prime and the extremes.
const AMOUNTS: [u64; 16] = [
    1,
    2,
    3,
    7,
    10,
    999,
    1_000,
    13_001,
    50_000,
    100_000,
    999_983,
    1_000_000,
    16_777_217,
    123_456_789,
    999_999_937,
    1_000_000_000,
];

/// Periods over 1 ms ..= 366 days (µs): round ones and ones that share no factor with the
/// amounts.
const PERIODS_US: [u64; 14] = [
    1_000,
    1_001,
    7_919,
    1_000_000,
    60_000_000,
    3_600_000_000,
    DAY_US,
    DAY_US + 1,
    7 * DAY_US,
    30 * DAY_US,
    31_556_952_000_001,
    365 * DAY_US,
    366 * DAY_US - 1,
    366 * DAY_US,
];

/// Every constructor with `amount` as its quota and `amount` per `period` as its rate.
fn every_rule(amount: u64, period: Duration) -> Vec<(&'static str, Result<Rule, String>)> {
    let rate = Rate::new(amount, period);
    let e = |r: Rule| r.checked().map_err(|e| e.to_string());
    vec![
        ("fixed_window", e(Rule::fixed_window("q", amount, period))),
        (
            "fixed_window_from_first_hit",
            e(Rule::fixed_window_from_first_hit("q", amount, period)),
        ),
        ("sliding_log", e(Rule::sliding_log("q", amount, period))),
        (
            "sliding_window",
            e(Rule::sliding_window("q", amount, period)),
        ),
        ("token_bucket", e(Rule::token_bucket("q", amount, rate))),
        (
            "token_bucket_stepped",
            e(Rule::token_bucket_stepped("q", amount, rate)),
        ),
        ("leaky_bucket", e(Rule::leaky_bucket("q", amount, rate))),
        ("gcra", e(Rule::gcra("q", amount, rate))),
        // The smallest quota at the same rate: one unit at a time.
        ("token_bucket of 1", e(Rule::token_bucket("q", 1, rate))),
        ("leaky_bucket of 1", e(Rule::leaky_bucket("q", 1, rate))),
        ("gcra of 1", e(Rule::gcra("q", 1, rate))),
    ]
}

/// Every algorithm builds for any quota from 1 to a billion over any period from 1 ms to
/// 366 days, and admits its whole quota at once.
#[test]
fn every_quota_from_1_to_a_billion_over_1_ms_to_366_days_builds() {
    let mut refused = Vec::new();
    for amount in AMOUNTS {
        for period in PERIODS_US {
            for (what, rule) in every_rule(amount, Duration::from_micros(period)) {
                match rule {
                    Ok(rule) => admits_its_quota_at_once(&rule, amount),
                    Err(e) => refused.push(format!("{what} {amount} per {period} µs: {e}")),
                }
            }
        }
    }
    assert!(refused.is_empty(), "refused:\n{}", refused.join("\n"));
}

/// Polls a future once: `MemoryStore` decides synchronously, so its futures are ready at once.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a MemoryStore future was not ready at once"),
    }
}

/// One key of one rule in a fresh in-process store, on a clock each call sets.
struct Key {
    rule: Rule,
    clock: ManualClock,
    limiter: Limiter<MemoryStore>,
}

impl Key {
    fn new(rule: Rule) -> Self {
        let clock = ManualClock::new(BASE);
        let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
        Self {
            rule,
            clock,
            limiter,
        }
    }

    /// Admits `cost` at `now` if the rule does; returns whether it did.
    fn check(&self, now: u64, cost: u64) -> bool {
        self.clock.set_micros(now);
        let check = [Check::new(&self.rule, b"k").with_cost(cost)];
        self.limiter.check_now(&check).unwrap().is_admitted()
    }

    /// What `cost` would get at `now`, consuming nothing.
    fn peek(&self, now: u64, cost: u64) -> RuleOutcome {
        self.clock.set_micros(now);
        ready(self.limiter.peek(&self.rule, b"k", cost)).unwrap()
    }

    /// The wait (µs) until `cost` is admitted after `now`: 0 if it is now, `None` if never.
    fn retry(&self, now: u64, cost: u64) -> Option<u64> {
        match self.peek(now, cost).decision {
            Decision::Deny(d) => d.retry_after.map(|r| u64::try_from(r.as_micros()).unwrap()),
            Decision::Allow | Decision::Delay(_) => Some(0),
        }
    }
}

/// A fresh key admits the rule's whole quota in one request and nothing more, at an instant
/// where every window starts (a built rule must also decide without overflowing).
fn admits_its_quota_at_once(rule: &Rule, amount: u64) {
    let key = Key::new(rule.clone());
    let quota = key.peek(BASE, 0).info.limit;
    assert!(quota == amount || quota == 1, "{rule:?}");
    assert!(key.check(BASE, quota), "{rule:?} refused its quota");
    match key.peek(BASE, 1).decision {
        Decision::Deny(d) => assert!(
            d.retry_after.is_some_and(|r| r > Duration::ZERO),
            "{rule:?}"
        ),
        // A leaky bucket queues rather than rejecting only while it has room: it has none.
        other => panic!("{rule:?} admitted past its quota: {other:?}"),
    }
}

/// 100,000 per day is one token every 864 ms exactly: the bucket admits its capacity at once,
/// then one unit at each multiple of 864 ms and not a microsecond earlier.
#[test]
fn token_bucket_of_100_000_per_day_refills_one_every_864_ms_exactly() {
    let rule = Rule::token_bucket("d", 100_000, Rate::per_day(100_000));
    let key = Key::new(rule);
    assert!(key.check(BASE, 100_000));
    assert_eq!(key.retry(BASE, 1), Some(864_000));
    for k in 1..=1_000u64 {
        let due = BASE + k * 864_000;
        assert!(!key.check(due - 1, 1), "unit {k} came early");
        assert!(key.check(due, 1), "unit {k} was late");
    }
    // A full day refills the whole capacity, exactly.
    let later = BASE + 1_000 * 864_000 + DAY_US;
    assert!(key.check(later, 100_000));
    assert!(!key.check(later, 1));
    // The quota a client is told: 100,000, whole again a day after it is spent.
    let info = key.peek(later, 0).info;
    assert_eq!(
        (info.limit, info.reset),
        (100_000, Duration::from_secs(86_400))
    );
}

/// The stepped bucket adds the whole 100,000 at the end of the day.
#[test]
fn stepped_token_bucket_of_100_000_per_day_refills_at_the_day_boundary() {
    let rule = Rule::token_bucket_stepped("d", 100_000, Rate::per_day(100_000));
    let key = Key::new(rule);
    assert!(key.check(BASE, 100_000));
    assert_eq!(key.retry(BASE + 1, 1), Some(DAY_US - 1));
    assert!(!key.check(BASE + DAY_US - 1, 1));
    assert!(key.check(BASE + DAY_US, 100_000));
}

/// A leaky bucket of 100,000 per day drains one unit every 864 ms: a full queue delays the
/// next unit by exactly that much per unit queued.
#[test]
fn leaky_bucket_of_100_000_per_day_drains_one_every_864_ms_exactly() {
    let rule = Rule::leaky_bucket("d", 100_000, Rate::per_day(100_000));
    let key = Key::new(rule);
    assert!(key.check(BASE, 99_999));
    match key.peek(BASE, 1).decision {
        Decision::Delay(delay) => assert_eq!(delay, Duration::from_micros(99_999 * 864_000)),
        other => panic!("{other:?}"),
    }
    assert!(key.check(BASE, 1));
    assert_eq!(key.retry(BASE, 1), Some(864_000));
    assert!(!key.check(BASE + 863_999, 1));
    assert!(key.check(BASE + 864_000, 1));
}

/// A sliding window of 50,000 per day weighs the previous day exactly (to the microsecond).
#[test]
fn sliding_window_of_50_000_per_day_is_exact() {
    let rule = Rule::sliding_window("d", 50_000, Duration::from_secs(86_400));
    let key = Key::new(rule);
    assert!(key.check(BASE, 50_000));
    assert!(!key.check(BASE + DAY_US - 1, 1));
    // In the next day the previous 50,000 weigh 50,000 × (day − e) / day: one unit fits once
    // that is at most 49,999, at e = day / 50,000 = 1,728,000 µs.
    let next = BASE + DAY_US;
    assert_eq!(key.retry(next, 1), Some(1_728_000));
    assert!(!key.check(next + 1_727_999, 1));
    assert!(key.check(next + 1_728_000, 1));
}

/// 600,000 per second is 3 units every 5 µs; GCRA keeps the fraction instead of rounding the
/// emission interval up to 2 µs (500,000 per second).
#[test]
fn gcra_of_600_000_per_second_admits_600_000_per_second() {
    let rule = Rule::gcra("g", 3, Rate::per_second(600_000));
    let key = Key::new(rule);
    assert!(key.check(BASE, 3));
    assert_eq!(key.retry(BASE, 3), Some(5));
    assert!(!key.check(BASE + 4, 3));
    assert!(key.check(BASE + 5, 3));
    // One request of one unit every microsecond: the first second also spends the burst the
    // idle bucket had saved (3 units, one of them still refilling at the end); from then on
    // exactly 600,000 in every whole second.
    let mut per_second = Vec::new();
    for second in 1..=4u64 {
        let start = BASE + second * 1_000_000;
        let admitted = (start..start + 1_000_000)
            .filter(|&t| key.check(t, 1))
            .count();
        per_second.push(admitted);
    }
    assert_eq!(per_second, [600_002, 600_000, 600_000, 600_000]);
}

/// The largest GCRA rates are exact too: 10^9 per second is 1,000 per µs.
#[test]
fn gcra_of_a_billion_per_second_admits_1_000_per_microsecond() {
    let rule = Rule::gcra("g", 1_000, Rate::per_second(1_000_000_000));
    let key = Key::new(rule);
    for t in 0..10_000 {
        assert!(key.check(BASE + t, 1_000), "at {t} µs");
        assert!(!key.check(BASE + t, 1), "at {t} µs");
    }
}

/// On a Redis Cluster, a batch across two slots whose second slot denies refunds the first:
/// for rates whose state carries fractions (GCRA's TAT, scaled bucket levels) and rounded
/// ones, the refund restores the first key exactly (every peek answers as before).
#[tokio::test]
async fn cluster_refunds_restore_fractional_state_exactly() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(&cluster.url())
        .await
        .expect("connect to the test cluster");
    let clock = ManualClock::new(BASE);
    let limiter = Limiter::new(store.with_clock(clock.clone()));
    let (a, b): (&[u8], &[u8]) = (b"alpha", b"beta");
    assert_ne!(Slot::for_key(b"{alpha}"), Slot::for_key(b"{beta}"));
    let prime = 999_999_937;
    let year = Duration::from_micros(366 * DAY_US);
    let rules = [
        Rule::gcra("g-fraction", 4, Rate::per_second(600_000)),
        Rule::gcra("g-rounded", prime, Rate::new(prime, year)),
        Rule::token_bucket("t-rounded", prime, Rate::per_day(prime)),
        Rule::leaky_bucket("l-fraction", 4, Rate::per_second(600_000)),
        Rule::sliding_window("s-stepped", 1_000_000_000, Duration::from_secs(86_400)),
    ];
    for rule in &rules {
        let quota = limiter.peek(rule, a, 0).await.unwrap().info.limit;
        // a holds a partly used, fractional state; b is used up.
        clock.set_micros(BASE);
        assert!(limiter.check_one(rule, a).await.unwrap().is_admitted());
        assert!(limiter
            .check(&[Check::new(rule, b).with_cost(quota)])
            .await
            .unwrap()
            .is_admitted());
        clock.set_micros(BASE + 1);
        let peeks = |limiter: &Limiter<RedisStore>| {
            let limiter = limiter.clone();
            async move {
                let mut seen: Vec<RuleOutcome> = Vec::new();
                for cost in [0, 1, 2, 3, quota] {
                    seen.push(limiter.peek(rule, a, cost).await.unwrap());
                }
                seen
            }
        };
        let before = peeks(&limiter).await;
        let outcome = limiter
            .check(&[Check::new(rule, a), Check::new(rule, b)])
            .await
            .unwrap();
        assert!(!outcome.is_admitted(), "{}: b is used up", rule.name());
        assert_eq!(
            peeks(&limiter).await,
            before,
            "{}: a was refunded exactly",
            rule.name()
        );
    }
}
