//! Wait mode never over-admits: a reservation takes units at a later instant without
//! forgetting what still counts before it (regression: fixed window and sliding log used to
//! drop the current window's admissions when a reservation reached past it).

mod common;

use std::time::Duration;

use common::redis_server::RedisServer;
use proptest::prelude::*;
use tollgate::{Check, Decision, Limiter, ManualClock, MemoryStore, RedisStore, Rule, Store};

const T0: u64 = 1_000_000_000;

/// Two admitted at t=5, a reservation at t=6 into the future, then a plain request at t=7:
/// with a limit of 2 per 10 µs it must be denied.
async fn request_before_a_reservation_is_denied<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let us = Duration::from_micros;
    for rule in [
        Rule::fixed_window("fw", 2, us(10)).unwrap(),
        Rule::sliding_window("sw", 2, us(10)).unwrap(),
        Rule::sliding_log("sl", 2, us(10)).unwrap(),
    ] {
        let batch = [Check::new(&rule, b"k")];
        clock.set_micros(T0 + 5);
        for _ in 0..2 {
            assert!(limiter.check(&batch).await.unwrap().is_admitted());
        }
        clock.set_micros(T0 + 6);
        let reserved = limiter.reserve(&batch, us(10)).await.unwrap();
        assert!(
            matches!(reserved.decision, Decision::Delay(_)),
            "{}",
            rule.name()
        );
        clock.set_micros(T0 + 7);
        let outcome = limiter.check(&batch).await.unwrap();
        assert!(
            !outcome.is_admitted(),
            "{}: a third unit before the window",
            rule.name()
        );
    }
}

#[tokio::test]
async fn a_reservation_keeps_the_current_window_memory() {
    let clock = ManualClock::new(T0);
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
    request_before_a_reservation_is_denied(&limiter, &clock).await;
}

#[tokio::test]
async fn a_reservation_keeps_the_current_window_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let limiter = Limiter::new(store.with_clock(clock.clone()));
    request_before_a_reservation_is_denied(&limiter, &clock).await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random traffic with and without waiting: no fixed window ever holds more than its
    /// limit, and no window-long interval more than a sliding log's limit, counting each
    /// admission at the instant it passes (now + its delay).
    #[test]
    fn wait_mode_never_over_admits(
        steps in proptest::collection::vec((0u64..40, 1u64..3, prop_oneof![Just(0u64), 0u64..60]), 1..80)
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let us = Duration::from_micros;
        let (limit, window) = (4u64, 20u64);
        let rules = [
            Rule::fixed_window("fw", limit, us(window)).unwrap(),
            Rule::sliding_log("sl", limit, us(window)).unwrap(),
        ];
        for rule in &rules {
            let clock = ManualClock::new(T0);
            let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
            let mut passed: Vec<(u64, u64)> = Vec::new();
            for &(advance, cost, wait) in &steps {
                clock.advance_micros(advance);
                let now = clock.now_micros_for_test();
                let outcome = rt
                    .block_on(limiter.reserve(&[Check::new(rule, b"k").with_cost(cost)], us(wait)))
                    .unwrap();
                match outcome.decision {
                    Decision::Allow => passed.push((now, cost)),
                    Decision::Delay(d) => passed.push((now + d.as_micros() as u64, cost)),
                    Decision::Deny(_) => {}
                }
            }
            if rule.name() == "fw" {
                let mut per_window = std::collections::HashMap::new();
                for &(t, c) in &passed {
                    *per_window.entry(t / window).or_insert(0) += c;
                }
                for (w, n) in per_window {
                    prop_assert!(n <= limit, "fixed window {w} passed {n}");
                }
            } else {
                for &(start, _) in &passed {
                    let n: u64 = passed
                        .iter()
                        .filter(|(t, _)| *t >= start && *t < start + window)
                        .map(|(_, c)| c)
                        .sum();
                    prop_assert!(n <= limit, "{n} passed in [{start}, {start}+{window})");
                }
            }
        }
    }
}

trait NowForTest {
    fn now_micros_for_test(&self) -> u64;
}

impl NowForTest for ManualClock {
    fn now_micros_for_test(&self) -> u64 {
        tollgate::Clock::now_micros(self)
    }
}
